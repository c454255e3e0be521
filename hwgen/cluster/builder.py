"""Cluster Builder (multi-FPGA I-BERT paper, sec. 6): descriptions -> kernel ids, GMI kernels,
routing tables, Galapagos logical/map files, graph picture and per-FPGA tops.

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

Outputs of :func:`build` (``OUT/<cluster>/``): ``kernels.json`` (ids, roles, kinds, FPGA,
destinations), ``logical.xml`` and ``map.xml`` (Galapagos style, from
``rtl_templates/galapagos_*.j2``), ``graph.dot`` (+ ``graph.svg``/``graph.png`` when graphviz's
``dot`` is installed), and per FPGA ``<fpga>/routing.json``, ``kernel_table.hex``,
``cluster_table.hex`` (256 words each: bit 32 valid, bits 31:0 the IPv4 address of the node)
and the top-level Verilog (:mod:`hwgen.cluster.top`).
"""

import ipaddress
import json
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import ConfigError
from . import describe as D

__all__ = ["Kernel", "ClusterPlan", "plan", "plan_cluster", "build", "routing_tables",
           "summary_lines", "FPGA_COLOURS"]

FPGA_COLOURS = ("#8dd3c7", "#ffffb3", "#bebada", "#fb8072", "#80b1d3", "#fdb462", "#b3de69",
                "#fccde5", "#d9d9d9", "#bc80bd", "#ccebc5", "#ffed6f")


@dataclass
class Kernel:
    """One kernel of a cluster."""
    id: int
    name: str
    role: str                 # gateway, compute, communication, virtual
    kind: str                 # layer label, GMI kind or "gateway"
    fpga: str = ""
    modules: tuple = ()       # compute: describe.Module chain
    gmi: object = None        # communication/virtual: the describe.Connection
    members: tuple = ()       # GMI: member kernel ids (receivers of a fan-out, senders of a fan-in)
    dests: list = field(default_factory=list)   # kernel ids (or "output") it sends to

    def to_dict(self):
        d = {"id": self.id, "name": self.name, "role": self.role, "kind": self.kind,
             "fpga": self.fpga, "dests": self.dests}
        if self.modules:
            d["modules"] = [{"kind": m.kind, "params": m.params} for m in self.modules]
        if self.gmi is not None:
            d["gmi"] = {"op": self.gmi.gmi, "members": list(self.members),
                        "params": self.gmi.params}
        return d


@dataclass
class ClusterPlan:
    cluster: D.Cluster
    index: int
    kernels: dict             # id -> Kernel
    by_name: dict             # name -> Kernel
    fpga_kernels: dict        # fpga name -> [ids]
    size: int                 # N: ids 0..N-1
    edges: list               # (src, dst) kernel ids; "input"/"output" at the cluster boundary

    def counts(self):
        roles = [k.role for k in self.kernels.values()]
        return {r: roles.count(r) for r in ("gateway", "compute", "communication", "virtual")}

    @property
    def physical(self):
        """Kernels placed in application regions (everything but the virtual ones)."""
        return [k for k in self.kernels.values() if k.role != "virtual"]


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

    add(Kernel(0, "gateway", "gateway", "gateway"))
    for layer in layers.layers:
        for inst in layer.instances():
            add(Kernel(next(free), inst, "compute", layer.label, modules=layer.modules))
    gmis = [c for c in layers.connections if c.gmi and not c.virtual]
    virt = [c for c in layers.connections if c.virtual]
    for c in gmis:
        add(Kernel(next(free), c.name, "communication", c.gmi, gmi=c))
    for c in virt:
        add(Kernel(next(free), c.name, "virtual", c.gmi, gmi=c))
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
            elif isinstance(ref, str) and ref in by_name and by_name[ref].role != "virtual":
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
        if k.role == "compute" and not k.fpga:
            raise ConfigError(f"{w}.fpgas", f"compute kernel {k.name} is on no FPGA")

    # edges, GMI members and default GMI placement
    edges = []
    for c in layers.connections:
        src = [0] if c.src == ("input",) else [by_name[s].id for s in c.src]
        dst = ["output"] if c.dst == ("output",) else [by_name[d].id for d in c.dst]
        if c.gmi:
            g = by_name[c.name]
            if c.virtual:
                g.fpga = kernels[0].fpga
                edges.append(("input", g.id))
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
        elif c.src == ("input",):
            edges += [("input", 0)] + [(0, d) for d in dst]
        elif len(src) == len(dst):
            edges += list(zip(src, dst))
        else:
            edges += [(s, dst[0]) for s in src] if len(dst) == 1 else [(src[0], d) for d in dst]
    for s, d in edges:
        if s != "input" and d not in kernels[s].dests:
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
            if k is None or not (k.role == "virtual" or (0, k.id) in target.edges):
                raise ConfigError(f"clusters[{p.index}].output.kernel",
                                  f"cluster {out['cluster']} has no kernel with this id "
                                  "receiving its `input`", value=out["kernel"])
    return plans


def _ip_word(ip):
    return (1 << 32) | int(ipaddress.IPv4Address(ip))


def routing_tables(p, plans):
    """The two routing tables of the cluster's routers (the same on every FPGA of it):
    ``kernels`` {kernel id: IP of its FPGA} (virtual kernels live on the gateway's FPGA) and
    ``clusters`` {cluster id: IP of that cluster's gateway FPGA}."""
    ips = {f.name: f.ip for f in p.cluster.fpgas}
    kern = {k.id: ips[k.fpga] for k in p.kernels.values()}
    clus = {}
    for q in plans:
        gw = q.kernels[0].fpga
        clus[q.cluster.id] = {f.name: f.ip for f in q.cluster.fpgas}[gw]
    return {"kernels": dict(sorted(kern.items())), "clusters": dict(sorted(clus.items()))}


def _hex_image(table):
    return "".join(f"{_ip_word(table[i]) if i in table else 0:09x}\n" for i in range(256))


def _mac(ip):
    """A locally administered MAC derived from the IP (Galapagos map files list one)."""
    b = ipaddress.IPv4Address(ip).packed
    return "02:00:" + ":".join(f"{x:02x}" for x in b)


def _dot(p, plans_colours):
    lines = [f'digraph "{p.cluster.name}" {{', "  rankdir=LR;",
             '  node [shape=box, style="filled,rounded", fontname="Helvetica", fontsize=10];',
             '  input [shape=oval, style=dashed]; output [shape=oval, style=dashed];']
    for j, f in enumerate(p.cluster.fpgas):
        colour = plans_colours[j % len(plans_colours)]
        lines.append(f'  subgraph "cluster_{f.name}" {{ label="{f.name} ({f.board}, {f.ip})"; '
                     f'style=filled; color="{colour}"; fillcolor="{colour}40";')
        for kid in sorted(p.fpga_kernels[f.name]):
            k = p.kernels[kid]
            shape = {"gateway": "house", "communication": "hexagon",
                     "virtual": "hexagon"}.get(k.role, "box")
            style = ', style="filled,dashed"' if k.role == "virtual" else ""
            lines.append(f'    k{kid} [label="Kern_{kid}\\n{k.name}\\n{k.kind}", shape={shape}, '
                         f'fillcolor="{colour}"{style}];')
        lines.append("  }")
    for s, d in p.edges:
        a = "input" if s == "input" else f"k{s}"
        b = "output" if d == "output" else f"k{d}"
        lines.append(f"  {a} -> {b};")
    lines.append("}")
    return "\n".join(lines) + "\n"


def summary_lines(plans):
    out = []
    for p in plans:
        c = p.counts()
        phys = len(p.physical)
        out.append(f"cluster {p.cluster.id} ({p.cluster.name}): {phys} kernels "
                   f"(1 gateway, {c['compute']} compute, {c['communication']} communication) "
                   f"+ {c['virtual']} virtual in the gateway; ids 0..{p.size - 1}"
                   + (f", reserved {sorted(p.cluster.reserved_ids)}"
                      if p.cluster.reserved_ids else ""))
        for f in p.cluster.fpgas:
            ids = sorted(p.fpga_kernels[f.name])
            roles = [p.kernels[i].role for i in ids]
            out.append(f"  {f.name:<8} {f.board:<11} {f.ip:<15} {len(ids):>3} kernels "
                       f"(" + ("gateway, " if "gateway" in roles else "")
                       + f"compute {roles.count('compute')}, communication "
                       f"{roles.count('communication')}, virtual {roles.count('virtual')}): "
                       + _ranges(ids))
    return out


def _ranges(ids):
    parts, start = [], None
    for i, k in enumerate(ids):
        if start is None:
            start = k
        if i + 1 == len(ids) or ids[i + 1] != k + 1:
            parts.append(str(start) if start == k else f"{start}-{k}")
            start = None
    return ",".join(parts)


def build(description, out_dir, *, tops=True, picture=True, log=None):
    """Write everything for ``description`` (a :class:`~hwgen.cluster.describe.Description` or
    a path) under ``out_dir``; returns ``{"plans", "written", "summary"}``."""
    from ..flow.package import render
    desc = description if isinstance(description, D.Description) else D.load(description)
    plans = plan(desc)
    out = Path(out_dir)
    written = []

    def write(path, text):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        written.append(path)

    for p in plans:
        cdir = out / p.cluster.name
        tables = routing_tables(p, plans)
        kinfo = {"cluster": p.cluster.id, "name": p.cluster.name, "size": p.size,
                 "reserved_ids": {str(k): v for k, v in p.cluster.reserved_ids.items()},
                 "counts": p.counts(), "output": p.cluster.output,
                 "kernels": [p.kernels[i].to_dict() for i in sorted(p.kernels)]}
        write(cdir / "kernels.json", json.dumps(kinfo, indent=2) + "\n")
        logical = [{"num": k.id, "name": f"kern_{k.id}_{k.name.replace('[', '_').rstrip(']')}",
                    "role": k.role, "kind": k.kind}
                   for k in sorted(p.physical, key=lambda k: k.id)]
        write(cdir / "logical.xml", render("galapagos_logical.xml.j2", kernels=logical,
                                           data_bits=desc.data_bits, cluster=p.cluster))
        nodes = [{"name": f.name, "board": f.board, "ip": f.ip, "mac": _mac(f.ip),
                  "kernels": sorted(i for i in p.fpga_kernels[f.name]
                                    if p.kernels[i].role != "virtual")}
                 for f in p.cluster.fpgas]
        write(cdir / "map.xml", render("galapagos_map.xml.j2", nodes=nodes, cluster=p.cluster))
        dot = _dot(p, FPGA_COLOURS)
        write(cdir / "graph.dot", dot)
        if picture and shutil.which("dot"):
            for fmt in ("svg", "png"):
                target = cdir / f"graph.{fmt}"
                subprocess.run(["dot", f"-T{fmt}", "-o", str(target), str(cdir / "graph.dot")],
                               check=True, capture_output=True, timeout=120)
                written.append(target)
        elif picture and log:
            log("graphviz `dot` not found: wrote graph.dot only (apt-get install graphviz)")
        for f in p.cluster.fpgas:
            fdir = cdir / f.name
            write(fdir / "routing.json", json.dumps({
                "fpga": f.name, "ip": f.ip, "cluster": p.cluster.id,
                "local_kernels": sorted(p.fpga_kernels[f.name]),
                "kernel_table": {str(k): v for k, v in tables["kernels"].items()},
                "cluster_table": {str(k): v for k, v in tables["clusters"].items()}},
                indent=2) + "\n")
            write(fdir / "kernel_table.hex", _hex_image(tables["kernels"]))
            write(fdir / "cluster_table.hex", _hex_image(tables["clusters"]))
        if tops:
            from .top import write_tops
            written += write_tops(p, plans, desc, cdir, log=log)
    lines = summary_lines(plans)
    write(out / "summary.txt", "\n".join(lines) + "\n")
    return {"plans": plans, "written": written, "summary": lines}
