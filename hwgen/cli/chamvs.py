"""``hwgen chamvs``: the ChamVS vector-search node: the demo, the node server, shards, L1 queue
sizing and the benchmarks of its blocks."""

import sys

import click

from .. import checks
from ..cli_support import log as _log
from ..cli_support import reports_errors
from ..errors import ConfigError, SimulationMismatch
from ..vecsearch.host import node_server
from .common import config as _config
from .common import k_option, progress, with_config_options
from .common import seed as _seed

__all__ = ["chamvs", "demo", "BENCHES"]


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
@reports_errors
def serve(shard, port, host, backend, timeout, max_queries, max_inflight_bytes,
          max_connections):
    """Serve one node SHARD (from `hwgen chamvs shard`) over TCP until interrupted; the same
    program as `python -m hwgen.vecsearch.host.node_server`."""
    sys.exit(node_server.main([
        str(shard), "--port", str(port), "--host", host, "--backend", backend,
        "--timeout", repr(timeout), "--max-queries", str(max_queries),
        "--max-inflight-bytes", str(max_inflight_bytes),
        "--max-connections", str(max_connections)]))


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
        write_json(json_path, result)
    if not (ok and result["ok"]):
        raise SimulationMismatch("the node disagreed with its golden model or its cycle model")


@click.command("queues")
@reports_errors
def bench_queues():
    """LUT/FF per entry of systolic-pq and insert-pq, AHPQ versus an exact hierarchy."""
    from ..vecsearch.bench import bench_queues as run_bench
    run_bench(echo=click.echo)


chamvs.add_command(bench_chamvs, "bench")

#: The benchmarks of the node and its blocks, listed by ``hwgen bench``.
BENCHES = (bench_chamvs, bench_pq_decoder, bench_lut_builder, bench_kselect, bench_queues)
