"""Packet switching primitives of the cluster: the kernel switch and the validating packet buffer.

:class:`KernelSwitch`
    N packet inputs to M packet outputs, routed by TDEST through a fixed map (kernel id ->
    output port), packet-atomic round-robin arbitration per output.
:class:`PacketFilter`
    Store-and-forward packet buffer that checks every packet as :func:`hwgen.cluster.spec.packet.
    classify` does (plus an optional destination check of its first beat) and drops and
    counts malformed ones; used by the router and the gateway's packet decoder.
"""

from amaranth.hdl import Cat, Const, Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from ...flow.model import StreamModel
from ..spec.packet import INTER_CLUSTER_BIT, Packet, packet_layout, to_beats
from ..spec.switch import COUNTER_BITS, DROP_KINDS, status_name

__all__ = ["KernelSwitch", "PacketFilter"]


class KernelSwitch(wiring.Component):
    """AXI-Stream packet switch: ``inputs`` x ``outputs``, routed by TDEST.

    Ports: ``i_<k>`` (k < inputs) and ``o_<k>`` (k < outputs), all
    ``stream.Signature(packet_layout(data_bits))``; with one input the input is ``i_pkt``,
    with one output the output is ``o_pkt``.

    Routing: a packet goes to output ``route_map[TDEST]`` (its first beat decides; packets
    never change TDEST inside). Unmapped TDEST: consumed and discarded (``drop_unmapped``) or
    sent to port 0.

    Arbitration: per output, round-robin among the inputs whose head beat wants it, starting
    after the input served last; the granted input holds the output until its TLAST beat
    (packets are never interleaved). Latency 0 (combinational path from input to output
    valid/payload and from output ready to input ready); one beat per cycle per output;
    backpressure of an output stalls only the inputs granted to it or waiting for it.
    """

    def __init__(self, config, route_map=None):
        self.config = c = config
        self.route_map = dict(route_map if route_map is not None else c.route_map)
        layout = packet_layout(c.data_bits)
        self.in_names = ["i_pkt"] if c.inputs == 1 else [f"i_{k}" for k in range(c.inputs)]
        self.out_names = ["o_pkt"] if c.outputs == 1 else [f"o_{k}" for k in range(c.outputs)]
        sig = {n: In(stream.Signature(layout)) for n in self.in_names}
        sig.update({n: Out(stream.Signature(layout)) for n in self.out_names})
        super().__init__(sig)

    def elaborate(self, platform):
        m = Module()
        c = self.config
        ins = [getattr(self, n) for n in self.in_names]
        outs = [getattr(self, n) for n in self.out_names]
        N, M = len(ins), len(outs)
        # Target port of each input's head beat (M = drop).
        targets = []
        for k, i in enumerate(ins):
            t = Signal(range(M + 1), name=f"target{k}")
            with m.Switch(i.payload.dest):
                for key, port in self.route_map.items():
                    if 0 <= key < 256:
                        with m.Case(key):
                            m.d.comb += t.eq(port)
                with m.Default():
                    m.d.comb += t.eq(M if c.drop_unmapped else 0)
            targets.append(t)
        ready_terms = [[] for _ in ins]
        for k, i in enumerate(ins):     # discard unmapped packets
            ready_terms[k].append(targets[k] == M)
        for o_idx, o in enumerate(outs):
            locked = Signal(name=f"locked{o_idx}")
            owner = Signal(range(N), name=f"owner{o_idx}")
            last = Signal(range(N), name=f"last{o_idx}", init=N - 1)
            sel = Signal(range(N), name=f"sel{o_idx}")
            any_req = Signal(name=f"req{o_idx}")
            reqs = [i.valid & (targets[k] == o_idx) for k, i in enumerate(ins)]
            # Round-robin choice starting after `last`.
            with m.Switch(last):
                for lv in range(N):
                    with m.Case(lv):
                        order = [(lv + 1 + j) % N for j in range(N)]
                        for j in reversed(order):       # first in order wins (last assign)
                            with m.If(reqs[j]):
                                m.d.comb += [sel.eq(j), any_req.eq(1)]
            active = Signal(range(N), name=f"active{o_idx}")
            go = Signal(name=f"go{o_idx}")
            m.d.comb += [active.eq(sel), go.eq(any_req)]
            with m.If(locked):
                m.d.comb += [active.eq(owner), go.eq(1)]
            with m.Switch(active):
                for k, i in enumerate(ins):
                    with m.Case(k):
                        m.d.comb += [o.payload.eq(i.payload),
                                     o.valid.eq(go & i.valid & (targets[k] == o_idx))]
            for k in range(N):
                ready_terms[k].append(go & (active == k) & (targets[k] == o_idx) & o.ready)
            with m.If(o.valid & o.ready):
                m.d.sync += [owner.eq(active), last.eq(active), locked.eq(~o.payload.last)]
        for k, i in enumerate(ins):
            m.d.comb += i.ready.eq(Cat(*ready_terms[k]).any())
        return m


def _contiguous(keep, lanes):
    """1 when ``keep`` is ``2**n - 1`` (n >= 1): bit 0 set and no set bit above a clear one
    (no carry chain)."""
    holes = [~keep[k] & keep[k + 1] for k in range(lanes - 1)]
    return keep[0] & ~Cat(*holes).any() if holes else keep[0]


class PacketFilter(wiring.Component):
    """Store-and-forward packet buffer that drops and counts malformed packets.

    Ports: ``i_pkt`` (In packet stream), ``o_pkt`` (Out packet stream), ``o_info`` (plain
    output, ``info_bits`` wide: the value ``info`` computed for the packet's first beat, valid
    with every beat on ``o_pkt``), status counters ``status_delivered`` and
    ``status_dropped_<kind>`` for every kind of :data:`DROP_KINDS` (``COUNTER_BITS`` wide,
    wrapping). ``accept(m, beat)`` (given at construction) returns ``(ok, info)`` Amaranth
    values from a beat's payload: ``ok`` = 0 drops the packet as ``unknown``. With
    ``accept_latency`` = 0 they are combinational functions of ``beat`` (the filter registers
    them); with ``accept_latency`` = 1 they are the values for the ``beat`` of the previous
    cycle (``accept`` registers its inputs every cycle, unconditionally, e.g. a synchronous
    read port of a table addressed by ``beat.dest``, so memory read data feeds a register).

    Checks (as :func:`hwgen.cluster.spec.packet.classify` with ``max_beats``, first failing beat
    decides, in that order): TKEEP = 0 (``zero-length``); TKEEP not ``2**n - 1`` or not all
    ones before TLAST (``bad-keep``); TDEST/TID/TUSER differing from the first beat's
    (``tlast-missing``); beat index >= ``max_beats`` (``too-long``); at TLAST, an
    inter-cluster packet of one beat with fewer than two bytes (``truncated``); then ``ok``
    of the first beat (``unknown``). A malformed packet's beats are discarded up to its TLAST;
    one counter increments per dropped packet, ``status_delivered`` per packet passed on.

    Pipeline: stage 0 accepts a beat and registers its per-beat checks (and ``accept``'s
    inputs); stage 1 combines them with the packet's earlier beats, writes the beat to the
    buffer (or rewinds a dropped packet) and registers which counter to increment; stage 2
    increments it. A counter therefore changes 3 cycles after the packet's TLAST beat was
    accepted (by then the packet's first beat can just have left ``o_pkt``).

    Buffer: ``depth`` beats (a power of two >= max_beats + 1) of on-chip memory; a packet is
    written as it arrives and becomes visible on ``o_pkt`` after its TLAST beat passed the
    checks (a dropped packet's beats are rewound). Latency: the packet's length + 2 cycles
    from its first input beat to its first output beat (a one-beat packet accepted in cycle
    ``t`` is first offered in cycle ``t + 2``); one beat per cycle in and out.
    Backpressure: ``i_pkt`` is stalled only while the buffer is full (a registered test that
    counts the beats in stages 0 and 1, so one entry can stay unused; beats of a packet
    being discarded are always accepted once its error is known), so a stalled output never
    stops counting of drops ahead of a full buffer, and dropped packets never block later
    ones.
    """

    def __init__(self, data_bits, max_beats, accept=None, info_bits=1, depth=None,
                 accept_latency=0):
        if accept_latency not in (0, 1):
            raise ValueError("accept_latency must be 0 or 1")
        self.data_bits, self.max_beats = data_bits, max_beats
        self.accept = accept or (lambda m, beat: (Const(1), Const(0, info_bits)))
        self.accept_latency = accept_latency
        self.info_bits = info_bits
        need = max(2 * max_beats, max_beats + 1, 4)
        self.depth = depth or 1 << (need - 1).bit_length()
        layout = packet_layout(data_bits)
        sig = {"i_pkt": In(stream.Signature(layout)), "o_pkt": Out(stream.Signature(layout)),
               "o_info": Out(info_bits), "status_delivered": Out(COUNTER_BITS)}
        sig.update({status_name(k): Out(COUNTER_BITS) for k in DROP_KINDS})
        super().__init__(sig)

    def elaborate(self, platform):
        m = Module()
        lanes = self.data_bits // 8
        full_keep = (1 << lanes) - 1
        layout = packet_layout(self.data_bits)
        row = data.StructLayout({"beat": layout, "info": self.info_bits})
        m.submodules.mem = mem = Memory(shape=row, depth=self.depth, init=[])
        wr = mem.write_port()
        rd = mem.read_port(domain="comb")
        abits = (self.depth - 1).bit_length()
        kind_of = {k: n + 1 for n, k in enumerate(DROP_KINDS)}
        i, o = self.i_pkt, self.o_pkt
        checks, first, over, fire0, ok0, info0 = self._stage0(m, lanes, full_keep, layout)
        v1, beat1, first1, flags1, trunc1, ok1, info1 = self._stage0_regs(
            m, layout, checks, first, fire0, ok0, info0)
        wp, cp, rp, err_nz, inc_delivered, inc_drop = self._stage1(
            m, wr, abits, kind_of, v1, beat1, first1, flags1, trunc1, ok1, info1)

        # -- stage 2: counters.
        with m.If(inc_delivered):
            m.d.sync += self.status_delivered.eq(self.status_delivered + 1)
        for k in DROP_KINDS:
            ctr = getattr(self, status_name(k))
            with m.If(inc_drop[k]):
                m.d.sync += ctr.eq(ctr + 1)

        # Input ready: a beat may be accepted when the buffer has room for it and for the
        # beats still in stages 0 and 1 (``full`` is registered: it assumes a beat was
        # accepted in the cycle before), or when it is discarded anyway.
        used = Signal(abits + 1)
        full = Signal()
        m.d.comb += used.eq(wp - rp)
        m.d.sync += full.eq(Mux(v1, used >= self.depth - 2, used >= self.depth - 1))
        m.d.comb += [i.ready.eq(~full | (~first & err_nz) | over),
                     fire0.eq(i.valid & i.ready)]

        m.d.comb += [rd.addr.eq(rp[:abits]), o.payload.eq(rd.data.beat),
                     self.o_info.eq(rd.data.info), o.valid.eq(rp != cp)]
        with m.If(o.valid & o.ready):
            m.d.sync += rp.eq(rp + 1)
        return m

    def _stage0(self, m, lanes, full_keep, layout):
        """Stage 0: the packet state (first beat, beat count) and the checks of the beat on
        ``i_pkt``, on its own and against its packet's first beat. Returns ``(checks, first,
        over, fire0, ok0, info0)``: one flag per kind, ``fire0`` (driven by
        :meth:`elaborate`: the beat is taken), and ``accept``'s verdict."""
        beat = self.i_pkt.payload
        # -- stage 0: accept a beat, check it on its own and against the packet's first beat.
        count = Signal(range(self.max_beats + 2))   # beats seen of the current packet (sat.)
        first = Signal(init=1)                      # the next beat starts a packet
        over = Signal()                             # count >= max_beats
        head = Signal(layout)                       # first beat (dest/id/user compared)
        fire0 = Signal()
        # The beat's own checks, one flag per kind (their order is applied in stage 1).
        checks = {"zero-length": beat.keep == 0,
                  "bad-keep": ~_contiguous(beat.keep, lanes)
                  | (~beat.last & (beat.keep != full_keep)),
                  "tlast-missing": ~first & ((beat.dest != head.dest) | (beat.id != head.id)
                                             | (beat.user != head.user)),
                  "too-long": over}
        ok0, info0 = self.accept(m, beat)
        with m.If(fire0):
            m.d.sync += first.eq(beat.last)
            with m.If(first):
                m.d.sync += [head.dest.eq(beat.dest), head.id.eq(beat.id),
                             head.user.eq(beat.user)]
            with m.If(beat.last):
                m.d.sync += [count.eq(0), over.eq(0)]
            with m.Else():
                with m.If(count <= self.max_beats):
                    m.d.sync += count.eq(count + 1)
                with m.If(count >= self.max_beats - 1):
                    m.d.sync += over.eq(1)
        return checks, first, over, fire0, ok0, info0

    def _stage0_regs(self, m, layout, checks, first, fire0, ok0, info0):
        """Stage 0 -> 1 registers: returns ``(v1, beat1, first1, flags1, trunc1, ok1,
        info1)`` (``ok1``, ``info1`` registered only with ``accept_latency == 0``)."""
        beat = self.i_pkt.payload
        # stage 0 -> 1 registers (unconditional: v1 says whether they hold a beat)
        v1 = Signal()
        beat1 = Signal(layout)
        first1 = Signal()
        flags1 = {k: Signal(name=f"check_{k.replace('-', '_')}") for k in checks}
        trunc1 = Signal()
        m.d.sync += [v1.eq(fire0), beat1.eq(beat), first1.eq(first),
                     trunc1.eq(beat.user[INTER_CLUSTER_BIT] & first & (beat.keep < 3))]
        m.d.sync += [flags1[k].eq(v) for k, v in checks.items()]
        if self.accept_latency == 0:
            ok1, info1 = Signal(), Signal(self.info_bits)
            m.d.sync += [ok1.eq(ok0), info1.eq(info0)]
        else:
            ok1, info1 = ok0, info0
        return v1, beat1, first1, flags1, trunc1, ok1, info1

    def _stage1(self, m, wr, abits, kind_of, v1, beat1, first1, flags1, trunc1, ok1, info1):
        """Stage 1: the packet's first error, the buffer write (speculative from ``wp``,
        committed to ``cp`` at a good packet's end, rewound on a drop) and the counter to
        increment. Returns ``(wp, cp, rp, err_nz, inc_delivered, inc_drop)``; ``rp`` is
        advanced by the output."""
        # -- stage 1: packet state, buffer write or rewind, which counter to increment.
        err1 = Signal(range(len(DROP_KINDS) + 1))   # 0 = none, else kind index + 1
        for k in reversed(list(flags1)):            # the first failing check wins
            with m.If(flags1[k]):
                m.d.comb += err1.eq(kind_of[k])
        bad1 = Cat(*flags1.values()).any()
        wp = Signal(abits + 1)      # next write (speculative, rewound on drop)
        cp = Signal(abits + 1)      # end of committed packets
        rp = Signal(abits + 1)      # next read
        err = Signal.like(err1)         # first error of the current packet so far
        err_nz = Signal()               # err != 0
        head_ok = Signal()
        head_info = Signal(self.info_bits)
        cur_ok = Signal()
        cur_info = Signal(self.info_bits)
        m.d.comb += [cur_ok.eq(Mux(first1, ok1, head_ok)),
                     cur_info.eq(Mux(first1, info1, head_info))]
        drop_mid = err_nz | bad1
        drop_end = drop_mid | trunc1 | ~cur_ok
        new_err = Mux(err_nz, err, err1)
        end_err = Signal.like(err1)
        with m.If(drop_mid):
            m.d.comb += end_err.eq(new_err)
        with m.Elif(trunc1):
            m.d.comb += end_err.eq(kind_of["truncated"])
        with m.Elif(~cur_ok):
            m.d.comb += end_err.eq(kind_of["unknown"])
        m.d.comb += [wr.addr.eq(wp[:abits]), wr.data.beat.eq(beat1), wr.data.info.eq(cur_info)]
        inc_delivered = Signal()
        inc_drop = {k: Signal(name=f"inc_{k.replace('-', '_')}") for k in DROP_KINDS}
        end1 = v1 & beat1.last
        m.d.sync += [inc_delivered.eq(end1 & ~drop_end)]
        m.d.sync += [inc_drop[k].eq(end1 & (end_err == n)) for k, n in kind_of.items()]
        with m.If(v1):
            with m.If(first1):
                m.d.sync += [head_ok.eq(ok1), head_info.eq(info1)]
            with m.If(beat1.last):
                m.d.sync += [err.eq(0), err_nz.eq(0)]
                with m.If(drop_end):
                    m.d.sync += wp.eq(cp)
                with m.Else():
                    m.d.comb += wr.en.eq(1)
                    m.d.sync += [wp.eq(wp + 1), cp.eq(wp + 1)]
            with m.Else():
                m.d.sync += [err.eq(new_err), err_nz.eq(drop_mid)]
                with m.If(drop_mid):
                    m.d.sync += wp.eq(cp)
                with m.Else():
                    m.d.comb += wr.en.eq(1)
                    m.d.sync += wp.eq(wp + 1)
        return wp, cp, rp, err_nz, inc_delivered, inc_drop



class SwitchModel(StreamModel):
    """Stimulus and expectation of a :class:`KernelSwitch` test: every input sends random
    packets (TID = the input's index, TDEST any id of ``route_map`` or, one in ten, an
    unmapped id). Arbitration interleaves inputs, so :meth:`expect` gives each output's
    packets grouped by input; a test compares, per output, each input's packets in order
    (``hwgen.flow.simulate.simulate(..., keep_outputs=True)``), not beat by beat."""

    result_port = "o_0"
    latency_from = "i_0"

    @staticmethod
    def stimulus(config, items, rng, length=40):
        c = config
        mapped = sorted(c.route_map)
        unmapped = [k for k in range(256) if k not in c.route_map]
        per_input = []
        for k in range(c.inputs):
            packets = []
            for _ in range(items):
                if unmapped and c.drop_unmapped and rng.random() < 0.1:
                    dest = int(rng.choice(unmapped))
                else:
                    dest = int(rng.choice(mapped))
                n = int(rng.integers(1, length, endpoint=True))
                packets.append(Packet(dest, k, rng.integers(0, 256, n, dtype="uint8").tobytes()))
            per_input.append(packets)
        return {"packets": per_input}

    @staticmethod
    def _names(config, direction):
        n = config.inputs if direction == "i" else config.outputs
        return ["i_pkt" if direction == "i" else "o_pkt"] if n == 1 else \
            [f"{direction}_{k}" for k in range(n)]

    @classmethod
    def inputs(cls, config, stim):
        return {name: [b for p in packets for b in to_beats(p, config.data_bits)]
                for name, packets in zip(cls._names(config, "i"), stim["packets"])}

    @classmethod
    def routed(cls, config, stim):
        """``{output name: {input index: [packets in order]}}``."""
        c = config
        outs = cls._names(c, "o")
        res = {name: {} for name in outs}
        for k, packets in enumerate(stim["packets"]):
            for p in packets:
                port = c.route_map.get(p.dest, None if c.drop_unmapped else 0)
                if port is not None:
                    res[outs[port]].setdefault(k, []).append(p)
        return res

    @classmethod
    def expect(cls, config, stim):
        return {name: [b for k in sorted(by_in) for p in by_in[k]
                       for b in to_beats(p, config.data_bits)]
                for name, by_in in cls.routed(config, stim).items()}

    @staticmethod
    def cycles_bound(config, stim):
        return 2 * sum(len(p.payload) for ps in stim["packets"] for p in ps) + 500
