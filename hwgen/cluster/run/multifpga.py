"""Multi-FPGA simulation of a built cluster description (issue 7 item 6).

:func:`prepare` builds the description (:func:`hwgen.cluster.run.builder.build` with
``kernels="external"``: the compute kernels are packet ports of the tops) and verilates every
FPGA top (builds cached under ``cache_dir()/cluster-sim/<sha256 of the Verilog>``).
:func:`traffic` makes the packets each compute kernel of each FPGA sends (the testbench plays
the compute kernels, the tops' only external kernels: the gateway kernel 0 with its virtual GMI
kernels is inside the top of its FPGA, :mod:`hwgen.cluster.gateware.top`);
:func:`golden` computes what every compute kernel must receive; :func:`simulate` runs all FPGAs
at once with :func:`hwgen.cluster.run.netsim.run_cluster` (each router's tables loaded first through
``s_axis_cfg``; the network address of each frame from ``m_axis_addr``); :func:`compare` counts
per-kernel differences (multisets of packets).

Traffic per round (``rounds`` rounds), following the plan's edges:

* every compute kernel sends one message to each destination: to a GMI kernel a message of the
  size the collective expects (scatter ``members * length`` elements, the others ``length``),
  to a compute kernel a random-length point-to-point packet, to ``output`` a message for the
  kernel named by the cluster's ``output`` (through the top's header attacher: inter-cluster);
* nothing else enters a cluster: its ``input`` is what the other clusters send to its
  ``output`` kernel, which arrives from the network at the gateway FPGA's ``s_axis_net`` and is
  decoded there in hardware (header stripped, forwarded point to point or into a virtual GMI
  kernel);
* one extra point-to-point packet per FPGA from its first compute kernel without an
  ``output`` destination to the first such kernel of the next FPGA of the cluster (intra-cluster
  traffic across FPGAs).

Golden model (:func:`golden`): a packet from a kernel with an ``output`` destination gets the
GMI header (:func:`~hwgen.cluster.spec.packet.attach_header`); an inter-cluster packet goes to the
destination cluster's gateway, which drops it unless it has a byte after the header, fits
its decoder and names a kernel it knows (:func:`hwgen.cluster.plan.placement.gateway_config`), and
otherwise strips the header (:func:`~hwgen.cluster.spec.packet.strip_header`) and sends it on from
the gateway's FPGA: to a virtual GMI kernel or, as an intra-cluster packet, to its kernel; an
intra-cluster packet goes to its TDEST kernel; a GMI kernel's inputs (interleaved round-robin
over sources, each source in order) go through
:func:`~hwgen.cluster.golden.collectives.collective_stream` (for virtual kernels
:meth:`~hwgen.cluster.spec.gateway.GatewayConfig.collective`, the same with the members' ids) and
its outputs are routed again (fixpoint).
Datagrams the hub dropped (``dropped`` frames) remove the matching packet on its network hop.
"""

from collections import Counter
from dataclasses import dataclass
import hashlib
import ipaddress
import json
from pathlib import Path
import time

import numpy as np

from ... import checks
from ...flow.frames import received_beats, stimulus_frames
from ...flow.ports import StreamFormat
from ...flow.tools import cache_dir
from ...flow.verilator import verilate
from ..golden.collectives import collective_stream, gateway_collective
from ..plan.placement import Role, gateway_config, gmi_config
from ..spec import describe as D
from ..spec.packet import Packet, attach_header, from_beats, split_packets, strip_header, to_beats
from .builder import build
from .netsim import NodeRun, run_cluster

__all__ = ["FPGARun", "prepare", "traffic", "golden", "simulate", "compare", "run"]


@dataclass
class FPGARun:
    """One FPGA prepared for simulation (:func:`prepare`): its cluster ``plan`` and
    description ``fpga``, top name ``top``, Verilator ``build_dir``, the top's ``ports``
    (``ports.json``), its router configuration beats ``cfg_beats``, the ``external`` compute
    kernels (packet ports of the top) and its :class:`~hwgen.cluster.plan.placement.FPGAPlan`."""
    plan: object
    fpga: object
    top: str
    build_dir: Path
    ports: dict
    cfg_beats: list
    external: list
    fpga_plan: object = None

    @property
    def address(self):
        """The FPGA's node address: its IPv4 address as a 32-bit integer."""
        return int(ipaddress.IPv4Address(self.fpga.ip))


def prepare(description, out_dir, log=None, kernels="external"):
    """Build the tops of ``description`` under ``out_dir/build`` (compute kernels
    ``kernels``: "external" packet ports, or "inside" the tops) and verilate them; returns
    ``(description, plans, [FPGARun])``."""
    desc = description if isinstance(description, D.Description) else D.load(description)
    result = build(desc, Path(out_dir) / "build", picture=False, log=log, kernels=kernels)
    plans = result["plans"]
    by_id = {p.cluster.id: p for p in plans}
    runs = []
    for fp in result["fpgas"]:
        p = by_id[fp.cluster_id]
        fdir = Path(out_dir) / "build" / p.cluster.name / fp.fpga.name
        v_path = fdir / f"{fp.name}.v"
        key = hashlib.sha256(v_path.read_bytes()).hexdigest()[:16]
        bdir = cache_dir() / "cluster-sim" / f"{fp.name}-{key}"
        verilate(v_path, fp.name, bdir, log=log)
        runs.append(FPGARun(p, fp.fpga, fp.name, bdir,
                            json.loads((fdir / "ports.json").read_text()),
                            json.loads((fdir / "router_cfg.json").read_text()),
                            list(fp.external), fp))
    return desc, plans, runs


def _gmi_cfg(plan, k, data_bits):
    if k.role is Role.VIRTUAL:
        return gateway_config(plan, data_bits).gmi_config(k.kind)
    return gmi_config(k, plan, data_bits)


def _msg_bytes(kind, cfg):
    elems = cfg.members * cfg.length if kind == "scatter" else cfg.length
    return elems * cfg.elem_bits // 8


def traffic(plans, data_bits, rounds=2, seed=1):
    """``{(cluster id, kernel id): [Packet]}``: what each compute kernel sends (see module
    docstring), in sending order."""
    rng = np.random.default_rng(seed)
    by_id = {p.cluster.id: p for p in plans}
    sent = {}

    def payload(n):
        return bytes(rng.integers(0, 256, n).astype(np.uint8))

    def message_for(plan, dest):
        k = plan.kernels[dest]
        if k.role in (Role.COMMUNICATION, Role.VIRTUAL):
            return payload(_msg_bytes(k.kind, _gmi_cfg(plan, k, data_bits)))
        return payload(int(rng.integers(1, 3 * data_bits // 8)))

    for p in plans:
        cid = p.cluster.id
        for r in range(rounds):
            for k in sorted(p.kernels.values(), key=lambda k: k.id):
                if k.role is not Role.COMPUTE:
                    continue
                out = sent.setdefault((cid, k.id), [])
                for d in k.dests:
                    if d == D.Boundary.OUTPUT:
                        o = p.cluster.output
                        tgt = by_id.get(o["cluster"])
                        body = message_for(tgt, o["kernel"]) if tgt else payload(8)
                        out.append(Packet(o["kernel"], k.id, body, src_cluster=cid))
                    else:
                        out.append(Packet(d, k.id, message_for(p, d), src_cluster=cid))
            # point-to-point across the FPGAs of the cluster
            firsts = []
            for f in p.cluster.fpgas:
                ids = [i for i in sorted(p.fpga_kernels[f.name])
                       if p.kernels[i].role is Role.COMPUTE
                       and D.Boundary.OUTPUT not in p.kernels[i].dests]
                if ids:
                    firsts.append(ids[0])
            if len(firsts) > 1:
                for a, b in zip(firsts, firsts[1:] + firsts[:1]):
                    sent[(cid, a)].append(Packet(b, a, payload(int(rng.integers(1, 40))),
                                                 src_cluster=cid))
    return sent


def _key(p):
    return (p.dest, p.src, bytes(p.payload), p.inter_cluster, p.src_cluster)


def golden(plans, sent, data_bits, dropped=()):
    """``{(cluster id, kernel id): [Packet]}`` each compute kernel must receive for the
    traffic ``sent``; ``dropped`` (packets, as the hub logged them) are lost on their network
    hop."""
    by_id = {p.cluster.id: p for p in plans}
    gw = {p.cluster.id: gateway_config(p, data_bits) for p in plans}
    fpga_of = {(p.cluster.id, k.id): k.fpga for p in plans for k in p.kernels.values()}
    gmi_out = {}
    for _ in range(16):
        lost = Counter(_key(p) for p in dropped)
        received, gmi_in = {}, {}

        def hop(pkt):
            """False when the hub dropped this packet's datagram."""
            if lost[_key(pkt)] > 0:
                lost[_key(pkt)] -= 1
                return False
            return True

        def route(cid, src_id, pkt):
            if pkt.inter_cluster:
                tc = pkt.dest
                if tc not in by_id:
                    return                               # dropped by the router
                if (tc != cid or fpga_of[(cid, src_id)] != fpga_of[(tc, 0)]) and not hop(pkt):
                    return
                g = gw[tc]                               # the gateway's packet decoder
                if len(pkt.payload) < 2 or len(to_beats(pkt, data_bits)) > g.max_beats:
                    return
                head = pkt.payload[0]
                inner = strip_header(pkt)
                if head in g.virtual_ids.values():
                    gmi_in.setdefault((tc, head), []).append(inner)
                elif head in g.local_list:
                    route(tc, 0, inner)                  # forwarded from the gateway's FPGA
                return
            dest = (cid, pkt.dest)
            if dest not in fpga_of:
                return                                   # dropped by the router
            if fpga_of[(cid, src_id)] != fpga_of[dest] and not hop(pkt):
                return
            role = by_id[cid].kernels[dest[1]].role
            if role is Role.COMMUNICATION:
                gmi_in.setdefault(dest, []).append(pkt)
            elif role is Role.COMPUTE:
                received.setdefault(dest, []).append(pkt)

        for (cid, kid), pkts in sent.items():
            p = by_id[cid]
            k = p.kernels[kid]
            for pkt in pkts:
                if D.Boundary.OUTPUT in k.dests and p.cluster.output:
                    pkt = attach_header(pkt, p.cluster.output["cluster"], pkt.dest, cid)
                route(cid, kid, pkt)
        for (cid, gid), pkts in gmi_out.items():
            for pkt in pkts:
                route(cid, gid, pkt)
        new_out = {}
        for (cid, gid), pkts in gmi_in.items():
            p = by_id[cid]
            k = p.kernels[gid]
            per_src = {}
            for pkt in pkts:
                per_src.setdefault(pkt.src, []).append(pkt)
            order = [q for n in range(max(map(len, per_src.values())))
                     for s in sorted(per_src) for q in per_src[s][n:n + 1]]
            if k.role is Role.VIRTUAL:
                new_out[(cid, gid)], _ = gateway_collective(gw[cid], k.kind, order)
            else:
                new_out[(cid, gid)], _ = collective_stream(k.kind, _gmi_cfg(p, k, data_bits),
                                                           order)
        if {k: list(map(_key, v)) for k, v in new_out.items()} == \
                {k: list(map(_key, v)) for k, v in gmi_out.items()}:
            return received
        gmi_out = new_out
    raise RuntimeError("GMI kernels do not settle (a cycle in the graph?)")


def _fmt(run, port):
    return StreamFormat.from_dict(next(s for s in run.ports["streams"] if s["port"] == port))


def simulate(runs, sent, data_bits, run_dir, *, latency_s=0.0, loss=0.0, seed=1, stall=0.3,
             expect=None, settle_s=1.5, timeout_s=900, echo=None):
    """Run every FPGA at once; returns ``(received {(cid, kid): [Packet]}, malformed count,
    hub stats)``. ``expect`` ({(cid, kid): [Packet]}) lets the run stop as soon as every kernel
    has its beats."""
    nodes = []
    for r in runs:
        cid = r.plan.cluster.id
        ports = [{"port": "s_axis_cfg", "direction": "in",
                  "frames": stimulus_frames(r.cfg_beats, _fmt(r, "s_axis_cfg"))}]
        want = {}
        for i in r.external:
            beats = [b for pkt in sent.get((cid, i), []) for b in to_beats(pkt, data_bits)]
            ports.append({"port": f"s_axis_k{i}", "direction": "in",
                          "frames": stimulus_frames(beats, _fmt(r, f"s_axis_k{i}"))})
            ports.append({"port": f"m_axis_k{i}", "direction": "out"})
            if expect is not None:
                want[f"m_axis_k{i}"] = sum(len(to_beats(q, data_bits))
                                           for q in expect.get((cid, i), []))
        job = {"seed": seed * 1000 + r.address % 1000, "stall": stall,
               "timeout_cycles": 20_000_000, "address": r.address,
               "net": {"out": "m_axis_net", "in": "s_axis_net",
                       "dst": {"stream": "m_axis_addr"}},
               "ports": ports, "expect": want}
        nodes.append(NodeRun(f"{r.plan.cluster.name}_{r.fpga.name}", r.top, r.build_dir, job))
    results, stats = run_cluster(nodes, Path(run_dir), latency_s=latency_s, loss=loss,
                                 seed=seed, settle_s=settle_s, timeout_s=timeout_s, echo=echo)
    received, malformed = {}, 0
    for r, n in zip(runs, nodes):
        cid = r.plan.cluster.id
        for i in r.external:
            fmt = _fmt(r, f"m_axis_k{i}")
            got = []
            for beats in split_packets(received_beats(results[n.name]["outputs"]
                                                       [f"m_axis_k{i}"], fmt)):
                try:
                    got.append(from_beats(beats, data_bits))
                except ValueError:
                    malformed += 1
            received[(cid, i)] = got
    net = _fmt(runs[0], "m_axis_net")
    stats["dropped_packets"] = [from_beats(received_beats([d["frame"]], net), data_bits)
                                for d in stats["dropped_log"]]
    stats["timeouts"] = [n.name for n in nodes if results[n.name]["timeout"]]
    return received, malformed, stats


def compare(expected, received):
    """Per kernel: ``{(cid, kid): (missing, unexpected)}`` for kernels whose multisets
    differ."""
    out = {}
    for key in sorted(set(expected) | set(received)):
        want = Counter(map(_key, expected.get(key, [])))
        got = Counter(map(_key, received.get(key, [])))
        if want != got:
            out[key] = (sum((want - got).values()), sum((got - want).values()))
    return out


def check_options(*, latency_s, loss, seed, rounds, stall):
    """Validate :func:`run`'s options (before any build)."""
    checks.in_range("latency_ms", latency_s * 1000, 0, 60_000)
    checks.probability("loss", loss)
    checks.at_least("seed", seed, 0, checks.SEED_MAX)
    checks.at_least("rounds", rounds, 1, 10_000)
    checks.probability("stall", stall)


def run(description, out_dir, *, latency_s=0.0, loss=0.0, seed=1, rounds=2, stall=0.3,
        log=None, echo=None):
    """Build, verilate, simulate and compare; returns a report dict."""
    check_options(latency_s=latency_s, loss=loss, seed=seed, rounds=rounds, stall=stall)
    t0 = time.monotonic()
    desc, plans, runs = prepare(description, out_dir, log=log)
    t_build = time.monotonic() - t0
    sent = traffic(plans, desc.data_bits, rounds=rounds, seed=seed)
    ideal = golden(plans, sent, desc.data_bits)
    t1 = time.monotonic()
    received, malformed, stats = simulate(
        runs, sent, desc.data_bits, Path(out_dir) / "run", latency_s=latency_s, loss=loss,
        seed=seed, stall=stall, expect=None if loss else ideal, echo=echo)
    t_sim = time.monotonic() - t1
    expected = golden(plans, sent, desc.data_bits, dropped=stats["dropped_packets"])
    diff = compare(expected, received)
    names = {(p.cluster.id, k.id): f"{p.cluster.name}/k{k.id} {k.name}"
             for p in plans for k in p.kernels.values()}
    kernels = [{"kernel": names[key], "fpga": next(r.fpga.name for r in runs
                                                   if r.plan.cluster.id == key[0]
                                                   and key[1] in r.external),
                "sent": len(sent.get(key, [])), "expected": len(expected.get(key, [])),
                "received": len(received.get(key, [])),
                "mismatches": sum(diff.get(key, (0, 0)))}
               for key in sorted(set(sent) | set(expected) | set(received))]
    return {"kernels": kernels, "mismatches": sum(map(sum, diff.values())) + malformed,
            "malformed": malformed, "forwarded": stats["forwarded"],
            "dropped": stats["dropped"], "unknown_destination": stats["unknown_destination"],
            "timeouts": stats["timeouts"], "build_s": t_build, "sim_s": t_sim,
            "packets_sent": sum(map(len, sent.values())),
            "packets_expected": sum(map(len, expected.values())),
            "packets_received": sum(map(len, received.values()))}
