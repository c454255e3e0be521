"""cluster-gateway: fuzzed malformed traffic on Verilator (every malformed packet dropped and
counted, good packets behind it delivered, nothing hangs), counters against the golden model,
and the GMI header attacher/stripper."""

import numpy as np
import pytest

from hwgen import registry
from hwgen.cluster.golden.collectives import gateway_collective
from hwgen.cluster.spec.gateway import GatewayConfig
from hwgen.cluster.gateware.gateway import GatewayModel, TEST_CONFIGS
from hwgen.cluster.spec.packet import Packet, attach_header, from_beats, split_packets, strip_header
from hwgen.cluster.spec.switch import DROP_KINDS
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


def test_gateway_golden_decodes_a_hand_written_case():
    """Eight packets from cluster 6 to cluster 5 (local kernels 1 and 2, a broadcast kernel with
    id 3 over members 1 and 2, messages of 3 bytes), worked out by hand: the point-to-point
    packet to kernel 2 comes out with its header byte removed and TDEST 2; the 3-byte message
    to kernel 3 is broadcast to kernels 1 and 2 with TID 3 and source cluster 5; a 2-byte
    message to kernel 3 passes the decoder and is dropped by the broadcast kernel for its
    length; packets for cluster 7, for kernel 9 (none here) and without the inter-cluster flag
    are unknown; 8 bytes and the header byte to kernel 1 are two 64-bit beats where the longest
    legitimate packet (3 bytes and the header) is one: too long; a beat with no byte kept is
    zero-length; an inter-cluster packet holding its header byte only is truncated."""
    cfg = GatewayConfig(cluster_id=5, members=2, length=3, elem_bits=8, kernels=2,
                        virtual="broadcast")
    assert cfg.virtual_ids == {"broadcast": 3} and cfg.max_beats == 1

    def inter(cluster, kernel, src, payload):
        return attach_header(Packet(0, src, payload), cluster, kernel, src_cluster=6)

    packets = [inter(5, 2, 9, b"hi"), inter(5, 3, 1, b"\x01\x02\x03"),
               inter(7, 1, 9, b"far"), inter(5, 9, 9, b"who"),
               Packet(1, 9, b"plain"), inter(5, 3, 2, b"\x04\x05"), inter(5, 1, 9, b"8 bytes!")]
    beats = [b for p in packets for b in p.beats(cfg.data_bits)]
    empty = dict(Packet(1, 9, b"x").beats(cfg.data_bits)[0], keep=0)
    header_only = Packet(5, 9, b"\x02", inter_cluster=True, src_cluster=6)
    stim = {"beats": beats + [empty] + header_only.beats(cfg.data_bits)}

    out, counts = GatewayModel.golden(cfg, stim)
    assert out == {
        "o_pkt": [Packet(2, 9, b"hi", inter_cluster=False, src_cluster=6)],
        "o_broadcast": [Packet(1, 3, b"\x01\x02\x03", inter_cluster=False, src_cluster=5),
                        Packet(2, 3, b"\x01\x02\x03", inter_cluster=False, src_cluster=5)]}
    drops = {k: 0 for k in DROP_KINDS} | {"unknown": 3, "too-long": 1, "zero-length": 1,
                                         "truncated": 1}
    gmi = {f"{kind}_{s}": 0 for kind in ("broadcast", "scatter", "gather", "reduce")
           for s in ("drop_source", "drop_length", "drop_overrun")}
    assert counts == {"delivered": 3, **drops, **gmi, "broadcast_drop_length": 1}


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
    sent, status = gateway_collective(cfg, "scatter", [Packet(12, 4, body)])
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
    from hwgen.cluster.gateware.header import TEST_CONFIGS as HC
    r = simulate(acc, acc.config.from_dict(HC[index]), items=120, seed=8, stall=0.3,
                 engine="native")
    assert not r["timeout"] and r["mismatches"] == 0, r["first_mismatches"]
    assert r["results"] > 120
