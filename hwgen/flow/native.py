"""The native simulation engine: the Verilated model driven by a generated C++ testbench.

``hwgen sim NAME --engine native`` runs the same job as the cocotb engine (the stimulus and golden
model of :func:`hwgen.flow.simulate.simulate`, the same ``--stall`` meaning, the same cycle
budget and drain) without a Python coroutine per clock edge: ``rtl_templates/native_tb.cpp.j2``
is rendered from the top's ``ports.json`` and compiled with the Verilated model once per
configuration (``<cache>/<name>-<digest>/native``, under the same lock as the other builds).

Inputs travel as binary beat files (``in_<port>.bin``), outputs come back as binary records
(``out_<port>.bin``) with the cycle of each handshake, and ``native.json`` holds the handshake
counts the cocotb monitor reports. The result has the cocotb testbench's form, so the comparison
with the golden model is the one of :func:`~hwgen.flow.simulate.simulate`.

Scope: every stream top of the registry. AXI4 read masters (``chamvs-node``'s memory channels,
the embedding kernel's banks) read a C++ model of an AXI4 read slave over the model's memory
image (INCR bursts, up to 8 outstanding requests, random latency of 2..17 cycles, random
ARREADY drops and R pauses with the same ``stall``); side signals a model samples
(``sample_signals``: status and performance counters) are read as the cocotb monitor reads
them, one cycle after each TLAST beat of the result port. With ``waves`` a ``--trace`` build of
its own writes ``dump.vcd`` (every signal, a 4 ns clock). Memory-mapped Vitis kernels and
cluster runs keep their cocotb testbenches. The random streams differ from cocotb's,
so the two engines see different stall patterns for one seed; both must give zero mismatches.
"""

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from ..errors import ToolError
from .emit import emit_accelerator
from . import profile
from .package import render
from .ports import SIDEBANDS
from .scoreboard import DRAIN_CYCLES
from .simbuild import SimBuild
from .tools import file_lock, use_verilator, work_dir, write_atomic
from .verilator import VERILATOR_ARGS, cxx_flags, drop_precompiled_headers

__all__ = ["NativeBuild", "build_native", "run_native"]
_TEMPLATE = "native_tb.cpp.j2"


class NativeBuild(SimBuild):
    """A compiled native testbench (:class:`SimBuild` plus its executable)."""

    @property
    def executable(self):
        """Path of the compiled simulator (``Vsim`` in the build folder)."""
        return self.directory / "Vsim"


def _port_view(stream):
    sidebands = [SIDEBANDS[name] for name in stream.get("sidebands", {})]
    return {"port": stream["port"], "words": max(1, -(-stream["tdata_bits"] // 32)),
            "tlast": bool(stream["tlast"]), "sidebands": sidebands}


def build_native(acc, config, *, waves=False, log=None):
    """Emit ``config``'s Verilog and compile it with the generated testbench (cached). With
    ``waves`` the model is built with ``--trace`` (a separate build) and the testbench writes
    ``dump.vcd`` into the run folder."""
    work = work_dir(acc, config)
    v_path, ports = emit_accelerator(acc, config, work / "rtl")
    streams = [_port_view(s) for s in ports["streams"]]
    sample = None
    if acc.model.sample_signals:
        port = next(st["port"] for st in ports["streams"]
                    if st["member"] == acc.model.result_port)
        sample = {"port": port, "signals": list(acc.model.sample_signals)}
    bits = {sig["name"]: sig["bits"] for sig in ports.get("signals", [])}
    memories = [{"prefix": prefix, "words": max(1, -(-bits[prefix + "_rdata"] // 32))}
                for prefix in (name[:-len("_arvalid")] for name in bits
                               if name.endswith("_arvalid"))]
    max_words = max([s["words"] for s in streams] + [m["words"] for m in memories] + [2])
    source = render(_TEMPLATE, top=acc.top_name, sample=sample, memories=memories,
                    max_words=max_words, waves=waves,
                    inputs=[s for s, p in zip(streams, ports["streams"]) if p["direction"] == "in"],
                    outputs=[s for s, p in zip(streams, ports["streams"])
                             if p["direction"] == "out"])
    build_dir = work / ("native-waves" if waves else "native")
    with file_lock(work / f".{build_dir.name}.lock"):
        build_dir.mkdir(parents=True, exist_ok=True)
        flags = VERILATOR_ARGS + cxx_flags()
        key = hashlib.sha256(v_path.read_bytes() + source.encode() +
                             " ".join(flags).encode()).hexdigest()
        stamp = build_dir / "hwgen.stamp"
        exe = build_dir / "Vsim"
        if stamp.exists() and stamp.read_text() == key and exe.exists():
            drop_precompiled_headers(build_dir)     # a build from before they were dropped
            profile.record("native", acc.top_name, build_dir, 0.0, True)
            return NativeBuild(build_dir, acc.top_name, ports, True, 0.0)
        if log:
            log(f"compiling the native testbench of {acc.top_name} into {build_dir} ...")
        write_atomic(build_dir / "harness.cpp", source)
        use_verilator()
        start = time.monotonic()
        cmd = ["verilator", "--cc", "--exe", "--build", "-j", str(min(2, os.cpu_count() or 1)),
               *flags, *(["--trace"] if waves else []), "--top-module", acc.top_name,
               "-Mdir", str(build_dir / "obj"),
               "-o", str(exe), str(v_path), str(build_dir / "harness.cpp")]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        (build_dir / "build.log").write_text(proc.stdout + proc.stderr)
        if proc.returncode != 0 or not exe.exists():
            raise ToolError(f"native build of {acc.top_name} failed; log "
                            f"{build_dir / 'build.log'}:\n{(proc.stdout + proc.stderr)[-2000:]}")
        drop_precompiled_headers(build_dir)
        write_atomic(stamp, key)
        seconds = time.monotonic() - start
        profile.record("native", acc.top_name, build_dir, seconds, False)
        return NativeBuild(build_dir, acc.top_name, ports, False, seconds)


def _record_dtype(view, output):
    fields = [("cycle", "<u8"), ("last", "<u4")] if output else []
    fields.append(("data", "<u4", (view["words"],)))
    if not output:
        fields.append(("last", "<u4"))
    if view["sidebands"]:
        fields.append(("sb", "<u8", (len(view["sidebands"]),)))
    return np.dtype(fields)


def _write_inputs(path, view, frames):
    """One record per beat: TDATA words, TLAST, sidebands (see the template's header)."""
    nbytes = view["words"] * 4
    parts = []
    for frame in frames:
        for k, word in enumerate(frame):
            last = int(view["tlast"] and k == len(frame) - 1)
            if isinstance(word, dict):
                parts.append(word["tdata"].to_bytes(nbytes, "little") + last.to_bytes(4, "little")
                             + b"".join(int(word.get(sig, 0)).to_bytes(8, "little")
                                        for sig in view["sidebands"]))
            else:
                parts.append(word.to_bytes(nbytes, "little") + last.to_bytes(4, "little"))
    path.write_bytes(b"".join(parts))


def _read_outputs(path, view):
    """Frames of received words (split at TLAST), as the cocotb sinks give them."""
    records = np.fromfile(path, dtype=_record_dtype(view, True))
    data = records["data"]
    if view["words"] <= 2:
        words = data[:, 0].astype(np.uint64)
        if view["words"] == 2:
            words |= data[:, 1].astype(np.uint64) << np.uint64(32)
        words = words.tolist()
    else:
        words = [int.from_bytes(row.tobytes(), "little") for row in data]
    if view["sidebands"]:
        sb = records["sb"].tolist()
        words = [{"tdata": w, **dict(zip(view["sidebands"], s))} for w, s in zip(words, sb)]
    if not view["tlast"]:
        return [words] if words else []
    frames, current = [], []
    for word, last in zip(words, records["last"].tolist()):
        current.append(word)
        if last:
            frames.append(current)
            current = []
    if current:
        frames.append(current)
    return frames


def run_native(build, job, run_dir, *, progress_label=None):
    """Run ``job`` (the cocotb testbench's job dictionary) on a :class:`NativeBuild`.

    Returns ``(result, seconds)`` in the cocotb testbench's result form, plus ``cycles_run``
    and the simulator's own wall time under ``"native_seconds"``.
    """
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    views = {s["port"]: _port_view(s) for s in build.ports["streams"]}
    start = time.monotonic()
    with file_lock(run_dir / ".lock"):
        for name in ("native.json", "progress"):
            (run_dir / name).unlink(missing_ok=True)
        expect = []
        for port in job["ports"]:
            if port["direction"] == "in":
                _write_inputs(run_dir / f"in_{port['port']}.bin", views[port["port"]],
                              port["frames"])
            else:
                expect.append(f"{port['port']} {port['beats']}")
        (run_dir / "expect.txt").write_text("\n".join(expect) + "\n")
        for mem in job.get("memories", []):
            image = bytes.fromhex(mem["image"])     # zero-padded to the size cocotb's AxiRam has
            (run_dir / f"mem_{mem['prefix']}.bin").write_bytes(
                image + bytes(max(0, mem["size"] - len(image))))
        cmd = [str(build.executable), str(run_dir), str(job["seed"]), repr(float(job["stall"])),
               str(job["timeout_cycles"]), str(DRAIN_CYCLES)]
        log_path = run_dir / "native.log"
        with open(log_path, "w") as log:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
            while proc.poll() is None:
                time.sleep(0.2)
                if progress_label and (run_dir / "progress").exists():
                    try:
                        got, total, cycle = (run_dir / "progress").read_text().split()
                    except ValueError:
                        continue
                    sys.stderr.write(f"\r  {progress_label}: {got}/{total} results, cycle "
                                     f"{cycle}   ")
                    sys.stderr.flush()
        if progress_label:
            sys.stderr.write("\r" + " " * 72 + "\r")
        summary_path = run_dir / "native.json"
        if proc.returncode != 0 or not summary_path.exists():
            raise ToolError(f"native simulation of {build.top} failed (exit {proc.returncode});"
                            f" log {log_path}:\n{log_path.read_text()[-2000:]}")
        summary = json.loads(summary_path.read_text())
        outputs = {port["port"]: _read_outputs(run_dir / f"out_{port['port']}.bin",
                                               views[port["port"]])
                   for port in job["ports"] if port["direction"] == "out"}
        samples = []
        if "sample" in job:
            names = job["sample"]["signals"]
            values = np.fromfile(run_dir / "samples.bin", dtype="<u8").reshape(-1, len(names))
            samples = [dict(zip(names, row)) for row in values.tolist()]
    profile.record("native-run", build.top, build.directory, time.monotonic() - start, False)
    handshakes = {p: {k: (v or None) if k in ("first", "last") else v for k, v in h.items()}
                  for p, h in summary["handshakes"].items()}
    result = {"cycles_run": summary["cycles_run"], "timeout": summary["timeout"],
              "outputs": outputs, "handshakes": handshakes, "samples": samples,
              "native_seconds": summary["seconds"], "memories": summary["memories"]}
    bad = {p: m["out_of_range"] for p, m in summary["memories"].items() if m["out_of_range"]}
    if bad:
        raise ToolError(f"{build.top} read beyond its memory images: {bad} bursts")
    return result, time.monotonic() - start
