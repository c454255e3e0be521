"""``hwgen bench timing`` (``make timing``): every registered accelerator placed and routed,
written to the table of record and printed beside the recorded "before".

The rows are the registered accelerators at their default configurations plus the
configurations the README's tables and the timing issues' acceptance use
(:data:`BENCH_CONFIGS`). Their place-and-route jobs run on Dask through the sweep machinery
(:func:`hwgen.flow.sweep.run_sweep` with ``"timing"`` entries): a LocalCluster of ``workers``
processes, or a user's scheduler, so more cores or a cluster give the table sooner. Each job
places the block with seeds 1..N (two at a time) and the reference design in the same flow.

A row of the table of record is kept, not placed again, when its Verilog (SHA-256), seeds and
flow (:func:`hwgen.flow.timing.flow_fingerprint`: netlist passes, nextpnr arguments, tool
versions, the reference's Verilog) are this run's and every seed finished: nextpnr is
deterministic, so placing it again would give the same figures. A seed that timed out is
placed again only under a longer ``--pnr-timeout`` than it had. ``remeasure`` (``hwgen bench
timing --remeasure``) places every row regardless.

The measured rows are merged into ``hwgen/flow/timing_results.json``
(:mod:`hwgen.flow.timing_table`), and the README's timing table is regenerated from it when
``readme`` is given. "Before" is a recorded baseline (``timing_baseline.json`` beside this
module): the same flow run on main before the pipelining of issue 11 (commit ``f8831e1``'s
gateware), printed for comparison.
"""

import hashlib
import json
import os
import tempfile
from pathlib import Path

from .. import registry
from . import timing_table
from .emit import emit_accelerator
from .sweep import run_sweep
from .timing import GOAL_RATIO, flow_fingerprint, pnr_timeout_s, timed_out_limit

__all__ = ["bench_timing", "BENCH_CONFIGS", "BASELINE", "NOTES", "SUM_OF_PARTS", "parts_of",
           "row_key", "selected_configs", "kept_rows"]

BASELINE = Path(__file__).with_name("timing_baseline.json")

#: Configurations beyond the defaults: the README tables' and issue 11's acceptance ones.
EXTRA_CONFIGS = [
    ("pq-decoder", ("m=16", "lut_bits=16")),
    ("insert-pq", ("k=16",)),
    ("hier-pq", ("streams=4", "k=10")),
    # The default node (four U250 DDR4 channels of 512 bits, 16 PQ units) needs 332 DP16KD of
    # the 85F's 208, and one U250 channel (95 DP16KD, 28K LUTs) did not finish placement in 40
    # minutes. The same node on one and two U55C HBM channels (256 bits: two PQ units each)
    # with the LUT builder at 4 sub-spaces per cycle fits and places (about 25 minutes a
    # seed). The second size replicates the PQ units instead of the channels: m 32 gives one
    # PQ unit per channel (a code fills the 32-byte word), m 16 two.
    ("chamvs-node", ("board=u55c", "channels=1", "m=32", "lut_sub_par=4")),
    ("chamvs-node", ("board=u55c", "channels=1", "lut_sub_par=4")),
    # The default Linear (8 tiles x 16 PEs: 128 of the 85F's 156 MULT18X18D) does not finish
    # routing within PNR_TIMEOUT_S; two and four tiles are the same pipeline.
    ("ibert-linear", ("tiles=2",)),
    ("ibert-linear", ("tiles=4",)),
    # The attention dot product with 4 PEs (the README's before and after); the default
    # softmax x V (4 PEs x 64 products) needs 256 multipliers of the 85F's 156.
    ("ibert-attn-dot", ("pes=4",)),
    ("ibert-softmax-matmul", ("head_dim=32", "pes=1")),
    ("ibert-softmax-matmul", ("head_dim=32", "pes=2")),
    # The default LUT builder (16 sub-spaces of 8 dimensions, all in one cycle: 128 squarers,
    # 128 of the 85F's 156 MULT18X18D) placed at 60-120 s per HeAP iteration; 4 and 8
    # sub-spaces of the same 8 dimensions are the same lanes, one row per cycle.
    ("lut-builder", ("dim=32", "m=4")),
    ("lut-builder", ("dim=64", "m=8")),
]
BENCH_CONFIGS = [(name, ()) for name in registry.names()] + EXTRA_CONFIGS

#: Blocks too large for the 85F, measured as the sum of their parts (issue 30 item 2): the
#: fitting configurations in :data:`EXTRA_CONFIGS` stand for them (two sizes at least).
SUM_OF_PARTS = ("chamvs-node", "ibert-linear", "ibert-softmax-matmul", "lut-builder")
#: Notes printed under the README's table (kept in the table of record).
NOTES = {
    "chamvs-node": "the default node (four U250 channels: 332 DP16KD) does not fit the "
                   "LFE5U-85F, and one U250 channel (95 DP16KD, 28K LUTs) did not finish "
                   "placement in 40 minutes; the node on one U55C HBM channel (256-bit words) "
                   "with the LUT builder at 4 sub-spaces per cycle stands for it, with two PQ "
                   "units (m 16) and one (m 32). Both were at 0.355 on the channel's AXI read "
                   "master (29 carry steps from the burst length through the credit check); "
                   "the master was rebuilt (hwgen/lib/axi.py: burst lengths prepared in "
                   "registers a cycle ahead, the credit check one carry chain between "
                   "registers, skid registers on commands and bursts, read data through a "
                   "BlockRAMFIFO whose block-RAM reads are registered; alone, 256-bit words: "
                   "71.4 -> 139.5 MHz, ratio 1.02, within the UltraScale+ goal) and the "
                   "node's query handshake no longer enables its wide registers. Both rows "
                   "are still below the goal, on paths with 0 to 5 logic levels that route "
                   "for 3 to 7 ns in the full node: with m 32 a PQ unit's LUT block RAM into "
                   "its register (5.83 ns clock-to-out, then 3.2 ns of routing; the unit "
                   "alone routes it in 1.7 ns), with m 16 the read master's credit or "
                   "last-burst decision (one carry chain, 4-5 LUTs, 70% routing). One seed of "
                   "each did not finish routing within the flow's 1,200 s, nor when run "
                   "again for longer (m 32 seed 2: 1,800 s, still 254 overused wires; m 16 "
                   "seed 3: 960 s, 2,174 left; two seeds shared the 2-core machine), so "
                   "each median is of two seeds",
    "maxsim": "all three seeds routed with --pnr-timeout 4000 (seed 1 in 3,830 s, seed 3 in "
              "about 3,300 s; 128 of the 85F's 156 MULT18X18D, two seeds sharing the 2-core "
              "machine; within the flow's default 1,200 s neither finished): 119.57 / "
              "131.15 / 124.91 MHz. "
              "Each lane's term (its maximum, zero past the query's length) is now a "
              "register ahead of the lane-sum adder, and which lanes hold query tokens is "
              "compared once and carried as bits: the critical path left is a product into "
              "the dot product's adder tree, 79% routing",
    "ibert-linear": "the default (8 tiles x 16 PEs, 128 of the 85F's 156 MULT18X18D) did not "
                    "finish routing within the flow's 1,200 s per seed; `ibert-linear tiles=2` "
                    "and `tiles=4` (the same Tile pipeline, 32 and 64 multipliers) stand for "
                    "it: equal ratios show that the critical path does not grow with the "
                    "tiles",
    "ibert-attn-dot": "K now lives in head_dim / 4 word memories shared by the PEs (16 "
                      "DP16KD at any PE count; before, a row-wide memory per PE: 240 at the "
                      "default 16 PEs, which did not place in 25 minutes), so the default is "
                      "placed and routed itself. It is below the goal on a K block RAM's "
                      "output into its word register (5.83 ns clock-to-out, then 2.3-2.6 ns of "
                      "routing); `pes=4` meets it on the same path (1.7 ns of routing)",
    "ibert-softmax-matmul": "the default (4 PEs x 64 products: 256 multipliers) does not fit "
                            "the 85F's 156 MULT18X18D; `head_dim=32` with `pes=1` and "
                            "`pes=2` (32 and 64 multipliers, the same PE pipeline) stand for it",
    "lut-builder": "the default (16 sub-spaces of 8 dimensions in one cycle: 128 of the 85F's "
                   "156 MULT18X18D) placed at 60-120 s per HeAP iteration and was not routed; "
                   "`lut-builder dim=32 m=4` and `dim=64 m=8` (4 and 8 of the same lanes, one "
                   "row per cycle: 32 and 64 multipliers) stand for it. Its critical path is "
                   "a centroid block RAM's output (5.83 ns clock-to-out) into its register, "
                   "no logic to remove: with nextpnr's default HeAP placer the register "
                   "landed 2.4-2.6 ns of routing away (0.893 and 0.877), so the block is "
                   "placed with the analytic static placer (`pnr_options` in the registry), "
                   "and so is the reference in the same run (137.8-138.0 MHz with it, "
                   "135.6-137.8 with HeAP)",
    "systolic-pq": "the paper's compare-swap array (ChamVS's systolic priority queue decides "
                   "and swaps 64-bit keys in one cycle), kept as the paper's reference; "
                   "hwgen's own designs use insertion queues (`hier-pq`'s default), which "
                   "meet the goal",
}


def row_key(name, sets):
    """Row name of a bench configuration: the accelerator ``name``, then its ``--set`` strings."""
    return name + (" " + " ".join(sets) if sets else "")


def selected_configs(names=None):
    """The :data:`BENCH_CONFIGS` that ``names`` picks (every one when empty): an accelerator
    name picks all its rows, a row name (:func:`row_key`) that row alone."""
    return [(n, s) for n, s in BENCH_CONFIGS
            if not names or n in names or row_key(n, s) in names]


def parts_of(name):
    """The row names standing for ``name``'s default when it is measured as the sum of its
    parts (:data:`SUM_OF_PARTS`): its configurations in :data:`EXTRA_CONFIGS`."""
    return [row_key(n, s) for n, s in EXTRA_CONFIGS if n == name]


def _parts_row(name, seeds, table):
    """The row of ``name``'s default configuration when it is not placed and routed: an
    unmeasured row (no Fmax, no ratio) naming the rows that stand for it and their ratios in
    ``table``."""
    said = []
    for part in parts_of(name):
        row = table["rows"].get(part)
        said.append(f"`{part}` " + ("not measured" if row is None or "error" in row
                                    else timing_table.ratio_text(row["fmax_ratio"])))
    cfg = registry.get(name).make_config([])
    return timing_table.error_row(
        name, name, cfg.to_dict(), cfg.digest(), None, seeds,
        "sum of its parts, the default not placed and routed (too large for the 85F or "
        "the flow's time limit; `hwgen bench timing --place-large` tries it): "
        + ", ".join(said))


def _seeds_final(row, timeout_s):
    """Whether ``row``'s failed seeds would fail again: each one timed out with a limit of at
    least ``timeout_s`` (nextpnr is deterministic, so the same netlist and seed stop at the
    same point; a longer limit may let it finish). Any other failure is placed again."""
    limits = [timed_out_limit(e) for e in (row.get("failed_seeds") or {}).values()]
    return all(limit is not None and limit >= timeout_s for limit in limits)


def kept_rows(configs, seeds, table, flow=None, timeout_s=None):
    """The rows of ``table`` that need no new place and route, by row name: measured (no
    error) with seeds 1..``seeds``, the flow fingerprint ``flow`` (default: this machine's
    with the block's own nextpnr options, :func:`~hwgen.flow.timing.flow_fingerprint`) and the Verilog that their configuration
    emits now, and no seed that this run could finish where the recorded one did not: a seed
    that timed out is placed again only when the limit ``timeout_s`` (default:
    :func:`~hwgen.flow.timing.pnr_timeout_s`, ``--pnr-timeout``) is longer than the one it
    ran under."""
    want = list(range(1, seeds + 1))
    timeout_s = timeout_s or pnr_timeout_s()
    candidates = [(key, name, sets, row) for name, sets in configs
                  if (row := table["rows"].get(key := row_key(name, sets)))
                  and "error" not in row and row.get("flow") and row.get("seeds") == want
                  and _seeds_final(row, timeout_s)]
    if not candidates:
        return {}
    kept = {}
    with tempfile.TemporaryDirectory(prefix="hwgen-timing-sha-") as tmp:
        for i, (key, name, sets, row) in enumerate(candidates):
            acc = registry.get(name)
            if row["flow"] != (flow or flow_fingerprint(options=acc.pnr_options)):
                continue
            v_path, _ = emit_accelerator(acc, acc.make_config(list(sets)), Path(tmp) / str(i))
            if hashlib.sha256(v_path.read_bytes()).hexdigest() == row["verilog_sha256"]:
                kept[key] = row
    return kept


def _fmt(v, spec):
    return format(v, spec) if v is not None else format("-", ">" + spec.split(".")[0])


def _before_depth(b):
    if not b or b.get("us_lut_levels") is None:
        return "-"
    return timing_table.depth_text({"lut_levels": b["us_lut_levels"],
                                    "carry_chains": b["us_carry_chains"],
                                    "dsp_ram_levels": b.get("us_dsp_ram_levels")})


def _entries(configs, seeds):
    """The sweep spec: one place-and-route entry per configuration, no simulations."""
    entries = []
    for name, sets in configs:
        cfg = registry.get(name).make_config(list(sets))
        entries.append({"accelerator": name, "configs": [cfg.to_dict()], "seeds": [],
                        "timing": seeds})
    return entries


def _table_row(key, name, sets, job, seeds):
    """The table row of one finished (or failed) timing job."""
    acc = registry.get(name)
    cfg = acc.make_config(list(sets))
    report = job.get("report")
    if report and report.get("fmax_mhz"):
        return timing_table.row_from_report(key, report, cfg.digest())
    error = job.get("error") or (f"every seed failed: {report['failed_seeds']}" if report
                                 else "no result")
    return timing_table.error_row(key, name, cfg.to_dict(), cfg.digest(),
                                  (report or {}).get("verilog_sha256"), seeds,
                                  error)


def _print_row(echo, key, before, row, kept=False):
    b = before or {}
    ratio = row.get("fmax_ratio")
    us = row.get("ultrascale") or {}
    goal = "-" if ratio is None else ("ok" if ratio >= GOAL_RATIO else "below")
    if us.get("goal_met") is False and goal == "ok":
        goal = "ok (US+ depth over)"
    echo(f"{key:<34} {_fmt(b.get('fmax_mhz'), '10.1f')} {_fmt(b.get('fmax_ratio'), '6.3f')} "
         f"{_fmt(row.get('fmax_mhz'), '9.1f')} {_fmt(ratio, '6.3f')} "
         f"{_before_depth(before):>16} {timing_table.depth_text(us):>9}  {goal}"
         + (f"  ({row['error']})" if "error" in row else "")
         + (f"  (kept: measured {row['measured']['date']})" if kept else ""))


def bench_timing(echo, *, seeds=3, names=None, json_path=None, log=None, workers=None,
                 scheduler=None, results=None, readme=None, out_dir=None, place_large=False,
                 remeasure=False):
    """Measure every row on Dask, merge them into ``results`` (the table of record), regenerate
    the README's table when ``readme`` is given, print the before/after table; returns the
    printed rows (``block``, ``before``, ``after``: the table row).

    The defaults of the :data:`SUM_OF_PARTS` blocks are not placed and routed unless
    ``place_large`` (each would take the flow's time limit per seed, or fails to fit): their
    rows name the measured rows that stand for them. Rows measured before with the same
    Verilog, seeds and flow are kept (:func:`kept_rows`) unless ``remeasure``."""
    baseline = json.loads(BASELINE.read_text()) if BASELINE.exists() else {"rows": {}}
    selected = selected_configs(names)
    large = [] if place_large else [n for n, s in selected if not s and n in SUM_OF_PARTS]
    configs = [(n, s) for n, s in selected if s or n not in large]
    kept = {} if remeasure else kept_rows(configs, seeds, timing_table.load(results))
    placed = [(n, s) for n, s in configs if row_key(n, s) not in kept]
    # each job runs two place-and-route seeds at a time: one worker per two cores
    workers = workers or max(1, (os.cpu_count() or 2) // 2)
    out = Path(out_dir) if out_dir else Path(tempfile.mkdtemp(prefix="hwgen-timing-"))
    echo(f"hwgen bench timing: {len(placed)} configurations on ECP5 LFE5U-85F out of context, "
         f"seeds 1..{seeds} (median), ratio to the reference placed in the same run; Dask: "
         f"{'scheduler ' + scheduler if scheduler else f'{workers} local worker(s)'}")
    if kept:
        echo(f"  {len(kept)} rows kept from the table of record (same Verilog, seeds and flow; "
             "--remeasure places them again): " + ", ".join(kept))
    jobs = run_sweep(_entries(placed, seeds), out, scheduler=scheduler, workers=workers,
                     echo=log or (lambda _: None)) if placed else []
    by_index = {j["job"]: j for j in jobs}
    by_config = {row_key(n, s): by_index.get(i, {}) for i, (n, s) in enumerate(placed)}
    head = (f"{'block (config)':<34} {'before MHz':>10} {'ratio':>6} {'after MHz':>9} "
            f"{'ratio':>6} {'US+ depth before':>16} {'after':>9}  goal")
    echo(f"before = {baseline.get('source', '-')}")
    echo(head)
    echo("-" * len(head))
    rows, table_rows = [], []
    for name, sets in configs:
        key = row_key(name, sets)
        row = kept.get(key) or _table_row(key, name, sets, by_config[key], seeds)
        before = baseline["rows"].get(key)
        _print_row(echo, key, before, row, kept=key in kept)
        rows.append({"block": key, "before": before, "after": row})
        table_rows.append(row)
    merged = timing_table.merge(timing_table.load(results), table_rows)
    for name in large:
        row = _parts_row(name, seeds, merged)
        _print_row(echo, name, baseline["rows"].get(name), row)
        rows.append({"block": name, "before": baseline["rows"].get(name), "after": row})
        table_rows.append(row)
    met = sum(1 for r in table_rows if (r.get("fmax_ratio") or 0) >= GOAL_RATIO)
    depth = sum(1 for r in table_rows if (r.get("ultrascale") or {}).get("goal_met"))
    echo(f"{met} of {len(rows)} rows at fmax_ratio >= {GOAL_RATIO}, {depth} within the "
         "UltraScale+ depth goal (LUT levels + carry chains, + DSP/RAM levels, on the longest "
         "register-to-register path)")
    table = timing_table.merge(timing_table.load(results), table_rows,
                               order=[row_key(n, s) for n, s in BENCH_CONFIGS], notes=NOTES)
    timing_table.save(table, results)
    echo(f"wrote {results or timing_table.RESULTS} ({len(table['rows'])} rows)")
    if readme:
        timing_table.update_readme(readme, table)
        echo(f"regenerated the timing table of {readme}")
    if json_path:
        Path(json_path).write_text(json.dumps({"seeds": seeds, "rows": rows}, indent=2) + "\n")
    return rows
