"""``hwgen chamvs explore``: from a user's vectors and a recall goal to the fastest node that fits.

Two spaces are searched, the index's on the data and the node's with its models:

* **Index** (measured): for every ``nlist`` and ``m`` of the grid the node's own integer IVF-PQ
  index is trained (:func:`~hwgen.vecsearch.ivfpq.train_integer_ivfpq`, faiss with integer
  centroids), and for every ``nprobe`` faiss searches it for the queries: recall@R against the
  exact ground truth, the probed lists of every query and the lists' sizes. The node computes
  what this index computes (bit-exact up to ties at the K-th distance), so faiss's recall is the
  node's. A base larger than ``sample`` vectors is subsampled at random (seeded) and its ground
  truth recomputed exactly on the subsample (faiss ``IndexFlatL2``): recall then describes a
  database of that size, and the result says so.
* **Node** (modelled): for each index point, every channel count of the board, LUT-builder width
  (``lut_sub_par``: a row per cycle, 16 or 4 sub-spaces per cycle) and queue kind gives a
  :class:`~hwgen.vecsearch.node.ChamVSNodeConfig`; its cycles per query come from the cycle model
  (:func:`~hwgen.vecsearch.model.query_cycles`, held within 5% of the simulation) on the probed
  lists' real sizes (each of ``nodes`` nodes holding its share of every list), its clock from
  the board's kernel clock times the node's measured ``fmax_ratio``
  (:func:`~hwgen.flow.timing_table.measured_clock`), and its resources from the netlist
  estimate (:func:`hwgen.flow.resources.estimate`), compared with ``budget`` percent of the
  board. Resources are estimated only for designs on the QPS-recall front, fastest first.

The chosen design is the fastest that reaches the recall and fits; the front (recall against
QPS, each point coloured by its binding resource) is written as JSON and plotted. ``validate``
simulates the best designs on the native engine (a sample of the queries on the same base):
mismatches against the golden model and the model's error per query.

Resource estimates (an elaboration each, 10-20 s) run on the Dask sweep machinery
(:func:`hwgen.flow.sweep.dask_client`: a LocalCluster, or a scheduler's workers), in rounds: the
front of the designs not yet known to overflow is estimated, the overflowing dropped, until the
front is estimated or ``max_estimates`` are spent. The index search and the cycle model run in
this process (seconds); validation simulations too (one Verilator build each).

**OPQ.** With ``opq`` including True every (nlist, m) is also measured with OPQ: a rotation
trained by faiss (``OPQMatrix``, :func:`opq_rotation`) on the base for ``m`` sub-spaces. The
node has no rotation: the host rotates the base before sharding and every query before sending
(``x @ R.T``, then the node's 8-bit quantisation), so a design with ``opq`` searches exactly
what an index of the rotated vectors holds; L2 distances, and so the ground truth, are those of
the original vectors up to the 8-bit rounding. The rotation costs the host ``D x D``
multiply-adds per query (not in the node's QPS).

Not searched: the L1 queue lengths (sized by the binomial rule, ``l1_len = 0``). Validation
checks bit-exactness and cycles, and where yosys is installed maps each pick with ``synth_xilinx``
(about 2 minutes for a four-channel node) and checks the resource estimate the search used
against it, within the estimate's stated error
(:data:`hwgen.flow.resources.STATED_ERROR`).
"""

import gc
import math
import time
from dataclasses import dataclass, field
from types import SimpleNamespace

import numpy as np

from .. import registry
from ..boards import load_board
from ..errors import ConfigError
from ..flow.timing_table import measured_clock
from .baseline import simulate_sample
from .ivfpq import import_faiss, quantize_vectors, train_integer_ivfpq
from .model import layout_query_cycles
from .node import ChamVSNodeConfig
from .node_model import prepare, recall_at

__all__ = ["Goal", "parse_goal", "explore", "validate", "plot_front", "opq_rotation", "rotate",
           "refine_ids", "LUT_WIDTHS", "QUEUES", "OPQ", "REFINES"]

#: LUT builder sub-spaces per cycle searched (0: all, a row per cycle).
LUT_WIDTHS = (0, 16, 4)
QUEUES = ("insert", "systolic")
NPROBES = (1, 2, 4, 8, 16, 32, 64, 128)
MS = (8, 16, 32, 64)
#: Index settings measured without and with an OPQ rotation.
OPQ = (False, True)
#: Re-ranking factors searched: the node returns ``refine x R`` results and the host keeps the
#: ``R`` nearest by exact distance on the stored vectors (1: no re-ranking).
REFINES = (1, 4)


@dataclass(frozen=True)
class Goal:
    """Recall ``recall`` of the true ``at`` nearest neighbours among the first ``at`` found."""
    recall: float
    at: int

    def __str__(self):
        return f"{self.recall:g}@{self.at}"


def parse_goal(text):
    """``"0.9@10"`` -> :class:`Goal`; ConfigError naming ``recall`` otherwise."""
    try:
        value, at = str(text).split("@")
        goal = Goal(float(value), int(at))
    except ValueError:
        raise ConfigError("recall", "must look like 0.9@10 (recall @ neighbours)",
                          value=text) from None
    if not 0 < goal.recall <= 1 or not 1 <= goal.at <= 1024:
        raise ConfigError("recall", "needs a recall in (0, 1] and 1..1024 neighbours",
                          value=text)
    return goal


@dataclass
class IndexPoint:
    """One index setting measured: its recall, the lists' sizes and each query's probed lists."""
    nlist: int
    m: int
    nprobe: int
    recall: float
    sizes: np.ndarray = field(repr=False)
    probes: np.ndarray = field(repr=False)
    opq: bool = False
    refine: int = 1


def query_rows(n, max_queries, seed):
    """Rows of the queries explore uses: all ``n``, or ``max_queries`` drawn at random."""
    if n <= max_queries:
        return np.arange(n)
    return np.sort(np.random.default_rng(seed).choice(n, max_queries, replace=False))


def exact_truth(base, queries, at):
    """Ids of the ``at`` nearest base vectors of every query (faiss ``IndexFlatL2``)."""
    faiss = import_faiss()
    flat = faiss.IndexFlatL2(base.shape[1])
    flat.add(np.ascontiguousarray(base, dtype=np.float32))
    return flat.search(np.ascontiguousarray(queries, dtype=np.float32), at)[1]


def _data(base, queries, gt, goal, sample, rows, seed, log):
    """Integer base and queries (the node's 8 bits, one scale), the ground truth and notes."""
    notes = []
    if len(rows) < len(queries):
        notes.append(f"{len(rows)} of the {len(queries)} queries, drawn at random")
    queries = queries[rows]
    gt = gt[rows] if gt is not None else None
    if len(base) > sample:
        pick = np.sort(np.random.default_rng(seed).choice(len(base), sample, replace=False))
        base = base[pick]
        gt = None
        notes.append(f"base subsampled to {sample:,} of its vectors at random; ground truth "
                     "recomputed exactly on the subsample, so recall is that of a database "
                     "of this size (validation measures it on the whole base)")
    if gt is not None and gt.shape[1] < goal.at:
        raise ConfigError("gt", f"holds {gt.shape[1]} neighbours per query; the goal needs "
                          f"{goal.at}")
    if gt is None:
        gt = exact_truth(base, queries, goal.at)
        if log:
            log(f"explore: exact ground truth of {len(queries)} queries computed")
    if np.issubdtype(base.dtype, np.integer):
        base_i, queries_i = base.astype(np.int64), queries.astype(np.int64)
    else:
        base_i, scale = quantize_vectors(base, 8)
        queries_i, _ = quantize_vectors(queries, 8, scale)
    return base_i, queries_i, np.asarray(gt)[:, :goal.at], notes


def _grid(n, dim, word_bytes, nlists, ms):
    if not nlists:
        root = math.sqrt(n)
        nlists = [1 << e for e in range(4, 17) if root / 2 <= (1 << e) <= 2 * root] or [16]
    nlists = [v for v in nlists if 1 <= v <= n // 4]
    ms = [v for v in (ms or MS) if dim % v == 0 and word_bytes % v == 0]
    if not nlists:
        raise ConfigError("nlist", f"no list count fits a base of {n} vectors (at most n / 4)")
    if not ms:
        raise ConfigError("m", f"no PQ width divides both the dimension {dim} and the "
                          f"{word_bytes}-byte memory word")
    return nlists, ms


def opq_rotation(base, m, seed=1234):
    """OPQ's rotation of ``base`` ``(n, D)`` for ``m`` PQ sub-spaces, trained by faiss
    (``OPQMatrix``, on at most 65,536 vectors): an orthonormal float32 ``(D, D)`` matrix ``R``;
    the rotated vectors are ``x @ R.T``."""
    faiss = import_faiss()
    x = np.ascontiguousarray(base, dtype=np.float32)
    dim = x.shape[1]
    opq = faiss.OPQMatrix(dim, m)
    pq = faiss.ProductQuantizer(dim, m, 8)         # the PQ it alternates with, as the node's
    pq.cp.min_points_per_centroid = 1               # small bases are fine (no faiss warning)
    opq.pq = pq
    if len(x) > opq.max_train_points:
        x = x[np.sort(np.random.default_rng(seed).choice(len(x), opq.max_train_points,
                                                         replace=False))]
    opq.train(x)
    return faiss.vector_to_array(opq.A).reshape(dim, dim)


def rotate(x, rotation, inv_scale=None):
    """``x @ R.T`` quantised to the node's 8 bits (with ``inv_scale``, default the peak's):
    ``(int64 array, inv_scale)``."""
    return quantize_vectors(np.asarray(x, dtype=np.float32) @ rotation.T, 8, inv_scale)


def refine_ids(found, base_i, queries_i, at):
    """The host's re-ranking: of each query's candidate ids ``found`` (``(q, K)``, -1 for
    none), the ``at`` nearest by exact squared L2 on the integer vectors ``base_i`` (ties by
    candidate order). Returns ``(q, at)`` ids, -1 where fewer than ``at`` candidates."""
    out = np.full((len(found), at), -1, dtype=np.int64)
    for i, (cand, q) in enumerate(zip(found, queries_i)):
        cand = cand[cand >= 0]
        diff = np.asarray(base_i[cand], dtype=np.int64) - np.asarray(q, dtype=np.int64)
        order = np.argsort(np.einsum("ij,ij->i", diff, diff), kind="stable")[:at]
        out[i, :len(order)] = cand[order]
    return out


def index_points(base_i, queries_i, gt, goal, nlists, ms, seed, log=None, opq=(False,),
                 refines=(1,), k=None):
    """Every (nlist, m, nprobe) of the grid, without and (with ``True`` in ``opq``) with an
    OPQ rotation, and for every re-ranking factor of ``refines``, with its recall measured by
    faiss on the node's integer index (and :func:`refine_ids` on its ``refine x k`` results,
    ``k`` the node's results without re-ranking, default the goal's R); the index is trained
    once per (nlist, m, OPQ), the rotation once per m."""
    k = k or goal.at
    points = []
    for rotated in opq:
        for m in ms:
            b, q, what = base_i, queries_i, ""
            if rotated:
                t = time.monotonic()
                rotation = opq_rotation(base_i, m, seed)
                b, inv_scale = rotate(base_i, rotation)
                q, _ = rotate(queries_i, rotation, inv_scale)
                what = " with OPQ"
                if log:
                    log(f"explore: OPQ rotation for m {m} trained in "
                        f"{time.monotonic() - t:.1f} s")
            for nlist in nlists:
                t = time.monotonic()
                idx = train_integer_ivfpq(b, nlist=nlist, m=m, seed=seed)
                sizes = np.array([len(ids) for ids in idx.list_ids], dtype=np.int64)
                for nprobe in [p for p in NPROBES if p <= nlist]:
                    idx.index.nprobe = nprobe
                    _, found = idx.index.search(q.astype(np.float32), k * max(refines))
                    probes = idx.probe(q, nprobe)
                    for r in refines:
                        ids = (found[:, :goal.at] if r == 1 else
                               refine_ids(found[:, :r * k], b, q, goal.at))
                        points.append(IndexPoint(nlist, m, nprobe, recall_at(ids, gt, goal.at),
                                                 sizes, probes, rotated, r))
                if log:
                    best = max(p.recall for p in points
                               if (p.nlist, p.m, p.opq) == (nlist, m, rotated))
                    log(f"explore: nlist {nlist}, m {m}{what}: trained and searched in "
                        f"{time.monotonic() - t:.1f} s; recall@{goal.at} up to {best:.3f}")
    return points


def _node_cycles(cfg, point, nodes, k, model_queries):
    """Mean cycles per query of one node holding ``1 / nodes`` of every list (the largest
    share, dealt round-robin over the channels as :func:`~hwgen.vecsearch.layout.pack_index`
    deals it), from the cycle model on the first ``model_queries`` queries' probed lists."""
    share = -(-point.sizes // nodes)
    ch = np.arange(cfg.n_channels)
    layout = SimpleNamespace(count=np.maximum(0, -(-(share[:, None] - ch[None, :])
                                                   // cfg.n_channels)))
    total = [layout_query_cycles(cfg, layout, probes,
                                 int(min(k, share[probes].sum())))["total"]
             for probes in point.probes[:model_queries]]
    return float(np.mean(total))


def _segment_bits(point, nodes, channels, codes_per_word):
    longest = -(-int(point.sizes.max()) // nodes)
    words = -(-(-(-longest // channels)) // codes_per_word)
    return max(16, max(1, words - 1).bit_length())


def designs(point, board, dim, k, nodes, channels=None, lut_widths=LUT_WIDTHS, queues=QUEUES):
    """The node configurations searched for one index point (invalid ones left out): every
    channel count of ``channels`` (all of the board's primary memory's by default; the board's
    whole count is written ``channels = 0``, "all"), LUT-builder width and queue kind."""
    out = []
    count = board.primary_memory.count
    for n in channels or range(1, count + 1):
        for width in lut_widths:
            for queue in queues:
                try:
                    cfg = ChamVSNodeConfig(board=board.name, channels=0 if n == count else n,
                                           dim=dim, m=point.m, nlist=point.nlist,
                                           nprobe_max=point.nprobe, k=k, lut_sub_par=width,
                                           queue=queue)
                    cfg = cfg.replace(segment_bits=_segment_bits(point, nodes, cfg.n_channels,
                                                                 cfg.codes_per_word))
                except ConfigError:
                    continue
                out.append(cfg)
    return out


def _front(rows):
    """Rows no other row beats on both recall and QPS, by recall."""
    front, best = [], -1.0
    for r in sorted(rows, key=lambda r: (-r["recall"], -r["qps"])):
        if r["qps"] > best:
            front.append(r)
            best = r["qps"]
    return sorted(front, key=lambda r: r["recall"])


def _config_key(config_dict):
    return tuple(sorted(config_dict.items()))


def estimate_task(config_dict):
    """The netlist resource estimate of one node configuration (a Dask task: plain data in and
    out)."""
    from ..flow.resources import estimate
    return estimate(registry.get("chamvs-node"), ChamVSNodeConfig(**config_dict)).to_dict()


def _usage(res, board, budget):
    counts = {"lut": res["lut"], "ff": res["ff"], "bram": res["bram18"], "uram": res["uram"],
              "dsp": res["dsp"]}
    pct = {k: round(v, 2) for k, v in board.percent(counts).items()}
    return {"resources": res, "percent": pct, "binding": max(pct, key=pct.get),
            "fits": all(v <= budget for v in pct.values())}


def _estimate_front(rows, goal, board, budget, max_estimates, scheduler, workers, log):
    """Resources of the designs that matter, in rounds on Dask: each round estimates the front
    of the designs not known to overflow (those reaching the goal first, fastest first), until
    every front design is estimated or ``max_estimates`` are spent. Returns the estimates
    made."""
    from ..flow.sweep import dask_client
    cache = {}
    client = cluster = None
    try:
        while len(cache) < max_estimates:
            front = _front([r for r in rows if r.get("fits", True)])
            todo = [r for r in sorted(front, key=lambda r: (r["recall"] < goal.recall,
                                                           -r["qps"]))
                    if "fits" not in r]
            if not todo:
                break
            keys = []
            for r in todo:
                key = _config_key(r["config"])
                if key not in cache and key not in keys:
                    keys.append(key)
            keys = keys[:max_estimates - len(cache)]
            if keys:
                if client is None:
                    client, cluster = dask_client(scheduler, workers)
                t = time.monotonic()
                futures = client.map(estimate_task, [dict(k) for k in keys], pure=False)
                for key, res in zip(keys, client.gather(futures)):
                    cache[key] = res
                if log:
                    log(f"explore: {len(keys)} resource estimates in "
                        f"{time.monotonic() - t:.0f} s ({len(cache)} in all)")
            for r in rows:
                key = _config_key(r["config"])
                if key in cache and "fits" not in r:
                    r.update(_usage(cache[key], board, budget))
    finally:
        if client is not None:
            client.close()
        if cluster is not None:
            cluster.close()
    return cache


def explore(base, queries, *, goal, board="u250", gt=None, nodes=1, budget=85.0,
            sample=100_000, max_queries=200, model_queries=64, nlists=None, ms=None,
            channels=None, lut_widths=LUT_WIDTHS, queues=QUEUES, seed=1234, k=None,
            max_estimates=24, scheduler=None, workers=None, opq=OPQ, refines=REFINES,
            log=None):
    """Search the index and node spaces; returns the JSON-ready result (``chosen`` is None and
    ``limit`` says why when no design reaches the goal within the budget)."""
    t0 = time.monotonic()
    board = load_board(board)
    k = k or goal.at
    if k < goal.at:
        raise ConfigError("k", f"must be at least the goal's {goal.at} neighbours", value=k)
    if not 0 < budget <= 100:
        raise ConfigError("budget", "must be a percentage in (0, 100]", value=budget)
    if nodes < 1:
        raise ConfigError("nodes", "must be at least 1", value=nodes)
    if base.ndim != 2 or queries.ndim != 2 or queries.shape[1] != base.shape[1]:
        raise ConfigError("queries", f"must be a matrix of the base's dimension "
                          f"{base.shape[-1]} (got shape {queries.shape})")
    if gt is not None and len(gt) != len(queries):
        raise ConfigError("gt", f"has {len(gt)} rows for {len(queries)} queries")
    rows_q = query_rows(len(queries), max_queries, seed)
    base_i, queries_i, gt, notes = _data(base, queries, gt, goal, sample, rows_q, seed, log)
    word_bytes = board.primary_memory.axi_data_bits // 8
    nlists, ms = _grid(len(base_i), base_i.shape[1], word_bytes, nlists, ms)
    if not opq or any(v not in (False, True) for v in opq):
        raise ConfigError("opq", "must be a non-empty subset of (False, True)", value=opq)
    refines = sorted(set(refines or REFINES))
    if any(not isinstance(r, int) or not 1 <= r or r * k > 1024 for r in refines):
        raise ConfigError("refine", f"factors must be whole numbers from 1 with refine x k "
                          f"at most 1024 (k {k})", value=refines)
    points = index_points(base_i, queries_i, gt, goal, nlists, ms, seed, log, tuple(opq),
                          tuple(refines), k)
    clock = measured_clock({"chamvs-node"}, board.kernel_clock_mhz)
    clock_mhz = clock["clock_mhz"] or board.kernel_clock_mhz
    rows = []
    t = time.monotonic()
    for point in points:
        node_k = k * point.refine
        for cfg in designs(point, board, base_i.shape[1], node_k, nodes, channels, lut_widths,
                           queues):
            cycles = _node_cycles(cfg, point, nodes, node_k, model_queries)
            rows.append({"recall": point.recall, "qps": clock_mhz * 1e6 / cycles,
                         "cycles": cycles, "nlist": point.nlist, "m": point.m,
                         "nprobe": point.nprobe, "opq": point.opq, "refine": point.refine,
                         "channels": cfg.n_channels, "lut_sub_par": cfg.lut_sub_par,
                         "queue": cfg.queue, "config": cfg.to_dict()})
    if not rows:
        raise ConfigError("channels", "no node configuration of the grid is valid on "
                          f"{board.name}")
    if log:
        log(f"explore: {len(rows)} designs through the cycle model in "
            f"{time.monotonic() - t:.1f} s")
    best = max(points, key=lambda p: p.recall)
    if best.recall >= goal.recall:
        cache = _estimate_front(rows, goal, board, budget, max_estimates, scheduler, workers,
                                log)
        front = _front([r for r in rows if r.get("fits")])
    else:       # no index reaches the goal: no design to size; the front as modelled
        cache = {}
        front = [{**r, "binding": None} for r in _front(rows)]
    chosen = next((r for r in sorted(front, key=lambda r: -r["qps"])
                   if r["recall"] >= goal.recall), None)
    limit = None
    if chosen is None:
        if best.recall < goal.recall:
            limit = (f"recall@{goal.at} >= {goal.recall:g} is out of reach: the best index "
                     f"of the grid (nlist {best.nlist}, m {best.m}, nprobe {best.nprobe}"
                     f"{', OPQ' if best.opq else ''}"
                     f"{f', re-ranking {best.refine} x {k}' if best.refine > 1 else ''}; OPQ "
                     f"{'searched' if True in opq else 'not searched'}, re-ranking factors "
                     f"{', '.join(map(str, refines))}) finds {best.recall:.3f}; "
                     f"product-quantisation codes of at most {max(ms)} bytes limit it (the "
                     f"node's m is at most its {word_bytes}-byte memory word; a longer code, "
                     "or re-ranking more candidates with --refine, would be needed)")
        else:
            limit = (f"no design reaching recall@{goal.at} >= {goal.recall:g} fits "
                     f"{budget:g}% of the {board.name}'s resources (of {len(cache)} estimated)")
    if nodes > 1:
        notes.append(f"each of {nodes} nodes holds 1/{nodes} of every list; QPS is per node "
                     "query stream (all nodes search every query)")
    notes.append(f"cycles per query from the cycle model on {min(model_queries, len(queries_i))}"
                 " queries' probed lists")
    if max(refines) > 1:
        notes.append("a design with refine r returns r x k results and the host keeps the k "
                     "nearest by exact distance on the stored 8-bit vectors: r x k x D "
                     "multiply-adds per query and the base's vectors in host memory, not in "
                     "the node's QPS")
    return {"goal": str(goal), "board": board.name, "nodes": nodes, "budget_percent": budget,
            "base_vectors": int(len(base_i)), "dim": int(base_i.shape[1]),
            "queries": int(len(queries_i)), "query_rows": rows_q.tolist(), "notes": notes,
            "grid": {"nlist": nlists, "m": ms, "nprobe": list(NPROBES), "opq": list(opq),
                     "refine": refines,
                     "channels": sorted({r["channels"] for r in rows}),
                     "lut_sub_par": list(lut_widths), "queue": list(queues)},
            "clock": {"mhz": clock_mhz, "ratio": clock["ratio"], "block": clock["block"],
                      "measured": clock["clock_mhz"] is not None},
            "index_points": [{"nlist": p.nlist, "m": p.m, "nprobe": p.nprobe, "opq": p.opq,
                              "refine": p.refine, "recall": p.recall} for p in points],
            "designs": len(rows), "estimated": len(cache),
            "front": front, "chosen": chosen, "limit": limit,
            "all": [{k2: r[k2] for k2 in ("recall", "qps", "nlist", "m", "nprobe", "opq",
                                          "refine", "channels", "lut_sub_par", "queue")}
                    for r in rows],
            "seconds": time.monotonic() - t0}


def picks(result, count):
    """The ``count`` fastest distinct designs of the front and below it that reach the goal and
    fit (the chosen first)."""
    goal = parse_goal(result["goal"])
    out, seen = [], set()
    for r in sorted(result["front"], key=lambda r: -r["qps"]):
        key = (_config_key(r["config"]), r.get("opq", False))
        if r["recall"] >= goal.recall and key not in seen:
            out.append(r)
            seen.add(key)
    return out[:count]


def validate(result, base, queries, count, *, gt=None, sim_queries=8, seed=1, synth=True,
             log=None):
    """The ``count`` best designs (:func:`picks`) on the whole ``base``: each design's index
    trained there, its recall on explore's queries (faiss, against ``gt`` or the exact
    neighbours), and ``sim_queries`` of them simulated on the native engine: mismatches against
    the golden model and the cycle model's error against the simulated cycles. With ``synth``
    (and yosys installed) each design is also mapped by yosys and its resource estimate checked
    (:func:`resources_against_yosys`)."""
    goal = parse_goal(result["goal"])
    rows = np.asarray(result["query_rows"], dtype=np.int64)
    queries = queries[rows]
    truth = (np.asarray(gt)[rows] if gt is not None else exact_truth(base, queries, goal.at))
    out = []
    for row in picks(result, count):
        cfg = ChamVSNodeConfig(**row["config"])
        t = time.monotonic()
        n = min(sim_queries, len(queries))
        b, q = base, queries
        if row.get("opq"):            # the host's rotation, trained on the whole base
            rotation = opq_rotation(base, cfg.m, seed)
            b = np.asarray(base, dtype=np.float32) @ rotation.T
            q = np.asarray(queries, dtype=np.float32) @ rotation.T
        data = prepare(cfg, base=b, queries=q, nprobe=row["nprobe"],
                       count=len(queries), seed=seed)           # every query, in order
        data.index.index.nprobe = row["nprobe"]
        found = data.index.index.search(data.queries.astype(np.float32), cfg.k)[1]
        refine = int(row.get("refine", 1))
        if refine > 1:                # the host's re-ranking of the node's refine x k results
            found = refine_ids(found, data.base, data.queries, goal.at)
        recall = recall_at(found, truth, goal.at)
        sim, cycles = simulate_sample(cfg, data, n, seed, log)
        model = [layout_query_cycles(cfg, data.layout, pr, cfg.k)["total"]
                 for pr in data.probes[:n]]
        errors = [abs(m - c) / c for m, c in zip(model, cycles)]
        mean_error = (float(abs(np.mean(model) - np.mean(cycles)) / np.mean(cycles))
                      if cycles else None)
        out.append({"config": row["config"], "nprobe": row["nprobe"],
                    "opq": bool(row.get("opq")), "refine": refine,
                    "recall": recall, "reaches_goal": recall >= goal.recall,
                    "simulated_queries": n, "mismatches": sim["mismatches"],
                    "timeout": sim["timeout"], "cycles": cycles, "model_cycles": model,
                    "model_error_mean": mean_error,
                    "model_error_max": float(max(errors)) if errors else None,
                    "sim_recall": sim.get("recall")})
        simulated_ok = (sim["mismatches"] == 0 and not sim["timeout"] and bool(cycles)
                        and mean_error <= 0.05)
        del data, sim, b, q   # a million-vector design holds gigabytes: free them before yosys
        gc.collect()
        check = (resources_against_yosys(cfg, result["board"], log) if synth
                 else {"checked": False, "why": "not asked (--no-synth)"})
        out[-1].update({"resources_yosys": check,
                        "ok": simulated_ok and check.get("ok", True),
                        "seconds": time.monotonic() - t})
        if log:
            v = out[-1]
            log(f"explore: validated nlist {cfg.nlist}, m {cfg.m}, nprobe {row['nprobe']}, "
                f"{cfg.n_channels} ch, lut_sub_par {cfg.lut_sub_par}, {cfg.queue} on "
                f"{len(base):,} vectors: recall@{goal.at} {recall:.3f}, {n} queries simulated,"
                f" {v['mismatches']} mismatches, model {v['model_error_mean']:.1%} off the "
                f"simulated cycles, {v['seconds']:.0f} s")
    return out


def resources_against_yosys(cfg, board, log=None):
    """The netlist estimate of node ``cfg`` against yosys ``synth_xilinx``
    (:func:`hwgen.flow.resources.against_yosys`: per resource both counts, their ratio and
    whether it is within the stated error; ``ok``), with ``checked`` and yosys' ``seconds``;
    ``checked`` False with ``why`` where yosys is not installed."""
    from ..flow.resources import against_yosys, estimate, measured
    from ..flow.tools import yosys_path
    if yosys_path() is None:
        return {"checked": False, "why": "yosys not installed (make setup installs it)"}
    acc = registry.get("chamvs-node")
    t = time.monotonic()
    real = measured(acc, cfg, board=load_board(board), log=log)
    out = {"checked": True, **against_yosys(estimate(acc, cfg), real),
           "seconds": round(time.monotonic() - t, 1)}
    if log:
        log("explore: yosys " + ", ".join(
            f"{k} {v['yosys']:,} (estimate {v['estimate']:,})" for k, v in out.items()
            if isinstance(v, dict)) + ("" if out["ok"] else ": OUTSIDE the stated error"))
    return out


def plot_front(result, path):
    """QPS against recall: every design searched (grey) and the front, coloured by the
    resource that binds it; the chosen design ringed."""
    from ..plots import new_axes, save_axes
    fig, ax = new_axes()
    every = result["all"]
    ax.scatter([r["recall"] for r in every], [r["qps"] for r in every], s=6, c="0.8",
               label=f"designs searched ({len(every)})")
    colours = {"lut": "tab:blue", "ff": "tab:orange", "bram": "tab:red", "uram": "tab:purple",
               "dsp": "tab:green"}
    for res, colour in colours.items():
        pts = [r for r in result["front"] if r["binding"] == res]
        if pts:
            ax.scatter([r["recall"] for r in pts], [r["qps"] for r in pts], s=30, c=colour,
                       label=f"front, bound by {res}")
    pts = [r for r in result["front"] if r["binding"] is None]
    if pts:
        ax.scatter([r["recall"] for r in pts], [r["qps"] for r in pts], s=30, c="k",
                   label="front (resources not estimated)")
    if result["chosen"]:
        c = result["chosen"]
        ax.scatter([c["recall"]], [c["qps"]], s=160, facecolors="none", edgecolors="k",
                   label="chosen")
    ax.axvline(float(result["goal"].split("@")[0]), color="k", linestyle=":", linewidth=1)
    ax.set_yscale("log")
    ax.set_title(f"ChamVS designs on {result['board']}: {result['base_vectors']:,} vectors, "
                 f"D {result['dim']}", fontsize="medium")
    return save_axes(fig, ax, path, f"recall@{result['goal'].split('@')[1]}",
                     f"QPS per query stream ({result['clock']['mhz']:g} MHz)")
