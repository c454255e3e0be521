"""``hwgen demo``: the ChamVS memory node searching a real data set, end to end.

1. Train a faiss IVF-PQ index on the digits data set (scikit-learn's copy: 1,797 real 64-d
   vectors, no download), make its centroids integer and pack it into the four DDR channels of
   an Alveo U250 node.
2. Run the node's Verilog on Verilator: metadata and queries over AXI-Stream, the database in
   four cocotbext-axi memories with random latency, 20 held-out queries probed with faiss's
   coarse quantizer; every result is compared with the golden model.
3. Report recall against exact search, agreement with faiss's own IVF-PQ search, the measured
   cycles per query, and the cycle model's projection for the paper's billion-vector data sets.
"""

import time

import numpy as np

from .. import registry
from ..flow.simulate import simulate
from .model import PAPER_DATASETS, project

__all__ = ["run_demo"]


def run_demo(*, queries=20, stall=0.1, seed=1, echo=print, progress=True):
    """``hwgen demo`` (see module docstring): ``queries`` held-out queries of the digits data set on
    the default ChamVS node's Verilog with ``stall`` random stalls, checked against the golden
    model; progress and results go to ``echo``. Returns True when every result matched and the
    simulation did not time out."""
    acc = registry.get("chamvs-node")
    cfg = acc.config()
    d = cfg.derived()
    echo(f"[1/3] digits data set -> faiss IVF-PQ (nlist {cfg.nlist}, m {cfg.m}), integer "
         f"centroids, packed into {d['channels']} DDR4 channels of a {cfg.board} node "
         f"({d['pq_units']} PQ units, K={cfg.k})")
    t0 = time.monotonic()
    stim = acc.model.stimulus(cfg, queries, np.random.default_rng(seed))
    echo(f"[2/3] node Verilog on Verilator: {queries} queries, nprobe {cfg.nprobe_max}, "
         f"{int(stall * 100)}% random stalls on every stream and memory channel "
         f"(first run builds the simulator, about a minute)")
    run = simulate(acc, cfg, items=queries, seed=seed, stall=stall, stimulus=stim,
                   progress=progress, log=echo)
    echo(f"      {run['results']} results, {run['mismatches']} mismatches against the golden "
         f"model ({time.monotonic() - t0:.0f} s)")
    echo("[3/3] results")
    rec = ", ".join(f"{k} {v:.3f}" for k, v in run["recall"].items())
    frec = ", ".join(f"{k} {v:.3f}" for k, v in run["faiss_recall"].items())
    echo(f"      recall (node):            {rec}")
    echo(f"      recall (faiss IndexIVFPQ): {frec}")
    echo(f"      identical top-{cfg.k} ids as faiss: "
         f"{100 * run['identical_topk_fraction']:.0f}% of queries")
    pq = run["per_query_cycles"]
    echo(f"      cycles per query: {pq['total']:.0f} (LUT {pq['lut']:.0f}, scan {pq['scan']:.0f}, "
         f"drain {pq['drain']:.0f}); memory-side scan efficiency {run['scan_efficiency']:.3f}")
    echo("      projected for the paper's data sets (1e9 vectors, nlist 32768, nprobe 32, "
         "K 100) on U250 nodes at 140 MHz:")
    for ds in PAPER_DATASETS:
        p = project(ds, clock_mhz=140)
        echo(f"        {ds.name:<9} {p['nodes']} node(s), {p['cycles']} cycles/query, "
             f"{p['latency_ms']:.2f} ms, {p['qps']:.0f} queries/s")
    ok = run["mismatches"] == 0 and not run["timeout"]
    echo(f"result: {'PASS' if ok else 'FAIL'}")
    return ok
