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
``input_items_per_cycle``
    Beats accepted on that input divided by the cycles spent inside its frames (from a
    frame's first beat to its TLAST beat): the input initiation interval a producer sees while
    sending a query or scan, not counting gaps a block imposes between frames (None for a
    stream without TLAST).
``input_gaps``
    Cycles with TVALID low between two handshakes of an input port, summed over the inputs:
    the gaps the sources inserted (zero at ``stall`` 0: sources present the next beat at once).
``output_stalls``
    Cycles with TVALID high and TREADY low on an output port, summed over the outputs: the
    beats the sinks held back (zero at ``stall`` 0).
``results_received``
    Handshakes the testbench counted on the result port (``results`` is the golden model's
    beat count).
"""

import json

from .. import checks
from ..errors import SimulationMismatch, ToolError
from .engine import get_engine
from .frames import received_beats, stimulus_frames
from .scoreboard import beat_names, compare, run_folder, timeout_cycles, workload
from .simbuild import SimBuild, build_sim

__all__ = ["build_sim", "simulate", "SimBuild"]


def port_of_result(formats, model):
    """The AXI-Stream port prefix of the model's result stream."""
    return formats[model.result_port][0]


def simulate(acc, config, *, items=None, seed=1, stall=0.0, waves=False, progress=False,
             log=None, stimulus_options=None, stimulus=None, keep_outputs=False,
             engine="cocotb"):
    """Run ``acc`` at ``config`` on the ``engine``'s testbench (``cocotb`` or ``native``) and
    compare with the golden model (the job and scoreboard of :mod:`.scoreboard`).

    ``stimulus_options`` are passed to the model's ``stimulus`` (tests use them to shape
    traffic); ``stimulus`` replaces the generated stimulus altogether (a dict in the model's
    stimulus format, e.g. real data). With ``keep_outputs`` the result holds the received beats
    under ``"outputs"`` (member name -> list of field dicts). Returns the result dictionary
    written by ``hwgen sim --json`` (see module docstring).
    """
    checks.probability("stall", stall)
    eng = get_engine(engine)
    model = acc.model
    # stimulus and golden model first: bad data or options fail before the Verilator build
    work = workload(acc, config, items=items, seed=seed, stimulus_options=stimulus_options,
                    stimulus=stimulus, log=log)
    items, stim, inputs, expected = work.items, work.stim, work.inputs, work.expected
    build = eng.build(acc, config, waves=waves, log=log)
    formats = build.stream_formats()
    job = _job(acc, config, formats, stim, inputs, expected, seed, stall)
    run_dir = run_folder(build.directory.parent, job, seed=seed, stall=stall, items=items,
                         prefix=eng.run_prefix)
    label = f"simulating {acc.name}" if progress else None
    result, sim_seconds = eng.run(acc, build, job, run_dir, seed=seed, waves=waves,
                                  progress_label=label)

    if result.get("monitor_disagrees"):
        raise ToolError(f"{acc.name}: the testbench's handshake monitor and its stream sinks "
                        f"counted different beats ({result['monitor_disagrees']}, [monitor, "
                        f"sink] per port): a testbench fault, not a design mismatch")
    mismatches, by_port, examples, received = _compare_outputs(formats, expected, result)
    hs = result["handshakes"]
    direction = {j["port"]: j["direction"] for j in job["ports"]}
    res, cycles, rpc, latency, in_rate = _measure(model, formats, hs, direction)

    summary = {
        "accelerator": acc.name,
        "config": config.to_dict(),
        "derived": config.derived(),
        "items": items,
        "seed": seed,
        "stall": stall,
        "results": len(expected[model.result_port]),
        # what the hardware did, counted by the testbench: result beats it handed over, cycles
        # an input's source idled between beats (--stall's gaps) and cycles an output's sink
        # held a valid beat back (--stall's backpressure)
        "results_received": res["count"],
        "input_gaps": sum(h["gaps"] for p, h in hs.items() if direction[p] == "in"),
        "output_stalls": sum(h["held"] for p, h in hs.items() if direction[p] == "out"),
        "mismatches": mismatches,
        "mismatches_by_port": by_port,
        "first_mismatches": examples,
        "timeout": result["timeout"],
        "cycles": cycles,
        "results_per_cycle": round(rpc, 6),
        "latency_cycles": latency,
        "input_items_per_cycle": round(in_rate, 6) if in_rate is not None else None,
        "build_cached": build.cached,
        "build_seconds": round(build.seconds, 2),
        "sim_seconds": round(sim_seconds, 2),
        "engine": engine,
        "cycles_run": result.get("cycles_run"),
        "cycles_per_second": round(result["cycles_run"] / max(
            result.get("native_seconds", sim_seconds), 1e-9)) if result.get("cycles_run")
        else None,
        "run_dir": str(run_dir),
    }
    summary.update(model.report(config, stim, summary, result.get("samples", [])))
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    if keep_outputs:
        summary["outputs"] = received
    return summary


def _job(acc, config, formats, stim, inputs, expected, seed, stall):
    """The testbench job of :func:`simulate`: each input port's frames, each output port's
    expected beat count, the timeout, the memory images and the signals to sample."""
    model = acc.model
    job_ports, in_beats, out_beats = [], 0, 0
    for member, (port, direction, fmt) in formats.items():
        if direction == "in":
            beats = inputs.get(member, [])
            frames = stimulus_frames(beats, fmt)
            job_ports.append({"port": port, "direction": "in", "frames": frames})
            in_beats += len(beats)
        else:
            if member not in expected:
                raise ValueError(f"model of {acc.name} gives no expectation for {member}")
            job_ports.append({"port": port, "direction": "out", "beats": len(expected[member])})
            out_beats += len(expected[member])
    timeout = timeout_cycles(in_beats + out_beats + model.cycles_bound(config, stim), stall)
    job = {"seed": seed, "stall": stall, "timeout_cycles": timeout, "ports": job_ports}
    memories = model.memories(config, stim)
    if memories:
        job["memories"] = [{"prefix": prefix, "image": image.hex(),
                            "size": 1 << max(12, (len(image) - 1).bit_length())}
                           for prefix, image in memories.items()]
    if model.sample_signals:
        job["sample"] = {"port": port_of_result(formats, model), "signals":
                         list(model.sample_signals)}
    return job


def _compare_outputs(formats, expected, result):
    """Every output port's received beats against the golden model's: ``(mismatches,
    mismatches by port, first mismatches, received beats by port)``."""
    mismatches, by_port, examples, received = 0, {}, [], {}
    for member, (port, direction, fmt) in formats.items():
        if direction != "out":
            continue
        got = received[member] = received_beats(result["outputs"][port], fmt)
        count, ex = compare(expected[member], got, beat_names(fmt))
        by_port[member] = count
        mismatches += count
        examples += [dict(e, port=member) for e in ex]
    return mismatches, by_port, examples, received


def _measure(model, formats, hs, direction):
    """The measurements of the module docstring from the handshake counts ``hs`` (port ->
    first, last, count, frame_cycles): ``(result port's counts, cycles, results per cycle,
    latency, input items per cycle)``."""
    port_of = {member: port for member, (port, _, _) in formats.items()}
    res = hs[port_of[model.result_port]]
    firsts = [h["first"] for p, h in hs.items() if direction[p] == "in" and h["first"]]
    lasts = [h["last"] for p, h in hs.items() if direction[p] == "out" and h["last"]]
    cycles = (max(lasts) - min(firsts) + 1) if firsts and lasts else None
    rpc = (res["count"] / (res["last"] - res["first"] + 1)) if res["count"] else 0.0
    src = hs[port_of[model.latency_from]] if model.latency_from else \
        hs[next(p for p, d in direction.items() if d == "in")]
    latency = (res["first"] - src["first"]) if src["first"] and res["first"] else None
    # Input rate inside frames (from a frame's first beat to its TLAST beat): the initiation
    # interval seen by the producer, excluding the gaps between frames a block may impose.
    in_rate = src["count"] / src["frame_cycles"] if src.get("frame_cycles") else None
    return res, cycles, rpc, latency, in_rate


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
