"""Golden model of the ESPN MaxSim unit (int64 numpy) and the int8 quantisation it expects.

ESPN (paper: ``shared/papers/espn-multivector-retrieval.txt``, equation 1) re-ranks candidate
documents with the late-interaction MaxSim score of ColBERT-style multi-vector models::

    S(q, d) = sum_i max_j (E_q[i] . E_d[j])

over the query's token embeddings ``E_q[i]`` and the document's token embeddings ``E_d[j]``.
The hardware (:mod:`hwgen.espn.maxsim`) works on int8 embeddings; :func:`maxsim_scores` defines
its exact result: every dot product and every sum in int64, no rounding, no saturation. For the
sizes the unit supports (``dim <= 256``, ``q_tokens <= 32``) a score is at most
``32 * 256 * 128 * 128 = 2**27`` in magnitude (:func:`score_bits`), so the unit's int32 output
holds every score exactly: it never overflows and never saturates.

:func:`quantize_int8` turns float embeddings into the int8 the unit takes (symmetric,
per tensor, :func:`hwgen.lib.quant.quantize`); the host pipeline (``hwgen.espn.host``) uses
both functions.
"""

import numpy as np

from ..errors import ConfigError
from ..lib.quant import quantize

__all__ = ["maxsim_scores", "quantize_int8", "score_bits", "dot_bits", "INT8_MIN", "INT8_MAX"]

INT8_MIN, INT8_MAX = -128, 127


def _int8_matrix(x, name):
    a = np.asarray(x)
    if a.ndim != 2:
        raise ValueError(f"{name} must be a 2-D array (tokens, dim), got shape {a.shape}")
    if a.dtype.kind not in "iu":
        if a.dtype.kind == "b" or not np.all(np.isfinite(a)) or not np.all(a == np.rint(a)):
            raise ValueError(f"{name} must hold integers (int8 values)")
    if a.size and (a.min() < INT8_MIN or a.max() > INT8_MAX):
        raise ValueError(f"{name} holds values outside the int8 range {INT8_MIN}..{INT8_MAX}")
    return a.astype(np.int64)


def maxsim_scores(query, doc_tokens, doc_lengths):
    """MaxSim scores of one query against a run of documents.

    Parameters
    ----------
    query : array-like of int8 values, shape ``(q, dim)``
        The query's token embeddings, ``q >= 1``.
    doc_tokens : array-like of int8 values, shape ``(n, dim)``
        The documents' token embeddings, document after document.
    doc_lengths : sequence of int
        Tokens of each document, each at least 1, adding up to ``n``.

    Returns
    -------
    numpy.ndarray of int64, shape ``(len(doc_lengths),)``
        ``score[d] = sum_i max_{j in d} (query[i] . doc_tokens[j])``, exact.
    """
    q = _int8_matrix(query, "query")
    d = _int8_matrix(doc_tokens, "doc_tokens")
    if q.shape[0] < 1:
        raise ValueError("query must have at least one token")
    if d.shape[1] != q.shape[1]:
        raise ValueError(f"doc_tokens have dim {d.shape[1]}, the query has dim {q.shape[1]}")
    lengths = np.asarray(doc_lengths, dtype=np.int64).reshape(-1)
    if lengths.size and lengths.min() < 1:
        raise ValueError("every document must have at least one token")
    if int(lengths.sum()) != d.shape[0]:
        raise ValueError(f"doc_lengths add up to {int(lengths.sum())}, doc_tokens has "
                         f"{d.shape[0]} tokens")
    if lengths.size == 0:
        return np.zeros(0, dtype=np.int64)
    sims = d @ q.T                                       # (n, q): every token pair, int64
    starts = np.concatenate(([0], np.cumsum(lengths)[:-1]))
    best = np.maximum.reduceat(sims, starts, axis=0)     # (docs, q): max over each document
    return best.sum(axis=1, dtype=np.int64)


def quantize_int8(x, scale=None):
    """Symmetric per-tensor int8 quantisation: ``q = clip(round(x / scale), -127, 127)``.

    :func:`hwgen.lib.quant.quantize` with its defaults (``bits=8, symmetric=True``, the step
    ``scale``, float64 arithmetic).

    Parameters
    ----------
    x : array-like of float
        Embeddings (any shape); must be finite.
    scale : float, optional
        Quantisation step (``x ~ q * scale``). Default ``max|x| / 127`` (1.0 for an all-zero
        tensor), so the largest magnitude maps to 127. A query and its documents may use
        different scales: MaxSim scores of the int8 tensors are then
        ``S_float ~ scale_q * scale_d * S_int`` (every query token's max is taken over the same
        scale, so the ranking of documents is that of the dequantised scores).

    Returns
    -------
    (numpy.ndarray of int8, float)
        The quantised tensor (same shape; -128 is never produced, so negation stays in range)
        and the scale used. Rounding is half to even (``numpy.rint``).

    Raises
    ------
    hwgen.errors.ConfigError (a ValueError)
        ``quantize_int8: x must be finite``, ``quantize_int8: scale must be a positive finite
        number, not ...``.
    """
    try:
        q, scale, _ = quantize(x, scale)
    except ConfigError as e:
        raise ConfigError("quantize_int8", f"{e.param} {e.reason}") from None
    return q, scale


def dot_bits(dim):
    """Bits of a signed value that holds any dot product of two int8 vectors of ``dim``."""
    hi, lo = dim * INT8_MIN * INT8_MIN, dim * INT8_MIN * INT8_MAX
    return max(hi.bit_length(), (-lo - 1).bit_length()) + 1


def score_bits(dim, q_tokens):
    """Bits of a signed value that holds any MaxSim score of ``q_tokens`` query tokens."""
    hi, lo = q_tokens * dim * INT8_MIN * INT8_MIN, q_tokens * dim * INT8_MIN * INT8_MAX
    return max(hi.bit_length(), (-lo - 1).bit_length()) + 1
