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

def _rotl(value, amount, width):
    """Rotate ``value`` (``width`` bits) left by ``amount`` bits (a Value < width)."""
    return (Cat(value, value) << amount)[width:2 * width]


def _rotr(value, amount, width):
    return (Cat(value, value) >> amount)[:width]


class _Collective(wiring.Component):
    """Common datapath of the four GMI kernels (see the subclasses' docstrings).

    Buffer: one :class:`amaranth.lib.memory.Memory` per element lane (``L = data_bits /
    elem_bits`` lanes, ``depth x rows`` words of ``elem_bits``), so that element ``e`` of a
    round's element space is lane bank ``e % L``, row ``e // L``. A message written at element
    offset ``o`` (member ``i`` of a gather at ``i * length``) is rotated by ``o % L`` lanes on
    the way in, and a chunk read from offset ``o`` (chunk ``i`` of a scatter) is rotated back
    on the way out, each bank reading its own row: one beat per cycle on both sides, for any
    length, without padding between members.
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
        c, kind = self.config, self.kind
        g = c.geometry(kind)
        m = Module()
        L, EB, D = c.lanes, c.elem_bits, c.depth
        R, S = g["rows"], g["slots"]

        banks = []
        for b in range(L):
            mem = memory.Memory(shape=EB, depth=D * R, init=[])
            m.submodules[f"bank{b}"] = mem
            banks.append((mem.write_port(), mem.read_port()))
        bank_base = Array([Const(d * R, range(D * R + 1)) for d in range(D)])
        ahead, robank, release, inc, round_ready = self._rounds(m, S, D)
        hs, cur_slot, cur_bank, cur_k, cur_drop, exp_last, last_elems, bases = self._input(
            m, g, ahead, robank, round_ready, inc)
        self._write(m, g, banks, bank_base, bases, hs, cur_slot, cur_bank, cur_k, cur_drop,
                    exp_last, last_elems)
        self._output(m, g, banks, bank_base, robank, round_ready, release)
        return m

    def _rounds(self, m, S, D):
        """Round bookkeeping: ``ahead[s]``, the rounds slot ``s`` has written ahead of the
        output (one of ``D`` banks each), ``robank`` the oldest round's bank. Returns
        ``(ahead, robank, release, inc, round_ready)``: ``inc[s]`` (driven by :meth:`_input`)
        adds a round to slot ``s``, ``release`` (driven by the output engine) frees the
        oldest, ``round_ready`` while every slot holds it."""
        # -- round bookkeeping ---------------------------------------------------------------
        ahead = [Signal(range(D + 1), name=f"ahead{s}") for s in range(S)]
        robank = Signal(range(D))          # bank of the oldest unsent round
        release = Signal()                 # the output engine has read the oldest round
        inc = [Signal(name=f"inc{s}") for s in range(S)]
        round_ready = Signal()
        m.d.comb += round_ready.eq(Cat(*[a != 0 for a in ahead]).all())
        for s in range(S):
            m.d.sync += ahead[s].eq(ahead[s] + inc[s] - release)
        with m.If(release):
            m.d.sync += [robank.eq(Mux(robank == D - 1, 0, robank + 1)),
                         self.stat_rounds.eq(self.stat_rounds + 1)]
        return ahead, robank, release, inc, round_ready

    def _input(self, m, g, ahead, robank, round_ready, inc):
        """Input, check: takes ``i_pkt`` beats (stalling a packet whose slot is full while a
        round is ready), checks source, length and keep, counts drops and drives ``inc`` at a
        good packet's last beat. Returns ``(hs, cur_slot, cur_bank, cur_k, cur_drop,
        exp_last, last_elems, bases)`` for :meth:`_write`."""
        c, kind = self.config, self.kind
        L, EB, W, D, M = c.lanes, c.elem_bits, c.data_bits, c.depth, c.members
        S, nbi = g["slots"], g["in_beats"]
        full_keep = (1 << (W // 8)) - 1
        # -- input: check, rotate, write -----------------------------------------------------
        i = self.i_pkt
        if kind == "reduce":
            bases = [s * nbi * L for s in range(S)]
        elif kind == "gather":
            bases = [s * c.length for s in range(S)]
        else:
            bases = [0]
        first = Signal(init=1)             # the next beat starts a packet
        k = Signal(range(nbi + 1))         # beat index in the packet (saturates at nbi)
        dropping, bad = Signal(), Signal()
        slot_r = Signal(range(S))
        bank_r = Signal(range(D))

        if GmiKind(kind).fan_in:   # members only (a group of one included)
            src_ok = (i.payload.id >= c.first_member) & (i.payload.id < c.first_member + M)
        else:                              # broadcast, scatter: any source
            src_ok = Const(1)
        if S > 1:
            slot_now = Signal(range(S))
            m.d.comb += slot_now.eq(i.payload.id - c.first_member)
        else:
            slot_now = Const(0, 1)
        ahead_sel = Array(ahead)[slot_now]
        is_full = ahead_sel == D
        stall = src_ok & is_full & round_ready
        overrun = src_ok & is_full & ~round_ready
        bsum = robank + ahead_sel
        bank_now = Mux(bsum >= D, bsum - D, bsum)

        cur_slot = Signal(range(S))
        cur_bank = Signal(range(D))
        cur_k = Signal(range(nbi + 1))
        cur_drop, cur_bad = Signal(), Signal()
        exp_last = cur_k == nbi - 1
        last_elems = g["in_elems"] - (nbi - 1) * L
        last_keep = (1 << (last_elems * EB // 8)) - 1
        beat_ok = (cur_k < nbi) & (i.payload.keep == Mux(exp_last, last_keep, full_keep)) & \
            (i.payload.last == exp_last)
        m.d.comb += [
            cur_slot.eq(Mux(first, slot_now, slot_r)),
            cur_bank.eq(Mux(first, bank_now, bank_r)),
            cur_k.eq(Mux(first, 0, k)),
            cur_drop.eq(Mux(first, ~src_ok | overrun, dropping)),
            cur_bad.eq((~first & bad) | ~beat_ok),
            i.ready.eq(~(first & stall)),
        ]
        hs = i.valid & i.ready
        with m.If(hs):
            with m.If(i.payload.last):
                m.d.sync += first.eq(1)
                with m.If(~cur_drop & cur_bad):
                    m.d.sync += self.stat_drop_length.eq(self.stat_drop_length + 1)
            with m.Else():
                m.d.sync += [first.eq(0), k.eq(Mux(cur_k == nbi, nbi, cur_k + 1)),
                             slot_r.eq(cur_slot), bank_r.eq(cur_bank),
                             dropping.eq(cur_drop), bad.eq(cur_bad)]
            with m.If(first & ~src_ok):
                m.d.sync += self.stat_drop_source.eq(self.stat_drop_source + 1)
            with m.If(first & overrun):
                m.d.sync += self.stat_drop_overrun.eq(self.stat_drop_overrun + 1)
        for s in range(S):
            m.d.comb += inc[s].eq(hs & i.payload.last & ~cur_drop & ~cur_bad &
                                  (cur_slot == s))
        return hs, cur_slot, cur_bank, cur_k, cur_drop, exp_last, last_elems, bases

    def _write(self, m, g, banks, bank_base, bases, hs, cur_slot, cur_bank, cur_k, cur_drop,
               exp_last, last_elems):
        """Input, write: rotates the beat's lanes to its slot's element offset and writes
        them into ``banks`` at the round bank's rows (the last beat's lanes past the packet
        masked)."""
        c = self.config
        L, EB, W = c.lanes, c.elem_bits, c.data_bits
        R, S, nbi = g["rows"], g["slots"], g["in_beats"]
        i = self.i_pkt
        rots = [b % L for b in bases]
        rows0 = [b // L for b in bases]
        if S > 1:
            rot_in = Array([Const(r, range(L)) for r in rots])[cur_slot]
            row_in = Array([Const(r, range(R + 1)) for r in rows0])[cur_slot]
        else:
            rot_in, row_in = Const(rots[0], range(L)), Const(rows0[0], range(R + 1))
        valid_lanes = Signal(L)
        for l in range(L):
            m.d.comb += valid_lanes[l].eq(~exp_last | (l < last_elems))
        data_rot = _rotl(i.payload.data, rot_in * EB, W)
        valid_rot = _rotl(valid_lanes, rot_in, L)
        wen = hs & ~cur_drop & (cur_k < nbi)
        row_base = bank_base[cur_bank] + row_in + cur_k
        for b, (wr, _) in enumerate(banks):
            m.d.comb += [wr.addr.eq(row_base + (b < rot_in)),
                         wr.data.eq(data_rot[b * EB:(b + 1) * EB]),
                         wr.en.eq(wen & valid_rot[b])]

    def _output(self, m, g, banks, bank_base, robank, round_ready, release):
        """Output: ``o_pkt`` beats read from ``banks``, one per cycle while ``o_pkt`` takes
        them (:meth:`_reduce_output` for reduce, :meth:`_send_output` otherwise); drives
        ``release`` when the oldest round has been read."""
        c, kind = self.config, self.kind
        L, EB = c.lanes, c.elem_bits
        full_keep = (1 << (c.data_bits // 8)) - 1
        # -- output ----------------------------------------------------------------------------
        o = self.o_pkt
        advance = Signal()
        m.d.comb += advance.eq(~o.valid | o.ready)
        for _, rd in banks:
            m.d.comb += rd.en.eq(advance)
        m.d.comb += [o.payload.id.eq(c.kernel_id), o.payload.user.eq(c.cluster_id << 8)]
        rdata = Cat(*[rd.data for _, rd in banks])
        busy = Signal()
        out_last_elems = g["out_elems"] - (g["out_beats"] - 1) * L
        out_last_keep = (1 << (out_last_elems * EB // 8)) - 1
        last_mask = Cat(*[Const((1 << EB) - 1 if l < out_last_elems else 0, EB)
                          for l in range(L)])

        if kind == "reduce":
            self._reduce_output(m, banks, bank_base, robank, busy, round_ready, release,
                                advance, rdata, last_mask, out_last_keep, full_keep)
        else:
            self._send_output(m, banks, bank_base, robank, busy, round_ready, release,
                              advance, rdata, last_mask, out_last_keep, full_keep, g)

    def _send_output(self, m, banks, bank_base, robank, busy, round_ready, release, advance,
                     rdata, last_mask, out_last_keep, full_keep, g):
        """Broadcast/scatter/gather: ``out_packets`` chunks of ``out_beats`` beats, chunk
        ``j`` read from element offset ``offs[j]`` of the round."""
        c, kind, o = self.config, self.kind, self.o_pkt
        L, EB, W = c.lanes, c.elem_bits, c.data_bits
        C, nbo = g["out_packets"], g["out_beats"]
        offs = [j * c.length if kind == "scatter" else 0 for j in range(C)]
        dests = c.member_ids if GmiKind(kind).fan_out else [c.root]
        oc = Signal(range(C))
        ok = Signal(range(nbo))
        if C > 1:
            rot = Array([Const(x % L, range(L)) for x in offs])[oc]
            row0 = Array([Const(x // L, range(g["rows"] + 1)) for x in offs])[oc]
            dest = Array([Const(d, 8) for d in dests])[oc]
        else:
            rot = Const(offs[0] % L, range(L))
            row0 = Const(offs[0] // L, range(g["rows"] + 1))
            dest = Const(dests[0], 8)
        row = bank_base[robank] + row0 + ok
        for b, (_, rd) in enumerate(banks):
            m.d.comb += rd.addr.eq(row + (b < rot))
        last_issue = busy & (ok == nbo - 1) & (oc == C - 1)
        with m.If(~busy & round_ready):
            m.d.sync += busy.eq(1)
        with m.If(busy & advance):
            m.d.sync += ok.eq(Mux(ok == nbo - 1, 0, ok + 1))
            with m.If(ok == nbo - 1):
                m.d.sync += oc.eq(Mux(oc == C - 1, 0, oc + 1))
            with m.If(oc == C - 1):
                with m.If(ok == nbo - 1):
                    m.d.sync += busy.eq(0)
        m.d.comb += release.eq(last_issue & advance)

        s1_valid, s1_last = Signal(), Signal()
        s1_rot = Signal(range(L))
        s1_dest = Signal(8)
        with m.If(advance):
            m.d.sync += [s1_valid.eq(busy), s1_last.eq(ok == nbo - 1), s1_rot.eq(rot),
                         s1_dest.eq(dest)]
            aligned = _rotr(rdata, s1_rot * EB, W)
            m.d.sync += [
                o.valid.eq(s1_valid),
                o.payload.data.eq(Mux(s1_last, aligned & last_mask, aligned)),
                o.payload.keep.eq(Mux(s1_last, out_last_keep, full_keep)),
                o.payload.last.eq(s1_last),
                o.payload.dest.eq(s1_dest),
            ]

    def _reduce_output(self, m, banks, bank_base, robank, busy, round_ready, release, advance,
                       rdata, last_mask, out_last_keep, full_keep):
        """Reduce: for each output beat, read that beat of every member (``members`` cycles)
        and fold it into an accumulator."""
        c, o = self.config, self.o_pkt
        L, EB, M = c.lanes, c.elem_bits, c.members
        nb = c.geometry("reduce")["in_beats"]
        ok = Signal(range(nb))
        om = Signal(range(M))
        mrow = Signal(range(M * nb + 1))   # om * nb
        row = bank_base[robank] + mrow + ok
        for _, rd in banks:
            m.d.comb += rd.addr.eq(row)
        last_issue = busy & (ok == nb - 1) & (om == M - 1)
        with m.If(~busy & round_ready):
            m.d.sync += busy.eq(1)
        with m.If(busy & advance):
            with m.If(om == M - 1):
                m.d.sync += [om.eq(0), mrow.eq(0), ok.eq(Mux(ok == nb - 1, 0, ok + 1))]
                with m.If(ok == nb - 1):
                    m.d.sync += busy.eq(0)
            with m.Else():
                m.d.sync += [om.eq(om + 1), mrow.eq(mrow + nb)]
        m.d.comb += release.eq(last_issue & advance)

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
            m.d.sync += [s1_valid.eq(busy), s1_first.eq(om == 0), s1_final.eq(om == M - 1),
                         s1_last.eq(ok == nb - 1)]
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
