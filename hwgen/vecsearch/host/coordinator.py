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

Wire protocol (:mod:`hwgen.vecsearch.host.protocol`): length-prefixed messages on TCP, queries and
results as packed records (``binary=False`` sends the nested JSON lists instead), over
one persistent connection per node, reused across searches, all of them served by the calling
thread (:mod:`hwgen.vecsearch.host.links`: every node is written to before any is read; large
requests are multiplexed with a selector). A batch larger than ``max_batch`` goes as several
requests pipelined on that connection. One search at a time uses a node's connection; a connection that failed, timed out or was closed
by the node is dropped and reopened by the next request, and a search that finds its reused
connection closed retries once on a fresh one within its time. A node that does not answer within ``timeout`` seconds (or whose connection
fails, or which answers with an error) is left out of the merge and the result is flagged
``partial`` with the node listed in ``missing``; the coordinator never waits longer than the
timeout.
"""

import time
from dataclasses import dataclass, field

import numpy as np

from ...errors import ConfigError
from ...lib import topk
from .links import NodeLink, exchange_all
from .protocol import ProtocolError, encode_message, encode_search

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


_INT_RANGES = tuple((t, int(np.iinfo(t).min), int(np.iinfo(t).max))
                    for t in (np.int8, np.int16, np.int32, np.int64))


def _smallest_int(values):
    """The narrowest signed integer dtype holding every value of ``values``."""
    if values.size == 0 or values.dtype == np.int8:
        return np.int8
    lo, hi = int(values.min()), int(values.max())
    return next((t for t, tlo, thi in _INT_RANGES if tlo <= lo and hi <= thi), values.dtype)


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
    #: the slowest answering node's own search time (``search_us`` of binary replies), None
    #: when no node reported one: ``seconds - node_seconds`` is what transport costs
    node_seconds: float = None
    #: the slowest answering node's time from a request's first bytes to its reply
    #: (``handled_us``): ``seconds - node_handled_seconds`` is the network and the two ends'
    #: wake-ups, ``node_handled_seconds - node_seconds`` the node's own request handling
    node_handled_seconds: float = None

    def transport_split(self, round_trip):
        """``round_trip`` (the caller's own timing of this search, in seconds) split by what
        the nodes reported: ``node_reported_s`` (the slowest node's search), ``transport_s``
        (the rest) and, where the nodes also reported ``handled_us``, ``node_handling_s`` (their
        reading, decoding and validation) and ``network_s`` (sockets, encoding, merging, both
        ends' wake-ups). Empty when no node reported its search time."""
        if self.node_seconds is None:
            return {}
        out = {"node_reported_s": self.node_seconds,
               "transport_s": round_trip - self.node_seconds}
        if self.node_handled_seconds is not None:
            out.update(node_handling_s=self.node_handled_seconds - self.node_seconds,
                       network_s=round_trip - self.node_handled_seconds)
        return out


def _merged(replies):
    """One node's replies to the requests of a batch as one reply (its first error reply if
    it refused one), or the exception that ended its exchange."""
    if isinstance(replies, BaseException):
        return replies
    failed = next((r for r in replies if r.get("error")), None)
    if failed is not None:
        return failed
    if len(replies) == 1:
        return replies[0]
    return {"distances": [d for r in replies for d in r["distances"]],
            "ids": [i for r in replies for i in r["ids"]],
            "search_us": sum(r.get("search_us", 0) for r in replies),
            "handled_us": sum(r.get("handled_us", 0) for r in replies)}


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
    binary : bool
        Send queries and probes as integer arrays and receive the results as arrays (packed
        records, the default), or as nested JSON lists.

    One connection per node is kept open between searches; :meth:`close` (or leaving a
    ``with`` block) closes them.
    """

    def __init__(self, nodes, timeout=5.0, payloads=None, max_batch=1024, binary=True):
        if not nodes:
            raise ConfigError("nodes", "at least one node address is needed")
        if isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1:
            raise ConfigError("max_batch", "must be an integer >= 1", value=max_batch)
        self.nodes = [tuple(a) for a in nodes]
        self.timeout = timeout
        self.max_batch = max_batch
        self.binary = bool(binary)
        self.payloads = payloads or {}
        self._links = [NodeLink(a) for a in self.nodes]

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _exchange(self, messages, deadline):
        """Per node, its replies to ``messages`` merged into one, or the exception that made
        it missing (its connection busy with another search past the deadline, refused,
        closed, late or malformed)."""
        held = [link.lock.acquire(timeout=max(0.0, deadline - time.monotonic()))
                for link in self._links]
        try:
            ready = [link for link, h in zip(self._links, held) if h]
            outcomes = iter(exchange_all(ready, messages, deadline))
            return [_merged(next(outcomes)) if h else
                    TimeoutError(f"node {link.address} busy past the timeout")
                    for link, h in zip(self._links, held)]
        finally:
            for link, h in zip(self._links, held):
                if h:
                    link.lock.release()

    def _requests(self, queries, probes, k):
        """The encoded search requests of a batch, at most ``max_batch`` queries each: packed
        records for integer arrays (:func:`~hwgen.vecsearch.host.protocol.encode_search`),
        safetensors for arrays of other types (the node answers why it refuses them), JSON
        lists without ``binary`` or for an empty batch."""
        queries, probes = np.asarray(queries), np.asarray(probes)
        slices = range(0, max(len(queries), 1), self.max_batch)
        if self.binary and len(queries) and queries.ndim == probes.ndim == 2 and \
                len(probes) == len(queries) and queries.dtype.kind in "iu" and \
                probes.dtype.kind in "iu":
            queries = queries.astype(_smallest_int(queries), copy=False)
            return [encode_search(queries[s:s + self.max_batch], probes[s:s + self.max_batch],
                                  int(k)) for s in slices]
        if not (self.binary and len(queries)):
            queries, probes = queries.tolist(), probes.tolist()
        return [encode_message({"op": "search", "queries": queries[s:s + self.max_batch],
                                "probes": probes[s:s + self.max_batch], "k": int(k)})
                for s in slices]

    def search(self, queries, probes, k):
        """Search a batch: ``queries`` (q, D) integers, ``probes`` (q, nprobe) list ids."""
        start = time.monotonic()
        deadline = start + self.timeout
        messages = self._requests(queries, probes, k)
        queries = np.asarray(queries)
        answers, missing = [], []
        for addr, reply in zip(self.nodes, self._exchange(messages, deadline)):
            try:
                if isinstance(reply, Exception):
                    raise reply
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
        payloads = [[self.payloads.get(int(x)) for x in row] for row in ids] \
            if self.payloads else [[None] * len(row) for row in ids]
        node_us = [a["search_us"] for a in answers if "search_us" in a]
        handled_us = [a["handled_us"] for a in answers if "handled_us" in a]
        return SearchResult(dists, ids, payloads, partial=bool(missing), missing=missing,
                            seconds=time.monotonic() - start,
                            node_seconds=max(node_us) / 1e6 if node_us else None,
                            node_handled_seconds=max(handled_us) / 1e6 if handled_us else None)

    def close(self):
        """Close the connection to every node (waiting up to ``timeout`` seconds for a search in
        flight on it)."""
        for link in self._links:
            if link.lock.acquire(timeout=self.timeout):
                try:
                    link.drop()
                finally:
                    link.lock.release()
            else:
                link.drop()
