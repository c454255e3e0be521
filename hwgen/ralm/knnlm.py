"""A kNN-LM whose neighbours come from ChamVS memory nodes over TCP (the retrieval-every-token
model family of Chameleon's Dec-S; Khandelwal et al.'s kNN-LM).

**Datastore** (:func:`build_datastore`): for every token of a corpus's passages (one forward
pass per passage, :mod:`hwgen.ralm.lm`), the key is the decoder's state before the LM head
at that position and the value is the next token; each entry remembers its passage, whose text
is the neighbour's snippet.

**Index** (:func:`make_index`): keys quantised to the node's signed ``elem_bits`` integers with
one multiplier ``inv_scale`` (:mod:`hwgen.lib.quant`: integers per key unit, the reciprocal of
the step; taken at the 99.9th percentile of ``|key|``, so that the few outlier components of a
transformer's state do not flatten the rest; larger ones saturate), faiss IVF-PQ trained in
ChamVS's integer form and written as node shards
(:func:`hwgen.vecsearch.host.shard.make_shards`), split over ``nodes`` node processes
(:mod:`hwgen.vecsearch.host.node_server`, golden backend by default).

**Retrieval** (:class:`Retriever`): the query is quantised with the same multiplier, probed against
the shards' integer coarse centroids (nearest ``nprobe`` lists, as faiss's coarse quantizer
does), and sent to every node through :class:`~hwgen.vecsearch.host.coordinator.Coordinator`, which
merges their top-K. A node that fails is left out by the coordinator; when no node answers the
result is empty and the model goes on with the LM alone.

**Interpolation** (:func:`knn_distribution`, :func:`interpolate`): ``p_kNN(w)`` is the softmax of
``-d / T`` over the K neighbours (``d`` the node's integer squared L2 distance divided by
``inv_scale**2``, i.e. in the key's units), summed per value token; the next-token distribution is
``λ·p_kNN + (1−λ)·p_LM``. Every ``interval`` tokens a retrieval is made with the current state;
between retrievals the last retrieved neighbours are **followed in their own passages**
(:func:`follow`: ``j`` tokens after a retrieval, neighbour entry ``i`` stands for entry
``i + j``, so its value is the token that came ``j`` tokens later in the neighbour's text;
RetoMaton's pointers, Alon et al. 2022), with their retrieval distances. A neighbour whose
passage has ended drops out. With interval 1 this is the plain kNN-LM. (Reusing the last
retrieval's next tokens unchanged, measured first, raised perplexity above the LM's alone at
intervals 8 and 64: 42.4 and 43.8 against 41.0.)
"""

import functools
import hashlib
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import ConfigError, ToolError

__all__ = ["Datastore", "build_datastore", "make_index", "Retriever", "knn_distribution",
           "interpolate", "quantize_keys"]


@dataclass
class Datastore:
    """``keys`` float32 ``(n, dim)``; ``values`` int64 ``(n,)`` next tokens; ``passage`` int32
    ``(n,)`` index into ``texts`` / ``sources``."""
    keys: np.ndarray
    values: np.ndarray
    passage: np.ndarray
    texts: list
    sources: list

    def save(self, path):
        """Write the datastore to ``path`` (one ``.npz``; written to a temporary file, then
        renamed)."""
        path = Path(path)
        tmp = path.with_suffix(".tmp.npz")
        np.savez(tmp, keys=self.keys, values=self.values, passage=self.passage,
                 meta=np.frombuffer(json.dumps({"texts": self.texts,
                                                "sources": self.sources}).encode(), np.uint8))
        os.replace(tmp, path)

    @classmethod
    def load(cls, path):
        """The datastore :meth:`save` wrote to ``path``."""
        with np.load(path, allow_pickle=False) as z:
            meta = json.loads(z["meta"].tobytes().decode())
            return cls(z["keys"], z["values"], z["passage"], meta["texts"], meta["sources"])


def build_datastore(model, passages, max_tokens=None, log=None):
    """Keys and values for every token of ``passages`` (:class:`~hwgen.espn.host.corpus.Passage`
    or ``(text, source)``), at most ``max_tokens`` entries; progress lines to ``log``."""
    keys, values, owner, texts, sources = [], [], [], [], []
    total, start, last = 0, time.monotonic(), 0.0
    for text, source in ((getattr(p, "text", None) or p[0], getattr(p, "source", None) or p[1])
                         for p in passages):
        ids = model.tokenizer.encode(text)[:model.config.context]
        if len(ids) < 2:
            continue
        if max_tokens is not None:
            ids = ids[:max_tokens - total + 1]
            if len(ids) < 2:
                break
        _, hidden = model.forward(ids, logits=False)
        keys.append(hidden[:-1])
        values.append(np.asarray(ids[1:], dtype=np.int64))
        owner.append(np.full(len(ids) - 1, len(texts), dtype=np.int32))
        texts.append(text)
        sources.append(source)
        total += len(ids) - 1
        now = time.monotonic()
        if log and now - last > 5:
            last = now
            log(f"datastore: {total} tokens from {len(texts)} passages, "
                f"{total / (now - start):.0f} tokens/s")
        if max_tokens is not None and total >= max_tokens:
            break
    if not keys:
        raise ConfigError("corpus", "holds no passage of two or more tokens")
    return Datastore(np.concatenate(keys).astype(np.float32), np.concatenate(values),
                     np.concatenate(owner), texts, sources)


def quantize_keys(keys, elem_bits, inv_scale=None, percentile=99.9):
    """``(int64 keys, inv_scale)``: ``round(key * inv_scale)`` saturated to signed ``elem_bits``
    (:func:`~hwgen.vecsearch.ivfpq.quantize_vectors`; ``inv_scale`` is the multiplier, the
    reciprocal of :mod:`hwgen.lib.quant`'s step ``scale``); it defaults to the factor that maps
    the ``percentile`` of ``|key|`` (not its maximum) to the largest integer."""
    from ..vecsearch.ivfpq import quantize_vectors
    if inv_scale is None:
        keys = np.asarray(keys, dtype=np.float64)
        peak = float(np.percentile(np.abs(keys), percentile)) if keys.size else 0.0
        inv_scale = ((1 << (elem_bits - 1)) - 1) / peak if peak > 0 else 1.0
    ints, inv_scale = quantize_vectors(keys, elem_bits, inv_scale)
    return ints, float(inv_scale)


def make_index(datastore, out_dir, nodes=2, nlist=64, m=32, nprobe=8, k=16, elem_bits=8,
               log=None):
    """Node shards of ``datastore`` in ``out_dir`` (``node0.npz`` ...) plus ``index.json``
    (the keys' multiplier ``inv_scale``, the softmax temperature of :func:`calibrate_temperature` and the node
    configuration); returns the shard paths."""
    from ..vecsearch.node import ChamVSNodeConfig
    from ..vecsearch.host.shard import make_shards
    config = ChamVSNodeConfig(dim=int(datastore.keys.shape[1]), m=m, nlist=nlist,
                              nprobe_max=nprobe, k=k, elem_bits=elem_bits)
    ints, inv_scale = quantize_keys(datastore.keys, elem_bits)
    paths = make_shards(config, ints, nodes, "split-lists", out_dir, log=log)
    (Path(out_dir) / "index.json").write_text(json.dumps(
        {"inv_scale": inv_scale, "temperature": calibrate_temperature(datastore.keys),
         "config": config.to_dict(), "nodes": nodes, "entries": int(len(datastore.values))}))
    return paths


class Retriever:
    """``nodes`` node processes serving the shards of ``index_dir`` and a coordinator to them.

    ``search(states)`` -> ``(distances, ids, result)`` for float states ``(q, dim)``:
    ``distances`` float (key units, squared), ``ids`` int datastore entries, -1 padded where a
    node was missing; ``result`` the coordinator's
    :class:`~hwgen.vecsearch.host.coordinator.SearchResult`.
    Use as a context manager; :meth:`close` stops the processes."""

    def __init__(self, index_dir, backend="golden", timeout=10.0, nprobe=None, addresses=None):
        from ..vecsearch.host.coordinator import Coordinator
        from ..vecsearch.host.shard import load_shard
        index_dir = Path(index_dir)
        try:
            info = json.loads((index_dir / "index.json").read_text())
            # "scale": the key name of index files written before the multiplier was named
            self.inv_scale = float(info["inv_scale"] if "inv_scale" in info else info["scale"])
            self.temperature = float(info.get("temperature", 1.0))
            nodes = int(info["nodes"])
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise ConfigError("index", f"no readable index.json ({type(e).__name__}: {e})",
                              value=str(index_dir)) from None
        if not (self.inv_scale > 0 and self.temperature > 0 and nodes >= 1):
            raise ConfigError("index", "index.json needs inv_scale > 0, temperature > 0 and "
                              "nodes >= 1", value=str(index_dir))
        self.shard_paths = paths = [index_dir / f"node{i}.npz" for i in range(nodes)]
        self.config, shard = load_shard(paths[0])
        self.coarse = np.asarray(shard.coarse, dtype=np.float32)
        self.nprobe = nprobe or self.config.nprobe_max
        if not 1 <= self.nprobe <= min(self.config.nprobe_max, self.config.nlist):
            raise ConfigError("nprobe", f"must be in 1..{self.config.nprobe_max}",
                              value=self.nprobe)
        self.procs = []
        try:
            self.addresses = list(addresses) if addresses else \
                [self._start(p, backend, timeout) for p in paths]
            self.coordinator = Coordinator(self.addresses, timeout=timeout)
        except BaseException:
            self.close()
            raise

    def _start(self, path, backend, timeout):
        proc = subprocess.Popen([sys.executable, "-m", "hwgen.vecsearch.host.node_server",
                                 str(path), "--port", "0", "--backend", backend],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.procs.append(proc)
        line = proc.stdout.readline()
        if not line.startswith("listening on "):
            err = proc.stderr.read() if proc.poll() is not None else ""
            raise ToolError(f"node server for {path.name} did not start: {err.strip() or line}")
        return ("127.0.0.1", int(line.split()[-1]))

    def encode(self, states):
        """``(ints, probes)`` of float states: the node's integer queries and the ``nprobe``
        nearest lists of each (squared L2 to the integer coarse centroids)."""
        ints, _ = quantize_keys(np.atleast_2d(states), self.config.elem_bits, self.inv_scale)
        d = ((ints[:, None, :].astype(np.float64) - self.coarse[None]) ** 2).sum(-1)
        return ints, np.argsort(d, axis=1, kind="stable")[:, :self.nprobe]

    @functools.cached_property
    def local_services(self):
        """A :class:`~hwgen.vecsearch.host.node_server.NodeService` per shard in this process (for
        timing the node search and for the node's cycle model), built on first use."""
        from ..vecsearch.host.node_server import NodeService
        from ..vecsearch.host.shard import load_shard
        return [NodeService(*load_shard(p)) for p in self.shard_paths]

    @functools.cached_property
    def cpu_index(self):
        """CPU faiss ``IndexIVFPQ`` over every shard's lists with this retriever's ``nprobe``:
        the index the nodes search, for timing what a user would run instead (built on first
        use)."""
        from ..vecsearch.ivfpq import faiss_index
        shards = [sv.shard for sv in self.local_services]
        lists = range(self.config.nlist)
        index = faiss_index(
            shards[0].coarse, shards[0].pq_centroids,
            [np.concatenate([sh.list_ids[lst] for sh in shards]) for lst in lists],
            [np.concatenate([sh.list_codes[lst] for sh in shards]) for lst in lists])
        index.nprobe = self.nprobe
        return index

    def search(self, states):
        """The ``k`` nearest datastore entries of float ``states`` ``(q, dim)``: ``(distances, ids,
        result)`` as described in the class docstring (missing entries: distance ``inf``, id -1)."""
        ints, probes = self.encode(states)
        result = self.coordinator.search(ints, probes, self.config.k)
        return (*self.arrays(result, len(ints)), result)

    def arrays(self, result, queries):
        """``(distances, ids)`` ``(queries, k)`` of a coordinator result, as :meth:`search`
        returns them: distances in key units (squared), ``inf`` / ``-1`` where missing."""
        k = self.config.k
        dist = np.full((queries, k), np.inf)
        ids = np.full((queries, k), -1, dtype=np.int64)
        for q, (d, i) in enumerate(zip(result.distances, result.ids)):
            dist[q, :len(d)] = np.asarray(d, dtype=np.float64) / self.inv_scale ** 2
            ids[q, :len(i)] = i
        return dist, ids

    def kill_node(self, n):
        """Stop node ``n``'s process (tests of a node lost mid-generation)."""
        self.procs[n].kill()
        self.procs[n].wait()

    def close(self):
        """Close the coordinator and stop the node processes (terminate, then kill after 5 s)."""
        if getattr(self, "coordinator", None) is not None:
            self.coordinator.close()
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    p.kill()
            for f in (p.stdout, p.stderr):
                f.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def calibrate_temperature(keys, sample=256, seed=0):
    """The median squared L2 distance from a key to its nearest other key (``sample`` random
    keys against all): the default softmax temperature of :func:`knn_distribution`, so that
    ``exp(-d / T)`` neither picks one neighbour alone nor flattens them all."""
    keys = np.asarray(keys, dtype=np.float32)
    rng = np.random.default_rng(seed)
    pick = rng.choice(len(keys), size=min(sample, len(keys)), replace=False)
    sq = (keys ** 2).sum(1)
    d = sq[pick, None] + sq[None, :] - 2 * keys[pick] @ keys.T
    d[np.arange(len(pick)), pick] = np.inf
    d = np.where(d <= 1e-6 * sq.mean(), np.inf, d)        # exact duplicates of the key
    return float(np.median(np.min(d, 1)))


def knn_distribution(distances, ids, values, vocab, temperature=1.0):
    """``p_kNN`` ``(q, vocab)`` from neighbours ``ids`` (``-1``: none) at ``distances``:
    ``softmax(-d / T)`` summed per value token. A query without neighbours gets all zeros."""
    distances, ids = np.atleast_2d(distances), np.atleast_2d(ids)
    if temperature <= 0:
        raise ConfigError("temperature", "must be > 0", value=temperature)
    out = np.zeros((len(ids), vocab))
    for q in range(len(ids)):
        ok = ids[q] >= 0
        if not ok.any():
            continue
        s = -distances[q, ok] / temperature
        w = np.exp(s - s.max())
        np.add.at(out[q], values[ids[q, ok]], w / w.sum())
    return out


def follow(ids, steps, passage):
    """Neighbours ``ids`` (datastore entries, ``-1`` none) moved ``steps`` tokens on in their
    own passages: entry ``i`` becomes ``i + steps`` (the state ``steps`` tokens later in the
    same text, whose value is the token that followed there), or ``-1`` where the passage ends
    first. Between retrievals the model uses these (RetoMaton's pointers): the neighbours'
    own continuations, not their next tokens of ``steps`` tokens ago."""
    ids = np.asarray(ids, dtype=np.int64)
    if steps == 0:
        return ids
    moved = ids + steps
    ok = (ids >= 0) & (moved < len(passage))
    out = np.full_like(ids, -1)
    out[ok] = moved[ok]
    same = passage[np.where(ok, moved, 0)] == passage[np.where(ids >= 0, ids, 0)]
    out[~same] = -1
    return out


def interpolate(p_lm, p_knn, lam):
    """``λ·p_kNN + (1−λ)·p_LM`` per row; rows where ``p_kNN`` is all zero (nothing retrieved)
    keep ``p_LM``."""
    if not 0 <= lam <= 1:
        raise ConfigError("lambda", "must be in 0..1", value=lam)
    p_lm, p_knn = np.atleast_2d(p_lm), np.atleast_2d(p_knn)
    have = p_knn.sum(-1, keepdims=True) > 0
    return np.where(have, lam * p_knn + (1 - lam) * p_lm, p_lm)


def cache_key(*parts):
    """A 12-hex-digit digest of ``parts`` (JSON, keys sorted): names a cached datastore or index."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:12]
