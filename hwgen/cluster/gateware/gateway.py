"""``cluster-gateway``: the gateway kernel (kernel 0) of a cluster (paper sections 4, 5).

Inter-cluster packets arriving from the network pass, in order:

1. **packet decoder**: a :class:`~hwgen.cluster.gateware.switch.PacketFilter` (drops and counts
   malformed packets, and ``unknown`` ones: not inter-cluster, TDEST not this cluster, or a
   header byte that is neither a local kernel nor a virtual kernel) followed by a
   :class:`~hwgen.cluster.gateware.header.HeaderStripper` (TDEST := header byte, header removed);
2. an AXI-Stream **switch** (:class:`~hwgen.cluster.gateware.switch.KernelSwitch`, one input):
   virtual kernel ids to their GMI kernels, local kernel ids to the forwarding path;
3. **virtual GMI kernels** (:func:`hwgen.cluster.gateware.gmi.gmi_component`, one per entry of
   ``virtual``) whose members are the local kernels ``1 .. members``, and the **forwarding
   module** for point-to-point traffic.

The cluster plan (:func:`hwgen.cluster.plan.placement.gateway_config`, for the builder's tops in
:mod:`hwgen.cluster.gateware.top`) describes the cluster as it was assigned through the optional
parameters ``local_ids`` (the kernel ids reachable point to point, any set), ``groups`` (each
virtual kernel's kind, id and member ids, which need not be contiguous: a fan-out kernel then
addresses ranks ``0 .. n-1`` and a TDEST remapper after it turns rank ``i`` into member
``i``'s id) and ``max_bytes`` (the longest point-to-point payload). Left at their defaults
they change nothing.
"""

from amaranth.hdl import Module
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from ...flow.model import SimOption, StreamModel
from ...lib.pipeline import SkidBuffer
from ..golden import collectives as gmi_golden
from ..golden.traffic import StatusLines, counter_report, filter_golden, fuzz_stream, random_payload
from ..spec.describe import GmiKind
from ..spec.gateway import GMI_DROPS, REGISTER_STAGES
from ..spec.packet import (INTER_CLUSTER_BIT, Packet, attach_header, from_beats, packet_layout,
                           strip_header, to_beats)
from ..spec.switch import COUNTER_BITS, DROP_KINDS, SwitchConfig, status_name
from .gmi import BroadcastModel, GatherModel, ReduceModel, ScatterModel, gmi_component
from .header import HeaderStripper
from .switch import KernelSwitch, PacketFilter

__all__ = ["Gateway", "GatewayModel", "TEST_CONFIGS"]


class TdestRemap(wiring.Component):
    """Combinational TDEST rewrite ``i -> ids[i]`` (a fan-out GMI kernel addressing ranks
    ``0 .. n-1`` -> the members' kernel ids). Ports ``i_pkt``/``o_pkt`` (packet streams);
    latency 0; ready passes straight through."""

    def __init__(self, data_bits, ids):
        self.ids = list(ids)
        layout = packet_layout(data_bits)
        super().__init__({"i_pkt": In(stream.Signature(layout)),
                          "o_pkt": Out(stream.Signature(layout))})

    def elaborate(self, platform):
        m = Module()
        i, o = self.i_pkt, self.o_pkt
        m.d.comb += [o.payload.eq(i.payload), o.valid.eq(i.valid), i.ready.eq(o.ready)]
        with m.Switch(i.payload.dest):
            for rank, kid in enumerate(self.ids):
                with m.Case(rank):
                    m.d.comb += o.payload.dest.eq(kid)
        return m


def gmi_status_name(kind, stat):
    """Name of the gateway's status output of GMI kernel ``kind``'s counter ``stat``
    (``status_<kind>_<stat>``, e.g. ``status_gather_drop_source``)."""
    return f"status_{kind}_{stat}"


class Gateway(wiring.Component):
    """Gateway kernel: decoder, switch, virtual GMI kernels, forwarding.

    Ports
    -----
    ``i_pkt`` : In packet stream, inter-cluster packets from the network (GMI header first)
    ``o_pkt`` : Out packet stream, point-to-point packets to local kernels (header stripped,
        TDEST = the local kernel, inter-cluster flag clear, TID and source cluster kept)
    ``o_<kind>`` : Out packet stream per virtual GMI kernel (``o_broadcast`` ...): what that
        kernel sends (TID = its virtual id)
    ``status_delivered``, ``status_dropped_<kind>`` : 32-bit counters of the packet decoder
        (:data:`~hwgen.cluster.spec.switch.DROP_KINDS`)
    ``status_<kind>_<stat>`` : the GMI kernels' counters (``rounds``, ``drop_source``,
        ``drop_length``, ``drop_overrun``; :data:`hwgen.cluster.golden.collectives.STATUS`), for
        every kind (0 for a kind that is not among ``virtual``)

    Latency: store-and-forward in the decoder (a packet leaves ``beats + 2`` cycles after its
    first beat), one more beat in the stripper, :data:`REGISTER_STAGES` register stages, then
    the GMI kernel's own latency or none (forwarding). Throughput one beat per cycle.
    Backpressure: an output that stalls blocks the switch only while a packet for it is at the
    head; dropped packets never wait.
    """

    def __init__(self, config):
        self.config = c = config
        layout = packet_layout(c.data_bits)
        sig = {"i_pkt": In(stream.Signature(layout)), "o_pkt": Out(stream.Signature(layout)),
               "status_delivered": Out(COUNTER_BITS)}
        sig.update({status_name(k): Out(COUNTER_BITS) for k in DROP_KINDS})
        for kind in c.virtual_kinds:
            sig[f"o_{kind}"] = Out(stream.Signature(layout))
        for kind in gmi_golden.KINDS:       # 0 for kinds not configured
            sig.update({gmi_status_name(kind, s): Out(COUNTER_BITS)
                        for s in gmi_golden.STATUS})
        super().__init__(sig)

    def elaborate(self, platform):
        m = Module()
        c = self.config
        known = c.local_list + list(c.virtual_ids.values())

        def accept(m, beat):
            header = beat.data[:8]
            ok = beat.user[INTER_CLUSTER_BIT] & (beat.dest == c.cluster_id)
            hit = 0
            for k in known:
                hit = hit | (header == k)
            return ok & hit, 0

        m.submodules.decoder = dec = PacketFilter(c.data_bits, c.max_beats, accept)
        m.submodules.strip = strip = HeaderStripper(c.data_bits)
        kinds = c.virtual_kinds
        routes = {k: 0 for k in c.local_list}
        routes.update({vid: 1 + j for j, vid in enumerate(c.virtual_ids.values())})
        m.submodules.switch = sw = KernelSwitch(
            SwitchConfig(data_bits=c.data_bits, inputs=1, outputs=1 + len(kinds)), routes)
        assert REGISTER_STAGES == 2
        layout = packet_layout(c.data_bits)
        m.submodules.dec_reg = dec_reg = SkidBuffer(layout)
        m.submodules.strip_reg = strip_reg = SkidBuffer(layout)
        wiring.connect(m, wiring.flipped(self.i_pkt), dec.i_pkt)
        wiring.connect(m, dec.o_pkt, dec_reg.i)
        wiring.connect(m, dec_reg.o, strip.i_pkt)
        wiring.connect(m, strip.o_pkt, strip_reg.i)
        wiring.connect(m, strip_reg.o, sw.i_pkt)
        for k in ("delivered",) + DROP_KINDS:
            name = "status_delivered" if k == "delivered" else status_name(k)
            m.d.comb += getattr(self, name).eq(getattr(dec, name))
        outs = [getattr(sw, n) for n in sw.out_names]
        # Forwarding module: point-to-point packets pass unchanged.
        wiring.connect(m, outs[0], wiring.flipped(self.o_pkt))
        for j, kind in enumerate(kinds):
            g = gmi_component(kind, c.gmi_config(kind))
            m.submodules[f"gmi_{kind}"] = g
            wiring.connect(m, outs[1 + j], g.i_pkt)
            src = g.o_pkt
            if c.remapped(kind) and GmiKind(kind).fan_out:
                m.submodules[f"remap_{kind}"] = r = TdestRemap(c.data_bits,
                                                               c.member_ids(kind))
                wiring.connect(m, src, r.i_pkt)
                src = r.o_pkt
            wiring.connect(m, src, wiring.flipped(getattr(self, f"o_{kind}")))
            for s in gmi_golden.STATUS:
                m.d.comb += getattr(self, gmi_status_name(kind, s)).eq(getattr(g, f"stat_{s}"))
        return m


class GatewayModel(StatusLines, StreamModel):
    """Stimulus and golden model of ``cluster-gateway``.

    Traffic, all inter-cluster to this cluster: ``--items`` point-to-point packets (1 ..
    max_payload bytes to local kernels 1..kernels), interleaved at random with ``items // 8 +
    1`` rounds of every virtual GMI kernel (messages made by the GMI kernels' own stimulus
    generators, including their wrong lengths, outsiders and overruns); then, with ``fuzz`` =
    N, the stream is N packets of which ~30% are malformed or unknown (every kind of
    :data:`hwgen.cluster.golden.traffic.FUZZ_KINDS`, corrupting point-to-point packets). The stream
    ends with three point-to-point packets, so the counters sampled at ``o_pkt``'s last TLAST
    are final. Expected: :func:`hwgen.cluster.golden.traffic.filter_golden` with the destination
    check, :func:`hwgen.cluster.spec.packet.strip_header`, and
    :func:`hwgen.cluster.golden.collectives.collective_stream` per virtual kernel.
    """

    result_port = "o_pkt"
    latency_from = "i_pkt"
    sim_options = (SimOption("fuzz", "N packets, about 30% malformed or to unknown "
                             "destinations; prints the dropped/delivered counters sampled from "
                             "the simulation beside the golden model's"),)

    #: Sampled after every TLAST on ``o_pkt``: the decoder's counters and the GMI kernels'
    #: drop counters (every kind; a kind not configured reads 0).
    sample_signals = ("status_delivered",) + tuple(status_name(k) for k in DROP_KINDS) + \
        tuple(gmi_status_name(kind, s) for kind in gmi_golden.KINDS for s in GMI_DROPS)

    @classmethod
    def stimulus(cls, config, items, rng, fuzz=None):
        """``{"beats": [beat, ...]}``: the ``i_pkt`` beats of the traffic in the class docstring
        (point-to-point and GMI packets; ``fuzz`` = N: N packets, ~30% malformed or unknown), ending
        with three point-to-point packets."""
        c = config
        models = {"broadcast": BroadcastModel, "scatter": ScatterModel,
                  "gather": GatherModel, "reduce": ReduceModel}
        src_cluster = (c.cluster_id + 1) % 256

        def wrap(p):
            return to_beats(attach_header(replace_src(p), c.cluster_id, p.dest, src_cluster),
                            c.data_bits)

        def replace_src(p):
            return Packet(p.dest, p.src, p.payload)

        local = c.local_list

        def p2p(rng):
            k = local[int(rng.integers(len(local)))]
            return wrap(Packet(k, int(rng.integers(256)),
                               random_payload(rng, 1, c.max_payload)))

        streams = [[wrap(p) for p in models[kind].stimulus(
            c.gmi_config(kind), items // 8 + 1, rng)["packets"]] for kind in c.virtual_kinds]
        n = fuzz if fuzz else items + sum(len(s) for s in streams)
        # Interleave: each packet slot is a GMI packet with probability share.
        gmi_total = sum(len(s) for s in streams)
        share = gmi_total / max(n, 1)
        heads = [0] * len(streams)

        def good(rng):
            left = [j for j, s in enumerate(streams) if heads[j] < len(s)]
            if left and rng.random() < share * 1.2:
                j = left[int(rng.integers(len(left)))]
                heads[j] += 1
                return streams[j][heads[j] - 1]
            return p2p(rng)

        def unknown(rng):
            choice = rng.random()
            k = local[int(rng.integers(len(local)))]
            p = Packet(k, 1, random_payload(rng, 1, c.max_payload))
            if choice < 0.4:            # header byte of no kernel here
                known = set(local) | set(c.virtual_ids.values())
                bad = next(x for x in range(256) if x not in known)
                return to_beats(attach_header(p, c.cluster_id, bad, src_cluster),
                                c.data_bits)
            if choice < 0.7:            # another cluster
                return to_beats(attach_header(p, (c.cluster_id + 3) % 256, k, src_cluster),
                                c.data_bits)
            return to_beats(p, c.data_bits)   # not inter-cluster

        tail = []
        beats = fuzz_stream(rng, max(n - 3, 1), good, unknown, c.data_bits, c.max_beats,
                            fraction=0.3 if fuzz else 0.0, make_victim=p2p)
        for _ in range(3):
            tail += p2p(rng)
        return {"beats": beats + tail}

    @staticmethod
    def inputs(config, stim):
        """``i_pkt``: ``stim["beats"]`` as they are (packet beats, ``last`` on each packet's final
        beat)."""
        return {"i_pkt": stim["beats"]}

    @staticmethod
    def golden(config, stim):
        """``(packets, counts)`` for the stimulus beats: ``packets`` maps ``o_pkt`` to the
        point-to-point packets the decoder passes (header stripped) and ``o_<kind>`` to what each
        virtual kernel sends (:meth:`GatewayConfig.collective`); ``counts`` holds the decoder's
        ``delivered`` and drop counts (:func:`~hwgen.cluster.golden.traffic.filter_golden`) and
        every kind's ``<kind>_drop_*`` GMI counters (0 for kinds not configured)."""
        c = config
        known = set(c.local_list) | set(c.virtual_ids.values())

        def lookup(head):
            ok = head["user"] >> INTER_CLUSTER_BIT & 1 and head["dest"] == c.cluster_id \
                and (head["data"] & 0xFF) in known
            return True if ok else None

        passed, counts = filter_golden(stim["beats"], c.data_bits, c.max_beats, lookup)
        by_id = {v: k for k, v in c.virtual_ids.items()}
        forward, to_gmi = [], {k: [] for k in c.virtual_kinds}
        for beats, _ in passed:
            p = strip_header(from_beats(beats, c.data_bits))
            if p.dest in by_id:
                to_gmi[by_id[p.dest]].append(p)
            else:
                forward.append(p)
        out = {"o_pkt": forward}
        counts.update({f"{kind}_{s}": 0 for kind in gmi_golden.KINDS for s in GMI_DROPS})
        for kind, packets in to_gmi.items():
            sent, status = gmi_golden.gateway_collective(c, kind, packets)
            out[f"o_{kind}"] = sent
            for s in GMI_DROPS:
                counts[f"{kind}_{s}"] = status[s]
        return out, counts

    @classmethod
    def expect(cls, config, stim):
        """:meth:`golden`'s packets as :func:`~hwgen.cluster.spec.packet.to_beats` beats: ``o_pkt``
        the point-to-point packets the decoder passes, header stripped; ``o_<kind>`` per virtual
        kernel
        :meth:`GatewayConfig.collective` of the packets addressed to it, in arrival order."""
        out, _ = cls.golden(config, stim)
        return {port: [b for p in packets for b in to_beats(p, config.data_bits)]
                for port, packets in out.items()}

    @staticmethod
    def cycles_bound(config, stim):
        return 4 * len(stim["beats"]) + 500

    @classmethod
    def report(cls, config, stim, summary, samples):
        _, counts = cls.golden(config, stim)
        names = {"delivered": "status_delivered", **{k: status_name(k) for k in DROP_KINDS},
                 **{f"{kind}_{s}": gmi_status_name(kind, s) for kind in gmi_golden.KINDS
                    for s in GMI_DROPS}}
        return counter_report(counts, summary, samples, names)


#: Simulated by tests/test_sim.py: the acceptance size (5 members, 33 elements), 512-bit TDATA
#: with 16-bit elements, odd members and more local kernels than members, point-to-point
#: only (no virtual kernels), and a builder-style assignment (``groups``: non-contiguous
#: members in any order, remapped; ``local_ids``; ``max_bytes``).
TEST_CONFIGS = (
    {"members": 5, "length": 33},
    {"data_bits": 512, "members": 3, "length": 21, "elem_bits": 16, "op": "max",
     "kernels": 6, "virtual": ["gather", "reduce", "broadcast"], "cluster_id": 9},
    {"members": 2, "length": 5, "kernels": 7, "virtual": [], "cluster_id": 255},
    {"data_bits": 512, "members": 7, "length": 3, "elem_bits": 32, "virtual": ["scatter"],
     "depth": 1},
    {"groups": [{"kind": "broadcast", "id": 9, "members": [2, 5, 3]},
                {"kind": "scatter", "id": 12, "members": [7, 8, 1]}],
     "local_ids": [1, 2, 3, 4, 5, 6, 7, 8], "length": 5, "max_bytes": 40, "cluster_id": 3},
)
