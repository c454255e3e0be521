"""I-BERT integer LayerNorm (``IntLayerNorm`` of the reference, paper sections 2.4 and 7).

Each row of ``H`` integers ``q`` is normalised without floating point, bit-exactly as
:func:`hwgen.ibert.golden.int_layernorm`::

    mean   = round_half_even(sum(q) / H)          exact: reciprocal multiply + correction
    y      = q - mean
    var    = sum((y >> shift)**2)                  < 2**32 for every row (checked by the config)
    std    = isqrt(var) << shift                   exact restoring square root
    factor = floor(2**31 / std)   (0 if std == 0)  = floor(2**(31 - shift) / isqrt(var))
    out    = floor(y * factor / 2) + bias_int[e]

``bias_int`` (one per element ``e``) and the output scale come from
:func:`golden.layernorm_constants` of the layer's float weight and bias; the configuration draws
them reproducibly from ``param_seed`` or reads them from the ``.npz`` file ``params`` (a real
model's ``weight`` and ``bias``, or the ``bias_int`` of :func:`hwgen.ibert.minilm.export`), and
the integers sit in an on-chip ROM.

The row is needed three times (sum, variance around the rounded mean, output), so it is kept
in an on-chip circular buffer: it is summed while it streams in, read once for the variance
once the mean is known and once more for the output once ``factor`` is known. Different rows
occupy the three phases at the same time, so rows stream at ``H / lanes`` cycles each.
"""

from dataclasses import dataclass
from functools import cached_property

import numpy as np
from amaranth.hdl import Cat, Const, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, fifo, memory, stream, wiring
from amaranth.lib.wiring import In, Out

from .. import contract
from ..config import Config, param
from ..errors import ConfigError
from ..flow.model import StreamModel
from ..lib.pipeline import CreditBuffer, adder_tree, delay
from ..lib.registered import compare_subtract, register_copies, sqrt_pipeline
from ..lib.row_ports import RowKernel, RowPort
from ..lib.wide_mul import split_multiply, split_multiply_stages
from . import golden
from .param_files import float_array, int_array, load_arrays, with_file_digest

__all__ = ["LayerNormConfig", "LayerNorm", "LayerNormModel", "TEST_CONFIGS",
           "layernorm_params"]

#: log2 of the numerator of the reciprocal of the standard deviation (``factor = 2**31 // std``).
FACTOR_BIT = golden.LAYERNORM_MAX_BIT - 1
#: Cycles of the mean unit besides its two multiplications (remainder, correction and rounding
#: decisions, rounded mean).
MEAN_STEPS = 3
#: Largest |bias_int| read from a file (the output then has at most 42 bits).
BIAS_INT_MAX = 1 << 40
#: Attributes of a memory whose ports never read and write one address in the same cycle:
#: yosys's ``no_rw_check`` then maps the read ports without collision logic (a multiplexer
#: between the block RAM's output and a bypass register on ECP5).
NO_COLLISIONS = {"no_rw_check": 1}


def layernorm_params(hidden, seed):
    """Float32 ``(weight, bias)`` of a LayerNorm drawn from ``seed``: weight in 0.5..1.5, bias in
    -0.5..0.5 (``numpy.random.default_rng(seed).uniform``)."""
    rng = np.random.default_rng(seed)
    weight = rng.uniform(0.5, 1.5, hidden).astype(np.float32)
    bias = rng.uniform(-0.5, 0.5, hidden).astype(np.float32)
    return weight, bias


def _wrap_inc(value, modulo):
    """``value + 1`` modulo ``modulo`` (a ring index)."""
    return Mux(value == modulo - 1, 0, value + 1)


def _signed_bits(lo, hi):
    """Bits of the narrowest signed integer holding ``lo .. hi``."""
    return max((-lo - 1).bit_length() if lo < 0 else 0, hi.bit_length() if hi > 0 else 0) + 1


@dataclass(frozen=True)
class LayerNormConfig(Config, RowKernel):
    """Configuration of ``ibert-layernorm`` (:class:`LayerNorm`): the row length ``hidden``,
    the beat width ``lanes`` (dividing ``hidden``), the input width ``in_bits``, the variance's
    pre-shift ``shift`` and where the weight and bias come from (``param_seed`` or the
    ``params`` file)."""
    hidden: int = param(768, "elements per row H (BERT-base: 768)", lo=1, hi=8192)
    lanes: int = param(8, "elements per stream beat (must divide hidden); a row takes "
                          "hidden / lanes cycles", lo=1, hi=64)
    in_bits: int = param(22, "bits of a signed input element (I-BERT's LayerNorm input "
                             "QuantAct: 22)", lo=2, hi=32)
    shift: int = param(10, "right shift of q - mean before squaring; must keep the variance "
                           "below 2**62 for every possible row (see var_bound)", lo=0, hi=31)
    param_seed: int = param(0, "seed of the layer's float32 weight (uniform 0.5..1.5) and bias "
                               "(uniform -0.5..0.5), drawn with numpy's default_rng",
                            lo=0, hi=2 ** 32 - 1)
    params: str = param("", "path of an .npz file (numpy.savez) with the layer's float32 "
                            "weight and bias (hidden,), or with int bias_int (hidden,) as "
                            "hwgen.ibert.minilm.export's layer<L>_ln<1|2>.npz; replaces the "
                            "weight and bias drawn from param_seed (empty: drawn)")

    def check(self):
        if self.hidden % self.lanes:
            raise ConfigError("lanes", f"must divide hidden={self.hidden} (allowed: "
                              + ", ".join(str(d) for d in range(1, min(self.hidden, 64) + 1)
                                          if self.hidden % d == 0) + ")", value=self.lanes)
        if self.var_max >= 1 << golden.ISQRT_MAX_BIT:
            raise ConfigError("shift", f"must be at least {self.min_shift()} so that the "
                              f"variance of {self.hidden} elements of {self.in_bits} bits stays "
                              f"below 2**{golden.ISQRT_MAX_BIT}", value=self.shift)
        if self.params:
            _ = self.constants             # reads and checks the file

    def digest(self):
        return with_file_digest(super().digest(), self.params)

    # -- value ranges and widths ---------------------------------------------------------------

    @staticmethod
    def ys_max(in_bits, shift):
        """Largest ``|(q - mean) >> shift|``: ``|q - mean| <= 2**in_bits - 1`` (the rounded mean
        lies between the row's extremes) and the floor shift rounds negative values away from 0."""
        return -(-((1 << in_bits) - 1) >> shift)

    @classmethod
    def var_bound(cls, hidden, in_bits, shift):
        """Upper bound of ``var = sum(((q - mean) >> shift)**2)`` over all rows.

        The smaller of ``hidden * ys_max**2`` and ``H * (2**in_bits + 2**(shift+1))**2 /
        4**(shift+1)``, rounded up. The second: with ``W = max(q) - min(q) <= 2**in_bits - 1``,
        ``sum((q - mean)**2) <= H W**2 / 4`` (Popoviciu) and rounding the mean adds at most
        ``H / 4``; ``|y >> shift| <= |y| / 2**shift + 1``; Cauchy-Schwarz then bounds the sum
        by ``H (sqrt(W**2 + 1) / 2**(shift+1) + 1)**2 < H ((W + 1) / 2**(shift+1) + 1)**2``.
        """
        per_element = hidden * cls.ys_max(in_bits, shift) ** 2
        num = hidden * ((1 << in_bits) + (1 << (shift + 1))) ** 2
        spread = -(-num >> (2 * shift + 2))
        return min(per_element, spread)

    @property
    def var_max(self):
        """:meth:`var_bound` of this configuration."""
        return self.var_bound(self.hidden, self.in_bits, self.shift)

    def min_shift(self):
        """The smallest shift for which :attr:`var_max` is below ``2**ISQRT_MAX_BIT`` (62: the
        square root and the int64 golden model; the reference's calibration aims at 2**32 on
        the rows it sees, a later row may exceed it)."""
        return next(s for s in range(64)
                    if self.var_bound(self.hidden, self.in_bits, s)
                    < 1 << golden.ISQRT_MAX_BIT)

    @property
    def beats(self):
        """Beats (and cycles) per row."""
        return self.hidden // self.lanes

    @property
    def var_bits(self):
        """Bits of the unsigned variance ``sum(((q - mean) >> shift)**2)`` (of
        :attr:`var_max`; at least 1)."""
        return max(self.var_max.bit_length(), 1)

    @property
    def sqrt_width(self):
        """Width of the square-root unit: ``var_bits`` rounded up to even."""
        return self.var_bits + self.var_bits % 2

    @property
    def root_bits(self):
        """Bits of ``isqrt(var)``: half of :attr:`sqrt_width`."""
        return self.sqrt_width // 2

    @property
    def factor_bits(self):
        """``factor = floor(2**(31 - shift) / root) <= 2**(31 - shift)``: quotient bits, and
        restoring division steps."""
        return FACTOR_BIT - self.shift + 1

    @cached_property
    def _file(self):
        """The arrays of the file :attr:`params`: ``weight`` and ``bias``, or ``bias_int``."""
        a = load_arrays("params", self.params, (),
                        optional=("weight", "bias", "bias_int", "out_scale"))
        if "bias_int" not in a and not {"weight", "bias"} <= a.keys():
            raise ConfigError("params", "the file holds neither weight and bias nor bias_int",
                              value=self.params)
        return a

    @cached_property
    def weight_bias(self):
        """Float32 ``(weight, bias)``: drawn from ``param_seed``, or the file :attr:`params`'s
        ``weight`` and ``bias``; None for a file holding ``bias_int``."""
        path, h = self.params, (self.hidden,)
        if not path:
            return layernorm_params(self.hidden, self.param_seed)
        if "bias_int" in self._file:
            return None
        return (float_array("params", path, "weight", self._file["weight"], h),
                float_array("params", path, "bias", self._file["bias"], h))

    @cached_property
    def constants(self):
        """:func:`golden.layernorm_constants` of the layer (``bias_int``, ``out_scale``, ...);
        for a file with ``bias_int``: that (integers within +-2**40) and the file's
        ``out_scale`` if it holds one."""
        path, h = self.params, (self.hidden,)
        if self.weight_bias is not None:
            weight, bias = self.weight_bias
            if path:
                norm_scale = golden.layernorm_constants(1, 0, self.hidden)["norm_scale"]
                with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
                    top = np.abs((bias / weight) / norm_scale).max()
                if not top <= BIAS_INT_MAX:             # also NaN, inf: a zero weight
                    raise ConfigError("params", f"the integer bias (bias / weight / "
                                      f"norm_scale) must stay within +-2**40 (it reaches "
                                      f"{top:g})", value=path)
            return golden.layernorm_constants(weight, bias, self.hidden)
        consts = {"bias_int": int_array("params", path, "bias_int", self._file["bias_int"], h,
                                        -BIAS_INT_MAX, BIAS_INT_MAX)}
        if "out_scale" in self._file:
            consts["out_scale"] = float_array("params", path, "out_scale",
                                              self._file["out_scale"], h)
        return consts

    def normalise(self, rows):
        """:func:`golden.int_layernorm` of ``rows`` (scale 1, ``shift``) with this layer's
        constants. With ``bias_int`` only: the normalisation of weight 1 and bias 0 (whose
        ``bias_int`` is 0) plus ``bias_int``."""
        if self.weight_bias is not None:
            return golden.int_layernorm(rows, 1.0, *self.weight_bias, self.shift)[0]
        ones, zeros = np.ones(self.hidden, np.float32), np.zeros(self.hidden, np.float32)
        out, _ = golden.int_layernorm(rows, 1.0, ones, zeros, self.shift)
        return out + self.constants["bias_int"]

    @property
    def bias_range(self):
        """``(lo, hi)`` of the integer bias ``bias_int`` over the row's elements."""
        b = self.constants["bias_int"]
        return int(b.min()), int(b.max())

    @property
    def bias_bits(self):
        """Bits of a signed value that holds every ``bias_int`` (:attr:`bias_range`)."""
        return _signed_bits(*self.bias_range)

    @property
    def norm_range(self):
        """Range of ``floor(y * factor / 2)``: ``-2**30 .. 2**31 - 1``.

        With ``r = isqrt(var) >= 1`` and ``std = r << shift``: ``|y >> shift| <= r`` for every
        element, so ``-std <= y < std + 2**shift <= 2 * std`` and ``factor <= 2**31 / std``,
        hence ``-2**31 <= y * factor < 2**32``. With ``var = 0``, ``factor = 0``.
        """
        return -(1 << (FACTOR_BIT - 1)), (1 << FACTOR_BIT) - 1

    @property
    def out_bits(self):
        """Bits of the signed output ``floor(y * factor / 2) + bias_int``
        (:attr:`norm_range` plus :attr:`bias_range`)."""
        lo, hi = self.norm_range
        blo, bhi = self.bias_range
        return _signed_bits(lo + blo, hi + bhi)

    # -- exact division of the row sum by H (reciprocal multiply, one correction) ----------------

    @property
    def mean_offset(self):
        """Added to the sum so the dividend ``x`` is non-negative: ``H * 2**(in_bits - 1)``."""
        return self.hidden << (self.in_bits - 1)

    @property
    def recip_shift(self):
        """``k``: ``2**k`` exceeds every dividend ``x <= H * (2**in_bits - 1)``."""
        return (self.hidden * ((1 << self.in_bits) - 1)).bit_length()

    @property
    def recip(self):
        """``floor(2**k / H)``. For ``0 <= x < 2**k``: ``x*recip/2**k <= x/H`` and
        ``> x/H - x/2**k > x/H - 1``, so ``floor(x * recip / 2**k)`` is ``floor(x/H)`` or one
        less; one conditional subtraction of ``H`` from the remainder corrects it."""
        return (1 << self.recip_shift) // self.hidden

    # -- latencies (cycles) ---------------------------------------------------------------------

    @property
    def lane_tree_latency(self):
        """Register stages of the adder tree summing a beat's ``lanes`` elements:
        ``ceil(log2(lanes))``."""
        return (self.lanes - 1).bit_length()

    @property
    def x_max(self):
        """Largest dividend ``x = sum + mean_offset``: ``H * (2**in_bits - 1)``."""
        return self.hidden * ((1 << self.in_bits) - 1)

    @property
    def rem_bits(self):
        """Bits of the remainder ``x - floor(x * recip / 2**k) * H`` (below ``2 H``)."""
        return (2 * self.hidden - 1).bit_length()

    @property
    def mean_stages(self):
        """Cycles of the mean unit: ``x * recip`` and ``q * H`` (low :attr:`rem_bits` bits),
        each split and registered (:func:`~hwgen.lib.wide_mul.split_multiply`), then
        ``MEAN_STEPS``."""
        q_bits = (self.x_max // self.hidden).bit_length()
        return (split_multiply_stages(unsigned(self.x_max.bit_length()), self.recip)
                + split_multiply_stages(unsigned(min(q_bits, self.rem_bits)), self.hidden)
                + MEAN_STEPS)

    @property
    def square_stages(self):
        """Register stages of ``((q - mean) >> shift)**2`` (split and registered)."""
        ys = signed(max(self.in_bits + 1 - self.shift, 1))
        return split_multiply_stages(ys, ys)

    @property
    def out_stages(self):
        """Cycles from issuing an output read to the result entering the output FIFO: memory
        read, read data register, ``q - mean``, then ``y * factor`` split and registered
        (the bias is added on the way into the FIFO)."""
        return 3 + split_multiply_stages(signed(self.in_bits + 1), unsigned(self.factor_bits))

    @property
    def mean_ready(self):
        """Cycles from the first beat of a row (accepted back to back) to the cycle the mean is
        valid: ``beats - 1`` more beats, lane adder tree, accumulator, mean unit."""
        return self.beats - 1 + self.lane_tree_latency + 1 + self.mean_stages

    @property
    def var_ready(self):
        """... to the variance: reads issued the cycle after the mean, ``beats`` reads, memory,
        read data register, subtract, square (:attr:`square_stages`), lane adder tree,
        accumulator."""
        return (self.mean_ready + self.beats + 4 + self.square_stages
                + self.lane_tree_latency)

    @property
    def factor_ready(self):
        """... to ``factor`` (square root, then one division step per quotient bit)."""
        return self.var_ready + self.root_bits + self.factor_bits

    @property
    def output_start(self):
        """... to the first output read: factor FIFO (1 cycle), load (1 cycle)."""
        return self.factor_ready + 2

    @property
    def buffer_depth(self):
        """Row-buffer entries (beats): a beat stays from its write until its output read,
        ``output_start`` cycles at full rate; one more keeps the input from ever stalling."""
        return self.output_start + 1

    @property
    def token_depth(self):
        """Rows waiting for the output pass are complete rows in the buffer."""
        return self.buffer_depth // self.beats

    @dataclass(frozen=True)
    class Workload(contract.Workload):
        """The workload of :meth:`cycle_model` (None: steady-state figures only)."""
        rows: int = None     # rows sent back to back

    def cycle_model(self, workload):
        """Cycle model without stalls: ``initiation_interval`` in cycles per row, latency from
        a row's first input beat to its first output beat, and with ``rows`` back-to-back rows
        the cycles from the first input beat to the last output beat, as ``hwgen sim``
        measures them."""
        rows = workload.rows
        latency = self.output_start + self.out_stages + 2
        model = {"initiation_interval": self.beats, "cycles_per_row": self.beats,
                 "latency_cycles": latency}
        if rows:
            model["cycles"] = rows * self.beats + latency
        return model

    def row_ports(self):
        """``i_row``: int(in_bits) rows of ``hidden`` on ``lanes`` lanes; ``o_row``:
        int(out_bits)."""
        return ([RowPort("i_row", "q", signed(self.in_bits), self.lanes, self.hidden)],
                RowPort("o_row", "y", signed(self.out_bits), self.lanes, self.hidden))

    def row_timing(self, m):
        """:meth:`RowKernel.row_timing`: one row every ``cycles_per_row`` cycles."""
        per = self.performance()["cycles_per_row"]
        return self.performance(self.workload(rows=1)).cycles - per, per

    def derived(self):
        return {"cycles_per_row": self.beats,
                "latency_cycles": self.performance()["latency_cycles"],
                "buffer_depth": self.buffer_depth,
                "buffer_bits": self.buffer_depth * self.lanes * self.in_bits,
                "bias_rom_bits": self.hidden * self.bias_bits,
                "var_bits": self.var_bits, "sqrt_steps": self.root_bits,
                "factor_bits": self.factor_bits, "out_bits": self.out_bits,
                "min_shift": self.min_shift(), "recip": self.recip,
                "recip_shift": self.recip_shift}


def row_in(lanes, in_bits):
    """Input beat: ``lanes`` signed elements ``q`` and ``last``."""
    return data.StructLayout({"q": data.ArrayLayout(signed(in_bits), lanes), "last": 1})


def row_out(lanes, out_bits):
    """Output beat: ``lanes`` signed results ``y`` and ``last``."""
    return data.StructLayout({"y": data.ArrayLayout(signed(out_bits), lanes), "last": 1})


class LayerNorm(wiring.Component):
    """I-BERT integer LayerNorm over rows of ``hidden`` elements, ``lanes`` per beat.

    Parameters
    ----------
    config : LayerNormConfig

    Members
    -------
    i_row : ``In(stream.Signature(StructLayout({"q": ArrayLayout(signed(in_bits), lanes), "last": 1})))``
        Input rows, ``hidden / lanes`` beats each, elements ``k * lanes .. k * lanes + lanes - 1``
        in beat ``k``. Rows are delimited by the beat count; ``last`` (TLAST) is expected on
        the final beat of each row and otherwise ignored.
    o_row : ``Out(stream.Signature(StructLayout({"y": ArrayLayout(signed(out_bits), lanes), "last": 1})))``
        Normalised rows in the same layout, ``last`` on the final beat of each row.

    Timing
    ------
    Initiation interval ``hidden / lanes`` cycles per row: rows stream back to back, one beat per
    cycle in and out. Latency from a row's first input beat to its first output beat:
    ``config.performance()["latency_cycles"]`` = ``2 * hidden / lanes + 2 * ceil(log2 lanes) + 8
    + mean_stages + square_stages + out_stages + root_bits + factor_bits`` (the stages of the
    mean unit, the squares and the output pass, whose products are split and registered;
    square-root and division steps): 262 cycles at the defaults (hidden=768, lanes=8,
    in_bits=22, shift=10: 9 + 2 + 7 + 16 + 22 of them).

    The row is written into a circular buffer of ``config.buffer_depth`` beats while its sum
    is accumulated; the mean unit divides by ``H`` exactly; the row is then read for the
    variance; the square root (:func:`~hwgen.lib.registered.sqrt_pipeline`, the algorithm of
    :class:`~hwgen.ibert.isqrt.IntSqrt`, one digit per stage) and the division
    ``2**(31 - shift) // root`` (one quotient bit per stage) are fully pipelined, each step one
    carry chain (:func:`~hwgen.lib.registered.compare_subtract`); the row is read
    a second time for the output. All stages up to the output read are free-running with fixed
    latency (a row's phases never collide because rows are at least ``hidden / lanes`` cycles
    apart); mean/factor tokens wait in small FIFOs for the output pass.

    Backpressure: ``o_row`` may stall at any time. Output reads are admitted by credits of the
    output FIFO; buffer entries are released when read for the output, and ``i_row.ready`` is
    low only while the buffer is full. Neither ``ready`` depends combinationally on the other
    side.
    """

    def __init__(self, config):
        self.config = c = config
        super().__init__({
            "i_row": In(stream.Signature(row_in(c.lanes, c.in_bits))),
            "o_row": Out(stream.Signature(row_out(c.lanes, c.out_bits))),
        })

    def elaborate(self, platform):
        c = self.config
        m = Module()
        lanes, beats, depth, b = c.lanes, c.beats, c.buffer_depth, c.in_bits

        # -- row buffer: one write port, a read port for each of the two passes ----------------
        elem = data.ArrayLayout(signed(b), lanes)
        # No cycle reads and writes one address: a beat is read for the variance after its
        # row was written, and written again only after its output read released it.
        m.submodules.buffer = buf = memory.Memory(shape=elem, depth=depth, init=[],
                                                  attrs=NO_COLLISIONS)
        wr = buf.write_port()
        rd_var = buf.read_port()
        rd_out = buf.read_port()

        used = Signal(range(depth + 1))          # beats written and not yet read for output
        write = Signal()
        release = Signal()
        # ready = used < depth, as a register computed a cycle ahead (used moves by one).
        ready = Signal(init=1)
        m.d.comb += [
            self.i_row.ready.eq(ready),
            write.eq(self.i_row.valid & ready),
        ]
        m.d.sync += [used.eq(used + write - release),
                     ready.eq(Mux(write & ~release, used < depth - 1,
                                  (~write & release) | (used < depth)))]

        wp = Signal(range(depth))
        in_beat = Signal(range(beats))
        row_start = Signal(range(depth))
        first = in_beat == 0
        m.d.comb += [wr.addr.eq(wp), wr.data.eq(self.i_row.payload.q), wr.en.eq(write)]
        with m.If(write):
            m.d.sync += [wp.eq(_wrap_inc(wp, depth)), in_beat.eq(_wrap_inc(in_beat, beats))]
            with m.If(first):
                m.d.sync += row_start.eq(wp)

        row_sum, sum_valid, sum_start = self._row_sum(m, write, first, in_beat, wp, row_start)
        mean, mean_valid, mean_start = self._mean(m, row_sum, sum_valid, sum_start)
        var, var_valid, side, side_fifo = self._variance(m, rd_var, mean, mean_valid, mean_start)
        factor_fifo = self._factor(m, var, var_valid)
        self._output(m, rd_out, release, side, side_fifo, factor_fifo)
        return m

    def _row_sum(self, m, write, first, in_beat, wp, row_start):
        """Pass 1: the sum of the row being written plus ``mean_offset`` (so non-negative),
        reduced as it arrives (``lanes`` wide adder tree, then an accumulator that starts at
        the offset). Returns ``(x, valid, start)``: ``valid`` is a one-cycle strobe, ``start``
        the row's first buffer address."""
        c = self.config
        beats, depth = c.beats, c.buffer_depth
        # -- pass 1: row sum --------------------------------------------------------------------
        lane_sum, tree_lat = adder_tree(m, list(self.i_row.payload.q), name="lanesum")
        assert tree_lat == c.lane_tree_latency
        t_valid = delay(m, write, tree_lat, name="sum_valid")
        t_first = delay(m, first, tree_lat, name="sum_first")
        t_last = delay(m, in_beat == beats - 1, tree_lat, name="sum_last")
        t_start = delay(m, Mux(first, wp, row_start), tree_lat, name="sum_start")
        acc = Signal(range(c.x_max + 1))        # offset + partial sum: 0 .. x_max
        acc_next = Signal(range(c.x_max + 1))
        m.d.comb += acc_next.eq(Mux(t_first, c.mean_offset, acc) + lane_sum)
        row_sum = Signal(range(c.x_max + 1))
        sum_valid = Signal()
        sum_start = Signal(range(depth))
        m.d.sync += sum_valid.eq(t_valid & t_last)
        with m.If(t_valid):
            m.d.sync += acc.eq(acc_next)
            with m.If(t_last):
                m.d.sync += [row_sum.eq(acc_next), sum_start.eq(t_start)]
        return row_sum, sum_valid, sum_start

    def _mean(self, m, x, sum_valid, sum_start):
        """``mean = round_half_even(sum / H)`` from ``x = sum + mean_offset`` by a
        multiplication with the reciprocal and one correction step, every product split and
        registered: ``config.mean_stages`` cycles. Returns ``(mean, valid, start)``."""
        c = self.config
        b, k, hidden, mb = c.in_bits, c.recip_shift, c.hidden, c.rem_bits
        # -- mean = round_half_even(sum / H) ------------------------------------------------------
        # q0 = floor(x * recip / 2**k) is floor(x / H) or one less; r0 = x - q0 H < 2 H, so its
        # low mb bits are all of it and only q0's low mb bits matter in q0 H.
        prod, p1 = split_multiply(m, x, c.recip, name="mrecip")
        q_bits = (c.x_max // hidden).bit_length()
        q0 = prod[k:k + q_bits]
        qh, p2 = split_multiply(m, q0[:min(q_bits, mb)], hidden, name="mqh")
        x_d = delay(m, x[:mb], p1 + p2, name="mx")
        q0_d = delay(m, q0, p2, name="mq")
        r0 = Signal(mb)
        q1 = Signal(len(q0))
        m.d.sync += [r0.eq(x_d - qh[:mb]), q1.eq(q0_d)]
        # over = r0 >= H; the rounding decision for either outcome: 2 r > H, or 2 r == H and
        # the floor odd, with r = r0 - over * H (q - 2**(b-1) has q's parity).
        over, _ = compare_subtract(m, r0, hidden, name="mover")
        half = hidden // 2
        tie = hidden % 2 == 0
        up0 = (r0 > half) | ((r0 == half) & q1[0]) if tie else r0 > half
        up1 = ((r0 > hidden + half) | ((r0 == hidden + half) & ~q1[0]) if tie
               else r0 > hidden + half)
        q2 = Signal(len(q0))
        s_over, s_up0, s_up1 = Signal(), Signal(), Signal()
        m.d.sync += [q2.eq(q1), s_over.eq(over), s_up0.eq(up0), s_up1.eq(up1)]
        # mean = q + over + up - 2**(b-1): the rounded quotient stays below 2**b.
        inc = Signal(2)
        m.d.comb += inc.eq(s_over + Mux(s_over, s_up1, s_up0))
        total = Signal(b)
        m.d.comb += total.eq(q2 + inc)
        mean = Signal(signed(b))
        m.d.sync += mean.eq(Cat(total[:b - 1], ~total[b - 1]))
        assert p1 + p2 + MEAN_STEPS == c.mean_stages
        mean_valid = delay(m, sum_valid, c.mean_stages, name="mean_valid")
        mean_start = delay(m, sum_start, c.mean_stages, name="mean_start")
        return mean, mean_valid, mean_start

    def _variance(self, m, rd_var, mean, mean_valid, mean_start):
        """Pass 2: rereads the row from the buffer and sums ``((q - mean) >> shift)**2``.
        Returns ``(var, var_valid, side, side_fifo)``: the row's ``(mean, start)`` wait in
        ``side_fifo`` (layout ``side``) for the output pass."""
        c = self.config
        lanes, beats, depth, b = c.lanes, c.beats, c.buffer_depth, c.in_bits
        # -- pass 2: variance of (q - mean) >> shift --------------------------------------------
        v_active = Signal()
        v_addr = Signal(range(depth))
        v_beat = Signal(range(beats))
        v_mean = Signal(signed(b))
        v_start = Signal(range(depth))
        v_last = v_beat == beats - 1
        m.d.comb += rd_var.addr.eq(v_addr)
        with m.If(v_active):
            m.d.sync += [v_addr.eq(_wrap_inc(v_addr, depth)),
                         v_beat.eq(_wrap_inc(v_beat, beats))]
            with m.If(v_last):
                m.d.sync += v_active.eq(0)
        with m.If(mean_valid):          # rows are >= beats cycles apart: the pass has ended
            m.d.sync += [v_active.eq(1), v_addr.eq(mean_start), v_beat.eq(0),
                         v_mean.eq(mean), v_start.eq(mean_start)]
        # Side band aligned with the read data's register (two cycles after the read).
        r_valid = delay(m, v_active, 2, name="vr_valid")
        r_first = delay(m, v_active & (v_beat == 0), 2, name="vr_first")
        r_last = delay(m, v_active & v_last, 2, name="vr_last")
        r_mean = delay(m, v_mean, 2, name="vr_mean")
        r_start = delay(m, v_start, 2, name="vr_start")
        squares = []
        ys_bits = max(b + 1 - c.shift, 1)
        sq_bits = max((c.ys_max(b, c.shift) ** 2).bit_length(), 1)
        # The read data go straight into a register; the square is split and registered.
        v_data = Signal.like(rd_var.data)
        m.d.sync += v_data.eq(rd_var.data)
        for lane in range(lanes):
            y = Signal(signed(b + 1), name=f"vy{lane}")
            ys = Signal(signed(ys_bits), name=f"vys{lane}")
            m.d.sync += y.eq(v_data[lane] - r_mean)
            m.d.comb += ys.eq(y >> c.shift)
            sq, sq_lat = split_multiply(m, ys, ys, name=f"vsq{lane}")
            assert sq_lat == c.square_stages
            squares.append(sq[:sq_bits])
        sq_sum, vtree_lat = adder_tree(m, squares, name="sqsum", shape=unsigned(c.var_bits))
        assert vtree_lat == c.lane_tree_latency
        lag = 1 + c.square_stages + vtree_lat
        s_valid = delay(m, r_valid, lag, name="sq_valid")
        s_last = delay(m, r_last, lag, name="sq_last")
        s_first = delay(m, r_first, lag, name="sq_first")
        s_mean = delay(m, r_mean, lag, name="sq_mean")
        s_start = delay(m, r_start, lag, name="sq_start")
        vacc = Signal(unsigned(c.var_bits))
        vacc_next = Mux(s_first, 0, vacc) + sq_sum
        var = Signal(unsigned(c.sqrt_width))
        var_valid = Signal()
        m.d.sync += var_valid.eq(s_valid & s_last)
        with m.If(s_valid):
            m.d.sync += vacc.eq(vacc_next)
            with m.If(s_last):
                m.d.sync += var.eq(vacc_next)

        # Rows waiting for the output pass: (mean, start) now, factor when it is computed.
        side = data.StructLayout({"mean": signed(b), "start": range(depth)})
        m.submodules.side_fifo = side_fifo = fifo.SyncFIFO(width=side.size, depth=c.token_depth)
        side_w = Signal(side)
        m.d.comb += [side_w.mean.eq(delay(m, s_mean, 1, name="var_mean")),
                     side_w.start.eq(delay(m, s_start, 1, name="var_start")),
                     side_fifo.w_data.eq(side_w), side_fifo.w_en.eq(var_valid)]
        return var, var_valid, side, side_fifo

    def _factor(self, m, var, var_valid):
        """``factor = floor(2**(31 - shift) / isqrt(var))`` (:func:`sqrt_pipeline`, then
        :meth:`_reciprocal`), queued in the returned ``factor_fifo`` for the output pass."""
        c = self.config
        # -- std and factor = floor(2**(31 - shift) / isqrt(var)) --------------------------------
        root, root_valid, latency = sqrt_pipeline(m, var, var_valid, c.sqrt_width, name="sqrt")
        assert latency == c.root_bits
        factor, factor_valid = self._reciprocal(m, root, root_valid)
        m.submodules.factor_fifo = factor_fifo = fifo.SyncFIFO(width=c.factor_bits,
                                                               depth=c.token_depth)
        m.d.comb += [factor_fifo.w_data.eq(factor), factor_fifo.w_en.eq(factor_valid)]
        return factor_fifo

    def _output(self, m, rd_out, release, side, side_fifo, factor_fifo):
        """Pass 3: once a row's factor is queued, rereads the row and streams
        ``floor((q - mean) * factor / 2) + bias_int`` to ``o_row`` through a credit-admitted
        FIFO; drives ``release`` (a buffer beat is free) at each issued beat."""
        c = self.config
        lanes, beats, depth, b = c.lanes, c.beats, c.buffer_depth, c.in_bits
        # -- pass 3: out = floor(y * factor / 2) + bias_int ---------------------------------------
        m.submodules.out = out = CreditBuffer(row_out(lanes, c.out_bits), latency=c.out_stages)
        wiring.connect(m, wiring.flipped(self.o_row), out.o)
        bias = c.constants["bias_int"].reshape(beats, lanes)
        m.submodules.bias_rom = rom = memory.Memory(
            shape=data.ArrayLayout(signed(c.bias_bits), lanes), depth=beats,
            init=[[int(x) for x in row] for row in bias])
        rd_bias = rom.read_port()

        o_active = Signal()
        o_addr = Signal(range(depth))
        o_beat = Signal(range(beats))
        o_mean = Signal(signed(b))
        o_factor = Signal(unsigned(c.factor_bits))
        issue = Signal()
        o_last = o_beat == beats - 1
        load = Signal()
        side_r = side(side_fifo.r_data)
        m.d.comb += [
            issue.eq(o_active & out.ready),
            out.take.eq(issue),
            release.eq(issue),
            load.eq(factor_fifo.r_rdy & (~o_active | (issue & o_last))),
            factor_fifo.r_en.eq(load),
            side_fifo.r_en.eq(load),
            rd_out.addr.eq(o_addr),
            rd_bias.addr.eq(delay(m, o_beat, c.out_stages - 3, name="obias_beat")),
        ]
        with m.If(issue):
            m.d.sync += [o_addr.eq(_wrap_inc(o_addr, depth)),
                         o_beat.eq(_wrap_inc(o_beat, beats))]
            with m.If(o_last):
                m.d.sync += o_active.eq(0)
        with m.If(load):
            m.d.sync += [o_active.eq(1), o_addr.eq(side_r.start), o_beat.eq(0),
                         o_mean.eq(side_r.mean), o_factor.eq(factor_fifo.r_data)]

        # The read data go straight into registers (cycle 2 after the issue), y = q - mean
        # (cycle 3), then y * factor split and registered. The bias ROM is read late, so that
        # its second register holds the bias in the cycle of the product (the first stays by
        # the block RAM, the second by the adders).
        o_data = Signal.like(rd_out.data)
        o_bias = Signal.like(rd_bias.data)
        o_bias2 = Signal.like(rd_bias.data)
        m.d.sync += [o_data.eq(rd_out.data), o_bias.eq(rd_bias.data), o_bias2.eq(o_bias)]
        p_mean = delay(m, o_mean, 2, name="or_mean")
        # Each lane's multipliers read their own copy of the factor.
        p_factor = register_copies(m, o_factor, lanes, 3, name="or_factor")
        mul_lat = c.out_stages - 3
        for lane in range(lanes):
            y = Signal(signed(b + 1), name=f"oy{lane}")
            m.d.sync += y.eq(o_data[lane] - p_mean)
            prod, lat = split_multiply(m, y, p_factor[lane], name=f"oprod{lane}")
            assert lat == mul_lat
            prod = prod[:FACTOR_BIT + 2].as_signed()                 # 2 * norm_range
            m.d.comb += out.i.payload.y[lane].eq((prod >> 1) + o_bias2[lane])
        lag = c.out_stages
        m.d.comb += [out.i.valid.eq(delay(m, issue, lag, name="oprod_valid")),
                     out.i.payload.last.eq(delay(m, issue & o_last, lag, name="oprod_last"))]

    def _reciprocal(self, m, root, valid):
        """``floor(2**(31 - shift) / root)`` (0 for ``root == 0``, a flag that travels with the
        steps), restoring division with one quotient bit per pipeline stage, each step one
        carry chain (:func:`compare_subtract`). Returns ``(factor, valid)``."""
        c = self.config
        nb, rb = c.factor_bits, c.root_bits
        rem = Const(0, 1)
        quot = Const(0, 0)
        zero = root == 0
        for i in range(nb - 1, -1, -1):
            cur = Cat(Const(int(i == nb - 1), 1), rem)      # (rem << 1) | numerator bit i
            take, rest = compare_subtract(m, cur, root, name=f"ddiff{i}")
            s_rem = Signal(unsigned(rb), name=f"drem{i}")
            s_quot = Signal(unsigned(nb - i), name=f"dquot{i}")
            s_root = Signal(unsigned(rb), name=f"droot{i}")
            s_zero = Signal(name=f"dzero{i}")
            s_valid = Signal(name=f"dvalid{i}")
            m.d.sync += [s_rem.eq(rest), s_quot.eq(Cat(take, quot)),
                         s_root.eq(root), s_zero.eq(zero), s_valid.eq(valid)]
            rem, quot, root, zero, valid = s_rem, s_quot, s_root, s_zero, s_valid
        factor = Signal(unsigned(nb))
        m.d.comb += factor.eq(Mux(zero, 0, quot))
        return factor, valid


class LayerNormModel(StreamModel):
    """Stream-level golden model and stimulus of :class:`LayerNorm` (items are rows)."""

    #: How :meth:`stimulus` holds the rows of each element field (``{field: (stimulus key,
    #: form)}``; form ``mats``, ``array`` or ``list``: :class:`~hwgen.cluster.gateware.compute.KernelChain`).
    row_fields = {"q": ("rows", "array")}

    result_port = "o_row"
    latency_from = "i_row"

    KINDS = ("realistic", "uniform", "narrow", "equal", "extreme", "tie", "tiny", "outlier")

    @classmethod
    def stimulus(cls, config, items, rng):
        """``items`` rows. The first rows are fixed extremes (all minimum, all maximum, half
        minimum and half maximum: the largest variance, one maximum among minima); then a
        random mix of: realistic rows (Gaussian of random spread and offset with a few large
        outliers), uniform over the full range, uniform over a random narrower range, all equal,
        every element at an extreme, mean ties (sum an odd multiple of H/2), spreads below
        ``2**shift`` (zero or tiny variance) and saturated rows with one outlier."""
        c = config
        h, b = c.hidden, c.in_bits
        lo, hi = -(1 << (b - 1)), (1 << (b - 1)) - 1
        fixed = [np.full(h, lo), np.full(h, hi),
                 np.where(np.arange(h) % 2 == 0, lo, hi),
                 np.where(np.arange(h) == h - 1, hi, lo)]
        rows = []
        for i in range(items):
            if i < len(fixed):
                rows.append(fixed[i])
                continue
            kind = cls.KINDS[rng.integers(len(cls.KINDS))]
            if kind == "realistic":
                sigma = 2.0 ** rng.uniform(max(b - 10, 0), b - 2)
                row = rng.normal(rng.uniform(-sigma, sigma), sigma, h)
                spikes = rng.integers(h, size=rng.integers(0, 4))
                row[spikes] = rng.choice([-1, 1], size=len(spikes)) * sigma * rng.uniform(
                    4, 32, size=len(spikes))
                row = np.rint(row)
            elif kind == "uniform":
                row = rng.integers(lo, hi, size=h, endpoint=True)
            elif kind == "narrow":
                width = 1 << int(rng.integers(0, b))
                centre = int(rng.integers(lo + width // 2, hi - width // 2, endpoint=True))
                row = rng.integers(centre - width // 2, centre + width // 2, size=h,
                                   endpoint=True)
            elif kind == "equal":
                row = np.full(h, rng.integers(lo, hi, endpoint=True))
            elif kind == "extreme":
                row = np.where(rng.random(h) < rng.uniform(0.1, 0.9), lo, hi)
            elif kind == "tie":
                row = rng.integers(lo // 2, hi // 2, size=h, endpoint=True)
                if h % 2 == 0:      # sum = mean * H + H / 2 exactly (mean even or odd)
                    row[0] += (h // 2) - int(row.sum()) % h
            elif kind == "tiny":        # spread below 2**shift: (q - mean) >> shift is 0 or -1
                top = 1 << min(c.shift, b - 1)
                base = int(rng.integers(lo, hi - top, endpoint=True))
                if rng.random() < 0.5:
                    row = base + rng.integers(0, top, size=h)
                else:                   # a few above a mean rounded down to base: var 0
                    step = int(rng.integers(1, top, endpoint=True)) if top > 1 else 1
                    row = np.full(h, base)
                    row[rng.permutation(h)[:(h - 1) // (2 * step)]] += step
            else:
                row = np.full(h, rng.choice([lo, hi]))
                row[rng.integers(h)] = rng.integers(lo, hi, endpoint=True)
            rows.append(np.clip(row, lo, hi))
        return {"rows": np.array(rows, dtype=np.int64).reshape(items, h)}

    @staticmethod
    def inputs(config, stim):
        """``i_row``: each row in ``hidden / lanes`` beats of ``lanes`` elements ``q``, ``last`` on
        the row's final beat."""
        lanes, beats = config.lanes, config.beats
        return {"i_row": [{"q": row[k * lanes:(k + 1) * lanes].tolist(),
                           "last": int(k == beats - 1)}
                          for row in stim["rows"] for k in range(beats)]}

    @staticmethod
    def expect(config, stim):
        """``o_row``: :func:`hwgen.ibert.golden.int_layernorm` of all rows (scale 1, the layer's
        weight and bias or ``bias_int``, ``shift``: :meth:`LayerNormConfig.normalise`), checked to
        fit ``out_bits``, in the input's beats as ``y`` with ``last`` on each row's final beat."""
        c = config
        out = c.normalise(stim["rows"])
        lim = 1 << (c.out_bits - 1)
        if out.size and not (-lim <= out.min() and out.max() < lim):
            raise AssertionError(f"golden output exceeds out_bits={c.out_bits}")
        lanes, beats = c.lanes, c.beats
        return {"o_row": [{"y": row[k * lanes:(k + 1) * lanes].tolist(),
                           "last": int(k == beats - 1)}
                          for row in out for k in range(beats)]}

    @staticmethod
    def cycles_bound(config, stim):
        return config.performance()["latency_cycles"] + 2 * len(stim["rows"]) * config.beats


#: Simulated by ``tests/test_sim.py``: BERT-base (768, 8 lanes, I-BERT's 22-bit input); tiny
#: rows of 5 beats (shorter than the square root); one-beat rows of 32-bit inputs; odd
#: lanes with narrow inputs and shift 0 (mean ties, zero variance); a power-of-two H (exact
#: reciprocal) with 16 lanes; H = 1; 22-bit inputs at a calibrated MiniLM shift (5: variances
#: up to 2**39, a 40-bit square root).
TEST_CONFIGS = (
    {"hidden": 768, "lanes": 8, "in_bits": 22, "shift": 10},
    {"hidden": 5, "lanes": 1, "in_bits": 16, "shift": 1, "param_seed": 3},
    {"hidden": 3, "lanes": 3, "in_bits": 32, "shift": 16, "param_seed": 4},
    {"hidden": 21, "lanes": 3, "in_bits": 8, "shift": 0, "param_seed": 5},
    {"hidden": 64, "lanes": 16, "in_bits": 12, "shift": 1, "param_seed": 6},
    {"hidden": 1, "lanes": 1, "in_bits": 9, "shift": 0, "param_seed": 7},
    {"hidden": 24, "lanes": 4, "in_bits": 22, "shift": 5, "param_seed": 8},
)
