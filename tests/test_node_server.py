"""ChamVS node server hardening: concurrent persistent clients next to idle and half-sent
connections, timeouts, limits, every malformed message answered and counted by kind, fuzzed
traffic, shards that cannot run code, one-line startup errors, and making shards."""

import json
import pickle
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hwgen.errors import ConfigError
from hwgen.vecsearch.host.node_server import (ERROR_KINDS, PAD_DISTANCE, PAD_ID, NodeService,
                                              LOOPS, make_server)
from hwgen.vecsearch.host.protocol import (BINARY_MAGIC, RESULT_MAGIC, SEARCH_MAGIC,
                                           PackedResult, ProtocolError, decode_message, encode_message, encode_result,
                                           encode_search, recv_message, send_message)
from hwgen.vecsearch.host.shard import load_shard, make_shards, save_shard, shard_metadata
from hwgen.vecsearch.node import ChamVSNodeConfig
from hwgen.vecsearch.node_model import Shard

from conftest import requires_faiss

CFG = ChamVSNodeConfig(dim=16, m=4, nlist=4, nprobe_max=2, k=5, l1_len=5)   # exact top-k


def _shard(seed=0, vectors=400):
    rng = np.random.default_rng(seed)
    coarse = rng.integers(-128, 128, size=(CFG.nlist, CFG.dim))
    pq = rng.integers(-128, 128, size=(CFG.m, 256, CFG.dim // CFG.m))
    lists = rng.integers(0, CFG.nlist, size=vectors)
    codes = rng.integers(0, 256, size=(vectors, CFG.m)).astype(np.uint8)
    ids = rng.permutation(vectors).astype(np.int64)
    return Shard(coarse, pq, [codes[lists == l] for l in range(CFG.nlist)],
                 [ids[lists == l] for l in range(CFG.nlist)])


def _queries(rng, q):
    return (rng.integers(-128, 128, size=(q, CFG.dim)).tolist(),
            [rng.choice(CFG.nlist, size=2, replace=False).tolist() for _ in range(q)])


def _start(path, *args):
    proc = subprocess.Popen([sys.executable, "-m", "hwgen.vecsearch.host.node_server", str(path),
                             "--port", "0", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    assert line.startswith("listening on"), (line, proc.stderr.read() if proc.poll() else "")
    return proc, ("127.0.0.1", int(line.split()[-1]))


def _stop(proc):
    proc.kill()
    _, err = proc.communicate()
    assert "Traceback" not in err and "internal error" not in err, err


@pytest.fixture(scope="module")
def shard_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("shard") / "node0.npz"
    save_shard(path, CFG, _shard())
    return path


@pytest.fixture(scope="module", params=LOOPS)
def loop(request):
    """Every server guarantee is checked on both event loops."""
    if request.param == "uvloop":
        pytest.importorskip("uvloop", reason="uvloop is not installed (pip install uvloop)")
    return request.param


@pytest.fixture(scope="module")
def server(shard_file, loop):
    """A node server with the default limits."""
    proc, addr = _start(shard_file, "--loop", loop)
    yield addr
    _stop(proc)


@pytest.fixture(scope="module")
def small_server(shard_file, loop):
    """A node server with small limits, to reach them quickly."""
    proc, addr = _start(shard_file, "--loop", loop, "--timeout", "1", "--max-queries", "4",
                        "--max-inflight-bytes", "4096", "--max-connections", "24")
    yield addr
    _stop(proc)


def _connect(addr, timeout=5.0):
    s = socket.create_connection(addr, timeout=timeout)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def _ask(addr, obj):
    with _connect(addr) as s:
        send_message(s, obj)
        return recv_message(s)


def _stats(addr, settle=True):
    """The server's counters, once every other connection has been closed and counted (asked
    up to 250 times, 20 ms apart)."""
    for _ in range(250):
        stats = _ask(addr, {"op": "stats"})
        if not settle or stats["open_connections"] == 1:
            return stats
        time.sleep(0.02)
    return stats


def _framed(body):
    return struct.pack(">I", len(body)) + body


def _read_until_eof(sock, limit=5.0):
    """Every byte the server sends before closing (failing if it sends nothing and does not
    close for ``limit`` seconds: the socket's own timeout)."""
    sock.settimeout(limit)
    data = b""
    while True:
        try:
            chunk = sock.recv(1 << 16)
        except socket.timeout:
            pytest.fail(f"the server neither sent nor closed for {limit} s")
        if not chunk:
            return data
        data += chunk


def _split(data):
    """The messages in a byte string received from the server (all complete)."""
    out = []
    while data:
        assert len(data) >= 4
        (n,) = struct.unpack(">I", data[:4])
        assert len(data) >= 4 + n
        out.append(decode_message(data[4:4 + n]))
        data = data[4 + n:]
    return out


# -- shards ----------------------------------------------------------------------------------


def test_npz_shard_round_trip(tmp_path):
    shard = _shard(1)
    path = save_shard(tmp_path / "s.npz", CFG, shard, node=0, nodes=1)
    config, back = load_shard(path)
    assert config == CFG
    assert np.array_equal(back.coarse, shard.coarse)
    assert np.array_equal(back.pq_centroids, shard.pq_centroids)
    for a, b in zip(back.list_codes + back.list_ids, shard.list_codes + shard.list_ids):
        assert np.array_equal(a, b)
    assert shard_metadata(path)["nodes"] == 1
    with np.load(path, allow_pickle=False) as npz:      # plain arrays only
        assert all(npz[k].dtype != object for k in npz.files)


class _Evil:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (Path(self.marker),))


def _bad_shards(tmp_path):
    with np.load(_write(tmp_path / "good.npz"), allow_pickle=False) as npz:
        good = dict(npz)
    marker = tmp_path / "pwned"
    cases = {"pickle": pickle.dumps({"config": CFG.to_dict(), "shard": _Evil(marker)}),
             "garbage": b"\x00garbage" * 10, "empty": b""}
    files = {name: tmp_path / f"{name}.bin" for name in cases}
    for name, data in cases.items():
        files[name].write_bytes(data)
    files["missing"] = tmp_path / "missing.npz"
    np.save(tmp_path / "plain.npy", np.zeros(3))
    files["npy"] = tmp_path / "plain.npy"
    for name, change in {"no_codes": lambda d: d.pop("codes"),
                         "float_ids": lambda d: d.update(ids=d["ids"].astype(float)),
                         "short_offsets": lambda d: d.update(offsets=d["offsets"][:-1]),
                         "bad_meta": lambda d: d.update(meta=np.frombuffer(b"[1]", np.uint8)),
                         "object": lambda d: d.update(coarse=np.array([None], object))}.items():
        d = dict(good)
        change(d)
        files[name] = tmp_path / f"{name}.npz"
        with open(files[name], "wb") as f:
            np.savez(f, **d)
    return files, marker


def _write(path):
    return save_shard(path, CFG, _shard())


def test_bad_shard_files_are_one_line_config_errors(tmp_path):
    files, marker = _bad_shards(tmp_path)
    for name, path in files.items():
        with pytest.raises(ConfigError) as e:
            load_shard(path)
        text = str(e.value)
        assert "\n" not in text and str(path) in text and text.startswith("shard="), name
    assert "pickle" in str(pytest.raises(ConfigError, load_shard, files["pickle"]).value)
    assert not marker.exists()


def _run_main(*args, module="hwgen.vecsearch.host.node_server"):
    proc = subprocess.run([sys.executable, "-m", module, *map(str, args)],
                          capture_output=True, text=True, timeout=60)
    return proc, None


def test_the_old_entry_point_still_runs_the_server(tmp_path):
    """``python -m hwgen.host.node_server`` (the server's old home) is the same program."""
    missing = tmp_path / "missing.npz"
    old, _ = _run_main(missing, module="hwgen.host.node_server")
    new, _ = _run_main(missing)
    assert old.returncode == new.returncode == 2
    assert old.stderr == new.stderr and str(missing) in new.stderr


def test_startup_errors_are_one_line_exit_2(tmp_path, shard_file):
    files, marker = _bad_shards(tmp_path)
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    port = busy.getsockname()[1]
    cases = [((files["pickle"],), str(files["pickle"])),
             ((files["garbage"],), str(files["garbage"])),
             ((files["missing"],), str(files["missing"])),
             ((shard_file, "--port", port), f"port {port} is in use"),
             ((shard_file, "--port", 70000), "70000"),
             ((shard_file, "--timeout", 0), "timeout")]
    try:
        for args, needle in cases:
            proc, _ = _run_main(*args)
            lines = proc.stderr.strip().splitlines()
            assert proc.returncode == 2, (args, proc.stderr)
            assert len(lines) == 1 and lines[0].startswith("node_server: error: "), proc.stderr
            assert needle in lines[0] and "Traceback" not in proc.stderr
            assert "listening" not in proc.stdout
    finally:
        busy.close()
    assert not marker.exists()


class _Broken(NodeService):
    def search_arrays(self, queries, probes):     # what run_search and the server call
        raise RuntimeError("boom\nsecond line")


def test_in_process_server_answers_internal_errors_and_shuts_down(capfd):
    server = make_server(_Broken(CFG, _shard()), timeout=2.0)
    thread = threading.Thread(target=server.serve_forever)
    thread.start()
    try:
        addr = ("127.0.0.1", server.port)
        with _connect(addr) as s:
            s.sendall(_framed(_search()))
            reply = recv_message(s)
            assert reply["kind"] == "internal" and "boom" in reply["error"]
            send_message(s, {"op": "stats"})          # the connection goes on
            stats = recv_message(s)
        assert stats["errors_by_kind"]["internal"] == 1 and stats["errors"] == 1
        assert stats["limits"]["timeout"] == 2.0 and stats["limits"]["max_queries"] == 1024
    finally:
        server.shutdown()
        thread.join(10)
        server.server_close()
    assert not thread.is_alive()
    err = capfd.readouterr().err
    assert err == "node_server: internal error: RuntimeError: boom second line\n", err


# -- concurrency and timeouts ------------------------------------------------------------------


def test_200_clients_beside_idle_and_half_sent_connections(server):
    service = NodeService(CFG, _shard())              # the expected answers, in process
    idle = []
    for i in range(20):                               # held open for the whole test
        s = _connect(server)
        if i % 2:                                     # half a message: header and 10 bytes
            s.sendall(struct.pack(">I", 100) + b'{"op": "pi')
        idle.append(s)
    clients, rounds = 200, 3
    latencies, failures, answers = [], [], []
    barrier = threading.Barrier(clients)

    def client(n):
        rng = np.random.default_rng(n)
        try:
            barrier.wait(timeout=30)
            with _connect(server, timeout=10) as s:   # one persistent connection
                for _ in range(rounds):
                    queries, probes = _queries(rng, 1 + n % 3)
                    start = time.monotonic()
                    send_message(s, {"op": "search", "queries": queries, "probes": probes,
                                     "k": CFG.k})
                    reply = recv_message(s)
                    latencies.append(time.monotonic() - start)
                    answers.append((queries, probes, reply))
        except Exception as e:                        # noqa: BLE001 - reported below
            failures.append(repr(e))

    threads = [threading.Thread(target=client, args=(n,)) for n in range(clients)]
    start = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    wall = time.monotonic() - start
    assert not failures, failures[:3]
    assert len(latencies) == clients * rounds
    for queries, probes, reply in answers:          # checked after the clock stopped
        assert (reply["distances"], reply["ids"]) == service.search(queries, probes, CFG.k)
    worst = max(latencies)
    print(f"\n{clients} clients x {rounds} searches beside 20 idle connections: max latency "
          f"{worst * 1000:.0f} ms, median {np.median(latencies) * 1000:.1f} ms, "
          f"wall {wall:.2f} s")
    # the latencies are printed, not bounded: a threshold on a 2-core machine shared with
    # Verilator builds is a flaky failure; every answer is checked above and none failed
    for s in idle:                                    # still open: none was dropped early
        s.settimeout(0.01)
        with pytest.raises(socket.timeout):
            s.recv(1)
        s.close()
    stats = _stats(server)
    assert stats["open_connections"] == 1


def test_idle_and_half_messages_time_out_without_blocking_others(small_server):
    before = _stats(small_server)
    silent = _connect(small_server)
    half = _connect(small_server)
    half.sendall(struct.pack(">I", 200) + b'{"op": ')
    half_header = _connect(small_server)
    half_header.sendall(b"\x00\x00")
    assert _ask(small_server, {"op": "ping"}) == {"ok": True}     # not blocked by them
    for s in (silent, half, half_header):         # answered while they were still open
        s.setblocking(False)
        with pytest.raises(BlockingIOError):      # no byte and no close yet
            s.recv(1)
        s.settimeout(5.0)
    assert _read_until_eof(silent) == b""                         # idle: closed, no answer
    for s in (half, half_header):
        (reply,) = _split(_read_until_eof(s))
        assert reply["kind"] == "timeout" and "error" in reply
    for s in (silent, half, half_header):
        s.close()
    after = _stats(small_server)
    assert after["errors_by_kind"]["timeout"] - before["errors_by_kind"]["timeout"] == 2
    assert after["idle_closed"] - before["idle_closed"] >= 1


def test_connection_carries_many_messages_until_idle(small_server):
    with _connect(small_server) as s:
        for _ in range(50):
            send_message(s, {"op": "ping"})
            assert recv_message(s) == {"ok": True}
        assert _read_until_eof(s) == b""          # closed after the 1 s idle timeout


def test_query_count_and_byte_budget_and_connection_limits(small_server):
    rng = np.random.default_rng(5)
    with _connect(small_server) as s:
        queries, probes = _queries(rng, 5)            # the limit is 4
        send_message(s, {"op": "search", "queries": queries, "probes": probes, "k": CFG.k})
        assert recv_message(s)["kind"] == "too_many_queries"
        send_message(s, {"op": "search", "queries": queries[:4], "probes": probes[:4],
                         "k": CFG.k})
        assert len(recv_message(s)["ids"]) == 4
    # the budget is 4096 bytes: a message announcing 3000 holds most of it
    holder = _connect(small_server)
    holder.sendall(struct.pack(">I", 3000) + b" ")
    time.sleep(0.1)
    with _connect(small_server) as s:
        padded = b'{"op": "ping"}' + b" " * 1500
        s.sendall(_framed(padded))
        reply = recv_message(s)
        assert reply["kind"] == "busy"
        holder.close()                                # frees the budget
        time.sleep(0.1)
        s.sendall(_framed(padded))                    # same connection goes on
        assert recv_message(s) == {"ok": True}
    with _connect(small_server) as s:                 # beyond the budget: never fits
        s.sendall(struct.pack(">I", 5000))
        (reply,) = _split(_read_until_eof(s))
        assert reply["kind"] == "too_large"
    # at most 24 connections: the next one is answered busy and closed
    _stats(small_server)
    held = [_connect(small_server) for _ in range(23)]
    try:
        time.sleep(0.2)
        with _connect(small_server) as s:
            send_message(s, {"op": "ping"})
            assert recv_message(s) == {"ok": True}    # the 24th
            extra = _connect(small_server)
            (reply,) = _split(_read_until_eof(extra))
            assert reply["kind"] == "busy"
            extra.close()
    finally:
        for h in held:
            h.close()


# -- malformed messages --------------------------------------------------------------------------


def _search(**change):
    req = {"op": "search", "queries": [[1] * CFG.dim], "probes": [[0, 1]], "k": CFG.k}
    req.update(change)
    return json.dumps(req).encode()


def _binary(**change):
    """The body of a binary search request (arrays), with fields changed."""
    req = {"op": "search", "queries": np.ones((1, CFG.dim), np.int8),
           "probes": np.array([[0, 1]], np.int32), "k": CFG.k}
    req.update(change)
    return encode_message(req)[4:]


def _packed(queries=None, probes=None, k=CFG.k):
    """The body of a packed search request."""
    queries = np.ones((1, CFG.dim), np.int8) if queries is None else queries
    probes = np.array([[0, 1]], np.int32) if probes is None else probes
    return encode_search(queries, probes, k)[4:]


def _safetensors(header, data=b""):
    """A binary body with a hand-written safetensors header."""
    text = json.dumps(header).encode()
    return BINARY_MAGIC + struct.pack("<Q", len(text)) + text + data


MALFORMED = {       # name: (body, kind); every one leaves the connection usable
    "not_json": (b"{bad", "json"),
    "bad_utf8": (b'{"op": "\xff\xfe"}', "json"),
    "not_object": (b"[1, 2, 3]", "json"),
    "empty": (b"", "json"),
    "deep_nesting": (b"[" * 100_000 + b"]" * 100_000, "json"),
    "deep_object": (b'{"op":' + b'{"a":' * 40_000 + b"1" + b"}" * 40_001, "json"),
    "long_int_literal": (b'{"op": ' + b"9" * 5000 + b"}", "json"),
    "int_2_63": (_search(queries=[[2 ** 63] * CFG.dim]), "bad_request"),
    "int_2_70": (_search(queries=[[2 ** 70] + [0] * (CFG.dim - 1)]), "bad_request"),
    "negative_2_70": (_search(probes=[[-2 ** 70, 0]]), "bad_request"),
    "big_k": (_search(k=2 ** 80), "bad_request"),
    "query_out_of_range": (_search(queries=[[128] * CFG.dim]), "bad_request"),
    "float_values": (_search(queries=[[0.5] * CFG.dim]), "bad_request"),
    "nan_values": (b'{"op": "search", "queries": [[NaN]], "probes": [[0]], "k": 5}',
                   "bad_request"),
    "string_values": (_search(queries=[["a"] * CFG.dim]), "bad_request"),
    "ragged": (_search(queries=[[1] * CFG.dim, [1]], probes=[[0], [0]]), "bad_request"),
    "wrong_dim": (_search(queries=[[1, 2]]), "bad_request"),
    "flat_queries": (_search(queries=[1] * CFG.dim), "bad_request"),
    "queries_object": (_search(queries={"a": 1}), "bad_request"),
    "probes_mismatch": (_search(probes=[[0], [1]]), "bad_request"),
    "too_many_probes": (_search(probes=[[0, 1, 2]]), "bad_request"),
    "bad_list_id": (_search(probes=[[CFG.nlist]]), "bad_request"),
    "wrong_k": (_search(k=3), "bad_request"),
    "bool_k": (_search(k=True), "bad_request"),
    "missing_probes": (json.dumps({"op": "search", "queries": [], "k": 5}).encode(),
                       "bad_request"),
    "deep_queries": (_search(queries=json.loads("[" * 500 + "]" * 500)), "bad_request"),
    "unknown_op": (b'{"op": "fly"}', "unknown_op"),
    "no_op": (b"{}", "unknown_op"),
    "list_op": (b'{"op": [1]}', "unknown_op"),
    "too_many_queries": (_search(queries=[[0] * CFG.dim] * 1025, probes=[[0]] * 1025),
                         "too_many_queries"),
    "binary_magic_only": (BINARY_MAGIC, "binary"),
    "binary_short_header": (BINARY_MAGIC + b"\x10\x00\x00", "binary"),
    "binary_header_past_end": (BINARY_MAGIC + struct.pack("<Q", 1 << 40) + b"{}", "binary"),
    "binary_header_not_json": (BINARY_MAGIC + struct.pack("<Q", 4) + b"{bad", "binary"),
    "binary_bytes_short": (_safetensors({"queries": {"dtype": "I8", "shape": [1, CFG.dim],
                                                     "data_offsets": [0, CFG.dim]}}, b"x"),
                           "binary"),
    "binary_metadata_not_json": (_safetensors({"__metadata__": {"op": "{search"}}),
                                 "binary"),
    "binary_field_twice": (_safetensors({"__metadata__": {"q": "1"}, "q": {
        "dtype": "I8", "shape": [1], "data_offsets": [0, 1]}}, b"\x01"), "binary"),
    "binary_float_queries": (_binary(queries=np.ones((1, CFG.dim), np.float32)),
                             "bad_request"),
    "binary_flat_queries": (_binary(queries=np.ones(CFG.dim, np.int8)), "bad_request"),
    "binary_wrong_dim": (_binary(queries=np.ones((1, 3), np.int8)), "bad_request"),
    "binary_out_of_range": (_binary(queries=np.full((1, CFG.dim), 200, np.int16)),
                            "bad_request"),
    "binary_uint64": (_binary(queries=np.full((1, CFG.dim), 2 ** 64 - 1, np.uint64)),
                      "bad_request"),
    "binary_bad_list_id": (_binary(probes=np.array([[0, CFG.nlist]], np.int32)),
                           "bad_request"),
    "binary_wrong_k": (_binary(k=3), "bad_request"),
    "binary_too_many_queries": (_binary(queries=np.zeros((1025, CFG.dim), np.int8),
                                        probes=np.zeros((1025, 1), np.int32)),
                                "too_many_queries"),
    "packed_magic_only": (SEARCH_MAGIC, "binary"),
    "packed_short_header": (SEARCH_MAGIC + bytes(5), "binary"),
    "packed_float_type": (_packed()[:20] + b"f1i4" + _packed()[24:], "binary"),
    "packed_odd_type": (_packed()[:20] + b"i3i4" + _packed()[24:], "binary"),
    "packed_bytes_short": (_packed()[:-1], "binary"),
    "packed_bytes_long": (_packed() + b"x", "binary"),
    "packed_huge_count": (SEARCH_MAGIC + struct.pack("<IIII4s", 2 ** 32 - 1, 2 ** 32 - 1, 1,
                                                     CFG.k, b"i8i8"), "binary"),
    "packed_wrong_dim": (_packed(queries=np.ones((1, 3), np.int8)), "bad_request"),
    "packed_out_of_range": (_packed(queries=np.full((1, CFG.dim), 200, np.int16)),
                            "bad_request"),
    "packed_uint64": (_packed(queries=np.full((1, CFG.dim), 2 ** 64 - 1, np.uint64)),
                      "bad_request"),
    "packed_no_probes": (_packed(probes=np.zeros((1, 0), np.int8)), "bad_request"),
    "packed_bad_list_id": (_packed(probes=np.array([[0, CFG.nlist]], np.int64)),
                           "bad_request"),
    "packed_wrong_k": (_packed(k=3), "bad_request"),
    "packed_too_many_queries": (_packed(queries=np.zeros((1025, CFG.dim), np.int8),
                                        probes=np.zeros((1025, 1), np.uint8)),
                                "too_many_queries"),
    "result_short": (RESULT_MAGIC + bytes(3), "binary"),
    "result_as_request": (encode_result(np.zeros((1, CFG.k), np.int64),
                                        np.zeros((1, CFG.k), np.int64), 1)[4:], "unknown_op"),
}


def test_every_malformed_message_is_answered_and_counted(server):
    before = _stats(server)
    expect = dict.fromkeys(ERROR_KINDS, 0)
    with _connect(server) as s:
        for name, (body, kind) in MALFORMED.items():
            s.sendall(_framed(body))
            reply = recv_message(s)
            assert reply.get("kind") == kind and reply["error"], (name, reply)
            assert len(reply["error"]) < 400
            expect[kind] += 1
            send_message(s, {"op": "ping"})           # the connection goes on
            assert recv_message(s) == {"ok": True}, name
    fatal = {   # name: (bytes, kind): answered, then the connection is closed
        "oversize_prefix": (b"\xff\xff\xff\xff" + b"x" * 100, "too_large"),
        "beyond_max_message": (struct.pack(">I", 64 << 20) + b"{}", "too_large"),
        "truncated": (struct.pack(">I", 100) + b'{"op": "ping"}', "framing"),
        "truncated_header": (b"\x00\x00", "framing"),
    }
    for name, (data, kind) in fatal.items():
        with _connect(server) as s:
            s.sendall(data)
            s.shutdown(socket.SHUT_WR)
            (reply,) = _split(_read_until_eof(s))
            assert reply["kind"] == kind, (name, reply)
            expect[kind] += 1
    with _connect(server) as s:                       # a clean close is not an error
        pass
    assert _ask(server, {"op": "ping"}) == {"ok": True}
    after = _stats(server)
    got = {k: after["errors_by_kind"][k] - before["errors_by_kind"][k] for k in ERROR_KINDS}
    assert got == expect
    assert after["errors"] - before["errors"] == sum(expect.values())
    # requests: the dispatched objects (bad ones included), pings and the stats calls
    assert after["requests"] > before["requests"]


def test_binary_search_answers_as_json_does_with_the_search_time(server):
    """The same queries as arrays and as JSON lists: the same results; the binary reply
    holds int64 arrays and the node's own search time."""
    rng = np.random.default_rng(5)
    queries, probes = _queries(rng, 6)
    as_json = _ask(server, {"op": "search", "queries": queries, "probes": probes, "k": CFG.k})
    with _connect(server) as s:
        s.sendall(_framed(_binary(queries=np.array(queries, np.int8),
                                  probes=np.array(probes, np.int32))))
        reply = recv_message(s)
    assert reply["distances"].dtype == reply["ids"].dtype == np.int64
    assert reply["ids"].shape == (6, CFG.k)
    assert reply["distances"].tolist() == as_json["distances"]
    assert reply["ids"].tolist() == as_json["ids"]
    assert isinstance(reply["search_us"], int) and reply["search_us"] > 0
    assert isinstance(reply["handled_us"], int) and reply["handled_us"] >= reply["search_us"]


def test_packed_search_answers_as_json_does_with_the_node_times(server):
    """The coordinator's form: a packed request gets a packed reply (int64 arrays, the node's
    search and handling times) with the JSON answer's results, whatever integer types and
    byte order the arrays came in."""
    rng = np.random.default_rng(6)
    queries, probes = _queries(rng, 5)
    as_json = _ask(server, {"op": "search", "queries": queries, "probes": probes, "k": CFG.k})
    for qt, pt in ((np.int8, np.uint8), (">i2", ">i8"), (np.int64, np.uint16)):
        with _connect(server) as s:
            s.sendall(encode_search(np.array(queries, qt), np.array(probes, pt), CFG.k))
            (n,) = struct.unpack(">I", s.recv(4, socket.MSG_WAITALL))
            body = s.recv(n, socket.MSG_WAITALL)
        assert body[:4] == RESULT_MAGIC
        reply = decode_message(body)
        assert reply["distances"].dtype == reply["ids"].dtype == np.int64
        assert reply["distances"].tolist() == as_json["distances"], (qt, pt)
        assert reply["ids"].tolist() == as_json["ids"]
        assert 0 < reply["search_us"] <= reply["handled_us"]


def test_packed_records_round_trip_and_reject_what_does_not_fit():
    """encode_search / encode_result and decode_message are inverses for every integer type;
    a record whose length disagrees with its counts by one byte is refused."""
    rng = np.random.default_rng(7)
    for qt in ("i1", "<i2", ">i4", "u8"):
        q = rng.integers(-100 if qt[-2] == "i" else 0, 100, size=(3, 7)).astype(qt)
        p = rng.integers(0, 9, size=(3, 2)).astype(">u2")
        got = decode_message(encode_search(q, p, 11)[4:])
        assert (got["op"], got["k"]) == ("search", 11)
        assert got["queries"].tolist() == q.tolist() and got["probes"].tolist() == p.tolist()
        assert got["queries"].dtype.kind == q.dtype.kind
    d, i = rng.integers(0, 2 ** 40, size=(2, 2, 4))
    body = encode_result(d, i, 12, 34)[4:]
    got = decode_message(body)
    assert got["distances"].tolist() == d.tolist() and got["ids"].tolist() == i.tolist()
    assert (got["search_us"], got["handled_us"]) == (12, 34)
    with pytest.raises(ProtocolError) as e:       # the size limit holds for every form
        encode_message(PackedResult(distances=d, ids=i, search_us=1), max_size=len(body) - 1)
    assert e.value.kind == "too_large"
    assert encode_message(PackedResult(distances=d, ids=i, search_us=12, handled_us=34),
                          max_size=len(body))[4:] == body
    for bad in (body[:-1], body + b"\0"):
        with pytest.raises(ProtocolError) as e:
            decode_message(bad)
        assert e.value.kind == "binary" and not e.value.fatal


def test_short_results_are_padded_in_arrays_and_not_in_lists():
    """Probed lists holding fewer than k vectors: the array form pads the row with id
    PAD_ID at PAD_DISTANCE, the list form (JSON) keeps the row short."""
    svc = NodeService(CFG, _shard(vectors=8))
    rng = np.random.default_rng(1)
    queries = rng.integers(-128, 128, size=(4, CFG.dim))
    probes = np.array([[lst] for lst in range(CFG.nlist)])
    held = [len(svc.shard.list_ids[lst]) for lst in range(CFG.nlist)]
    dists, ids = svc.search_arrays(queries, probes)
    lists = svc.run_search(queries, probes)
    for q, n in enumerate(held):
        assert n < CFG.k and (ids[q] != PAD_ID).sum() == n
        assert (dists[q, n:] == PAD_DISTANCE).all() and (ids[q, n:] == PAD_ID).all()
        assert lists[1][q] == ids[q, :n].tolist() and lists[0][q] == dists[q, :n].tolist()


# -- fuzzing -----------------------------------------------------------------------------------

_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner,
                                                                max_size=4),
    max_leaves=20)
_request = st.fixed_dictionaries(
    {"op": st.sampled_from(["ping", "stats", "search", "fly"]) | _json},
    optional={"queries": st.one_of(_json, st.lists(st.lists(st.integers(-2 ** 70, 2 ** 70),
                                                            min_size=CFG.dim,
                                                            max_size=CFG.dim), max_size=3)),
              "probes": st.one_of(_json, st.lists(st.lists(st.integers(-1, 5), min_size=1,
                                                           max_size=3), max_size=3)),
              "k": st.one_of(st.just(CFG.k), _json)})
_chunk = st.one_of(
    st.binary(max_size=64),                                          # raw bytes
    st.binary(max_size=64).map(_framed),                             # framed garbage
    st.binary(max_size=64).map(lambda b: _framed(BINARY_MAGIC + b)),  # binary garbage
    st.binary(max_size=64).map(lambda b: _framed(SEARCH_MAGIC + b)),  # packed garbage
    st.binary(max_size=20).map(lambda b: _framed(_packed()[:4] + b +
                                                 _packed()[4 + len(b):])),  # damaged header
    _request.map(lambda r: _framed(json.dumps(r).encode())),         # framed objects
    _json.map(lambda r: _framed(json.dumps(r).encode())),            # framed JSON values
)


def _check_reply(reply):
    if "error" in reply:
        assert reply["kind"] in ERROR_KINDS and isinstance(reply["error"], str)
    else:
        assert reply == {"ok": True} or "requests" in reply or \
            (len(reply["ids"]) == len(reply["distances"]))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(chunks=st.lists(_chunk, min_size=1, max_size=4))
def test_fuzzed_byte_streams_get_replies_or_clean_close(server, chunks):
    with _connect(server) as s:
        s.sendall(b"".join(chunks))
        s.shutdown(socket.SHUT_WR)
        data = _read_until_eof(s, limit=5.0)
    replies = _split(data)
    assert len(replies) <= sum(map(len, chunks)) // 4 + 1
    for reply in replies:
        _check_reply(reply)
    assert _ask(server, {"op": "ping"}) == {"ok": True}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests=st.lists(_request, min_size=1, max_size=4))
def test_fuzzed_requests_each_get_one_reply(server, requests):
    with _connect(server) as s:
        s.settimeout(5.0)                             # a reply that never comes fails
        for request in requests:
            send_message(s, request)
            _check_reply(recv_message(s))
        send_message(s, {"op": "ping"})
        assert recv_message(s) == {"ok": True}


# -- making shards -----------------------------------------------------------------------------


@requires_faiss
def test_make_shards_from_float_vectors(tmp_path):
    from hwgen.vecsearch.host.coordinator import merge_topk, same_results
    rng = np.random.default_rng(7)
    base = rng.normal(size=(300, CFG.dim)).astype(np.float32)
    np.save(tmp_path / "base.npy", base)
    lines = []
    paths = make_shards(CFG, tmp_path / "base.npy", 3, "split-lists", tmp_path / "out",
                        log=lines.append)
    assert [p.name for p in paths] == ["node0.npz", "node1.npz", "node2.npz"]
    assert len(lines) == 4 and "trained" in lines[0]
    loaded = [load_shard(p) for p in paths]
    ids = np.concatenate([i for _, s in loaded for i in s.list_ids])
    assert sorted(ids.tolist()) == list(range(300))
    meta = shard_metadata(paths[1])
    assert meta["node"] == 1 and meta["nodes"] == 3 and meta["scale"] > 0
    (one,) = make_shards(CFG, base, 1, "whole-lists", tmp_path / "one")
    single = NodeService(*load_shard(one))
    nodes = [NodeService(c, s) for c, s in loaded]
    queries, probes = _queries(rng, 4)
    full = single.search(queries, probes, CFG.k)
    parts = [n.search(queries, probes, CFG.k) for n in nodes]
    for q in range(4):
        merged = merge_topk([(p[0][q], p[1][q]) for p in parts], CFG.k)
        assert same_results((full[0][q], full[1][q]), merged)
    for bad in [dict(nodes=0), dict(nodes=1.5), dict(scheme="rows"),
                dict(base=base[0]), dict(base=base[:100]), dict(base=base[:, :8]),
                dict(base=np.full_like(base, np.nan)),
                dict(base=tmp_path / "nope.npy"), dict(out=tmp_path / "base.npy")]:
        args = dict(nodes=2, scheme="split-lists", base=base, out=tmp_path / "x") | bad
        with pytest.raises(ConfigError):
            make_shards(CFG, args["base"], args["nodes"], args["scheme"], args["out"])


@requires_faiss
def test_hwgen_chamvs_shard_command_makes_servable_shards(tmp_path):
    """`hwgen chamvs shard` (the CLI) writes shards a node server loads and answers from."""
    from click.testing import CliRunner
    from hwgen.cli import main
    rng = np.random.default_rng(11)
    np.save(tmp_path / "base.npy", rng.normal(size=(400, 16)).astype(np.float32))
    result = CliRunner().invoke(main, ["chamvs", "shard", str(tmp_path / "base.npy"),
                                       "--nodes", "2", "--set", "nlist=8", "--set", "m=8",
                                       "--out", str(tmp_path / "s")])
    assert result.exit_code == 0, result.stderr
    assert result.stdout.split() == [str(tmp_path / "s" / f"node{i}.npz") for i in (0, 1)]
    config, shard = load_shard(tmp_path / "s" / "node1.npz")
    assert (config.dim, config.nlist, config.m) == (16, 8, 8)
    proc, addr = _start(tmp_path / "s" / "node1.npz")
    try:
        with socket.create_connection(addr, timeout=5) as sock:
            send_message(sock, {"op": "search", "queries": [[1] * 16], "probes": [[0]],
                                "k": config.k})
            reply = recv_message(sock)
        assert len(reply["ids"][0]) == config.k and "error" not in reply
    finally:
        _stop(proc)
    bad = CliRunner().invoke(main, ["chamvs", "shard", str(tmp_path / "base.npy"),
                                    "--nodes", "0", "--out", str(tmp_path / "t")])
    assert bad.exit_code == 2 and bad.stderr == "hwgen: error: nodes=0: must be an integer in " \
        "1..1024\n"
