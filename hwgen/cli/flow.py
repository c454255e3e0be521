"""The flow verbs of ``hwgen``, the same for every registered accelerator: ``list``, ``config``,
``build``, ``sim``, ``synth``, ``timing`` and ``sweep``."""

import json
from pathlib import Path

import click

from .. import checks, registry
from ..cli_support import log as _log
from ..cli_support import reports_errors
from ..errors import ConfigError, SimulationMismatch
from ..flow.sweep import MAX_JOBS, MAX_JOBS_LIMIT
from .common import board as _board
from .common import config as _config
from .common import seed as _seed
from .common import progress, with_config_options, write_json

__all__ = ["COMMANDS", "list_cmd", "config_cmd", "build", "sim", "synth", "timing", "sweep",
           "timing_lines"]


@click.command("list")
@click.argument("name", required=False)
@click.option("--boards", is_flag=True, help="List the target boards instead (vendor boards, "
              "then the open-flow ECP5 boards).")
@click.option("--json", "as_json", is_flag=True, help="Print every accelerator as JSON: name, "
              "summary, default configuration, workload, performance (the cycle model at the "
              "default workload) and resources (the estimate: lut, ff, bram18, uram, dsp).")
@reports_errors
def list_cmd(name, boards, as_json):
    """List accelerators (or boards); with NAME, show its parameters."""
    if boards:
        from ..boards import board_names, load_board
        from ..flow.openboard import OPEN_BOARDS
        for b in map(load_board, board_names()):
            mem = ", ".join(f"{mc.count}x {mc.kind}" for mc in b.memory)
            click.echo(f"{b.name:<11} {b.title:<28} {b.part:<26} {mem}; "
                       f"{b.kernel_clock_mhz:g} MHz")
        for board, (platform, what) in OPEN_BOARDS.items():
            click.echo(f"{board:<11} {what:<28} open flow: self-test bitstream "
                       f"(amaranth-boards {platform.rpartition(':')[2]})")
        return
    if as_json:
        names = [registry.get(name).name] if name else registry.names()
        click.echo(json.dumps([_describe(registry.get(n)) for n in names], indent=2,
                              default=str))
        return
    if name:
        acc = registry.get(name)
        click.echo(f"{acc.name}: {acc.summary}\n")
        for pname, default, allowed, doc in acc.config.describe():
            click.echo(f"  {pname:<12} default {default!s:<6} {allowed:<26} {doc}")
        return
    for acc in registry.ACCELERATORS.values():
        click.echo(f"{acc.name:<14} {acc.summary}")


def _describe(acc):
    """One accelerator of ``hwgen list --json``: its default configuration's answers."""
    from ..flow.resources import estimate
    _log(f"{acc.name} ...")            # the estimate may emit the Verilog (seconds, cold)
    cfg = acc.make_config()
    performance = cfg.performance()
    return {"name": acc.name, "summary": acc.summary, "config": cfg.to_dict(),
            "workload": performance.workload.to_dict(), "performance": performance.to_dict(),
            "resources": estimate(acc, cfg).to_dict()}


@click.command("config")
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
        write_json(json_path, cfg.to_dict())
    click.echo(json.dumps({"accelerator": acc.name, "config": cfg.to_dict(),
                           "derived": cfg.derived()}, indent=2, default=str))


def _build_board(board, open_boards):
    """The vendor board ``board`` for ``hwgen build``; an unknown name is refused listing the
    vendor boards and the open-flow ECP5 boards ``build`` also takes."""
    try:
        return _board(board)
    except ConfigError as e:
        if e.param != "board":
            raise
        from ..boards import board_names
        raise ConfigError("board", "unknown board; choose one of: "
                          + ", ".join([*board_names(), *open_boards])
                          + f" (the last {len(open_boards)}: ECP5, open flow)",
                          value=board) from None


@click.command()
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
    from ..flow.build import build_accelerator
    from ..flow.openboard import OPEN_BOARDS, build_bitstream
    open_board = board in OPEN_BOARDS
    board_obj = None if open_board else _build_board(board, OPEN_BOARDS)
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


@click.command(cls=_WithModelOptions)
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
    from ..flow.simulate import check, simulate
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
                      progress=progress(), log=_log, stimulus_options=options,
                      engine=engine)
    if json_path:
        write_json(json_path, result)
    click.echo(f"{acc.name}: {result['results']} results from {result['items']} items, "
               f"{result['mismatches']} mismatches; {result['cycles']} cycles, "
               f"{result['results_per_cycle']:.4f} results/cycle at steady state, "
               f"latency {result['latency_cycles']} cycles"
               + (f", {result['input_items_per_cycle']:.4f} input items/cycle within frames"
                  if result["input_items_per_cycle"] is not None else "")
               + f" (stall {stall:g}, seed {seed}; {engine} engine, "
               f"{result['cycles_per_second'] or 0:,} simulated cycles/s)")
    for line in acc.model.report_lines(cfg, result):
        click.echo(line)
    if waves:
        click.echo(f"waveform: {Path(result['run_dir']) / 'dump.vcd'}")
    check(result)


@click.command()
@click.argument("name")
@with_config_options
@click.option("--board", help="Board whose resources the percentages refer to.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False),
              help="Write the report as JSON.")
@reports_errors
def synth(name, sets, config_file, board, json_path):
    """Estimate resources with yosys synth_xilinx (UltraScale+ cells)."""
    from ..flow.synth import synthesize
    board_obj = _board(board)
    acc, cfg = _config(name, sets, config_file, board_obj)
    if json_path:
        checks.output_file("json", json_path)
    report = synthesize(acc, cfg, board=board_obj, log=_log)
    if json_path:
        write_json(json_path, report)
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


@click.command()
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
    from ..flow.timing import measure_timing
    acc, cfg = _config(name, sets, config_file, None)
    checks.at_least("seeds", seeds, 1, 99)
    if json_path:
        checks.output_file("json", json_path)
    report = measure_timing(acc, cfg, seeds=seeds, xilinx=not no_xilinx, log=_log)
    if json_path:
        write_json(json_path, report)
    for line in timing_lines(report):
        click.echo(line)


def timing_lines(r):
    """Human-readable lines of a ``hwgen timing`` report."""
    ref = r["reference"]
    seeds = ", ".join(f"{f:.1f}" if f else "-" for f in r["fmax_mhz_per_seed"])
    ratio = f"{r['fmax_ratio']:.3f}" if r["fmax_ratio"] is not None else "n/a"
    lines = [f"{r['accelerator']} on {r['device']}, seeds {r['seeds'][0]}..{r['seeds'][-1]}:",
             f"  Fmax {r['fmax_mhz']} MHz (median; per seed {seeds})",
             f"  reference {ref['fmax_mhz']} MHz ({ref['design']})"
             + (f", placed like the block with nextpnr {' '.join(r['pnr_options'])}"
                if r.get("pnr_options") else ""),
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


@click.command()
@click.argument("spec", type=click.Path(dir_okay=False))
@click.option("--scheduler", help="Address of a running Dask scheduler (default: a "
              "LocalCluster on this machine).")
@click.option("--workers", type=int, help="LocalCluster worker processes (default: CPUs).")
@click.option("--retries", type=int, default=2, show_default=True,
              help="Retries of a job that raises (a dead worker's jobs are rescheduled too).")
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False),
              help="Folder for sweep.json, sweep.csv and sweep.png.")
@click.option("--max-jobs", type=int, default=MAX_JOBS, show_default=True,
              help="Refuse a spec that expands to more jobs than this (counted from the "
              f"grid's sizes before any job is built; at most {MAX_JOBS_LIMIT:,}).")
@reports_errors
def sweep(spec, scheduler, workers, retries, out_dir, max_jobs):
    """Run a sweep SPEC (JSON or YAML: accelerator, grid/configs, seeds, stall, items) on Dask
    distributed: every job a simulation checked against the golden model."""
    from ..flow.sweep import check_scheduler, run_sweep
    checks.at_least("retries", retries, 0, 10)
    checks.at_least("max-jobs", max_jobs, 1, MAX_JOBS_LIMIT)
    if scheduler:
        check_scheduler(scheduler)
    rows = run_sweep(spec, out_dir, scheduler=scheduler, workers=workers, retries=retries,
                     echo=click.echo, max_jobs=max_jobs)
    bad = [r for r in rows if r.get("error") or r.get("mismatches") or r.get("timeout")
           or r.get("counter_mismatches")]
    if bad:
        raise SimulationMismatch(f"{len(bad)} of {len(rows)} jobs failed or disagreed with "
                                 f"the golden model (first: job {bad[0]['job']})")


#: The flow verbs, in the order ``hwgen --help`` lists them.
COMMANDS = (list_cmd, config_cmd, build, sim, synth, timing, sweep)
