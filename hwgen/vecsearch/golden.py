"""Golden models of the ChamVS vector-search datapath (int64 numpy).

These functions define, bit for bit, what the hardware computes. They are checked against faiss
(``tests/test_vecsearch_faiss.py``): with integer data and integer-rounded centroids written back
into a faiss ``IndexIVFPQ``, :func:`build_lut` equals faiss's residual distance table and
:func:`pq_distances` equals faiss's search distances.

Shapes: ``D`` vector dimension, ``m`` PQ sub-spaces, ``dsub = D // m``, 256 centroids per
sub-space (8-bit codes).
"""

import numpy as np

__all__ = ["KSUB", "build_lut", "pq_distances", "saturate_unsigned", "distance_bits", "topk",
           "l1_queues", "hier_topk"]

KSUB = 256  #: centroids per PQ sub-space (8-bit codes)


def saturate_unsigned(values, bits):
    """Clamp non-negative integers to ``2**bits - 1`` (``bits=None``: no saturation)."""
    values = np.asarray(values, dtype=np.int64)
    if bits is None:
        return values
    return np.minimum(values, (1 << bits) - 1)


def build_lut(residual, pq_centroids, lut_shift=0, lut_bits=None):
    """Distance lookup table of one residual vector.

    Parameters
    ----------
    residual : (D,) integers
        Query minus the probed IVF list's coarse centroid.
    pq_centroids : (m, 256, dsub) integers
        PQ centroids of every sub-space.
    lut_shift : int
        Right shift applied to each squared distance (floor division by ``2**lut_shift``).
    lut_bits : int or None
        Saturate each entry at ``2**lut_bits - 1``; ``None`` keeps the exact value.

    Returns
    -------
    (m, 256) int64
        ``lut[i, r] = sat(floor(sum_j (residual_i[j] - C[i, r, j])**2 / 2**lut_shift))``.
    """
    c = np.asarray(pq_centroids, dtype=np.int64)
    if c.ndim != 3 or c.shape[1] != KSUB:
        raise ValueError(f"pq_centroids must have shape (m, {KSUB}, dsub), got {c.shape}")
    m, _, dsub = c.shape
    res = np.asarray(residual, dtype=np.int64)
    if res.shape != (m * dsub,):
        raise ValueError(f"residual must have shape ({m * dsub},), got {res.shape}")
    diff = res.reshape(m, 1, dsub) - c
    lut = np.sum(diff * diff, axis=2) >> lut_shift
    return saturate_unsigned(lut, lut_bits)


def pq_distances(codes, lut):
    """Approximate distances of PQ-coded vectors: ``sum_i lut[i, codes[n, i]]``.

    Parameters
    ----------
    codes : (n, m) uint8
    lut : (m, 256) integers

    Returns
    -------
    (n,) int64
    """
    codes = np.asarray(codes)
    lut = np.asarray(lut, dtype=np.int64)
    if codes.ndim != 2 or codes.shape[1] != lut.shape[0]:
        raise ValueError(f"codes must have shape (n, {lut.shape[0]}), got {codes.shape}")
    if codes.size and (codes.min() < 0 or codes.max() >= KSUB):
        raise ValueError("codes must be in 0..255")
    idx = codes.astype(np.int64)
    return lut[np.arange(lut.shape[0])[None, :], idx].sum(axis=1)


def distance_bits(m, lut_bits):
    """Width of a sum of ``m`` LUT entries of ``lut_bits`` that can never overflow."""
    return (m * ((1 << lut_bits) - 1)).bit_length()


def topk(distances, ids, k):
    """The ``k`` smallest items ordered by distance, then id (smaller first).

    This is the order of every hwgen priority queue. Returns ``(distances, ids)`` as int64
    arrays of length ``min(k, n)``.
    """
    d = np.asarray(distances, dtype=np.int64)
    i = np.asarray(ids, dtype=np.int64)
    if d.shape != i.shape or d.ndim != 1:
        raise ValueError("distances and ids must be 1-D arrays of the same length")
    order = np.lexsort((i, d))[:k]
    return d[order], i[order]


def l1_queues(streams, queues_per_stream):
    """Split each stream's items over its L1 queues as the hardware does: with two queues per
    stream, items alternate (the stream's items 0, 2, 4, ... to the first queue). Streams hold
    only real items (empty markers are not counted)."""
    queues = []
    for dists, ids in streams:
        d, i = np.asarray(dists, dtype=np.int64), np.asarray(ids, dtype=np.int64)
        for q in range(queues_per_stream):
            queues.append((d[q::queues_per_stream], i[q::queues_per_stream]))
    return queues


def hier_topk(streams, k, l1_len, queues_per_stream=1):
    """Approximate hierarchical top-k (Chameleon 4.2.2), exactly as ``hier-pq`` computes it.

    ``streams`` is a list of ``(distances, ids)`` per input stream for one query. Each L1 queue
    keeps the top ``l1_len`` of the items it receives (:func:`l1_queues`); the L2 queue keeps the
    top ``k`` of all L1 survivors. Equal to :func:`topk` of everything unless some L1 queue
    received more than ``l1_len`` of the true top-k.
    """
    survivors = [topk(d, i, l1_len) for d, i in l1_queues(streams, queues_per_stream)]
    if not survivors:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    return topk(np.concatenate([s[0] for s in survivors]),
                np.concatenate([s[1] for s in survivors]), k)
