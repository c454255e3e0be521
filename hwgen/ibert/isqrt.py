"""Exact integer square root for I-BERT's LayerNorm: the restoring digit-by-digit algorithm of
:func:`hwgen.ibert.golden.isqrt`, one digit (two input bits) per pipeline stage.

The golden model keeps the whole remainder ``rem`` (initially ``v``) and, at digit ``j`` (from
the top), compares it with ``(4 * root + 1) << 2j``. The low ``2j`` bits of that operand are
zero, so the step only touches ``hi = rem >> 2j``: ``take = hi >= 4 * root + 1``, ``hi -= take *
(4 * root + 1)``, ``root = 2 * root + take``; bits below ``2j`` are still the untouched bits of
``v``. The hardware computes exactly this, holding in each stage only the bits that can be non
zero: after digit ``j`` the partial root is ``isqrt(v >> 2j)`` (``n - j`` bits for ``n =
width / 2`` digits) and ``hi = (v >> 2j) - root**2 <= 2 * root``, ``n - j + 1`` bits.
``tests/test_ibert_isqrt.py`` proves the algorithm on every 32-bit input (C transcription of the
golden steps) and tests this unit against the golden model on Verilator.
"""

from amaranth.hdl import Cat, Const, Module, Mux, Signal, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

__all__ = ["IntSqrt", "isqrt_layouts"]


def isqrt_layouts(width):
    """Payload layouts ``(input, output)`` of :class:`IntSqrt`: ``{"v"}`` and ``{"root"}``."""
    return (data.StructLayout({"v": unsigned(width)}),
            data.StructLayout({"root": unsigned(width // 2)}))


class IntSqrt(wiring.Component):
    """Pipelined exact floor square root.

    Parameters
    ----------
    width : int
        Input bits (even, 2..64); the root has ``width / 2`` bits. Values below ``2**width``
        give the same root as :func:`golden.isqrt` (whose 16 steps run on 32 bits: leading
        steps of a narrower unit would take no digit).

    Members
    -------
    i : ``In(stream.Signature(StructLayout({"v": unsigned(width)}), always_ready=True))``
        Radicands, one per cycle at most.
    o : ``Out(stream.Signature(StructLayout({"root": unsigned(width // 2)}), always_ready=True))``
        ``root = floor(sqrt(v))``, in order.

    Timing
    ------
    Latency ``width / 2`` cycles (one register per digit), initiation interval 1. The pipeline
    is free-running: there is no backpressure, so the consumer takes every result (wrap it with
    :class:`hwgen.lib.pipeline.CreditBuffer` to give it a stream interface with backpressure).
    """

    def __init__(self, width=32):
        if width % 2 or not 2 <= width <= 64:
            raise ValueError(f"IntSqrt width must be even and in 2..64, not {width}")
        self._width = width
        layout_in, layout_out = isqrt_layouts(width)
        super().__init__({
            "i": In(stream.Signature(layout_in, always_ready=True)),
            "o": Out(stream.Signature(layout_out, always_ready=True)),
        })

    @property
    def latency(self):
        """Cycles from an input handshake to its root on the output: ``width / 2`` (one
        register per result digit)."""
        return self._width // 2

    def elaborate(self, platform):
        m = Module()
        n = self._width // 2
        v = self.i.payload.v
        low = v                                  # bits of v not yet brought into the remainder
        hi = Const(0, 1)                         # (rem >> 2(j+1)), at most n - j bits
        root = Const(0, 1)
        valid = self.i.valid
        for j in range(n - 1, -1, -1):
            cur = Cat(low[2 * j:2 * j + 2], hi)              # rem >> 2j before this digit
            trial = Cat(Const(1, 2), root)                   # 4 * root + 1
            take = cur >= trial
            s_hi = Signal(unsigned(n - j + 1), name=f"hi{j}")
            s_root = Signal(unsigned(n - j), name=f"root{j}")
            s_valid = Signal(name=f"valid{j}")
            m.d.sync += [
                s_hi.eq(cur - Mux(take, trial, 0)),
                s_root.eq(Cat(take, root)),
                s_valid.eq(valid),
            ]
            if j:
                s_low = Signal(unsigned(2 * j), name=f"low{j}")
                m.d.sync += s_low.eq(low[:2 * j])
                low = s_low
            hi, root, valid = s_hi, s_root, s_valid
        m.d.comb += [self.o.valid.eq(valid), self.o.payload.root.eq(root)]
        return m
