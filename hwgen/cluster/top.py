"""Per-FPGA top level of a built cluster: the FPGA's GMI kernels, header attachers, kernel
switches and router, on the FPGA holding kernel 0 the gateway kernel
(:class:`~hwgen.cluster.gateway.Gateway`, configured from the builder's plan by
:func:`gateway_config`), with the compute kernels connected outside through packet stream
ports.

:class:`FPGATop` (one per FPGA of a :class:`~hwgen.cluster.builder.ClusterPlan`)

Ports (emitted names; every packet stream is ``packet_layout(data_bits)`` with TKEEP, TDEST,
TID, TUSER, TLAST):

* ``m_axis_k<id>`` / ``s_axis_k<id>``: to / from each compute kernel ``id`` of this FPGA
  (built by ``hwgen build <kind>``). Kernel 0 has no ports: the gateway only receives
  inter-cluster packets and sends what it decodes (it is not a compute kernel). A compute
  kernel that sends to another cluster (``output`` in the layer description) goes through a
  :class:`~hwgen.cluster.header.HeaderAttacher` here: it sets TDEST to the kernel id inside
  the destination cluster, the attacher makes the one-byte header.
* ``s_axis_net`` (packets from the network, already out of the UDP core) and ``m_axis_net``
  (packets to the network) with ``m_axis_addr``, one beat per ``m_axis_net`` packet carrying the
  destination node's IPv4 address (:class:`~hwgen.cluster.router.Router`'s ``o_addr``).
* ``s_axis_cfg``: the router's configuration stream (``router_cfg.hex`` of the build loads both
  routing tables); ``status_*``: the router's delivered/dropped counters; on the gateway's
  FPGA also ``status_gw_delivered`` / ``status_gw_dropped_<kind>`` (the gateway's packet
  decoder, :data:`~hwgen.cluster.switch.DROP_KINDS`).

Dataflow: every local kernel output, and the gateway's outputs (point-to-point packets with the
header stripped and what its virtual GMI kernels send) -> output switch (round-robin,
packet-atomic) -> router (routing tables: local or network, so a gateway output for a kernel
on another FPGA of the cluster leaves through ``m_axis_net``); router's local output +
``s_axis_net`` -> merge -> inter-cluster packets (TUSER bit 16) to the gateway (dropped on
FPGAs without it), the others -> input switch by TDEST -> the local kernels (GMI kernels
inside, compute kernels through ``m_axis_k<id>``). Packets for ids not on this FPGA (kernel 0
and the virtual ids included: virtual kernels are fed only by inter-cluster packets) are
dropped by the input switch; the router drops and counts unknown ids, the gateway malformed
and unknown inter-cluster packets.

Latency: the switches are combinational (0 cycles); the router and the gateway's decoder are
store-and-forward (a packet leaves after its last beat has arrived, see
:class:`~hwgen.cluster.router.Router`, :class:`~hwgen.cluster.gateway.Gateway`).
Backpressure: a stalled kernel input stalls only the switch output for it and the traffic
waiting on that output.
"""

import json
from pathlib import Path

from amaranth.hdl import Module
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out, connect

from ..errors import ConfigError
from .packet import INTER_CLUSTER_BIT, packet_layout

__all__ = ["FPGATop", "InterSplit", "write_tops", "router_cfg_beats", "gateway_config",
           "MAX_PACKET_BYTES"]

#: Longest packet the router buffers (bytes): a row of 768 int32 results is 3072 bytes.
MAX_PACKET_BYTES = 4096


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


def _gmi_config(k, plan, data_bits, where):
    from .gmi import GMIConfig
    members = list(k.members)
    if members != list(range(members[0], members[0] + len(members))):
        raise ConfigError(f"{where}.to", f"GMI kernel {k.name}: members {members} are not "
                          "contiguous kernel ids (the GMI kernels address first_member .. "
                          "first_member + members - 1)")
    root = k.dests[0] if k.gmi.gmi in ("gather", "reduce") else 0
    values = {"members": len(members), "first_member": members[0], "kernel_id": k.id,
              "root": root, "cluster_id": plan.cluster.id, "data_bits": data_bits,
              **k.gmi.params}
    try:
        return GMIConfig.from_dict(values)
    except ConfigError as e:
        raise ConfigError(f"{where}.params.{e.param}", str(e).split(": ", 1)[-1],
                          value=e.value) from None


def gateway_config(plan, data_bits):
    """:class:`~hwgen.cluster.gateway.GatewayConfig` of the cluster's gateway as the builder
    assigned it: point to point to every physical kernel of the cluster but the gateway
    (``local_ids``, on any FPGA of the cluster), one virtual GMI kernel per connection from
    ``input`` with its id and members (``groups``), payloads up to ``MAX_PACKET_BYTES - 1``.
    The virtual kernels share ``length``/``elem_bits``/``op``/``depth`` and are of different
    kinds (a limit of the gateway; ConfigError naming the connection otherwise)."""
    from .gateway import GatewayConfig, format_ids
    virt = sorted((k for k in plan.kernels.values() if k.role == "virtual"), key=lambda k: k.id)
    local = sorted(k.id for k in plan.kernels.values() if k.role in ("compute", "communication"))
    values = {"data_bits": data_bits, "cluster_id": plan.cluster.id,
              "local_ids": format_ids(local), "max_bytes": MAX_PACKET_BYTES - 1, "virtual": ""}
    shared, kinds = {}, []
    for k in virt:
        where = f"clusters[{plan.index}].layers.connections[{k.gmi.index}]"
        if k.kind in kinds:
            raise ConfigError(f"{where}.gmi", "the gateway holds at most one virtual GMI "
                              "kernel of each kind", value=k.kind)
        kinds.append(k.kind)
        for key, v in k.gmi.params.items():
            if key in shared and shared[key] != v:
                raise ConfigError(f"{where}.params.{key}", "virtual GMI kernels of one "
                                  f"gateway share this parameter ({shared[key]} elsewhere)",
                                  value=v)
            shared[key] = v
    if virt:
        values["groups"] = ";".join(f"{k.kind}@{k.id}:" + ",".join(map(str, k.members))
                                    for k in virt)
    try:
        return GatewayConfig.from_dict({**shared, **values})
    except ConfigError as e:
        where = f"clusters[{plan.index}].layers.connections[{virt[0].gmi.index}].params" \
            if virt else f"clusters[{plan.index}]"
        raise ConfigError(f"{where}.{e.param}", str(e).split(": ", 1)[-1],
                          value=e.value) from None


class FPGATop(wiring.Component):
    """Top level of one FPGA of a cluster (see the module docstring)."""

    def __init__(self, plan, fpga, data_bits, n_clusters):
        from .router import Router, RouterConfig, addr_layout, cfg_layout
        from .switch import COUNTER_BITS, DROP_KINDS, status_name
        import ipaddress
        self.plan, self.fpga, self.data_bits = plan, fpga, data_bits
        layout = packet_layout(data_bits)
        ids = sorted(plan.fpga_kernels[fpga.name])
        kernels = [plan.kernels[i] for i in ids]
        self.external = [k.id for k in kernels if k.role == "compute"]
        self.gateway = gateway_config(plan, data_bits) if 0 in ids else None
        self.internal = [k for k in kernels if k.role == "communication"]
        self.router_config = RouterConfig(
            data_bits=data_bits, members=plan.size, clusters=n_clusters,
            length=MAX_PACKET_BYTES, node_address=int(ipaddress.IPv4Address(fpga.ip)))
        self._cfg_layout = cfg_layout()
        self.gmi_configs = {}
        for k in self.internal:
            where = f"clusters[{plan.index}].layers.connections[{k.gmi.index}]"
            self.gmi_configs[k.id] = _gmi_config(k, plan, data_bits, where)
        sig = {"i_cfg": In(stream.Signature(cfg_layout())),
               "i_net": In(stream.Signature(layout)),
               "o_net": Out(stream.Signature(layout)),
               "o_addr": Out(stream.Signature(addr_layout()))}
        for i in self.external:
            sig[f"o_k{i}"] = Out(stream.Signature(layout))
            sig[f"i_k{i}"] = In(stream.Signature(layout))
        sig["status_delivered"] = Out(COUNTER_BITS)
        sig.update({status_name(k): Out(COUNTER_BITS) for k in DROP_KINDS})
        self._status = ["status_delivered"] + [status_name(k) for k in DROP_KINDS]
        if self.gateway is not None:
            sig["status_gw_delivered"] = Out(COUNTER_BITS)
            sig.update({"status_gw_" + status_name(k)[len("status_"):]: Out(COUNTER_BITS)
                        for k in DROP_KINDS})
        super().__init__(sig)

    def elaborate(self, platform):
        from .gmi import gmi_component
        from .header import HeaderAttacher
        from .router import Router
        from .switch import KernelSwitch, SwitchConfig
        from .gateway import Gateway
        from .switch import DROP_KINDS, status_name
        m = Module()
        plan, db = self.plan, self.data_bits
        gw_here = self.gateway is not None
        # kernel-side endpoints: (id, sink into kernel, source out of kernel)
        ends = []
        for i in self.external:
            src = getattr(self, f"i_k{i}")
            k = plan.kernels[i]
            if "output" in k.dests and plan.cluster.output:
                att = HeaderAttacher(db, dest_cluster=plan.cluster.output["cluster"],
                                     cluster_id=plan.cluster.id)
                m.submodules[f"header_k{i}"] = att
                connect(m, wiring.flipped(src), att.i_pkt)
                src = att.o_pkt
            ends.append((i, getattr(self, f"o_k{i}"), src))
        for k in self.internal:
            g = gmi_component(k.kind, self.gmi_configs[k.id])
            m.submodules[f"gmi_k{k.id}"] = g
            ends.append((k.id, g.i_pkt, g.o_pkt))
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


def router_cfg_beats(tables):
    """Configuration stream beats (``cfg_layout``) loading both routing tables: one beat per
    valid entry, kernel table then cluster table, ``last`` on the final beat."""
    import ipaddress
    beats = [{"table": 0, "index": k, "address": int(ipaddress.IPv4Address(ip)), "valid": 1,
              "last": 0} for k, ip in sorted(tables["kernels"].items())]
    beats += [{"table": 1, "index": c, "address": int(ipaddress.IPv4Address(ip)), "valid": 1,
               "last": 0} for c, ip in sorted(tables["clusters"].items())]
    beats[-1]["last"] = 1
    return beats


def _pack_cfg(beat):
    return (beat["table"] | beat["index"] << 1 | beat["address"] << 9 | beat["valid"] << 41
            | beat["last"] << 42)


def write_tops(plan, plans, desc, cdir, log=None):
    """Emit ``<fpga>/<cluster>_<fpga>.v`` + ``ports.json`` + ``router_cfg.{json,hex}`` for every
    FPGA of ``plan``; returns the paths written."""
    from ..flow.emit import emit_verilog
    from .builder import routing_tables
    written = []
    n_clusters = max(p.cluster.id for p in plans) + 1
    tables = routing_tables(plan, plans)
    beats = router_cfg_beats(tables)
    for f in plan.cluster.fpgas:
        fdir = Path(cdir) / f.name
        top = FPGATop(plan, f, desc.data_bits, n_clusters)
        name = f"{plan.cluster.name}_{f.name}".replace("-", "_")
        if log:
            log(f"emitting {name}.v")
        v_path, _ = emit_verilog(top, name, fdir)
        (fdir / "router_cfg.json").write_text(json.dumps(beats, indent=1) + "\n")
        (fdir / "router_cfg.hex").write_text("".join(f"{_pack_cfg(b):011x}\n" for b in beats))
        (fdir / "gmi.json").write_text(json.dumps(
            {str(i): c.to_dict() for i, c in top.gmi_configs.items()}, indent=2) + "\n")
        written += [v_path, fdir / "ports.json", fdir / "router_cfg.json",
                    fdir / "router_cfg.hex", fdir / "gmi.json"]
        if top.gateway is not None:
            (fdir / "gateway.json").write_text(json.dumps(
                {**top.gateway.to_dict(), "derived": top.gateway.derived()}, indent=2) + "\n")
            written.append(fdir / "gateway.json")
    return written
