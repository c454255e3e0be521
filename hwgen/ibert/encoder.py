"""Golden I-BERT encoder (int64 numpy): layers composed only from :mod:`hwgen.ibert.golden`.

:func:`encoder_layer` is one Hugging Face ``IBertLayer`` (the paper's Fig. 14 order) on the
integer rows of one sentence, without padding (one sentence at a time, as the hardware takes
it; no attention mask)::

    Q, K, V   = requant8(linear(x))                      per-channel weight scales
    S_h       = Q_h K_h^T                                integer, per head (golden.linear)
    P_h       = int_softmax(S_h)                         scale s_q s_k / sqrt(d), see below
    C         = requant8(concat_h P_h V_h)
    A         = requant8(layernorm(requant22(linear(C) + x)))
    A'        = requant8(A)                              IBertLayer.pre_intermediate_act
    F         = requant8(requant8(int_gelu(linear(A'))))  intermediate act, pre_output_act
    out       = requant8(layernorm(requant22(linear(F) + A')))

Softmax scale: IBertSelfAttention divides the float scores and their scale by
``sqrt(head_dim)``; the integers the softmax sees are ``Q K^T`` and the scale is
``float32(s_q * s_k) / float32(sqrt(d))`` (:func:`attention_score_scale`), so no integer
division by ``sqrt(d)`` exists: it lives in the softmax's constants.

``layernorm`` is :func:`golden.int_layernorm`, except for rows whose shifted variance reaches
2**32 at the calibrated shift (rare: 7 of 189,423 rows on 500 MiniLM sentences), which it
takes through the same steps with an exact square root of any width (see :func:`layernorm`).

:func:`embed` is IBertEmbeddings on token ids (integer tables, two 16-bit requants with the
token-type and position rows as residuals, IntLayerNorm, 8-bit requant);
:func:`sentence_embedding` runs the whole integer MiniLM from token ids and pools on the host
(dequantised mean over the tokens, L2 normalisation: sentence-transformers' pooling for
all-MiniLM-L6-v2). Parameters come from :func:`hwgen.ibert.minilm.params`.

Importing this module imports numpy only.
"""

import math

import numpy as np

from . import golden as g

__all__ = ["attention_score_scale", "layernorm", "embed", "encoder_layer", "encode",
           "sentence_embedding"]


def attention_score_scale(scale_q, scale_k, head_dim):
    """Scale of the integer scores ``Q K^T``: ``float32(scale_q * scale_k) /
    float32(sqrt(head_dim))``, as IBertSelfAttention computes it."""
    return g.f32(g.f32(scale_q) * g.f32(scale_k)) / np.float32(math.sqrt(head_dim))


def _heads(x, heads):
    """(M, H) -> (heads, M, H / heads)."""
    m, h = x.shape
    return x.reshape(m, heads, h // heads).transpose(1, 0, 2)


def layernorm(q, scale, ln):
    """:func:`golden.int_layernorm` with ``ln = {"weight", "bias", "shift"}``. The calibrated
    shifts (5-7) let a later sentence's variance reach 2**32 (7 of 189,423 rows over 500
    sentences); ``golden.isqrt`` and the RTL square root take variances up to 2**62, so those
    rows need nothing special (the reference then takes a float32 square root).
    Returns ``(int64 (M, H), float32 (H,) scale)``.
    """
    return g.int_layernorm(q, scale, ln["weight"], ln["bias"], ln["shift"])


def _record(trace, name, q, scale):
    if trace is not None:
        trace[name] = (q, scale)
    return q, scale


def encoder_layer(q_x, scale_x, p, heads, trace=None):
    """One I-BERT encoder layer on one sentence.

    ``q_x``: int64 (M, H), 8-bit values at scale ``scale_x`` (float32 scalar; the previous
    layer's output scale, ``p["in_scale"]`` for the calibrated model). ``p``: one layer of
    :func:`hwgen.ibert.minilm.params` (int8 weights (N, K), int64 biases, float32 weight
    scales per output channel, LayerNorm weight/bias/shift, QuantAct output scales ``act``).
    ``trace``: a dict that receives ``name -> (integers, scale)`` of every stage (names as
    the reference's modules: ``query``, ``key``, ``value``, ``scores`` (heads, M, M),
    ``probs``, ``context``, ``attn_residual``, ``ln1``, ``attn_out``, ``ffn_in``, ``ffn_up``,
    ``gelu``, ``gelu_out``, ``ffn_mid``, ``ffn_down``, ``ffn_residual``, ``ln2``, ``out``).

    Returns ``(q_out, scale_out)``: int64 (M, H) 8-bit values and their float32 scale.
    """
    q_x = np.asarray(q_x, dtype=np.int64)
    a = p["act"]
    head_dim = q_x.shape[1] // heads

    def linear(name, x, s):
        lin = p[name]
        return g.linear(x, lin["w"], lin["b"], s, lin["w_scale"])

    def requant(name, x, s, bits=8, **residual):
        return _record(trace, name, *g.requant(x, s, a[name], bits, **residual))

    qkv = {}
    for name in ("query", "key", "value"):
        y, s = linear(name, q_x, scale_x)
        qkv[name] = requant(name, y, s)
    (q, sq), (k, sk), (v, sv) = qkv["query"], qkv["key"], qkv["value"]
    qh, kh, vh = _heads(q, heads), _heads(k, heads), _heads(v, heads)
    zero = np.zeros(1, dtype=np.int64)
    scores = np.stack([g.linear(qh[h], kh[h], zero)[0] for h in range(heads)])
    s_scores = attention_score_scale(sq, sk, head_dim)
    _record(trace, "scores", scores, s_scores)
    probs, s_probs = _record(trace, "probs", *g.int_softmax(scores, s_scores, 8,
                                                            act_scale=a["softmax16"]))
    ctx = np.concatenate([g.linear(probs[h], vh[h].T, zero)[0] for h in range(heads)], axis=1)
    ctx, s_ctx = requant("context", ctx, g.f32(s_probs) * g.f32(sv))

    y, s = linear("attn_output", ctx, s_ctx)
    y, s = requant("attn_residual", y, s, 22, identity=q_x, identity_scale=scale_x)
    y, s = _record(trace, "ln1", *layernorm(y, s, p["ln1"]))
    attn, s_attn = requant("attn_out", y, s)
    attn, s_attn = requant("ffn_in", attn, s_attn)

    y, s = _record(trace, "ffn_up", *linear("ffn_up", attn, s_attn))
    y, s = _record(trace, "gelu", *g.int_gelu(y, s))
    y, s = requant("gelu_out", y, s)
    y, s = requant("ffn_mid", y, s)
    y, s = _record(trace, "ffn_down", *linear("ffn_down", y, s))
    y, s = requant("ffn_residual", y, s, 22, identity=attn, identity_scale=s_attn)
    y, s = _record(trace, "ln2", *layernorm(y, s, p["ln2"]))
    return requant("out", y, s)


def encode(q_x, scale_x, params, layers=None, trace=None):
    """A stack of the first ``layers`` layers (default all) of ``params``
    (:func:`hwgen.ibert.minilm.params`) on one sentence's int64 (M, H) 8-bit rows at scale
    ``scale_x``. ``trace``: a list that receives one stage dict per layer
    (:func:`encoder_layer`). Returns ``(q_out, scale_out)`` as :func:`encoder_layer`."""
    stack = params["layers"][:layers]
    for p in stack:
        stage = {} if trace is not None else None
        q_x, scale_x = encoder_layer(q_x, scale_x, p, params["heads"], trace=stage)
        if trace is not None:
            trace.append(stage)
    return q_x, scale_x


def embed(ids, emb, trace=None):
    """IBertEmbeddings on one sentence's token ids (int64 (M,), BERT positions 0 .. M-1,
    token type 0).

    ``emb``: ``params["embeddings"]`` (:func:`hwgen.ibert.minilm.params`): int8 tables
    ``word``/``position``/``token_type`` with one scale each, ``act1`` (the 16-bit QuantAct
    the reference applies twice: word + token type, then + position), ``ln``, ``out``.
    Returns int64 (M, H) 8-bit rows and their float32 scale (``emb["out"]``).
    """
    ids = np.asarray(ids, dtype=np.int64)
    rows = {k: np.asarray(emb[k]["w"], dtype=np.int64) for k in ("word", "position",
                                                                  "token_type")}
    x, s = g.requant(rows["word"][ids], emb["word"]["scale"], emb["act1"], 16,
                     identity=np.broadcast_to(rows["token_type"][0], (len(ids),
                                                                      rows["word"].shape[1])),
                     identity_scale=emb["token_type"]["scale"])
    x, s = _record(trace, "act1", *g.requant(x, s, emb["act1"], 16,
                                             identity=rows["position"][:len(ids)],
                                             identity_scale=emb["position"]["scale"]))
    x, s = _record(trace, "ln", *layernorm(x, s, emb["ln"]))
    return _record(trace, "out", *g.requant(x, s, emb["out"], 8))


def sentence_embedding(ids, params, layers=None):
    """The integer MiniLM on one sentence's token ids (``[CLS] ... [SEP]``, int64 (M,)):
    :func:`embed` (integer, from the quantised tables), :func:`encode`, then on the host the
    dequantised mean over the M token rows, L2-normalised (float64 (H,))."""
    q, s = embed(ids, params["embeddings"])
    q, s = encode(q, s, params, layers)
    pooled = q.astype(np.float64).mean(axis=0) * float(s)
    return pooled / np.linalg.norm(pooled)
