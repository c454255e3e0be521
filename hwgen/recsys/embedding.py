"""Embedding lookup unit of the recommendation node (paper section III-B1, Fig. 3).

For every inference the unit looks up one row in each embedding table and emits the rows,
concatenated in table order, followed by the inference's dense features. The tables are placed
by :func:`hwgen.recsys.placement.place`: the smallest in on-chip memories, the medium ones in
HBM pseudo-channels, the largest in DDR; every off-chip channel used gets its own AXI4 read
master, and all lookups of an inference are issued at once, concurrently on all channels.

The model simulated is synthetic (:func:`synthetic_model`): ``tables`` tables of odd dimensions
and sizes, one of them a single row, with reproducible random contents
(:func:`hwgen.recsys.golden.table_contents`). The default channel caps are small so that a
13-table model uses all three kinds of memory.

Loading real tables: off-chip tables are written by the host into the channels' buffers as
:func:`hwgen.recsys.placement.pack_tables` packs them (each channel's image at offset 0 of the
buffer bound to that bank); on-chip tables are memory initial contents fixed when the design is
built: pass them as ``Embedding(config, contents=[array per table])`` (shape ``(rows, dim)``,
signed ``elem_bits`` values) instead of the synthetic ones.
"""

import math
from dataclasses import dataclass
from functools import cached_property

import numpy as np
from amaranth.hdl import Array, Cat, Const, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, fifo, memory, stream, wiring
from amaranth.lib.wiring import In, Out

from ..boards import board_names
from .. import contract
from ..config import Config, param
from ..errors import ConfigError
from ..flow.model import StreamModel
from ..lib.axi import AXI4Signature
from ..lib.pipeline import CreditBuffer, delay
from . import golden
from .model import RecModel, Table
from .placement import place

__all__ = ["EmbeddingConfig", "Embedding", "EmbeddingModel", "TEST_CONFIGS", "synthetic_model",
           "onchip_rows", "ADDR_BITS"]

#: AXI address bits of the read masters (Vitis requires 64).
ADDR_BITS = 64
#: Largest table contents (int64 arrays in host memory) generated for a simulation.
SIM_TABLE_BYTES = 1 << 30
#: Cycles from a row at the head of its FIFO to its output beat on ``o_emb``: the registered
#: readiness (1), beat register (1), output buffer (2, :class:`~hwgen.lib.pipeline.CreditBuffer`).
OUTPUT_CYCLES = 4
#: Cycles from a query's acceptance to the output of a row whose last word arrives from memory
#: ``e`` cycles after the channel's first AR handshake, minus ``e``: s1 register (1), lookup
#: FIFO (2), AR register (1), R register (1), row register (1), row FIFO (2), output
#: (:data:`OUTPUT_CYCLES`).
PIPELINE_CYCLES = 8 + OUTPUT_CYCLES
#: The same for an on-chip row (s1 register, memory read, read data register, row FIFO,
#: output) and for the dense features (s1 register, info FIFO, output).
ONCHIP_CYCLES = 5 + OUTPUT_CYCLES
DENSE_CYCLES = 3 + OUTPUT_CYCLES


def _fifo_depth(inflight):
    """Depth of a per-inference SyncFIFOBuffered that never refuses a write while it holds
    fewer than ``inflight`` entries: a buffered FIFO of depth 2 refuses the second write while
    its first entry moves to the output register, so at least 3."""
    return max(3, inflight)


def _bits(n):
    """Bits of an unsigned value 0..n-1 (at least 1)."""
    return max(1, (n - 1).bit_length())


def synthetic_model(tables, *, dim_min=1, dim_max=20, rows_max=3000, dense=5, elem_bits=16,
                    seed=7):
    """A reproducible model of ``tables`` tables for simulations.

    Dimensions are uniform in ``dim_min..dim_max`` (at least one odd when the range has one);
    row counts log-uniform in ``2..rows_max``, one table exactly ``rows_max`` rows and, with
    two tables or more, one table of a single row. Drawn with
    ``numpy.random.default_rng([seed, 0x53594E])``.
    """
    rng = np.random.default_rng([seed, 0x53594E])
    dims = rng.integers(dim_min, dim_max, size=tables, endpoint=True)
    if not (dims % 2).any() and dim_min < dim_max:
        dims[0] += 1 if dims[0] < dim_max else -1
    lo = math.log(min(2, rows_max))
    rows = np.round(np.exp(rng.uniform(lo, math.log(rows_max), size=tables))).astype(int)
    rows = np.clip(rows, 1, rows_max)
    order = rng.permutation(tables)
    rows[order[0]] = rows_max
    if tables > 1:
        rows[order[1]] = 1
    return RecModel(name=f"synthetic-{tables}", dense=dense,
                    tables=tuple(Table(int(r), int(d)) for r, d in zip(rows, dims)),
                    layers=(1,), weight_bits=8, act_bits=(elem_bits,), shifts=(), seed=seed,
                    note="hwgen synthetic embedding model (hwgen.recsys.embedding)")


def _cap(value):
    """Config cap: -1 -> None (the board's), else the value."""
    return None if value < 0 else value


def output_beat_times(placement, tables, lanes, out_beats, memory_latency=None):
    """Cycle (after a query's acceptance) at which each output beat of the lookup unit
    leaves, with an always-ready output (the schedule of :meth:`EmbeddingConfig.performance`,
    also used by :func:`hwgen.recsys.perf.lookup_stage`). ``memory_latency``: AR-to-R cycles
    (default: the placement's memory model at its clock). Returns ``(times, memory_latency)``.
    """
    p = placement
    if memory_latency is None:
        memory_latency = max((math.ceil(p.memory_models[ch.kind].latency_ns
                                        * p.clock_mhz / 1e3) for ch in p.channels), default=0)
    ready = {t: ONCHIP_CYCLES for t in p.onchip}
    for ch in p.channels:
        end = None
        for k, t in enumerate(ch.tables):
            first = k + memory_latency if end is None else max(k + memory_latency, end + 1)
            end = first + p.slots[t].beats - 1
            ready[t] = PIPELINE_CYCLES + end
    owner = [t for t, table in enumerate(tables) for _ in range(table.dim)]
    times = []
    for b in range(out_beats):               # beats past the tables: dense features
        span = owner[b * lanes:(b + 1) * lanes]
        due = max([DENSE_CYCLES] + [ready[t] for t in span])
        times.append(max(due, times[-1] + 1) if times else due)
    return times, memory_latency


@dataclass(frozen=True)
class EmbeddingConfig(Config):
    """Configuration of the embedding lookup unit (:class:`Embedding`): the synthetic model's shape
    (tables, dimensions, rows, dense features, element bits, seed), the board and the caps of the
    table placement on it (on-chip bytes, HBM and DDR channels), the output beat width (``lanes``),
    out-of-range index handling and the inferences in flight."""
    tables: int = param(13, "embedding tables of the synthetic model", lo=1, hi=256)
    dim_min: int = param(1, "smallest table dimension (elements per row)", lo=1, hi=64)
    dim_max: int = param(20, "largest table dimension", lo=1, hi=64)
    rows_max: int = param(3000, "rows of the largest table (sizes log-uniform from 2; one "
                                "table of a single row)", lo=1, hi=1 << 24)
    dense: int = param(5, "dense features appended after the embedding vectors", lo=0, hi=1024)
    elem_bits: int = param(16, "bits of a signed table element / dense feature",
                           choices=(8, 16))
    model_seed: int = param(7, "seed of the synthetic model's shapes and table contents",
                            lo=0, hi=2 ** 32 - 1)
    index_bits: int = param(32, "bits of a sparse index on i_query (indices at or beyond a "
                                "table's rows are out of range)", lo=1, hi=32)
    board: str = param("u280", "target board: memory kinds, channels, AXI widths",
                       choices=board_names())
    onchip_bytes: int = param(1024, "on-chip bytes for the smallest tables (-1: half the "
                                    "board's BRAM/URAM)", lo=-1, hi=1 << 31)
    hbm_channels: int = param(4, "HBM pseudo-channels used at most (-1: all)", lo=-1, hi=64)
    ddr_channels: int = param(2, "DDR channels used at most (-1: all)", lo=-1, hi=64)
    hbm_table_max_bytes: int = param(32768, "tables larger than this (row-padded) go to DDR "
                                            "(-1: only those larger than a pseudo-channel)",
                                     lo=-1, hi=1 << 40)
    lanes: int = param(16, "elements per output beat", lo=1, hi=256)
    oob: str = param("clamp", "out-of-range index: clamp to the last row, or zero the "
                              "table's vector and flag the inference", choices=("clamp", "flag"))
    inflight: int = param(16, "inferences in flight (FIFO depth); above (memory latency + 12) "
                              "/ initiation interval for full rate", lo=2, hi=1024)

    def check(self):
        if self.dim_min > self.dim_max:
            raise ConfigError("dim_min", f"must be <= dim_max={self.dim_max}",
                              value=self.dim_min)
        if self.rows_max > 1 << self.index_bits:
            raise ConfigError("index_bits", f"must address rows_max={self.rows_max} rows "
                              f"(at least {_bits(self.rows_max)} bits)", value=self.index_bits)
        self.placement        # raises ConfigError naming what does not fit the board

    def for_board(self, board):
        """This configuration targeting ``board`` (``hwgen synth --board``)."""
        return self.replace(board=board.name)

    # -- the model and its placement -----------------------------------------------------------

    @cached_property
    def rec_model(self):
        """The :class:`~hwgen.recsys.model.RecModel` whose tables are looked up: the synthetic model
        of :func:`synthetic_model` (computed once)."""
        return synthetic_model(self.tables, dim_min=self.dim_min, dim_max=self.dim_max,
                               rows_max=self.rows_max, dense=self.dense,
                               elem_bits=self.elem_bits, seed=self.model_seed)

    @cached_property
    def placement(self):
        """The tables' :class:`~hwgen.recsys.placement.Placement` on ``board`` under the configured
        caps (computed once; ConfigError when the tables do not fit)."""
        return place(self.rec_model, self.board, onchip_bytes=_cap(self.onchip_bytes),
                     hbm_channels=_cap(self.hbm_channels), ddr_channels=_cap(self.ddr_channels),
                     hbm_table_max_bytes=_cap(self.hbm_table_max_bytes))

    @cached_property
    def contents(self):
        """The tables' contents (:func:`hwgen.recsys.golden.table_contents`), for simulation;
        ConfigError beyond :data:`SIM_TABLE_BYTES`."""
        size = sum(t.rows * t.dim for t in self.rec_model.tables) * 8
        if size > SIM_TABLE_BYTES:
            raise ConfigError("tables", f"contents of {size / (1 << 30):.3g} GiB (as int64) are "
                              f"too large to simulate (limit {SIM_TABLE_BYTES >> 30} GiB): "
                              "reduce tables, rows_max or dim_max")
        return golden.table_contents(self.rec_model)

    @property
    def concat_len(self):
        """Elements per inference on the output: the tables' dimensions plus the dense features."""
        return self.rec_model.concat_len

    @property
    def out_beats(self):
        """Output beats per inference."""
        return -(-self.concat_len // self.lanes)

    @property
    def channel_beats(self):
        """AXI data words per inference on each used channel: ``{port: beats}``."""
        return {ch.port: ch.beats for ch in self.placement.channels}

    @property
    def interval(self):
        """Cycles per inference at full rate: output beats or the busiest channel's words."""
        return max([self.out_beats, 1] + list(self.channel_beats.values()))

    # -- stream layouts ------------------------------------------------------------------------

    def query_layout(self):
        """Payload of ``i_query``: ``indices`` (one unsigned ``index_bits`` index per table) and,
        when ``dense`` > 0, ``dense`` (signed ``elem_bits`` features)."""
        fields = {"indices": data.ArrayLayout(unsigned(self.index_bits), self.tables)}
        if self.dense:
            fields["dense"] = data.ArrayLayout(signed(self.elem_bits), self.dense)
        return data.StructLayout(fields)

    def output_layout(self):
        """Payload of ``o_emb``: ``elem`` (``lanes`` signed ``elem_bits`` elements), ``error`` when
        ``oob`` is ``flag``, and ``last``."""
        fields = {"elem": data.ArrayLayout(signed(self.elem_bits), self.lanes)}
        if self.oob == "flag":
            fields["error"] = unsigned(1)
        fields["last"] = unsigned(1)
        return data.StructLayout(fields)

    # -- reports -------------------------------------------------------------------------------

    @dataclass(frozen=True)
    class Workload(contract.Workload):
        """The workload of :meth:`cycle_model` (None: steady-state figures only)."""
        items: int = None     # inferences back to back
        # cycles from an AR handshake to the first R beat (None: the placement's model)
        memory_latency: int = None

    def cycle_model(self, workload):
        """Cycle model at full input rate and an always-ready output (``--stall 0``).

        ``memory_latency`` ``L``: cycles from an AR handshake to the first R beat (default: the
        placement's memory model at the board clock). Relative to a query's acceptance:

        * a channel's first AR handshake is at cycle 4 (s1, lookup FIFO, AR register); lookup
          ``k`` is issued ``k`` cycles later and its ``n`` words return one per cycle after
          ``L`` cycles, behind the words of earlier lookups: the last word of lookup ``k``
          arrives at ``4 + e_k``, ``e_k = max(k + L, e_{k-1} + 1) + n - 1``;
        * a row is ready for the output ``8`` cycles after its last word (R register, row
          register, row FIFO, registered readiness, beat register, output buffer): cycle
          ``12 + e_k``; on-chip rows at cycle 9, dense features at 7;
        * output beat ``b`` leaves at ``t_b = max(t_{b-1} + 1, ready of its rows)``.

        ``latency_cycles = t_0``. An inference holds one of the ``inflight`` credits for
        ``t_{B-1}`` cycles (its last beat is taken at ``t_{B-1} - 3``; the credit returns with
        the beat, two registers later), so successive inferences follow every
        ``initiation_interval = max(interval, t_{B-1} / inflight)`` cycles: :attr:`interval`
        (output beats or the busiest channel's words) unless there are too few credits to cover
        the latency (``credit_bound``; then the figure is an average). ``items`` inferences take
        ``cycles = t_{B-1} + (items - 1) * initiation_interval + 1`` from the first query to the
        last output beat (``hwgen sim``'s ``cycles``; exact unless credit-bound).
        """
        items, memory_latency = workload.items, workload.memory_latency
        times, memory_latency = output_beat_times(self.placement, self.rec_model.tables,
                                                  self.lanes, self.out_beats, memory_latency)
        credit = times[-1] / self.inflight
        interval = self.interval if credit <= self.interval else credit
        out = {"initiation_interval": interval, "latency_cycles": times[0],
               "output_beats": self.out_beats, "channel_beats": self.channel_beats,
               "memory_latency_cycles": memory_latency, "inference_cycles": times[-1] + 1,
               "credit_bound": credit > self.interval}
        if items:
            out["cycles"] = times[-1] + (items - 1) * interval + 1
        return out

    def memory_banks(self):
        """``{read master member: Vitis bank}`` of the off-chip channels (``{"m_axi_hbm3":
        "HBM[3]"}``): where a kernel shell must connect each master (``sp=`` lines)."""
        return {ch.port: ch.bank for ch in self.placement.channels}

    def derived(self):
        p = self.placement
        return {"concat_len": self.concat_len, "output_beats": self.out_beats,
                "initiation_interval": self.interval,
                "onchip_tables": list(p.onchip), "onchip_bytes": p.onchip_bytes,
                "channels": {ch.port: {"tables": list(ch.tables), "rounds": ch.rounds,
                                       "beats": ch.beats, "bytes": ch.bytes}
                             for ch in p.channels},
                "predicted_inferences_per_s": p.inferences_per_s,
                "predicted_lookup_latency_ns": round(p.latency_ns, 2)}


def onchip_rows(config, contents=None):
    """The on-chip tables' initial contents: ``{table: [row word, ...]}``, element 0 in a
    word's lowest bits.

    ``contents`` holds one ``(rows, dim)`` array per table of ``config.rec_model`` (ConfigError
    if a shape or a value, signed ``elem_bits``, is wrong); default the synthetic contents
    (:func:`hwgen.recsys.golden.table_content`), generated for the on-chip tables only.
    """
    eb = config.elem_bits
    tables = config.rec_model.tables
    onchip = config.placement.onchip
    if contents is None:
        contents = {t: golden.table_content(config.rec_model, t) for t in onchip}
    elif len(contents) != len(tables):
        raise ConfigError("contents", f"needs {len(tables)} tables", value=len(contents))
    lo, hi = -(1 << (eb - 1)), (1 << (eb - 1)) - 1
    mask = (1 << eb) - 1
    out = {}
    for t in (onchip if isinstance(contents, dict) else range(len(tables))):
        table = tables[t]
        x = np.asarray(contents[t], dtype=np.int64)
        if x.shape != (table.rows, table.dim) or (x.size and (x.min() < lo or x.max() > hi)):
            raise ConfigError(f"contents[{t}]", f"must be ({table.rows}, {table.dim}) signed "
                              f"{eb}-bit values")
        if t in onchip:
            out[t] = [sum((int(v) & mask) << (eb * e) for e, v in enumerate(row)) for row in x]
    return out


class Embedding(wiring.Component):
    """Embedding lookup unit: one row per table from on-chip memories and AXI memory channels,
    concatenated with the dense features.

    Parameters
    ----------
    config : EmbeddingConfig
    contents : list of array, optional
        Table contents (one ``(rows, dim)`` array per table); default the synthetic ones. Only
        the on-chip tables are built into the design (:func:`onchip_rows`); off-chip ones are
        in memory.

    Members
    -------
    i_query : ``In(stream.Signature({indices: tables x unsigned(index_bits), dense: dense x
    signed(elem_bits)}))``
        One beat per inference: the sparse index of every table and the dense features (no
        TLAST). An index at or beyond its table's rows is out of range (see ``oob``).
    o_emb : ``Out(stream.Signature({elem: lanes x signed(elem_bits)[, error], last}))``
        The concatenated vector (table 0's row, table 1's row, ..., dense features),
        ``lanes`` elements per beat, zero-padded in the last beat; ``last`` (TLAST) on each
        inference's last beat. With ``oob="flag"`` an out-of-range index's vector is zeros and
        ``error`` is set on every beat of that inference; with ``oob="clamp"`` it reads the
        table's last row. No read ever leaves a table.
    m_axi_<kind><n> : ``Out(AXI4Signature(64, data_bits, write=False))``
        One read master per used off-chip channel (``m_axi_hbm0``, ``m_axi_ddr1``, ...). A
        lookup is one INCR burst of ``max(1, stride / word)`` beats at ``base + index *
        stride`` (:mod:`hwgen.recsys.placement`), ID 0; ``rready`` is always 1.

    Organisation
    ------------
    An accepted query is registered (s1), with a flag per index out of range (compared as s1
    is written); each table's index is clamped there, its address computed, and the lookups of
    every channel written to that channel's FIFO. Each channel's sequencer then issues its
    lookups on AR, one per cycle, all channels at once; the returned words are registered,
    aligned into a register and written to one row FIFO per table (on-chip tables are read in
    s1, the data registered and written the cycle after). The output serialiser takes beat
    ``b`` when the rows it covers are all at the heads of their FIFOs and its output buffer
    has room: a beat register, then a :class:`~hwgen.lib.pipeline.CreditBuffer` (its credit
    is a register, so ``o_emb.ready`` reaches no decision). The sequencers drive AR themselves
    rather than through :class:`hwgen.lib.axi.AXI4Reader`, whose burst splitter takes a command
    every other cycle: a lookup is always a single burst inside one 4 KiB page.

    Timing
    ------
    Initiation interval ``max(output beats, data words of the busiest channel)`` cycles per
    inference (a lookup of an ``n``-word row costs its channel ``n`` cycles; one-word rows: the
    channel's lookup rounds). Latency from acceptance to the first output beat: ``12 + L`` cycles
    plus the cycles the rows of that beat wait behind earlier lookups on their channels, ``L``
    being the memory's AR-to-R latency (exact model: :meth:`EmbeddingConfig.performance`).
    For full rate ``inflight`` must cover that latency: ``inflight * interval > 12 + L``.

    Backpressure: ``i_query`` is accepted while fewer than ``inflight`` inferences are in
    flight (a register compare): every FIFO has room reserved for them, so reads are never
    stalled on R. ``o_emb`` may stall at any time.
    """

    def __init__(self, config, contents=None):
        self.config = c = config
        self._rows = onchip_rows(c, contents)
        members = {"i_query": In(stream.Signature(c.query_layout())),
                   "o_emb": Out(stream.Signature(c.output_layout()))}
        for ch in c.placement.channels:
            members[ch.port] = Out(AXI4Signature(ADDR_BITS, ch.data_bits, write=False))
        super().__init__(members)

    def elaborate(self, platform):
        c = self.config
        m = Module()
        model, p = c.rec_model, c.placement
        eb, depth = c.elem_bits, c.inflight
        fifo_depth = _fifo_depth(depth)
        tables = model.tables
        flag = c.oob == "flag"

        # -- admission and s1 ------------------------------------------------------------------
        q = self.i_query
        inflight = Signal(range(depth + 1))
        accept, done = Signal(), Signal()
        m.d.comb += [q.ready.eq(inflight < depth), accept.eq(q.valid & q.ready)]
        # An inference's credit returns two cycles after its last beat is taken (its FIFO
        # entries are free by then), as the beat leaves: the counter's adder starts at a
        # register.
        done_q = delay(m, done, 2, name="done")
        m.d.sync += inflight.eq(inflight + accept - done_q)
        s1_valid = Signal()
        s1 = Signal(c.query_layout())
        s1_oob = Signal(len(tables))       # index out of range, compared as s1 is written
        m.d.sync += s1_valid.eq(accept)
        with m.If(accept):
            m.d.sync += s1.eq(q.payload)
            m.d.sync += [s1_oob[t].eq(q.payload.indices[t] >= table.rows)
                         for t, table in enumerate(tables) if table.rows < 1 << c.index_bits]

        # index check: effective row and zero flag of every table
        eff, zero = [], []
        for t, table in enumerate(tables):
            idx = s1.indices[t]
            row = Signal(range(table.rows), name=f"row{t}")
            z = Signal(name=f"zero{t}")
            if table.rows < 1 << c.index_bits:
                oob = s1_oob[t]
                m.d.comb += row.eq(Mux(oob, 0 if flag else table.rows - 1, idx))
                if flag:
                    m.d.comb += z.eq(oob)
            else:
                m.d.comb += row.eq(idx)
            eff.append(row)
            zero.append(z)

        # dense features and the error flag, per inference
        info_fields = {"error": unsigned(1)}
        if c.dense:
            info_fields["dense"] = data.ArrayLayout(signed(eb), c.dense)
        info_layout = data.StructLayout(info_fields)
        m.submodules.info = info = fifo.SyncFIFOBuffered(width=info_layout.size,
                                                              depth=fifo_depth)
        info_w = Signal(info_layout)
        m.d.comb += [info_w.error.eq(Cat(*zero).any()), info.w_data.eq(info_w),
                     info.w_en.eq(s1_valid)]
        if c.dense:
            m.d.comb += info_w.dense.eq(s1.dense)

        # one row FIFO per table
        rows = []
        for t, table in enumerate(tables):
            f = fifo.SyncFIFOBuffered(width=table.dim * eb, depth=fifo_depth)
            m.submodules[f"rows{t}"] = f
            rows.append(f)

        # -- on-chip tables: read in s1, the read data registered (s3), then written ---------
        for t in p.onchip:
            mem = memory.Memory(shape=unsigned(tables[t].dim * eb), depth=tables[t].rows,
                                init=self._rows[t])
            m.submodules[f"table{t}"] = mem
            rd = mem.read_port()
            s2_valid, s2_zero = Signal(name=f"s2_valid{t}"), Signal(name=f"s2_zero{t}")
            s3_valid, s3_zero = Signal(name=f"s3_valid{t}"), Signal(name=f"s3_zero{t}")
            s3_data = Signal.like(rd.data, name=f"s3_data{t}")
            m.d.sync += [s2_valid.eq(s1_valid), s2_zero.eq(zero[t]),
                         s3_valid.eq(s2_valid), s3_zero.eq(s2_zero), s3_data.eq(rd.data)]
            m.d.comb += [rd.addr.eq(eff[t]), rd.en.eq(s1_valid),
                         rows[t].w_data.eq(Mux(s3_zero, 0, s3_data)), rows[t].w_en.eq(s3_valid)]

        # -- off-chip channels -----------------------------------------------------------------
        for ch in p.channels:
            self._channel(m, ch, eff, zero, s1_valid, rows)

        # -- output serialiser -----------------------------------------------------------------
        self._serialiser(m, info, info_layout, rows, done)
        return m

    def _channel(self, m, ch, eff, zero, s1_valid, rows):
        """Lookup FIFO, AR sequencer and R alignment of one channel."""
        c = self.config
        p, tables, eb = c.placement, c.rec_model.tables, c.elem_bits
        bus = getattr(self, ch.port)
        name = ch.port[len("m_axi_"):]
        word = ch.word_bytes
        tabs = ch.tables
        n = len(tabs)
        slots = [p.slots[t] for t in tabs]
        per_word = [max(1, word // s.stride) for s in slots]     # rows per data word
        sel_bits = max(1, max(_bits(w) for w in per_word))
        addr_bits = _bits(ch.bytes)
        entry = data.StructLayout({"addr": data.ArrayLayout(unsigned(addr_bits), n),
                                   "sel": data.ArrayLayout(unsigned(sel_bits), n),
                                   "zero": unsigned(n)})
        meta = data.StructLayout({"sel": unsigned(sel_bits), "zero": unsigned(1)})

        # lookups of an inference, written in s1
        lookups = fifo.SyncFIFOBuffered(width=entry.size, depth=_fifo_depth(c.inflight))
        m.submodules[f"{name}_lookups"] = lookups
        w = Signal(entry, name=f"{name}_entry")
        for k, (t, s) in enumerate(zip(tabs, slots)):
            m.d.comb += [w.addr[k].eq(s.base + eff[t] * s.stride),
                         w.zero[k].eq(zero[t])]
            if per_word[k] > 1:
                m.d.comb += w.sel[k].eq(eff[t][:_bits(per_word[k])])
        m.d.comb += [lookups.w_data.eq(w), lookups.w_en.eq(s1_valid)]

        # AR: one lookup per cycle
        head = Signal(entry, name=f"{name}_head")
        m.d.comb += head.eq(lookups.r_data)
        k = Signal(range(n), name=f"{name}_k")
        issue = Signal(name=f"{name}_issue")
        final = k == n - 1
        # buffered: the head is a register (the LUTRAM read is registered), so the row
        # select of R's alignment starts at a register; an entry is written at its issue
        # and read at the row's last R beat, at least three cycles later
        m.submodules[f"{name}_meta"] = pending = fifo.SyncFIFOBuffered(
            width=meta.size, depth=c.inflight * n)
        pend_w = Signal(meta, name=f"{name}_meta_w")
        lens = Array(Const(s.beats - 1, 8) for s in slots)
        m.d.comb += [
            issue.eq(lookups.r_rdy & (~bus.arvalid | bus.arready)),
            lookups.r_en.eq(issue & final),
            pend_w.sel.eq(head.sel[k]), pend_w.zero.eq(head.zero.bit_select(k, 1)),
            pending.w_data.eq(pend_w), pending.w_en.eq(issue),
            bus.arsize.eq((word - 1).bit_length()), bus.arburst.eq(0b01), bus.arid.eq(0),
            bus.rready.eq(1),
        ]
        with m.If(issue):
            m.d.sync += [bus.arvalid.eq(1), bus.araddr.eq(head.addr[k]), bus.arlen.eq(lens[k]),
                         k.eq(Mux(final, 0, k + 1))]
        with m.Elif(bus.arready):
            m.d.sync += bus.arvalid.eq(0)

        # R: registered, words of multi-word rows gathered, rows aligned into the row FIFOs
        r_valid = Signal(name=f"{name}_r_valid")
        r_data = Signal(8 * word, name=f"{name}_r_data")
        m.d.sync += [r_valid.eq(bus.rvalid), r_data.eq(bus.rdata)]
        kr = Signal(range(n), name=f"{name}_kr")
        most = max(s.beats for s in slots)
        beat = Signal(range(most), name=f"{name}_beat")
        row_end = Signal(name=f"{name}_row_end")
        m.d.comb += row_end.eq(r_valid & (beat == Array(Const(s.beats - 1, range(most))
                                                        for s in slots)[kr]))
        got = Signal(meta, name=f"{name}_meta_r")
        m.d.comb += [got.eq(pending.r_data), pending.r_en.eq(row_end)]
        gathered = Signal(8 * word * max(1, most - 1), name=f"{name}_gathered")
        with m.If(row_end):
            m.d.sync += [beat.eq(0), kr.eq(Mux(kr == n - 1, 0, kr + 1))]
        with m.Elif(r_valid):
            m.d.sync += [beat.eq(beat + 1),
                         gathered.word_select(beat, 8 * word).eq(r_data)]
        # the aligned row is registered (row_q) before its FIFO: the row FIFOs sit by the
        # output serialiser, away from the channel's R logic
        widths = [tables[t].dim * eb for t in tabs]
        row_q = Signal(max(widths), name=f"{name}_row")
        row_we = Signal(n, name=f"{name}_row_we")       # one-hot: the table whose row it is
        m.d.sync += row_we.eq(0)
        for pos, (t, s) in enumerate(zip(tabs, slots)):
            bits = widths[pos]
            if s.beats > 1:
                row = Cat(gathered[:8 * word * (s.beats - 1)], r_data)[:bits]
            elif per_word[pos] > 1:
                row = r_data.word_select(got.sel[:_bits(per_word[pos])], 8 * s.stride)[:bits]
            else:
                row = r_data[:bits]
            with m.If(row_end & (kr == pos)):
                m.d.sync += [row_we[pos].eq(1), row_q.eq(Mux(got.zero, 0, row))]
            m.d.comb += [rows[t].w_en.eq(row_we[pos]), rows[t].w_data.eq(row_q[:bits])]

    def _serialiser(self, m, info, info_layout, rows, done):
        """Output beats of ``lanes`` elements from the row FIFOs' heads and the dense FIFO.

        Beat ``b`` is taken (``go``) when ``rdy``, a register, says the FIFOs it covers have
        their rows at the head, and the output buffer (:class:`~hwgen.lib.pipeline.
        CreditBuffer`) has a credit, also a register: ``go`` is one gate, and ``o_emb.ready``
        reaches no decision. ``go`` drives the beat counter, the pops of the FIFOs whose last
        element is in this beat and the beat's valid bit; the beat register loads every cycle
        (no enable) and feeds the output buffer. ``rdy`` is computed a cycle ahead for the beat
        that will be current (:meth:`_ready_next`)."""
        c = self.config
        tables, eb, lanes = c.rec_model.tables, c.elem_bits, c.lanes
        beats = c.out_beats
        # element sources, in concatenation order: (fifo index or None for dense, element)
        source = [(t, e) for t, table in enumerate(tables) for e in range(table.dim)]
        source += [(None, d) for d in range(c.dense)]
        spans = [source[bb * lanes:(bb + 1) * lanes] for bb in range(beats)]
        # the FIFOs each beat reads (info: every beat) and those it pops (their last beat)
        needed = [[info] + [rows[t] for t in sorted({t for t, _ in span if t is not None})]
                  for span in spans]
        pops = [[] for _ in range(beats)]
        for t in range(len(tables)):
            pops[max(bb for bb in range(beats) if rows[t] in needed[bb])].append(rows[t])
        pops[-1].append(info)
        head = Signal(info_layout)
        m.d.comb += head.eq(info.r_data)

        m.submodules.out = out = CreditBuffer(c.output_layout(), latency=1)
        wiring.connect(m, out.o, wiring.flipped(self.o_emb))
        beat = Signal(c.output_layout())
        go, rdy = Signal(), Signal()
        m.d.sync += out.i.valid.eq(go)
        m.d.comb += [out.i.payload.eq(beat), out.take.eq(go), go.eq(rdy & out.ready)]

        b = Signal(range(max(2, beats)))      # (a 0-bit Switch would match no Case)
        with m.If(go):
            m.d.sync += b.eq(Mux(b == beats - 1, 0, b + 1))
        m.d.comb += done.eq(go & (b == beats - 1))
        deep = self._ready_next(m, [info, *rows], pops)
        with m.Switch(b):
            for bb in range(beats):
                with m.Case(bb):
                    nxt = (bb + 1) % beats
                    stay = Cat(*[f.r_rdy for f in needed[bb]]).all()
                    adv = Cat(*[deep[id(f)] if f in pops[bb] else f.r_rdy
                                for f in needed[nxt]]).all()
                    m.d.sync += rdy.eq(Mux(go, adv, stay))
                    m.d.sync += beat.last.eq(bb == beats - 1)
                    if c.oob == "flag":
                        m.d.sync += beat.error.eq(head.error)
                    for j in range(lanes):
                        if j < len(spans[bb]):
                            t, e = spans[bb][j]
                            value = head.dense[e] if t is None else \
                                rows[t].r_data.word_select(e, eb)
                        else:
                            value = 0
                        m.d.sync += beat.elem[j].eq(value)
                    m.d.comb += [f.r_en.eq(go) for f in pops[bb]]

    def _ready_next(self, m, fifos, pops):
        """Per FIFO of ``fifos`` that some beat pops, whether it holds a second row (``{id:
        signal}``): the count of rows written and not popped is at least 2, so that after a
        pop its next row is at the head in the next cycle (a buffered FIFO moves its next row
        to the output register in the cycle of the pop). Without a pop, a FIFO's own ``r_rdy``
        tells the next cycle's head (or is one cycle late when a row arrives), so ``rdy``
        follows a row's arrival one cycle later than the FIFO's ``r_rdy``."""
        deep = {}
        popped = [f for bb in pops for f in bb]
        for f in fifos:
            if f not in popped:
                continue
            count = Signal(range(f.depth + 1), name="rows_held")
            m.d.sync += count.eq(count + f.w_en - f.r_en)
            deep[id(f)] = count >= 2
        return deep


class EmbeddingModel(StreamModel):
    """Stream-level golden model and stimulus of :class:`Embedding`.

    The item unit of ``hwgen sim --items`` is one inference: one ``i_query`` beat, ``ceil(L /
    lanes)`` ``o_emb`` beats (``L`` = concatenated length).
    """

    result_port = "o_emb"
    latency_from = "i_query"

    @staticmethod
    def stimulus(config, items, rng):
        """``items`` inferences. Inference 0 looks up row 0 of every table, inference 1 the
        last rows, inference 2 the largest index ``2**index_bits - 1`` (out of range wherever
        that is possible); after that each index is, with probabilities 0.1 / 0.1 / 0.06 / 0.25 /
        0.49: 0, the last row, out of range (the first index beyond the table, or random up to
        the largest), Zipf-distributed (popular rows: realistic traffic), or uniform over the
        table. Dense features: :func:`hwgen.recsys.golden.dense_features`."""
        model = config.rec_model
        top = (1 << config.index_bits) - 1
        rows = np.array([t.rows for t in model.tables], dtype=np.int64)
        n, tables = items, len(rows)
        pick = rng.random((n, tables))
        uniform = (rng.random((n, tables)) * rows).astype(np.int64)
        zipf = np.minimum(rng.zipf(1.3, size=(n, tables)) - 1, rows - 1)
        beyond = np.where(rng.random((n, tables)) < 0.5, rows,
                          rows + (rng.random((n, tables)) * (top + 1 - rows)).astype(np.int64))
        beyond = np.minimum(beyond, top)
        idx = np.select([pick < 0.1, pick < 0.2, pick < 0.26, pick < 0.51],
                        [0, rows - 1, beyond, zipf], uniform)
        fixed = [np.zeros(tables, dtype=np.int64), rows - 1, np.full(tables, top)]
        for i, row in enumerate(fixed[:n]):
            idx[i] = row
        return {"indices": idx.astype(np.int64),
                "dense": golden.dense_features(model, n, rng)}

    @staticmethod
    def inputs(config, stim):
        """``i_query``: one beat per inference, ``indices`` (one per table) and, when the model has
        dense features, ``dense``; no TLAST."""
        beats = []
        for idx, dense in zip(stim["indices"], stim["dense"]):
            beat = {"indices": idx.tolist()}
            if config.dense:
                beat["dense"] = dense.tolist()
            beats.append(beat)
        return {"i_query": beats}

    @staticmethod
    def expect(config, stim):
        """``o_emb``: per inference :func:`hwgen.recsys.golden.embed` (each table's row, then the
        dense features; out-of-range indices per ``oob``), zero-padded to ``out_beats * lanes``, in
        ``out_beats`` beats of ``elem`` with ``last`` on the final one; with ``oob="flag"`` every
        beat's ``error`` says whether any index was out of range."""
        model = config.rec_model
        vec = golden.embed(model, config.contents, stim["indices"], stim["dense"],
                           oob=config.oob)
        errors = golden.out_of_range(model, stim["indices"]).any(axis=1)
        lanes, beats = config.lanes, config.out_beats
        padded = np.zeros((len(vec), beats * lanes), dtype=np.int64)
        padded[:, :vec.shape[1]] = vec
        out = []
        for v, err in zip(padded, errors):
            for b in range(beats):
                beat = {"elem": v[b * lanes:(b + 1) * lanes].tolist(), "last": int(b == beats - 1)}
                if config.oob == "flag":
                    beat["error"] = int(err)
                out.append(beat)
        return {"o_emb": out}

    @staticmethod
    def memories(config, stim):
        from .placement import pack_tables
        return pack_tables(config.rec_model, config.placement, config.contents)

    @staticmethod
    def report(config, stim, summary, samples):
        """The placement and the cycle model's interval next to the measured one."""
        rate = summary["results_per_cycle"]
        return {"placement": config.placement.to_dict(),
                "model_initiation_interval": config.interval,
                "measured_initiation_interval":
                    round(config.out_beats / rate, 3) if rate else None}

    @staticmethod
    def cycles_bound(config, stim):
        perf = config.performance(
            config.workload(items=len(stim["indices"]), memory_latency=50))
        return perf["cycles"] + 100


#: Simulated by tests/test_sim.py (200 inferences each, 30% stalls): the default 13-table model
#: on on-chip memory, 4 HBM and 2 DDR channels (two-word rows on HBM); one table alone with the
#: fewest credits (throughput limited by the latency); 8-bit elements with "flag" out-of-range
#: handling and one-element output beats; a channel-bound configuration (one HBM channel with
#: many lookups, wide output beats) with narrow indices (many out-of-range values); and a
#: DDR-only board (u250) with two-word rows.
TEST_CONFIGS = (
    {"tables": 13},
    {"tables": 1, "dense": 0, "rows_max": 37, "dim_min": 5, "dim_max": 5, "lanes": 3,
     "onchip_bytes": 0, "inflight": 2},
    {"tables": 6, "elem_bits": 8, "oob": "flag", "lanes": 1, "dim_max": 9, "dense": 3,
     "rows_max": 500, "hbm_table_max_bytes": 1024, "model_seed": 3},
    {"tables": 9, "hbm_channels": 1, "ddr_channels": 1, "lanes": 64, "index_bits": 12,
     "onchip_bytes": 0, "dim_max": 8, "rows_max": 2000, "oob": "flag", "inflight": 8},
    {"tables": 7, "board": "u250", "ddr_channels": 3, "dim_max": 40, "lanes": 8,
     "model_seed": 11},
)
