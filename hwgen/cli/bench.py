"""``hwgen bench``: benchmarks printed as tables. The flow's own (timing, tests, mutation, sim)
are here; each domain's benchmark lives with its group (``hwgen chamvs bench`` is ``hwgen bench
chamvs``) and is listed here too."""

import os

import click

from .. import checks, registry
from ..cli_support import log as _log
from ..cli_support import reports_errors
from . import chamvs, cluster, recsys
from .common import seed as _seed
from .common import write_json

__all__ = ["bench"]


@click.group()
def bench():
    """Benchmarks: measured throughput/latency and resources, printed as tables."""


@bench.command("timing")
@click.option("--seeds", type=int, default=3, show_default=True,
              help="Place and route with seeds 1..N per block (median).")
@click.option("--only", "names", multiple=True, metavar="NAME",
              help="Only these accelerators, or single rows by their name in the table "
              "(e.g. \"ibert-linear tiles=2\"; repeatable); the table's other rows are kept.")
@click.option("--workers", type=int, help="Dask LocalCluster processes (default: one per two "
              "cores; each runs two place-and-route seeds at a time).")
@click.option("--scheduler", metavar="ADDRESS", help="A running Dask scheduler to use "
              "instead (its workers need hwgen and the ECP5 tools).")
@click.option("--results", "results_path", type=click.Path(dir_okay=False),
              help="The table of record to merge the rows into [default: "
              "hwgen/flow/timing_results.json].")
@click.option("--readme", "readme_path", type=click.Path(dir_okay=False, exists=True),
              help="Regenerate the timing table of this Markdown page from the results (make "
              "timing: docs/guides/timing.md, the documentation site's timing page).")
@click.option("--out", "out_dir", type=click.Path(file_okay=False),
              help="Folder for the sweep's sweep.json and sweep.csv [default: a temporary one].")
@click.option("--json", "json_path", type=click.Path(dir_okay=False),
              help="Write the printed rows (before and after) as JSON.")
@click.option("--place-large", is_flag=True,
              help="Also place and route the defaults of the blocks measured as the sum of "
              "their parts (the table's notes name them); each fails to fit the 85F or runs "
              "into the flow's time limit per seed.")
@click.option("--remeasure", is_flag=True,
              help="Place and route every selected row, also those the table of record "
              "measured with the same Verilog, seeds and flow (kept by default).")
@click.option("--pnr-timeout", type=int, metavar="SECONDS",
              help="Stop a nextpnr seed after this many seconds [default: 1200; "
              "$HWGEN_PNR_TIMEOUT_S]. A seed stopped is reported as failed; the limit never "
              "changes a finished seed's figures. A row whose seed timed out is placed again "
              "only under a longer limit than it had.")
@reports_errors
def bench_timing(seeds, names, workers, scheduler, results_path, readme_path, out_dir,
                 json_path, place_large, remeasure, pnr_timeout):
    """ECP5 Fmax, ratio and UltraScale+ depth of every registered accelerator, measured on
    Dask and written to the timing table of record (beside the recorded before)."""
    from ..flow import timing_table
    from ..flow.timing_bench import bench_timing as run_bench
    checks.at_least("seeds", seeds, 1, 20)
    if workers is not None:
        checks.at_least("workers", workers, 1, 1024)
    for name in names:
        registry.get(name.split()[0])
    if json_path:
        checks.output_file("json", json_path)
    if scheduler:
        from ..flow.sweep import check_scheduler
        check_scheduler(scheduler)
    if pnr_timeout is not None:
        from ..flow.timing import PNR_TIMEOUT_ENV, PNR_TIMEOUT_MAX_S
        checks.at_least("pnr-timeout", pnr_timeout, 1, PNR_TIMEOUT_MAX_S)
        os.environ[PNR_TIMEOUT_ENV] = str(pnr_timeout)     # Dask's local workers inherit it
    timing_table.load(results_path)     # a malformed table fails before hours of work
    run_bench(click.echo, seeds=seeds, names=names, json_path=json_path, log=_log,
              workers=workers, scheduler=scheduler, results=results_path, readme=readme_path,
              out_dir=out_dir, place_large=place_large, remeasure=remeasure)


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
    from ..flow import profile
    if json_path:
        checks.output_file("json", json_path)
    report = profile.summarize(profile.read_events(events_path), junit=junit_path,
                               setup_seconds=setup_seconds, wall_seconds=wall_seconds)
    errors = profile.check_budget(report, budget_path) if budget_path else []
    _finish(profile.table(report), report, "budget_errors", errors, json_path)


@bench.command("mutation")
@click.option("--results", "results_dir", type=click.Path(file_okay=False), default="mutants",
              show_default=True, help="mutmut's results folder (make mutate writes mutants/).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False),
              help="Write the report as JSON.")
@reports_errors
def bench_mutation(results_dir, json_path):
    """Kill rate per package of a mutmut run (make mutate); fails below the floors
    (hwgen/flow/mutation.py: FLOORS)."""
    from ..flow import mutation
    if json_path:
        checks.output_file("json", json_path)
    report = mutation.summarize(mutation.read_results(results_dir))
    _finish(mutation.table(report), report, "floor_errors", mutation.check_floors(report),
            json_path)


@bench.command("sim")
@click.option("--seed", type=int, default=1, show_default=True)
@click.option("--json", "json_path", type=click.Path(dir_okay=False),
              help="Write the rows as JSON (with the command, date, machine and commit).")
@reports_errors
def bench_sim_cmd(seed, json_path):
    """Simulated cycles per second: cocotb vs native engine, side by side."""
    from ..flow.sim_bench import bench_sim
    _seed(seed)
    if json_path:
        checks.output_file("json", json_path)
    rows = bench_sim(click.echo, seed=seed, log=_log)
    if json_path:
        from ..flow.provenance import measured
        write_json(json_path, {"measured": measured(), "rows": rows})


for _command in (*chamvs.BENCHES, cluster.bench_cluster, recsys.bench_recsys):
    bench.add_command(_command)


def _finish(lines, report, errors_key, errors, json_path):
    """Print a bench's table ``lines``, record ``errors`` in ``report[errors_key]``, write the
    report to ``json_path`` when given, and fail naming the errors."""
    for line in lines:
        click.echo(line)
    report[errors_key] = errors
    if json_path:
        write_json(json_path, report)
    if errors:
        raise click.ClickException("; ".join(errors))
