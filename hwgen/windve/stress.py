"""HTTP load generator for a WindVE embedding service: closed and open loops, main-only vs
heterogeneous.

The service answers ``POST {url}/v1/embeddings`` (OpenAI-compatible body ``{"input": text,
"model": ...}``) with 200 and the embedding, or 429 (with ``Retry-After``) when every queue is
full. Every request sent here carries one text.

Closed loop (:func:`closed_loop`, the paper's workload, section 5.1.3): ``concurrency``
requests are sent at once and the next round starts only when all of them are answered, so
at most ``concurrency`` requests are ever in flight; the largest concurrency whose every
request is answered 200 within the SLO is the system's maximum concurrency (equation 6's
``C``, :func:`max_concurrency`). Open loop (:func:`open_loop`): bursts of requests at a fixed
interval without waiting for answers, so the load does not slow down when the service does
(the offered load of a real peak).

Route header: ``X-WindVE-Route: main`` asks the service to use only its main (accelerator)
queue, never the CPU overflow queue. One service thus measures both the paper's baseline
(main-only) and WindVE (heterogeneous, no header); :func:`run_stress` runs both and reports
the concurrency improvement, :func:`plot_stress` draws it.

Overload: :func:`clients_loop` runs many concurrent clients (each request after the last is
answered, on a kept-alive connection). With ``probe_health=True`` it and :func:`open_loop` also
ask ``GET {url}/health`` every 50 ms from a process of its own while the load is answered (its
latency is the service's, not this load generator's), and read ``/metrics`` before and after,
so a user sees whether the service stays responsive and counts every answer at overload
(``hwgen windve stress --clients/--burst``).

Accounting guarantee: every request sent is counted exactly once, as ``ok`` (200 with an
embedding), ``rejected`` (429) or ``errors`` (any other status, a 200 whose body is not one
embedding, a transport failure or a timeout), so ``ok + rejected + errors == sent`` in every
result. Latencies are end to end (request sent to answer read), in seconds; the percentiles
are over the 200 answers only.
"""

import asyncio
import math
import multiprocessing
import random
import time
from collections import Counter

import httpx

from .. import checks
from ..errors import ConfigError
from ..plots import new_axes, save_axes

__all__ = ["ROUTE_HEADER", "check_reachable", "closed_loop", "clients_loop", "open_loop",
           "max_concurrency", "ClosedLoops", "describe_level",
           "run_stress", "plot_stress", "default_texts", "counted_answers"]

#: The request header that restricts a request to one queue (``main``: the accelerator).
ROUTE_HEADER = "X-WindVE-Route"
#: The ``model`` field sent in every request.
MODEL = "all-MiniLM-L6-v2"
#: Levels that miss the SLO in a row after which :func:`run_stress` stops a route.
MISSES_TO_STOP = 2


def _check_common(url, texts, route, timeout):
    """Validate the arguments shared by the loops; returns the endpoint URL."""
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        raise ConfigError("url", "must be an http:// or https:// URL", value=url)
    if (not isinstance(texts, (list, tuple)) or not texts
            or not all(isinstance(t, str) and t for t in texts)):
        raise ConfigError("texts", "must be a non-empty list of non-empty strings")
    if route is not None and (not isinstance(route, str) or not route.strip()):
        raise ConfigError("route", "must be None or a non-empty string", value=route)
    checks.positive("timeout", timeout)
    return url.rstrip("/") + "/v1/embeddings"


def check_reachable(url, timeout=5.0):
    """Refuse ``url`` (:class:`ConfigError` naming ``url``) unless a WindVE service answers its
    ``/health`` within ``timeout`` seconds: a connection refused, an unresolvable host or a
    timeout is the user's mistake and is said in one line before any load is sent."""
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        raise ConfigError("url", "must be an http:// or https:// URL", value=url)
    try:
        response = httpx.get(url.rstrip("/") + "/health", timeout=timeout)
    except httpx.ConnectError as e:
        reason = "connection refused" if "refused" in str(e).lower() or "111" in str(e) \
            else f"cannot connect ({e})"
        raise ConfigError("url", f"no service answers at {url}: {reason}", value=url) from None
    except httpx.TimeoutException:
        raise ConfigError("url", f"no answer from {url} within {timeout:g} s",
                          value=url) from None
    except (httpx.HTTPError, ValueError) as e:
        raise ConfigError("url", f"cannot reach {url}: {e}", value=url) from None
    if response.status_code not in (200, 503):
        raise ConfigError("url", f"{url}/health answered HTTP {response.status_code}; is it a "
                          f"WindVE service?", value=url)


def _client(timeout, connections, keep_alive=False):
    """An AsyncClient whose pool holds ``connections`` connections (so no request waits for a
    free connection inside the load generator). Without ``keep_alive`` each connection serves
    one request, as if every request came from a client of its own: the loops whose requests
    outnumber their connections use that, since kept-alive connections went stale under
    overload there (httpcore opened a connection for a request that it then sent on another
    one, left the new one idle in the pool without an expiry, and sent a later request on it
    after the service had closed it: a ReadError the service never saw, 2 in 12,000
    requests). :func:`clients_loop`, one connection per client, keeps them alive."""
    limits = httpx.Limits(max_connections=connections,
                          max_keepalive_connections=connections if keep_alive else 0)
    return httpx.AsyncClient(timeout=httpx.Timeout(timeout), limits=limits)


def _is_one_embedding(response):
    """Whether a 200 answer's body holds exactly one embedding (a list of numbers)."""
    try:
        data = response.json()["data"]
        vector = data[0]["embedding"]
        return len(data) == 1 and isinstance(vector, list) and len(vector) > 0
    except (ValueError, KeyError, IndexError, TypeError):
        return False


async def _send(client, endpoint, text, headers):
    """One request; returns ``(status, seconds)``: status is the HTTP status (``"invalid"`` for
    a 200 without one embedding) or ``"timeout"``/``"error"`` for a transport failure."""
    start = time.perf_counter()
    try:
        response = await client.post(endpoint, json={"input": text, "model": MODEL},
                                      headers=headers)
    except httpx.TimeoutException:
        return "timeout", time.perf_counter() - start
    except (httpx.HTTPError, OSError):
        return "error", time.perf_counter() - start
    seconds = time.perf_counter() - start
    status = response.status_code
    if status == 200 and not _is_one_embedding(response):
        status = "invalid"
    return status, seconds


def _nearest_rank(sorted_values, q):
    """The ``q``-th percentile (0 < q <= 100) by the nearest-rank rule; None if empty."""
    if not sorted_values:
        return None
    return sorted_values[max(0, math.ceil(q / 100 * len(sorted_values)) - 1)]


def _summary(records):
    """Counts and latency statistics of ``(status, seconds)`` records (see the module doc)."""
    statuses = Counter(str(status) for status, _ in records)
    latencies = sorted(seconds for status, seconds in records if status == 200)
    sent, ok, rejected = len(records), statuses.get("200", 0), statuses.get("429", 0)
    return {"sent": sent, "ok": ok, "rejected": rejected, "errors": sent - ok - rejected,
            "statuses": dict(sorted(statuses.items())),
            "p50": _nearest_rank(latencies, 50), "p99": _nearest_rank(latencies, 99),
            "max": latencies[-1] if latencies else None,
            "mean": sum(latencies) / len(latencies) if latencies else None}


async def _closed_loop(client, endpoint, concurrency, texts, route, rounds, slo=None):
    headers = {ROUTE_HEADER: route} if route is not None else {}
    records = []
    start = time.perf_counter()
    for r in range(rounds):
        batch = [texts[(r * concurrency + i) % len(texts)] for i in range(concurrency)]
        records += await asyncio.gather(*(_send(client, endpoint, t, headers) for t in batch))
    seconds = time.perf_counter() - start
    result = {"concurrency": concurrency, "route": route, "rounds": rounds}
    result.update(_summary(records))
    if slo is not None:         # requests answered 200 within the SLO
        result["within_slo"] = sum(1 for status, t in records if status == 200 and t <= slo)
    result.update(met_slo=None, seconds=seconds, throughput=result["ok"] / seconds)
    return result


async def closed_loop(url, concurrency, texts, *, route=None, rounds=1, timeout=30.0):
    """Closed loop: ``rounds`` times, ``concurrency`` single-text requests at once to
    ``{url}/v1/embeddings``, the next round once all are answered.

    ``texts`` are cycled over the requests; ``route`` (e.g. ``"main"``) is sent as the
    ``X-WindVE-Route`` header when given; ``timeout`` bounds each request (seconds).

    Returns ``{"concurrency", "route", "rounds", "sent", "ok", "rejected", "errors",
    "statuses": {status: count}, "p50", "p99", "max", "mean", "met_slo", "seconds",
    "throughput"}``: ``ok``/``rejected`` count 200/429 answers, ``errors`` everything else (so
    ``ok + rejected + errors == sent``); the latency figures (seconds, nearest-rank
    percentiles) are over the 200 answers, None if there are none; ``met_slo`` is None
    (:func:`run_stress` fills it); ``seconds`` is the wall time of the whole loop and
    ``throughput`` its 200 answers per second (``ok / seconds``).

    Raises ConfigError naming the parameter for a URL that is not http(s), empty ``texts``,
    ``concurrency``/``rounds`` not integers >= 1, a ``timeout`` not > 0 or an empty ``route``.
    Transport failures are counted, never raised.
    """
    endpoint = _check_common(url, texts, route, timeout)
    checks.at_least("concurrency", concurrency, 1)
    checks.at_least("rounds", rounds, 1)
    async with _client(timeout, concurrency) as client:
        return await _closed_loop(client, endpoint, concurrency, texts, route, rounds)


#: Seconds between two /health probes of ``open_loop(probe_health=True)``.
HEALTH_INTERVAL = 0.05
#: The service's counter of HTTP answers (labels ``status``, ``path``).
ANSWERS_METRIC = "windve_http_responses_total"


def counted_answers(url, path="/v1/embeddings", timeout=5.0):
    """Answers to ``path`` the service at ``url`` has counted in ``/metrics``
    (:data:`ANSWERS_METRIC`, summed over statuses), by status: ``{"200": n, "429": m, ...}``.
    Raises ConfigError naming ``url`` when ``/metrics`` cannot be read."""
    from prometheus_client.parser import text_string_to_metric_families
    try:
        text = httpx.get(url.rstrip("/") + "/metrics", timeout=timeout).text
    except httpx.HTTPError as e:
        raise ConfigError("url", f"cannot read /metrics: {e}", value=url) from None
    counts = Counter()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if (sample.name == ANSWERS_METRIC and sample.labels.get("path") == path):
                counts[sample.labels.get("status", "?")] += int(sample.value)
    return dict(sorted(counts.items()))


def _probe_health(url, stop, conn, timeout):
    """Child process: ``GET {url}/health`` every :data:`HEALTH_INTERVAL` s until ``stop`` is
    set, then send the ``(status, seconds)`` records (``"error"`` for a transport failure)
    over ``conn``. A process of its own, so that the load generator's work (thousands of
    connections in this interpreter) does not delay the probe."""
    records = []
    with httpx.Client(timeout=timeout) as client:
        while not stop.is_set():
            start = time.perf_counter()
            try:
                status = client.get(url.rstrip("/") + "/health").status_code
            except httpx.HTTPError:
                status = "error"
            records.append((status, time.perf_counter() - start))
            stop.wait(HEALTH_INTERVAL)
    conn.send(records)
    conn.close()


def _health_summary(records):
    """Counts and nearest-rank latency percentiles (ms) of the /health probes."""
    times = sorted(t * 1000 for _, t in records)
    return {"probes": len(records),
            "statuses": dict(sorted(Counter(str(s) for s, _ in records).items())),
            "p50_ms": _nearest_rank(times, 50), "p99_ms": _nearest_rank(times, 99),
            "max_ms": times[-1] if times else None}


def _counted_delta(before, after):
    return {k: after.get(k, 0) - before.get(k, 0) for k in sorted(set(before) | set(after))
            if after.get(k, 0) != before.get(k, 0)}


async def _health_checked(url, timeout, loop):
    """Await the load ``loop`` (a coroutine returning a result with ``statuses``) while a
    child process probes ``/health`` (:func:`_probe_health`); add ``health``, ``counted`` and
    ``counted_all`` to its result (see :func:`open_loop`)."""
    before = counted_answers(url)
    ctx = multiprocessing.get_context("spawn")
    stop, (mine, theirs) = ctx.Event(), ctx.Pipe(duplex=False)
    prober = ctx.Process(target=_probe_health, args=(url, stop, theirs, timeout),
                         name="windve-health-probe", daemon=True)
    prober.start()
    theirs.close()
    try:
        result = await loop
    finally:
        stop.set()
        try:            # a probe that died (or never started) leaves no records
            probes = mine.recv() if mine.poll(timeout + 5) else []
        except EOFError:
            probes = []
        prober.join(5)
        if prober.is_alive():
            prober.kill()
    result["health"] = _health_summary(probes)
    # every HTTP answer received must have been counted (a transport failure or a client-side
    # timeout has no answer to count)
    answered = sum(n for status, n in result["statuses"].items()
                   if status.isdigit() or status == "invalid")
    for _ in range(20):
        counted = _counted_delta(before, counted_answers(url))
        if sum(counted.values()) >= answered:
            break
        await asyncio.sleep(0.1)
    result["counted"] = counted
    result["counted_all"] = sum(counted.values()) == answered
    return result


async def clients_loop(url, clients, requests, texts, *, timeout=30.0, probe_health=False):
    """``clients`` independent clients, each sending ``requests`` single-text requests one
    after the other (the next when the previous is answered, 200 or 429 alike) on a kept-alive
    connection, all at once: the concurrent users of the issue's overload check. Returns the counts and latency figures
    of :func:`closed_loop` with ``clients``, ``requests`` (per client) and ``seconds``; with
    ``probe_health`` also ``health``, ``counted`` and ``counted_all`` as :func:`open_loop`.
    Raises ConfigError naming the parameter."""
    endpoint = _check_common(url, texts, None, timeout)
    checks.at_least("clients", clients, 1)
    checks.at_least("requests", requests, 1)
    if probe_health:
        return await _health_checked(url, timeout, clients_loop(
            url, clients, requests, texts, timeout=timeout))

    async def client_of(k, client):
        return [await _send(client, endpoint, texts[(k * requests + j) % len(texts)], {})
                for j in range(requests)]

    async with _client(timeout, clients, keep_alive=True) as client:
        start = time.perf_counter()
        per_client = await asyncio.gather(*(client_of(k, client) for k in range(clients)))
        seconds = time.perf_counter() - start
    result = {"clients": clients, "requests": requests}
    result.update(_summary([r for records in per_client for r in records]))
    result["seconds"] = seconds
    return result


async def open_loop(url, bursts, burst_size, interval, texts, *, route=None, timeout=30.0,
                    probe_health=False):
    """Open loop: ``bursts`` bursts of ``burst_size`` single-text requests, one burst every
    ``interval`` seconds, without waiting for answers; then wait for all answers.

    Bursts are scheduled from the start time (a late burst does not shift the later ones).
    ``texts``, ``route`` and ``timeout`` are as for :func:`closed_loop`.

    Returns the same counts and latency figures as :func:`closed_loop` (``ok + rejected +
    errors == sent``) with ``bursts``, ``burst_size``, ``interval``, ``route``, ``seconds``
    (wall time) and ``lateness`` (seconds the latest burst left after its scheduled time: a
    large value means the load generator, not the service, was the bottleneck).

    With ``probe_health``, also ``health`` (the /health probes during the loop: ``probes``,
    ``statuses``, ``p50_ms``, ``p99_ms``, ``max_ms``) and ``counted`` (the answers to
    ``/v1/embeddings`` that ``/metrics`` counted meanwhile, by status; waits up to 2 s for the
    service to count the last ones) with ``counted_all`` (whether they add up to the HTTP
    answers received: ``sent`` less transport failures and client-side timeouts).

    Raises ConfigError naming the parameter as :func:`closed_loop` does, and for ``bursts``/
    ``burst_size`` not integers >= 1 or ``interval`` not a number >= 0.
    """
    endpoint = _check_common(url, texts, route, timeout)
    if probe_health:
        return await _health_checked(url, timeout, open_loop(
            url, bursts, burst_size, interval, texts, route=route, timeout=timeout))
    checks.at_least("bursts", bursts, 1)
    checks.at_least("burst_size", burst_size, 1)
    checks.in_range("interval", interval, 0, math.inf)
    headers = {ROUTE_HEADER: route} if route is not None else {}
    total = bursts * burst_size
    tasks, lateness = [], 0.0
    async with _client(timeout, total) as client:
        start = time.perf_counter()
        for b in range(bursts):
            delay = start + b * interval - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            lateness = max(lateness, time.perf_counter() - (start + b * interval))
            tasks += [asyncio.create_task(_send(client, endpoint,
                                                texts[(b * burst_size + i) % len(texts)],
                                                headers))
                      for i in range(burst_size)]
        records = await asyncio.gather(*tasks)
        seconds = time.perf_counter() - start
    result = {"bursts": bursts, "burst_size": burst_size, "interval": interval, "route": route}
    result.update(_summary(records))
    result.update(seconds=seconds, lateness=lateness)
    return result


def _meets(result, slo):
    """Whether a closed-loop level had every request answered 200 within ``slo`` seconds."""
    return (result["sent"] > 0 and result["ok"] == result["sent"]
            and result["max"] is not None and result["max"] <= slo)


def max_concurrency(results, slo):
    """The largest concurrency among ``results`` (closed-loop dicts) that meets ``slo``.

    A concurrency meets it when every request of every result at that concurrency was answered
    200 within ``slo`` seconds; any 429, error or slower answer fails it. Returns 0 when no
    concurrency meets it (or ``results`` is empty).

    Raises ConfigError naming ``slo`` unless it is a finite number > 0.
    """
    checks.positive("slo", slo)
    verdict = {}
    for result in results:
        c = result["concurrency"]
        verdict[c] = verdict.get(c, True) and _meets(result, slo)
    return max((c for c, good in verdict.items() if good), default=0)


_ROUTES = (("main_only", "main"), ("heterogeneous", None))


def describe_level(key, result):
    """One progress line for a closed-loop level ``result`` of the route ``key``
    (``main_only``/``heterogeneous``): counts, latency figures and the SLO verdict."""
    times = " ".join("-" if result[q] is None else f"{q} {result[q]:.3f} s"
                     for q in ("p50", "p99", "max"))
    return (f"{key}: concurrency {result['concurrency']}: {result['ok']}/{result['sent']} ok, "
            f"{result['rejected']} busy, {result['errors']} errors, "
            f"{result['within_slo']} within the SLO; {times}: "
            + ("met" if result["met_slo"] else "missed"))


class ClosedLoops:
    """Closed-loop levels against one service over one connection pool, each judged against
    ``slo`` (an async context manager)::

        async with ClosedLoops(url, texts, slo, rounds=2) as loops:
            result = await loops.level(16, route="main")

    :meth:`level` returns a :func:`closed_loop` result with ``within_slo`` and ``met_slo``
    filled (every request answered 200 within ``slo``). ``connections`` caps the pool (at
    least the largest concurrency measured, so no request waits for a connection here).
    Raises ConfigError naming the parameter as :func:`closed_loop` does, or ``slo``.
    """

    def __init__(self, url, texts, slo, *, rounds=1, timeout=30.0, connections=64):
        self.endpoint = _check_common(url, texts, None, timeout)
        self.slo = checks.positive("slo", slo)
        self.rounds = checks.at_least("rounds", rounds, 1)
        self.texts = texts
        self._client = _client(timeout, checks.at_least("connections", connections, 1))

    async def __aenter__(self):
        await self._client.__aenter__()
        return self

    async def __aexit__(self, *exc):
        return await self._client.__aexit__(*exc)

    async def level(self, concurrency, route=None, rounds=None):
        """One level: ``rounds`` (default: the loops' ``rounds``) rounds of ``concurrency``
        simultaneous requests."""
        checks.at_least("concurrency", concurrency, 1)
        rounds = self.rounds if rounds is None else checks.at_least("rounds", rounds, 1)
        result = await _closed_loop(self._client, self.endpoint, concurrency, self.texts,
                                    route, rounds, self.slo)
        result["met_slo"] = _meets(result, self.slo)
        return result


async def run_stress(url, slo, concurrencies, texts, *, rounds=1, timeout=30.0, progress=None):
    """Main-only vs heterogeneous maximum concurrency of one service, by closed loops.

    For the route ``main`` (header ``X-WindVE-Route: main``, the paper's accelerator-only
    baseline) and then no route (WindVE's heterogeneous dispatch), :func:`closed_loop` runs at
    each of ``concurrencies`` in increasing order (``rounds`` rounds each); each level's
    ``met_slo`` is set, and a route stops after two levels in a row miss the SLO. ``progress``,
    if given, is called with one short line per level.

    Returns ``{"slo", "rounds", "levels": {"main_only": [...], "heterogeneous": [...]},
    "max_concurrency": {"main_only": a, "heterogeneous": b}, "improvement_percent",
    "sent", "ok", "rejected", "errors"}``: the levels are :func:`closed_loop` results,
    ``improvement_percent`` is ``100 * (b - a) / a`` (None if ``a == 0``) and the counts are
    totals over every level of both routes (``ok + rejected + errors == sent``).

    Raises ConfigError naming the parameter for a ``slo`` not > 0, ``concurrencies`` not a
    non-empty sequence of integers >= 1, a non-callable ``progress``, or as
    :func:`closed_loop` does.
    """
    checks.positive("slo", slo)
    _check_common(url, texts, None, timeout)
    checks.at_least("rounds", rounds, 1)
    if isinstance(concurrencies, (str, bytes)) or not hasattr(concurrencies, "__iter__"):
        raise ConfigError("concurrencies", "must be a sequence of integers >= 1",
                          value=concurrencies)
    levels = sorted({checks.at_least("concurrencies", c, 1) for c in concurrencies})
    if not levels:
        raise ConfigError("concurrencies", "needs at least one level")
    if progress is not None and not callable(progress):
        raise ConfigError("progress", "must be a callable taking one line", value=progress)
    report = {"slo": slo, "rounds": rounds, "levels": {}, "max_concurrency": {}}
    async with ClosedLoops(url, texts, slo, rounds=rounds, timeout=timeout,
                           connections=levels[-1]) as loops:
        for key, route in _ROUTES:
            done, misses = [], 0
            for c in levels:
                result = await loops.level(c, route)
                done.append(result)
                if progress is not None:
                    progress(describe_level(key, result))
                misses = 0 if result["met_slo"] else misses + 1
                if misses >= MISSES_TO_STOP:
                    break
            report["levels"][key] = done
            report["max_concurrency"][key] = max_concurrency(done, slo)
    base, hetero = (report["max_concurrency"][key] for key, _ in _ROUTES)
    report["improvement_percent"] = 100.0 * (hetero - base) / base if base else None
    everything = [r for done in report["levels"].values() for r in done]
    for count in ("sent", "ok", "rejected", "errors"):
        report[count] = sum(r[count] for r in everything)
    return report


def plot_stress(report, path):
    """Draw a :func:`run_stress` report: p50 and max latency of the 200 answers against
    concurrency for both routes, the SLO as a horizontal line; saved as a PNG at ``path``.

    Uses Matplotlib's Agg canvas directly (no pyplot, no global backend change). Levels with
    no 200 answer have no latency and are left out of the lines; levels that missed the SLO
    are marked with a cross. Returns ``path``.
    """
    fig, ax = new_axes()
    styles = {"main_only": ("tab:blue", "main only"), "heterogeneous": ("tab:orange",
                                                                        "heterogeneous")}
    for key, levels in report["levels"].items():
        color, label = styles.get(key, (None, key))
        xs = [r["concurrency"] for r in levels]
        for stat, line in (("p50", "--"), ("max", "-")):
            ys = [math.nan if r[stat] is None else r[stat] for r in levels]
            ax.plot(xs, ys, line, marker="o", ms=3, color=color, label=f"{label} {stat}")
        missed = [(r["concurrency"], r["max"] if r["max"] is not None else report["slo"])
                  for r in levels if not r["met_slo"]]
        if missed:
            ax.plot(*zip(*missed), "x", ms=8, color=color, label=f"{label} missed SLO")
    ax.axhline(report["slo"], color="tab:red", lw=1, label=f"SLO {report['slo']:g} s")
    best = report["max_concurrency"]
    gain = report.get("improvement_percent")
    ax.set_title(f"max concurrency: main only {best.get('main_only')}, heterogeneous "
                 f"{best.get('heterogeneous')}" + (f" (+{gain:.1f}%)" if gain is not None
                                                  else ""))
    return save_axes(fig, ax, path, "concurrency (closed loop)", "end-to-end latency (s)")


_SUBJECTS = ["the engineer", "a small team", "the new service", "our customer", "the model",
             "a curious student", "the night shift", "every query", "the old server",
             "the research group", "a busy user", "the scheduler"]
_VERBS = ["reviewed", "rebuilt", "measured", "summarised", "compared", "shipped", "described",
          "tested", "explained", "indexed", "translated", "improved"]
_OBJECTS = ["the quarterly report", "a long list of documents", "the search results",
            "every failing test", "the latency budget", "a short product manual",
            "the weather forecast", "the database schema", "the customer feedback",
            "a set of vector embeddings", "the release notes", "the training data"]
_TAILS = ["before the deadline", "in the afternoon", "with great care", "for the second time",
          "without any help", "after a long meeting", "during the outage", "on a quiet day",
          "at the end of the week", "for the whole department"]
_JOINS = ["and", "while", "because", "so", "but", "although", "then"]


def default_texts(n=64, seed=0):
    """``n`` deterministic short English sentences of 8 to 40 words, for load generation.

    Each sentence joins a few simple clauses (subject, verb, object, sometimes a time or manner
    phrase) drawn from fixed word lists with ``random.Random(seed)``; the same ``n`` and
    ``seed`` always give the same list, and a longer list starts with the shorter one.

    Raises ConfigError naming ``n`` unless it is an integer >= 1.
    """
    checks.at_least("n", n, 1)
    rng = random.Random(seed)

    def clause():                                  # 5 to 15 words
        words = f"{rng.choice(_SUBJECTS)} {rng.choice(_VERBS)} {rng.choice(_OBJECTS)}".split()
        if rng.random() < 0.6:
            words += rng.choice(_TAILS).split()
        return words

    texts = []
    for _ in range(n):
        target = rng.randint(8, 40)
        words = clause()
        while len(words) < target:
            more = clause()
            if len(words) + 1 + len(more) > 40:
                break
            words += [rng.choice(_JOINS)] + more
        texts.append(" ".join(words).capitalize() + ".")
    return texts
