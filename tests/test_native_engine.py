"""The native simulation engine (generated C++ testbench around the Verilated model) against the
golden models: odd sizes, random input gaps and output backpressure, sideband signals
(TKEEP/TDEST), sampled status counters, AXI4 read memories, and the same configuration on
both engines."""

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from hwgen import registry
from hwgen.cli import main
from hwgen.flow.simulate import check, simulate

from conftest import assert_fuzz_exact, requires_verilator

pytestmark = requires_verilator

CASES = [
    ("pq-decoder", {"m": 5}, {}, 700),
    ("insert-pq", {"k": 7, "dist_bits": 12, "id_bits": 9}, {}, 400),
    ("ibert-softmax", {"max_len": 13, "lanes": 3}, {}, 60),
    ("cluster-router", {}, {"fuzz": 300}, None),
]


@pytest.mark.parametrize("name, params, options, items", CASES,
                         ids=[c[0] for c in CASES])
def test_native_engine_matches_golden_model_under_stalls(name, params, options, items):
    acc = registry.get(name)
    cfg = acc.config(**params)
    r = simulate(acc, cfg, items=items, seed=3, stall=0.3, engine="native",
                 stimulus_options=options)
    check(r)
    assert r["engine"] == "native" and r["results"] > 0 and r["cycles_run"] >= r["cycles"]
    assert r["cycles_per_second"] > 0
    if options.get("fuzz"):
        assert_fuzz_exact(r)


def test_both_engines_agree_on_one_configuration():
    """Different stall patterns (the engines' random streams differ), the same results."""
    acc = registry.get("pq-decoder")
    cfg = acc.config(m=5)
    runs = {engine: simulate(acc, cfg, items=500, seed=8, stall=0.25, engine=engine,
                             keep_outputs=True) for engine in ("cocotb", "native")}
    for r in runs.values():
        check(r)
    assert runs["cocotb"]["outputs"] == runs["native"]["outputs"]
    assert runs["cocotb"]["run_dir"] != runs["native"]["run_dir"]
    # without stalls the engines see the same cycles: latency and rate agree exactly
    calm = {engine: simulate(acc, cfg, items=200, seed=8, stall=0.0, engine=engine)
            for engine in ("cocotb", "native")}
    for key in ("cycles", "latency_cycles", "results_per_cycle"):
        assert calm["cocotb"][key] == calm["native"][key], key


def test_native_engine_runs_the_node_with_axi_memory_models():
    """The node (a U250's four DDR4 channels) reads its lists through four C++ AXI4 read
    models (random latency, ARREADY drops and R pauses at 20%); results and the sampled
    performance counters come back as from cocotb."""
    acc = registry.get("chamvs-node")
    r = simulate(acc, acc.config(), items=6, seed=2, stall=0.2, engine="native")
    check(r)
    assert r["per_query_cycles"]["total"] > 0 and r["scan_efficiency"] > 0


def test_native_engine_writes_waves(tmp_path):
    """--waves on the native engine: a --trace build of its own, dump.vcd in the run folder
    with the top's ports, a 4 ns clock, and the same results as without waves."""
    out = tmp_path / "w.json"
    result = CliRunner().invoke(main, ["sim", "pq-decoder", "--engine", "native", "--waves",
                                       "--set", "m=3", "--items", "300", "--stall", "0.2",
                                       "--json", str(out)])
    assert result.exit_code == 0, result.stderr
    data = json.loads(out.read_text())
    vcd = Path(data["run_dir"]) / "dump.vcd"
    assert f"waveform: {vcd}" in result.output
    text = vcd.read_text()
    assert "s_axis_codes_tvalid" in text and "m_axis_dist_tdata" in text
    times = [int(line[1:]) for line in text.splitlines() if line.startswith("#")]
    assert times[:4] == [2000, 4000, 6000, 8000]
    assert times[-1] == 4000 * (5 + data["cycles_run"])         # reset cycles, then the run
    plain = simulate(registry.get("pq-decoder"), registry.get("pq-decoder").config(m=3),
                     items=300, seed=1, stall=0.2, engine="native", keep_outputs=True)
    assert plain["mismatches"] == 0 and plain["cycles_run"] == data["cycles_run"]


def test_cli_native_json_fields(tmp_path):
    out = tmp_path / "n.json"
    result = CliRunner().invoke(main, ["sim", "pq-decoder", "--engine", "native", "--set",
                                       "m=5", "--items", "300", "--stall", "0.2", "--json",
                                       str(out)])
    assert result.exit_code == 0, result.stderr
    data = json.loads(out.read_text())
    assert data["engine"] == "native" and data["mismatches"] == 0 and data["items"] == 300
    assert data["cycles_per_second"] > 0 and "native engine" in result.stdout


def test_node_on_replicated_integer_vectors_from_the_cli(tmp_path):
    """`hwgen dataset digits-syn` writes integer vectors that `--base` uses as they are (no
    quantisation; the digits queries), here at 5,000 vectors on the native engine."""
    base = tmp_path / "syn.npy"
    runner = CliRunner()
    made = runner.invoke(main, ["dataset", "digits-syn", "--vectors", "5000", "--out", str(base)])
    assert made.exit_code == 0 and "6,388 vectors of 64 dimensions" in made.stdout
    out = tmp_path / "n.json"
    result = runner.invoke(main, ["sim", "chamvs-node", "--engine", "native", "--base",
                                  str(base), "--items", "5", "--stall", "0.1", "--json",
                                  str(out)])
    assert result.exit_code == 0, result.stderr
    data = json.loads(out.read_text())
    assert data["mismatches"] == 0 and data["dataset"] == "integer vectors"
    assert data["results"] == 5 * 10


def test_engines_share_one_interface_and_unknown_names_are_refused():
    from hwgen.errors import ConfigError
    from hwgen.flow.engine import ENGINES, get_engine
    assert list(ENGINES) == ["cocotb", "native"]
    for name, eng in ENGINES.items():
        assert get_engine(name) is eng and eng.name == name
        assert callable(eng.build) and callable(eng.run)
    # run folders: the cocotb engine keeps the bare name used before the engines existed
    assert (ENGINES["cocotb"].run_prefix, ENGINES["native"].run_prefix) == ("", "native-")
    with pytest.raises(ConfigError, match="^engine='verilog': must be one of cocotb, native$"):
        get_engine("verilog")
