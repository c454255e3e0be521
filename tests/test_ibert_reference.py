"""hwgen's I-BERT golden models against the public reference (Hugging Face transformers'
``models/ibert/quant_modules.py``), on wide random inputs and on the activations of a small,
randomly initialised and calibrated ``IBertModel``.

The reference keeps integers in float32 tensors. Wherever its float arithmetic is exact the
outputs must be identical. Every mismatch of the exact kernels (requant, linear) must belong to
a class in which the reference itself rounds (the flags below, computed from the exact integer
intermediates). For the inexact kernels (IntGELU, IntSoftmax, IntLayerNorm) two things are
asserted instead of an observed tolerance (``tests/ibert_float32.py`` derives both): the
golden model equals the exact evaluation of the reference's formula on the same integers, and
the reference's float32 output lies in the interval that its operations allow on any processor
(sums in any order, vector roots and reciprocals within two units in the last place). The
classes of the differing elements are still counted and printed. docs/guides/ibert.md ("I-BERT:
agreement with the reference") explains each class.
"""

import numpy as np
import pytest

F32 = np.float32

torch = pytest.importorskip("torch", reason="the reference check needs PyTorch (torch==2.13.0)")
qm = pytest.importorskip("transformers.models.ibert.quant_modules",
                         reason="the reference check needs Hugging Face transformers")

pytestmark = pytest.mark.float_reference

from hwgen.ibert import golden as g  # noqa: E402
import ibert_float32 as f32ref  # noqa: E402

EXACT = 1 << 24          # float32 holds every integer below this exactly
torch.set_grad_enabled(False)


def t32(x):
    return torch.tensor(np.asarray(x, dtype=np.float32))


def assert_scale(golden_scale, ref_scale, maxulp=2):
    """Output scales agree within ``maxulp`` float32 units in the last place.

    Scales are float32 results of a few float32 operations. torch may compute them with other
    instructions than numpy (its ``sqrt`` is not correctly rounded on every x86 processor:
    ``sqrt(37)`` is 6.0827622 on an AMD EPYC, numpy's correctly rounded value 6.0827627), so
    they are compared within the rounding bound of those operations, not bit for bit.
    """
    ref = np.asarray(ref_scale.numpy() if hasattr(ref_scale, "numpy") else ref_scale,
                     dtype=np.float32)
    gold, ref = np.broadcast_arrays(np.asarray(golden_scale, dtype=np.float32), ref)
    np.testing.assert_array_max_ulp(gold, ref, maxulp=maxulp)


def ints(out, scale):
    """The reference's integer result: its float output divided by its output scale."""
    out = out.numpy().astype(np.float64)
    scale = np.asarray(scale.numpy() if hasattr(scale, "numpy") else scale, dtype=np.float64)
    return np.round(out / scale).astype(np.int64)


def classes(name, got, ref, flags):
    """Print the mismatches by class; return ``(mismatch mask, unexplained mask, counts)``."""
    mismatch = got != ref
    explained = np.zeros_like(mismatch)
    counts = {}
    for cls, flag in flags.items():
        flag = np.broadcast_to(flag, mismatch.shape)
        counts[cls] = int((mismatch & flag).sum())
        explained |= flag
    unexplained = mismatch & ~explained
    print(f"{name}: {mismatch.sum()} of {mismatch.size} differ; by class {counts}")
    return mismatch, unexplained, counts


def report(name, got, ref, flags, abs_tol=0):
    """Assert that every mismatch of an exact kernel is explained by a flag and within
    ``abs_tol`` of the reference; return the number of mismatches and the class counts."""
    mismatch, unexplained, counts = classes(name, got, ref, flags)
    assert not unexplained.any(), (
        f"{name}: {unexplained.sum()} unexplained mismatches, e.g. golden "
        f"{got[unexplained][:5]} vs reference {ref[unexplained][:5]}")
    # Where the reference computed on a different input (its float32 input divided by the
    # scale is not the integer), no magnitude bound applies; elsewhere rounding is small.
    other_input = np.zeros_like(mismatch)
    for cls, flag in flags.items():
        if "input" in cls or "identity" in cls:
            other_input |= np.broadcast_to(flag, mismatch.shape)
    far = (np.abs(got - ref) > abs_tol) & mismatch & ~other_input
    assert not far.any(), (f"{name}: {far.sum()} deviations beyond the float-rounding bound, "
                           f"e.g. golden {got[far][:5]} vs reference {ref[far][:5]}")
    return int(mismatch.sum()), counts


# -- the kernels on wide random inputs --------------------------------------------------------

@pytest.mark.parametrize("sin, sout, bits, span", [
    (0.001, 0.05, 8, 30000), (3e-5, 0.01, 8, 1 << 22), (0.0123, 0.0456, 16, 1 << 20),
    (2 ** -10, 2 ** -4, 8, 5000), (7e-7, 0.02, 16, 1 << 30)])
@pytest.mark.parametrize("with_identity", [False, True])
def test_requant(sin, sout, bits, span, with_identity):
    rng = np.random.default_rng(bits + span)
    q = rng.integers(-span, span, size=(16, 96), endpoint=True)
    q[0, :4] = [span, -span, 0, 1]
    mod = qm.QuantAct(bits, quant_mode=True).eval()
    n = 2 ** (bits - 1) - 1
    mod.x_min.fill_(-sout * n)
    mod.x_max.fill_(sout * n)
    x = t32(q) * t32([sin])
    kwargs = {}
    ident = ident_scale = None
    if with_identity:
        ident, ident_scale = rng.integers(-3000, 3000, size=q.shape), 0.0071
        kwargs = {"identity": t32(ident) * t32([ident_scale]),
                  "identity_scaling_factor": t32([ident_scale])}
    out, scale_out = mod(x, t32([sin]), **kwargs)
    ref = ints(out, scale_out)
    got, gscale = g.requant(q, sin, float(scale_out), bits, ident, ident_scale)
    assert_scale(gscale, scale_out)
    # The reference recovers q as round(x / scale) in float32, then multiplies in float64.
    recovered = torch.round(x / t32([sin])).numpy().astype(np.int64)
    (m, _), ident_c = g.requant_constants(sin, float(scale_out), ident_scale)
    flags = {"float32 input above 2**24 not recovered": recovered != q,
             "float64 product above 2**53": np.abs(q) * m >= 1 << 53}
    if with_identity:
        rec_id = torch.round(kwargs["identity"] / t32([ident_scale])).numpy()
        flags["float32 input above 2**24 not recovered"] |= rec_id.astype(np.int64) != ident
    count, _ = report(f"requant {sin}->{sout}", got, ref, flags, abs_tol=1)
    if span < EXACT:
        assert count == 0


def _gelu_flags(q, x, scale):
    b, c, shift, _ = g.gelu_constants(scale)
    x_int = (x / t32([scale])).numpy()
    a = np.minimum(np.abs(q), -b)
    poly = np.abs((a + b) ** 2 + c)
    y = np.sign(q) * ((a + b) ** 2 + c) >> g.GELU_CONST
    return {"float32 input not an integer": x_int != q,
            "float32 intermediate above 2**24": (poly >= EXACT) | (np.abs(q * (y + shift)) >=
                                                                    EXACT)}


@pytest.mark.parametrize("scale, span", [(0.01, 2000), (0.0371, 3000), (2 ** -6, 4000),
                                         (0.3, 60), (0.0004, 20000), (0.05, 127)])
def test_gelu(scale, span):
    rng = np.random.default_rng(span)
    q = rng.integers(-span, span, size=(16, 128), endpoint=True)
    q[0, :3] = [span, -span, 0]
    x = t32(q) * t32([scale])
    out, scale_out = qm.IntGELU(quant_mode=True)(x, t32([scale]))
    got, gscale = g.int_gelu(q, scale)
    assert_scale(gscale, scale_out)
    check_inexact(f"gelu scale {scale}", got, ints(out, scale_out), _gelu_flags(q, x, scale),
                  f32ref.gelu(x.numpy(), F32(scale), scale_out.numpy()),
                  f32ref.gelu(None, F32(scale), q=q))


def check_inexact(name, got, ref, flags, envelope, exact):
    """An inexact kernel: the reference inside its float32 envelope, the golden model equal to
    the exact evaluation (``tests/ibert_float32.py``); the differing elements by class."""
    classes(name, got, ref, flags)
    width = f32ref.assert_within(name, ref, envelope)
    if exact is not None:
        f32ref.assert_exact(name, got, exact)
    print(f"{name}: envelope width up to {width}, largest |golden - reference| "
          f"{int(np.abs(got - ref).max()) if got.size else 0}")


def _softmax_flags(q, scale, act_scale):
    """Which elements' reference result passed through an inexact float step."""
    c = g.softmax_constants(scale, act_scale)
    z, qq = g.exp_parts(q - q.max(axis=-1, keepdims=True), c["x0_int"], c["b_int"], c["c_int"])
    m, e = c["dyadic"]
    # 16-bit step: the reference divides the i-exp value by its scale in float32 (relative
    # error 2**-24) before the dyadic multiply; a value within that of a rounding boundary
    # may round the other way.
    value = z * m / 2.0 ** (e - g.EXP_CONST + qq)
    near_half = np.abs(value - np.floor(value) - 0.5) <= value * 2 ** -22 + 1e-9
    e16 = g.exp16(z, qq, m, e)
    total = e16.sum(axis=-1, keepdims=True)
    factor = (1 << 32) // np.maximum(total, 1)
    recip = np.floor(np.float32(2 ** 32) * (np.float32(1) / total.astype(np.float32)))
    return {"float32 polynomial above 2**24": np.abs(z) >= EXACT,
            "16-bit requant at a rounding boundary": near_half,
            "float32 reciprocal of the sum": np.broadcast_to(recip != factor, q.shape)
            | np.broadcast_to(near_half.any(axis=-1, keepdims=True), q.shape),
            "float32 product above 2**24": e16 * factor >= EXACT}


@pytest.mark.parametrize("scale, span, length", [(0.05, 300, 37), (0.01, 2000, 128),
                                                 (0.2, 60, 1), (0.2, 100, 64),
                                                 (0.003, 30000, 17)])
def test_softmax(scale, span, length):
    rng = np.random.default_rng(length + span)
    q = rng.integers(-span, span, size=(3, 8, length), endpoint=True)
    q[0, 0, :] = 5                                           # all equal
    mod = qm.IntSoftmax(8, quant_mode=True)
    x = t32(q) * t32([scale])
    mod.train()(x, t32([scale]))                             # calibrates the 16-bit act
    out, _ = mod.eval()(x, t32([scale]))
    act = float(mod.act.act_scaling_factor)
    assert_scale(g.calibrate_softmax(q, scale), act)
    got, out_scale = g.int_softmax(q, scale, 8, act_scale=act)
    ref = np.round(out.numpy().astype(np.float64) * 2 ** 8).astype(np.int64)
    flags = _softmax_flags(q, scale, act)
    flags["float32 input not an integer"] = np.broadcast_to(
        ((x / t32([scale])).numpy() != q).any(axis=-1, keepdims=True), q.shape)
    name = f"softmax scale {scale} M={length}"
    check_inexact(name, got, ref, flags, f32ref.softmax(x.numpy(), F32(scale), act), None)
    f32ref.assert_softmax_exact(name, got, q, F32(scale), act)
    assert np.all(got.sum(axis=-1) <= 256) and np.all(got >= 0)


def _layernorm_flags(q, weight, bias, shift, x, scale):
    hidden = q.shape[-1]
    total = q.sum(axis=-1, keepdims=True)
    mean = g._round_div(total, hidden)
    y = q - mean
    ys = y >> shift
    var = (ys * ys).sum(axis=-1, keepdims=True)
    std = g.isqrt(var) << shift
    factor = np.where(std > 0, (1 << 31) // np.maximum(std, 1), 0)
    x_int = x / t32([scale])
    ref_mean = torch.round(x_int.mean(axis=-1, keepdim=True)).numpy().astype(np.int64)
    ref_var = torch.sum(torch.floor((x_int - torch.tensor(ref_mean, dtype=torch.float32))
                                    / 2 ** shift) ** 2, axis=-1, keepdim=True).numpy()
    # The reference's own float32 square roots (torch's, which may differ from numpy's).
    ref_std = np.floor(torch.sqrt(torch.tensor(ref_var, dtype=torch.float32)).numpy()
                       ) * 2.0 ** shift
    dim_sqrt = torch.sqrt(torch.tensor(hidden, dtype=torch.float32))
    ref_bias_int = torch.floor((t32(bias) / t32(weight)) / (dim_sqrt / 2 ** 30)).numpy()
    return {"float32 mean rounding": np.broadcast_to(ref_mean != mean, q.shape),
            "float32 variance above 2**24": np.broadcast_to((var >= EXACT) |
                                                            (ref_std != std), q.shape),
            "float32 reciprocal of std": np.broadcast_to(
                np.floor(np.float32(2 ** 31) * (np.float32(1) / std.astype(np.float32)))
                != factor, q.shape),
            "float32 product above 2**24": np.abs(y * factor) >= EXACT,
            "float32 result above 2**24": np.abs((y * factor >> 1) + g.layernorm_constants(
                weight, bias, hidden)["bias_int"]) >= EXACT,
            "float32 sqrt(H) in the reference's bias": np.broadcast_to(
                ref_bias_int != g.layernorm_constants(weight, bias, hidden)["bias_int"],
                q.shape),
            "zero variance (NaN in the reference)": np.broadcast_to(std == 0, q.shape)}


@pytest.mark.parametrize("hidden, shift, span", [(768, 0, 3000), (96, 2, 3000), (37, 0, 100),
                                                 (768, 6, 40000), (16, 0, 7)])
def test_layernorm(hidden, shift, span):
    rng = np.random.default_rng(hidden + shift)
    q = rng.integers(-span, span, size=(2, 4, hidden), endpoint=True)
    w = rng.uniform(0.5, 1.5, hidden).astype(np.float32)
    b = rng.uniform(-0.5, 0.5, hidden).astype(np.float32)
    mod = qm.IntLayerNorm(hidden, 1e-5, quant_mode=True).eval()
    mod.weight.data = torch.tensor(w)
    mod.bias.data = torch.tensor(b)
    mod.shift.fill_(shift)
    scale = 0.01
    x = t32(q) * t32([scale])
    out, out_scale = mod(x, t32([scale]))
    got, gscale = g.int_layernorm(q, scale, w, b, shift)
    assert_scale(gscale, out_scale.numpy(), maxulp=4)
    ref = ints(out, out_scale)
    flags = _layernorm_flags(q, w, b, shift, x, scale)
    check_inexact(f"layernorm H={hidden} shift={shift}", got, ref, flags,
                  f32ref.layernorm(x.numpy(), F32(scale), w, b, shift, out_scale.numpy()),
                  f32ref.layernorm(None, F32(scale), w, b, shift, q=q))


def test_linear():
    rng = np.random.default_rng(5)
    mod = qm.QuantLinear(96, 40, weight_bit=8, bias_bit=32, quant_mode=True)
    mod.weight.data = torch.tensor(rng.normal(0, 0.05, (40, 96)).astype(np.float32))
    mod.bias.data = torch.tensor(rng.normal(0, 0.1, 40).astype(np.float32))
    for span in (127, 1000):
        q = rng.integers(-span, span, size=(9, 96), endpoint=True)
        scale = 0.02
        out, out_scale = mod(t32(q) * t32([scale]), t32([scale]))
        q_w = mod.weight_integer.numpy().astype(np.int64)
        q_b = mod.bias_integer.numpy().astype(np.int64)
        got, gscale = g.linear(q, q_w, q_b, scale_x=scale, scale_w=mod.fc_scaling_factor)
        assert_scale(gscale, out_scale)
        partial = np.abs(q) @ np.abs(q_w).T + np.abs(q_b)
        report(f"linear span {span}", got, ints(out, out_scale),
               {"float32 accumulation above 2**24": partial >= EXACT})


# -- the kernels inside a small I-BERT model --------------------------------------------------

@pytest.fixture(scope="module")
def captured():
    """Inputs and outputs of every quantised module of a calibrated 2-layer I-BERT."""
    from transformers import IBertConfig, IBertModel
    torch.manual_seed(0)
    cfg = IBertConfig(vocab_size=200, hidden_size=96, num_hidden_layers=2, num_attention_heads=4,
                      intermediate_size=192, max_position_embeddings=64, quant_mode=True)
    model = IBertModel(cfg)
    ids = torch.randint(5, 200, (3, 38))
    model.train()
    for _ in range(3):
        model(ids)                                       # calibrate activation ranges
    model.eval()
    calls = []
    hooks = [mod.register_forward_hook(lambda mod, args, kw, out: calls.append((mod, args, kw,
                                                                                out)),
                                       with_kwargs=True)
             for mod in model.modules()
             if isinstance(mod, (qm.QuantAct, qm.IntGELU, qm.IntSoftmax, qm.IntLayerNorm))]
    model(ids)
    for h in hooks:
        h.remove()
    return calls


def _row_wide(flags):
    return {cls: np.broadcast_to(f.any(axis=-1, keepdims=True), f.shape)
            for cls, f in flags.items()}


def test_model_activations(captured):
    kinds = {}
    inner = {id(mod.act) for mod, *_ in captured if isinstance(mod, qm.IntSoftmax)}
    for mod, args, kw, out in captured:
        if id(mod) in inner:
            continue            # IntSoftmax's own 16-bit act: checked as part of the softmax
        x = args[0]
        scale = args[1] if len(args) > 1 else kw.get("scaling_factor",
                                                       kw.get("pre_act_scaling_factor"))
        if scale is None:
            continue
        q = np.round((x / scale).numpy()).astype(np.int64)
        s = float(scale.reshape(-1)[0]) if scale.numel() == 1 else scale.numpy().reshape(-1)
        flags = {"float32 input not an integer": (x / scale).numpy() != q}
        name = type(mod).__name__
        ref = ints(out[0], out[1])
        if isinstance(mod, qm.QuantAct):
            ident = kw.get("identity")
            if ident is not None:
                id_scale = kw["identity_scaling_factor"]
                id_q = np.round((ident / id_scale).numpy()).astype(np.int64)
                id_s = id_scale.numpy().reshape(-1)
                got, _ = g.requant(q, s, float(out[1]), mod.activation_bit, id_q,
                                   id_s if id_s.size > 1 else float(id_s[0]))
                flags["float32 identity not an integer"] = (ident / id_scale).numpy() != id_q
                name += " (residual)"
            else:
                got, _ = g.requant(q, s, float(out[1]), mod.activation_bit)
        elif isinstance(mod, qm.IntGELU):
            got, _ = g.int_gelu(q, s)
            flags.update(_gelu_flags(q, x, s))
            check_inexact(f"model {name}", got, ref, flags,
                          f32ref.gelu(x.numpy(), scale.numpy(), out[1].numpy()),
                          f32ref.gelu(None, scale.numpy(), q=q))
        elif isinstance(mod, qm.IntSoftmax):
            flags = _row_wide(flags)             # the row's max and sum involve every element
            act = float(mod.act.act_scaling_factor)
            got, _ = g.int_softmax(q, s, mod.output_bit, act_scale=act)
            flags.update(_softmax_flags(q, s, act))
            ref = np.round(out[0].numpy().astype(np.float64) * 2 ** mod.output_bit)
            check_inexact(f"model {name}", got, ref.astype(np.int64), flags,
                          f32ref.softmax(x.numpy(), scale.numpy(), act, mod.output_bit), None)
            f32ref.assert_softmax_exact(f"model {name}", got, q, F32(s), act, mod.output_bit)
        elif isinstance(mod, qm.IntLayerNorm):
            flags = _row_wide(flags)             # the row's mean and variance, likewise
            w, b = mod.weight.numpy(), mod.bias.numpy()
            got, _ = g.int_layernorm(q, s, w, b, int(mod.shift))
            flags.update(_layernorm_flags(q, w, b, int(mod.shift), x, s))
            check_inexact(f"model {name}", got, ref, flags,
                          f32ref.layernorm(x.numpy(), scale.numpy(), w, b, int(mod.shift),
                                           out[1].numpy()),
                          f32ref.layernorm(None, scale.numpy(), w, b, int(mod.shift), q=q))
        else:
            continue
        if isinstance(mod, qm.QuantAct):
            report(f"model {name}", got, ref, flags, abs_tol=1)
        kinds[name] = kinds.get(name, 0) + 1
    assert {"QuantAct", "QuantAct (residual)", "IntGELU", "IntSoftmax", "IntLayerNorm"} <= \
        set(kinds), kinds
