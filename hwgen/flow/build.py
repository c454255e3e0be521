"""``hwgen build``: everything a user takes to the vendor tools, in one directory.

Writes the stream top's Verilog and ``ports.json`` (:mod:`hwgen.flow.emit`), with a board the
Vitis memory-mapped kernel around it and the vendor files rendered from ``rtl_templates/``
(:mod:`hwgen.flow.kernel`, :mod:`hwgen.flow.package`), and ``report.json``: configuration,
derived parameters, ports, performance-model prediction, the latest simulation measurement of
this configuration (if it was simulated), the yosys resource estimate (if run or cached) and
the ``hwgen timing`` figures (post-route ECP5 Fmax and ratio, UltraScale+ logic depth) when
they were measured for this Verilog.
"""

import json
from pathlib import Path

from .emit import emit_accelerator
from .tools import work_dir

__all__ = ["build_accelerator", "latest_measurement"]


def latest_measurement(acc, config):
    """The newest ``hwgen sim`` summary of this configuration from the build cache, or None."""
    runs = work_dir(acc, config) / "runs"
    summaries = sorted(runs.glob("*/summary.json"), key=lambda p: p.stat().st_mtime)
    if not summaries:
        return None
    data = json.loads(summaries[-1].read_text())
    keys = ("items", "seed", "stall", "results", "mismatches", "cycles", "results_per_cycle",
            "latency_cycles")
    return {k: data.get(k) for k in keys}


def _cached_synth(acc, config):
    path = work_dir(acc, config) / "synth" / "synth.json"
    if path.exists():
        data = json.loads(path.read_text())
        return {k: v for k, v in data["counts"].items() if k != "cells"}
    return None


def build_accelerator(acc, config, board, out_dir, *, synth=False, log=None):
    """Write the build products of ``config`` into ``out_dir``; returns the written paths."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    v_path, ports = emit_accelerator(acc, config, out_dir)
    written = [v_path, out_dir / "ports.json"]

    report = {
        "accelerator": acc.name,
        "summary": acc.summary,
        "config": config.to_dict(),
        "derived": config.derived(),
        "board": board.name if board is not None else None,
        "ports": ports,
        "model": config.performance().to_dict(),
        "measured": latest_measurement(acc, config),
    }
    if synth:
        from .synth import synthesize
        report["resources"] = synthesize(acc, config, board=board, log=log)["resources"]
    else:
        report["resources"] = _cached_synth(acc, config)

    from .timing import cached_timing
    report["timing"] = cached_timing(acc, config, v_path.read_text())

    if board is not None:
        from .kernel import emit_kernel
        from .package import write_vendor_files
        kernel = None
        if board.vitis_platform:
            kernel = emit_kernel(acc, config, board, out_dir)
            written.append(out_dir / kernel["verilog"])
            ports["kernel"] = report["ports"]["kernel"] = kernel
            (out_dir / "ports.json").write_text(json.dumps(ports, indent=2) + "\n")
        written += list(write_vendor_files(acc, config, board, out_dir, kernel).values())
    (out_dir / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    written.append(out_dir / "report.json")
    return written
