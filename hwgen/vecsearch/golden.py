"""Golden models of the ChamVS vector-search datapath (int64 numpy).

These functions define, bit for bit, what the hardware computes. They are checked against faiss
(``tests/test_vecsearch_faiss.py``): with integer data and integer-rounded centroids written back
into a faiss ``IndexIVFPQ``, :func:`build_lut` equals faiss's residual distance table and
:func:`pq_distances` equals faiss's search distances.

Shapes: ``D`` vector dimension, ``m`` PQ sub-spaces, ``dsub = D // m``, 256 centroids per
sub-space (8-bit codes).
"""

import numpy as np

__all__ = ["KSUB", "build_lut", "pq_distances", "saturate_unsigned", "distance_bits"]

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
