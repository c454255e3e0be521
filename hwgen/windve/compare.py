"""``hwgen windve stress --compare``: WindVE against the accelerator alone, the paper's way.

The paper (section 5.2, Tables 1-2) compares the accelerator alone at its own best concurrency
under the SLO (FlagEmbedding or PyTorch on the V100 or the Atlas 300I, with nothing else) with
WindVE at the SAME main depth plus the CPU queue: "44 + 8", "96 + 22". Its gain is the
"concurrency improvement" ``C_CPU / C_NPU``. :func:`compare` measures exactly that, in one run,
on services it starts itself (``hwgen windve run`` in a child process, :class:`ServiceProcess`),
with the closed-loop load generator of :mod:`.stress` over HTTP:

Every service is warmed up first (:data:`WARM_UP_ROUNDS` unrecorded levels).

1. **Main only.** A service with only the main instances and an unbounded main queue: one level
   at concurrency 1 (the latency of a lone request, ``t_proc`` of the cost model), then
   :func:`search_max` finds the largest concurrency ``C_main`` whose every request is answered
   200 within the SLO: levels doubling from ``step`` until one misses, then bisection to the
   exact request (or, from a calibration's depth, steps of ``step`` up or down, then
   bisection). That is the accelerator's best depth.
2. **Heterogeneous.** A second service with the main queue at ``C_main`` and the CPU queue
   unbounded. The same search over ``C_main + k`` finds the largest extra concurrency
   ``k = C_cpu`` the CPU queue adds within the SLO (in a closed loop at ``C_main + k`` the main
   queue holds ``C_main`` and the CPU queue ``k``, exactly as with a CPU depth of ``k``).
3. **Final pair.** On that service, back to back and with at least :data:`FINAL_ROUNDS` rounds
   each: main-only (header ``X-WindVE-Route: main``) at ``C_main`` and heterogeneous at
   ``C_main + C_cpu``. These are the figures reported (their ``met_slo`` says whether the SLO
   held again).

The gain is reported two ways: ``concurrency_percent = 100 * C_cpu / C_main`` (the paper's
concurrency improvement, from the searches) and ``throughput_percent = 100 * (T_het / T_main -
1)``, the 200 answers per second of the final heterogeneous level against main-only's (the
paper's "throughput up to 1.22x").

A level meets the SLO when every request of its ``rounds`` rounds is answered 200 within it;
one level is a measurement, so near the limit the search can land a request or two either side
of the true figure on a noisy machine.
"""

import asyncio
import signal
import socket
import subprocess
import sys
import tempfile
import time

import httpx

from .. import checks
from ..errors import ConfigError, ToolError
from .stress import ClosedLoops, describe_level

__all__ = ["LIMIT", "ServiceProcess", "compare", "free_port", "search_max"]

#: Largest concurrency a search tries (and the depth of an "unbounded" queue).
LIMIT = 2000
#: Seconds a service may take to answer its first ``/health`` (model copies loading).
START_SECONDS = 300.0


def free_port():
    """A TCP port of 127.0.0.1 that is free now (the OS picks it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServiceProcess:
    """``hwgen windve run`` in a child process on a free port of 127.0.0.1, as a context
    manager yielding its URL once ``/health`` answers 200; on exit it is sent SIGINT (it
    drains: every accepted request answered) and killed if it has not exited in 60 s.

    ``devices``: the ``--devices`` text, or None to let the service detect the devices;
    ``depths``: ``{"main": N, "cpu": N}``; ``heterogeneous``: whether the CPU queue is used.
    The child's log goes to a temporary file, shown in the error when it fails to start
    (:class:`~hwgen.errors.ToolError`).
    """

    def __init__(self, devices, depths, heterogeneous, *, max_batch=32, max_wait_ms=5.0,
                 log=None):
        self.args = ["windve", "run", "--depths", f"main={depths['main']},cpu={depths['cpu']}",
                     "--heterogeneous" if heterogeneous else "--no-heterogeneous",
                     "--max-batch", str(max_batch), "--max-wait-ms", f"{max_wait_ms:g}"]
        if devices is not None:
            self.args += ["--devices", devices]
        self.log = log or (lambda line: None)
        self.proc = None
        self._output = None

    @property
    def command(self):
        """The command line the service runs (without the port), as a user would type it."""
        return "hwgen " + " ".join(self.args)

    def __enter__(self):
        port = free_port()
        self._output = tempfile.TemporaryFile(mode="w+")
        self.log(f"starting: {self.command} --port {port}")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "hwgen.cli", *self.args, "--port", str(port)],
            stdout=self._output, stderr=subprocess.STDOUT, text=True)
        url = f"http://127.0.0.1:{port}"
        try:
            self._wait_ready(url)
        except BaseException:               # a failed start or an interrupt: no orphan
            self._stop()
            self._output.close()
            raise
        return url

    def _wait_ready(self, url):
        deadline = time.monotonic() + START_SECONDS
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self._fail(f"exited with status {self.proc.returncode}")
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        self._fail(f"did not answer /health within {START_SECONDS:g} s")

    def _fail(self, what):
        self._output.seek(0)
        lines = [line.strip() for line in self._output.read().splitlines() if line.strip()]
        raise ToolError(f"the service `{self.command}` {what}: "
                        + (" | ".join(lines[-3:]) or "no output"))

    def _stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def __exit__(self, *exc):
        self._stop()
        self._output.close()
        return False


async def search_max(measure, start, *, step=None, limit=LIMIT):
    """The largest concurrency ``C`` in ``1..limit`` for which ``await measure(C)`` (a
    closed-loop result) has ``met_slo``, or 0 when none does.

    From ``start``: while levels meet the SLO, go up (doubling with ``step`` None, else by
    ``step``) until one misses or ``limit`` is passed; if ``start`` misses, go down (halving,
    or by ``step``) until one meets or 1 missed. Then bisect between the last level that met
    and the first that missed. Each level is measured once.

    Returns ``(best, results)``: ``results`` maps every concurrency measured to its result.
    """
    start = checks.at_least("start", start, 1, limit)
    results = {}

    async def met(c):
        if c not in results:
            results[c] = await measure(c)
        return results[c]["met_slo"]

    def up(c):
        return c * 2 if step is None else c + step

    def down(c):
        return c // 2 if step is None else c - step

    if await met(start):
        good, bad = start, None
        while bad is None and good < limit:
            nxt = min(up(good), limit)
            if await met(nxt):
                good = nxt
            else:
                bad = nxt
    else:
        good, bad = 0, start
        while good == 0 and bad > 1:
            nxt = max(down(bad), 1)
            if await met(nxt):
                good = nxt
            else:
                bad = nxt
    while bad is not None and bad - good > 1:
        mid = (good + bad) // 2
        if await met(mid):
            good = mid
        else:
            bad = mid
    return good, results


def _figures(result):
    """The figures of one level that a comparison reports."""
    keys = ("concurrency", "met_slo", "throughput", "p50", "p99", "max", "mean", "sent", "ok",
            "rejected", "errors", "within_slo", "seconds")
    return {k: result[k] for k in keys}


#: Closed-loop rounds (at least) of the two final levels whose figures are compared.
FINAL_ROUNDS = 5
#: Unrecorded closed-loop levels each new service gets first (its instances' first batches
#: are slower: thread pools and PyTorch's kernels for new shapes start up).
WARM_UP_ROUNDS = 3


async def _warm_up(loops, levels, concurrency, route, say):
    """``levels`` levels at ``concurrency``, not recorded."""
    for _ in range(levels):
        await loops.level(concurrency, route)
    if levels:
        say(f"warmed up: {levels} levels of {concurrency} requests, not recorded")


async def _main_only(url, texts, slo, rounds, start, step, warm_up, say):
    """Phase 1: a lone request, then the search for ``C_main`` (see the module docstring)."""
    async with ClosedLoops(url, texts, slo, rounds=rounds, connections=LIMIT) as loops:
        await _warm_up(loops, warm_up, 4, "main", say)
        single = await loops.level(1, "main")
        say(describe_level("main_only", single) + " (a lone request: t_proc)")

        async def measure(c):
            result = await loops.level(c, "main")
            say(describe_level("main_only", result))
            return result

        best, results = await search_max(measure, start, step=step)
    return single, best, results


async def _heterogeneous(url, texts, slo, rounds, main_depth, start, step, warm_up, say):
    """Phase 2: the search for the CPU's extra concurrency ``k`` over ``main_depth + k``, then
    the final pair of :data:`FINAL_ROUNDS`-round levels (see the module docstring)."""
    async with ClosedLoops(url, texts, slo, rounds=rounds, connections=LIMIT) as loops:
        await _warm_up(loops, warm_up, main_depth + 4, None, say)     # both queues' instances

        async def measure(k):
            result = await loops.level(main_depth + k, None)
            say(describe_level("heterogeneous", result) + f" (main {main_depth} + cpu {k})")
            return result

        extra, results = await search_max(measure, start, step=step,
                                          limit=max(1, LIMIT - main_depth))
        final_rounds = max(rounds, FINAL_ROUNDS)
        say(f"final: main only at {main_depth} and heterogeneous at {main_depth} + {extra}, "
            f"{final_rounds} rounds each, on this service")
        main = await loops.level(main_depth, "main", final_rounds)
        say(describe_level("main_only", main) + " (final)")
        het = await loops.level(main_depth + extra, None, final_rounds)
        say(describe_level("heterogeneous", het) + f" (final: main {main_depth} + cpu {extra})")
    return main, extra, het, results


def _percent(part, whole):
    return None if not whole else 100.0 * part / whole


def compare(slo, texts, *, start_service, step=8, rounds=2, hint=None, progress=None,
            warm_up=None):
    """Main-only at its best depth against heterogeneous at the same main depth plus the CPU
    queue (see the module docstring).

    ``start_service(depths, heterogeneous)`` returns a context manager yielding the URL of a
    service with those queue depths (:class:`ServiceProcess` bound to the devices);
    ``hint``: ``{"main": depth, "cpu": depth}`` from a calibration, where the searches start
    (by steps of ``step``) instead of doubling from ``step``; ``warm_up``: unrecorded levels
    each new service gets first (default :data:`WARM_UP_ROUNDS`).

    Returns ``{"slo", "rounds", "step", "depth_source", "main_only", "heterogeneous",
    "gain", "levels", "max_concurrency", "improvement_percent", "sent", "ok", "rejected",
    "errors"}``: ``main_only`` has the level figures at ``C_main`` (``concurrency``,
    ``met_slo``, ``throughput`` in 200 answers/s, ``p50``/``p99``/``max``/``mean`` seconds,
    counts), ``depth`` and ``t_proc`` (the median latency of a lone request);
    ``heterogeneous`` the figures at ``C_main + C_cpu`` with ``main_depth`` and
    ``cpu_depth`` (both from the final pair); ``gain`` ``{"concurrency_percent",
    "throughput_percent", "definition"}``; the counts are totals over every recorded level;
    ``levels``/``max_concurrency``/``improvement_percent`` as :func:`.stress.run_stress`
    (so :func:`.stress.plot_stress` draws it). Raises ConfigError naming ``slo`` when the
    main instances meet it at no concurrency.
    """
    checks.positive("slo", slo)
    checks.at_least("step", step, 1, LIMIT)
    checks.at_least("rounds", rounds, 1)
    warm_up = checks.at_least("warm_up", WARM_UP_ROUNDS if warm_up is None else warm_up, 0)
    say = progress or (lambda line: None)
    hint = hint or {}
    main_step = step if hint.get("main") else None
    say(f"1/2 main only (the accelerator alone, its queue unbounded): the largest concurrency "
        f"whose every request meets the SLO of {slo:g} s")
    with start_service({"main": LIMIT, "cpu": 1}, False) as url:
        single, main_depth, main_levels = asyncio.run(_main_only(
            url, texts, slo, rounds, min(hint.get("main") or step, LIMIT), main_step, warm_up,
            say))
    if main_depth == 0:
        raise ConfigError("slo", "the main instances alone answer no concurrency, not even "
                          "one request, within it; give a longer SLO", value=slo)
    say(f"main only: best depth {main_depth}")
    say(f"2/2 heterogeneous: main queue depth {main_depth} (main only's best) plus the CPU "
        "queue")
    cpu_start = min(hint.get("cpu") or step, LIMIT - main_depth)
    with start_service({"main": main_depth, "cpu": LIMIT}, True) as url:
        main, cpu_depth, het, het_levels = asyncio.run(_heterogeneous(
            url, texts, slo, rounds, main_depth, max(cpu_start, 1),
            step if hint.get("cpu") else None, warm_up, say))
    main_only = {"depth": main_depth, **_figures(main), "t_proc": single["p50"]}
    heterogeneous = {"main_depth": main_depth, "cpu_depth": cpu_depth, **_figures(het)}
    gain = {"concurrency_percent": _percent(cpu_depth, main_depth),
            "throughput_percent": (_percent(het["throughput"] - main["throughput"],
                                            main["throughput"])),
            "definition": "concurrency: 100 * cpu_depth / main_depth, the paper's concurrency "
                          "improvement (largest concurrency within the SLO, heterogeneous over "
                          "main only, minus 1); throughput: 100 * (heterogeneous / main-only "
                          "200 answers per second - 1), each measured at its largest "
                          "concurrency in the final pair"}
    levels = {"main_only": [single] * (1 not in main_levels)
              + [main_levels[c] for c in sorted(main_levels)],
              "heterogeneous": [het_levels[k] for k in sorted(het_levels)]}
    report = {"mode": "compare", "slo": slo, "rounds": rounds, "step": step,
              "depth_source": "calibration" if hint else "search",
              "main_only": main_only, "heterogeneous": heterogeneous, "gain": gain,
              "levels": levels,
              "max_concurrency": {"main_only": main_depth,
                                  "heterogeneous": main_depth + cpu_depth},
              "improvement_percent": gain["concurrency_percent"]}
    everything = [single, main, het, *main_levels.values(), *het_levels.values()]
    for count in ("sent", "ok", "rejected", "errors"):
        report[count] = sum(r[count] for r in everything)
    return report

