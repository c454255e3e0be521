"""The CPU coordinator of ChamVS: shards a database over memory nodes, broadcasts queries to them
over TCP, merges their top-k and maps ids to payloads (Chameleon section 3 and 4.3).

Sharding schemes (paper section 4.3):

``"split-lists"``
    every node holds every list, with a ``1/N`` share of each list's vectors (vector ``i`` of a
    list on node ``i % N``): all nodes do the same work for every query (the paper's choice);
``"whole-lists"``
    list ``l`` lives on node ``l % N`` only: cheaper with many small lists, but a query's work
    falls on the nodes that happen to hold its lists.

Every node runs the same node configuration (lists a node does not hold are empty there), so a
query goes to all nodes with the same probed list ids. Results are merged by (distance, id).

Wire protocol (:mod:`hwgen.vecsearch.host.protocol`): length-prefixed JSON messages on TCP, over one
persistent connection per node, reused across searches (one request at a time per node; a
connection that failed, timed out or was closed by the node is dropped and reopened by the next
request, and a search that finds its reused connection closed retries once on a fresh one
within its time). A node that does not answer within ``timeout`` seconds (or whose connection
fails, or which answers with an error) is left out of the merge and the result is flagged
``partial`` with the node listed in ``missing``; the coordinator never waits longer than the
timeout.
"""

import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from ...errors import ConfigError
from ...lib import topk
from .protocol import ProtocolError, encode_message, recv_message

__all__ = ["SCHEMES", "shard_lists", "Coordinator", "SearchResult", "merge_topk",
           "same_results"]

SCHEMES = ("split-lists", "whole-lists")


def shard_lists(list_codes, list_ids, nodes, scheme="split-lists"):
    """Per node, the (codes, ids) of every list that node holds (empty lists elsewhere)."""
    if scheme not in SCHEMES:
        raise ConfigError("scheme", "must be one of " + ", ".join(SCHEMES), value=scheme)
    if nodes < 1:
        raise ConfigError("nodes", "must be at least 1", value=nodes)
    shards = []
    for n in range(nodes):
        codes, ids = [], []
        for lst, (c, i) in enumerate(zip(list_codes, list_ids)):
            if scheme == "split-lists":
                codes.append(c[n::nodes])
                ids.append(i[n::nodes])
            elif lst % nodes == n:
                codes.append(c)
                ids.append(i)
            else:
                codes.append(c[:0])
                ids.append(i[:0])
        shards.append((codes, ids))
    return shards


def merge_topk(parts, k):
    """Global top-k of per-node (distances, ids) lists, ordered by (distance, id)
    (:func:`hwgen.lib.topk.merge_topk` with int64 distances)."""
    return topk.merge_topk(parts, k, dtype=np.int64)


def same_results(a, b):
    """Two top-k results agree: the same distances in order, and the same ids wherever the
    distance is below the last one (items tied at the k-th distance may legitimately differ,
    as the hardware breaks ties by scan position)."""
    (da, ia), (db, ib) = a, b
    if not np.array_equal(np.asarray(da), np.asarray(db)):
        return False
    if len(da) == 0:
        return True
    below = np.asarray(da) < da[-1]
    return set(np.asarray(ia)[below].tolist()) == set(np.asarray(ib)[below].tolist())


@dataclass
class SearchResult:
    """Merged results of a batch of queries."""
    distances: list
    ids: list
    payloads: list
    partial: bool = False
    missing: list = field(default_factory=list)
    seconds: float = 0.0


class _NodeLink:
    """The persistent connection to one node, used by one request at a time."""

    def __init__(self, address):
        self.address = tuple(address)
        self.sock = None
        self.lock = threading.Lock()

    def drop(self):
        if self.sock is not None:
            try:
                self.sock.close()
            except OSError:
                pass
            self.sock = None

    def alive(self):
        """False if the node closed (or reset) the idle connection since its last use."""
        try:
            self.sock.settimeout(0)        # a socket timeout would make recv wait for data
            return self.sock.recv(1, socket.MSG_PEEK) != b""
        except BlockingIOError:
            return True
        except OSError:
            return False


class Coordinator:
    """Broadcasts queries to node servers and merges their answers.

    Parameters
    ----------
    nodes : list of (host, port)
    timeout : float
        Seconds to wait for a node's answer (connection included).
    payloads : mapping id -> text, optional
        Returned beside the ids (the paper's ChamTS token store).
    max_batch : int
        Most queries sent in one request (a node refuses more than its ``--max-queries``,
        1024 by default): larger batches go as several requests on the same connection.

    One connection per node is kept open between searches; :meth:`close` (or leaving a
    ``with`` block) closes them.
    """

    def __init__(self, nodes, timeout=5.0, payloads=None, max_batch=1024):
        if not nodes:
            raise ConfigError("nodes", "at least one node address is needed")
        if isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1:
            raise ConfigError("max_batch", "must be an integer >= 1", value=max_batch)
        self.nodes = [tuple(a) for a in nodes]
        self.timeout = timeout
        self.max_batch = max_batch
        self.payloads = payloads or {}
        self._links = [_NodeLink(a) for a in self.nodes]
        self._pool = ThreadPoolExecutor(max_workers=len(self.nodes))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _ask(self, link, messages, deadline):
        """The node's replies to ``messages`` (encoded requests), merged into one."""
        if not link.lock.acquire(timeout=max(0.0, deadline - time.monotonic())):
            raise TimeoutError(f"node {link.address} busy past the timeout")
        try:
            replies = []
            for data in messages:
                replies.append(self._exchange(link, data, deadline, retry=not replies))
                if replies[-1].get("error"):
                    return replies[-1]
            if len(replies) == 1:
                return replies[0]
            return {"distances": [d for r in replies for d in r["distances"]],
                    "ids": [i for r in replies for i in r["ids"]]}
        finally:
            link.lock.release()

    @staticmethod
    def _exchange(link, data, deadline, retry):
        for attempt in (0, 1):
            if link.sock is not None and not link.alive():
                link.drop()
            reused = link.sock is not None
            if not reused:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no time left to connect to {link.address}")
                link.sock = socket.create_connection(link.address, timeout=left)
                link.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            try:
                link.sock.settimeout(max(0.01, deadline - time.monotonic()))
                link.sock.sendall(data)
                return recv_message(link.sock, deadline=deadline)
            except (ConnectionError, ProtocolError) as e:
                link.drop()
                # a reused connection the node closed meanwhile: searches are idempotent, so
                # ask once more on a fresh one
                stale = reused and (isinstance(e, ConnectionError) or e.kind == "framing")
                if attempt or not retry or not stale or time.monotonic() >= deadline:
                    raise
            except BaseException:
                link.drop()
                raise

    def search(self, queries, probes, k):
        """Search a batch: ``queries`` (q, D) integers, ``probes`` (q, nprobe) list ids."""
        start = time.monotonic()
        deadline = start + self.timeout
        queries, probes = np.asarray(queries).tolist(), np.asarray(probes).tolist()
        messages = [encode_message({"op": "search", "queries": queries[s:s + self.max_batch],
                                    "probes": probes[s:s + self.max_batch], "k": int(k)})
                    for s in range(0, len(queries), self.max_batch)] or \
            [encode_message({"op": "search", "queries": [], "probes": [], "k": int(k)})]
        futures = [self._pool.submit(self._ask, link, messages, deadline)
                   for link in self._links]
        answers, missing = [], []
        for addr, fut in zip(self.nodes, futures):
            try:
                reply = fut.result(timeout=max(0.0, deadline + 0.5 - time.monotonic()))
                if reply.get("error"):
                    raise ProtocolError(reply["error"], reply.get("kind", "bad_request"))
                if len(reply["distances"]) != len(queries) or len(reply["ids"]) != \
                        len(queries):
                    raise ProtocolError("answer for a different number of queries")
                answers.append(reply)
            except Exception:      # timeout, refused, reset, malformed: the node is missing
                missing.append(f"{addr[0]}:{addr[1]}")
        dists, ids = [], []
        for q in range(len(queries)):
            d, i = merge_topk([(a["distances"][q], a["ids"][q]) for a in answers], k)
            dists.append(d)
            ids.append(i)
        payloads = [[self.payloads.get(int(x)) for x in row] for row in ids]
        return SearchResult(dists, ids, payloads, partial=bool(missing), missing=missing,
                            seconds=time.monotonic() - start)

    def close(self):
        """Close the connection to every node (waiting up to ``timeout`` seconds for a search in
        flight on it) and cancel queued requests."""
        self._pool.shutdown(wait=False, cancel_futures=True)
        for link in self._links:
            if link.lock.acquire(timeout=self.timeout):
                try:
                    link.drop()
                finally:
                    link.lock.release()
            else:
                link.drop()
