"""``hwgen dataset ralm-keys``: a real retrieval data set, SmolLM2-135M's kNN-LM keys.

The Chameleon paper notes that trained RALM vector data sets are not available online. Here
they are made offline: every token of the offline corpora (the papers, the Lee corpus, the
Wikipedia extract, pydoc, then the standard library's docstrings and comments, in that order,
until ``tokens`` keys) is run through SmolLM2-135M (:mod:`hwgen.ralm.lm`, one forward pass per
passage) and the state before the LM head (576-d, float32) is its key, the next token its
value: the datastore a kNN-LM (and ChamLM) searches.

Held out: one document in :data:`HELDOUT_EVERY` (a document is a passage's source up to its
last ``/``: one Wikipedia article, one Lee document, one paper section, one module) never
enters the base; query keys are drawn at random from the tokens of those held-out documents
that lie among the base's (so the queries mix the corpora as the base does). The ground
truth is exact: faiss ``IndexFlatL2`` over the float32 base, the ``gt_k`` nearest per query.

Files in ``DIR``: ``base.npy`` float32 ``(N, 576)``, ``base_int8.npy`` (the node's 8-bit
integers: one scale mapping the 99.9th percentile of ``|key|`` to 127, saturated),
``values.npy`` int64 next tokens, ``queries.npy`` / ``queries_int8.npy`` (same scale),
``gt.npy`` int64 ``(Q, gt_k)``, and ``meta.json`` (the mix per corpus, the scale, build and
ground-truth seconds, the parameters). Keys are written in parts of :data:`PART_TOKENS` under
``DIR/parts/`` as they are made, so an interrupted build resumes where it stopped; a finished
``DIR`` with the same parameters is returned as it is (cached).
"""

import json
import os
import time
from pathlib import Path

import numpy as np

from ..errors import ConfigError

__all__ = ["build_ralm_keys", "corpus_of", "document_of", "split_documents", "DEFAULT_CORPUS",
           "HELDOUT_EVERY", "PART_TOKENS", "FORMAT"]

DEFAULT_CORPUS = "all+pysource"
HELDOUT_EVERY = 10
PART_TOKENS = 50_000
FORMAT = 1


def document_of(source):
    """The document a passage belongs to: its source up to the last ``/``."""
    return source.rsplit("/", 1)[0]


def split_documents(passages, every=HELDOUT_EVERY):
    """``(base passages, held-out passages)``: the documents in order of first appearance,
    every ``every``-th held out whole."""
    order = {}
    for p in passages:
        order.setdefault(document_of(p.source), len(order))
    held = [p for p in passages if order[document_of(p.source)] % every == every - 1]
    base = [p for p in passages if order[document_of(p.source)] % every != every - 1]
    return base, held


def corpus_of(source):
    """The corpus a passage comes from: its source up to the first ``/``."""
    return source.split("/", 1)[0]


def _encode(model, passage):
    """``(keys (t, dim) float32, next tokens (t,))`` of one passage, or None if too short."""
    ids = model.tokenizer.encode(passage.text)[:model.config.context]
    if len(ids) < 2:
        return None
    _, hidden = model.forward(ids, logits=False)
    return np.asarray(hidden[:-1], dtype=np.float32), np.asarray(ids[1:], dtype=np.int64)


class _Progress:
    """A line every few seconds: tokens done, rate, time left."""

    def __init__(self, total, log, what):
        self.total, self.log, self.what = total, log, what
        self.start = self.last = time.monotonic()

    def __call__(self, done, force=False):
        now = time.monotonic()
        if self.log is None or (not force and now - self.last < 10):
            return
        self.last = now
        rate = done / max(now - self.start, 1e-9)
        left = (self.total - done) / rate if rate > 0 else float("inf")
        self.log(f"{self.what}: {done:,} / {self.total:,} tokens ({100 * done / self.total:.0f}%), "
                 f"{rate:.0f} tokens/s, about {left / 60:.0f} min left")


def _parts_done(parts_dir):
    """Parts written so far, in order, and the passage index after the last one."""
    parts = sorted(parts_dir.glob("part-*.npz"))
    resume = 0
    for path in parts:
        with np.load(path, allow_pickle=False) as z:
            resume = int(z["next_passage"])
    return parts, resume


def _write_part(parts_dir, number, keys, values, counts, next_passage, seconds):
    tmp = parts_dir / f"part-{number:05d}.tmp.npz"
    np.savez(tmp, keys=np.concatenate(keys), values=np.concatenate(values),
             next_passage=np.int64(next_passage), seconds=np.float64(seconds),
             corpora=np.frombuffer(json.dumps(counts).encode(), np.uint8))
    os.replace(tmp, parts_dir / f"part-{number:05d}.npz")


def _base_keys(model, passages, tokens, parts_dir, log):
    """Keys of the first ``tokens`` tokens of ``passages``, written part by part (resumed)."""
    parts_dir.mkdir(parents=True, exist_ok=True)
    parts, start = _parts_done(parts_dir)
    done = 0
    for path in parts:
        with np.load(path, allow_pickle=False) as z:
            done += len(z["values"])
    if parts and log:
        log(f"ralm-keys: resuming after {done:,} tokens in {len(parts)} parts")
    progress = _Progress(tokens, log, "ralm-keys")
    keys, values, counts, pending = [], [], {}, 0
    index, since = start, time.monotonic()
    while done < tokens and index < len(passages):
        p = passages[index]
        index += 1
        got = _encode(model, p)
        if got is None:
            continue
        k, v = got
        take = min(len(v), tokens - done)
        keys.append(k[:take])
        values.append(v[:take])
        corpus = corpus_of(p.source)
        counts[corpus] = counts.get(corpus, 0) + take
        done += take
        pending += take
        progress(done)
        if pending >= PART_TOKENS or done >= tokens:
            _write_part(parts_dir, len(parts), keys, values, counts, index,
                        time.monotonic() - since)
            parts.append(parts_dir / f"part-{len(parts):05d}.npz")
            keys, values, counts, pending, since = [], [], {}, 0, time.monotonic()
    if keys:
        _write_part(parts_dir, len(parts), keys, values, counts, index, time.monotonic() - since)
        parts.append(parts_dir / f"part-{len(parts):05d}.npz")
    progress(done, force=True)
    if done < tokens:
        raise ConfigError("tokens", f"the corpus holds {done:,} tokens outside its held-out "
                          "documents; ask for at most that many", value=tokens)
    return sorted(parts_dir.glob("part-*.npz"))


def _gather(parts):
    """``(keys, values, tokens per corpus, seconds of encoding)`` of the parts."""
    keys, values, mix, seconds = [], [], {}, 0.0
    for path in parts:
        with np.load(path, allow_pickle=False) as z:
            keys.append(z["keys"])
            values.append(z["values"])
            seconds += float(z["seconds"])
            for corpus, n in json.loads(z["corpora"].tobytes().decode()).items():
                mix[corpus] = mix.get(corpus, 0) + n
    return np.concatenate(keys), np.concatenate(values), mix, seconds


def _query_keys(model, held, queries, seed):
    """``queries`` keys drawn at random from the tokens of the held-out passages (passages in
    a seeded random order, encoded until four times as many tokens are at hand)."""
    rng = np.random.default_rng(seed)
    pool = []
    have = 0
    for i in rng.permutation(len(held)):
        got = _encode(model, held[i])
        if got is None:
            continue
        pool.append(got[0])
        have += len(got[0])
        if have >= 4 * queries:
            break
    pool = np.concatenate(pool) if pool else np.zeros((0, model.config.dim), np.float32)
    if len(pool) < queries:
        raise ConfigError("queries", f"the held-out documents hold {len(pool):,} tokens",
                          value=queries)
    return pool[np.sort(rng.choice(len(pool), size=queries, replace=False))]


def _ground_truth(base, queries, k):
    from ..vecsearch.ivfpq import import_faiss
    faiss = import_faiss()
    index = faiss.IndexFlatL2(base.shape[1])
    index.add(np.ascontiguousarray(base))
    _, ids = index.search(np.ascontiguousarray(queries), k)
    return ids.astype(np.int64)


def build_ralm_keys(out_dir, tokens, *, corpus=DEFAULT_CORPUS, queries=1000, gt_k=100,
                    seed=0, model=None, log=None):
    """Build (or find cached) the data set in ``out_dir``; returns its ``meta.json`` dict."""
    from ..espn.host.corpus import load as load_corpus
    from . import lm
    from .knnlm import quantize_keys
    for name, value, low in (("tokens", tokens, 2), ("queries", queries, 1), ("k", gt_k, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ConfigError(name, f"must be an integer >= {low}", value=value)
    if gt_k > tokens:
        raise ConfigError("k", f"must be at most --tokens ({tokens})", value=gt_k)
    out = Path(out_dir)
    params = {"format": FORMAT, "tokens": tokens, "corpus": corpus, "queries": queries,
              "gt_k": gt_k, "seed": seed, "heldout_every": HELDOUT_EVERY}
    meta_path = out / "meta.json"
    if meta_path.exists():
        meta = json.loads(meta_path.read_text())
        if meta.get("params") == params:
            if log:
                log(f"ralm-keys: cached in {out} ({meta['tokens']:,} keys, built in "
                    f"{meta['build_seconds']:.0f} s)")
            return meta
        meta_path.unlink()
    out.mkdir(parents=True, exist_ok=True)
    parts_dir = out / "parts"
    stamp = parts_dir / "params.json"
    if stamp.exists() and json.loads(stamp.read_text()) != params:
        for path in parts_dir.glob("part-*.npz"):
            path.unlink()
    parts_dir.mkdir(parents=True, exist_ok=True)
    stamp.write_text(json.dumps(params))
    model = model or lm.load()
    passages = load_corpus(corpus)
    base_p, held_p = split_documents(passages)
    parts = _base_keys(model, base_p, tokens, parts_dir, log)
    base, values, mix, encode_s = _gather(parts)
    # queries from the held-out documents that lie among the base's (the same mix of corpora)
    _, used = _parts_done(parts_dir)
    position = {id(p): i for i, p in enumerate(passages)}
    end = position[id(base_p[used - 1])]
    held_p = [p for p in held_p if position[id(p)] < end] or held_p
    t = time.monotonic()
    qkeys = _query_keys(model, held_p, queries, seed)
    build_s = encode_s + time.monotonic() - t
    if log:
        log(f"ralm-keys: {len(base):,} keys and {queries} query keys in {build_s:.0f} s of "
            f"encoding; exact ground truth (faiss IndexFlatL2, k {gt_k}) ...")
    t = time.monotonic()
    gt = _ground_truth(base, qkeys, gt_k)
    gt_s = time.monotonic() - t
    base_i, inv_scale = quantize_keys(base, 8)
    query_i, _ = quantize_keys(qkeys, 8, inv_scale)
    for name, array in (("base", base), ("base_int8", base_i.astype(np.int8)),
                        ("values", values), ("queries", qkeys),
                        ("queries_int8", query_i.astype(np.int8)), ("gt", gt)):
        np.save(out / f"{name}.npy", array)
    meta = {"params": params, "tokens": int(len(base)), "dim": int(base.shape[1]),
            "mix": mix, "heldout_documents_every": HELDOUT_EVERY,
            "heldout_passages": len(held_p), "queries": queries, "gt_k": gt_k,
            "int8_inv_scale": inv_scale, "model": "SmolLM2-135M-Instruct Q4_1 (GGUF)",
            "build_seconds": build_s, "gt_seconds": gt_s,
            "files": ["base.npy", "base_int8.npy", "values.npy", "queries.npy",
                      "queries_int8.npy", "gt.npy"]}
    tmp = out / "meta.tmp.json"
    tmp.write_text(json.dumps(meta, indent=2) + "\n")
    os.replace(tmp, meta_path)
    return meta
