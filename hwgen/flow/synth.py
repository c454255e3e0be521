"""``hwgen synth``: resource estimate with yosys ``synth_xilinx`` (UltraScale+ cell library).

yosys maps the emitted Verilog to UltraScale+ primitives (``synth_xilinx -family xcup``) and its
``stat`` lists the cells. We count:

=========  ===============================================================================
lut        LUT1..LUT6 and INV (a LUT1) plus LUTs used as distributed RAM (RAM32M = 4, RAM64M = 4, RAM32M16 = 8,
           RAM64M8 = 8, RAM*X1D = 2, RAM128X1D = 4, RAM256X1D = 8) and shift registers (SRL = 1)
lutram     the distributed-RAM and SRL share of ``lut``
ff         FDRE, FDSE, FDCE, FDPE
bram18     RAMB18E2 + 2 x RAMB36E2 (in 18 Kb blocks, as Vivado reports BRAM18)
bram36     RAMB36E2 cells (BRAM18 cells not included)
uram       URAM288
dsp        DSP48E2
carry      CARRY4 / CARRY8 cells (yosys 0.23 maps UltraScale+ carry chains to CARRY4, so carry
           and LUT counts are approximate)
=========  ===============================================================================

``-nowidelut`` maps logic to LUT6 only: with wide LUTs (LUT7..9 built from MUXF7/8/9) ABC was
seen to map comparator-heavy designs (``insert-pq``) to four times the LUTs, an artefact no
vendor tool would reproduce. No open tool times UltraScale+ or Versal: we never report an Fmax.
Results are cached per Verilog text.
"""

import hashlib
import json
import re
import subprocess
import time

from ..errors import ToolError
from . import profile
from .design import Design
from .emit import emit_design
from .tools import file_lock, yosys_path

__all__ = ["synthesize", "synthesize_design", "parse_stat", "LUTRAM_WEIGHTS"]

LUTRAM_WEIGHTS = {
    "RAM32M": 4, "RAM64M": 4, "RAM32M16": 8, "RAM64M8": 8, "RAM32X1D": 2, "RAM64X1D": 2,
    "RAM128X1D": 4, "RAM256X1D": 8, "RAM32X1S": 1, "RAM64X1S": 1, "RAM128X1S": 2,
    "RAM256X1S": 4, "SRL16E": 1, "SRLC32E": 1, "SRLC16E": 1,
}
_FF = ("FDRE", "FDSE", "FDCE", "FDPE")


def parse_stat(text):
    """Cell counts of the last ``stat`` block in a yosys log -> resource dictionary."""
    blocks = text.split("Number of cells:")
    if len(blocks) < 2:
        raise ToolError("yosys log holds no 'stat' cell list")
    cells = {}
    for line in blocks[-1].splitlines()[1:]:
        match = re.match(r"\s+(\S+)\s+(\d+)\s*$", line)
        if match:
            cells[match.group(1)] = int(match.group(2))
        elif line.strip() and not line.startswith(" "):
            break
    logic = sum(n for c, n in cells.items() if re.fullmatch(r"LUT[1-6]|INV", c))
    lutram = sum(LUTRAM_WEIGHTS[c] * n for c, n in cells.items() if c in LUTRAM_WEIGHTS)
    return {
        "lut": logic + lutram,
        "lutram": lutram,
        "ff": sum(cells.get(c, 0) for c in _FF),
        "bram18": cells.get("RAMB18E2", 0) + 2 * cells.get("RAMB36E2", 0),
        "bram36": cells.get("RAMB36E2", 0),
        "uram": cells.get("URAM288", 0),
        "dsp": cells.get("DSP48E2", 0),
        "carry": cells.get("CARRY4", 0) + cells.get("CARRY8", 0),
        "cells": cells,
    }


def synthesize(acc, config, *, board=None, log=None):
    """Run yosys on ``config`` of ``acc``; returns the report dictionary of ``hwgen synth``."""
    return synthesize_design(Design.of(acc, config), board=board, log=log)


def synthesize_design(design, *, board=None, log=None):
    """Run yosys on a :class:`~hwgen.flow.design.Design` (cached per configuration key and
    Verilog); returns the report dictionary of ``hwgen synth``."""
    exe = yosys_path()
    if exe is None:
        raise ToolError("yosys not found: install Debian's yosys (make setup does when run as "
                        "root) or set HWGEN_YOSYS")
    family = board.family if board is not None else "xcup"
    work = design.work_dir / "synth"
    with file_lock(work.parent / ".synth.lock"):      # one yosys run per configuration
        return _synthesize(design, board, exe, family, work, log)


def _synthesize(design, board, exe, family, work, log):
    v_path, _ = emit_design(design, work)
    script = (f"read_verilog -sv {v_path.name}\n"
              f"synth_xilinx -family {family} -top {design.top_name} -noiopad -noclkbuf "
              f"-nowidelut\n"
              f"stat\n")
    key = hashlib.sha256(v_path.read_bytes() + script.encode()).hexdigest()
    log_path = work / "yosys.log"
    cached = work / "synth.json"
    if cached.exists():
        old = json.loads(cached.read_text())
        if old.get("key") == key:
            counts, seconds, version = old["counts"], old["seconds"], old["yosys"]
            profile.record("yosys", design.top_name, work, 0.0, True)
        else:
            old = None
    else:
        old = None
    if old is None:
        if log:
            log(f"yosys synth_xilinx -family {family} on {design.name} ({design.key}) ...")
        (work / "synth.ys").write_text(script)
        start = time.monotonic()
        proc = subprocess.run([exe, "-q", "-l", log_path.name, "-s", "synth.ys"], cwd=work,
                              capture_output=True, text=True)
        seconds = round(time.monotonic() - start, 1)
        if proc.returncode != 0:
            raise ToolError(f"yosys failed on {design.name} (exit {proc.returncode}); log "
                            f"{log_path}:\n{(proc.stderr or proc.stdout)[-2000:]}")
        profile.record("yosys", design.top_name, work, seconds, False)
        counts = parse_stat(log_path.read_text())
        version = subprocess.run([exe, "-V"], capture_output=True, text=True).stdout.strip()
        cached.write_text(json.dumps({"key": key, "counts": counts, "seconds": seconds,
                                      "yosys": version}))
    report = {
        "accelerator": design.name,
        **design.describe(),
        "tool": version,
        "command": script.strip().replace("\n", "; "),
        "seconds": seconds,
        "resources": {k: v for k, v in counts.items() if k != "cells"},
        "cells": counts["cells"],
    }
    if board is not None:
        report["board"] = board.name
        report["percent"] = {k: round(v, 3) for k, v in board.percent({
            "lut": counts["lut"], "ff": counts["ff"], "bram": counts["bram18"],
            "uram": counts["uram"], "dsp": counts["dsp"]}).items()}
        report["board_resources_scope"] = board.resources_scope
    return report
