"""hwgen.lib.quant.quantize, the one integer quantiser: against outside references (PyTorch's
``quantize_per_tensor``, numpy's half-to-even ``round``), its edge cases and bad input, and the
three callers (ESPN's golden model, ESPN's host re-ranking, ChamVS's IVF-PQ) each equal to it
with their parameters."""

import math

import numpy as np
import pytest

from hwgen.errors import ConfigError
from hwgen.espn.golden import quantize_int8
from hwgen.espn.host.search import INT8_INV_SCALE, INT8_SCALE, quantise_int8
from hwgen.lib.quant import Quantized, qrange, quantize
from hwgen.vecsearch.ivfpq import quantize_vectors


def _ties(rng, step, n=200):
    """Values at exact ties ``(k + 0.5) * step`` and on the grid, both signs, past the range."""
    k = rng.integers(-140, 140, size=n)
    return np.concatenate([(k + 0.5) * step, k * step, [0.0, -0.0, 127 * step, -128 * step]])


# -- outside references ----------------------------------------------------------------------

@pytest.mark.filterwarnings("ignore:torch.quantize_per_tensor:UserWarning")
@pytest.mark.parametrize("step", [1.0, 0.5, 2.0 ** -7, 0.25, 4.0])
def test_matches_torch_quantize_per_tensor_qint8(step):
    """Symmetric int8 with a dyadic step (ties exact): PyTorch's qint8 quantisation rounds half
    to even and clips to -128..127; ours clips to -127..127, so only -128 differs."""
    torch = pytest.importorskip("torch")
    x = _ties(np.random.default_rng(1), step)
    ref = torch.quantize_per_tensor(torch.tensor(x, dtype=torch.float32), step, 0,
                                    torch.qint8).int_repr().numpy()
    q, scale, inv = quantize(x, step)
    assert q.dtype == np.int8 and scale == step and inv == 1 / step
    assert np.array_equal(q, np.maximum(ref, -127))
    full, _, _ = quantize(x, step, symmetric=False)
    assert np.array_equal(full, ref)


@pytest.mark.filterwarnings("ignore:torch.quantize_per_tensor:UserWarning")
def test_matches_torch_with_a_random_step():
    """Random data and the peak step: equal to PyTorch except where float32 (PyTorch's
    tensors) and float64 (ours) put a value on different sides of a tie."""
    torch = pytest.importorskip("torch")
    x = np.random.default_rng(2).normal(0, 0.3, size=5000).astype(np.float32)
    q, scale, _ = quantize(x)
    ref = torch.quantize_per_tensor(torch.tensor(x), scale, 0, torch.qint8).int_repr().numpy()
    assert np.abs(q.astype(int) - ref).max() <= 1
    assert np.mean(q == ref) > 0.999


@pytest.mark.parametrize("step", [1.0, 0.125, 3.0, 0.1])
def test_matches_numpy_round_half_to_even(step):
    """``numpy.round`` (half to even) of ``x / step``, clipped: the definition."""
    x = _ties(np.random.default_rng(3), step)
    for bits in (2, 4, 8, 12, 16):
        for symmetric in (True, False):
            lo, hi = qrange(bits, symmetric)
            want = np.clip(np.round(x / step), lo, hi)
            assert np.array_equal(quantize(x, step, bits=bits, symmetric=symmetric).values, want)
            want = np.clip(np.round(x * (1 / step)), lo, hi)
            got = quantize(x, inv_scale=1 / step, bits=bits, symmetric=symmetric).values
            assert np.array_equal(got, want)
    assert quantize([0.5, 1.5, 2.5, -0.5, -1.5, -2.5], 1.0).values.tolist() == \
        [0, 2, 2, -0, -2, -2]


def test_step_meaning_and_error_bound():
    """``x ~ q * scale``: the default step maps the peak to qmax, error at most half a step."""
    x = np.random.default_rng(4).normal(0, 2, size=(30, 16))
    for bits in (4, 8, 16):
        q, scale, inv = quantize(x, bits=bits)
        qmax = (1 << (bits - 1)) - 1
        assert scale == np.abs(x).max() / qmax and np.abs(q).max() == qmax
        assert np.abs(q * scale - x).max() <= scale / 2 * (1 + 1e-12)
        assert q.dtype == (np.int8 if bits <= 8 else np.int16)
    assert quantize(x, bits=32).values.dtype == np.int32
    q, scale, inv = quantize(x, inv_scale="peak")
    assert inv == 127 / np.abs(x).max() and scale == 1 / inv and np.abs(q).max() == 127


def test_qrange():
    assert qrange(8) == (-127, 127) and qrange(8, symmetric=False) == (-128, 127)
    assert qrange(2) == (-1, 1) and qrange(16, False) == (-32768, 32767)


# -- edge cases ------------------------------------------------------------------------------

@pytest.mark.parametrize("x", [np.zeros(5), np.zeros((3, 4)), np.zeros(0), np.zeros((0, 4)),
                               [-0.0, 0.0]])
@pytest.mark.parametrize("form", [{}, {"inv_scale": "peak"}])
def test_zero_and_empty_tensors_get_step_one(x, form):
    """An all-zero or empty tensor: step 1.0 (documented), all zeros, no division by zero."""
    with np.errstate(all="raise"):
        q, scale, inv = quantize(x, **form)
    assert scale == inv == 1.0 and q.shape == np.shape(x) and not q.any()


def test_all_equal_and_negative_extremes():
    assert quantize(np.full(7, -3.5)).values.tolist() == [-127] * 7
    assert quantize(np.full(7, 0.25)).values.tolist() == [127] * 7
    assert quantize(np.full(3, -2.0), inv_scale="peak", symmetric=False).values.tolist() == \
        [-127] * 3                                # the peak maps to qmax, never to qmin
    assert quantize([-1e9, 1e9], 1.0).values.tolist() == [-127, 127]
    assert quantize([-1e9, 1e9], 1.0, symmetric=False).values.tolist() == [-128, 127]
    assert quantize([-1e300, 1e300], 1e-300).values.tolist() == [-127, 127]    # inf: clipped


@pytest.mark.parametrize("tiny", [5e-324, 1e-322, 1e-310])
def test_an_underflowing_peak_saturates_by_sign_without_nan(tiny):
    """``max|x| / 127`` is 0.0 (or ``127 / max|x|`` inf): the values saturate by sign, as
    ``x / +0.0`` clipped would, with no division by zero and no NaN."""
    x = np.array([tiny, -tiny, 0.0, tiny / 2])
    with np.errstate(all="raise"):
        q, scale, inv = quantize(x)
        assert not math.isnan(scale) and not math.isnan(inv)
        if scale == 0:
            assert math.isinf(inv) and q.tolist() == (np.sign(x) * 127).tolist()
        else:                                     # a subnormal step, still divided by
            assert q.tolist()[:3] == [127, -127, 0] and 63 <= q[3] <= 64
        q, scale, inv = quantize(x, inv_scale="peak", symmetric=False)
        assert math.isinf(inv) and scale == 0
        assert q.tolist() == np.where(x > 0, 127, np.where(x < 0, -128, 0)).tolist()
    assert quantize([5e-324]).scale == 0.0


def test_float32_arithmetic_is_a_parameter():
    """``compute_dtype`` picks the arithmetic: near a tie, float32 and float64 products round
    differently (the host re-ranking's float32 product is kept)."""
    x = np.float32(-126.5 / 127)                 # float32 just beyond -126.5 / 127
    q32 = quantize([x], inv_scale=127, compute_dtype=np.float32).values[0]
    q64 = quantize([x], inv_scale=127).values[0]
    assert q32 == np.rint(x * np.float32(127)) == -126     # x * 127 rounds to the tie -126.5
    assert q64 == np.rint(np.float64(x) * 127) == -127     # exactly: just beyond -126.5


# -- bad input -------------------------------------------------------------------------------

@pytest.mark.parametrize("x, message", [
    ([1.0, np.nan], "^x: must be finite$"),
    ([np.inf], "^x: must be finite$"),
    (np.array([-np.inf, 0.0], dtype=np.float32), "^x: must be finite$"),
    (["a", "b"], "^x: must hold real numbers"),
    (np.array([1 + 2j]), "^x: must hold real numbers"),
    (np.array([None, 1.0], dtype=object), "^x: must hold real numbers"),
])
def test_bad_x_raises_config_error_naming_it(x, message):
    with pytest.raises(ConfigError, match=message):
        quantize(x)
    with pytest.raises(ConfigError, match=message.replace("x:", "tokens:")):
        quantize(x, inv_scale=127, name="tokens")


@pytest.mark.parametrize("kwargs, message", [
    ({"scale": 0.0}, "^scale: must be a positive finite number, not 0.0$"),
    ({"scale": -1}, "^scale: must be a positive finite number, not -1.0$"),
    ({"scale": np.nan}, "^scale: must be a positive"),
    ({"scale": np.inf}, "^scale: must be a positive"),
    ({"scale": "x"}, "^scale: must be a positive finite number, not 'x'$"),
    ({"scale": [1.0, 2.0]}, "^scale: must be a positive"),
    ({"inv_scale": 0}, "^inv_scale: must be a positive"),
    ({"inv_scale": np.inf}, "^inv_scale: must be a positive"),
    ({"inv_scale": "max"}, "^inv_scale: must be a positive"),
    ({"scale": 1.0, "inv_scale": 1.0}, "^inv_scale: give scale or inv_scale, not both$"),
    ({"bits": 1}, "^bits=1: must be an integer in 2..32$"),
    ({"bits": 33}, "^bits=33: must be an integer in 2..32$"),
    ({"bits": 8.0}, "^bits=8.0: must be an integer"),
    ({"bits": True}, "^bits=True: must be an integer"),
])
def test_bad_parameters_raise_config_error_naming_them(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        quantize([0.5, -1.0], **kwargs)
    with pytest.raises(ValueError):                 # a ConfigError is a ValueError
        quantize([0.5, -1.0], **kwargs)


def test_callers_name_their_parameters():
    with pytest.raises(ConfigError, match="^quantize_int8: x must be finite$"):
        quantize_int8([np.nan])
    with pytest.raises(ConfigError, match="^quantize_int8: scale must be a positive finite "
                                          "number, not 0.0$"):
        quantize_int8([1.0], scale=0)
    with pytest.raises(ConfigError, match="^tokens: must be finite$"):
        quantise_int8(np.array([[np.nan]], dtype=np.float16))
    with pytest.raises(ConfigError, match="^x: must be finite$"):
        quantize_vectors([[np.inf]], 8)


# -- the three callers are the shared function -----------------------------------------------

def _inputs():
    rng = np.random.default_rng(5)
    out = [rng.normal(0, 0.3, size=(40, 32)), _ties(rng, 2.0 ** -7), _ties(rng, 0.37),
           np.zeros((4, 3)), np.full(9, -0.75), np.array([-1.0, 1.0, 0.5, -0.5])]
    return out


def test_espn_golden_is_quantize_with_its_defaults():
    """``quantize_int8(x, scale)`` = ``quantize(x, scale)``: step, symmetric -127..127,
    float64 division."""
    for x in _inputs():
        for scale in (None, 1.0, 0.01, 2.0 ** -7):
            q, s = quantize_int8(x, scale)
            want = quantize(x, scale)
            assert q.dtype == np.int8 and np.array_equal(q, want.values) and s == want.scale


def test_espn_host_search_is_quantize_with_inv_scale_127_in_float32():
    """The host re-ranking's int8: ``quantize(tokens, inv_scale=127, compute_dtype=float32)``
    (unit vectors, x * 127 in float32, symmetric); ``INT8_SCALE`` is the old name of the
    multiplier."""
    assert INT8_SCALE == INT8_INV_SCALE == 127
    every16 = np.arange(1 << 16, dtype=np.uint16).view(np.float16)
    every16 = every16[np.isfinite(every16)].reshape(-1, 8)       # every finite float16
    near = np.nextafter(((np.arange(-130, 130) + 0.5) / 127).astype(np.float32), np.float32(2))
    for t in (every16, near, every16.astype(np.float32)):
        want = quantize(t, inv_scale=127, compute_dtype=np.float32).values
        got = quantise_int8(t)
        assert got.dtype == np.int8 and np.array_equal(got, want)
        ref = np.clip(np.rint(t.astype(np.float32) * np.float32(127)), -127, 127)
        assert np.array_equal(got, ref)


def test_vecsearch_ivfpq_is_quantize_with_peak_inv_scale_full_range():
    """``quantize_vectors(x, bits, inv_scale)`` = ``quantize(x, inv_scale=... or "peak",
    bits=bits, symmetric=False)`` as int64; the multiplier it returns is the one it used."""
    for x in _inputs():
        for bits in (2, 4, 8, 16):
            for inv in (None, 1.0, 127.0, 100.3):
                q, m = quantize_vectors(x, bits, inv)
                want = quantize(x, inv_scale="peak" if inv is None else inv, bits=bits,
                                symmetric=False)
                assert q.dtype == np.int64 and np.array_equal(q, want.values)
                assert m == want.inv_scale
                top = (1 << (bits - 1)) - 1
                assert q.min() >= -top - 1 and q.max() <= top
    assert quantize_vectors([-4.0, 2.0], 8, 64.0)[0].tolist() == [-128, 127]   # full range


def test_quantized_is_a_named_tuple():
    r = quantize([1.0, -2.0])
    assert isinstance(r, Quantized) and r == (r.values, r.scale, r.inv_scale)
