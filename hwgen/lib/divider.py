"""Iterative restoring integer divider.

:class:`Divider` computes ``floor(dividend / divisor)`` and ``dividend mod divisor`` of unsigned
integers by long division, MSB first, resolving ``bits_per_cycle`` quotient bits per cycle
(each a compare-and-subtract of ``divisor_bits + 1`` bits). It is small (one subtractor per
bit resolved per cycle) and exact; use it where a division is needed once per row or per
block, e.g. the reciprocal ``floor(2**32 / sum)`` of I-BERT's softmax or ``floor(2**31 / std)``
of its LayerNorm. A dividend that is a constant (driven by a ``Const``) costs no storage
after synthesis's constant propagation.

Python model: :func:`divide` (the same steps, for tests).
"""

from amaranth.hdl import Cat, Module, Mux, Signal, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

__all__ = ["Divider", "divide", "divider_cycles"]


def divider_cycles(dividend_bits, bits_per_cycle=1):
    """Iteration cycles of one division: ``ceil(dividend_bits / bits_per_cycle)``."""
    return -(-dividend_bits // bits_per_cycle)


def divide(dividend, divisor, dividend_bits, divisor_bits):
    """Restoring division exactly as :class:`Divider` performs it: ``(quotient, remainder)``.

    Equal to ``divmod(dividend, divisor)`` for a non-zero divisor; a zero divisor gives the
    all-ones quotient ``2**dividend_bits - 1`` and remainder ``dividend mod 2**divisor_bits``.
    """
    rem_mask = (1 << (divisor_bits + 1)) - 1
    rem, quo = 0, 0
    for k in range(dividend_bits - 1, -1, -1):
        rem = ((rem << 1) | ((dividend >> k) & 1)) & rem_mask
        take = rem >= divisor
        if take:
            rem -= divisor
        quo = (quo << 1) | int(take)
    return quo, rem & ((1 << divisor_bits) - 1)


class Divider(wiring.Component):
    """Iterative restoring divider of unsigned integers.

    Parameters
    ----------
    dividend_bits : int
        Width of the dividend and of the quotient.
    divisor_bits : int
        Width of the divisor and of the remainder.
    bits_per_cycle : int
        Quotient bits resolved per cycle (compare-subtract steps chained in one cycle);
        1 is the classic one-bit-per-cycle divider, larger values trade logic depth for
        fewer cycles.

    Members
    -------
    i : ``In(stream.Signature(StructLayout({"dividend": n, "divisor": k})))``
        Operand pairs (unsigned; ``n = dividend_bits``, ``k = divisor_bits``).
    o : ``Out(stream.Signature(StructLayout({"quotient": n, "remainder": k})))``
        ``floor(dividend / divisor)`` and ``dividend mod divisor``. A zero divisor gives the
        all-ones quotient and ``dividend mod 2**divisor_bits`` (see :func:`divide`).

    Timing
    ------
    One division at a time. An operand pair is accepted while the divider is idle; the
    ``N = ceil(dividend_bits / bits_per_cycle)`` iterations run in the ``N`` cycles after
    acceptance and ``o.valid`` rises in cycle ``N + 1`` (latency ``N + 1``). The result holds
    until taken; ``i.ready`` rises the cycle after the result is taken, so back-to-back
    divisions with an always-ready consumer start every ``N + 2`` cycles.

    Backpressure: ``i.ready`` is a register (it does not depend on ``o.ready`` or
    ``i.valid`` combinationally).
    """

    def __init__(self, dividend_bits, divisor_bits, bits_per_cycle=1):
        if dividend_bits < 1 or divisor_bits < 1:
            raise ValueError("dividend_bits and divisor_bits must be at least 1")
        if not 1 <= bits_per_cycle <= dividend_bits:
            raise ValueError(f"bits_per_cycle must be in 1..{dividend_bits}")
        self._n = dividend_bits
        self._k = divisor_bits
        self._step = bits_per_cycle
        super().__init__({
            "i": In(stream.Signature(data.StructLayout({
                "dividend": unsigned(dividend_bits), "divisor": unsigned(divisor_bits)}))),
            "o": Out(stream.Signature(data.StructLayout({
                "quotient": unsigned(dividend_bits), "remainder": unsigned(divisor_bits)}))),
        })

    @property
    def cycles(self):
        """Iteration cycles ``N`` of one division (latency ``N + 1``, period ``N + 2``)."""
        return divider_cycles(self._n, self._step)

    def elaborate(self, platform):
        m = Module()
        n_iter = self.cycles
        width = n_iter * self._step          # dividend zero-extended to whole iterations
        rem = Signal(self._k + 1)
        quo = Signal(width)                  # dividend bits shift out at the top, quotient in
        divisor = Signal(self._k)
        count = Signal(range(n_iter + 1))
        busy = Signal()

        m.d.comb += [
            self.i.ready.eq(~busy),
            self.o.payload.quotient.eq(quo[:self._n]),
            self.o.payload.remainder.eq(rem[:self._k]),
        ]
        with m.If(self.i.valid & self.i.ready):
            m.d.sync += [rem.eq(0), quo.eq(self.i.payload.dividend),
                         divisor.eq(self.i.payload.divisor), count.eq(n_iter), busy.eq(1)]

        r, q = rem, quo
        for _ in range(self._step):
            shifted = Cat(q[-1], r[:self._k])            # (r << 1) | next dividend bit
            take = shifted >= divisor
            r = Mux(take, shifted - divisor, shifted)
            q = Cat(take, q[:-1])
        with m.If(count != 0):
            m.d.sync += [rem.eq(r), quo.eq(q), count.eq(count - 1)]
            with m.If(count == 1):
                m.d.sync += self.o.valid.eq(1)
        with m.If(self.o.valid & self.o.ready):
            m.d.sync += [self.o.valid.eq(0), busy.eq(0)]
        return m
