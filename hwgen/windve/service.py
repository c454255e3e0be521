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
    ``max_attempts`` times. A text with a lone surrogate (not encodable as UTF-8), or holding
    only whitespace, control or zero-width characters (NUL, U+200B, BOM), is a 400. The body
    is size-checked from ``Content-Length`` before it is read and again while it streams in
    (413 past ``MAX_BODY``; 408 when it takes over ``BODY_TIMEOUT``); JSON decoding,
    tokenization and the answer's serialisation run off the event loop. Every answer, 404,
    405 and 500 included, is counted in ``/metrics`` (``windve_http_responses``).
``GET /metrics``
    Prometheus text: requests by outcome and device, queue occupancy and depth, per-device
    end-to-end latency histograms, batch sizes, worker restarts, requeued requests.
``GET /health``
    200 ``{"status": "ok", "heterogeneous", "queues": {...}, "instances": [...]}``; 503 with
    ``"status": "draining"`` during shutdown, or ``"unhealthy"`` and a ``reason`` when an
    instance's runner is dead or a batch has been in flight over ``STUCK_SECONDS``; instances
    list their role, device and pid.

Shutdown (SIGINT/SIGTERM): the service is marked draining (new requests get 503), uvicorn
stops accepting connections and waits up to ``DRAIN_SECONDS`` for the requests in flight; the
queues are then closed and drained (every accepted request is answered) before the worker
processes stop.
"""

import asyncio
import json
import logging
import time
import unicodedata

from prometheus_client import (CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge,
                               Histogram, generate_latest)

from ..models.minilm import MAX_TOKENS, count_tokens
from .queues import BUSY, DeviceQueue, QueueManager, Request
from .workers import InstanceFailed, start_runners, stop_runners

__all__ = ["MODEL_NAME", "EmbeddingService", "create_app", "draining_server", "read_body",
           "server_config"]

MODEL_NAME = "all-MiniLM-L6-v2"
ROUTE_HEADER = "x-windve-route"
#: Largest request body accepted (bytes).
MAX_BODY = 4 << 20
#: Words (whitespace-separated) beyond which a text is refused (413) without tokenizing it.
_MAX_WORDS = 4 * MAX_TOKENS
#: Seconds a client may take to send the whole body once the headers arrived (408 after).
BODY_TIMEOUT = 10.0
#: Seconds a client may take to send a request's head (request line and headers) on a new or
#: idle connection; the connection is closed after that (slow-header clients).
HEADER_TIMEOUT = 10.0
#: Seconds an idle keep-alive connection is kept: longer than the 5 s after which httpx drops
#: an idle connection itself, so that an httpx client never sends a request on a connection
#: the service is closing. At 5 s both ends timed out together: 1 of 2,000 requests of 200
#: keep-alive clients at 10x capacity failed as a ReadError that the service never saw.
KEEP_ALIVE_SECONDS = 10
#: Largest request head in bytes (uvicorn answers 400 beyond it).
MAX_HEADER_BYTES = 64 * 1024
#: Seconds uvicorn waits for the requests in flight after SIGINT/SIGTERM.
DRAIN_SECONDS = 30
#: Seconds a batch may be in flight before ``/health`` calls its instance stuck.
STUCK_SECONDS = 60.0
#: Paths counted under their own label in ``windve_http_responses``; others are ``other``.
_PATHS = ("/v1/embeddings", "/metrics", "/health")
_log = logging.getLogger("hwgen.windve")
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
        self.responses = Counter("windve_http_responses", "HTTP answers by status and path "
                                 "(every answer, 404/405/413/500 included)",
                                 ["status", "path"], registry=r)
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

    def unhealthy(self):
        """Why the service cannot answer (a dead or stuck instance), or None when it can."""
        for r in self.runners:
            name = r.worker.instance.name
            if r.dead or not r.is_alive() and not self.draining:
                return f"instance {name} is dead ({r.error or 'its runner stopped'})"
            if r.stuck(STUCK_SECONDS):
                return f"instance {name} is stuck (a batch in flight over {STUCK_SECONDS:g} s)"
        return None

    def health(self):
        """The ``/health`` answer: status (``ok``, ``unhealthy`` with a ``reason``, or
        ``draining``), model, queue snapshots, rejected
        requests and each instance's device, threads, process id, restarts and liveness."""
        problem = self.unhealthy()
        return {"status": "draining" if self.draining else "unhealthy" if problem else "ok",
                "reason": problem,
                "model": MODEL_NAME,
                "heterogeneous": self.manager.heterogeneous,
                "queues": {q.name: q.snapshot() for q in self.manager.queues},
                "rejected": self.manager.rejected,
                "instances": [{"queue": r.queue.name, "instance": r.worker.instance.name,
                               "device": r.worker.instance.torch_device,
                               "threads": r.worker.instance.threads,
                               "emulates": r.worker.instance.emulates,
                               "pid": r.worker.pid, "restarts": r.worker.restarts,
                               "alive": not r.dead and r.is_alive(),
                               "crashes": r.crashes}
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
            problem = _text_problem(text)
            if problem:
                return None, 0, (400, f"input[{k}] {problem}")
        if len(texts) > self.max_texts:
            return None, 0, (400, f"{len(texts)} texts in one request; at most {self.max_texts}")
        if len(texts) > self.manager.largest_request():
            return None, 0, (413, f"{len(texts)} texts is more than any queue holds "
                                  f"({self.manager.largest_request()})")
        if not self.truncate:              # every word is at least one token: refuse a long
            for k, text in enumerate(texts):     # text before the (slow) tokenizer sees it
                if len(text.split(None, _MAX_WORDS)) > _MAX_WORDS:
                    return None, 0, (413, f"input[{k}] has over {_MAX_WORDS} words; the model "
                                          f"takes at most {MAX_TOKENS} tokens (the service "
                                          f"truncates only with --truncate)")
        counts = count_tokens(texts)
        if not self.truncate:
            for k, n in enumerate(counts):
                if n > MAX_TOKENS:
                    return None, 0, (413, f"input[{k}] has {n} tokens; the model takes at "
                                          f"most {MAX_TOKENS} (the service truncates only "
                                          f"with --truncate)")
        return texts, sum(min(n, MAX_TOKENS) for n in counts), None


def _answer(vectors, tokens):
    """The 200 body (bytes) for ``vectors``: serialised off the event loop (384 floats a text
    is CPU work)."""
    return json.dumps(
        {"object": "list", "model": MODEL_NAME,
         "data": [{"object": "embedding", "index": k, "embedding": v.tolist()}
                  for k, v in enumerate(vectors)],
         "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}).encode()


def _text_problem(text):
    """Why ``text`` cannot be embedded, or None. A text must be valid Unicode (no lone
    surrogates: they cannot be encoded as UTF-8) and must hold something besides whitespace,
    control and format characters (NUL, zero-width spaces, BOMs): those are all treated like an
    empty text, 400."""
    if not isinstance(text, str):
        return "must be a string"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        return (f"is not valid Unicode: {text[e.start]!r} at offset {e.start} (a lone "
                f"surrogate) cannot be encoded as UTF-8")
    if not any(not ch.isspace() and unicodedata.category(ch) not in ("Cc", "Cf")
               for ch in text):
        return ("must be a non-empty string (it holds only whitespace, control or zero-width "
                "characters)")
    return None


class _CountStatuses:
    """ASGI middleware: counts every HTTP answer by status and path in ``windve_http_responses``
    and answers an exception that escaped the application with a counted, logged 500 (one
    line, no traceback) instead of a dropped connection."""

    def __init__(self, app, metrics):
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope.get("path", "")
        label = path if path in _PATHS else "other"
        started = False

        async def counting_send(message):
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                self.metrics.responses.labels(str(message["status"]), label).inc()
            await send(message)

        try:
            await self.app(scope, receive, counting_send)
        except Exception as e:
            _log.error("windve: %s %s failed: %s: %s", scope.get("method"), path,
                       type(e).__name__, e)
            if started:
                return
            body = json.dumps({"error": {"message": "internal error", "code": 500}}).encode()
            await counting_send({"type": "http.response.start", "status": 500,
                                 "headers": [(b"content-type", b"application/json")]})
            await send({"type": "http.response.body", "body": body})


async def read_body(request, limit=MAX_BODY, timeout=BODY_TIMEOUT):
    """The request body, or ``(status, message)``: 413 from ``Content-Length`` before anything
    is read, or as soon as the streamed body passes ``limit`` bytes; 400 for a bad
    ``Content-Length``; 408 when the body takes over ``timeout`` seconds. A client that goes
    away raises starlette's ``ClientDisconnect``."""
    declared = request.headers.get("content-length")
    if declared is not None:
        if not (declared.isascii() and declared.strip().isdigit()):
            return (400, "invalid Content-Length")
        if int(declared) > limit:
            return (413, f"body of {int(declared)} bytes; at most {limit}")
    chunks, size = [], 0

    async def collect():
        nonlocal size
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                return (413, f"body over {limit} bytes")
            chunks.append(chunk)
        return None

    try:
        problem = await asyncio.wait_for(collect(), timeout)
    except asyncio.TimeoutError:
        return (408, f"the body did not arrive within {timeout:g} s")
    return problem or b"".join(chunks)


def create_app(service):
    """The FastAPI application of ``service``."""
    from fastapi import FastAPI, Request as HTTPRequest
    from fastapi.responses import JSONResponse, Response

    from starlette.requests import ClientDisconnect

    app = FastAPI(title="hwgen WindVE embedding service", docs_url=None, redoc_url=None)
    m = service.metrics
    app.add_middleware(_CountStatuses, metrics=m)

    def error(status, message, device="none", outcome=None, headers=None):
        m.requests.labels(outcome or f"http_{status}", device).inc()
        return JSONResponse({"error": {"message": message, "code": status}}, status_code=status,
                            headers=headers)

    @app.post("/v1/embeddings")
    async def embeddings(request: HTTPRequest):
        if service.draining:
            return error(503, "the service is shutting down", outcome="draining")
        try:
            body = await read_body(request)
        except ClientDisconnect:
            _log.warning("windve: client disconnected before sending the whole body")
            m.requests.labels("disconnected", "none").inc()
            return Response(status_code=400)      # nobody reads it; counted as http 400
        if isinstance(body, tuple):
            return error(*body, outcome="bad_request")
        # JSON decoding and tokenization are CPU work: off the event loop, so /health and
        # the other connections are answered meanwhile.
        loop = asyncio.get_running_loop()
        texts, tokens, problem = await loop.run_in_executor(None, service.parse, body)
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
        content = await loop.run_in_executor(None, _answer, vectors, tokens)
        return Response(content, media_type="application/json",
                        headers={"X-WindVE-Device": device})

    @app.get("/metrics")
    async def metrics():
        return Response(service.metrics_text(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/health")
    async def health():
        state = service.health()
        return JSONResponse(state, status_code=200 if state["status"] == "ok" else 503)

    return app


def _head_timeout_protocol(seconds):
    """uvicorn's h11 protocol with a deadline for each request head: a connection whose next
    request's headers are not complete ``seconds`` after it opened (or after its last answer)
    is closed, however slowly the client trickles bytes (uvicorn's keep-alive timer restarts
    on every byte)."""
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class HeadTimeoutH11(H11Protocol):
        """H11Protocol plus the head deadline (see :func:`_head_timeout_protocol`)."""

        def connection_made(self, transport):
            """Start the connection and arm the head deadline."""
            super().connection_made(transport)
            self._arm_head_deadline()

        def on_response_complete(self):
            """Finish the answer and arm the deadline for the next request's head."""
            super().on_response_complete()
            self._arm_head_deadline()

        def connection_lost(self, exc):
            """Forget the deadline with the connection."""
            timer = getattr(self, "_head_timer", None)
            if timer is not None:
                timer.cancel()
            super().connection_lost(exc)

        def _arm_head_deadline(self):
            timer = getattr(self, "_head_timer", None)
            if timer is not None:
                timer.cancel()
            waiting_for = self.cycle
            self._head_timer = self.loop.call_later(seconds, self._head_deadline, waiting_for)

        def _head_deadline(self, waiting_for):
            if self.cycle is waiting_for and not self.transport.is_closing():
                _log.warning("windve: closed a connection whose request head took over %g s",
                             seconds)
                self.transport.close()

    return HeadTimeoutH11


def server_config(app, host, port):
    """The ``uvicorn.Config`` the service runs with: idle keep-alive, request-head size and
    time limits, a bounded graceful shutdown, no access log."""
    import uvicorn
    return uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False,
                          http=_head_timeout_protocol(HEADER_TIMEOUT),
                          timeout_keep_alive=KEEP_ALIVE_SECONDS,
                          timeout_graceful_shutdown=DRAIN_SECONDS,
                          h11_max_incomplete_event_size=MAX_HEADER_BYTES)


def draining_server(service, config):
    """A ``uvicorn.Server`` for ``config`` that, on SIGINT/SIGTERM, first marks ``service``
    draining, so a request that arrives while the requests in flight finish gets a 503 rather
    than a closed connection; uvicorn then waits at most ``DRAIN_SECONDS`` for them."""
    import uvicorn

    class DrainingServer(uvicorn.Server):
        """uvicorn.Server that marks the service draining on exit (see above)."""

        def handle_exit(self, sig, frame):
            """Mark the service draining, then stop as uvicorn does."""
            service.draining = True
            super().handle_exit(sig, frame)

    return DrainingServer(config)
