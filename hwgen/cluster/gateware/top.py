"""Per-FPGA top level of a built cluster: the FPGA's compute kernels behind their packet
adapters, GMI kernels, header attachers, kernel switches and router, on the FPGA holding kernel 0
the gateway kernel (:class:`~hwgen.cluster.gateware.gateway.Gateway`, configured from the builder's
plan by :func:`~hwgen.cluster.plan.placement.gateway_config`). With ``kernels="external"`` in the
plan the compute kernels are connected outside through packet stream ports instead. Gateware only:
:class:`FPGATop` is built from one FPGA's :class:`~hwgen.cluster.plan.placement.FPGAPlan` (every
configuration already made there); :func:`hwgen.cluster.run.builder.write_tops` emits it.

Ports (emitted names; every packet stream is ``packet_layout(data_bits)`` with TKEEP, TDEST,
TID, TUSER, TLAST):

* Compute kernels inside (:attr:`FPGAPlan.computes`): kernel ``id`` is
  :class:`~hwgen.cluster.gateware.compute.KernelChain` ``kernel_k<id>`` fed by a
  :class:`~hwgen.cluster.gateware.adapter.PacketsToRows` ``pkt2row_k<id>`` (one row stream per
  source id into the chain input the plan assigns, through an element-extending
  :class:`~hwgen.cluster.gateware.compute.Regroup` ``widen_k<id>_<input>`` where the packets carry
  narrower elements than the input takes) and sending through a
  :class:`~hwgen.cluster.gateware.adapter.RowToPackets` ``row2pkt_k<id>`` (TID = ``id``, TDEST = its
  destination), then a store-and-forward buffer ``pktbuf_k<id>``
  (:class:`~hwgen.cluster.gateware.switch.PacketFilter`, one packet of the kernel's longest);
  ``status_k<id>_dropped`` counts the packets of unknown source ids its ``pkt2row`` dropped,
  ``status_k<id>_pktbuf_dropped`` the malformed packets the buffer dropped (none, unless a
  packet is longer than the buffer's ``max_beats``: a bug).
  The buffer matters: the output switch grants an input until its TLAST, and a kernel emits
  a row as slowly as it computes it (a linear one group of outputs every ``S`` cycles), so a
  row's packet streamed straight into the switch held the FPGA's one output path for the
  kernel's whole row time. In ``minilm_encoder`` fpga4's ``ln2`` output waited behind
  ``ffn_down``'s next row (768 cycles); only the last row, with nothing behind it, left on time.
* Compute kernels outside (``kernels="external"``): ``m_axis_k<id>`` / ``s_axis_k<id>``: to /
  from each compute kernel ``id`` of this FPGA (built by ``hwgen build <kind>``).
* Kernel 0 has no ports: the gateway only receives inter-cluster packets and sends what it
  decodes (it is not a compute kernel). A compute kernel that sends to another cluster
  (``output`` in the layer description) goes through a
  :class:`~hwgen.cluster.gateware.header.HeaderAttacher` ``header_k<id>`` here: TDEST is the kernel
  id inside the destination cluster, the attacher makes the one-byte header.
* ``s_axis_net`` (packets from the network, already out of the UDP core) and ``m_axis_net``
  (packets to the network) with ``m_axis_addr``, one beat per ``m_axis_net`` packet carrying the
  destination node's IPv4 address (:class:`~hwgen.cluster.gateware.router.Router`'s ``o_addr``).
* ``s_axis_cfg``: the router's configuration stream (``router_cfg.hex`` of the build loads both
  routing tables); ``status_*``: the router's delivered/dropped counters; on the gateway's
  FPGA also ``status_gw_delivered`` / ``status_gw_dropped_<kind>`` (the gateway's packet
  decoder, :data:`~hwgen.cluster.spec.switch.DROP_KINDS`); for every GMI kernel ``id`` here
  ``status_k<id>_rounds`` / ``_drop_source`` / ``_drop_length`` / ``_drop_overrun`` (its
  ``stat_*`` counters, :data:`~hwgen.cluster.gateware.gmi.STATUS_PORTS`).

Dataflow: every local kernel output, and the gateway's outputs (point-to-point packets with the
header stripped and what its virtual GMI kernels send) -> output switch (round-robin,
packet-atomic) -> router (routing tables: local or network, so a gateway output for a kernel
on another FPGA of the cluster leaves through ``m_axis_net``); router's local output +
``s_axis_net`` -> merge -> inter-cluster packets (TUSER bit 16) to the gateway (dropped on
FPGAs without it), the others -> input switch by TDEST -> the local kernels (GMI kernels,
compute kernels through their ``pkt2row`` or ``m_axis_k<id>``). Packets for ids not on this
FPGA (kernel 0 and the virtual ids included: virtual kernels are fed only by inter-cluster
packets) are dropped by the input switch; the router drops and counts unknown ids, the
gateway malformed and unknown inter-cluster packets.

Latency: the switches are combinational (0 cycles); the router and the gateway's decoder are
store-and-forward (a packet leaves after its last beat has arrived, see
:class:`~hwgen.cluster.gateware.router.Router`, :class:`~hwgen.cluster.gateware.gateway.Gateway`).
Backpressure: a stalled kernel input stalls only the switch output for it and the traffic
waiting on that output.
"""

from dataclasses import replace

from amaranth.hdl import Module, signed, unsigned
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out, connect

from ..plan.router_load import packet_beats
from ..spec.packet import INTER_CLUSTER_BIT, packet_layout
from ..spec.switch import COUNTER_BITS, DROP_KINDS, SwitchConfig, status_name
from .adapter import PacketsToRows, RowToPackets
from .compute import KernelChain, Regroup
from .gateway import Gateway
from .gmi import STATUS_PORTS, gmi_component
from .header import HeaderAttacher
from .router import Router, addr_layout, cfg_layout
from .switch import KernelSwitch, PacketFilter

__all__ = ["FPGATop", "InterSplit"]


class InterSplit(wiring.Component):
    """Demultiplexer: beats with the inter-cluster flag (TUSER bit 16) to ``o_inter``, the
    others to ``o_intra``. Combinational (latency 0); the input waits for the selected output.
    The flag is the same on every beat of a well-formed packet, so packets stay whole."""

    def __init__(self, data_bits):
        layout = packet_layout(data_bits)
        super().__init__({"i_pkt": In(stream.Signature(layout)),
                          "o_inter": Out(stream.Signature(layout)),
                          "o_intra": Out(stream.Signature(layout))})

    def elaborate(self, platform):
        m = Module()
        inter = self.i_pkt.payload.user[INTER_CLUSTER_BIT]
        for port, sel in ((self.o_inter, inter), (self.o_intra, ~inter)):
            m.d.comb += [port.payload.eq(self.i_pkt.payload), port.valid.eq(self.i_pkt.valid & sel)]
        m.d.comb += self.i_pkt.ready.eq(
            (inter & self.o_inter.ready) | (~inter & self.o_intra.ready))
        return m


def packet_buffer_beats(cp):
    """Beats of the longest packet compute kernel ``cp`` (a
    :class:`~hwgen.cluster.plan.placement.ComputePlan`) sends: its row, or ``max_packet_bytes`` when
    rows are split, plus the header byte of an inter-cluster packet."""
    r = cp.r2p
    nbytes = min(r.format.row_bytes, r.max_packet_bytes) + int(cp.header)
    return packet_beats(nbytes, nbytes, r.data_bits)[1]


class FPGATop(wiring.Component):
    """Top level of one FPGA of a cluster (see the module docstring)."""

    def __init__(self, fpga_plan):
        self.fpga_plan = fp = fpga_plan
        self.data_bits = fp.data_bits
        self.external = list(fp.external)
        self.gateway = fp.gateway
        self.router_config = fp.router
        self.gmi_configs = fp.gmi_configs
        layout = packet_layout(fp.data_bits)
        sig = {"i_cfg": In(stream.Signature(cfg_layout())),
               "i_net": In(stream.Signature(layout)),
               "o_net": Out(stream.Signature(layout)),
               "o_addr": Out(stream.Signature(addr_layout()))}
        for i in self.external:
            sig[f"o_k{i}"] = Out(stream.Signature(layout))
            sig[f"i_k{i}"] = In(stream.Signature(layout))
        self.computes = dict(fp.computes)
        sig.update({f"status_k{i}_dropped": Out(COUNTER_BITS) for i in self.computes})
        sig.update({f"status_k{i}_pktbuf_dropped": Out(COUNTER_BITS) for i in self.computes})
        sig.update({f"status_k{i}_{name[len('stat_'):]}": Out(COUNTER_BITS)
                    for i in fp.gmi_kinds for name in STATUS_PORTS})
        sig["status_delivered"] = Out(COUNTER_BITS)
        sig.update({status_name(k): Out(COUNTER_BITS) for k in DROP_KINDS})
        self._status = ["status_delivered"] + [status_name(k) for k in DROP_KINDS]
        if self.gateway is not None:
            sig["status_gw_delivered"] = Out(COUNTER_BITS)
            sig.update({"status_gw_" + status_name(k)[len("status_"):]: Out(COUNTER_BITS)
                        for k in DROP_KINDS})
        super().__init__(sig)

    def elaborate(self, platform):
        m = Module()
        fp, db = self.fpga_plan, self.data_bits
        gw_here = self.gateway is not None
        # kernel-side endpoints: (id, sink into kernel, source out of kernel)
        ends = []
        for i in self.external:
            src = getattr(self, f"i_k{i}")
            if i in fp.headers:
                att = HeaderAttacher(db, dest_cluster=fp.dest_cluster, cluster_id=fp.cluster_id)
                m.submodules[f"header_k{i}"] = att
                connect(m, wiring.flipped(src), att.i_pkt)
                src = att.o_pkt
            ends.append((i, getattr(self, f"o_k{i}"), src))
        for i, cp in self.computes.items():
            ends.append((i, *self._compute(m, cp)))
        for i, kind in fp.gmi_kinds.items():
            g = gmi_component(kind, self.gmi_configs[i])
            m.submodules[f"gmi_k{i}"] = g
            for name in STATUS_PORTS:
                m.d.comb += getattr(self, f"status_k{i}_{name[len('stat_'):]}").eq(
                    getattr(g, name))
            ends.append((i, g.i_pkt, g.o_pkt))
        sources = [wiring.flipped(src) if i in self.external and src is
                   getattr(self, f"i_k{i}") else src for i, _, src in ends]
        if gw_here:
            gw = Gateway(self.gateway)
            m.submodules.gateway = gw
            sources += [gw.o_pkt] + [getattr(gw, f"o_{kind}")
                                     for kind in self.gateway.virtual_kinds]
            m.d.comb += self.status_gw_delivered.eq(gw.status_delivered)
            for k in DROP_KINDS:
                name = status_name(k)
                m.d.comb += getattr(self, "status_gw_" + name[len("status_"):]).eq(
                    getattr(gw, name))

        # output switch -> router
        n = len(ends)
        out_sw = KernelSwitch(SwitchConfig(data_bits=db, inputs=len(sources), outputs=1,
                                           drop_unmapped=False), {x: 0 for x in range(256)})
        m.submodules.out_switch = out_sw
        for src, name in zip(sources, out_sw.in_names):
            connect(m, src, getattr(out_sw, name))
        router = Router(self.router_config)
        m.submodules.router = router
        connect(m, out_sw.o_pkt, router.i_pkt)
        connect(m, wiring.flipped(self.i_cfg), router.i_cfg)
        connect(m, router.o_net, wiring.flipped(self.o_net))
        connect(m, router.o_addr, wiring.flipped(self.o_addr))
        for s in self._status:
            m.d.comb += getattr(self, s).eq(getattr(router, s))

        # router local + network -> merge -> inter/intra split -> input switch
        merge = KernelSwitch(SwitchConfig(data_bits=db, inputs=2, outputs=1,
                                          drop_unmapped=False), {x: 0 for x in range(256)})
        m.submodules.merge = merge
        connect(m, router.o_local, merge.i_0)
        connect(m, wiring.flipped(self.i_net), merge.i_1)
        split = InterSplit(db)
        m.submodules.split = split
        connect(m, merge.o_pkt, split.i_pkt)
        routes = {i: p for p, (i, _, _) in enumerate(ends)}
        in_sw = KernelSwitch(SwitchConfig(data_bits=db, inputs=1, outputs=n), routes)
        m.submodules.in_switch = in_sw
        connect(m, split.o_intra, in_sw.i_pkt)
        sinks = {i: sink for i, sink, _ in ends}
        for (i, _, _), name in zip(ends, in_sw.out_names):
            if i in self.external:
                connect(m, getattr(in_sw, name), wiring.flipped(sinks[i]))
            else:
                connect(m, getattr(in_sw, name), sinks[i])
        if gw_here:
            connect(m, split.o_inter, gw.i_pkt)
        else:                       # inter-cluster packets only arrive at the gateway's FPGA
            m.d.comb += split.o_inter.ready.eq(1)
        return m

    def _compute(self, m, cp):
        """Compute kernel ``cp`` (a :class:`~hwgen.cluster.plan.placement.ComputePlan`) behind its
        adapters; returns its packet ``(sink, source)``."""
        i, fp = cp.id, self.fpga_plan
        chain = KernelChain(cp.chain)
        p2r, r2p = PacketsToRows(cp.p2r), RowToPackets(cp.r2p)
        m.submodules[f"kernel_k{i}"] = chain
        m.submodules[f"pkt2row_k{i}"] = p2r
        m.submodules[f"row2pkt_k{i}"] = r2p
        ports = {p.name: p for p in chain.inputs}
        for j, ((_, name, _), (_, fmt)) in enumerate(zip(cp.sources,
                                                          cp.p2r.source_formats)):
            src = getattr(p2r, f"o_{j}")
            if name in cp.widen:
                port = ports[name]
                shape = (signed if fmt.signed else unsigned)(fmt.bits)
                rg = Regroup(replace(port, shape=shape), port)
                m.submodules[f"widen_k{i}_{name}"] = rg
                connect(m, src, rg.i)
                src = rg.o
            connect(m, src, getattr(chain, name))
        connect(m, chain.o_y, r2p.i_row)
        m.d.comb += getattr(self, f"status_k{i}_dropped").eq(p2r.status_dropped)
        out = r2p.o_pkt
        if cp.header:
            att = HeaderAttacher(self.data_bits, dest_cluster=fp.dest_cluster,
                                 cluster_id=fp.cluster_id)
            m.submodules[f"header_k{i}"] = att
            connect(m, out, att.i_pkt)
            out = att.o_pkt
        buf = PacketFilter(self.data_bits, packet_buffer_beats(cp))
        m.submodules[f"pktbuf_k{i}"] = buf
        connect(m, out, buf.i_pkt)
        m.d.comb += getattr(self, f"status_k{i}_pktbuf_dropped").eq(
            sum(getattr(buf, status_name(k)) for k in DROP_KINDS))
        return p2r.i_pkt, buf.o_pkt
