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

from hwgen.cluster.run.netsim import Host, NetworkHub, NodeRun, run_cluster
from hwgen.cluster.spec.packet import Packet, from_beats, packet_layout, split_packets, to_beats
from hwgen.flow.emit import emit_verilog
from hwgen.flow.ports import StreamFormat
from hwgen.flow.frames import received_beats, stimulus_frames
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
               "ports": [{"port": "s_axis_k", "direction": "in", "frames": stimulus_frames(beats, fmt)},
                         {"port": "m_axis_k", "direction": "out"}],
               "expect": {"m_axis_k": expect} if not loss else {}}
        nodes.append(NodeRun(f"node{addr}", "bridge", build_dir, job))
    results, stats = run_cluster(nodes, tmp_path, latency_s=latency_s, loss=loss, seed=3,
                                 settle_s=1.0, timeout_s=300)
    got = {}
    for addr in sent:
        frames = results[f"node{addr}"]["outputs"]["m_axis_k"]
        got[addr] = [from_beats(p, DATA_BITS)
                     for f in frames for p in split_packets(received_beats([f], fmt))]
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


def lockstep_run(build, tmp_path, hop, seed, extra_expected=0, idle_cycles=0):
    """Node 1 sends 30 packets to the host (address 9; the run ends when the host has them
    all, after cycle 90 at least); the host sends 4 to node 2 (due at cycle hop + 1)."""
    build_dir, fmt = build
    rng = np.random.default_rng(seed)
    to_host = [Packet(9, 1, bytes(rng.integers(0, 256, 20).astype(np.uint8)))
               for _ in range(30)]
    from_host = [Packet(2, 9, bytes([k]) * 11) for k in range(4)]
    nodes = []
    for addr, packets in ((1, to_host), (2, [])):
        beats = [b for p in packets for b in to_beats(p, DATA_BITS)]
        job = {"seed": addr, "stall": 0.3, "timeout_cycles": 200_000, "address": addr,
               "net": {"out": "m_axis_net", "in": "s_axis_net",
                       "dst": {"signal": "tdest", "bits": 8}},
               "ports": [{"port": "s_axis_k", "direction": "in", "frames": stimulus_frames(beats, fmt)},
                         {"port": "m_axis_k", "direction": "out"}],
               "expect": {}}
        nodes.append(NodeRun(f"node{addr}", "bridge", build_dir, job))
    host = Host(9, [(2, f) for p in from_host for f in stimulus_frames(to_beats(p, DATA_BITS), fmt)],
                expect_frames=len(to_host) + extra_expected)
    results, stats = run_cluster(nodes, tmp_path, seed=3, timeout_s=300, lockstep=hop,
                                 host=host, idle_cycles=idle_cycles)
    at_host = [(c, from_beats(received_beats([f], fmt), DATA_BITS))
               for c, f in stats["host_received"]]
    at_2 = [from_beats(p, DATA_BITS) for f in results["node2"]["outputs"]["m_axis_k"]
            for p in split_packets(received_beats([f], fmt))]
    return to_host, from_host, at_host, at_2, results, stats


@requires_verilator
def test_lockstep_host_exchanges_and_cycles_are_reproducible(bridge_build, tmp_path):
    """Lock-step mode: the host's packets reach node 2, node 1's reach the host in order with
    the sender's cycle; both nodes stop at the same barrier; a second run (other wall-clock
    timing) stamps the same cycles, and a longer hop only moves the stop barrier."""
    to_host, from_host, at_host, at_2, results, stats = lockstep_run(bridge_build,
                                                                     tmp_path / "a", 32, 5)
    assert [p for _, p in at_host] == to_host
    assert at_2 == from_host
    cycles = [c for c, _ in at_host]
    assert cycles == sorted(cycles) and 0 < cycles[0] < cycles[-1] < 32 * 40
    assert results["node1"]["cycles_run"] == results["node2"]["cycles_run"]
    assert results["node1"]["cycles_run"] % 32 == 0
    assert stats["stalled_at"] is None
    again = lockstep_run(bridge_build, tmp_path / "b", 32, 5)[2]
    assert [c for c, _ in again] == cycles


@requires_verilator
def test_lockstep_stall_is_detected_and_stops_the_nodes(bridge_build, tmp_path):
    """A host waiting for one frame more than is ever sent: with ``idle_cycles`` the run stops
    (instead of running to the nodes' timeout) once the network has been quiet that long,
    reports the cycle of the last traffic, and every node stops at the same barrier."""
    to_host, _, at_host, _, results, stats = lockstep_run(
        bridge_build, tmp_path, 32, 5, extra_expected=1, idle_cycles=2000)
    assert [p for _, p in at_host] == to_host
    last = max(c for c, _ in at_host)
    assert stats["stalled_at"] == last                 # the sender's cycle of the last frame
    runs = {r["cycles_run"] for r in results.values()}
    assert len(runs) == 1 and stats["stalled_at"] + 2000 < runs.pop() < 200_000
    assert not any(r["timeout"] for r in results.values())


def test_hub_lockstep_needs_cycles_not_seconds():
    with pytest.raises(ValueError, match="latency_s"):
        NetworkHub(latency_s=0.01, lockstep_nodes=2)
