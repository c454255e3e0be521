"""Packet adapters between compute kernels' row streams and Galapagos packets.

A compute kernel (the I-BERT kernels of :mod:`hwgen.ibert`) streams *rows*: ``lanes`` elements
per beat, TLAST (``last``) on a row's final beat, the final beat padded when ``lanes`` does not
divide the row (:mod:`hwgen.ibert.stream_rows`). Between kernels the rows travel as Galapagos
packets (:mod:`hwgen.cluster.spec.packet`). The two adapters here convert:

* :class:`RowToPackets` (kernel output -> network): the elements of a row, each ``elem_bits``
  (8, 16 or 32) wide, little-endian, byte ``k`` of the row in payload byte ``k``; one packet per
  row, split into several packets of at most ``max_packet_bytes`` when the row is longer (TLAST
  on every packet's final beat; TKEEP of a partial final beat = its valid low bytes), TDEST =
  ``dest``, TID = ``src``, TUSER = 0 (an intra-cluster packet; the GMI header attacher makes
  it an inter-cluster one).
* :class:`PacketsToRows` (network -> kernel input): packets from several source kernels arrive
  on one packet port; each source id (TID) has its own output row stream (``o_0``, ``o_1``,
  ...: Q and K of the attention dot product, P and V of softmax x V, the residual of a
  requantisation). The bytes of one source form one byte stream; rows are cut from it by
  counting ``row_elems`` elements, whatever the packet boundaries (a row may span packets, a
  packet may end inside an element). With ``row_elems = 0`` a row ends with each packet
  instead (rows of any length, e.g. the softmax's rows of M <= max_len scores: the sender's
  :class:`RowToPackets` then needs ``max_packet_bytes`` >= its longest row, and the packets
  whole elements). Packets of unknown TIDs are dropped and counted.

Row formats
-----------
Both adapters describe the kernel side with a :class:`RowFormat`; its :meth:`RowFormat.layout`
is the kernel's own payload layout, so ``wiring.connect`` joins adapter and kernel directly:

===================  ======================================================================
field                ``field`` (the kernel's payload field name, e.g. ``q``, ``y``, ``p``):
                     ``ArrayLayout(signed/unsigned(field_bits), lanes)``, or with
                     ``array = False`` (``lanes`` = 1) a plain integer (the attention
                     scores' ``s``). Elements travel as ``elem_bits`` in packets: sign- or
                     zero-extended on the way in, truncated to ``field_bits`` on the way out.
``count``            with ``count``: elements in the beat (``lanes`` except on a row's final
                     beat), ``unsigned(lanes.bit_length())`` as the softmax's ``count``.
``last_row``         with ``rows`` > 0: set on every beat of every ``rows``-th row (the last
                     row of a matrix of ``rows`` rows: Linear's ``i_x``, softmax x V's ``i_p``).
                     :class:`RowToPackets` accepts the field and ignores it.
``last``             TLAST, the row's final beat.
===================  ======================================================================

Kernels whose TLAST marks the end of a *matrix* of one-beat rows (attention ``i_q``/``i_k``,
softmax x V ``i_v``) use ``lanes = head_dim`` and ``row_elems = M * head_dim``: the adapter's
"row" is whatever ``last`` delimits. A requantisation with a residual takes ``q`` and ``id`` in
one beat: two sources of one :class:`PacketsToRows`, zipped by :func:`join_rows`.
:func:`row_format_from_ports` reads a format from a kernel's ``ports.json`` stream entry.

=====================  ========================================================================
kernel stream          adapter format (``field``, ``lanes``, ``elem_bits``/``field_bits``, row)
=====================  ========================================================================
linear ``i_x``         p2r ``x``, pes, 8, row K, ``rows`` = M (``last_row``)
linear ``o_y``         r2p ``y``, tiles, 32, row N, ``rows`` = M (``last_row`` ignored)
requant ``i_x``        p2r ``q``, lanes, 32 (in_bits); with identity a second source ``id``
                       (8) and :func:`join_rows`
requant ``o_y``        r2p ``y``, lanes, 8 (bits), row ``row``
gelu/layernorm input   p2r ``q``, lanes, 32 (in_bits <= 32), row ``row``/``hidden``
gelu/layernorm output  too wide (47 / 33 bits at the defaults): a requant first
softmax ``i_x``        p2r ``q``, lanes, 32, ``count``, row M (or 0: a row per packet)
softmax ``o_y``        r2p ``y``, lanes, 16/9 unsigned, ``count``, row <= max_len
attn-dot ``i_q/i_k``   p2r ``q``/``k``, head_dim, 8, row M x head_dim (one matrix)
attn-dot ``o_s``       r2p ``s`` (``array`` false), 1, 32, row M, ``rows`` = M
softmax-mm ``i_p``     p2r ``p``, pes, 16/9 unsigned, row M, ``rows`` = M (``last_row``)
softmax-mm ``i_v``     p2r ``v``, head_dim, 8, row M x head_dim (one matrix)
softmax-mm ``o_o``     r2p ``o``, head_dim, 32, row M x head_dim
=====================  ========================================================================

(p2r: :class:`PacketsToRows` output, r2p: :class:`RowToPackets` input; ``tests/
test_cluster_adapter.py`` connects each with ``wiring.connect``.) Counting ``rows`` and ``row
= M x head_dim`` fix M in the adapter's configuration; only the softmax-style rows (``count``,
``row_elems = 0``) follow any M at run time.
"""

from dataclasses import replace

from amaranth.hdl import Cat, Const, Module, Mux, Signal, Value
from amaranth.lib import data, fifo, stream, wiring
from amaranth.lib.wiring import In, Out
import numpy as np

from ...flow.model import StreamModel
from ..golden.rows import encode_rows, packets_to_rows, row_beats, rows_to_packets
from ..spec.adapter import COUNTER_BITS
from ..spec.packet import Packet, packet_layout, to_beats

__all__ = ["RowToPackets", "PacketsToRows", "join_rows", "RowToPacketsModel", "PacketsToRowsModel",
           "ROW2PKT_CONFIGS", "PKT2ROW_CONFIGS"]


def _const_reg(m, value, width, name):
    """A flop always holding ``value`` (Verilator does not evaluate an ``always @*`` block that
    only assigns a constant to part of a signal)."""
    reg = Signal(width, init=value, name=name)
    m.d.sync += reg.eq(value)
    return reg


def _bytes_mask(n, total):
    """``total`` bytes of ones below byte ``n`` (an Amaranth value), zeros above."""
    return Cat(*[(n > k).replicate(8) for k in range(total)])


def _byte_shift(m, value, nbytes, width, left, name):
    """``value`` shifted left (``left``) or right by ``nbytes`` whole bytes (a barrel
    shifter), cut to ``width`` bits."""
    amount = Cat(Const(0, 3), nbytes)
    out = Signal(width, name=name)
    m.d.comb += out.eq(value << amount if left else value >> amount)
    return out


def _min(a, b):
    return Mux(a < b, a, b)


def _choose_next(m, take, regs, ready, taken, kept):
    """Registers ``regs`` (name -> Signal) take the next state of ``taken`` (output beat
    taken) or ``kept`` (not), each ``(ready, {name: value})``, as ``take`` chooses; the
    input's ``ready`` too (combinational in ``take``). Both are computed side by side, so
    ``take`` reaches every register through one multiplexer."""
    m.d.comb += ready.eq(Mux(take, taken[0], kept[0]))
    for name, reg in regs.items():
        m.d.sync += reg.eq(Mux(take, taken[1][name], kept[1][name]))


class RowToPackets(wiring.Component):
    """Kernel rows -> Galapagos packets (see the module docstring for the formats).

    Parameters
    ----------
    config : RowToPacketsConfig

    Members
    -------
    i_row : ``In(stream.Signature(config.format.layout()))``
        Kernel rows. A beat carries ``count`` elements with ``count`` (read on ``last`` beats;
        other beats are full), else ``lanes`` (:attr:`RowFormat.tail` on ``last`` beats).
        Padding lanes and ``last_row`` are ignored.
    o_pkt : ``Out(stream.Signature(packet_layout(data_bits)))``
        Packets to ``dest`` from ``src``: each row's ``elem_bits`` elements little-endian, at
        most ``max_packet_bytes`` per packet; TLAST at each packet's end, the final beat's
        TKEEP its valid low bytes, data bytes past TKEEP zero.

    Organisation and timing
    -----------------------
    A byte buffer of ``lanes * elem_bytes + data_bits / 8`` bytes: input beats append their
    bytes, output beats take ``min(data_bits / 8, room left in the packet, bytes up to the row's
    end)`` from its bottom. An output beat leaves the cycle after the input beat that completes
    it (latency 1). Input II 1 while the output keeps up: ``ceil(beat_bytes / (data_bits / 8))``
    output beats per input beat plus one where a row or packet ends inside a beat; one row
    end is held at a time, so a row's last beat waits while the previous row's end is still in
    the buffer. Backpressure: ``i_row.ready`` follows ``o_pkt.ready`` combinationally (an
    input beat is taken when the bytes left after this cycle's output leave room for it).

    The next output beat's size and its row and packet ends are registers, computed from the
    next state; the next state is computed both for an output beat taken and not taken, and
    ``o_pkt``'s handshake picks one (:func:`_choose_next`): no count comparison or subtraction
    lies between the handshake and the buffer's shifts.
    """

    def __init__(self, config):
        self.config = config
        super().__init__({"i_row": In(stream.Signature(config.format.layout())),
                          "o_pkt": Out(stream.Signature(packet_layout(config.data_bits)))})

    def elaborate(self, platform):
        m = Module()
        c, f = self.config, self.config.format
        L, W, EB = c.data_bits // 8, f.beat_bytes, f.elem_bytes
        B = W + L
        top = c.max_packet_bytes
        i, o = self.i_row, self.o_pkt
        buf = Signal(8 * B)
        n = Signal(range(B + 1))
        pend = Signal()                         # a row end lies in the buffer ...
        endpos = Signal(range(B + 1))           # ... after this many bytes
        room = Signal(range(top + 1), init=top)  # bytes left in the current packet
        # room - L - 1, updated beside room: its sign says room <= L with no comparison after
        # the subtraction
        over = Signal(range(-L - 1, top - L), init=top - L - 1)
        # The next output beat, kept as registers (a function of room, pend and endpos,
        # computed from their next values): e = min(room, L, endpos if pend) bytes, and
        # whether it ends the row and the packet. So no comparison of the counts precedes the
        # output decision or the buffer's shifts in a cycle.
        e = Signal(range(L + 1), init=min(L, top))
        row_end = Signal()
        pkt_end = Signal(init=int(top <= L))

        take = Signal()
        m.d.comb += [o.valid.eq(n >= e), take.eq(o.valid & o.ready),
                     o.payload.data.eq(buf[:8 * L] & _bytes_mask(e, L)),
                     o.payload.keep.eq(Cat(*[e > k for k in range(L)])),
                     o.payload.last.eq(pkt_end),
                     o.payload.dest.eq(_const_reg(m, c.dest, 8, "dest")),
                     o.payload.id.eq(_const_reg(m, c.src, 8, "src")),
                     o.payload.user.eq(_const_reg(m, 0, 17, "user"))]

        # input beat: its elements as bytes, padding lanes zero
        beat = i.payload
        lanes = [getattr(beat, f.field)[k] for k in range(f.lanes)] if f.array \
            else [getattr(beat, f.field)]
        if f.count:
            n_elems = Mux(beat.last, beat.count, f.lanes)
        else:
            n_elems = Mux(beat.last, f.tail, f.lanes)
        elems = Signal(range(f.lanes + 1))
        m.d.comb += elems.eq(n_elems)
        in_bytes = Signal(range(W + 1))
        m.d.comb += in_bytes.eq(elems * EB)
        packed = Cat(*[Mux(elems > k, _extend(lane, f), 0) for k, lane in enumerate(lanes)])

        def after(taking):
            """The next state when the output beat is (``taking``) or is not taken, computed
            for both in parallel; ``take`` chooses."""
            tag = "t" if taking else "n"
            n1 = Signal(range(B + 1), name=f"n1_{tag}")
            m.d.comb += n1.eq(n - e if taking else n)
            pend1 = pend & ~row_end if taking else pend
            ready = Signal(name=f"ready_{tag}")
            m.d.comb += ready.eq((n1 <= L) & ~(pend1 & beat.last))
            accept = i.valid & ready
            closes = accept & beat.last
            room2 = Signal.like(room, name=f"room_{tag}")
            over2 = Signal.like(over, name=f"over_{tag}")
            m.d.comb += [
                room2.eq(Mux(pkt_end, top, room - e) if taking else room),
                over2.eq(Mux(pkt_end, top - L - 1, over - e) if taking else over),
            ]
            # the next beat from the next state: comparisons side by side, one choice. With
            # room2 > L the row end (at most L away to count) comes first anyway; with room2
            # <= L its low bits are room2. Worked out both for a row end kept (from registers)
            # and for one this input beat brings (``closes``: then no end was pending), so the
            # input handshake only picks between them.
            room_first = over2 < 0
            low = room2[:L.bit_length()]
            kept_end = Signal.like(endpos, name=f"kept_end_{tag}")
            new_end = Signal.like(endpos, name=f"new_end_{tag}")
            m.d.comb += [kept_end.eq(endpos - e if taking else endpos),
                         new_end.eq(n1 + in_bytes)]

            def beat_after(end, pending):
                ends_row = Signal(name=f"ends_row_{tag}_{end.name}")
                m.d.comb += ends_row.eq(pending & (end <= L) & (~room_first | (end <= low)))
                return ends_row, Mux(ends_row, end, Mux(room_first, room2, L))

            ends_kept, e_kept = beat_after(kept_end, pend1)
            ends_new, e_new = beat_after(new_end, 1)
            ends_row = Mux(closes, ends_new, ends_kept)
            placed = _byte_shift(m, packed, n1, 8 * B, True, f"placed_{tag}")
            rest = _byte_shift(m, buf, e, 8 * B, False, "buf_rest") if taking else buf
            return ready, {
                "buf": rest | Mux(accept, placed, 0),
                "n": n1 + Mux(accept, in_bytes, 0),
                "room": room2, "over": over2, "pend": pend1 | closes,
                "endpos": Mux(closes, new_end, kept_end),
                "e": Mux(closes, e_new, e_kept),
                "row_end": ends_row,
                "pkt_end": ends_row | room_first,
            }

        regs = {"buf": buf, "n": n, "room": room, "over": over, "pend": pend, "endpos": endpos,
                "e": e,
                "row_end": row_end, "pkt_end": pkt_end}
        _choose_next(m, take, regs, i.ready, after(True), after(False))
        return m


def _extend(lane, fmt):
    """A lane's ``field_bits`` sign- or zero-extended to ``elem_bits`` (unsigned bits)."""
    v = Value.cast(lane)[:fmt.bits]
    top = v[-1] if fmt.signed else Const(0, 1)
    return Cat(v, top.replicate(fmt.elem_bits - fmt.bits))


class _Unpack(wiring.Component):
    """One source's byte stream -> kernel rows (part of :class:`PacketsToRows`).

    ``i``: ``{"data": data_bits, "n": bytes, "end": packet end}`` chunks (bytes ``0 .. n-1``
    valid); ``o``: rows in ``fmt.layout()``. A buffer of ``beat_bytes + data_bits / 8`` bytes;
    an output beat takes ``min(beat_bytes, bytes left in the row)`` from its bottom once that
    many are there (latency 1); a chunk is appended while the bytes left after this cycle's
    output leave room. Rows end after ``row_bytes`` bytes, or with ``row_elems = 0`` at the
    packet ends (one packet end is held at a time: a chunk with ``end`` waits while the
    previous one is still in the buffer). As in :class:`RowToPackets` the next beat's size and
    row end are registers and the next state is chosen by the output handshake.
    """

    def __init__(self, data_bits, fmt):
        self.L, self.fmt = data_bits // 8, fmt
        self.chunk = data.StructLayout({"data": data_bits, "n": range(self.L + 1), "end": 1})
        super().__init__({"i": In(stream.Signature(self.chunk)),
                          "o": Out(stream.Signature(fmt.layout()))})

    def elaborate(self, platform):
        m = Module()
        f, L = self.fmt, self.L
        W, EB = f.beat_bytes, f.elem_bytes
        B = W + L
        i, o = self.i, self.o
        buf = Signal(8 * B)
        n = Signal(range(B + 1))
        # The next output beat, kept as registers (computed from the next row state): e
        # bytes and whether it ends the row, so no comparison precedes the output decision
        # or the buffer's shifts in a cycle.
        e = Signal(range(W + 1), init=min(W, f.row_bytes) if f.row_elems else W)
        row_end = Signal(init=int(bool(f.row_elems) and f.row_bytes <= W))
        if f.row_elems:                         # rows counted in bytes
            rem = Signal(range(f.row_bytes + 1), init=f.row_bytes)
            regs = {"rem": rem}
        else:                                   # rows end with packets
            pend = Signal()                     # a packet end lies in the buffer ...
            endpos = Signal(range(B + 1))       # ... after this many bytes
            regs = {"pend": pend, "endpos": endpos}
        take = Signal()
        m.d.comb += [o.valid.eq(n >= e), take.eq(o.valid & o.ready), o.payload.last.eq(row_end)]
        field = getattr(o.payload, f.field)
        for k in range(f.lanes):
            lane = field[k] if f.array else field
            word = buf[8 * EB * k:8 * EB * (k + 1)][:f.bits]
            m.d.comb += lane.eq(Mux(e > EB * k, word, 0))
        if f.count:
            m.d.comb += o.payload.count.eq(e >> (EB.bit_length() - 1))
        if f.rows:
            row = Signal(range(f.rows))
            m.d.comb += o.payload.last_row.eq(row == f.rows - 1)
            with m.If(take & row_end):
                m.d.sync += row.eq(Mux(row == f.rows - 1, 0, row + 1))
        chunk = i.payload.data & _bytes_mask(i.payload.n, L)

        def after(taking):
            """The next state when the output beat is (``taking``) or is not taken, computed
            for both in parallel; ``take`` chooses."""
            tag = "t" if taking else "n"
            n1 = Signal(range(B + 1), name=f"n1_{tag}")
            m.d.comb += n1.eq(n - e if taking else n)
            ready = Signal(name=f"ready_{tag}")
            nxt = {}
            if f.row_elems:
                m.d.comb += ready.eq(n1 <= W)
                rem2 = Signal.like(rem, name=f"rem_{tag}")
                m.d.comb += rem2.eq(Mux(row_end, f.row_bytes, rem - e) if taking else rem)
                ends_row = rem2 <= W
                nxt.update(rem=rem2, e=Mux(ends_row, rem2, W))
            else:
                pend1 = pend & ~row_end if taking else pend
                m.d.comb += ready.eq((n1 <= W) & ~(pend1 & i.payload.end))
                closes = i.valid & ready & i.payload.end
                pend2 = Signal(name=f"pend_{tag}")
                endpos2 = Signal.like(endpos, name=f"endpos_{tag}")
                m.d.comb += [pend2.eq(pend1 | closes),
                             endpos2.eq(Mux(closes, n1 + i.payload.n,
                                            endpos - e if taking else endpos))]
                ends_row = pend2 & (endpos2 <= W)
                nxt.update(pend=pend2, endpos=endpos2, e=Mux(ends_row, endpos2, W))
            accept = i.valid & ready
            placed = _byte_shift(m, chunk, n1, 8 * B, True, f"placed_{tag}")
            rest = _byte_shift(m, buf, e, 8 * B, False, "buf_rest") if taking else buf
            nxt.update(buf=rest | Mux(accept, placed, 0), n=n1 + Mux(accept, i.payload.n, 0),
                       row_end=ends_row)
            return ready, nxt

        regs.update(buf=buf, n=n, e=e, row_end=row_end)
        _choose_next(m, take, regs, i.ready, after(True), after(False))
        return m


class PacketsToRows(wiring.Component):
    """Packets from several source kernels -> one kernel row stream per source.

    Parameters
    ----------
    config : PacketsToRowsConfig

    Members
    -------
    i_pkt : ``In(stream.Signature(packet_layout(data_bits)))``
        Well-formed intra-cluster packets (TKEEP of the form ``2**n - 1``, TID constant in a
        packet); TDEST and TUSER are not looked at.
    o_<k> : ``Out(stream.Signature(fmt_k.layout()))``
        The rows of the ``k``-th source of ``sources`` (TID ``tid_k``, format ``fmt_k``): the
        source's payload bytes in arrival order, cut into rows of ``row_elems`` elements of
        ``elem_bits`` (little-endian; ``row_elems = 0``: a row per packet), ``lanes`` per
        beat, TLAST on each row's final beat (padding lanes 0, ``count`` = elements in the
        beat, ``last_row`` on every beat of each ``rows``-th row where the format has them).
    status_dropped : ``Out(32)``
        Packets whose TID is not a source (consumed, counted at their TLAST beat).

    Organisation, timing and backpressure
    -------------------------------------
    A demultiplexer steers each beat by TID into its source's FIFO (``fifo_depth`` beats of
    data, byte count and packet end), behind which a byte-buffer unpacker cuts rows
    (:class:`_Unpack`). Latency: 3 cycles from a packet beat to the first output beat it
    completes (2 in the FIFO, 1 in the unpacker). Each output gives one beat per cycle while
    bytes arrive fast enough (``ceil(beat_bytes / (data_bits / 8))`` input beats per full
    output beat); ``fifo_depth`` >= 3 for one input beat per cycle (a 2-deep FIFO takes one
    every other cycle). A stalled output fills its FIFO; then the packet port stalls on that
    source's next beat (head-of-line blocking): beats behind it, of other sources too, wait
    until it moves. No data of any source is lost or reordered; beats of different sources
    overtake each other only through the FIFOs.
    """

    def __init__(self, config):
        self.config = config
        sig = {"i_pkt": In(stream.Signature(packet_layout(config.data_bits)))}
        for k, (_, fmt) in enumerate(config.source_formats):
            sig[f"o_{k}"] = Out(stream.Signature(fmt.layout()))
        sig["status_dropped"] = Out(COUNTER_BITS)
        super().__init__(sig)

    def elaborate(self, platform):
        m = Module()
        c = self.config
        L = c.data_bits // 8
        i = self.i_pkt
        nbytes = Signal(range(L + 1))
        m.d.comb += nbytes.eq(sum(i.payload.keep[k] for k in range(L)))
        known = Signal()
        dropped = Signal(COUNTER_BITS)
        m.d.comb += self.status_dropped.eq(dropped)
        ready = Const(1)
        for k, (tid, fmt) in enumerate(c.source_formats):
            unpack = _Unpack(c.data_bits, fmt)
            q = fifo.SyncFIFOBuffered(width=unpack.chunk.size, depth=c.depths[k])
            m.submodules[f"fifo_{k}"] = q
            m.submodules[f"unpack_{k}"] = unpack
            hit = i.payload.id == tid
            chunk = Signal(unpack.chunk)
            m.d.comb += [chunk.data.eq(i.payload.data), chunk.n.eq(nbytes),
                         chunk.end.eq(i.payload.last),
                         q.w_data.eq(chunk), q.w_en.eq(i.valid & hit),
                         unpack.i.payload.eq(q.r_data), unpack.i.valid.eq(q.r_rdy),
                         q.r_en.eq(unpack.i.ready)]
            wiring.connect(m, unpack.o, wiring.flipped(getattr(self, f"o_{k}")))
            ready = Mux(hit, q.w_rdy, ready)
            known = known | hit
        m.d.comb += i.ready.eq(ready)
        with m.If(i.valid & i.ready & i.payload.last & ~known):
            m.d.sync += dropped.eq(dropped + 1)
        return m


def join_rows(m, parts, out):
    """Zip row streams beat by beat into ``out`` (e.g. a requantisation's ``q`` and ``id``
    from two :class:`PacketsToRows` outputs of the same ``lanes`` and ``row_elems``):
    ``parts`` = ``[(stream, field), ...]``; ``out`` takes each field from its stream and the
    other fields (``last`` ...) from the first. A beat passes when every part has one."""
    all_valid = Cat(*[s.valid for s, _ in parts]).all()
    m.d.comb += out.valid.eq(all_valid)
    first = parts[0][0].payload
    for name, _ in out.payload.shape():
        src = next((s.payload for s, f in parts if f == name), first)
        m.d.comb += getattr(out.payload, name).eq(getattr(src, name))
    for s, _ in parts:
        m.d.comb += s.ready.eq(out.ready & all_valid)


# -- stream models ---------------------------------------------------------------------------

def _random_rows(rng, fmt, count, variable=False):
    lo, hi = fmt.value_range()
    lengths = rng.integers(1, fmt.row_elems, count, endpoint=True) if variable \
        else [fmt.row_elems] * count
    if variable and count:
        lengths[:min(count, 2)] = [fmt.row_elems, 1][:min(count, 2)]
    return [rng.integers(lo, hi, int(n), endpoint=True) for n in lengths]


def _cycles(rows, fmts, data_bits):
    """Timeout allowance: 4 cycles per element, packet byte-beat and row."""
    return 50 + 4 * sum(len(r) * (1 + f.elem_bytes * 8 // data_bits) + 1
                        for r, f in zip(rows, fmts))


class RowToPacketsModel(StreamModel):
    """Stimulus and golden model of ``cluster-row2pkt``: ``items`` rows of random elements in
    the field's range (with ``count``: lengths 1..``row_elems``, the first rows the longest and
    the shortest), random padding lanes and ``last_row``; expected packets from
    :func:`rows_to_packets`."""

    result_port = "o_pkt"
    latency_from = "i_row"

    @staticmethod
    def stimulus(config, items, rng):
        """``{"rows": [int64 arrays], "seed": int}`` (the seed draws the ignored input
        padding)."""
        return {"rows": _random_rows(rng, config.format, items, variable=config.count),
                "seed": int(rng.integers(1 << 31))}

    @staticmethod
    def inputs(config, stim):
        """``i_row``: :func:`row_beats` of the rows (random padding and ``last_row``)."""
        return {"i_row": row_beats(stim["rows"], config.format,
                                   np.random.default_rng(stim["seed"]))}

    @staticmethod
    def expect(config, stim):
        """``o_pkt``: the beats of :func:`rows_to_packets`."""
        c = config
        return {"o_pkt": [b for p in rows_to_packets(stim["rows"], c.format, c.dest, c.src,
                                                     c.max_packet_bytes)
                          for b in to_beats(p, c.data_bits)]}

    @staticmethod
    def cycles_bound(config, stim):
        rows = stim["rows"]
        return _cycles(rows, [config.format] * len(rows), config.data_bits)


class PacketsToRowsModel(StreamModel):
    """Stimulus and golden model of ``cluster-pkt2row``: ``items`` rows per source, each
    source's bytes cut into packets of random lengths (1 byte to several beats, independent
    of rows and elements), interleaved at random with packets of unknown TIDs (about 10%); the
    final packet is source 0's (so ``status_dropped``, sampled after ``o_0``'s last TLAST, is
    final). Expected rows: :func:`packets_to_rows`."""

    result_port = "o_0"
    latency_from = "i_pkt"
    sample_signals = ("status_dropped",)

    @staticmethod
    def stimulus(config, items, rng):
        """``{"packets": [Packet], "rows": {tid: [rows]}}``."""
        c, L = config, config.data_bits // 8
        formats = dict(c.source_formats)
        unknown = [t for t in range(256) if t not in formats]
        queues, rows = {}, {}
        for tid, fmt in formats.items():
            if not fmt.row_elems:               # one packet per row of 1 .. 3 lanes + 1
                rows[tid] = _random_rows(rng, replace(fmt, row_elems=3 * fmt.lanes + 1), items,
                                         variable=True)
                queues[tid] = [Packet(0, tid, encode_rows([r], fmt)) for r in rows[tid]]
                continue
            rows[tid] = _random_rows(rng, fmt, items)
            body, pkts, k = encode_rows(rows[tid], fmt), [], 0
            while k < len(body):
                n = int(rng.integers(1, 3 * L + 2))
                if rng.random() < 0.2:          # sometimes a whole row
                    n = fmt.row_bytes - k % fmt.row_bytes
                pkts.append(Packet(0, tid, body[k:k + n]))
                k += n
            queues[tid] = pkts
        first = c.source_formats[0][0]
        final = queues[first].pop()
        order = [t for t, q in queues.items() for _ in q]
        rng.shuffle(order)
        pos = {t: 0 for t in queues}
        packets = []
        for t in order:
            if unknown and rng.random() < 0.1:
                packets.append(Packet(0, int(rng.choice(unknown)),
                                      bytes(rng.integers(0, 256, int(rng.integers(1, 2 * L)),
                                                         dtype=np.uint8))))
            packets.append(queues[t][pos[t]])
            pos[t] += 1
        packets.append(final)
        return {"packets": packets, "rows": rows}

    @staticmethod
    def inputs(config, stim):
        """``i_pkt``: the packets' beats (:func:`~hwgen.cluster.spec.packet.to_beats`)."""
        return {"i_pkt": [b for p in stim["packets"] for b in to_beats(p, config.data_bits)]}

    @staticmethod
    def golden(config, stim):
        """``({tid: [row arrays]}, dropped)``: :func:`packets_to_rows` of the stimulus
        packets over the configured sources."""
        return packets_to_rows(stim["packets"], dict(config.source_formats))

    @classmethod
    def expect(cls, config, stim):
        """``o_<k>``: :func:`row_beats` of source ``k``'s rows from :func:`packets_to_rows`."""
        rows, _ = cls.golden(config, stim)
        return {f"o_{k}": row_beats(rows[tid], fmt)
                for k, (tid, fmt) in enumerate(config.source_formats)}

    @staticmethod
    def cycles_bound(config, stim):
        pairs = [(r, f) for tid, f in config.source_formats for r in stim["rows"][tid]]
        return 4 * len(stim["packets"]) + _cycles(*zip(*pairs), config.data_bits)

    @classmethod
    def report(cls, config, stim, summary, samples):
        _, dropped = cls.golden(config, stim)
        got = samples[-1]["status_dropped"] if samples else None
        out = {"status_dropped": got, "status_dropped_expected": dropped}
        if got != dropped:
            out["mismatches"] = summary["mismatches"] + 1
            out["first_mismatches"] = summary["first_mismatches"] + [
                {"port": "status_dropped", "expected": dropped, "received": got}]
        return out


#: ``cluster-row2pkt`` configurations simulated by the test suite: the brief's odd row (37
#: bytes, lanes 3), the softmax's output (9-bit unsigned in 16, count, variable rows), int32
#: with a packet smaller than a row, the attention scores (plain int32, last_row, 512 bits),
#: attention-like rows of a matrix split into 50-byte packets.
ROW2PKT_CONFIGS = (
    {"field": "y", "lanes": 3, "row_elems": 37},
    {"field": "y", "lanes": 4, "elem_bits": 16, "field_bits": 9, "signed": False,
     "count": True, "row_elems": 29, "max_packet_bytes": 1024},
    {"field": "y", "lanes": 5, "elem_bits": 32, "row_elems": 23, "max_packet_bytes": 36},
    {"data_bits": 512, "field": "s", "lanes": 1, "array": False, "elem_bits": 32,
     "rows": 7, "row_elems": 13, "max_packet_bytes": 40, "dest": 9, "src": 200},
    {"field": "o", "lanes": 24, "row_elems": 120, "max_packet_bytes": 50},
)

#: ``cluster-pkt2row`` configurations: two sources of 37-element int8 rows (lanes 3); P
#: (9-bit in 16, last_row) and V (a matrix of 8-lane rows) of softmax x V; a requantisation's
#: int32 ``q`` and int8 residual ``id`` on 512 bits; three softmax-like sources with ``count``
#: (the first with rows of any length, one packet each);
#: attention Q and K (24 lanes, matrix of 5 rows) with a small FIFO.
PKT2ROW_CONFIGS = (
    {"sources": [{"id": 1}, {"id": 2}], "lanes": 3, "row_elems": 37},
    {"sources": [{"id": 4, "field": "p", "elem_bits": 16, "field_bits": 9, "signed": False,
                  "rows": 11},
                 {"id": 5, "field": "v", "lanes": 8, "row_elems": 88}],
     "lanes": 3, "row_elems": 11},
    {"data_bits": 512, "sources": [{"id": 1, "field": "q", "elem_bits": 32},
                                   {"id": 2, "field": "id"}], "lanes": 5, "row_elems": 23},
    {"sources": [{"id": 7, "row_elems": 0}, {"id": 3, "lanes": 2},
                 {"id": 250, "elem_bits": 16}],
     "field": "q", "elem_bits": 32, "lanes": 4, "count": True, "row_elems": 19},
    {"sources": [{"id": 3, "field": "q"}, {"id": 9, "field": "k"}], "lanes": 24,
     "row_elems": 120, "fifo_depth": 2},
)
