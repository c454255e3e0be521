"""``hwgen demo``: IVF-PQ search through the two ChamVS blocks' Verilog, checked against faiss.

1. Train a faiss IVF-PQ index on the digits data set and make its centroids integer.
2. For a few queries, take faiss's ``nprobe`` nearest lists and run the **LUT builder's
   Verilog** (Verilator) on every (query, list) pair.
3. Feed the LUTs the RTL produced, with each probed list's PQ codes, to the **PQ decoder's
   Verilog**; the tag of each code is its vector id.
4. Select the top-k of the RTL distances and compare ids and distances with faiss's search.
"""

import time

import numpy as np

from .. import registry
from ..datasets import digits
from ..flow.simulate import simulate
from .ivfpq import train_integer_ivfpq

__all__ = ["run_demo"]


def _topk(dists, ids, k):
    order = np.lexsort((ids, dists))[:k]
    return dists[order], ids[order]


def run_demo(*, queries=4, nlist=8, m=16, nprobe=2, k=10, stall=0.2, seed=1, echo=print):
    x, _ = digits()
    base, query_vecs = x[:-queries], x[-queries:]
    echo(f"[1/4] training faiss IVF-PQ on {len(base)} digits vectors (D={x.shape[1]}, "
         f"nlist={nlist}, m={m}) and rounding its centroids to integers")
    index = train_integer_ivfpq(base, nlist=nlist, m=m, elem_bits=8, seed=seed)
    probes = index.probe(query_vecs, nprobe)

    builder = registry.get("lut-builder")
    bcfg = builder.make_config([f"dim={x.shape[1]}", f"m={m}", "lut_bits=20"])
    pairs_q = np.repeat(query_vecs, nprobe, axis=0)
    pairs_c = index.coarse[probes.ravel()]
    echo(f"[2/4] LUT builder RTL: {len(pairs_q)} (query, list) pairs -> {256 * len(pairs_q)} "
         f"LUT rows (Verilator, stall {stall})")
    t0 = time.monotonic()
    lut_run = simulate(builder, bcfg, items=len(pairs_q), seed=seed, stall=stall,
                       stimulus={"pq_centroids": index.pq_centroids, "queries": pairs_q,
                                 "coarse": pairs_c}, keep_outputs=True, log=echo)
    rows = np.array([r["value"] for r in lut_run["outputs"]["o_lut"]], dtype=np.int64)
    luts = [rows[256 * p:256 * (p + 1)].T for p in range(len(pairs_q))]
    echo(f"      {lut_run['mismatches']} mismatches vs golden; "
         f"{lut_run['results_per_cycle']:.3f} rows/cycle; {time.monotonic() - t0:.1f} s")

    decoder = registry.get("pq-decoder")
    dcfg = decoder.make_config([f"m={m}", "lut_bits=20", "tag_bits=16"])
    lists = probes.ravel()
    scanned = [p for p, lst in enumerate(lists) if len(index.list_ids[lst])]  # skip empty lists
    luts = [luts[p] for p in scanned]
    lists = lists[scanned]
    codes = [index.list_codes[lst] for lst in lists]
    tags = np.concatenate([index.list_ids[lst] for lst in lists]).astype(np.uint64)
    echo(f"[3/4] PQ decoder RTL: {len(tags)} codes in {len(codes)} list scans, LUTs from the "
         f"LUT builder's RTL output")
    t0 = time.monotonic()
    dec_run = simulate(decoder, dcfg, items=len(tags), seed=seed, stall=stall,
                       stimulus={"luts": luts, "codes": codes, "tags": tags},
                       keep_outputs=True, log=echo)
    out = dec_run["outputs"]["o_dist"]
    echo(f"      {dec_run['mismatches']} mismatches vs golden; "
         f"{dec_run['results_per_cycle']:.3f} distances/cycle; {time.monotonic() - t0:.1f} s")

    echo(f"[4/4] top-{k} of the RTL distances vs faiss IndexIVFPQ.search (nprobe={nprobe})")
    index.index.nprobe = nprobe
    f_dist, f_ids = index.index.search(query_vecs.astype(np.float32), k)
    dists = np.array([o["dist"] for o in out], dtype=np.int64)
    ids = np.array([o["tag"] for o in out], dtype=np.int64)
    per_query = [sum(len(index.list_ids[lst]) for lst in probes[q]) for q in range(queries)]
    start, agree = 0, 0
    for q in range(queries):
        span = slice(start, start + per_query[q])
        start += per_query[q]
        d, i = _topk(dists[span], ids[span], k)
        rtl = dict(zip(ids[span].tolist(), dists[span].tolist()))
        # Same distances in order, and faiss's ids at faiss's distances (ties may pick
        # different ids at the k-th distance; both choices are then correct).
        same = np.array_equal(d, f_dist[q].astype(np.int64)) and all(
            rtl.get(fid) == fd for fid, fd in zip(f_ids[q].tolist(), f_dist[q].tolist()))
        agree += same
        echo(f"      query {q}: RTL ids {i.tolist()} {'==' if same else '!='} faiss")
    ok = agree == queries and not lut_run["mismatches"] and not dec_run["mismatches"]
    echo(f"result: {agree}/{queries} queries with top-{k} identical to faiss; "
         f"{'PASS' if ok else 'FAIL'}")
    return ok
