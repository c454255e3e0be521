"""Approximate hierarchical priority queue (AHPQ, Chameleon paper section 4.2.2).

``streams`` item streams (one per PQ decoding unit) feed level-one (L1) queues truncated to
``l1_len`` entries; at the end of a query their survivors are merged into one level-two (L2)
queue of length ``k``, whose contents are the result. The result equals the exact top-k unless
some L1 queue received more than ``l1_len`` of the true top-k items; ``l1_len`` defaults to the
smallest length for which that happens in at most 1% of queries
(:func:`hwgen.vecsearch.sizing.l1_queue_length`). The golden model
:func:`hwgen.vecsearch.golden.hier_topk` reproduces the truncation exactly.
"""

from dataclasses import dataclass

import numpy as np
from amaranth.hdl import Module, Mux, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from ..config import Config, param
from ..errors import ConfigError
from ..flow.model import StreamModel
from ..lib.pipeline import SkidBuffer
from . import golden, layouts
from .queues import InsertPQ, InsertPQConfig, SystolicPQ, SystolicPQConfig
from .sizing import l1_queue_length

__all__ = ["HierPQConfig", "HierPQ", "HierPQModel", "Alternator", "QueueMerger"]

KINDS = ("systolic", "insert")


@dataclass(frozen=True)
class HierPQConfig(Config):
    """Configuration of the hierarchical priority queue :class:`HierPQ`: input streams, results per
    query (``k``, the L2 queue), the L1 queue length and kind, and the item field widths."""
    streams: int = param(4, "input streams (PQ decoding units)", lo=1, hi=64)
    k: int = param(16, "results per query (L2 queue length)", lo=1, hi=1024)
    l1_len: int = param(0, "L1 queue length (0 = smallest meeting 99% exact queries)",
                        lo=0, hi=1024)
    queue: str = param("insert", "queue kind: insert (one single-cycle L1 queue per stream) "
                       "or systolic (two L1 queues per stream, as in the paper)",
                       choices=KINDS)
    dist_bits: int = param(32, "bits of a distance", lo=1, hi=62)
    id_bits: int = param(32, "bits of an id", lo=1, hi=62)

    def check(self):
        if self.l1_len > self.k:
            raise ConfigError("l1_len", f"must be in 0..k={self.k}", value=self.l1_len)

    @property
    def queues_per_stream(self):
        """L1 queues per input stream: 2 for systolic queues (items dealt alternately), else 1."""
        return 2 if self.queue == "systolic" else 1

    @property
    def l1_queues(self):
        """L1 queues in all: ``streams * queues_per_stream``."""
        return self.streams * self.queues_per_stream

    @property
    def l1(self):
        """The L1 queue length in use."""
        return self.l1_len or l1_queue_length(self.k, self.l1_queues)

    def queue_config(self, k):
        """The configuration of one queue of the configured kind keeping ``k`` items (an L1 queue:
        :attr:`l1`; the L2 queue: ``k``)."""
        cls = SystolicPQConfig if self.queue == "systolic" else InsertPQConfig
        return cls(k=k, dist_bits=self.dist_bits, id_bits=self.id_bits)

    def derived(self):
        return {"l1_queues": self.l1_queues, "l1_len": self.l1,
                "l1_entries": self.l1_queues * self.l1, "l2_entries": self.k,
                "exact_hierarchy_entries": self.l1_queues * self.k + self.k}


class Alternator(wiring.Component):
    """Deals one stream's items alternately to two queues, closing both at the end of a query.

    Parameters
    ----------
    dist_bits, id_bits : int
    markers : bool
        ``i`` carries ``empty`` markers: those without ``last`` are dropped (they do not take a
        turn); one with ``last`` closes the query like an item.

    Members
    -------
    i : ``In(stream.Signature(item(dist_bits, id_bits, markers)))``
    o0, o1 : ``Out(stream.Signature(item(dist_bits, id_bits, markers=True)))``
        Items 0, 2, 4, ... of each query go to ``o0``, items 1, 3, ... to ``o1``. A query's last
        beat carries ``last`` to its queue; the other queue then receives an empty marker with
        ``last`` so that it closes too (``i`` waits meanwhile).

    Combinational: an item passes in the cycle its queue is ready.
    """

    def __init__(self, dist_bits, id_bits, *, markers=False):
        self._markers = markers
        layout = layouts.item(dist_bits, id_bits, markers=True)
        super().__init__({
            "i": In(stream.Signature(layouts.item(dist_bits, id_bits, markers))),
            "o0": Out(stream.Signature(layout)),
            "o1": Out(stream.Signature(layout)),
        })

    def elaborate(self, platform):
        m = Module()
        turn = Signal()            # queue of the next item
        closing = Signal()         # the last beat went out; the other queue gets a marker
        p = self.i.payload
        empty = p.empty if self._markers else 0
        skip = Signal()            # an empty beat without last: dropped
        m.d.comb += skip.eq(empty & ~p.last)
        outs = (self.o0, self.o1)
        for n, o in enumerate(outs):
            m.d.comb += [o.payload.dist.eq(p.dist), o.payload.id.eq(p.id)]
            with m.If(closing):
                m.d.comb += [o.valid.eq(turn == n), o.payload.empty.eq(1),
                             o.payload.last.eq(1)]
            with m.Else():
                m.d.comb += [o.valid.eq(self.i.valid & ~skip & (turn == n)),
                             o.payload.empty.eq(empty), o.payload.last.eq(p.last)]
        ready = Signal()
        m.d.comb += [ready.eq(Mux(turn, outs[1].ready, outs[0].ready)),
                     self.i.ready.eq(~closing & (ready | skip))]
        with m.If(closing):
            with m.If(ready):
                m.d.sync += [closing.eq(0), turn.eq(0)]
        with m.Elif(self.i.valid & ready & ~skip):
            m.d.sync += turn.eq(~turn)
            with m.If(p.last):
                m.d.sync += closing.eq(1)
        return m


class QueueMerger(wiring.Component):
    """Drains ``n`` queues' results of one query, one queue after the other, into one stream.

    Members
    -------
    i0 .. i{n-1} : ``In(stream.Signature(item(..., markers=True)))``
        Each queue's results, ``last`` on its final beat (an empty marker if it had none).
    o : ``Out(stream.Signature(item(..., markers=True)))``
        All items; ``last`` only on the final beat of queue ``n-1``. Empty markers of other
        queues pass with ``last`` cleared: a queue ignores an empty item, and each queue then
        takes one beat whether it has results or not.

    Combinational pass-through of the selected queue (a one-hot select register).
    """

    def __init__(self, n, dist_bits, id_bits):
        self._n = n
        layout = layouts.item(dist_bits, id_bits, markers=True)
        members = {f"i{q}": In(stream.Signature(layout)) for q in range(n)}
        members["o"] = Out(stream.Signature(layout))
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        n = self._n
        # One-hot select: each bit gates only its own queue's beat, so no select register fans
        # out to a whole n-way payload multiplexer. The payload gates read an inverted copy
        # (different inputs, so synthesis keeps it apart), the handshakes the select itself.
        sel = Signal(n, init=1)
        sel_n = Signal(n, init=~1 & ((1 << n) - 1))
        ins = [getattr(self, f"i{q}") for q in range(n)]
        gated, valids, ends = [], [], []
        for q, i in enumerate(ins):
            final = q == n - 1
            on = sel[q]
            beat = Signal.like(i.payload, name=f"beat{q}")     # last only from the final queue
            m.d.comb += [i.ready.eq(on & self.o.ready), beat.eq(i.payload),
                         beat.last.eq(i.payload.last & final)]
            gated.append(Mux(~sel_n[q], beat.as_value(), 0))
            valids.append(on & i.valid)
            ends.append(on & i.valid & self.o.ready & i.payload.last)
        payload = gated[0]
        for g in gated[1:]:
            payload = payload | g
        advance = ends[0]
        for e in ends[1:]:
            advance = advance | e
        valid = valids[0]
        for v in valids[1:]:
            valid = valid | v
        m.d.comb += [self.o.payload.eq(payload), self.o.valid.eq(valid)]
        with m.If(advance):
            m.d.sync += [sel.eq(sel.rotate_left(1)), sel_n.eq(~sel.rotate_left(1))]
        return m


class HierPQ(wiring.Component):
    """Approximate hierarchical priority queue.

    Parameters
    ----------
    config : HierPQConfig
    markers : bool
        Input items carry ``empty`` markers (a stream may then contribute nothing to a query
        but a closing marker); used inside the ChamVS node.

    Members
    -------
    i_s0 .. i_s{streams-1} : ``In(stream.Signature(item(dist_bits, id_bits, markers)))``
        One item stream per PQ decoding unit; each stream's query ends with a beat whose
        ``last`` is set (without markers, every stream contributes at least one item).
    o_topk : ``Out(stream.Signature(item(dist_bits, id_bits)))``
        The query's ``min(k, items)`` best L1 survivors, ascending, ``last`` on the final one.

    Structure
    ---------
    ``queue="systolic"``: per stream an :class:`Alternator` and two :class:`SystolicPQ` of
    length ``l1`` (the paper's pairing: each takes one item every two cycles, together one per
    cycle); L2 is a :class:`SystolicPQ` of length ``k``. ``queue="insert"``: one
    :class:`InsertPQ` of length ``l1`` per stream and an :class:`InsertPQ` L2.

    Timing: every stream takes one item per cycle. At the end of a query the L1 queues sort
    and emit their survivors, each through a :class:`~hwgen.lib.pipeline.SkidBuffer` of its
    own (so the merger's select reaches no queue's shift enables), which a
    :class:`QueueMerger` feeds into L2 one queue after the other through one more
    :class:`~hwgen.lib.pipeline.SkidBuffer` (one item per cycle; every second cycle for a
    systolic L2; two more cycles of latency in all); the streams wait (backpressure) until
    their L1 queues have been drained.
    """

    def __init__(self, config, *, markers=False):
        self.config = c = config
        self._markers = markers
        members = {f"i_s{s}": In(stream.Signature(layouts.item(c.dist_bits, c.id_bits,
                                                                 markers)))
                   for s in range(c.streams)}
        members["o_topk"] = Out(stream.Signature(layouts.item(c.dist_bits, c.id_bits)))
        super().__init__(members)

    def elaborate(self, platform):
        c = self.config
        m = Module()
        queue_cls = SystolicPQ if c.queue == "systolic" else InsertPQ
        l1_cfg = c.queue_config(c.l1)
        item = layouts.item(c.dist_bits, c.id_bits, markers=True)
        m.submodules.merge = merge = QueueMerger(c.l1_queues, c.dist_bits, c.id_bits)
        q = 0
        for s in range(c.streams):
            src = getattr(self, f"i_s{s}")
            queues = []
            for j in range(c.queues_per_stream):
                queues.append(queue_cls(l1_cfg, markers=True))
                m.submodules[f"l1_{s}_{j}"] = queues[-1]
            if c.queue == "systolic":
                m.submodules[f"deal{s}"] = deal = Alternator(c.dist_bits, c.id_bits,
                                                             markers=self._markers)
                wiring.connect(m, wiring.flipped(src), deal.i)
                wiring.connect(m, deal.o0, queues[0].i_items)
                wiring.connect(m, deal.o1, queues[1].i_items)
            else:
                l1 = queues[0].i_items
                m.d.comb += [l1.valid.eq(src.valid), src.ready.eq(l1.ready),
                             l1.payload.dist.eq(src.payload.dist),
                             l1.payload.id.eq(src.payload.id),
                             l1.payload.last.eq(src.payload.last)]
                if self._markers:
                    m.d.comb += l1.payload.empty.eq(src.payload.empty)
            for queue in queues:
                # A skid buffer per L1 queue: the merger's select reaches no queue's shift
                # enables, only this buffer's registers.
                m.submodules[f"l1_out{q}"] = out = SkidBuffer(item)
                wiring.connect(m, queue.o_topk, out.i)
                wiring.connect(m, out.o, getattr(merge, f"i{q}"))
                q += 1
        m.submodules.l2 = l2 = queue_cls(c.queue_config(c.k), markers=True)
        # The merger's queue select and payload multiplexer end in a register, not in L2's
        # comparators, and L2's ready reaches the L1 queues' shift enables from a register.
        m.submodules.l2_in = l2_in = SkidBuffer(item)
        wiring.connect(m, merge.o, l2_in.i)
        wiring.connect(m, l2_in.o, l2.i_items)
        o = self.o_topk
        m.d.comb += [o.valid.eq(l2.o_topk.valid), l2.o_topk.ready.eq(o.ready),
                     o.payload.dist.eq(l2.o_topk.payload.dist),
                     o.payload.id.eq(l2.o_topk.payload.id),
                     o.payload.last.eq(l2.o_topk.payload.last)]
        return m


class HierPQModel(StreamModel):
    """Stream-level golden model and stimulus of :class:`HierPQ`."""

    result_port = "o_topk"

    @staticmethod
    def stimulus(config, items, rng, skew=0.25):
        """Queries of ``items`` items in total over all streams. Each stream gets at least one
        item per query. A fraction ``skew`` of the queries put their smallest distances in one
        stream, so that truncated L1 queues do lose top-k items and the truncation itself is
        checked; the others draw distances independently (with ties)."""
        c = config
        dmax, imax = (1 << c.dist_bits) - 1, (1 << c.id_bits) - 1
        queries, left = [], items
        while left >= c.streams:
            n = int(min(left, rng.integers(c.streams, c.streams * (3 * c.k + 2) + 1)))
            left -= n
            counts = 1 + rng.multinomial(n - c.streams, [1 / c.streams] * c.streams)
            streams = []
            skewed = rng.random() < skew
            hot = int(rng.integers(0, c.streams))
            for s, cnt in enumerate(counts):
                top = min(dmax, max(3, n // 2))
                d = rng.integers(0, top, size=cnt, endpoint=True, dtype=np.uint64)
                if skewed and s != hot:
                    d = np.minimum(d + np.uint64(top // 2), np.uint64(dmax))
                ids = rng.integers(0, imax, size=cnt, endpoint=True, dtype=np.uint64)
                streams.append((d, ids))
            queries.append(streams)
        return {"queries": queries}

    @staticmethod
    def inputs(config, stim):
        """``i_s0`` .. ``i_s{streams-1}``: per query, each stream's items (at least one) as
        ``dist``/``id`` beats, ``last`` on the stream's final item of the query."""
        beats = {f"i_s{s}": [] for s in range(config.streams)}
        for streams in stim["queries"]:
            for s, (d, ids) in enumerate(streams):
                beats[f"i_s{s}"] += [{"dist": int(a), "id": int(b), "last": int(j == len(d) - 1)}
                                     for j, (a, b) in enumerate(zip(d, ids))]
        return beats

    @staticmethod
    def expect(config, stim):
        """``o_topk``: per query :func:`hwgen.vecsearch.golden.hier_topk` (L1 queues keeping ``l1``
        items, ``queues_per_stream`` per stream, then the L2 top ``k``), ascending by (distance,
        id), as ``dist``/``id`` beats with ``last`` on the query's final result."""
        out = []
        for streams in stim["queries"]:
            d, i = golden.hier_topk(streams, config.k, config.l1, config.queues_per_stream)
            out += [{"dist": int(a), "id": int(b), "last": int(j == len(d) - 1)}
                    for j, (a, b) in enumerate(zip(d, i))]
        return {"o_topk": out}

    @staticmethod
    def cycles_bound(config, stim):
        per_query = 4 * (config.l1_queues * config.l1 + config.k) + 3 * config.k + 16
        return sum(4 * sum(len(d) for d, _ in q) + per_query for q in stim["queries"])

