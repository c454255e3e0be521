"""``hwgen chamvs``: the ChamVS vector-search node: the demo, the node server, shards, L1 queue
sizing and the benchmarks of its blocks."""

import sys

import click

from .. import checks
from ..cli_support import log as _log
from ..cli_support import reports_errors
from ..contract import RESOURCE_KEYS
from ..errors import ConfigError, SimulationMismatch
from ..vecsearch.host import node_server
from .common import config as _config
from .common import k_option, named_command, progress, with_config_options
from .common import seed as _seed

__all__ = ["chamvs", "demo", "BENCHES", "explore_lines"]


@click.group()
def chamvs():
    """ChamVS: the vector-search memory node, its server, shards and benchmarks."""


@chamvs.command()
@click.option("--queries", type=int, default=20, show_default=True)
@click.option("--stall", type=float, default=0.1, show_default=True,
              help="Probability per cycle of an input gap and of output backpressure.")
@click.option("--seed", type=int, default=1, show_default=True)
@reports_errors
def demo(queries, stall, seed):
    """The ChamVS node's Verilog searching the digits data set, checked against faiss."""
    from ..vecsearch.demo import run_demo
    checks.at_least("queries", queries, 1)
    checks.probability("stall", stall)
    _seed(seed)
    if not run_demo(queries=queries, stall=stall, seed=seed, echo=click.echo,
                    progress=progress()):
        raise SimulationMismatch("the node's results differ from its golden model")


@chamvs.command("serve")
@click.argument("shard", type=click.Path(dir_okay=False))
@click.option("--port", type=click.IntRange(0, 65535), default=0, show_default=True,
              help="TCP port, 0 = any free one (printed as `listening on PORT`).")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--backend", type=click.Choice(["golden", "rtl"]), default="golden",
              show_default=True, help="golden: the node's golden model; rtl: its Verilog on "
              "Verilator, checked against the golden model.")
@click.option("--timeout", type=click.FloatRange(0, min_open=True),
              default=node_server.DEFAULT_TIMEOUT, show_default=True,
              help="Seconds a connection may idle, and a message may take to arrive.")
@click.option("--max-queries", type=click.IntRange(1), default=node_server.DEFAULT_MAX_QUERIES,
              show_default=True, help="Most queries in one search request.")
@click.option("--max-inflight-bytes", type=click.IntRange(1),
              default=node_server.DEFAULT_MAX_INFLIGHT, show_default=True,
              help="Request bytes held by all connections together.")
@click.option("--max-connections", type=click.IntRange(1),
              default=node_server.DEFAULT_MAX_CONNECTIONS, show_default=True,
              help="Connections served at once.")
@click.option("--loop", type=click.Choice(node_server.LOOPS),
              help="Event loop (default: uvloop where installed, else asyncio).")
@reports_errors
def serve(shard, port, host, backend, timeout, max_queries, max_inflight_bytes,
          max_connections, loop):
    """Serve one node SHARD (from `hwgen chamvs shard`) over TCP until interrupted; the same
    program as `python -m hwgen.vecsearch.host.node_server`."""
    sys.exit(node_server.main([
        str(shard), "--port", str(port), "--host", host, "--backend", backend,
        "--timeout", repr(timeout), "--max-queries", str(max_queries),
        "--max-inflight-bytes", str(max_inflight_bytes),
        "--max-connections", str(max_connections)] + (["--loop", loop] if loop else [])))


@chamvs.command("shard")
@click.argument("base", type=click.Path(dir_okay=False))
@with_config_options
@click.option("--nodes", type=int, default=2, show_default=True, help="Memory nodes.")
@click.option("--scheme", type=click.Choice(["split-lists", "whole-lists"]),
              default="split-lists", show_default=True,
              help="split-lists: every node a share of every list; whole-lists: list l on "
                   "node l % N.")
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False),
              help="Folder receiving node0.npz ... node{N-1}.npz.")
@reports_errors
def chamvs_shard(base, sets, config_file, nodes, scheme, out_dir):
    """Train the node's IVF-PQ index on BASE (.npy vectors) and write one shard per node,
    for `hwgen chamvs serve SHARD.npz`."""
    from ..vecsearch.host.shard import make_shards
    from ..vecsearch.node_model import load_vectors
    checks.at_least("nodes", nodes, 1, 1024)
    vectors = load_vectors(base, "base")
    sets = list(sets)
    if not any(s.startswith("dim=") for s in sets):
        sets.append(f"dim={vectors.shape[1]}")
    _, cfg = _config("chamvs-node", sets, config_file, None)
    checks.output_dir("out", out_dir)
    for path in make_shards(cfg, vectors, nodes, scheme, out_dir, log=_log):
        click.echo(str(path))


@chamvs.command("size-queues")
@k_option(100, "Results per query.")
@click.option("--streams", type=int, multiple=True,
              help="L1 queue counts (repeatable; default 4 8 16 32).")
@click.option("--target", type=float, default=0.99, show_default=True,
              help="Required probability.")
@reports_errors
def size_queues(k, streams, target):
    """L1 queue lengths of the approximate hierarchical priority queue (binomial sizing)."""
    from ..vecsearch.sizing import sizing_table
    checks.at_least("k", k, 1)
    for n in streams:
        checks.at_least("streams", n, 1)
    if not 0 < target < 1:
        raise ConfigError("target", "must be a probability strictly between 0 and 1",
                          value=target)
    rows = sizing_table(k, streams or (4, 8, 16, 32), target)
    click.echo(f"L1 queue length for k={k}, target {target}: top-k items fall into each of "
               f"the L1 queues with equal probability (binomial)")
    click.echo(f"{'L1 queues':>9} {'all-queues':>10} {'per-queue':>9} {'P(exact query)':>14} "
               f"{'L1 entries':>10} {'exact L1':>8} {'saved':>6}")
    for r in rows:
        click.echo(f"{r['streams']:>9} {r['l1_len']:>10} {r['l1_len_per_queue']:>9} "
                   f"{r['p_exact_query']:>14.4f} {r['l1_entries']:>10} "
                   f"{r['exact_l1_entries']:>8} {r['saving']:>6.0%}")


@click.command("pq-decoder")
@reports_errors
def bench_pq_decoder():
    """Results per cycle, latency and yosys counts at m = 16/32/64, 16/24-bit LUTs."""
    from ..vecsearch.bench import bench_pq_decoder as run_bench
    run_bench(echo=click.echo)


@click.command("lut-builder")
@reports_errors
def bench_lut_builder():
    """Rows per cycle, latency and yosys counts of the LUT builder at D=128, m=16."""
    from ..vecsearch.bench import bench_lut_builder as run_bench
    run_bench(echo=click.echo)


@click.command("kselect")
@click.option("--queries", type=int, default=20000, show_default=True,
              help="Random queries per row.")
@click.option("--seed", type=int, default=1, show_default=True)
@reports_errors
def bench_kselect(queries, seed):
    """Exactness of the approximate hierarchical queue (random and digits data)."""
    from ..vecsearch.bench import bench_kselect as run_bench
    checks.at_least("queries", queries, 1)
    _seed(seed)
    if not run_bench(echo=click.echo, queries=queries, seed=seed):
        raise SimulationMismatch("a K-selection row misses its exactness target")


class _QueriesOption(click.ParamType):
    """``--queries``: a ``.npy`` file of query vectors, or an integer (the old spelling of
    ``--sim-queries``)."""
    name = "FILE.npy"

    def convert(self, value, param, ctx):
        if isinstance(value, int) or str(value).lstrip("-").isdigit():
            return int(value)
        return str(value)


class _PercentOption(click.ParamType):
    """``85%`` or ``85``: a percentage."""
    name = "PERCENT"

    def convert(self, value, param, ctx):
        if isinstance(value, (int, float)):
            return float(value)
        try:
            return float(str(value).rstrip("%"))
        except ValueError:
            self.fail(f"{value!r} is not a percentage such as 85%", param, ctx)


@chamvs.command("explore")
@click.option("--base", required=True, type=click.Path(dir_okay=False),
              help=".npy database vectors (float: quantised to the node's 8 bits; integer: as "
                   "they are).")
@click.option("--queries", required=True, type=click.Path(dir_okay=False),
              help=".npy query vectors (held out from the base).")
@click.option("--gt", type=click.Path(dir_okay=False),
              help=".npy ids of each query's exact nearest neighbours in the base (default: "
                   "computed with faiss IndexFlatL2).")
@click.option("--recall", "goal", default="0.9@10", show_default=True,
              help="Goal: recall of the true R nearest among the first R found, as RECALL@R.")
@click.option("--board", default="u250", show_default=True, help="Target board.")
@click.option("--nodes", type=int, default=1, show_default=True,
              help="Memory nodes sharing every list (each holds 1/N of it).")
@click.option("--budget", type=_PercentOption(), default="85%", show_default=True,
              help="Share of every board resource a node may use.")
@click.option("--sample", type=int, default=100_000, show_default=True,
              help="Base vectors the index search trains on (a larger base is subsampled at "
                   "random and the result says so).")
@click.option("--max-queries", type=int, default=200, show_default=True,
              help="Queries measured (drawn at random from --queries).")
@click.option("--nlist", "nlists", type=int, multiple=True,
              help="IVF list counts searched (repeatable; default: powers of two within 2x of "
                   "sqrt(n)).")
@click.option("--m", "ms", type=int, multiple=True,
              help="PQ bytes per code searched (repeatable; default 8, 16, 32, 64).")
@click.option("--channels", type=int, multiple=True,
              help="Memory channel counts searched (repeatable; default 1..all).")
@click.option("--opq", type=click.Choice(["both", "no", "yes"]), default="both",
              show_default=True,
              help="Index settings measured without and/or with an OPQ rotation (applied to "
                   "the base and the queries on the host; the node has none).")
@k_option(None, "Results per query (default: the goal's R).")
@click.option("--refine", "refines", type=int, multiple=True,
              help="Re-ranking factors searched (repeatable; default 1 and 4): the node "
                   "returns refine x k results and the host keeps the k nearest by exact "
                   "distance on the stored vectors (1: no re-ranking).")
@click.option("--max-estimates", type=int, default=24, show_default=True,
              help="Most netlist resource estimates (10-20 s each, on Dask).")
@click.option("--workers", type=int, default=None,
              help="Dask LocalCluster workers for the estimates (default: every core).")
@click.option("--scheduler", default=None,
              help="A Dask scheduler address (tcp://HOST:PORT) instead of a LocalCluster.")
@click.option("--validate", "validate_count", type=int, default=0, show_default=True,
              help="Simulate the N best designs on the native engine on the whole base.")
@click.option("--validate-queries", type=int, default=8, show_default=True,
              help="Queries simulated per validated design.")
@click.option("--synth/--no-synth", "validate_synth", default=True, show_default=True,
              help="Map each validated design with yosys synth_xilinx (about 2 min for a "
                   "four-channel node) and check the resource estimate against it.")
@click.option("--seed", type=int, default=1234, show_default=True)
@click.option("--json", "json_path", type=click.Path(dir_okay=False),
              help="Write the front, the chosen design and the validations as JSON.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False),
              help="Write the QPS-recall plot (PNG).")
@click.option("--config-out", type=click.Path(dir_okay=False),
              help="Write the chosen design as a configuration for hwgen build / hwgen sim "
                   "chamvs-node --config (default: beside --json, NAME.config.json).")
@reports_errors
def explore_cmd(base, queries, gt, goal, board, nodes, budget, sample, max_queries, nlists, ms,
                channels, opq, k, refines, max_estimates, workers, scheduler, validate_count,
                validate_queries, validate_synth, seed, json_path, plot_path, config_out):
    """From a user's vectors and a recall goal to the fastest ChamVS node that fits: the index
    (nlist, m, nprobe) measured by faiss on the data, the node (channels, LUT-builder width,
    queue kind) by the cycle model, the measured clock ratio and netlist resource estimates."""
    import json
    from pathlib import Path

    import numpy as np

    from ..vecsearch.explore import explore, parse_goal, plot_front, validate
    from ..vecsearch.node_model import load_vectors
    from .common import write_json
    goal = parse_goal(goal)
    checks.at_least("nodes", nodes, 1, 1024)
    checks.at_least("sample", sample, 256)
    checks.at_least("max-queries", max_queries, 1)
    checks.at_least("max-estimates", max_estimates, 1, 10_000)
    checks.at_least("validate", validate_count, 0, 32)
    checks.at_least("validate-queries", validate_queries, 1, 10_000)
    if workers is not None:
        checks.at_least("workers", workers, 1, 1024)
    base_v = load_vectors(base, "base")
    queries_v = load_vectors(queries, "queries")
    gt_v = None
    if gt is not None:
        gt_v = load_vectors(gt, "gt")
        if not np.issubdtype(gt_v.dtype, np.integer):
            raise ConfigError("gt", "must hold integer ids", value=gt)
    result = explore(base_v, queries_v, goal=goal, board=board, gt=gt_v, nodes=nodes,
                     budget=budget, sample=sample, max_queries=max_queries,
                     nlists=list(nlists) or None, ms=list(ms) or None,
                     channels=list(channels) or None, seed=seed, k=k,
                     max_estimates=max_estimates, scheduler=scheduler, workers=workers,
                     opq={"both": (False, True), "no": (False,), "yes": (True,)}[opq],
                     refines=list(refines) or None, log=_log)
    for line in explore_lines(result):
        click.echo(line)
    if result["chosen"] and validate_count:
        result["validated"] = validate(result, base_v, queries_v, validate_count, gt=gt_v,
                                       sim_queries=validate_queries, seed=seed,
                                       synth=validate_synth, log=_log)
        for v in result["validated"]:
            c = v["config"]
            click.echo(f"  validated nlist {c['nlist']}, m {c['m']}, nprobe {v['nprobe']}, "
                       + (f"re-ranking {c['k']} results, " if v["refine"] > 1 else "")
                       + f"channels {c['channels'] or 'all'}, lut_sub_par {c['lut_sub_par']}, "
                       f"{c['queue']}: recall@{goal.at} {v['recall']:.3f} on "
                       f"{len(base_v):,} vectors"
                       + ("" if v["reaches_goal"] else " (below the goal at this size)")
                       + f"; {v['mismatches']} mismatches in "
                       f"{v['simulated_queries']} simulated queries; model "
                       f"{v['model_error_mean']:.1%} off the simulated cycles")
            click.echo("    " + yosys_line(v["resources_yosys"]))
    if config_out is None and json_path and result["chosen"]:
        config_out = str(Path(json_path).with_suffix("")) + ".config.json"
    if config_out and result["chosen"]:
        write_json(config_out, result["chosen"]["config"])
        click.echo(f"  chosen design written to {config_out} (hwgen build chamvs-node --config "
                   f"{config_out}; hwgen sim chamvs-node --config {config_out} --base {base} "
                   f"--queries {queries} --nprobe {result['chosen']['nprobe']})")
        if result["chosen"]["opq"]:
            from ..vecsearch.explore import opq_rotation
            rot_path = str(Path(config_out).with_suffix("")).removesuffix(".config") + ".opq.npy"
            np.save(rot_path, opq_rotation(base_v, result["chosen"]["m"], seed))
            result["chosen"]["rotation"] = rot_path
            click.echo(f"  the design searches OPQ-rotated vectors: rotation (D x D, trained on "
                       f"the whole base) written to {rot_path}; rotate the base and every "
                       "query on the host as x @ R.T before sharding, simulating or sending")
    if json_path:
        write_json(json_path, json.loads(json.dumps(result, default=float)))
        click.echo(f"  wrote {json_path}")
    if plot_path:
        click.echo(f"  wrote {plot_front(result, plot_path)}")
    if result["chosen"] is None:
        raise ConfigError("recall", result["limit"], value=str(goal))
    bad = [v for v in result.get("validated", []) if not v["ok"]]
    if bad:
        raise SimulationMismatch(f"{len(bad)} validated design(s) mismatched the golden model, "
                                 "were more than 5% off the cycle model or outside the "
                                 "resource estimate's stated error")


def yosys_line(check):
    """One line: a validated design's resources, yosys against the estimate."""
    if not check.get("checked"):
        return f"resources not checked by yosys: {check['why']}"
    parts = [f"{key} {check[key]['yosys']:,} (estimate {check[key]['estimate']:,}"
             + (f", x{check[key]['ratio']:.2f}" if check[key]["ratio"] is not None else "")
             + ")" for key in RESOURCE_KEYS]
    verdict = ("within the estimate's stated error" if check["ok"] else
               "OUTSIDE the estimate's stated error: " + ", ".join(
                   k for k in RESOURCE_KEYS if not check[k]["within"]))
    took = f"{check['seconds']:.0f} s" if check["seconds"] >= 0.5 else "cached"
    return f"yosys synth_xilinx ({took}): " + ", ".join(parts) + f"; {verdict}"


def explore_lines(result):
    """The explore result as text: the data, the clock, the front and the chosen design."""
    clock = result["clock"]
    lines = [f"explore: {result['base_vectors']:,} vectors (D {result['dim']}), "
             f"{result['queries']} queries, goal recall@{result['goal'].split('@')[1]} >= "
             f"{result['goal'].split('@')[0]}, {result['board']}, {result['nodes']} node(s), "
             f"budget {result['budget_percent']:g}%",
             f"  clock {clock['mhz']:g} MHz (" + (f"kernel clock x measured fmax_ratio "
                                                  f"{clock['ratio']:.3f} of {clock['block']})"
                                                  if clock["measured"] else "declared)"),
             f"  {len(result['index_points'])} index settings (nlist, m, nprobe) measured, "
             f"{result['designs']} designs "
             f"modelled, {result['estimated']} resource estimates; {result['seconds']:.0f} s"]
    lines += [f"  note: {n}" for n in result["notes"]]
    lines.append("  front (recall, QPS, nlist, m, nprobe, OPQ, re-ranking, channels, "
                 "lut_sub_par, queue, binding resource):")
    for r in result["front"]:
        mark = "  <- chosen" if r is result["chosen"] else ""
        lines.append(f"    {r['recall']:.3f} {r['qps']:>10,.0f}  {r['nlist']:>6} {r['m']:>3} "
                     f"{r['nprobe']:>4} {'OPQ' if r.get('opq') else '-':>3} "
                     f"{'x' + str(r['refine']) if r.get('refine', 1) > 1 else '-':>4} "
                     f"{r['channels']:>3} {r['lut_sub_par']:>3} "
                     f"{r['queue']:<8} " + (f"{r['binding']} {r['percent'][r['binding']]:.1f}%"
                                            if r["binding"] else "not estimated") + mark)
    return lines


@click.command("chamvs")
@click.option("--base", type=click.Path(dir_okay=False),
              help=".npy database vectors (float or integer); with it the node and CPU faiss "
                   "search the same index (default data: the digits set).")
@click.option("--queries", "queries", type=_QueriesOption(), default=None,
              help=".npy query vectors for --base (an integer N here is the old spelling of "
                   "--sim-queries N).")
@click.option("--sim-queries", type=int, default=None,
              help="Queries simulated on the node's Verilog per row [default: 12 for the "
                   "model-vs-simulation table, 20 for the CPU comparison].")
@click.option("--nprobe", type=int, default=None,
              help="Lists probed per query (default: the configuration's nprobe_max).")
@with_config_options
@click.option("--threads", type=int, default=None,
              help="CPU faiss threads (default: every core).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False),
              help="Write the CPU comparison as JSON.")
@reports_errors
def bench_chamvs(base, queries, sim_queries, nprobe, sets, config_file, threads, json_path):
    """ChamVS node: model vs simulation, scan throughput, projected QPS of the paper's data,
    and the node beside CPU faiss on the same data (--base/--queries, or the digits set)."""
    from ..vecsearch.baseline import compare, compare_lines
    from ..vecsearch.bench import bench_chamvs as run_bench
    from ..vecsearch.node_model import load_vectors
    from .common import write_json
    if isinstance(queries, int):
        sim_queries, queries = queries, None
    if sim_queries is not None:
        checks.at_least("sim-queries", sim_queries, 1)
    if threads is not None:
        checks.at_least("threads", threads, 1)
    if queries is not None and base is None:
        raise ConfigError("queries", "a query file needs --base")
    ok = True
    if base is None and not sets and config_file is None:
        ok = run_bench(echo=click.echo, queries=sim_queries or 12)
        click.echo("")
    base_v = load_vectors(base, "base") if base is not None else None
    queries_v = load_vectors(queries, "queries") if queries is not None else None
    sets = list(sets)
    if base_v is not None and not any(s.startswith("dim=") for s in sets):
        sets.append(f"dim={base_v.shape[1]}")
    _, cfg = _config("chamvs-node", sets, config_file, None)
    result = compare(cfg, base=base_v, queries=queries_v, nprobe=nprobe,
                     sim_queries=sim_queries or 20, threads=threads, log=_log)
    for line in compare_lines(result):
        click.echo(line)
    if json_path:
        from ..flow.provenance import measured
        write_json(json_path, {**result, "measured": measured()})
    if not (ok and result["ok"]):
        raise SimulationMismatch("the node disagreed with its golden model or its cycle model")


@click.command("queues")
@reports_errors
def bench_queues():
    """LUT/FF per entry of systolic-pq and insert-pq, AHPQ versus an exact hierarchy."""
    from ..vecsearch.bench import bench_queues as run_bench
    run_bench(echo=click.echo)


chamvs.add_command(named_command(bench_chamvs, "bench"))

#: The benchmarks of the node and its blocks, listed by ``hwgen bench``.
BENCHES = (bench_chamvs, bench_pq_decoder, bench_lut_builder, bench_kselect, bench_queues)
