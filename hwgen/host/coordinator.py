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

Wire protocol (:mod:`hwgen.host.protocol`): length-prefixed JSON messages on TCP. A node that
does not answer within ``timeout`` seconds (or whose connection fails) is left out of the merge
and the result is flagged ``partial`` with the node listed in ``missing``; the coordinator
never waits longer than the timeout.
"""

import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from ..errors import ConfigError
from .protocol import ProtocolError, recv_message, send_message

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
    """Global top-k of per-node (distances, ids) lists, ordered by (distance, id)."""
    d = np.concatenate([np.asarray(p[0], dtype=np.int64) for p in parts]) if parts else \
        np.zeros(0, np.int64)
    i = np.concatenate([np.asarray(p[1], dtype=np.int64) for p in parts]) if parts else \
        np.zeros(0, np.int64)
    order = np.lexsort((i, d))[:k]
    return d[order], i[order]


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


class Coordinator:
    """Broadcasts queries to node servers and merges their answers.

    Parameters
    ----------
    nodes : list of (host, port)
    timeout : float
        Seconds to wait for a node's answer (connection included).
    payloads : mapping id -> text, optional
        Returned beside the ids (the paper's ChamTS token store).
    """

    def __init__(self, nodes, timeout=5.0, payloads=None):
        if not nodes:
            raise ConfigError("nodes", "at least one node address is needed")
        self.nodes = list(nodes)
        self.timeout = timeout
        self.payloads = payloads or {}
        self._pool = ThreadPoolExecutor(max_workers=len(self.nodes))

    def _ask(self, address, request):
        deadline = time.monotonic() + self.timeout
        with socket.create_connection(address, timeout=self.timeout) as sock:
            sock.settimeout(max(0.01, deadline - time.monotonic()))
            send_message(sock, request)
            sock.settimeout(max(0.01, deadline - time.monotonic()))
            return recv_message(sock)

    def search(self, queries, probes, k):
        """Search a batch: ``queries`` (q, D) integers, ``probes`` (q, nprobe) list ids."""
        start = time.monotonic()
        request = {"op": "search", "queries": np.asarray(queries).tolist(),
                   "probes": np.asarray(probes).tolist(), "k": int(k)}
        futures = [self._pool.submit(self._ask, addr, request) for addr in self.nodes]
        answers, missing = [], []
        for addr, fut in zip(self.nodes, futures):
            try:
                reply = fut.result(timeout=self.timeout + 1.0)
                if reply.get("error"):
                    raise ProtocolError(reply["error"])
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
        self._pool.shutdown(wait=False, cancel_futures=True)
