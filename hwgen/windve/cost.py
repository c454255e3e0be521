"""The paper's deployment-cost model (section 3.1-3.2, equations 4-6): what WindVE saves.

Equation 4, the queries another query may wait for within the SLO ``t_max``::

    n = floor((t_max - t_proc) / t_proc)

Equation 5, deploying for the average load (``N`` queries a second, throughput ``T``)::

    Cost = (N / n) / T * D * P

Equation 6, deploying for the peak (``N_peak`` simultaneous queries, maximum concurrency ``C``
within the SLO)::

    Cost = N_peak / C * D * P

``D`` is the devices per instance and ``P`` the price of a device. WindVE raises ``C`` from
``C_main`` (the accelerator alone) to ``C_main + C_cpu`` and ``T`` from ``T_main`` to
``T_het`` with the same devices at the same price (the CPU is already in the server, the
paper's premise), so Eq. 6 saves ``1 - C_main / (C_main + C_cpu) = C_cpu / (C_main + C_cpu)``
and Eq. 5 saves ``1 - T_main / T_het``; neither depends on ``N``, ``N_peak``, ``D``, ``P`` or
``n`` (the same ``t_proc``, the main device's, is used for both). The paper's 18.6% is Eq. 6 on
its Table 1 (bge, one Tesla V100 with two Xeon E5 2690, 2 s: ``22 / (96 + 22)``); for the
average case it quotes the throughput increase ``C_cpu / C_main`` (22/96 = 22.9%, printed as
22.3%) as the saving, which Eq. 5 itself turns into ``1 - 96/118`` when ``T`` grows in
proportion to ``C``.

:func:`figures_from_file` reads the measured figures from a ``hwgen windve stress --compare
--json`` report (measured throughputs) or a ``hwgen windve calibrate --json`` report
(throughputs of the fitted lines, ``T = C / (alpha * C + beta)`` per device, summed for
WindVE); :func:`paper_figures` are used without a file. Errors are ConfigError naming the
parameter.
"""

import math

from .. import checks
from ..errors import ConfigError
from .calibrate import read_calibration

__all__ = ["PAPER_TABLE1", "PAPER_T_PROC", "paper_figures", "costs", "figures_from_file",
           "peak_cost", "average_cost", "queries_per_wait"]

#: The paper's Table 1 (bge-large-zh-v1.5, one Tesla V100 with two Xeon E5 2690): SLO (s) ->
#: (FlagEmbedding's concurrency on the V100 alone, the CPU queue's addition with WindVE).
PAPER_TABLE1 = {1.0: (44, 8), 2.0: (96, 22)}
#: The V100's beta in the paper's Fig. 4 (A), seconds: the latency of a lone query.
PAPER_T_PROC = 0.27


def paper_figures(slo=2.0):
    """The figures used without a file, for the SLO 1 or 2 s: the paper's Table 1, ``t_proc``
    its V100 beta (Fig. 4 A) and throughputs ``T = C / SLO`` (each closed-loop round answered
    within the SLO; the paper gives no throughputs). Raises ConfigError naming ``slo``
    otherwise."""
    if slo not in PAPER_TABLE1:
        raise ConfigError("slo", "the paper's Table 1 has the SLOs 1 and 2 s only; give "
                          "--calibration FILE for others", value=slo)
    c_main, c_cpu = PAPER_TABLE1[slo]
    return {"source": f"defaults, no measurement of this machine: the paper's Table 1 at "
                      f"{slo:g} s (bge-large-zh-v1.5, FlagEmbedding on one Tesla V100: "
                      f"{c_main}; WindVE with two Xeon E5 2690: {c_main} + {c_cpu}), t_proc "
                      f"= {PAPER_T_PROC:g} s (the V100's beta, Fig. 4 A), T = C / SLO",
            "slo": float(slo), "main_concurrency": c_main, "cpu_concurrency": c_cpu,
            "main_throughput": c_main / slo, "heterogeneous_throughput": (c_main + c_cpu) / slo,
            "t_proc": PAPER_T_PROC}


def queries_per_wait(slo, t_proc):
    """Equation 4: ``floor((slo - t_proc) / t_proc)`` (0 when a query takes the whole SLO)."""
    checks.positive("slo", slo)
    checks.positive("t_proc", t_proc)
    return max(0, math.floor((slo - t_proc) / t_proc))


def average_cost(queries_per_second, n, throughput, devices=1, price=1.0):
    """Equation 5: ``(N / n) / T * D * P``; None when ``n`` is 0 (no query can wait)."""
    checks.positive("qps", queries_per_second)
    checks.positive("throughput", throughput)
    if n == 0:
        return None
    return queries_per_second / n / throughput * devices * price


def peak_cost(peak, concurrency, devices=1, price=1.0):
    """Equation 6: ``N_peak / C * D * P``."""
    checks.positive("peak", peak)
    checks.positive("concurrency", concurrency)
    return peak / concurrency * devices * price


def _saving(before, after):
    return None if before is None or after is None else 100.0 * (1 - after / before)


def costs(figures, *, peak=1000.0, qps=100.0, devices=1, price=1.0):
    """Equations 4-6 for main-only and WindVE from ``figures`` (keys of
    :func:`paper_figures`). Returns ``{"figures", "parameters", "n", "peak": {"main_only",
    "heterogeneous", "saving_percent"}, "average": {...}, "concurrency_gain_percent",
    "throughput_gain_percent"}``: ``peak`` is Eq. 6, ``average`` Eq. 5 (costs None when
    ``n`` is 0), costs in units of ``P``; ``saving_percent`` is ``100 * (1 - WindVE /
    main-only)``."""
    checks.positive("peak", peak)
    checks.positive("qps", qps)
    checks.at_least("devices_per_instance", devices, 1)
    checks.positive("price", price)
    c_main, c_cpu = figures["main_concurrency"], figures["cpu_concurrency"]
    t_main, t_het = figures["main_throughput"], figures["heterogeneous_throughput"]
    n = queries_per_wait(figures["slo"], figures["t_proc"])
    by_peak = {"main_only": peak_cost(peak, c_main, devices, price),
               "heterogeneous": peak_cost(peak, c_main + c_cpu, devices, price)}
    by_average = {"main_only": average_cost(qps, n, t_main, devices, price),
                  "heterogeneous": average_cost(qps, n, t_het, devices, price)}
    for entry in (by_peak, by_average):
        entry["saving_percent"] = _saving(entry["main_only"], entry["heterogeneous"])
    return {"figures": figures,
            "parameters": {"peak": peak, "qps": qps, "devices_per_instance": devices,
                           "price": price},
            "n": n, "peak": by_peak, "average": by_average,
            "concurrency_gain_percent": 100.0 * c_cpu / c_main,
            "throughput_gain_percent": 100.0 * (t_het / t_main - 1)}


def _number(report, path, name, keys, lo=0.0):
    """``report[keys[0]][keys[1]]...`` as a finite number >= ``lo``; ConfigError naming
    ``name`` (the option the file came from) otherwise."""
    value = report
    for key in keys:
        value = value.get(key) if isinstance(value, dict) else None
    if (isinstance(value, bool) or not isinstance(value, (int, float))
            or not math.isfinite(value) or value < lo):
        raise ConfigError(name, f"{'.'.join(keys)} is {value!r}; expected a number >= {lo:g}",
                          value=str(path))
    return value


def _from_compare(report, path, name):
    main, het = report["main_only"], report["heterogeneous"]
    for what, entry in (("main_only", main), ("heterogeneous", het)):
        if not isinstance(entry, dict):
            raise ConfigError(name, f"{what} is not an object", value=str(path))
    figures = {
        "source": f"measured: {path} (hwgen windve stress --compare; throughputs are 200 "
                  "answers per second at each side's largest concurrency within the SLO)",
        "slo": _number(report, path, name, ["slo"]),
        "main_concurrency": _number(report, path, name, ["main_only", "depth"], 1),
        "cpu_concurrency": _number(report, path, name, ["heterogeneous", "cpu_depth"]),
        "main_throughput": _number(report, path, name, ["main_only", "throughput"]),
        "heterogeneous_throughput": _number(report, path, name,
                                            ["heterogeneous", "throughput"]),
        "t_proc": _number(report, path, name, ["main_only", "t_proc"])}
    for key in ("slo", "main_throughput", "heterogeneous_throughput", "t_proc"):
        if figures[key] <= 0:
            raise ConfigError(name, f"{key} is {figures[key]!r}; expected a number > 0",
                              value=str(path))
    return figures


def _from_calibration(path, slo, name):
    cal = read_calibration(path, slo, name)
    main, cpu = cal["main"], cal["cpu"]
    if cpu is None:
        raise ConfigError(name, "has no 'cpu' device: calibrate with a CPU overflow instance "
                          "(`hwgen windve calibrate --heterogeneous`)", value=str(path))
    if main["depth"] < 1:
        raise ConfigError(name, f"the main device meets the SLO of {cal['slo']:g} s at no "
                          "concurrency (final depth 0)", value=str(path))

    def throughput(d):               # the fitted line's closed loop: C answers per round
        return d["depth"] / (d["alpha"] * d["depth"] + d["beta"]) if d["depth"] else 0.0

    t_main = throughput(main)
    return {"source": f"measured: {path} (hwgen windve calibrate; throughputs of the fitted "
                      "lines, T = C / (alpha * C + beta), the two devices' summed for WindVE: "
                      "each device was profiled alone, so this assumes they share no cores)",
            "slo": cal["slo"], "main_concurrency": main["depth"],
            "cpu_concurrency": cpu["depth"], "main_throughput": t_main,
            "heterogeneous_throughput": t_main + throughput(cpu),
            "t_proc": main["alpha"] + main["beta"]}


def figures_from_file(path, slo=None, name="calibration"):
    """The figures (keys of :func:`paper_figures`) of a ``stress --compare --json`` or a
    ``calibrate --json`` report (for ``slo``, default the file's first SLO; a compare report
    has one and ``slo`` must match it when given). Raises ConfigError naming ``name`` for a
    file that is neither, or ``slo``."""
    report = checks.read_json(path, name)
    if isinstance(report, dict) and "main_only" in report and "heterogeneous" in report:
        figures = _from_compare(report, path, name)
        if slo is not None and slo != figures["slo"]:
            raise ConfigError("slo", f"{path} was measured at the SLO {figures['slo']:g} s",
                              value=slo)
        return figures
    if isinstance(report, dict) and "devices" in report:
        return _from_calibration(path, slo, name)
    raise ConfigError(name, "is neither a `hwgen windve stress --compare --json` report "
                      "(main_only, heterogeneous) nor a `hwgen windve calibrate --json` report "
                      "(devices)", value=str(path))
