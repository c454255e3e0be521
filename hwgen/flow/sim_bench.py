"""``hwgen bench sim``: simulated cycles per wall second of the cocotb and native engines, side by
side in one run, on the same configurations, seeds and stall level.

cocotb's rate is its run's cycles over the testbench's wall time (simulator start included, as a
user waits for it); the native rate is its cycles over the compiled testbench's own loop time.
Both runs are checked against the golden model (a mismatch fails the bench). Builds are cached
and not timed.
"""

from .. import registry
from .simulate import check, simulate

__all__ = ["CASES", "bench_sim"]

#: (accelerator, parameters, cocotb items, native items); the node's items are queries (the
#: digits query pool holds 200)
CASES = (
    ("pq-decoder", {"m": 16, "lut_bits": 16}, 20_000, 2_000_000),
    ("insert-pq", {"k": 16}, 20_000, 1_000_000),
    ("chamvs-node", {}, 4, 200),
)
STALL = 0.2


def bench_sim(echo, *, seed=1, log=None):
    """Print the table; returns the rows (dicts)."""
    rows = []
    echo(f"{'accelerator':<13} {'configuration':<22} {'engine':<7} {'items':>9} {'cycles':>10} "
         f"{'wall s':>7} {'cycles/s':>11} {'mismatches':>10}")
    for name, params, cocotb_items, native_items in CASES:
        acc = registry.get(name)
        cfg = acc.config(**params)
        conf = " ".join(f"{k}={v}" for k, v in params.items()) or "default"
        rates = {}
        for engine, items in (("cocotb", cocotb_items), ("native", native_items)):
            r = simulate(acc, cfg, items=items, seed=seed, stall=STALL, engine=engine, log=log)
            check(r)
            rates[engine] = r["cycles_per_second"]
            wall = r["cycles_run"] / r["cycles_per_second"]
            echo(f"{name:<13} {conf:<22} {engine:<7} {items:>9,} {r['cycles_run']:>10,} "
                 f"{wall:>7.2f} {r['cycles_per_second']:>11,} {r['mismatches']:>10}")
            rows.append({"accelerator": name, "config": params, "engine": engine,
                         "items": items, "cycles": r["cycles_run"], "wall_seconds": wall,
                         "cycles_per_second": r["cycles_per_second"],
                         "mismatches": r["mismatches"]})
        if len(rates) == 2:
            echo(f"{'':<13} {'':<22} native / cocotb = {rates['native'] / rates['cocotb']:.0f}x")
    return rows
