"""The exact integer square root of I-BERT's LayerNorm.

(a) The golden algorithm (``golden.isqrt``: 16 restoring steps), transcribed to C
    (``tests/isqrt_check.c``), gives ``r*r <= v < (r+1)**2`` for every ``v < 2**32``.
(b) ``golden.isqrt`` (numpy) equals the C transcription (and Python's ``math.isqrt``) around
    every square below ``2**32`` and on random values.
(c) The RTL unit :class:`hwgen.ibert.isqrt.IntSqrt` equals ``golden.isqrt`` on Verilator on
    values around squares, random values, 0 and ``2**32 - 1``, with random input gaps and output
    backpressure (the unit wrapped with a credit FIFO in a small test harness).
"""

import gc
import math
import os
import shutil
import subprocess
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from amaranth.hdl import Module, UnusedElaboratable
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from hwgen.config import Config, param
from hwgen.flow.model import StreamModel
from hwgen.flow.simulate import simulate
from hwgen.flow.tools import cache_dir
from hwgen.ibert import golden
from hwgen.ibert.isqrt import IntSqrt, isqrt_layouts
from hwgen.lib.pipeline import CreditBuffer

from conftest import requires_verilator

C_SOURCE = Path(__file__).with_name("isqrt_check.c")
requires_gcc = pytest.mark.skipif(shutil.which("gcc") is None,
                                  reason="needs gcc to compile tests/isqrt_check.c")


@pytest.fixture(scope="module")
def c_isqrt():
    """The compiled C transcription (built once per session in the build cache)."""
    out = cache_dir() / "isqrt-check"
    out.mkdir(parents=True, exist_ok=True)
    exe = out / "isqrt_check"
    for flags in (["-O3", "-march=native"], ["-O3"]):      # -march=native: vectorised loop
        done = subprocess.run(["gcc", *flags, "-o", str(exe), str(C_SOURCE)],
                              capture_output=True, text=True)
        if done.returncode == 0:
            return exe
    pytest.fail(f"gcc could not compile {C_SOURCE}:\n{done.stderr}")


def square_boundaries():
    """``s*s - 1, s*s, s*s + s, (s+1)**2 - 1`` for every ``s < 65536`` (within 0 .. 2**32-1)."""
    s = np.arange(1 << 16, dtype=np.int64)
    values = np.concatenate([s * s - 1, s * s, s * s + s, (s + 1) ** 2 - 1])
    return np.unique(values[(values >= 0) & (values < 1 << 32)])


@requires_gcc
def test_c_transcription_exact_for_every_32_bit_input(c_isqrt):
    """All 2**32 inputs, split over the available cores."""
    parts = os.cpu_count() or 1
    bounds = [(k * 65536 // parts, (k + 1) * 65536 // parts) for k in range(parts)]

    def run(bound):
        done = subprocess.run([str(c_isqrt), "all", str(bound[0]), str(bound[1])],
                              capture_output=True, text=True, timeout=600)
        return done.returncode, done.stdout.split()

    with ThreadPoolExecutor(parts) as pool:
        results = list(pool.map(run, bounds))
    for (code, (bad, first)), bound in zip(results, bounds):
        assert code == 0 and bad == "0", f"isqrt wrong for v={first} ({bad} failures in " \
                                         f"{bound[0] << 16:#x}..{bound[1] << 16:#x})"


@requires_gcc
def test_c_checker_detects_a_wrong_root(c_isqrt, tmp_path):
    """The exhaustive check can fail: a transcription with one step's comparison off by one
    (``>`` instead of ``>=``) is reported, with the first failing value."""
    wrong = tmp_path / "wrong.c"
    wrong.write_text(C_SOURCE.read_text().replace("rem >= sub", "rem > sub"))
    exe = tmp_path / "wrong"
    subprocess.run(["gcc", "-O2", "-o", str(exe), str(wrong)], check=True)
    done = subprocess.run([str(exe), "all", "0", "1"], capture_output=True, text=True)
    bad, first = done.stdout.split()
    assert done.returncode == 1 and int(bad) > 0 and int(first) == 1     # isqrt(1) would be 0


@requires_gcc
def test_golden_equals_c_transcription(c_isqrt):
    rng = np.random.default_rng(11)
    values = np.concatenate([square_boundaries(), [0, 1, 2, 3, (1 << 32) - 1],
                             rng.integers(0, 1 << 32, size=200_000, dtype=np.int64),
                             rng.integers(0, 1 << 32, size=50_000, dtype=np.int64)
                             >> rng.integers(0, 32, size=50_000)])
    done = subprocess.run([str(c_isqrt), "roots"], input="\n".join(map(str, values)) + "\n",
                          capture_output=True, text=True, check=True)
    c_roots = np.array(done.stdout.split(), dtype=np.int64)
    gold = golden.isqrt(values)
    assert len(c_roots) == len(values)
    np.testing.assert_array_equal(gold, c_roots)
    some = values[:: 97]
    np.testing.assert_array_equal(golden.isqrt(some), [math.isqrt(int(v)) for v in some])


def test_golden_wide_inputs():
    """Beyond 2**32 (LayerNorm variances at small shifts) the root is still exact: around
    squares of up to 31 bits and at the 2**32 boundary, against Python's ``math.isqrt``."""
    rng = np.random.default_rng(5)
    s = np.concatenate([rng.integers(1 << 16, 1 << 31, size=2000), [1 << 16, (1 << 31) - 1]])
    values = np.concatenate([s * s - 1, s * s, s * s + s, (s + 1) ** 2 - 1,
                             [(1 << 32) - 1, 1 << 32, (1 << 62) - 1]])
    np.testing.assert_array_equal(golden.isqrt(values), [math.isqrt(int(v)) for v in values])


def test_golden_rejects_out_of_range():
    with pytest.raises(ValueError):
        golden.isqrt(np.array([1 << 62]))
    with pytest.raises(ValueError):
        golden.isqrt(np.array([-1]))


# -- (c) the RTL unit on Verilator --------------------------------------------------------------

@dataclass(frozen=True)
class IsqrtHarnessConfig(Config):
    width: int = param(32, "input bits of the square-root unit", lo=2, hi=64)


class IsqrtHarness(wiring.Component):
    """:class:`IntSqrt` behind credit admission: ``i_v`` (backpressured) -> ``o_root``."""

    def __init__(self, config):
        self._width = config.width
        layout_in, layout_out = isqrt_layouts(config.width)
        super().__init__({"i_v": In(stream.Signature(layout_in)),
                          "o_root": Out(stream.Signature(layout_out))})

    def elaborate(self, platform):
        m = Module()
        m.submodules.sqrt = sqrt = IntSqrt(self._width)
        m.submodules.out = out = CreditBuffer(sqrt.o.payload.shape(), latency=sqrt.latency)
        wiring.connect(m, wiring.flipped(self.o_root), out.o)
        accept = self.i_v.valid & out.ready
        m.d.comb += [
            self.i_v.ready.eq(out.ready),
            out.take.eq(accept),
            sqrt.i.valid.eq(accept),
            sqrt.i.payload.eq(self.i_v.payload),
            out.i.valid.eq(sqrt.o.valid),
            out.i.payload.eq(sqrt.o.payload),
        ]
        return m


class IsqrtModel(StreamModel):
    result_port = "o_root"
    latency_from = "i_v"

    @staticmethod
    def stimulus(config, items, rng):
        """0, 1, 2**32 - 1 and its neighbours, then values around random squares (``s*s - 1``,
        ``s*s``, ``s*s + s``, ``(s+1)**2 - 1``, ``s`` over the whole range and near 0 and
        65535), uniform values and values of random bit lengths."""
        top = (1 << config.width) - 1
        n = 1 << (config.width // 2)
        s = np.concatenate([np.arange(min(n, 40)), np.arange(max(n - 40, 0), n),
                            rng.integers(0, n, size=items // 8)]).astype(np.int64)
        around = np.concatenate([s * s - 1, s * s, s * s + s, (s + 1) ** 2 - 1])
        uniform = rng.integers(0, top, size=items // 4, endpoint=True, dtype=np.int64)
        lengths = rng.integers(0, config.width + 1, size=items // 4)
        short = rng.integers(0, top, size=items // 4, endpoint=True, dtype=np.int64) >> \
            (config.width - lengths)
        values = np.concatenate([[0, 1, 2, 3, top, top - 1, top - 2], around, uniform, short])
        values = values[(values >= 0) & (values <= top)]
        return {"v": rng.permutation(values)}

    @staticmethod
    def inputs(config, stim):
        return {"i_v": [{"v": int(v)} for v in stim["v"]]}

    @staticmethod
    def expect(config, stim):
        return {"o_root": [{"root": int(r)} for r in golden.isqrt(stim["v"])]}


class IsqrtBench:
    """What :func:`hwgen.flow.simulate.simulate` needs of an accelerator, without the registry."""

    name = "ibert-isqrt-harness"
    top_name = "ibert_isqrt_harness"
    testbench = "hwgen.sim.stream_tb"
    default_items = 4000
    model = IsqrtModel

    @staticmethod
    def build_core(config):
        return IsqrtHarness(config)


@requires_verilator
@pytest.mark.parametrize("stall,width", [(0.3, 32), (0.0, 32), (0.3, 40)])
def test_rtl_isqrt_matches_golden(stall, width):
    """32 bits, and 40 (the variance of MiniLM's LayerNorm at its calibrated shift 5)."""
    cfg = IsqrtHarnessConfig(width=width)
    result = simulate(IsqrtBench, cfg, items=4000, seed=21, stall=stall, engine="native")
    assert not result["timeout"]
    assert result["mismatches"] == 0, result["first_mismatches"]
    stim = IsqrtModel.stimulus(cfg, 4000, np.random.default_rng(21))
    assert {0, (1 << width) - 1} <= set(stim["v"].tolist())
    assert result["results"] == len(stim["v"])
    if stall == 0:
        # Fully pipelined: one root per cycle, width / 2 stages plus the output FIFO.
        assert result["results_per_cycle"] == 1.0
        assert result["latency_cycles"] == cfg.width // 2 + 2


@requires_verilator
def test_harness_detects_wrong_roots(monkeypatch):
    """A golden model off by one on a few values must produce mismatches."""
    cfg = IsqrtHarnessConfig(width=32)
    real = golden.isqrt
    monkeypatch.setattr(golden, "isqrt", lambda v: real(v) + (np.asarray(v) % 1000 == 7))
    result = simulate(IsqrtBench, cfg, items=4000, seed=21, stall=0.3, engine="native")
    assert result["mismatches"] > 0


def test_isqrt_width_is_validated():
    with warnings.catch_warnings():         # the rejected, never elaborated objects
        warnings.simplefilter("ignore", UnusedElaboratable)
        for width in (0, 3, 66):
            with pytest.raises(ValueError):
                IntSqrt(width)
        gc.collect()
