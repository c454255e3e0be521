"""The WindVE load generator (hwgen.windve.stress) against a real HTTP server.

The server is a stand-in for the embedding service (which has tests of its own): a minimal
Starlette app on uvicorn, in a background thread on 127.0.0.1, answering
``POST /v1/embeddings`` after a short sleep while fewer than its limit of requests are in
flight, and 429 with ``Retry-After`` otherwise. Requests routed ``X-WindVE-Route: main`` get
the main limit only; others also the overflow (a second, slower "CPU" limit), so main-only and
heterogeneous maximum concurrencies differ as in the paper. It records the route header of
every request. httpx is not mocked: the requests go through real sockets.

Counts do not depend on how fast the machine delivers the requests: a test that expects
bursts of known sizes declares them (``STATE.bursts``), and the stand-in holds every admitted
request of a burst until the whole burst has arrived, so no slot frees up early. Latencies are
checked only for order (a request takes at least its service time); the SLO is far above
the service times, so which levels meet it depends on rejections alone.
"""

import asyncio
import socket
import threading
import time

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route

from hwgen.errors import ConfigError
from hwgen.windve import stress

MAIN_LIMIT = 4              # requests in flight on the stand-in's "accelerator"
CPU_LIMIT = 2               # overflow slots, for requests without the route header
DELAY = 0.2                 # seconds an admitted request takes (main)
CPU_DELAY = 0.3             # seconds an overflow request takes
SLO = 20.0                  # seconds; every admitted request takes DELAY or CPU_DELAY


class StandIn:
    """The stand-in service's state: in-flight counts and the route headers seen."""

    def __init__(self):
        self.main = self.cpu = 0         # balanced by every handler, never reset
        self.reset()

    def reset(self):
        self.routes = []
        self.texts = []
        self.bursts = []            # sizes of the bursts still to come, in order
        self.gate = None            # set once the current burst has fully arrived
        self.arrived = 0

    def arrive(self):
        """Count an arrival; the event that opens when its burst is complete (None when the
        test declared no bursts)."""
        if not self.bursts:
            return None
        if self.gate is None:
            self.gate, self.arrived = asyncio.Event(), 0
        gate = self.gate
        self.arrived += 1
        if self.arrived == self.bursts[0]:
            self.bursts.pop(0)
            gate.set()
            self.gate = None
        return gate


STATE = StandIn()


async def embeddings(request):
    body = await request.json()
    route = request.headers.get(stress.ROUTE_HEADER)
    STATE.routes.append(route)
    STATE.texts.append(body["input"])
    gate = STATE.arrive()
    if body["input"] == "slow":                      # outlives the client's timeout
        await asyncio.sleep(6)
        return JSONResponse({"object": "list", "data": []})
    if body["input"] == "garbled":                   # a 200 without an embedding
        return JSONResponse({"object": "list", "data": []})
    if STATE.main < MAIN_LIMIT:
        slot, delay = "main", DELAY
    elif route != "main" and STATE.cpu < CPU_LIMIT:
        slot, delay = "cpu", CPU_DELAY
    else:
        return JSONResponse({"error": {"message": "busy"}}, status_code=429,
                            headers={"Retry-After": "1"})
    setattr(STATE, slot, getattr(STATE, slot) + 1)
    try:
        if gate is not None:
            await gate.wait()
        await asyncio.sleep(delay)
    finally:
        setattr(STATE, slot, getattr(STATE, slot) - 1)
    return JSONResponse({"object": "list", "model": body.get("model"),
                         "data": [{"object": "embedding", "index": 0,
                                   "embedding": [0.1, 0.2, 0.3]}],
                         "usage": {"prompt_tokens": 1, "total_tokens": 1}})


APP = Starlette(routes=[Route("/v1/embeddings", embeddings, methods=["POST"])])


@pytest.fixture(scope="module")
def server_url():
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(APP, log_level="warning", lifespan="off",
                                           backlog=256))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    for _ in range(1000):                          # 1000 polls, 10 ms apart
        assert thread.is_alive(), "stand-in exited"
        if server.started:
            break
        time.sleep(0.01)
    assert server.started, "stand-in did not start"
    try:
        yield f"http://127.0.0.1:{port}/"
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


@pytest.fixture
def url(server_url):
    STATE.reset()
    return server_url


def counted(result):
    """Whether every request of a result is counted exactly once."""
    return result["ok"] + result["rejected"] + result["errors"] == result["sent"]


def test_closed_loop_within_limit(url):
    texts = ["alpha", "beta", "gamma"]
    result = asyncio.run(stress.closed_loop(url, 3, texts, route="main", rounds=2))
    assert (result["sent"], result["ok"], result["rejected"], result["errors"]) == (6, 6, 0, 0)
    assert result["statuses"] == {"200": 6}
    assert DELAY <= result["p50"] <= result["p99"] <= result["max"]
    assert result["concurrency"] == 3 and result["route"] == "main" and result["met_slo"] is None
    assert STATE.routes == ["main"] * 6                    # the header arrived on every request
    assert sorted(STATE.texts) == sorted(texts * 2)        # texts cycled over the requests
    assert stress.max_concurrency([result], SLO) == 3


def test_closed_loop_above_limit_gets_429(url):
    STATE.bursts = [8, 8]
    main = asyncio.run(stress.closed_loop(url, 8, ["x"], route="main"))
    assert counted(main) and main["sent"] == 8
    assert (main["ok"], main["rejected"]) == (MAIN_LIMIT, 8 - MAIN_LIMIT)
    assert stress.max_concurrency([main], SLO) == 0
    hetero = asyncio.run(stress.closed_loop(url, 8, ["x"]))
    assert counted(hetero)
    assert (hetero["ok"], hetero["rejected"]) == (MAIN_LIMIT + CPU_LIMIT,
                                                  8 - MAIN_LIMIT - CPU_LIMIT)
    assert STATE.routes == ["main"] * 8 + [None] * 8


def test_transport_failures_are_counted(url):
    with socket.socket() as s:                             # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    refused = asyncio.run(stress.closed_loop(dead, 3, ["x"], timeout=2.0))
    assert (refused["sent"], refused["errors"], refused["statuses"]) == (3, 3, {"error": 3})
    assert refused["p50"] is None and refused["max"] is None
    mixed = asyncio.run(stress.closed_loop(url, 3, ["slow", "garbled", "fine"], timeout=2.0))
    assert counted(mixed)
    assert mixed["statuses"] == {"200": 1, "invalid": 1, "timeout": 1}
    assert (mixed["ok"], mixed["errors"]) == (1, 2)
    assert stress.max_concurrency([mixed], SLO) == 0


def test_open_loop_bursts(url):
    STATE.bursts = [9]              # three bursts of three, held as one: 4 admitted, 5 refused
    result = asyncio.run(stress.open_loop(url, 3, 3, 0.05, ["a", "b"], route="main"))
    assert counted(result) and result["sent"] == 9
    assert (result["ok"], result["rejected"]) == (MAIN_LIMIT, 9 - MAIN_LIMIT)
    # the last burst leaves 2 intervals after the first, and no earlier than scheduled
    assert result["lateness"] >= 0 and result["seconds"] >= 2 * 0.05
    assert STATE.routes == ["main"] * 9


def test_max_concurrency_rules():
    slo = 1.0
    def level(c, ok=None, rejected=0, worst=0.5):
        sent = c
        ok = c - rejected if ok is None else ok
        return {"concurrency": c, "sent": sent, "ok": ok, "rejected": rejected,
                "errors": sent - ok - rejected, "max": worst if ok else None}

    assert stress.max_concurrency([], slo) == 0
    assert stress.max_concurrency([level(1), level(2), level(4, rejected=1)], slo) == 2
    assert stress.max_concurrency([level(2), level(4, worst=1.2)], slo) == 2
    assert stress.max_concurrency([level(2), level(4, worst=slo)], slo) == 4   # equality meets
    assert stress.max_concurrency([level(2), level(4, ok=3)], slo) == 2        # an error
    assert stress.max_concurrency([level(4), level(4, rejected=1)], slo) == 0  # every round
    with pytest.raises(ConfigError, match="^slo"):
        stress.max_concurrency([level(2)], 0)


def test_run_stress_and_plot(url, tmp_path):
    STATE.bursts = [4, 6, 8, 4, 6, 8, 10]          # the levels the search below visits
    lines = []
    report = asyncio.run(stress.run_stress(url, SLO, [8, 4, 6, 10, 12], ["q"],
                                           progress=lines.append))
    main, hetero = report["levels"]["main_only"], report["levels"]["heterogeneous"]
    assert [r["concurrency"] for r in main] == [4, 6, 8]             # two misses in a row
    assert [r["concurrency"] for r in hetero] == [4, 6, 8, 10]
    assert [r["met_slo"] for r in main] == [True, False, False]
    assert [r["met_slo"] for r in hetero] == [True, True, False, False]
    assert report["max_concurrency"] == {"main_only": MAIN_LIMIT,
                                         "heterogeneous": MAIN_LIMIT + CPU_LIMIT}
    assert report["improvement_percent"] == pytest.approx(50.0)
    assert report["sent"] == sum(r["sent"] for r in main + hetero) == 18 + 28
    assert report["ok"] + report["rejected"] + report["errors"] == report["sent"]
    assert report["errors"] == 0
    assert len(lines) == 7 and lines[0].startswith("main_only: concurrency 4:")
    for r in main + hetero:         # a level meets the SLO iff every request did
        assert r["within_slo"] <= r["ok"] and r["met_slo"] == (r["within_slo"] == r["sent"])
    assert STATE.routes.count("main") == 18 and STATE.routes.count(None) == 28
    png = tmp_path / "stress.png"
    assert stress.plot_stress(report, png) == png
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 1000


def test_plot_without_answers(tmp_path):
    level = {"concurrency": 4, "sent": 4, "ok": 0, "rejected": 4, "errors": 0, "p50": None,
             "p99": None, "max": None, "met_slo": False}
    report = {"slo": 1.0, "levels": {"main_only": [level], "heterogeneous": [level]},
              "max_concurrency": {"main_only": 0, "heterogeneous": 0},
              "improvement_percent": None}
    png = stress.plot_stress(report, tmp_path / "empty.png")
    assert png.stat().st_size > 0


@pytest.mark.parametrize("call, param", [
    (lambda: stress.closed_loop("ftp://x", 1, ["a"]), "url"),
    (lambda: stress.closed_loop("http://x", 0, ["a"]), "concurrency"),
    (lambda: stress.closed_loop("http://x", 1, []), "texts"),
    (lambda: stress.closed_loop("http://x", 1, ["a"], rounds=0), "rounds"),
    (lambda: stress.closed_loop("http://x", 1, ["a"], timeout=0), "timeout"),
    (lambda: stress.closed_loop("http://x", 1, ["a"], route=""), "route"),
    (lambda: stress.open_loop("http://x", 0, 1, 0.1, ["a"]), "bursts"),
    (lambda: stress.open_loop("http://x", 1, 1, -1, ["a"]), "interval"),
    (lambda: stress.run_stress("http://x", 1.0, [], ["a"]), "concurrencies"),
    (lambda: stress.run_stress("http://x", 1.0, [0, 2], ["a"]), "concurrencies"),
    (lambda: stress.run_stress("http://x", -1, [2], ["a"]), "slo"),
    (lambda: stress.run_stress("http://x", 1.0, [2], ["a"], progress=3), "progress"),
])
def test_bad_arguments(call, param):
    with pytest.raises(ConfigError) as err:
        asyncio.run(call())
    assert err.value.param == param


def test_default_texts():
    texts = stress.default_texts()
    assert len(texts) == 64 and len(set(texts)) == 64
    assert texts == stress.default_texts() and stress.default_texts(5) == texts[:5]
    assert all(8 <= len(t.split()) <= 40 and t.endswith(".") for t in texts)
    assert stress.default_texts(8, seed=1) != texts[:8]
    with pytest.raises(ConfigError, match="^n="):
        stress.default_texts(0)
