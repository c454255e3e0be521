"""The ``hwgen`` command line: list, build, sim, synth, timing, bench.

Every command takes the accelerator's parameters from its defaults, then ``--config FILE.json``,
then ``--set key=value`` (repeatable). Invalid input is reported on one line naming the parameter
and its allowed range, with exit status 2; a simulation that disagrees with the golden model
exits with status 1.
"""

import json
import sys
from pathlib import Path

import click

from . import checks, registry
from .cli_support import DEBUG as _DEBUG
from .cli_support import _fail, _report, reports_errors
from .cli_support import log as _log
from .errors import ConfigError, SimulationMismatch
from .host.espn.cli import espn
from .host.ralm.cli import ralm
from .host.windve.cli import serve

__all__ = ["main"]


class _Main(click.Group):
    """The ``hwgen`` group: click's own usage errors also become one line."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True,
             **extra):
        try:
            rv = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except click.exceptions.ClickException as e:
            hint = ""
            if isinstance(e, click.UsageError) and e.ctx is not None:
                hint = f" (see `{e.ctx.command_path} --help`)"
            _fail(" ".join(e.format_message().split()) + hint, e.exit_code)
        except click.exceptions.Abort:
            _fail("aborted", 1)
        except (click.exceptions.Exit, SystemExit):
            raise
        except Exception as e:      # raised while parsing (e.g. loading a model's options)
            if _DEBUG["on"]:
                raise
            _report(e)
        if standalone_mode:
            sys.exit(rv if isinstance(rv, int) else 0)
        return rv


def _board(name):
    if name is None:
        return None
    from .boards import load_board
    return load_board(name)


def _config(name, sets, config_file, board):
    acc = registry.get(name)
    return acc, acc.make_config(sets, config_file, board)


def _write_json(path, data):
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(data, indent=2) + "\n")


def _seed(seed):
    return checks.at_least("seed", seed, 0, checks.SEED_MAX)


config_options = [
    click.option("--set", "sets", multiple=True, metavar="KEY=VALUE",
                 help="Override one parameter (repeatable)."),
    click.option("--config", "config_file", type=click.Path(dir_okay=False),
                 help="JSON file of parameters."),
]


def with_config_options(fn):
    for option in reversed(config_options):
        fn = option(fn)
    return fn


@click.group(cls=_Main, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="hwgen")
@click.option("--debug", is_flag=True, help="Show tracebacks instead of one-line errors "
              "(also HWGEN_DEBUG=1).")
def main(debug):
    """hwgen: generate, simulate and size data-centre ML accelerators."""
    if debug:
        _DEBUG["on"] = True


@main.command("list")
@click.argument("name", required=False)
@click.option("--boards", is_flag=True, help="List the target boards instead (vendor boards, "
              "then the open-flow ECP5 boards).")
@reports_errors
def list_cmd(name, boards):
    """List accelerators (or boards); with NAME, show its parameters."""
    if boards:
        from .boards import board_names, load_board
        from .flow.openboard import OPEN_BOARDS
        for b in map(load_board, board_names()):
            mem = ", ".join(f"{mc.count}x {mc.kind}" for mc in b.memory)
            click.echo(f"{b.name:<11} {b.title:<28} {b.part:<26} {mem}; "
                       f"{b.kernel_clock_mhz:g} MHz")
        for board, (platform, what) in OPEN_BOARDS.items():
            click.echo(f"{board:<11} {what:<28} open flow: self-test bitstream "
                       f"(amaranth-boards {platform.rpartition(':')[2]})")
        return
    if name:
        acc = registry.get(name)
        click.echo(f"{acc.name}: {acc.summary}\n")
        for pname, default, allowed, doc in acc.config.describe():
            click.echo(f"  {pname:<12} default {default!s:<6} {allowed:<26} {doc}")
        return
    for acc in registry.ACCELERATORS.values():
        click.echo(f"{acc.name:<14} {acc.summary}")


@main.command("config")
@click.argument("name")
@with_config_options
@click.option("--board", help="Board whose defaults apply (see hwgen list --boards).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False),
              help="Write the configuration as a JSON file usable with --config.")
@reports_errors
def config_cmd(name, sets, config_file, board, json_path):
    """Validate a configuration and print it resolved (defaults, file, --set), with the
    values derived from it; nothing is built."""
    acc, cfg = _config(name, sets, config_file, _board(board))
    if json_path:
        checks.output_file("json", json_path)
        _write_json(json_path, cfg.to_dict())
    click.echo(json.dumps({"accelerator": acc.name, "config": cfg.to_dict(),
                           "derived": cfg.derived()}, indent=2, default=str))


@main.command()
@click.argument("name")
@with_config_options
@click.option("--board", help="Target board (see hwgen list --boards); an open-flow ECP5 "
              "board (ecpix5-85, ecpix5-45, ulx3s-85f) gives a self-test bitstream.")
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False),
              help="Output directory.")
@click.option("--synth/--no-synth", default=False,
              help="Also run yosys and put the resource estimate in report.json.")
@reports_errors
def build(name, sets, config_file, board, out_dir, synth):
    """Generate Verilog, ports.json, report.json and vendor files."""
    from .flow.build import build_accelerator
    from .flow.openboard import OPEN_BOARDS, build_bitstream
    open_board = board in OPEN_BOARDS
    board_obj = None if open_board else _board(board)
    acc, cfg = _config(name, sets, config_file, board_obj)
    checks.output_dir("out", out_dir)
    written = build_accelerator(acc, cfg, board_obj, Path(out_dir), synth=synth, log=_log)
    if open_board:
        paths, report = build_bitstream(acc, cfg, board, Path(out_dir), log=_log)
        written += paths
    for path in written:
        click.echo(str(path))
    if open_board:
        click.echo(f"{report['platform']}: post-route Fmax {report['fmax_mhz']} MHz at the "
                   f"board's {report['board_clock_mhz']:g} MHz clock: timing "
                   f"{'met' if report['timing_met'] else 'NOT met'}; self-test of "
                   f"{report['bist_items']} items, {report['leds']}")


class _WithModelOptions(click.Command):
    """A command taking an accelerator NAME whose model adds its own options
    (:attr:`hwgen.flow.model.StreamModel.sim_options`) once NAME is known: ``hwgen sim
    chamvs-node --help`` lists ``--base``, ``--nprobe`` ...; the options of one model given to
    another are refused naming their owner."""

    _META = "hwgen.model_options"

    def parse_args(self, ctx, args):
        name = next((a for a in args if a in registry.ACCELERATORS), None)
        ctx.meta[self._META] = _model_params(name) if name else []
        original = list(args)                   # click's parser consumes ``args``
        try:
            return super().parse_args(ctx, args)
        except click.NoSuchOption as e:
            owners = [other for other in registry.names() if other != name and any(
                opt.flag == e.option_name for opt in registry.get(other).model.sim_options)]
            if not owners or name is None:
                raise
            at = original.index(e.option_name) if e.option_name in original else -1
            raw = original[at + 1] if 0 <= at < len(original) - 1 else None
            value = int(raw) if raw is not None and raw.isdigit() else raw
            error = ConfigError(e.option_name[2:].replace("-", "_"), "is an option of "
                                f"{', '.join(owners)}, not of {name}", value=value)
            raise click.UsageError(str(error), ctx) from None

    def get_params(self, ctx):
        return super().get_params(ctx) + ctx.meta.get(self._META, [])


def _model_params(name):
    """click options of accelerator ``name``'s model."""
    params = []
    for opt in registry.get(name).model.sim_options:
        kind = click.Path(dir_okay=False) if opt.kind == "path" else opt.kind
        params.append(click.Option([opt.flag, opt.name], type=kind,
                                   help=f"{name}: {opt.help}"))
    return params


def _model_options(acc, given, sets, items):
    """Route the model's own ``hwgen sim`` options: ``(sets, items, stimulus options)``."""
    model = acc.model
    values = {opt.name: given.get(opt.name) for opt in model.sim_options}
    stimulus_options = {}
    for opt in model.sim_options:
        value = values[opt.name]
        if value is None:
            continue
        if opt.kind is int:
            checks.at_least(opt.name, value, opt.minimum)
        if opt.route == "stimulus":
            stimulus_options[opt.name] = value
        elif opt.route == "set":
            sets = sets + [f"{opt.name}={value}"]
        elif items is not None and value != items:
            raise ConfigError(opt.name, f"and --items={items} disagree (they are the same "
                              "option)", value=value)
        else:
            items = value
    return sets + list(model.sim_sets(values, sets)), items, stimulus_options


@main.command(cls=_WithModelOptions)
@click.argument("name")
@with_config_options
@click.option("--items", type=int, help="Number of input items (accelerator-specific unit).")
@click.option("--seed", type=int, default=1, show_default=True)
@click.option("--stall", type=float, default=0.0, show_default=True,
              help="Probability per cycle of an input gap and, independently, of output "
                   "backpressure (and of pauses on AXI memory channels).")
@click.option("--engine", type=click.Choice(["cocotb", "native"]), default="cocotb",
              show_default=True, help="cocotb: Python testbench (every model); native: a "
              "generated C++ testbench, 100x faster, for stream tops (AXI4 read memories "
              "included).")
@click.option("--waves", is_flag=True, help="Dump a VCD waveform (dump.vcd in the run dir).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False),
              help="Write the result as JSON.")
@reports_errors
def sim(name, sets, config_file, items, seed, stall, engine, waves, json_path, **model_options):
    """Simulate the Verilog on Verilator and compare with the golden model.

    An accelerator may take options of its own (chamvs-node: --base, --queries, --nprobe ...;
    cluster-router and cluster-gateway: --fuzz); `hwgen sim NAME --help` lists them."""
    from .flow.simulate import check, simulate
    acc = registry.get(name)
    _seed(seed)
    checks.probability("stall", stall)
    if items is not None:
        checks.at_least("items", items, 1)
    if json_path:
        checks.output_file("json", json_path)
    sets, items, options = _model_options(acc, model_options, list(sets), items)
    cfg = acc.make_config(sets, config_file, None)
    result = simulate(acc, cfg, items=items, seed=seed, stall=stall, waves=waves,
                      progress=sys.stderr.isatty(), log=_log, stimulus_options=options,
                      engine=engine)
    if json_path:
        _write_json(json_path, result)
    click.echo(f"{acc.name}: {result['results']} results from {result['items']} items, "
               f"{result['mismatches']} mismatches; {result['cycles']} cycles, "
               f"{result['results_per_cycle']:.4f} results/cycle at steady state, "
               f"latency {result['latency_cycles']} cycles"
               + (f", {result['input_items_per_cycle']:.4f} input items/cycle within frames"
                  if result["input_items_per_cycle"] is not None else "")
               + f" (stall {stall:g}, seed {seed}; {engine} engine, "
               f"{result['cycles_per_second'] or 0:,} simulated cycles/s)")
    if result.get("status_expected") is not None:
        from .cluster.traffic import echo_status
        echo_status(result, click.echo)
    if "recall" in result:
        _echo_node(result)
    if waves:
        click.echo(f"waveform: {Path(result['run_dir']) / 'dump.vcd'}")
    check(result)


def _echo_node(r):
    recall = ", ".join(f"{key} {val:.3f}" for key, val in r["recall"].items())
    faiss = ", ".join(f"{key} {val:.3f}" for key, val in r["faiss_recall"].items())
    click.echo(f"  {r['dataset']}, {r['queries']} queries, nprobe {r['nprobe']}: node {recall}; "
               f"faiss IndexIVFPQ {faiss}; identical top-k ids in "
               f"{100 * r['identical_topk_fraction']:.1f}% of queries")
    if "per_query_cycles" in r:
        pq = r["per_query_cycles"]
        click.echo(f"  cycles per query: {pq['total']:.0f} (LUT {pq['lut']:.0f}, scan "
                   f"{pq['scan']:.0f}, drain {pq['drain']:.0f}); scan efficiency "
                   f"{r['scan_efficiency']:.3f} (memory-side), "
                   f"{r['scan_codes_per_cycle']:.2f} codes/cycle of "
                   f"{r['scan_limit_codes_per_cycle']} while scanning")


@main.command()
@click.argument("name")
@with_config_options
@click.option("--board", help="Board whose resources the percentages refer to.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False),
              help="Write the report as JSON.")
@reports_errors
def synth(name, sets, config_file, board, json_path):
    """Estimate resources with yosys synth_xilinx (UltraScale+ cells)."""
    from .flow.synth import synthesize
    board_obj = _board(board)
    acc, cfg = _config(name, sets, config_file, board_obj)
    if json_path:
        checks.output_file("json", json_path)
    report = synthesize(acc, cfg, board=board_obj, log=_log)
    if json_path:
        _write_json(json_path, report)
    res = report["resources"]
    pct = report.get("percent", {})
    click.echo(f"{acc.name} ({report['tool']}):")
    for key, label in (("lut", "LUT"), ("ff", "FF"), ("bram18", "BRAM18"), ("uram", "URAM"),
                       ("dsp", "DSP"), ("carry", "CARRY")):
        share = {"bram18": pct.get("bram")}.get(key, pct.get(key))
        extra = f"  ({share:.3f}% of {report['board']})" if share is not None else ""
        click.echo(f"  {label:<7}{res[key]:>9}{extra}")
    if "lutram" in res and res["lutram"]:
        click.echo(f"  (LUT includes {res['lutram']} LUTs used as distributed RAM/SRL)")


@main.command()
@click.argument("name")
@with_config_options
@click.option("--seeds", type=int, default=3, show_default=True,
              help="Place and route with seeds 1..N; Fmax is the median.")
@click.option("--no-xilinx", is_flag=True,
              help="Skip the UltraScale+ logic-depth analysis (Debian yosys synth_xilinx).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False),
              help="Write the report as JSON.")
@reports_errors
def timing(name, sets, config_file, seeds, no_xilinx, json_path):
    """Post-route Fmax on ECP5 (ratio to a reference in the same run), UltraScale+ depth."""
    from .flow.timing import measure_timing
    acc, cfg = _config(name, sets, config_file, None)
    checks.at_least("seeds", seeds, 1, 99)
    if json_path:
        checks.output_file("json", json_path)
    report = measure_timing(acc, cfg, seeds=seeds, xilinx=not no_xilinx, log=_log)
    if json_path:
        _write_json(json_path, report)
    for line in timing_lines(report):
        click.echo(line)


def timing_lines(r):
    """Human-readable lines of a ``hwgen timing`` report."""
    ref = r["reference"]
    seeds = ", ".join(f"{f:.1f}" if f else "-" for f in r["fmax_mhz_per_seed"])
    ratio = f"{r['fmax_ratio']:.3f}" if r["fmax_ratio"] is not None else "n/a"
    lines = [f"{r['accelerator']} on {r['device']}, seeds {r['seeds'][0]}..{r['seeds'][-1]}:",
             f"  Fmax {r['fmax_mhz']} MHz (median; per seed {seeds})",
             f"  reference {ref['fmax_mhz']} MHz ({ref['design']})",
             f"  fmax_ratio {ratio} (goal >= {r['goal_ratio']})"]
    cp = r.get("critical_path")
    if cp:
        lines.append(f"  critical path {cp['from']} -> {cp['to']}: {cp['delay_ns']} ns, "
                     f"{cp['logic_levels']} logic levels + {cp['carry_steps']} carry steps, "
                     f"routing {cp['routing_share']:.0%}")
    res = r["resources"]
    lines.append("  ECP5 cells: " + ", ".join(f"{k} {v}" for k, v in res.items() if v))
    us = r.get("ultrascale")
    if us:
        lines.append(f"  UltraScale+ (yosys synth_xilinx): worst path {us['lut_levels']} LUT "
                     f"levels + {us['carry_chains']} carry chain(s) ({us['carry_cells']} carry "
                     f"cells) + {us['dsp_ram_levels']} DSP/RAM levels; DSP48E2 "
                     f"{us['dsp48e2']} ({us['dsp_unregistered']} not fully registered), block "
                     f"RAM {us['block_rams']} ({us['ram_unregistered']} output unregistered); "
                     f"goal {'met' if us['goal_met'] else 'NOT met'}")
    elif us is None:
        lines.append("  UltraScale+ depth: not measured (no Debian yosys, or --no-xilinx)")
    return lines


@main.group()
def bench():
    """Benchmarks: measured throughput/latency and resources, printed as tables."""


@bench.command("timing")
@click.option("--seeds", type=int, default=2, show_default=True,
              help="Place and route with seeds 1..N per block (median).")
@click.option("--only", "names", multiple=True, metavar="NAME",
              help="Only these accelerators (repeatable).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False),
              help="Write the rows as JSON.")
@reports_errors
def bench_timing(seeds, names, json_path):
    """ECP5 Fmax and ratio of every registered accelerator, before/after issue 11."""
    from .flow.timing_bench import bench_timing as run_bench
    checks.at_least("seeds", seeds, 1, 99)
    for name in names:
        registry.get(name)
    if json_path:
        checks.output_file("json", json_path)
    run_bench(click.echo, seeds=seeds, names=names, json_path=json_path, log=_log)


@bench.command("tests")
@click.option("--events", "events_path", type=click.Path(dir_okay=False, exists=True),
              required=True, help="The HWGEN_PROFILE file of a test run (make test writes "
              "build/profile/events.jsonl).")
@click.option("--junit", "junit_path", type=click.Path(dir_okay=False),
              help="pytest's JUnit XML of the same run (per-test call time).")
@click.option("--setup-seconds", type=float, help="Measured set-up time (venv, Debian).")
@click.option("--wall-seconds", type=float, help="Measured pytest wall time.")
@click.option("--budget", "budget_path", type=click.Path(dir_okay=False, exists=True),
              help="Fail when the distinct Verilator builds exceed this JSON's numbers "
              "(tests/build_budget.json).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False),
              help="Write the report as JSON.")
@reports_errors
def bench_tests(events_path, junit_path, setup_seconds, wall_seconds, budget_path, json_path):
    """Where a test run's time went: set-up, every Verilator build (hit or miss), every
    yosys and nextpnr run, the slowest tests; and the build budget."""
    from .flow import profile
    if json_path:
        checks.output_file("json", json_path)
    report = profile.summarize(profile.read_events(events_path), junit=junit_path,
                               setup_seconds=setup_seconds, wall_seconds=wall_seconds)
    for line in profile.table(report):
        click.echo(line)
    errors = profile.check_budget(report, budget_path) if budget_path else []
    report["budget_errors"] = errors
    if json_path:
        _write_json(json_path, report)
    if errors:
        raise click.ClickException("; ".join(errors))


@bench.command("mutation")
@click.option("--results", "results_dir", type=click.Path(file_okay=False), default="mutants",
              show_default=True, help="mutmut's results folder (make mutate writes mutants/).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False),
              help="Write the report as JSON.")
@reports_errors
def bench_mutation(results_dir, json_path):
    """Kill rate per package of a mutmut run (make mutate); fails below the floors
    (hwgen/flow/mutation.py: FLOORS)."""
    from .flow import mutation
    if json_path:
        checks.output_file("json", json_path)
    report = mutation.summarize(mutation.read_results(results_dir))
    for line in mutation.table(report):
        click.echo(line)
    errors = mutation.check_floors(report)
    report["floor_errors"] = errors
    if json_path:
        _write_json(json_path, report)
    if errors:
        raise click.ClickException("; ".join(errors))


@bench.command("sim")
@click.option("--seed", type=int, default=1, show_default=True)
@click.option("--json", "json_path", type=click.Path(dir_okay=False),
              help="Write the rows as JSON.")
@reports_errors
def bench_sim_cmd(seed, json_path):
    """Simulated cycles per second: cocotb vs native engine, side by side."""
    from .flow.sim_bench import bench_sim
    _seed(seed)
    if json_path:
        checks.output_file("json", json_path)
    rows = bench_sim(click.echo, seed=seed, log=_log)
    if json_path:
        _write_json(json_path, rows)


@bench.command("pq-decoder")
@reports_errors
def bench_pq_decoder():
    """Results per cycle, latency and yosys counts at m = 16/32/64, 16/24-bit LUTs."""
    from .vecsearch.bench import bench_pq_decoder as run_bench
    run_bench(echo=click.echo)


@bench.command("lut-builder")
@reports_errors
def bench_lut_builder():
    """Rows per cycle, latency and yosys counts of the LUT builder at D=128, m=16."""
    from .vecsearch.bench import bench_lut_builder as run_bench
    run_bench(echo=click.echo)


@bench.command("kselect")
@click.option("--queries", type=int, default=20000, show_default=True,
              help="Random queries per row.")
@click.option("--seed", type=int, default=1, show_default=True)
@reports_errors
def bench_kselect(queries, seed):
    """Exactness of the approximate hierarchical queue (random and digits data)."""
    from .vecsearch.bench import bench_kselect as run_bench
    checks.at_least("queries", queries, 1)
    _seed(seed)
    if not run_bench(echo=click.echo, queries=queries, seed=seed):
        raise SimulationMismatch("a K-selection row misses its exactness target")


@bench.command("chamvs")
@click.option("--queries", type=int, default=12, show_default=True)
@reports_errors
def bench_chamvs(queries):
    """ChamVS node: model vs simulation, scan throughput, projected QPS of the paper's data."""
    from .vecsearch.bench import bench_chamvs as run_bench
    checks.at_least("queries", queries, 1)
    if not run_bench(echo=click.echo, queries=queries):
        raise SimulationMismatch("the node disagreed with its golden model or its cycle model")


@bench.command("cluster")
@click.option("--no-sim", is_flag=True,
              help="Skip the simulations of mini_encoder (the model tables only).")
@click.option("--measured", "measured", multiple=True, type=click.Path(dir_okay=False),
              help="A report of `hwgen cluster sim DESC --tokens M --json FILE` to print "
                   "beside the model (repeatable; e.g. minilm_encoder at M 1, 8, 38, 64).")
@click.option("--minilm-tokens", "minilm_tokens", multiple=True, type=int,
              help="Also simulate minilm_encoder across its six FPGAs at this M (repeatable; "
                   "1..64; the first build of each M takes ~30 min on 2 cores).")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Where the simulations build and run [default: a temporary folder].")
@reports_errors
def bench_cluster(no_sim, measured, minilm_tokens, out_dir):
    """Multi-FPGA I-BERT latency model: the paper's Table 2, Versal 860 us, hwgen's encoder,
    and X, T measured by simulating encoders across FPGAs."""
    from .checks import read_json
    from .cluster.bench import bench_cluster as run_bench
    reports = [read_json(path, "measured") for path in measured]
    for path, r in zip(measured, reports):
        if not isinstance(r, dict) or not {"tokens", "X", "T", "I", "path"} <= set(r):
            raise ConfigError("measured", "not a report of `hwgen cluster sim --tokens M "
                              "--json FILE` with X, T (a run that failed has none)", value=path)
    for m in minilm_tokens:
        if not 1 <= m <= 64:
            raise ConfigError("minilm_tokens", "must be in 1..64 (the kernels' max_len)",
                              value=m)
    if not run_bench(echo=click.echo, simulate=not no_sim, measured=reports, out_dir=out_dir,
                     minilm_tokens=minilm_tokens, echo_sim=click.echo):
        raise SimulationMismatch("the Table 2 reproduction is off by more than 0.5%, or a "
                                 "simulated encoder disagreed with its golden model")


@main.group()
def cluster():
    """Multi-FPGA clusters (Galapagos): the Cluster Builder."""


@cluster.command("build")
@click.argument("description")
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False),
              help="Output directory.")
@click.option("--no-tops", is_flag=True, help="Skip the per-FPGA top-level Verilog.")
@click.option("--kernels", type=click.Choice(["inside", "external"]), default=None,
              help="Compute kernels inside the tops behind packet adapters, or external "
                   "packet ports [default: the description's `kernels`, else inside].")
@click.option("--resources", is_flag=True,
              help="Per-FPGA resource table (yosys synth_xilinx per distinct module "
                   "configuration, cached) against the boards' capacity; writes "
                   "resources.json. Slow for BERT-base kernels.")
@reports_errors
def cluster_build(description, out_dir, no_tops, kernels, resources):
    """Build a cluster description (a JSON file, or a shipped name: ibert_encoder)."""
    from .cluster.builder import build as run_build
    from .cluster.describe import load
    desc = load(description)
    checks.output_dir("out", out_dir)
    if resources and no_tops:
        raise ConfigError("resources", "needs the tops (drop --no-tops)")
    result = run_build(desc, Path(out_dir), tops=not no_tops, log=_log, kernels=kernels)
    for line in result["summary"]:
        click.echo(line)
    click.echo(f"wrote {len(result['written'])} files to {out_dir}")
    if resources:
        from .cluster.builder import resource_lines, resource_table, write_resources
        table = resource_table(result["fpgas"], result["plans"], log=_log)
        for line in resource_lines(table):
            click.echo(line)
        click.echo(f"wrote {write_resources(table, out_dir)}")


@cluster.command("sim")
@click.argument("description")
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False),
              help="Output directory (tops under build/, simulation runs under run/).")
@click.option("--latency-ms", type=float, default=0.0, show_default=True,
              help="Network hub delay per datagram (wall-clock ms).")
@click.option("--loss", type=float, default=0.0, show_default=True,
              help="Probability of dropping a datagram (0 .. 0.99).")
@click.option("--seed", type=int, default=1, show_default=True)
@click.option("--rounds", type=int, default=2, show_default=True,
              help="Messages per kernel and destination.")
@click.option("--stall", type=float, default=0.3, show_default=True,
              help="Random input gaps / output backpressure probability.")
@click.option("--tokens", type=int, default=None,
              help="Encoder mode: build with the compute kernels inside the tops for this many "
                   "tokens (M), send M input rows from the host through the gateway and "
                   "compare the output rows with the golden layers; measures X, T, I.")
@click.option("--hop", "hop_cycles", type=int, default=None,
              help="Encoder mode: network hop in cycles (lock-step simulators) "
                   "[default: 220, 1.1 us at 200 MHz].")
@click.option("--sentence", default=None,
              help="Encoder mode: the input rows are this sentence's embeddings in the "
                   "calibrated integer MiniLM (exactly --tokens WordPiece tokens with [CLS] "
                   "and [SEP]; for minilm_encoder) [default: random int8 rows of --seed].")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None,
              help="Write the report as JSON.")
@reports_errors
def cluster_sim(description, out_dir, latency_ms, loss, seed, rounds, stall, tokens,
                hop_cycles, sentence, json_path):
    """Simulate every FPGA of a description at once (Verilator per FPGA, UDP network).

    Without --tokens: every compute kernel is a port of its top played by the testbench
    (random traffic over the plan's edges). With --tokens: the encoder itself runs inside
    the tops, fed by a host at the cluster's output.ip (hwgen.cluster.encoder_sim)."""
    if tokens is not None:
        return _cluster_sim_encoder(description, out_dir, latency_ms, loss, seed, stall,
                                    tokens, hop_cycles, sentence, json_path)
    for name, value in (("hop", hop_cycles), ("sentence", sentence)):
        if value is not None:
            raise ConfigError(name, "only with --tokens (the encoder's lock-step simulation)",
                              value=value)
    from .cluster.multifpga import check_options, run as run_sim
    check_options(latency_s=latency_ms / 1000, loss=loss, seed=seed, rounds=rounds,
                  stall=stall)
    r = run_sim(description, Path(out_dir), latency_s=latency_ms / 1000, loss=loss, seed=seed,
                rounds=rounds, stall=stall, log=_log, echo=click.echo)
    click.echo(f"{'kernel':<24} {'fpga':<6} {'sent':>5} {'expected':>9} {'received':>9} "
               f"{'mismatches':>11}")
    for k in r["kernels"]:
        click.echo(f"{k['kernel']:<24} {k['fpga']:<6} {k['sent']:>5} {k['expected']:>9} "
                   f"{k['received']:>9} {k['mismatches']:>11}")
    click.echo(f"packets: {r['packets_sent']} sent, {r['packets_expected']} expected, "
               f"{r['packets_received']} received; datagrams: {r['forwarded']} forwarded, "
               f"{r['dropped']} dropped; malformed {r['malformed']}; "
               f"build {r['build_s']:.1f} s, simulation {r['sim_s']:.1f} s")
    if r["drops"]:
        click.echo("packets dropped (status counters): " + ", ".join(
            f"{k} {v}" for k, v in r["drops"].items()))
    if r["stalled_at"] is not None:
        click.echo(f"stalled: no network traffic after cycle {r['stalled_at']}; stopped")
    click.echo(f"mismatches == {r['mismatches']}")
    if json_path:
        Path(json_path).write_text(json.dumps(r, indent=2) + "\n")
    if r["mismatches"] or r["timeouts"]:
        raise SimulationMismatch(f"{r['mismatches']} mismatches, timeouts: {r['timeouts']}")


def _cluster_sim_encoder(description, out_dir, latency_ms, loss, seed, stall, tokens,
                         hop_cycles, sentence, json_path):
    from .cluster import encoder_sim
    if latency_ms:
        raise ConfigError("latency_ms", "the encoder simulation runs lock-step: give the "
                          "network delay in cycles with --hop", value=latency_ms)
    if loss:
        raise ConfigError("loss", "the encoder has no retransmission: a lost datagram loses "
                          "rows; the encoder simulation takes --loss 0 only", value=loss)
    hop = encoder_sim.HOP_CYCLES if hop_cycles is None else hop_cycles
    encoder_sim.check_options(tokens=tokens, seed=seed, stall=stall, hop=hop)
    x = encoder_sim.sentence_rows(sentence, tokens) if sentence is not None else None
    r = encoder_sim.run(description, Path(out_dir), tokens=tokens, seed=seed, stall=stall,
                        hop=hop, x=x, log=_log, echo=click.echo)
    if sentence is not None:
        r["sentence"] = sentence
    click.echo(f"encoder {r['description']}: {r['fpgas']} FPGAs, M = {r['tokens']} tokens of "
               f"H = {r['hidden']}; hop {r['hop_cycles']} cycles; stall {r['stall']}")
    click.echo(f"rows: {r['rows_expected']} expected, {r['rows_received']} received; "
               f"malformed {r['malformed']}; datagrams {r['forwarded']} forwarded")
    if "T" in r:
        click.echo(f"X (first output packet) {r['X']} cycles, T (last) {r['T']} cycles, "
                   f"I (packet interval) {r['I']:.1f} cycles")
    click.echo(f"build {r['build_s']:.1f} s, simulation {r['sim_s']:.1f} s "
               f"({r['cycles_run']} cycles)")
    if r["drops"]:
        click.echo("packets dropped (status counters): " + ", ".join(
            f"{k} {v}" for k, v in r["drops"].items()))
    if r["stalled_at"] is not None:
        click.echo(f"stalled: no network traffic after cycle {r['stalled_at']}; stopped")
    click.echo(f"mismatches == {r['mismatches']}")
    if json_path:
        Path(json_path).write_text(json.dumps(r, indent=2) + "\n")
    if r["mismatches"] or r["timeouts"] or r["rows_received"] != r["rows_expected"]:
        raise SimulationMismatch(f"{r['mismatches']} mismatches, {r['rows_received']} of "
                                 f"{r['rows_expected']} rows, timeouts: {r['timeouts']}"
                                 + (f", stalled after cycle {r['stalled_at']}"
                                    if r["stalled_at"] is not None else ""))


@bench.command("recsys")
@click.option("--no-sim", is_flag=True, help="Skip the simulations (model tables only).")
@reports_errors
def bench_recsys(no_sim):
    """Recommendation: model vs simulation, lookup placement, predicted vs paper designs."""
    from .recsys.bench import bench_recsys as run_bench
    if not run_bench(echo=click.echo, simulate_blocks=not no_sim):
        raise SimulationMismatch("a recsys block disagreed with its golden model or its "
                                 "cycle model is off by more than 5%")


@bench.command("queues")
@reports_errors
def bench_queues():
    """LUT/FF per entry of systolic-pq and insert-pq, AHPQ versus an exact hierarchy."""
    from .vecsearch.bench import bench_queues as run_bench
    run_bench(echo=click.echo)


@main.command("size-queues")
@click.option("--k", "k", type=int, default=100, show_default=True, help="Results per query.")
@click.option("--streams", type=int, multiple=True,
              help="L1 queue counts (repeatable; default 4 8 16 32).")
@click.option("--target", type=float, default=0.99, show_default=True,
              help="Required probability.")
@reports_errors
def size_queues(k, streams, target):
    """L1 queue lengths of the approximate hierarchical priority queue (binomial sizing)."""
    from .vecsearch.sizing import sizing_table
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


@main.command()
@click.option("--preset", help="A named model (paper-ctr, small-ctr).")
@click.option("--model", "model_file", type=click.Path(dir_okay=False),
              help="A model description JSON file instead of a preset.")
@click.option("--board", default="u280", show_default=True)
@click.option("--nodes", type=int, default=4, show_default=True)
@click.option("--dsp-per-pe", type=int, default=18, show_default=True)
@click.option("--rate", type=float, help="Inferences per second the network check assumes.")
@click.option("--link-gbps", type=float, default=100.0, show_default=True)
@click.option("--out", "out_dir", type=click.Path(file_okay=False),
              help="Write one configuration JSON per node here.")
@reports_errors
def partition(preset, model_file, board, nodes, dsp_per_pe, rate, link_gbps, out_dir):
    """Partition a recommendation model's FC layers over several FPGAs."""
    from .recsys.model import RecModel, preset as get_preset
    from .recsys.partition import partition as run_partition
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
            _write_json(out / f"node{n.node}.json", {"model": model.to_dict(),
                                                     "board": board_obj.name, **n.to_dict()})
        click.echo(f"wrote {len(plan.nodes)} node configurations to {out}")


@main.command("recsys-cluster-sim")
@click.option("--preset", default="cluster-ctr", show_default=True, help="A named model.")
@click.option("--nodes", type=int, default=2, show_default=True)
@click.option("--latency-ns", type=float, default=1000.0, show_default=True,
              help="One-way network latency.")
@click.option("--gbps", type=float, default=100.0, show_default=True, help="Link bandwidth.")
@click.option("--clock-mhz", type=float, default=135.0, show_default=True)
@click.option("--items", type=int, default=40, show_default=True, help="Inferences.")
@click.option("--stall", type=float, default=0.0, show_default=True)
@click.option("--seed", type=int, default=1, show_default=True)
@click.option("--json", "json_path", type=click.Path(dir_okay=False))
@reports_errors
def recsys_cluster_sim(preset, nodes, latency_ns, gbps, clock_mhz, items, stall, seed,
                       json_path):
    """Every node's top in Verilator, activations exchanged through a network model."""
    from .recsys.multinode import Network, plan_cluster, report_lines, simulate_cluster
    checks.at_least("nodes", nodes, 1)
    checks.at_least("items", items, 1)
    checks.probability("stall", stall)
    _seed(seed)
    if json_path:
        checks.output_file("json", json_path)
    network = Network(latency_ns=latency_ns, gbps=gbps, clock_mhz=clock_mhz)
    report = simulate_cluster(plan_cluster(preset, nodes), items=items, seed=seed,
                              stall=stall, network=network, log=_log)
    for line in report_lines(report):
        click.echo(line)
    if json_path:
        _write_json(json_path, report)
    if report["mismatches"] or report["block_mismatches"] or report["timeouts"]:
        raise SimulationMismatch(f"{report['mismatches']} of {report['outputs']} outputs differ "
                                 f"from the golden model ({report['block_mismatches']} block "
                                 f"beats, {report['timeouts']} timeouts)")


@main.group()
def chamvs():
    """ChamVS memory nodes served over TCP (see hwgen.host.node_server)."""


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
    for `python -m hwgen.host.node_server SHARD.npz`."""
    from .host.shard import make_shards
    from .vecsearch.node_model import load_vectors
    checks.at_least("nodes", nodes, 1, 1024)
    vectors = load_vectors(base, "base")
    sets = list(sets)
    if not any(s.startswith("dim=") for s in sets):
        sets.append(f"dim={vectors.shape[1]}")
    _, cfg = _config("chamvs-node", sets, config_file, None)
    checks.output_dir("out", out_dir)
    for path in make_shards(cfg, vectors, nodes, scheme, out_dir, log=_log):
        click.echo(str(path))


@main.command()
@click.argument("spec", type=click.Path(dir_okay=False))
@click.option("--scheduler", help="Address of a running Dask scheduler (default: a "
              "LocalCluster on this machine).")
@click.option("--workers", type=int, help="LocalCluster worker processes (default: CPUs).")
@click.option("--retries", type=int, default=2, show_default=True,
              help="Retries of a job that raises (a dead worker's jobs are rescheduled too).")
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False),
              help="Folder for sweep.json, sweep.csv and sweep.png.")
@reports_errors
def sweep(spec, scheduler, workers, retries, out_dir):
    """Run a sweep SPEC (JSON or YAML: accelerator, grid/configs, seeds, stall, items) on Dask
    distributed: every job a simulation checked against the golden model."""
    from .flow.sweep import run_sweep
    checks.at_least("retries", retries, 0, 10)
    rows = run_sweep(spec, out_dir, scheduler=scheduler, workers=workers, retries=retries,
                     echo=click.echo)
    bad = [r for r in rows if r.get("error") or r.get("mismatches") or r.get("timeout")
           or r.get("counter_mismatches")]
    if bad:
        raise SimulationMismatch(f"{len(bad)} of {len(rows)} jobs failed or disagreed with "
                                 f"the golden model (first: job {bad[0]['job']})")


@main.group()
def dataset():
    """Data sets that exist offline, written as .npy files for --base."""


@dataset.command("digits-syn")
@click.option("--vectors", type=int, default=1_000_000, show_default=True,
              help="At least this many vectors (whole copies of the base).")
@click.option("--noise", type=int, default=3, show_default=True,
              help="Uniform integer noise -N..N per component of each copy.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--out", "out_path", required=True, type=click.Path(dir_okay=False),
              help="The .npy file to write (int16 vectors).")
@reports_errors
def dataset_digits_syn(vectors, noise, seed, out_path):
    """scikit-learn's digits (1,597 base vectors; the last 200 stay queries) replicated with
    noise, as the Chameleon paper builds its SYN data sets from SIFT: integer vectors of signed
    8-bit range, 64 dimensions."""
    import numpy as np
    from .datasets import digits, replicated
    from .vecsearch.node_model import QUERY_POOL
    checks.at_least("vectors", vectors, 1, 100_000_000)
    checks.at_least("noise", noise, 0, 127)
    _seed(seed)
    checks.output_file("out", out_path)
    base = digits()[0][:-QUERY_POOL]
    x = replicated(base, -(-vectors // len(base)), noise=noise, seed=seed).astype(np.int16)
    np.save(out_path, x)
    click.echo(f"{out_path}: {x.shape[0]:,} vectors of {x.shape[1]} dimensions (int16)")


@main.command()
@click.option("--queries", type=int, default=20, show_default=True)
@click.option("--stall", type=float, default=0.1, show_default=True)
@click.option("--seed", type=int, default=1, show_default=True)
@reports_errors
def demo(queries, stall, seed):
    """The ChamVS node's Verilog searching the digits data set, checked against faiss."""
    from .vecsearch.demo import run_demo
    checks.at_least("queries", queries, 1)
    checks.probability("stall", stall)
    _seed(seed)
    if not run_demo(queries=queries, stall=stall, seed=seed, echo=click.echo,
                    progress=sys.stderr.isatty()):
        raise SimulationMismatch("the node's results differ from its golden model")


main.add_command(serve)
main.add_command(espn)
main.add_command(ralm)


if __name__ == "__main__":
    main()
