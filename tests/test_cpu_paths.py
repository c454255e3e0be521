"""The float-sensitive reference tests under every CPU kernel path PyTorch offers here.

torch picks its vector kernels (``ATEN_CPU_CAPABILITY``: ``default``, ``avx2``, ``avx512``)
and its thread count per machine, and both change the order and the instructions of float32
reductions. A comparison with torch, transformers or sentence-transformers floats that holds
for one of them only fails on some user's machine (issue: LayerNorm passed on an AMD EPYC and
failed on an Intel Xeon). Every test marked ``float_reference`` is run again in a fresh
process under each capability this processor supports, with 1 and with 2 torch threads
(``HWGEN_TORCH_THREADS=1,2``: ``tests/conftest.py`` runs each marked test once per count and
keeps torch at that count whatever the code under test asks for). One process per capability
(torch reads ``ATEN_CPU_CAPABILITY`` once, at import) runs both counts; the capability torch
picks by itself is left to the suite's own run when that run pins both counts (``make test``
does).
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="the CPU paths are torch's (torch==2.13.0)")

ROOT = Path(__file__).resolve().parents[1]


def marked_files():
    """The test files that hold ``float_reference`` tests (the sub-runs collect only these)."""
    here = Path(__file__).resolve()
    return sorted(str(p.relative_to(ROOT)) for p in here.parent.glob("test_*.py")
                  if p != here and "mark.float_reference" in p.read_text())


def _flags():
    try:
        return set(Path("/proc/cpuinfo").read_text().split())
    except OSError:
        return set()


def capabilities():
    """The ``ATEN_CPU_CAPABILITY`` values this processor can run (x86: every level up to its
    own; elsewhere only torch's own choice)."""
    flags = _flags()
    caps = ["default"]
    if "avx2" in flags:
        caps.append("avx2")
    if {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= flags:
        caps.append("avx512")
    return caps


THREADS = (1, 2)


def covered_here():
    """The capability this run already covers at every count of :data:`THREADS`: torch's own
    choice, when this process pins them all (``make test`` sets ``HWGEN_TORCH_THREADS=1,2``,
    so its float-reference tests run at 1 and 2 threads in the suite itself); else None."""
    from conftest import _pinned_threads
    if set(THREADS) <= set(_pinned_threads()):
        return torch.backends.cpu.get_cpu_capability().lower()
    return None


def sub_run_capabilities():
    return [c for c in capabilities() if c != covered_here()]


@pytest.mark.parametrize("capability", sub_run_capabilities())
def test_float_references_on_every_cpu_path(capability):
    env = dict(os.environ, ATEN_CPU_CAPABILITY=capability,
               HWGEN_TORCH_THREADS=",".join(map(str, THREADS)),
               HWGEN_EXPECT_CPU_CAPABILITY=capability)
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", "-p", "no:xdist",
         "-m", "float_reference", "--no-header", "-rfE", *marked_files()],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
    tail = run.stdout[-4000:] + run.stderr[-2000:]
    assert run.returncode == 0, f"{capability}, {THREADS} threads:\n{tail}"
    summary = run.stdout.strip().splitlines()[-1]
    assert " passed" in summary, tail
    for n in THREADS:                              # each marked test ran at each count
        assert f"threads{n}" in run.stdout, tail
    # under CI=true a skip in the sub-run is a failure (tests/conftest.py), so the return
    # code above already refuses it
