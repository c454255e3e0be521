"""The built-in self-test wrapper (simulated with Amaranth's simulator) and the open-flow
bitstream build for an amaranth-boards ECP5 board."""

import json

import numpy as np
import pytest
from amaranth.sim import Simulator
from click.testing import CliRunner

from conftest import requires_ecp5_flow
from hwgen import registry
from hwgen.cli import main
from hwgen.errors import ConfigError
from hwgen.flow.bist import SelfTest
from hwgen.flow.openboard import build_bitstream


def _run_selftest(name, sets, items, corrupt=None, max_cycles=20000):
    acc = registry.get(name)
    cfg = acc.make_config(sets)
    stim = acc.model.stimulus(cfg, items, np.random.default_rng(3))
    inputs, expected = acc.model.inputs(cfg, stim), acc.model.expect(cfg, stim)
    if corrupt:
        port, index, field = corrupt
        beat = dict(expected[port][index])
        beat[field] = beat[field] ^ 1
        expected[port] = expected[port][:index] + [beat] + expected[port][index + 1:]
    dut = SelfTest(acc.build_core(cfg), inputs, expected)
    sim = Simulator(dut)
    sim.add_clock(1e-8)
    seen = {}

    async def bench(ctx):
        for cycle in range(max_cycles):
            await ctx.tick()
            if ctx.get(dut.done) or ctx.get(dut.fail):
                break
        seen.update(cycles=cycle, done=ctx.get(dut.done), fail=ctx.get(dut.fail))

    sim.add_testbench(bench)
    sim.run()
    return seen


@pytest.mark.parametrize("name, sets, items", [
    ("gmi-reduce", ["members=3", "length=5"], 6),
    ("pq-decoder", ["m=3", "lut_bits=7", "tag_bits=5"], 40),
])
def test_selftest_passes_on_the_golden_results(name, sets, items):
    r = _run_selftest(name, sets, items)
    assert (r["done"], r["fail"]) == (1, 0), r


@pytest.mark.parametrize("name, sets, items, corrupt", [
    ("gmi-reduce", ["members=3", "length=5"], 6, ("o_pkt", 2, "last")),
    ("pq-decoder", ["m=3", "lut_bits=7", "tag_bits=5"], 40, ("o_dist", 17, "dist")),
])
def test_selftest_fails_on_one_wrong_bit(name, sets, items, corrupt):
    r = _run_selftest(name, sets, items, corrupt)
    assert r["fail"] == 1, r


def test_board_build_refuses_memory_mapped_cores(tmp_path):
    acc = registry.get("recsys-embedding")
    with pytest.raises(ConfigError, match="board"):
        build_bitstream(acc, acc.make_config(), "ecpix5-85", tmp_path)


@requires_ecp5_flow
def test_ecpix5_bitstream_and_timing_report(tmp_path):
    result = CliRunner().invoke(main, ["build", "gmi-broadcast", "--board", "ecpix5-85",
                                       "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    bit = tmp_path / "bitstream" / "gmi_broadcast_bist.bit"
    data = bit.read_bytes()
    # An ECP5 bitstream: a comment block, then the preamble 0xFFFFBDB3.
    assert len(data) > 100_000 and bytes.fromhex("ffffbdb3") in data[:4096]
    rep = json.loads((tmp_path / "timing_report.json").read_text())
    assert rep["board_clock_mhz"] == 100 and rep["device"] == "LFE5UM5G-85F"
    assert 20 < rep["fmax_mhz"] < 500 and rep["timing_met"] == (rep["fmax_mhz"] >= 100)
    assert "timing met" in result.output or "timing NOT met" in result.output
