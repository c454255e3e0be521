"""Stream model of the MaxSim unit: random queries and documents, and the golden scores."""

import numpy as np

from ..flow.model import SimOption, StreamModel
from .golden import INT8_MAX, INT8_MIN, maxsim_scores

__all__ = ["MaxSimModel", "int8_tokens", "batch_shapes"]

#: Contents of (query, documents) of successive batches, then repeated. ``min``/``min`` gives
#: the largest score (every dot product ``dim * 128 * 128``), ``min``/``max`` the smallest
#: (every dot product negative, ``-dim * 128 * 127``); ``realistic`` is embedding-like.
KINDS = (("random", "random"), ("min", "min"), ("min", "max"), ("realistic", "realistic"),
         ("alternate", "random"), ("random", "realistic"))


def int8_tokens(kind, shape, rng):
    """Int8 token embeddings (int64 array) of one ``kind``: ``"min"`` (all -128), ``"max"``
    (all 127), ``"alternate"`` (-128 and 127 in a checkerboard), ``"realistic"`` (a rounded
    normal distribution of sigma 30, clipped) or ``"random"`` (uniform)."""
    if kind == "min":
        return np.full(shape, INT8_MIN, dtype=np.int64)
    if kind == "max":
        return np.full(shape, INT8_MAX, dtype=np.int64)
    if kind == "alternate":
        return np.where(np.indices(shape).sum(axis=0) % 2 == 0, INT8_MIN,
                        INT8_MAX).astype(np.int64)
    if kind == "realistic":
        return np.clip(np.rint(rng.normal(0, 30, size=shape)), INT8_MIN,
                       INT8_MAX).astype(np.int64)
    return rng.integers(INT8_MIN, INT8_MAX, size=shape, endpoint=True)


def batch_shapes(stim):
    """``[(query tokens, [document lengths]), ...]``: the argument of
    :meth:`~hwgen.espn.maxsim.MaxSimConfig.performance`."""
    return [(len(q), [len(d) for d in docs]) for q, docs in stim["batches"]]


class MaxSimModel(StreamModel):
    """Stream-level golden model and stimulus of :class:`~hwgen.espn.maxsim.MaxSim`.

    The item unit of ``hwgen sim --items`` is one document (one score). Documents are split
    into batches, one query each: batches of 2, 1 and 1 documents first (back-to-back query
    switches), then random sizes (a third of them single documents). Queries have
    ``q_tokens`` tokens (three times: random, largest and smallest scores), 1, then random
    token counts (a third of them full); documents have 1 token
    (the first of the run, so that the measured latency is the pipeline's), then random
    lengths up to ``max_doc_len`` (a third of them single tokens).
    """

    result_port = "o_scores"
    latency_from = "i_docs"
    sim_options = (SimOption("max_doc_len", "longest document in tokens (default 24; 1: "
                             "one-token documents only, the unit's peak score rate)"),)

    @staticmethod
    def stimulus(config, items, rng, max_doc_len=None):
        """``{"batches": [(query (q, dim) int64, [document (n, dim) int64, ...]), ...]}`` with
        ``items`` documents in all, and ``"noise"``: random ``last_doc`` bits for the
        document beats that are not a document's last (the unit must ignore them)."""
        c = config
        max_doc_len = max_doc_len or 24
        sizes, left = [], items
        plan = [2, 1, 1]
        while left > 0:
            if plan:
                want = plan.pop(0)
            else:
                want = 1 if rng.random() < 1 / 3 else int(rng.integers(2, 16, endpoint=True))
            sizes.append(min(want, left))
            left -= sizes[-1]
        q_plan = [c.q_tokens] * 3 + [1]
        batches, n_docs = [], 0
        for b, size in enumerate(sizes):
            if q_plan:
                q_len = q_plan.pop(0)
            else:
                q_len = c.q_tokens if rng.random() < 1 / 3 else \
                    int(rng.integers(1, c.q_tokens, endpoint=True))
            q_kind, d_kind = KINDS[b % len(KINDS)]
            query = int8_tokens(q_kind, (q_len, c.dim), rng)
            docs = []
            for _ in range(size):
                if n_docs == 0 or rng.random() < 1 / 3:
                    length = 1
                else:
                    length = int(rng.integers(1, max_doc_len, endpoint=True))
                docs.append(int8_tokens(d_kind, (length, c.dim), rng))
                n_docs += 1
            batches.append((query, docs))
        tokens = sum(len(d) for _, docs in batches for d in docs)
        return {"batches": batches, "noise": rng.integers(0, 1, size=tokens, endpoint=True)}

    @staticmethod
    def inputs(config, stim):
        """``i_query``: one beat per query token, ``q`` (``dim`` int8), ``last`` on each
        query's final token. ``i_docs``: one beat per document token, ``tok`` (``dim`` int8),
        ``last`` on each document's final token, ``last_doc`` set on the final token of each
        batch's last document (and random on beats without ``last``)."""
        queries, tokens, n = [], [], 0
        for query, docs in stim["batches"]:
            queries += [{"q": row.tolist(), "last": int(i == len(query) - 1)}
                        for i, row in enumerate(query)]
            for d, doc in enumerate(docs):
                for j, row in enumerate(doc):
                    last = j == len(doc) - 1
                    flag = (d == len(docs) - 1) if last else bool(stim["noise"][n])
                    tokens.append({"tok": row.tolist(), "last_doc": int(flag),
                                   "last": int(last)})
                    n += 1
        return {"i_query": queries, "i_docs": tokens}

    @staticmethod
    def expect(config, stim):
        """``o_scores``: one beat per document, ``score`` =
        :func:`hwgen.espn.golden.maxsim_scores` of the document with its batch's query (its
        first ``q_tokens`` tokens, as the unit keeps), ``last`` on each batch's last
        document."""
        beats = []
        for query, docs in stim["batches"]:
            query = np.asarray(query)[:config.q_tokens]      # the unit drops extra tokens
            scores = maxsim_scores(query, np.concatenate(docs), [len(d) for d in docs])
            beats += [{"score": int(s), "last": int(k == len(docs) - 1)}
                      for k, s in enumerate(scores)]
        return {"o_scores": beats}

    @staticmethod
    def cycles_bound(config, stim):
        """Every document token takes ``groups`` cycles; every query token one."""
        shapes = batch_shapes(stim)
        return sum(q + sum(lengths) * config.groups for q, lengths in shapes) + 100

    @staticmethod
    def report(config, stim, summary, samples):
        """The cycle model's prediction for this run (exact without stalls)."""
        return {"model_cycles": config.performance(
            config.workload(batches=batch_shapes(stim))).cycles}
