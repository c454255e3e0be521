"""Multi-FPGA simulation of two_clusters.json: the four generated FPGA tops, each verilated and
simulated in its own process, joined by the UDP network hub; what every kernel receives is
compared with the golden model (packet format + GMI collectives + header attach).

Traffic covers point-to-point inside an FPGA and across FPGAs of a cluster, point-to-point and
collective input across clusters (header attacher -> router -> network -> the other cluster's
gateway FPGA, where the gateway kernel inside the top decodes it: cluster 1's output is
forwarded to cluster 0's kernel 1, cluster 0's output feeds cluster 1's virtual broadcast),
physical scatter, gather (cluster 0) and reduce (cluster 1). The testbench plays only the
compute kernels.

With datagram loss, the golden model removes the packets of the datagrams the hub logged as
dropped (and what the collectives can then no longer complete).
"""

from dataclasses import replace

import pytest

from hwgen.cluster.run.multifpga import compare, golden, prepare, simulate, traffic

from conftest import requires_verilator

pytestmark = requires_verilator

DESC = "two_clusters"


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    desc, plans, runs = prepare(DESC, tmp_path_factory.mktemp("multifpga"))
    return desc, plans, runs


@pytest.fixture(scope="module")
def clean_run(built, tmp_path_factory):
    desc, plans, runs = built
    sent = traffic(plans, desc.data_bits, rounds=2, seed=4)
    expected = golden(plans, sent, desc.data_bits)
    received, malformed, stats = simulate(runs, sent, desc.data_bits,
                                          tmp_path_factory.mktemp("clean"), latency_s=0.002,
                                          stall=0.3, seed=4, expect=expected)
    return plans, sent, expected, received, malformed, stats


def test_no_loss_every_kernel_gets_the_golden_packets(clean_run):
    plans, sent, expected, received, malformed, stats = clean_run
    assert stats["timeouts"] == [] and malformed == 0
    assert stats["dropped"] == 0 and stats["unknown_destination"] == 0
    assert compare(expected, received) == {}
    # the traffic really exercised every path
    gmi_ids = {(p.cluster.id, k.id): k.kind for p in plans for k in p.kernels.values()
               if k.role in ("communication", "virtual")}
    srcs = {(c, q.src) for (c, _), pkts in received.items() for q in pkts}
    assert {gmi_ids[s] for s in srcs if s in gmi_ids} == {"scatter", "gather", "reduce",
                                                         "broadcast"}
    # inter-cluster traffic arrived decoded by the gateways (header stripped in hardware):
    # point to point into cluster 0, through the virtual broadcast into cluster 1
    assert not any(q.inter_cluster for pkts in received.values() for q in pkts)
    crossed = {(c, q.src) for (c, _), pkts in received.items() for q in pkts
               if q.src_cluster != c}
    assert crossed and all(c == 0 for c, _ in crossed)
    assert any(s in gmi_ids and gmi_ids[s] == "broadcast" and
               next(k for p in plans if p.cluster.id == s[0] for k in p.kernels.values()
                    if k.id == s[1]).role == "virtual" for s in srcs)
    assert sum(len(v) for (c, _), v in sent.items() if c == 1) > 0
    fpga = {(p.cluster.id, k.id): k.fpga for p in plans for k in p.kernels.values()}
    assert any(fpga[(c, q.src)] != fpga[(c, k)] and not q.inter_cluster
               and (c, q.src) not in gmi_ids for (c, k), pkts in received.items() for q in pkts)
    assert stats["forwarded"] > 0


def test_comparison_catches_a_wrong_delivery(clean_run):
    plans, sent, expected, received, malformed, stats = clean_run
    key = next(k for k, v in sorted(expected.items()) if v)
    altered = dict(expected)
    p = altered[key][0]
    altered[key] = [replace(p, payload=bytes([p.payload[0] ^ 1]) + p.payload[1:])] \
        + altered[key][1:]
    assert compare(altered, received) == {key: (1, 1)}
    moved = dict(expected)
    moved[key] = expected[key][1:]
    assert compare(moved, received) == {key: (0, 1)}


def test_lost_datagrams_are_the_missing_packets(built, tmp_path):
    desc, plans, runs = built
    sent = traffic(plans, desc.data_bits, rounds=2, seed=7)
    ideal = golden(plans, sent, desc.data_bits)
    received, malformed, stats = simulate(runs, sent, desc.data_bits, tmp_path, loss=0.3,
                                          stall=0.2, seed=7)
    assert stats["timeouts"] == [] and malformed == 0
    assert stats["dropped"] > 0
    expected = golden(plans, sent, desc.data_bits, dropped=stats["dropped_packets"])
    assert compare(expected, received) == {}
    assert sum(map(len, received.values())) < sum(map(len, ideal.values()))
