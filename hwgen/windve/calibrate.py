"""``hwgen serve calibrate``: the queue-depth estimator run on this machine's instances.

For each device role of a plan (the main instances, then the CPU instances) the instances are
started as in the service (their own processes and model copies) behind one
:class:`~hwgen.windve.queues.DeviceQueue` without a depth limit, and a closed loop is run
directly on the queue (no HTTP, so the figures are the device's): ``C`` single-text requests at
once, the latency of the slowest answer. The estimator profiles a few concurrencies, fits
``t = alpha * C + beta`` (non-negative least squares, paper eq. 12) and predicts the largest
``C`` within each SLO; the paper's baseline, a stress test in steps of 8, finds the same by
measurement; the final depth is the prediction checked by one more measurement (lowered until
it meets the SLO). The result is the Table 3 shape.
"""

import concurrent.futures
import time

from .. import checks
from ..errors import ConfigError
from ..plots import new_axes, save_axes
from . import estimator
from .queues import DeviceQueue, Request
from .workers import start_runners, stop_runners

__all__ = ["Profiler", "calibrate", "fit_role", "read_calibration"]


class Profiler:
    """Instances of one role behind an unbounded queue; :meth:`measure` runs one closed-loop
    level."""

    def __init__(self, name, instances, texts, *, max_batch=32, max_wait=0.005):
        self.name = name
        self.texts = texts
        self.queue = DeviceQueue(name, 1 << 30)
        self.runners = start_runners(instances, self.queue, max_batch=max_batch,
                                     max_wait=max_wait)

    def measure(self, concurrency, rounds=1):
        """Seconds until the slowest of ``concurrency`` simultaneous single-text requests is
        answered (the largest over ``rounds`` rounds)."""
        worst = 0.0
        for _ in range(rounds):
            start = time.monotonic()
            requests = [Request([self.texts[k % len(self.texts)]]) for k in range(concurrency)]
            for request in requests:
                self.queue.try_put(request)
            concurrent.futures.wait([r.future for r in requests])
            for r in requests:
                r.future.result()
            worst = max(worst, time.monotonic() - start)
        return worst

    def close(self):
        """Close the queue and stop the role's instances (waiting up to 30 s for each runner)."""
        self.queue.close()
        stop_runners(self.runners, 30)


def fit_role(prof, slos, *, max_profile=32, points=5, rounds=2, limit=None, progress=None):
    """The estimator on one role's :class:`Profiler`: profile ``points`` concurrencies up to
    ``max_profile`` (after a warm-up), fit ``t = alpha * C + beta`` and, per SLO, predict the
    depth and check it by one more measurement (lowered until it meets the SLO); ``limit``,
    when given, caps the depth checked.

    Returns ``{"points": [[C, seconds], ...], "alpha", "beta", "depths": {slo:
    {"linear_regression", "final"}}}``.
    """
    say = progress or (lambda line: None)
    role = prof.name
    prof.measure(2)                          # warm-up, not recorded
    pts = []
    for c in estimator.profile_points(max_profile, points):
        t = prof.measure(c, rounds)
        pts.append([c, t])
        say(f"{role}: concurrency {c:>4}: {t:.3f} s")
    alpha, beta = estimator.fit_linear([p[0] for p in pts], [p[1] for p in pts])
    say(f"{role}: t = {alpha:.5f} * C + {beta:.4f} s")
    depths = {}
    for slo in slos:
        predicted = estimator.predict_depth(alpha, beta, slo)
        final = predicted if limit is None else min(predicted, limit)
        while final > 0 and prof.measure(final, rounds) > slo:
            final -= max(1, final // 16)
        depths[slo] = {"linear_regression": predicted, "final": final}
    return {"points": pts, "alpha": alpha, "beta": beta, "depths": depths}


def calibrate(plan, slos, texts, *, max_profile=32, points=5, step=8, rounds=2, limit=512,
              progress=None):
    """Profile, fit and stress-test every role of ``plan`` (see module docstring).

    Returns ``{"devices": [{"role", "instances", "points": [[C, seconds], ...], "alpha",
    "beta", "depths": {slo: {"linear_regression", "stress_test", "final", "stress_trace"}}}],
    "table": [lines]}``.
    """
    say = progress or (lambda line: None)
    roles = [("main", plan.main)] + ([("cpu", plan.auxiliary)] if plan.auxiliary else [])
    devices, rows = [], []
    for role, instances in roles:
        label = "+".join(i.name for i in instances)
        say(f"{role}: starting {label} ...")
        prof = Profiler(role, instances, texts)
        try:
            fit = fit_role(prof, slos, max_profile=max_profile, points=points, rounds=rounds,
                           limit=limit, progress=say)
            for slo, depth in fit["depths"].items():
                depth["stress_test"], depth["stress_trace"] = estimator.stress_depth(
                    lambda c: prof.measure(c, rounds), slo, step=step, limit=limit)
                rows.append({"device": f"{role} ({label})", "slo": slo, **{
                    k: depth[k] for k in ("linear_regression", "stress_test", "final")}})
                say(f"{role}: SLO {slo:g} s: regression {depth['linear_regression']}, stress "
                    f"test {depth['stress_test']}, final {depth['final']}")
            devices.append({"role": role, "instances": [i.name for i in instances], **fit})
        finally:
            prof.close()
    return {"devices": devices, "table": estimator.table3(rows)}


def read_calibration(path, slo=None, name="calibration"):
    """The figures of a ``hwgen windve calibrate --json`` file for one SLO (``slo`` None: the
    file's first): ``{"slo", "main": {...}, "cpu": {...} or None}``, each role's ``alpha``,
    ``beta``, ``depth`` (the final depth) and ``instances``. Raises ConfigError naming
    ``name`` for a file that is not such a report, or ``slo`` for an SLO it has no depths
    for."""
    data = checks.read_json(path, name)
    roles = data.get("devices") if isinstance(data, dict) else None
    if not isinstance(roles, list) or not roles:
        raise ConfigError(name, "is not a `hwgen windve calibrate --json` report (no "
                          "'devices' list)", value=str(path))
    figures = {"main": None, "cpu": None}
    for d in roles:
        try:
            depths = {float(k): v["final"] for k, v in d["depths"].items()}
            entry = {"alpha": float(d["alpha"]), "beta": float(d["beta"]),
                     "instances": list(d["instances"]), "depths": depths}
            role = d["role"]
        except (KeyError, TypeError, ValueError, AttributeError):
            raise ConfigError(name, "has a device entry without role, alpha, beta, instances "
                              "and depths {SLO: {final}}", value=str(path)) from None
        if role in figures:
            figures[role] = entry
    if figures["main"] is None:
        raise ConfigError(name, "has no 'main' device", value=str(path))
    known = sorted(figures["main"]["depths"])
    if slo is None:
        if not known:
            raise ConfigError(name, "has no depths", value=str(path))
        slo = known[0]
    if slo not in known:
        raise ConfigError("slo", f"{path} has depths for the SLOs "
                          f"{', '.join(f'{k:g}' for k in known) or 'none'} s only", value=slo)
    for entry in filter(None, figures.values()):
        if slo not in entry["depths"]:
            raise ConfigError("slo", f"{path} has no depth for this SLO", value=slo)
        depth = entry.pop("depths")[slo]
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < 0:
            raise ConfigError(name, f"has a final depth {depth!r}; expected an integer >= 0",
                              value=str(path))
        entry["depth"] = depth
    return {"slo": slo, **figures}


def plot_calibration(result, path):
    """Measured latency against concurrency per device (profile points and stress-test levels)
    with the fitted ``alpha * C + beta`` line and the SLOs; saved as a PNG at ``path``."""
    fig, ax = new_axes()
    slos = set()
    for d, color in zip(result["devices"], ("tab:blue", "tab:orange", "tab:green")):
        name = f"{d['role']} ({'+'.join(d['instances'])})"
        ax.plot(*zip(*d["points"]), "o", color=color, label=f"{name}: profiled")
        stressed = [pt for v in d["depths"].values() for pt in v["stress_trace"]]
        if stressed:
            ax.plot(*zip(*stressed), "x", color=color, ms=5, label=f"{name}: stress test")
        top = max([c for c, _ in d["points"]] + [c for c, _ in stressed])
        ax.plot([0, top], [d["beta"], d["alpha"] * top + d["beta"]], "-", color=color,
                lw=1, label=f"{name}: t = {d['alpha']:.4f} C + {d['beta']:.3f}")
        slos.update(d["depths"])
    for slo in sorted(slos, key=float):
        ax.axhline(float(slo), color="tab:red", lw=0.8, ls=":")
    return save_axes(fig, ax, path, "concurrency C (simultaneous requests)",
                     "latency of the slowest answer (s)")
