"""Verilator builds and cocotb runs, shared by every simulation in hwgen.

:func:`verilate` builds a Verilog file with cocotb's runner unless the same text (and options)
was already built in that directory. :func:`run_testbench` runs one cocotb test module on a
build with a job file (the testbench reads ``HWGEN_JOB`` and writes ``HWGEN_RESULT``), shows the
testbench's progress file while it runs, and returns the result, never hanging on a failed
simulator: a run without a result raises :class:`~hwgen.errors.ToolError` with the log's tail.
"""

import functools
import hashlib
import json
import os
import sys
import threading
import time
from pathlib import Path

from ..errors import ToolError
from . import profile
from .tools import file_lock, use_verilator, write_atomic

__all__ = ["VERILATOR_ARGS", "VPI_PUBLIC_ARGS", "cxx_flags", "verilate", "run_testbench"]

#: Amaranth's Verilog trips width and unused-signal warnings; they are not errors.
VERILATOR_ARGS = ["-Wno-fatal", "-Wno-WIDTHEXPAND", "-Wno-WIDTHTRUNC", "-Wno-UNOPTFLAT",
                  "-Wno-UNUSEDSIGNAL", "-O3", "--x-assign", "fast", "--x-initial", "fast"]

#: C++ optimisation of the native testbench's Verilated model per build kind (``-CFLAGS``
#: comes after Verilator's own ``OPT_FAST``/``OPT_SLOW`` and so wins for every file).
#: ``HWGEN_BUILD=test`` (``make test``) compiles at -O1 instead of -O2: the suite's simulations
#: are short, and pq-decoder's build took 8.9 s at -O1, 14.4 s at -O2 (8.5 s at -O0). cocotb
#: builds keep Verilator's defaults (-Os for the fast path, no optimisation for the ``Slow``
#: files) in every kind: when they were built with cocotb's ``--public-flat-rw`` their
#: symbol-table constructor was so large that -O1 on it took over 8 minutes where the default
#: takes seconds (not measured again since :data:`VPI_PUBLIC_ARGS` replaced that option).
NATIVE_CXX_OPT = {"test": "-O1", "": "-O2"}


def cxx_flags():
    """``-CFLAGS`` arguments of a native build under ``$HWGEN_BUILD``."""
    kind = os.environ.get("HWGEN_BUILD", "")
    if kind not in NATIVE_CXX_OPT:
        raise ToolError(f"HWGEN_BUILD={kind!r}: must be one of {sorted(NATIVE_CXX_OPT)}")
    return ["-CFLAGS", NATIVE_CXX_OPT[kind]]


#: What a cocotb build makes visible through VPI, in place of cocotb's ``--public-flat-rw``
#: (every signal of every module, read and write). hwgen's testbenches touch the top's ports
#: only, so the top's signals are enough: a chamvs-node build with its run took 20 s instead of
#: 47 s, pq-decoder's 2.8 s instead of 8.3 s, with the same cycles and results.
VPI_PUBLIC_ARGS = ["--public-depth", "1"]


@functools.lru_cache(maxsize=None)
def _runner_class():
    from cocotb_tools.runner import Verilator

    class TopPortsVerilator(Verilator):
        """cocotb's Verilator runner with :data:`VPI_PUBLIC_ARGS` for ``--public-flat-rw``."""

        def _build_command(self):
            cmds = super()._build_command()
            verilate_cmd = cmds[0]
            if "--public-flat-rw" not in verilate_cmd:
                raise ToolError("cocotb's Verilator build command has no --public-flat-rw to "
                                "replace (cocotb changed?): " + " ".join(verilate_cmd))
            cmds[0] = [a for arg in verilate_cmd
                       for a in (VPI_PUBLIC_ARGS if arg == "--public-flat-rw" else [arg])]
            return cmds
    return TopPortsVerilator


def _runner():
    use_verilator()
    return _runner_class()()


def drop_precompiled_headers(build_dir):
    """Delete the precompiled headers (``*.gch``, about 70 MB each, two per model) that a
    finished Verilator build leaves behind; the stamped executable is all a cached build needs,
    and ccache keeps a rebuild cheap. Without this a full test run leaves about 6 GB of headers
    in the build cache."""
    for header in Path(build_dir).rglob("*.gch"):
        header.unlink(missing_ok=True)


def verilate(v_path, top, build_dir, *, waves=False, log=None):
    """Build ``v_path`` (top module ``top``) into ``build_dir`` unless already built.

    Returns ``(cached, seconds)``.
    """
    build_dir = Path(build_dir)
    # One build at a time per folder: a second process waits and then finds it cached.
    with file_lock(build_dir.parent / f".{build_dir.name}.lock"):
        cached, seconds = _verilate(v_path, top, build_dir, waves=waves, log=log)
    profile.record("verilator", top, build_dir, seconds, cached)
    return cached, seconds


def _verilate(v_path, top, build_dir, *, waves, log):
    key = hashlib.sha256(Path(v_path).read_bytes()).hexdigest() + " " + \
        " ".join(VERILATOR_ARGS + VPI_PUBLIC_ARGS)
    stamp = build_dir / "hwgen.stamp"
    if stamp.exists() and stamp.read_text() == key and (build_dir / top).exists():
        drop_precompiled_headers(build_dir)         # a build from before they were dropped
        return True, 0.0
    if log:
        log(f"verilating {top} into {build_dir} ...")
    runner = _runner()
    start = time.monotonic()
    build_dir.mkdir(parents=True, exist_ok=True)
    log_file = build_dir / "build.log"
    try:
        runner.build(sources=[v_path], hdl_toplevel=top, build_dir=build_dir,
                     build_args=VERILATOR_ARGS, waves=waves, always=True, log_file=log_file)
    except (RuntimeError, SystemExit) as e:
        tail = log_file.read_text()[-2000:] if log_file.exists() else ""
        raise ToolError(f"Verilator build of {top} failed ({e}); log {log_file}:\n{tail}") \
            from None
    drop_precompiled_headers(build_dir)
    write_atomic(stamp, key)
    return False, time.monotonic() - start


def run_testbench(test_module, top, build_dir, run_dir, job, *, testcase=None, seed=1,
                  waves=False, progress_label=None):
    """Run cocotb ``test_module`` on the build in ``build_dir`` with ``job`` (JSON-able).

    With ``progress_label``, the testbench's progress file (``got total cycle``) is shown on
    stderr while it runs. Returns ``(result dict, seconds)``. Runs sharing ``run_dir`` (callers
    key it by the job, so only identical jobs do) take turns under a lock.
    """
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    with file_lock(run_dir / ".lock"):
        result, seconds = _run_testbench(test_module, top, build_dir, run_dir, job,
                                         testcase=testcase, seed=seed, waves=waves,
                                         progress_label=progress_label)
    profile.record("cocotb-run", top, build_dir, seconds, False)
    return result, seconds


def _run_testbench(test_module, top, build_dir, run_dir, job, *, testcase, seed, waves,
                   progress_label):
    job_path, result_path = run_dir / "job.json", run_dir / "result.json"
    progress_path, log_path = run_dir / "progress", run_dir / "sim.log"
    for p in (result_path, progress_path):
        p.unlink(missing_ok=True)
    job_path.write_text(json.dumps(job))
    # cocotb's runner hands the simulator's Python this process's sys.path as PYTHONPATH (and
    # its interpreter as PYGPI_PYTHON_BIN), so the testbench imports the same hwgen as this one,
    # installed or editable; no checkout path is added.
    env = {
        "HWGEN_JOB": str(job_path), "HWGEN_RESULT": str(result_path),
        "HWGEN_PROGRESS": str(progress_path),
        "COCOTB_LOG_LEVEL": "WARNING",
        # cocotb installs pytest's assertion rewriting for every imported file ("*.py") and
        # builds a pytest Config, which loads every installed pytest plugin: 0.9 s of a 1.3 s
        # pq-decoder run whose test takes 0.02 s. The testbenches (sim/*_tb.py) keep the
        # rewriting; plugins are not loaded in the simulator (0.39 s per run).
        "COCOTB_REWRITE_ASSERTION_FILES": "*_tb.py",
        "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
    }
    # ... and a relative sys.executable (`.venv/bin/python -m pytest`, as make test runs it)
    # would not resolve in the simulator's working folder: the simulator would start the base
    # interpreter without the venv's site-packages and its editable-install finder.
    if not os.path.isabs(sys.executable):
        sys.executable = os.path.abspath(sys.executable)
    runner = _runner()
    error = []

    def run():
        try:
            runner.test(test_module=test_module, testcase=testcase, hdl_toplevel=top,
                        hdl_toplevel_lang="verilog", build_dir=build_dir, test_dir=run_dir,
                        extra_env=env, seed=seed, waves=waves, log_file=log_path)
        except (Exception, SystemExit) as e:      # cocotb's runner exits on failures
            error.append(e)

    start = time.monotonic()
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    while thread.is_alive():
        thread.join(0.5)
        if progress_label and progress_path.exists():
            try:
                got, total, cycle = progress_path.read_text().split()
            except ValueError:
                continue
            sys.stderr.write(f"\r  {progress_label}: {got}/{total} results, cycle {cycle}   ")
            sys.stderr.flush()
    if progress_label:
        sys.stderr.write("\r" + " " * 72 + "\r")
    if not result_path.exists():
        tail = log_path.read_text()[-3000:] if log_path.exists() else ""
        raise ToolError(f"simulation of {top} produced no result "
                        f"({error[0] if error else 'no error reported'}); log {log_path}:\n{tail}")
    return json.loads(result_path.read_text()), time.monotonic() - start
