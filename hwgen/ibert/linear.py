"""I-BERT Linear layer: INT8 x INT8 -> INT32 matrix multiply with bias (paper section 7.1.1,
Fig. 11).

``Y (M x N) = X (M x K) @ W^T + b`` with the weights ``W`` (``N x K`` int8) and the bias ``b``
(``N`` int32) in on-chip memories and the input matrix streamed row by row. The Matrix
Multiply module is organised in two levels: ``tiles`` Tiles compute different output columns,
and each Tile's ``pes`` PEs compute partial dot products over different slices of the row,
summed by an adder tree; the bias addition follows. Rows are independent, so a matrix of any
number of rows M (1 .. unbounded) is processed without padding: the sequence length never has
to be padded to a maximum.

Small configuration used for ``hwgen sim ibert-linear`` (the defaults): K = 128, N = 64,
8 tiles x 16 PEs. BERT-base sizes: ``--set in_features=768 --set out_features=768 --set
tiles=16 --set pes=48`` (768 MACs per cycle, 768 cycles per row).
"""

from dataclasses import dataclass
from functools import cached_property

import numpy as np
from amaranth.hdl import Cat, Module, Signal, signed
from amaranth.lib import data, memory, stream, wiring
from amaranth.lib.wiring import In, Out

from .. import contract
from ..config import Config, param
from ..errors import ConfigError
from ..flow.model import StreamModel
from ..flow.netlist_count import LUTRAM_DEPTH
from ..lib.pipeline import CreditBuffer, adder_tree, delay
from ..lib.row_ports import RowKernel, RowPort
from . import golden
from .matrix_common import ceil_div, matrix_int8, matrix_sizes, random_int8
from .param_files import int_array, load_arrays, with_file_digest

__all__ = ["LinearConfig", "Linear", "LinearModel", "TEST_CONFIGS", "OPERAND_STAGES"]

#: Registers between a memory's read data and a multiplier when the weight memories are
#: distributed RAM (whose read data come from a flip-flop): the multiplier's input register
#: (the one the ECP5 flow packs into the MULT18X18D). Block-RAM weight memories add one more,
#: the block RAM's output register in the fabric (:attr:`LinearConfig.operand_stages`).
OPERAND_STAGES = 1

#: Largest |x * w| of int8 operands (-128 * -128).
_PRODUCT_MAX = 1 << 14


@dataclass(frozen=True)
class LinearConfig(Config, RowKernel):
    """Configuration of ``ibert-linear`` (:class:`Linear`): the matrix sizes K
    (``in_features``) and N (``out_features``), the parallelism (``tiles`` output columns at
    once, ``pes`` MACs per Tile) and the weights (drawn from ``weight_seed`` or read from the
    ``weights`` file)."""
    in_features: int = param(128, "K: input features (row length of X and W)", lo=1, hi=8192)
    out_features: int = param(64, "N: output features (rows of W, row length of Y)",
                              lo=1, hi=8192)
    tiles: int = param(8, "Tiles: output columns computed in parallel (divides N)",
                       lo=1, hi=256)
    pes: int = param(16, "PEs per Tile: MACs per Tile per cycle, each over its slice of K",
                     lo=1, hi=256)
    weight_seed: int = param(1, "seed of numpy's default_rng drawing W (int8) and b (int32)",
                             lo=0, hi=2 ** 32 - 1)
    weights: str = param("", "path of an .npz file (numpy.savez) with w (out_features x "
                             "in_features, int8) and b (out_features, int32), e.g. "
                             "hwgen.ibert.minilm.export's layer<L>_<linear>.npz; replaces the "
                             "W and b drawn from weight_seed (empty: drawn)")

    def check(self):
        if self.out_features % self.tiles:
            divisors = [d for d in range(1, min(self.out_features, 256) + 1)
                        if self.out_features % d == 0]
            raise ConfigError("tiles", f"must divide out_features={self.out_features} "
                              f"(allowed: {', '.join(map(str, divisors))})", value=self.tiles)
        if self.pes > self.in_features:
            raise ConfigError("pes", f"must be in 1..in_features={self.in_features}",
                              value=self.pes)
        if self.weights:
            _ = self.parameters            # reads and checks the file

    def digest(self):
        return with_file_digest(super().digest(), self.weights)

    # -- derived sizes ------------------------------------------------------------------------

    @property
    def steps(self):
        """S: input beats per row, and cycles per output group (``ceil(K / pes)``)."""
        return ceil_div(self.in_features, self.pes)

    @property
    def groups(self):
        """G: output beats per row (``N / tiles``)."""
        return self.out_features // self.tiles

    @property
    def tree_latency(self):
        """Register stages of a Tile's adder tree over its ``pes`` partial dot products:
        ``ceil(log2(pes))``."""
        return (self.pes - 1).bit_length()

    @property
    def latency(self):
        """Cycles from issuing a group's last step to its result entering the output FIFO:
        memory read, operand registers (:attr:`operand_stages`), product, accumulate, adder
        tree, bias."""
        return 4 + self.operand_stages + self.tree_latency

    @property
    def operand_stages(self):
        """Registers from a memory's read data to a multiplier: ``OPERAND_STAGES``, plus one
        when a weight memory (``G * S`` words) is deeper than distributed RAM takes
        (:data:`hwgen.flow.netlist_count.LUTRAM_DEPTH`): a block RAM's read data then go
        into a fabric register before the multiplier's input register."""
        return OPERAND_STAGES + int(self.groups * self.steps > LUTRAM_DEPTH)

    @property
    def bias_range(self):
        """Bias values for which ``x @ w + b`` always fits int32."""
        room = self.in_features * _PRODUCT_MAX
        return -(1 << 31) + room, (1 << 31) - 1 - room

    @cached_property
    def parameters(self):
        """``(W, b)``: ``W`` (N x K int8) and ``b`` (N int32), int64 arrays: the arrays ``w``
        and ``b`` of the file :attr:`weights` (:meth:`file_parameters`) or, without one, drawn
        with ``numpy.random.default_rng(weight_seed)``.

        Drawn, W is uniform over int8 with row 0 all -128 and row 1 all 127; b is uniform over
        :attr:`bias_range` for even columns and over +-2**16 (realistic magnitudes) for odd
        columns, with the range ends at columns 0 and 1.
        """
        if self.weights:
            return self.file_parameters()
        rng = np.random.default_rng(self.weight_seed)
        n, k = self.out_features, self.in_features
        w = random_int8(rng, (n, k))
        w[0] = -128
        if n > 1:
            w[1] = 127
        lo, hi = self.bias_range
        b = rng.integers(lo, hi, size=n, endpoint=True)
        small = rng.integers(-(1 << 16), 1 << 16, size=n, endpoint=True)
        b[1::2] = small[1::2]
        b[0] = hi
        if n > 1:
            b[1] = lo
        return w, b

    def file_parameters(self):
        """``(W, b)`` of the file :attr:`weights`, checked: ``w`` N x K integers in int8,
        ``b`` N integers in int32 such that ``x @ W[n] + b[n]`` fits int32 for every int8 row
        ``x`` (the hardware's output is 32 bits); otherwise a :class:`ConfigError` naming
        ``weights``."""
        n, k, path = self.out_features, self.in_features, self.weights
        a = load_arrays("weights", path, ("w", "b"))
        w = int_array("weights", path, "w", a["w"], (n, k), -128, 127)
        b = int_array("weights", path, "b", a["b"], (n,), -(1 << 31), (1 << 31) - 1)
        top = np.where(w > 0, 127 * w, -128 * w).sum(axis=1) + b        # largest x @ w + b
        bottom = np.where(w > 0, -128 * w, 127 * w).sum(axis=1) + b
        bad = np.flatnonzero((top > (1 << 31) - 1) | (bottom < -(1 << 31)))
        if bad.size:
            i = int(bad[0])
            raise ConfigError("weights", f"output {i}: x @ w[{i}] + b[{i}] reaches "
                              f"{int(bottom[i])}..{int(top[i])} over int8 rows x, beyond int32",
                              value=path)
        return w, b

    def weight_words(self):
        """Init of each Tile's weight memory: address ``g * S + j`` of Tile ``t`` holds
        ``W[g * tiles + t, j * pes .. j * pes + pes - 1]`` (zero past K)."""
        w, _ = self.parameters
        padded = np.zeros((self.out_features, self.steps * self.pes), dtype=np.int64)
        padded[:, :self.in_features] = w
        # [g, t, j, p] -> tile t, address g * S + j, lane p
        blocks = padded.reshape(self.groups, self.tiles, self.steps, self.pes)
        return [blocks[:, t].reshape(self.groups * self.steps, self.pes).tolist()
                for t in range(self.tiles)]

    @dataclass(frozen=True)
    class Workload(contract.Workload):
        """The workload of :meth:`cycle_model` (None: steady-state figures only)."""
        rows: int = None     # rows of the input matrix

    def cycle_model(self, workload):
        """Cycle model (:func:`hwgen.ibert.model.linear_cycles`), for ``rows`` rows."""
        rows = workload.rows
        from .model import linear_cycles
        return linear_cycles(self, rows)

    def row_ports(self):
        """``i_x``: int8 rows of ``in_features`` on ``pes`` lanes; ``o_y``: int32 rows of
        ``out_features`` on ``tiles`` lanes; both mark the matrix's last row."""
        return ([RowPort("i_x", "x", signed(8), self.pes, self.in_features, last_row=True)],
                RowPort("o_y", "y", signed(32), self.tiles, self.out_features, last_row=True))

    def row_timing(self, m):
        """:meth:`RowKernel.row_timing`: a row's output follows its input after the matrix
        pass less the input steps; one row every ``cycles_per_row``."""
        p = self.performance(self.workload(rows=1))
        return p["cycles_per_matrix"] - self.steps, p["cycles_per_row"]

    def derived(self):
        return {"steps": self.steps, "groups": self.groups,
                "cycles_per_row": self.steps * self.groups,
                "macs": self.tiles * self.pes, "pipeline_latency": self.latency,
                "weight_memory_bits": self.groups * self.steps * self.tiles * self.pes * 8,
                "output_fifo_depth": self.latency + 3}


def input_layout(pes):
    """Payload of ``i_x``: one beat of ``pes`` int8 row elements ``x``, ``last_row`` (the
    matrix's last row) and ``last`` (TLAST, the row's last beat)."""
    return data.StructLayout({"x": data.ArrayLayout(signed(8), pes), "last_row": 1, "last": 1})


def output_layout(tiles):
    """Payload of ``o_y``: one beat of ``tiles`` int32 results ``y``, ``last_row`` and
    ``last`` (TLAST, the row's last beat)."""
    return data.StructLayout({"y": data.ArrayLayout(signed(32), tiles), "last_row": 1,
                              "last": 1})


class Linear(wiring.Component):
    """Linear layer ``Y = X @ W^T + b`` with on-chip weights.

    Parameters
    ----------
    config : LinearConfig

    Members
    -------
    i_x : ``In(stream.Signature(input_layout(pes)))``
        Input rows. A row of K int8 values is ``S = ceil(K / pes)`` beats; beat ``j`` carries
        ``x[j * pes .. j * pes + pes - 1]`` (lanes past K in a row's last beat are ignored).
        The core counts beats: TLAST must be set on each row's beat ``S - 1``. ``last_row``
        (read on that beat) marks the last row of a matrix; it is passed to the output.
    o_y : ``Out(stream.Signature(output_layout(tiles)))``
        Output rows: ``G = N / tiles`` beats per row, beat ``g`` carrying
        ``y[g * tiles .. g * tiles + tiles - 1]`` (int32, never overflows: the bias is limited
        to :attr:`LinearConfig.bias_range`). TLAST on each row's last beat; ``last_row`` on
        every beat of a row whose input had ``last_row``.

    Organisation
    ------------
    PE ``p`` of Tile ``t`` multiplies lane ``p`` of every input beat (K indices ``p, p + pes,
    ...``) with the matching weights of output columns ``t, t + tiles, ...``: one MAC per
    cycle, ``S`` cycles per output column; the Tile's adder tree sums its PEs' partial dot
    products and adds the bias. Input rows are double-buffered (two rows of ``S`` beats), so the
    next row loads while the current one is computed.

    Timing
    ------
    A row takes ``G * S`` cycles (initiation interval); consecutive rows follow without a gap
    and one input beat is accepted per cycle while a row buffer is free. Latency from a row's
    first beat to its first result: ``2 * S + 5 + operand_stages + ceil(log2 pes)`` cycles
    (loading, the first group, memory read, operand registers, product, accumulate, adder tree, bias, output
    FIFO); the row's other results follow every ``S`` cycles. Exact formulas: :func:`hwgen.ibert.model.linear_cycles`.

    Backpressure: ``o_y`` may stall at any time; the issue of groups pauses when the output FIFO
    could fill (credits), never combinationally from ``o_y.ready``. ``i_x`` is ready while a
    row buffer is free.
    """

    def __init__(self, config):
        self.config = c = config
        super().__init__({
            "i_x": In(stream.Signature(input_layout(c.pes))),
            "o_y": Out(stream.Signature(output_layout(c.tiles))),
        })

    def elaborate(self, platform):
        c = self.config
        m = Module()
        S, G, pes, tiles = c.steps, c.groups, c.pes, c.tiles
        sbits = (S - 1).bit_length()

        # -- input row buffer: two rows, bank bit above the beat index -------------------------
        xmem = memory.Memory(shape=data.ArrayLayout(signed(8), pes), depth=2 << sbits, init=[])
        m.submodules.xmem = xmem
        x_wr, x_rd = xmem.write_port(), xmem.read_port()

        full = Signal(range(3))            # complete rows in the buffer
        wbank, wbeat = Signal(), Signal(range(S))
        row_flag = Signal(2)               # last_row of each bank
        load = Signal()
        m.d.comb += [
            self.i_x.ready.eq(full < 2),
            load.eq(self.i_x.valid & self.i_x.ready),
            x_wr.addr.eq(Cat(wbeat, wbank)),
            x_wr.data.eq(self.i_x.payload.x),
            x_wr.en.eq(load),
        ]
        load_done = Signal()
        m.d.comb += load_done.eq(load & (wbeat == S - 1))
        with m.If(load):
            m.d.sync += wbeat.eq(wbeat + 1)
            with m.If(wbeat == S - 1):
                m.d.sync += [wbeat.eq(0), wbank.eq(~wbank)]
                with m.Switch(wbank):
                    for k in range(2):
                        with m.Case(k):
                            m.d.sync += row_flag[k].eq(self.i_x.payload.last_row)

        # -- issue: group g, step j of the oldest loaded row, one step per cycle -----------------
        m.submodules.out = out = CreditBuffer(output_layout(tiles), latency=c.latency)
        wiring.connect(m, wiring.flipped(self.o_y), out.o)

        rbank = Signal()
        j = Signal(range(S))
        g = Signal(range(G))
        waddr = Signal(range(G * S))       # g * S + j
        final_j, final_g, issue, row_done = Signal(), Signal(), Signal(), Signal()
        m.d.comb += [
            final_j.eq(j == S - 1),
            final_g.eq(g == G - 1),
            issue.eq((full != 0) & (~final_j | out.ready)),
            out.take.eq(issue & final_j),
            row_done.eq(issue & final_j & final_g),
            x_rd.addr.eq(Cat(j, rbank)),
        ]
        with m.If(issue):
            m.d.sync += [j.eq(j + 1), waddr.eq(waddr + 1)]
            with m.If(final_j):
                m.d.sync += [j.eq(0), g.eq(g + 1)]
                with m.If(final_g):
                    m.d.sync += [g.eq(0), waddr.eq(0), rbank.eq(~rbank)]
        m.d.sync += full.eq(full + load_done - row_done)
        self._tiles(m, out, x_rd, issue, j, g, waddr)

        done = issue & final_j
        row_last = Signal()
        m.d.comb += row_last.eq(row_flag.bit_select(rbank, 1))
        m.d.comb += [
            out.i.valid.eq(delay(m, done, c.latency, name="out_valid")),
            out.i.payload.last.eq(delay(m, final_g, c.latency, name="out_last")),
            out.i.payload.last_row.eq(delay(m, row_last, c.latency, name="out_last_row")),
        ]
        return m

    def _tiles(self, m, out, x_rd, issue, j, g, waddr):
        """Datapath: each tile multiplies the input beat ``x_rd.data`` by its weight word
        (``pes`` products), accumulates over a group's steps, sums the products, adds the
        group's bias and drives its lane of ``out.i.payload.y``."""
        c = self.config
        S, G, pes, tiles = c.steps, c.groups, c.pes, c.tiles
        sbits = (S - 1).bit_length()
        _, bias = c.parameters
        # -- datapath ----------------------------------------------------------------------------
        # Memory read into its read register (cycle 1), a register per multiplier input (2),
        # product (3). The last two are reset-less so that the ECP5 flow packs them into the
        # MULT18X18D's own registers (hwgen.flow.ecp5_dsp_pack); the valid and first flags
        # travel beside them. (One more register between them would make a three-deep
        # shift chain that synth_xilinx maps to SRL16E.)
        # Block-RAM weights: their read data and x's go through one more register first.
        prod_at = 2 + c.operand_stages
        v_prod = delay(m, issue, prod_at, name="v")            # product valid
        first_prod = delay(m, j == 0, prod_at, name="first")
        bias_addr = delay(m, g, prod_at + c.tree_latency, name="bias_addr")
        extra = c.operand_stages - OPERAND_STAGES
        x_data = [delay(m, x_rd.data[p], extra, name=f"x_q{p}", reset_less=True)
                  for p in range(pes)]
        words = c.weight_words()
        for t in range(tiles):
            wmem = memory.Memory(shape=data.ArrayLayout(signed(8), pes), depth=G * S,
                                 init=words[t])
            m.submodules[f"wmem{t}"] = wmem
            w_rd = wmem.read_port()
            m.d.comb += w_rd.addr.eq(waddr)
            accs = []
            for p in range(pes):
                x_op, w_op = (Signal(signed(8), name=f"{n}{t}_{p}", reset_less=True)
                              for n in ("x_op", "w_op"))
                prod = Signal(signed(16), name=f"prod{t}_{p}", reset_less=True)
                acc = Signal(signed(16 + sbits), name=f"acc{t}_{p}")
                w_data = delay(m, w_rd.data[p], extra, name=f"w_q{t}_{p}", reset_less=True)
                m.d.sync += [x_op.eq(x_data[p]), w_op.eq(w_data), prod.eq(x_op * w_op)]
                with m.If(v_prod):
                    with m.If(first_prod):
                        m.d.sync += acc.eq(prod)
                    with m.Else():
                        m.d.sync += acc.eq(acc + prod)
                accs.append(acc)
            total, lat = adder_tree(m, accs, name=f"dot{t}")
            assert lat == c.tree_latency
            bmem = memory.Memory(shape=signed(32), depth=G, init=[int(bias[g_ * tiles + t])
                                                                  for g_ in range(G)])
            m.submodules[f"bias{t}"] = bmem
            b_rd = bmem.read_port()
            m.d.comb += b_rd.addr.eq(bias_addr)
            y = Signal(signed(32), name=f"y{t}")
            m.d.sync += y.eq(total + b_rd.data)
            m.d.comb += out.i.payload.y[t].eq(y)


class LinearModel(StreamModel):
    """Stream-level golden model and stimulus of :class:`Linear` for the testbench.

    The item unit of ``hwgen sim --items`` is one input row: ``items`` rows are split into
    matrices of M = 1, 7, 128 (the maximum BERT sequence length) and then random M in 1..128
    (:func:`~hwgen.ibert.matrix_common.matrix_sizes`).
    """

    #: How :meth:`stimulus` holds the rows of each element field (``{field: (stimulus key,
    #: form)}``; form ``mats``, ``array`` or ``list``: :class:`~hwgen.cluster.gateware.compute.KernelChain`).
    row_fields = {"x": ("x", "mats")}

    result_port = "o_y"
    latency_from = "i_x"

    #: Contents of successive matrices (then repeated).
    KINDS = ("min", "max", "random", "alternate", "realistic")

    @classmethod
    def stimulus(cls, config, items, rng, sizes=None, max_len=128):
        """Matrices of ``sizes`` rows (default: ``items`` rows split by
        :func:`~hwgen.ibert.matrix_common.matrix_sizes`), each filled with one of
        :attr:`KINDS`: all -128, all 127, uniform int8, a -128/127 checkerboard, or
        activation-like values (a rounded normal distribution, sigma 24, clipped to int8); random
        matrices also get a few all -128 and all 127 rows. Lanes past K in a row's last beat
        carry random values (the core must ignore them)."""
        sizes = list(sizes) if sizes is not None else matrix_sizes(items, max_len, rng)
        k = config.in_features
        mats = [matrix_int8(cls.KINDS[i % len(cls.KINDS)], (m, k), rng)
                for i, m in enumerate(sizes)]
        pad = config.steps * config.pes - k
        junk = [random_int8(rng, (m, pad)) for m in sizes]
        return {"x": mats, "junk": junk}

    @staticmethod
    def inputs(config, stim):
        """``i_x``: each row of each matrix in ``steps`` beats of ``pes`` int8 lanes ``x`` (the row,
        then its ``junk`` padding), ``last`` on the row's final beat, ``last_row`` on every beat of
        the matrix's final row."""
        c = config
        beats = []
        for x, junk in zip(stim["x"], stim["junk"]):
            rows = np.concatenate([x, junk], axis=1).reshape(len(x), c.steps, c.pes)
            for r, row in enumerate(rows):
                for j, lanes in enumerate(row):
                    beats.append({"x": lanes.tolist(), "last_row": int(r == len(x) - 1),
                                  "last": int(j == c.steps - 1)})
        return {"i_x": beats}

    @staticmethod
    def expect(config, stim):
        """``o_y``: :func:`hwgen.ibert.golden.linear` of each matrix with the config's
        ``parameters`` ``(W, b)``; each row's N outputs in order, ``groups`` beats of ``tiles``
        int32 lanes ``y``, ``last`` on the row's final beat, ``last_row`` on every beat of the
        matrix's final row."""
        c = config
        w, b = c.parameters
        beats = []
        for x in stim["x"]:
            y, _ = golden.linear(x, w, b)
            for r, row in enumerate(y.reshape(len(x), c.groups, c.tiles)):
                for g, lanes in enumerate(row):
                    beats.append({"y": lanes.tolist(), "last_row": int(r == len(x) - 1),
                                  "last": int(g == c.groups - 1)})
        return {"o_y": beats}

    @staticmethod
    def cycles_bound(config, stim):
        rows = sum(len(x) for x in stim["x"])
        return rows * config.steps * config.groups + 100


#: Simulated by tests/test_sim.py (200 rows each): odd sizes (K % pes != 0, G = 3), the
#: smallest (one MAC, one cycle per row), one-beat rows of two groups, the default, and BERT-base's K = 768
#: with 16 tiles x 48 PEs (N reduced to 48 for simulation time).
TEST_CONFIGS = (
    {"in_features": 37, "out_features": 15, "tiles": 5, "pes": 4, "weight_seed": 7},
    {"in_features": 1, "out_features": 1, "tiles": 1, "pes": 1},
    {"in_features": 24, "out_features": 16, "tiles": 8, "pes": 24, "weight_seed": 3},
    {},
    {"in_features": 768, "out_features": 48, "tiles": 16, "pes": 48, "weight_seed": 11},
)
