"""``hwgen sweep``: regression sweeps over configurations x seeds x stall levels on Dask.

A spec (JSON or YAML) is one object or a list of objects::

    {"accelerator": "pq-decoder",
     "grid": {"m": [1, 5, 16], "lut_bits": [16, 24]},     # cartesian product ...
     "configs": [{"m": 7}],                                # ... and/or a list of configurations
     "seeds": [1, 2, 3], "stall": [0.0, 0.3], "items": 2000,
     "engine": "native",                                   # or "cocotb" (default: native)
     "options": {},                                        # the model's options, e.g. fuzz
     "synth": false,                                       # also a yosys job per configuration
     "timing": 3}                                          # also place and route, seeds 1..3

Every simulation job is checked against the golden model; a ``synth`` job is a yosys resource
count and a ``timing`` job an ECP5 place and route (:func:`hwgen.flow.timing.measure_timing`:
Fmax per seed, its median and ratio to the reference, critical path, UltraScale+ depth; ``true``
means 3 seeds). An entry with ``"seeds": []`` has no simulation jobs (``hwgen bench timing``
runs its place-and-route jobs this way; an entry with neither ``synth`` nor ``timing`` needs
seeds). A spec may also be given in memory, as that list. Jobs run on Dask distributed: a
``LocalCluster`` of ``--workers`` processes by default, or the scheduler at ``--scheduler
ADDRESS`` (a cluster a user already has; its workers need hwgen installed and a shared
``$HWGEN_CACHE`` or their own cache). Verilator builds are shared: one build task per distinct
configuration runs first, and every simulation of that configuration reuses it (the build
cache's file locks make concurrent builds safe as well).

A job whose worker dies is rescheduled by Dask, and a job that raises is retried
(``retries``); each attempt leaves a marker file, so the table says how many attempts a job
took. The results are ``sweep.json`` and ``sweep.csv`` (one row per job) and ``sweep.png``
(results per cycle against the first swept parameter, one line per stall level; LUTs too when
``synth`` is on).

``fault`` (testing only): ``{"kill_worker_on_job": N}`` makes the first attempt of job N kill
its worker process, to prove that no job is lost.
"""

import csv
import itertools
import json
import logging
import math
import os
import sys
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .. import checks, registry
from ..errors import ConfigError, ToolError

__all__ = ["Job", "load_spec", "run_sweep", "check_scheduler", "dask_client", "MAX_JOBS", "MAX_JOBS_LIMIT"]

_KEYS = ("accelerator", "grid", "configs", "seeds", "stall", "items", "engine", "options",
         "synth", "timing", "fault", "comment")
#: Place-and-route seeds of ``"timing": true``.
TIMING_SEEDS = 3
#: Most jobs a spec may expand to by default (``hwgen sweep --max-jobs`` raises it); checked
#: from the grid's sizes before any job list is built.
MAX_JOBS = 10_000
#: Largest ``--max-jobs`` accepted.
MAX_JOBS_LIMIT = 10_000_000
#: Most items per simulation job.
MAX_ITEMS = 10_000_000


@dataclass
class Job:
    """One sweep job: a simulation (``kind="sim"``) of one configuration (``params``, overrides of
    the accelerator's defaults) at one ``seed`` and ``stall`` level with ``items`` items on
    ``engine``, a yosys synthesis of it (``kind="synth"``) or an ECP5 place and route with
    seeds 1..``seed`` (``kind="timing"``). ``index`` is its position in the
    spec's job list; ``options`` are the model's stimulus options and ``fault`` the spec's
    fault-injection entry (see module docstring)."""
    index: int
    accelerator: str
    params: dict
    seed: int
    stall: float
    items: int
    engine: str
    kind: str = "sim"                # "sim", "synth" or "timing"
    options: dict = field(default_factory=dict)     # the model's stimulus options (fuzz, ...)
    fault: dict = field(default_factory=dict)


def _list(obj, key, where, default, empty=False):
    value = obj.get(key, default)
    if not isinstance(value, list) or not (value or empty):
        raise ConfigError(f"{where}.{key}", "must be a " + ("list" if empty else
                                                            "non-empty list"), value=value)
    return value


def _timing_seeds(entry, where):
    """Place-and-route seeds of an entry's ``timing`` key: 0 (none), 3 for true, or N."""
    value = entry.get("timing", False)
    if value is False:
        return 0
    if value is True:
        return TIMING_SEEDS
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 20:
        raise ConfigError(f"{where}.timing", "must be true, false or a seed count 1..20",
                          value=value)
    return value


def _read(path):
    if Path(path).suffix in (".yaml", ".yml"):
        import yaml
        text = checks.read_text(path, "spec")
        try:
            return yaml.safe_load(text)
        except (yaml.YAMLError, RecursionError) as e:
            raise ConfigError("spec", f"not valid YAML ({' '.join(str(e).split())[:200]})",
                              value=str(path)) from None
    return checks.read_json(path, "spec")


#: Shipped specs, usable by name (``hwgen sweep regression``).
SPECS_DIR = Path(__file__).parent / "sweeps"


def spec_path(name):
    """``name`` as given, or the shipped spec of that name."""
    p = Path(name)
    if not p.exists() and not p.suffix and (SPECS_DIR / f"{name}.json").exists():
        return SPECS_DIR / f"{name}.json"
    return p


def _stimulus_options(acc, options, where):
    """``options`` checked against the model's ``hwgen sim`` stimulus options."""
    if not isinstance(options, dict):
        raise ConfigError(f"{where}.options", "must be an object of the model's stimulus "
                          "options (e.g. {\"fuzz\": 200})", value=options)
    known = [o.name for o in acc.model.sim_options if o.route == "stimulus"]
    for key in options:
        if key not in known:
            raise ConfigError(f"{where}.options.{key}", f"is not a stimulus option of "
                              f"{acc.name} (its options: {', '.join(known) or 'none'})")
    return options


def _check_job_count(grid_sizes, extra, runs, where, total, max_jobs):
    """Refuse an entry whose jobs (``prod(grid_sizes) + extra`` configurations x ``runs``
    each) would bring the spec's ``total`` past ``max_jobs``; counted without building
    them."""
    configs = (math.prod(grid_sizes) if grid_sizes else 0) + extra
    if total + configs * runs > max_jobs:
        raise ConfigError(f"{where}.grid", f"expands to {total + configs * runs:,} jobs in "
                          f"all, more than --max-jobs {max_jobs:,}: fewer values, or a larger "
                          "--max-jobs")


def load_spec(path, max_jobs=MAX_JOBS):
    """The jobs of the spec file ``path`` (or of a spec given as a list of entries), every
    configuration validated (nothing runs yet); at most ``max_jobs`` jobs."""
    from .engine import ENGINES
    doc = path if isinstance(path, list) else _read(spec_path(path))
    entries = doc if isinstance(doc, list) else [doc]
    jobs = []
    for e, entry in enumerate(entries):
        where = f"spec[{e}]"
        if not isinstance(entry, dict):
            raise ConfigError(where, "must be an object")
        for key in entry:
            if key not in _KEYS:
                raise ConfigError(f"{where}.{key}", "unknown key; known: " + ", ".join(_KEYS))
        if not isinstance(entry.get("accelerator"), str):
            raise ConfigError(f"{where}.accelerator", "must name an accelerator (hwgen list)")
        acc = registry.get(entry["accelerator"])
        grid = entry.get("grid", {})
        if not isinstance(grid, dict):
            raise ConfigError(f"{where}.grid", "must be an object {parameter: [values]}")
        if "grid" in entry and not grid:
            raise ConfigError(f"{where}.grid", "names no parameter: give {parameter: "
                              "[values]}, or leave grid out to run the default configuration")
        names = list(grid)
        values = [_list(grid, n, f"{where}.grid", None) for n in names]
        extra = entry.get("configs", [] if names else [{}])
        if not isinstance(extra, list) or not all(isinstance(c, dict) for c in extra):
            raise ConfigError(f"{where}.configs", "must be a list of parameter objects")
        seeds = [checks.at_least(f"{where}.seeds", s, 0, checks.SEED_MAX)
                 for s in _list(entry, "seeds", where, [1],
                                empty=bool(entry.get("timing") or entry.get("synth")))]
        stalls = [checks.probability(f"{where}.stall", s) for s in _list(entry, "stall", where,
                                                                          [0.0])]
        runs = len(seeds) * len(stalls) + bool(entry.get("synth")) + bool(entry.get("timing"))
        _check_job_count([len(v) for v in values], len(extra), runs, where, len(jobs), max_jobs)
        configs = [dict(zip(names, combo)) for combo in itertools.product(*values)] \
            if names else []
        configs += extra
        for c, params in enumerate(configs):
            try:
                acc.config.from_dict(params)
            except ConfigError as err:
                raise ConfigError(f"{where} configuration {c} ({params})", str(err)) from None
        items = checks.at_least(f"{where}.items", entry.get("items", acc.default_items), 1,
                                MAX_ITEMS)
        engine = entry.get("engine", "native")
        if not isinstance(engine, str) or engine not in ENGINES:
            raise ConfigError(f"{where}.engine", "must be one of " + ", ".join(ENGINES),
                              value=engine)
        options = _stimulus_options(acc, entry.get("options", {}), where)
        timing_seeds = _timing_seeds(entry, where)
        fault = entry.get("fault", {})
        if not isinstance(fault, dict):
            raise ConfigError(f"{where}.fault", "must be an object", value=fault)
        for params in configs:
            for seed, stall in itertools.product(seeds, stalls):
                jobs.append(Job(len(jobs), acc.name, params, seed, stall, items, engine,
                                options=options, fault=fault))
            if entry.get("synth"):
                jobs.append(Job(len(jobs), acc.name, params, 0, 0.0, 0, engine, kind="synth"))
            if timing_seeds:
                jobs.append(Job(len(jobs), acc.name, params, timing_seeds, 0.0, 0, engine,
                                kind="timing"))
    if not jobs:
        raise ConfigError("spec", "holds no job")
    return jobs


# -- tasks (run on the workers) -----------------------------------------------------------

def _build_task(accelerator, params, engine):
    from .engine import get_engine
    acc = registry.get(accelerator)
    cfg = acc.config.from_dict(params)
    build = get_engine(engine).build(acc, cfg)
    return {"accelerator": accelerator, "params": params, "cached": build.cached,
            "seconds": round(build.seconds, 2)}


def _job_task(job, attempts_dir):
    marker = Path(attempts_dir) / f"{job['index']}-{uuid.uuid4().hex[:8]}"
    marker.write_text(str(os.getpid()))
    if job["fault"].get("kill_worker_on_job") == job["index"] and \
            len(list(Path(attempts_dir).glob(f"{job['index']}-*"))) == 1:
        os._exit(1)          # fault injection: this worker process dies mid-job
    acc = registry.get(job["accelerator"])
    cfg = acc.config.from_dict(job["params"])
    start = time.monotonic()
    row = {"job": job["index"], "accelerator": job["accelerator"], "kind": job["kind"],
           **{f"param.{k}": v for k, v in job["params"].items()}, "config": cfg.digest()}
    if job["kind"] == "synth":
        from .synth import synthesize
        res = synthesize(acc, cfg)["resources"]
        row.update({"lut": res["lut"], "ff": res["ff"], "dsp": res["dsp"],
                    "bram18": res["bram18"]})
    elif job["kind"] == "timing":
        row.update(_timing_row(acc, cfg, job["seed"]))
    else:
        from .simulate import simulate
        r = simulate(acc, cfg, items=job["items"], seed=job["seed"], stall=job["stall"],
                     engine=job["engine"], stimulus_options=job["options"] or None)
        row.update({"seed": job["seed"], "stall": job["stall"], "items": job["items"],
                    "engine": job["engine"], "mismatches": r["mismatches"],
                    "timeout": r["timeout"], "results": r["results"], "cycles": r["cycles"],
                    "results_per_cycle": r["results_per_cycle"],
                    "latency_cycles": r["latency_cycles"],
                    "cycles_per_second": r["cycles_per_second"]})
        if "counter_mismatches" in r:        # status counters sampled from the simulation
            row["counter_mismatches"] = r["counter_mismatches"]
    row["seconds"] = round(time.monotonic() - start, 3)
    return row


def _timing_row(acc, cfg, seeds):
    """A timing job's columns: the headline figures and the whole report (``report``); a
    design that does not fit the device or whose place and route fails gives ``error``."""
    from ..errors import HwgenError
    from .timing import measure_timing
    try:
        report = measure_timing(acc, cfg, seeds=seeds)
    except HwgenError as e:
        return {"seeds": seeds, "error": str(e).splitlines()[0], "report": None}
    us = report.get("ultrascale") or {}
    return {"seeds": seeds, "fmax_mhz": report["fmax_mhz"],
            "reference_mhz": report["reference"]["fmax_mhz"],
            "fmax_ratio": report["fmax_ratio"], "us_lut_levels": us.get("lut_levels"),
            "us_carry_chains": us.get("carry_chains"), "us_goal_met": us.get("goal_met"),
            "report": report}


# -- driver ---------------------------------------------------------------------------------

def check_scheduler(address):
    """``address`` if it is a Dask scheduler address (``tcp://HOST:PORT``, ``HOST:PORT``, or
    another protocol's ``PROTO://...``); :class:`ConfigError` naming ``scheduler`` otherwise,
    before any connection is tried."""
    from distributed.comm.addressing import parse_address, parse_host_port
    try:
        proto, loc = parse_address(address)
        if proto in ("tcp", "tls", "ws", "wss"):
            parse_host_port(loc)
    except (ValueError, TypeError) as e:
        raise ConfigError("scheduler", f"is not a Dask scheduler address ({e}); give "
                          "tcp://HOST:PORT, e.g. tcp://10.0.0.5:8786", value=address) from None
    return address


def dask_client(scheduler, workers):
    """``(client, cluster)``: a client of the Dask scheduler at ``scheduler``, or of a new
    LocalCluster of ``workers`` one-thread processes (``cluster`` then, to close after the
    client) when ``scheduler`` is None."""
    try:
        from distributed import Client, LocalCluster
    except ImportError:
        raise ToolError("hwgen sweep needs Dask distributed (pip install "
                        "'distributed==2026.8.0'; make setup installs it)") from None
    if scheduler:
        check_scheduler(scheduler)
        try:
            return Client(scheduler, timeout="10s"), None
        except (OSError, TimeoutError) as e:
            raise ConfigError("scheduler", f"cannot connect: {e}", value=scheduler) from None
    # a worker that dies makes the scheduler log its lost keys; the table reports retries
    logging.getLogger("distributed").setLevel(logging.CRITICAL)
    cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                           dashboard_address=None, silence_logs=logging.CRITICAL)
    return Client(cluster), cluster


def _progress(done, total, failed, start, stream):
    width = 30
    fill = int(width * done / total)
    stream.write(f"\r  [{'#' * fill}{'.' * (width - fill)}] {done}/{total} jobs"
                 f"{f', {failed} failed' if failed else ''}, {time.monotonic() - start:.0f} s ")
    stream.flush()


def run_sweep(spec, out_dir, *, scheduler=None, workers=None, retries=2, echo=print,
              progress=None, max_jobs=MAX_JOBS):
    """Run every job of the spec (at most ``max_jobs``) on Dask; write the table and the
    plot; returns the rows."""
    from distributed import as_completed
    jobs = load_spec(spec, max_jobs=max_jobs)
    workers = checks.at_least("workers", workers if workers is not None else
                              (os.cpu_count() or 1), 1, 1024)
    out = checks.output_dir("out", out_dir)
    attempts_dir = out / "attempts"
    attempts_dir.mkdir(exist_ok=True)
    for old in attempts_dir.iterdir():
        old.unlink()
    stream = progress if progress is not None else (sys.stderr if sys.stderr.isatty()
                                                    else None)
    client, cluster = dask_client(scheduler, workers)
    start = time.monotonic()
    try:
        # 1. one build per distinct configuration (and engine), before any simulation
        builds = {}
        for j in jobs:
            if j.kind == "sim":
                builds.setdefault((j.accelerator, json.dumps(j.params, sort_keys=True),
                                   j.engine), (j.accelerator, j.params, j.engine))
        build_futures = [client.submit(_build_task, *args, pure=False, retries=retries,
                                       key=f"build-{n}")
                         for n, args in enumerate(builds.values())]
        echo(f"sweep: {len(jobs)} jobs, {len(builds)} configurations to build, on "
             f"{'scheduler ' + scheduler if scheduler else f'a LocalCluster of {workers} workers'}")
        build_rows = client.gather(build_futures)
        echo(f"  builds: {sum(not b['cached'] for b in build_rows)} compiled, "
             f"{sum(b['cached'] for b in build_rows)} cached, "
             f"{time.monotonic() - start:.0f} s")
        # 2. the jobs
        futures = {client.submit(_job_task, asdict(j), str(attempts_dir), pure=False,
                                 retries=retries, key=f"job-{j.index}"): j for j in jobs}
        rows, failures = [], []
        for n, fut in enumerate(as_completed(futures), 1):
            job = futures[fut]
            try:
                rows.append(fut.result())
            except Exception as e:            # the job's own error after every retry
                failures.append({"job": job.index, "accelerator": job.accelerator,
                                 "kind": job.kind, "error": f"{type(e).__name__}: {e}"})
            if stream:
                _progress(n, len(jobs), len(failures), start, stream)
        if stream:
            stream.write("\n")
    finally:
        client.close()
        if cluster is not None:
            cluster.close()
    attempts = {}
    for marker in attempts_dir.iterdir():
        idx = int(marker.name.split("-")[0])
        attempts[idx] = attempts.get(idx, 0) + 1
    for row in rows + failures:
        row["attempts"] = attempts.get(row["job"], 1)
        row["retried"] = row["attempts"] > 1
    rows.sort(key=lambda r: r["job"])
    table = rows + sorted(failures, key=lambda r: r["job"])
    spec_name = "(in memory)" if isinstance(spec, list) else str(spec_path(spec))
    (out / "sweep.json").write_text(json.dumps({"spec": spec_name, "jobs": len(jobs),
                                                "failed": len(failures), "rows": table},
                                               indent=1) + "\n")
    # the timing jobs' whole reports stay in sweep.json; the CSV has their headline columns
    columns = sorted({k for r in table for k in r} - {"report"},
                     key=lambda k: (k != "job", k))
    with open(out / "sweep.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(table)
    plot = _plot(rows, out / "sweep.png")
    sims = [r for r in rows if r["kind"] == "sim"]
    bad = [r for r in sims if r["mismatches"] or r["timeout"] or r.get("counter_mismatches")]
    echo(f"  {len(rows)} jobs done ({len(sims)} simulations, {len(bad)} with mismatches or "
         f"timeouts), {len(failures)} failed, {sum(r['retried'] for r in table)} retried; "
         f"{time.monotonic() - start:.0f} s")
    echo(f"  wrote {out / 'sweep.json'}, {out / 'sweep.csv'}" + (f", {plot}" if plot else ""))
    return table


def _plot(rows, path):
    """Per accelerator, results/cycle against its first swept parameter (or the seed when
    nothing else varies), a line per stall level; LUTs per configuration when ``synth``."""
    sims = [r for r in rows if r["kind"] == "sim"]
    if not sims:
        return None
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    names = list(dict.fromkeys(r["accelerator"] for r in sims))
    synth = [r for r in rows if r["kind"] == "synth"]
    panels = len(names) + (1 if synth else 0)
    fig, axes = plt.subplots(1, panels, figsize=(4.8 * panels, 4), squeeze=False)

    def x_of(group):
        params = [k for k in group[0] if k.startswith("param.")]
        varying = [k for k in params if len({repr(r.get(k)) for r in group}) > 1
                   and all(isinstance(r.get(k), (int, float)) for r in group)]
        return varying[0] if varying else "seed"

    for ax, name in zip(axes[0], names):
        group = [r for r in sims if r["accelerator"] == name]
        x_key = x_of(group)
        lines = {}
        for r in group:
            lines.setdefault(r["stall"], {}).setdefault(r[x_key], []).append(
                r["results_per_cycle"])
        for stall, points in sorted(lines.items()):
            xs = sorted(points)
            ax.plot(xs, [sum(points[x]) / len(points[x]) for x in xs], marker="o",
                    label=f"stall {stall:g}")
        ax.set_title(f"{name} ({len(group)} runs)", fontsize=10)
        ax.set_xlabel(x_key.removeprefix("param."))
        ax.set_ylabel("results per cycle (mean)")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    if synth:
        ax = axes[0][-1]
        for name in dict.fromkeys(r["accelerator"] for r in synth):
            group = [r for r in synth if r["accelerator"] == name]
            x_key = x_of(group) if len(group) > 1 else None
            if x_key and x_key != "seed":
                pts = sorted((r[x_key], r["lut"]) for r in group)
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="s", label=name)
        ax.set_ylabel("LUTs (yosys synth_xilinx)")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("hwgen sweep: every run checked against its golden model")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
