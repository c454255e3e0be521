"""``cluster-router``: the per-FPGA router with two routing tables (paper sections 2.1, 4).

Packets from the FPGA's kernels (``i_pkt``) are checked and buffered by a
:class:`~hwgen.cluster.gateware.switch.PacketFilter`, then looked up in one of two routing tables
held in on-chip memory (``amaranth.lib.memory``):

* kernel table: kernel id (TDEST of an intra-cluster packet) -> node address (32 bits, e.g. the
  IPv4 address of the FPGA holding the kernel) and a valid bit;
* cluster table: cluster id (TDEST of an inter-cluster packet, TUSER bit 16) -> node address of
  that cluster's gateway FPGA, and a valid bit.

A packet whose node address is ``node_address`` (this FPGA) goes to ``o_local`` (the kernel
switch), any other to ``o_net``, its node address to ``o_addr`` (one beat per packet, in
packet order). Packets to ids beyond the table or to an
entry not (yet) valid are dropped and counted as ``unknown``, malformed packets are dropped and
counted by kind; neither stalls later traffic.
"""

from amaranth.hdl import Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from ...flow.model import SimOption, StreamModel
from ..golden.traffic import (StatusLines, counter_report, filter_golden, fuzz_stream,
                              random_payload, sample_signals)
from ..spec.packet import INTER_CLUSTER_BIT, Packet, packet_layout, to_beats
from ..spec.router import ADDR_BITS
from ..spec.switch import COUNTER_BITS, DROP_KINDS, status_name
from .switch import PacketFilter

__all__ = ["Router", "RouterModel", "cfg_layout", "pack_cfg", "addr_layout", "TEST_CONFIGS"]


def cfg_layout():
    """Configuration stream beat: write ``address``/``valid`` into entry ``index`` of table
    ``table`` (0 kernel, 1 cluster); ``last`` ends a configuration frame."""
    return data.StructLayout({"table": 1, "index": 8, "address": ADDR_BITS, "valid": 1,
                              "last": 1})


def pack_cfg(beat):
    """The integer of one configuration beat (a dict of :func:`cfg_layout`'s fields), packed by
    the layout itself (``router_cfg.hex`` of a cluster build holds one per line)."""
    return cfg_layout().const(beat).as_value().value


def addr_layout():
    """``o_addr`` beats: the destination node address of one packet on ``o_net``."""
    return data.StructLayout({"addr": ADDR_BITS})


class Router(wiring.Component):
    """Two-level routing of packets from local kernels to the kernel switch or the network.

    Ports
    -----
    ``i_cfg`` : In stream of :func:`cfg_layout`
        Table writes, one per beat (always ready; a beat is registered, then written in the
        next cycle). ``i_pkt`` is held (not ready) until the first configuration beat with
        ``last`` set has been written; later frames update the tables while packets flow (a
        packet uses the entry read in the cycle its first beat is accepted, i.e. the writes of
        configuration beats accepted at least two cycles earlier).
    ``i_pkt`` : In packet stream (``packet_layout(data_bits)``)
    ``o_local`` : Out packet stream, packets for kernels on this FPGA
    ``o_net`` : Out packet stream, packets for other FPGAs
    ``o_addr`` : Out stream of :func:`addr_layout`, the node address of each ``o_net`` packet,
        pushed when the packet's first beat leaves (a 4-entry FIFO; ``o_net`` waits while it
        is full)
    ``status_delivered``, ``status_dropped_<kind>`` : counters (32 bits) of routed packets
        and of dropped packets per kind (:data:`~hwgen.cluster.spec.switch.DROP_KINDS`).

    Pipeline (:class:`~hwgen.cluster.gateware.switch.PacketFilter` with ``accept_latency`` = 1): the
    first beat's TDEST addresses both tables through synchronous read ports (the read data
    and the range checks are registered); the next cycle picks the entry and checks the
    packet; counters change two cycles after that (3 cycles after the TLAST beat entered).
    Whether an entry's address is this node's is computed when the entry is written.

    Latency: a packet appears on its output ``beats + 2`` cycles after its first beat entered
    (store-and-forward; ``beats + 1`` before the pipelining of issue 11); one beat per cycle.
    Backpressure: a stalled output stalls the buffer's head packet (and, once the buffer is
    full, ``i_pkt``); dropped packets are consumed at full rate.
    """

    def __init__(self, config):
        self.config = c = config
        sig = {"i_cfg": In(stream.Signature(cfg_layout())),
               "i_pkt": In(stream.Signature(packet_layout(c.data_bits))),
               "o_local": Out(stream.Signature(packet_layout(c.data_bits))),
               "o_net": Out(stream.Signature(packet_layout(c.data_bits))),
               "o_addr": Out(stream.Signature(addr_layout())),
               "status_delivered": Out(COUNTER_BITS)}
        sig.update({status_name(k): Out(COUNTER_BITS) for k in DROP_KINDS})
        super().__init__(sig)

    def elaborate(self, platform):
        m = Module()
        c = self.config
        # Table entries keep whether the address is this node's (compared when written).
        entry = data.StructLayout({"address": ADDR_BITS, "valid": 1, "local": 1})
        m.submodules.ktab = ktab = Memory(shape=entry, depth=c.members, init=[])
        m.submodules.ctab = ctab = Memory(shape=entry, depth=c.clusters, init=[])
        kw, cw = ktab.write_port(), ctab.write_port()
        kr, cr = ktab.read_port(), ctab.read_port()         # synchronous: data registered
        # Configuration beats are registered, then written (and ``configured`` set).
        cfg = Signal(cfg_layout())
        cfg_valid = Signal()
        m.d.sync += [cfg.eq(self.i_cfg.payload), cfg_valid.eq(self.i_cfg.valid)]
        configured = Signal()
        for w in (kw, cw):
            m.d.comb += [w.addr.eq(cfg.index), w.data.address.eq(cfg.address),
                         w.data.valid.eq(cfg.valid),
                         w.data.local.eq(cfg.address == c.node_address)]
        m.d.comb += self.i_cfg.ready.eq(1)
        with m.If(cfg_valid):
            with m.If(cfg.table == 0):
                m.d.comb += kw.en.eq(cfg.index < c.members)
            with m.Else():
                m.d.comb += cw.en.eq(cfg.index < c.clusters)
            with m.If(cfg.last):
                m.d.sync += configured.eq(1)

        info = data.StructLayout({"local": 1, "addr": ADDR_BITS})

        def accept(m, beat):
            # Table reads addressed by the beat; ``ok``/``info`` one cycle later.
            m.d.comb += [kr.addr.eq(beat.dest), cr.addr.eq(beat.dest)]
            inter, in_k, in_c = Signal(), Signal(), Signal()
            m.d.sync += [inter.eq(beat.user[INTER_CLUSTER_BIT]),
                         in_k.eq(beat.dest < c.members), in_c.eq(beat.dest < c.clusters)]
            ok = Mux(inter, in_c & cr.data.valid, in_k & kr.data.valid)
            res = Signal(info)
            m.d.comb += [res.addr.eq(Mux(inter, cr.data.address, kr.data.address)),
                         res.local.eq(Mux(inter, cr.data.local, kr.data.local))]
            return ok, res.as_value()

        m.submodules.filter = f = PacketFilter(c.data_bits, c.max_beats, accept,
                                               info_bits=info.size, accept_latency=1)
        m.d.comb += [f.i_pkt.payload.eq(self.i_pkt.payload),
                     f.i_pkt.valid.eq(self.i_pkt.valid & configured),
                     self.i_pkt.ready.eq(f.i_pkt.ready & configured)]
        for k in ("delivered",) + DROP_KINDS:
            name = "status_delivered" if k == "delivered" else status_name(k)
            m.d.comb += getattr(self, name).eq(getattr(f, name))
        where = info(f.o_info)
        m.submodules.addr_fifo = af = SyncFIFOBuffered(width=ADDR_BITS, depth=4)
        in_packet = Signal()            # a beat of the current o_net packet has left
        net_ok = ~where.local & (in_packet | af.w_rdy)
        m.d.comb += [self.o_local.payload.eq(f.o_pkt.payload),
                     self.o_net.payload.eq(f.o_pkt.payload),
                     self.o_local.valid.eq(f.o_pkt.valid & where.local),
                     self.o_net.valid.eq(f.o_pkt.valid & net_ok),
                     f.o_pkt.ready.eq(Mux(where.local, self.o_local.ready,
                                          self.o_net.ready & net_ok)),
                     af.w_data.eq(where.addr),
                     af.w_en.eq(self.o_net.valid & self.o_net.ready & ~in_packet),
                     self.o_addr.payload.addr.eq(af.r_data),
                     self.o_addr.valid.eq(af.r_rdy),
                     af.r_en.eq(self.o_addr.ready)]
        with m.If(self.o_net.valid & self.o_net.ready):
            m.d.sync += in_packet.eq(~self.o_net.payload.last)
        return m


class RouterModel(StatusLines, StreamModel):
    """Stimulus and golden model of ``cluster-router``.

    Tables: kernel ids 0..members-1 spread over this node and three other node addresses;
    about one entry in eight of each table is left invalid, one cluster entry points at this
    node (a gateway here). Traffic (``--items`` packets, payloads of 1..length bytes): kernel
    packets to valid, invalid and out-of-table ids, inter-cluster packets (with their header
    byte) to valid and invalid clusters; with ``fuzz`` = N, N packets of which ~30% are
    malformed (every kind) or unknown (see :mod:`hwgen.cluster.golden.traffic`). The last packet
    always goes to another node, so the counters sampled at ``o_net``'s last TLAST are final.
    """

    result_port = "o_net"
    latency_from = "i_pkt"
    sim_options = (SimOption("fuzz", "N packets, about 30% malformed or to unknown "
                             "destinations; prints the dropped/delivered counters sampled from "
                             "the simulation beside the golden model's"),)
    sample_signals = sample_signals()

    @staticmethod
    def tables(config, rng):
        """Random routing tables ``(ktab, ctab)``, each ``{id: node address}`` over four nodes
        (``node_address`` and three of 10.0.0.2 .. 10.0.0.15): kernel ids 0 .. ``members - 1``
        (kernel 0 always remote) and cluster ids 0 .. ``clusters - 1`` (cluster 0 this node,
        the others remote), about one entry in eight left out (invalid)."""
        c = config
        nodes = [c.node_address] + [int(a) for a in rng.choice(
            [a for a in range(0x0A000002, 0x0A000010) if a != c.node_address], 3,
            replace=False)]
        ktab = {k: nodes[int(rng.integers(4))] for k in range(c.members)
                if rng.random() >= 0.125 or k == 0}
        ktab[0] = nodes[1]                  # at least one remote kernel
        ctab = {k: nodes[int(rng.integers(1, 4))] for k in range(c.clusters)
                if rng.random() >= 0.125}
        ctab[0] = c.node_address
        return ktab, ctab

    @classmethod
    def stimulus(cls, config, items, rng, fuzz=None):
        """``{"ktab", "ctab", "beats"}``: kernel and cluster tables (:meth:`tables`,
        ``{id: node address}``) and the ``i_pkt`` beats of ``items`` packets (``fuzz`` = N: N
        packets, ~30% malformed or unknown), the last one to a remote kernel (see the class
        docstring)."""
        c = config
        ktab, ctab = cls.tables(config, rng)
        remote = sorted(k for k, a in ktab.items() if a != c.node_address)

        def good(rng):
            inter = rng.random() < 0.25
            dest = int(rng.integers(0, (c.clusters if inter else c.members) + 2))
            dest = min(dest, 255)
            lo = 2 if inter else 1
            p = Packet(dest, int(rng.integers(256)), random_payload(rng, lo, max(c.length, lo)),
                       inter_cluster=inter, src_cluster=int(rng.integers(256)))
            return to_beats(p, c.data_bits)

        def unknown(rng):
            p = Packet(min(c.members + int(rng.integers(0, 4)), 255), 1,
                       random_payload(rng, 1, c.length))
            return to_beats(p, c.data_bits)

        def last(rng):
            return to_beats(Packet(remote[0], 1, random_payload(rng, 1, c.length)),
                            c.data_bits)

        n = fuzz if fuzz else items
        beats = fuzz_stream(rng, n, good, unknown, c.data_bits, c.max_beats,
                            fraction=0.3 if fuzz else 0.0, last_good=last)
        return {"ktab": ktab, "ctab": ctab, "beats": beats}

    @staticmethod
    def inputs(config, stim):
        """``i_cfg``: one beat per table entry (``table`` 0 = kernel, 1 = cluster; ``index``,
        ``address``, ``valid`` = 1), kernel table first, ``last`` on the final entry; ``i_pkt``:
        ``stim["beats"]`` as they are (packet beats, ``last`` on each packet's final beat)."""
        cfg = [{"table": t, "index": k, "address": a, "valid": 1, "last": 0}
               for t, tab in ((0, stim["ktab"]), (1, stim["ctab"])) for k, a in tab.items()]
        cfg[-1]["last"] = 1
        return {"i_cfg": cfg, "i_pkt": stim["beats"]}

    @staticmethod
    def golden(config, stim):
        """``(passed, counts)`` of :func:`~hwgen.cluster.golden.traffic.filter_golden` over the
        stimulus beats, the destination node looked up in ``ctab`` for inter-cluster packets and in
        ``ktab`` otherwise (the node address is each passed packet's ``info``)."""
        c = config

        def lookup(head):
            inter = head["user"] >> INTER_CLUSTER_BIT & 1
            return (stim["ctab"] if inter else stim["ktab"]).get(head["dest"])

        return filter_golden(stim["beats"], c.data_bits, c.max_beats, lookup)

    @classmethod
    def expect(cls, config, stim):
        """The packets :meth:`golden` passes (:func:`~hwgen.cluster.golden.traffic.filter_golden`,
        destination looked up in ``ctab`` if inter-cluster, else ``ktab``), in order: those for
        ``node_address`` on ``o_local``, the others on ``o_net`` with one ``o_addr`` beat (``addr``)
        per packet."""
        passed, _ = cls.golden(config, stim)
        local, net, addrs = [], [], []
        for beats, addr in passed:
            if addr == config.node_address:
                local += beats
            else:
                net += beats
                addrs.append({"addr": addr})
        return {"o_local": local, "o_net": net, "o_addr": addrs}

    @staticmethod
    def cycles_bound(config, stim):
        return 3 * len(stim["beats"]) + 200

    @classmethod
    def report(cls, config, stim, summary, samples):
        _, counts = cls.golden(config, stim)
        return counter_report(counts, summary, samples)


#: Simulated by tests/test_sim.py: the acceptance size (5 kernels, 33-byte packets), 512-bit
#: TDATA with odd table sizes, one-beat packets.
TEST_CONFIGS = (
    {"members": 5, "length": 33},
    {"data_bits": 512, "members": 37, "clusters": 3, "length": 200},
    {"members": 3, "clusters": 1, "length": 8, "node_address": 0x0A00000F},
    {"data_bits": 512, "members": 16, "clusters": 7, "length": 65},
)
