"""``hwgen bench recsys``: the recommendation performance model against simulation, the
placement's lookup figures, and the paper's 1-, 2- and 4-node designs predicted beside the
paper's measurements (model and assumptions: :mod:`hwgen.recsys.perf`).

1. **Model vs simulation.** A few ``recsys-fc`` and ``recsys-embedding`` test configurations
   (the ones ``tests/test_sim.py`` simulates, so their Verilator builds are shared) run at
   ``--stall 0`` with 1 and with ``n`` inferences. Measured cycles per inference = (cycles of
   ``n`` - cycles of 1) / (n - 1); latency = first input handshake to first output beat. The
   FC model is :meth:`FCConfig.performance`; the lookup unit's is
   :meth:`EmbeddingConfig.performance` with the testbench memory's AR-to-R latency, which the
   model does not know: it is calibrated once, on the first embedding configuration's latency
   (that row's latency error is 0 by construction; the other rows are a check). The bench
   fails if any error exceeds 5%.
2. **Placement** of ``paper-ctr`` on the U280 at 135 MHz and the lookup stage of the unit.
3. **CPU measured here** (``--cpu``, :mod:`hwgen.recsys.cpu_baseline`): the model's inference
   in PyTorch on this machine's CPU at batch 1 and a large batch, beside the paper's CPU.
4. **Designs**: CPU, 1, 2 and 4 nodes: clock, predicted inferences/s and latency, speed-up
   over the paper's CPU, the paper's speed-up and latency, the ratios, and (with ``--cpu`` on
   paper-ctr) the speed-up over the CPU measured here.
"""

from .. import registry
from ..flow.simulate import simulate
from ..flow.timing_table import measured_clock, ratio_text
from . import embedding as embedding_mod
from . import fc as fc_mod
from .model import preset
from .cpu_baseline import report_lines as cpu_report_lines
from .cpu_baseline import run_cpu_baseline, threads_text
from .perf import (HOP_LATENCY_NS, LANES, MULTS_PER_PE, PAPER_CPU, cpu_inferences_per_s,
                   lookup_stage, paper_designs)
from .placement import place

__all__ = ["bench_recsys", "FC_CASES", "EMBEDDING_CASES", "measure", "model_vs_simulation"]

#: Test configurations simulated by the bench (indices into the TEST_CONFIGS): FC: the issue's
#: odd size 100 -> 37 on 8 PEs (compute bound), 16-bit odd sizes, one output per beat (output
#: bound); lookup unit: the 13-table model (output bound) and the one-HBM-channel model
#: (channel bound).
FC_CASES = (0, 2, 5)
EMBEDDING_CASES = (0, 3)
#: Inferences of the long run.
FC_ITEMS = 24
EMBEDDING_ITEMS = 40
#: Largest allowed model error.
TOLERANCE = 0.05


def measure(acc, cfg, items, seed=5):
    """Simulate 1 and ``items`` inferences at stall 0: ``(cycles per inference, latency,
    mismatches)``."""
    runs = [simulate(acc, cfg, items=n, seed=seed, stall=0.0) for n in (1, items)]
    bad = sum(r["mismatches"] for r in runs) + sum(bool(r["timeout"]) for r in runs)
    per = (runs[1]["cycles"] - runs[0]["cycles"]) / (items - 1)
    return per, runs[0]["latency_cycles"], bad


def _err(model, sim):
    return abs(model - sim) / sim if sim else float("inf")


def model_vs_simulation(echo=print, fc_cases=FC_CASES, embedding_cases=EMBEDDING_CASES):
    """Rows ``{block, config, model/sim cycles per inference and latency, errors}``; echoes a
    progress line per simulated configuration."""
    rows = []
    acc = registry.get("recsys-fc")
    for i in fc_cases:
        values = fc_mod.TEST_CONFIGS[i]
        cfg = acc.config.from_dict(values)
        echo(f"  simulating recsys-fc {_short(values)} (1 and {FC_ITEMS} inferences) ...")
        per, lat, bad = measure(acc, cfg, FC_ITEMS)
        perf = cfg.performance(cfg.workload(inferences=FC_ITEMS))
        rows.append(_row_of("recsys-fc", values, perf["cycles_per_inference"], per,
                            perf["latency_cycles"], lat, bad))
    acc = registry.get("recsys-embedding")
    memory_latency = None
    for i in embedding_cases:
        values = embedding_mod.TEST_CONFIGS[i]
        cfg = acc.config.from_dict(values)
        echo(f"  simulating recsys-embedding {_short(values)} (1 and {EMBEDDING_ITEMS} "
             "inferences) ...")
        per, lat, bad = measure(acc, cfg, EMBEDDING_ITEMS)
        note = ""
        if memory_latency is None:
            memory_latency = lat - cfg.performance(cfg.workload(memory_latency=0)).latency_cycles
            note = f"testbench memory latency calibrated here: {memory_latency} cycles"
        perf = cfg.performance(cfg.workload(items=EMBEDDING_ITEMS,
                                               memory_latency=memory_latency))
        rows.append(_row_of("recsys-embedding", values, perf["initiation_interval"], per,
                            perf["latency_cycles"], lat, bad, note))
    return rows


def _short(values):
    return "{" + ", ".join(f"{k}={v}" for k, v in values.items()) + "}" if values else \
        "(default)"


def _row_of(block, values, model_ii, sim_ii, model_lat, sim_lat, bad, note=""):
    return {"block": block, "config": _short(values), "model_ii": model_ii, "sim_ii": sim_ii,
            "ii_error": _err(model_ii, sim_ii), "model_latency": model_lat,
            "sim_latency": sim_lat, "latency_error": _err(model_lat, sim_lat),
            "mismatches": bad, "note": note}


def _table(echo, header, rows):
    echo("| " + " | ".join(header) + " |")
    echo("| " + " | ".join("---" for _ in header) + " |")
    for r in rows:
        echo("| " + " | ".join(str(c) for c in r) + " |")


def _rate(x):
    return f"{x:,.0f}"


def _simulation_section(echo):
    """Echo the cycle models against Verilator; ``(rows, ok)``."""
    echo("Cycle models against Verilator (--stall 0; cycles per inference from runs of 1 "
         "and n inferences, latency = first input to first output beat)")
    rows = model_vs_simulation(echo)
    _table(echo, ["block", "configuration", "cycles/inference model", "sim", "error",
                  "latency model", "sim", "error", "mismatches"],
           [[r["block"], r["config"] + (f" ({r['note']})" if r["note"] else ""),
             f"{r['model_ii']:.2f}", f"{r['sim_ii']:.2f}", f"{100 * r['ii_error']:.2f}%",
             r["model_latency"], r["sim_latency"], f"{100 * r['latency_error']:.2f}%",
             r["mismatches"]] for r in rows])
    worst = max(max(r["ii_error"], r["latency_error"]) for r in rows)
    bad = [r for r in rows if r["mismatches"] or max(r["ii_error"], r["latency_error"])
           > TOLERANCE]
    echo(f"largest model error {100 * worst:.2f}% (limit {100 * TOLERANCE:.0f}%): "
         + ("PASS" if not bad else "FAIL: " + ", ".join(r["config"] for r in bad)))
    echo("")
    return rows, not bad


def _placement_section(echo, model):
    """Echo the placement of ``model`` on the U280 at 135 MHz and its lookup stage."""
    p = place(model, "u280", clock_mhz=135)
    lk = lookup_stage(p)
    echo("Embedding placement of paper-ctr (tables assumed, see hwgen.recsys.model.paper_ctr) "
         "on u280 at 135 MHz (memory model: hwgen.recsys.placement)")
    echo(p.summary())
    echo(f"lookup unit ({LANES} elements per output beat): one inference every "
         f"{lk['initiation_interval']:g} cycles ({lk['output_beats']} output beats; busiest "
         f"channel {lk['busiest_channel_beats']} words) = "
         f"{_rate(135e6 / lk['initiation_interval'])} inferences/s; query to last beat "
         f"{lk['inference_cycles']} cycles = {lk['inference_cycles'] * 1e3 / 135:.0f} ns "
         f"(memory {lk['memory_latency_cycles']} cycles)")
    echo("")


def _cpu_section(echo, cpu, log):
    """Run the CPU baseline with the options ``cpu`` (:func:`run_cpu_baseline`'s) and echo
    it beside the paper's CPU; returns its result."""
    result = run_cpu_baseline(**cpu, log=log)
    for line in cpu_report_lines(result):
        echo(line)
    paper = {1: PAPER_CPU["batch1_latency_ms"] * 1e-3,
             PAPER_CPU["batch"]: PAPER_CPU["latency_ms"] * 1e-3}
    here = (f"{result['machine']}; {result['framework']}, {threads_text(result['threads'])}; "
            f"{result['model']}, tables {result['tables']['mode']}")
    rows = []
    for r in result["runs"]:
        same = paper.get(r["batch"]) if result["model"] == "paper-ctr" else None
        rows.append([here, "measured here", r["batch"], _rate(r["inferences_per_s"]),
                     f"{r['median_s'] * 1e3:.3f} ({r['p10_s'] * 1e3:.3f}-"
                     f"{r['p90_s'] * 1e3:.3f})",
                     f"{r['inferences_per_s'] * same / r['batch']:.3f}" if same else "-"])
    for batch, seconds in paper.items():
        rows.append([PAPER_CPU["machine"], "the paper (section IV-C)", batch,
                     _rate(batch / seconds), f"{seconds * 1e3:g}", "1"])
    _table(echo, ["CPU", "figure from", "batch", "inferences/s",
                  "ms per batch (median, p10-p90 here)", "rate / paper's at the same batch"],
           rows)
    echo("")
    return result


def _design_row(d, paper, cpu, measured, here):
    """One row of the designs table: ``d`` the prediction, ``paper`` the paper's figures,
    ``cpu`` the paper's CPU rate, ``measured`` the ECP5 ratio, ``here`` the CPU rate measured
    on this machine (None: no column)."""
    speed = d.inferences_per_s / cpu
    paper_cycles = d.clocks[0] * 1e6 / (paper["speedup"] * cpu)
    lat = paper["latency_us"]
    row = [
        paper["label"], "/".join(f"{c:g}" for c in d.clocks),
        "/".join(map(str, d.layer_pes)) + " (DSP " + "+".join(map(str, d.node_dsp))
        + "; paper " + "+".join(map(str, paper["dsp"])) + ")",
        d.bottleneck, _rate(d.inferences_per_s),
        _rate(d.inferences_per_s * min(measured["ratio"], 1.0)) if measured["ratio"]
        else "not measured",
        f"{d.clocks[0] * 1e6 / d.inferences_per_s:.0f} / {paper_cycles:.0f}",
        f"{d.latency_ns / 1e3:.2f}", f"{speed:.2f}", f"{paper['speedup']:g}",
        f"{speed / paper['speedup']:.2f}"]
    if here:
        row.append(f"{d.inferences_per_s / here:.2f}")
    return row + [f"{lat:g}" if lat else "not given",
                  f"{d.latency_ns / 1e3 / lat:.2f}" if lat else "-"]


def _cpu_rows(cpu, cpu_result, here):
    """The CPU rows of the designs table: the paper's, and the best rate measured here."""
    rows = [[f"{PAPER_CPU['label']} (the paper's CPU)", f"{PAPER_CPU['clock_mhz']:g}", "-",
             "-", f"{_rate(cpu)} (paper)", "-", "-", "-", "1", "1", "-"]
            + ([f"{cpu / here:.2f}"] if here else [])
            + [f"{PAPER_CPU['latency_ms'] * 1e3:g}", "-"]]
    if cpu_result:
        best = cpu_result["best"]
        rows.append([f"CPU measured here ({cpu_result['machine']}, "
                     f"{threads_text(cpu_result['threads'])}), {cpu_result['model']}, batch "
                     f"{best['batch']}", "-", "-", "-",
                     f"{_rate(best['inferences_per_s'])} (measured)", "-", "-",
                     f"{best['median_s'] * 1e6:.0f}",
                     f"{best['inferences_per_s'] / cpu:.3f}" if here else "-", "-", "-"]
                    + (["1"] if here else []) + ["-", "-"])
    return rows


def _designs_section(echo, model, cpu_result):
    """Echo the predicted designs beside the paper (and beside the CPU measured here when
    ``cpu_result`` ran paper-ctr); returns ``(designs, JSON rows)``."""
    cpu = cpu_inferences_per_s()
    here = cpu_result["best"]["inferences_per_s"] if cpu_result and \
        cpu_result["model"] == model.name else None
    designs = paper_designs(model)
    echo(f"Predicted designs (hwgen partition, {MULTS_PER_PE} multipliers per 18-DSP PE, "
         f"100 Gb/s links, {HOP_LATENCY_NS / 1e3:g} us per hop assumed) beside the paper "
         "(Zhu et al., section IV); the paper's speed-ups are over its CPU, " + _rate(cpu)
         + " inferences/s (1024 in 31.72 ms)" + (
             f"; the last speed-up column is over the CPU measured here, {_rate(here)} "
             f"inferences/s at batch {cpu_result['best']['batch']}" if here else ""))
    measured = measured_clock({"recsys-fc", "recsys-embedding"}, 1.0)   # ratio only
    table = _cpu_rows(cpu, cpu_result, here)
    json_rows = []
    for nodes, (d, paper) in designs.items():
        table.append(_design_row(d, paper, cpu, measured, here))
        json_rows.append({**d.to_dict(), "label": paper["label"], "paper": paper,
                          "speedup_over_paper_cpu": d.inferences_per_s / cpu,
                          "speedup_over_measured_cpu": d.inferences_per_s / here if here
                          else None})
    _table(echo, ["design", "clock MHz (the paper's, declared)", "PEs L1/L2/L3", "bottleneck",
                  "inferences/s", "inferences/s at the clock x measured ratio",
                  "cycles/inference model / paper (node 1 clock)", "latency us",
                  "speed-up model over the paper's CPU", "paper's speed-up over its CPU",
                  "model/paper"] + (["speed-up model over the CPU measured here"] if here
                                    else []) + ["paper latency us", "latency model/paper"],
           table)
    if cpu_result and not here:
        echo(f"(the CPU ran {cpu_result['model']}, not {model.name}: no speed-up over it)")
    echo("Measured ratio: " + (f"{ratio_text(measured['ratio'])} ({measured['block']}, the "
                               "slower of recsys-fc and recsys-embedding on ECP5, "
                               "hwgen/flow/timing_results.json)" if measured["ratio"] else
                               "recsys-fc and recsys-embedding have no row in "
                               "hwgen/flow/timing_results.json yet (make timing)"))
    echo("")
    return designs, json_rows


def _notes(echo, designs):
    """Echo the latency parts, the per-hop latency the paper's figures imply, and what the
    model is."""
    echo("Latency parts of the model (ns): " + "; ".join(
        f"{nodes} node{'s' if nodes > 1 else ''}: " + ", ".join(
            f"{k} {v:.0f}" for k, v in d.latency_parts.items())
        for nodes, (d, _) in designs.items()))
    for nodes, (d, paper) in designs.items():
        if paper["latency_us"] and d.hops:
            implied = (paper["latency_us"] * 1e3 - d.compute_latency_ns) / d.hops
            echo(f"{nodes} nodes: the paper's {paper['latency_us']:g} us would need "
                 f"{implied / 1e3:.2f} us per hop over the {d.hops} hops of the chain "
                 f"(model assumes {HOP_LATENCY_NS / 1e3:g} us; the paper: 'within several "
                 "microseconds')")
    cpu = cpu_inferences_per_s()
    ratios = [d.inferences_per_s / cpu / paper["speedup"] for d, paper in designs.values()]
    echo(f"The model predicts hwgen's fully pipelined design: each PE share needs max(R*S, "
         f"beats) cycles per inference. The paper's HLS designs measure "
         f"{min(ratios):.1f}-{max(ratios):.1f}x fewer inferences/s than that bound at the "
         "same clocks and (4 nodes) the same PE counts. The paper says its 4-node design "
         "computes at about its embedding lookup rate (Fig. 6) without saying what limits the "
         "lookups; a unit that issues each channel's reads one after another, each waiting "
         "for the memory (a common HLS pattern), would, but this is a guess, and the model "
         "assumes one read request per cycle per channel, as hwgen's unit does. PE counts: "
         "hwgen's partition rounds the layer ratios to 8:4:1 for every node count; the "
         "paper's 2-node DSPs (8064 + 8073) are 448 PEs a node (e.g. 512/256/128), and its "
         "single node (MicroRec) used 5193 DSPs (57.55%, BRAM-limited, section III-C1), "
         "while hwgen's 1-node partition takes 83%.")


def bench_recsys(echo=print, simulate_blocks=True, cpu=None, log=lambda message: None):
    """Run the bench (see module docstring).

    ``cpu``: None, or the options of :func:`hwgen.recsys.cpu_baseline.run_cpu_baseline`
    (``preset_name``, ``batches``, ``seconds``, ``threads``, ``tables``, ``directory``,
    ``seed``) to measure the CPU baseline on this machine too; ``log`` gets its progress
    lines. Returns a JSON-ready report: ``ok`` (every simulation matched its golden model and
    every model error is within :data:`TOLERANCE`), ``simulation`` (rows, [] when skipped),
    ``paper_cpu``, ``cpu`` (the measurement or None) and ``designs``.
    """
    rows, ok = _simulation_section(echo) if simulate_blocks else ([], True)
    model = preset("paper-ctr")
    _placement_section(echo, model)
    cpu_result = _cpu_section(echo, cpu, log) if cpu is not None else None
    designs, design_rows = _designs_section(echo, model, cpu_result)
    _notes(echo, designs)
    return {"ok": ok, "simulation": rows,
            "paper_cpu": {**PAPER_CPU, "inferences_per_s": cpu_inferences_per_s()},
            "cpu": cpu_result, "designs": design_rows}
