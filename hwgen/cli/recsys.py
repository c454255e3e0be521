"""``hwgen recsys``: recommendation inference over an FPGA cluster: partitioning the model, the
multi-node simulation and the benchmark of the model against simulation."""

from pathlib import Path

import click

from .. import checks
from ..cli_support import log as _log
from ..cli_support import reports_errors
from ..errors import ConfigError, SimulationMismatch
from .common import board as _board
from .common import seed as _seed
from .common import alias_option, named_command, write_json

__all__ = ["recsys", "partition", "cluster_sim", "bench_recsys"]


@click.group()
def recsys():
    """Recommendation (CTR) inference: partition over FPGAs, simulate the cluster, bench."""


@recsys.command()
@click.option("--preset", help="A named model (paper-ctr, small-ctr).")
@click.option("--model", "model_file", type=click.Path(dir_okay=False),
              help="A model description JSON file instead of a preset.")
@click.option("--board", default="u280", show_default=True,
              help="Board of every node (see hwgen list --boards).")
@click.option("--nodes", type=int, default=4, show_default=True, help="FPGA nodes.")
@click.option("--dsp-per-pe", type=int, default=18, show_default=True)
@click.option("--rate", type=float, help="Inferences per second the network check assumes.")
@click.option("--link-gbps", type=float, default=100.0, show_default=True,
              help="Link bandwidth (Gb/s).")
@click.option("--out", "out_dir", type=click.Path(file_okay=False),
              help="Write one configuration JSON per node here.")
@reports_errors
def partition(preset, model_file, board, nodes, dsp_per_pe, rate, link_gbps, out_dir):
    """Partition a recommendation model's FC layers over several FPGAs."""
    from ..recsys.model import RecModel, preset as get_preset
    from ..recsys.partition import partition as run_partition
    if (preset is None) == (model_file is None):
        raise ConfigError("preset", "give exactly one of --preset and --model")
    model = get_preset(preset) if preset else RecModel.from_json(model_file)
    board_obj = _board(board)
    if out_dir:
        checks.output_dir("out", out_dir)
    plan = run_partition(model, board_obj, nodes, dsp_per_pe=dsp_per_pe, link_gbps=link_gbps,
                         inferences_per_s=rate)
    click.echo(f"{model.name} on {nodes} x {board_obj.name}: layer work ratios "
               f"{':'.join(map(str, plan.ratios))}, {dsp_per_pe} DSPs per PE")
    sizes = " / ".join(str(p) for p in plan.layer_pes)
    click.echo(f"PEs per layer: {sizes} (layers "
               + ", ".join(f"{i}x{o}" for i, o in model.layer_shapes[:len(plan.layer_pes)])
               + f"): the largest power-of-two multiple ({plan.unit}) of the work ratios that "
               f"fits {nodes} x {board_obj.resources['dsp']:,} DSPs")
    tables = plan.placement
    click.echo(f"embedding tables on node 1: {len(tables.onchip)} on chip "
               f"({tables.onchip_bytes:,} B), {len(model.tables) - len(tables.onchip)} off chip "
               f"on {len(tables.channels)} memory channels; lookups allow "
               f"{tables.inferences_per_s:,.0f} inferences/s")
    click.echo(f"{'node':>4} {'PEs (layer: count)':<28} {'DSP':>6} {'DSP %':>7} "
               f"{'BRAM18':>7} {'BRAM %':>7} {'recv B/inf':>10} {'send B/inf':>10}")
    for n in plan.nodes:
        pes = ", ".join(f"L{s.layer + 1}: {s.pes}" for s in n.slices)
        extra = (" +emb" if n.embedding else "") + (" +out" if n.output_unit else "")
        click.echo(f"{n.node:>4} {pes + extra:<28} {n.dsp:>6} {n.dsp_percent:>6.2f}% "
                   f"{n.bram18:>7} {n.bram_percent:>6.2f}% {n.recv_bytes:>10} {n.send_bytes:>10}")
    busiest = max(max(n.recv_bytes, n.send_bytes) for n in plan.nodes)
    if busiest:
        click.echo(f"links allow up to {link_gbps * 1e9 / 8 / busiest:,.0f} inferences/s "
                   f"({busiest} bytes per inference on the busiest link at {link_gbps:g} Gb/s)")
    if plan.problems:          # nothing is written for a plan that does not fit
        value = {"nodes": nodes, "rate": rate}[plan.blame]
        raise ConfigError(plan.blame, "infeasible: " + "; ".join(plan.problems), value=value)
    if out_dir:
        out = Path(out_dir)
        for n in plan.nodes:
            write_json(out / f"node{n.node}.json", {"model": model.to_dict(),
                                                     "board": board_obj.name, **n.to_dict()})
        click.echo(f"wrote {len(plan.nodes)} node configurations to {out}")


@recsys.command("cluster-sim")
@click.option("--preset", default="cluster-ctr", show_default=True, help="A named model.")
@click.option("--nodes", type=int, default=2, show_default=True, help="FPGA nodes.")
@click.option("--latency-ns", type=float, default=1000.0, show_default=True,
              help="One-way network latency (simulated ns).")
@click.option("--link-gbps", type=float, default=100.0, show_default=True,
              help="Link bandwidth (Gb/s).")
@alias_option("--gbps", "link_gbps", type=float)
@click.option("--clock-mhz", type=float, default=135.0, show_default=True,
              help="The nodes' clock (converts the network's ns to cycles).")
@click.option("--items", type=int, default=40, show_default=True, help="Inferences.")
@click.option("--stall", type=float, default=0.0, show_default=True,
              help="Probability per cycle of an input gap and of output backpressure.")
@click.option("--seed", type=int, default=1, show_default=True)
@click.option("--json", "json_path", type=click.Path(dir_okay=False))
@reports_errors
def cluster_sim(preset, nodes, latency_ns, link_gbps, clock_mhz, items, stall, seed, json_path):
    """Every node's top in Verilator, activations exchanged through a network model."""
    from ..recsys.multinode import Network, plan_cluster, report_lines, simulate_cluster
    checks.at_least("nodes", nodes, 1)
    checks.at_least("items", items, 1)
    checks.probability("stall", stall)
    _seed(seed)
    if json_path:
        checks.output_file("json", json_path)
    network = Network(latency_ns=latency_ns, gbps=link_gbps, clock_mhz=clock_mhz)
    report = simulate_cluster(plan_cluster(preset, nodes), items=items, seed=seed,
                              stall=stall, network=network, log=_log)
    for line in report_lines(report):
        click.echo(line)
    if json_path:
        write_json(json_path, report)
    if report["mismatches"] or report["block_mismatches"] or report["timeouts"]:
        raise SimulationMismatch(f"{report['mismatches']} of {report['outputs']} outputs differ "
                                 f"from the golden model ({report['block_mismatches']} block "
                                 f"beats, {report['timeouts']} timeouts)")


#: Options of ``hwgen bench recsys`` that only the CPU baseline uses: their names on the
#: command line and their defaults.
_CPU_OPTIONS = {"cpu_preset": ("cpu-preset", "paper-ctr"), "batches": ("batch", None),
                "cpu_seconds": ("cpu-seconds", 1.0), "threads": ("threads", None),
                "cpu_tables": ("cpu-tables", "auto"), "cpu_dir": ("cpu-dir", None)}


@click.command("recsys")
@click.option("--no-sim", is_flag=True, help="Skip the simulations (model tables only).")
@click.option("--cpu", is_flag=True,
              help="Also run the model's inference on this machine's CPU (PyTorch) and print "
              "the measured rate beside the FPGA figures and the paper's CPU.")
@click.option("--cpu-preset", help="Model run on the CPU [default: paper-ctr; speed-ups over "
              "the measured CPU only for paper-ctr].")
@click.option("--batch", "batches", type=int, multiple=True,
              help="Batch size measured on the CPU (repeatable) [default: 1 and 1024, the "
              "paper's batch].")
@click.option("--cpu-seconds", type=float,
              help="Timed seconds per batch size, after 2 warm-up batches and at least 5 "
              "timed batches [default: 1].")
@click.option("--threads", type=int,
              help="PyTorch threads for the CPU baseline (1..256) [default: PyTorch's, one "
              "per core].")
@click.option("--cpu-tables", type=click.Choice(["auto", "memory", "mmap"]),
              help="Embedding tables held in memory or memory-mapped from a file [default: "
              "auto: in memory up to 4 GiB, else mapped; paper-ctr's 15.1 GB are mapped].")
@click.option("--cpu-dir", type=click.Path(file_okay=False),
              help="Folder of the memory-mapped table file [default: recsys-cpu in the build cache].")
@click.option("--seed", type=int, default=1, show_default=True,
              help="Seed of the CPU baseline's indices and dense features.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False),
              help="Write the report (simulation rows, CPU measurement, designs) as JSON.")
@reports_errors
def bench_recsys(no_sim, cpu, json_path, seed, **cpu_options):
    """Recommendation: model vs simulation, lookup placement, the CPU measured here (--cpu),
    predicted designs beside the paper."""
    from ..recsys.bench import bench_recsys as run_bench
    from ..recsys.cpu_baseline import DEFAULT_BATCHES, check_options
    given = [name for name, value in cpu_options.items() if value not in (None, ())]
    if given and not cpu:
        raise ConfigError(_CPU_OPTIONS[given[0]][0], "only with --cpu",
                          value=cpu_options[given[0]])
    _seed(seed)
    if json_path:
        checks.output_file("json", json_path)
    options = None
    if cpu:
        o = {k: v if v not in (None, ()) else _CPU_OPTIONS[k][1]
             for k, v in cpu_options.items()}
        options = {"preset_name": o["cpu_preset"], "batches": tuple(o["batches"] or
                                                                    DEFAULT_BATCHES),
                   "seconds": o["cpu_seconds"], "threads": o["threads"],
                   "tables": o["cpu_tables"], "directory": o["cpu_dir"], "seed": seed}
        check_options(options["preset_name"], options["batches"], options["seconds"],
                      options["threads"], options["tables"])
        if o["cpu_dir"]:
            checks.output_dir("cpu-dir", o["cpu_dir"])
    report = run_bench(echo=click.echo, simulate_blocks=not no_sim, cpu=options, log=_log)
    if json_path:
        write_json(json_path, report)
    if not report["ok"]:
        raise SimulationMismatch("a recsys block disagreed with its golden model or its "
                                 "cycle model is off by more than 5%")


recsys.add_command(named_command(bench_recsys, "bench"))
