"""Performance model of a whole recommendation design (``hwgen bench recsys``).

A design is the paper's pipeline (section III, Figs. 3 and 5): the embedding lookup unit on
node 1, the FC layers' PEs spread over the nodes by :func:`hwgen.recsys.partition.partition`,
the nodes joined in a chain by 100 Gb/s links, the final result sent back to node 1. Every
node runs at its own clock. :func:`design_performance` predicts the throughput (inferences per
second) and the latency of one inference from three kinds of stages:

**Lookup stage** (:func:`lookup_stage`): the placement's channels
(:func:`hwgen.recsys.placement.place`) and the lookup unit's cycle model, the same formulas as
:meth:`hwgen.recsys.embedding.EmbeddingConfig.performance` applied to any model (the test suite
checks they agree on every embedding test configuration): one inference every ``max(output
beats, busiest channel's AXI words)`` cycles; latency from the query to the last beat of the
concatenated vector, with the memory's random-read latency of the placement's
:data:`~hwgen.recsys.placement.MEMORY_MODELS` (150 ns assumed). The placement's own channel
rate (which also caps a channel by its bandwidth) is a second bound on the stage.

**FC stages** (:func:`fc_stage`): each node's share of a layer is a :class:`hwgen.recsys.fc.FC`
of the node's PEs computing the rows of its share, and its cycles come from
:meth:`hwgen.recsys.fc.FCConfig.performance` (``max(R * S, input beats, output beats)`` cycles
per inference, ``R`` rows per PE, ``S = ceil(in / mults)`` steps per row); the same model is
checked against Verilator in the bench and the tests (within 5%). Assumed:

* ``mults`` = :data:`MULTS_PER_PE` (16) multipliers per PE: the paper's PE costs 18 DSPs
  (section III-C1) and gives no breakdown; 16 16-bit multipliers, one DSP48E2 each, plus two
  DSPs for the accumulator/bias path is the assumption. With 18 multipliers per PE the FC
  cycles drop by about 11%.
* The output layer (256 -> 1) runs on the last node's output unit of
  :data:`~hwgen.recsys.partition.PAPER_OUTPUT_DSP` (9) DSPs, modelled as one PE of
  :data:`OUTPUT_MULTS` (8) multipliers.
* 16-bit activations and weights (the ``paper-ctr`` preset), :data:`LANES` (16) elements per
  stream beat between blocks (876 elements: 55 beats).
* Shares of different layers on one node run concurrently (separate PEs), so each share is a
  stage of its own.

**Network stages**: each link of the chain carries the bytes per inference that the partition
reports (a layer's input vector forwarded to later nodes that compute part of it, partial
results towards the next layer's nodes), at ``link_gbps`` (100 Gb/s, the paper's network). A
transfer of ``B`` bytes over one hop takes :data:`HOP_LATENCY_NS` plus ``8 B / link rate``
(store and forward at each node). The per-hop latency is an **assumption**: the paper says only
that the 100 Gb/s TCP/IP stack (EasyNet) gives "a latency within several microseconds"; 1 us
per hop is assumed (switch plus both TCP stacks).

**Throughput** is that of the slowest stage (the stages are pipelined: the lookup unit, every
PE share and every link work on different inferences at once). **Latency** follows one
inference through the pipeline as events: a share starts when the complete input vector has
reached its node (from every node that produces part of it, hop by hop along the chain) and
its last output beat leaves ``cycles_single - input beats`` cycles after the input's last beat
(:meth:`FCConfig.performance`); the layer's vector is complete at a node when every share's
results have arrived there; the last node returns the 4-byte result to node 1 over one hop.

**What the model is and is not.** It predicts hwgen's generated design (fully pipelined RTL: one
AXI read request per cycle per channel, every multiplier busy every cycle) at the paper's clocks
and PE counts. It is *not* a model of the paper's HLS design, whose measured throughput is well
below this compute bound: at 135 MHz the paper's 4-node figure (28.95 x the CPU) is 144 cycles
per inference, while 1024/512/128 PEs of 16 multipliers need 64 (layer 2: 1024 inputs / 16 =
64 steps, one row per PE). The paper states that its 4-node design computes "at almost the
same rate as the embedding lookup" (Fig. 6), so its lookups, not its PEs, set its rate, at
about one inference per microsecond; its lookup unit does not reach one request per cycle per
channel (HLS lookups of a channel are issued one after the other and each waits for the
memory's latency), which this model does not assume. Likewise the paper's latencies (12.06 and
20.05 us) are far above the model's, whose compute and memory parts are about 2-3 us: they are
dominated by the network stack and host-side costs the paper does not break down. The bench
prints both figures and their ratio, and the per-hop latency that would explain the paper's
latency if all the difference were network.

Paper figures used (Zhu et al., "Distributed Recommendation Inference on FPGA Clusters",
section IV): CPU baseline (16 vCPU) 31.72 ms at batch 1024, taken as 1024 / 31.72 ms = 32,282
inferences/s, and 7.48 ms at batch 1 (``hwgen bench recsys --cpu`` measures the model on this
machine's CPU as well, :mod:`hwgen.recsys.cpu_baseline`); single FPGA (MicroRec) 3.77 x the
CPU, latency not stated as a number ("less than 31.72 microseconds" for all FPGA designs); 2
nodes 16.31 x (4.32 x the single FPGA), 12.06 us; 4 nodes 28.95 x (7.68 x), 20.05 us; clocks
135 MHz everywhere except node 1 of the 2-node design (115 MHz). Table II's DSP counts (single
5193, 2 nodes 8064 + 8073, 4 nodes 7488 x 3 + 7497) are printed beside the PE counts of
hwgen's partition.
"""

import math
from dataclasses import dataclass, field

from ..boards import load_board
from ..errors import ConfigError
from ..lib.intmath import ceil_div
from .embedding import output_beat_times
from .fc import FCConfig
from .partition import partition
from .placement import place

__all__ = ["MULTS_PER_PE", "OUTPUT_MULTS", "LANES", "LINK_GBPS", "HOP_LATENCY_NS",
           "PAPER_CPU", "PAPER_DESIGNS", "Stage", "DesignPerformance", "lookup_stage",
           "fc_stage", "design_performance", "paper_designs", "cpu_inferences_per_s"]

#: Multipliers per PE (assumed; the paper's PE is 18 DSPs).
MULTS_PER_PE = 16
#: Multipliers of the output layer's unit (assumed; 9 DSPs in the paper's Table II).
OUTPUT_MULTS = 8
#: Elements per stream beat between blocks.
LANES = 16
#: Network link rate (the paper's 100 Gb/s TCP/IP network).
LINK_GBPS = 100.0
#: Latency of one node-to-node hop (assumed; the paper: "within several microseconds").
HOP_LATENCY_NS = 1000.0
#: Lookup-unit credits (inferences in flight), as ``recsys-embedding``'s default.
INFLIGHT = 16

#: The paper's CPU baseline (section IV-A/C): batch, latency of a batch in ms, latency at
#: batch 1, the machine and software.
PAPER_CPU = {"batch": 1024, "latency_ms": 31.72, "label": "CPU 16 vCPU, batch 1024",
             "clock_mhz": 2300.0, "batch1_latency_ms": 7.48,
             "machine": "Intel Xeon E5-2686 v4 @ 2.30 GHz, 16 vCPU (AVX2), 128 GB DRAM "
                        "(8 channels), TensorFlow Serving"}

#: The paper's FPGA designs: node clocks (MHz), speed-up over the CPU, latency (us, None where
#: the paper gives no number), DSPs per node (Table II).
PAPER_DESIGNS = {
    1: {"clocks": (135.0,), "speedup": 3.77, "latency_us": None, "dsp": (5193,),
        "label": "1 node (MicroRec)"},
    2: {"clocks": (115.0, 135.0), "speedup": 16.31, "latency_us": 12.06, "dsp": (8064, 8073),
        "label": "2 nodes"},
    4: {"clocks": (135.0,) * 4, "speedup": 28.95, "latency_us": 20.05,
        "dsp": (7488, 7488, 7488, 7497), "label": "4 nodes"},
}


def cpu_inferences_per_s():
    """The paper's CPU throughput: batch / latency at batch 1024."""
    return PAPER_CPU["batch"] / (PAPER_CPU["latency_ms"] * 1e-3)


@dataclass
class Stage:
    """One pipelined stage: what it is, where, its rate and its own latency."""
    name: str
    node: int
    clock_mhz: float
    cycles_per_inference: float
    inferences_per_s: float
    latency_ns: float
    detail: dict = field(default_factory=dict)


@dataclass
class DesignPerformance:
    """The prediction of :func:`design_performance`."""
    model: str
    board: str
    nodes: int
    clocks: tuple
    layer_pes: list
    node_dsp: list
    stages: list
    inferences_per_s: float
    bottleneck: str
    latency_ns: float
    latency_parts: dict
    hops: int
    hop_latency_ns: float

    @property
    def compute_latency_ns(self):
        """The latency without any network time."""
        return self.latency_ns - self.latency_parts["network"]

    def to_dict(self):
        """JSON form: the figures (``clocks_mhz``, ``latency_parts_ns``) and one dict per stage."""
        return {"model": self.model, "board": self.board, "nodes": self.nodes,
                "clocks_mhz": list(self.clocks), "layer_pes": self.layer_pes,
                "node_dsp": self.node_dsp, "inferences_per_s": self.inferences_per_s,
                "bottleneck": self.bottleneck, "latency_ns": self.latency_ns,
                "latency_parts_ns": self.latency_parts, "hops": self.hops,
                "hop_latency_ns": self.hop_latency_ns,
                "stages": [{"name": s.name, "node": s.node, "clock_mhz": s.clock_mhz,
                            "cycles_per_inference": s.cycles_per_inference,
                            "inferences_per_s": s.inferences_per_s,
                            "latency_ns": s.latency_ns, **s.detail} for s in self.stages]}


def lookup_stage(placement, lanes=LANES, memory_latency=None, inflight=INFLIGHT):
    """Cycle model of the lookup unit for ``placement`` (any model; the formulas of
    :meth:`hwgen.recsys.embedding.EmbeddingConfig.performance`).

    ``memory_latency``: AR-to-R cycles (default: the placement's memory model at its clock).
    Returns ``initiation_interval``, ``latency_cycles`` (query to first output beat),
    ``inference_cycles`` (query to after the last output beat), ``output_beats``,
    ``busiest_channel_beats``, ``memory_latency_cycles``, ``credit_bound``.
    """
    p, model = placement, placement.model
    if lanes < 1:
        raise ConfigError("lanes", "must be at least 1", value=lanes)
    out_beats = ceil_div(model.concat_len, lanes)
    times, memory_latency = output_beat_times(p, model.tables, lanes, out_beats, memory_latency)
    busiest = max([ch.beats for ch in p.channels], default=0)
    interval = max(out_beats, 1, busiest)
    credit = times[-1] / inflight
    return {"initiation_interval": max(interval, credit), "latency_cycles": times[0],
            "inference_cycles": times[-1] + 1, "output_beats": out_beats,
            "busiest_channel_beats": busiest, "memory_latency_cycles": memory_latency,
            "credit_bound": credit > interval}


def fc_stage(in_dim, rows, pes, mults, lanes=LANES, weight_bits=16, act_bits=16,
             out_bits=16):
    """:meth:`FCConfig.performance` of ``pes`` PEs of ``mults`` multipliers computing ``rows``
    outputs of a layer with ``in_dim`` inputs (PEs beyond ``rows`` would idle: at most
    ``rows`` are used; ``mults`` at most ``in_dim``)."""
    cfg = FCConfig(in_dim=in_dim, out_dim=rows, pes=min(pes, rows), mults=min(mults, in_dim),
                   lanes=lanes, weight_bits=weight_bits, act_bits=act_bits, out_bits=out_bits)
    perf = cfg.performance().to_dict()
    perf["in_beats"] = cfg.in_beats
    perf["out_beats"] = cfg.out_beats
    return perf


def _share_rows(fan_out, pes, total):
    """Rows of a layer computed by shares of ``pes`` of its ``total`` PEs: in proportion,
    rounded up, the last shares trimmed so that they add up to ``fan_out``."""
    rows = [max(1, math.ceil(fan_out * p / total)) for p in pes]
    extra = sum(rows) - fan_out
    for i in range(len(rows) - 1, -1, -1):
        cut = min(max(extra, 0), rows[i] - 1)
        rows[i] -= cut
        extra -= cut
    return rows


def _hop_ns(nbytes, hop_latency_ns, link_gbps):
    return hop_latency_ns + nbytes * 8 / link_gbps


def design_performance(model, board="u280", nodes=4, *, clocks=None, mults=MULTS_PER_PE,
                       output_mults=OUTPUT_MULTS, lanes=LANES, link_gbps=LINK_GBPS,
                       hop_latency_ns=HOP_LATENCY_NS, dsp_per_pe=18, placement=None):
    """Predicted throughput and latency of ``model`` on ``nodes`` boards (see module docstring).

    ``clocks``: one clock (MHz) per node, default the paper's (135 MHz) for every node.
    ``placement``: the embedding tables' placement (default :func:`place` on ``board`` at node
    1's clock). Raises ConfigError naming the parameter for a wrong count of clocks or a
    non-positive value.
    """
    board_obj = load_board(board) if isinstance(board, str) else board
    clocks = _check_perf_args(nodes, clocks, hop_latency_ns, mults=mults,
                              output_mults=output_mults, lanes=lanes, link_gbps=link_gbps)
    plan = partition(model, board_obj, nodes, dsp_per_pe=dsp_per_pe, link_gbps=link_gbps)
    p = placement or place(model, board_obj, clock_mhz=clocks[0])
    shapes = model.layer_shapes
    act_bytes = [b // 8 for b in model.act_bits] + [4]
    ns = [1e3 / c for c in clocks]                      # ns per cycle of each node
    stages = []

    # -- lookup stage (node 1) ------------------------------------------------------------------
    lk = lookup_stage(p, lanes)
    rate = min(clocks[0] * 1e6 / lk["initiation_interval"], p.inferences_per_s)
    lookup_ns = lk["inference_cycles"] * ns[0]
    stages.append(Stage("lookup", 1, clocks[0], lk["initiation_interval"], rate, lookup_ns,
                        {"output_beats": lk["output_beats"],
                         "busiest_channel_beats": lk["busiest_channel_beats"],
                         "channel_bound_inferences_per_s": p.inferences_per_s}))

    # -- FC shares (one stage per node share of a layer) ------------------------------------
    layers = _fc_stages(model, plan, nodes, clocks, mults, output_mults, lanes, stages)

    def follow(hop_ns):
        """Latency of one inference (ns) and the time each layer's vector is complete."""
        producers = [(0, lookup_ns, shapes[0][0] * act_bytes[0])]
        marks = {"lookup": lookup_ns}
        for layer, (label, entries) in enumerate(layers):
            finished = []
            for n, r, perf in entries:
                arrive = max(t + abs(n - src) * hop_ns(b) for src, t, b in producers)
                done = arrive + (perf["cycles_single"] - perf["in_beats"]) * ns[n]
                finished.append((n, done, r * act_bytes[layer + 1]))
            marks[label] = max(t for _, t, _ in finished)
            producers = finished
        end = producers[0][1] + (hop_ns(4) if nodes > 1 else 0.0)
        return end, marks

    latency, marks = follow(lambda b: _hop_ns(b, hop_latency_ns, link_gbps))
    compute_only, compute_marks = follow(lambda b: 0.0)
    parts, before = {}, 0.0
    for label, t in compute_marks.items():
        parts[label] = t - before
        before = t
    parts["network"] = latency - compute_only
    # Hops on the longest chain of transfers (with a huge cost per hop the latency counts them).
    big = 1e9
    hops = round((follow(lambda b: big)[0] - compute_only) / big)

    # -- network stages ------------------------------------------------------------------------
    for n, node in enumerate(plan.nodes):
        if node.send_bytes:
            dst = n + 2 if n < nodes - 1 else 1
            rate = link_gbps * 1e9 / 8 / node.send_bytes
            stages.append(Stage(f"link {n + 1}->{dst}", n + 1, clocks[n],
                                clocks[n] * 1e6 / rate, rate,
                                _hop_ns(node.send_bytes, hop_latency_ns, link_gbps),
                                {"bytes_per_inference": node.send_bytes}))

    slowest = min(stages, key=lambda s: s.inferences_per_s)
    return DesignPerformance(
        model=model.name, board=board_obj.name, nodes=nodes, clocks=clocks,
        layer_pes=list(plan.layer_pes), node_dsp=[nd.dsp for nd in plan.nodes], stages=stages,
        inferences_per_s=slowest.inferences_per_s, bottleneck=f"{slowest.name} (node "
        f"{slowest.node})", latency_ns=latency, latency_parts=parts, hops=hops,
        hop_latency_ns=hop_latency_ns)


def _check_perf_args(nodes, clocks, hop_latency_ns, **positive):
    """The clocks of :func:`design_performance` (one per node, default 135 MHz) as floats,
    after checking them, ``nodes``, ``hop_latency_ns`` and the ``positive`` parameters;
    ConfigError naming the parameter otherwise."""
    if nodes < 1:
        raise ConfigError("nodes", "must be at least 1", value=nodes)
    clocks = tuple(float(c) for c in (clocks or (135.0,) * nodes))
    if len(clocks) != nodes:
        raise ConfigError("clocks", f"needs one clock per node ({nodes})", value=clocks)
    if min(clocks) <= 0:
        raise ConfigError("clocks", "must be positive (MHz)", value=clocks)
    for name, value in positive.items():
        if value <= 0:
            raise ConfigError(name, "must be positive", value=value)
    if hop_latency_ns < 0:
        raise ConfigError("hop_latency_ns", "must be >= 0", value=hop_latency_ns)
    return clocks


def _fc_stages(model, plan, nodes, clocks, mults, output_mults, lanes, stages):
    """The FC stages of :func:`design_performance`, one per node share of a layer (appended
    to ``stages``); returns per layer ``(label, [(node, rows, fc_stage figures)])``."""
    shapes = model.layer_shapes
    hidden = len(plan.layer_pes)
    act_bytes = [b // 8 for b in model.act_bits] + [4]
    ns = [1e3 / c for c in clocks]                      # ns per cycle of each node
    layers = []                 # per layer: [(node, pes, rows, mults, perf)]
    for layer in range(len(shapes)):
        fan_in, fan_out = shapes[layer]
        if layer < hidden:
            shares = [(n, s.pes) for n, node in enumerate(plan.nodes) for s in node.slices
                      if s.layer == layer]
            rows = _share_rows(fan_out, [pes for _, pes in shares], plan.layer_pes[layer])
            units = [(n, pes, r, mults) for (n, pes), r in zip(shares, rows)]
            label = f"L{layer + 1}"
        else:
            units = [(nodes - 1, 1, fan_out, output_mults)]
            label = "out"
        entries = []
        for n, pes, r, k in units:
            perf = fc_stage(fan_in, r, pes, k, lanes, model.weight_bits, act_bytes[layer] * 8,
                            act_bytes[layer + 1] * 8 if layer + 1 < len(shapes) else 16)
            stages.append(Stage(f"{label} {min(pes, r)} PEs x {min(k, fan_in)}", n + 1,
                                clocks[n], perf["cycles_per_inference"],
                                clocks[n] * 1e6 / perf["cycles_per_inference"],
                                perf["cycles_single"] * ns[n],
                                {"layer": label, "in": fan_in, "rows": r}))
            entries.append((n, r, perf))
        layers.append((label, entries))
    return layers


def paper_designs(model, board="u280", **options):
    """``{nodes: (DesignPerformance, paper figures)}`` for the paper's 1-, 2- and 4-node
    designs at their clocks."""
    out = {}
    for nodes, paper in PAPER_DESIGNS.items():
        out[nodes] = (design_performance(model, board, nodes, clocks=paper["clocks"], **options),
                      paper)
    return out
