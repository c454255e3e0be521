"""Sizing the level-one queues of the approximate hierarchical priority queue (Chameleon 4.2.2).

With ``streams`` level-one (L1) queues and the true top ``k`` items spread independently and
uniformly over them, the number of top-k items one queue receives is Binomial(k, 1/streams).
A queue truncated to length ``L`` loses a top-k item only when it receives more than ``L`` of
them. Two criteria:

``"all-queues"``
    the smallest ``L`` with ``P(X <= L) ** streams >= target``: no queue of the query loses a
    top-k item with probability at least ``target`` (treating queues as independent, as the
    paper does), so at least a ``target`` fraction of queries get the exact top-k;
``"per-queue"``
    the smallest ``L`` with ``P(X <= L) >= target`` for one queue.

Probabilities are computed exactly with integer binomial coefficients and fractions.
"""

from fractions import Fraction
from functools import lru_cache
from math import comb

from ..errors import ConfigError

__all__ = ["binomial_cdf", "l1_queue_length", "CRITERIA", "sizing_table"]

CRITERIA = ("all-queues", "per-queue")


def binomial_cdf(n, p, x):
    """Exact ``P(X <= x)`` for ``X ~ Binomial(n, p)`` (``p`` a Fraction)."""
    q = 1 - p
    return sum(comb(n, i) * p ** i * q ** (n - i) for i in range(0, min(x, n) + 1))


def _check(k, streams, target, criterion):
    if not isinstance(k, int) or k < 1:
        raise ConfigError("k", "must be an integer >= 1", value=k)
    if not isinstance(streams, int) or streams < 1:
        raise ConfigError("streams", "must be an integer >= 1", value=streams)
    if not 0 < target <= 1:
        raise ConfigError("target", "must be a probability in (0, 1]", value=target)
    if criterion not in CRITERIA:
        raise ConfigError("criterion", "must be one of " + ", ".join(CRITERIA), value=criterion)


@lru_cache(maxsize=1024)
def l1_queue_length(k, streams, target=0.99, criterion="all-queues"):
    """Smallest L1 queue length meeting ``target`` under ``criterion`` (see module docstring).

    >>> [l1_queue_length(100, s) for s in (4, 8, 16, 32)]
    [38, 23, 15, 10]
    """
    _check(k, streams, target, criterion)
    if streams == 1:
        return k
    p = Fraction(1, streams)
    goal = Fraction(target).limit_denominator(10 ** 12)
    q = 1 - p
    cdf = Fraction(0)
    for length in range(0, k + 1):
        cdf += comb(k, length) * p ** length * q ** (k - length)
        achieved = cdf ** streams if criterion == "all-queues" else cdf
        if achieved >= goal:
            return length
    return k


def sizing_table(k, streams_list, target=0.99):
    """Rows: streams, L (all-queues), L (per-queue), probability of an exact query at L, L1
    storage (entries) of the approximate and of an exact hierarchy, and the saving."""
    rows = []
    for streams in streams_list:
        all_q = l1_queue_length(k, streams, target, "all-queues")
        per_q = l1_queue_length(k, streams, target, "per-queue")
        p_exact = float(binomial_cdf(k, Fraction(1, streams), all_q) ** streams)
        exact_entries = streams * k
        rows.append({"streams": streams, "l1_len": all_q, "l1_len_per_queue": per_q,
                     "p_exact_query": p_exact, "l1_entries": streams * all_q,
                     "exact_l1_entries": exact_entries,
                     "saving": 1 - streams * all_q / exact_entries})
    return rows
