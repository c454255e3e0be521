"""A ChamVS memory node behind a TCP socket, for the coordinator.

The node holds one shard (:mod:`hwgen.vecsearch.host.shard`: an ``.npz`` that cannot run code,
made by :func:`~hwgen.vecsearch.host.shard.make_shards` / ``hwgen chamvs shard``) and answers
``search`` requests either with the node's golden model (``golden``) or by running the node's
Verilog on Verilator with the shard in the native engine's AXI memories (``rtl``: hwgen's C++
testbench, random input gaps and output backpressure; one simulation at a time; the simulation
is itself checked against the golden model, a disagreement is answered as an error).

Run: ``python -m hwgen.vecsearch.host.node_server SHARD.npz --port 0 --backend golden``; it prints
``listening on <port>`` once ready. Startup problems (missing or invalid shard, port in use or
out of range, bad option) print one line ``node_server: error: ...`` and exit with status 2.

Protocol
--------
Length-prefixed messages (:mod:`hwgen.vecsearch.host.protocol`), each a JSON object, a binary
one (safetensors arrays plus JSON metadata) or a packed search record. A connection is persistent: it carries any number of
request/reply pairs, one reply per request in order, until the client closes it. Requests:

``{"op": "ping"}`` -> ``{"ok": true}``
``{"op": "stats"}`` -> ``{"requests", "queries", "errors", "errors_by_kind": {kind: n},
    "connections", "open_connections", "idle_closed", "inflight_bytes", "limits": {...}}``
``{"op": "search", "queries": [[int] * dim] * q, "probes": [[list id] * p] * q, "k": k}``
    -> ``{"distances": [[int] * k] * q, "ids": [[int] * k] * q}``; query components must be
    signed ``elem_bits`` integers, ``1 <= p <= nprobe_max``, list ids in ``0..nlist-1``, ``k``
    the node's ``k`` and ``q <= max_queries``.
the same search with ``queries`` and ``probes`` as integer arrays (a binary message)
    -> a binary reply: ``distances`` and ``ids`` as int64 (q, k) arrays, ``search_us``, the
    microseconds the node spent searching (so a client can tell transport from search), and
    ``handled_us``, the microseconds from the request's first bytes to the reply's encoding
    (search, reading, decoding and validation: the node's own share of the transport).
the same search as a packed record (:func:`~hwgen.vecsearch.host.protocol.encode_search`: the
    :class:`~hwgen.vecsearch.host.coordinator.Coordinator`'s form)
    -> a packed result (:func:`~hwgen.vecsearch.host.protocol.encode_result`) with the same
    arrays and times.

Concurrency: one asyncio event loop serves every connection (listen backlog 512; an idle or
half-sent connection costs a socket and a coroutine, never a thread, and holds up no one).
Golden searches run on the loop :data:`SEARCH_SLICE` queries at a time, so a large request is
interleaved with small ones; ``rtl`` simulations run in one worker thread, one at a time. (With a
thread per connection, 200 simultaneous clients saw a ~7x higher worst latency: the threads'
contention for the GIL starves the accepting thread.) Internal errors are logged as one
``node_server: ...`` line on stderr.

Errors
------
Every malformed request is answered with ``{"error": "<text>", "kind": "<kind>"}`` where the
connection still allows it, counted in ``errors`` and in ``errors_by_kind``:

``too_large``
    the length prefix exceeds the server's message limit: answered, then the connection is
    closed (the stream cannot be resynchronised);
``framing``
    the client closed the connection in the middle of a message (answered if still possible);
``timeout``
    a message started but was not complete ``timeout`` seconds later: answered, then closed;
``json``
    the body is not a UTF-8 JSON object (invalid UTF-8 or JSON, nesting too deep, integer
    literal too long, not an object); the connection goes on;
``binary``
    the body starts as a binary or packed message but is not a valid one (safetensors header
    or array bytes inconsistent, metadata not JSON; a packed record whose length or types
    disagree with its header); the connection goes on;
``bad_request``
    a JSON object that is not a valid request (missing or mistyped field, wrong shapes,
    integers out of range, wrong ``k``); the connection goes on;
``unknown_op``
    ``op`` is not ``ping``, ``stats`` or ``search``; the connection goes on;
``too_many_queries``
    a search with more than ``max_queries`` queries; the connection goes on;
``busy``
    the in-flight byte budget stayed full for :data:`BUSY_WAIT` seconds (the message body is
    read and discarded, the connection goes on), or the server holds ``max_connections``
    connections already (answered at accept, then closed);
``backend``
    the ``rtl`` backend failed or disagreed with the golden model; the connection goes on;
``send``
    a reply could not be delivered within the timeout (the connection is closed);
``internal``
    anything unexpected: answered, one line logged on stderr (no traceback), the connection
    goes on.

Limits and timeouts
-------------------
``timeout`` (default 10 s)
    a connection idle that long between messages is closed (counted in ``idle_closed``, not an
    error); a message, once its first byte arrived, must complete within ``timeout``; a reply
    must be accepted by the client within ``timeout``.
``max_queries`` (default 1024)
    queries per search request.
``max_inflight_bytes`` (default 256 MiB)
    global budget of request bytes held by all connections together: a message's announced
    length is reserved when its header arrives and released once its reply is sent. When the
    budget is full the message waits up to :data:`BUSY_WAIT` s for room, then is refused as
    ``busy``. (Parsed JSON takes several times its text in memory; ``max_message`` bounds that.)
``max_message``
    bytes of one message, default ``min(MAX_MESSAGE, max_inflight_bytes, R)`` where ``R`` is
    ample for any valid search of ``max_queries`` queries (16 bytes per number plus 64 KiB).
``max_connections`` (default 1024)
    connections served at once; more are answered ``busy`` and closed.

Besides, each connection buffers at most ~128 KiB that it has not consumed yet (asyncio's
stream limit), so pipelining clients cannot grow the server's memory beyond the budget much.
"""

import argparse
import asyncio
import dataclasses
import errno
import socket
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ...errors import HwgenError
from .protocol import (HEADER, MAX_MESSAGE, PackedResult, PackedSearch, ProtocolError,
                       decode_message, encode_message, error_reply, parse_header)
from .shard import load_shard, save_shard

__all__ = ["save_shard", "load_shard", "NodeService", "NodeServer", "make_server", "serve",
           "ERROR_KINDS", "DEFAULT_TIMEOUT", "DEFAULT_MAX_QUERIES", "DEFAULT_MAX_INFLIGHT",
           "DEFAULT_MAX_CONNECTIONS", "BUSY_WAIT", "SEARCH_SLICE", "PAD_ID", "PAD_DISTANCE",
           "main"]

ERROR_KINDS = ("framing", "too_large", "timeout", "json", "binary", "bad_request", "unknown_op",
               "too_many_queries", "busy", "backend", "send", "internal")
DEFAULT_TIMEOUT = 10.0
DEFAULT_MAX_QUERIES = 1024
DEFAULT_MAX_INFLIGHT = 256 << 20
DEFAULT_MAX_CONNECTIONS = 1024
BUSY_WAIT = 0.5              #: seconds a message waits for room in the in-flight byte budget
SEARCH_SLICE = 8             #: golden searches run this many queries between other work
LISTEN_BACKLOG = 512
PAD_ID = -1                  #: id of the padding of a binary reply's short rows
PAD_DISTANCE = np.iinfo(np.int64).max   #: and its distance (sorts after every real one)


def _log(line):
    try:
        print(f"node_server: {' '.join(str(line).split())}", file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass


def _int_matrix(value, name, width=None, max_rows=None):
    """A request field (nested lists, or an array of a binary message) as an int64
    (rows, width) array, or a bad_request ProtocolError."""
    if not isinstance(value, (list, np.ndarray)):
        raise ProtocolError(f"{name} must be a list of lists of integers or an integer array")
    if max_rows is not None and len(value) > max_rows:
        raise ProtocolError(f"{len(value)} queries exceed this node's limit of {max_rows} per "
                            f"request", "too_many_queries")
    if isinstance(value, np.ndarray):
        arr = value
    elif not value:
        return np.zeros((0, width or 0), dtype=np.int64)
    else:
        try:
            arr = np.array(value)
        except (ValueError, TypeError, OverflowError, RecursionError, MemoryError):
            raise ProtocolError(f"{name} must be a rectangular list of lists of integers") \
                from None
    if arr.ndim == 2 and arr.shape[0] == 0:
        return np.zeros((0, width or arr.shape[1]), dtype=np.int64)
    if arr.dtype.kind == "O":
        raise ProtocolError(f"{name} holds non-integers or integers beyond 64 bits")
    if arr.ndim != 2 or arr.dtype.kind not in "iu":
        raise ProtocolError(f"{name} must be a rectangular list of lists of integers (got "
                            f"{arr.ndim}-D {arr.dtype.name} values)")
    if arr.dtype.kind == "u" and arr.size and arr.max() > np.iinfo(np.int64).max:
        raise ProtocolError(f"{name} holds integers beyond 64 bits")
    if width is not None and arr.shape[1] != width:
        raise ProtocolError(f"{name} rows must have {width} values, not {arr.shape[1]}")
    return arr.astype(np.int64)


def _within(dtype, lo, hi):
    """Whether every value of integer ``dtype`` (None: unknown) lies in ``lo..hi`` (a request
    sent as int8 needs no range check against 8-bit components)."""
    if dtype is None or dtype.kind not in "iu":
        return False
    info = np.iinfo(dtype)
    return lo <= info.min and info.max <= hi


def _padded(rows, k, fill):
    """Rows of at most ``k`` integers as an int64 (len(rows), k) array, short rows filled."""
    out = np.full((len(rows), k), fill, dtype=np.int64)
    for r, row in enumerate(rows):
        out[r, :len(row)] = row
    return out


def _unpadded(dists, ids):
    """Padded (q, k) result arrays as lists of rows without their padding."""
    keep = ids != PAD_ID
    return [d[m].tolist() for d, m in zip(dists, keep)], \
        [i[m].tolist() for i, m in zip(ids, keep)]


class NodeService:
    """Answers requests for one shard; thread-safe (counters under a lock, RTL simulations one
    at a time)."""

    def __init__(self, config, shard, backend="golden", *, max_queries=DEFAULT_MAX_QUERIES):
        from ..node_model import node_data
        if backend not in ("golden", "rtl"):
            raise ValueError(f"backend must be golden or rtl, not {backend!r}")
        if isinstance(max_queries, bool) or not isinstance(max_queries, int) or max_queries < 1:
            raise ValueError(f"max_queries must be a positive integer, not {max_queries!r}")
        self.config, self.shard, self.backend = config, shard, backend
        self.max_queries = max_queries
        # the shard packed into channels once; requests only swap in their queries
        self._packed = node_data(config, shard, np.zeros((0, config.dim), np.int64),
                                 np.zeros((0, 1), np.int64))
        self._lock = threading.Lock()
        self._sim_lock = threading.Lock()
        self.counts = {"requests": 0, "queries": 0, "errors": 0,
                       "errors_by_kind": {kind: 0 for kind in ERROR_KINDS},
                       "connections": 0, "open_connections": 0, "idle_closed": 0}
        self.limits = {"max_queries": max_queries}
        self.inflight = None          # set by the server: a callable returning bytes in flight

    # -- counters ------------------------------------------------------------------------------

    def count(self, name, delta=1):
        """Add ``delta`` to the counter ``name`` of :attr:`counts`."""
        with self._lock:
            self.counts[name] += delta

    def count_error(self, kind):
        """Count one error of ``kind`` (the total and the per-kind counter)."""
        with self._lock:
            self.counts["errors"] += 1
            by = self.counts["errors_by_kind"]
            by[kind] = by.get(kind, 0) + 1

    def stats(self):
        """A copy of the counters, plus ``inflight_bytes`` (request bytes the server holds now) and
        the ``limits`` in force: the node's answer to a ``stats`` request."""
        with self._lock:
            out = {k: (dict(v) if isinstance(v, dict) else v) for k, v in self.counts.items()}
        out["inflight_bytes"] = self.inflight() if self.inflight else 0
        out["limits"] = dict(self.limits)
        return out

    # -- requests ------------------------------------------------------------------------------

    def check_search(self, request):
        """The validated ``(queries, probes)`` int64 arrays of a search request (a mapping with
        ``queries``, ``probes`` and ``k``); a ProtocolError with its kind otherwise."""
        c = self.config
        missing = [key for key in ("queries", "probes", "k") if key not in request]
        if missing:
            raise ProtocolError("search needs " + ", ".join(missing))
        queries, probes, k = request["queries"], request["probes"], request["k"]
        if isinstance(k, bool) or not isinstance(k, int) or k != c.k:
            shown = repr(k) if len(repr(k)) <= 40 else repr(k)[:40] + "..."
            raise ProtocolError(f"this node returns k={c.k} results, not {shown}")
        if not all(isinstance(v, (list, np.ndarray)) for v in (queries, probes)):
            raise ProtocolError("queries and probes must be lists or integer arrays")
        sent = queries.dtype if isinstance(queries, np.ndarray) else None
        queries = _int_matrix(queries, "queries", c.dim, max_rows=self.max_queries)
        probes = _int_matrix(probes, "probes", max_rows=self.max_queries)
        if len(probes) != len(queries) or (len(probes) and not 1 <= probes.shape[1] <=
                                           c.nprobe_max):
            raise ProtocolError(f"queries must be (q, {c.dim}) and probes (q, 1.."
                                f"{c.nprobe_max})")
        lo, hi = -(1 << (c.elem_bits - 1)), (1 << (c.elem_bits - 1)) - 1
        if queries.size and not _within(sent, lo, hi) and (queries.min() < lo or
                                                             queries.max() > hi):
            raise ProtocolError(f"query components must be signed {c.elem_bits}-bit integers "
                                f"({lo}..{hi})")
        if probes.size and (probes.min() < 0 or probes.max() >= c.nlist):
            raise ProtocolError(f"list ids must be in 0..{c.nlist - 1}")
        return queries, probes

    def run_search(self, queries, probes):
        """``(distances, ids)`` lists for validated arrays (see :meth:`check_search`), each row
        as long as that query's results (at most ``k``); a ``backend`` ProtocolError if the
        RTL simulation fails or disagrees."""
        return _unpadded(*self.search_arrays(queries, probes))

    def search_arrays(self, queries, probes):
        """As :meth:`run_search`, as int64 (q, k) arrays; a query with fewer than ``k``
        results (probed lists holding fewer vectors) has its row padded with id
        :data:`PAD_ID` at distance :data:`PAD_DISTANCE`."""
        from ..node_model import node_search
        data = dataclasses.replace(self._packed, queries=queries, probes=probes)
        results = [node_search(self.config, data, q, p) for q, p in zip(queries, probes)]
        if self.backend == "rtl" and results:
            try:
                with self._sim_lock:
                    results = self._simulate(data, results)
            except HwgenError as e:
                raise ProtocolError(str(e), "backend") from None
        return _padded([r[0] for r in results], self.config.k, PAD_DISTANCE), \
            _padded([r[1] for r in results], self.config.k, PAD_ID)

    def search(self, queries, probes, k):
        """``(distances, ids)`` of a batch given as lists (as on the wire)."""
        return self.run_search(*self.check_search({"queries": queries, "probes": probes,
                                                   "k": k}))

    def _simulate(self, data, golden_results):
        from ... import registry
        from ...flow.simulate import simulate
        acc = registry.get("chamvs-node")
        run = simulate(acc, self.config, items=len(data.queries), stall=0.1,
                       stimulus={"data": data, "results": golden_results}, keep_outputs=True,
                       engine="native")
        if run["mismatches"]:
            raise HwgenError(f"RTL disagrees with the golden model ({run['mismatches']} beats)")
        out, cur = [], ([], [])
        for beat in run["outputs"]["o_result"]:
            cur[0].append(beat["dist"])
            cur[1].append(beat["id"])
            if beat["last"]:
                out.append((np.array(cur[0]), np.array(cur[1])))
                cur = ([], [])
        return out

    def handle(self, request):
        """The reply to one decoded request; ProtocolError (with its ``kind``) if it is bad."""
        self.count("requests")
        op = request.get("op")
        if op == "ping":
            return {"ok": True}
        if op == "stats":
            return self.stats()
        if op == "search":
            dists, ids = self.run_search(*self.check_search(request))
            self.count("queries", len(dists))
            return {"distances": dists, "ids": ids}
        shown = repr(op) if len(repr(op)) <= 40 else repr(op)[:40] + "..."
        raise ProtocolError(f"unknown op {shown}", "unknown_op")


class _Budget:
    """Bytes in flight across all connections (used from the event loop only)."""

    def __init__(self, limit):
        self.limit, self.used = limit, 0
        self._waiters = []

    async def acquire(self, n, wait):
        """Reserve ``n`` bytes, waiting up to ``wait`` seconds for room; False if none."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait
        while self.used + n > self.limit:
            left = deadline - loop.time()
            if left <= 0:
                return False
            fut = loop.create_future()
            self._waiters.append(fut)
            try:
                async with asyncio.timeout(left):
                    await fut
            except TimeoutError:
                return False
            finally:
                if fut in self._waiters:
                    self._waiters.remove(fut)
        self.used += n
        return True

    def release(self, n):
        self.used -= n
        waiters, self._waiters = self._waiters, []
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)


class _Connection:
    """One client connection: messages in sequence until the peer closes, the connection
    idles past the timeout, or a fatal error."""

    def __init__(self, server, reader, writer):
        self.server, self.reader, self.writer = server, reader, writer

    async def send(self, obj, count_failure=True):
        """Send a message; False (and a ``send`` error counted) if it cannot be delivered."""
        srv = self.server
        try:
            data = encode_message(obj)
        except ProtocolError as e:              # a reply beyond MAX_MESSAGE
            srv.service.count_error("internal")
            data = encode_message(error_reply(f"reply too large: {e}", "internal"))
        try:
            if self.writer.is_closing():
                raise ConnectionResetError("connection closed")
            self.writer.write(data)
            if self.writer.transport.get_write_buffer_size():   # else nothing to wait for
                async with asyncio.timeout(srv.timeout):
                    await self.writer.drain()
            return True
        except (TimeoutError, OSError):
            if count_failure:
                srv.service.count_error("send")
            return False

    async def fail(self, e):
        """Count and answer a ProtocolError; True if the connection can go on."""
        self.server.service.count_error(e.kind)
        # after framing/timeout errors the peer may be gone: a failed answer is not counted
        delivered = await self.send(error_reply(e, e.kind), count_failure=not e.fatal)
        if e.fatal and delivered:
            await self.linger()
        return delivered and not e.fatal

    async def linger(self):
        """Before closing on a fatal error: stop sending and read (and drop) what the client
        still sends for a moment, so that closing with unread input does not reset the
        connection before the client has read the error answer."""
        try:
            if self.writer.can_write_eof():
                self.writer.write_eof()
            async with asyncio.timeout(min(self.server.timeout, 1.0)):
                while await self.reader.read(1 << 16):
                    pass
        except (TimeoutError, OSError):
            pass

    async def discard(self, n, deadline):
        try:
            async with asyncio.timeout_at(deadline):
                while n > 0:
                    chunk = await self.reader.read(min(n, 1 << 16))
                    if not chunk:
                        raise ProtocolError("connection closed in the middle of a message",
                                            "framing", fatal=True)
                    n -= len(chunk)
        except TimeoutError:
            raise _late(self.server.timeout) from None
        except OSError as e:
            raise ProtocolError(f"connection failed: {e}", "framing", fatal=True) from None

    async def read(self, n, deadline):
        try:
            async with asyncio.timeout_at(deadline):
                return await self.reader.readexactly(n)
        except TimeoutError:
            raise _late(self.server.timeout) from None
        except asyncio.IncompleteReadError as e:
            raise ProtocolError(f"connection closed {len(e.partial)} bytes into a "
                                f"{n}-byte read", "framing", fatal=True) from None
        except OSError as e:
            raise ProtocolError(f"connection failed: {e}", "framing", fatal=True) from None

    async def one(self):
        """Serve one message; False when the connection is to be closed."""
        srv, svc = self.server, self.server.service
        try:
            async with asyncio.timeout(srv.timeout):
                first = await self.reader.read(HEADER)
        except TimeoutError:
            svc.count("idle_closed")
            return False
        except OSError:
            return False
        if not first:
            return False                       # clean close between messages
        arrived = time.perf_counter()
        deadline = asyncio.get_running_loop().time() + srv.timeout
        try:
            header = first
            if len(header) < HEADER:
                header += await self.read(HEADER - len(header), deadline)
            n = parse_header(header, srv.max_message)
        except ProtocolError as e:
            return await self.fail(e)
        if not await srv.budget.acquire(n, BUSY_WAIT):
            try:
                await self.discard(n, deadline)
            except ProtocolError as e:
                return await self.fail(e)
            return await self.fail(ProtocolError(
                f"server busy: {srv.budget.limit} bytes of requests in flight; retry later",
                "busy"))
        try:
            try:
                body = await self.read(n, deadline)
                request = decode_message(body)
                del body
                reply = await srv.reply(request)
                if "search_us" in reply:
                    reply["handled_us"] = round((time.perf_counter() - arrived) * 1e6)
            except ProtocolError as e:
                return await self.fail(e)
            except Exception as e:         # never let anything escape: answer and count it
                _log(f"internal error: {type(e).__name__}: {e}")
                return await self.fail(ProtocolError(f"internal error: {type(e).__name__}: "
                                                     f"{e}", "internal"))
            return await self.send(reply)
        finally:
            srv.budget.release(n)


def _late(timeout):
    return ProtocolError(f"message incomplete {timeout:g} s after it started", "timeout",
                         fatal=True)


def _loop_error(loop, context):
    """asyncio's own errors (e.g. accept() out of file descriptors): one line, no traceback."""
    exc = context.get("exception")
    _log(f"event loop: {context.get('message', '')}"
         + (f": {type(exc).__name__}: {exc}" if exc else ""))


class NodeServer:
    """A :class:`NodeService` on a TCP port, served by one asyncio event loop (see the module
    docstring for the protocol and limits). The socket is bound and listening once the
    constructor returns (so a port in use raises ``OSError`` there); :meth:`serve_forever`
    serves until :meth:`shutdown` (from another thread)."""

    def __init__(self, service, address, *, timeout=DEFAULT_TIMEOUT,
                 max_inflight_bytes=DEFAULT_MAX_INFLIGHT,
                 max_connections=DEFAULT_MAX_CONNECTIONS, max_message=None, loop=None):
        if loop not in (None,) + LOOPS:
            raise ValueError(f"loop must be one of {', '.join(LOOPS)}, not {loop!r}")
        self.loop_kind = loop or default_loop()
        if not timeout > 0:
            raise ValueError(f"timeout must be positive, not {timeout!r}")
        if max_inflight_bytes < 1 or max_connections < 1:
            raise ValueError("max_inflight_bytes and max_connections must be positive")
        c = service.config
        bound = service.max_queries * (c.dim + c.nprobe_max) * 16 + (64 << 10)
        self.service = service
        self.timeout = float(timeout)
        self.max_connections = int(max_connections)
        self.max_message = int(min(max_message or min(MAX_MESSAGE, bound), MAX_MESSAGE,
                                   max_inflight_bytes))
        self.budget = _Budget(int(max_inflight_bytes))
        self._open = 0
        self._loop = self._stop = None
        self._started = threading.Event()
        self._pool = None
        service.inflight = lambda: self.budget.used
        service.limits.update(timeout=self.timeout, max_inflight_bytes=self.budget.limit,
                              max_message=self.max_message,
                              max_connections=self.max_connections)
        host, port = address
        family, kind, proto, _, sockaddr = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
        self.socket = socket.socket(family, kind, proto)
        try:
            self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self.socket.bind(sockaddr)
            self.socket.listen(LISTEN_BACKLOG)
        except BaseException:
            self.socket.close()
            raise
        self.server_address = self.socket.getsockname()

    @property
    def port(self):
        """The TCP port the server listens on (the one chosen when it was asked for port 0)."""
        return self.server_address[1]

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.server_close()

    def serve_forever(self):
        """Serve connections on an asyncio event loop in this thread until :meth:`shutdown`
        (uvloop's where :attr:`loop_kind` says so)."""
        factory = None
        if self.loop_kind == "uvloop":
            import uvloop
            factory = uvloop.new_event_loop
        with asyncio.Runner(loop_factory=factory) as runner:
            runner.run(self._serve())

    def shutdown(self):
        """Stop :meth:`serve_forever` (call from another thread)."""
        self._started.wait()
        self._loop.call_soon_threadsafe(self._stop.set)

    def server_close(self):
        """Close the listening socket and cancel RTL-backend searches not yet started."""
        self.socket.close()
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)

    async def _serve(self):
        self._loop = asyncio.get_running_loop()
        self._loop.set_exception_handler(_loop_error)
        self._stop = asyncio.Event()
        server = await asyncio.start_server(self._connection, sock=self.socket,
                                            backlog=LISTEN_BACKLOG)
        self._started.set()
        try:
            await self._stop.wait()
        finally:
            server.close()

    async def _connection(self, reader, writer):
        svc = self.service
        if self._open >= self.max_connections:
            svc.count_error("busy")
            writer.write(encode_message(error_reply(
                f"server busy: {self.max_connections} connections open", "busy")))
            writer.close()
            return
        self._open += 1
        svc.count("connections")
        svc.count("open_connections")
        try:
            sock = writer.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn = _Connection(self, reader, writer)
            while await conn.one():
                pass
        except Exception as e:             # a bug in the loop itself: log one line, drop
            svc.count_error("internal")
            _log(f"internal error: {type(e).__name__}: {e}")
        finally:
            self._open -= 1
            svc.count("open_connections", -1)
            writer.close()

    async def reply(self, request):
        """The reply to a decoded request. Golden searches run on the event loop a slice of
        :data:`SEARCH_SLICE` queries at a time, so a large request does not hold up others;
        RTL searches run in a worker thread (one simulation at a time). A binary request
        (arrays) gets a binary reply with ``search_us``; a JSON one a JSON reply."""
        svc = self.service
        if request.get("op") != "search":
            return svc.handle(request)
        svc.count("requests")
        queries, probes = svc.check_search(request)
        start = time.perf_counter()
        if svc.backend == "rtl":
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rtl")
            dists, ids = await self._loop.run_in_executor(self._pool, svc.search_arrays,
                                                          queries, probes)
        else:
            parts = []
            for s in range(0, len(queries), SEARCH_SLICE):
                if s:
                    await asyncio.sleep(0)
                parts.append(svc.search_arrays(queries[s:s + SEARCH_SLICE],
                                               probes[s:s + SEARCH_SLICE]))
            k = svc.config.k
            if len(parts) == 1:
                dists, ids = parts[0]
            elif parts:
                dists = np.concatenate([p[0] for p in parts])
                ids = np.concatenate([p[1] for p in parts])
            else:
                dists, ids = np.zeros((0, k), np.int64), np.zeros((0, k), np.int64)
        search_us = round((time.perf_counter() - start) * 1e6)
        svc.count("queries", len(dists))
        if isinstance(request, PackedSearch):
            return PackedResult(distances=dists, ids=ids, search_us=search_us)
        if isinstance(request["queries"], np.ndarray):
            return {"distances": dists, "ids": ids, "search_us": search_us}
        dists, ids = _unpadded(dists, ids)
        return {"distances": dists, "ids": ids}


#: Event loops a server can run on: uvloop (libuv; the default where it is installed: it
#: halves the loop's own cost per message) or the standard library's.
LOOPS = ("uvloop", "asyncio")


def default_loop():
    """``"uvloop"`` if the uvloop package is installed, else ``"asyncio"``."""
    import importlib.util
    return "uvloop" if importlib.util.find_spec("uvloop") else "asyncio"


def make_server(service, port=0, host="127.0.0.1", **limits):
    """A bound, listening :class:`NodeServer` (not yet serving: call ``serve_forever``, e.g.
    in a thread, and ``shutdown()`` it). ``limits``: ``timeout``, ``max_inflight_bytes``,
    ``max_connections``, ``max_message``."""
    return NodeServer(service, (host, port), **limits)


def serve(service, port=0, host="127.0.0.1", ready=None, **limits):
    """Serve ``service`` until killed; ``ready(port)`` is called once listening."""
    with make_server(service, port, host, **limits) as server:
        if ready:
            ready(server.port)
        server.serve_forever()


# -- command line ------------------------------------------------------------------------------

class _Parser(argparse.ArgumentParser):
    def error(self, message):
        self.exit(2, f"{self.prog}: error: {' '.join(message.split())}\n")


def _port(text):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"port {value} is out of range 0..65535")
    return value


def _positive(kind):
    def parse(text):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not value > 0:
            raise argparse.ArgumentTypeError(f"{text} must be positive")
        return value
    return parse


def main(argv=None):
    """``python -m hwgen.vecsearch.host.node_server SHARD`` (or ``hwgen chamvs serve``): serve
    one shard until killed; prints ``listening on PORT`` once the socket listens. Returns the
    exit status: 0, 2 for a bad shard or port (one ``node_server: error:`` line on stderr), 130
    on Ctrl-C."""
    parser = _Parser(prog="node_server", description="Serve one ChamVS node shard over TCP.")
    parser.add_argument("shard", help=".npz shard (hwgen chamvs shard)")
    parser.add_argument("--port", type=_port, default=0, help="TCP port, 0 = any free one")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--backend", choices=("golden", "rtl"), default="golden")
    parser.add_argument("--timeout", type=_positive(float), default=DEFAULT_TIMEOUT,
                        help="seconds a connection may idle, and a message may take to arrive")
    parser.add_argument("--max-queries", type=_positive(int), default=DEFAULT_MAX_QUERIES,
                        help="most queries in one search request")
    parser.add_argument("--max-inflight-bytes", type=_positive(int),
                        default=DEFAULT_MAX_INFLIGHT,
                        help="request bytes held by all connections together")
    parser.add_argument("--max-connections", type=_positive(int),
                        default=DEFAULT_MAX_CONNECTIONS, help="connections served at once")
    parser.add_argument("--loop", choices=LOOPS, default=None,
                        help="event loop (default: uvloop where installed, else asyncio)")
    args = parser.parse_args(argv)

    def fail(message):
        print(f"node_server: error: {' '.join(str(message).split())}", file=sys.stderr,
              flush=True)
        return 2

    try:
        config, shard = load_shard(args.shard)
        service = NodeService(config, shard, args.backend, max_queries=args.max_queries)
    except (HwgenError, ValueError) as e:
        return fail(e)
    try:
        server = make_server(service, args.port, args.host, timeout=args.timeout,
                             max_inflight_bytes=args.max_inflight_bytes,
                             max_connections=args.max_connections, loop=args.loop)
    except OSError as e:
        if e.errno == errno.EADDRINUSE:
            return fail(f"port {args.port} is in use")
        if e.errno == errno.EACCES:
            return fail(f"port {args.port}: permission denied")
        return fail(f"cannot listen on {args.host}:{args.port}: {e.strerror or e}")
    except (OverflowError, ValueError) as e:
        return fail(f"cannot listen on {args.host}:{args.port}: {e}")
    with server:
        print(f"listening on {server.port}", flush=True)
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
