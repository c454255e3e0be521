"""ESPN's retrieval: IVF candidates, ANN prefetch, early re-ranking, merge, partial re-ranking.

One query (paper §4):

1. the query's pooled vector probes the ``nprobe`` (η) nearest IVF lists of the faiss index for
   the top ``candidates`` documents by inner product;
2. with a ``prefetch_step`` (δ/η), the lists are probed in two steps: after the first δ lists
   the current top candidates' token embeddings are requested from the store in the background
   (§4.2) while the other lists are probed; each prefetched document is scored by MaxSim as it
   arrives (early re-ranking, §4.3);
3. once the search ends, only the final candidates the prefetch missed are read (the critical
   path) and scored; early and late scores are merged and sorted;
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

import numpy as np

from ...errors import ConfigError
from ...lib import topk
from ...lib.quant import quantize
from ..golden import maxsim_scores

__all__ = ["maxsim", "maxsim_int8", "Query", "Result", "Searcher", "ann_steps", "merge_topk",
           "INT8_INV_SCALE", "INT8_SCALE", "MAX_CANDIDATES"]

#: Most candidates one query may take from the ANN (``--candidates``): faiss allocates a
#: score and an id per candidate and query before it searches. Fewer are taken when the index
#: holds fewer documents.
MAX_CANDIDATES = 100_000

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
    ``rerank``: MaxSim after the probe; ``total``). ``prefetched``/``hits``/``missed``: counts
    of documents; ``bytes_read``: from the token file."""
    ids: np.ndarray
    scores: np.ndarray
    candidates: np.ndarray
    times: dict = field(default_factory=dict)
    prefetched: int = 0
    hits: int = 0
    missed: int = 0
    bytes_read: int = 0

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

    Parameters: ``nprobe`` (η lists), ``candidates`` (documents from the ANN), ``k`` (results),
    ``prefetch_step`` (δ/η in (0, 1), None: no prefetch), ``rerank`` (k': re-rank only the ANN's
    first k' candidates; None: all), ``precision`` (``"float16"`` or ``"int8"``).
    Prefetching needs a store with ``submit`` (:class:`~hwgen.espn.host.store.DirectStore`).
    """

    def __init__(self, index, store, nprobe=16, candidates=100, k=10, prefetch_step=None,
                 rerank=None, precision="float16"):
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

    @property
    def split(self):
        """Lists probed before the prefetch starts (δ)."""
        if self.prefetch_step is None:
            return None
        return max(1, int(round(self.prefetch_step * self.nprobe)))

    def _reranked(self, top):
        """The candidates that get re-ranked: all, or the first k' of the ANN order."""
        ids = top[1]
        return ids if self.rerank is None else ids[:self.rerank]

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
        scores = {}
        prepared = self._prepare(query.tokens)
        if self.split is None or self.split >= self.nprobe:
            top = ann_steps(self.index.ivf, query.pooled[None], self.nprobe, self.candidates)[0]
            t_ann = time.perf_counter() - started
            reranked = self._reranked(top)
            t0 = time.perf_counter()
            tokens = store.read(reranked)
            result = Result(None, None, top[1], {"ann": t_ann,
                                                 "fetch": time.perf_counter() - t0},
                            missed=len(reranked))
            for d in reranked:
                scores[int(d)] = self._score(prepared, tokens[int(d)])
        else:
            lock = threading.Lock()

            def early(doc, tokens):            # runs in a reading thread as each doc arrives
                s = self._score(prepared, tokens)
                with lock:
                    scores[doc] = s

            first, finish = ann_steps(self.index.ivf, query.pooled[None], self.nprobe,
                                      self.candidates, split=self.split)
            guess = self._reranked(first[0])
            fetch = store.submit(guess, on_arrival=early)
            top = finish()[0]
            t_ann = time.perf_counter() - started
            reranked = self._reranked(top)
            wanted = set(int(d) for d in guess)
            missing = [int(d) for d in reranked if int(d) not in wanted]
            t0 = time.perf_counter()
            late = store.submit(missing, on_arrival=early, urgent=True) if missing else None
            fetch.wait()
            if late is not None:
                late.wait()
            result = Result(None, None, top[1], {"ann": t_ann,
                                                 "fetch": time.perf_counter() - t0},
                            prefetched=len(guess), hits=len(reranked) - len(missing),
                            missed=len(missing))
        result.bytes_read = store.bytes_read - before
        return self._finish(scores, reranked, result, started, t_ann)
