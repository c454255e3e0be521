"""Cluster Builder (multi-FPGA I-BERT paper, sec. 6): descriptions -> kernel ids, GMI kernels,
routing tables, Galapagos logical/map files, graph picture and per-FPGA tops.

The only module of the package that writes files. What it writes comes from the plan
(:mod:`hwgen.cluster.plan`: ids, roles, placement, routing tables, per-FPGA configurations);
the tops are the gateware of :mod:`hwgen.cluster.top` built from each FPGA's plan.

Outputs of :func:`build` (``OUT/<cluster>/``): ``kernels.json`` (ids, roles, kinds, FPGA,
destinations), ``logical.xml`` and ``map.xml`` (Galapagos style, from
``rtl_templates/galapagos_*.j2``), ``graph.dot`` (+ ``graph.svg``/``graph.png`` when graphviz's
``dot`` is installed), and per FPGA ``<fpga>/routing.json``, ``kernel_table.hex``,
``cluster_table.hex`` (256 words each: bit 32 valid, bits 31:0 the IPv4 address of the node)
and, from :func:`write_tops`, the top-level Verilog with ``ports.json``, ``router_cfg.json`` /
``router_cfg.hex`` (the configuration beats loading the routing tables), ``gmi.json`` and, on
the gateway's FPGA, ``gateway.json``.
"""

import ipaddress
import json
import shutil
import subprocess
from pathlib import Path

from . import describe as D
from .plan import (ClusterPlan, Kernel, Role, fpga_plan, plan, plan_cluster, router_cfg_beats,
                   routing_tables)

__all__ = ["Kernel", "ClusterPlan", "plan", "plan_cluster", "build", "routing_tables",
           "write_tops", "summary_lines", "FPGA_COLOURS"]

FPGA_COLOURS = ("#8dd3c7", "#ffffb3", "#bebada", "#fb8072", "#80b1d3", "#fdb462", "#b3de69",
                "#fccde5", "#d9d9d9", "#bc80bd", "#ccebc5", "#ffed6f")


def _ip_word(ip):
    return (1 << 32) | int(ipaddress.IPv4Address(ip))


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
            shape = {Role.GATEWAY: "house", Role.COMMUNICATION: "hexagon",
                     Role.VIRTUAL: "hexagon"}.get(k.role, "box")
            style = ', style="filled,dashed"' if k.role is Role.VIRTUAL else ""
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
            n = {r: [p.kernels[i].role for i in ids].count(r) for r in Role}
            out.append(f"  {f.name:<8} {f.board:<11} {f.ip:<15} {len(ids):>3} kernels "
                       f"(" + ("gateway, " if n[Role.GATEWAY] else "")
                       + f"compute {n[Role.COMPUTE]}, communication "
                       f"{n[Role.COMMUNICATION]}, virtual {n[Role.VIRTUAL]}): "
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
    a path) under ``out_dir``; returns ``{"plans", "written", "summary", "fpgas"}`` (``fpgas``:
    the :class:`~hwgen.cluster.plan.FPGAPlan` of every top written, none without ``tops``)."""
    from ..flow.package import render
    desc = description if isinstance(description, D.Description) else D.load(description)
    plans = plan(desc)
    out = Path(out_dir)
    written, fpgas = [], []

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
                    "role": k.role.value, "kind": k.kind}
                   for k in sorted(p.physical, key=lambda k: k.id)]
        write(cdir / "logical.xml", render("galapagos_logical.xml.j2", kernels=logical,
                                           data_bits=desc.data_bits, cluster=p.cluster))
        nodes = [{"name": f.name, "board": f.board, "ip": f.ip, "mac": _mac(f.ip),
                  "kernels": sorted(i for i in p.fpga_kernels[f.name]
                                    if p.kernels[i].role is not Role.VIRTUAL)}
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
            paths, fps = write_tops(p, plans, desc, cdir, log=log)
            written += paths
            fpgas += fps
    lines = summary_lines(plans)
    write(out / "summary.txt", "\n".join(lines) + "\n")
    return {"plans": plans, "written": written, "summary": lines, "fpgas": fpgas}


def write_tops(plan, plans, desc, cdir, log=None):
    """Emit ``<fpga>/<cluster>_<fpga>.v`` + ``ports.json`` + ``router_cfg.{json,hex}`` +
    ``gmi.json`` (+ ``gateway.json``) for every FPGA of ``plan``; returns the paths written
    and the FPGAs' :class:`~hwgen.cluster.plan.FPGAPlan`."""
    from ..flow.emit import emit_verilog
    from .router import pack_cfg
    from .top import FPGATop
    n_clusters = max(p.cluster.id for p in plans) + 1
    beats = router_cfg_beats(routing_tables(plan, plans))
    written, fpgas = [], []
    for f in plan.cluster.fpgas:
        fdir = Path(cdir) / f.name
        fp = fpga_plan(plan, f, desc.data_bits, n_clusters)
        fpgas.append(fp)
        if log:
            log(f"emitting {fp.name}.v")
        v_path, _ = emit_verilog(FPGATop(fp), fp.name, fdir)
        (fdir / "router_cfg.json").write_text(json.dumps(beats, indent=1) + "\n")
        (fdir / "router_cfg.hex").write_text("".join(f"{pack_cfg(b):011x}\n" for b in beats))
        (fdir / "gmi.json").write_text(json.dumps(
            {str(i): c.to_dict() for i, c in fp.gmi_configs.items()}, indent=2) + "\n")
        written += [v_path, fdir / "ports.json", fdir / "router_cfg.json",
                    fdir / "router_cfg.hex", fdir / "gmi.json"]
        if fp.gateway is not None:
            (fdir / "gateway.json").write_text(json.dumps(
                {**fp.gateway.to_dict(), "derived": fp.gateway.derived()}, indent=2) + "\n")
            written.append(fdir / "gateway.json")
    return written, fpgas
