"""Issue 35's WindVE items kept as regression tests: bad `hwgen serve` options refused in one
line (exit 2) before any model loads; the HTTP API never answers 500 to a client's input, counts
every status in /metrics, size-checks bodies before reading them, survives a runner crash, and
keeps /health fast under 10x overload (200 concurrent clients). The service here runs fake
instances (a fixed vector after a short sleep) so the tests take seconds, not a model load."""

import asyncio
import json
import socket
import time
from types import SimpleNamespace

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hwgen.cli import main

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")
uvicorn = pytest.importorskip("uvicorn")

from hwgen.windve import service as svc  # noqa: E402
from hwgen.windve.compare import free_port  # noqa: E402
from hwgen.windve.queues import Request  # noqa: E402
from hwgen.windve.workers import InstanceFailed, InstanceRunner  # noqa: E402
from test_windve_service import _metric  # noqa: E402


def cli(*args):
    result = CliRunner().invoke(main, [str(a) for a in args])
    return result.exit_code, result.stderr


RUN = ["serve", "run", "--devices", "cpu:1,cpu:1", "--heterogeneous"]
# (arguments, text the one-line error must contain)
PROBES = [
    (RUN + ["--max-wait-ms", "inf"], "max_wait_ms"),                        # item 1
    (RUN + ["--max-wait-ms", "nan"], "max_wait_ms"),
    (RUN + ["--max-wait-ms", "-1"], "max_wait_ms"),
    (RUN + ["--max-wait-ms", "1e12"], "0..10000"),
    (RUN + ["--depths", "main=\u00b2"], "depths"),                           # item 11
    (RUN + ["--depths", "main=\u0661"], "depths"),
    (RUN + ["--depths", "main=10000000000"], "1..100000"),
    (RUN + ["--host", "256.1.1.1"], "host"),                                 # item 18
    (RUN + ["--host", "no-such-host.invalid"], "host"),
    (RUN + ["--host", "192.0.2.77"], "host"),                  # not this machine's address
    (["serve", "run", "--devices", ""], "devices"),                          # item 19
    (["serve", "stress", "--concurrency", "1000000"], "1..2000"),            # item 10
    (["serve", "stress", "--concurrency", "4", "--burst", "-5"], "burst"),
    (["serve", "stress", "--concurrency", "4", "--burst", "0"], "burst"),
    (["serve", "stress", "--concurrency", "4", "--rounds", "1000000"], "rounds"),
    (["serve", "stress", "--slo", "inf"], "slo"),
    (["serve", "stress", "--overload-only"], "overload-only"),
    (["serve", "stress", "--clients", "0"], "clients"),
    (["serve", "stress", "--clients", "5", "--per-client", "1000"], "per-client"),
    (["serve", "calibrate", "--devices", "cpu:1", "--slo", "inf"], "slo"),
    (["serve", "calibrate", "--devices", "cpu:1", "--slo", "nan"], "slo"),
]


@pytest.mark.parametrize("args,needle", PROBES, ids=[" ".join(a[1:]) for a, _ in PROBES])
def test_bad_option_is_one_line_exit_2_before_any_work(args, needle):
    start = time.monotonic()
    code, err = cli(*args)
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hwgen: error:"), err
    assert needle in lines[0]
    assert "Traceback" not in err
    assert time.monotonic() - start < 10            # refused before a model load


def test_stress_against_nothing_says_connection_refused():            # item 17
    port = free_port()
    code, err = cli("serve", "stress", "--url", f"http://127.0.0.1:{port}",
                    "--concurrency", "1", "--rounds", "1")
    assert code == 2, err
    assert "connection refused" in err and "url" in err
    assert len(err.strip().splitlines()) == 1


# -- the HTTP API over fake instances --------------------------------------------------------

class FakeWorker:
    """Stands in for InstanceWorker: a fixed unit vector per text after ``delay`` seconds;
    ``fail`` makes embed raise it once (a bug in the runner's path)."""

    def __init__(self, name="fake0", delay=0.0):
        self.instance = SimpleNamespace(name=name, torch_device="cpu", threads=1,
                                        emulates=None)
        self.pid = 0
        self.restarts = 0
        self.delay = delay
        self.fail = None

    def embed(self, texts):
        if self.fail is not None:
            error, self.fail = self.fail, None
            raise error
        if self.delay:
            time.sleep(self.delay)
        out = np.zeros((len(texts), 384), np.float32)
        out[:, 0] = 1.0
        return out

    def start(self):
        self.restarts += 1
        return self

    def kill(self):
        pass

    def stop(self):
        pass


def _service(depths=(4, 4), delay=0.0, max_wait=0.001):
    plan = SimpleNamespace(main=(), auxiliary=(), heterogeneous=False, main_kind="cpu",
                           note="", unused=())
    service = svc.EmbeddingService(plan, {"main": depths[0], "cpu": depths[1]},
                                   max_wait=max_wait, max_texts=8)
    worker = FakeWorker(delay=delay)
    runner = InstanceRunner(worker, service.manager.main, max_wait=max_wait,
                            on_batch=service._on_batch, on_restart=service._on_restart)
    runner.start()
    service.runners.append(runner)
    return service, worker, runner


@pytest.fixture()
def api():
    from fastapi.testclient import TestClient
    service, worker, runner = _service()
    with TestClient(svc.create_app(service), raise_server_exceptions=False) as client:
        yield client, service, worker, runner
    service.drain(timeout=5)


BAD_TEXTS = [
    ("\ud800", 400, "lone surrogate"),                                           # item 2
    ("abc \udfff def", 400, "lone surrogate"),
    ("\u0000", 400, "non-empty"),                                                # item 6
    ("\u200b\u200b", 400, "non-empty"),
    ("\ufeff \u0000\t", 400, "non-empty"),
    ("   ", 400, "non-empty"),
]


@pytest.mark.parametrize("text,status,needle", BAD_TEXTS)
def test_unencodable_or_invisible_text_is_a_counted_400(api, text, status, needle):
    client, *_ = api
    body = json.dumps({"input": text}).encode()        # ensure_ascii: \\ud800 escapes survive
    r = client.post("/v1/embeddings", content=body,
                    headers={"content-type": "application/json"})
    assert r.status_code == status
    assert needle in r.json()["error"]["message"]
    metrics = client.get("/metrics").text
    assert _metric(metrics, "windve_http_responses_total", status=str(status),
                   path="/v1/embeddings") == 1
    assert _metric(metrics, "windve_requests_total", outcome="bad_request") == 1


def test_404_405_and_500_are_counted(api, monkeypatch):
    client, service, *_ = api
    assert client.get("/nowhere").status_code == 404
    assert client.get("/v1/embeddings").status_code == 405

    def broken(body):
        raise RuntimeError("a bug")
    monkeypatch.setattr(service, "parse", broken)
    assert client.post("/v1/embeddings", json={"input": "x"}).status_code == 500
    metrics = client.get("/metrics").text
    assert _metric(metrics, "windve_http_responses_total", status="404", path="other") == 1
    assert _metric(metrics, "windve_http_responses_total", status="405") == 1
    assert _metric(metrics, "windve_http_responses_total", status="500") == 1


def test_content_length_over_the_limit_is_413_without_reading_the_body(api):       # item 3
    client, *_ = api
    sent = []

    def body():                       # would be 300 MB; only the first chunk may be pulled
        for _ in range(300):
            sent.append(1)
            yield b"x" * (1 << 20)
    start = time.monotonic()
    r = client.post("/v1/embeddings", content=body(),
                    headers={"content-length": str(300 << 20)})
    assert r.status_code == 413 and "at most" in r.json()["error"]["message"]
    assert time.monotonic() - start < 5


def test_a_long_text_is_413_at_once(api):                                          # item 3
    client, *_ = api
    start = time.monotonic()
    r = client.post("/v1/embeddings", json={"input": "word " * 800_000})       # 4 MB
    assert r.status_code == 413 and "256 tokens" in r.json()["error"]["message"]
    assert time.monotonic() - start < 2.0


def test_streamed_body_over_the_limit_is_413(api):
    client, *_ = api

    def body():                       # chunked: no Content-Length
        for _ in range(6):
            yield b"x" * (1 << 20)
    r = client.post("/v1/embeddings", content=body())
    assert r.status_code == 413 and "over" in r.json()["error"]["message"]


def test_bad_content_length_is_400(api):
    client, *_ = api
    r = client.post("/v1/embeddings", content=b"{}", headers={"content-length": "-2"})
    assert r.status_code == 400 and "Content-Length" in r.json()["error"]["message"]


def test_runner_survives_an_unexpected_exception():                                # item 1
    service, worker, runner = _service()
    worker.fail = OverflowError("timeout value is too large")
    job = Request(["x"])
    service.manager.dispatch(job)
    with pytest.raises(InstanceFailed, match="OverflowError"):
        job.future.result(timeout=10)
    assert runner.is_alive() and runner.crashes == 1
    later = Request(["y"])
    service.manager.dispatch(later)
    assert later.future.result(timeout=10).shape == (1, 384)
    assert service.health()["status"] == "ok"
    assert service.manager.main.snapshot()["occupancy"] == 0
    service.drain(timeout=5)


def test_health_reports_a_dead_or_stuck_instance():
    service, worker, runner = _service()
    assert service.health()["status"] == "ok"
    runner.dead, runner.error = True, "no model"
    state = service.health()
    assert state["status"] == "unhealthy" and "fake0" in state["reason"]
    runner.dead = False
    runner.busy_since = time.monotonic() - svc.STUCK_SECONDS - 1
    assert "stuck" in service.health()["reason"]
    runner.busy_since = None
    service.drain(timeout=5)


def test_infinite_max_wait_does_not_kill_the_queue():
    service, worker, runner = _service(max_wait=float("inf"))
    job = Request(["x"])
    service.manager.dispatch(job)
    time.sleep(1.2)                     # the batch waits (forever) for company: no overflow
    assert runner.is_alive() and runner.crashes == 0
    service.drain(timeout=5)            # closing the queue sends the batch off
    assert job.future.result(timeout=10).shape == (1, 384)


# -- fuzzing the HTTP API ------------------------------------------------------------------

_texts = st.text(max_size=40) | st.text(st.characters(codec=None), max_size=20) \
    | st.sampled_from(["\ud800", "a\udfff", "\u0000", "\u200b", " ", "x" * 2000])
_inputs = _texts | st.lists(_texts, max_size=10) | st.integers() | st.none() \
    | st.dictionaries(st.text(max_size=5), st.integers(), max_size=3)
_bodies = st.builds(lambda i, m, extra: {"input": i, **({"model": m} if m else {}), **extra},
                    _inputs, st.sampled_from([None, "all-MiniLM-L6-v2", "gpt", 7]),
                    st.dictionaries(st.text(max_size=5), st.integers(), max_size=2)) \
    .map(lambda d: json.dumps(d).encode()) \
    | st.binary(max_size=200) \
    | st.sampled_from([b"", b"[]", b"null", b"[" * 5000, b'{"input": "' + b"y" * 5000 + b'"}'])
_headers = st.dictionaries(
    st.sampled_from(["x-windve-route", "content-type", "accept", "x-anything"]),
    st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=30), max_size=3)


@settings(max_examples=60, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(body=_bodies, headers=_headers)
def test_fuzz_http_api_never_500_and_counts_every_answer(api, body, headers):
    client, *_ = api
    before = _metric(client.get("/metrics").text, "windve_http_responses_total",
                     path="/v1/embeddings")
    r = client.post("/v1/embeddings", content=body, headers=headers)
    assert r.status_code in (200, 400, 413, 429), (r.status_code, r.text)
    if r.status_code != 200:
        assert r.json()["error"]["message"]
    else:
        assert all(len(d["embedding"]) == 384 for d in r.json()["data"])
    after = _metric(client.get("/metrics").text, "windve_http_responses_total",
                    path="/v1/embeddings")
    assert after == before + 1


# -- 10x overload: /health stays fast, every request answered and counted -------------------

_PROBE = """
import sys, time, httpx
url, seconds = sys.argv[1], float(sys.argv[2])
end = time.monotonic() + seconds
with httpx.Client(timeout=30) as client:
    while time.monotonic() < end:
        t = time.monotonic()
        code = client.get(url + "/health").status_code
        print(time.monotonic() - t, code, flush=True)
        time.sleep(0.02)
"""


async def _overload(url, clients, per_client):
    """Send ``per_client`` requests from each of ``clients`` concurrent clients; the statuses."""
    statuses = []
    limits = httpx.Limits(max_connections=clients + 8)
    async with httpx.AsyncClient(timeout=30, limits=limits) as client:
        async def user(k):
            for j in range(per_client):
                r = await client.post(url + "/v1/embeddings", json={"input": f"text {k} {j}"})
                statuses.append(r.status_code)
        await asyncio.gather(*(user(k) for k in range(clients)))
    return statuses


def _serve_fake(port):
    """Serve the HTTP API over one fake instance (depth main=20, 10 ms per batch) until
    interrupted: the overload test runs it as a process of its own, as in production, so the
    load generator does not share its interpreter."""
    import logging
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    svc.HEADER_TIMEOUT = float(sys.argv[2]) if len(sys.argv) > 2 else svc.HEADER_TIMEOUT
    delay = float(sys.argv[3]) if len(sys.argv) > 3 else 0.01
    service, *_ = _service(depths=(20, 4), delay=delay)
    svc.draining_server(service, svc.server_config(svc.create_app(service), "127.0.0.1",
                                                   port)).run()
    service.drain(timeout=svc.DRAIN_SECONDS)


def _start_fake(*extra, stderr=None):
    import subprocess
    import sys
    port = free_port()
    proc = subprocess.Popen([sys.executable, __file__, str(port), *extra], stderr=stderr,
                            text=True)
    url = f"http://127.0.0.1:{port}"
    for _ in range(200):
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return proc, port, url
        except httpx.HTTPError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("the fake service did not start")


def test_slow_header_sender_is_cut_off_and_half_bodies_log_one_line():         # item 5
    import subprocess
    proc, port, url = _start_fake("1.5", stderr=subprocess.PIPE)
    try:
        slow = socket.create_connection(("127.0.0.1", port))
        start = time.monotonic()
        closed = False
        for _ in range(8):                          # one byte every 0.5 s, never the end
            try:
                slow.sendall(b"G")
                if slow.recv(1, socket.MSG_DONTWAIT) == b"":
                    closed = True
                    break
            except BlockingIOError:
                pass
            except OSError:
                closed = True
                break
            time.sleep(0.5)
        assert closed and time.monotonic() - start < 3.5
        slow.close()
        for _ in range(5):                          # half a body, then gone
            s = socket.create_connection(("127.0.0.1", port))
            s.sendall(b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Type: "
                      b"application/json\r\nContent-Length: 1000\r\n\r\n{\"input\": \"ab")
            time.sleep(0.1)
            s.close()
        time.sleep(0.5)
        assert httpx.get(url + "/health", timeout=5).status_code == 200
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=20)
    assert "Traceback" not in err, err
    assert err.count("client disconnected") == 5, err


async def _requests_across_sigterm(url, proc, clients):
    """``clients`` concurrent requests; SIGTERM to ``proc`` while they are in flight; the
    status of each, or the transport error's class name."""
    import signal
    outcomes = []
    async with httpx.AsyncClient(timeout=30, limits=httpx.Limits(max_connections=clients)) \
            as client:
        async def one(k):
            try:
                r = await client.post(url + "/v1/embeddings", json={"input": f"text {k}"})
                outcomes.append(r.status_code)
            except httpx.HTTPError as e:
                outcomes.append(type(e).__name__)

        async def stop():
            # SIGTERM once the service has accepted a request (so that one is in flight
            # however slowly a loaded machine starts the clients), at the latest after 10 s
            async with httpx.AsyncClient(timeout=5) as probe:   # its own connection
                for _ in range(100):
                    await asyncio.sleep(0.1)
                    health = (await probe.get(url + "/health")).json()
                    if any(q["accepted"] for q in health["queues"].values()):
                        break
            proc.send_signal(signal.SIGTERM)
        await asyncio.gather(stop(), *(one(k) for k in range(clients)))
    return outcomes


def test_sigterm_answers_every_request_in_flight_and_exits_in_bounded_time():     # item 5
    proc, port, url = _start_fake("10", "0.2")      # 0.2 s per batch: requests stay in flight
    try:
        outcomes = asyncio.run(_requests_across_sigterm(url, proc, 40))
        start = time.monotonic()
        proc.wait(svc.DRAIN_SECONDS * 2)
        assert time.monotonic() - start < svc.DRAIN_SECONDS * 2
    finally:
        if proc.poll() is None:
            proc.kill()
    answered = [o for o in outcomes if isinstance(o, int)]
    assert set(answered) <= {200, 429, 503}, outcomes
    assert 200 in answered                            # some were in flight and answered
    # a request may only fail before it reached the server (the listener closed)
    assert all(o == "ConnectError" for o in outcomes if not isinstance(o, int)), outcomes


def test_200_clients_at_10x_capacity_health_answers_and_every_request_is_counted():
    import subprocess
    import sys
    proc, port, url = _start_fake()
    try:
        clients, per_client = 200, 3          # capacity 20 texts in queue: 10x
        # /health is probed from a process of its own, so its latency is the server's, not
        # the load generator's event loop's.
        probe = subprocess.Popen([sys.executable, "-c", _PROBE, url, "4"],
                                 stdout=subprocess.PIPE, text=True)
        statuses = asyncio.run(_overload(url, clients, per_client))
        out, _ = probe.communicate(timeout=60)
        health = [(float(a), int(b)) for a, b in (line.split() for line in out.splitlines())]
        metrics = httpx.get(url + "/metrics").text
    finally:
        proc.terminate()
        proc.wait(20)
    assert len(statuses) == clients * per_client
    assert set(statuses) <= {200, 429}, sorted(set(statuses))
    assert 429 in statuses                                  # it really was overloaded
    sent = _metric(metrics, "windve_http_responses_total", path="/v1/embeddings")
    assert sent == clients * per_client
    assert _metric(metrics, "windve_http_responses_total", status="429",
                   path="/v1/embeddings") == statuses.count(429)
    times = sorted(t for t, _ in health)
    p50, p99 = times[len(times) // 2], times[min(len(times) - 1, int(0.99 * len(times)))]
    # Regression guard, not a speed target: before the fix /health queued behind the
    # tokenization on the event loop (p50 1.3 s, up to 5.2 s under this overload), so a p99
    # under 1 s shows it no longer waits for the work. The p99 < 100 ms is a
    # measurement on an idle machine (the printed figure; see docs/guides/windve.md),
    # since a loaded CI core adds its own scheduling delay.
    print(f"/health p50 {p50 * 1000:.1f} ms, p99 {p99 * 1000:.1f} ms over {len(times)} probes; "
          f"200: {statuses.count(200)}, 429: {statuses.count(429)}")
    assert len(times) >= 20 and all(code == 200 for _, code in health)
    assert p99 < 1.0


def test_stress_overload_times_health_and_matches_the_metrics(tmp_path):
    """``windve stress --burst N --clients C --overload-only`` against the stand-in service
    (queue 20, 10 ms batches): 10 bursts of 100 requests (5x capacity each) and 200 clients
    of 3 requests (10x): every answer 200 or 429, the service's /metrics counted exactly the
    answers sent, and /health was probed during both and answered 200."""
    proc, _, url = _start_fake()
    try:
        code, err = cli("serve", "stress", "--url", url, "--burst", 100, "--clients", 200,
                        "--overload-only", "--json", tmp_path / "s.json")
    finally:
        proc.terminate()
        proc.wait(20)
    report = json.loads((tmp_path / "s.json").read_text())
    assert code == 0, (err, report)
    for key, sent in (("open_loop", 1000), ("clients", 600)):
        loop = report[key]
        assert loop["sent"] == sent and set(loop["statuses"]) <= {"200", "429"}, loop
        assert "429" in loop["statuses"]                    # it really was overloaded
        assert loop["counted"] == loop["statuses"] and loop["counted_all"] is True
        health = loop["health"]
        assert health["probes"] >= 3 and set(health["statuses"]) == {"200"}
        assert health["p50_ms"] <= health["p99_ms"] <= health["max_ms"]
    assert report["sent"] == 1600


if __name__ == "__main__":
    import sys
    sys.modules.setdefault("test_windve_bad_input", sys.modules["__main__"])
    _serve_fake(int(sys.argv[1]))
