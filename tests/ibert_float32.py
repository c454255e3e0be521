"""The Hugging Face I-BERT reference's inexact kernels (IntLayerNorm, IntGELU, IntSoftmax)
transcribed operation by operation and evaluated two ways.

``exact=True``, on the reference's integer input: in float64 (every value an integer below
2**53, or a correctly rounded float64 quotient or root whose floor is exact) and, for
IntSoftmax's 16-bit step, in Python integers. Host constants (``b_int``, ``bias_int``, ...)
are the correctly rounded float32 ones. This is the formula's exact result: the golden model
must equal it.

``exact=False``, on the reference's own float input: the interval of float32 results that any
processor may produce, derived from the operations and the values involved:

- ``+ - * /`` of float32 tensors and ``floor``, ``round``, ``min``, ``max``, ``abs``, ``sign``
  are correctly rounded or exact under IEEE 754 on every processor and vector width, and
  torch runs each as its own kernel, never contracted into a fused multiply-add. They are
  evaluated exactly, at the interval's end points: each is monotone in each argument, and a
  product takes its extremes at the corners.
- Sums over a row (``sum``, ``mean``) may be taken in any order, vector width and thread
  count. For every summation tree the float32 result lies within
  ``gamma(n-1) * sum|a_i|`` of the exact sum, ``gamma(k) = k u / (1 - k u)``, ``u = 2**-24``
  (Higham, *Accuracy and Stability of Numerical Algorithms*, 2nd ed., section 4.2); a mean
  adds at most two roundings (``sum / n`` or ``sum * (1 / n)``).
- ``sqrt``, ``reciprocal`` (torch's ``scalar / tensor``) and ``pow`` may come from vector
  math code that is not correctly rounded (``sqrt(37)`` is one unit low on an AMD EPYC): each
  is allowed two units in the last place, a relative ``2**-22``.

A host constant derived through a reciprocal may then take two integer values (an interval
like any other); a row mean that can round two ways is evaluated for both and the results
joined.

Used by ``tests/test_ibert_reference.py`` and ``tests/test_ibert_encoder.py``: the reference's
output must lie in its interval (else the reference's arithmetic is not what this file says,
or some processor computes it outside the stated bounds), and the golden model must equal the
exact evaluation.
"""

import itertools
import math

import numpy as np

U = 2.0 ** -24                 # float32 unit roundoff, round to nearest
APPROX = 2.0 ** -22            # sqrt, reciprocal, pow: two units in the last place
F32, F64 = np.float32, np.float64


def gamma(n):
    """Higham's ``gamma(n)`` for float32: the relative error bound of ``n`` roundings."""
    return n * U / (1 - n * U)


def down32(v):
    """The largest float32 not above each real ``v`` (float64)."""
    v = np.asarray(v, dtype=F64)
    f = v.astype(F32)
    return np.where(f.astype(F64) > v, np.nextafter(f, F32(-np.inf)), f)


def up32(v):
    """The smallest float32 not below each real ``v`` (float64)."""
    v = np.asarray(v, dtype=F64)
    f = v.astype(F32)
    return np.where(f.astype(F64) < v, np.nextafter(f, F32(np.inf)), f)


class Iv:
    """Closed intervals ``[lo, hi]`` element by element, of dtype ``dt``. ``approx`` says
    whether processor-dependent operations (sums, roots, reciprocals, powers) widen the
    interval by their bounds (the float32 envelope) or are evaluated as exactly as ``dt``
    allows (the exact evaluation, and correctly rounded float32 host constants)."""

    def __init__(self, lo, hi=None, dt=F32, approx=True):
        self.dt, self.approx = dt, approx
        self.lo = np.asarray(lo, dtype=dt)
        self.hi = self.lo if hi is None else np.asarray(hi, dtype=dt)
        if dt == F64 and self.lo.size and max(np.abs(self.lo).max(), np.abs(self.hi).max()) \
                >= 2.0 ** 53:
            raise ValueError("the exact evaluation left float64's exact integers (2**53)")

    def _like(self, lo, hi=None):
        return Iv(lo, hi, self.dt, self.approx)

    def const(self, v):
        """A constant of this interval's kind."""
        return self._like(v)

    def cast(self, other):
        """``other`` (a host constant) as an interval of this kind."""
        return self._like(other.lo.astype(self.dt), other.hi.astype(self.dt))

    # exact under IEEE 754: evaluated at the corners ------------------------------------------
    def apply(self, fn, *others):
        """``fn`` at every corner of the arguments' box; ``fn`` monotone in each argument, or
        bilinear."""
        args = [self] + [o if isinstance(o, Iv) else self.const(o) for o in others]
        with np.errstate(over="ignore"):   # float32 overflows to inf, as in the reference
            corners = [np.asarray(fn(*c), dtype=self.dt)
                       for c in itertools.product(*[(a.lo, a.hi) for a in args])]
        return self._like(np.minimum.reduce(corners), np.maximum.reduce(corners))

    def __add__(self, o):
        return self.apply(np.add, o)

    def __sub__(self, o):
        return self.apply(np.subtract, o)

    def __mul__(self, o):
        return self.apply(np.multiply, o)

    def __truediv__(self, o):          # divisors here are of one sign
        return self.apply(np.divide, o)

    def floor(self):
        return self.apply(np.floor)

    def round(self):                   # torch.round and np.rint both round half to even
        return self.apply(np.rint)

    def square(self):                  # torch's ``t ** 2`` is t * t
        lo2, hi2 = self.lo * self.lo, self.hi * self.hi
        low = np.where((self.lo <= 0) & (self.hi >= 0), 0, np.minimum(lo2, hi2))
        return self._like(low, np.maximum(lo2, hi2))

    # processor-dependent ---------------------------------------------------------------------
    def _approx(self, fn, decreasing=False):
        a, b = (self.hi, self.lo) if decreasing else (self.lo, self.hi)
        lo, hi = fn(a.astype(F64)), fn(b.astype(F64))
        if not self.approx:
            return self._like(lo.astype(self.dt), hi.astype(self.dt))
        return self._like(down32(lo * (1 - APPROX)), up32(hi * (1 + APPROX)))

    def sqrt(self):
        return self._approx(np.sqrt)

    def recip(self):                   # of positive values
        return self._approx(lambda v: 1.0 / v, decreasing=True)

    def exp2(self):
        return self._approx(np.exp2)

    def isqrt(self):
        """``floor(sqrt(v))`` of integral values: exact in Python integers, else through the
        approximate root."""
        if self.approx:
            return self.sqrt().floor()
        root = np.vectorize(lambda v: math.isqrt(int(v)), otypes=[np.int64])
        return self._like(root(self.lo), root(self.hi))

    def floordiv_into(self, numerator):
        """``floor(numerator / v)`` of positive integral values, as the reference computes it
        (``floor(numerator * (1 / v))``); exact in integers."""
        if self.approx:
            return (self.recip() * float(numerator)).floor()
        return self._like(numerator // self.hi.astype(np.int64),
                          numerator // self.lo.astype(np.int64))

    def sum(self, divide=1):
        """The sum over the last axis, divided by ``divide`` (a mean), in any order."""
        lo = self.lo.astype(F64).sum(axis=-1, keepdims=True) / divide
        hi = self.hi.astype(F64).sum(axis=-1, keepdims=True) / divide
        if not self.approx:
            return self._like(lo, hi)
        mag = np.maximum(np.abs(self.lo), np.abs(self.hi)).astype(F64)
        err = gamma(self.lo.shape[-1] - 1) * mag.sum(axis=-1, keepdims=True) / divide
        rounding = gamma(2) if divide != 1 else 0.0
        return self._like(down32((lo - err) - rounding * np.abs(lo - err)),
                          up32((hi + err) + rounding * np.abs(hi + err)))

    def max(self):
        return self._like(self.lo.max(axis=-1, keepdims=True),
                          self.hi.max(axis=-1, keepdims=True))

    def ints(self):
        return np.floor(self.lo).astype(np.int64), np.ceil(self.hi).astype(np.int64)

    def points(self):
        """An integral interval as the point intervals it may take: one, or two when some
        rows hold two values (the union is taken over the results); else itself."""
        lo, hi = self.ints()
        if ((hi - lo) > 1).any() or (hi == lo).all():
            return [self]
        return [self._like(lo), self._like(hi)]


def _host(value, exact):
    """A float32 host constant (a scale): exact IEEE arithmetic on it, with the reference's
    approximate operations widened unless ``exact``."""
    return Iv(np.asarray(value, dtype=F32), dt=F32, approx=not exact)


def _union(results):
    los, his = zip(*results)
    return np.minimum.reduce(los), np.maximum.reduce(his)


def _input(x, scale, q, exact):
    """The kernel's input: the integers ``q`` (exact) or the reference's ``x / scale``."""
    if exact:
        return Iv(np.asarray(q, dtype=F64), dt=F64, approx=False)
    return Iv(np.asarray(x, dtype=F32)) / Iv(np.asarray(scale, dtype=F32))


def _recover(value, out_scale, exact):
    """The integers the tests read from the reference's float output: ``round(out /
    out_scale)`` in float64 with ``out = fl32(value * out_scale)`` (monotone in ``value``)."""
    if exact:
        return value.ints()
    scale = np.asarray(out_scale, dtype=F32)

    def one(v):
        out = (v.astype(F32) * scale).astype(F64)
        return np.rint(out / scale.astype(F64)).astype(np.int64)
    return one(value.lo), one(value.hi)


def _floordiv32(a, b):
    """torch's float32 ``a // b`` (``div_floor_floating``: from ``fmod``), IEEE-exact."""
    a, b = np.asarray(a, dtype=F32), np.asarray(b, dtype=F32)
    mod = np.fmod(a, b)
    div = (a - mod) / b
    div = np.where((mod != 0) & ((b < 0) != (mod < 0)), div - F32(1), div)
    floor = np.floor(div)
    return np.where(div - floor > F32(0.5), floor + F32(1), floor)


# -- IntLayerNorm -------------------------------------------------------------------------------

def layernorm(x, scale, weight, bias, shift, out_scale=None, q=None):
    """IntLayerNorm.forward (quant_mode) over the last axis: ``(lo, hi)`` of the integer
    output (``round(out / out_scale)``). ``q`` given: the exact evaluation on it; else the
    float32 envelope on the reference's input ``x``."""
    exact = q is not None
    x_int = _input(x, scale, q, exact)
    hidden = x_int.lo.shape[-1]
    pow2 = 2.0 ** float(shift)
    dim_sqrt = _host(hidden, exact).sqrt()
    norm = dim_sqrt / F32(2 ** 30)
    ratio = _host(bias, exact) / _host(weight, exact)
    bias_int = (ratio / norm).floor()
    bias_int = x_int.cast(bias_int)
    results = []
    for mean in x_int.sum(divide=hidden).round().points():
        y = x_int - mean
        ys = (y / pow2).floor()
        std = ys.square().sum().isqrt() * pow2
        if (std.lo <= 0).any():
            raise ValueError("a row of zero variance: the reference divides by zero there")
        factor = std.floordiv_into(2 ** 31)
        out = (y * factor / 2.0).floor()
        results.append(_recover(out + bias_int, out_scale, exact))
    return _union(results)


# -- IntGELU ------------------------------------------------------------------------------------

GELU_K, GELU_CONST, GELU_COEFF = 1.4142, 14, (-0.2888, -1.769, 1 / -0.2888)


def gelu(x, scale, out_scale=None, q=None):
    """IntGELU.forward (quant_mode): ``(lo, hi)`` of the integer output; exact with ``q``,
    else the float32 envelope (see :func:`layernorm`)."""
    exact = q is not None
    x_int = _input(x, scale, q, exact)
    s_erf = _host(scale, exact) / F32(GELU_K)                   # tensor / python float
    s_erf2 = s_erf.square()
    sig_scale = s_erf2 * F32(GELU_COEFF[0]) * F32(2 ** GELU_CONST)
    shift_int = x_int.cast(Iv(_floordiv32(1.0, sig_scale.lo)))    # python 1.0 // tensor
    b = x_int.cast((s_erf.recip() * F32(GELU_COEFF[1])).floor())
    c = x_int.cast((s_erf2.recip() * F32(GELU_COEFF[2])).floor())
    a = x_int.apply(np.abs).apply(np.minimum, b * -1.0)
    y = (x_int.apply(np.sign) * ((a + b).square() + c) / 2.0 ** GELU_CONST).floor()
    return _recover(x_int * (y + shift_int), out_scale, exact)


# -- IntSoftmax ---------------------------------------------------------------------------------

EXP_X0, EXP_CONST = -0.6931, 30
EXP_COEFF = (0.35815147, 0.96963238 / 0.35815147, 1.0 / 0.35815147)
SOFTMAX_MAX_BIT = 32


def _frexp_dyadic(ratio):
    """The reference's ``batch_frexp``: ``ratio = m / 2**e``, 31-bit ``m`` rounded half up."""
    mant, exp = math.frexp(ratio)
    return math.floor(mant * 2 ** 31 + 0.5), 31 - exp


def _round_half_even(num, den):
    """``round(num / den)`` half to even, for Python integers (object arrays)."""
    q, r = num // den, num % den
    up = (2 * r > den) | ((2 * r == den) & (q % 2 == 1))
    return q + up.astype(np.int64).astype(object)


def softmax_e16(x, scale, act_scale, q=None):
    """IntSoftmax's i-exp and its 16-bit QuantAct: ``(lo, hi)`` of the 16-bit integers
    (``exp / act_scale``); exact with ``q`` (Python integers for ``exp / exp_scale``, a value
    near 2**66), else the float32 envelope."""
    exact = q is not None
    x_int = _input(x, scale, q, exact)
    x_int = x_int - x_int.max()
    s = _host(scale, exact)
    s2 = s.square()
    exp_scale = ((s2 * F32(EXP_COEFF[0])).lo / F32(2 ** EXP_CONST)).item()
    m, e = _frexp_dyadic(exp_scale / float(F32(np.asarray(act_scale).item())))
    x0 = x_int.cast((s.recip() * F32(EXP_X0)).floor())
    b = x_int.cast((s.recip() * F32(EXP_COEFF[1])).floor())
    c = x_int.cast((s2.recip() * F32(EXP_COEFF[2])).floor())
    xc = x_int.apply(np.maximum, x0 * float(EXP_CONST))
    qq = (xc / x0).floor()
    r = xc - qq * x0
    z = (r + b) * r + c
    if exact:   # exp = z * 2**(30 - q) (up to 2**62), round(exp / exp_scale), round(* m / 2**e)
        zs = np.maximum(z.lo, 0).astype(np.int64).astype(object)
        ex = zs * (2 ** (EXP_CONST - qq.lo.astype(np.int64))).astype(object)
        mant, pw = math.frexp(float(exp_scale))            # exp_scale = M * 2**(pw - 53)
        num = ex * 2 ** max(53 - pw, 0)
        den = int(mant * 2 ** 53) * 2 ** max(pw - 53, 0)
        z_int = _round_half_even(num, den)
        e16 = _round_half_even(z_int * m, 2 ** e) if e > 0 else z_int * m * 2 ** -e
        e16 = np.clip(e16.astype(np.int64), -(1 << 15), (1 << 15) - 1)
        return e16, e16
    ex = (z * (qq * -1.0 + float(EXP_CONST)).exp2()).floor().apply(np.maximum, 0.0)
    z_int = (ex / float(exp_scale)).round()
    # z_int * m / 2.0**e in float64, the power from torch.pow: 2**-50 relative slack
    lo = z_int.lo.astype(F64) * m / 2.0 ** e * (1 - 2.0 ** -50)
    hi = z_int.hi.astype(F64) * m / 2.0 ** e * (1 + 2.0 ** -50)
    return tuple(np.clip(np.rint(v), -(1 << 15), (1 << 15) - 1).astype(np.int64)
                 for v in (lo, hi))


def softmax_out(e16, act_scale, output_bit=8, exact=False):
    """IntSoftmax after the 16-bit QuantAct, from the 16-bit integers ``e16`` (an ``(lo, hi)``
    pair): ``exp_int = fl32(e16 * act) / act``, the row sum, ``floor(2**32 / sum)``,
    ``floor(exp_int * factor / 2**(32 - output_bit))``. Returns ``(lo, hi)`` of the output
    integers (``out * 2**output_bit``)."""
    lo, hi = (np.asarray(v, dtype=F64 if exact else F32) for v in e16)
    v = Iv(lo, hi, F64, False) if exact else Iv(lo, hi)
    if not exact:
        v = v * F32(act_scale) / F32(act_scale)
    factor = v.sum().floordiv_into(2 ** SOFTMAX_MAX_BIT)
    return (v * factor / 2.0 ** (SOFTMAX_MAX_BIT - output_bit)).floor().ints()


def softmax(x, scale, act_scale, output_bit=8, q=None):
    """IntSoftmax.forward (quant_mode, eval): ``(lo, hi)`` of ``out * 2**output_bit``."""
    return softmax_out(softmax_e16(x, scale, act_scale, q), act_scale, output_bit,
                       exact=q is not None)


# -- checks shared by the tests -----------------------------------------------------------------

def assert_within(name, ref, bounds):
    """The reference's integers lie in their float32 envelope."""
    lo, hi = (np.broadcast_to(b, np.shape(ref)) for b in bounds)
    out = (ref < lo) | (ref > hi)
    assert not out.any(), (
        f"{name}: {out.sum()} reference values outside the float32 envelope, e.g. "
        f"{ref[out][:5]} not in [{lo[out][:5]}, {hi[out][:5]}]")
    return int((hi - lo).max())


def assert_exact(name, got, bounds):
    """The golden integers equal the exact evaluation."""
    lo, hi = bounds
    assert (lo == hi).all()
    diff = got != lo
    assert not diff.any(), (f"{name}: golden differs from the exact evaluation of the "
                            f"reference's formula at {diff.sum()}, e.g. {got[diff][:5]} vs "
                            f"{lo[diff][:5]}")


def assert_softmax_exact(name, got, q, scale, act_scale, output_bit=8):
    """The golden IntSoftmax against the exact evaluation. Its 16-bit step rounds
    ``exp * m / 2**e`` once (``m / 2**e`` the 31-bit dyadic of ``1 / act_scale``) where the
    reference rounds ``exp / exp_scale`` (near 2**66) and then multiplies by the dyadic of
    ``exp_scale / act_scale``: both round the same real value times ``1 + eps``,
    ``|eps| < 2**-30``, and it is below 2**15, so the two differ by at most one unit, and only
    next to a half-integer. From the 16-bit integers on, the golden model is exact."""
    from hwgen.ibert import golden as g
    c = g.softmax_constants(scale, act_scale, output_bit)
    z, qq = g.exp_parts(np.asarray(q) - np.max(q, axis=-1, keepdims=True), c["x0_int"],
                        c["b_int"], c["c_int"])
    e16 = g.exp16(z, qq, *c["dyadic"])
    exact16, _ = softmax_e16(None, scale, act_scale, q=q)
    assert np.abs(e16 - exact16).max() <= 1, f"{name}: 16-bit step beyond one unit"
    assert_exact(name, got, softmax_out((e16, e16), act_scale, output_bit, exact=True))
    return int((e16 != exact16).sum())
