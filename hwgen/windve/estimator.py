"""WindVE's queue-depth estimator: latency linear in concurrency, fitted with NNLS.

The paper (WindVE, CPU-NPU collaborative vector embedding) sizes each device queue by the
largest concurrency ``C_d^max`` whose end-to-end latency still meets the SLO ``T``
(section 3.2, equations 7-10)::

    t_proc,d(C_d^max) <= T   and   t_proc,d(C_d^max + 1) > T,     d in {NPU, CPU}

Measuring that point by a stress test (raise ``C`` in fixed steps until the SLO fails) takes
many profiling rounds and, with a coarse step, misses the peak. Section 4.2.2 instead observes
that latency is linear in concurrency (equation 12)::

    t_proc,d(C_d) = alpha_d * C_d + beta_d,     alpha_d, beta_d >= 0

so a few profiled points fitted by non-negative least squares (:func:`fit_linear`) predict the
depth directly (:func:`predict_depth`): the largest integer ``C`` with ``alpha*C + beta <= T``.
:func:`stress_depth` is the paper's baseline, :func:`profile_points` picks the calibration
concurrencies and :func:`table3` prints the comparison in the shape of the paper's Table 3.

Reference: the paper's Table 3 (bge-large-zh-v1.5; stress tests in steps of 8)::

    queue depth            Tesla V100  Intel Xeon E5  Atlas 300I DUO  Kunpeng 920
    1 s  linear regression     40            8              84            2
         stress test           40            6              80            2
         fine-tuned            44            8              84            2
    2 s  linear regression     96           20             195           15
         stress test           88           18             176           12
         fine-tuned            96           22             172            8

All errors on input are :class:`~hwgen.errors.ConfigError` naming the parameter.
"""

import math
import numbers

import numpy as np
from scipy.optimize import nnls

from .. import checks
from ..errors import ConfigError

__all__ = ["fit_linear", "predict_depth", "stress_depth", "profile_points", "table3"]

#: Relative slack on ``latency <= slo`` comparisons of computed (not measured) latencies, so that
#: a point exactly on the SLO counts as met despite floating-point rounding of ``alpha*C+beta``.
_REL_TOL = 1e-9


def _real(name, value):
    """``value`` as a finite float; ConfigError naming ``name`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ConfigError(name, "must be a number", value=value)
    value = float(value)
    if not math.isfinite(value):
        raise ConfigError(name, "must be a finite number", value=value)
    return value


def _vector(name, values):
    """``values`` as a 1-D float array of finite positive numbers; ConfigError otherwise."""
    try:
        arr = np.asarray(values, dtype=float)
    except (TypeError, ValueError):
        raise ConfigError(name, "must be a sequence of numbers") from None
    if arr.ndim != 1:
        raise ConfigError(name, f"must be a flat sequence of numbers (got {arr.ndim} dimensions)")
    if not np.all(np.isfinite(arr)):
        raise ConfigError(name, "must hold finite numbers only", value=values)
    if np.any(arr <= 0):
        raise ConfigError(name, "must hold positive numbers only", value=values)
    return arr


def _within(latency, slo):
    """Whether a computed latency meets ``slo`` (equality, up to rounding, counts as met)."""
    return latency <= slo + _REL_TOL * max(1.0, abs(slo))


def fit_linear(concurrency, latency):
    """Fit ``latency = alpha * concurrency + beta`` (paper eq. 12) with ``alpha, beta >= 0``.

    Non-negative least squares (:func:`scipy.optimize.nnls`) on the design matrix
    ``[C, 1]``: where the unconstrained slope would be negative (noise, a flat device), the
    fit clamps it to 0 and ``beta`` becomes the best constant.

    Returns ``(alpha, beta)`` as floats (seconds per concurrent request, seconds).

    Raises ConfigError naming ``concurrency`` or ``latency`` when either is not a flat sequence
    of finite positive numbers, when their lengths differ, or when fewer than two distinct
    concurrencies are given (a line needs two).
    """
    c = _vector("concurrency", concurrency)
    t = _vector("latency", latency)
    if len(c) != len(t):
        raise ConfigError("latency", f"has {len(t)} values for {len(c)} concurrencies; "
                          "give one latency per concurrency")
    if len(np.unique(c)) < 2:
        raise ConfigError("concurrency", "needs at least two distinct concurrencies to fit a "
                          "line", value=list(c.tolist()))
    design = np.column_stack([c, np.ones_like(c)])
    (alpha, beta), _residual = nnls(design, t)
    return float(alpha), float(beta)


def predict_depth(alpha, beta, slo):
    """The largest integer ``C >= 0`` with ``alpha * C + beta <= slo`` (equations 7-8 on the fit).

    Equality counts as met (up to floating-point rounding). Returns 0 when even ``beta``, the
    latency of a lone request, exceeds ``slo``.

    Raises ConfigError naming ``alpha``/``beta`` when they are not finite numbers >= 0 or
    ``slo`` when it is not a finite number > 0; naming ``slo`` too when ``alpha == 0`` and
    ``beta <= slo``: a flat fit sets no limit on concurrency (profile up to higher
    concurrencies, where latency grows).
    """
    alpha, beta, slo = _real("alpha", alpha), _real("beta", beta), _real("slo", slo)
    for name, value in (("alpha", alpha), ("beta", beta)):
        if value < 0:
            raise ConfigError(name, "must be >= 0 (a fit of eq. 12 is non-negative)",
                              value=value)
    if slo <= 0:
        raise ConfigError("slo", "must be a positive number of seconds", value=slo)
    if not _within(beta, slo):
        return 0
    if alpha == 0:
        raise ConfigError("slo", f"is never exceeded by the fit t = {beta:g} s: it is flat "
                          "(alpha = 0), so it sets no queue depth; profile up to higher "
                          "concurrencies, where latency grows", value=slo)
    bound = (slo - beta) / alpha
    if not math.isfinite(bound) or bound > 2**53:
        raise ConfigError("alpha", f"is too small for the SLO: the predicted depth {bound:g} is "
                          "not a usable queue depth", value=alpha)
    depth = max(0, math.floor(bound))
    while _within(alpha * (depth + 1) + beta, slo):       # rounding put the floor one short
        depth += 1
    while depth > 0 and not _within(alpha * depth + beta, slo):
        depth -= 1
    return depth


def stress_depth(measure, slo, step=8, start=None, limit=4096):
    """The paper's baseline: raise the concurrency in fixed steps until the SLO fails.

    ``measure(C)`` runs the device at concurrency ``C`` and returns the latency in seconds the
    caller judges by (e.g. the slowest answer, or a p99). Concurrencies tried are ``start``
    (default ``step``), ``start + step``, ``start + 2*step``, ... up to ``limit``; the test stops
    at the first latency above ``slo`` or when the next concurrency would exceed ``limit``.

    Returns ``(depth, trace)``: the largest concurrency tried whose latency was ``<= slo`` (0 if
    the first one already failed) and the list of ``(C, latency)`` pairs tried, in order.

    Raises ConfigError naming ``measure`` if it is not callable or returns something other than
    a finite number >= 0, ``slo`` if not a finite number > 0, ``step``/``start`` if not integers
    >= 1 and ``limit`` if not an integer >= ``start``.
    """
    if not callable(measure):
        raise ConfigError("measure", "must be a callable taking a concurrency", value=measure)
    slo = checks.positive("slo", slo)
    step = checks.at_least("step", step, 1)
    start = step if start is None else checks.at_least("start", start, 1)
    limit = checks.at_least("limit", limit, start)
    depth, trace = 0, []
    for c in range(start, limit + 1, step):
        got = measure(c)
        if (isinstance(got, bool) or not isinstance(got, numbers.Real)
                or not math.isfinite(got) or got < 0):
            raise ConfigError("measure", f"returned {got!r} at concurrency {c}; expected a "
                              "latency in seconds (a finite number >= 0)")
        trace.append((c, float(got)))
        if got > slo:
            break
        depth = c
    return depth, trace


def profile_points(max_c, points=5):
    """``min(points, max_c)`` distinct concurrencies from 1 to ``max_c``, spread geometrically.

    The calibration points for :func:`fit_linear`: sorted, the first 1 and the last ``max_c``;
    where rounding a geometric step would repeat a value, the next free integer is taken. E.g.
    ``profile_points(64)`` is ``[1, 3, 8, 23, 64]``.

    Raises ConfigError naming ``max_c`` unless it is an integer >= 2, ``points`` unless an
    integer >= 2 (a line needs two points).
    """
    max_c = checks.at_least("max_c", max_c, 2)
    points = checks.at_least("points", points, 2)
    n = min(points, max_c)
    targets = np.geomspace(1, max_c, n)
    out = []
    for i, target in enumerate(targets):
        lowest = out[-1] + 1 if out else 1
        highest = max_c - (n - 1 - i)                 # leave room for the points still to come
        out.append(min(max(round(float(target)), lowest), highest))
    return out


_TABLE3_COLUMNS = (("device", "device"), ("slo", "SLO (s)"),
                   ("linear_regression", "linear regression"), ("stress_test", "stress test"),
                   ("final", "final"))


def table3(rows):
    """Lines of a Table-3-style comparison of queue depths, one row per (device, SLO).

    ``rows`` are dicts with the keys ``device``, ``slo`` (seconds), ``linear_regression``
    (predicted depth), ``stress_test`` (stress-test depth) and ``final`` (fine-tuned depth);
    a missing or ``None`` value prints as ``-``. Returns the header, a rule and one line per
    row, columns aligned (the device left-aligned, the numbers right-aligned).

    Raises ConfigError naming ``rows`` when an entry is not a dict.
    """
    cells = []
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise ConfigError("rows", f"entry {i} must be a dict with the keys "
                              + ", ".join(k for k, _ in _TABLE3_COLUMNS), value=row)
        line = []
        for key, _ in _TABLE3_COLUMNS:
            value = row.get(key)
            if value is None:
                line.append("-")
            elif key == "slo":
                line.append(f"{value:g}")
            else:
                line.append(str(value))
        cells.append(line)
    header = [title for _, title in _TABLE3_COLUMNS]
    widths = [max(len(r[j]) for r in [header] + cells) for j in range(len(header))]

    def fmt(line):
        first = line[0].ljust(widths[0])
        return "  ".join([first] + [v.rjust(w) for v, w in zip(line[1:], widths[1:])])

    return [fmt(header), "  ".join("-" * w for w in widths)] + [fmt(r) for r in cells]
