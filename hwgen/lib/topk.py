"""Merging top-k lists: one rule for every search in hwgen (ChamVS's coordinator merging its
nodes' answers by distance, ESPN's ANN merging its probe steps by score)."""

import numpy as np

__all__ = ["merge_topk"]


def merge_topk(parts, k, *, largest=False, dtype=None):
    """The top ``k`` of several ``(values, ids)`` results over disjoint items.

    Ordered by value, ascending (distances) or with ``largest`` descending (scores), ties by
    ascending id; entries with a negative id (padding of a short list) are dropped. ``dtype``
    casts the values (the ids are int64); returns ``(values, ids)`` arrays of at most ``k``.
    """
    values = [np.asarray(p[0], dtype=dtype) for p in parts]
    ids = [np.asarray(p[1], dtype=np.int64) for p in parts]
    v = np.concatenate(values) if values else np.zeros(0, dtype or np.float64)
    i = np.concatenate(ids) if ids else np.zeros(0, np.int64)
    keep = i >= 0
    v, i = v[keep], i[keep]
    order = np.lexsort((i, -v if largest else v))[:k]
    return v[order], i[order]
