"""ChamVS distance lookup-table (LUT) construction unit (Chameleon paper sections 2.2 and 4).

For each (query, probed IVF list) pair the unit forms the residual ``query - coarse centroid``
and computes, for every PQ sub-space ``i`` and centroid ``r``, the squared L2 distance between the
residual's sub-vector ``i`` and centroid ``C[i][r]``. It emits the table as 256 rows (the layout
the PQ decoding units load), row ``r`` holding ``m`` entries, each
``sat(floor(dist / 2**lut_shift), lut_bits)``.
"""

from dataclasses import dataclass

from amaranth.hdl import Module, Signal, signed, unsigned
from amaranth.lib import data, memory, stream, wiring
from amaranth.lib.wiring import In, Out

from .. import contract
from ..config import Config, param
from ..errors import ConfigError
from ..flow.model import StreamModel
from ..lib.pipeline import CreditBuffer, adder_tree, delay
from . import golden, layouts

__all__ = ["LUTBuilderConfig", "LUTBuilder", "LUTBuilderModel"]


@dataclass(frozen=True)
class LUTBuilderConfig(Config):
    """Configuration of the distance-LUT builder :class:`LUTBuilder`: vector dimension, PQ
    sub-spaces, component bits, the shift and saturation of LUT entries, and sub-spaces computed per
    cycle."""
    dim: int = param(128, "vector dimension D", lo=1, hi=4096)
    m: int = param(16, "PQ sub-spaces (D % m == 0)", lo=1, hi=256)
    elem_bits: int = param(8, "bits of a signed vector component", lo=2, hi=16)
    lut_shift: int = param(0, "right shift applied to each squared distance", lo=0, hi=48)
    lut_bits: int = param(16, "bits of a LUT entry; larger values saturate", lo=1, hi=32)
    sub_par: int = param(0, "sub-spaces computed per cycle (0 = all m: one row per cycle); "
                            "a row takes ceil(m / sub_par) cycles", lo=0, hi=256)

    def check(self):
        if self.dim % self.m:
            raise ConfigError("m", f"must divide dim={self.dim} (allowed: "
                              + ", ".join(str(d) for d in range(1, min(self.dim, 256) + 1)
                                          if self.dim % d == 0) + ")", value=self.m)
        if self.sub_par > self.m:
            raise ConfigError("sub_par", f"must be in 0..m={self.m}", value=self.sub_par)

    @property
    def dsub(self):
        """Components per sub-vector: ``dim / m``."""
        return self.dim // self.m

    @property
    def lanes(self):
        """Sub-spaces computed per cycle: ``sub_par``, or ``m`` when it is 0."""
        return self.sub_par or self.m

    @property
    def steps(self):
        """Cycles per LUT row."""
        return -(-self.m // self.lanes)

    @property
    def sq_bits(self):
        """Width of one squared difference (difference spans 2**(elem_bits+1) - 1)."""
        return 2 * self.elem_bits + 2

    @property
    def tree_latency(self):
        """Pipeline stages (cycles) of the adder tree over a sub-vector's ``dsub`` squared
        differences: ``ceil(log2(dsub))``."""
        return (self.dsub - 1).bit_length()

    @property
    def latency(self):
        """Cycles from issuing a row's last step to the row entering the output FIFO:
        memory read, read-data register, difference (the squarer's input register), square
        (its output register), adder tree, shift/saturate."""
        return 5 + self.tree_latency

    @dataclass(frozen=True)
    class Workload(contract.Workload):
        """The workload of :meth:`cycle_model` (None: steady-state figures only)."""
        pairs: int = None     # query pairs (query, centroid) to build LUTs for

    def cycle_model(self, workload):
        """Cycle model (no stalls): rows per cycle, latency from a query pair's acceptance to
        its first row, and with ``pairs`` the cycles from the first centroid beat to the last
        row (centroid load of ``m * 256`` beats first), as ``hwgen sim`` measures them."""
        pairs = workload.pairs
        latency = self.steps + self.latency + 2
        model = {"rows_per_cycle": 1 / self.steps, "cycles_per_lut": 256 * self.steps,
                 "latency_cycles": latency, "centroid_load_cycles": 256 * self.m}
        if pairs:
            model["cycles"] = 256 * self.m + 256 * self.steps * pairs + self.latency + 3
        return model

    def derived(self):
        return {"dsub": self.dsub, "lanes": self.lanes, "cycles_per_row": self.steps,
                "cycles_per_lut": 256 * self.steps, "squarers": self.lanes * self.dsub,
                "pipeline_latency": self.latency,
                "centroid_memory_bits": 256 * self.steps * self.lanes * self.dsub
                * (self.elem_bits + 1)}


class LUTBuilder(wiring.Component):
    """Distance-LUT construction unit.

    Parameters
    ----------
    config : LUTBuilderConfig

    Members
    -------
    i_centroids : ``In(stream.Signature(pq_centroid(dsub, elem_bits)))``
        PQ centroids, ``m * 256`` beats in faiss order (sub-space ``i`` major, centroid ``r``
        minor). Accepted only while no query is being processed; queries wait until a complete
        set has been loaded. Components are ``elem_bits + 1`` bits (residual range).
    i_query : ``In(stream.Signature(query_pair(dim, elem_bits)))``
        A query vector and the coarse centroid of the list it probes.
    o_lut : ``Out(stream.Signature(lut_row(m, lut_bits)))``
        256 rows per query pair, row 0 first.

    Timing
    ------
    ``lanes = sub_par or m`` sub-spaces are computed per cycle by ``lanes * dsub`` squarers, so a
    row takes ``ceil(m / lanes)`` cycles and a LUT ``256 * ceil(m / lanes)``; consecutive query
    pairs follow back to back. Latency from a pair's acceptance to its first row on ``o_lut`` is
    ``ceil(m / lanes) + 7 + ceil(log2 dsub)`` cycles. Registers: the centroid memories' read
    data (no arithmetic follows a block RAM output in the same cycle), each squarer's input
    and product (reset-less, so that the ECP5 flow packs them into the MULT18X18D), every
    adder-tree level and the saturated value.

    Backpressure: ``o_lut`` may stall at any time; row computation pauses when the output FIFO
    could fill (credits), never combinationally from ``o_lut.ready``.
    """

    def __init__(self, config):
        self.config = c = config
        super().__init__({
            "i_centroids": In(stream.Signature(layouts.pq_centroid(c.dsub, c.elem_bits))),
            "i_query": In(stream.Signature(layouts.query_pair(c.dim, c.elem_bits))),
            "o_lut": Out(stream.Signature(layouts.lut_row(c.m, c.lut_bits))),
        })

    def elaborate(self, platform):
        c = self.config
        m = Module()
        lanes, steps, dsub, eb = c.lanes, c.steps, c.dsub, c.elem_bits
        centroid_shape = data.ArrayLayout(signed(eb + 1), dsub)

        # -- centroid memories: lane l holds sub-spaces l, l + lanes, ...; step-major rows ----
        mems = []
        for lane in range(lanes):
            mem = memory.Memory(shape=centroid_shape, depth=256 * steps, init=[])
            m.submodules[f"centroids{lane}"] = mem
            mems.append((mem.write_port(), mem.read_port()))
        busy, loaded, ld_active = self._loader(m, mems)
        out, step, issue, s1_res = self._issue(m, mems, busy, loaded, ld_active)
        self._datapath(m, mems, out, step, issue, s1_res)
        return m

    def _loader(self, m, mems):
        """Centroid loader: ``i_centroids`` beats into the lane memories of ``mems`` (lane
        ``l`` holds sub-spaces ``l, l + lanes, ...``, step-major rows). Returns ``(busy,
        loaded, ld_active)``: ``busy`` (driven by :meth:`_issue`) holds off loading while a
        query pair is issued, ``loaded`` once a complete set is in memory, ``ld_active``
        while a set is being loaded."""
        c = self.config
        lanes, steps = c.lanes, c.steps
        busy = Signal()          # a query pair is being issued
        loaded = Signal()        # a complete centroid set is in memory
        ld_row = Signal(8)
        ld_lane = Signal(range(lanes))
        ld_step = Signal(range(steps))
        ld_active = Signal()     # first beat of a set seen, last not yet
        load = Signal()
        m.d.comb += [
            self.i_centroids.ready.eq(~busy),
            load.eq(self.i_centroids.valid & self.i_centroids.ready),
        ]
        for lane, (wr, rd) in enumerate(mems):
            m.d.comb += [
                wr.addr.eq(ld_row | (ld_step << 8) if steps > 1 else ld_row),
                wr.data.eq(self.i_centroids.payload.elem),
                wr.en.eq(load & (ld_lane == lane)),
                # No read while loading (no query pair is issued then, and the read data
                # register holds): synthesis sees that a read never meets a write, so it adds
                # no read-during-write bypass (a mux after the block RAM's output, and a
                # register of the write data) to keep the read's old-data semantics.
                rd.en.eq(~load),
            ]
        with m.If(load):
            m.d.sync += [ld_row.eq(ld_row + 1), ld_active.eq(1), loaded.eq(0)]
            with m.If(ld_row == 255):
                with m.If(ld_lane == lanes - 1):
                    m.d.sync += [ld_lane.eq(0), ld_step.eq(ld_step + 1)]
                with m.Else():
                    m.d.sync += ld_lane.eq(ld_lane + 1)
                with m.If((ld_step == steps - 1) & (ld_lane == (c.m - 1) % lanes)):
                    m.d.sync += [ld_lane.eq(0), ld_step.eq(0), ld_active.eq(0), loaded.eq(1)]
        return busy, loaded, ld_active

    def _issue(self, m, mems, busy, loaded, ld_active):
        """Issue: takes a query pair (its residual ``query - centroid``) once a centroid set
        is loaded and issues one (row, step) per cycle, a row's last step waiting for a
        credit of the output buffer ``out`` (created here, driving ``o_lut``). Returns
        ``(out, step, issue, s1_res)``: ``s1_res``, each lane's residual slice, is registered
        beside the memory read."""
        c = self.config
        lanes, steps, dsub, eb = c.lanes, c.steps, c.dsub, c.elem_bits
        # -- issue: one (row, step) per cycle ------------------------------------------------
        res = Signal(data.ArrayLayout(signed(eb + 1), c.dim))
        row = Signal(8)
        step = Signal(range(steps))
        m.submodules.out = out = CreditBuffer(layouts.lut_row(c.m, c.lut_bits),
                                              latency=c.latency)
        wiring.connect(m, wiring.flipped(self.o_lut), out.o)

        final_step = Signal()
        issue = Signal()
        pair_done = Signal()
        take_pair = Signal()
        m.d.comb += [
            final_step.eq(step == steps - 1),
            issue.eq(busy & (~final_step | out.ready)),
            out.take.eq(issue & final_step),
            pair_done.eq(issue & final_step & (row == 255)),
            self.i_query.ready.eq(loaded & ~ld_active & (~busy | pair_done)),
            take_pair.eq(self.i_query.valid & self.i_query.ready),
        ]
        with m.If(issue):
            with m.If(final_step):
                m.d.sync += [step.eq(0), row.eq(row + 1)]
            with m.Else():
                m.d.sync += step.eq(step + 1)
        with m.If(take_pair):
            m.d.sync += busy.eq(1)
            for j in range(c.dim):
                m.d.sync += res[j].eq(self.i_query.payload.query[j]
                                      - self.i_query.payload.centroid[j])
        with m.Elif(pair_done):
            m.d.sync += busy.eq(0)

        # Residual slice of each lane for the current step, registered beside the memory read.
        s1_res = [Signal(data.ArrayLayout(signed(eb + 1), dsub), name=f"s1_res{lane}")
                  for lane in range(lanes)]
        for lane, (_, rd) in enumerate(mems):
            m.d.comb += rd.addr.eq(row | (step << 8) if steps > 1 else row)
            with m.Switch(step):
                for t in range(steps):
                    sub = t * lanes + lane
                    with m.Case(t):
                        if sub < c.m:
                            for j in range(dsub):
                                m.d.sync += s1_res[lane][j].eq(res[sub * dsub + j])
                        else:
                            m.d.sync += s1_res[lane].eq(0)
        return out, step, issue, s1_res

    def _datapath(self, m, mems, out, step, issue, s1_res):
        """Datapath: per lane, the squared differences of the residual slice and the
        centroid, summed, shifted and saturated; a row's entries of earlier steps wait in
        registers and the row enters ``out`` ``latency`` cycles after its last step."""
        c = self.config
        lanes, steps, dsub, eb = c.lanes, c.steps, c.dsub, c.elem_bits
        # -- datapath: difference, square, sum over dsub, shift and saturate ---------------------
        lut_max = (1 << c.lut_bits) - 1
        lane_values = []
        for lane, (_, rd) in enumerate(mems):
            # the read data and the residual slice registered side by side (cycle 2)
            cent = Signal.like(rd.data, name=f"cent{lane}", reset_less=True)
            s2_res = Signal.like(s1_res[lane], name=f"s2_res{lane}", reset_less=True)
            m.d.sync += [cent.eq(rd.data), s2_res.eq(s1_res[lane])]
            diffs = []
            for j in range(dsub):
                d = Signal(signed(eb + 2), name=f"diff{lane}_{j}", reset_less=True)
                sq = Signal(unsigned(c.sq_bits), name=f"sq{lane}_{j}", reset_less=True)
                m.d.sync += [d.eq(s2_res[j] - cent[j]), sq.eq(d * d)]
                diffs.append(sq)
            total, lat = adder_tree(m, diffs, name=f"sum{lane}")
            assert lat == c.tree_latency
            value = Signal(unsigned(c.lut_bits), name=f"value{lane}")
            shifted = total >> c.lut_shift
            m.d.sync += value.eq(max_value_clamp(shifted, lut_max))
            lane_values.append(value)

        valid = delay(m, issue, c.latency, name="valid")
        at_step = delay(m, step, c.latency, name="step")
        # Entries of earlier steps wait in row_acc; the final step's go straight out.
        row_acc = [Signal(unsigned(c.lut_bits), name=f"acc{s}") for s in range(c.m)]
        for s in range(c.m):
            t, lane = divmod(s, lanes)
            if t == steps - 1:
                m.d.comb += out.i.payload.value[s].eq(lane_values[lane])
            else:
                m.d.comb += out.i.payload.value[s].eq(row_acc[s])
                with m.If(valid & (at_step == t)):
                    m.d.sync += row_acc[s].eq(lane_values[lane])
        m.d.comb += out.i.valid.eq(valid & (at_step == steps - 1))


def max_value_clamp(value, limit):
    """``min(value, limit)`` for an unsigned value."""
    from amaranth.hdl import Mux
    return Mux(value > limit, limit, value)


class LUTBuilderModel(StreamModel):
    """Stream-level golden model and stimulus of :class:`LUTBuilder` for the testbench."""

    result_port = "o_lut"
    latency_from = "i_query"

    @staticmethod
    def stimulus(config, items, rng):
        """Random PQ centroids over the full residual range and ``items`` query pairs; the
        first pair and centroid 0 of every sub-space sit at range extremes, so the largest
        difference (``2**(elem_bits+1) - 1``) and saturation are exercised."""
        c = config
        lo, hi = -(1 << (c.elem_bits - 1)), (1 << (c.elem_bits - 1)) - 1
        cents = rng.integers(-(1 << c.elem_bits), (1 << c.elem_bits) - 1,
                             size=(c.m, 256, c.dsub), endpoint=True)
        cents[:, 0, :] = -(1 << c.elem_bits)
        queries = rng.integers(lo, hi, size=(items, c.dim), endpoint=True)
        coarse = rng.integers(lo, hi, size=(items, c.dim), endpoint=True)
        queries[0], coarse[0] = hi, lo
        return {"pq_centroids": cents, "queries": queries, "coarse": coarse}

    @staticmethod
    def inputs(config, stim):
        """``i_centroids``: ``m * 256`` beats, sub-space major, ``elem`` = the ``dsub`` components
        of one PQ centroid; ``i_query``: one beat per query, ``query`` and its coarse ``centroid``
        (``dim`` elements each). Neither stream has TLAST."""
        cents = stim["pq_centroids"]
        return {
            "i_centroids": [{"elem": cents[i, r].tolist()}
                            for i in range(cents.shape[0]) for r in range(256)],
            "i_query": [{"query": q.tolist(), "centroid": cc.tolist()}
                        for q, cc in zip(stim["queries"], stim["coarse"])],
        }

    @staticmethod
    def expect(config, stim):
        """``o_lut``: 256 beats per query (no TLAST); beat ``r``'s ``value`` is column ``r`` of
        :func:`hwgen.vecsearch.golden.build_lut` of the residual ``query - centroid`` with
        ``lut_shift`` and saturation to ``lut_bits``."""
        rows = []
        for q, cc in zip(stim["queries"], stim["coarse"]):
            lut = golden.build_lut(q - cc, stim["pq_centroids"], config.lut_shift,
                                   config.lut_bits)
            rows += [{"value": lut[:, r].tolist()} for r in range(256)]
        return {"o_lut": rows}

    @staticmethod
    def cycles_bound(config, stim):
        return len(stim["queries"]) * 256 * config.steps + config.m * 256
