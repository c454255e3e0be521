"""Multi-node function simulation of a recommendation model (paper section III-C, Fig. 3 and 5).

The model's FC layers are split over ``nodes`` FPGAs by :func:`hwgen.recsys.partition.partition`;
each node's generated top (:class:`hwgen.recsys.node.NodeTop`) runs in Verilator, and the
activation streams between nodes go through a network model.

Node configurations from the partitioner
----------------------------------------
:func:`cluster_partition` runs the partitioner with the cluster's DSPs re-scaled to a small PE
budget: a PE of the small model "costs" ``dsp_per_pe = board DSPs // ceil(cluster_pes /
nodes)`` DSPs (and the output unit none), so the cluster holds ``cluster_pes`` PEs at most and
every node's equal share fits its board. The partitioner then divides the PEs over the layers in
proportion to their work (powers of two, cluster-ctr: 8:4:1, 16 / 8 / 2 PEs), lays them out layer
after layer and cuts them into equal shares per node; the output layer's single-PE unit goes to
the last node and the embedding unit to node 1. A node's slice of PEs ``a .. b - 1`` of a layer
with ``P`` PEs and ``O`` output rows computes the contiguous rows ``floor(O a / P) .. floor(O b /
P) - 1`` with ``min(b - a, rows)`` PEs (:func:`slice_rows`).

Simulation (layer by layer)
---------------------------
1. Node 1's top runs the inferences' queries through its embedding unit (tables in AXI memories
   served by cocotbext-axi ``AxiRamRead``, random stalls on every stream and AXI channel).
2. For every layer, every node holding a slice of it runs with the whole input vectors of that
   layer on the slice's input port (the received hardware outputs of the previous stage, never
   the golden values), and the network model gathers the slices' outputs in row order into the
   next layer's input vectors.
3. The last layer's outputs are compared with :func:`hwgen.recsys.golden.mlp` of
   :func:`hwgen.recsys.golden.embed` (end-to-end, ``mismatches``); every run is also compared
   beat by beat with its blocks' golden models on the inputs it got (``block_mismatches``).

Network model
-------------
Nodes hang off one switch (the paper's 100 Gb/s Cisco switch), each with one link of ``gbps``
in each direction. A message of ``B`` bytes leaves its sender when the data is complete and the
sender's link is free, occupies it for ``8 B / gbps`` ns (serialisation), and arrives ``latency_ns``
later (or when the receiver's link has taken the messages before it). A node sends a layer's
complete input vector (node 1: the embedding vector) or its slice of a layer's outputs to every
other node holding a slice of the next layer, and the last node returns the result (4 bytes per
output) to node 1. A block starts when its whole input has arrived (local parts: when produced)
and takes its simulated single-inference time: ``latency_cycles`` (first input beat to first
output beat) plus the remaining output beats, at ``clock_mhz``. ``latency_ns`` of the report is
that timeline for one inference; ``network_ns`` its excess over the same timeline with an ideal
network; ``inferences_per_s`` the steady-state rate, bounded by the slowest block (simulated
cycles per inference; blocks of a node run concurrently) and the busiest link.
"""

import math
from dataclasses import dataclass, replace

import numpy as np

from .. import checks
from ..boards import load_board
from ..errors import ConfigError
from ..flow.simulate import simulate
from . import golden
from .embedding import EmbeddingModel
from .model import preset as get_preset
from .node import NodeConfig, NodeModel, NodeTop, format_slices
from .partition import partition

__all__ = ["CLUSTER_PES", "Network", "ClusterPlan", "cluster_partition", "slice_rows",
           "plan_cluster", "simulate_cluster", "network_timeline", "report_lines"]

#: PE budget of a simulated cluster (cluster-ctr: 16 / 8 / 2 PEs, as 8:4:1 with unit 2).
CLUSTER_PES = 26


@dataclass(frozen=True)
class Network:
    """Switch-connected nodes: one-way latency, link bandwidth and the nodes' clock."""
    latency_ns: float = 1000.0
    gbps: float = 100.0
    clock_mhz: float = 135.0

    def __post_init__(self):
        checks.in_range("latency_ns", self.latency_ns, 0, 1e9)
        checks.positive("gbps", self.gbps)
        checks.positive("clock_mhz", self.clock_mhz)

    def serialise_ns(self, nbytes):
        """Nanoseconds to put ``nbytes`` bytes on a link of ``gbps`` Gb/s."""
        return nbytes * 8 / self.gbps


def slice_rows(out_rows, layer_pes, pe_start, pes):
    """Contiguous output rows ``(start, count)`` of PEs ``pe_start .. pe_start + pes - 1`` of a
    layer of ``out_rows`` rows computed by ``layer_pes`` PEs (see module docstring)."""
    start = out_rows * pe_start // layer_pes
    end = out_rows * (pe_start + pes) // layer_pes
    return start, end - start


def cluster_partition(model, nodes, board="u280", cluster_pes=CLUSTER_PES):
    """:func:`hwgen.recsys.partition.partition` of ``model`` over ``nodes`` boards with each
    PE costing ``board DSPs // ceil(cluster_pes / nodes)`` DSPs and a free output unit."""
    if nodes < 1:
        raise ConfigError("nodes", "must be at least 1", value=nodes)
    if cluster_pes < 1:
        raise ConfigError("cluster_pes", "must be at least 1", value=cluster_pes)
    board_obj = load_board(board) if isinstance(board, str) else board
    dsp_per_pe = board_obj.resources["dsp"] // math.ceil(cluster_pes / nodes)
    plan = partition(model, board_obj, nodes, dsp_per_pe=dsp_per_pe, output_dsp=0)
    return plan, dsp_per_pe


@dataclass
class ClusterPlan:
    """The nodes of a simulated cluster.

    ``layer_slices[l]``: ``(node index, row_start, rows, pes)`` of every slice of layer ``l``
    in row order (where the network model puts each node's outputs); ``configs``: the
    :class:`~hwgen.recsys.node.NodeConfig` each node's top is built from.
    """
    model: object
    partition: object
    dsp_per_pe: int
    layer_slices: list
    configs: list

    @property
    def nodes(self):
        """Number of nodes."""
        return len(self.configs)

    def with_config(self, node, config):
        """This plan with node ``node``'s (0-based) top built from ``config`` instead (the
        network still gathers the planned rows: a way to test that a wrong node is caught)."""
        configs = list(self.configs)
        configs[node] = config
        return replace(self, configs=configs)

    def to_dict(self):
        """JSON form for reports: the model's name, nodes, PEs per layer and ratios, each node's
        configuration and every layer's slices (nodes numbered from 1, rows as ``[first,
        last]``)."""
        return {"model": self.model.name, "nodes": self.nodes, "dsp_per_pe": self.dsp_per_pe,
                "layer_pes": self.partition.layer_pes, "ratios": self.partition.ratios,
                "node_configs": [c.to_dict() for c in self.configs],
                "layer_slices": [[{"node": n + 1, "rows": [s, s + r - 1], "pes": p}
                                  for n, s, r, p in sl] for sl in self.layer_slices]}


def plan_cluster(preset="cluster-ctr", nodes=2, *, board="u280", cluster_pes=CLUSTER_PES,
                 mults=4, lanes=8):
    """Node configurations of ``preset`` split over ``nodes`` (see module docstring)."""
    model = get_preset(preset)
    part, dsp_per_pe = cluster_partition(model, nodes, board, cluster_pes)
    if part.problems:
        raise ConfigError("nodes", "infeasible: " + "; ".join(part.problems), value=nodes)
    shapes = model.layer_shapes
    per_node = [[] for _ in range(nodes)]
    layer_slices = [[] for _ in shapes]
    for n, plan in enumerate(part.nodes):
        for s in plan.slices:
            start, rows = slice_rows(shapes[s.layer][1], part.layer_pes[s.layer], s.pe_start,
                                     s.pes)
            if rows:
                per_node[n].append((s.layer, start, rows, min(s.pes, rows)))
                layer_slices[s.layer].append((n, start, rows, min(s.pes, rows)))
    if len(part.layer_pes) < len(shapes):          # the output unit on the last node
        layer = len(shapes) - 1
        per_node[nodes - 1].append((layer, 0, shapes[layer][1], 1))
        layer_slices[layer].append((nodes - 1, 0, shapes[layer][1], 1))
    for layer, sl in enumerate(layer_slices):
        sl.sort(key=lambda s: s[1])
        covered = [r for _, start, rows, _ in sl for r in range(start, start + rows)]
        assert covered == list(range(shapes[layer][1])), (layer, sl)
    index_bits = (max(t.rows for t in model.tables) - 1).bit_length() + 1
    configs = [NodeConfig(preset=preset, embedding=(n == 0), slices=tuple(per_node[n]),
                          mults=mults, lanes=lanes, index_bits=index_bits,
                          board=board if isinstance(board, str) else board.name)
               for n in range(nodes)]
    return ClusterPlan(model, part, dsp_per_pe, layer_slices, configs)


class _NodeAccelerator:
    """What :func:`hwgen.flow.simulate.simulate` needs of an accelerator, for one node run."""
    name = "recsys-node"
    top_name = "recsys_node"
    testbench = "hwgen.sim.stream_tb"
    default_items = 1

    def __init__(self, result_port, latency_from):
        self.model = NodeModel(result_port, latency_from)

    @staticmethod
    def build_core(config):
        return NodeTop(config)


def _vectors(beats, name, length, items):
    """``(items, length)`` int64 vectors from received beats (frames end at ``last``); vectors
    that did not arrive are filled with ``None`` rows (a mask is returned too)."""
    out = np.zeros((items, length), dtype=np.int64)
    got = np.zeros(items, dtype=bool)
    current, k = [], 0
    for beat in beats:
        current += list(beat[name])
        if beat["last"]:
            if k < items and len(current) >= length:
                out[k] = current[:length]
                got[k] = True
            k += 1
            current = []
    return out, got


def _run(config, stim, items, *, result, source, seed, stall, log):
    acc = _NodeAccelerator(result, source)
    res = simulate(acc, config, items=items, seed=seed, stall=stall, stimulus=stim,
                   keep_outputs=True, log=log)
    return res


def simulate_cluster(plan, *, items=40, seed=1, stall=0.0, network=None, log=None):
    """Simulate ``plan`` (a :class:`ClusterPlan`) end to end on ``items`` inferences; returns
    the report (see module docstring)."""
    checks.at_least("items", items, 1)
    checks.probability("stall", stall)
    checks.at_least("seed", seed, 0, checks.SEED_MAX)
    network = network or Network()
    model, configs = plan.model, plan.configs
    last = len(model.layers) - 1
    rng = np.random.default_rng(seed)
    emb_cfg = configs[0].embedding_config
    query = EmbeddingModel.stimulus(emb_cfg, items, rng)

    # golden, layer by layer
    want = [golden.embed(model, golden.table_contents(model), query["indices"], query["dense"],
                         oob=emb_cfg.oob)]
    for layer in range(last + 1):
        w, b = golden.layer_params(model, layer)
        want.append(golden.fc_layer(
            want[-1], w, b, relu=layer < last, shift=model.shifts[layer] if layer < last else 0,
            out_bits=model.act_bits[layer + 1] if layer < last else 0))
    final = golden.mlp(model, want[0])
    assert np.array_equal(final, want[-1])

    runs, blocks = [], {}
    count = [0]

    def run(node, stim, result, source, block, out_len, field):
        count[0] += 1
        res = _run(configs[node], stim, items, result=result, source=source,
                   seed=seed * 1000 + count[0], stall=stall, log=log)
        vec, got = _vectors(res["outputs"][result], field, out_len, items)
        beats = -(-out_len // configs[node].lanes)
        single = (res["latency_cycles"] or 0) + beats - 1
        interval = ((res["cycles"] - single) / (items - 1)) if items > 1 and res["cycles"] \
            else float(res["cycles"] or 0)
        entry = {"node": node + 1, "block": block, "cycles": res["cycles"],
                 "latency_cycles": res["latency_cycles"], "single_cycles": single,
                 "cycles_per_inference": round(interval, 3), "mismatches": res["mismatches"],
                 "timeout": res["timeout"], "build_cached": res["build_cached"],
                 "build_seconds": res["build_seconds"], "sim_seconds": res["sim_seconds"]}
        runs.append(entry)
        blocks[(node, block)] = entry
        if log:
            log(f"node {node + 1} {block}: {res['cycles']} cycles, "
                f"{res['mismatches']} mismatching beats")
        return vec, got

    # embedding on node 1
    x, got = run(0, {"query": query}, "o_emb", "i_query", "embedding", model.concat_len, "elem")
    layer_mismatches = [int((~got | (x != want[0]).any(axis=1)).sum())]
    for layer in range(last + 1):
        sc0 = configs[plan.layer_slices[layer][0][0]].slice_config(layer)
        pad = sc0.in_beats * sc0.lanes - sc0.in_dim
        bits = model.act_bits[layer]
        junk = rng.integers(-(1 << (bits - 1)), 1 << (bits - 1), size=(items, pad))
        out_len = model.layers[layer]
        y = np.zeros((items, out_len), dtype=np.int64)
        ok = np.ones(items, dtype=bool)
        for node, start, rows, _ in plan.layer_slices[layer]:
            stim = {"x": {layer: x}, "junk": {layer: junk}}
            part, got = run(node, stim, f"o_y{layer}", f"i_x{layer}", f"layer{layer}", rows,
                            "y")
            y[:, start:start + rows] = part
            ok &= got
        layer_mismatches.append(int((~ok | (y != want[layer + 1]).any(axis=1)).sum()))
        # what the next layer's nodes receive: the gathered hardware outputs
        x = y

    mismatches = layer_mismatches[-1]
    bad = np.flatnonzero((x != final).any(axis=1))
    first = [{"inference": int(i), "expected": final[i].tolist(), "received": x[i].tolist()}
             for i in bad[:3]]
    timing = network_timeline(plan, blocks, network)
    per_node = []
    for n in range(plan.nodes):
        mine = [r for r in runs if r["node"] == n + 1]
        per_node.append({
            "node": n + 1, "slices": format_slices(configs[n].slices),
            "embedding": configs[n].embedding,
            "sim_cycles": sum(r["cycles"] or 0 for r in mine),
            "cycles_per_inference": max(r["cycles_per_inference"] for r in mine),
            "blocks": {r["block"]: r["cycles"] for r in mine}})
    return {
        "model": model.name, "nodes": plan.nodes, "items": items, "seed": seed, "stall": stall,
        "network": {"latency_ns": network.latency_ns, "gbps": network.gbps,
                    "clock_mhz": network.clock_mhz},
        "plan": plan.to_dict(), "runs": runs, "per_node": per_node,
        "layer_mismatches": layer_mismatches, "block_mismatches": sum(r["mismatches"]
                                                                      for r in runs),
        "timeouts": sum(bool(r["timeout"]) for r in runs),
        "mismatches": mismatches, "first_mismatches": first, "outputs": int(len(final)),
        **timing}


def network_timeline(plan, blocks, network):
    """Single-inference timeline and steady-state rate (see module docstring).

    ``blocks``: ``{(node index, "embedding" | "layer<l>"): {"single_cycles",
    "cycles_per_inference"}}`` from simulation.
    """
    model = plan.model
    last = len(model.layers) - 1

    def walk(net):
        ns = 1e3 / net.clock_mhz
        egress = [0.0] * plan.nodes
        ingress = [0.0] * plan.nodes
        messages = []

        def send(src, dst, nbytes, ready, what):
            ser = net.serialise_ns(nbytes)
            start = max(ready, egress[src])
            egress[src] = start + ser
            arrive = max(start + ser + net.latency_ns, ingress[dst] + ser)
            ingress[dst] = arrive
            messages.append({"what": what, "from": src + 1, "to": dst + 1, "bytes": nbytes,
                             "ready_ns": round(ready, 2), "arrive_ns": round(arrive, 2)})
            return arrive

        done = blocks[(0, "embedding")]["single_cycles"] * ns
        producers = [(0, done, model.concat_len * model.act_bits[0] // 8, "embedding")]
        finish = {}
        for layer in range(last + 1):
            out_bytes = model.act_bits[layer + 1] // 8 if layer < last else 4
            nxt = []
            for node, start, rows, _ in plan.layer_slices[layer]:
                ready = 0.0
                for src, t, nbytes, what in producers:
                    ready = max(ready, t if src == node else
                                send(src, node, nbytes, t, f"{what} -> layer{layer}"))
                t_done = ready + blocks[(node, f"layer{layer}")]["single_cycles"] * ns
                finish[(node + 1, f"layer{layer}")] = (round(ready, 2), round(t_done, 2))
                nxt.append((node, t_done, rows * out_bytes, f"layer{layer} rows {start}.."
                            f"{start + rows - 1}"))
            producers = nxt
        end = max(t if src == 0 else send(src, 0, nbytes, t, "result")
                  for src, t, nbytes, _ in producers)
        return end, messages, finish

    end, messages, finish = walk(network)
    ideal, _, _ = walk(Network(latency_ns=0.0, gbps=1e12, clock_mhz=network.clock_mhz))

    # steady state: slowest block and busiest link
    ns = 1e3 / network.clock_mhz
    block_ns = max(b["cycles_per_inference"] for b in blocks.values()) * ns
    sent, received = [0] * plan.nodes, [0] * plan.nodes
    for m in messages:
        sent[m["from"] - 1] += m["bytes"]
        received[m["to"] - 1] += m["bytes"]
    link_ns = network.serialise_ns(max(sent + received)) if messages else 0.0
    interval = max(block_ns, link_ns)
    return {"latency_ns": round(end, 2), "compute_latency_ns": round(ideal, 2),
            "network_ns": round(end - ideal, 2), "messages": messages,
            "block_windows_ns": {f"node{n} {b}": w for (n, b), w in finish.items()},
            "bytes_sent": sent, "bytes_received": received,
            "block_interval_ns": round(block_ns, 2), "link_interval_ns": round(link_ns, 2),
            "bottleneck": "compute" if block_ns >= link_ns else "network",
            "inferences_per_s": round(1e9 / interval, 1) if interval else None}


def report_lines(report):
    """Human-readable summary of :func:`simulate_cluster`'s report."""
    net = report["network"]
    plan = report["plan"]
    yield (f"{report['model']} on {report['nodes']} node(s): PEs per layer "
           f"{' / '.join(map(str, plan['layer_pes']))} ({plan['dsp_per_pe']} DSPs per PE); "
           f"{report['items']} inferences, stall {report['stall']:g}, seed {report['seed']}")
    yield f"{'node':>4} {'slices (layer:first:rows:PEs)':<36} {'sim cycles':>10} {'cyc/inf':>8}"
    for n in report["per_node"]:
        slices = ("emb," if n["embedding"] else "") + n["slices"]
        yield (f"{n['node']:>4} {slices:<36} {n['sim_cycles']:>10} "
               f"{n['cycles_per_inference']:>8.2f}")
    sent = sum(report["bytes_sent"])
    yield (f"network: {net['latency_ns']:g} ns one-way, {net['gbps']:g} Gb/s links, "
           f"{len(report['messages'])} messages / {sent} bytes per inference, nodes at "
           f"{net['clock_mhz']:g} MHz")
    yield (f"latency per inference: {report['latency_ns']:.1f} ns end to end = "
           f"{report['compute_latency_ns']:.1f} ns compute + {report['network_ns']:.1f} ns "
           f"network; {report['inferences_per_s']:,.0f} inferences/s "
           f"({report['bottleneck']}-bound)")
    yield (f"mismatches: {report['mismatches']} of {report['outputs']} outputs end to end "
           f"(per layer {report['layer_mismatches']}), {report['block_mismatches']} beats "
           f"against the blocks' golden models, {report['timeouts']} timeouts")
