"""Packet-level cycle model of one cluster of an encoder description: the kernels' cycle models
joined by the packets between them, with every FPGA's router a shared store-and-forward server.

:func:`hwgen.cluster.plan.latency.encoder_timing` chains the kernels' own cycle models and leaves
the network out; on ``minilm_encoder`` it predicts X a third of the simulated one, because
fpga1's one router carries 480 beats a token against its linears' 192 cycles
(:mod:`hwgen.cluster.plan.router_load`), rows wait for whole packets in store-and-forward buffers,
and every FPGA crossing costs a hop. This model replays one sentence through the plan
(:func:`hwgen.cluster.plan.placement.fpga_plan`) event by event, in time order:

* **input**: the host's M frames reach the gateway's FPGA back to back from cycle ``hop``
  (``input_beats`` each); the gateway's decoder is store-and-forward, its virtual GMI kernels
  then send as a GMI kernel does;
* **compute kernel** (:class:`~hwgen.cluster.plan.placement.ComputePlan`): row ``r`` is ready when
  row ``r`` of each row input, and every row of each matrix input (the module configuration's
  :attr:`~hwgen.lib.row_ports.RowKernel.matrix_inputs`: K of the attention dot product, V of
  softmax x V), and for kernels that compute rows in groups
  (:meth:`~hwgen.lib.row_ports.RowKernel.row_group`) the rest of row ``r``'s group, has come
  out of its packet adapter (3 cycles after the packet's last beat,
  :class:`~hwgen.cluster.gateware.adapter.PacketsToRows`); each module of its chain then finishes
  the row at ``max(ready + latency, previous row + period)``
  (:meth:`~hwgen.lib.row_ports.RowKernel.row_timing`, the kernels' own cycle models), plus the
  chain's regroupers
  (:meth:`~hwgen.cluster.spec.compute.ChainPlan.cycle_model`); the row's packets
  (:func:`~hwgen.cluster.plan.router_load.packet_sizes`) pass the row adapter (1 cycle) and
  leave the packet buffer 3 cycles after their last beat;
* **GMI kernel**: a round's output starts 3 cycles after its last input (all members' for a
  gather or reduce), one beat per cycle (:meth:`~hwgen.cluster.spec.gmi.GMIConfig.cycles`);
* **output switch and router** (one per FPGA, every packet its kernels send): the switch
  grants the kernels with a packet ready round-robin, a packet at a time
  (:class:`~hwgen.cluster.gateware.switch.KernelSwitch`); the router is store-and-forward, one beat
  per cycle in and out; a packet's first beat leaves ``beats + 2`` cycles after its first
  beat entered (:class:`~hwgen.cluster.gateware.router.Router`);
* **network**: a packet leaves at the testbench's next poll of the network port (every
  ``poll_cycles``, ``sim/cluster_tb.py``) after its last beat left the router and reaches
  the other FPGA ``hop`` cycles later (the lock-step network of :mod:`hwgen.cluster.run.netsim`);
  a local one goes straight to the input switch.

Left out: contention in the input switches and the merge of network and local traffic,
backpressure (buffers are taken as deep enough: the builder sizes GMI and FIFO depths to M),
stalls. X and T are counted as
:mod:`hwgen.cluster.run.encoder_sim` counts them: from the first input packet's arrival (cycle
``hop``) to the cycle the first and the last output row leave for the host.
"""

import heapq

from ..spec.describe import Boundary, GmiKind
from ..spec.gateway import REGISTER_STAGES
from .placement import Role
from .router_load import description_plans, packet_sizes

__all__ = ["packet_timing"]


class _Output:
    """One FPGA's output switch and router. The switch grants one sending kernel at a time,
    round-robin (in kernel id order, starting after the kernel served last) among those whose
    next packet is ready, until its last beat; the router takes one beat per cycle, stores
    the packet and sends it ``beats + 2`` cycles after its first beat came in."""

    def __init__(self, at):
        self.at = at                              # the model's event scheduler
        self.queues = {}                          # sender id -> [(ready, beats, done)]
        self.last = None                          # sender served last
        self.in_free = self.out_free = 0
        self.granting = False
        self.beats = 0

    def offer(self, t, src, beats, done):
        """Kernel ``src``'s packet of ``beats``, ready in cycle ``t``; ``done(last)`` is called
        with the cycle its last beat leaves the router."""
        self.queues.setdefault(src, []).append((t, beats, done))
        if not self.granting:
            self.granting = True
            self.at(max(t, self.in_free), self.grant)

    def grant(self, t):
        ready = sorted(s for s, q in self.queues.items() if q and q[0][0] <= t)
        if not ready:
            waiting = [q[0][0] for q in self.queues.values() if q]
            self.granting = bool(waiting)
            if waiting:
                self.at(min(waiting), self.grant)
            return
        after = [s for s in ready if self.last is not None and s > self.last]
        src = (after or ready)[0]
        self.last = src
        _, beats, done = self.queues[src].pop(0)
        self.in_free = t + beats
        out = max(t + beats + 2, self.out_free)
        self.out_free = out + beats
        self.beats += beats
        done(out + beats - 1)
        self.at(self.in_free, self.grant)


#: Cycles from a packet's last beat to its row's last beat out of a
#: :class:`~hwgen.cluster.gateware.adapter.PacketsToRows`, from a row's last beat into a
#: :class:`~hwgen.cluster.gateware.adapter.RowToPackets` to its packet's, and from a packet's last
#: beat into a :class:`~hwgen.cluster.gateware.switch.PacketFilter` to its first beat out (their
#: docstrings).
P2R_CYCLES, R2P_CYCLES, PKTBUF_CYCLES = 3, 1, 3
#: The testbench polls each FPGA's network output every this many cycles (``sim/cluster_tb.py``).
POLL_CYCLES = 16


def packet_timing(description, m, hop_cycles, input_beats=None, poll_cycles=POLL_CYCLES):
    """Replay one sentence of ``m`` tokens through the first cluster of ``description`` (a
    name, path or :class:`~hwgen.cluster.spec.describe.Description` with its compute kernels
    inside; see the module docstring). ``input_beats``: beats of one input frame (default: the
    gateway broadcast's input row). Returns ``{"X", "T", "I", "output_cycles", "kernels":
    {name: [cycle each row left the kernel]}, "datagrams": [{"cycle", "tid", "tdest",
    "beats"}], "router_beats": {top: beats}}`` in the cycles of
    :func:`hwgen.cluster.run.encoder_sim.run`'s report (``datagrams``: every packet that leaves
    an FPGA, at the testbench's cycle, as ``datagrams.jsonl`` of a simulation lists them)."""
    plans, fps = description_plans(description, m)
    p = plans[0]
    fpga_of = {i: k.fpga for i, k in p.kernels.items()}
    events, seq = [], [0]

    def at(t, fn, *args):
        """Call ``fn(t, *args)`` in cycle ``t``."""
        seq[0] += 1
        heapq.heappush(events, (t, seq[0], fn, args))

    router = {fp.fpga.name: _Output(at) for fp in fps}

    def send(first, src, dest, beats, row, final):
        """Packet of kernel ``src`` offered to its FPGA's output switch in cycle ``first``."""
        router[fpga_of[src]].offer(first, src, beats,
                                   lambda last: sent(last, src, dest, beats, row, final))

    def sent(last, src, dest, beats, row, final):
        leave = -(-(last + 1) // poll_cycles) * poll_cycles       # the testbench's poll
        if dest == Boundary.OUTPUT or fpga_of[dest] != fpga_of[src]:
            datagrams.append({"cycle": leave, "tid": src, "tdest": dest, "beats": beats})
        if dest == Boundary.OUTPUT:
            outputs.append(leave)
            return
        arrive = last + 1 if fpga_of[dest] == fpga_of[src] else leave + hop_cycles + beats
        if final:
            at(arrive, receive, dest, src, row)

    # -- GMI kernels (and the gateway's virtual ones) ------------------------------------
    gmis = {}
    for fp in fps:
        for i, cfg in fp.gmi_configs.items():
            gmis[i] = (fp.gmi_kinds[i], cfg)
        if fp.gateway is not None:
            for kind, vid in fp.gateway.virtual_ids.items():
                gmis[vid] = (kind, fp.gateway.gmi_config(kind))
    gmi_state = {i: {"free": 0, "got": {}} for i in gmis}

    def gmi_receive(i, src, row, t):
        kind, cfg = gmis[i]
        st = gmi_state[i]
        k = p.kernels[i]
        if GmiKind(kind).fan_in:
            got = st["got"].setdefault(row, {})
            got[src] = t
            if len(got) < len(k.members):
                return
            t = max(got.values())
        g = cfg.geometry(kind)
        start = max(t + 3, st["free"])
        dests = list(k.dests) if GmiKind(kind).fan_out else list(k.dests) * \
            g["out_packets"]
        for j, dest in enumerate(dests):
            at(start + j * g["out_beats"], send, i, dest, g["out_beats"], row, True)
        st["free"] = start + len(dests) * g["out_beats"] + 1

    # -- compute kernels ------------------------------------------------------------------
    comp, kernel_rows = {}, {}
    for fp in fps:
        for i, cp in fp.computes.items():
            ports = {port.name: port for port in cp.chain.inputs}
            matrix = set()
            for tid, name, _ in cp.sources:
                port = ports[name]
                if port.field in cp.chain.configs[port.module].matrix_inputs:
                    matrix.add(tid)
            mods = [cfg.row_timing(m) for cfg in cp.chain.configs]
            r = cp.r2p
            rows = 1 if cp.chain.output.framing == "beat" else m
            group = cp.chain.configs[0].row_group()
            comp[i] = {"cp": cp, "matrix": matrix, "mods": mods, "prev": [None] * len(mods),
                       "group": group,
                       "regroup": cp.chain.cycle_model()["regroup_latency"],
                       "sources": {tid for tid, _, _ in cp.sources}, "got": {}, "next": 0,
                       "rows": rows, "sizes": packet_sizes(r.format.row_bytes,
                                                           r.max_packet_bytes, r.data_bits)}
            kernel_rows[cp.name] = []

    def compute_receive(i, src, row, t):
        c = comp[i]
        c["got"].setdefault(src, {})[row] = t
        while c["next"] < c["rows"]:
            r = c["next"]
            need = []
            for s in c["sources"]:
                got = c["got"].get(s, {})
                if s in c["matrix"]:
                    if len(got) < m:
                        return
                    need.append(max(got.values()))
                else:
                    rows = range(r, min(m, (r // c["group"] + 1) * c["group"]))
                    if not all(k in got for k in rows):
                        return
                    need.extend(got[k] for k in rows)
            t = max(need) + P2R_CYCLES
            for j, (lat, per) in enumerate(c["mods"]):
                prev = c["prev"][j]
                t = t + lat if prev is None else max(t + lat, prev + per)
                c["prev"][j] = t
            kernel_rows[c["cp"].name].append(round(t))
            c["next"] += 1
            (dest,) = p.kernels[i].dests
            t += c["regroup"]
            first = round(t) + R2P_CYCLES + PKTBUF_CYCLES
            for j, b in enumerate(c["sizes"]):
                at(first, send, i, dest, b, r, j == len(c["sizes"]) - 1)
                first += b

    def receive(t, dest, src, row):
        if dest in gmis:
            gmi_receive(dest, src, row, t)
        elif dest in comp:
            compute_receive(dest, src, row, t)
        else:
            raise ValueError(f"kernel {dest} ({p.kernels[dest].name}) is neither a compute "
                             "nor a GMI kernel inside the tops")

    # -- input: the host's frames, through the gateway's decoder --------------------------
    entry = [k.id for k in p.with_role(Role.VIRTUAL)]
    if len(entry) != 1:
        raise ValueError("the packet model takes one virtual GMI kernel as the cluster's input")
    b_in = input_beats or gmis[entry[0]][1].geometry(gmis[entry[0]][0])["in_beats"]
    for r in range(m):
        last_in = hop_cycles + (r + 1) * b_in - 1
        # the decoder's last beat out, through the gateway's register stages
        at(last_in + b_in + 2 + REGISTER_STAGES, receive, entry[0], 0, r)

    outputs, datagrams = [], []
    while events:
        t, _, fn, args = heapq.heappop(events)
        fn(t, *args)
    if len(outputs) != m:
        raise ValueError(f"the model's sentence ended with {len(outputs)} of {m} output rows")
    arrive = hop_cycles
    return {"X": outputs[0] - arrive, "T": outputs[-1] - arrive,
            "I": (outputs[-1] - outputs[0]) / max(m - 1, 1), "output_cycles": outputs,
            "kernels": kernel_rows, "datagrams": datagrams,
            "router_beats": {fp.name: router[fp.fpga.name].beats for fp in fps}}
