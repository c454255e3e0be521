"""Cluster plan (multi-FPGA I-BERT paper, sec. 6): what the Cluster Builder decides, as data.

This module neither builds gateware nor writes files: :mod:`hwgen.cluster.gateware.top` builds the
gateware of one FPGA from its :class:`FPGAPlan`, :mod:`hwgen.cluster.run.builder` writes the files.

Kernel ids per cluster follow the paper's order, one contiguous space ``0 .. N-1``:

* ``0``: the gateway kernel (every inter-cluster packet arrives there);
* *compute* ids ``1 ..``: the compute kernels, layer by layer, instance by instance, in the
  order of the layer description;
* *communication* ids: one GMI kernel per GMI connection (a fan-out: broadcast/scatter; a
  fan-in: gather/reduce), in the order of the connections;
* *virtual* ids: the gateway's virtual GMI kernels (GMI connections from ``input``).

Ids listed in the cluster's ``reserved_ids`` are skipped (left unassigned; their routing entries
stay invalid), so the shipped I-BERT encoder reproduces the paper's Kern_34..38 with its
missing Kern_33.

Per cluster: :func:`plan_cluster` (ids, roles, placement, edges), :func:`routing_tables` and
:func:`router_cfg_beats` (the routers' tables and the stream that loads them), and per FPGA
:func:`fpga_plan` (router, GMI and gateway configurations, the compute kernels inside the top
with their packet adapters (:func:`kernel_plan`, :class:`ComputePlan`) or, with
``kernels="external"``, the top's external kernel ports, and which kernels get a header
attacher).

Compute kernels inside a top (:func:`kernel_plan`): the kernel's chain
(:func:`hwgen.cluster.spec.compute.chain_plan`) between a
:class:`~hwgen.cluster.gateware.adapter.PacketsToRows` (one row stream per source id: the TID each
sender puts on its packets, i.e. a GMI kernel's own id, a virtual GMI kernel's virtual id, a compute
kernel's id, or for point-to-point ``input`` the id of the kernel of the cluster whose
``output`` names this one) and a :class:`~hwgen.cluster.gateware.adapter.RowToPackets` to its single
destination (a GMI or compute kernel id; for ``output`` the kernel id named by the cluster's
``output``, through a header attacher). Which chain input each connection feeds is the
connection's ``port`` (or the one input left unfed); element widths in packets are the GMI's
``elem_bits`` around a GMI kernel, else the smallest of 8/16/32 bits holding the sender's
elements; the sequence length M (the description's ``sequence_length``) fixes the adapters' row
counts.

The configuration classes (:class:`~hwgen.cluster.spec.router.RouterConfig`,
:class:`~hwgen.cluster.spec.gmi.GMIConfig`, :class:`~hwgen.cluster.spec.gateway.GatewayConfig`, the
adapters' configurations and chain plans) live beside their gateware and are imported only
when a configuration is made.
"""

from dataclasses import dataclass, field
from enum import StrEnum
import ipaddress

from ... import registry
from ...errors import ConfigError
from ...lib.row_ports import shape_holds
from ..spec import describe as D
from ..spec.adapter import FORMAT_KEYS, PacketsToRowsConfig, RowFormat, RowToPacketsConfig, Source
from ..spec.compute import chain_plan
from ..spec.gateway import GatewayConfig, GmiGroup
from ..spec.gmi import GMIConfig
from ..spec.router import RouterConfig

__all__ = ["Role", "Kernel", "ClusterPlan", "plan", "plan_cluster", "routing_tables",
           "router_cfg_beats", "gmi_config", "gateway_config", "FPGAPlan", "fpga_plan", "top_name",
           "MAX_PACKET_BYTES", "ComputePlan", "kernel_plan", "sequence_length", "KERNEL_MODES"]


#: Where an FPGA's compute kernels are: in its top behind adapters, or outside it (packet ports).
KERNEL_MODES = ("inside", "external")

#: Longest packet the router buffers (bytes): a row of 768 int32 results is 3072 bytes.
MAX_PACKET_BYTES = 4096


class Role(StrEnum):
    """What a kernel is in its cluster; the value (and ``str()``) is the string written to
    ``kernels.json`` and ``logical.xml``."""
    GATEWAY = "gateway"
    COMPUTE = "compute"
    COMMUNICATION = "communication"     # a GMI kernel in an application region
    VIRTUAL = "virtual"                 # a GMI kernel inside the gateway


@dataclass
class Kernel:
    """One kernel of a cluster."""
    id: int
    name: str
    role: Role
    kind: str                 # layer label, GMI kind or "gateway"
    fpga: str = ""
    modules: tuple = ()       # compute: describe.Module chain
    gmi: object = None        # communication/virtual: the describe.Connection
    members: tuple = ()       # GMI: member kernel ids (receivers of a fan-out, senders of a fan-in)
    dests: list = field(default_factory=list)   # kernel ids (or Boundary.OUTPUT) it sends to

    def to_dict(self):
        """The kernel as a JSON-ready dict, as written to ``kernels.json``: ``id``, ``name``,
        ``role``, ``kind``, ``fpga``, ``dests``, plus ``modules`` (compute) or ``gmi``
        (``op``, ``members``, ``params``) where set."""
        d = {"id": self.id, "name": self.name, "role": self.role.value, "kind": self.kind,
             "fpga": self.fpga, "dests": self.dests}
        if self.modules:
            d["modules"] = [{"kind": m.kind, "params": m.params} for m in self.modules]
        if self.gmi is not None:
            d["gmi"] = {"op": self.gmi.gmi, "members": list(self.members),
                        "params": self.gmi.params}
        return d


@dataclass
class ClusterPlan:
    """The plan of one cluster (:func:`plan_cluster`): its description ``cluster`` and
    ``index``, the :class:`Kernel` objects by id (``kernels``) and by name (``by_name``), each
    FPGA's kernel ids (``fpga_kernels``), the id space ``size`` (ids 0 .. size - 1) and the
    ``edges`` (sender, receiver kernel ids; a :class:`~hwgen.cluster.spec.describe.Boundary`
    at the cluster boundary)."""
    cluster: D.Cluster
    index: int
    kernels: dict             # id -> Kernel
    by_name: dict             # name -> Kernel
    fpga_kernels: dict        # fpga name -> [ids]
    size: int                 # N: ids 0..N-1
    edges: list               # (src, dst) kernel ids; Boundary.INPUT/OUTPUT at the boundary

    def counts(self):
        """``{role string: number of kernels}`` over every role."""
        roles = [k.role for k in self.kernels.values()]
        return {r.value: roles.count(r) for r in Role}

    def with_role(self, *roles):
        """The kernels of these roles, by id."""
        return [self.kernels[i] for i in sorted(self.kernels) if self.kernels[i].role in roles]

    @property
    def physical(self):
        """Kernels placed in application regions (everything but the virtual ones)."""
        return [k for k in self.kernels.values() if k.role is not Role.VIRTUAL]


def plan_cluster(cluster, index, description=None):
    """Assign ids, insert GMI kernels, place kernels on FPGAs (see module docstring)."""
    w = f"clusters[{index}]"
    layers = cluster.layers
    free = (i for i in range(1, 10 ** 6) if i not in cluster.reserved_ids)
    kernels, by_name = {}, {}

    def add(k):
        if k.id >= D.MAX_KERNELS:
            raise ConfigError(w, f"needs more than {D.MAX_KERNELS} kernel ids (8-bit TDEST); "
                              "split it into several clusters", value=k.id + 1)
        kernels[k.id] = k
        by_name[k.name] = k
        return k

    add(Kernel(0, "gateway", Role.GATEWAY, "gateway"))
    for layer in layers.layers:
        for inst in layer.instances():
            add(Kernel(next(free), inst, Role.COMPUTE, layer.label, modules=layer.modules))
    gmis = [c for c in layers.connections if c.gmi and not c.virtual]
    virt = [c for c in layers.connections if c.virtual]
    for c in gmis:
        add(Kernel(next(free), c.name, Role.COMMUNICATION, c.gmi, gmi=c))
    for c in virt:
        add(Kernel(next(free), c.name, Role.VIRTUAL, c.gmi, gmi=c))
    size = max(kernels) + 1

    # placement
    placed = {}
    fpga_kernels = {f.name: [] for f in cluster.fpgas}
    layer_names = {l.name: l for l in layers.layers}
    for j, f in enumerate(cluster.fpgas):
        fw = f"{w}.fpgas[{j}].kernels"
        for ref in f.kernels:
            if ref in layer_names:
                names = layer_names[ref].instances()
            elif isinstance(ref, str) and ref in by_name \
                    and by_name[ref].role is not Role.VIRTUAL:
                names = [ref]
            else:
                raise ConfigError(fw, "names no kernel: a layer, an instance (layer[i]), a GMI "
                                  "connection or `gateway`", value=ref)
            for name in names:
                if name in placed:
                    raise ConfigError(fw, f"{name} is already placed on {placed[name]}",
                                      value=ref)
                placed[name] = f.name
                by_name[name].fpga = f.name
    if "gateway" not in placed:
        raise ConfigError(f"{w}.fpgas", "no FPGA holds the `gateway` kernel")
    for k in kernels.values():
        if k.role is Role.COMPUTE and not k.fpga:
            raise ConfigError(f"{w}.fpgas", f"compute kernel {k.name} is on no FPGA")

    # edges, GMI members and default GMI placement
    edges = []
    for c in layers.connections:
        src = [0] if c.src == (D.Boundary.INPUT,) else [by_name[s].id for s in c.src]
        dst = [D.Boundary.OUTPUT] if c.dst == (D.Boundary.OUTPUT,) \
            else [by_name[d].id for d in c.dst]
        if c.gmi:
            g = by_name[c.name]
            if c.virtual:
                g.fpga = kernels[0].fpga
                edges.append((D.Boundary.INPUT, g.id))
                g.members = tuple(dst)
                edges += [(g.id, d) for d in dst]
            elif c.gmi in D.FAN_OUT:
                g.members = tuple(dst)
                g.fpga = g.fpga or kernels[src[0]].fpga
                edges += [(src[0], g.id)] + [(g.id, d) for d in dst]
            else:
                g.members = tuple(src)
                g.fpga = g.fpga or kernels[dst[0]].fpga
                edges += [(s, g.id) for s in src] + [(g.id, dst[0])]
        elif c.src == (D.Boundary.INPUT,):
            edges += [(D.Boundary.INPUT, 0)] + [(0, d) for d in dst]
        elif len(src) == len(dst):
            edges += list(zip(src, dst))
        else:
            edges += [(s, dst[0]) for s in src] if len(dst) == 1 else [(src[0], d) for d in dst]
    for s, d in edges:
        if s != D.Boundary.INPUT and d not in kernels[s].dests:
            kernels[s].dests.append(d)
    for k in kernels.values():
        if k.fpga:
            fpga_kernels[k.fpga].append(k.id)
    for j, f in enumerate(cluster.fpgas):
        if len(fpga_kernels[f.name]) > D.MAX_KERNELS:
            raise ConfigError(f"{w}.fpgas[{j}].kernels", f"an FPGA holds at most "
                              f"{D.MAX_KERNELS} kernels", value=len(fpga_kernels[f.name]))
    return ClusterPlan(cluster, index, kernels, by_name, fpga_kernels, size, edges)


def plan(description):
    """Plans of every cluster; checks that each cluster's ``output`` names an existing kernel
    of the target cluster when that cluster is in the description."""
    plans = [plan_cluster(c, i, description) for i, c in enumerate(description.clusters)]
    by_id = {p.cluster.id: p for p in plans}
    for p in plans:
        out = p.cluster.output
        if out and out["cluster"] in by_id:
            target = by_id[out["cluster"]]
            k = target.kernels.get(out["kernel"])
            # the receiver: a virtual GMI kernel, or a kernel the gateway forwards `input` to
            if k is None or not (k.role is Role.VIRTUAL or (0, k.id) in target.edges):
                raise ConfigError(f"clusters[{p.index}].output.kernel",
                                  f"cluster {out['cluster']} has no kernel with this id "
                                  "receiving its `input`", value=out["kernel"])
    return plans


# -- routing -----------------------------------------------------------------------------------

def routing_tables(p, plans):
    """The two routing tables of the cluster's routers (the same on every FPGA of it):
    ``kernels`` {kernel id: IP of its FPGA} (virtual kernels live on the gateway's FPGA) and
    ``clusters`` {cluster id: IP of that cluster's gateway FPGA; the ``output.ip`` of a
    receiving cluster outside the description}."""
    ips = {f.name: f.ip for f in p.cluster.fpgas}
    kern = {k.id: ips[k.fpga] for k in p.kernels.values()}
    clus = {}
    for q in plans:
        gw = q.kernels[0].fpga
        clus[q.cluster.id] = {f.name: f.ip for f in q.cluster.fpgas}[gw]
    out = p.cluster.output or {}
    if "ip" in out:                          # a receiver outside the description (a host)
        clus[out["cluster"]] = out["ip"]
    return {"kernels": dict(sorted(kern.items())), "clusters": dict(sorted(clus.items()))}


def router_cfg_beats(tables):
    """Configuration stream beats (fields of :func:`~hwgen.cluster.gateware.router.cfg_layout`)
    loading both routing tables: one beat per valid entry, kernel table then cluster table, ``last``
    on the final beat."""
    beats = [{"table": 0, "index": k, "address": int(ipaddress.IPv4Address(ip)), "valid": 1,
              "last": 0} for k, ip in sorted(tables["kernels"].items())]
    beats += [{"table": 1, "index": c, "address": int(ipaddress.IPv4Address(ip)), "valid": 1,
               "last": 0} for c, ip in sorted(tables["clusters"].items())]
    beats[-1]["last"] = 1
    return beats


# -- configurations of the kernels inside the tops ---------------------------------------------

def _connection(plan, k):
    return f"clusters[{plan.index}].layers.connections[{k.gmi.index}]"


def gmi_config(k, plan, data_bits, seq_len=0):
    """:class:`~hwgen.cluster.spec.gmi.GMIConfig` of the communication kernel ``k`` of ``plan``;
    a ConfigError names the connection (its ``to`` or ``params.<name>``).

    A GMI kernel without ``params.depth`` buffers ``max(2, seq_len)`` rounds, a sentence:

    * gather/reduce: the members (the heads of an attention) run independently, and a member
      that is ``depth`` rounds ahead of the slowest has its packets dropped
      (``stat_drop_overrun``; stalling it would block the slow member's packets behind it on
      the shared input path). Within one sentence no member is more than M rounds ahead. With
      the old default of 2, 12 heads of ``minilm_encoder`` at M = 8 lost rows (4 of 8 out).
    * broadcast/scatter: a full buffer stalls the input, and the input comes through the
      FPGA's router, which its own output needs: a packet for a full scatter blocks the router
      and with it the scatter's output (``minilm_encoder``'s fpga1 stopped after one round once
      Q/K/V's rows reached the router whole, behind the packet buffers)."""
    where = _connection(plan, k)
    members = list(k.members)
    if members != list(range(members[0], members[0] + len(members))):
        raise ConfigError(f"{where}.to", f"GMI kernel {k.name}: members {members} are not "
                          "contiguous kernel ids (the GMI kernels address first_member .. "
                          "first_member + members - 1)")
    root = k.dests[0] if k.gmi.gmi in D.FAN_IN else 0
    values = {"members": len(members), "first_member": members[0], "kernel_id": k.id,
              "root": root, "cluster_id": plan.cluster.id, "data_bits": data_bits,
              **k.gmi.params}
    if "depth" not in k.gmi.params:
        values["depth"] = max(2, seq_len)
    try:
        return GMIConfig.from_dict(values)
    except ConfigError as e:
        raise e.relocated(f"{where}.params") from None


def gateway_config(plan, data_bits, seq_len=0):
    """:class:`~hwgen.cluster.spec.gateway.GatewayConfig` of the cluster's gateway as the builder
    assigned it: point to point to every physical kernel of the cluster but the gateway
    (``local_ids``, on any FPGA of the cluster), one virtual GMI kernel per connection from
    ``input`` with its id and members (``groups``), payloads up to ``MAX_PACKET_BYTES - 1``.
    The virtual kernels share ``length``/``elem_bits``/``op``/``depth`` and are of different
    kinds (a limit of the gateway; ConfigError naming the connection otherwise). Without
    ``params.depth`` they buffer ``max(2, seq_len)`` rounds, a sentence, as
    :func:`gmi_config`'s: the host sends a sentence's rows back to back, and a full virtual
    broadcast stalls the FPGA's network input, which the merge in front of the kernels shares
    with the router's local output that the broadcast's own packets need (``minilm_encoder``
    at M 38 stopped after 30 datagrams with the old depth of 2)."""
    virt = plan.with_role(Role.VIRTUAL)
    local = [k.id for k in plan.with_role(Role.COMPUTE, Role.COMMUNICATION)]
    values = {"data_bits": data_bits, "cluster_id": plan.cluster.id,
              "local_ids": tuple(local), "max_bytes": MAX_PACKET_BYTES - 1, "virtual": ()}
    shared, kinds = {}, []
    for k in virt:
        where = _connection(plan, k)
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
    if virt and "depth" not in shared:
        values["depth"] = max(2, seq_len)
    if virt:
        values["groups"] = tuple(GmiGroup(k.kind, k.id, tuple(k.members)) for k in virt)
    try:
        return GatewayConfig.from_dict({**shared, **values})
    except ConfigError as e:
        where = f"{_connection(plan, virt[0])}.params" if virt else f"clusters[{plan.index}]"
        raise e.relocated(where) from None


# -- one FPGA ----------------------------------------------------------------------------------

def top_name(plan, fpga):
    """Module (and file) name of the top of ``fpga``: ``<cluster>_<fpga>``, ``-`` as ``_``."""
    return f"{plan.cluster.name}_{fpga.name}".replace("-", "_")


@dataclass(frozen=True)
class FPGAPlan:
    """Everything the top of one FPGA is built from
    (:class:`hwgen.cluster.gateware.top.FPGATop`)."""
    cluster_id: int
    fpga: D.FPGA
    name: str                 # top module name (top_name)
    data_bits: int
    router: object            # RouterConfig: the FPGA's node address, table sizes
    external: tuple           # compute kernel ids: the top's m_axis_k<id>/s_axis_k<id> ports
    headers: tuple            # external ids whose packets leave the cluster (header attached)
    dest_cluster: object      # cluster id the headers name (the cluster's `output`), or None
    gmi_kinds: dict           # communication kernel id -> GMI kind, inside the top
    gmi_configs: dict         # communication kernel id -> GMIConfig
    gateway: object           # GatewayConfig when the gateway (kernel 0) is here, else None
    computes: dict = field(default_factory=dict)   # id -> ComputePlan (kernels inside)


def fpga_plan(plan, fpga, data_bits, n_clusters, *, kernels="inside", plans=None, seq_len=0):
    """The :class:`FPGAPlan` of ``fpga`` (a :class:`~hwgen.cluster.spec.describe.FPGA` of
    ``plan``'s cluster) in a description of ``n_clusters`` cluster ids. ``kernels``: "inside"
    (each compute kernel a :class:`ComputePlan` in ``computes``; ``plans``, all clusters'
    plans, name the senders of point-to-point ``input``; ``seq_len`` is M, 0: the default of
    :func:`sequence_length`) or "external" (the kernels' ids in ``external``: packet ports)."""
    if kernels not in KERNEL_MODES:
        raise ConfigError("kernels", "must be one of " + ", ".join(KERNEL_MODES),
                          value=kernels)
    mode = kernels
    kernels = [plan.kernels[i] for i in sorted(plan.fpga_kernels[fpga.name])]
    compute = tuple(k.id for k in kernels if k.role is Role.COMPUTE)
    external = compute if mode == "external" else ()
    computes = {}
    m = seq_len or (sequence_length(plan.cluster.layers) if plan.cluster.layers else 0)
    if mode == "inside":
        computes = {i: kernel_plan(plan.kernels[i], plan, plans or [plan], data_bits, m)
                    for i in compute}
    output = plan.cluster.output
    gateway = gateway_config(plan, data_bits, m) if 0 in plan.fpga_kernels[fpga.name] \
        else None
    router = RouterConfig(data_bits=data_bits, members=plan.size, clusters=n_clusters,
                          length=MAX_PACKET_BYTES,
                          node_address=int(ipaddress.IPv4Address(fpga.ip)))
    gmis = [k for k in kernels if k.role is Role.COMMUNICATION]
    configs = {k.id: gmi_config(k, plan, data_bits, m) for k in gmis}
    headers = tuple(i for i in compute if output and D.Boundary.OUTPUT in plan.kernels[i].dests)
    return FPGAPlan(cluster_id=plan.cluster.id, fpga=fpga, name=top_name(plan, fpga),
                    data_bits=data_bits, router=router, external=external, headers=headers,
                    dest_cluster=output["cluster"] if output else None,
                    gmi_kinds={k.id: k.kind for k in gmis}, gmi_configs=configs,
                    gateway=gateway, computes=computes)


# -- compute kernels inside the tops -----------------------------------------------------------

def sequence_length(layers):
    """Default M of a layer description: the smallest ``max_len`` among its modules (the
    kernels' own bound), or 1 when none has one."""
    lens = [registry.get(m.kind).config.from_dict(m.params).max_tokens()
            for l in layers.layers for m in l.modules]
    return min((n for n in lens if n is not None), default=1)


@dataclass(frozen=True)
class ComputePlan:
    """One compute kernel inside its FPGA's top (:class:`hwgen.cluster.gateware.top.FPGATop`)."""
    id: int
    name: str
    chain: object             # compute.ChainPlan (KernelChain is built from it)
    sources: tuple            # ((tid, chain input name, connection index), ...): o_0, o_1 ...
    p2r: object               # PacketsToRowsConfig: one source per chain input
    widen: tuple              # chain input names whose elements are extended after the p2r
    r2p: object               # RowToPacketsConfig: dest, src = id
    header: bool              # the output leaves the cluster (header attacher after the r2p)
    seq_len: int

    def to_dict(self):
        """The plan as a JSON-ready dict, as written to ``compute.json``: chain kinds,
        sequence length, inputs (``tid``, chain ``port``, ``connection`` index), both adapter
        configurations, ``header`` and ``widen``."""
        return {"id": self.id, "name": self.name, "kinds": list(self.chain.kinds),
                "sequence_length": self.seq_len,
                "inputs": [{"tid": t, "port": p, "connection": c} for t, p, c in self.sources],
                "pkt2row": self.p2r.to_dict(), "row2pkt": self.r2p.to_dict(),
                "header": self.header, "widen": list(self.widen)}


def _elem_bits(bits, where):
    for b in (8, 16, 32):
        if bits <= b:
            return b
    raise ConfigError(where, f"elements of {bits} bits do not fit a packet element (at most "
                      "32 bits): end the chain with a requantisation (ibert-requant)",
                      value=bits)


def _feeds(k, plan, plans):
    """``[(tid, connection, sender), ...]``: what arrives at compute kernel ``k`` (``sender``:
    ``(plan, Kernel)`` of the compute kernel whose elements arrive, None through a GMI)."""
    where = f"clusters[{plan.index}].layers.connections"
    out = []
    for c in plan.cluster.layers.connections:
        if k.name not in c.dst:
            continue
        if c.gmi:
            out.append((plan.by_name[c.name].id, c, None))
        elif c.src == (D.Boundary.INPUT,):
            senders = [(q, s) for q in plans if q.cluster.output
                       and q.cluster.output["cluster"] == plan.cluster.id
                       and q.cluster.output["kernel"] == k.id
                       for s in q.kernels.values() if D.Boundary.OUTPUT in s.dests]
            if len(senders) != 1:
                raise ConfigError(f"{where}[{c.index}].from", f"`input` to {k.name} point to "
                                  "point: its packets' source id is the sending kernel of the "
                                  f"cluster whose `output` names kernel {k.id}; the "
                                  f"description has {len(senders)} such kernels")
            q, s = senders[0]
            out.append((s.id, c, (q, s)))
        else:
            s = plan.by_name[c.src[c.dst.index(k.name)] if len(c.src) == len(c.dst)
                             else c.src[0]]
            out.append((s.id, c, (plan, s)))
    return out


def _assign_ports(k, chain, feeds, where):
    """``{input name: (tid, connection, sender)}`` from the connections' ``port`` keys and the
    one-unfed-input default."""
    names = [p.name for p in chain.inputs]
    try:
        fed = D.assign_ports(k.name, names, feeds, connection=lambda feed: feed[1])
    except D.PortError as e:
        raise ConfigError(f"{where}[{e.connection.index}].port", str(e), value=e.value) \
            from None
    seen = set()
    for port, (tid, c, _) in fed.items():          # in the order of assignment
        if tid in seen:
            raise ConfigError(f"{where}[{c.index}].port", f"{k.name} receives two streams "
                              f"from kernel {tid}: packets are told apart by source id only",
                              value=port)
        seen.add(tid)
    missing = [n for n in names if n not in fed]
    if missing:
        raise ConfigError(where, f"compute kernel {k.name}: no connection feeds input(s) "
                          + ", ".join(missing))
    return fed


def _layer_path(k, plan):
    layer = next(j for j, l in enumerate(plan.cluster.layers.layers)
                 if k.name in l.instances())
    return f"clusters[{plan.index}].layers.layers[{layer}]"


def _chain(k, plan):
    """The :class:`~hwgen.cluster.spec.compute.ChainPlan` of compute kernel ``k``; a ConfigError
    names its layer's module."""
    try:
        return chain_plan(k.modules)
    except ConfigError as e:
        raise e.relocated(_layer_path(k, plan)) from None


def _out_elem_bits(k, plan, chain):
    """Packet element bits of compute kernel ``k``'s output (its destination GMI kernel's
    ``elem_bits``, else the smallest that holds the chain's output elements)."""
    bits = _elem_bits(chain.output.elem_bits, f"{_layer_path(k, plan)}.modules")
    dest = k.dests[0] if len(k.dests) == 1 else None
    g = plan.kernels.get(dest) if dest != D.Boundary.OUTPUT else None
    if g is not None and g.role is Role.COMMUNICATION:
        eb = g.gmi.params.get("elem_bits", 8)
        if eb < chain.output.elem_bits:
            raise ConfigError(f"{_connection(plan, g)}.params.elem_bits", f"{k.name} sends "
                              f"{chain.output.elem_bits}-bit elements", value=eb)
        return eb
    return bits


def _row_elems(port, m):
    if port.framing == "beat":
        return m * port.row
    return port.row or m


def _format(port, m, elem_bits, **over):
    return RowFormat(field=port.field, lanes=port.lanes, elem_bits=elem_bits,
                     field_bits=min(port.elem_bits, elem_bits), signed=port.signed,
                     row_elems=_row_elems(port, m), count=port.count,
                     rows=m if port.last_row else 0, array=port.array, **over)


def kernel_plan(k, plan, plans, data_bits, seq_len):
    """The :class:`ComputePlan` of compute kernel ``k`` of ``plan`` (see the module docstring);
    a :class:`ConfigError` names the connection (``.port``, ``.params.elem_bits``), the layer's
    ``modules`` or ``sequence_length``."""
    # Imported here: importing the plan must not import Amaranth
    # (tests/test_cluster_plan.py::test_plan_imports_no_gateware).
    where = f"clusters[{plan.index}].layers.connections"
    lw = f"{_layer_path(k, plan)}.modules"
    chain = _chain(k, plan)
    for cfg in chain.configs:
        if (cfg.max_tokens() or seq_len) < seq_len:
            raise ConfigError("sequence_length", f"{k.name} takes at most {cfg.max_len} "
                              "tokens", value=seq_len)
    for p in chain.inputs:
        if p.extra:
            raise ConfigError(lw, f"{k.name}: input {p.name} carries several fields in one "
                              "beat (a residual requantisation first in a chain); put a "
                              "module before it")
    fed = _assign_ports(k, chain, _feeds(k, plan, plans), where)
    sources, widen, sentence_bytes = [], [], []
    for p in chain.inputs:
        tid, c, sender = fed[p.name]
        w = f"{where}[{c.index}]"
        if sender is None:                       # through a GMI kernel: its element width
            eb = plan.by_name[c.name].gmi.params.get("elem_bits", 8)
        else:
            q, s = sender
            s_chain = _chain(s, q)
            eb = _out_elem_bits(s, q, s_chain)
            if not shape_holds(s_chain.output.shape, p.shape):
                raise ConfigError(f"{w}.port", f"{p.name} of {k.name} cannot hold the "
                                  f"{s_chain.output.elem_bits}-bit elements {s.name} sends",
                                  value=p.name)
        if p.elem_bits > eb:
            widen.append(p.name)
        fmt = _format(p, seq_len, eb)
        sources.append((tid, p.name, c.index, fmt))
        sentence_bytes.append(fmt.row_bytes * (1 if p.framing == "beat" else seq_len))
    if len(k.dests) != 1:
        raise ConfigError(lw, f"compute kernel {k.name} sends to "
                          f"{len(k.dests) or 'no'} destinations; its one output stream needs "
                          "a broadcast GMI kernel for several")
    dest, header = k.dests[0], k.dests[0] == D.Boundary.OUTPUT
    if header:
        dest = plan.cluster.output["kernel"]
    out_fmt = _format(chain.output, seq_len, _out_elem_bits(k, plan, chain))
    g = plan.kernels.get(dest) if not header else None
    if g is not None and g.role is Role.COMMUNICATION:
        cfg = gmi_config(g, plan, data_bits)
        msg = (cfg.members if g.kind == "scatter" else 1) * cfg.length * cfg.elem_bits // 8
        if chain.output.framing != "beat" and msg != out_fmt.row_bytes:
            raise ConfigError(f"{_connection(plan, g)}.params.length", f"{k.name} sends rows "
                              f"of {out_fmt.row_bytes} bytes, the {g.kind} takes messages of "
                              f"{msg}", value=cfg.length)
    fmts = [f for *_, f in sources]
    # Every source's FIFO holds one sentence (M rows). The FPGA's packets for all its kernels
    # share one input path, so a full FIFO blocks the packets behind it: a chain that needs all
    # of one input first (K before Q, V before P, the residual's identity until the linear's
    # rows come) deadlocks (seen in minilm_encoder with 16-beat FIFOs: attn_out's identity), as
    # would a kernel whose output returns through the same path to a kernel on its own FPGA.
    # The FIFOs of inputs that never wait were deepened too, on a misdiagnosis (the second
    # stop was the gather's lost rows, see gmi_config): safe, but not shown to be needed.
    depths = [max(16, -(-n * 8 // data_bits) + 2) for n in sentence_bytes]
    p2r = PacketsToRowsConfig.from_dict({
        "data_bits": data_bits, "fifo_depths": tuple(depths),
        "sources": tuple(Source(t, **{k: getattr(f, k) for k in FORMAT_KEYS})
                         for t, _, _, f in sources),
        **{key: getattr(fmts[0], key) for key in ("field", "lanes", "elem_bits", "row_elems")}})
    r2p = RowToPacketsConfig.from_dict({
        "data_bits": data_bits, "dest": dest, "src": k.id,
        "max_packet_bytes": MAX_PACKET_BYTES - 1,
        **{key: getattr(out_fmt, key) for key in ("field", "lanes", "elem_bits", "field_bits",
                                                  "signed", "row_elems", "count", "rows",
                                                  "array")}})
    return ComputePlan(k.id, k.name, chain, tuple((t, n, c) for t, n, c, _ in sources), p2r,
                       tuple(widen), r2p, header, seq_len)
