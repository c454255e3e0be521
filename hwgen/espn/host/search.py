"""ESPN's retrieval: IVF candidates, ANN prefetch, early re-ranking, merge, partial re-ranking.

One query (paper §4):

1. the query's pooled vector probes the ``nprobe`` (η) nearest IVF lists of the faiss index for
   the top ``candidates`` documents by inner product (1,000 by default, as the paper);
2. with a ``prefetch_step`` (δ/η), and when equation (4) says the prefetch can be hidden
   (:mod:`.prefetch`), the lists are probed in two steps: after the first δ lists the token
   embeddings of the best current candidates that fit the prefetch budget are requested from
   the store in the background (§4.2) while the other lists are probed; each prefetched
   document is scored by MaxSim as it arrives (early re-ranking, §4.3);
3. once the search ends, the prefetch is stopped and only the final candidates whose read had
   not started are read (the critical path), the faster of the store's two ways, and scored;
   early and late scores are merged and sorted. Without a prefetch that fits, the query reads
   as the faster SSD method does;
4. ``rerank`` = k' re-ranks only the first k' candidates of the ANN order (partial re-ranking,
   §4.4); the others are not read at all.

Every document's score is :func:`maxsim` of the same float16 tokens in float32 whichever way its
tokens arrived, and ties order by document id, so without partial re-ranking the top-k ids and
scores equal the in-memory pipeline's exactly (``tests/test_espn_search.py``).

``precision="int8"`` scores with the golden model of the ``maxsim`` hardware unit instead
(:func:`hwgen.espn.golden.maxsim_scores`) on tokens quantised to int8 (x 127, the vectors have unit
norm): the re-ranking a MaxSim unit beside the SSD would compute.
"""

import threading
import time
from dataclasses import dataclass, field
from statistics import median

import numpy as np

from ...errors import ConfigError
from ...lib import topk
from ...lib.quant import quantize
from ..golden import maxsim_scores
from .prefetch import Observed, decide, measure, prefetch_budget

__all__ = ["maxsim", "maxsim_int8", "Query", "Result", "Searcher", "ann_steps", "merge_topk",
           "INT8_INV_SCALE", "INT8_SCALE", "MAX_CANDIDATES", "CANDIDATES"]

#: Most candidates one query may take from the ANN (``--candidates``): faiss allocates a
#: score and an id per candidate and query before it searches. Fewer are taken when the index
#: holds fewer documents.
MAX_CANDIDATES = 100_000
#: Candidates re-ranked per query by default: the paper's 1,000 (§4.4, Fig. 6).
CANDIDATES = 1000

#: Integers per unit of the int8 token quantisation (unit-norm vectors: every element is in
#: [-1, 1]): the reciprocal of the step ``scale`` of :func:`hwgen.lib.quant.quantize`.
INT8_INV_SCALE = 127
#: The old name of :data:`INT8_INV_SCALE` (a multiplier, not a step), kept for its users.
INT8_SCALE = INT8_INV_SCALE


def maxsim(query, doc):
    """MaxSim of one document: sum over query tokens of the max dot product over doc tokens.

    ``query`` (q, dim) and ``doc`` (n, dim) are float16; the products and sums are float32 in a
    fixed order, so equal inputs give bit-equal scores."""
    return _maxsim_float32(query.astype(np.float32), doc)


def _maxsim_float32(query32, doc):
    """:func:`maxsim` with the query already converted to float32 (once per search)."""
    sims = doc.astype(np.float32) @ query32.T                            # (n, q)
    return np.float32(sims.max(axis=0).sum(dtype=np.float32))


def quantise_int8(tokens):
    """float16 unit vectors -> int8 (round half to even of x * 127 in float32, clipped to
    -127..127): :func:`hwgen.lib.quant.quantize` with ``inv_scale=127``,
    ``compute_dtype=float32``."""
    return quantize(tokens, inv_scale=INT8_INV_SCALE, compute_dtype=np.float32,
                    name="tokens").values


def maxsim_int8(query, doc):
    """The ``maxsim`` unit's integer score of one document (golden model of the hardware)."""
    return _maxsim_int8(quantise_int8(query), doc)


def _maxsim_int8(query8, doc):
    """:func:`maxsim_int8` with the query already quantised (once per search)."""
    d = quantise_int8(doc)
    return np.int64(maxsim_scores(query8, d, [d.shape[0]])[0])


#: precision -> (prepare the query once per search, score one document with it)
_SCORERS = {"float16": (lambda tokens: tokens.astype(np.float32), _maxsim_float32),
            "int8": (quantise_int8, _maxsim_int8)}


@dataclass
class Query:
    """An encoded query: its pooled vector (384,) and float16 tokens (q, dim)."""
    pooled: np.ndarray
    tokens: np.ndarray
    text: str = ""


@dataclass
class Result:
    """One query's answer and what it cost.

    ``ids``/``scores``: the top-k, best first. ``times``: seconds per stage (``ann``: the whole
    probe; ``fetch``: waiting for token embeddings after the probe, the critical path;
    ``rerank``: MaxSim after the probe; ``total``). ``prefetched``: documents whose prefetch
    read started; ``hits``: final candidates among them; ``missed``: final candidates read
    after the search; ``bytes_read``: from the token file. ``plan``: the prefetch decision
    when the query prefetched (``budget`` seconds, ``fit`` documents of the first step's
    candidates that fit it, equation (4)'s ``threshold`` for all of them), else empty."""
    ids: np.ndarray
    scores: np.ndarray
    candidates: np.ndarray
    times: dict = field(default_factory=dict)
    prefetched: int = 0
    hits: int = 0
    missed: int = 0
    bytes_read: int = 0
    plan: dict = field(default_factory=dict)

    @property
    def hit_rate(self):
        """Fraction of the re-ranked final candidates that the prefetch had already read (NaN when
        none was re-ranked)."""
        reranked = self.hits + self.missed
        return self.hits / reranked if reranked else float("nan")


def merge_topk(parts, k):
    """Top ``k`` of several ``(scores, ids)`` results of disjoint lists, by score then id
    (:func:`hwgen.lib.topk.merge_topk`, largest first; padding ids dropped)."""
    return topk.merge_topk(parts, k, largest=True)


def ann_steps(ivf, pooled, nprobe, candidates, split=None):
    """Probe the ``nprobe`` nearest lists of ``ivf`` for ``pooled`` (n, 384) queries.

    ``split`` (lists probed first) makes it a pair of calls: returns ``(first, finish)`` where
    ``first`` is the per-query top after ``split`` lists and ``finish()`` probes the rest and
    returns the final top (``split >= nprobe``: both are the final top). Without ``split`` it
    returns the final top directly. A top is a list of ``(scores, ids)`` per query."""
    pooled = np.ascontiguousarray(pooled, np.float32)
    nprobe = min(nprobe, ivf.nlist)
    coarse_d, coarse_i = ivf.quantizer.search(pooled, nprobe)

    def probe(lo, hi):
        ivf.nprobe = hi - lo            # search_preassigned takes no per-call parameters
        return ivf.search_preassigned(pooled, candidates, np.ascontiguousarray(coarse_i[:, lo:hi]),
                                      np.ascontiguousarray(coarse_d[:, lo:hi]))

    if split is None or split >= nprobe:
        d, i = probe(0, nprobe)
        final = [merge_topk([(d[q], i[q])], candidates) for q in range(len(pooled))]
        return final if split is None else (final, lambda: final)
    split = max(1, split)
    d1, i1 = probe(0, split)
    first = [merge_topk([(d1[q], i1[q])], candidates) for q in range(len(pooled))]

    def finish():
        d2, i2 = probe(split, nprobe)
        return [merge_topk([first[q], (d2[q], i2[q])], candidates) for q in range(len(pooled))]
    return first, finish


class Searcher:
    """ESPN's pipeline over an :class:`~hwgen.espn.host.index.Index` and a store reader.

    Parameters: ``nprobe`` (η lists), ``candidates`` (documents from the ANN, all re-ranked;
    the paper's :data:`CANDIDATES` by default, fewer when the index holds fewer), ``k``
    (results), ``prefetch_step`` (δ/η in (0, 1), None: no prefetch), ``rerank`` (k': re-rank
    only the ANN's first k' candidates; None: all), ``precision`` (``"float16"`` or
    ``"int8"``), ``read_model`` (a :class:`~hwgen.espn.host.prefetch.ReadModel` of the store;
    measured on it by default when prefetching).

    Without a prefetch step every query searches, then reads all its re-ranked candidates with
    the store's ``read`` and scores them (the ``ssd``, ``ssd-sync``, ``mmap`` and in-memory
    methods). With one, each query decides from quantities measured here (:meth:`plan`):

    * the **budget** (equations 2-3): the median time of the last searches that ran without a
      prefetch, x (1 - step);
    * the **overhead**: the median time that a prefetch in flight added to the search (its
      start and its threads competing with the search for the cores);
    * the **room**: budget - overhead; equation (4) with the store's measured bandwidth and
      latency (:class:`ReadModel`) gives the best-ranked candidates whose reads fit in it;
    * the **saving**: the measured share of prefetched documents that were re-ranked x the time
      their reads would take on the critical path.

    When nothing fits or the saving does not exceed the overhead, the query runs exactly as the
    faster SSD method (one search, then every candidate read one after another or ``threads``
    at once, whichever the ``ReadModel`` predicts faster, then scored). Otherwise the lists
    are probed in two steps; after the first δ the candidates that fit are prefetched and
    scored by MaxSim as they arrive (early re-ranking); when the search ends the prefetch is
    stopped: reads not yet started are dropped, the final candidates whose read started are
    reused (waited for if in flight), and only the others are read, the faster way, and scored.
    No document is read twice. Before the first query the medians are seeded by three searches
    at the IVF's first centroids, alone and with a prefetch in flight.

    Prefetching needs a store with ``submit`` (:class:`~hwgen.espn.host.store.DirectStore`).
    """

    def __init__(self, index, store, nprobe=16, candidates=None, k=10, prefetch_step=None,
                 rerank=None, precision="float16", read_model=None):
        candidates = CANDIDATES if candidates is None else candidates
        for name, value in (("nprobe", nprobe), ("candidates", candidates), ("k", k)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(name, "must be a positive integer", value=value)
        if candidates > MAX_CANDIDATES:
            raise ConfigError("candidates", f"must be at most {MAX_CANDIDATES:,}",
                              value=candidates)
        if prefetch_step is not None and not 0 < prefetch_step < 1:
            raise ConfigError("prefetch_step", "a fraction of nprobe in (0, 1)",
                              value=prefetch_step)
        if prefetch_step is not None and not hasattr(store, "submit"):
            raise ConfigError("store", "prefetching needs an asynchronous store (direct), "
                              f"not {store.name}")
        if rerank is not None and (isinstance(rerank, bool) or not isinstance(rerank, int)
                                   or not 1 <= rerank <= candidates):
            raise ConfigError("rerank_count", f"must be in [1, candidates={candidates}]",
                              value=rerank)
        if precision not in _SCORERS:
            raise ConfigError("rerank", "float16 or int8", value=precision)
        self.index, self.store = index, store
        # more candidates than documents would only allocate padding
        self.nprobe, self.k = min(nprobe, index.ivf.nlist), k
        self.candidates = min(candidates, max(1, int(index.ivf.ntotal)))
        self.prefetch_step, self.rerank, self.precision = prefetch_step, rerank, precision
        self._prepare, self._score = _SCORERS[precision]
        self.model = None
        #: what the prefetch decisions are made from (:class:`~.prefetch.Observed`)
        self.observed = Observed()
        if prefetch_step is not None:
            self.model = read_model if read_model is not None else measure(store)
            self._calibrate()

    @property
    def split(self):
        """Lists probed before the prefetch starts (δ)."""
        if self.prefetch_step is None:
            return None
        return max(1, int(round(self.prefetch_step * self.nprobe)))

    def _calibrate(self):
        """Seed :attr:`observed`: searches at the IVF's first three centroids alone, then
        again with a prefetch of random documents that fit their budget in flight."""
        ivf, seen = self.index.ivf, self.observed
        count = self.rerank or self.candidates
        probes = [ivf.quantizer.reconstruct(c % ivf.nlist).reshape(1, -1) for c in range(3)]
        for p in probes:
            t0 = time.perf_counter()
            ann_steps(ivf, p, self.nprobe, self.candidates)
            seen.plain(time.perf_counter() - t0, count)
        if self.split >= self.nprobe:
            return
        prepared = self._prepare(np.full((8, self.index.dim), self.index.dim ** -0.5,
                                         np.float16))
        budget = prefetch_budget(median(seen.ann), self.prefetch_step)
        rng = np.random.default_rng(0)
        for p in probes:
            docs = rng.permutation(len(self.store.offsets))[:count]
            fit = self.model.fitting(self.store.extents[docs], budget)
            if fit < 1:
                return
            t0 = time.perf_counter()
            _, finish = ann_steps(ivf, p, self.nprobe, self.candidates, split=self.split)
            fetch = self.store.submit(docs[:fit], on_arrival=lambda d, t:
                                      self._score(prepared, t))
            finish()
            elapsed = time.perf_counter() - t0
            fetch.stop()
            fetch.wait()
            seen.overhead.append(max(0.0, elapsed - median(seen.ann)))

    def plan(self):
        """The next query's prefetch decision (:func:`~.prefetch.decide` on
        :attr:`observed`), with ``prefetch`` False when the step leaves no lists after the
        split; None without a prefetch step."""
        if self.prefetch_step is None:
            return None
        plan = decide(self.observed, self.prefetch_step, self.model,
                      self.store.file_bytes / max(1, len(self.store.offsets)),
                      self.rerank or self.candidates)
        plan["prefetch"] = plan["prefetch"] and self.split < self.nprobe
        return plan

    def _reranked(self, top):
        """The candidates that get re-ranked: all, or the first k' of the ANN order."""
        ids = top[1]
        return ids if self.rerank is None else ids[:self.rerank]

    def _read(self, docs):
        """``{doc: tokens}`` of ``docs`` read now: the store's ``read``, or for ESPN the
        faster of reading one after another and ``threads`` at once (:class:`ReadModel`)."""
        if self.model is not None:
            return self.model.read(self.store, docs)
        return self.store.read(docs)

    def _finish(self, scores, reranked, result, started, t_ann):
        ids = np.asarray(reranked, np.int64)
        values = np.array([scores[int(d)] for d in ids])
        order = np.lexsort((ids, -values))[:self.k]
        result.ids, result.scores = ids[order], values[order]
        result.times["total"] = time.perf_counter() - started
        result.times["rerank"] = result.times["total"] - t_ann - result.times.get("fetch", 0.0)
        return result

    def search(self, query):
        """Answer one encoded :class:`Query`; returns a :class:`Result`."""
        store = self.store
        before = store.bytes_read
        started = time.perf_counter()
        prepared = self._prepare(query.tokens)
        plan = self.plan()
        if plan is None or not plan["prefetch"]:
            top = ann_steps(self.index.ivf, query.pooled[None], self.nprobe, self.candidates)[0]
            t_ann = time.perf_counter() - started
            reranked = self._reranked(top)
            t0 = time.perf_counter()
            tokens = self._read(reranked)
            result = Result(None, None, top[1], {"ann": t_ann,
                                                 "fetch": time.perf_counter() - t0},
                            missed=len(reranked))
            scores = {int(d): self._score(prepared, tokens[int(d)]) for d in reranked}
        else:
            scores, reranked, result, t_ann = self._prefetching(query, prepared, plan,
                                                                started)
        if plan is not None:
            self._learn(result, t_ann, len(reranked))
            plan["threshold"] = self.model.threshold(
                plan["budget"], int(store.extents[np.asarray(reranked, np.int64)].sum()))
            result.plan = plan
        result.bytes_read = store.bytes_read - before
        return self._finish(scores, reranked, result, started, t_ann)

    def _learn(self, result, t_ann, count):
        """Add this query's search time and prefetch outcome to :attr:`observed`."""
        if result.prefetched:
            self.observed.prefetched(t_ann, count, result.prefetched, result.hits)
        else:
            self.observed.plain(t_ann, count)

    def _prefetching(self, query, prepared, plan, started):
        """The prefetching query of the class docstring: ``(scores, reranked, result, ANN
        seconds)``."""
        store = self.store
        lock = threading.Lock()
        scores = {}

        def early(doc, tokens):            # runs in a reading thread as each doc arrives
            s = self._score(prepared, tokens)
            with lock:
                scores[doc] = s

        first, finish = ann_steps(self.index.ivf, query.pooled[None], self.nprobe,
                                  self.candidates, split=self.split)
        guess = np.asarray(self._reranked(first[0]), np.int64)
        fit = self.model.fitting(store.extents[guess], plan["room"])
        fetch = store.submit(guess[:fit], on_arrival=early) if fit else None
        top = finish()[0]
        t_ann = time.perf_counter() - started
        reranked = [int(d) for d in self._reranked(top)]
        read = set(fetch.stop()) if fetch is not None else set()
        hits = [d for d in reranked if d in read]
        missing = [d for d in reranked if d not in read]
        t0 = time.perf_counter()
        tokens = self._read(missing) if missing else {}
        if fetch is not None:
            fetch.wait(hits)
        fetched = time.perf_counter() - t0
        late = {d: self._score(prepared, tokens[d]) for d in missing}
        with lock:
            scores.update(late)
        plan["fit"] = fit
        result = Result(None, None, top[1], {"ann": t_ann, "fetch": fetched},
                        prefetched=len(read), hits=len(hits), missed=len(missing))
        return scores, reranked, result, t_ann
