"""``hwgen windve run | stress | calibrate``: the WindVE embedding service from the command line
(``hwgen serve`` is the old name of the group, still working)."""

import asyncio
import errno
import json
import signal
import socket
import sys
from pathlib import Path

import click

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


def _plan(devices, heterogeneous):
    from ..windve import devices as dev
    if devices is not None and not devices.strip():
        raise ConfigError("devices", "is empty; leave the option out to detect the devices, "
                          "or name them, e.g. cpu:1,cpu:1", value=devices)
    instances = dev.parse_devices(devices) if devices else dev.detect()
    plan = dev.plan(instances, heterogeneous)
    for line in dev.describe(plan):
        _log(line)
    if plan.note:
        _log(plan.note)
    return plan


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
              "(KIND[:THREADS or INDEX][@CORES]); default: detect. With only CPU instances "
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
@reports_errors
def serve_stress(url, slo, levels, rounds, burst, clients, per_client, overload_only,
                 json_path, plot_path):
    """Closed-loop stress test of a running service: main-only vs heterogeneous; with
    --burst/--clients also overload, /health latency and /metrics accounting."""
    from ..windve import stress
    _check_inputs([slo], json_path, plot_path)
    checks.at_least("rounds", rounds, 1, MAX_ROUNDS)
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


@windve.command("calibrate")
@click.option("--devices", help="As for `hwgen windve run`.")
@click.option("--heterogeneous/--no-heterogeneous", default=True, show_default=True,
              help="Also calibrate the CPU (auxiliary) instances.")
@click.option("--slo", "slos", type=float, multiple=True, help="SLO in seconds "
              "(repeatable; default 1 and 2, the paper's).")
@click.option("--max-profile", type=int, default=32, show_default=True,
              help="Largest concurrency profiled for the fit.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False))
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False),
              help="PNG of latency against concurrency per device with the fitted lines.")
@reports_errors
def serve_calibrate(devices, heterogeneous, slos, max_profile, json_path, plot_path):
    """Fit t = alpha*C + beta per device, predict the queue depths, compare with a stress
    test in steps of 8 (the paper's Table 3)."""
    from ..windve import stress
    from ..windve.calibrate import calibrate, plot_calibration
    slos = slos or (1.0, 2.0)
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
