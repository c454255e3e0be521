"""ChamVS coordinator over TCP: N-node results equal one node's, a dead node gives a partial
result within the timeout, malformed traffic is answered and counted."""

import socket
import struct
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from hwgen.vecsearch.host.coordinator import (Coordinator, merge_topk, same_results, shard_lists)
from hwgen.vecsearch.host.node_server import NodeService, save_shard
from hwgen.vecsearch.host.protocol import encode_message, recv_message, send_message
from hwgen.vecsearch.node import ChamVSNodeConfig
from hwgen.vecsearch.node_model import Shard, prepare

from conftest import requires_faiss, requires_verilator

pytestmark = requires_faiss


@pytest.fixture(scope="module")
def dataset():
    cfg = ChamVSNodeConfig(k=10, l1_len=10)       # exact K-selection in every node
    data = prepare(cfg, count=12, rng=np.random.default_rng(3))
    return cfg, data


def _start(path, backend="golden", *args):
    proc = subprocess.Popen([sys.executable, "-m", "hwgen.vecsearch.host.node_server", str(path),
                             "--port", "0", "--backend", backend, *args],
                            stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    assert line.startswith("listening on"), line
    return proc, ("127.0.0.1", int(line.split()[-1]))


@pytest.fixture
def cluster(tmp_path, dataset):
    procs = []

    def launch(nodes, scheme="split-lists", backend="golden", config=None):
        cfg, data = dataset
        cfg = config or cfg
        addrs = []
        for n, (codes, ids) in enumerate(shard_lists(data.index.list_codes,
                                                     data.index.list_ids, nodes, scheme)):
            path = tmp_path / f"{scheme}-{nodes}-{n}-{backend}.npz"
            save_shard(path, cfg, Shard(data.index.coarse, data.index.pq_centroids, codes,
                                        ids))
            proc, addr = _start(path, backend)
            procs.append(proc)
            addrs.append(addr)
        return addrs

    yield launch
    for proc in procs:
        proc.kill()
        proc.wait()


@pytest.mark.timeout(60)
def test_pipelined_requests_cannot_deadlock_on_full_socket_buffers():
    """Eight 2 MiB requests to a peer that answers each with 4 MiB before reading the next:
    a client that wrote every request before reading would block on a full socket while the
    peer blocks on its answer. The pipelined exchange reads while it writes."""
    from hwgen.vecsearch.host.links import NodeLink, exchange_all
    requests = [encode_message({"op": "echo", "blob": np.full(2 << 20, i, np.uint8)})
                for i in range(8)]
    listener = socket.create_server(("127.0.0.1", 0))

    def peer():
        conn, _ = listener.accept()
        with conn:
            for _ in requests:
                msg = recv_message(conn)
                conn.sendall(encode_message({"blob": np.repeat(msg["blob"], 2)}))

    thread = threading.Thread(target=peer, daemon=True)
    thread.start()
    link = NodeLink(listener.getsockname())
    (replies,) = exchange_all([link], requests, time.monotonic() + 30)
    link.drop()
    thread.join(5)
    listener.close()
    assert [(len(r["blob"]), int(r["blob"][0])) for r in replies] == \
        [(4 << 20, i) for i in range(8)]


def test_merge_orders_by_distance_then_id():
    d, i = merge_topk([([5, 9], [3, 1]), ([5, 2], [2, 8])], 3)
    assert d.tolist() == [2, 5, 5] and i.tolist() == [8, 2, 3]


def test_shards_partition_every_list():
    codes = [np.arange(10).reshape(10, 1), np.arange(3).reshape(3, 1)]
    ids = [np.arange(10), np.arange(10, 13)]
    for scheme in ("split-lists", "whole-lists"):
        shards = shard_lists(codes, ids, 3, scheme)
        for lst in range(2):
            held = sorted(x for _, sid in shards for x in sid[lst].tolist())
            assert held == ids[lst].tolist()
    whole = shard_lists(codes, ids, 3, "whole-lists")
    assert [len(s[1][0]) for s in whole] == [10, 0, 0]


@pytest.mark.parametrize("scheme", ["split-lists", "whole-lists"])
def test_three_nodes_equal_one(cluster, dataset, scheme):
    cfg, data = dataset
    one = Coordinator(cluster(1), timeout=20)
    three = Coordinator(cluster(3, scheme), timeout=20)
    a = one.search(data.queries, data.probes, cfg.k)
    b = three.search(data.queries, data.probes, cfg.k)
    assert not a.partial and not b.partial
    for q in range(len(data.queries)):
        assert same_results((a.distances[q], a.ids[q]), (b.distances[q], b.ids[q]))
        assert len(b.ids[q]) == cfg.k


def test_binary_and_json_transports_give_the_same_results(cluster, dataset):
    """Arrays (the default) and nested JSON lists carry the same searches; only binary replies
    report the nodes' own search time, which the round trip includes."""
    cfg, data = dataset
    addrs = cluster(2)
    with Coordinator(addrs, timeout=20) as binary, \
            Coordinator(addrs, timeout=20, binary=False) as text:
        a = binary.search(data.queries, data.probes, cfg.k)
        b = text.search(data.queries, data.probes, cfg.k)
        empty = binary.search(np.zeros((0, cfg.dim), np.int64), np.zeros((0, 1), np.int64),
                              cfg.k)
    assert not a.partial and not b.partial and not empty.partial and empty.ids == []
    for q in range(len(data.queries)):
        assert a.distances[q].tolist() == b.distances[q].tolist()
        assert a.ids[q].tolist() == b.ids[q].tolist()
    assert b.node_seconds is None
    assert 0 < a.node_seconds < a.seconds


@pytest.mark.timeout(60)           # a coordinator that waited on the silent node forever
def test_dead_node_gives_partial_result_within_timeout(cluster, dataset):
    cfg, data = dataset
    addrs = cluster(3)
    coord = Coordinator(addrs, timeout=2.0)
    full = coord.search(data.queries[:2], data.probes[:2], cfg.k)
    assert not full.partial
    # a node that accepts connections but never answers
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen()
    coord = Coordinator(addrs[:2] + [silent.getsockname()], timeout=2.0)
    res = coord.search(data.queries[:2], data.probes[:2], cfg.k)    # its 2 s timeout
    assert res.partial and res.missing == [f"127.0.0.1:{silent.getsockname()[1]}"]
    assert all(len(ids) == cfg.k for ids in res.ids)
    silent.close()


@pytest.mark.timeout(60)
def test_killed_node_process(tmp_path, dataset):
    cfg, data = dataset
    shards = shard_lists(data.index.list_codes, data.index.list_ids, 2)
    procs, addrs = [], []
    for n, (codes, ids) in enumerate(shards):
        path = tmp_path / f"kill-{n}.npz"
        save_shard(path, cfg, Shard(data.index.coarse, data.index.pq_centroids, codes, ids))
        proc, addr = _start(path)
        procs.append(proc)
        addrs.append(addr)
    try:
        coord = Coordinator(addrs, timeout=2.0)
        assert not coord.search(data.queries[:1], data.probes[:1], cfg.k).partial
        procs[1].kill()
        procs[1].wait()
        res = coord.search(data.queries[:1], data.probes[:1], cfg.k)
        assert res.partial and res.missing == [f"{addrs[1][0]}:{addrs[1][1]}"]
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def test_connections_persist_and_reopen_after_the_node_drops_them(tmp_path, dataset):
    cfg, data = dataset
    path = tmp_path / "persist.npz"
    shard = Shard(data.index.coarse, data.index.pq_centroids, data.index.list_codes,
                  data.index.list_ids)
    save_shard(path, cfg, shard)
    proc, addr = _start(path, "golden", "--timeout", "0.5",   # drops idle connections
                        "--max-queries", "5")
    try:
        with Coordinator([addr], timeout=5.0) as coord:
            first = [coord.search(data.queries[i:i + 1], data.probes[i:i + 1], cfg.k)
                     for i in range(5)]
            assert not any(r.partial for r in first)
            with socket.create_connection(addr) as s:
                send_message(s, {"op": "stats"})
                assert recv_message(s)["connections"] == 2     # the coordinator's and this one
            time.sleep(1.0)                                     # the node closed it meanwhile
            again = coord.search(data.queries[:1], data.probes[:1], cfg.k)
            assert not again.partial
            assert same_results((again.distances[0], again.ids[0]),
                                (first[0].distances[0], first[0].ids[0]))
            with socket.create_connection(addr) as s:
                send_message(s, {"op": "stats"})
                stats = recv_message(s)
            assert stats["connections"] == 4 and stats["errors"] == 0
            assert stats["idle_closed"] >= 1
        # 12 queries: over the node's limit of 5 in one request, fine in batches of 5
        with Coordinator([addr], timeout=5.0) as coord:
            assert coord.search(data.queries, data.probes, cfg.k).partial
        with Coordinator([addr], timeout=5.0, max_batch=5) as coord:
            res = coord.search(data.queries, data.probes, cfg.k)
        assert not res.partial and len(res.ids) == len(data.queries) == 12
        dists, ids = NodeService(cfg, shard).search(data.queries.tolist(),
                                                    data.probes.tolist(), cfg.k)
        for q in range(12):
            assert same_results((res.distances[q], res.ids[q]), (dists[q], ids[q]))
    finally:
        proc.kill()
        proc.wait()


def test_malformed_requests_are_answered_and_counted(cluster, dataset):
    addr = cluster(1)[0]
    with socket.create_connection(addr) as s:        # garbage length prefix, then close
        s.sendall(struct.pack(">I", 10) + b"{bad")
    with socket.create_connection(addr) as s:
        send_message(s, {"op": "search", "queries": [[1, 2]], "probes": [[0]], "k": 10})
        assert "error" in recv_message(s)
    with socket.create_connection(addr) as s:
        send_message(s, {"op": "fly"})
        assert "unknown op" in recv_message(s)["error"]
    with socket.create_connection(addr) as s:
        send_message(s, {"op": "stats"})
        stats = recv_message(s)
    assert stats["errors"] == 3 and stats["requests"] == 3


@requires_verilator
def test_rtl_node_equals_golden_node(cluster, dataset):
    cfg, data = dataset
    rtl_cfg = ChamVSNodeConfig(k=10)          # the default node, built by the simulation tests
    golden = Coordinator(cluster(1, config=rtl_cfg), timeout=30)
    rtl = Coordinator(cluster(1, backend="rtl", config=rtl_cfg), timeout=600)
    a = golden.search(data.queries[:4], data.probes[:4], rtl_cfg.k)
    b = rtl.search(data.queries[:4], data.probes[:4], rtl_cfg.k)
    assert not b.partial
    for q in range(4):
        assert a.distances[q].tolist() == b.distances[q].tolist()
        assert a.ids[q].tolist() == b.ids[q].tolist()
