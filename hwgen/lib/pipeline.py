"""Building blocks for free-running, fully pipelined datapaths with stream backpressure.

hwgen's arithmetic pipelines never stall internally: every stage advances each cycle, and
backpressure is handled at the entrance by credits. :class:`CreditBuffer` holds a FIFO deep
enough for everything that may be in flight; the pipeline only accepts a new item while the
FIFO is guaranteed to have room for it when it comes out. ``ready`` towards the producer is
therefore a register compare, never a combinational path from the consumer's ``ready``.

:func:`adder_tree` adds up a list of values with one register per tree level; :func:`delay`
matches side-band signals (valid, tags) to a datapath's latency.
"""

from amaranth.hdl import Const, Module, Mux, Shape, Signal, signed, unsigned
from amaranth.lib import fifo, memory, stream, wiring
from amaranth.lib.wiring import In, Out

__all__ = ["BlockRAMFIFO", "CreditBuffer", "SkidBuffer", "adder_tree", "delay", "sum_shape"]


class CreditBuffer(wiring.Component):
    """Output FIFO of a free-running pipeline, with credit-based admission.

    Parameters
    ----------
    shape : shape-like
        Payload shape of the results.
    latency : int
        Maximum number of cycles between an item being admitted (``take``) and its result
        appearing on ``i`` (``i.valid`` high).
    depth : int, optional
        FIFO depth; default ``latency + 3``, the smallest that sustains one item per cycle
        through the buffered FIFO's extra output register.
    registered_ready : bool, optional
        Keep ``ready`` in a register of its own (updated beside the count, by an equality)
        instead of comparing the count of pending items with ``depth`` after its register:
        the same value every cycle, with no carry chain in front of the pipeline's
        admission. Default False (the rows measured before this option kept).

    Members
    -------
    take : ``In(1)``
        The pipeline admits one item this cycle. Only legal while ``ready`` is high.
    ready : ``Out(1)``
        An item may be admitted: the FIFO will have room for its result. ``pending < depth``
        of the registered count of pending items, or a register (``registered_ready``).
    i : ``In(stream.Signature(shape))``
        Results entering the FIFO. ``i.ready`` is constant 1 (room is guaranteed by credits).
    o : ``Out(stream.Signature(shape))``
        Results to the consumer, with normal valid/ready backpressure.

    Latency is that of :class:`amaranth.lib.fifo.SyncFIFOBuffered` (2 cycles from ``i`` to ``o``);
    initiation interval 1.
    """

    def __init__(self, shape, *, latency, depth=None, registered_ready=False):
        self._shape = shape
        self._registered_ready = registered_ready
        self._depth = depth if depth is not None else latency + 3
        if self._depth < 1:
            raise ValueError("CreditBuffer depth must be at least 1")
        super().__init__({
            "take": In(1),
            "ready": Out(1),
            "i": In(stream.Signature(shape)),
            "o": Out(stream.Signature(shape)),
        })

    @property
    def depth(self):
        """FIFO depth in results: the most items admitted and not yet delivered on ``o``."""
        return self._depth

    def elaborate(self, platform):
        m = Module()
        width = Shape.cast(self._shape).width
        m.submodules.fifo = buf = fifo.SyncFIFOBuffered(width=width, depth=self._depth)
        m.d.comb += [
            buf.w_data.eq(self.i.payload),
            buf.w_en.eq(self.i.valid),
            self.i.ready.eq(1),
            self.o.payload.eq(buf.r_data),
            self.o.valid.eq(buf.r_rdy),
            buf.r_en.eq(self.o.ready),
        ]
        # Items admitted and not yet delivered; admission keeps it <= depth.
        pending = Signal(range(self._depth + 1))
        popped = self.o.valid & self.o.ready
        with m.If(self.take & ~popped):
            m.d.sync += pending.eq(pending + 1)
        with m.Elif(~self.take & popped):
            m.d.sync += pending.eq(pending - 1)
        if not self._registered_ready:
            m.d.comb += self.ready.eq(pending < self._depth)
            return m
        # ready == (pending < depth) at every cycle: an admission (legal only while ready)
        # without a pop fills the last slot when pending == depth - 1; a pop without an
        # admission frees one.
        ready = Signal(init=1)
        with m.If(self.take & ~popped):
            m.d.sync += ready.eq(pending != self._depth - 1)
        with m.Elif(~self.take & popped):
            m.d.sync += ready.eq(1)
        m.d.comb += self.ready.eq(ready)
        return m


class SkidBuffer(wiring.Component):
    """A fully registered stream stage: payload, valid and ready all come from registers.

    Parameters
    ----------
    shape : shape-like
        Payload shape.

    Members
    -------
    i : ``In(stream.Signature(shape))``
        ``i.ready`` is a register (``~skid_valid``): no combinational path from ``o.ready``.
    o : ``Out(stream.Signature(shape))``
        Driven from registers.

    Latency 1 cycle, initiation interval 1. A beat that arrives while ``o`` is stalled waits in
    the skid register; ``i.ready`` drops until it has moved on.
    """

    def __init__(self, shape):
        super().__init__({"i": In(stream.Signature(shape)), "o": Out(stream.Signature(shape))})

    def elaborate(self, platform):
        m = Module()
        skid_valid = Signal()
        skid = Signal.like(self.i.payload)
        m.d.comb += self.i.ready.eq(~skid_valid)
        # The payload registers' enables come from registers only: the skid register follows
        # the input while it is empty (its contents matter only once skid_valid is set).
        with m.If(~skid_valid):
            m.d.sync += skid.eq(self.i.payload)
        with m.If(self.o.ready | ~self.o.valid):
            with m.If(skid_valid):
                m.d.sync += [self.o.valid.eq(1), self.o.payload.eq(skid), skid_valid.eq(0)]
            with m.Else():
                m.d.sync += [self.o.valid.eq(self.i.valid), self.o.payload.eq(self.i.payload)]
        with m.Elif(self.i.valid & self.i.ready):
            m.d.sync += skid_valid.eq(1)
        return m


class BlockRAMFIFO(wiring.Component):
    """A deep first-in first-out stream buffer whose block-RAM read data pass a register.

    :class:`amaranth.lib.fifo.SyncFIFOBuffered` drives its output straight from the memory's
    read port, so a block RAM's clock-to-out (ECP5 ``DP16KD`` without its output register:
    5.8 ns) and whatever the consumer does with the data share one cycle, and UltraScale+
    cannot use the RAM's output register. Here the memory is read ahead into a register (the
    RAM's output register, which synthesis packs into ``RAMB36``) and then into a small output
    FIFO; reads are issued only while that FIFO is sure to have room (credits), so the
    consumer's ``ready`` reaches no memory control.

    Parameters
    ----------
    width : int
        Payload bits.
    depth : int
        Words held in the memory (at least 2). The output FIFO holds up to
        :data:`OUT_DEPTH` more.

    Members
    -------
    i : ``In(stream.Signature(unsigned(width)))``
        ``i.ready`` is a register: fewer than ``depth`` words in the memory (words read ahead
        into the output FIFO not counted).
    o : ``Out(stream.Signature(unsigned(width)))``
        From the output FIFO's register.

    Latency 5 cycles from ``i`` to ``o`` (write, read, RAM output register, output FIFO);
    initiation interval 1.
    """

    #: Words of the output FIFO: enough for the read-ahead pipeline and the credit's return.
    OUT_DEPTH = 6

    def __init__(self, width, depth):
        if depth < 2:
            raise ValueError(f"BlockRAMFIFO depth must be at least 2, not {depth}")
        self._width, self._depth = width, depth
        super().__init__({"i": In(stream.Signature(unsigned(width))),
                          "o": Out(stream.Signature(unsigned(width)))})

    def elaborate(self, platform):
        m = Module()
        depth = self._depth
        # ``no_rw_check``: a read and a write in the same cycle never meet at one address (a
        # read needs a stored word, a write a free one), so yosys need not emulate
        # read-old-data on collisions with a multiplexer behind the block RAM's output.
        m.submodules.storage = storage = memory.Memory(shape=unsigned(self._width), depth=depth,
                                                       init=[], attrs={"no_rw_check": 1})
        w_port = storage.write_port()
        r_port = storage.read_port(domain="sync", transparent_for=())
        m.submodules.out = out = fifo.SyncFIFOBuffered(width=self._width, depth=self.OUT_DEPTH)

        produce = Signal(range(depth))
        consume = Signal(range(depth))
        stored = Signal(range(depth + 1))
        room = Signal(range(self.OUT_DEPTH + 1), init=self.OUT_DEPTH)
        # stored != 0, stored != depth and room != 0 kept as registers beside the counts, so
        # that `read` is one gate of registers and `i.ready` a register
        nonempty, not_full, room_ok = Signal(), Signal(init=1), Signal(init=1)
        popped = Signal()
        write = self.i.valid & not_full
        read = Signal()
        m.d.comb += [
            self.i.ready.eq(not_full),
            read.eq(nonempty & room_ok),
            w_port.addr.eq(produce), w_port.data.eq(self.i.payload), w_port.en.eq(write),
            r_port.addr.eq(consume),         # always enabled: `fetched` marks the reads
        ]
        with m.If(write):
            m.d.sync += produce.eq(Mux(produce == depth - 1, 0, produce + 1))
        with m.If(read):
            m.d.sync += consume.eq(Mux(consume == depth - 1, 0, consume + 1))
        with m.If(write & ~read):
            m.d.sync += [stored.eq(stored + 1), nonempty.eq(1),
                         not_full.eq(stored != depth - 1)]
        with m.Elif(~write & read):
            m.d.sync += [stored.eq(stored - 1), nonempty.eq(stored != 1), not_full.eq(1)]

        # read ahead: the port's data a cycle after `read`, the RAM output register the next
        fetched, held = Signal(), Signal()
        data = Signal(self._width, reset_less=True)
        m.d.sync += [fetched.eq(read), held.eq(fetched), data.eq(r_port.data)]
        m.d.comb += [out.w_data.eq(data), out.w_en.eq(held),
                     self.o.payload.eq(out.r_data), self.o.valid.eq(out.r_rdy),
                     out.r_en.eq(self.o.ready)]
        # credits of the output FIFO: taken by a read, returned the cycle after a pop
        m.d.sync += popped.eq(self.o.valid & self.o.ready)
        with m.If(read & ~popped):
            m.d.sync += [room.eq(room - 1), room_ok.eq(room != 1)]
        with m.Elif(~read & popped):
            m.d.sync += [room.eq(room + 1), room_ok.eq(1)]
        return m


def sum_shape(shapes):
    """Shape of a sum of values of the given shapes that never overflows."""
    shapes = [Shape.cast(s) for s in shapes]
    is_signed = any(s.signed for s in shapes)
    # Magnitude bound of each operand, in its own width.
    total_max = sum((1 << (s.width - 1)) - 1 if s.signed else (1 << s.width) - 1 for s in shapes)
    total_min = sum(-(1 << (s.width - 1)) if s.signed else 0 for s in shapes)
    if is_signed:
        return signed(max(Shape.cast(range(total_min, total_max + 1)).width, 1))
    return unsigned(max(total_max.bit_length(), 1))


def adder_tree(m, values, *, name="sum", shape=None, reset_less=False):
    """Add ``values`` with a pipelined binary tree, one register per level.

    Parameters
    ----------
    m : Module
        Module receiving the logic (``sync`` domain).
    values : list of Value
        Operands; all of them must be valid in the same cycle.
    shape : shape-like, optional
        Result shape; default the exact width that cannot overflow (:func:`sum_shape`),
        computed from operand widths. Give a narrower shape only when a tighter value bound is
        known (e.g. operands that never reach their full range).
    reset_less : bool
        Registers without reset: a datapath's synchronous reset is one net to every register,
        which the placer pulls together, away from the arithmetic.

    Returns
    -------
    (Signal, int)
        The sum and the latency in cycles (``ceil(log2(len(values)))``; 0 for one value).
    """
    if not values:
        return Const(0, 1), 0
    out_shape = Shape.cast(shape) if shape is not None else sum_shape([v.shape() for v in values])
    level, latency = list(values), 0
    while len(level) > 1:
        nxt = []
        for k in range(0, len(level) - 1, 2):
            part = sum_shape([level[k].shape(), level[k + 1].shape()])
            if part.width > out_shape.width:
                part = out_shape
            reg = Signal(part, name=f"{name}_l{latency}_{k // 2}", reset_less=reset_less)
            m.d.sync += reg.eq(level[k] + level[k + 1])
            nxt.append(reg)
        if len(level) % 2:
            reg = Signal(level[-1].shape(), name=f"{name}_l{latency}_pass",
                         reset_less=reset_less)
            m.d.sync += reg.eq(level[-1])
            nxt.append(reg)
        level, latency = nxt, latency + 1
    result = Signal(out_shape, name=name)
    m.d.comb += result.eq(level[0])
    return result, latency


def delay(m, value, cycles, *, name="delayed", reset_less=False):
    """``value`` delayed by ``cycles`` registers in the ``sync`` domain (reset to 0, or no reset
    with ``reset_less``)."""
    for k in range(cycles):
        reg = Signal.like(value, name=f"{name}_d{k + 1}", reset_less=reset_less)
        m.d.sync += reg.eq(value)
        value = reg
    return value
