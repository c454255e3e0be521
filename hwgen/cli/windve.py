"""``hwgen windve run | stress | calibrate | cost``: the WindVE embedding service from the command
line (``hwgen serve`` is the old name of the group, still working)."""

import asyncio
import errno
import json
import signal
import socket
import sys
from pathlib import Path

import click
from click.core import ParameterSource

from .. import checks
from ..cli_support import log as _log
from ..cli_support import reports_errors
from ..errors import ConfigError

__all__ = ["windve", "parse_depths"]

DEPTH_ALIASES = {"main": "main", "accelerator": "main", "npu": "main", "gpu": "main",
                 "fpga": "main", "cpu": "cpu", "aux": "cpu"}
DEFAULT_DEPTHS = {"main": 16, "cpu": 4}
#: Largest queue depth (texts) `--depths` accepts.
MAX_DEPTH = 100_000
#: Largest `--max-batch` and `--max-texts`.
MAX_BATCH = 1024
#: Largest `--max-wait-ms` (a batch never waits longer than this for company).
MAX_WAIT_MS = 10_000.0
#: Largest closed-loop concurrency level and open-loop burst of `windve stress`.
MAX_CONCURRENCY = 2_000
#: Largest number of closed-loop rounds per level.
MAX_ROUNDS = 100
#: The instances of `stress --compare` and the sweeps on a machine without a GPU or NPU (when
#: `--devices` is not given): one CPU thread emulates the accelerator, another is the overflow.
EMULATED_DEVICES = "cpu:1,cpu:1"


def _ms(value):
    return "-" if value is None else f"{value:.1f} ms"


def parse_depths(text):
    """``main=16,cpu=4`` (``npu``/``gpu``/``accelerator`` name the main queue) -> dict."""
    depths = dict(DEFAULT_DEPTHS)
    if not text:
        return depths
    for item in text.split(","):
        key, sep, value = item.partition("=")
        key = key.strip().lower()
        if not sep or key not in DEPTH_ALIASES:
            raise ConfigError("depths", "expected main=N,cpu=N (main may be written npu, gpu "
                              "or accelerator)", value=text)
        value = value.strip()
        if not (value.isascii() and value.isdigit()) or not 1 <= int(value) <= MAX_DEPTH:
            raise ConfigError("depths", f"{key} must be a whole number in 1..{MAX_DEPTH}",
                              value=text)
        depths[DEPTH_ALIASES[key]] = int(value)
    return depths


def _plan(devices, heterogeneous, pair=False):
    """The plan of ``--devices`` (or the detected devices), logged; with ``pair`` it must
    have a main and a CPU overflow queue (ConfigError naming ``devices`` otherwise)."""
    from ..windve import devices as dev
    if devices is not None and not devices.strip():
        raise ConfigError("devices", "is empty; leave the option out to detect the devices, "
                          "or name them, e.g. cpu:1,cpu:1", value=devices)
    instances = dev.parse_devices(devices) if devices else dev.detect()
    plan = dev.plan(instances, heterogeneous)
    if pair and not plan.auxiliary:
        raise ConfigError("devices", "needs a main instance and a CPU overflow instance, e.g. "
                          "cpu:1,cpu:1 (the first emulates the accelerator) or gpu:0,cpu:8",
                          value=devices)
    for line in dev.describe(plan):
        _log(line)
    if plan.note:
        _log(plan.note)
    return plan


def _pair_plan(devices):
    """A plan with a main and a CPU queue, and the ``--devices`` text its services take:
    ``devices``, or without it the detected devices, or on a machine with no GPU or NPU
    :data:`EMULATED_DEVICES` (said in the log)."""
    from ..windve import devices as dev
    if devices is None and not any(i.accelerator and i.usable for i in dev.detect()):
        devices = EMULATED_DEVICES
        _log(f"no GPU or NPU on this machine: one CPU thread emulates the accelerator "
             f"(as --devices {EMULATED_DEVICES})")
    return _plan(devices, True, pair=True), devices


def _who(instances):
    """``cpu0 (1 thread, emulating the accelerator)``, ``gpu0 (cuda:0)``, ..."""
    parts = []
    for i in instances:
        what = (f"{i.threads} thread{'s' if i.threads != 1 else ''}" if i.kind == "cpu"
                and i.threads else i.torch_device)
        parts.append(f"{i.name} ({what}" + (f", EMULATING the {i.emulates}" if i.emulates
                                              else "") + ")")
    return " + ".join(parts)


def _int_list(name, text):
    """``"16,64,256"`` -> [16, 64, 256]; ConfigError naming ``name`` otherwise."""
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ConfigError(name, "expected a comma-separated list of integers",
                          value=text) from None
    if not values:
        raise ConfigError(name, "needs at least one value", value=text)
    return values


def _check_port(host, port):
    checks.at_least("port", port, 1, 65535)
    try:
        infos = socket.getaddrinfo(host, port, socket.AF_INET, socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as e:
        reason = getattr(e, "strerror", None) or str(e)
        raise ConfigError("host", f"is not an IPv4 address or a name this machine resolves "
                          f"({reason})", value=host) from None
    if not infos:
        raise ConfigError("host", "resolves to no IPv4 address", value=host)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            if e.errno == errno.EADDRNOTAVAIL:
                raise ConfigError("host", f"is not an address of this machine: {e.strerror}",
                                  value=host) from None
            raise ConfigError("port", f"cannot listen on {host}:{port}: {e.strerror}",
                              value=port) from None


@click.group()
def windve():
    """WindVE: embedding serving that overflows peak load from the accelerator to the CPU."""


@windve.command("run")
@click.option("--devices", help="Declared instances, e.g. cpu:1,cpu:1 or gpu:0,cpu:8@0-7 "
              "(KIND, then :THREADS or :INDEX, then optionally @CORES); default: detect. With only CPU instances "
              "declared, the first one emulates the accelerator.")
@click.option("--heterogeneous/--no-heterogeneous", default=False, show_default=True,
              help="Overflow to the CPU queue when the main queue is full.")
@click.option("--depths", help="Queue depths in texts, main=N,cpu=N, each 1..100000 "
              "(default main=16,cpu=4; `hwgen windve calibrate` measures them).")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="IPv4 address or name to listen on (must be this machine's).")
@click.option("--port", type=int, default=8088, show_default=True, help="1..65535.")
@click.option("--max-batch", type=int, default=32, show_default=True,
              help="Texts per instance batch, 1..1024.")
@click.option("--max-wait-ms", type=float, default=5.0, show_default=True,
              help="How long an instance waits for its batch to fill; a finite number "
              "in 0..10000.")
@click.option("--max-texts", type=int, default=64, show_default=True,
              help="Texts per request, 1..1024.")
@click.option("--truncate", is_flag=True, help="Cut texts over 256 tokens (as "
              "sentence-transformers does) instead of answering 413.")
@reports_errors
def serve_run(devices, heterogeneous, depths, host, port, max_batch, max_wait_ms, max_texts,
              truncate):
    """Serve POST /v1/embeddings, GET /metrics and GET /health until interrupted."""
    from ..windve.service import (DRAIN_SECONDS, EmbeddingService, create_app,
                                  draining_server, server_config)
    depth = parse_depths(depths)
    checks.at_least("max_batch", max_batch, 1, MAX_BATCH)
    checks.at_least("max_texts", max_texts, 1, MAX_BATCH)
    checks.in_range("max_wait_ms", max_wait_ms, 0.0, MAX_WAIT_MS)
    _check_port(host, port)
    plan = _plan(devices, heterogeneous)
    service = EmbeddingService(plan, depth, max_batch=max_batch, max_wait=max_wait_ms / 1000,
                               max_texts=max_texts, truncate=truncate)
    # the web stack (FastAPI, uvicorn) is imported before the model copies load
    server = draining_server(service, server_config(create_app(service), host, port))
    service.start(log=_log)
    queues = ", ".join(f"{q.name} depth {q.depth}" for q in service.manager.queues)
    click.echo(f"WindVE serving {len(service.runners)} instances ({queues}; heterogeneous "
               f"{'on' if service.manager.heterogeneous else 'off'}) on http://{host}:{port}",
               err=True)
    # uvicorn handles SIGINT/SIGTERM while serving (stop accepting, finish the requests in
    # flight) and re-raises the signal afterwards; this handler takes it, so the queues are
    # drained below and the command exits 0 instead of with a KeyboardInterrupt.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda signum, frame: None)
    try:
        server.run()
    finally:
        _log("draining: answering every accepted request ...")
        service.drain(timeout=DRAIN_SECONDS)
        _log(f"stopped; {json.dumps(service.health()['queues'])}")


def _check_inputs(slos, json_path, plot_path):
    """SLOs must be positive; output files must be writable (checked before anything runs)."""
    for slo in slos:
        checks.positive("slo", slo)
    for path, name in ((json_path, "json"), (plot_path, "plot")):
        if path:
            checks.output_file(name, path)


def _levels(text):
    try:
        levels = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise ConfigError("concurrency", "expected a comma-separated list of integers",
                          value=text) from None
    if not levels or levels[0] < 1 or levels[-1] > MAX_CONCURRENCY:
        raise ConfigError("concurrency", f"needs at least one level, all in "
                          f"1..{MAX_CONCURRENCY}", value=text)
    return levels


@windve.command("stress")
@click.option("--url", default="http://127.0.0.1:8088", show_default=True)
@click.option("--slo", type=float, default=1.0, show_default=True,
              help="End-to-end latency limit in seconds.")
@click.option("--concurrency", "levels", default="1,2,4,8,12,16,20,24,28,32,40,48,56,64",
              show_default=True, help="Closed-loop concurrency levels, each 1..2000.")
@click.option("--rounds", type=int, default=2, show_default=True,
              help="Closed-loop rounds per level, 1..100.")
@click.option("--burst", type=int, help="Also send open-loop bursts of this many requests, "
              "1..2000 (10 bursts, 0.2 s apart).")
@click.option("--clients", type=int, help="Also run this many concurrent clients, 1..2000, "
              "each sending --per-client requests one after another (the next once the last "
              "is answered, 200 or 429).")
@click.option("--per-client", type=int, default=3, show_default=True,
              help="Requests of each --clients client, 1..100.")
@click.option("--overload-only", "--burst-only", is_flag=True,
              help="Skip the closed-loop levels: only --burst and/or --clients. During both, "
              "GET /health is timed every 50 ms from a process of its own and the service's "
              "/metrics are checked to count every answer (exit 1 otherwise).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False))
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False),
              help="PNG of latency against concurrency, main-only and heterogeneous.")
@click.option("--compare", is_flag=True, help="The paper's comparison in one run, on "
              "services this command starts (no --url): main only at its best depth (its "
              "largest concurrency within --slo), then heterogeneous at that same main depth "
              "plus the CPU queue; prints both and the gain.")
@click.option("--devices", help="With --compare: the instances, as for `hwgen windve run`; "
              "default: detect (GPU main, CPU overflow), or on a machine without GPU or NPU "
              f"{EMULATED_DEVICES} (the first CPU thread emulates the accelerator).")
@click.option("--calibration", type=click.Path(dir_okay=False), help="With --compare: a "
              "`hwgen windve calibrate --json` report; the searches start at its depths for "
              "--slo and move in steps of --step.")
@click.option("--step", type=int, default=8, show_default=True, help="With --compare: the "
              "searches double from this concurrency (or step by it from --calibration's "
              "depths), then bisect; 1..2000.")
@reports_errors
def serve_stress(url, slo, levels, rounds, burst, clients, per_client, overload_only,
                 json_path, plot_path, compare, devices, calibration, step):
    """Closed-loop stress test of a running service: main-only vs heterogeneous; with
    --burst/--clients also overload, /health latency and /metrics accounting; with --compare
    the paper's comparison on services of its own."""
    from ..windve import stress
    _check_inputs([slo], json_path, plot_path)
    checks.at_least("rounds", rounds, 1, MAX_ROUNDS)
    _check_compare_options(compare)
    if compare:
        return _stress_compare(slo, rounds, step, devices, calibration, json_path, plot_path)
    levels = _levels(levels)
    if burst is not None:
        checks.at_least("burst", burst, 1, MAX_CONCURRENCY)
    if clients is not None:
        checks.at_least("clients", clients, 1, MAX_CONCURRENCY)
    checks.at_least("per-client", per_client, 1, MAX_ROUNDS)
    if overload_only and burst is None and clients is None:
        raise ConfigError("overload-only", "needs --burst N or --clients N")
    stress.check_reachable(url)
    texts = stress.default_texts()
    if overload_only:
        report = {"sent": 0, "ok": 0, "rejected": 0, "errors": 0}
    else:
        report = asyncio.run(stress.run_stress(url, slo, levels, texts, rounds=rounds,
                                               progress=_log))
    overloads = []
    if burst:
        overloads.append(("open_loop", f"open loop, 10 bursts of {burst}", stress.open_loop(
            url, 10, burst, 0.2, texts, probe_health=True)))
    if clients:
        overloads.append(("clients", f"{clients} clients x {per_client} requests",
                          stress.clients_loop(url, clients, per_client, texts,
                                              probe_health=True)))
    uncounted = False
    for key, what, loop in overloads:
        loop = report[key] = asyncio.run(loop)
        for total in ("sent", "ok", "rejected", "errors"):
            report[total] += loop[total]
        health = loop["health"]
        uncounted |= not loop["counted_all"]
        click.echo(f"{what}: sent {loop['sent']}, statuses {loop['statuses']}; /metrics "
                   f"counted {loop['counted']}{'' if loop['counted_all'] else ' (NOT all)'}; "
                   f"/health {health['statuses']} over {health['probes']} probes, p50 "
                   f"{_ms(health['p50_ms'])}, p99 {_ms(health['p99_ms'])}, max "
                   f"{_ms(health['max_ms'])}")
    if not overload_only:
        best = report["max_concurrency"]
        gain = report["improvement_percent"]
        click.echo(f"SLO {slo:g} s: maximum concurrency main-only {best['main_only']}, "
                   f"heterogeneous {best['heterogeneous']}"
                   + (f" (+{gain:.1f}%)" if gain is not None else "")
                   + f"; sent {report['sent']}, 200 {report['ok']}, 429 {report['rejected']}, "
                   f"errors {report['errors']}")
    if json_path:            # written before the verdict, so a failed run can be inspected
        Path(json_path).write_text(json.dumps(report, indent=2) + "\n")
    if plot_path and not overload_only:          # the plot draws the closed-loop levels
        stress.plot_stress(report, plot_path)
        click.echo(f"plot: {plot_path}")
    if report["ok"] + report["rejected"] + report["errors"] != report["sent"]:
        click.echo("hwgen: error: answers do not add up to the requests sent", err=True)
        sys.exit(1)
    if uncounted:
        click.echo("hwgen: error: /metrics did not count every answer", err=True)
        sys.exit(1)


#: `stress` options that --compare does not take, and the ones only --compare takes.
_STRESS_ONLY = {"url": "--url", "levels": "--concurrency", "burst": "--burst",
                "clients": "--clients", "per_client": "--per-client",
                "overload_only": "--overload-only"}
_COMPARE_ONLY = {"devices": "--devices", "calibration": "--calibration", "step": "--step"}


def _check_compare_options(compare):
    """Refuse a `stress` option given explicitly that does not apply with/without --compare."""
    ctx = click.get_current_context()
    for name, option in (_STRESS_ONLY if compare else _COMPARE_ONLY).items():
        if ctx.get_parameter_source(name) is not ParameterSource.DEFAULT:
            raise ConfigError(option.lstrip("-"), "does not apply with --compare, which "
                              "starts services of its own" if compare else
                              "applies with --compare only")


def _stress_compare(slo, rounds, step, devices, calibration, json_path, plot_path):
    """``stress --compare`` (see :mod:`hwgen.windve.compare`)."""
    from ..windve import compare, stress
    from ..windve.calibrate import read_calibration
    from ..windve.devices import allowed_cores
    checks.at_least("step", step, 1, compare.LIMIT)
    hint = None
    if calibration:
        cal = read_calibration(calibration, slo)
        if cal["cpu"] is None:
            raise ConfigError("calibration", "has no cpu device: calibrate with a CPU overflow "
                              "instance", value=calibration)
        hint = {"main": cal["main"]["depth"], "cpu": cal["cpu"]["depth"]}
    plan, service_devices = _pair_plan(devices)
    emulated = any(i.emulates for i in plan.main)
    report = compare.compare(
        slo, stress.default_texts(), step=step, rounds=rounds, hint=hint, progress=_log,
        start_service=lambda depths, het: compare.ServiceProcess(service_devices, depths, het,
                                                                 log=_log))
    accelerator = ("none: EMULATED by a CPU instance (no GPU or NPU in this run)" if emulated
                   else _who(plan.main))
    report["devices"] = {"main": _who(plan.main), "cpu": _who(plan.auxiliary),
                         "accelerator": accelerator, "emulated": emulated,
                         "devices": service_devices, "cores": len(allowed_cores())}
    main, het, gain = report["main_only"], report["heterogeneous"], report["gain"]

    def figures(r):
        seconds = " ".join("" if r[q] is None else f"{q} {r[q]:.3f} s," for q in ("p99", "max"))
        return (f"concurrency {r['concurrency']}, {r['throughput']:.1f} answers/s, {seconds} "
                + ("met the SLO" if r["met_slo"] else "MISSED the SLO"))

    click.echo(f"WindVE, the paper's comparison (SLO {slo:g} s, closed loop over HTTP, "
               f"{rounds} round{'s' if rounds != 1 else ''} a level):")
    click.echo(f"  main only      depth {main['depth']} (its best):  {figures(main)}")
    click.echo(f"  heterogeneous  main depth {het['main_depth']} + CPU queue {het['cpu_depth']}:"
               f"  {figures(het)}")
    click.echo(f"  gain: concurrency {gain['concurrency_percent']:+.1f}% ({het['cpu_depth']} / "
               f"{main['depth']}, the paper's concurrency improvement); throughput "
               f"{gain['throughput_percent']:+.1f}% (answers/s, heterogeneous / main only - 1)")
    click.echo(f"  main: {report['devices']['main']}; CPU overflow: {report['devices']['cpu']}; "
               f"accelerator: {accelerator}")
    _write_outputs(report, json_path, plot_path)
    if report["ok"] + report["rejected"] + report["errors"] != report["sent"]:
        click.echo("hwgen: error: answers do not add up to the requests sent", err=True)
        sys.exit(1)


def _write_outputs(report, json_path, plot_path):
    from ..windve import stress
    if json_path:
        Path(json_path).write_text(json.dumps(report, indent=2) + "\n")
    if plot_path:
        stress.plot_stress(report, plot_path)
        click.echo(f"plot: {plot_path}")


@windve.command("calibrate")
@click.option("--devices", help="As for `hwgen windve run`; with a sweep, default: detect, or "
              f"on a machine without GPU or NPU {EMULATED_DEVICES} (emulated).")
@click.option("--heterogeneous/--no-heterogeneous", default=True, show_default=True,
              help="Also calibrate the CPU (auxiliary) instances.")
@click.option("--slo", "slos", type=float, multiple=True, help="SLO in seconds "
              "(repeatable; default 1 and 2, the paper's).")
@click.option("--max-profile", type=int, default=32, show_default=True,
              help="Largest concurrency profiled for the fit.")
@click.option("--sweep-lengths", help="Instead of Table 3, the paper's Fig. 5: the depths of "
              "the main and CPU instances for texts of each of these token counts, 3..256 "
              "(e.g. 16,64,128,256); writes --json and --plot (default windve-lengths.json and "
              ".png).")
@click.option("--sweep-cores", help="Instead of Table 3, the paper's Fig. 6: the main depth "
              "once, then the CPU instance's with each of these core counts, 1..the cores this "
              "process may use (e.g. 1,2); 75-token texts; writes --json and --plot (default "
              "windve-cores.json and .png).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False))
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False),
              help="PNG of latency against concurrency per device with the fitted lines "
              "(with a sweep: concurrency against the swept quantity).")
@reports_errors
def serve_calibrate(devices, heterogeneous, slos, max_profile, sweep_lengths, sweep_cores,
                    json_path, plot_path):
    """Fit t = alpha*C + beta per device, predict the queue depths, compare with a stress
    test in steps of 8 (the paper's Table 3); or sweep query length (Fig. 5) or CPU cores
    (Fig. 6)."""
    from ..windve import stress
    from ..windve.calibrate import calibrate, plot_calibration
    slos = slos or (1.0, 2.0)
    if sweep_lengths is not None or sweep_cores is not None:
        return _calibrate_sweep(devices, heterogeneous, slos, max_profile, sweep_lengths,
                                sweep_cores, json_path, plot_path)
    _check_inputs(slos, json_path, plot_path)
    checks.at_least("max_profile", max_profile, 2)
    plan = _plan(devices, heterogeneous)
    result = calibrate(plan, slos, stress.default_texts(), max_profile=max_profile,
                       progress=_log)
    for line in result["table"]:
        click.echo(line)
    for d in result["devices"]:
        click.echo(f"{d['role']} ({'+'.join(d['instances'])}): alpha {d['alpha']:.5f} s per "
                   f"request, beta {d['beta']:.4f} s")
    first = slos[0]
    click.echo(f"for an SLO of {first:g} s: hwgen windve run --depths " + ",".join(
        f"{d['role']}={d['depths'][first]['final']}" for d in result["devices"]))
    if json_path:
        Path(json_path).write_text(json.dumps(result, indent=2, default=str) + "\n")
    if plot_path:
        plot_calibration(result, plot_path)
        click.echo(f"plot: {plot_path}")


def _calibrate_sweep(devices, heterogeneous, slos, max_profile, lengths, cores, json_path,
                     plot_path):
    """``calibrate --sweep-lengths/--sweep-cores`` (see :mod:`hwgen.windve.sweep`)."""
    from ..windve import sweep
    from ..windve.devices import allowed_cores
    if lengths is not None and cores is not None:
        raise ConfigError("sweep-cores", "one sweep a run: give --sweep-lengths or "
                          "--sweep-cores")
    if not heterogeneous:
        raise ConfigError("heterogeneous", "a sweep measures the CPU overflow instance too; "
                          "leave --no-heterogeneous out")
    kind = "lengths" if lengths is not None else "cores"
    values = _int_list(f"sweep-{kind}", lengths if lengths is not None else cores)
    json_path = json_path or f"windve-{kind}.json"
    plot_path = plot_path or f"windve-{kind}.png"
    _check_inputs(slos, json_path, plot_path)
    checks.at_least("max_profile", max_profile, 2)
    if kind == "lengths":
        for x in values:
            checks.at_least("sweep-lengths", x, 3, 256)
    else:
        for x in values:
            checks.at_least("sweep-cores", x, 1, len(allowed_cores()))
    plan, _ = _pair_plan(devices)
    run = sweep.sweep_lengths if kind == "lengths" else sweep.sweep_cores
    report = run(plan, slos, values, max_profile=max_profile, progress=_log)
    report["accelerator"] = ("none: EMULATED by a CPU instance (no GPU or NPU in this run)"
                             if any(i.emulates for i in plan.main) else _who(plan.main))
    report["cores"] = len(allowed_cores())
    click.echo(f"{report['x_label']:>34}  SLO (s)  original (main alone)  additional (CPU)  "
               "improvement")
    for r in report["rows"]:
        gain = "-" if r["improvement_percent"] is None else f"+{r['improvement_percent']:.1f}%"
        click.echo(f"{r['x']:>34}  {r['slo']:>7g}  {r['original']:>21}  {r['additional']:>16}  "
                   f"{gain:>11}")
    click.echo(f"main: {_who(plan.main)}; CPU: {'; '.join(report['cpu'])}; accelerator: "
               f"{report['accelerator']}; {report['cores']} cores available to this process")
    Path(json_path).write_text(json.dumps(report, indent=2, default=str) + "\n")
    sweep.plot_sweep(report, plot_path)
    click.echo(f"json: {json_path}\nplot: {plot_path}")


@windve.command("cost")
@click.option("--calibration", type=click.Path(dir_okay=False), help="A `hwgen windve stress "
              "--compare --json` report (measured throughputs) or a `hwgen windve calibrate "
              "--json` report (throughputs of the fitted lines); default: the paper's Table 1 "
              "(bge on a Tesla V100 with two Xeon E5 2690).")
@click.option("--slo", type=float, help="Seconds: which SLO's depths to take (default: the "
              "report's first; without --calibration 2, the paper's 18.6%; 1 also works).")
@click.option("--peak", type=float, default=1000.0, show_default=True,
              help="N_peak of Eq. 6: simultaneous queries at the peak.")
@click.option("--qps", type=float, default=100.0, show_default=True,
              help="N of Eq. 5: queries a second on average.")
@click.option("--devices-per-instance", type=int, default=1, show_default=True,
              help="D of Eqs. 5-6.")
@click.option("--price", type=float, default=1.0, show_default=True,
              help="P of Eqs. 5-6, the price of a device (the costs print in its units).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False))
@reports_errors
def serve_cost(calibration, slo, peak, qps, devices_per_instance, price, json_path):
    """The paper's cost model (Eqs. 4-6): what the CPU overflow saves, deploying for the peak
    (maximum concurrency) or for the average load (throughput)."""
    from ..windve import cost
    if slo is not None:
        checks.positive("slo", slo)
    _check_inputs([], json_path, None)
    checks.positive("peak", peak)
    checks.positive("qps", qps)
    checks.at_least("devices_per_instance", devices_per_instance, 1)
    checks.positive("price", price)
    figures = (cost.figures_from_file(calibration, slo) if calibration
               else cost.paper_figures(2.0 if slo is None else slo))
    result = cost.costs(figures, peak=peak, qps=qps, devices=devices_per_instance, price=price)
    _print_cost(result)
    if json_path:
        Path(json_path).write_text(json.dumps(result, indent=2) + "\n")


def _print_cost(result):
    f, par, n = result["figures"], result["parameters"], result["n"]
    c_main, c_cpu = f["main_concurrency"], f["cpu_concurrency"]
    peak, avg = result["peak"], result["average"]
    click.echo(f"figures ({f['source']}):")
    click.echo(f"  SLO {f['slo']:g} s; maximum concurrency main only {c_main}, WindVE {c_main} "
               f"+ {c_cpu} = {c_main + c_cpu}; throughput main only {f['main_throughput']:.2f}"
               f", WindVE {f['heterogeneous_throughput']:.2f} queries/s; t_proc "
               f"{f['t_proc']:.3f} s")
    click.echo(f"Eq. 6, deploying for the peak (Cost = N_peak / C * D * P; N_peak "
               f"{par['peak']:g}, D {par['devices_per_instance']}, P {par['price']:g}): main "
               f"only {peak['main_only']:.3f}, WindVE {peak['heterogeneous']:.3f}: saving "
               f"{peak['saving_percent']:.1f}% (= C_cpu / (C_main + C_cpu))")
    click.echo(f"Eq. 4: n = floor((SLO - t_proc) / t_proc) = floor(({f['slo']:g} - "
               f"{f['t_proc']:.3f}) / {f['t_proc']:.3f}) = {n}")
    if avg["saving_percent"] is None:
        click.echo("Eq. 5, deploying for the average: undefined, n = 0 (a lone query takes "
                   "more than half the SLO)")
    else:
        click.echo(f"Eq. 5, deploying for the average (Cost = (N / n) / T * D * P; N "
                   f"{par['qps']:g} queries/s): main only {avg['main_only']:.3f}, WindVE "
                   f"{avg['heterogeneous']:.3f}: saving {avg['saving_percent']:.1f}% (= 1 - "
                   "T_main / T_het)")
    click.echo(f"gains: concurrency {result['concurrency_gain_percent']:+.1f}% (C_cpu / "
               f"C_main), throughput {result['throughput_gain_percent']:+.1f}% (T_het / T_main "
               "- 1; the paper quotes this increase as its average-case saving, where Eq. 5 "
               "gives the saving above)")
    click.echo(f"saving: {peak['saving_percent']:.1f}% (Eq. 6, deploying for the peak; the "
               "paper's 18.6% is this for its Table 1 at 2 s)")
