"""cluster-gateway: fuzzed malformed traffic on Verilator (every malformed packet dropped and
counted, good packets behind it delivered, nothing hangs), counters against the golden model,
and the GMI header attacher/stripper."""

import numpy as np
import pytest

from hwgen import registry
from hwgen.cluster.gateway import GatewayConfig, GatewayModel, TEST_CONFIGS
from hwgen.cluster.packet import Packet, attach_header, from_beats, split_packets, \
    strip_header
from hwgen.cluster.switch import DROP_KINDS
from hwgen.errors import ConfigError
from hwgen.flow.simulate import simulate

from conftest import assert_fuzz_exact, requires_verilator


def test_gateway_golden_accounts_for_every_packet():
    cfg = GatewayConfig(members=5, length=33)
    stim = GatewayModel.stimulus(cfg, 0, np.random.default_rng(1), fuzz=800)
    out, counts = GatewayModel.golden(cfg, stim)
    groups = split_packets(stim["beats"])
    assert counts["delivered"] + sum(counts[k] for k in DROP_KINDS) == len(groups)
    assert all(counts[k] > 0 for k in DROP_KINDS), counts
    # Point-to-point packets come out as strip_header of what went in.
    p = out["o_pkt"][-1]
    assert p == strip_header(from_beats(groups[-1], cfg.data_bits))
    assert attach_header(p, cfg.cluster_id, p.dest, p.src_cluster).payload[0] == p.dest


@pytest.mark.parametrize("values, name", [
    ({"virtual": "allreduce"}, "virtual"), ({"virtual": "gather,gather"}, "virtual"),
    ({"members": 5, "kernels": 3}, "kernels"), ({"members": 0}, "members"),
    ({"elem_bits": 12}, "elem_bits"), ({"length": 4096, "members": 200}, "length"),
    ({"local_ids": "1-x"}, "local_ids"), ({"local_ids": "0-3"}, "local_ids"),
    ({"groups": "bcast@9:1,2"}, "groups"), ({"groups": "gather@9:1,3"}, "groups"),
    ({"groups": "broadcast@9:1;scatter@9:2"}, "groups"),
    ({"groups": "broadcast@3:1,2", "local_ids": "1-4"}, "groups")])
def test_gateway_config_errors_name_parameter(values, name):
    with pytest.raises(ConfigError) as e:
        GatewayConfig(**values)
    assert name in str(e.value)


def test_gateway_groups_remap_members():
    """A fan-out virtual kernel with non-contiguous members addresses them by rank and the
    gateway rewrites TDEST: the golden model sends member i's chunk to the i-th listed id."""
    cfg = GatewayConfig(groups="scatter@12:7,2,5", local_ids="1-8", length=3)
    assert cfg.remapped("scatter") and cfg.gmi_config("scatter").first_member == 0
    body = bytes(range(9))
    sent, status = cfg.collective("scatter", [Packet(12, 4, body)])
    assert [(p.dest, p.payload) for p in sent] == [(7, body[0:3]), (2, body[3:6]),
                                                    (5, body[6:9])]
    assert {p.src for p in sent} == {12} and status["rounds"] == 1
    plain = GatewayConfig(groups="broadcast@12:2-4", local_ids="1-8", length=3)
    assert not plain.remapped("broadcast") and plain.gmi_config("broadcast").first_member == 2


def _run(index, **kw):
    acc = registry.get("cluster-gateway")
    return simulate(acc, acc.config.from_dict(TEST_CONFIGS[index]), **{"engine": "native", **kw})


@requires_verilator
@pytest.mark.parametrize("index, stall, fuzz", [(0, 0.3, 1000), (1, 0.4, 400), (2, 0.0, 600)])
def test_gateway_fuzz(index, stall, fuzz):
    r = _run(index, items=1, seed=40 + index, stall=stall, stimulus_options={"fuzz": fuzz})
    assert_fuzz_exact(r)


@requires_verilator
def test_gateway_counter_check_catches_wrong_count(monkeypatch):
    real = GatewayModel.golden

    def off(config, stim):
        out, counts = real(config, stim)
        return out, dict(counts, truncated=counts["truncated"] - 1)

    monkeypatch.setattr(GatewayModel, "golden", staticmethod(off))
    r = _run(0, items=1, seed=6, stall=0.2, stimulus_options={"fuzz": 200})
    assert r["counter_mismatches"] == 1 and r["mismatches"] >= 1


@requires_verilator
@pytest.mark.parametrize("index", [0, 1])
def test_header_attach_strip(index):
    acc = registry.get("gmi-header")
    from hwgen.cluster.header import TEST_CONFIGS as HC
    r = simulate(acc, acc.config.from_dict(HC[index]), items=120, seed=8, stall=0.3,
                 engine="native")
    assert not r["timeout"] and r["mismatches"] == 0, r["first_mismatches"]
    assert r["results"] > 120
