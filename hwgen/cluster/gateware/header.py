"""The one-byte GMI header: attacher (sending kernels) and stripper (the gateway's decoder).

Both are :class:`ByteShift`, one byte-realignment core that moves a packet's bytes across
beats by a fixed offset, with TKEEP recomputed and an extra or one fewer beat where the byte
count crosses a beat boundary:

* :class:`HeaderAttacher` inserts the header byte (the packet's TDEST, the destination kernel in
  the destination cluster) before the payload, sets TDEST = ``dest_cluster``, TUSER = inter-
  cluster flag | ``cluster_id`` << 8 (packet.attach_header).
* :class:`HeaderStripper` removes payload byte 0 and makes it TDEST, clears the inter-cluster
  flag and keeps the source cluster (packet.strip_header).
"""

from amaranth.hdl import Module, Mux, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out
import numpy as np

from ...flow.model import StreamModel
from ..spec.packet import (INTER_CLUSTER_BIT, SRC_CLUSTER_SHIFT, Packet, attach_header,
                           packet_layout, strip_header, to_beats)

__all__ = ["ByteShift", "HeaderAttacher", "HeaderStripper", "GMIHeader", "HeaderModel",
           "TEST_CONFIGS"]


class ByteShift(wiring.Component):
    """Byte realignment of well-formed packets by one byte (insert before, or remove byte 0).

    Ports: ``i_pkt``, ``o_pkt`` (packet streams of ``data_bits``). ``mode`` is ``"insert"``
    (output = ``header(head)`` byte followed by the payload) or ``"remove"`` (output = the
    payload without byte 0). ``rewrite(head)`` gives the output ``(dest, id, user)`` from the
    packet's first input beat ``head`` (a payload view; in remove mode ``head.data[:8]`` is the
    removed byte).

    Every output beat takes the top ``o`` bytes of the previous input beat and the low
    ``lanes - o`` bytes of the current one (``o`` = 1 to insert, ``lanes - 1`` to remove).
    Insert: one output beat per input beat, plus one when the last input beat is full. Remove:
    the first input beat is absorbed, then one output beat per input beat, plus one when the
    last input beat has more than one byte. Latency 0 (insert) or one input beat (remove);
    one beat per cycle except the extra beat (input stalled for that cycle). Backpressure
    passes straight through (``i_pkt.ready`` follows ``o_pkt.ready``). Input packets must be
    well formed (:class:`~hwgen.cluster.gateware.switch.PacketFilter` in front), and in remove mode
    have at least two bytes.
    """

    def __init__(self, data_bits, mode, rewrite, header=None):
        assert mode in ("insert", "remove")
        self.data_bits, self.mode = data_bits, mode
        self.rewrite, self.header = rewrite, header
        layout = packet_layout(data_bits)
        super().__init__({"i_pkt": In(stream.Signature(layout)),
                          "o_pkt": Out(stream.Signature(layout))})

    def elaborate(self, platform):
        m = Module()
        L = self.data_bits // 8
        o = 1 if self.mode == "insert" else L - 1
        layout = packet_layout(self.data_bits)
        i, out = self.i_pkt, self.o_pkt
        beat = i.payload
        state = Signal(range(3))            # 0 first beat, 1 body, 2 flush
        prev = Signal(self.data_bits)
        res_keep = Signal(L)
        head_reg = Signal(layout)
        head = Signal(layout)
        first = state == 0
        m.d.comb += head.eq(Mux(first, beat, head_reg))
        # Constant sidebands go through a flop holding the constant: Verilator does not
        # evaluate an ``always @*`` block that assigns only a constant to part of a signal.
        dest, ident, user = (const_reg(m, v, w) for v, w in
                             zip(self.rewrite(head), (8, 8, 17)))
        m.d.comb += [out.payload.dest.eq(dest), out.payload.id.eq(ident),
                     out.payload.user.eq(user)]
        prev_eff = Signal(self.data_bits)
        if self.mode == "insert":
            m.d.comb += prev_eff.eq(Mux(first, self.header(head) << (8 * (L - 1)), prev))
        else:
            m.d.comb += prev_eff.eq(prev)
        spill = beat.keep[L - o]            # input bytes beyond lanes - o: one more beat
        absorb = first if self.mode == "remove" else 0

        with m.If(state == 2):
            m.d.comb += [out.valid.eq(1), out.payload.data.eq(prev >> (8 * (L - o))),
                         out.payload.keep.eq(res_keep), out.payload.last.eq(1)]
            with m.If(out.ready):
                m.d.sync += state.eq(0)
        with m.Elif(absorb):
            m.d.comb += i.ready.eq(1)
        with m.Else():
            m.d.comb += [out.valid.eq(i.valid), i.ready.eq(out.ready),
                         out.payload.data.eq((prev_eff >> (8 * (L - o))) | (beat.data << (8 * o))),
                         out.payload.keep.eq((beat.keep << o) | ((1 << o) - 1)),
                         out.payload.last.eq(beat.last & ~spill)]
        with m.If(i.valid & i.ready):
            m.d.sync += [prev.eq(beat.data), res_keep.eq(beat.keep >> (L - o))]
            with m.If(first):
                m.d.sync += head_reg.eq(beat)
            with m.If(beat.last):
                m.d.sync += state.eq(Mux(spill, 2, 0))
            with m.Else():
                m.d.sync += state.eq(1)
        return m


def const_reg(m, value, width):
    """``value`` itself, or for a Python int a flop that always holds it (see above)."""
    if not isinstance(value, int):
        return value
    reg = Signal(width, init=value)
    m.d.sync += reg.eq(value)
    return reg


def _user(inter, cluster):
    return (inter << INTER_CLUSTER_BIT) | (cluster << SRC_CLUSTER_SHIFT)


class HeaderAttacher(ByteShift):
    """GMI header attacher for a kernel sending to another cluster.

    Input: intra-cluster-style packets whose TDEST is the destination kernel id *inside the
    destination cluster*. Output: the one-byte header (that id) + payload, TDEST =
    ``dest_cluster``, TID kept, TUSER = inter-cluster flag | ``cluster_id`` << 8 (what
    :func:`hwgen.cluster.spec.packet.attach_header` gives). Ports, latency and backpressure: see
    :class:`ByteShift` (insert mode).
    """

    def __init__(self, data_bits=64, dest_cluster=1, cluster_id=0):
        user = _user(1, cluster_id)
        super().__init__(data_bits, "insert",
                         rewrite=lambda h: (dest_cluster, h.id, user),
                         header=lambda h: h.dest)


class HeaderStripper(ByteShift):
    """The gateway's packet decoder datapath: reads payload byte 0 (the GMI header) into
    TDEST, removes it, clears the inter-cluster flag and keeps TID and the source cluster
    (:func:`hwgen.cluster.spec.packet.strip_header`). See :class:`ByteShift` (remove mode)."""

    def __init__(self, data_bits=64):
        super().__init__(data_bits, "remove",
                         rewrite=lambda h: (h.data[:8], h.id,
                                            h.user & ~(1 << INTER_CLUSTER_BIT)))


class GMIHeader(wiring.Component):
    """``gmi-header`` top, both directions side by side: ``i_pkt`` -> :class:`HeaderAttacher`
    -> ``o_pkt`` (inter-cluster packets with the header), and ``i_dec`` (inter-cluster packets)
    -> :class:`HeaderStripper` -> ``o_dec``. Latency/backpressure of each path:
    :class:`ByteShift`."""

    def __init__(self, config):
        self.config = config
        layout = packet_layout(config.data_bits)
        super().__init__({"i_pkt": In(stream.Signature(layout)),
                          "o_pkt": Out(stream.Signature(layout)),
                          "i_dec": In(stream.Signature(layout)),
                          "o_dec": Out(stream.Signature(layout))})

    def elaborate(self, platform):
        m = Module()
        c = self.config
        m.submodules.attach = a = HeaderAttacher(c.data_bits, c.dest_cluster, c.cluster_id)
        m.submodules.strip = s = HeaderStripper(c.data_bits)
        wiring.connect(m, wiring.flipped(self.i_pkt), a.i_pkt)
        wiring.connect(m, a.o_pkt, wiring.flipped(self.o_pkt))
        wiring.connect(m, wiring.flipped(self.i_dec), s.i_pkt)
        wiring.connect(m, s.o_pkt, wiring.flipped(self.o_dec))
        return m


def random_packet(rng, length, dests, srcs=range(256), **kw):
    """A random :class:`~hwgen.cluster.spec.packet.Packet` to one of ``dests`` from one of
    ``srcs`` with a payload of 1 .. ``length`` random bytes; ``kw`` go to ``Packet``
    (``inter_cluster``, ``src_cluster``)."""
    n = int(rng.integers(1, length, endpoint=True))
    return Packet(int(rng.choice(list(dests))), int(rng.choice(list(srcs))),
                  rng.integers(0, 256, n, dtype=np.uint8).tobytes(), **kw)


class HeaderModel(StreamModel):
    """Stimulus and golden model of ``gmi-header``: random packets with payloads of 1..length
    bytes (lengths at every beat boundary included) to kernels 1..members; ``i_dec`` gets
    inter-cluster packets (header + >= 1 byte) from random clusters."""

    result_port = "o_pkt"
    latency_from = "i_pkt"

    @staticmethod
    def stimulus(config, items, rng):
        """``{"send": [Packet], "recv": [Packet]}``, ``items`` each: ``send`` to kernels 1..members
        with 1..length payload bytes (the first ones at beat-boundary lengths); ``recv``
        inter-cluster packets (:func:`~hwgen.cluster.spec.packet.attach_header`) from random source
        clusters."""
        c, lanes = config, config.data_bits // 8
        edge = sorted({1, lanes - 1, lanes, lanes + 1, 2 * lanes, c.length} &
                      set(range(1, c.length + 1)))
        out, dec = [], []
        for k in range(items):
            p = random_packet(rng, c.length, range(1, c.members + 1))
            if k < len(edge):
                p = Packet(p.dest, p.src, bytes(rng.integers(0, 256, edge[k], dtype=np.uint8)))
            out.append(p)
            q = random_packet(rng, c.length, range(1, c.members + 1))
            dec.append(attach_header(q, int(rng.integers(0, 256)), q.dest,
                                     src_cluster=int(rng.integers(0, 256))))
        return {"send": out, "recv": dec}

    @staticmethod
    def inputs(config, stim):
        """``i_pkt``: the ``send`` packets, ``i_dec``: the ``recv`` packets, as
        :func:`~hwgen.cluster.spec.packet.to_beats` beats (``data``, ``keep``, ``dest``, ``id``,
        ``user``), ``last`` on each packet's final beat."""
        b = config.data_bits
        return {"i_pkt": [x for p in stim["send"] for x in to_beats(p, b)],
                "i_dec": [x for p in stim["recv"] for x in to_beats(p, b)]}

    @staticmethod
    def expect(config, stim):
        """``o_pkt``: each ``send`` packet through :func:`~hwgen.cluster.spec.packet.attach_header`
        (``dest_cluster``, header byte = its TDEST, ``cluster_id``); ``o_dec``: each ``recv`` packet
        through :func:`~hwgen.cluster.spec.packet.strip_header`; beats as on input."""
        c, b = config, config.data_bits
        return {"o_pkt": [x for p in stim["send"] for x in to_beats(
                    attach_header(p, c.dest_cluster, p.dest, c.cluster_id), b)],
                "o_dec": [x for p in stim["recv"] for x in to_beats(strip_header(p), b)]}

    @staticmethod
    def cycles_bound(config, stim):
        return 4 * sum(len(p.payload) for p in stim["send"] + stim["recv"])


TEST_CONFIGS = (
    {"data_bits": 64, "length": 33, "members": 5},
    {"data_bits": 512, "length": 200, "members": 3, "dest_cluster": 7, "cluster_id": 200},
    {"data_bits": 64, "length": 1, "members": 1, "dest_cluster": 0},
    {"data_bits": 512, "length": 65, "members": 9, "dest_cluster": 255, "cluster_id": 1},
)
