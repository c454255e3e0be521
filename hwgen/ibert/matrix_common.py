"""Pieces shared by the I-BERT matrix kernels (Linear, attention dot product, softmax x V).

* :class:`GroupSerializer`: the output stage of a PE array whose PEs finish together. A group
  of up to ``lanes`` results is captured at once and sent one result per cycle through a FIFO
  with credit-based admission, so the PE array never stalls on a combinational ``ready`` path.
* :func:`matrix_sizes`: how the stimulus of a matrix kernel splits ``items`` rows into
  matrices (M = 1, odd M, maximum M, random M).
* :func:`extreme_int8`: int8 test matrices at range extremes.
"""

from amaranth.hdl import Module, Mux, Signal
from amaranth.lib import data, fifo, stream, wiring
from amaranth.lib.wiring import In, Out

import numpy as np

from ..lib.intmath import ceil_div

__all__ = ["GroupSerializer", "ceil_div", "matrix_sizes", "matrix_int8", "extreme_int8",
           "random_int8"]


class GroupSerializer(wiring.Component):
    """Serialise groups of results computed together into a stream of single results.

    Parameters
    ----------
    shape : shape-like
        One result (usually a ``StructLayout`` including a 1-bit ``last``).
    lanes : int
        Largest group.
    latency : int
        Cycles from a group's admission (``take``) to its results on ``i_items`` (``i_valid``).

    Members
    -------
    take : ``In(1)``
        Admit a group of ``count`` results this cycle (only while ``ready``).
    count : ``In(range(lanes + 1))``
        Size of the admitted group.
    ready : ``Out(1)``
        A full group can be admitted: the FIFO will have room for it. A register compare.
    i_valid : ``In(1)``
        The admitted group's results are on ``i_items``, ``latency`` cycles after ``take``.
    i_items : ``In(data.ArrayLayout(shape, lanes))``
        Results; elements ``0 .. count-1`` are sent in that order.
    i_count : ``In(range(lanes + 1))``
        ``count`` of the group on ``i_items``.
    o : ``Out(stream.Signature(shape))``
        One result per beat.

    Timing
    ------
    Result ``k`` of a group enters the FIFO ``k + 1`` cycles after ``i_valid`` and can leave it
    two cycles later. The caller guarantees that consecutive groups reach ``i_items`` at least
    ``count`` (of the earlier group) cycles apart: one shift register holds one group.
    The FIFO holds ``latency + 3 * lanes + 4`` results, enough that admission never waits
    while ``o`` is always ready and groups are admitted no faster than one result per cycle.
    """

    def __init__(self, shape, *, lanes, latency):
        self._shape = shape
        self._lanes = lanes
        self.depth = latency + 3 * lanes + 4
        super().__init__({
            "take": In(1),
            "count": In(range(lanes + 1)),
            "ready": Out(1),
            "i_valid": In(1),
            "i_items": In(data.ArrayLayout(shape, lanes)),
            "i_count": In(range(lanes + 1)),
            "o": Out(stream.Signature(shape)),
        })

    def elaborate(self, platform):
        m = Module()
        lanes = self._lanes
        width = data.ArrayLayout(self._shape, 1).size
        m.submodules.fifo = buf = fifo.SyncFIFOBuffered(width=width, depth=self.depth)

        held = Signal(data.ArrayLayout(self._shape, lanes))
        remaining = Signal(range(lanes + 1))
        with m.If(self.i_valid):
            m.d.sync += [held.eq(self.i_items), remaining.eq(self.i_count)]
        with m.Elif(remaining != 0):
            for k in range(lanes - 1):
                m.d.sync += held[k].eq(held[k + 1])
            m.d.sync += remaining.eq(remaining - 1)
        m.d.comb += [
            buf.w_data.eq(held[0]),
            buf.w_en.eq(remaining != 0),
            self.o.payload.eq(buf.r_data),
            self.o.valid.eq(buf.r_rdy),
            buf.r_en.eq(self.o.ready),
        ]

        # Results admitted and not yet delivered; admission keeps it <= depth.
        pending = Signal(range(self.depth + 1))
        popped = self.o.valid & self.o.ready
        m.d.sync += pending.eq(pending + Mux(self.take, self.count, 0) - popped)
        m.d.comb += self.ready.eq(pending <= self.depth - lanes)
        return m


# -- stimulus helpers ----------------------------------------------------------------------------

def matrix_sizes(items, max_len, rng, *, first=(1, 7)):
    """Split ``items`` rows into matrices: ``first`` sizes (M = 1 and an odd M), then the
    maximum ``max_len``, then random sizes in ``1 .. max_len``; the last matrix takes the
    remainder so the sizes add up to ``items``."""
    sizes, left = [], items
    plan = [min(s, max_len) for s in first] + [max_len]
    while left > 0:
        want = plan.pop(0) if plan else int(rng.integers(1, max_len, endpoint=True))
        take = min(want, left)
        sizes.append(take)
        left -= take
    return sizes


def random_int8(rng, shape):
    """A uniformly random int8 matrix (values -128 .. 127, int64 dtype) of ``shape``."""
    return rng.integers(-128, 127, size=shape, endpoint=True)


def extreme_int8(kind, shape):
    """An int8 matrix of one extreme kind: ``"min"`` (all -128), ``"max"`` (all 127) or
    ``"alternate"`` (-128 and 127 in a checkerboard)."""
    if kind == "min":
        return np.full(shape, -128, dtype=np.int64)
    if kind == "max":
        return np.full(shape, 127, dtype=np.int64)
    idx = np.indices(shape).sum(axis=0)
    return np.where(idx % 2 == 0, -128, 127).astype(np.int64)


def matrix_int8(kind, shape, rng):
    """An int8 test matrix: ``"min"``, ``"max"``, ``"alternate"`` (:func:`extreme_int8`),
    ``"random"`` (uniform, with some rows all -128 or all 127) or ``"realistic"``
    (activation-like: a rounded normal distribution of sigma 24, clipped to int8)."""
    if kind in ("min", "max", "alternate"):
        return extreme_int8(kind, shape)
    if kind == "realistic":
        return np.clip(np.rint(rng.normal(0, 24, size=shape)), -128, 127).astype(np.int64)
    x = random_int8(rng, shape)
    if shape[0] > 2:
        rows = rng.choice(shape[0], size=2, replace=False)
        x[rows[0]], x[rows[1]] = -128, 127
    return x
