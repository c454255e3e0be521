"""Packets and beats that pass each FPGA's router for one sentence of M tokens.

Every packet a kernel of an FPGA sends, to another FPGA or to a kernel of its own, goes through
that FPGA's one output switch and router (:class:`hwgen.cluster.gateware.top.FPGATop`), one beat per
cycle, store-and-forward (a packet leaves ``beats + 2`` cycles after its first beat entered,
:class:`hwgen.cluster.gateware.router.Router`). So the beats an FPGA sends per sentence bound from
below the cycles its router is busy, whatever the kernels' speed: a term the kernels' cycle model
(:func:`hwgen.cluster.plan.latency.encoder_timing`) does not have. Counted from the plan:

* a compute kernel: its :class:`~hwgen.cluster.gateware.adapter.RowToPackets` rows (M per sentence,
  or one matrix for kernels whose output is one matrix per sentence), each split into packets of
  at most ``max_packet_bytes``;
* a GMI kernel: per round (one per token) ``out_packets`` packets of ``out_beats`` beats
  (:meth:`~hwgen.cluster.spec.gmi.GMIConfig.geometry`); the gateway's virtual GMI kernels the same,
  on the gateway's FPGA.

Header bytes of inter-cluster packets are left out (one byte per packet).
"""

from dataclasses import replace

from ...lib.intmath import ceil_div
from ..spec import describe as D
from .placement import fpga_plan, plan

__all__ = ["router_load", "packet_beats", "packet_sizes", "description_load", "description_plans"]


def packet_sizes(nbytes, max_packet_bytes, data_bits):
    """Beats of each packet of ``nbytes`` of payload cut into packets of at most
    ``max_packet_bytes``, ``data_bits`` per beat."""
    if nbytes <= 0:
        return []
    full, rest = divmod(nbytes, max_packet_bytes)
    lane = data_bits // 8
    return [ceil_div(max_packet_bytes, lane)] * full + ([ceil_div(rest, lane)] if rest else [])


def packet_beats(nbytes, max_packet_bytes, data_bits):
    """``(packets, beats)`` of :func:`packet_sizes`."""
    sizes = packet_sizes(nbytes, max_packet_bytes, data_bits)
    return len(sizes), sum(sizes)


def router_load(fpga_plans, m):
    """``{top name: {"packets", "beats", "kernels": {kernel id: (packets, beats)}}}`` per
    sentence of ``m`` tokens for :class:`~hwgen.cluster.plan.placement.FPGAPlan` s built with their
    kernels inside."""
    out = {}
    for fp in fpga_plans:
        kernels = {}
        for i, cp in fp.computes.items():
            r = cp.r2p
            rows = 1 if cp.chain.output.framing == "beat" else m
            p, b = packet_beats(r.format.row_bytes, r.max_packet_bytes, r.data_bits)
            kernels[i] = (rows * p, rows * b)
        gmis = dict(fp.gmi_configs)
        kinds = dict(fp.gmi_kinds)
        if fp.gateway is not None:
            for kind, vid in fp.gateway.virtual_ids.items():
                gmis[vid], kinds[vid] = fp.gateway.gmi_config(kind), kind
        for i, cfg in gmis.items():
            g = cfg.geometry(kinds[i])
            kernels[i] = (m * g["out_packets"], m * g["out_packets"] * g["out_beats"])
        out[fp.name] = {"packets": sum(p for p, _ in kernels.values()),
                        "beats": sum(b for _, b in kernels.values()), "kernels": kernels}
    return out


def description_plans(description, m):
    """``(plans, fpga_plans)``: the :func:`~hwgen.cluster.plan.placement.plan` of ``description`` (a
    name, path or :class:`~hwgen.cluster.spec.describe.Description`) built for ``m`` tokens, and
    the :class:`~hwgen.cluster.plan.placement.FPGAPlan` s of its first cluster."""
    desc = description if isinstance(description, D.Description) else D.load(description)
    desc = replace(desc, sequence_length=m)
    plans = plan(desc)
    return plans, [fpga_plan(plans[0], f, desc.data_bits, len(plans) + 1, plans=plans,
                             seq_len=m) for f in plans[0].cluster.fpgas]


def description_load(description, m):
    """:func:`router_load` of the first cluster of ``description`` built for ``m`` tokens
    (:func:`description_plans`)."""
    return router_load(description_plans(description, m)[1], m)
