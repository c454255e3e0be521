"""Registered building blocks for timing closure: restoring steps with one carry chain, a
pipelined exact square root, and per-consumer register copies of a shared operand.

A restoring division or square-root step asks whether ``cur >= sub`` and keeps ``cur - sub``
if so, ``cur`` otherwise. Written as a comparison and a separate subtraction
(``cur - Mux(cur >= sub, sub, 0)``), synthesis builds two carry chains one after the other;
:func:`compare_subtract` computes the difference once and takes the decision from its sign, so
a registered step is one carry chain and a multiplexer (UltraScale+: a LUT level before the
chain, one after).

:func:`sqrt_pipeline` is the exact digit-by-digit square root of
:func:`hwgen.ibert.golden.isqrt` (the algorithm of :class:`hwgen.ibert.isqrt.IntSqrt`, one
digit per register stage) built from these steps.

:func:`register_copies` gives each of several consumers (the lanes of a datapath) its own
register of a shared value. Synthesis merges flip-flops bit by bit when they have the same
input and the same initial value, so copies of one register differing only in their initial
values cannot be more than two; a binary tree of registers (children starting at 0 and at all
ones) keeps up to ``2**depth`` copies apart, each next to its consumer (e.g. the operand
registers of :func:`hwgen.lib.wide_mul.split_multiply`, which would otherwise be merged
across the lanes into one register driving every lane's multipliers).
"""

from amaranth.hdl import Cat, Const, Mux, Signal, Value, signed, unsigned

__all__ = ["compare_subtract", "register_copies", "sqrt_pipeline"]


def compare_subtract(m, cur, sub, *, name):
    """``(take, rest)``: ``take = cur >= sub`` and ``rest = cur - sub`` if ``take`` else
    ``cur``, for unsigned ``cur`` and ``sub``, from one subtraction: ``take`` is the inverted
    sign of ``cur - sub`` (a combinational signal named ``name`` holds the difference).
    ``rest`` has the width of ``cur``; the caller registers what it needs. ``sub`` may be a
    non-negative integer."""
    cur, sub = Value.cast(cur), Value.cast(sub)
    width = max(len(cur), len(sub)) + 1
    diff = Signal(signed(width), name=name)
    m.d.comb += diff.eq(cur - sub)
    take = ~diff[-1]
    return take, Mux(take, diff[:len(cur)], cur)


def sqrt_pipeline(m, v, valid, width, *, name="sqrt"):
    """Pipelined exact ``floor(sqrt(v))`` of an unsigned ``v`` below ``2**width`` (``width``
    even), one result digit (two input bits) per register stage.

    Digit ``j`` (from the top) compares ``hi = (v >> 2j) - root**2`` with ``4 * root + 1``;
    the stage holds only the bits that can be non-zero (``root``: ``n - j`` bits, ``hi``:
    ``n - j + 1``, ``n = width / 2``), exactly as :class:`hwgen.ibert.isqrt.IntSqrt`.

    Returns ``(root, valid, latency)``: ``root`` (``width / 2`` bits) and ``valid`` are
    registers ``latency = width / 2`` cycles after ``v`` and ``valid``. Free-running
    (initiation interval 1, no enable).
    """
    if width % 2 or width < 2:
        raise ValueError(f"sqrt_pipeline width must be even and at least 2, not {width}")
    n = width // 2
    low = v                                  # bits of v not yet brought into the remainder
    hi = Const(0, 1)                         # (rem >> 2(j+1)), at most n - j bits
    root = Const(0, 1)
    for j in range(n - 1, -1, -1):
        cur = Cat(low[2 * j:2 * j + 2], hi)              # rem >> 2j before this digit
        trial = Cat(Const(1, 2), root)                   # 4 * root + 1
        take, rest = compare_subtract(m, cur, trial, name=f"{name}_diff{j}")
        s_hi = Signal(unsigned(n - j + 1), name=f"{name}_hi{j}")
        s_root = Signal(unsigned(n - j), name=f"{name}_root{j}")
        s_valid = Signal(name=f"{name}_valid{j}")
        m.d.sync += [s_hi.eq(rest), s_root.eq(Cat(take, root)), s_valid.eq(valid)]
        if j:
            s_low = Signal(unsigned(2 * j), name=f"{name}_low{j}")
            m.d.sync += s_low.eq(low[:2 * j])
            low = s_low
        hi, root, valid = s_hi, s_root, s_valid
    return root, valid, n


def register_copies(m, value, count, depth, *, name, reset_less=False):
    """``count`` copies of ``value``, each ``depth`` registers later, through a binary tree of
    registers: a node's two children start at 0 and at all ones, so no two nodes have the same
    input and initial value and synthesis merges none of them. Returns a list of ``count``
    registers; they are all distinct while ``count <= 2**depth`` (beyond that, leaves are
    shared round robin). With ``count`` 1 it is a plain delay. ``reset_less``: registers
    without reset (a datapath's reset is one net to every copy, which the placer pulls
    together, away from the copies' loads)."""
    value = Value.cast(value)
    ones = -1 if value.shape().signed else (1 << len(value)) - 1
    level = [value]
    for d in range(depth):
        size = min(2 * len(level), max(count, 1))
        nodes = []
        for j in range(size):
            reg = Signal(value.shape(), init=ones if j % 2 else 0, name=f"{name}_l{d}_{j}",
                         reset_less=reset_less)
            m.d.sync += reg.eq(level[j // 2])
            nodes.append(reg)
        level = nodes
    return [level[k % len(level)] for k in range(count)]
