"""Exact top-k priority queues for ChamVS K-selection (Chameleon paper section 4.2.1).

Both queues keep the ``k`` best (distance, id) items of a query, ordered by distance then id
(:func:`hwgen.vecsearch.golden.topk`), take items with a ``last`` flag closing the query, and
then emit the query's best ``min(k, n)`` items in ascending order, ``last`` on the final one.

:class:`SystolicPQ`
    The paper's replace-only register array (Figure 6): ``k`` registers joined by compare-swap
    units, driven by a repeating two-cycle procedure, one input every two cycles.
:class:`InsertPQ`
    A shift-register insertion queue: a comparator per entry against the new item, which is
    inserted at its sorted place while the worse entries shift by one; one input per cycle.

Entries hold ``(valid, dist, id)``; an invalid entry is worse than every item, so a query with
fewer than ``k`` items leaves invalid entries that are simply not emitted.
"""

from dataclasses import dataclass

import numpy as np
from amaranth.hdl import Cat, Const, Module, Mux, Signal
from amaranth.lib import enum, stream, wiring
from amaranth.lib.wiring import In, Out

from .. import contract
from ..config import Config, param
from ..flow.model import StreamModel
from . import golden, layouts

__all__ = ["QueueConfig", "SystolicPQConfig", "InsertPQConfig", "SystolicPQ", "InsertPQ",
           "QueueModel"]


@dataclass(frozen=True)
class QueueConfig(Config):
    """Configuration shared by the exact top-k queues: items kept per query (``k``) and the distance
    and id widths."""
    k: int = param(16, "items kept and emitted per query", lo=1, hi=1024)
    dist_bits: int = param(32, "bits of a distance", lo=1, hi=64)
    id_bits: int = param(32, "bits of an id", lo=1, hi=64)

    @property
    def key_bits(self):
        """Bits of an entry's sort key, distance above id: ``dist_bits + id_bits``."""
        return self.dist_bits + self.id_bits


@dataclass(frozen=True)
class SystolicPQConfig(QueueConfig):
    """Configuration of :class:`SystolicPQ`, the paper's systolic queue (one item every two
    cycles)."""
    @dataclass(frozen=True)
    class Workload(contract.Workload):
        """The workload of :meth:`cycle_model` (None: steady-state figures only)."""
        queries: tuple = None     # item counts of back-to-back queries

    def cycle_model(self, workload):
        """Cycle model (no stalls): one item every two cycles (``2n - 1`` cycles for ``n``
        items); after a query's last item, ``k`` compare-swap phases sort the array, then one
        result per cycle. ``queries``: item counts of back-to-back queries."""
        queries = workload.queries
        model = {"items_per_cycle": 0.5, "drain_cycles": self.k}
        if queries is not None:
            model["cycles"] = sum(2 * n - 1 + self.k + min(n, self.k) for n in queries)
        return model


@dataclass(frozen=True)
class InsertPQConfig(QueueConfig):
    """Configuration of :class:`InsertPQ`, the shift-register insertion queue (one item per
    cycle)."""
    @dataclass(frozen=True)
    class Workload(contract.Workload):
        """The workload of :meth:`cycle_model` (None: steady-state figures only)."""
        queries: tuple = None     # item counts of back-to-back queries

    def cycle_model(self, workload):
        """Cycle model (no stalls): one item per cycle; a query's results follow its last
        item after two cycles, one per cycle. ``queries``: item counts of back-to-back
        queries."""
        queries = workload.queries
        model = {"items_per_cycle": 1.0, "drain_cycles": 2}
        if queries is not None:
            model["cycles"] = sum(n + 2 + min(n, self.k) for n in queries)
        return model


class _State(enum.Enum, shape=2):
    RUN = 0
    DRAIN = 1
    EMIT = 2


class _Queue(wiring.Component):
    """Shared ports and entry registers of the two queues.

    Parameters
    ----------
    config : QueueConfig
    markers : bool
        Items carry an ``empty`` flag (see :func:`layouts.item`); used inside ``hier-pq``.

    Members
    -------
    i_items : ``In(stream.Signature(item(dist_bits, id_bits, markers)))``
    o_topk : ``Out(stream.Signature(item(dist_bits, id_bits, markers)))``
    """

    def __init__(self, config, *, markers=False):
        self.config = config
        self._markers = markers
        layout = layouts.item(config.dist_bits, config.id_bits, markers)
        super().__init__({"i_items": In(stream.Signature(layout)),
                          "o_topk": Out(stream.Signature(layout))})

    def _entries(self):
        c = self.config
        valid = [Signal(name=f"valid{i}") for i in range(c.k)]
        key = [Signal(c.key_bits, name=f"key{i}") for i in range(c.k)]
        return valid, key

    @staticmethod
    def _better(va, ka, vb, kb):
        """Item a comes before item b: valid, and b invalid or a's (dist, id) smaller."""
        return va & (~vb | (ka < kb))

    def _emit(self, m, state, valid, key, head, follower):
        """Drive ``o_topk`` from entry ``head`` while emitting; ``follower`` is the entry that
        moves into ``head`` on each handshake (its validity tells whether this is the last).
        Returns the handshake signal."""
        c = self.config
        o = self.o_topk
        emitting = state == _State.EMIT
        m.d.comb += [
            o.payload.dist.eq(key[head][c.id_bits:]),
            o.payload.id.eq(key[head][:c.id_bits]),
            o.payload.last.eq(~valid[follower] if c.k > 1 else 1),
        ]
        if self._markers:   # a query with no item at all emits one empty marker
            m.d.comb += [o.valid.eq(emitting),
                         o.payload.empty.eq(~valid[head])]
            with m.If(~valid[head]):
                m.d.comb += o.payload.last.eq(1)
        else:
            m.d.comb += o.valid.eq(emitting & valid[head])
        shake = o.valid & o.ready
        with m.If(shake & o.payload.last):
            m.d.sync += state.eq(_State.RUN)
        return shake

    def _input(self):
        """(item present and not an empty marker, its key)."""
        p = self.i_items.payload
        present = ~p.empty if self._markers else 1
        return present, Cat(p.id, p.dist)


class SystolicPQ(_Queue):
    """The paper's systolic priority queue: replace-only, one input every two cycles.

    Parameters and members as :class:`_Queue` (``config`` a :class:`SystolicPQConfig`).

    Operation
    ---------
    ``k`` entry registers ``e[0..k-1]``, ``e[0]`` the worst, joined by compare-swap units
    between neighbours (the worse of a pair moves left). Cycles alternate:

    * odd cycle: ``e[0]`` is replaced by the incoming item if that is better (replace-only:
      the worst item leaves), while the pairs ``(1,2), (3,4), ...`` compare and swap;
    * even cycle: the pairs ``(0,1), (2,3), ...`` compare and swap.

    The worst item therefore reaches ``e[0]`` before each insertion and the best drifts right.
    After a query's ``last`` item, ``k`` more phases sort the array completely (odd-even
    transposition sort), then the items leave from ``e[k-1]`` while the array shifts right,
    best first. The queue is then empty and ready for the next query.

    While no item is offered the queue waits in an odd cycle (skipping idle odd/even pairs changes
    nothing), so an item arriving after a gap is taken at once.

    Timing and backpressure: ``i_items.ready`` is high on odd cycles only (one item every two
    cycles) and stays low from a query's last item until its results have been emitted (``k``
    cycles of sorting, then one result per cycle while ``o_topk`` is ready): input is never
    lost, it waits. ``o_topk`` is driven from registers.
    """

    def elaborate(self, platform):
        c = self.config
        k = c.k
        m = Module()
        valid, key = self._entries()
        state = Signal(_State)
        odd = Signal(init=1)             # odd cycle: insertion + pairs (1,2), (3,4), ...
        drained = Signal(range(k + 1))

        sorting = (state == _State.RUN) | (state == _State.DRAIN)
        m.d.comb += self.i_items.ready.eq((state == _State.RUN) & odd)
        take = self.i_items.valid & self.i_items.ready
        present, x_key = self._input()
        insert = take & present & self._better(1, x_key, valid[0], key[0])

        # Phases advance every cycle, except that an odd cycle without an item is held: that
        # skips odd/even pairs in which nothing was inserted, so an item always finds the queue
        # ready (two queues fed alternately then take one item per cycle together).
        with m.If(sorting & ~((state == _State.RUN) & odd & ~self.i_items.valid)):
            m.d.sync += odd.eq(~odd)
        with m.If(take & self.i_items.payload.last):
            m.d.sync += [state.eq(_State.DRAIN), drained.eq(0)]
        with m.If(state == _State.DRAIN):
            m.d.sync += drained.eq(drained + 1)
            with m.If(drained == k - 1):
                m.d.sync += state.eq(_State.EMIT)

        # Compare-swap unit of pair (j, j+1): swap when the left entry is the better one.
        swap = []
        for j in range(k - 1):
            active = sorting & (odd if j % 2 else ~odd)
            swap.append(Signal(name=f"swap{j}"))
            m.d.comb += swap[-1].eq(active & self._better(valid[j], key[j],
                                                          valid[j + 1], key[j + 1]))

        shift = self._emit(m, state, valid, key, head=k - 1, follower=max(k - 2, 0))
        with m.If(shift & self.o_topk.payload.last):
            m.d.sync += odd.eq(1)

        for i in range(k):
            with m.If(shift):
                if i == 0:
                    m.d.sync += valid[0].eq(0)
                else:
                    m.d.sync += [valid[i].eq(valid[i - 1]), key[i].eq(key[i - 1])]
            if i > 0:
                with m.Elif(swap[i - 1]):
                    m.d.sync += [valid[i].eq(valid[i - 1]), key[i].eq(key[i - 1])]
            if i < k - 1:
                with m.Elif(swap[i]):
                    m.d.sync += [valid[i].eq(valid[i + 1]), key[i].eq(key[i + 1])]
            if i == 0:
                with m.Elif(insert):
                    m.d.sync += [valid[0].eq(1), key[0].eq(x_key)]
        return m


class InsertPQ(_Queue):
    """Shift-register insertion queue: exact top-k, one input per cycle.

    Parameters and members as :class:`_Queue` (``config`` an :class:`InsertPQConfig`).

    Operation
    ---------
    Entries ``e[0..k-1]`` are kept sorted, ``e[0]`` the best. An accepted item is registered
    (``y``) and compared with every entry; the comparison results are corrected for the item
    inserted meanwhile (``x``: an entry then holds itself, ``x``, or its left neighbour) and
    registered, so the next cycle inserts ``y`` from registered decisions: the entries it
    beats shift one place towards ``e[k-1]`` (the last one leaves) and the item takes the
    place of the first of them. After a query's ``last`` item is inserted the items leave from
    ``e[0]`` while the array shifts towards it, best first.

    Timing and backpressure: one item per cycle; the first result follows the last item by
    two cycles. ``i_items.ready`` drops from the cycle a last item is accepted until the
    query's results have been emitted (one per cycle while ``o_topk`` is ready). ``o_topk`` is
    driven from registers. Every register-to-register path holds one key comparison and one
    multiplexer, or a registered decision fanning out to one entry.
    """

    def elaborate(self, platform):
        c = self.config
        k = c.k
        m = Module()
        valid, key = self._entries()
        state = Signal(_State)

        # Two input registers: y, the accepted item, compared with the entries; x, the item
        # inserted this cycle, whose comparison results were registered one cycle earlier.
        y_valid, y_last = Signal(name="y_valid"), Signal(name="y_last")
        x_valid, x_last = Signal(name="x_valid"), Signal(name="x_last")
        x_key = Signal(c.key_bits, name="x_key")
        m.d.comb += self.i_items.ready.eq((state == _State.RUN) & ~(y_valid & y_last)
                                          & ~(x_valid & x_last))
        take = self.i_items.valid & self.i_items.ready
        present, in_key = self._input()
        # Validity rides in the comparison: y held as Cat(key, 0, ~valid) is smaller than an
        # entry as Cat(key, ~valid) exactly when y is valid and beats the entry, so nothing
        # but the selection below follows the carry chain.
        y_cmp = Signal(c.key_bits + 2, name="y_cmp", init=1 << (c.key_bits + 1))
        y_key = y_cmp[:c.key_bits]
        m.d.sync += [y_valid.eq(take & present), y_cmp.eq(Cat(in_key, Const(0, 1),
                                                               ~(take & present))),
                     y_last.eq(take & self.i_items.payload.last),
                     x_valid.eq(y_valid), x_key.eq(y_key), x_last.eq(y_last)]
        with m.If(x_last):
            m.d.sync += state.eq(_State.EMIT)

        y_beats_x = Signal(name="y_beats_x")
        m.d.comb += y_beats_x.eq(y_cmp < x_key)
        y_beats = [Signal(name=f"y_beats{i}") for i in range(k)]
        # beats[i] (registered): x, the item inserted this cycle, beats entry i. It is computed
        # while x is y: whether y beats what entry i holds once the previous item is inserted:
        # entry i itself, that item, or entry i-1 (shifted by it).
        beats = [Signal(name=f"beats{i}") for i in range(k)]
        for i in range(k):
            m.d.comb += y_beats[i].eq(y_cmp < Cat(key[i], ~valid[i]))
            before = y_beats[i - 1] if i else y_beats_x
            m.d.sync += beats[i].eq(Mux(beats[i], Mux(beats[i - 1] if i else 0, before,
                                                      y_beats_x), y_beats[i]))

        shift = self._emit(m, state, valid, key, head=0, follower=min(1, k - 1))
        for i in range(k):
            # Entry i changes when the queue shifts out or the item beats it; it then takes its
            # right neighbour (shift out), its left neighbour (the item also beats that one) or
            # the item itself.
            later = (valid[i + 1], key[i + 1]) if i < k - 1 else (0, 0)
            with m.If(shift):
                m.d.sync += [valid[i].eq(later[0]), key[i].eq(later[1])]
            with m.Elif(beats[i]):
                if i == 0:
                    m.d.sync += [valid[i].eq(1), key[i].eq(x_key)]
                else:
                    m.d.sync += [valid[i].eq(Mux(beats[i - 1], valid[i - 1], 1)),
                                 key[i].eq(Mux(beats[i - 1], key[i - 1], x_key))]
        return m


class QueueModel(StreamModel):
    """Stream-level golden model and stimulus shared by ``systolic-pq`` and ``insert-pq``."""

    result_port = "o_topk"
    latency_from = "i_items"

    @staticmethod
    def query_lengths(items, k, rng):
        """Split ``items`` into queries: single items, fewer than ``k``, and several times k."""
        lengths, left = [], items
        while left > 0:
            kind = rng.integers(0, 4)
            n = [1, int(rng.integers(1, k + 1)), int(rng.integers(k, 4 * k + 2)),
                 int(rng.integers(1, 4 * k + 2))][kind]
            n = min(n, left)
            lengths.append(n)
            left -= n
        return lengths

    @classmethod
    def stimulus(cls, config, items, rng):
        """Queries of :meth:`query_lengths`; half of them draw distances from a narrow range
        (many ties, broken by id) and include the largest distance and id."""
        c = config
        queries = []
        dmax, imax = (1 << c.dist_bits) - 1, (1 << c.id_bits) - 1
        for n in cls.query_lengths(items, c.k, rng):
            if rng.random() < 0.5:
                d = rng.integers(0, min(dmax, max(3, n // 4)), size=n, endpoint=True,
                                 dtype=np.uint64)
            else:
                d = rng.integers(0, dmax, size=n, endpoint=True, dtype=np.uint64)
            ids = rng.integers(0, imax, size=n, endpoint=True, dtype=np.uint64)
            if n > 2:
                d[rng.integers(0, n)] = dmax
                ids[rng.integers(0, n)] = imax
            queries.append((d, ids))
        return {"queries": queries}

    @staticmethod
    def inputs(config, stim):
        """``i_items``: one beat per item, queries in order, ``dist`` and ``id``, with ``last`` on
        each query's final item."""
        return {"i_items": [{"dist": int(d), "id": int(i), "last": int(j == len(ds) - 1)}
                            for ds, ids in stim["queries"]
                            for j, (d, i) in enumerate(zip(ds, ids))]}

    @staticmethod
    def expect(config, stim):
        """``o_topk``: per query its ``min(k, n)`` smallest items, ascending by (distance, id)
        (:func:`hwgen.vecsearch.golden.topk`, exact for 64-bit values), as ``dist``/``id`` beats
        with ``last`` on the query's final result."""
        out = []
        for ds, ids in stim["queries"]:
            d, i = _topk_u64(ds, ids, config.k)
            out += [{"dist": int(a), "id": int(b), "last": int(j == len(d) - 1)}
                    for j, (a, b) in enumerate(zip(d, i))]
        return {"o_topk": out}

    @staticmethod
    def cycles_bound(config, stim):
        return sum(2 * len(d) + 2 * config.k + 4 for d, _ in stim["queries"])


def _topk_u64(dists, ids, k):
    """:func:`golden.topk` for values that may not fit int64 (64-bit distances or ids)."""
    if max(int(np.max(dists, initial=0)), int(np.max(ids, initial=0))) < (1 << 63):
        return golden.topk(dists.astype(np.int64), ids.astype(np.int64), k)
    order = sorted(range(len(dists)), key=lambda j: (int(dists[j]), int(ids[j])))[:k]
    return [int(dists[j]) for j in order], [int(ids[j]) for j in order]
