"""Cluster Builder (multi-FPGA I-BERT paper, sec. 6): descriptions -> kernel ids, GMI kernels,
routing tables, Galapagos logical/map files, graph picture and per-FPGA tops.

The only module of the package that writes files. What it writes comes from the plan
(:mod:`hwgen.cluster.plan.placement`: ids, roles, placement, routing tables, per-FPGA
configurations); the tops are the gateware of :mod:`hwgen.cluster.gateware.top` built from each
FPGA's plan.

Outputs of :func:`build` (``OUT/<cluster>/``): ``kernels.json`` (ids, roles, kinds, FPGA,
destinations), ``logical.xml`` and ``map.xml`` (Galapagos style, from
``rtl_templates/galapagos_*.j2``), ``graph.dot`` (+ ``graph.svg``/``graph.png`` when graphviz's
``dot`` is installed), and per FPGA ``<fpga>/routing.json``, ``kernel_table.hex``,
``cluster_table.hex`` (256 words each: bit 32 valid, bits 31:0 the IPv4 address of the node)
and, from :func:`write_tops`, the top-level Verilog with ``ports.json``, ``router_cfg.json`` /
``router_cfg.hex`` (the configuration beats loading the routing tables), ``gmi.json``,
``compute.json`` (each compute kernel inside the top: its chain, the source ids feeding each
chain input, both adapters' configurations) and, on the gateway's FPGA, ``gateway.json``.
With ``kernels="external"`` the compute kernels stay outside the tops (packet ports; the
multi-FPGA simulation plays them).

:func:`resource_table` (``hwgen cluster build --resources``) estimates each top's resources with
yosys, one run per distinct module or adapter configuration (cached), against the boards'
capacity; :func:`write_resources` writes ``OUT/resources.json``. A BERT-base Linear 768x768
alone took 638 s in yosys here, so the table is opt-in.
"""

from collections import Counter
from dataclasses import replace
import hashlib
import ipaddress
import json
from pathlib import Path
import shutil
import subprocess

from ... import registry
from ...boards import load_board
from ...flow.design import Design
from ...flow.emit import cached_design, emit_verilog
from ...flow.package import render
from ...flow.synth import synthesize_design
from ..gateware.router import pack_cfg
from ..gateware.switch import PacketFilter
from ..gateware.top import FPGATop, packet_buffer_beats
from ..plan.placement import (ClusterPlan, Kernel, Role, fpga_plan, plan, plan_cluster,
                              router_cfg_beats, routing_tables)
from ..spec import describe as D

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
        a = str(s) if s == D.Boundary.INPUT else f"k{s}"
        b = str(d) if d == D.Boundary.OUTPUT else f"k{d}"
        lines.append(f"  {a} -> {b};")
    lines.append("}")
    return "\n".join(lines) + "\n"


def summary_lines(plans):
    """Human-readable summary of cluster ``plans``: per cluster one line of kernel counts
    by role and the id range, then per FPGA its board, IP, kernel counts by role and kernel
    id ranges."""
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


def build(description, out_dir, *, tops=True, picture=True, log=None, kernels=None):
    """Write everything for ``description`` (a :class:`~hwgen.cluster.spec.describe.Description` or
    a path) under ``out_dir``; returns ``{"plans", "written", "summary", "fpgas"}`` (``fpgas``:
    the :class:`~hwgen.cluster.plan.placement.FPGAPlan` of every top written, none without
    ``tops``). ``kernels``: "inside" (each top holds its compute kernels behind packet adapters),
    "external" (compute kernels are packet ports of the tops) or None (the description's
    ``kernels``)."""
    desc = description if isinstance(description, D.Description) else D.load(description)
    kernels = kernels or desc.kernels
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
                 "compute_kernels": kernels if tops else None,
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
            paths, fps = write_tops(p, plans, desc, cdir, log=log, kernels=kernels)
            written += paths
            fpgas += fps
    lines = summary_lines(plans)
    seq = next((c.seq_len for fp in fpgas for c in fp.computes.values()), None)
    if tops and kernels == "inside":
        lines.append("compute kernels: inside the tops behind packet adapters"
                     + (f" (M = {seq} tokens, a build-time limit)" if seq else ""))
    elif tops:
        lines.append("compute kernels: external (packet ports s_axis_k<id>/m_axis_k<id>)")
    write(out / "summary.txt", "\n".join(lines) + "\n")
    return {"plans": plans, "written": written, "summary": lines, "fpgas": fpgas,
            "kernels": kernels}


def fpga_plans(plan, plans, desc, kernels="inside"):
    """The :class:`~hwgen.cluster.plan.placement.FPGAPlan` of every FPGA of cluster ``plan``
    (``plans``: every cluster's, for the routes between them), checked, nothing emitted."""
    n_clusters = max([p.cluster.id for p in plans]      # and a host's cluster (output.ip)
                     + [p.cluster.output["cluster"] for p in plans
                        if "ip" in (p.cluster.output or {})]) + 1
    return [fpga_plan(plan, f, desc.data_bits, n_clusters, kernels=kernels, plans=plans,
                      seq_len=desc.sequence_length) for f in plan.cluster.fpgas]


def write_tops(plan, plans, desc, cdir, log=None, kernels="inside"):
    """Emit ``<fpga>/<cluster>_<fpga>.v`` + ``ports.json`` + ``router_cfg.{json,hex}`` +
    ``gmi.json`` + ``compute.json`` (the compute kernels inside: chains and adapter
    configurations; empty with ``kernels="external"``) (+ ``gateway.json``) for every FPGA of
    ``plan``; returns the paths written and the FPGAs'
    :class:`~hwgen.cluster.plan.placement.FPGAPlan`."""
    beats = router_cfg_beats(routing_tables(plan, plans))
    written = []
    fpgas = fpga_plans(plan, plans, desc, kernels)
    for f, fp in zip(plan.cluster.fpgas, fpgas):      # every plan checked before emitting
        fdir = Path(cdir) / f.name
        if log:
            log(f"emitting {fp.name}.v")
        v_path, _ = emit_verilog(FPGATop(fp), fp.name, fdir)
        (fdir / "router_cfg.json").write_text(json.dumps(beats, indent=1) + "\n")
        (fdir / "router_cfg.hex").write_text("".join(f"{pack_cfg(b):011x}\n" for b in beats))
        (fdir / "gmi.json").write_text(json.dumps(
            {str(i): c.to_dict() for i, c in fp.gmi_configs.items()}, indent=2) + "\n")
        (fdir / "compute.json").write_text(json.dumps(
            {str(i): c.to_dict() for i, c in fp.computes.items()}, indent=2) + "\n")
        written += [v_path, fdir / "ports.json", fdir / "router_cfg.json",
                    fdir / "router_cfg.hex", fdir / "gmi.json", fdir / "compute.json"]
        if fp.gateway is not None:
            (fdir / "gateway.json").write_text(json.dumps(
                {**fp.gateway.to_dict(), "derived": fp.gateway.derived()}, indent=2) + "\n")
            written.append(fdir / "gateway.json")
    return written, fpgas


# -- resources ---------------------------------------------------------------------------------

#: Resource keys of the table (``bram``: BRAM18 blocks, as :meth:`hwgen.boards.Board.percent`).
RESOURCE_KEYS = ("lut", "ff", "bram", "uram", "dsp")


def _part_key(args):
    """A 12-digit key of a part's construction arguments (their ``repr``)."""
    return hashlib.sha256(repr(args).encode()).hexdigest()[:12]


def _shell_design(fp):
    """The top of FPGA plan ``fp`` without its compute kernels (switches, router, GMI
    kernels, gateway, header attachers), as a :class:`~hwgen.flow.design.Design`."""
    args = (fp.name, fp.data_bits, fp.router, fp.headers, fp.dest_cluster,
            sorted(fp.gmi_configs.items()), fp.gateway, fp.external)
    shell = replace(fp, computes={}, external=tuple(fp.computes) or fp.external)
    return Design("cluster-shell", "cluster_shell", _part_key(args),
                  lambda: FPGATop(shell), lambda: {"config": {"part": fp.name}, "derived": {}})


def _packet_buffer_design(data_bits, max_beats):
    """A compute kernel's store-and-forward packet buffer (``pktbuf_k<id>`` of the top), as a
    :class:`~hwgen.flow.design.Design`."""
    return Design("cluster-pktbuf", "cluster_pktbuf", _part_key((data_bits, max_beats)),
                  lambda: PacketFilter(data_bits, max_beats),
                  lambda: {"config": {"part": "pktbuf"}, "derived": {}})


def _counts(report):
    r = report["resources"]
    return {"lut": r["lut"], "ff": r["ff"], "bram": r["bram18"], "uram": r["uram"],
            "dsp": r["dsp"]}


def _anonymous_p2r(cfg):
    """``cfg`` with source ids 0, 1, ...: adapters differing only in ids share one synthesis
    (the ids are constants of one comparator each)."""
    return replace(cfg, sources=tuple(replace(s, id=k) for k, s in enumerate(cfg.sources)))


def _estimated(design, log=None):
    """:func:`_counts` of ``design``'s netlist estimate (:mod:`hwgen.flow.netlist_count`, kept
    with its cached Verilog) in the shape of a synthesis report."""
    if log:
        log(f"netlist estimate: {design.name} ({design.key})")
    stored = cached_design(design)
    return {"resources": json.loads((stored / "resources.json").read_text()), "seconds": 0.0}


#: ``resource_table``'s ``exact``: how each kind of part is counted (yosys or its netlist).
COUNTED = {True: ("yosys", "yosys"), False: ("netlist", "netlist"),
           "infrastructure": ("netlist", "yosys")}


def resource_table(fpgas, plans=None, log=None, exact=True):
    """Per FPGA (:class:`~hwgen.cluster.plan.placement.FPGAPlan` with its kernels inside) the yosys
    ``synth_xilinx`` resources of its parts, each distinct configuration synthesised once
    (cached by configuration digest, :func:`hwgen.flow.synth.synthesize`): every module of its
    compute kernels' chains, their two packet adapters, their packet buffers
    (``pktbuf_k<id>``), and the rest of the top (switches,
    router, GMI kernels, gateway, header attachers: the top without its compute kernels).
    Adapters are synthesised with their ids set to 0, 1, ... (ids only change comparator
    constants), so adapters of one format share a run. The regroupers between a chain's
    modules are not counted (a few registers and multiplexers each). Compute kernels outside
    the tops (``kernels="external"``) count with their modules (``plans`` names them) and
    without adapters. With ``exact=False`` every part is counted from its netlist instead
    (:func:`hwgen.flow.resources.estimate`'s rules and stated error; seconds, not minutes), with
    ``exact="infrastructure"`` the compute modules from their netlists and the rest (adapters,
    packet buffers, shell: fixed by the mapping, and the parts the netlist rules overcount 3 to
    5 times) with yosys: what ``hwgen cluster fit`` searches with. Returns ``{"capacity":
    {board: {...}}, "fpgas": {top: {"parts": [...], "total": {...}, "percent": {...}, "fits":
    bool}}, "synth_seconds", "note"}``."""
    out, seconds, boards = {}, 0.0, {}
    for fp in fpgas:
        board = boards.setdefault(fp.fpga.board, load_board(fp.fpga.board))
        parts = []

        def add(label, design, count=1, module=False):
            nonlocal seconds
            by = COUNTED[exact][0 if module else 1]
            rep = synthesize_design(design, log=log) if by == "yosys" else _estimated(design, log)
            seconds += rep["seconds"]
            parts.append({"part": label, "count": count, "digest": design.key,
                          **_counts(rep)})
        groups = {}
        plan_of = {p.cluster.id: p for p in plans or ()}
        for i in fp.external:                   # kernels outside: their modules, no adapters
            for mod in plan_of[fp.cluster_id].kernels[i].modules:
                cfg = registry.get(mod.kind).config.from_dict(mod.params)
                groups.setdefault((mod.kind, cfg.digest()), [mod.kind, cfg, 0])[2] += 1
        for cp in fp.computes.values():
            for kind, cfg in zip(cp.chain.kinds, cp.chain.configs):
                groups.setdefault((kind, cfg.digest()), [kind, cfg, 0])[2] += 1
            for kind, cfg in (("cluster-pkt2row", _anonymous_p2r(cp.p2r)),
                              ("cluster-row2pkt", replace(cp.r2p, dest=0, src=0))):
                groups.setdefault((kind, cfg.digest()), [kind, cfg, 0])[2] += 1
        for kind, cfg, n in groups.values():
            add(kind, Design.of(registry.get(kind), cfg), n,
                module=kind not in ("cluster-pkt2row", "cluster-row2pkt"))
        bufs = Counter((fp.data_bits, packet_buffer_beats(cp)) for cp in fp.computes.values())
        for key, n in bufs.items():
            add("cluster-pktbuf", _packet_buffer_design(*key), n)
        add("shell (switches, router, GMI, gateway)", _shell_design(fp))
        total = {k: sum(p[k] * p["count"] for p in parts) for k in RESOURCE_KEYS}
        pct = {k: round(v, 1) for k, v in board.percent(total).items()}
        out[fp.name] = {"fpga": fp.fpga.name, "board": board.name, "parts": parts,
                        "total": total, "percent": pct, "fits": max(pct.values()) <= 100}
    caps = {name: {"lut": b.resources["lut"], "ff": b.resources["ff"],
                   "bram": 2 * b.resources["bram36"], "uram": b.resources["uram"],
                   "dsp": b.resources["dsp"], "scope": b.resources_scope}
            for name, b in boards.items()}
    return {"capacity": caps, "fpgas": out, "synth_seconds": round(seconds, 1),
            "note": "compute modules: {}, adapters, buffers and shell: {} ({}); BRAM in 18 Kb "
                    "blocks; chain regroupers not counted".format(
                        *COUNTED[exact], "yosys: synth_xilinx -family xcup, hwgen.flow.synth; "
                        "netlist: hwgen.flow.resources.estimate")}


def resource_lines(table):
    """The table as text lines (one per FPGA, then the FPGAs that do not fit)."""
    lines = [f"{'top':<20} " + " ".join(f"{k:>16}" for k in RESOURCE_KEYS) + "  fits"]
    for name, row in table["fpgas"].items():
        cells = " ".join(f"{row['total'][k]:>9} {row['percent'][k]:>5.1f}%"
                         for k in RESOURCE_KEYS)
        lines.append(f"{name:<20} {cells}  {'yes' if row['fits'] else 'NO'}")
    for b, cap in table["capacity"].items():
        lines.append(f"capacity ({b}, {cap['scope']}): " + ", ".join(
            f"{k} {cap[k]}" for k in RESOURCE_KEYS))
    bad = [n for n, r in table["fpgas"].items() if not r["fits"]]
    lines.append("does not fit: " + ", ".join(bad) if bad else "every FPGA fits")
    return lines


def write_resources(table, out_dir):
    """``OUT/resources.json``; returns its path."""
    path = Path(out_dir) / "resources.json"
    path.write_text(json.dumps(table, indent=2) + "\n")
    return path
