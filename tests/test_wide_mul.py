"""hwgen.lib.wide_mul: split, pipelined multipliers are exact and have the latency they state."""

import random
import re

import pytest
from amaranth.hdl import Module, Signal, signed, unsigned
from amaranth.sim import Simulator

from hwgen.lib.wide_mul import _const_pieces, _pieces, split_multiply, split_multiply_stages


def _extremes(shape):
    lo, hi = (-(1 << (shape.width - 1)), (1 << (shape.width - 1)) - 1) if shape.signed \
        else (0, (1 << shape.width) - 1)
    return lo, hi


def _check(a_shape, b, n=60, seed=0):
    """Drive ``n`` operand pairs back to back (extremes first) and compare every product."""
    m = Module()
    a = Signal(a_shape)
    b_sig = b if isinstance(b, int) else Signal(b)
    product, stages = split_multiply(m, a, b_sig, name="p")
    assert stages == split_multiply_stages(a_shape, b if isinstance(b, int) else b)
    rng = random.Random(seed)
    alo, ahi = _extremes(a_shape)
    blo, bhi = (b, b) if isinstance(b, int) else _extremes(b)
    pairs = [(x, y) for x in (alo, ahi, 0, -1 if alo < 0 else 1) for y in (blo, bhi)]
    pairs += [(rng.randint(alo, ahi), rng.randint(blo, bhi)) for _ in range(n)]
    got = []

    async def bench(ctx):
        for k in range(len(pairs) + stages):
            if k < len(pairs):
                ctx.set(a, pairs[k][0])
                if not isinstance(b, int):
                    ctx.set(b_sig, pairs[k][1])
            await ctx.tick()
            if k + 1 >= stages:
                got.append(ctx.get(product))

    sim = Simulator(m)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    want = [x * y for x, y in pairs]
    # ``stages`` registers: the product of the pair set before tick k appears after tick
    # k + stages - 1 (a 0-stage product is combinational, not used here).
    assert got[:len(want)] == want


CASES = [
    (signed(8), signed(7)),            # one native multiplier, no tree
    (signed(18), signed(18)),
    (unsigned(17), unsigned(17)),
    (signed(32), signed(16)),          # 2 partials
    (signed(32), signed(21)),          # 4 partials, two levels
    (signed(35), unsigned(40)),        # 2 x 3 partials
    (unsigned(20), signed(3)),
    (signed(32), 1305670129),          # I-BERT requantisation multiplier
    (signed(24), 5859375),
    (signed(20), -70001),
    (signed(12), 3),
    (signed(40), (1 << 40) + 5),       # a zero middle digit is left out
    (signed(9), 1 << 20),              # only a high digit: a shifted register
]


@pytest.mark.parametrize("a_shape, b", CASES, ids=[str(c) for c in range(len(CASES))])
def test_split_multiply_exact(a_shape, b):
    _check(a_shape, b)


def test_pieces_fit_native_multipliers():
    for width in range(1, 70):
        for shape in (signed(width), unsigned(width)):
            pieces = _pieces(shape)
            assert sum(w for _, w, _ in pieces) == width
            assert all(w <= (18 if s else 17) for _, w, s in pieces)
    for value in (0, 1, -1, 131071, 131072, -131072, -131073, 2 ** 63 - 1, -2 ** 63, 5 << 40):
        digits = _const_pieces(value)
        assert sum(d << off for off, d in digits) == value
        assert all(-(1 << 17) <= d < (1 << 17) for _, d in digits)


def test_stage_counts():
    assert split_multiply_stages(signed(18), signed(18)) == 2
    assert split_multiply_stages(signed(32), signed(16)) == 3
    assert split_multiply_stages(signed(32), signed(21)) == 4
    assert split_multiply_stages(signed(32), 1305670129) == 4
    assert split_multiply_stages(signed(8), 1305670129) == 3
    assert split_multiply_stages(signed(8), 0) == 0


def test_one_input_register_per_multiplier():
    """Each 17-bit piece of a 32-bit operand times a two-digit constant feeds two multipliers:
    it gets two registers, with reset values that keep synthesis from merging them."""
    from amaranth.back import rtlil

    m = Module()
    a, y = Signal(signed(32)), Signal(signed(64))
    product, _ = split_multiply(m, a, 1305670129, name="p")
    m.d.comb += y.eq(product)
    text = rtlil.convert(m, ports=[a, y])
    assert {"p_a0_0", "p_a0_1", "p_a17_0", "p_a17_1"} <= \
        set(re.findall(r"\\(p_a\d+_\d)\b", text))
    assert "attribute \\init 17'11111111111111111" in text
