"""Performance model of whole recommendation designs (hwgen.recsys.perf) and
``hwgen bench recsys``: stage formulas, monotonicity, the paper's designs, the model against
Verilator (configurations shared with tests/test_sim.py, so no extra builds)."""

import math

import pytest
from click.testing import CliRunner

from hwgen import registry
from hwgen.cli import main
from hwgen.errors import ConfigError
from hwgen.recsys import embedding, perf
from hwgen.recsys.bench import model_vs_simulation
from hwgen.recsys.model import preset
from hwgen.recsys.placement import place

from conftest import requires_verilator


@pytest.fixture(scope="module")
def paper():
    return preset("paper-ctr")


@pytest.fixture(scope="module")
def designs(paper):
    return perf.paper_designs(paper)


# -- lookup stage -------------------------------------------------------------------------------

@pytest.mark.parametrize("index", range(len(embedding.TEST_CONFIGS)))
@pytest.mark.parametrize("memory_latency", [0, 2, 45])
def test_lookup_stage_is_the_embedding_units_model(index, memory_latency):
    """perf.lookup_stage re-applies EmbeddingConfig.performance to any placement: on every
    embedding test configuration (which the simulations check) the two agree."""
    cfg = embedding.EmbeddingConfig.from_dict(embedding.TEST_CONFIGS[index])
    want = cfg.performance(cfg.workload(memory_latency=memory_latency))
    got = perf.lookup_stage(cfg.placement, cfg.lanes, memory_latency, cfg.inflight)
    for key in ("initiation_interval", "latency_cycles", "inference_cycles", "credit_bound"):
        assert got[key] == want[key], key


@pytest.mark.parametrize("memory_latency", [0, 2, 45])
def test_lookup_stage_by_hand(memory_latency):
    """Schedules worked out by hand (L: AR-to-R cycles; 12 pipeline cycles from a table's last
    word to its elements in the output beat, ``embedding.PIPELINE_CYCLES``).

    Test configuration 3: nine tables of one word each, five on the HBM channel and four on the
    DDR channel, all 64 lanes in one output beat. A channel issues one read per cycle, so the
    HBM channel's fifth word arrives at 4 + L and the beat leaves at 12 + 4 + L; one inference
    per five cycles (the HBM channel's five words), one output beat each, while its 8 reads
    in flight cover the latency.

    Test configuration 2: one lane, 21 output beats; table 2 (beats 5 and 6, after 1 + 4
    elements of on-chip tables 0 and 1) is the only one in memory. On-chip rows are ready 9
    cycles after the query (``embedding.ONCHIP_CYCLES``), so beats 0-4 leave at 9..13; beat 5
    waits for table 2's word at 12 + L: at 14 when L <= 2 (then one per cycle: 34 for beat
    20), at 12 + L when L is larger."""
    three = embedding.EmbeddingConfig.from_dict(embedding.TEST_CONFIGS[3])
    for got in (three.performance(three.workload(memory_latency=memory_latency)),
                perf.lookup_stage(three.placement, three.lanes, memory_latency,
                                  three.inflight)):
        assert got["latency_cycles"] == 12 + 4 + memory_latency
        if memory_latency < 45:
            assert got["initiation_interval"] == 5 and not got["credit_bound"]
        else:                  # 8 reads in flight cannot cover 45 cycles: credits bound it
            assert got["initiation_interval"] > 5 and got["credit_bound"]
    two = embedding.EmbeddingConfig.from_dict(embedding.TEST_CONFIGS[2])
    times, _ = embedding.output_beat_times(two.placement, two.rec_model.tables, two.lanes,
                                           two.out_beats, memory_latency)
    table2 = max(12 + memory_latency, 14)
    assert times == [9, 10, 11, 12, 13] + list(range(table2, table2 + 16))
    assert two.performance(two.workload(memory_latency=memory_latency))["latency_cycles"] == 9


def test_lookup_stage_of_paper_model(paper):
    """876 elements at 16 per beat: 55 output beats, more than any channel's words, so the
    unit is output bound; more lanes make it channel bound."""
    p = place(paper, "u280", clock_mhz=135)
    lk = perf.lookup_stage(p, 16)
    assert lk["output_beats"] == math.ceil(876 / 16)
    assert lk["initiation_interval"] == max(lk["output_beats"], p.max_rounds)
    wide = perf.lookup_stage(p, 256)
    assert wide["initiation_interval"] == max(math.ceil(876 / 256), p.max_rounds)
    assert wide["latency_cycles"] <= lk["inference_cycles"]


# -- FC stages ----------------------------------------------------------------------------------

def _bound(fan_in, rows, pes, mults, lanes):
    return max(math.ceil(rows / pes) * math.ceil(fan_in / mults), math.ceil(fan_in / lanes),
               math.ceil(rows / lanes))


def test_fc_stages_follow_the_pe_counts(designs, paper):
    """Each share's cycles per inference: R * S or the beats, R = rows per PE, S = input
    steps, from the partition's PE counts (rows of a layer add up to its outputs)."""
    shapes = dict(zip(("L1", "L2", "L3", "out"), paper.layer_shapes))
    for d, _ in designs.values():
        rows = {}
        for s in d.stages:
            if "layer" not in s.detail:
                continue
            layer = s.detail["layer"]
            pes = int(s.name.split()[1])
            mults = int(s.name.split()[-1])
            fan_in = shapes[layer][0]
            assert s.detail["in"] == fan_in
            assert s.cycles_per_inference == _bound(fan_in, s.detail["rows"], pes, mults, 16)
            assert s.inferences_per_s == pytest.approx(s.clock_mhz * 1e6
                                                       / s.cycles_per_inference)
            rows[layer] = rows.get(layer, 0) + s.detail["rows"]
        assert rows == {k: v[1] for k, v in shapes.items()}


def test_four_node_design_is_bound_by_layer_two(designs):
    """1024 / 512 / 128 PEs of 16 multipliers at 135 MHz: layer 1 needs ceil(876/16) = 55
    cycles, layer 2 ceil(1024/16) = 64, layer 3 2 rows x 32 = 64; so 135e6 / 64."""
    d, _ = designs[4]
    assert d.layer_pes == [1024, 512, 128]
    assert d.inferences_per_s == pytest.approx(135e6 / 64)
    assert d.bottleneck.startswith(("L2", "L3"))


# -- whole designs ------------------------------------------------------------------------------

def test_more_nodes_are_faster(designs):
    one, two, four = (designs[n][0] for n in (1, 2, 4))
    assert one.inferences_per_s < two.inferences_per_s < four.inferences_per_s
    # Every node of hwgen's partitions holds 83% of its DSPs in busy PEs, so a node delivers
    # about the same rate in every design (the paper's cluster nodes beat its single node
    # by 2.16x / 1.92x because MicroRec's single node used only 57.55% of its DSPs).
    per_node = [d.inferences_per_s / d.nodes for d in (one, two, four)]
    assert max(per_node) / min(per_node) < 1.1


def test_two_node_design_is_limited_by_the_slow_node(paper, designs):
    """Node 1 of the paper's 2-node design runs at 115 MHz: at 135 MHz it would be faster."""
    slow, _ = designs[2]
    assert "(node 1)" in slow.bottleneck
    fast = perf.design_performance(paper, "u280", 2, clocks=(135, 135))
    assert fast.inferences_per_s > slow.inferences_per_s


def test_monotonic_in_multipliers_and_network(paper):
    base = perf.design_performance(paper, "u280", 4)
    # 32 multipliers per PE: layer 2 would take 32 steps, but its 1024 inputs still arrive
    # in 64 beats of 16: the rate stays, the latency falls; with 32 lanes the rate rises too
    more = perf.design_performance(paper, "u280", 4, mults=32)
    assert more.inferences_per_s == base.inferences_per_s
    assert more.latency_ns < base.latency_ns
    wide = perf.design_performance(paper, "u280", 4, mults=32, lanes=32)
    assert wide.inferences_per_s > base.inferences_per_s
    # each extra microsecond per hop adds a microsecond per hop of the longest chain
    slow = perf.design_performance(paper, "u280", 4, hop_latency_ns=3000)
    assert slow.latency_ns - base.latency_ns == pytest.approx(2000 * base.hops)
    assert slow.inferences_per_s == base.inferences_per_s       # latency only
    assert base.hops == 4                                       # 1 -> 2 -> 3 -> 4 -> 1
    # a slow link becomes the bottleneck: the busiest link's bytes at its rate
    thin = perf.design_performance(paper, "u280", 4, link_gbps=1)
    busiest = max(s.detail.get("bytes_per_inference", 0) for s in thin.stages)
    assert thin.bottleneck.startswith("link")
    assert thin.inferences_per_s == pytest.approx(1e9 / 8 / busiest)
    assert thin.latency_ns > base.latency_ns


def test_latency_parts_add_up(designs):
    for nodes, (d, _) in designs.items():
        assert sum(d.latency_parts.values()) == pytest.approx(d.latency_ns)
        assert all(v >= 0 for v in d.latency_parts.values())
        if nodes == 1:
            assert d.latency_parts["network"] == 0 and d.hops == 0
        else:
            assert d.latency_parts["network"] >= d.hops * perf.HOP_LATENCY_NS


def test_paper_figures_are_consistent():
    """The transcribed speed-ups agree with the paper's other statements: 4.32x and 7.68x the
    single FPGA, 2.16x and 1.92x per node."""
    d = perf.PAPER_DESIGNS
    assert d[2]["speedup"] / d[1]["speedup"] == pytest.approx(4.32, abs=0.01)
    assert d[4]["speedup"] / d[1]["speedup"] == pytest.approx(7.68, abs=0.01)
    assert d[2]["speedup"] / d[1]["speedup"] / 2 == pytest.approx(2.16, abs=0.01)
    assert d[4]["speedup"] / d[1]["speedup"] / 4 == pytest.approx(1.92, abs=0.01)
    assert perf.cpu_inferences_per_s() == pytest.approx(1024 / 31.72e-3)


@pytest.mark.parametrize("kwargs, name", [
    ({"nodes": 0}, "nodes"),
    ({"nodes": 2, "clocks": (135,)}, "clocks"),
    ({"nodes": 1, "clocks": (0,)}, "clocks"),
    ({"nodes": 2, "mults": 0}, "mults"),
    ({"nodes": 2, "hop_latency_ns": -1}, "hop_latency_ns"),
    ({"nodes": 2, "link_gbps": 0}, "link_gbps"),
])
def test_invalid_options_name_the_parameter(paper, kwargs, name):
    with pytest.raises(ConfigError) as e:
        perf.design_performance(paper, "u280", **kwargs)
    assert e.value.param == name


def test_bench_without_simulation_prints_the_paper_table():
    result = CliRunner().invoke(main, ["bench", "recsys", "--no-sim"])
    assert result.exit_code == 0, result.output
    for text in ("| 4 nodes |", "| 2 nodes |", "28.95", "16.31", "3.77", "20.05", "12.06",
                 "115/135", "model/paper", "DDR[0]"):
        assert text in result.output


# -- against Verilator --------------------------------------------------------------------------

@requires_verilator
def test_models_within_five_percent_of_simulation():
    """The bench's comparison on the issue's FC size (100 -> 37, 8 PEs) and the 13-table
    lookup unit (the first FC and embedding test configurations: builds shared with
    tests/test_sim.py)."""
    rows = model_vs_simulation(echo=lambda line: None, fc_cases=(0,), embedding_cases=(0,))
    assert [r["block"] for r in rows] == ["recsys-fc", "recsys-embedding"]
    for r in rows:
        assert r["mismatches"] == 0
        assert r["ii_error"] <= 0.05 and r["latency_error"] <= 0.05, r
        assert r["sim_ii"] > 0 and r["sim_latency"] > 0
    acc = registry.get("recsys-fc")
    cfg = acc.config.from_dict({"in_dim": 100, "out_dim": 37, "pes": 8})
    # the FC share model used by the design: same cycles as the simulated block
    share = perf.fc_stage(100, 37, 8, cfg.mults, cfg.lanes, 8, 8, 8)
    assert share["cycles_per_inference"] == pytest.approx(rows[0]["sim_ii"], rel=0.05)
