"""The packet-level cycle model of an encoder cluster (:mod:`hwgen.cluster.plan.packet_model`).

Its agreement with the simulated RTL is checked where the RTL runs: ``mini_encoder`` at M 1
without stalls in ``test_cluster_encoder_sim.py`` (within 5%), and ``hwgen bench cluster`` for
``mini_encoder`` at M 1..4 and ``minilm_encoder``. Here: its bookkeeping against the plan.
"""

import pytest

from hwgen.cluster.plan import packet_model, router_load


@pytest.mark.parametrize("desc,m", [("mini_encoder", 1), ("mini_encoder", 3),
                                    ("minilm_encoder", 8)])
def test_routers_serve_the_plans_beats(desc, m):
    r = packet_model.packet_timing(desc, m, 220)
    load = router_load.description_load(desc, m)
    assert r["router_beats"] == {n: v["beats"] for n, v in load.items()}
    assert len(r["output_cycles"]) == m
    assert all(len(rows) == m for rows in r["kernels"].values())


def test_each_hop_on_the_critical_path_counts_once():
    # minilm_encoder's first output row crosses fpga1 -> fpga2 -> fpga3 -> fpga5 -> fpga6 ->
    # fpga4 (the residuals' crossings run beside it): five hops; hops that are multiples of
    # the testbench's poll period keep the poll rounding unchanged
    a = packet_model.packet_timing("minilm_encoder", 1, 16 * 14)
    b = packet_model.packet_timing("minilm_encoder", 1, 16 * 20)
    assert b["X"] - a["X"] == 5 * 16 * 6


def test_output_interval_is_the_slowest_kernels_period():
    # ffn_down's linear (1536 -> 384), the slowest stage, emits a row every 768 cycles
    from hwgen.cluster.spec.describe import load
    r = packet_model.packet_timing("minilm_encoder", 6, 220)
    desc = load("minilm_encoder")
    (down,) = [l for l in desc.clusters[0].layers.layers if l.name == "ffn_down"]
    from hwgen import registry
    lin = down.modules[0]
    cfg = registry.get(lin.kind).config.from_dict(lin.params)
    assert r["I"] == cfg.row_timing(6)[1] == 768
    assert r["T"] - r["X"] == 5 * 768
