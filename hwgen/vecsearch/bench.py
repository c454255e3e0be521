"""Benchmarks of the ChamVS blocks: throughput and latency measured in simulation, resources
from yosys, exactness of the approximate K-selection. ``hwgen bench NAME`` prints the tables of
the ChamVS and K-selection guides (``docs/guides/``)."""

import numpy as np

from .. import registry
from ..boards import load_board
from ..flow.simulate import simulate
from ..flow.synth import synthesize
from ..flow.timing_table import measured_clock, ratio_text
from ..flow.tools import yosys_path
from . import golden
from .sizing import l1_queue_length

__all__ = ["bench_pq_decoder", "bench_lut_builder", "bench_kselect", "queue_overflow_exact"]

#: FANNS's floating-point PQ decoding PE at m = 16 (the comparison point of issue #2).
FANNS_PE = {"lut": 3937, "ff": 3954, "dsp": 30, "bram18": 16}


def _resources(acc, cfg):
    if yosys_path() is None:
        return None
    return synthesize(acc, cfg)["resources"]


def _row(cells):
    return "| " + " | ".join(str(c) for c in cells) + " |"


def bench_pq_decoder(echo=print, items=20000):
    """``hwgen bench pq-decoder``: the ChamVS guide's table of the PQ decoding unit. For m in 16/32/64 and
    16/24-bit LUT entries, simulates ``items`` codes at ``--stall 0`` (results per cycle, latency in
    cycles beside the cycle model's) and synthesises it with yosys when installed (LUT, FF, BRAM18,
    DSP, LUTs against a quarter of FANNS's float PE); rows go to ``echo``."""
    acc = registry.get("pq-decoder")
    echo(f"pq-decoder: {items} codes per run, --stall 0 (steady state), yosys synth_xilinx xcup")
    echo(_row(["m", "lut_bits", "dist_bits", "results/cycle", "latency (cycles)", "model latency",
               "LUT", "FF", "BRAM18", "DSP", "LUT / (FANNS/4)"]))
    echo(_row(["---"] * 11))
    for m in (16, 32, 64):
        for lut_bits in (16, 24):
            cfg = acc.make_config([f"m={m}", f"lut_bits={lut_bits}"])
            sim = simulate(acc, cfg, items=items, seed=1, stall=0.0)
            res = _resources(acc, cfg) or {}
            budget = FANNS_PE["lut"] / 4 * m / 16
            echo(_row([m, lut_bits, cfg.dist_bits, f"{sim['results_per_cycle']:.4f}",
                       sim["latency_cycles"], cfg.performance()["latency_cycles"],
                       res.get("lut", "-"), res.get("ff", "-"), res.get("bram18", "-"),
                       res.get("dsp", "-"),
                       f"{res['lut'] / budget:.2f}" if res else "-"]))
            if sim["mismatches"]:
                echo(f"  MISMATCHES: {sim['mismatches']}")
    echo(_row(["16 (FANNS float PE)", "fp32", "-", "1", "-", "-", FANNS_PE["lut"], FANNS_PE["ff"],
               FANNS_PE["bram18"], FANNS_PE["dsp"], "4.00"]))
    echo("(LUT / (FANNS/4): our LUTs over a quarter of FANNS's per-m-scaled figure; <= 1 meets "
         "the goal)")


def bench_lut_builder(echo=print, pairs=8):
    """``hwgen bench lut-builder``: the ChamVS guide's table of the LUT builder at dim 128, m 16, for
    ``sub_par`` 16/4/1: rows per cycle simulated (``pairs`` query pairs, ``--stall 0``) and
    modelled, cycles per LUT, latency in cycles and yosys resources when installed; rows go to
    ``echo``."""
    acc = registry.get("lut-builder")
    echo(f"lut-builder: dim 128, m 16 (SIFT-like), {pairs} query pairs, --stall 0")
    echo(_row(["sub_par", "rows/cycle (sim)", "model", "cycles/LUT", "latency", "LUT", "FF",
               "BRAM18", "DSP"]))
    echo(_row(["---"] * 9))
    for sub_par in (16, 4, 1):
        cfg = acc.make_config(["dim=128", "m=16", "lut_bits=16", f"sub_par={sub_par}"])
        sim = simulate(acc, cfg, items=pairs, seed=1, stall=0.0)
        res = _resources(acc, cfg) or {}
        model = cfg.performance()
        echo(_row([sub_par, f"{sim['results_per_cycle']:.4f}", f"{model['rows_per_cycle']:.4f}",
                   model["cycles_per_lut"], sim["latency_cycles"], res.get("lut", "-"),
                   res.get("ff", "-"), res.get("bram18", "-"), res.get("dsp", "-")]))
        if sim["mismatches"]:
            echo(f"  MISMATCHES: {sim['mismatches']}")


# -- K-selection ---------------------------------------------------------------------------------

def queue_overflow_exact(dists, ids, queue_of, k, l1_len):
    """Per query, whether the hierarchical result is exact: no L1 queue received more than
    ``l1_len`` of the query's true top-k (items ordered by distance, then id).

    ``dists``, ``ids``, ``queue_of``: (queries, items) arrays. Equivalent to comparing
    :func:`golden.hier_topk` with :func:`golden.topk` (``tests/test_kselect.py`` checks that).
    """
    order = np.lexsort((ids, dists), axis=1)[:, :k]
    top_queues = np.take_along_axis(queue_of, order, axis=1)
    queues = int(queue_of.max()) + 1
    counts = np.stack([(top_queues == q).sum(axis=1) for q in range(queues)], axis=1)
    return counts.max(axis=1) <= l1_len


def exactness_random(k, streams, queries, rng, per_stream=None):
    """Fraction of exact queries with i.i.d. random distances in every stream."""
    n = per_stream or max(2 * k, 64)
    l1_len = l1_queue_length(k, streams)
    dists = rng.integers(0, 1 << 40, size=(queries, streams * n))
    ids = np.broadcast_to(np.arange(streams * n), dists.shape)
    queue_of = np.broadcast_to(np.arange(streams * n) % streams, dists.shape)
    return float(queue_overflow_exact(dists, ids, queue_of, k, l1_len).mean()), l1_len


def dataset_scan(nlist=16, m=16, nprobe=4, seed=1):
    """IVF-PQ scan of the digits data set with the ChamVS golden model: for every vector used
    as a query, the PQ distances and ids of all vectors in its ``nprobe`` nearest lists, and
    each one's position within its list (a list is spread over memory channels and PQ units
    by position, so the position decides the stream)."""
    from ..datasets import digits
    from .ivfpq import train_integer_ivfpq
    x, _ = digits()
    index = train_integer_ivfpq(x, nlist=nlist, m=m, seed=seed)
    probes = index.probe(x, nprobe)
    scans = []
    for q, lists in enumerate(probes):
        d, i, pos = [], [], []
        for lst in lists:
            lut = golden.build_lut(x[q] - index.coarse[lst], index.pq_centroids)
            d.append(golden.pq_distances(index.list_codes[lst], lut))
            i.append(index.list_ids[lst])
            pos.append(np.arange(len(index.list_ids[lst])))
        scans.append((np.concatenate(d), np.concatenate(i), np.concatenate(pos)))
    return scans


def exactness_dataset(scans, k, streams):
    """Fraction of the dataset's queries whose hierarchical top-k is exact."""
    l1_len = l1_queue_length(k, streams)
    ok = []
    for d, i, pos in scans:
        if len(d) < k:
            continue
        ok.append(bool(queue_overflow_exact(d[None], i[None], (pos % streams)[None], k,
                                            l1_len)[0]))
    return float(np.mean(ok)), l1_len, len(ok)


def wilson_interval(successes, n, z=1.96):
    """95% Wilson score interval of a binomial proportion."""
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return centre - half, centre + half


def bench_kselect(echo=print, queries=20000, seed=1, target=0.99, rtl_queries=60):
    """The exactness table of ``hwgen bench kselect``; returns True if every row meets
    ``target``: its measured fraction is not significantly below it (the target lies below
    the upper end of the 95% Wilson interval; the sizing promises the target in expectation, and
    a finite sample scatters around that)."""
    rng = np.random.default_rng(seed)
    echo(f"Approximate hierarchical priority queue: fraction of queries whose result equals the "
         f"exact top-k (target {target}); L1 length from l1_queue_length(k, streams) "
         f"(all-queues); one L1 queue per stream")
    echo("(a) random: i.i.d. distances, max(2k, 64) items per stream, "
         f"{queries} queries; (b) digits data set: IVF-PQ (nlist 16, m 16, nprobe 4) scanned "
         "with the ChamVS golden model, stream = position in list mod streams, every vector a "
         "query")
    scans = dataset_scan(seed=seed)
    echo(_row(["k", "streams", "L1 length", "predicted P(exact)", "random [95% interval]",
               "digits [95% interval]", "digits queries", "meets target"]))
    echo(_row(["---"] * 8))
    from fractions import Fraction
    from .sizing import binomial_cdf
    ok_all = True
    for k in (10, 100):
        for streams in (4, 8, 16, 32):
            rand, l1_len = exactness_random(k, streams, queries, rng)
            real, _, n_real = exactness_dataset(scans, k, streams)
            predicted = float(binomial_cdf(k, Fraction(1, streams), l1_len) ** streams)
            r_lo, r_hi = wilson_interval(round(rand * queries), queries)
            d_lo, d_hi = wilson_interval(round(real * n_real), n_real)
            ok = r_hi >= target and d_hi >= target
            ok_all &= ok
            echo(_row([k, streams, l1_len, f"{predicted:.4f}",
                       f"{rand:.4f} [{r_lo:.4f}, {r_hi:.4f}]",
                       f"{real:.4f} [{d_lo:.4f}, {d_hi:.4f}]", n_real, "yes" if ok else "NO"]))
    if rtl_queries:
        ok_all &= _rtl_check(scans, rtl_queries, echo, seed)
    return ok_all


def _rtl_check(scans, count, echo, seed, k=10, streams=4):
    """Run the hier-pq Verilog on the first ``count`` digits queries: bit-exact vs golden."""
    acc = registry.get("hier-pq")
    cfg = acc.make_config([f"k={k}", f"streams={streams}", "dist_bits=24", "id_bits=12",
                           "queue=systolic"])
    queries = []
    for d, i, pos in scans[:count]:
        streams_of = [(d[pos % streams == s].astype(np.uint64), i[pos % streams == s]
                       .astype(np.uint64)) for s in range(streams)]
        if all(len(s[0]) for s in streams_of):
            queries.append(streams_of)
    result = simulate(acc, cfg, items=sum(len(s[0]) for q in queries for s in q), seed=seed,
                      stall=0.2, stimulus={"queries": queries})
    echo(f"hier-pq RTL (k={k}, streams={streams}, two systolic L1 queues per stream, "
         f"L1 length {cfg.l1}) on {len(queries)} digits queries with 20% stalls: "
         f"{result['mismatches']} mismatches against the golden model")
    return result["mismatches"] == 0


def bench_queues(echo=print, ks=(16, 64, 100), ahpq=(100, 16)):
    """yosys LUT/FF per entry of both exact queues at 32-bit distances and ids, and the AHPQ
    against an exact two-level hierarchy (``hwgen bench queues``)."""
    if yosys_path() is None:
        echo("yosys not found: nothing to measure")
        return
    echo("K-selection resources, yosys synth_xilinx -family xcup -nowidelut, 32-bit distance + "
         "32-bit id (the published HLS queue: 215 LUT + 196 FF per entry)")
    echo(_row(["queue", "k", "LUT", "FF", "LUT/entry", "FF/entry", "items/cycle"]))
    echo(_row(["---"] * 7))
    per_entry = {}
    for name in ("systolic-pq", "insert-pq"):
        acc = registry.get(name)
        for k in ks:
            cfg = acc.make_config([f"k={k}"])
            res = synthesize(acc, cfg)["resources"]
            per_entry[name, k] = (res["lut"] / k, res["ff"] / k)
            echo(_row([name, k, res["lut"], res["ff"], f"{res['lut'] / k:.1f}",
                       f"{res['ff'] / k:.1f}", cfg.performance()["items_per_cycle"]]))
    k, streams = ahpq
    acc = registry.get("hier-pq")
    cfg = acc.make_config([f"k={k}", f"streams={streams}", "queue=systolic"])
    res = synthesize(acc, cfg)["resources"]
    d = cfg.derived()
    lut_e, ff_e = per_entry.get(("systolic-pq", k), (None, None))
    echo("")
    echo(f"AHPQ k={k}, streams={streams} (two systolic L1 queues per stream: {d['l1_queues']} "
         f"queues of {d['l1_len']}, L2 of {k}): {res['lut']} LUT, {res['ff']} FF, "
         f"{d['l1_entries'] + d['l2_entries']} queue entries")
    if lut_e:
        entries = d["exact_hierarchy_entries"]
        echo(f"exact two-level hierarchy ({d['l1_queues']} L1 queues of {k} + L2 of {k}: "
             f"{entries} entries), estimated at the measured systolic-pq k={k} cost per entry: "
             f"{lut_e * entries:.0f} LUT, {ff_e * entries:.0f} FF "
             f"({lut_e * entries / res['lut']:.1f}x the AHPQ's LUTs)")


# -- ChamVS node ---------------------------------------------------------------------------------

def _model_errors(config, stim, result):
    """Per query: (measured total, predicted total) from the node's counters and the model."""
    from .model import layout_query_cycles
    data = stim["data"]
    pairs = []
    for st, probes, res in zip(result["per_query_stats"], data.probes, stim["results"]):
        pairs.append((st["stat_cycles"], layout_query_cycles(config, data.layout, probes,
                                                             len(res[0]))["total"]))
    return pairs


def run_node_case(config, *, queries, seed=1, stall=0.0, base=None, nprobe=None, log=None,
                  engine="cocotb"):
    """Simulate the node on ``queries`` queries; returns (simulate result, model pairs)."""
    acc = registry.get("chamvs-node")
    stim = acc.model.stimulus(config, queries, np.random.default_rng(seed), base=base,
                              nprobe=nprobe)
    result = simulate(acc, config, items=queries, seed=seed, stall=stall, stimulus=stim,
                      log=log, engine=engine)
    return result, _model_errors(config, stim, result)


def bench_chamvs(echo=print, queries=12, seed=1):
    """``hwgen bench chamvs``: model against simulation, scan throughput, paper projections.
    Returns True if every simulated query matched the golden model, the model's error stays
    within 5%, the long-list case scans at 0.95 of the memory limit or more and the default
    case loses no memory cycle (efficiency 0.95 or more; moved here from the test suite,
    where a 51,104-vector simulation took 180 s)."""
    from ..datasets import digits, replicated
    from .model import PAPER_DATASETS, project
    from .node import ChamVSNodeConfig
    ok = True
    big = replicated(digits()[0][:-200], 32)
    cases = [("digits (1,597 vectors), nlist 16, nprobe 4", ChamVSNodeConfig(), None),
             ("digits x32 (51,104 vectors), nlist 4, nprobe 4",
              ChamVSNodeConfig(nlist=4), big)]
    echo("ChamVS node on u250 (4 DDR4 channels, 64-byte words), m 16, k 10: 16 PQ units, scan "
         "limit 16 codes/cycle; simulation with an ideal memory (--stall 0)")
    echo(_row(["workload", "queries", "mismatches", "cycles/query (sim)", "model",
               "max model error", "LUT / scan / drain (sim)", "scan codes/cycle",
               "of limit", "memory-side efficiency"]))
    echo(_row(["---"] * 10))
    for label, cfg, base in cases:
        result, pairs = run_node_case(cfg, queries=queries, seed=seed, base=base)
        measured = np.array([p[0] for p in pairs], dtype=float)
        predicted = np.array([p[1] for p in pairs], dtype=float)
        err = np.abs(predicted - measured) / measured
        ok &= result["mismatches"] == 0 and err.max() <= 0.05
        if base is not None:      # lists long enough to hide the LUT: the scan at its limit
            ok &= result["scan_codes_per_cycle"] >= 0.95 * cfg.units
        else:                     # LUT-bound: no memory cycle lost
            ok &= result["scan_efficiency"] >= 0.95
        pq = result["per_query_cycles"]
        echo(_row([label, queries, result["mismatches"], f"{measured.mean():.0f}",
                   f"{predicted.mean():.0f}", f"{100 * err.max():.1f}%",
                   f"{pq['lut']:.0f} / {pq['scan']:.0f} / {pq['drain']:.0f}",
                   f"{result['scan_codes_per_cycle']:.2f}",
                   f"{result['scan_codes_per_cycle'] / cfg.units:.3f}",
                   f"{result['scan_efficiency']:.3f}"]))
    echo("")
    echo("Projection for the paper's data sets (Table 3: 1e9 vectors, nlist 32768, nprobe 32, "
         "K 100; 8-byte ids) on U250 nodes, from the model; databases larger than a node's "
         "64 GB are split over several nodes, which scan in parallel")
    kernel = load_board("u250").kernel_clock_mhz
    clk = measured_clock({"chamvs-node"}, kernel)
    measured_head = (f"QPS at {clk['clock_mhz']:g} MHz ({kernel:g} x measured ratio "
                     f"{ratio_text(clk['ratio'])} of {clk['block']})" if clk["clock_mhz"]
                     else f"QPS at {kernel:g} MHz x measured ratio (not measured)")
    echo(_row(["data set", "D", "m", "nodes", "PQ units", "words/list/channel",
               "cycles/query", "scan share", "QPS at 140 MHz (paper clock, declared)",
               f"QPS at {kernel:g} MHz (u250 kernel clock, declared)", measured_head,
               "Chameleon U250 LUT/FF/BRAM/URAM/DSP %"]))
    echo(_row(["---"] * 12))
    for ds in PAPER_DATASETS:
        slow, fast = project(ds, clock_mhz=140), project(ds)
        real = f"{project(ds, clock_mhz=clk['clock_mhz'])['qps']:.0f}" if clk["clock_mhz"] \
            else "-"
        echo(_row([ds.name, ds.dim, ds.m, slow["nodes"], slow["units"],
                   slow["words_per_list_channel"], slow["cycles"],
                   f"{slow['scan_share']:.3f}", f"{slow['qps']:.0f}", f"{fast['qps']:.0f}",
                   real, " / ".join(f"{v:g}" for v in ds.chameleon_percent)]))
    echo("Clocks: 140 MHz is the paper's and 300 MHz the U250 kernel clock, both declared "
         "(no Vivado here); the measured column scales the kernel clock by the node's "
         "fmax_ratio on ECP5 (hwgen/flow/timing_results.json, capped at 1), the one clock "
         "this repository measured.")
    echo("Chameleon reports its search latency only as distributions in a figure (Fig. 9: "
         "1.36-6.13x faster than CPU with the IVF index on the CPU); it publishes no QPS to set "
         "beside these numbers.")
    return ok
