"""cluster-router, kernel switch and GMI header: golden-model checks, config validation, and
Verilator runs (fuzzed traffic with stalls, counters against the golden model)."""

import numpy as np
import pytest

from hwgen import registry
from hwgen.cluster.golden import traffic
from hwgen.cluster.spec.packet import Packet, classify, split_packets, to_beats
from hwgen.cluster.spec.router import RouterConfig
from hwgen.cluster.gateware.router import RouterModel, TEST_CONFIGS
from hwgen.cluster.spec.switch import DROP_KINDS, SwitchConfig
from hwgen.errors import ConfigError
from hwgen.flow.simulate import simulate

from conftest import assert_fuzz_exact, requires_verilator


# -- models (no simulator) -------------------------------------------------------------------

@pytest.mark.parametrize("data_bits", [64, 512])
def test_malform_makes_each_kind(data_bits):
    """Each fuzz kind, applied to good packets, is classified as that kind."""
    rng = np.random.default_rng(4)
    lanes = data_bits // 8
    for kind in traffic.MALFORMED_KINDS:
        for _ in range(50):
            n = int(rng.integers(1, 4 * lanes))
            good = to_beats(Packet(3, 1, bytes(rng.integers(0, 256, n, dtype=np.uint8))),
                            data_bits)
            other = to_beats(Packet(4, 2, b"xy"), data_bits)
            bad = traffic.malform(kind, good, other, rng, data_bits, max_beats=4)
            assert classify(bad, data_bits, 4) == kind, (kind, n)
            assert bad[-1]["last"] == 1


def test_router_golden_routes_and_counts():
    cfg = RouterConfig(members=5, length=33)
    stim = RouterModel.stimulus(cfg, 0, np.random.default_rng(2), fuzz=600)
    passed, counts = RouterModel.golden(cfg, stim)
    groups = split_packets(stim["beats"])
    assert sum(counts.values()) == len(groups)
    assert all(counts[k] > 0 for k in DROP_KINDS), counts
    exp = RouterModel.expect(cfg, stim)
    assert len(exp["o_addr"]) == sum(1 for _, a in passed if a != cfg.node_address)
    assert all(a["addr"] != cfg.node_address for a in exp["o_addr"])
    # The last packet goes to the network (counters are sampled at its TLAST).
    assert groups[-1] == passed[-1][0] and passed[-1][1] != cfg.node_address


@pytest.mark.parametrize("values, name", [
    ({"data_bits": 32}, "data_bits"), ({"members": 0}, "members"),
    ({"length": 0}, "length"), ({"node_address": -1}, "node_address"),
    ({"length": 9000000}, "length")])
def test_router_config_errors_name_parameter(values, name):
    with pytest.raises(ConfigError) as e:
        RouterConfig(**values)
    assert e.value.args and name in str(e.value)


def test_switch_config_errors():
    with pytest.raises(ConfigError, match="routes"):
        SwitchConfig(outputs=2, routes="3:2")
    with pytest.raises(ConfigError, match="routes"):
        SwitchConfig(routes="x")


# -- Verilator -------------------------------------------------------------------------------

def _run(index, **kw):
    acc = registry.get("cluster-router")
    return simulate(acc, acc.config.from_dict(TEST_CONFIGS[index]), **{"engine": "native", **kw})


@requires_verilator
@pytest.mark.parametrize("index, stall", [(0, 0.3), (1, 0.5), (2, 0.0)])
def test_router_fuzz_counters_match_golden(index, stall):
    r = _run(index, items=1, seed=20 + index, stall=stall,
             stimulus_options={"fuzz": 500})
    assert_fuzz_exact(r)


@requires_verilator
def test_router_counter_check_catches_wrong_count(monkeypatch):
    """A golden model that is one off in one counter must make the run fail."""
    real = RouterModel.golden

    def off_by_one(config, stim):
        passed, counts = real(config, stim)
        return passed, dict(counts, unknown=counts["unknown"] + 1)

    monkeypatch.setattr(RouterModel, "golden", staticmethod(off_by_one))
    r = _run(0, items=1, seed=3, stall=0.2, stimulus_options={"fuzz": 100})
    assert r["counter_mismatches"] == 1
    assert r["mismatches"] >= 1
    assert r["first_mismatches"][-1]["port"] == "status"


@requires_verilator
@pytest.mark.parametrize("values", [
    {"inputs": 3, "outputs": 4, "routes": "1:0,2:1,3:2,4:3,5:3,9:0"},
    {"data_bits": 512, "inputs": 5, "outputs": 2, "routes": "1:0,2:1,7:1",
     "drop_unmapped": False},
])
def test_kernel_switch_packet_atomic_round_robin(values):
    """Every input's packets reach the right output intact and in order, never interleaved
    with another input's packet (arbitration order itself is free)."""
    from hwgen.cluster.spec.packet import from_beats
    from hwgen.cluster.gateware.switch import SwitchModel
    acc = registry.Accelerator(
        name="cluster-switch", summary="kernel switch test",
        config_path="hwgen.cluster.spec.switch:SwitchConfig",
        top_path="hwgen.cluster.gateware.switch:KernelSwitch",
        model_path="hwgen.cluster.gateware.switch:SwitchModel")
    cfg = SwitchConfig(**values)
    r = simulate(acc, cfg, items=60, seed=5, stall=0.3, keep_outputs=True, engine="native")
    assert not r["timeout"]
    stim = SwitchModel.stimulus(cfg, 60, np.random.default_rng(5))
    want = SwitchModel.routed(cfg, stim)
    for port, by_input in want.items():
        got = [from_beats(b, cfg.data_bits) for b in split_packets(r["outputs"][port])]
        for k, packets in by_input.items():
            assert [p for p in got if p.src == k] == packets, (port, k)
        assert len(got) == sum(map(len, by_input.values()))


def test_golden_routes_a_hand_written_case():
    """Five packets worked out by hand: kernel 0 lives on node A, kernel 1 here, kernel 4 is
    in no table; cluster 2 is behind node B, cluster 3 unknown. Expected: kernel 1's packet
    on ``o_local``; kernel 0's and cluster 2's on ``o_net`` with addresses A then B; the
    packets to kernel 4 and cluster 3 dropped as unknown."""
    cfg = RouterConfig.from_dict({"members": 5, "clusters": 4, "length": 33})
    here, node_a, node_b = cfg.node_address, 0x0A000003, 0x0A000007
    packets = [Packet(0, 9, b"to A"), Packet(1, 9, b"here"), Packet(4, 9, b"nowhere"),
               Packet(2, 9, b"\x01via B", inter_cluster=True, src_cluster=1),
               Packet(3, 9, b"\x01lost", inter_cluster=True, src_cluster=1)]
    beats = [to_beats(p, cfg.data_bits) for p in packets]
    stim = {"ktab": {0: node_a, 1: here}, "ctab": {0: here, 2: node_b},
            "beats": [b for group in beats for b in group]}
    want = {"o_local": beats[1], "o_net": beats[0] + beats[3],
            "o_addr": [{"addr": node_a}, {"addr": node_b}]}
    assert RouterModel.expect(cfg, stim) == want
    _, counts = RouterModel.golden(cfg, stim)
    assert counts == {"delivered": 3, **{k: 0 for k in DROP_KINDS}, "unknown": 2}
