"""Golden models of the I-BERT integer kernels (int64 numpy).

Each function mirrors one module of the public reference, Hugging Face
``transformers/models/ibert/quant_modules.py`` (the maths of the original I-BERT code), on
integer inputs plus the float scale the reference uses, and returns ``(integer output, output
scale)``. The reference holds integers in float32 tensors; where its float arithmetic is exact,
the results are identical (``tests/test_ibert_reference.py`` checks this and counts the cases
where the reference's own float arithmetic is inexact; docs/guides/ibert.md).

Host-side constants (``b_int``, ``c_int``, ``x0_int``, dyadic multipliers ``(m, e)``, ``bias_int``)
are derived exactly as the reference derives them, with float32 operations in the order torch
evaluates them (``tensor / scalar`` divides; ``scalar / tensor`` multiplies by the reciprocal),
in one function per kernel (``*_constants``) that the RTL configurations use too.

Rounding: ``torch.round`` rounds half to even, so does :func:`round_shift`; ``floor`` of a
negative quotient rounds towards minus infinity, as ``//`` does.
"""

import decimal
import math

import numpy as np

__all__ = [
    "f32", "dyadic", "round_shift", "isqrt",
    "requant_constants", "requant",
    "gelu_constants", "int_gelu",
    "softmax_constants", "int_softmax",
    "layernorm_constants", "int_layernorm",
    "linear",
]

#: Constants of the reference modules.
GELU_K = 1.4142
GELU_CONST = 14
GELU_COEFF = (-0.2888, -1.769, 1 / -0.2888)          # a (x + b)^2 + c, c divided by a
EXP_X0 = -0.6931
EXP_CONST = 30
EXP_COEFF = (0.35815147, 0.96963238 / 0.35815147, 1.0 / 0.35815147)
SOFTMAX_MAX_BIT = 32
LAYERNORM_MAX_BIT = 32
#: Inputs of :func:`isqrt` stay below 2**ISQRT_MAX_BIT (int64 sums of squares stay exact).
ISQRT_MAX_BIT = 62


def f32(x):
    """float32 value (numpy scalar or array)."""
    return np.float32(x) if np.ndim(x) == 0 else np.asarray(x, dtype=np.float32)


def _rdiv(c, t):
    """torch's ``python_scalar / float32_tensor``: ``c * (1 / t)`` in float32."""
    return f32(c) * (np.float32(1.0) / f32(t))


def dyadic(scale):
    """The reference's ``batch_frexp``: ``scale ~= m / 2**e`` with a 31-bit ``m``.

    ``m`` is the frexp mantissa times 2**31 rounded half up; ``e = 31 - exponent``.
    """
    mant, exp = math.frexp(float(scale))
    m = int(decimal.Decimal(mant * 2 ** 31).quantize(decimal.Decimal(1),
                                                    rounding=decimal.ROUND_HALF_UP))
    return m, 31 - exp


def round_shift(x, e):
    """``round_half_even(x / 2**e)`` for integers ``x``; ``e`` (a scalar or an array broadcast
    against ``x``) may be zero or negative: a left shift. Exact for any shift: int64 inputs
    whose left shift could overflow are computed with Python integers."""
    x = np.asarray(x)
    e = np.asarray(e, dtype=np.int64)
    if x.dtype != object:
        x = x.astype(np.int64)
        left = int(np.max(np.maximum(-e, 0), initial=0))
        if left and x.size and int(np.abs(x).max()) << left >= 1 << 62:
            x = x.astype(object)
    if x.dtype == object:                 # Python integers: any width
        e = e.astype(object)
        pos = np.maximum(e, 1)
        q = x >> pos
        r = x - (q << pos)
        half = (q * 0 + 1) << (pos - 1)
        up = (r > half) | ((r == half) & ((q & 1) == 1))
        return np.where(e > 0, q + up.astype(np.int64), x << np.maximum(-e, 0))
    # int64: shifts of 63 and more leave |x / 2**e| < 1 (0.5 or less from 64 on)
    pos = np.clip(e, 1, 62)
    q = x >> pos
    r = x - (q << pos)
    half = np.int64(1) << (pos - 1)
    up = (r > half) | ((r == half) & ((q & 1) == 1))
    # e == 63: |x| / 2**63 rounds to 1 above 2**62, to 0 at 2**62 (a tie, to even) and below;
    # compared on x itself, since np.abs(-2**63) wraps to -2**63 (which is -1 exactly)
    small = np.where(e == 63, (x > (1 << 62)).astype(np.int64) - (x < -(1 << 62)), 0)
    return np.where(e >= 63, small, np.where(e > 0, q + up.astype(np.int64),
                                             x << np.maximum(-e, 0)))


def isqrt(v):
    """Exact floor square root of non-negative integers below 2**62 (restoring, two bits per
    step from the top, as the RTL computes it).

    After the step that consumes bits ``2j+1, 2j`` the partial root is the floor square root
    of ``v >> 2j``; ``tests/test_ibert_isqrt.py`` checks every input below 2**32 with a C
    transcription of the same steps. Inputs of 2**32 and more (a LayerNorm variance at a small
    ``shift``) take Python's exact ``math.isqrt``: the restoring steps give the floor root at
    any width, and their int64 form would overflow there.
    """
    v = np.asarray(v, dtype=np.int64)
    if v.size and (v.min() < 0 or v.max() >= 1 << ISQRT_MAX_BIT):
        raise ValueError(f"isqrt takes integers in 0 .. 2**{ISQRT_MAX_BIT} - 1")
    wide = v >= 1 << 32
    rem = np.where(wide, 0, v)
    root = np.zeros_like(v)
    for j in range(15, -1, -1):
        trial = (root << np.int64(2)) + 1           # (2 * root + 1) at this digit: 4r + 1
        sub = trial << np.int64(2 * j)
        take = rem >= sub
        rem = np.where(take, rem - sub, rem)
        root = (root << np.int64(1)) + take.astype(np.int64)
    if wide.any():
        root[wide] = [math.isqrt(int(x)) for x in v[wide]]
    return root


# -- requantisation (QuantAct with a previous scale: FixedPointMul) ---------------------------

def _dyadic_of(scale_in, out):
    scale_in = f32(scale_in)
    if np.ndim(scale_in) == 0:
        return dyadic(float(scale_in) / out)
    pairs = [dyadic(float(s) / out) for s in scale_in.ravel()]
    return (np.array([p[0] for p in pairs], dtype=np.int64).reshape(scale_in.shape),
            np.array([p[1] for p in pairs], dtype=np.int64).reshape(scale_in.shape))


def requant_constants(scale_in, scale_out, identity_scale=None):
    """Dyadic multipliers of :func:`requant`: ``((m, e), (m1, e1) or None)``, from
    ``float64(scale_in) / float64(float32(scale_out))`` as the reference computes them.
    ``scale_in`` may be a vector (per output channel, after a per-channel QuantLinear): then
    ``m`` and ``e`` are vectors broadcast over the last axis."""
    out = float(f32(scale_out))
    main = _dyadic_of(scale_in, out)
    ident = _dyadic_of(identity_scale, out) if identity_scale is not None else None
    return main, ident


def requant(q, scale_in, scale_out, bits, identity=None, identity_scale=None):
    """``clamp(round(q * m / 2**e) [+ round(identity * m1 / 2**e1)], -2**(bits-1), 2**(bits-1)-1)``.

    Products are exact at any width (inputs of 32 bits and more use Python integers). Mirrors ``QuantAct(bits)(x, scale_in, identity, identity_scale)`` in quantised mode, whose
    output scale ``scale_out`` is its (calibrated) activation scale.
    """
    (m, e), ident = requant_constants(scale_in, scale_out, identity_scale)

    def scaled(v, m, e):
        v = np.asarray(v, dtype=np.int64)
        if v.size and int(np.abs(v).max()) * int(np.max(np.abs(m))) >= 1 << 62:  # > 64 bits
            v = v.astype(object)
            m = np.asarray(m).astype(object)
        return round_shift(v * m, e)

    out = scaled(q, m, e)
    if identity is not None:
        if ident is None:
            raise ValueError("identity needs identity_scale")
        out = out + scaled(identity, *ident)
    lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    return np.clip(out, lo, hi).astype(np.int64), f32(scale_out)


# -- i-GELU ------------------------------------------------------------------------------------

def _floordiv32(a, b):
    """torch's float32 ``a // b`` (``div_floor_floating``: fmod-based, then rounded)."""
    a, b = f32(a), f32(b)
    mod = np.fmod(a, b)
    div = (a - mod) / b
    div = np.where((mod != 0) & ((b < 0) != (mod < 0)), div - np.float32(1), div)
    floor = np.floor(div)
    floor = np.where(div - floor > np.float32(0.5), floor + np.float32(1), floor)
    return np.where(div != 0, floor, np.float32(0) * a / b)


def _int(x):
    """Python int of a scalar, int64 array of an array."""
    return int(x) if np.ndim(x) == 0 else np.asarray(x).astype(np.int64)


def gelu_constants(scale):
    """``(b_int, c_int, shift_int, out_scale)`` of IntGELU at input scale ``scale`` (a scalar,
    or a vector of per-channel scales after a per-channel QuantLinear: then vectors)."""
    s_erf = f32(scale) / np.float32(GELU_K)
    b_int = _int(np.floor(_rdiv(GELU_COEFF[1], s_erf)))
    c_int = _int(np.floor(_rdiv(GELU_COEFF[2], s_erf * s_erf)))
    sig_scale = (s_erf * s_erf) * np.float32(GELU_COEFF[0]) * np.float32(2 ** GELU_CONST)
    shift_int = _int(_floordiv32(1.0, sig_scale))        # the reference's ``1.0 // scale``
    out_scale = f32(scale) * sig_scale / np.float32(2)
    return b_int, c_int, shift_int, out_scale


def int_gelu(q, scale):
    """i-GELU: ``q * (floor(sign(q) * ((min(|q|, -b) + b)**2 + c) / 2**14) + shift)``."""
    b_int, c_int, shift_int, out_scale = gelu_constants(scale)
    q = np.asarray(q, dtype=np.int64)
    a = np.minimum(np.abs(q), -b_int)
    y = np.sign(q) * ((a + b_int) ** 2 + c_int)
    y = y >> np.int64(GELU_CONST)                      # floor division by 2**14
    return q * (y + shift_int), out_scale


# -- i-softmax ---------------------------------------------------------------------------------

def softmax_constants(scale, act_scale, output_bits=8):
    """IntSoftmax constants at input scale ``scale``.

    Returns a dict: ``x0_int``, ``b_int``, ``c_int`` (i-exp polynomial), ``exp_scale`` (scale of
    the i-exp result), ``act_scale`` (the 16-bit QuantAct's scale), ``(m, e)`` (dyadic
    multiplier taking the i-exp integer to the 16-bit one: ``1 / act_scale``, the reference's
    net factor), ``output_bits`` and ``out_scale``.
    """
    s = f32(scale)
    x0_int = int(np.floor(_rdiv(EXP_X0, s)))
    b_int = int(np.floor(_rdiv(EXP_COEFF[1], s)))
    c_int = int(np.floor(_rdiv(EXP_COEFF[2], s * s)))
    exp_scale = np.float32(EXP_COEFF[0]) * (s * s) / np.float32(2 ** EXP_CONST)
    act = f32(act_scale)
    return {"x0_int": x0_int, "b_int": b_int, "c_int": c_int, "exp_scale": exp_scale,
            "act_scale": act, "dyadic": dyadic(1.0 / float(act)), "output_bits": output_bits,
            "out_scale": f32(1.0 / 2 ** output_bits)}


def exp_parts(x, x0_int, b_int, c_int):
    """i-exp of non-positive integers ``x`` in parts: ``(z, q)`` with ``exp = z * 2**(30 - q)``.

    ``x`` (clipped at ``30 * x0_int``) is written ``q * x0_int + r`` with ``x0_int < r <= 0``;
    ``z = max(0, (r + b_int) * r + c_int)`` is the polynomial of the remainder.
    """
    x = np.maximum(np.asarray(x, dtype=np.int64), EXP_CONST * x0_int)
    q = x // x0_int
    r = x - x0_int * q
    return np.maximum((r + b_int) * r + c_int, 0), q


def int_exp(x, x0_int, b_int, c_int):
    """i-exp of non-positive integers: ``floor(z * 2**(30 - q))`` (exact: ``z`` is integer)."""
    z, q = exp_parts(x, x0_int, b_int, c_int)
    return z << (EXP_CONST - q)


def calibrate_softmax(q, scale):
    """The 16-bit activation scale a fresh reference IntSoftmax calibrates on its first
    training-mode pass over ``q`` (range of the i-exp integers, +-1e-5, over 32767)."""
    c = softmax_constants(scale, 1.0)
    x = np.asarray(q, dtype=np.int64)
    e = int_exp(x - x.max(axis=-1, keepdims=True), c["x0_int"], c["b_int"], c["c_int"])
    lo = np.float32(-1e-5) + np.float32(e.min())
    hi = np.float32(1e-5) + np.float32(e.max())
    return max(abs(lo), abs(hi)) / np.float32(2 ** 15 - 1)


def exp16(z, q, m, e):
    """The 16-bit activation of ``z * 2**(30 - q)``: ``clamp(round(z * 2**(30-q) * m / 2**e),
    0, 32767)``, computed as ``round_shift(z * m, e - 30 + q)``: exact at any width (products
    of 63 bits and more, at very small input scales, are taken in Python integers)."""
    z, q = np.broadcast_arrays(np.asarray(z, dtype=np.int64), np.asarray(q, dtype=np.int64))
    shape = z.shape
    z, s = z.reshape(-1), (e - EXP_CONST + q).reshape(-1)
    if z.size and int(z.max()) * int(m) >= 1 << 62:
        z = z.astype(object)
    t = z * m
    big = s <= 0                       # a left shift: any non-zero product exceeds 2**15
    out = np.where(big, np.where(t > 0, 1 << 15, 0), round_shift(t, np.maximum(s, 1)))
    return np.clip(out, 0, (1 << 15) - 1).astype(np.int64).reshape(shape)


def int_softmax(q, scale, output_bits=8, act_scale=None):
    """IntSoftmax over the last axis of ``q``.

    Row maximum subtracted, i-exp (:func:`exp_parts`), requantised to 16 bits with the dyadic
    multiplier of ``1 / act_scale`` (:func:`exp16`), summed, ``factor = floor(2**32 / sum)``,
    ``out = floor(e16 * factor / 2**(32 - output_bits))``. ``act_scale`` is the scale of the
    reference's 16-bit QuantAct (a calibrated model parameter); None calibrates it on ``q`` like
    the reference's first training pass. Returns ``(out, 1 / 2**output_bits)``, ``out`` in
    ``0 .. 2**output_bits``.
    """
    q = np.asarray(q, dtype=np.int64)
    if act_scale is None:
        act_scale = calibrate_softmax(q, scale)
    c = softmax_constants(scale, act_scale, output_bits)
    z, qq = exp_parts(q - q.max(axis=-1, keepdims=True), c["x0_int"], c["b_int"], c["c_int"])
    e16 = exp16(z, qq, *c["dyadic"])
    total = e16.sum(axis=-1, keepdims=True)
    factor = (1 << SOFTMAX_MAX_BIT) // np.maximum(total, 1)
    return (e16 * factor) >> np.int64(SOFTMAX_MAX_BIT - output_bits), c["out_scale"]


# -- integer LayerNorm -------------------------------------------------------------------------

def layernorm_constants(weight, bias, hidden):
    """IntLayerNorm constants: ``bias_int`` (per element), ``out_scale`` (per element) and the
    normalisation scale ``sqrt(H) / 2**30``."""
    dim_sqrt = np.sqrt(np.float32(hidden), dtype=np.float32)
    norm_scale = dim_sqrt / np.float32(2 ** 30)
    w, b = f32(weight), f32(bias)
    bias_int = np.floor((b / w) / norm_scale).astype(np.int64)
    return {"bias_int": bias_int, "out_scale": norm_scale * w, "norm_scale": norm_scale}


def int_layernorm(q, scale, weight, bias, shift):
    """IntLayerNorm over the last axis (hidden size H): mean rounded half to even, variance of
    ``(q - mean) >> shift``, exact integer square root, ``floor(2**31 / std)``, bias.

    ``scale`` (the input scale) does not enter the integer result: the output scale depends
    only on ``weight``. A row with zero variance gives ``y = 0`` (the reference divides by zero
    there and returns NaN).
    """
    q = np.asarray(q, dtype=np.int64)
    hidden = q.shape[-1]
    c = layernorm_constants(weight, bias, hidden)
    total = q.sum(axis=-1, keepdims=True)
    mean = _round_div(total, hidden)
    y = q - mean
    ys = y >> np.int64(shift)
    var = (ys * ys).sum(axis=-1, keepdims=True)
    std = isqrt(var) << np.int64(shift)
    factor = np.where(std > 0, (1 << 31) // np.maximum(std, 1), 0)
    out = (y * factor) >> np.int64(1)
    return out + c["bias_int"], c["out_scale"]


def _round_div(a, n):
    """``round_half_even(a / n)`` for integers ``a`` and a positive integer ``n``."""
    a = np.asarray(a, dtype=np.int64)
    q = a // n
    r = a - q * n
    up = (2 * r > n) | ((2 * r == n) & ((q & 1) == 1))
    return q + up.astype(np.int64)


# -- linear ------------------------------------------------------------------------------------

def linear(q_x, q_w, q_b, scale_x=None, scale_w=None):
    """``q_x @ q_w.T + q_b`` (INT8 x INT8 -> INT32 accumulation, exact in int64).

    The output scale is ``float32(scale_w * scale_x)`` when both are given (QuantLinear's
    ``bias_scaling_factor``), else None.
    """
    y = np.asarray(q_x, dtype=np.int64) @ np.asarray(q_w, dtype=np.int64).T
    y = y + np.asarray(q_b, dtype=np.int64)
    scale = f32(scale_w) * f32(scale_x) if scale_x is not None and scale_w is not None else None
    return y, scale
