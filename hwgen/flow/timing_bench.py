"""``hwgen bench timing``: every registered accelerator placed and routed, before and after.

"Before" is a recorded baseline (``timing_baseline.json`` beside this module): the same
``hwgen timing`` flow run on main before the pipelining of issue 11 (commit ``f8831e1``'s
gateware). "After" is measured now, on this tree, with the same tools and seeds. Each row is a
registered accelerator at its default configuration, plus the configurations the README's
tables and the issue's acceptance use.
"""

import json
from pathlib import Path

from .. import registry
from ..errors import HwgenError
from .timing import GOAL_RATIO, measure_timing

__all__ = ["bench_timing", "BENCH_CONFIGS", "BASELINE", "row_key"]

BASELINE = Path(__file__).with_name("timing_baseline.json")

#: Configurations beyond the defaults: the README tables' and issue 11's acceptance ones.
EXTRA_CONFIGS = [
    ("pq-decoder", ("m=16", "lut_bits=16")),
    ("insert-pq", ("k=16",)),
    ("hier-pq", ("streams=4", "k=10")),
    # The default node (four U250 DDR4 channels, 16 PQ units) needs 332 DP16KD of the 85F's
    # 208: one channel's share is what the ECP5 can hold.
    ("chamvs-node", ("channels=1",)),
]
BENCH_CONFIGS = [(name, ()) for name in registry.names()] + EXTRA_CONFIGS


def row_key(name, sets):
    """Row name of a bench configuration: the accelerator ``name``, then its ``--set`` strings."""
    return name + (" " + " ".join(sets) if sets else "")


def _summary(report):
    us = report.get("ultrascale") or {}
    cp = report.get("critical_path") or {}
    return {
        "fmax_mhz": report["fmax_mhz"],
        "reference_mhz": report["reference"]["fmax_mhz"],
        "fmax_ratio": report["fmax_ratio"],
        "critical_path": f"{cp.get('from')} -> {cp.get('to')}, {cp.get('logic_levels')} "
                         f"levels, routing {cp.get('routing_share', 0):.0%}" if cp else None,
        "us_lut_levels": us.get("lut_levels"),
        "us_carry_chains": us.get("carry_chains"),
        "us_dsp_ram_levels": us.get("dsp_ram_levels"),
        "us_goal_met": us.get("goal_met"),
    }


def _fmt(v, spec):
    return format(v, spec) if v is not None else format("-", ">" + spec.split(".")[0])


def _depth(s):
    if not s or s.get("us_lut_levels") is None:
        return "-"
    extra = f"+{s['us_dsp_ram_levels']}d" if s.get("us_dsp_ram_levels") else ""
    return f"{s['us_lut_levels']}L+{s['us_carry_chains']}c{extra}"


def bench_timing(echo, *, seeds=2, names=None, json_path=None, log=None):
    """Measure every row, print the before/after table; returns the rows."""
    baseline = json.loads(BASELINE.read_text()) if BASELINE.exists() else {"rows": {}}
    rows = []
    configs = [(n, s) for n, s in BENCH_CONFIGS if not names or n in names]
    echo(f"hwgen bench timing: ECP5 LFE5U-85F out of context, seeds 1..{seeds} (median), "
         f"ratio to the reference placed in the same run; before = {baseline.get('source', '-')}")
    head = (f"{'block (config)':<34} {'before MHz':>10} {'ratio':>6} {'after MHz':>9} "
            f"{'ratio':>6} {'US+ depth before':>16} {'after':>9}  goal")
    echo(head)
    echo("-" * len(head))
    for name, sets in configs:
        key = row_key(name, sets)
        before = baseline["rows"].get(key)
        acc = registry.get(name)
        try:
            after = _summary(measure_timing(acc, acc.make_config(list(sets)), seeds=seeds,
                                            log=log))
        except HwgenError as e:
            after = {"error": str(e).splitlines()[0]}
        ratio = after.get("fmax_ratio")
        goal = "-" if ratio is None else ("ok" if ratio >= GOAL_RATIO else "below")
        if after.get("us_goal_met") is False and goal == "ok":
            goal = "ok (US+ depth over)"
        b = before or {}
        echo(f"{key:<34} {_fmt(b.get('fmax_mhz'), '10.1f')} {_fmt(b.get('fmax_ratio'), '6.3f')} "
             f"{_fmt(after.get('fmax_mhz'), '9.1f')} {_fmt(ratio, '6.3f')} "
             f"{_depth(before):>16} {_depth(after):>9}  {goal}"
             + (f"  ({after['error']})" if "error" in after else ""))
        rows.append({"block": key, "before": before, "after": after})
    met = sum(1 for r in rows if (r["after"].get("fmax_ratio") or 0) >= GOAL_RATIO)
    echo(f"{met} of {len(rows)} rows at fmax_ratio >= {GOAL_RATIO}; US+ depth: LUT levels + "
         f"carry chains (+ DSP/RAM levels) on the longest register-to-register path")
    if json_path:
        Path(json_path).write_text(json.dumps({"seeds": seeds, "rows": rows}, indent=2) + "\n")
    return rows
