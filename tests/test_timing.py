"""``hwgen timing``: the ECP5 place-and-route flow with its reference design, and the
UltraScale+ logic-depth walk of a yosys netlist.

The live runs assert only that the figures exist and are sane; speed goals are in
``hwgen bench timing``, not here.
"""

import json

import pytest
from click.testing import CliRunner

from conftest import requires_ecp5_flow, requires_yosys
from hwgen import registry
from hwgen.cli import main
from hwgen.errors import ConfigError
from hwgen.flow.logic_depth import netlist_depth
from hwgen.flow.timing import measure_timing, parse_pnr_report


# -- the netlist walk on hand-made netlists ---------------------------------------------------

def _cell(kind, conns, dirs, **params):
    return {"type": kind, "connections": conns, "port_directions": dirs,
            "parameters": {k: format(v, "032b") for k, v in params.items()}}


def _ff(d, q):
    return _cell("FDRE", {"D": [d], "Q": [q], "C": [2], "CE": ["1"], "R": ["0"]},
                 {"D": "input", "Q": "output", "C": "input", "CE": "input", "R": "input"})


def _lut(ins, out):
    return _cell("LUT4", {"I0": ins, "O": [out]}, {"I0": "input", "O": "output"})


def _carry(ci, s, co):
    return _cell("CARRY4", {"CI": [ci], "S": s, "CO": [co], "O": [co + 100]},
                 {"CI": "input", "S": "input", "CO": "output", "O": "output"})


def _module(cells, inputs=(10,), outputs=()):
    ports = {"clk": {"direction": "input", "bits": [2]},
             "i": {"direction": "input", "bits": list(inputs)}}
    if outputs:
        ports["o"] = {"direction": "output", "bits": list(outputs)}
    return {"modules": {"top": {"ports": ports, "cells": cells}}}


def test_depth_counts_luts_between_registers():
    # ff0 -> 5 LUTs -> ff1: five levels; a one-LUT side path does not count.
    cells = {"ff0": _ff(10, 20), "ff1": _ff(25, 30), "ff2": _ff(40, 41),
             "side": _lut([20], 40)}
    for k in range(5):
        cells[f"l{k}"] = _lut([20 + k], 21 + k)
    d = netlist_depth(_module(cells), "top")
    assert (d["lut_levels"], d["carry_chains"], d["levels"]) == (5, 0, 5)
    assert d["path"][0] == "ff0" and d["path"][-1] == "ff1"
    assert not d["goal_met"]


def test_depth_counts_a_cascaded_carry_chain_once():
    # ff0 -> LUT -> carry a -> carry b (cascaded through CI) -> LUT -> carry c -> ff1
    cells = {"ff0": _ff(10, 20), "lut": _lut([20], 21), "a": _carry("0", [21], 22),
             "b": _carry(22, ["0"], 23), "lut2": _lut([23], 24), "c": _carry("0", [24], 25),
             "ff1": _ff(25, 26)}
    d = netlist_depth(_module(cells), "top")
    assert (d["lut_levels"], d["carry_chains"], d["carry_cells"]) == (2, 2, 3)
    assert d["levels"] == 4


def _dsp(a, p, **params):
    return _cell("DSP48E2", {"A": [a], "B": ["0"], "P": [p], "CLK": [2]},
                 {"A": "input", "B": "input", "P": "output", "CLK": "input"}, **params)


def test_dsp_between_registers_counts_as_registered():
    cells = {"ff0": _ff(10, 20), "dsp": _dsp(20, 21), "ff1": _ff(21, 22)}
    d = netlist_depth(_module(cells), "top")
    assert (d["dsp48e2"], d["dsp_unregistered"], d["levels"]) == (1, 0, 0)
    assert d["goal_met"]


def test_dsp_followed_by_logic_is_a_level():
    cells = {"ff0": _ff(10, 20), "dsp": _dsp(20, 21), "lut": _lut([21], 22),
             "ff1": _ff(22, 23)}
    d = netlist_depth(_module(cells), "top")
    assert (d["dsp_unregistered"], d["dsp_ram_levels"], d["lut_levels"]) == (1, 1, 1)
    assert not d["goal_met"]
    # With its P register on, the same DSP starts the path.
    cells["dsp"] = _dsp(20, 21, AREG=1, BREG=1, PREG=1)
    d = netlist_depth(_module(cells), "top")
    assert (d["dsp_unregistered"], d["dsp_ram_levels"], d["levels"]) == (0, 0, 1)


def test_block_ram_into_logic_is_a_level():
    ram = _cell("RAMB18E2", {"ADDRARDADDR": [20], "DOUTADOUT": [21], "CLKARDCLK": [2]},
                {"ADDRARDADDR": "input", "DOUTADOUT": "output", "CLKARDCLK": "input"})
    cells = {"ff0": _ff(10, 20), "ram": ram, "lut": _lut([21], 22), "ff1": _ff(22, 23)}
    d = netlist_depth(_module(cells), "top")
    assert (d["ram_unregistered"], d["dsp_ram_levels"]) == (1, 1)
    cells = {"ff0": _ff(10, 20), "ram": ram, "ff1": _ff(21, 23)}
    d = netlist_depth(_module(cells), "top")
    assert (d["ram_unregistered"], d["levels"]) == (0, 0)


def _srl(d, q, address):
    conns = {"D": [d], "Q": [q], "CLK": [2], "CE": ["1"]}
    conns.update({f"A{k}": [a] for k, a in enumerate(address)})
    return _cell("SRL16E", conns, {p: "output" if p == "Q" else "input" for p in conns})


def test_fixed_shift_register_counts_as_flip_flops_around_dsp_and_ram():
    # yosys maps a delay line feeding a DSP into an SRL16E (constant tap): Vivado would have
    # packed its last stage into AREG/BREG, so the DSP counts as registered.
    cells = {"ff0": _ff(10, 20), "srl": _srl(20, 21, ["1", "0", "1", "0"]),
             "dsp": _dsp(21, 22), "ff1": _ff(22, 23)}
    d = netlist_depth(_module(cells), "top")
    assert (d["dsp_unregistered"], d["dsp_ram_levels"]) == (0, 0)
    assert d["goal_met"]
    # An SRL read at a moving tap is a multiplexer: the DSP behind it is not registered.
    cells["ff_a"] = _ff(11, 30)
    cells["srl"] = _srl(20, 21, [30, "0", "0", "0"])
    d = netlist_depth(_module(cells, inputs=(10, 11)), "top")
    assert d["dsp_unregistered"] == 1 and not d["goal_met"]
    # A block RAM whose output enters a fixed SRL has its output register.
    ram = _cell("RAMB18E2", {"ADDRARDADDR": [20], "DOUTADOUT": [21], "CLKARDCLK": [2]},
                {"ADDRARDADDR": "input", "DOUTADOUT": "output", "CLKARDCLK": "input"})
    cells = {"ff0": _ff(10, 20), "ram": ram, "srl": _srl(21, 22, ["1", "1", "0", "0"]),
             "ff1": _ff(22, 23)}
    d = netlist_depth(_module(cells), "top")
    assert (d["ram_unregistered"], d["dsp_ram_levels"]) == (0, 0)
    # Its output into logic still costs the LUT level it always did.
    assert d["lut_levels"] == 1


def test_parse_pnr_report_picks_the_slowest_clock_and_its_path():
    step = lambda kind, delay, cell, port: {"type": kind, "delay": delay,  # noqa: E731
                                            "from": {"cell": cell, "port": port},
                                            "to": {"cell": cell, "port": port}}
    report = {"fmax": {"ap_clk": {"achieved": 123.4, "constraint": 400}},
              "critical_paths": [{"from": "posedge ap_clk", "to": "posedge ap_clk", "path": [
                  step("clk-to-q", 0.5, "a", "Q"), step("routing", 1.5, "a", "Q"),
                  step("logic", 0.3, "lut", "A"), step("routing", 1.0, "lut", "F"),
                  step("logic", 0.1, "cc", "FCI"), step("setup", 0.1, "b", "DI")]}],
              "utilization": {"TRELLIS_FF": {"used": 9, "available": 100},
                              "DP16KD": {"used": 0, "available": 208}}}
    r = parse_pnr_report(report)
    assert r["fmax_mhz"] == 123.4 and r["clock"] == "ap_clk"
    cp = r["critical_path"]
    assert (cp["from"], cp["to"], cp["logic_levels"], cp["carry_steps"]) == ("a", "b", 1, 1)
    assert cp["routing_share"] == pytest.approx(2.5 / 3.5, abs=1e-3)
    assert r["utilization"] == {"TRELLIS_FF": {"used": 9, "available": 100}}


@pytest.mark.parametrize("stdout, stderr, version", [
    ("Yosys 0.70 (git sha1 28ba3cb92)\n", "", "Yosys 0.70 (git sha1 28ba3cb92)"),
    # a fresh YoWASP cache: the notice first, ecppack's version on stderr
    ("", "Preparing to run yowasp-ecppack. This might take a while...\n"
         "Project Trellis ecppack Version 1.4-82-g3afe7b5\n",
     "Project Trellis ecppack Version 1.4-82-g3afe7b5"),
    ("", "", "unknown"),
])
def test_tool_version_skips_yowasp_notice(tmp_path, stdout, stderr, version):
    """The version recorded in each row and in the flow fingerprint is the same on a fresh
    machine (whose first YoWASP run prints a notice) as on a warm one."""
    from hwgen.flow.timing import _tool_version
    (tmp_path / "out").write_text(stdout)
    (tmp_path / "err").write_text(stderr)
    exe = tmp_path / "tool"
    exe.write_text(f"#!/bin/sh\ncat {tmp_path / 'out'}\ncat {tmp_path / 'err'} >&2\n")
    exe.chmod(0o755)
    assert _tool_version(str(exe)) == version


def test_seeds_out_of_range_name_the_parameter():
    acc = registry.get("gmi-broadcast")
    with pytest.raises(ConfigError, match="seeds"):
        measure_timing(acc, acc.make_config(), seeds=0)


# -- live runs of the open flow -----------------------------------------------------------------

@requires_ecp5_flow
@requires_yosys
@pytest.mark.parametrize("name, sets", [("gmi-broadcast", ["members=3"]),
                                        ("gmi-header", [])])
def test_timing_runs_block_and_reference(tmp_path, name, sets):
    args = ["timing", name, "--seeds", "1", "--json", str(tmp_path / "t.json")]
    for s in sets:
        args += ["--set", s]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    r = json.loads((tmp_path / "t.json").read_text())
    assert r["seeds"] == [1] and len(r["fmax_mhz_per_seed"]) == 1
    # A placed and routed ECP5 design runs between 20 and 500 MHz; the reference's block-RAM
    # clock-to-out (5.8 ns) alone bounds it below 170 MHz.
    assert 20 < r["fmax_mhz"] < 500
    assert 50 < r["reference"]["fmax_mhz"] < 170
    assert r["fmax_ratio"] == pytest.approx(r["fmax_mhz"] / r["reference"]["fmax_mhz"],
                                            abs=1e-3)
    cp = r["critical_path"]
    assert cp["from"] and cp["to"] and cp["delay_ns"] == pytest.approx(1000 / r["fmax_mhz"],
                                                                       rel=0.05)
    assert 0 <= cp["routing_share"] <= 1 and cp["logic_levels"] >= 0
    assert r["resources"]["ff"] > 0 and r["resources"]["lut4"] > 0
    us = r["ultrascale"]
    assert us["levels"] == us["lut_levels"] + us["carry_chains"] + us["dsp_ram_levels"]
    assert us["levels"] >= 1 and len(us["path"]) >= 2
    assert "fmax_ratio" in result.output and "UltraScale+" in result.output


def test_baseline_rows_name_bench_rows():
    """Every recorded "before" row is one the bench measures (a typo would hide it)."""
    from hwgen.flow.timing_bench import BASELINE, BENCH_CONFIGS, row_key
    rows = json.loads(BASELINE.read_text())["rows"]
    keys = {row_key(n, s) for n, s in BENCH_CONFIGS}
    assert set(rows) <= keys
    # lut-builder's row was lost (the baseline's note); maxsim and the cluster adapters and
    # kernel chains were registered after the baseline's gateware (f8831e1), so they have no
    # "before" (the bench prints "-")
    later = {"maxsim", "cluster-row2pkt", "cluster-pkt2row", "cluster-kernel-chain"}
    assert set(registry.names()) - {"lut-builder"} - later <= set(rows)
    for row in rows.values():
        assert "error" in row or 0 < row["fmax_ratio"] == pytest.approx(
            row["fmax_mhz"] / row["reference_mhz"], abs=2e-3)


@requires_ecp5_flow
@requires_yosys
def test_bench_timing_prints_before_and_after(tmp_path):
    """One row through the whole bench: a Dask worker places and routes it, the row is merged
    into a table of record (a copy: the shipped file is left alone) next to a row it did not
    measure, and a README's generated table is rewritten from it."""
    from hwgen.flow import timing_table
    from hwgen.flow.timing_bench import BASELINE
    out = tmp_path / "bench.json"
    results = tmp_path / "timing_results.json"
    other = {"block": "pq-decoder", "accelerator": "pq-decoder", "config": {},
             "config_digest": "x", "verilog_sha256": "y", "seeds": [1], "error": "kept",
             "measured": {"date": "2026-01-01"}}
    timing_table.save({"format": 1, "rows": {"pq-decoder": other}}, results)
    readme = tmp_path / "README.md"
    readme.write_text(f"# t\n{timing_table.README_BEGIN}\nold\n{timing_table.README_END}\nend\n")
    result = CliRunner().invoke(main, ["bench", "timing", "--only", "gmi-header", "--seeds",
                                       "1", "--workers", "1", "--json", str(out), "--results",
                                       str(results), "--readme", str(readme), "--out",
                                       str(tmp_path / "sweep")])
    assert result.exit_code == 0, result.output
    rows = json.loads(out.read_text())["rows"]
    assert [r["block"] for r in rows] == ["gmi-header"]
    assert rows[0]["before"] == json.loads(BASELINE.read_text())["rows"]["gmi-header"]
    after = rows[0]["after"]
    assert 20 < after["fmax_mhz"] < 500 and after["fmax_ratio"] > 0
    line = [l for l in result.output.splitlines() if l.startswith("gmi-header")][0]
    assert f"{rows[0]['before']['fmax_mhz']:.1f}" in line and f"{after['fmax_mhz']:.1f}" in line
    table = timing_table.load(results)
    assert list(table["rows"]) == ["pq-decoder", "gmi-header"]      # bench order, other kept
    assert table["rows"]["pq-decoder"] == other
    assert table["rows"]["gmi-header"] == after
    acc = registry.get("gmi-header")
    assert after["config_digest"] == acc.make_config([]).digest()
    assert after["seeds"] == [1] and after["fmax_mhz_per_seed"] == [after["fmax_mhz"]]
    text = readme.read_text()
    assert "old" not in text and text.endswith(timing_table.README_END + "\nend\n")
    assert timing_table.markdown(table) in text
    sweep = json.loads((tmp_path / "sweep" / "sweep.json").read_text())
    assert [r["kind"] for r in sweep["rows"]] == ["timing"] and not sweep["failed"]


def test_pnr_timeout_from_the_environment(monkeypatch):
    """``$HWGEN_PNR_TIMEOUT_S`` overrides the flow's limit per seed; a value that is not a
    whole number of seconds in range is refused naming the variable."""
    from hwgen.flow.timing import PNR_TIMEOUT_ENV, PNR_TIMEOUT_S, pnr_timeout_s
    monkeypatch.delenv(PNR_TIMEOUT_ENV, raising=False)
    assert pnr_timeout_s() == PNR_TIMEOUT_S
    monkeypatch.setenv(PNR_TIMEOUT_ENV, "3600")
    assert pnr_timeout_s() == 3600
    for bad in ("0", "-5", "1.5", "soon", "100000"):
        monkeypatch.setenv(PNR_TIMEOUT_ENV, bad)
        with pytest.raises(ConfigError, match=PNR_TIMEOUT_ENV):
            pnr_timeout_s()


def test_bench_timing_refuses_a_bad_pnr_timeout(tmp_path):
    """``--pnr-timeout`` out of range is refused (exit 2, naming the option) before any
    place and route."""
    result = CliRunner().invoke(main, ["bench", "timing", "--only", "gmi-header",
                                       "--pnr-timeout", "0", "--results",
                                       str(tmp_path / "t.json")])
    assert result.exit_code == 2, result.output
    assert "pnr-timeout" in result.output and not (tmp_path / "t.json").exists()


@requires_ecp5_flow
def test_block_options_place_the_reference_the_same_way(tmp_path, monkeypatch):
    """A block's own nextpnr options (lut-builder: the static placer) reach the block's and the
    reference's place and route alike, the reference's in its own cache folder, and they are
    part of the row's flow fingerprint, so a row placed with other options is not kept."""
    from hwgen.flow import timing
    monkeypatch.setenv("HWGEN_CACHE", str(tmp_path / "cache"))
    placed = []

    def fake_synth(tools, work, v_name, top):
        (work / f"{top}.json").write_text("{}")
        return {"LUT4": 1}, "fake"

    def fake_pnr(tools, work, top, seeds, log=None, options=()):
        placed.append((top, work, tuple(options)))
        return {"fmax_mhz": 130.0 if top != "timing_reference" else 140.0,
                "per_seed": [130.0], "failed_seeds": {}}

    monkeypatch.setattr(timing, "_ecp5_synth", fake_synth)
    monkeypatch.setattr(timing, "_pnr", fake_pnr)
    acc = registry.get("lut-builder")
    assert acc.pnr_options == ("--placer", "static")
    report = measure_timing(acc, acc.make_config(["dim=16", "m=2"]), seeds=1, xilinx=False)
    assert [(top, opts) for top, _, opts in placed] == [
        ("lut_builder", ("--placer", "static")), ("timing_reference", ("--placer", "static"))]
    assert report["pnr_options"] == ["--placer", "static"]
    assert report["fmax_ratio"] == round(130.0 / 140.0, 3)
    assert report["flow"] == timing.flow_fingerprint(options=acc.pnr_options)
    assert report["flow"] != timing.flow_fingerprint()
    # the default flow's reference folder is another one
    plain = registry.get("gmi-header")
    measure_timing(plain, plain.make_config(), seeds=1, xilinx=False)
    assert placed[-1][2] == () and placed[-1][1] != placed[1][1]
    assert timing.pnr_args("a.json", 1, "r", "l", ("--placer", "static"))[-2:] == [
        "--placer", "static"]
