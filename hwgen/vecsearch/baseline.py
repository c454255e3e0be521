"""The node beside what a user would run instead: faiss ``IndexIVFPQ`` on this machine's CPU,
with the same index, nprobe and K, measured in the same run (``hwgen bench chamvs --base B
--queries Q``).

* **CPU faiss**: the node's own trained index (:func:`~hwgen.vecsearch.ivfpq.train_integer_ivfpq`:
  faiss ``IndexIVFPQ`` with integer centroids), ``nprobe`` and ``k`` set as the node's, every
  core (``omp_set_num_threads``), searched in batches of 1 and of 64 queries. Each batch is
  timed with ``time.perf_counter``; passes over the query set repeat until
  :data:`MIN_SECONDS` have elapsed, after one warm-up pass. QPS = queries / seconds; p50 and
  p99 are of the per-batch latencies (a query of a batch of 64 waits for the whole batch).
* **Node**: a sample of the queries simulated on the native Verilator engine from the node's
  Verilog, bit-exact against the golden model; its cycle counters give the cycles of each query.
  Seconds per query = cycles / clock, the clock being the board's kernel clock times the node's
  measured ``fmax_ratio`` (:func:`~hwgen.flow.timing_table.measured_clock`): a projection from
  simulation and an ECP5 measurement, since no FPGA is here. Queries are served one after
  another (the node holds one query at a time), so QPS = clock / mean cycles. The cycle model
  (held within 5% of the simulation) gives the same figures for every query of the set.
* **GPU faiss**: not measured here (no GPU on this machine); the line says so.
"""

import os
import time
from dataclasses import replace

import numpy as np

from .. import registry
from ..boards import load_board
from ..flow.simulate import simulate
from ..flow.timing_table import measured_clock, ratio_text
from .ivfpq import import_faiss
from .model import layout_query_cycles
from .node_model import QUERY_POOL, node_search, prepare

__all__ = ["faiss_cpu", "node_speed", "compare", "compare_lines", "simulate_sample", "MIN_SECONDS", "BATCHES"]

#: Seconds of timed searching per CPU row at least (passes over the queries repeat).
MIN_SECONDS = 1.0
#: Batch sizes of the CPU rows.
BATCHES = (1, 64)


def faiss_cpu(index, queries, k, nprobe, batch, *, threads=None, min_seconds=MIN_SECONDS):
    """faiss ``index`` (an ``IndexIVFPQ``) searched for ``queries`` in batches of ``batch``
    with ``threads`` OpenMP threads (default: every core). Returns ``{"batch", "threads",
    "queries", "passes", "seconds", "qps", "p50_ms", "p99_ms"}``."""
    faiss = import_faiss()
    threads = threads or os.cpu_count() or 1
    faiss.omp_set_num_threads(threads)
    index.nprobe = nprobe
    x = np.ascontiguousarray(queries, dtype=np.float32)
    chunks = [x[s:s + batch] for s in range(0, len(x), batch)]
    for chunk in chunks:                    # warm-up pass: caches, thread pool
        index.search(chunk, k)
    latencies, passes, start = [], 0, time.perf_counter()
    while passes == 0 or time.perf_counter() - start < min_seconds:
        for chunk in chunks:
            t = time.perf_counter()
            index.search(chunk, k)
            latencies.append(time.perf_counter() - t)
        passes += 1
    seconds = sum(latencies)
    ms = np.array(latencies) * 1e3
    return {"batch": batch, "threads": threads, "queries": len(x), "passes": passes,
            "seconds": seconds, "qps": passes * len(x) / seconds,
            "p50_ms": float(np.percentile(ms, 50)), "p99_ms": float(np.percentile(ms, 99))}


def node_speed(cycles, clock_mhz):
    """QPS and p50/p99 latency of a node serving queries of ``cycles`` one after another at
    ``clock_mhz``."""
    us = np.asarray(cycles, dtype=float) / clock_mhz
    return {"clock_mhz": clock_mhz, "mean_cycles": float(np.mean(cycles)),
            "qps": 1e6 / float(np.mean(us)),
            "p50_ms": float(np.percentile(us, 50)) / 1e3,
            "p99_ms": float(np.percentile(us, 99)) / 1e3}


def simulate_sample(config, data, count, seed, log):
    """The first ``count`` queries of ``data`` on the native engine: the simulate result and
    each query's cycles from the node's counters."""
    sample = replace(data, queries=data.queries[:count], probes=data.probes[:count])
    results = [node_search(config, sample, q, pr) for q, pr in zip(sample.queries, sample.probes)]
    result = simulate(registry.get("chamvs-node"), config, items=count, seed=seed,
                      stimulus={"data": sample, "results": results}, engine="native", log=log)
    cycles = [s["stat_cycles"] for s in result.get("per_query_stats", [])]
    return result, cycles


def compare(config, *, base=None, queries=None, nprobe=None, sim_queries=20, seed=1,
            threads=None, min_seconds=MIN_SECONDS, log=None):
    """Node and CPU faiss on one data set (the digits set when ``base`` is None). Returns the
    JSON-ready comparison; ``ok`` is False when the simulated sample mismatched."""
    pool = len(queries) if queries is not None else QUERY_POOL
    data = prepare(config, base=base, queries=queries, nprobe=nprobe, count=pool, seed=seed)
    nprobe = int(data.probes.shape[1])
    k = config.k
    sim_queries = min(sim_queries, len(data.queries))
    result, sim_cycles = simulate_sample(config, data, sim_queries, seed, log)
    model_cycles = [layout_query_cycles(config, data.layout, pr, k)["total"]
                    for pr in data.probes]
    board = load_board(config.board)
    clock = measured_clock({"chamvs-node"}, board.kernel_clock_mhz)
    clock_mhz = clock["clock_mhz"] or board.kernel_clock_mhz
    cpu = [faiss_cpu(data.index.index, data.queries, k, nprobe, b, threads=threads,
                     min_seconds=min_seconds) for b in BATCHES]
    node_sim = node_speed(sim_cycles, clock_mhz) if sim_cycles else None
    node_model = node_speed(model_cycles, clock_mhz)
    node = node_sim or node_model
    return {
        "dataset": data.name, "vectors": int(len(data.base)), "dim": int(data.base.shape[1]),
        "queries": int(len(data.queries)), "nlist": config.nlist, "m": config.m,
        "nprobe": nprobe, "k": k, "board": config.board,
        "clock": {"kernel_mhz": board.kernel_clock_mhz, "ratio": clock["ratio"],
                  "block": clock["block"], "mhz": clock_mhz,
                  "measured": clock["clock_mhz"] is not None},
        "node_simulated": {"queries": sim_queries, "mismatches": result["mismatches"],
                           "timeout": result["timeout"], "cycles": sim_cycles,
                           "speed": node_sim, "recall": result.get("recall"),
                           "faiss_recall": result.get("faiss_recall"),
                           "identical_topk_fraction": result.get("identical_topk_fraction")},
        "node_model": {"queries": len(model_cycles), "speed": node_model},
        "cpu_faiss": cpu,
        "gpu_faiss": None,
        "speedup": {f"batch{c['batch']}": node["qps"] / c["qps"] for c in cpu},
        "ok": result["mismatches"] == 0 and not result["timeout"] and bool(sim_cycles),
    }


def compare_lines(r):
    """The comparison as printed lines."""
    clk = r["clock"]
    source = (f"{clk['kernel_mhz']:g} MHz x measured ratio {ratio_text(clk['ratio'])} of "
              f"{clk['block']}" if clk["measured"] else
              f"{clk['kernel_mhz']:g} MHz declared (no measured ratio in the timing table)")
    lines = [f"Same data, index and search on the node and on CPU faiss: {r['dataset']} "
             f"({r['vectors']:,} vectors, D {r['dim']}), {r['queries']} queries, nlist "
             f"{r['nlist']}, m {r['m']}, nprobe {r['nprobe']}, K {r['k']}",
             "| system | batch | queries timed | QPS | p50 ms (per batch) | p99 ms | node / this |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    sim, model = r["node_simulated"], r["node_model"]
    node = sim["speed"] or model["speed"]
    if sim["speed"]:
        s = sim["speed"]
        lines.append(f"| node on {r['board']} at {s['clock_mhz']:g} MHz, simulated cycles "
                     f"({s['mean_cycles']:.0f}/query; {sim['mismatches']} mismatches) | 1 | "
                     f"{sim['queries']} | {s['qps']:,.0f} | {s['p50_ms']:.4f} | "
                     f"{s['p99_ms']:.4f} | 1 |")
    s = model["speed"]
    lines.append(f"| node, cycle model ({s['mean_cycles']:.0f}/query) | 1 | {model['queries']} "
                 f"| {s['qps']:,.0f} | {s['p50_ms']:.4f} | {s['p99_ms']:.4f} | "
                 f"{node['qps'] / s['qps']:.2f} |")
    for c in r["cpu_faiss"]:
        lines.append(f"| CPU faiss IndexIVFPQ, {c['threads']} threads | {c['batch']} | "
                     f"{c['queries']} x {c['passes']} | {c['qps']:,.0f} | {c['p50_ms']:.4f} | "
                     f"{c['p99_ms']:.4f} | {node['qps'] / c['qps']:.2f} |")
    lines.append("| GPU faiss | - | - | - | - | - | not measured: no GPU on this machine |")
    if sim.get("recall"):
        lines.append("Same results: on the simulated queries the node's "
                     + ", ".join(f"{key} {v:.3f}" for key, v in sim["recall"].items())
                     + "; faiss's " + ", ".join(f"{key} {v:.3f}"
                                                 for key, v in sim["faiss_recall"].items())
                     + f"; identical top-K ids in {100 * sim['identical_topk_fraction']:.0f}% "
                     "of queries (ties at the K-th distance may be broken differently).")
    lines.append(f"Node clock: {source}. The node's figures are projected from simulation "
                 "(cycles) and an ECP5 place and route (clock ratio); no FPGA is here. CPU "
                 "faiss was timed on this machine in this run.")
    return lines

