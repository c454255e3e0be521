"""``hwgen sim``: build an accelerator's Verilog with Verilator and prove it against its golden model.

Builds are cached per configuration (``<cache>/<name>-<config digest>``) and rebuilt only when
the emitted Verilog changes. A run generates stimulus from the accelerator's model with a seeded
random generator, drives it through the cocotb testbench with random input gaps and output
backpressure (probability ``stall`` each per cycle), and compares every output beat with the
golden model.

Measurements (all in clock cycles, counted by the testbench monitor at the top-level ports):

``cycles``
    From the first input handshake on any port to the last output handshake.
``results_per_cycle``
    Beats on the model's result port divided by the cycles from its first to its last beat:
    the steady-state rate (1.0 = one result per cycle).
``latency_cycles``
    From the first handshake on the model's ``latency_from`` input to the first result beat.
"""

import hashlib
import json
import os
import sys
import threading
import time
from pathlib import Path

import numpy as np

from ..errors import SimulationMismatch, ToolError
from .emit import emit_verilog
from .ports import StreamFormat
from .tools import REPO_ROOT, cache_dir, use_verilator

__all__ = ["build_sim", "simulate", "SimBuild"]

VERILATOR_ARGS = ["-Wno-fatal", "-Wno-WIDTHEXPAND", "-Wno-WIDTHTRUNC", "-Wno-UNOPTFLAT",
                  "-Wno-UNUSEDSIGNAL", "-O3", "--x-assign", "fast", "--x-initial", "fast"]


class SimBuild:
    """A Verilated build of one configuration: its directory, top name and ports."""

    def __init__(self, directory, top, ports, cached, seconds):
        self.directory = Path(directory)
        self.top = top
        self.ports = ports
        self.cached = cached
        self.seconds = seconds

    def stream_formats(self):
        """``{member name: (port prefix, direction, StreamFormat)}``."""
        return {s["member"]: (s["port"], s["direction"], StreamFormat.from_dict(s))
                for s in self.ports["streams"]}


def _runner():
    use_verilator()
    from cocotb_tools.runner import get_runner
    return get_runner("verilator")


def build_sim(acc, config, *, waves=False, log=None):
    """Emit and Verilate ``config`` of accelerator ``acc`` (cached). Returns a :class:`SimBuild`."""
    top_name = acc.top_name
    work = cache_dir() / f"{acc.name}-{config.digest()}"
    rtl = work / "rtl"
    v_path, ports = emit_verilog(acc.build_core(config), top_name, rtl)
    text_hash = hashlib.sha256(v_path.read_bytes()).hexdigest()
    build_dir = work / ("build-waves" if waves else "build")
    stamp = build_dir / "hwgen.stamp"
    key = text_hash + " " + " ".join(VERILATOR_ARGS)
    if stamp.exists() and stamp.read_text() == key and (build_dir / top_name).exists():
        return SimBuild(build_dir, top_name, ports, cached=True, seconds=0.0)
    if log:
        log(f"verilating {acc.name} ({config.digest()}) ...")
    runner = _runner()
    start = time.monotonic()
    build_dir.mkdir(parents=True, exist_ok=True)
    log_file = build_dir / "build.log"
    try:
        runner.build(sources=[v_path], hdl_toplevel=top_name, build_dir=build_dir,
                     build_args=VERILATOR_ARGS, waves=waves, always=True, log_file=log_file)
    except (RuntimeError, SystemExit) as e:
        tail = log_file.read_text()[-2000:] if log_file.exists() else ""
        raise ToolError(f"Verilator build of {acc.name} failed ({e}); log {log_file}:\n{tail}") \
            from None
    stamp.write_text(key)
    return SimBuild(build_dir, top_name, ports, cached=False, seconds=time.monotonic() - start)


def _frames(beats, fmt):
    """Group packed words into AXI-Stream frames at beats with ``last`` set."""
    words = [fmt.pack(b) for b in beats]
    if not fmt.has_last:
        return [words] if words else []
    frames, current = [], []
    for beat, word in zip(beats, words):
        current.append(word)
        if beat["last"]:
            frames.append(current)
            current = []
    if current:
        raise ValueError("stimulus stream does not end with a beat whose last flag is set")
    return frames


def _received_beats(frames, fmt):
    """Unpack the testbench's frames; TLAST (end of each frame) becomes the ``last`` field."""
    beats = []
    for frame in frames:
        for k, word in enumerate(frame):
            beat = fmt.unpack(word)
            if fmt.has_last:
                beat["last"] = int(k == len(frame) - 1)
            beats.append(beat)
    return beats


def _normalise(beat, fmt):
    names = [f.name for f in fmt.fields] + (["last"] if fmt.has_last else [])
    return {n: (list(map(int, beat[n])) if isinstance(beat[n], (list, tuple, np.ndarray))
                else int(beat[n])) for n in names}


def _compare(expected, received, fmt):
    """Mismatching beat count and the first few differences."""
    mismatches, examples = 0, []
    for k in range(max(len(expected), len(received))):
        want = _normalise(expected[k], fmt) if k < len(expected) else None
        have = received[k] if k < len(received) else None
        if want != have:
            mismatches += 1
            if len(examples) < 5:
                examples.append({"index": k, "expected": want, "received": have})
    return mismatches, examples


def simulate(acc, config, *, items=None, seed=1, stall=0.0, waves=False, progress=False,
             log=None, stimulus_options=None, stimulus=None, keep_outputs=False):
    """Run the cocotb testbench of ``acc`` at ``config`` and compare with the golden model.

    ``stimulus_options`` are passed to the model's ``stimulus`` (tests use them to shape
    traffic); ``stimulus`` replaces the generated stimulus altogether (a dict in the model's
    stimulus format, e.g. real data). With ``keep_outputs`` the result holds the received beats
    under ``"outputs"`` (member name -> list of field dicts). Returns the result dictionary written by ``hwgen sim --json`` (see module
    docstring).
    """
    if not 0.0 <= stall < 1.0:
        from ..errors import ConfigError
        raise ConfigError("stall", "must be a probability in 0..0.99", value=stall)
    model = acc.model
    items = items if items is not None else acc.default_items
    if items < 1:
        from ..errors import ConfigError
        raise ConfigError("items", "must be at least 1", value=items)
    build = build_sim(acc, config, waves=waves, log=log)
    formats = build.stream_formats()

    rng = np.random.default_rng(seed)
    stim = stimulus if stimulus is not None else \
        model.stimulus(config, items, rng, **(stimulus_options or {}))
    inputs = model.inputs(config, stim)
    expected = model.expect(config, stim)

    job_ports, in_beats, out_beats = [], 0, 0
    for member, (port, direction, fmt) in formats.items():
        if direction == "in":
            beats = inputs.get(member, [])
            frames = _frames(beats, fmt)
            job_ports.append({"port": port, "direction": "in", "frames": frames})
            in_beats += len(beats)
        else:
            if member not in expected:
                raise ValueError(f"model of {acc.name} gives no expectation for {member}")
            job_ports.append({"port": port, "direction": "out", "beats": len(expected[member])})
            out_beats += len(expected[member])
    bound = model.cycles_bound(config, stim) if hasattr(model, "cycles_bound") else 0
    timeout = int((in_beats + out_beats + bound) * 3 / (1.0 - stall) ** 2) + 20000

    run_dir = build.directory.parent / "runs" / f"seed{seed}-stall{stall:g}-n{items}"
    run_dir.mkdir(parents=True, exist_ok=True)
    job_path, result_path = run_dir / "job.json", run_dir / "result.json"
    progress_path = run_dir / "progress"
    for p in (result_path, progress_path):
        p.unlink(missing_ok=True)
    job_path.write_text(json.dumps({"seed": seed, "stall": stall, "timeout_cycles": timeout,
                                    "ports": job_ports}))

    runner = _runner()
    env = {
        "HWGEN_JOB": str(job_path), "HWGEN_RESULT": str(result_path),
        "HWGEN_PROGRESS": str(progress_path),
        "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]),
        "COCOTB_LOG_LEVEL": "WARNING",
    }
    error = []

    def run():
        try:
            runner.test(test_module=acc.testbench, hdl_toplevel=build.top,
                        hdl_toplevel_lang="verilog",
                        build_dir=build.directory, test_dir=run_dir, extra_env=env,
                        seed=seed, waves=waves, log_file=run_dir / "sim.log")
        except (Exception, SystemExit) as e:      # cocotb's runner exits on failures
            error.append(e)

    start = time.monotonic()
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    while thread.is_alive():
        thread.join(0.5)
        if progress and progress_path.exists():
            try:
                got, total, cyc = progress_path.read_text().split()
                sys.stderr.write(f"\r  simulating {acc.name}: {got}/{total} results, "
                                 f"cycle {cyc}   ")
                sys.stderr.flush()
            except ValueError:
                pass
    if progress:
        sys.stderr.write("\r" + " " * 70 + "\r")
    sim_seconds = time.monotonic() - start
    if not result_path.exists():
        log_tail = (run_dir / "sim.log").read_text()[-3000:] if (run_dir / "sim.log").exists() \
            else ""
        raise ToolError(f"simulation of {acc.name} produced no result ({error[0] if error else ''});"
                        f" log {run_dir / 'sim.log'}:\n{log_tail}")
    result = json.loads(result_path.read_text())

    mismatches, by_port, examples, received = 0, {}, [], {}
    for member, (port, direction, fmt) in formats.items():
        if direction != "out":
            continue
        got = received[member] = _received_beats(result["outputs"][port], fmt)
        count, ex = _compare(expected[member], got, fmt)
        by_port[member] = count
        mismatches += count
        examples += [dict(e, port=member) for e in ex]

    hs = result["handshakes"]
    fmt_port = {member: port for member, (port, _, _) in formats.items()}
    res = hs[fmt_port[model.result_port]]
    firsts = [h["first"] for p, h in hs.items() if h["first"] is not None and
              any(j["port"] == p and j["direction"] == "in" for j in job_ports)]
    lasts = [h["last"] for p, h in hs.items() if h["last"] is not None and
             any(j["port"] == p and j["direction"] == "out" for j in job_ports)]
    cycles = (max(lasts) - min(firsts) + 1) if firsts and lasts else None
    rpc = (res["count"] / (res["last"] - res["first"] + 1)) if res["count"] else 0.0
    src = hs[fmt_port[getattr(model, "latency_from", model.result_port)]] \
        if hasattr(model, "latency_from") else None
    latency = (res["first"] - src["first"]) if src and src["first"] and res["first"] else None

    summary = {
        "accelerator": acc.name,
        "config": config.to_dict(),
        "derived": config.derived(),
        "items": items,
        "seed": seed,
        "stall": stall,
        "results": len(expected[model.result_port]),
        "mismatches": mismatches,
        "mismatches_by_port": by_port,
        "first_mismatches": examples,
        "timeout": result["timeout"],
        "cycles": cycles,
        "results_per_cycle": round(rpc, 6),
        "latency_cycles": latency,
        "build_cached": build.cached,
        "build_seconds": round(build.seconds, 2),
        "sim_seconds": round(sim_seconds, 2),
        "run_dir": str(run_dir),
    }
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    if keep_outputs:
        summary["outputs"] = received
    return summary


def check(result):
    """Raise :class:`SimulationMismatch` unless ``result`` shows a clean run."""
    if result["timeout"]:
        raise SimulationMismatch(f"{result['accelerator']}: simulation timed out "
                                 f"({result['mismatches']} mismatching beats)")
    if result["mismatches"]:
        first = result["first_mismatches"][0] if result["first_mismatches"] else {}
        raise SimulationMismatch(f"{result['accelerator']}: {result['mismatches']} of "
                                 f"{result['results']} results differ from the golden model; "
                                 f"first: {first}")
