"""hwgen.lib.registered: the one-chain compare-and-subtract step, the pipelined square root
(against ``golden.isqrt`` around squares, at the ends of the range and on random values) and
the register copies that synthesis cannot merge (Amaranth's simulator)."""

import gc
import math
import warnings

import numpy as np
import pytest
from amaranth.hdl import Module, Signal, UnusedElaboratable, unsigned
from amaranth.sim import Simulator

from hwgen.ibert import golden
from hwgen.lib.registered import compare_subtract, register_copies, sqrt_pipeline


def _run(m, bench, clock=True):
    sim = Simulator(m)
    if clock:
        sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()


def test_compare_subtract_every_pair_of_small_operands():
    m = Module()
    cur, sub = Signal(5), Signal(4)
    take, rest = compare_subtract(m, cur, sub, name="diff")
    t, r = Signal(), Signal(5)
    m.d.comb += [t.eq(take), r.eq(rest)]

    async def bench(ctx):
        for a in range(32):
            for b in range(16):
                ctx.set(cur, a)
                ctx.set(sub, b)
                assert (ctx.get(t), ctx.get(r)) == ((1, a - b) if a >= b else (0, a))

    _run(m, bench, clock=False)


@pytest.mark.parametrize("width", [2, 8, 32, 40])
def test_sqrt_pipeline_matches_golden(width):
    """One value per cycle in, the root ``width / 2`` cycles later, for values around every
    square (all of them at 8 bits) and random values; 0 and ``2**width - 1`` included."""
    rng = np.random.default_rng(width)
    top = (1 << width) - 1
    if width <= 8:
        values = list(range(top + 1))
    else:
        s = rng.integers(0, math.isqrt(top) + 1, size=600)
        values = [v for x in s.tolist() for v in (x * x - 1, x * x, x * x + x, (x + 1) ** 2 - 1)
                  if 0 <= v <= top]
        values += rng.integers(0, top, size=600, endpoint=True).tolist() + [0, 1, top]
    m = Module()
    v, valid = Signal(unsigned(width)), Signal()
    root, root_valid, latency = sqrt_pipeline(m, v, valid, width, name="sq")
    assert latency == width // 2
    got = []

    async def bench(ctx):
        for k in range(len(values) + latency):
            ctx.set(v, values[k] if k < len(values) else 0)
            ctx.set(valid, int(k < len(values)))
            await ctx.tick()
            if ctx.get(root_valid):
                got.append(ctx.get(root))

    _run(m, bench)
    want = [math.isqrt(x) for x in values]
    if width <= 32:
        assert want == golden.isqrt(np.array(values, dtype=np.int64)).tolist()
    assert got == want


def test_sqrt_pipeline_width_is_validated():
    with warnings.catch_warnings():         # the modules, never elaborated
        warnings.simplefilter("ignore", UnusedElaboratable)
        for width in (0, 3):
            with pytest.raises(ValueError):
                sqrt_pipeline(Module(), Signal(4), Signal(), width)
        gc.collect()


@pytest.mark.parametrize("count, depth", [(1, 3), (8, 3), (5, 3), (16, 3), (3, 1)])
def test_register_copies(count, depth):
    """Each copy is ``depth`` registers after the value; no two registers of the tree share
    both their input and their initial value (so synthesis merges none), and the copies are
    distinct registers as long as ``count <= 2**depth``."""
    m = Module()
    value = Signal(6)
    copies = register_copies(m, value, count, depth, name="c")
    assert len(copies) == count
    assert len({id(c) for c in copies}) == min(count, 1 << depth)
    seen = set()
    for stmt in m._statements["sync"]:
        key = (repr(stmt.rhs), stmt.lhs.init)
        assert key not in seen
        seen.add(key)

    async def bench(ctx):
        for k in range(depth + 4):
            ctx.set(value, (5 * k + 3) % 64)
            await ctx.tick()
            if k >= depth - 1:
                want = (5 * (k - depth + 1) + 3) % 64
                assert all(ctx.get(c) == want for c in copies)

    _run(m, bench)
