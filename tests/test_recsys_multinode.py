"""Multi-node function simulation of the recommendation model (issue 6, deliverable 6).

Node plans come from the partitioner; every node's top runs in Verilator with random stalls and
the activation streams between nodes go through the network model; the last layer's outputs
must equal the golden model end to end. A node built with the wrong rows of a layer must be
caught. Builds: 2 node tops of the 2-node split, 4 of the 4-node split, 1 corrupted node.
"""

import json

import numpy as np
import pytest
from click.testing import CliRunner

from hwgen.cli import main
from hwgen.errors import ConfigError
from hwgen.recsys import golden
from hwgen.recsys.model import cluster_ctr
from hwgen.recsys.multinode import (Network, network_timeline, plan_cluster, simulate_cluster,
                                    slice_rows)
from hwgen.recsys.node import NodeConfig, SliceConfig

from conftest import requires_verilator


# -- plans (no simulation) ---------------------------------------------------------------------

def test_cluster_model_is_odd():
    m = cluster_ctr()
    dims = [t.dim for t in m.tables]
    assert len(m.tables) == 6 and any(d % 2 for d in dims) and min(t.rows for t in m.tables) == 1
    assert m.concat_len == 35 and m.concat_len & (m.concat_len - 1)
    assert m.layers == (29, 13, 7, 1)


@pytest.mark.parametrize("nodes", [1, 2, 3, 4])
def test_plan_follows_partitioner(nodes):
    plan = plan_cluster(nodes=nodes)
    m, part = plan.model, plan.partition
    assert part.layer_pes == [16, 8, 2] and part.ratios == [8, 4, 1] and part.feasible
    assert [c.embedding for c in plan.configs] == [True] + [False] * (nodes - 1)
    for layer, out in enumerate(m.layers):
        rows = [r for _, s, n, _ in plan.layer_slices[layer] for r in range(s, s + n)]
        assert rows == list(range(out))                   # every row once, in order
        w, b = golden.layer_params(m, layer)
        # the node tops' weights, put together in row order, are the layer's weights
        ws = [plan.configs[n].slice_config(layer).parameters for n, *_ in
              plan.layer_slices[layer]]
        assert np.array_equal(np.concatenate([p[0] for p in ws]), w)
        assert np.array_equal(np.concatenate([p[1] for p in ws]), b)
    # PEs of each node's slices: the partitioner's (capped by the slice's rows)
    for n, node in enumerate(part.nodes):
        mine = {l: p for l, _, _, p in plan.configs[n].slice_list}
        for s in node.slices:
            assert mine[s.layer] == s.pes
    # the output layer's unit on the last node
    assert plan.layer_slices[-1] == [(nodes - 1, 0, 1, 1)]


def test_four_node_layout_like_the_paper():
    """Layer 1 over nodes 1-3, layer 2 over nodes 3-4, layer 3 and the output on node 4."""
    plan = plan_cluster(nodes=4)
    holders = [sorted(n + 1 for n, *_ in sl) for sl in plan.layer_slices]
    assert holders == [[1, 2, 3], [3, 4], [4], [4]]


def test_slice_rows_are_proportional():
    assert slice_rows(29, 16, 0, 13) == (0, 23)
    assert slice_rows(29, 16, 13, 3) == (23, 6)
    assert slice_rows(7, 2, 1, 1) == (3, 4)


def test_invalid_configs_name_the_parameter():
    with pytest.raises(ConfigError) as e:
        plan_cluster(nodes=0)
    assert e.value.param == "nodes"
    with pytest.raises(ConfigError) as e:
        NodeConfig(slices="0:20:10:2")                    # rows 20..29 of a 29-row layer
    assert e.value.param == "slices"
    with pytest.raises(ConfigError) as e:
        NodeConfig(slices="1:0:13:14")                    # more PEs than rows
    assert e.value.param == "slices"
    with pytest.raises(ConfigError) as e:
        NodeConfig(embedding=False, slices="")
    assert e.value.param == "slices"
    with pytest.raises(ConfigError) as e:
        SliceConfig(in_dim=35, out_dim=10, pes=2, layer_rows=29, row_start=20)
    assert e.value.param == "row_start"


def test_network_timeline_by_hand():
    """Zero-time blocks: the 2-node critical path is the embedding vector (35 B) and node 1's
    23 rows (23 B) on node 1's link, then the 4-byte result back: 2 latencies and 62 bytes of
    serialisation at 100 Gb/s (0.08 ns per byte)."""
    plan = plan_cluster(nodes=2)
    blocks = {(n, b): {"single_cycles": 0, "cycles_per_inference": 10}
              for n, c in enumerate(plan.configs)
              for b in (["embedding"] if c.embedding else []) + [f"layer{l}" for l in c.layers]}
    for latency in (0.0, 1000.0, 2500.0):
        t = network_timeline(plan, blocks, Network(latency_ns=latency))
        assert t["latency_ns"] == pytest.approx(2 * latency + 62 * 0.08)
        assert t["compute_latency_ns"] == pytest.approx(0, abs=1e-6)
    assert t["bytes_sent"] == [35 + 23, 4] and t["bytes_received"] == [4, 58]
    # compute-bound: 10 cycles at 135 MHz
    assert t["inferences_per_s"] == pytest.approx(13.5e6) and t["bottleneck"] == "compute"
    slow = network_timeline(plan, blocks, Network(gbps=0.01))
    assert slow["bottleneck"] == "network"
    assert slow["inferences_per_s"] == pytest.approx(0.01e9 / (58 * 8), rel=1e-5)


# -- Verilator ---------------------------------------------------------------------------------

def _check_clean(report, items):
    assert report["timeouts"] == 0
    assert report["block_mismatches"] == 0
    assert report["layer_mismatches"] == [0] * (len(cluster_ctr().layers) + 1)
    assert report["mismatches"] == 0 and report["outputs"] == items
    for n in report["per_node"]:
        assert n["sim_cycles"] > 0
    assert report["network_ns"] >= 2 * report["network"]["latency_ns"]


@requires_verilator
def test_two_node_split_bit_exact(tmp_path):
    """hwgen recsys-cluster-sim: 2 nodes, 30% stalls, end to end against the golden model."""
    out = tmp_path / "c2.json"
    res = CliRunner().invoke(main, ["recsys-cluster-sim", "--nodes", "2", "--items", "40",
                                    "--stall", "0.3", "--seed", "5", "--latency-ns", "800",
                                    "--json", str(out)])
    assert res.exit_code == 0, res.output
    assert "mismatches: 0 of 40" in res.output
    report = json.loads(out.read_text())
    _check_clean(report, 40)
    assert len(report["runs"]) == 6                        # embedding + 5 slices
    assert [m["bytes"] for m in report["messages"]] == [35, 23, 4]


@requires_verilator
def test_four_node_split_bit_exact():
    plan = plan_cluster(nodes=4)
    report = simulate_cluster(plan, items=40, seed=9, stall=0.25,
                              network=Network(latency_ns=1500.0))
    _check_clean(report, 40)
    assert len(report["runs"]) == 1 + 3 + 2 + 1 + 1
    # the nodes exchange: node 1's embedding vector goes to nodes 2 and 3, ...
    pairs = {(m["from"], m["to"]) for m in report["messages"]}
    assert {(1, 2), (1, 3), (3, 4), (4, 1)} <= pairs


@requires_verilator
def test_wrong_weight_rows_are_caught():
    """Node 2 of the 2-node split built with rows 22..27 of layer 1 instead of 23..28: every
    block agrees with its own (wrong) golden model, and the end-to-end check must fail."""
    plan = plan_cluster(nodes=2)
    node2 = plan.configs[1]
    slices = [(l, s - 1 if l == 0 else s, r, p) for l, s, r, p in node2.slice_list]
    bad = plan.with_config(1, node2.replace(slices=slices))
    report = simulate_cluster(bad, items=20, seed=2, stall=0.2)
    assert report["block_mismatches"] == 0 and report["timeouts"] == 0
    assert report["layer_mismatches"][:1] == [0]
    assert report["layer_mismatches"][1] > 0 and report["mismatches"] > 0
    assert report["first_mismatches"]


def test_cli_rejects_bad_options():
    res = CliRunner().invoke(main, ["recsys-cluster-sim", "--nodes", "0"])
    assert res.exit_code == 2 and "nodes" in res.output
    res = CliRunner().invoke(main, ["recsys-cluster-sim", "--latency-ns", "-1"])
    assert res.exit_code == 2 and "latency_ns" in res.output
