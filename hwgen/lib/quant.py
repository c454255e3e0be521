"""Uniform integer quantisation with one meaning of *scale*: the step size.

A real value ``x`` and its integer ``q`` are related by ``x ~ q * scale`` (PyTorch's and ONNX's
convention, zero point 0): ``scale`` is the real value of one integer step. Its reciprocal, the
integers per unit of ``x``, is called ``inv_scale`` wherever it appears, never "scale".

:func:`quantize` is the one quantiser of hwgen: ESPN's golden model
(``hwgen.espn.golden.quantize_int8``), ESPN's host re-ranking (``hwgen.espn.host.search``) and
ChamVS's integer IVF-PQ (``hwgen.vecsearch.ivfpq.quantize_vectors``) all call it, each with the
parameters that keep the integers it has always produced.
"""

import math
from typing import NamedTuple

import numpy as np

from ..errors import ConfigError

__all__ = ["quantize", "Quantized", "qrange"]


def qrange(bits, symmetric=True):
    """``(qmin, qmax)`` of signed ``bits``-bit integers: ``qmax = 2**(bits-1) - 1`` and
    ``qmin = -qmax`` when ``symmetric`` (so negation stays in range), else ``-qmax - 1``."""
    if isinstance(bits, bool) or not isinstance(bits, (int, np.integer)) or not 2 <= bits <= 32:
        raise ConfigError("bits", "must be an integer in 2..32", value=bits)
    qmax = (1 << (int(bits) - 1)) - 1
    return (-qmax if symmetric else -qmax - 1), qmax


def _real_array(x, name, dtype):
    """``x`` as a finite ``dtype`` array; ConfigError naming ``name`` otherwise."""
    a = np.asarray(x)
    if a.dtype.kind not in "biuf":
        raise ConfigError(name, "must hold real numbers (bool, int or float), "
                                f"not dtype {a.dtype}")
    a = a.astype(dtype, copy=False)
    if not np.all(np.isfinite(a)):
        raise ConfigError(name, "must be finite")
    return a


def _peak(a):
    """``max |a|`` as a Python float (0.0 for an empty array)."""
    return float(np.max(np.abs(a))) if a.size else 0.0


def _positive(value, name):
    """``value`` as a positive finite Python float; ConfigError naming ``name`` otherwise."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        v = None
    if v is None or not (math.isfinite(v) and v > 0):
        shown = value if v is None else v
        raise ConfigError(name, f"must be a positive finite number, not {shown!r}")
    return v


class Quantized(NamedTuple):
    """What :func:`quantize` returns: the integers, the step ``scale`` and its reciprocal
    ``inv_scale``. The one the values were computed with is exact (given, or the peak form);
    the other is its reciprocal (``inf`` for a zero step, 0.0 for an infinite multiplier)."""
    values: np.ndarray
    scale: float
    inv_scale: float


def _reciprocal(v):
    """``1 / v`` for ``v >= 0``, with ``1 / 0 = inf`` and ``1 / inf = 0``."""
    return math.inf if v == 0 else 1.0 / v


def quantize(x, scale=None, *, inv_scale=None, bits=8, symmetric=True,
             compute_dtype=np.float64, name="x"):
    """Per-tensor uniform quantisation to signed ``bits``-bit integers, zero point 0.

    ``q = clip(rint(x / scale), qmin, qmax)``, or ``clip(rint(x * inv_scale), qmin, qmax)``
    when ``inv_scale`` is given; ``rint`` rounds half to even (``numpy.rint``, as
    ``torch.quantize_per_tensor`` does). Dequantised, ``x ~ q * scale``.

    Parameters
    ----------
    x : array-like of int or float
        The values (any shape); must be finite.
    scale : float, optional
        The step size: the real value of one integer step, a positive finite number. Default
        (``inv_scale`` not given either) ``max|x| / qmax``, computed as that quotient, so the
        largest magnitude maps to ``qmax``; 1.0 for an all-zero or empty ``x``.
    inv_scale : float or "peak", optional
        ``1 / scale``, given instead of ``scale`` by a caller whose exact number is the
        multiplier (127 for unit vectors): ``x * inv_scale`` and ``x / (1 / inv_scale)`` can
        differ in the last bit, which moves values at ties. ``"peak"``: ``qmax / max|x|``
        computed as that quotient (1.0 for an all-zero or empty ``x``).
    bits : int
        Width of the signed integers, 2..32 (``qmax = 2**(bits-1) - 1``).
    symmetric : bool
        Clip to ``-qmax..qmax`` (-128 never produced at 8 bits, so negation stays in range);
        False: to ``-qmax-1..qmax``.
    compute_dtype : numpy float dtype
        The dtype ``x`` is converted to and the division or product is computed in.
    name : str
        The parameter name errors give for ``x``.

    Returns
    -------
    Quantized
        ``(values, scale, inv_scale)``: the integers (same shape as ``x``; int8, int16 or
        int32, the narrowest that holds ``bits``), the step and its reciprocal. When a peak
        form underflows (``max|x|`` so small that ``max|x| / qmax`` is 0.0 or ``qmax / max|x|``
        is inf) the values saturate by sign (``qmax``, ``qmin``, 0 for 0), as ``x / +0.0``
        clipped would, without dividing by zero and without NaN.

    Raises
    ------
    hwgen.errors.ConfigError (a ValueError)
        Naming ``x`` (``name``), ``scale``, ``inv_scale`` or ``bits``: a non-real or
        non-finite ``x``, a ``scale`` or ``inv_scale`` that is not a positive finite number,
        both given, ``bits`` outside 2..32.
    """
    a = _real_array(x, name, compute_dtype)
    qmin, qmax = qrange(bits, symmetric)
    if scale is not None and inv_scale is not None:
        raise ConfigError("inv_scale", "give scale or inv_scale, not both")
    multiply = inv_scale is not None
    if isinstance(inv_scale, str) and inv_scale == "peak":
        peak = _peak(a)
        inv_scale = qmax / peak if peak > 0 else 1.0       # inf when peak is subnormal
        scale = _reciprocal(inv_scale)
    elif multiply:
        inv_scale = _positive(inv_scale, "inv_scale")
        scale = 1.0 / inv_scale
    elif scale is not None:
        scale = _positive(scale, "scale")
        inv_scale = 1.0 / scale
    else:
        peak = _peak(a)
        scale = peak / qmax if peak > 0 else 1.0           # 0.0 when peak is subnormal
        inv_scale = _reciprocal(scale)
    if (math.isinf(inv_scale) if multiply else scale == 0):  # a zero step: saturate by sign
        scaled = np.sign(a) * (qmax + 1)
    else:
        with np.errstate(over="ignore"):                    # inf beyond the float range: clipped
            scaled = np.multiply(a, inv_scale, dtype=compute_dtype) if multiply \
                else np.divide(a, scale, dtype=compute_dtype)
    q = np.clip(np.rint(scaled), qmin, qmax)
    dtype = np.int8 if bits <= 8 else np.int16 if bits <= 16 else np.int32
    return Quantized(q.astype(dtype), scale, inv_scale)
