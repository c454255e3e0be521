"""When ESPN's prefetch pays: the paper's equation (4) on quantities measured on this store.

The paper (§4.2) starts the prefetch after δ of the η lists and hides it behind the search of
the other λ = η - δ lists. Its prefetch budget (equations 2-3) is that remaining search time,
which it approximates by the search time itself; with the step s = δ / η:

    PrefetchBudget = ANNSearchTime(η) x (1 - s)                                 (2), (3)

and the prefetch stays off the critical path while a batch of queries is at most

    Query Batch threshold = BW_SSD x PrefetchBudget / Data size per query      (4)

A read here has a latency as well as a bandwidth (a prefetch of one document is not faster than
one read), so :class:`ReadModel` measures both on the store itself and uses equation (4) with the
budget less the latency of the first read: ``threshold = BW x (budget - L) / D``. A prefetch of
``D`` bytes fits when ``threshold >= batch`` (1 for one query). :func:`fitting` turns that into a
number of documents: the longest prefix of the prefetch list (best-ranked first) that fits.

``measure`` times the store's two ways of reading on the critical path, one read after another
(``direct-sync``) and ``threads`` at once (``direct``), as ``latency + bytes / bandwidth``
each; ESPN reads its misses, or everything when nothing fits, the way predicted faster.
"""

import time
from collections import deque
from dataclasses import asdict, dataclass
from statistics import median

import numpy as np

__all__ = ["ReadModel", "Observed", "batch_threshold", "prefetch_budget", "fitting", "decide",
           "measure"]


def prefetch_budget(ann_seconds, step):
    """Equations (2)-(3): the search time left after the first ``step`` (δ/η) of the lists."""
    return max(0.0, float(ann_seconds)) * (1.0 - float(step))


def batch_threshold(bandwidth, budget_seconds, bytes_per_query):
    """Equation (4): how many queries' prefetches of ``bytes_per_query`` bytes each the
    bandwidth reads within the budget (inf for no data)."""
    if bytes_per_query <= 0:
        return float("inf")
    return bandwidth * max(0.0, budget_seconds) / bytes_per_query


def fitting(sizes, budget_seconds, bandwidth, latency=0.0, batch=1):
    """Longest prefix of ``sizes`` (bytes of the documents in prefetch order) whose reads
    equation (4) says finish within the budget for ``batch`` queries: the largest ``n`` with
    ``batch_threshold(bandwidth, budget - latency, sum(sizes[:n])) >= batch``."""
    room = bandwidth * (budget_seconds - latency) / batch        # bytes that fit
    if room <= 0:
        return 0
    return int(np.searchsorted(np.cumsum(np.asarray(sizes, np.float64)), room, side="right"))


@dataclass(frozen=True)
class ReadModel:
    """Critical-path read time ``latency + bytes / bandwidth`` (seconds, bytes/s) of a store,
    one read after another (``sync_``) and ``threads`` reads in flight (``parallel_``)."""
    sync_latency: float
    sync_bandwidth: float
    parallel_latency: float
    parallel_bandwidth: float
    threads: int = 1

    def seconds(self, nbytes, mode):
        """Predicted time to read ``nbytes`` in ``mode`` (``"sync"`` or ``"parallel"``)."""
        if nbytes <= 0:
            return 0.0
        if mode == "sync":
            return self.sync_latency + nbytes / self.sync_bandwidth
        return self.parallel_latency + nbytes / self.parallel_bandwidth

    def best(self, nbytes):
        """The faster way to read ``nbytes`` on the critical path: ``"sync"`` or
        ``"parallel"`` (sync on a tie: fewer threads)."""
        if self.threads <= 1:
            return "sync"
        return ("sync" if self.seconds(nbytes, "sync") <= self.seconds(nbytes, "parallel")
                else "parallel")

    def read(self, store, docs):
        """``{doc: tokens}`` of ``docs`` read now from ``store`` (a
        :class:`~hwgen.espn.host.store.DirectStore`) the faster way for their bytes
        (:meth:`best`): one after another (``read_sync``) or ``threads`` at once (``read``)."""
        nbytes = int(store.extents[np.asarray(docs, np.int64)].sum())
        return store.read_sync(docs) if self.best(nbytes) == "sync" else store.read(docs)

    def fitting(self, sizes, budget_seconds, batch=1):
        """:func:`fitting` with the background prefetch's (parallel) bandwidth and latency."""
        return fitting(sizes, budget_seconds, self.parallel_bandwidth, self.parallel_latency,
                       batch)

    def documents(self, budget_seconds, doc_bytes):
        """How many documents of ``doc_bytes`` each fit the budget (:meth:`fitting` of equal
        sizes, in closed form)."""
        room = self.parallel_bandwidth * (budget_seconds - self.parallel_latency)
        return max(0, int(room // doc_bytes)) if room > 0 else 0

    def threshold(self, budget_seconds, bytes_per_query):
        """Equation (4) with the budget less the first read's latency."""
        return batch_threshold(self.parallel_bandwidth, budget_seconds - self.parallel_latency,
                               bytes_per_query)

    def as_dict(self):
        """The model's fields as a JSON-ready dict (``ReadModel(**d)`` reads it back)."""
        return asdict(self)


class Observed:
    """What a searcher has measured of its last ``history`` queries: search times without a
    prefetch in flight (``ann``, seconds), the time a prefetch in flight added to a search
    (``overhead``), the share of prefetched documents that were re-ranked (``precision``) and
    the documents re-ranked (``count``). Give values to start from (tests, a known machine)."""

    def __init__(self, ann=(), overhead=(), precision=(), count=(), history=32):
        self.ann = deque(ann, maxlen=history)
        self.overhead = deque(overhead, maxlen=history)
        self.precision = deque(precision, maxlen=history)
        self.count = deque(count, maxlen=history)

    def plain(self, ann_seconds, count):
        """A query that searched with no prefetch in flight."""
        self.ann.append(ann_seconds)
        self.count.append(count)

    def prefetched(self, ann_seconds, count, prefetched, hits):
        """A query that prefetched ``prefetched`` documents, ``hits`` of them re-ranked."""
        self.overhead.append(max(0.0, ann_seconds - median(self.ann)))
        self.precision.append(hits / prefetched)
        self.count.append(count)


def decide(observed, step, model, doc_bytes, count):
    """The prefetch decision of one query from what ``observed`` holds (medians), the
    prefetch ``step``, the store's ``model``, the mean document size ``doc_bytes`` and the
    documents to re-rank (``count``, when none were observed yet):

    * ``budget`` = median search time x (1 - step) (equations 2-3);
    * ``overhead`` = median time a prefetch added to the search (0 before any);
    * ``room`` = budget - overhead; ``fit`` = documents whose reads fit in it (equation 4
      with the latency, :meth:`ReadModel.documents`), at most ``count``;
    * ``hit`` = median share of prefetched documents re-ranked (1 before any);
    * ``saving`` = hit x the time the fitting documents' reads take off the critical path
      (read the faster way);
    * ``prefetch`` = at least one document fits and ``saving > overhead``.

    Returns them as a dict (seconds)."""
    budget = prefetch_budget(median(observed.ann), step)
    overhead = median(observed.overhead) if observed.overhead else 0.0
    room = budget - overhead
    count = int(median(observed.count)) if observed.count else count
    fit = min(count, model.documents(room, doc_bytes))
    hit = median(observed.precision) if observed.precision else 1.0
    total = count * doc_bytes
    way = model.best(total)
    saving = hit * (model.seconds(total, way) - model.seconds(total - fit * doc_bytes, way))
    return {"budget": budget, "overhead": overhead, "room": room, "fit": fit, "hit": hit,
            "saving": saving, "prefetch": fit >= 1 and saving > overhead}


def _line(points):
    """``(latency, bandwidth)`` of the line through ``(bytes, seconds)`` medians: two sizes;
    a slope that noise made flat or negative falls back to the larger read's mean rate."""
    (b1, t1), (b2, t2) = points
    if t2 > t1 and b2 > b1:
        bandwidth = (b2 - b1) / (t2 - t1)
        return max(0.0, float(t1 - b1 / bandwidth)), float(bandwidth)
    return 0.0, float(b2 / max(t2, 1e-9))


def measure(store, size=128, rounds=5):
    """A :class:`ReadModel` of ``store`` (a :class:`~hwgen.espn.host.store.DirectStore`),
    timed on its own file: one document and ``size`` documents spread over the file, read
    one after another and ``threads`` at once, the median of ``rounds`` each on other
    documents (alternating the two ways). Costs about ``2 x rounds x (size + 1)`` reads."""
    n = len(store.offsets)
    size = max(1, min(size, n // 2 or 1))
    rng = np.random.default_rng(0)
    ways = {"sync": store.read_sync, "parallel": store.read}
    times = {(way, k): [] for way in ways for k in (1, size)}
    for r in range(rounds):
        for k in (1, size):
            for way, read in (ways.items() if r % 2 else reversed(ways.items())):
                docs = rng.choice(n, size=k, replace=False)
                t0 = time.perf_counter()
                read(docs)
                times[way, k].append((time.perf_counter() - t0,
                                      sum(store.extent(int(d)) for d in docs)))
    fitted = {}
    for way in ways:
        points = []
        for k in (1, size):
            seconds, nbytes = np.median(np.asarray(times[way, k]), axis=0)
            points.append((nbytes, seconds))
        fitted[way] = _line(points) if size > 1 else (float(points[0][1]), float("inf"))
    return ReadModel(*fitted["sync"], *fitted["parallel"], threads=store.threads)
