"""Golden model, data set preparation and stimulus of the ChamVS node.

:func:`prepare` turns a data set into everything the node needs: an integer IVF-PQ index trained
by faiss (:mod:`hwgen.vecsearch.ivfpq`), its packing into memory channels
(:mod:`hwgen.vecsearch.layout`) and the queries with their probed lists from faiss's coarse
quantizer. :func:`node_search` is the node's golden model: bit-exact, including the assignment
of codes to PQ units, the tags that break distance ties, and the approximate K-selection.
"""

import zipfile
from dataclasses import dataclass

import numpy as np

from ..errors import ConfigError
from ..flow.model import SimOption, StreamModel
from . import golden
from .ivfpq import import_faiss, quantize_vectors, train_integer_ivfpq
from .layout import pack_index, split_lists

__all__ = ["NodeData", "Shard", "node_data", "prepare", "node_search", "recall_at",
           "ChamVSNodeModel", "load_vectors"]

QUERY_POOL = 200     #: digits vectors held out of the base as queries


@dataclass
class NodeData:
    """A data set prepared for a node configuration."""
    base: object              # (n, D) int64, or None when only a shard is known
    queries: np.ndarray       # (q, D) int64
    index: object             # IntegerIVFPQ (or a shard: coarse, pq_centroids, lists)
    layout: object            # NodeLayout
    placed: list              # per list, per channel: (codes, ids)
    probes: np.ndarray        # (q, nprobe) int64
    scale: float              # float -> integer scale (1.0 for integer data)
    name: str


@dataclass
class Shard:
    """The part of an index one node holds: centroids and its share of every list."""
    coarse: np.ndarray
    pq_centroids: np.ndarray
    list_codes: list
    list_ids: list


def node_data(config, shard, queries, probes, name="shard"):
    """Pack a shard for ``config`` and pair it with queries (no ground truth)."""
    c = config
    layout = pack_index(shard.list_codes, shard.list_ids, channels=c.n_channels,
                        word_bytes=c.word_bytes, m=c.m, id_bytes=c.id_bytes)
    placed = split_lists(shard.list_codes, shard.list_ids, c.n_channels)
    return NodeData(None, np.asarray(queries, dtype=np.int64), shard, layout, placed,
                    np.asarray(probes, dtype=np.int64), 1.0, name)


def load_vectors(path, what):
    """A 2-D array of at least one non-empty row from an ``.npy`` file, with errors naming the
    option: float32 for real values (quantised later), int64 for integers (used as they are,
    e.g. ``hwgen dataset digits-syn``); no pickled objects."""
    try:
        x = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:
        reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e).split("\n")[0]
        raise ConfigError(what, f"cannot read as .npy: {reason}", value=str(path)) from None
    if not isinstance(x, np.ndarray):
        raise ConfigError(what, "holds several arrays (.npz); give one .npy array",
                          value=str(path))
    if x.dtype.kind not in "iuf":
        raise ConfigError(what, f"must hold real numbers (integer or float), not {x.dtype}",
                          value=str(path))
    if x.ndim != 2:
        raise ConfigError(what, f"must be a 2-D array (vectors x dimensions), got shape "
                          f"{x.shape}", value=str(path))
    if 0 in x.shape:
        raise ConfigError(what, f"is empty (shape {x.shape})", value=str(path))
    if x.dtype.kind in "iu":        # integer vectors are used as they are (no quantisation)
        if x.size and (x.min() < -2**31 or x.max() >= 2**31):
            raise ConfigError(what, "holds integers beyond 32 bits", value=str(path))
        return x.astype(np.int64)
    with np.errstate(over="ignore"):
        x = x.astype(np.float32)
    if not np.all(np.isfinite(x)):
        raise ConfigError(what, "holds NaN or infinite values (or values beyond float32)",
                          value=str(path))
    return x


def prepare(config, *, base=None, queries=None, nprobe=None, count=20, rng=None, seed=1234):
    """Data set, trained integer index, node memory images and probed lists.

    ``base``/``queries``: float arrays (a user's vectors, quantised to ``elem_bits`` with one
    scale) or integer arrays (used as they are), or None for the digits data set (the last 200
    vectors are the query pool; ``queries`` alone replaces that pool). ``count`` queries are
    drawn from the pool with ``rng``.
    """
    from ..datasets import digits
    c = config
    if base is None and queries is not None:
        raise ConfigError("queries", "needs --base (the default digits data set brings its "
                          "own queries)")
    if base is None:
        x, _ = digits()
        base_i, pool, scale, name = x[:-QUERY_POOL], x[-QUERY_POOL:], 1.0, "digits"
    elif np.issubdtype(base.dtype, np.integer):
        base_i, scale, name = base.astype(np.int64), 1.0, "integer vectors"
        if queries is not None and not np.issubdtype(queries.dtype, np.integer):
            raise ConfigError("queries", "hold real numbers but the base holds integers "
                              "(used without quantisation): give integer queries")
        pool = queries.astype(np.int64) if queries is not None else digits()[0][-QUERY_POOL:]
        if pool.shape[1] != base_i.shape[1]:
            raise ConfigError("queries", f"dimension {pool.shape[1]} differs from the base's "
                              f"{base_i.shape[1]}" + ("" if queries is not None else
                                                      " (the digits queries: give --queries)"))
    else:
        if queries is None:
            raise ConfigError("queries", "--queries is needed with --base")
        if queries.shape[1] != base.shape[1]:
            raise ConfigError("queries", f"dimension {queries.shape[1]} differs from the "
                              f"base's {base.shape[1]}")
        base_i, scale = quantize_vectors(base, c.elem_bits)
        pool, _ = quantize_vectors(queries, c.elem_bits, scale)
        name = "user vectors"
    if base_i.shape[1] != c.dim:
        raise ConfigError("dim", f"must equal the data's dimension {base_i.shape[1]}",
                          value=c.dim)
    nprobe = c.nprobe_max if nprobe is None else nprobe
    if not 1 <= nprobe <= min(c.nprobe_max, c.nlist):
        raise ConfigError("nprobe", f"must be in 1..{min(c.nprobe_max, c.nlist)}", value=nprobe)
    if not 1 <= count <= len(pool):
        raise ConfigError("items", f"queries to run (--items / --queries-count) must be in "
                          f"1..{len(pool)}: the query set of the {name} holds {len(pool)} "
                          "vectors", value=count)
    rng = rng if rng is not None else np.random.default_rng(seed)
    pick = np.sort(rng.choice(len(pool), size=count, replace=False))
    queries_i = pool[pick]
    index = train_integer_ivfpq(base_i, nlist=c.nlist, m=c.m, elem_bits=c.elem_bits, seed=seed)
    longest = max(len(ids) for ids in index.list_ids)
    seg_words = -(-(-(-longest // c.n_channels)) // c.codes_per_word)
    if seg_words > (1 << c.segment_bits):
        raise ConfigError("segment_bits", f"a list needs {seg_words} words per channel; "
                          f"raise segment_bits to {max(1, (seg_words - 1).bit_length())}",
                          value=c.segment_bits)
    layout = pack_index(index.list_codes, index.list_ids, channels=c.n_channels,
                        word_bytes=c.word_bytes, m=c.m, id_bytes=c.id_bytes)
    placed = split_lists(index.list_codes, index.list_ids, c.n_channels)
    probes = index.probe(queries_i, nprobe)
    return NodeData(base_i, queries_i, index, layout, placed, probes, scale, name)


def _tag_shifts(config):
    """Bit offset of each tag field (lane, word, probe, channel)."""
    shifts, shift = {}, 0
    for name, bits in config.tag_fields:
        shifts[name] = shift
        shift += bits
    return shifts


def node_search(config, data, query, probes):
    """The node's result for one query: ``(distances, ids, tags)``, ascending by
    (distance, tag), exactly as the hardware computes it."""
    c = config
    cpw, sh = c.codes_per_word, _tag_shifts(c)
    streams = [([], []) for _ in range(c.units)]
    scanned_tags, scanned_ids = [], []
    for p, lst in enumerate(probes):
        lut = golden.build_lut(query - data.index.coarse[lst], data.index.pq_centroids,
                               c.lut_shift, c.lut_bits)
        for ch in range(c.n_channels):
            codes, ids = data.placed[lst][ch]
            if not len(codes):
                continue
            dists = golden.pq_distances(codes, lut)
            i = np.arange(len(codes), dtype=np.int64)
            lane = i % cpw
            tags = (lane << sh["lane"]) | ((i // cpw) << sh["word"]) | (p << sh["probe"]) \
                | (ch << sh["channel"])
            for ln in range(min(cpw, len(codes))):      # stream order: scan order per lane
                streams[ch * cpw + ln][0].append(dists[ln::cpw])
                streams[ch * cpw + ln][1].append(tags[ln::cpw])
            scanned_tags.append(tags)
            scanned_ids.append(np.asarray(ids, dtype=np.int64))
    ks = c.kselect_config()
    empty = np.zeros(0, np.int64)
    d, t = golden.hier_topk([(np.concatenate(a).astype(np.int64) if a else empty,
                              np.concatenate(b).astype(np.int64) if b else empty)
                             for a, b in streams], c.k, ks.l1, ks.queues_per_stream)
    return d, _ids_of_tags(np.asarray(t, dtype=np.int64), scanned_tags, scanned_ids), t


def _ids_of_tags(found, tags, ids):
    """The vector ids of the ``found`` tags, given every scanned vector's tag (unique within a
    query: lane, word, probe and channel) and id."""
    if not len(found):
        return np.zeros(0, np.int64)
    tags, ids = np.concatenate(tags), np.concatenate(ids)
    order = np.argsort(tags, kind="stable")
    return ids[order[np.searchsorted(tags[order], found)]]


def exact_neighbours(base, queries, k):
    """Exact L2 ground truth (faiss IndexFlatL2 on the integer vectors)."""
    faiss = import_faiss()
    flat = faiss.IndexFlatL2(base.shape[1])
    flat.add(base.astype(np.float32))
    return flat.search(queries.astype(np.float32), k)[1]


def recall_at(found, truth, r):
    """Mean fraction of the true ``r`` nearest neighbours among the first ``r`` found ids."""
    hits = [len(set(f[:r].tolist()) & set(t[:r].tolist())) / r for f, t in zip(found, truth)]
    return float(np.mean(hits)) if hits else 0.0


class ChamVSNodeModel(StreamModel):
    """Stream-level model of the node for ``hwgen sim``: metadata streams, queries, memory
    images and golden results, from the digits data set or a user's vectors."""

    result_port = "o_result"
    latency_from = "i_query"
    sim_options = (
        SimOption("base", ".npy database vectors, float or integer (default: the digits data "
                  "set)", kind="path"),
        SimOption("queries", ".npy query vectors (needs --base)", kind="path"),
        SimOption("queries_count", "queries to run (= --items)", route="items"),
        SimOption("nprobe", "lists probed per query (default: the configuration's "
                  "nprobe_max)"),
        SimOption("nlist", "IVF lists (= --set nlist=N)", route="set"),
        SimOption("k", "results per query (= --set k=N)", route="set"),
        SimOption("m", "PQ sub-spaces (= --set m=N)", route="set"),
    )
    #: queries are bounded by the data: no memory trial
    memory_trial = False
    sample_signals = ("stat_cycles", "stat_lut", "stat_scan", "stat_drain", "stat_words",
                      "stat_starve", "stat_wait")

    @staticmethod
    def sim_sets(options, sets):
        """``--base`` sets the vector dimension from the file unless ``--set dim=`` does."""
        if options.get("base") is None or any(s.startswith("dim=") for s in sets):
            return []
        return [f"dim={load_vectors(options['base'], 'base').shape[1]}"]

    @staticmethod
    def stimulus(config, items, rng, base=None, queries=None, nprobe=None):
        """``{"data": NodeData, "results": list}``: :func:`prepare` of the digits data set, or of
        ``base``/``queries`` (``.npy`` paths or arrays), with ``items`` queries drawn by ``rng`` and
        ``nprobe`` lists probed each (default ``nprobe_max``); ``results`` holds
        :func:`node_search`'s ``(distances, ids, tags)`` per query."""
        base = load_vectors(base, "base") if isinstance(base, str) else base
        queries = load_vectors(queries, "queries") if isinstance(queries, str) else queries
        data = prepare(config, base=base, queries=queries, nprobe=nprobe, count=items, rng=rng)
        results = [node_search(config, data, q, pr) for q, pr in zip(data.queries, data.probes)]
        return {"data": data, "results": results}

    @staticmethod
    def inputs(config, stim):
        """``i_pq``: ``m * 256`` beats, sub-space major, ``elem`` = one PQ centroid; ``i_coarse``:
        one beat per list, ``elem`` = its coarse centroid; ``i_table``: the layout's address-table
        entries (``code_word``, ``count``, ``id_word``; list major); ``i_query``: per query
        ``query``, ``nprobe`` and ``lists`` (the probed lists, 0-padded to ``nprobe_max``). No
        TLAST."""
        c, data = config, stim["data"]
        idx = data.index
        pad = np.zeros(c.nprobe_max, dtype=np.int64)
        queries = []
        for q, pr in zip(data.queries, data.probes):
            lists = pad.copy()
            lists[:len(pr)] = pr
            queries.append({"query": q.tolist(), "nprobe": len(pr), "lists": lists.tolist()})
        return {
            "i_pq": [{"elem": idx.pq_centroids[i, r].tolist()}
                     for i in range(c.m) for r in range(256)],
            "i_coarse": [{"elem": row.tolist()} for row in idx.coarse],
            "i_table": data.layout.table_entries(),
            "i_query": queries,
        }

    @staticmethod
    def expect(config, stim):
        """``o_result``: per query the ``(distances, ids)`` :func:`node_search` gave in
        :meth:`stimulus` (ascending by distance, then tag), as ``dist``/``id`` beats with ``last``
        on the query's final result."""
        out = []
        for d, ids, _ in stim["results"]:
            out += [{"dist": int(a), "id": int(b), "last": int(j == len(d) - 1)}
                    for j, (a, b) in enumerate(zip(d, ids))]
        return {"o_result": out}

    @staticmethod
    def memories(config, stim):
        return {f"m_axi_ch{ch}": image for ch, image in enumerate(stim["data"].layout.images)}

    @staticmethod
    def cycles_bound(config, stim):
        data = stim["data"]
        words = sum(data.layout.words(l, ch) for pr in data.probes for l in pr
                    for ch in range(config.n_channels))
        per_query = 256 * config.lut_config().steps * (config.nprobe_max + 1) + 4 * config.k \
            + 8 * config.units * config.kselect_config().l1 + 500
        return 4 * words + len(data.queries) * per_query + 256 * config.m + config.nlist

    @staticmethod
    def report(config, stim, summary, samples):
        """Recall and agreement with faiss (where the base is known: not for a shard served by
        a node), per-query cycle breakdown and scan efficiency."""
        data = stim["data"]
        out = {}
        if data.base is not None:
            found = np.array([ids for _, ids, _ in stim["results"]], dtype=object)
            k = config.k
            truth = exact_neighbours(data.base, data.queries, max(k, 1))
            index = data.index.index
            index.nprobe = data.probes.shape[1]
            _, faiss_ids = index.search(data.queries.astype(np.float32), k)
            rec = {f"recall@{r}": recall_at(found, truth, r) for r in (1, 10, 100) if r <= k}
            rec_faiss = {f"recall@{r}": recall_at(faiss_ids, truth, r) for r in (1, 10, 100)
                         if r <= k}
            same = float(np.mean([set(f.tolist()) == set(g.tolist())
                                  for f, g in zip(found, faiss_ids)]))
            out = {"dataset": data.name, "queries": len(data.queries),
                   "nprobe": int(data.probes.shape[1]), "recall": rec, "faiss_recall": rec_faiss,
                   "identical_topk_fraction": same}
        if samples:
            cols = {name: np.array([s[name] for s in samples], dtype=np.int64)
                    for name in ChamVSNodeModel.sample_signals}
            words, starve = cols["stat_words"].sum(), cols["stat_starve"].sum()
            codes = sum(data.layout.words(l, ch) for pr in data.probes for l in pr
                        for ch in range(config.n_channels)) * config.codes_per_word
            out["per_query_cycles"] = {
                "total": float(cols["stat_cycles"].mean()),
                "lut": float(cols["stat_lut"].mean()),
                "scan": float(cols["stat_scan"].mean()),
                "drain": float(cols["stat_drain"].mean())}
            out["scan_efficiency"] = float(words / (words + starve)) if words else 0.0
            out["scan_codes_per_cycle"] = float(codes / cols["stat_scan"].sum())
            out["scan_limit_codes_per_cycle"] = config.units
            out["per_query_stats"] = [{k2: int(v[i]) for k2, v in cols.items()}
                                      for i in range(len(samples))]
        return out

    @staticmethod
    def report_lines(config, result):
        """Recall of the node and of faiss, the share of identical top-k lists and, with the
        performance counters, the per-query cycle breakdown (none for a shard without ground
        truth)."""
        if "recall" not in result:
            return []
        r = result
        recall = ", ".join(f"{key} {val:.3f}" for key, val in r["recall"].items())
        faiss = ", ".join(f"{key} {val:.3f}" for key, val in r["faiss_recall"].items())
        lines = [f"  {r['dataset']}, {r['queries']} queries, nprobe {r['nprobe']}: node "
                 f"{recall}; faiss IndexIVFPQ {faiss}; identical top-k ids in "
                 f"{100 * r['identical_topk_fraction']:.1f}% of queries"]
        if "per_query_cycles" in r:
            pq = r["per_query_cycles"]
            lines.append(f"  cycles per query: {pq['total']:.0f} (LUT {pq['lut']:.0f}, scan "
                         f"{pq['scan']:.0f}, drain {pq['drain']:.0f}); scan efficiency "
                         f"{r['scan_efficiency']:.3f} (memory-side), "
                         f"{r['scan_codes_per_cycle']:.2f} codes/cycle of "
                         f"{r['scan_limit_codes_per_cycle']} while scanning")
        return lines
