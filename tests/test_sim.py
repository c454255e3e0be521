"""Every registered accelerator, simulated from its emitted Verilog on Verilator, bit-exact
against its golden model, in several configurations, with random input gaps and output
backpressure; plus measured initiation interval and latency against the models.

Every configuration runs on the native engine (the generated C++ testbench: beats in, beats
out); the first configuration of every accelerator also runs on the cocotb testbench
(cocotbext-axi sources, sinks and AXI memories), and without stalls both engines must report
the same beats, cycles, latency and rate."""

import numpy as np
import pytest

from hwgen import registry
from hwgen.flow.model import StreamModel
from hwgen.flow.simulate import simulate

from conftest import requires_verilator

pytestmark = requires_verilator

CASES = [(name, i, "native") for name in registry.names()
         for i in range(len(registry.get(name).test_configs))] + \
    [(name, 0, "cocotb") for name in registry.names()]


def _cfg(name, index):
    acc = registry.get(name)
    return acc, acc.config.from_dict(acc.test_configs[index])


@pytest.mark.parametrize("name, index, engine", CASES,
                         ids=[f"{n}-{i}-{e}" for n, i, e in CASES])
def test_bit_exact_with_random_stalls(name, index, engine):
    acc, cfg = _cfg(name, index)
    items = acc.test_items or acc.default_items
    options = {"min_scan": 1} if name == "pq-decoder" else None   # many short scans
    result = simulate(acc, cfg, items=items, seed=100 + index, stall=0.3,
                      stimulus_options=options, engine=engine)
    assert not result["timeout"]
    assert result["mismatches"] == 0, result["first_mismatches"]
    # the hardware handed over every result beat, and the stalls took effect: sources idled
    # between beats and sinks held valid beats back
    assert result["results_received"] == result["results"] > 0
    assert result["input_gaps"] > 0 and result["output_stalls"] > 0, result
    assert result["engine"] == engine


@pytest.mark.parametrize("name", registry.names())
def test_engines_agree_without_stalls(name):
    """Same stimulus, no stalls: both testbenches receive the same beats and, where no
    memory model with its own random latency is involved, count the same cycles. Then the
    same stimulus with stalls, on each engine: the gaps and held beats are counted, and the
    run takes no fewer cycles than without them (a compute-bound block absorbs 30% stalls in
    its buffers: the attention dot product, ``head_dim`` cycles per round, finishes 0 to 2
    cycles later)."""
    acc, cfg = _cfg(name, 0)
    items = min(acc.test_items or acc.default_items, 400)
    runs = {engine: simulate(acc, cfg, items=items, seed=7, stall=0.0, engine=engine,
                             keep_outputs=True) for engine in ("cocotb", "native")}
    for r in runs.values():
        assert r["mismatches"] == 0 and not r["timeout"], r["first_mismatches"]
        assert r["input_gaps"] == 0 and r["output_stalls"] == 0
    assert runs["cocotb"]["outputs"] == runs["native"]["outputs"]
    if acc.model.memories is StreamModel.memories:
        for key in ("cycles", "latency_cycles", "results_per_cycle"):
            assert runs["cocotb"][key] == runs["native"][key], key
    for engine, plain in runs.items():
        stalled = simulate(acc, cfg, items=items, seed=7, stall=0.3, engine=engine)
        assert stalled["mismatches"] == 0 and not stalled["timeout"]
        assert stalled["input_gaps"] > 0 and stalled["output_stalls"] > 0, (engine, stalled)
        assert stalled["cycles"] >= plain["cycles"], engine


@pytest.mark.parametrize("engine", ["cocotb", "native"])
def test_harness_detects_wrong_results(monkeypatch, engine):
    """A golden model that is off by one in a few places must produce mismatches."""
    from hwgen.vecsearch import golden
    acc, cfg = _cfg("pq-decoder", 0)
    real = golden.pq_distances
    monkeypatch.setattr(golden, "pq_distances",
                        lambda codes, lut: real(codes, lut) + (codes[:, 0] == 5))
    result = simulate(acc, cfg, items=600, seed=3, stall=0.2, engine=engine)
    assert result["mismatches"] > 0
    assert result["first_mismatches"][0]["port"] == "o_dist"


def test_pq_decoder_one_distance_per_cycle():
    acc = registry.get("pq-decoder")
    cfg = acc.make_config(["m=24", "lut_bits=18"])
    result = simulate(acc, cfg, items=20000, seed=7, stall=0.0, engine="native")
    assert result["mismatches"] == 0
    assert result["results_per_cycle"] >= 0.99
    assert result["latency_cycles"] == cfg.performance()["latency_cycles"]


@pytest.mark.parametrize("buffers, min_scan", [(1, 256), (2, 256), (2, 1)])
def test_pq_decoder_cycles_match_model(buffers, min_scan):
    """The cycle model is exact: LUT loads of 256 cycles hidden by the second buffer except
    behind scans shorter than a load, fully exposed with one buffer."""
    acc = registry.get("pq-decoder")
    cfg = acc.make_config(["m=16", f"lut_buffers={buffers}"])
    result = simulate(acc, cfg, items=6000, seed=9, stall=0.0,
                      stimulus_options={"min_scan": min_scan}, engine="native")
    assert result["mismatches"] == 0
    rng = np.random.default_rng(9)
    scans = acc.model.scan_lengths(6000, rng, min_scan)
    predicted = cfg.performance(cfg.workload(scans=scans))["cycles"]
    assert result["cycles"] == predicted


@pytest.mark.parametrize("sets", [["dim=96", "m=12", "lut_bits=20"],
                                  ["dim=35", "m=7", "elem_bits=6", "sub_par=3"]])
def test_lut_builder_cycles_match_model(sets):
    acc = registry.get("lut-builder")
    cfg = acc.make_config(sets)
    result = simulate(acc, cfg, items=4, seed=1, stall=0.0, engine="native")
    assert result["mismatches"] == 0
    model = cfg.performance()
    assert result["latency_cycles"] == model["latency_cycles"]
    assert result["results_per_cycle"] == pytest.approx(1 / cfg.steps, rel=1e-3)
    assert result["cycles"] == cfg.performance(cfg.workload(pairs=4))["cycles"]


@pytest.mark.parametrize("name", ["systolic-pq", "insert-pq"])
@pytest.mark.parametrize("k", [1, 7, 37])
def test_queue_cycles_match_model(name, k):
    """Back-to-back queries at full rate: the systolic queue takes an item every two cycles
    and sorts for k cycles after each query; the insertion queue takes one per cycle."""
    acc = registry.get(name)
    cfg = acc.make_config([f"k={k}"])
    result = simulate(acc, cfg, items=2000, seed=4, stall=0.0, engine="native")
    assert result["mismatches"] == 0
    stim = acc.model.stimulus(cfg, 2000, np.random.default_rng(4))
    queries = [len(d) for d, _ in stim["queries"]]
    assert result["cycles"] == cfg.performance(cfg.workload(queries=queries))["cycles"]
