"""Partitioning a recommendation model's FC layers over several FPGAs (paper section III-C).

1. **PEs per layer, in proportion to work.** The hidden layers' work (in x out multiply-adds)
   is divided by the smallest, each ratio rounded to the nearest power of two (the paper's
   876x1024 : 1024x512 : 512x256 -> 8:4:1), and the PEs are the largest power-of-two multiple
   ``u`` of those ratios that fits the DSPs of all nodes at ``dsp_per_pe`` DSPs per PE (four
   U280s at 18 DSPs per PE: u = 128, so 1024 / 512 / 128 PEs). The output layer (a few
   outputs) runs on a small output unit of ``output_dsp`` DSPs on the last node.
2. **Even spread over nodes.** The PEs are laid out layer after layer and cut into ``nodes``
   equal shares (four nodes: 416 PEs, 7,488 DSPs = 83% of a U280 each): layer 1 spans nodes
   1-3, layer 2 nodes 3-4, layer 3 node 4, as in the paper's Fig. 3. The embedding unit is
   on node 1.
3. **Checks.** DSPs and BRAM (weights of the node's PEs, plus the on-chip embedding tables on
   node 1) against the board, and each node's network traffic against the link: nodes form a
   chain, each forwarding the input vector of a layer to the next node that computes part of
   it and sending partial results on towards the next layer's nodes.

``partition`` returns one configuration per node (JSON-serialisable) and the reasons a requested
split is infeasible.
"""

import math
from dataclasses import asdict, dataclass, field

from .. import checks
from ..errors import ConfigError

__all__ = ["Slice", "NodePlan", "Partition", "partition", "pe_allocation"]

#: DSPs of one PE in the paper's design (section III-C1)
PAPER_DSP_PER_PE = 18
#: DSPs of the output layer's unit: node 4 of Table II uses 7,497 DSPs, 9 beyond its PEs
PAPER_OUTPUT_DSP = 9


@dataclass(frozen=True)
class Slice:
    """PEs ``pe_start .. pe_start + pes - 1`` of FC layer ``layer`` (0-based)."""
    layer: int
    pe_start: int
    pes: int


@dataclass
class NodePlan:
    """What one node computes and what it costs."""
    node: int
    slices: list
    embedding: bool
    output_unit: bool
    dsp: int
    dsp_percent: float
    bram18: int
    bram_percent: float
    recv_bytes: int
    send_bytes: int

    def to_dict(self):
        """JSON form: the fields, each slice as a dict."""
        d = asdict(self)
        d["slices"] = [asdict(s) for s in self.slices]
        return d


@dataclass
class Partition:
    """The result of :func:`partition`: the model's and board's names, one :class:`NodePlan` per
    node, the PEs of each hidden layer (``layer_pes``), the power-of-two ``unit`` and work
    ``ratios`` they come from, the ``problems`` that make the split infeasible (with ``blame``, the
    option to change: ``nodes`` or ``rate``) and the embedding tables' ``placement``."""
    model: str
    board: str
    nodes: list
    layer_pes: list
    unit: int
    ratios: list
    problems: list = field(default_factory=list)
    blame: str = None
    placement: object = None

    @property
    def feasible(self):
        """True when no problem was found."""
        return not self.problems

    def node_configs(self):
        """Each node's plan in JSON form (:meth:`NodePlan.to_dict`)."""
        return [n.to_dict() for n in self.nodes]


def _pow2_round(x):
    return 1 << max(0, round(math.log2(x)))


def pe_allocation(model, total_dsp, dsp_per_pe=PAPER_DSP_PER_PE, output_dsp=PAPER_OUTPUT_DSP):
    """``(pes per hidden layer, unit, ratios)`` (see module docstring)."""
    shapes = model.layer_shapes
    hidden = shapes[:-1] if len(shapes) > 1 and shapes[-1][1] <= 16 else shapes
    work = [i * o for i, o in hidden]
    ratios = [_pow2_round(w / min(work)) for w in work]
    budget = (total_dsp - (output_dsp if len(hidden) < len(shapes) else 0)) // dsp_per_pe
    if budget < sum(ratios):
        raise ConfigError("nodes", f"{total_dsp} DSPs give {budget} PEs of {dsp_per_pe} DSPs: "
                          f"fewer than the {sum(ratios)} the layers' work ratios "
                          f"{':'.join(map(str, ratios))} need")
    unit = 1 << int(math.floor(math.log2(budget / sum(ratios))))
    return [r * unit for r in ratios], unit, ratios


def _bram18(bits):
    return math.ceil(bits / (18 * 1024))


def partition(model, board, nodes, *, dsp_per_pe=PAPER_DSP_PER_PE,
              output_dsp=PAPER_OUTPUT_DSP, link_gbps=100.0, inferences_per_s=None,
              placement=None):
    """Partition ``model`` over ``nodes`` boards (see module docstring).

    ``inferences_per_s``: the throughput the network check assumes (default: none, the check
    reports bytes per inference and the largest rate the links allow). ``placement``: the
    embedding tables' :class:`~hwgen.recsys.placement.Placement` on node 1's board (default:
    :func:`~hwgen.recsys.placement.place` with its defaults), whose failure to fit is raised
    as a :class:`ConfigError` naming the tables; the on-chip tables count against node 1's
    on-chip memory beside its weights.

    Problems are returned in ``Partition.problems``; ``Partition.blame`` names the option to
    change: ``nodes`` for DSP or memory, ``rate`` when only the links are too slow.
    """
    from .placement import onchip_capacity, place
    checks.at_least("nodes", nodes, 1)
    checks.at_least("dsp_per_pe", dsp_per_pe, 1)
    checks.at_least("output_dsp", output_dsp, 0)
    checks.positive("link_gbps", link_gbps)
    if inferences_per_s is not None:
        checks.positive("rate", inferences_per_s)
    tables = placement if placement is not None else place(model, board)
    onchip_table_bytes = tables.onchip_bytes
    dsp_board = board.resources["dsp"]
    layer_pes, unit, ratios = pe_allocation(model, nodes * dsp_board, dsp_per_pe, output_dsp)
    total = sum(layer_pes)
    share = math.ceil(total / nodes)
    shapes = model.layer_shapes
    has_output = len(layer_pes) < len(shapes)

    per_node = _cut_shares(layer_pes, nodes, share)
    link = _link_bytes(model, shapes, layer_pes, per_node, nodes, has_output)
    result_bytes = 4 if nodes > 1 else 0             # the final result back to node 1

    problems, network, plans = [], [], []


    bram_board = 2 * board.resources["bram36"]
    for n in range(nodes):
        dsp = sum(s.pes for s in per_node[n]) * dsp_per_pe
        output_unit = has_output and n == nodes - 1
        dsp += output_dsp if output_unit else 0
        weight_bits = 0
        for s in per_node[n]:
            fan_in, fan_out = shapes[s.layer]
            rows = math.ceil(fan_out * s.pes / layer_pes[s.layer])
            weight_bits += rows * fan_in * model.weight_bits + rows * 32
        bram = _bram18(weight_bits)
        recv = (link[n - 1] if n > 0 else 0) + (result_bytes if n == 0 else 0)
        send = (link[n] if n < nodes - 1 else 0) + (result_bytes if n == nodes - 1 else 0)
        plan = NodePlan(n + 1, per_node[n], n == 0, output_unit, dsp,
                        round(100 * dsp / dsp_board, 2), bram, round(100 * bram / bram_board, 2),
                        recv, send)
        plans.append(plan)
        if dsp > dsp_board:
            problems.append(f"node {n + 1}: DSP {dsp} > {dsp_board} available on {board.name}")
        if bram > bram_board:
            problems.append(f"node {n + 1}: BRAM {bram} BRAM18 for weights > {bram_board} on "
                            f"{board.name}")
        if n == 0 and weight_bits // 8 + onchip_table_bytes > onchip_capacity(board):
            problems.append(f"node 1: weights ({weight_bits // 8:,} B) and on-chip embedding "
                            f"tables ({onchip_table_bytes:,} B) exceed the "
                            f"{onchip_capacity(board):,} B of BRAM and URAM on {board.name}")
        if inferences_per_s:
            gbps = max(recv, send) * 8 * inferences_per_s / 1e9
            if gbps > link_gbps:
                network.append(f"node {n + 1}: network {gbps:.1f} Gb/s > {link_gbps:g} Gb/s "
                               f"link at {inferences_per_s:.0f} inferences/s")
    blame = "nodes" if problems else "rate" if network else None
    return Partition(model.name, board.name, plans, layer_pes, unit, ratios,
                     problems + network, blame, tables)


def _cut_shares(layer_pes, nodes, share):
    """The PEs laid out layer after layer and cut into ``nodes`` shares of ``share``: the
    :class:`Slice` list of each node."""
    per_node = [[] for _ in range(nodes)]
    offset = 0
    for layer, pes in enumerate(layer_pes):
        done = 0
        while done < pes:
            node = min(offset // share, nodes - 1)
            room = (node + 1) * share - offset if node < nodes - 1 else pes - done
            take = min(pes - done, room)
            per_node[node].append(Slice(layer, done, take))
            done += take
            offset += take
    return per_node


def _link_bytes(model, shapes, layer_pes, per_node, nodes, has_output):
    """Network traffic on each link ``n -> n+1`` of the chain, bytes per inference: a
    layer's complete input travels on to later nodes that compute part of it; while the
    input is still being produced, the partial results made so far travel on instead."""
    # Layers in order, the output layer (if any) held by the last node's output unit.
    layers = len(layer_pes) + (1 if has_output else 0)

    def holders(layer):
        if layer == len(layer_pes):
            return {nodes - 1}
        return {n for n in range(nodes) for s in per_node[n] if s.layer == layer}

    def rows_on(layer, upto):
        """Outputs of ``layer`` computed on nodes 0..upto."""
        fan_out = shapes[layer][1]
        pes = sum(s.pes for n in range(upto + 1) for s in per_node[n] if s.layer == layer)
        return min(fan_out, math.ceil(fan_out * pes / layer_pes[layer]))

    act_bytes = [b // 8 for b in model.act_bits] + [4]
    link = [0] * max(nodes - 1, 0)
    for n in range(nodes - 1):
        for layer in range(layers):
            if not any(k > n for k in holders(layer)):
                continue
            producers = {0} if layer == 0 else holders(layer - 1)
            if max(producers) <= n:
                link[n] += shapes[layer][0] * act_bytes[layer]
            else:
                link[n] += rows_on(layer - 1, n) * act_bytes[layer]
    return link
