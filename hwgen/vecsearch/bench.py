"""Benchmarks of the ChamVS blocks: throughput and latency measured in simulation, resources
from yosys. ``hwgen bench pq-decoder`` / ``hwgen bench lut-builder`` print the README tables."""

from .. import registry
from ..flow.simulate import simulate
from ..flow.synth import synthesize
from ..flow.tools import yosys_path

__all__ = ["bench_pq_decoder", "bench_lut_builder"]

#: FANNS's floating-point PQ decoding PE at m = 16 (the comparison point of issue #2).
FANNS_PE = {"lut": 3937, "ff": 3954, "dsp": 30, "bram18": 16}


def _resources(acc, cfg):
    if yosys_path() is None:
        return None
    return synthesize(acc, cfg)["resources"]


def _row(cells):
    return "| " + " | ".join(str(c) for c in cells) + " |"


def bench_pq_decoder(echo=print, items=20000):
    acc = registry.get("pq-decoder")
    echo(f"pq-decoder: {items} codes per run, --stall 0 (steady state), yosys synth_xilinx xcup")
    echo(_row(["m", "lut_bits", "dist_bits", "results/cycle", "latency (cycles)", "model latency",
               "LUT", "FF", "BRAM18", "DSP", "LUT / (FANNS/4)"]))
    echo(_row(["---"] * 11))
    for m in (16, 32, 64):
        for lut_bits in (16, 24):
            cfg = acc.make_config([f"m={m}", f"lut_bits={lut_bits}"])
            sim = simulate(acc, cfg, items=items, seed=1, stall=0.0)
            res = _resources(acc, cfg) or {}
            budget = FANNS_PE["lut"] / 4 * m / 16
            echo(_row([m, lut_bits, cfg.dist_bits, f"{sim['results_per_cycle']:.4f}",
                       sim["latency_cycles"], cfg.performance()["latency_cycles"],
                       res.get("lut", "-"), res.get("ff", "-"), res.get("bram18", "-"),
                       res.get("dsp", "-"),
                       f"{res['lut'] / budget:.2f}" if res else "-"]))
            if sim["mismatches"]:
                echo(f"  MISMATCHES: {sim['mismatches']}")
    echo(_row(["16 (FANNS float PE)", "fp32", "-", "1", "-", "-", FANNS_PE["lut"], FANNS_PE["ff"],
               FANNS_PE["bram18"], FANNS_PE["dsp"], "4.00"]))
    echo("(LUT / (FANNS/4): our LUTs over a quarter of FANNS's per-m-scaled figure; <= 1 meets "
         "the goal)")


def bench_lut_builder(echo=print, pairs=8):
    acc = registry.get("lut-builder")
    echo(f"lut-builder: dim 128, m 16 (SIFT-like), {pairs} query pairs, --stall 0")
    echo(_row(["sub_par", "rows/cycle (sim)", "model", "cycles/LUT", "latency", "LUT", "FF",
               "BRAM18", "DSP"]))
    echo(_row(["---"] * 9))
    for sub_par in (16, 4, 1):
        cfg = acc.make_config(["dim=128", "m=16", "lut_bits=16", f"sub_par={sub_par}"])
        sim = simulate(acc, cfg, items=pairs, seed=1, stall=0.0)
        res = _resources(acc, cfg) or {}
        model = cfg.performance()
        echo(_row([sub_par, f"{sim['results_per_cycle']:.4f}", f"{model['rows_per_cycle']:.4f}",
                   model["cycles_per_lut"], sim["latency_cycles"], res.get("lut", "-"),
                   res.get("ff", "-"), res.get("bram18", "-"), res.get("dsp", "-")]))
        if sim["mismatches"]:
            echo(f"  MISMATCHES: {sim['mismatches']}")
