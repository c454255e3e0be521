"""GMI collective kernels: Broadcast, Scatter, Gather, Reduce (multi-FPGA I-BERT paper, section 5).

Each kernel is a Galapagos kernel of its own (a kernel id in the cluster) with one packet input
``i_pkt`` and one packet output ``o_pkt`` (:func:`hwgen.cluster.spec.packet.packet_layout`). The
group is the ``members`` kernels ``first_member .. first_member + members - 1``; member ``i``
is MPI rank ``i``. Semantics, drop rules and status counters are those of
:func:`hwgen.cluster.golden.collectives.collective_stream`:

* **Broadcast**: a message of ``length`` elements from any source is sent to every member,
  in member order (TDEST = member id).
* **Scatter**: a message of ``members * length`` elements from any source is cut into
  ``members`` consecutive chunks of ``length`` elements; chunk ``i`` goes to member ``i``.
* **Gather**: one message of ``length`` elements from each member (identified by TID; members
  arrive in any order, interleaved as whole packets, up to ``depth`` rounds ahead of each
  other) -> one packet of ``members * length`` elements to ``root``, in member order.
* **Reduce**: one message from each member -> the elementwise ``op`` (``sum`` wrapping
  around, or signed ``max``) over the members, ``length`` elements, to ``root``.

Allgather is a Gather whose ``root`` is a Broadcast kernel (paper section 5.1).

Elements are signed ``elem_bits`` integers, little-endian in the payload (byte 0 = bits 7:0 of
the first beat). Everything sent has TID = ``kernel_id`` and TUSER = ``cluster_id << 8``
(intra-cluster; the gateway's header attacher adds inter-cluster headers). The input's TDEST
and TUSER are not looked at (the kernel switch already routed the packet here).
"""

from types import SimpleNamespace

from amaranth.hdl import Array, Cat, Const, Module, Mux, Signal
from amaranth.lib import memory, stream, wiring
from amaranth.lib.wiring import In, Out
import numpy as np

from ...errors import ConfigError
from ...flow.model import StreamModel
from ...lib.intmath import ceil_div
from ..golden import collectives as golden
from ..golden.traffic import StatusLines
from ..spec.describe import GmiKind
from ..spec.gmi import GMIConfig
from ..spec.packet import Packet, from_beats, packet_layout, split_packets, to_beats

__all__ = ["Broadcast", "Scatter", "Gather", "Reduce", "gmi_component", "KINDS", "STATUS_PORTS",
           "BroadcastModel", "ScatterModel", "GatherModel", "ReduceModel", "TEST_CONFIGS"]


KINDS = golden.KINDS
#: Status outputs (32-bit counters), in the order of
#: :data:`hwgen.cluster.golden.collectives.STATUS`.
STATUS_PORTS = tuple(f"stat_{name}" for name in golden.STATUS)


def _rotr(value, amount, width):
    """Rotate ``value`` (``width`` bits) right by ``amount`` bits (a Value < width)."""
    return (Cat(value, value) >> amount)[:width]


def _table(values, index):
    """``values[index]`` for a Value ``index``: a constant when all are equal (``index`` is not
    looked at), else a lookup (LUTs only, no arithmetic)."""
    if len(set(values)) == 1:
        return Const(values[0], range(max(values[0], 1) + 1))
    return Array([Const(v, range(max(values) + 1)) for v in values])[index]


def _counter(m, n, step, name):
    """A counter of ``0 .. n - 1`` that advances (wrapping to 0) in the cycles ``step`` is
    high, with the flag ``count == n - 1`` registered beside it. Returns ``(count,
    at_last)``."""
    count = Signal(range(n), name=name)
    at_last = Signal(init=n == 1, name=f"{name}_last")
    with m.If(step):
        m.d.sync += [count.eq(Mux(at_last, 0, count + 1)),
                     at_last.eq(Mux(at_last, int(n == 1), count == n - 2))]
    return count, at_last


class _Collective(wiring.Component):
    """Common datapath of the four GMI kernels (see the subclasses' docstrings).

    Buffer: one :class:`amaranth.lib.memory.Memory` per element lane (``L = data_bits /
    elem_bits`` lanes, ``depth x rows`` words of ``elem_bits``), so that element ``e`` of a
    round's element space is lane bank ``e % L``, row ``e // L``. A message written at element
    offset ``o`` (member ``i`` of a gather at ``i * length``) is rotated by ``o % L`` lanes on
    the way in, and a chunk read from offset ``o`` (chunk ``i`` of a scatter) is rotated back
    on the way out, each bank reading its own row: one beat per cycle on both sides, for any
    length, without padding between members.

    Logic depth (issue 30): decisions are kept in registers updated beside the state they
    come from, so no buffer address is added up on the way to the buffer and no path between
    registers crosses more than one carry chain. Each slot keeps the row where its next
    message starts, whether it is full and whether it holds a round (updated when it completes
    a message or a round is released); a packet's next beat's row and the beat index's
    comparisons are registered at each beat; a beat is written into the buffer a cycle later
    from registers; the output engine keeps the row of its next read and its counters'
    end flags. A first beat's slot comes from comparing its TID with each member id and
    looking up its low bits (no subtraction, no range compare). Latency and rate are those of
    the plain design (the buffered write lands before the output engine can read the round).
    """

    kind = None

    def __init__(self, config):
        if not isinstance(config, GMIConfig):
            raise TypeError("config must be a GMIConfig")
        self.config = config
        layout = packet_layout(config.data_bits)
        super().__init__({
            "i_pkt": In(stream.Signature(layout)),
            "o_pkt": Out(stream.Signature(layout)),
            **{name: Out(32) for name in STATUS_PORTS},
        })

    def elaborate(self, platform):
        c = self.config
        g = c.geometry(self.kind)
        m = Module()
        banks = []
        for b in range(c.lanes):
            mem = memory.Memory(shape=c.elem_bits, depth=c.depth * g["rows"], init=[])
            m.submodules[f"bank{b}"] = mem
            banks.append((mem.write_port(), mem.read_port()))
        rounds = self._rounds(m, g)
        self._write(m, g, banks, self._input(m, g, rounds))
        self._output(m, g, banks, rounds)
        return m

    def _offsets(self, g):
        """Element offset of each slot's message in a round's element space."""
        c, kind = self.config, self.kind
        if kind == "reduce":
            return [s * g["in_beats"] * c.lanes for s in range(g["slots"])]
        if kind == "gather":
            return [s * c.length for s in range(g["slots"])]
        return [0]

    def _rounds(self, m, g):
        """Round bookkeeping. ``ahead[s]``: the rounds slot ``s`` has written ahead of the
        output; the oldest round is in bank ``robank`` (of ``depth``, ``rows`` rows each) and
        slot ``s`` writes its next message into bank ``(robank + ahead[s]) % depth``, which
        moves only when the slot completes a message. Registered beside ``ahead``: ``full[s]``
        (``ahead[s] == depth``), ``held[s]`` (``ahead[s] != 0``), the row where slot ``s``'s
        next message starts (``wrow[s]``) and the row after it (``wrow1[s]``; None unless some
        slot's message starts inside a row, whose lanes below the rotation write the row
        after); for the output engine, the first rows of the oldest round's bank (``rbase``)
        and of the bank after it (``rnext``). ``inc[s]`` (driven by :meth:`_input`) adds a
        round to slot ``s``, ``release`` (driven by the output engine) frees the oldest,
        ``round_ready`` while every slot holds it. Returns these signals as a namespace."""
        c = self.config
        D, R, S = c.depth, g["rows"], g["slots"]
        offsets = self._offsets(g)
        rows0 = [o // c.lanes for o in offsets]
        two = any(o % c.lanes for o in offsets)
        r = SimpleNamespace(
            ahead=[Signal(range(D + 1), name=f"ahead{s}") for s in range(S)],
            full=[Signal(name=f"full{s}") for s in range(S)],
            held=[Signal(name=f"held{s}") for s in range(S)],
            wrow=[Signal(range(D * R + 1), name=f"wrow{s}", init=rows0[s]) for s in range(S)],
            wrow1=[Signal(range(D * R + 1), name=f"wrow{s}_1", init=rows0[s] + 1)
                   for s in range(S)] if two else None,
            inc=[Signal(name=f"inc{s}") for s in range(S)],
            release=Signal(), round_ready=Signal(),
            rbase=Signal(range(D * R)), rnext=Signal(range(D * R), init=R if D > 1 else 0))
        m.d.comb += r.round_ready.eq(Cat(*r.held).all())
        for s in range(S):
            ahead, inc, wbank = r.ahead[s], r.inc[s], Signal(range(D), name=f"wbank{s}")
            with m.If(inc & ~r.release):
                m.d.sync += [ahead.eq(ahead + 1), r.full[s].eq(ahead == D - 1), r.held[s].eq(1)]
            with m.Elif(r.release & ~inc):
                m.d.sync += [ahead.eq(ahead - 1), r.full[s].eq(0), r.held[s].eq(ahead != 1)]
            wrap = wbank == D - 1
            with m.If(inc):
                m.d.sync += [wbank.eq(Mux(wrap, 0, wbank + 1)),
                             r.wrow[s].eq(Mux(wrap, rows0[s], r.wrow[s] + R))]
                if two:
                    m.d.sync += r.wrow1[s].eq(Mux(wrap, rows0[s] + 1, r.wrow1[s] + R))
        robank = Signal(range(D))          # bank of the oldest unsent round
        with m.If(r.release):
            m.d.sync += [robank.eq(Mux(robank == D - 1, 0, robank + 1)), r.rbase.eq(r.rnext),
                         self.stat_rounds.eq(self.stat_rounds + 1)]
            if D > 1:
                m.d.sync += r.rnext.eq(Mux(robank == D - 2, 0, r.rnext + R))
        return r

    def _input(self, m, g, rounds):
        """Input, check: takes ``i_pkt`` beats (stalling a packet whose slot is full while a
        round is ready), checks source, length and keep, counts drops and drives
        ``rounds.inc`` at a good packet's last beat. A first beat's TID is compared with each
        member id (no range compare) and its low bits give the slot (no subtraction); the beat
        index's decisions (last beat expected, past the message) and the next beat's rows are
        registered with the index. Returns the beat for :meth:`_write` as a namespace: ``hs``,
        ``slot``, ``row`` (its row) and ``row1`` (the next), ``drop``, ``last`` (the
        message's last beat expected), ``in_range`` (not past the message)."""
        c, kind, r = self.config, self.kind, rounds
        L, EB, W, D = c.lanes, c.elem_bits, c.data_bits, c.depth
        S, nbi, R = g["slots"], g["in_beats"], g["rows"]
        full_keep = (1 << (W // 8)) - 1
        last_keep = (1 << ((g["in_elems"] - (nbi - 1) * L) * EB // 8)) - 1
        i = self.i_pkt
        first = Signal(init=1)             # the next beat starts a packet
        k = Signal(range(nbi + 1))         # index of the next beat if ~first (saturates at nbi)
        k_last, k_over = Signal(), Signal()    # k == nbi - 1, k == nbi
        dropping, bad = Signal(), Signal()
        slot_r = Signal(range(S))
        row_r, row1_r = Signal(range(D * R + 1)), Signal(range(D * R + 1))

        if GmiKind(kind).fan_in:   # members only (a group of one included)
            src_ok = Cat(*[i.payload.id == c.first_member + s for s in range(S)]).any()
        else:                              # broadcast, scatter: any source
            src_ok = Const(1)
        n = (S - 1).bit_length()           # (id - first_member) % 2**n is the slot of a member
        slot_now = _table([min((v - c.first_member) % (1 << n), S - 1) for v in range(1 << n)],
                          i.payload.id[:n])
        is_full = src_ok & Array(r.full)[slot_now]
        stall = is_full & r.round_ready
        overrun = is_full & ~r.round_ready
        exp_last = Mux(first, int(nbi == 1), k_last)
        in_range = first | ~k_over
        beat_ok = in_range & (i.payload.keep == Mux(exp_last, last_keep, full_keep)) & \
            (i.payload.last == exp_last)
        cur_slot, cur_drop = Signal(range(S)), Signal()
        row, row1 = Signal(range(D * R + 1)), Signal(range(D * R + 1))
        m.d.comb += [
            cur_slot.eq(Mux(first, slot_now, slot_r)),
            cur_drop.eq(Mux(first, ~src_ok | overrun, dropping)),
            row.eq(Mux(first, Array(r.wrow)[slot_now], row_r)),
            row1.eq(Mux(first, Array(r.wrow1)[slot_now], row1_r) if r.wrow1 else row + 1),
            i.ready.eq(~(first & stall)),
        ]
        hs = i.valid & i.ready
        cur_bad = (~first & bad) | ~beat_ok
        with m.If(hs):
            with m.If(i.payload.last):
                m.d.sync += first.eq(1)
                with m.If(~cur_drop & cur_bad):
                    m.d.sync += self.stat_drop_length.eq(self.stat_drop_length + 1)
            with m.Else():
                m.d.sync += [first.eq(0), slot_r.eq(cur_slot), dropping.eq(cur_drop),
                             bad.eq(cur_bad), row_r.eq(row1),
                             k.eq(Mux(first, 1, Mux(k_over, nbi, k + 1))),
                             k_last.eq(Mux(first, int(nbi == 2), k == nbi - 2)),
                             k_over.eq(Mux(first, int(nbi == 1), k_over | k_last))]
                if r.wrow1:
                    m.d.sync += row1_r.eq(row1 + 1)
            with m.If(first & ~src_ok):
                m.d.sync += self.stat_drop_source.eq(self.stat_drop_source + 1)
            with m.If(first & overrun):
                m.d.sync += self.stat_drop_overrun.eq(self.stat_drop_overrun + 1)
        # a good last beat completes slot s's message; on a first beat (a one-beat message)
        # that is a member's whose slot is not full (neither stalled nor dropped)
        good_end = i.valid & i.payload.last & beat_ok & (first | ~bad)
        for s in range(S):
            m.d.comb += r.inc[s].eq(good_end & Mux(first, src_ok & ~r.full[s] & (slot_now == s),
                                                   ~dropping & (slot_r == s)))
        return SimpleNamespace(hs=hs, slot=cur_slot, row=row, row1=row1, drop=cur_drop,
                               last=exp_last, in_range=in_range)

    def _write(self, m, g, banks, beat):
        """Input, write, a cycle after the beat: the beat's lanes, slot, row, whether it is
        written and whether it is the message's last are registered (and, where slots'
        messages start inside a row, the next row and which lane banks write it), so the
        buffer's write address comes from registers. Rotates the lanes to the slot's element
        offset and writes them into ``banks``, lane bank ``b`` at ``row``, or at the next row
        where ``b`` is below the rotation (the lanes that wrap into it); the last beat's lanes
        past the message are masked. The output engine reads a round 2 cycles after its last
        beat at the earliest (a register sees the round ready, the next cycle starts the
        engine), so the write is in before the read."""
        c = self.config
        L, EB, W, D, R = c.lanes, c.elem_bits, c.data_bits, c.depth, g["rows"]
        rots = [o % L for o in self._offsets(g)]
        last_elems = g["in_elems"] - (g["in_beats"] - 1) * L
        data, last, slot = Signal(W), Signal(), Signal(range(g["slots"]))
        row, row1, wen = Signal(range(D * R + 1)), Signal(range(D * R + 1)), Signal()
        m.d.sync += [data.eq(self.i_pkt.payload.data), last.eq(beat.last), slot.eq(beat.slot),
                     row.eq(beat.row), wen.eq(beat.hs & ~beat.drop & beat.in_range)]
        high = Signal(L)                # lane bank b writes the next row (0 without rotations)
        if any(rots):
            m.d.sync += [row1.eq(beat.row1),
                         high.eq(Cat(*[_table([int(b < x) for x in rots], beat.slot)
                                       for b in range(L)]))]
        lanes = [data[l * EB:(l + 1) * EB] for l in range(L)]
        for b, (wr, _) in enumerate(banks):
            src = [(b - x) % L for x in rots]           # the beat's lane bank b takes
            lane = lanes[src[0]] if len(set(src)) == 1 else Array([lanes[x] for x in src])[slot]
            keep = _table([int(x < last_elems) for x in src], slot)
            m.d.comb += [wr.addr.eq(Mux(high[b], row1, row)),
                         wr.data.eq(lane),
                         wr.en.eq(wen & (~last | keep))]

    def _output(self, m, g, banks, rounds):
        """Output: ``o_pkt`` beats read from ``banks``, one per cycle while ``o_pkt`` takes
        them (:meth:`_reduce_output` for reduce, :meth:`_send_output` otherwise), the
        engine's next read row kept in registers; drives ``rounds.release`` when the oldest
        round has been read."""
        c, kind = self.config, self.kind
        L, EB = c.lanes, c.elem_bits
        full_keep = (1 << (c.data_bits // 8)) - 1
        o = self.o_pkt
        advance = Signal()
        m.d.comb += advance.eq(~o.valid | o.ready)
        for _, rd in banks:
            m.d.comb += rd.en.eq(advance)
        m.d.comb += [o.payload.id.eq(c.kernel_id), o.payload.user.eq(c.cluster_id << 8)]
        rdata = Cat(*[rd.data for _, rd in banks])
        out_last_elems = g["out_elems"] - (g["out_beats"] - 1) * L
        out_last_keep = (1 << (out_last_elems * EB // 8)) - 1
        last_mask = Cat(*[Const((1 << EB) - 1 if l < out_last_elems else 0, EB)
                          for l in range(L)])
        args = (m, g, banks, rounds, advance, rdata, last_mask, out_last_keep, full_keep)
        if kind == "reduce":
            self._reduce_output(*args)
        else:
            self._send_output(*args)

    def _send_output(self, m, g, banks, rounds, advance, rdata, last_mask, out_last_keep,
                     full_keep):
        """Broadcast/scatter/gather: ``out_packets`` chunks of ``out_beats`` beats, chunk
        ``j`` read from element offset ``offs[j]`` of the round. ``rrow`` is the row of the
        next read and ``rrow1`` the row after it (a register where some chunk starts inside a
        row: the lane banks below its rotation read the row after); a chunk of a scatter
        starts in the row the previous one ends in or the next, a broadcast re-reads the round
        from its first row."""
        c, kind, o = self.config, self.kind, self.o_pkt
        L, EB, W = c.lanes, c.elem_bits, c.data_bits
        C, nbo, R, D = g["out_packets"], g["out_beats"], g["rows"], c.depth
        offs = [j * c.length if kind == "scatter" else 0 for j in range(C)]
        dests = c.member_ids if GmiKind(kind).fan_out else [c.root]
        busy = Signal()
        issue = busy & advance
        _, chunk_end = _counter(m, nbo, issue, "ok")
        oc, oc_last = _counter(m, C, issue & chunk_end, "oc")
        round_end = chunk_end & oc_last
        two = any(x % L for x in offs)
        rrow = Signal(range(D * R + 1))
        rrow1 = Signal(range(D * R + 1), init=1) if two else rrow + 1
        rot = _table([x % L for x in offs], oc)
        dest = _table(dests, oc)
        for b, (_, rd) in enumerate(banks):
            m.d.comb += rd.addr.eq(Mux(_table([int(b < x % L) for x in offs], oc), rrow1, rrow))
        if kind == "scatter":
            # chunk j + 1 starts in the row where chunk j ends (0) or in the next (1)
            steps = [offs[j + 1] // L - offs[j] // L - (nbo - 1) for j in range(C - 1)]
            assert set(steps) <= {0, 1}, steps
            same = _table([int(x == 0) for x in steps] + [0], oc)
            nxt, nxt1 = Mux(same, rrow, rrow1), Mux(same, rrow1, rrow1 + 1)
        else:
            nxt, nxt1 = rounds.rbase, rounds.rbase + 1
        with m.If(~busy & rounds.round_ready):
            m.d.sync += busy.eq(1)

        def to(row, row1):
            return [rrow.eq(row), rrow1.eq(row1)] if two else [rrow.eq(row)]
        with m.If(issue):
            m.d.sync += to(rrow1, rrow1 + 1)
            with m.If(chunk_end):
                m.d.sync += to(nxt, nxt1)
            with m.If(round_end):
                m.d.sync += [busy.eq(0), *to(rounds.rnext, rounds.rnext + 1)]
        m.d.comb += rounds.release.eq(issue & round_end)

        s1_valid, s1_last = Signal(), Signal()
        s1_rot = Signal(range(L))
        s1_dest = Signal(8)
        with m.If(advance):
            m.d.sync += [s1_valid.eq(busy), s1_last.eq(chunk_end), s1_rot.eq(rot),
                         s1_dest.eq(dest)]
            aligned = _rotr(rdata, s1_rot * EB, W)
            m.d.sync += [
                o.valid.eq(s1_valid),
                o.payload.data.eq(Mux(s1_last, aligned & last_mask, aligned)),
                o.payload.keep.eq(Mux(s1_last, out_last_keep, full_keep)),
                o.payload.last.eq(s1_last),
                o.payload.dest.eq(s1_dest),
            ]

    def _reduce_output(self, m, g, banks, rounds, advance, rdata, last_mask, out_last_keep,
                       full_keep):
        """Reduce: for each output beat, read that beat of every member (``members`` cycles)
        and fold it into an accumulator. ``rrow``, the row of the next read, steps by
        ``in_beats`` from member to member and back to member 0's next beat."""
        c, o = self.config, self.o_pkt
        L, EB, M, D = c.lanes, c.elem_bits, c.members, c.depth
        nb = g["in_beats"]
        busy = Signal()
        issue = busy & advance
        om, member_end = _counter(m, M, issue, "om")
        _, beat_end = _counter(m, nb, issue & member_end, "ok")
        rrow = Signal(range(g["rows"] * D + 1))
        for _, rd in banks:
            m.d.comb += rd.addr.eq(rrow)
        with m.If(~busy & rounds.round_ready):
            m.d.sync += busy.eq(1)
        with m.If(issue):
            with m.If(member_end):
                m.d.sync += rrow.eq(rrow - ((M - 1) * nb - 1))
                with m.If(beat_end):
                    m.d.sync += [busy.eq(0), rrow.eq(rounds.rnext)]
            with m.Else():
                m.d.sync += rrow.eq(rrow + nb)
        m.d.comb += rounds.release.eq(issue & member_end & beat_end)

        s1_valid, s1_first, s1_final, s1_last = Signal(), Signal(), Signal(), Signal()
        acc = [Signal(EB, name=f"acc{l}") for l in range(L)]
        new = []
        for l in range(L):
            x = rdata[l * EB:(l + 1) * EB]
            if c.op == "sum":
                folded = (acc[l] + x)[:EB]
            else:
                folded = Mux(acc[l].as_signed() > x.as_signed(), acc[l], x)
            v = Signal(EB, name=f"fold{l}")
            m.d.comb += v.eq(Mux(s1_first, x, folded))
            new.append(v)
        new_word = Cat(*new)
        with m.If(advance):
            m.d.sync += [s1_valid.eq(busy), s1_first.eq(om == 0), s1_final.eq(member_end),
                         s1_last.eq(beat_end)]
            with m.If(s1_valid):
                m.d.sync += [a.eq(v) for a, v in zip(acc, new)]
            m.d.sync += [
                o.valid.eq(s1_valid & s1_final),
                o.payload.data.eq(Mux(s1_last, new_word & last_mask, new_word)),
                o.payload.keep.eq(Mux(s1_last, out_last_keep, full_keep)),
                o.payload.last.eq(s1_last),
                o.payload.dest.eq(c.root),
            ]


_DOC_COMMON = """

    Parameters
    ----------
    config : GMIConfig

    Members
    -------
    i_pkt : ``In(stream.Signature(packet_layout(data_bits)))``
        Arriving packets (whole packets, TLAST to TLAST). A packet of the wrong length (beat
        count, TKEEP of any beat or TLAST position differing from a message of {in_size}) is
        dropped at its TLAST and counted in ``stat_drop_length``.{src_rule}
    o_pkt : ``Out(stream.Signature(packet_layout(data_bits)))``
        {out_desc} TID = ``kernel_id``, TUSER = ``cluster_id << 8``; TKEEP all ones except
        on the last beat of a packet; bytes past TKEEP are zero.
    stat_rounds, stat_drop_source, stat_drop_length, stat_drop_overrun : ``Out(32)``
        Rounds sent (counted when the last word of the round is read from the buffer) and
        dropped packets by reason (see :func:`hwgen.cluster.golden.collectives.collective_stream`).

    Timing
    ------
    Input: one beat per cycle. {in_timing} Output: {out_timing} The first output beat of a
    round is valid 4 cycles after the handshake of the TLAST beat that completes the round
    (round bookkeeping, engine start, buffer read, output register); between rounds the
    output engine idles one cycle. Steady state (members in order):
    :meth:`GMIConfig.round_cycles` cycles per round; exact count: :meth:`GMIConfig.cycles`.
    With members' rounds interleaved at random the rate depends on the arrival order (a
    round is sent only once complete).

    Backpressure: ``o_pkt`` may stall at any time (the read pipeline holds). Up to ``depth``
    rounds are buffered; a packet that would start a round beyond them waits (``i_pkt.ready``
    low on its first beat) while the oldest round is complete and being sent, so the input
    stalls only behind the output. ``i_pkt.ready`` depends combinationally on the first
    beat's TID and registered state, never on ``o_pkt.ready``.
    """


class Broadcast(_Collective):
    kind = "broadcast"
    __doc__ = """GMI Broadcast: each arriving message of ``length`` elements (from any source)
    is sent to every member, in member order (TDEST = ``first_member + i``).""" + \
        _DOC_COMMON.format(
            in_size="``length`` elements", src_rule=" Any source is accepted.",
            out_desc="Per round, ``members`` packets of ``length`` elements, member order.",
            in_timing="The input is free again once the message is buffered.",
            out_timing="one beat per cycle, ``members * ceil(length / lanes)`` beats per "
                       "round.")


class Scatter(_Collective):
    kind = "scatter"
    __doc__ = """GMI Scatter: each arriving message of ``members * length`` elements (from any
    source) is cut into ``members`` chunks of ``length`` consecutive elements; chunk ``i``
    goes to member ``i`` (TDEST = ``first_member + i``), in member order.""" + \
        _DOC_COMMON.format(
            in_size="``members * length`` elements", src_rule=" Any source is accepted.",
            out_desc="Per round, ``members`` packets of ``length`` elements, member order.",
            in_timing="``ceil(members * length / lanes)`` beats per round.",
            out_timing="one beat per cycle, ``members * ceil(length / lanes)`` beats per "
                       "round (chunks need not start on a beat boundary).")


class Gather(_Collective):
    kind = "gather"
    __doc__ = """GMI Gather: one message of ``length`` elements from each member (identified by
    TID, any arrival order, whole packets interleaved across up to ``depth`` rounds) -> one
    packet of ``members * length`` elements to ``root``, member ``i``'s message at elements
    ``i * length ..`` (MPI_Gather).""" + \
        _DOC_COMMON.format(
            in_size="``length`` elements",
            src_rule=" A packet whose TID is not a member is dropped "
                     "(``stat_drop_source``); one from a member already ``depth`` rounds "
                     "ahead of the oldest incomplete round is dropped (``stat_drop_overrun``).",
            out_desc="Per round, one packet of ``members * length`` elements to ``root``.",
            in_timing="``members * ceil(length / lanes)`` beats per round.",
            out_timing="one beat per cycle, ``ceil(members * length / lanes)`` beats per "
                       "round.")


class Reduce(_Collective):
    kind = "reduce"
    __doc__ = """GMI Reduce: one message of ``length`` signed elements from each member (any
    arrival order, interleaved across up to ``depth`` rounds) -> the elementwise ``op`` over
    the members (``sum`` wrapping around modulo ``2**elem_bits``, or signed ``max``) to
    ``root`` (MPI_Reduce).""" + \
        _DOC_COMMON.format(
            in_size="``length`` elements",
            src_rule=" A packet whose TID is not a member is dropped "
                     "(``stat_drop_source``); one from a member already ``depth`` rounds "
                     "ahead of the oldest incomplete round is dropped (``stat_drop_overrun``).",
            out_desc="Per round, one packet of ``length`` elements to ``root``.",
            in_timing="``members * ceil(length / lanes)`` beats per round.",
            out_timing="one beat every ``members`` cycles (each member's word of that beat "
                       "is read and folded in turn), ``members * ceil(length / lanes)`` "
                       "cycles per round, matching the input.")


_CLASSES = {"broadcast": Broadcast, "scatter": Scatter, "gather": Gather, "reduce": Reduce}


def gmi_component(kind, config):
    """The GMI kernel ``kind`` (one of :data:`KINDS`) built from ``config``."""
    if kind not in _CLASSES:
        raise ConfigError("kind", "must be one of " + ", ".join(KINDS), value=kind)
    return _CLASSES[kind](config)


# -- stream models for hwgen sim -------------------------------------------------------------

class _GMIModel(StatusLines, StreamModel):
    """Stream-level model of a GMI kernel for ``hwgen sim``: the item unit is one collective
    round. The stimulus interleaves members' packets at random (up to ``depth`` rounds apart),
    and mixes in dropped packets: wrong lengths (``bad``), unknown sources (gather/reduce) and,
    with probability ``overrun``, a packet from a member already ``depth`` rounds ahead
    (``interleave=False``: members' packets round by round in member order instead).
    The stream ends with the packet that completes the last round, so the status counters
    sampled after the last output packet are final; :meth:`report` compares them with the
    golden model's and adds any difference to ``mismatches``."""

    kind = None
    result_port = "o_pkt"
    latency_from = "i_pkt"
    sample_signals = STATUS_PORTS

    @staticmethod
    def _values(rng, n, bits):
        lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
        pick = rng.random()
        if pick < 0.1:
            return np.full(n, lo, dtype=np.int64)
        if pick < 0.2:
            return np.full(n, hi, dtype=np.int64)
        return rng.integers(lo, hi, size=n, endpoint=True)

    @classmethod
    def stimulus(cls, config, items, rng, bad=0.1, overrun=0.05, interleave=True):
        """``{"packets": [Packet]}`` to ``kernel_id``: messages of ``message_elems`` random
        ``elem_bits`` elements until every member (gather/reduce; else the one slot) has ``items``
        accepted; ``bad``: probability of a dropped wrong-length/outsider packet before each,
        ``overrun`` and ``interleave`` as in the class docstring."""
        c, kind = config, cls.kind
        eb = c.elem_bits // 8
        nbytes = golden.message_elems(kind, c) * eb
        multi = GmiKind(kind).fan_in
        slots = c.members if multi else 1

        def message(src):
            values = cls._values(rng, golden.message_elems(kind, c), c.elem_bits)
            return Packet(c.kernel_id, src, golden.from_elems(values, c.elem_bits))

        def bad_packet():
            if multi and rng.random() < 0.4:
                outsiders = [x for x in range(256) if not
                             c.first_member <= x < c.first_member + c.members]
                src = int(rng.choice(outsiders))
                size = nbytes
            else:
                src = c.first_member + int(rng.integers(slots)) if multi else \
                    int(rng.integers(256))
                size = nbytes
                while size == nbytes:
                    size = int(rng.integers(max(1, nbytes - 2 * c.data_bits // 8),
                                            nbytes + 2 * c.data_bits // 8 + 1))
            return Packet(c.kernel_id, src, bytes(rng.integers(0, 256, size=size,
                                                               dtype=np.uint8)))

        packets, accepted = [], [0] * slots
        while min(accepted) < items:
            if rng.random() < bad:
                packets.append(bad_packet())
            open_ = [s for s in range(slots) if accepted[s] < items]
            ok = [s for s in open_ if accepted[s] - min(accepted) < c.depth]
            late = [s for s in open_ if s not in ok]
            if late and rng.random() < overrun:
                s = int(rng.choice(late))
                packets.append(message(c.first_member + s))        # dropped: overrun
                continue
            s = int(rng.choice(ok)) if interleave else \
                min(ok, key=lambda x: (accepted[x], x))        # round by round, member order
            src = c.first_member + s if multi else int(rng.integers(256))
            packets.append(message(src))
            accepted[s] += 1
        return {"packets": packets}

    @staticmethod
    def inputs(config, stim):
        """``i_pkt``: ``stim["packets"]`` in order as :func:`~hwgen.cluster.spec.packet.to_beats`
        beats, ``last`` on each packet's final beat."""
        beats = []
        for p in stim["packets"]:
            beats += to_beats(p, config.data_bits)
        return {"i_pkt": beats}

    @classmethod
    def golden(cls, config, stim):
        """``(packets sent, status counters)`` of
        :func:`hwgen.cluster.golden.collectives.collective_stream` for this model's ``kind`` over
        the stimulus packets; the counters include ``rounds`` (rounds completed)."""
        return golden.collective_stream(cls.kind, config, stim["packets"])

    @classmethod
    def expect(cls, config, stim):
        """``o_pkt``: the packets :func:`hwgen.cluster.golden.collectives.collective_stream` sends
        for ``kind`` (:meth:`golden`), in order, as :func:`~hwgen.cluster.spec.packet.to_beats`
        beats."""
        out, _ = cls.golden(config, stim)
        beats = []
        for p in out:
            beats += to_beats(p, config.data_bits)
        return {"o_pkt": beats}

    @classmethod
    def cycles_bound(cls, config, stim):
        g = config.geometry(cls.kind)
        rounds = cls.golden(config, stim)[1]["rounds"]
        in_beats = sum(ceil_div(len(p.payload), config.data_bits // 8)
                       for p in stim["packets"])
        return in_beats + rounds * (config.round_cycles(cls.kind) + 8) + g["rows"] + 100

    @classmethod
    def report(cls, config, stim, summary, samples):
        """Status counters against the golden model, cycles per round."""
        _, want = cls.golden(config, stim)
        got = {name: samples[-1][f"stat_{name}"] for name in golden.STATUS} if samples else {}
        bad = sum(got.get(name) != want[name] for name in golden.STATUS)
        rounds = want["rounds"]
        out = {"status": got, "status_expected": want, "status_mismatches": bad,
               "mismatches": summary["mismatches"] + bad,
               "cycles_per_round": round(summary["cycles"] / rounds, 3)
               if summary["cycles"] and rounds else None,
               "round_cycles_model": config.round_cycles(cls.kind)}
        if bad:
            out["first_mismatches"] = summary["first_mismatches"] + [
                {"port": "status", "expected": want, "received": got}]
        return out


class BroadcastModel(_GMIModel):
    """Stream model of :class:`Broadcast` for ``hwgen sim``; the item is one round (the
    stimulus, drops and status check are those of the shared GMI model)."""
    kind = "broadcast"


class ScatterModel(_GMIModel):
    """Stream model of :class:`Scatter` for ``hwgen sim``; the item is one round (the
    stimulus, drops and status check are those of the shared GMI model)."""
    kind = "scatter"


class GatherModel(_GMIModel):
    """Stream model of :class:`Gather` for ``hwgen sim``; the item is one round (the
    stimulus, drops and status check are those of the shared GMI model)."""
    kind = "gather"


class ReduceModel(_GMIModel):
    """Stream model of :class:`Reduce` for ``hwgen sim``; the item is one round (the
    stimulus, drops and status check are those of the shared GMI model)."""
    kind = "reduce"


def received_packets(beats, data_bits):
    """Packets of a received beat list (for tests)."""
    return [from_beats(b, data_bits) for b in split_packets(beats)]


#: Simulated by tests/test_sim.py for each of the four kernels (``op`` only matters to
#: reduce): odd members and a length not dividing the lanes on 64-bit data (8-bit sum, the
#: acceptance size, with non-default ids), 512-bit data with 16-bit elements (signed max,
#: three buffered rounds), 32-bit elements with seven members of three elements and a single
#: buffered round (sum), and a group of one member (a single partial beat per message; it
#: found gather/reduce accepting non-members when the group had one slot).
TEST_CONFIGS = (
    {"members": 5, "length": 33, "kernel_id": 9, "first_member": 3, "root": 1,
     "cluster_id": 7},
    {"members": 3, "length": 37, "elem_bits": 16, "data_bits": 512, "op": "max", "depth": 3},
    {"members": 7, "length": 3, "elem_bits": 32, "depth": 1, "root": 200,
     "first_member": 100},
    # a group of one (MPI's size-1 communicator), a single partial beat per message
    {"members": 1, "length": 3, "elem_bits": 16, "op": "max", "first_member": 6},
)
