"""The WindVE HTTP service: an OpenAI-compatible embeddings API over the queue manager.

Endpoints (FastAPI on uvicorn):

``POST /v1/embeddings``
    Body ``{"input": "text" | ["text", ...], "model": "all-MiniLM-L6-v2"}`` (``model`` optional;
    another name is refused). 200: ``{"object": "list", "data": [{"object": "embedding",
    "index": i, "embedding": [384 floats]}], "model", "usage": {"prompt_tokens",
    "total_tokens"}}``; the vectors are L2-normalised float32 values. The header
    ``X-WindVE-Route: main`` keeps the request on the main queue (no CPU overflow): the
    paper's baseline, measured on the same service. Answers: 429 with ``Retry-After`` when
    every eligible queue is full (BUSY, Algorithm 1); 400 for invalid JSON, a body that is not
    an object, a missing/empty input, a non-string or empty text, more than ``max_texts``
    texts, or an unknown model; 413 for a text over the model's 256 tokens (unless the service
    runs with ``truncate``, then it is cut as sentence-transformers cuts it) or for more texts
    than any queue holds; 503 while draining or when an instance failed the request
    ``max_attempts`` times. Every answer is counted in ``/metrics``.
``GET /metrics``
    Prometheus text: requests by outcome and device, queue occupancy and depth, per-device
    end-to-end latency histograms, batch sizes, worker restarts, requeued requests.
``GET /health``
    200 ``{"status": "ok", "heterogeneous", "queues": {...}, "instances": [...]}`` (503 with
    ``"status": "draining"`` during shutdown); instances list their role, device and pid.

Shutdown (SIGINT/SIGTERM): uvicorn stops accepting connections and waits for the requests in
flight; the queues are then closed and drained (every accepted request is answered) before the
worker processes stop.
"""

import asyncio
import json
import time

from prometheus_client import (CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge,
                               Histogram, generate_latest)

from ..models.minilm import MAX_TOKENS, count_tokens
from .queues import BUSY, DeviceQueue, QueueManager, Request
from .workers import InstanceFailed, start_runners, stop_runners

__all__ = ["MODEL_NAME", "EmbeddingService", "create_app"]

MODEL_NAME = "all-MiniLM-L6-v2"
ROUTE_HEADER = "x-windve-route"
#: Largest request body accepted (bytes).
MAX_BODY = 4 << 20
_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0)


class _Metrics:
    """The service's Prometheus metrics, in a registry of its own."""

    def __init__(self):
        self.registry = r = CollectorRegistry()
        self.requests = Counter("windve_requests", "Requests by outcome and device",
                                ["outcome", "device"], registry=r)
        self.texts = Counter("windve_texts", "Texts embedded by device", ["device"],
                             registry=r)
        self.occupancy = Gauge("windve_queue_occupancy", "Texts waiting or being embedded",
                               ["device"], registry=r)
        self.depth = Gauge("windve_queue_depth", "Queue depth C_max (texts)", ["device"],
                           registry=r)
        self.latency = Histogram("windve_latency_seconds", "End-to-end latency of answered "
                                 "requests", ["device"], buckets=_LATENCY_BUCKETS, registry=r)
        self.batch = Histogram("windve_batch_texts", "Texts per instance batch", ["device"],
                               buckets=(1, 2, 4, 8, 16, 32, 64, 128), registry=r)
        self.restarts = Counter("windve_worker_restarts", "Worker processes restarted",
                                ["instance"], registry=r)
        self.requeued = Gauge("windve_requeued_requests", "Requests put back after an instance "
                              "failure", ["device"], registry=r)


class EmbeddingService:
    """Queues, instances and metrics of one service (see module docstring).

    ``plan`` is a :class:`~hwgen.windve.devices.Plan`; ``depths`` maps ``"main"`` and
    ``"cpu"`` to queue depths in texts.
    """

    def __init__(self, plan, depths, *, max_batch=32, max_wait=0.005, max_texts=64,
                 truncate=False, max_attempts=3):
        self.plan = plan
        self.max_texts = max_texts
        self.truncate = truncate
        self.metrics = _Metrics()
        main = DeviceQueue("main", depths["main"])
        cpu = DeviceQueue("cpu", depths["cpu"]) if plan.heterogeneous and plan.auxiliary \
            else None
        self.manager = QueueManager(main, cpu, heterogeneous=cpu is not None)
        self.draining = False
        self._runner_opts = {"max_batch": max_batch, "max_wait": max_wait,
                             "max_attempts": max_attempts}
        self.runners = []
        for q in self.manager.queues:
            self.metrics.depth.labels(q.name).set(q.depth)

    def start(self, log=None):
        """Spawn every instance's worker (loading the model copies) and its runner."""
        roles = [(self.plan.main, self.manager.main)]
        if self.manager.cpu is not None:
            roles.append((self.plan.auxiliary, self.manager.cpu))
        for instances, queue in roles:
            self.runners += start_runners(
                instances, queue, truncate=self.truncate, log=log, on_batch=self._on_batch,
                on_restart=self._on_restart, **self._runner_opts)
        return self

    def _on_batch(self, device, batch, seconds):
        now = time.monotonic()
        m = self.metrics
        m.batch.labels(device).observe(sum(r.size for r in batch))
        for request in batch:
            m.latency.labels(device).observe(now - request.arrived)
            m.texts.labels(device).inc(request.size)

    def _on_restart(self, name):
        self.metrics.restarts.labels(name).inc()

    def drain(self, timeout=None):
        """Refuse new requests, answer every accepted one, stop the workers."""
        self.draining = True
        self.manager.close()
        for q in self.manager.queues:
            q.wait_empty(timeout)
        stop_runners(self.runners, timeout)

    def health(self):
        """The ``/health`` answer: status (``ok`` or ``draining``), model, queue snapshots, rejected
        requests and each instance's device, threads, process id, restarts and liveness."""
        return {"status": "draining" if self.draining else "ok",
                "model": MODEL_NAME,
                "heterogeneous": self.manager.heterogeneous,
                "queues": {q.name: q.snapshot() for q in self.manager.queues},
                "rejected": self.manager.rejected,
                "instances": [{"queue": r.queue.name, "instance": r.worker.instance.name,
                               "device": r.worker.instance.torch_device,
                               "threads": r.worker.instance.threads,
                               "emulates": r.worker.instance.emulates,
                               "pid": r.worker.pid, "restarts": r.worker.restarts,
                               "alive": not r.dead}
                              for r in self.runners]}

    def metrics_text(self):
        """The ``/metrics`` answer: the Prometheus text exposition (bytes), with the queues'
        occupancy and requeue gauges refreshed first."""
        m = self.metrics
        for q in self.manager.queues:
            snap = q.snapshot()
            m.occupancy.labels(q.name).set(snap["occupancy"])
            m.requeued.labels(q.name).set(snap["requeued"])
        return generate_latest(m.registry)

    # -- request checking --------------------------------------------------------------------

    def parse(self, body):
        """``(texts, tokens, None)`` for a valid body (``tokens``: the model's input tokens, after
        truncation), else ``(None, 0, (status, message))``."""
        if len(body) > MAX_BODY:
            return None, 0, (413, f"body over {MAX_BODY} bytes")
        try:
            data = json.loads(body)
        except (ValueError, RecursionError):
            return None, 0, (400, "invalid JSON")
        if not isinstance(data, dict):
            return None, 0, (400, "the body must be a JSON object with 'input'")
        model = data.get("model", MODEL_NAME)
        if model not in (MODEL_NAME, f"sentence-transformers/{MODEL_NAME}"):
            return None, 0, (400, f"unknown model {str(model)[:80]!r}; this service runs "
                                  f"{MODEL_NAME}")
        texts = data.get("input")
        if isinstance(texts, str):
            texts = [texts]
        if not isinstance(texts, list) or not texts:
            return None, 0, (400, "'input' must be a non-empty string or list of strings")
        for k, text in enumerate(texts):
            if not isinstance(text, str) or not text.strip():
                return None, 0, (400, f"input[{k}] must be a non-empty string")
        if len(texts) > self.max_texts:
            return None, 0, (400, f"{len(texts)} texts in one request; at most {self.max_texts}")
        if len(texts) > self.manager.largest_request():
            return None, 0, (413, f"{len(texts)} texts is more than any queue holds "
                                  f"({self.manager.largest_request()})")
        counts = count_tokens(texts)
        if not self.truncate:
            for k, n in enumerate(counts):
                if n > MAX_TOKENS:
                    return None, 0, (413, f"input[{k}] has {n} tokens; the model takes at "
                                          f"most {MAX_TOKENS} (the service truncates only "
                                          f"with --truncate)")
        return texts, sum(min(n, MAX_TOKENS) for n in counts), None


def create_app(service):
    """The FastAPI application of ``service``."""
    from fastapi import FastAPI, Request as HTTPRequest
    from fastapi.responses import JSONResponse, Response

    app = FastAPI(title="hwgen WindVE embedding service", docs_url=None, redoc_url=None)
    m = service.metrics

    def error(status, message, device="none", outcome=None, headers=None):
        m.requests.labels(outcome or f"http_{status}", device).inc()
        return JSONResponse({"error": {"message": message, "code": status}}, status_code=status,
                            headers=headers)

    @app.post("/v1/embeddings")
    async def embeddings(request: HTTPRequest):
        if service.draining:
            return error(503, "the service is shutting down", outcome="draining")
        body = await request.body()
        texts, tokens, problem = service.parse(body)
        if problem:
            return error(*problem, outcome="bad_request")
        main_only = request.headers.get(ROUTE_HEADER, "").strip().lower() == "main"
        job = Request(texts)
        device = service.manager.dispatch(job, main_only=main_only)
        if device is BUSY:
            return error(429, "busy: every queue is full", outcome="rejected",
                         headers={"Retry-After": "1"})
        try:
            vectors = await asyncio.wrap_future(job.future)
        except InstanceFailed as e:
            return error(503, f"instance failed: {e}", device=device, outcome="failed")
        except ValueError as e:
            return error(400, str(e), device=device, outcome="bad_request")
        m.requests.labels("ok", device).inc()
        return JSONResponse(
            {"object": "list", "model": MODEL_NAME,
             "data": [{"object": "embedding", "index": k, "embedding": v.tolist()}
                      for k, v in enumerate(vectors)],
             "usage": {"prompt_tokens": tokens, "total_tokens": tokens}},
            headers={"X-WindVE-Device": device})

    @app.get("/metrics")
    async def metrics():
        return Response(service.metrics_text(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/health")
    async def health():
        state = service.health()
        return JSONResponse(state, status_code=503 if service.draining else 200)

    return app
