"""I-BERT integer softmax (the reference's ``IntSoftmax``) over rows of any length.

Bit-exact with :func:`hwgen.ibert.golden.int_softmax` at the constants of
:func:`~hwgen.ibert.golden.softmax_constants`: for a row ``q`` of ``M`` integers,

* ``x = max(q - max(q), 30 * x0_int)`` and, with ``d = -x0_int > 0`` and ``a = -x`` in
  ``0 .. 30 d``, ``qq = floor(x / x0_int) = floor(a / d)`` (0..30) and
  ``r = x - x0_int * qq = -(a mod d)``;
* ``z = max(0, (r + b_int) * r + c_int)``, the i-exp polynomial (``exp(x) ~ z * 2**(30 - qq)``);
* ``e16 = clamp(round_half_even(z * m / 2**(e - 30 + qq)), 0, 32767)`` with ``(m, e)`` the
  dyadic multiplier of ``1 / act_scale`` (a non-positive shift count saturates any non-zero
  ``z``);
* ``sum = sum(e16)``, ``factor = floor(2**32 / max(sum, 1))``;
* ``y = floor(e16 * factor / 2**(32 - output_bits))``, in ``0 .. 2**output_bits``.

The kernel makes three passes over a row: it needs the row maximum before the first
exponential and the sum of all exponentials before the first output. Rows are buffered on
chip; four stages work on four different rows at once:

``ingest``
    writes the row into one of two *raw* banks (``amaranth.lib.memory``) and reduces its
    maximum;
``exp``
    reads the raw bank at one beat per cycle, computes ``e16`` (a free-running pipeline: the
    floor division by the constant ``x0_int`` is an exact five-step restoring division by
    ``d``, two multipliers, a variable right shift with round-half-even), writes it to one
    of the *exp* banks and sums it. A raw bank is handed back to ``ingest`` as soon as
    ``exp`` starts reading it: ``exp`` reads one beat per cycle without ever stalling and
    ``ingest`` writes at most one, a cycle behind, so it never overtakes;
``divide``
    ``floor(2**32 / sum)`` with the iterative :class:`~hwgen.lib.divider.Divider`;
``output``
    reads the exp bank, multiplies by the factor and streams the row out through a
    credit-admitted output FIFO; the bank is free again after its last read.

Enough exp banks (:attr:`SoftmaxConfig.exp_banks`) are provided that the exp stage never
waits for one in steady state: rows of ``L = ceil(M / lanes)`` beats flow at one row every
``max(L, N + 2)`` cycles, ``N`` the divider's iterations (:meth:`SoftmaxConfig.performance`).
"""

import math
from dataclasses import dataclass
from functools import cached_property
from types import SimpleNamespace

import numpy as np
from amaranth.hdl import Array, Cat, Const, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, memory, stream, wiring
from amaranth.lib.wiring import In, Out

from .. import contract
from ..config import Config, param
from ..errors import ConfigError
from ..flow.model import StreamModel
from ..lib.divider import Divider, divider_cycles
from ..lib.pipeline import CreditBuffer, adder_tree, delay
from ..lib.row_ports import RowKernel, RowPort
from ..lib.wide_mul import range_shape, split_multiply, split_multiply_stages
from . import golden
from .stream_rows import OUTPUT_FIFO_CYCLES, beats_per_row

__all__ = ["SoftmaxConfig", "Softmax", "SoftmaxModel", "TEST_CONFIGS"]

E16_MAX = (1 << 15) - 1
RECIP_BITS = golden.SOFTMAX_MAX_BIT           # factor = floor(2**32 / sum)
FACTOR_BITS = RECIP_BITS + 1                  # sum = 1 gives 2**32
RAW_BANKS = 2
#: Pipeline registers of the output stage: the e16 memory read, its register, then ``e16 *
#: factor`` split and registered (:func:`~hwgen.lib.wide_mul.split_multiply`: operands, partial
#: products, sum).
OUT_STAGES = 2 + split_multiply_stages(unsigned(15), unsigned(FACTOR_BITS))
#: Register stages of the requantisation shift with rounding (``Softmax._round_shift``).
ROUND_STAGES = 3
#: Attributes of a memory whose ports never read and write one address in the same cycle:
#: yosys's ``no_rw_check`` then maps the read port without collision logic (a multiplexer
#: between the block RAM's output and a bypass register on ECP5).
NO_COLLISIONS = {"no_rw_check": 1}
#: Row states of an exp bank.
FREE, BUSY, SUMMED, READY = range(4)


def _bits(v):
    """Unsigned width of ``v >= 0`` (at least 1)."""
    return max(int(v).bit_length(), 1)


@dataclass(frozen=True)
class SoftmaxConfig(Config, RowKernel):
    """Configuration of ``ibert-softmax`` (:class:`Softmax`): the input scale ``scale`` and
    width ``in_bits``, the i-exp activation scale ``act_scale``, the output precision
    ``output_bits``, the longest row ``max_len``, the beat width ``lanes`` and the reciprocal
    divider's quotient bits per cycle ``div_bits_per_cycle``."""
    scale: float = param(0.005, "scale of the input integers (attention scores Q.K^T / "
                                "sqrt(64) of INT8 Q, K with scales ~0.2: 0.2 * 0.2 / 8)",
                         lo=1e-9, hi=1e9)
    act_scale: float = param(0.0, "scale of the 16-bit activation after i-exp (the "
                                  "reference's calibrated QuantAct); 0: the value a reference "
                                  "IntSoftmax calibrates, exp(0) -> 32767 "
                                  "(golden.calibrate_softmax)", lo=0.0)
    output_bits: int = param(8, "output bits: y = p * 2**output_bits in 0..2**output_bits "
                                "(output_bits + 1 wide)", lo=1, hi=16)
    in_bits: int = param(32, "input bits (signed; INT32 attention scores)", lo=2, hi=32)
    max_len: int = param(128, "longest row (elements); rows may have any length 1..max_len",
                         lo=1, hi=8192)
    lanes: int = param(1, "elements per beat", lo=1, hi=64)
    div_bits_per_cycle: int = param(1, "quotient bits per cycle of the reciprocal divider "
                                       "(33 quotient bits)", lo=1, hi=FACTOR_BITS)

    def check(self):
        for name in ("scale", "act_scale"):
            v = golden.f32(getattr(self, name))
            if not np.isfinite(v) or (v <= 0 and (name == "scale" or getattr(self, name))):
                raise ConfigError(name, "must be a positive number representable in float32",
                                  value=getattr(self, name))
        if self.lanes > self.max_len:
            raise ConfigError("lanes", f"must be at most max_len={self.max_len}",
                              value=self.lanes)
        if self.t_max >= 1 << 63:
            raise ConfigError("scale", "is so small (or act_scale so large) that z * m exceeds "
                              "the RTL's 64-bit product", value=self.scale)

    # -- constants -----------------------------------------------------------------------------

    @property
    def act(self):
        """The 16-bit activation scale in use (``act_scale``, or the calibrated value)."""
        if self.act_scale:
            return float(golden.f32(self.act_scale))
        return float(golden.calibrate_softmax(np.zeros((1, 1), dtype=np.int64), self.scale))

    @cached_property
    def constants(self):
        """:func:`golden.softmax_constants` at ``scale``, :attr:`act` and ``output_bits``."""
        return golden.softmax_constants(self.scale, self.act, self.output_bits)

    @property
    def dyadic(self):
        """``(m, e)``: the dyadic multiplier of ``1 / act`` that turns ``z`` into ``e16``."""
        return self.constants["dyadic"]

    @property
    def divisor(self):
        """``d = -x0_int``: ``qq = floor(a / d)``, ``r = -(a mod d)``."""
        return -self.constants["x0_int"]

    @property
    def a_max(self):
        """Largest ``a = min(max - q, 30 d)`` the input width allows."""
        return min((1 << self.in_bits) - 1, golden.EXP_CONST * self.divisor)

    @property
    def qq_max(self):
        """Largest quotient ``qq = floor(a / d)`` the input width allows (at most 30)."""
        return self.a_max // self.divisor

    @property
    def u_max(self):
        """Largest remainder ``u = a mod d``."""
        return min(self.divisor - 1, self.a_max)

    @property
    def z_max(self):
        """Largest ``z = max(0, u*u - b u + c)``: convex in ``u``, so at an end of
        ``0..u_max``."""
        b, c = self.constants["b_int"], self.constants["c_int"]
        u = self.u_max
        return max(0, c, u * u - b * u + c)

    @property
    def poly_min(self):
        """Smallest product ``u (b - u)`` over ``u`` in ``0 .. u_max``."""
        b = self.constants["b_int"]
        return min(0, self.u_max * (b - self.u_max))

    @property
    def poly_max(self):
        """Largest product ``u (b - u)`` (a concave parabola: at ``u = b / 2`` or an end)."""
        b = self.constants["b_int"]
        us = {0, self.u_max} | {u for u in (b // 2, (b + 1) // 2) if 0 <= u <= self.u_max}
        return max(u * (b - u) for u in us)

    @property
    def t_max(self):
        """Largest product ``z * m`` before the requantisation shift (must stay below 2**63)."""
        return self.z_max * self.dyadic[0]

    @property
    def shift_range(self):
        """Range of the requantisation shift ``e - 30 + qq``."""
        s0 = self.dyadic[1] - golden.EXP_CONST
        return s0, s0 + self.qq_max

    # -- widths and pipeline -------------------------------------------------------------------

    @property
    def beats_max(self):
        """Beats of the longest row (buffer depth per bank)."""
        return beats_per_row(self.max_len, self.lanes)

    @property
    def count_bits(self):
        """Width of the ``count`` field: enough bits for 0 .. ``lanes``."""
        return self.lanes.bit_length()

    @property
    def sum_bits(self):
        """Bits of the row sum of ``e16`` values: ``max_len`` times 32767, unsigned."""
        return _bits(self.max_len * E16_MAX)

    @property
    def out_bits(self):
        """Bits of an output element: ``output_bits + 1`` (values 0 .. 2**output_bits)."""
        return self.output_bits + 1

    @property
    def quotient_steps(self):
        """Restoring-division steps (quotient bits) of ``qq = floor(a / d)``."""
        return self.qq_max.bit_length()

    @property
    def poly_stages(self):
        """Register stages of the polynomial's product ``u (b - u)``
        (:func:`~hwgen.lib.wide_mul.split_multiply`)."""
        b = self.constants["b_int"]
        return split_multiply_stages(unsigned(_bits(self.u_max)),
                                     range_shape(b - self.u_max, b))

    @property
    def zm_stages(self):
        """Register stages of the product ``z m`` (split by
        :func:`~hwgen.lib.wide_mul.split_multiply`)."""
        return split_multiply_stages(unsigned(_bits(self.z_max)), self.dyadic[0])

    @property
    def exp_stages(self):
        """Register stages from the raw-bank read data to ``e16``: the read data, ``max - q``,
        clip, ``floor(a / d)`` (one per quotient bit), ``u (b - u)`` (:attr:`poly_stages`),
        ``z`` (1), ``z m`` (:attr:`zm_stages`), shift and round (:data:`ROUND_STAGES`)."""
        return (3 + self.quotient_steps + self.poly_stages + 1 + self.zm_stages
                + ROUND_STAGES)

    @property
    def tree_levels(self):
        """Registered levels of the lane max tree and of the lane adder tree."""
        return (self.lanes - 1).bit_length()

    @property
    def divider_cycles(self):
        """Iterations ``N`` of the reciprocal divider (one division every ``N + 2`` cycles)."""
        return divider_cycles(FACTOR_BITS, self.div_bits_per_cycle)

    @property
    def bank_hold(self):
        """Cycles an exp bank of a row of ``L`` beats is held in steady state, ``2 L + K``:
        ``K`` is returned (exp pipeline and sum, divider, the load and free cycles)."""
        return 2 + self.exp_stages + self.tree_levels + (self.divider_cycles + 2) + 1

    @cached_property
    def exp_banks(self):
        """Exp banks: the fewest that never make the exp stage wait in steady state at any
        row length, ``max_L ceil((2 L + K) / max(L, N + 2))`` (:attr:`bank_hold`)."""
        period = self.divider_cycles + 2
        need = max(-(-(2 * L + self.bank_hold) // max(L, period))
                   for L in range(1, min(self.beats_max, period) + 1))
        return max(2, need)

    def schedule(self, lengths):
        """Cycle-exact timing of rows of the given lengths (elements) with the input always
        valid and the output always ready: per row the cycles (counted from the first input
        handshake) of ``ingest`` start and end, exp-stage load, divider start, output-stage
        load, and first and last output beat."""
        t_lat = self.tree_levels
        n = self.divider_cycles
        rows = []
        for i, length in enumerate(lengths):
            L = beats_per_row(length, self.lanes)
            prev = rows[i - 1] if i else None
            a_start = prev["a_end"] + 1 if prev else 0
            if i >= RAW_BANKS:                          # raw bank freed at the exp load
                a_start = max(a_start, rows[i - RAW_BANKS]["b_load"] + 1)
            a_end = a_start + L - 1
            b_load = a_end + 3 + t_lat                  # row maximum visible
            if prev:
                b_load = max(b_load, prev["b_load"] + prev["beats"])
            if i >= self.exp_banks:                     # exp bank freed after the output
                old = rows[i - self.exp_banks]
                b_load = max(b_load, old["d_load"] + old["beats"] + 1)
            c_start = b_load + L + 2 + self.exp_stages + t_lat
            if prev:
                c_start = max(c_start, prev["c_start"] + n + 2)
            d_load = c_start + n + 2
            if prev:
                d_load = max(d_load, prev["d_load"] + prev["beats"])
            first_out = d_load + 1 + OUT_STAGES + OUTPUT_FIFO_CYCLES
            rows.append({"beats": L, "a_start": a_start, "a_end": a_end, "b_load": b_load,
                         "c_start": c_start, "d_load": d_load, "first_out": first_out,
                         "last_out": first_out + L - 1})
        return rows

    @dataclass(frozen=True)
    class Workload(contract.Workload):
        """The workload of :meth:`cycle_model` (None: steady-state figures only)."""
        M: int = None     # elements per row (steady-state figures)
        rows: tuple = None     # lengths of rows sent back to back

    def cycle_model(self, workload):
        """Cycle model (no stalls).

        With ``M`` (elements per row): ``cycles_per_row`` in steady state,
        ``max(ceil(M / lanes), N + 2)`` (the exp and output passes take one beat per cycle,
        the divider ``N + 2`` cycles per row), ``rows_per_cycle``, ``elements_per_cycle`` and
        ``latency_cycles``, from a lone row's first input beat to its first output beat
        (``2 L + N +`` pipeline depths: the row is read twice after it has arrived).
        With ``rows`` (a list of row lengths sent back to back): ``cycles`` from the first
        input beat to the last output beat, as ``hwgen sim`` measures them (:meth:`schedule`).
        """
        M, rows = workload.M, workload.rows
        n = self.divider_cycles
        model = {"divider_period_cycles": n + 2, "exp_banks": self.exp_banks}
        if M is not None:
            L = beats_per_row(M, self.lanes)
            period = max(L, n + 2)
            model.update({"beats_per_row": L, "cycles_per_row": period,
                          "rows_per_cycle": 1 / period, "elements_per_cycle": M / period,
                          "latency_cycles": self.schedule([M])[0]["first_out"]})
        if rows:
            model["cycles"] = self.schedule(rows)[-1]["last_out"] + 1
        return model

    def row_ports(self):
        """``i_x``: int(in_bits) rows of up to ``max_len`` on ``lanes`` lanes; ``o_y``:
        uint(out_bits); with more than one lane each beat counts its elements."""
        many = self.lanes > 1
        return ([RowPort("i_x", "q", signed(self.in_bits), self.lanes, max_row=self.max_len,
                         count=many)],
                RowPort("o_y", "y", unsigned(self.out_bits), self.lanes, max_row=self.max_len,
                        count=many))

    def max_tokens(self):
        """:meth:`RowKernel.max_tokens`: ``max_len``."""
        return self.max_len

    def row_timing(self, m):
        """:meth:`RowKernel.row_timing` for rows of ``m`` elements."""
        p = self.performance(self.workload(M=m, rows=[m]))
        return p["cycles"] - p["beats_per_row"], p["cycles_per_row"]

    def derived(self):
        k = self.constants
        m, e = k["dyadic"]
        return {"x0_int": k["x0_int"], "b_int": k["b_int"], "c_int": k["c_int"],
                "act_scale": self.act, "dyadic_m": m, "dyadic_e": e,
                "shift_range": list(self.shift_range), "qq_max": self.qq_max,
                "a_bits": _bits(self.a_max), "z_bits": _bits(self.z_max),
                "t_bits": _bits(self.t_max), "sum_bits": self.sum_bits,
                "out_bits": self.out_bits, "beats_max": self.beats_max,
                "raw_banks": RAW_BANKS, "exp_banks": self.exp_banks,
                "raw_buffer_bits": RAW_BANKS * (1 << (self.beats_max - 1).bit_length())
                * self.lanes * self.in_bits,
                "exp_buffer_bits": self.exp_banks * (1 << (self.beats_max - 1).bit_length())
                * self.lanes * 15,
                "exp_pipeline_stages": self.exp_stages, "divider_cycles": self.divider_cycles,
                "out_scale": float(k["out_scale"])}


def payload_in(config):
    """Input beat: ``q`` per lane (``in_bits`` signed), ``count`` (elements in the beat,
    only with ``lanes > 1``), ``last`` at a row's final beat."""
    fields = {"q": data.ArrayLayout(signed(config.in_bits), config.lanes)}
    if config.lanes > 1:
        fields["count"] = unsigned(config.count_bits)
    fields["last"] = 1
    return data.StructLayout(fields)


def payload_out(config):
    """Output beat: ``y`` per lane (``output_bits + 1`` unsigned), ``count``, ``last``."""
    fields = {"y": data.ArrayLayout(unsigned(config.out_bits), config.lanes)}
    if config.lanes > 1:
        fields["count"] = unsigned(config.count_bits)
    fields["last"] = 1
    return data.StructLayout(fields)


def _max_tree(m, values, shape, name):
    """Maximum of ``values`` with a registered binary tree; returns ``(signal, levels)``."""
    level, depth = list(values), 0
    while len(level) > 1:
        nxt = []
        for k in range(0, len(level) - 1, 2):
            reg = Signal(shape, name=f"{name}_l{depth}_{k // 2}")
            m.d.sync += reg.eq(Mux(level[k] > level[k + 1], level[k], level[k + 1]))
            nxt.append(reg)
        if len(level) % 2:
            reg = Signal(shape, name=f"{name}_l{depth}_pass")
            m.d.sync += reg.eq(level[-1])
            nxt.append(reg)
        level, depth = nxt, depth + 1
    return level[0], depth


def _lane_mask(count, lanes):
    """Lanes ``0 .. count-1`` set."""
    return Cat(*[count > k for k in range(lanes)])


def _wrap(p, n):
    """``p + 1`` modulo ``n`` (a ring index)."""
    return Mux(p == n - 1, 0, p + 1)


class Softmax(wiring.Component):
    """I-BERT integer softmax of rows of any length up to ``max_len``.

    Parameters
    ----------
    config : SoftmaxConfig

    Members
    -------
    i_x : ``In(stream.Signature(payload_in(config)))``
        Rows of ``M`` (1..``max_len``) integers, ``lanes`` per beat: element ``j`` is lane
        ``j % lanes`` of beat ``j // lanes``; ``last`` (TLAST) marks a row's final beat.
        With ``lanes > 1``, ``count`` gives the elements in a beat; it is read only on the
        final beat (other beats are full) and the lanes past it are padding (ignored). No
        padding to ``max_len``: a row of ``M`` elements is ``ceil(M / lanes)`` beats. Rows
        longer than ``max_len`` are not supported (their results are unspecified).
    o_y : ``Out(stream.Signature(payload_out(config)))``
        The row's softmax ``y = floor(e16 * factor / 2**(32 - output_bits))`` in the same beat
        layout (``count``: ``lanes`` except on the final beat; ``last``; padding lanes 0).
        Output scale ``2**-output_bits``.

    Timing
    ------
    Rows of ``L = ceil(M / lanes)`` beats are accepted at one beat per cycle and, in steady
    state, one row every ``max(L, N + 2)`` cycles (``N = ceil(33 / div_bits_per_cycle)``
    divider iterations); output beats follow one per cycle within a row. A row's first
    output beat leaves ``2 L + N + exp_stages + 2 ceil(log2 lanes) + 14`` cycles after its
    first input beat when the kernel is otherwise idle (``config.performance(M)``): the row
    is read twice after it has arrived, then waits for the divider.

    Backpressure: ``o_y`` may stall at any time; the output stage then pauses (credits of
    the output FIFO), exp banks fill, and ``i_x.ready`` drops when no raw bank is free.
    ``i_x.ready`` is a register lookup; no ready depends combinationally on ``o_y.ready``.
    """

    def __init__(self, config):
        self.config = config
        super().__init__({
            "i_x": In(stream.Signature(payload_in(config))),
            "o_y": Out(stream.Signature(payload_out(config))),
        })

    def elaborate(self, platform):
        c = self.config
        m = Module()
        lanes, in_bits = c.lanes, c.in_bits
        beats = c.beats_max
        beat_bits = (beats - 1).bit_length()
        nexp = c.exp_banks

        # -- buffers: bank index above the beat index --------------------------------------
        # No cycle reads and writes the same address of either memory (a raw bank is written
        # a beat behind its exp-pass read; an exp bank is read only once it is READY, written
        # only while its exp pass holds it), so synthesis need not emulate read-old-data on a
        # collision: the read data go straight from the block RAM into a register.
        raw = memory.Memory(shape=data.ArrayLayout(signed(in_bits), lanes),
                            depth=RAW_BANKS << beat_bits, init=[], attrs=NO_COLLISIONS)
        ebuf = memory.Memory(shape=data.ArrayLayout(unsigned(15), lanes),
                             depth=nexp << beat_bits, init=[], attrs=NO_COLLISIONS)
        m.submodules.raw = raw
        m.submodules.ebuf = ebuf
        raw_wr, raw_rd = raw.write_port(), raw.read_port()
        e_wr, e_rd = ebuf.write_port(), ebuf.read_port()

        # Raw banks: busy (holds a complete row, or is being read) / ready (maximum known).
        r_busy = Array(Signal(name=f"r_busy{b}") for b in range(RAW_BANKS))
        r_ready = Array(Signal(name=f"r_ready{b}") for b in range(RAW_BANKS))
        r_max = Array(Signal(signed(in_bits), name=f"r_max{b}") for b in range(RAW_BANKS))
        r_last = Array(Signal(range(beats), name=f"r_last{b}") for b in range(RAW_BANKS))
        r_count = Array(Signal(c.count_bits, name=f"r_count{b}") for b in range(RAW_BANKS))
        # Exp banks: FREE -> BUSY (exp) -> SUMMED -> BUSY (divider) -> READY -> BUSY (out).
        e_state = Array(Signal(2, name=f"e_state{b}") for b in range(nexp))
        e_last = Array(Signal(range(beats), name=f"e_last{b}") for b in range(nexp))
        e_count = Array(Signal(c.count_bits, name=f"e_count{b}") for b in range(nexp))
        e_sum = Array(Signal(c.sum_bits, name=f"e_sum{b}") for b in range(nexp))
        e_factor = Array(Signal(FACTOR_BITS, name=f"e_factor{b}") for b in range(nexp))
        bk = SimpleNamespace(
            raw_wr=raw_wr, raw_rd=raw_rd, e_wr=e_wr, e_rd=e_rd,
            r_busy=r_busy, r_ready=r_ready, r_max=r_max, r_last=r_last, r_count=r_count,
            e_state=e_state, e_last=e_last, e_count=e_count, e_sum=e_sum, e_factor=e_factor)
        self._ingest(m, bk)
        x = self._exp_issue(m, bk)
        self._exp_pass(m, bk, x)
        self._divide(m, bk)
        self._output(m, bk)
        return m

    def _ingest(self, m, bk):
        """Ingest stage: takes ``i_x`` into the free raw bank (``r_busy``, ``r_last``,
        ``r_count``), writes it one cycle later and reduces the row maximum through a
        ``tree_levels`` deep tree and a running maximum (``r_max`` and ``r_ready`` the cycle
        after the last beat's)."""
        c = self.config
        lanes, in_bits, beats = c.lanes, c.in_bits, c.beats_max
        t_lat, all_lanes = c.tree_levels, (1 << c.lanes) - 1
        r_busy, r_ready, r_max = bk.r_busy, bk.r_ready, bk.r_max
        r_last, r_count, raw_wr = bk.r_last, bk.r_count, bk.raw_wr
        # == ingest ===========================================================================
        a_bank = Signal(range(RAW_BANKS))
        a_beat = Signal(range(beats))
        take = Signal()
        pay = self.i_x.payload
        count_in = pay.count if lanes > 1 else Const(1, 1)
        m.d.comb += [self.i_x.ready.eq(~r_busy[a_bank]),
                     take.eq(self.i_x.valid & self.i_x.ready)]
        with m.If(take):
            m.d.sync += a_beat.eq(a_beat + 1)
            with m.If(pay.last):
                m.d.sync += [a_beat.eq(0), a_bank.eq(_wrap(a_bank, RAW_BANKS)),
                             r_busy[a_bank].eq(1), r_last[a_bank].eq(a_beat),
                             r_count[a_bank].eq(count_in)]
        # Registered beat: written to the bank and reduced to the running maximum.
        # Padding lanes are written as the smallest input (the exp pass masks them anyway).
        s_valid = Signal()
        s_q = Signal.like(pay.q)
        s_first = Signal()
        s_last = Signal()
        s_bank = Signal.like(a_bank)
        s_beat = Signal.like(a_beat)
        q_min = -(1 << (in_bits - 1))
        mask = Mux(pay.last, _lane_mask(count_in, lanes), all_lanes)
        m.d.sync += [s_valid.eq(take), s_first.eq(a_beat == 0),
                     s_last.eq(pay.last), s_bank.eq(a_bank), s_beat.eq(a_beat)]
        m.d.sync += [s_q[j].eq(Mux(mask[j], pay.q[j], q_min)) for j in range(lanes)]
        m.d.comb += [raw_wr.addr.eq(Cat(s_beat, s_bank)), raw_wr.data.eq(s_q),
                     raw_wr.en.eq(s_valid)]
        lane_max, levels = _max_tree(m, [s_q[j] for j in range(lanes)],
                                     signed(in_bits), "lane_max")
        assert levels == t_lat
        mx_valid = delay(m, s_valid, t_lat, name="mx_valid")
        mx_first = delay(m, s_first, t_lat, name="mx_first")
        mx_last = delay(m, s_last, t_lat, name="mx_last")
        mx_bank = delay(m, s_bank, t_lat, name="mx_bank")
        # The running maximum: one compare and a select per cycle; the row's maximum goes to
        # its bank the cycle after the last beat.
        run_max = Signal(signed(in_bits))
        with m.If(mx_valid):
            m.d.sync += run_max.eq(Mux(mx_first | (lane_max > run_max), lane_max, run_max))
        done = Signal()
        done_bank = Signal.like(mx_bank)
        m.d.sync += [done.eq(mx_valid & mx_last), done_bank.eq(mx_bank)]
        with m.If(done):
            m.d.sync += [r_max[done_bank].eq(run_max), r_ready[done_bank].eq(1)]

    def _exp_issue(self, m, bk):
        """Exp pass, issue: loads the next ready raw bank into a free exp bank (handing the
        raw bank back to ingest) and reads it one beat per cycle; returns the side band
        aligned with the read data, ``(valid, first, last, mask, max, e, beat)``."""
        c = self.config
        lanes, in_bits, beats, nexp = c.lanes, c.in_bits, c.beats_max, c.exp_banks
        all_lanes = (1 << lanes) - 1
        r_busy, r_ready, r_max, r_last, r_count = (bk.r_busy, bk.r_ready, bk.r_max, bk.r_last,
                                                   bk.r_count)
        e_state, e_last, e_count, raw_rd = bk.e_state, bk.e_last, bk.e_count, bk.raw_rd
        # == exp pass: issue ==================================================================
        b_next_raw = Signal(range(RAW_BANKS))     # next raw bank to read
        b_next_e = Signal(range(nexp))            # next exp bank to fill
        b_active = Signal()
        b_beat = Signal(range(beats))
        b_last = Signal(range(beats))
        b_count = Signal(c.count_bits)
        b_max = Signal(signed(in_bits))
        b_raw = Signal.like(b_next_raw)
        b_e = Signal.like(b_next_e)
        b_fin = Signal()
        b_load = Signal()
        m.d.comb += [
            b_fin.eq(b_active & (b_beat == b_last)),
            b_load.eq((~b_active | b_fin) & r_ready[b_next_raw]
                      & (e_state[b_next_e] == FREE)),
            raw_rd.addr.eq(Cat(b_beat, b_raw)),
        ]
        with m.If(b_active):
            m.d.sync += b_beat.eq(b_beat + 1)
            with m.If(b_fin):
                m.d.sync += b_active.eq(0)
        with m.If(b_load):
            m.d.sync += [
                b_active.eq(1), b_beat.eq(0), b_last.eq(r_last[b_next_raw]),
                b_count.eq(r_count[b_next_raw]), b_max.eq(r_max[b_next_raw]),
                b_raw.eq(b_next_raw), b_e.eq(b_next_e),
                b_next_raw.eq(_wrap(b_next_raw, RAW_BANKS)), b_next_e.eq(_wrap(b_next_e, nexp)),
                # The raw bank goes back to ingest now: see the module docstring.
                r_busy[b_next_raw].eq(0), r_ready[b_next_raw].eq(0),
                e_state[b_next_e].eq(BUSY), e_last[b_next_e].eq(r_last[b_next_raw]),
                e_count[b_next_e].eq(r_count[b_next_raw]),
            ]
        # Side band aligned with the read data (one cycle after the issue).
        x_valid = Signal()
        x_first = Signal()
        x_last = Signal()
        x_mask = Signal(lanes)
        x_max = Signal(signed(in_bits))
        x_e = Signal.like(b_e)
        x_beat = Signal.like(b_beat)
        m.d.sync += [x_valid.eq(b_active), x_first.eq(b_beat == 0), x_last.eq(b_fin),
                     x_mask.eq(Mux(b_fin, _lane_mask(b_count, lanes), all_lanes)),
                     x_max.eq(b_max), x_e.eq(b_e), x_beat.eq(b_beat)]
        return x_valid, x_first, x_last, x_mask, x_max, x_e, x_beat

    def _exp_pass(self, m, bk, x):
        """Exp pass, datapath: ``e16`` per lane (``exp_stages`` cycles), written to the exp
        bank and summed per row (``e_sum``; the bank becomes SUMMED). ``x`` is the side band
        of :meth:`_exp_issue`."""
        c = self.config
        lanes, t_lat = c.lanes, c.tree_levels
        x_valid, x_first, x_last, x_mask, x_max, x_e, x_beat = x
        raw_rd, e_wr, e_sum, e_state = bk.raw_rd, bk.e_wr, bk.e_sum, bk.e_state
        # == exp pass: datapath per lane =========================================================
        e16 = [self._exp_lane(m, j, raw_rd.data[j], x_max) for j in range(lanes)]
        stages = c.exp_stages
        w_valid = delay(m, x_valid, stages, name="w_valid")
        w_first = delay(m, x_first, stages, name="w_first")
        w_last = delay(m, x_last, stages, name="w_last")
        w_mask = delay(m, x_mask, stages, name="w_mask")
        w_e = delay(m, x_e, stages, name="w_e")
        w_beat = delay(m, x_beat, stages, name="w_beat")
        e16_masked = [Mux(w_mask[j], e16[j], 0) for j in range(lanes)]
        m.d.comb += [e_wr.addr.eq(Cat(w_beat, w_e)), e_wr.en.eq(w_valid)]
        for j in range(lanes):
            m.d.comb += e_wr.data[j].eq(e16_masked[j])
        beat_sum, levels = adder_tree(m, e16_masked, name="beat_sum", shape=c.sum_bits)
        assert levels == t_lat
        sm_valid = delay(m, w_valid, t_lat, name="sm_valid")
        sm_first = delay(m, w_first, t_lat, name="sm_first")
        sm_last = delay(m, w_last, t_lat, name="sm_last")
        sm_e = delay(m, w_e, t_lat, name="sm_e")
        acc = Signal(c.sum_bits)
        acc_next = Signal(c.sum_bits)
        m.d.comb += acc_next.eq(Mux(sm_first, 0, acc) + beat_sum)
        with m.If(sm_valid):
            m.d.sync += acc.eq(acc_next)
            with m.If(sm_last):
                m.d.sync += [e_sum[sm_e].eq(acc_next), e_state[sm_e].eq(SUMMED)]

    def _divide(self, m, bk):
        """Divide stage: ``factor = floor(2**32 / max(sum, 1))`` of each SUMMED exp bank, in
        bank order, with the iterative :class:`~hwgen.lib.divider.Divider` (bank READY)."""
        c = self.config
        nexp = c.exp_banks
        e_sum, e_state, e_factor = bk.e_sum, bk.e_state, bk.e_factor
        # == divide: factor = floor(2**32 / max(sum, 1)) ======================================
        m.submodules.divider = div = Divider(FACTOR_BITS, c.sum_bits, c.div_bits_per_cycle)
        assert div.cycles == c.divider_cycles
        c_in = Signal(range(nexp))                # next bank to divide
        c_out = Signal(range(nexp))               # bank in the divider
        total = e_sum[c_in]
        m.d.comb += [
            div.i.valid.eq(e_state[c_in] == SUMMED),
            div.i.payload.dividend.eq(1 << RECIP_BITS),
            div.i.payload.divisor.eq(Mux(total == 0, 1, total)),
            div.o.ready.eq(1),
        ]
        with m.If(div.i.valid & div.i.ready):
            m.d.sync += [e_state[c_in].eq(BUSY), c_in.eq(_wrap(c_in, nexp))]
        with m.If(div.o.valid):
            m.d.sync += [e_factor[c_out].eq(div.o.payload.quotient), e_state[c_out].eq(READY),
                         c_out.eq(_wrap(c_out, nexp))]

    def _output(self, m, bk):
        """Output pass: reads each READY exp bank, registers the read data, multiplies by its
        factor (split and registered, ``OUT_STAGES`` cycles from the read in all) and streams
        the row to ``o_y`` through a credit-admitted FIFO; the bank is FREE after its last
        read."""
        c = self.config
        lanes, beats, nexp = c.lanes, c.beats_max, c.exp_banks
        e_state, e_last, e_count, e_factor, e_rd = (bk.e_state, bk.e_last, bk.e_count,
                                                    bk.e_factor, bk.e_rd)
        # == output pass ==========================================================================
        m.submodules.out = out = CreditBuffer(payload_out(c), latency=OUT_STAGES)
        wiring.connect(m, wiring.flipped(self.o_y), out.o)
        d_next = Signal(range(nexp))
        d_active = Signal()
        d_beat = Signal(range(beats))
        d_last = Signal(range(beats))
        d_count = Signal(c.count_bits)
        d_factor = Signal(FACTOR_BITS)
        d_e = Signal(range(nexp))
        d_issue = Signal()
        d_fin = Signal()
        d_load = Signal()
        m.d.comb += [
            d_issue.eq(d_active & out.ready),
            d_fin.eq(d_issue & (d_beat == d_last)),
            d_load.eq((~d_active | d_fin) & (e_state[d_next] == READY)),
            out.take.eq(d_issue),
            e_rd.addr.eq(Cat(d_beat, d_e)),
        ]
        with m.If(d_issue):
            m.d.sync += d_beat.eq(d_beat + 1)
            with m.If(d_fin):
                m.d.sync += [d_active.eq(0), e_state[d_e].eq(FREE)]
        with m.If(d_load):
            m.d.sync += [d_active.eq(1), d_beat.eq(0), d_last.eq(e_last[d_next]),
                         d_count.eq(e_count[d_next]), d_factor.eq(e_factor[d_next]),
                         d_e.eq(d_next), e_state[d_next].eq(BUSY),
                         d_next.eq(_wrap(d_next, nexp))]
        o_valid = Signal()
        o_last = Signal()
        o_count = Signal(c.count_bits)
        o_factor = Signal(FACTOR_BITS)
        m.d.sync += [o_valid.eq(d_issue), o_last.eq(d_fin),
                     o_count.eq(Mux(d_fin, d_count, lanes)), o_factor.eq(d_factor)]
        shift = RECIP_BITS - c.output_bits
        # The read data goes straight into one register per bit (as the reference design's
        # block-RAM read), then into the multipliers' operand registers.
        e16_reg = Signal.like(e_rd.data)
        f_reg = Signal.like(o_factor)
        m.d.sync += [e16_reg.eq(e_rd.data), f_reg.eq(o_factor)]
        for j in range(lanes):
            prod, stages = split_multiply(m, e16_reg[j], f_reg, name=f"prod{j}")
            assert stages == OUT_STAGES - 2
            m.d.comb += out.i.payload.y[j].eq(prod[shift:shift + c.out_bits])
        lag = OUT_STAGES - 1
        m.d.comb += [out.i.valid.eq(delay(m, o_valid, lag, name="y_valid")),
                     out.i.payload.last.eq(delay(m, o_last, lag, name="y_last"))]
        if lanes > 1:
            m.d.comb += out.i.payload.count.eq(delay(m, o_count, lag, name="y_count"))

    def _exp_lane(self, m, j, q, row_max):
        """``e16`` of one lane: ``q`` (the raw bank's read data) and ``row_max`` valid in the
        same cycle; the result is a register ``config.exp_stages`` cycles later."""
        c = self.config
        k = c.constants
        d, b_int, c_int = c.divisor, k["b_int"], k["c_int"]
        mult = k["dyadic"][0]
        a_bits = _bits(c.a_max)

        def reg(shape, name):
            return Signal(shape, name=f"{name}{j}")

        # The memory's read data goes straight into a register (a block RAM's output register).
        q_reg = reg(signed(c.in_bits), "q")
        max_reg = reg(signed(c.in_bits), "qmax")
        m.d.sync += [q_reg.eq(q), max_reg.eq(row_max)]
        # x = max(q - max, 30 x0) as a = min(max - q, 30 d) >= 0.
        diff = reg(signed(c.in_bits + 1), "diff")
        m.d.sync += diff.eq(max_reg - q_reg)
        a = reg(a_bits, "a")
        m.d.sync += a.eq(Mux(diff > c.a_max, c.a_max, diff))
        # qq = floor(a / d), u = a mod d: restoring division by the constant d (qq < 2**steps).
        rem, qq = a, Const(0, 1)
        for step in range(c.quotient_steps - 1, -1, -1):
            dk = d << step
            ge = rem >= dk
            nrem = reg(a_bits, f"rem{step}_")
            nqq = reg(c.quotient_steps, f"qq{step}_")
            m.d.sync += [nrem.eq(Mux(ge, rem - dk, rem)), nqq.eq(Cat(ge, qq))]
            rem, qq = nrem, nqq
        u = rem[:_bits(c.u_max)]
        # z = max(0, (r + b) r + c) with r = -u: z = c - u (b - u); the multiplier's operands
        # and its product are registers (split_multiply).
        bu = reg(range_shape(b_int - c.u_max, b_int), "bu")
        m.d.comb += bu.eq(b_int - u)
        prod, p_stages = split_multiply(m, u, bu, name=f"poly{j}")
        assert p_stages == c.poly_stages
        z = reg(_bits(c.z_max), "z")
        zfull = reg(range_shape(c_int - c.poly_max, c_int - c.poly_min), "zfull")
        m.d.comb += zfull.eq(c_int - prod)
        m.d.sync += z.eq(Mux(zfull[-1], 0, zfull) if zfull.shape().signed else zfull)
        zpos = reg(1, "zpos")
        m.d.sync += zpos.eq(z != 0)
        # t = z m (split and registered), e16 = round_half_even(t / 2**(e - 30 + qq)).
        t, t_stages = split_multiply(m, z, mult, name=f"zm{j}")
        assert t_stages == c.zm_stages
        shift = SimpleNamespace(
            t=t[:_bits(c.t_max)],
            v=delay(m, qq, p_stages + 1 + t_stages, name=f"qq_t{j}"),
            zpos=delay(m, zpos, t_stages - 1, name=f"zpos_t{j}"))
        return self._round_shift(m, j, shift)

    def _round_shift(self, m, j, x):
        """``e16 = clamp(round_half_even(t / 2**s), 0, 32767)`` for ``s = e - 30 + qq`` in
        three registered stages (:data:`ROUND_STAGES`): ``x.t`` the product ``z m``, ``x.v``
        its ``qq`` and ``x.zpos`` (``z != 0``) registers of the same cycle. Stage 1 shifts by
        the shift's high bits (multiples of 8) and ORs the bits it drops in groups of 8;
        stage 2 shifts by the low three bits and forms the sticky bit below the rounding bit;
        stage 3 rounds and saturates. A shift ``s <= 0`` saturates any non-zero ``z``."""
        c = self.config
        s0 = c.dyadic[1] - golden.EXP_CONST
        # Shift right by s - 1 = c0 + v (c0 constant >= 0) and keep the rounding bit and the
        # sticky bit (whether anything lower was non-zero). v < 0: s <= 0.
        c0, bias = max(s0 - 1, 0), min(s0 - 1, 0)
        t = x.t
        y = Cat(t[c0:], Const(0, 1))
        v_max = c.qq_max + bias
        nb = max(v_max, 0).bit_length()
        lo_bits = min(3, nb)
        hi_bits = nb - lo_bits
        group = 1 << lo_bits

        def reg(shape, name):
            return Signal(shape, name=f"{name}{j}")

        v = Signal(signed(max(c.quotient_steps, 1) + _bits(-bias) + 2), name=f"v{j}")
        m.d.comb += v.eq(x.v + bias)
        # Stage 1: coarse shift; ORs of the bits below c0 and of each group of 8 above.
        v_hi = v[lo_bits:nb] if hi_bits else Const(0, 1)
        y1 = reg(len(y), "y1_")
        g = reg(1 << hi_bits, "g")
        v1 = reg(max(lo_bits, 1), "v1_")
        big1 = reg(1, "big1_")
        zpos1 = reg(1, "zpos1_")
        m.d.sync += [y1.eq(y >> (v_hi << lo_bits) if hi_bits else y),
                     g[0].eq(t[:c0].any() if c0 else 0),
                     v1.eq(v[:lo_bits] if lo_bits else 0), big1.eq(v < 0), zpos1.eq(x.zpos)]
        for n in range(1, 1 << hi_bits):
            m.d.sync += g[n].eq(y[(n - 1) * group:n * group].any() & (v_hi >= n))
        # Stage 2: fine shift by the low bits; sticky = everything below the rounding bit.
        y2 = reg(len(y), "y2_")
        sticky = reg(1, "sticky")
        big2 = reg(1, "big2_")
        zpos2 = reg(1, "zpos2_")
        low = [y1[i] & (v1 > i) for i in range(group - 1)]
        dropped = (g.any() | Cat(*low).any()) if low else g.any()
        m.d.sync += [y2.eq(y1 >> v1 if lo_bits else y1), sticky.eq(dropped),
                     big2.eq(big1), zpos2.eq(zpos1)]
        # Stage 3: round half to even and saturate.
        hi = y2 >> 1
        up = y2[0] & (sticky | hi[0])
        out = reg(15, "e16_")
        m.d.sync += out.eq(Mux(big2, Mux(zpos2, E16_MAX, 0),
                               Mux(hi >= E16_MAX, E16_MAX, hi + up)))
        return out


# == stimulus and golden model ==================================================================

_KINDS = ("realistic", "random", "equal", "spread", "narrow", "extremes", "peaked", "ramp")


def softmax_row(rng, kind, length, config):
    """One row of ``length`` inputs of a kind: ``realistic`` (a row of ``Q K^T`` of INT8
    ``Q``, ``K`` with 64-wide heads, real logits of a few units at ``scale``), ``random``
    (uniform over a random sub-range of the input range), ``equal`` (all the same value),
    ``spread`` (a few values near the maximum, the rest beyond the ``30 x0`` clip), ``narrow``
    (within a few ``x0`` of each other: every remainder of the polynomial), ``extremes``
    (input minimum and maximum), ``peaked`` (one maximum, the rest far below) and ``ramp``
    (steps of ``x0 / 3``, so every ``qq`` appears)."""
    lo, hi = -(1 << (config.in_bits - 1)), (1 << (config.in_bits - 1)) - 1
    d = config.divisor
    if kind == "realistic":
        sigma = math.sqrt(max(2.5 / (float(golden.f32(config.scale)) * 8.0), 1e-3))
        qv = np.clip(np.round(rng.normal(0, sigma, size=64)), -128, 127)
        kv = np.clip(np.round(rng.normal(0, sigma, size=(length, 64))), -128, 127)
        row = (kv @ qv).astype(np.int64)
    elif kind == "random":
        width = int(rng.integers(1, config.in_bits, endpoint=True))
        centre = int(rng.integers(lo, hi, endpoint=True))
        row = centre + rng.integers(-(1 << (width - 1)), (1 << (width - 1)), size=length)
    elif kind == "equal":
        row = np.full(length, rng.integers(lo, hi, endpoint=True), dtype=np.int64)
    elif kind == "spread":
        top = int(rng.integers(lo, hi, endpoint=True))
        row = top - rng.integers(31 * d, 64 * d + (1 << min(config.in_bits, 40)), size=length)
        near = rng.random(length) < 0.2
        row[near] = top - rng.integers(0, 3 * d, size=int(near.sum()), endpoint=True)
        row[int(rng.integers(length))] = top
    elif kind == "narrow":
        base = int(rng.integers(lo, hi, endpoint=True))
        row = base + rng.integers(-2 * d, 2 * d, size=length, endpoint=True)
    elif kind == "extremes":
        row = rng.choice([lo, hi, lo + 1, hi - 1], size=length)
    elif kind == "peaked":
        row = rng.integers(lo, lo + 4 * d, size=length, endpoint=True)
        row[int(rng.integers(length))] = hi
    else:                                                          # ramp
        start = int(rng.integers(lo, hi, endpoint=True))
        row = start - (np.arange(length) * max(d // 3, 1))[rng.permutation(length)]
    return np.clip(row, lo, hi).astype(np.int64)


class SoftmaxModel(StreamModel):
    """Stream-level golden model and stimulus of :class:`Softmax`. An item is a row."""

    #: How :meth:`stimulus` holds the rows of each element field (``{field: (stimulus key,
    #: form)}``; form ``mats``, ``array`` or ``list``: :class:`~hwgen.cluster.gateware.compute.KernelChain`).
    row_fields = {"q": ("rows", "list")}

    result_port = "o_y"
    latency_from = "i_x"

    @staticmethod
    def stimulus(config, items, rng, length=0):
        """``items`` rows. Lengths: with ``length`` all rows have that many elements;
        otherwise the first rows have 1, ``max_len``, an odd length and 2 elements and the
        rest random lengths in ``1 .. max_len`` (a quarter of them short, up to 8). Contents:
        every kind of :func:`softmax_row` in turn first, then at random (realistic attention
        scores most often). Padding lanes get random values (ignored by the kernel)."""
        c = config
        if length:
            lengths = [length] * items
        else:
            fixed = [1, c.max_len, c.max_len - 1 | 1, min(2, c.max_len)]
            short = rng.integers(1, min(8, c.max_len), size=items, endpoint=True)
            longer = rng.integers(1, c.max_len, size=items, endpoint=True)
            lengths = fixed + [int(s if rng.random() < 0.25 else g)
                               for s, g in zip(short, longer)]
            lengths = lengths[:items]
        kinds = list(_KINDS) + list(rng.choice(
            _KINDS, size=max(0, items - len(_KINDS)),
            p=(0.4, 0.12, 0.08, 0.1, 0.1, 0.06, 0.07, 0.07)))
        rows = [softmax_row(rng, kinds[i], n, c) for i, n in enumerate(lengths)]
        pad = sum(beats_per_row(n, c.lanes) * c.lanes - n for n in lengths)
        lo, hi = -(1 << (c.in_bits - 1)), (1 << (c.in_bits - 1)) - 1
        return {"rows": rows, "pad": rng.integers(lo, hi, size=pad, endpoint=True)}

    @staticmethod
    def _beats(config, rows, field, pad=None):
        lanes = config.lanes
        beats, used = [], 0
        for row in rows:
            n = len(row)
            nb = beats_per_row(n, lanes)
            for b in range(nb):
                values = [int(v) for v in row[b * lanes:(b + 1) * lanes]]
                missing = lanes - len(values)
                if pad is not None:
                    values += [int(v) for v in pad[used:used + missing]]
                    used += missing
                else:
                    values += [0] * missing
                beat = {field: values, "last": int(b == nb - 1)}
                if lanes > 1:
                    beat["count"] = len(row[b * lanes:(b + 1) * lanes])
                beats.append(beat)
        return beats

    @classmethod
    def inputs(cls, config, stim):
        """``i_x``: each row in ``ceil(len / lanes)`` beats of ``lanes`` elements ``q`` (padding
        lanes from ``stim["pad"]``), ``last`` on the row's final beat and, with more than one lane,
        ``count`` = the beat's elements."""
        return {"i_x": cls._beats(config, stim["rows"], "q", stim["pad"])}

    @classmethod
    def expect(cls, config, stim):
        """``o_y``: :func:`hwgen.ibert.golden.int_softmax` of each row on its own (``scale``,
        ``output_bits``, ``act_scale`` = the config's ``act``), in the input's beats as ``y`` with
        zero padding lanes, ``last`` and ``count`` as on input."""
        c = config
        ys = [golden.int_softmax(row[None, :], c.scale, c.output_bits, act_scale=c.act)[0][0]
              for row in stim["rows"]]
        return {"o_y": cls._beats(config, ys, "y")}

    @staticmethod
    def cycles_bound(config, stim):
        return config.performance(
            config.workload(rows=[len(r) for r in stim["rows"]])).cycles


#: Simulated by ``tests/test_sim.py`` (200 rows each): the default at max_len = 128 (INT32
#: scores, one lane); 3 lanes of 12-bit inputs with odd max_len 37, a coarse scale (x0 = -14:
#: the clip is reached) and an act_scale above the calibrated one (e16 below 32767, rounding
#: everywhere); rows of one element only; 4 lanes of 20-bit inputs, 16-bit outputs, 3 divider
#: bits per cycle; an act_scale so small that most elements saturate at 32767 (non-positive
#: shifts); 8 lanes with max_len 8 (a row is one beat); 10-bit inputs at a fine scale, where
#: qq is 0 or 1 (one division step).
TEST_CONFIGS = (
    {"max_len": 128},
    {"max_len": 37, "lanes": 3, "in_bits": 12, "scale": 0.05, "act_scale": 5e7},
    {"max_len": 1, "in_bits": 8, "scale": 0.2, "output_bits": 4},
    {"max_len": 50, "lanes": 4, "in_bits": 20, "scale": 0.0037, "output_bits": 16,
     "div_bits_per_cycle": 3},
    {"max_len": 20, "in_bits": 16, "scale": 0.01, "act_scale": 0.001},
    {"max_len": 8, "lanes": 8, "in_bits": 9, "scale": 0.3, "output_bits": 7},
    {"max_len": 24, "lanes": 2, "in_bits": 10, "scale": 0.001},
)
