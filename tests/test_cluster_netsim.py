"""The multi-FPGA network model: Verilator processes joined by UDP on loopback.

A minimal FPGA top (kernel port straight to the network, network straight to the kernel, TDEST
as the node address) checks the bridge itself: with no loss every packet arrives intact at the
node it was addressed to; with loss, exactly the packets the hub logged as dropped are missing.
"""

import numpy as np
import pytest
from amaranth.hdl import Module
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from hwgen.cluster.netsim import NetworkHub, NodeRun, run_cluster
from hwgen.cluster.packet import Packet, from_beats, packet_layout, split_packets, to_beats
from hwgen.flow.emit import emit_verilog
from hwgen.flow.ports import StreamFormat
from hwgen.flow.simulate import _frames, _received_beats
from hwgen.flow.tools import cache_dir
from hwgen.flow.verilator import verilate

from conftest import requires_verilator

DATA_BITS = 64


class Bridge(wiring.Component):
    """Kernel output -> network, network -> kernel input (no logic)."""

    def __init__(self):
        layout = packet_layout(DATA_BITS)
        super().__init__({"i_k": In(stream.Signature(layout)), "o_k": Out(stream.Signature(layout)),
                          "i_net": In(stream.Signature(layout)),
                          "o_net": Out(stream.Signature(layout))})

    def elaborate(self, platform):
        m = Module()
        wiring.connect(m, wiring.flipped(self.i_k), wiring.flipped(self.o_net))
        wiring.connect(m, wiring.flipped(self.i_net), wiring.flipped(self.o_k))
        return m


@pytest.fixture(scope="module")
def bridge_build():
    work = cache_dir() / "netsim-bridge"
    v_path, ports = emit_verilog(Bridge(), "bridge", work / "rtl")
    verilate(v_path, "bridge", work / "build")
    fmt = StreamFormat.from_dict(next(s for s in ports["streams"] if s["port"] == "s_axis_k"))
    return work / "build", fmt


def traffic(rng, nodes, count):
    out = {n: [] for n in nodes}
    for i in range(count):
        src = nodes[i % len(nodes)]
        dst = int(rng.choice([n for n in nodes if n != src]))
        payload = bytes(rng.integers(0, 256, int(rng.integers(1, 30))).astype(np.uint8))
        out[src].append(Packet(dst, src, payload, src_cluster=i % 256))
    return out


def simulate(build, fmt, tmp_path, sent, *, loss=0.0, latency_s=0.0):
    build_dir, _ = build
    nodes = []
    for addr, packets in sent.items():
        beats = [b for p in packets for b in to_beats(p, DATA_BITS)]
        expect = sum(len(to_beats(p, DATA_BITS)) for q in sent.values() for p in q
                     if p.dest == addr)
        job = {"seed": addr, "stall": 0.3, "timeout_cycles": 10_000_000, "address": addr,
               "net": {"out": "m_axis_net", "in": "s_axis_net",
                       "dst": {"signal": "tdest", "bits": 8}},
               "ports": [{"port": "s_axis_k", "direction": "in", "frames": _frames(beats, fmt)},
                         {"port": "m_axis_k", "direction": "out"}],
               "expect": {"m_axis_k": expect} if not loss else {}}
        nodes.append(NodeRun(f"node{addr}", "bridge", build_dir, job))
    results, stats = run_cluster(nodes, tmp_path, latency_s=latency_s, loss=loss, seed=3,
                                 settle_s=1.0, timeout_s=300)
    got = {}
    for addr in sent:
        frames = results[f"node{addr}"]["outputs"]["m_axis_k"]
        got[addr] = [from_beats(p, DATA_BITS)
                     for f in frames for p in split_packets(_received_beats([f], fmt))]
    return got, stats


def key(p):
    return (p.src, p.dest, p.src_cluster, p.payload)


@requires_verilator
def test_three_nodes_deliver_every_packet(bridge_build, tmp_path):
    sent = traffic(np.random.default_rng(5), [1, 2, 7], 45)
    got, stats = simulate(bridge_build, bridge_build[1], tmp_path, sent, latency_s=0.005)
    for addr in sent:
        want = sorted((p for q in sent.values() for p in q if p.dest == addr), key=key)
        assert sorted(got[addr], key=key) == want
    assert stats["forwarded"] == 45 and stats["dropped"] == 0


@requires_verilator
def test_lost_datagrams_are_exactly_the_missing_packets(bridge_build, tmp_path):
    sent = traffic(np.random.default_rng(6), [1, 2], 40)
    got, stats = simulate(bridge_build, bridge_build[1], tmp_path, sent, loss=0.25)
    assert 0 < stats["dropped"] < 40
    assert stats["forwarded"] + stats["dropped"] == 40
    delivered = sum(len(v) for v in got.values())
    assert delivered == stats["forwarded"]
    # Sequence numbers are per sending node, in sending order: the dropped ones are missing.
    for addr, packets in sent.items():
        lost = {d["seq"] for d in stats["dropped_log"] if d["src"] == addr}
        arrived = [p for q in got.values() for p in q if p.src == addr]
        assert len(arrived) == len(packets) - len(lost)


def test_hub_rejects_bad_loss():
    with pytest.raises(ValueError):
        NetworkHub(loss=1.0)
