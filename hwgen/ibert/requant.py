"""I-BERT requantisation (the reference's ``QuantAct`` after a layer: ``FixedPointMul``).

Integers ``q`` at scale ``scale_in`` become integers at scale ``scale_out`` with ``bits`` bits:
``clamp(round(q * m / 2**e) [+ round(id * m1 / 2**e1)], -2**(bits-1), 2**(bits-1) - 1)``,
``round`` half to even, ``(m, e)`` the dyadic approximation of ``scale_in / scale_out`` and
``(m1, e1)`` that of ``identity_scale / scale_out`` for the optional residual input, exactly as
:func:`hwgen.ibert.golden.requant` (constants from :func:`~hwgen.ibert.golden.requant_constants`).

The multipliers are constants of the configuration. Trailing zero bits of ``m`` are folded into
the shift (``q * m / 2**e == q * (m >> t) / 2**(e - t)``), so a power-of-two ratio needs no
multiplier at all; a shift that ends at or below zero is a left shift, as in the golden model.

After a per-channel QuantLinear the input scale differs per column of the row (``scale_in_file``,
a vector of ``row`` scales): each column's ``(m >> t, e - t)`` then sits in a ROM read by the
element's position in the row, the product is a real (pipelined) multiplier and the rounding
shift a variable one (:meth:`Requant._column_branch`).
"""

from dataclasses import dataclass
from functools import cached_property

import numpy as np
from amaranth.hdl import Cat, Const, Module, Mux, Signal, Value, signed, unsigned
from amaranth.lib import data, memory, stream, wiring
from amaranth.lib.wiring import In, Out

from .. import contract
from ..config import Config, param
from ..errors import ConfigError
from ..flow.model import StreamModel
from ..lib.pipeline import delay
from ..lib.wide_mul import range_shape, split_multiply, split_multiply_stages
from ..lib.row_ports import RowKernel, RowPort
from . import golden
from .param_files import scale_vector, with_file_digest
from .stream_rows import OUTPUT_FIFO_CYCLES, beats_per_row, elementwise, lanes_in_last_beat, \
    to_beats

__all__ = ["RequantConfig", "Requant", "RequantModel", "TEST_CONFIGS",
           "round_shift_int", "dyadic_branch", "dyadic_stages", "round_half_even", "clamp"]

INT64 = (-(1 << 63), (1 << 63) - 1)
#: Register stages of a per-column branch: multiplier inputs, product, product again (the
#: DSP's output register), rounding bits.
COLUMN_STAGES = 4


def round_shift_int(x, e):
    """``round_half_even(x / 2**e)`` on Python integers (any size; ``e <= 0``: left shift)."""
    if e <= 0:
        return x << -e
    quo, rem = x >> e, x & ((1 << e) - 1)
    half = 1 << (e - 1)
    return quo + int(rem > half or (rem == half and quo & 1 == 1))


def dyadic_branch(m, e, in_bits):
    """Hardware form and exact result range of ``round(q * m / 2**e)`` for ``in_bits``-bit
    signed ``q``: ``{"mult", "shift", "lo", "hi"}`` with ``mult = m >> t``, ``shift = e - t``
    (``t`` trailing zeros of ``m``). The rounded value is monotonic in ``q``, so its range is
    that of the two extreme inputs."""
    t = (m & -m).bit_length() - 1
    qlo, qhi = -(1 << (in_bits - 1)), (1 << (in_bits - 1)) - 1
    return {"m": m, "e": e, "mult": m >> t, "shift": e - t,
            "lo": round_shift_int(qlo * m, e), "hi": round_shift_int(qhi * m, e)}


def _floor_shift(x, s):
    return x >> s if s > 0 else x << -s


def column_branches(m, e, in_bits):
    """Per-column :func:`dyadic_branch` of vectors ``m``, ``e``: ``{"m", "e", "mult",
    "shift"}`` as int64 vectors, ``lo``, ``hi`` (the range over all columns) and ``floor_lo``,
    ``floor_hi`` (that of ``floor(q * mult / 2**shift)``)."""
    cols = [dyadic_branch(int(a), int(b), in_bits) for a, b in zip(m, e)]
    qlo, qhi = -(1 << (in_bits - 1)), (1 << (in_bits - 1)) - 1
    out = {k: np.array([c[k] for c in cols], dtype=np.int64)
           for k in ("m", "e", "mult", "shift")}
    out.update(lo=min(c["lo"] for c in cols), hi=max(c["hi"] for c in cols),
               floor_lo=min(_floor_shift(qlo * c["mult"], c["shift"]) for c in cols),
               floor_hi=max(_floor_shift(qhi * c["mult"], c["shift"]) for c in cols))
    return out


def dyadic_stages(b, in_bits):
    """Register stages of :meth:`Requant._branch` for a :func:`dyadic_branch` ``b`` of
    ``in_bits``-bit inputs: the split multiplier's (none when ``mult == 1``), plus one for the
    rounding bits when the shift is a right shift; :data:`COLUMN_STAGES` for per-column
    branches (:func:`column_branches`)."""
    if np.ndim(b["mult"]):
        return COLUMN_STAGES
    mult = 0 if b["mult"] == 1 else split_multiply_stages(signed(in_bits), b["mult"])
    return mult + int(b["shift"] > 0)


def round_half_even(x, shift):
    """Amaranth value ``round_half_even(x / 2**shift)`` of a signed value ``x`` and a constant
    ``shift``; ``x << -shift`` when ``shift <= 0``."""
    if shift <= 0:
        return x << -shift
    width = max(len(x), shift + 1)
    ext = Cat(x, x[-1].replicate(width - len(x))).as_signed() if width > len(x) else x
    floor = ext[shift:].as_signed()
    half = ext[shift - 1]
    sticky = ext[:shift - 1].any() if shift >= 2 else Const(0)
    return floor + (half & (sticky | floor[0]))


def clamp(value, value_lo, value_hi, lo, hi):
    """``value`` (known to lie in ``value_lo..value_hi``) saturated to ``lo..hi``; comparisons
    that can never fire are left out."""
    out = value
    if value_hi > hi:
        out = Mux(value > hi, hi, out)
    if value_lo < lo:
        out = Mux(value < lo, lo, out)
    return out


def _plus(floor, inc, offset):
    """``floor + inc + offset`` (``inc`` a bit or None, ``offset`` a constant) with one adder:
    the increment selects between two constants."""
    return Value.cast(floor + (offset if inc is None else Mux(inc, offset + 1, offset)))


def _negative(value):
    """Sign bit of an exact-width Amaranth sum."""
    value = Value.cast(value)
    return value[-1] if value.shape().signed else Const(0)


def _register(m, value, name):
    reg = Signal(value.shape(), name=name)
    m.d.sync += reg.eq(value)
    return reg


def _finite_positive(name, value):
    with np.errstate(over="ignore"):
        v = golden.f32(value)
    if not (np.isfinite(v) and v > 0):
        raise ConfigError(name, "must be a positive number representable in float32",
                          value=value)


@dataclass(frozen=True)
class RequantConfig(Config, RowKernel):
    """Configuration of ``ibert-requant`` (:class:`Requant`): the input scale (``scale_in``
    or the per-column vector of ``scale_in_file``) and width ``in_bits``, the output scale
    ``scale_out`` and width ``bits``, the optional residual input (``identity``,
    ``identity_scale``, ``identity_bits``), the beat width ``lanes`` and the row length ``row``."""
    scale_in: float = param(1.9e-4, "scale of the input integers (after a linear layer: input "
                                    "scale x weight scale)")
    scale_out: float = param(0.08, "scale of the output integers (the activation's scale)")
    bits: int = param(8, "output bits (signed; results saturate)", lo=2, hi=32)
    in_bits: int = param(32, "input bits (signed; i-GELU gives 47, the integer LayerNorm up "
                               "to 34)", lo=2, hi=48)
    identity: bool = param(False, "add a residual (identity) input with its own scale")
    identity_scale: float = param(0.08, "scale of the identity integers (with identity)")
    identity_bits: int = param(8, "identity input bits (signed; with identity)", lo=2, hi=32)
    lanes: int = param(16, "elements per beat (one result per lane per cycle)", lo=1, hi=64)
    row: int = param(768, "elements per row: TLAST after each row; a row is ceil(row/lanes) "
                          "beats, the last one padded", lo=1, hi=1 << 16)
    scale_in_file: str = param("", "path of an .npz file with a float32 vector scale_in (or "
                                   "in_scale, as in hwgen.ibert.minilm.export's "
                                   "layer<L>_requant_<name>.npz) of row scales, one per column "
                                   "(after a per-channel QuantLinear); replaces scale_in "
                                   "(empty: scale_in for every column)")

    def check(self):
        if self.scale_in_file:
            _ = self.scale_in_value        # reads and checks the file
        else:
            _finite_positive("scale_in", self.scale_in)
        _finite_positive("scale_out", self.scale_out)
        if self.identity:
            _finite_positive("identity_scale", self.identity_scale)
        # The datapath shifts by at most 63 bits and keeps results (left-shifted ones
        # included) within 64 bits; ratios outside that are configuration errors.
        main = ("scale_in_file", self.scale_in_file) if self.scale_in_file else \
            ("scale_in", self.scale_in)
        branches = [(*main, self.main)]
        if self.identity:
            branches.append(("identity_scale", self.identity_scale, self.ident))
        for name, value, b in branches:
            if np.max(b["e"]) > 63:
                raise ConfigError(name, f"gives a ratio to scale_out={self.scale_out} below "
                                  f"2**-32 (shift e={np.max(b['e'])} > 63), beyond the "
                                  "datapath's 63-bit shifter", value=value)
            if b["lo"] < INT64[0] or b["hi"] > INT64[1]:
                raise ConfigError(name, f"gives a ratio to scale_out={self.scale_out} so large "
                                  f"that results reach {max(-b['lo'], b['hi'])} in magnitude: "
                                  "beyond the datapath's 64 bits", value=value)
        lo, hi = self.sum_range
        if lo < INT64[0] or hi > INT64[1]:
            raise ConfigError("identity_scale", "makes the sum of both branches overflow int64 "
                              "(beyond the datapath's 64 bits)", value=self.identity_scale)

    # -- constants and widths ------------------------------------------------------------------

    def digest(self):
        return with_file_digest(super().digest(), self.scale_in_file)

    @cached_property
    def scale_in_value(self):
        """The input scale: ``scale_in``, or the float32 vector (``row``) of the file
        :attr:`scale_in_file` (its array ``scale_in`` or ``in_scale``), checked positive."""
        path = self.scale_in_file
        if not path:
            return self.scale_in
        return scale_vector("scale_in_file", path, ("scale_in", "in_scale"), self.row)

    @property
    def per_column(self):
        """The input scale is a vector: one ``(m, e)`` per column of the row."""
        return bool(self.scale_in_file)

    @property
    def constants(self):
        """``((m, e), (m1, e1) or None)`` from :func:`golden.requant_constants` (``m``, ``e``
        int64 vectors with :attr:`per_column`)."""
        return golden.requant_constants(self.scale_in_value, self.scale_out,
                                        self.identity_scale if self.identity else None)

    @cached_property
    def main(self):
        """The main branch ``round(q * m / 2**e)``: :func:`dyadic_branch` of the input's
        ``(m, e)`` at ``in_bits``, or :func:`column_branches` with :attr:`per_column`."""
        if self.per_column:
            return column_branches(*self.constants[0], self.in_bits)
        return dyadic_branch(*self.constants[0], self.in_bits)

    @property
    def ident(self):
        """The residual branch ``round(id * m1 / 2**e1)``: :func:`dyadic_branch` at
        ``identity_bits``; None without ``identity``."""
        return dyadic_branch(*self.constants[1], self.identity_bits) if self.identity else None

    @property
    def sum_range(self):
        """Exact range of the unsaturated result (both branches)."""
        b, i = self.main, self.ident
        return (b["lo"] + (i["lo"] if i else 0), b["hi"] + (i["hi"] if i else 0))

    @property
    def out_range(self):
        """``(lo, hi)``: the signed ``bits``-bit range the results saturate to."""
        return -(1 << (self.bits - 1)), (1 << (self.bits - 1)) - 1

    @property
    def beats_per_row(self):
        """Beats of one row, ``ceil(row / lanes)`` (the last one padded)."""
        return beats_per_row(self.row, self.lanes)

    @property
    def branch_stages(self):
        """Register stages of the multiply and rounding bits (:func:`dyadic_stages`), the
        longer branch's with ``identity`` (the shorter one is delayed to match)."""
        stages = dyadic_stages(self.main, self.in_bits)
        if self.identity:
            stages = max(stages, dyadic_stages(self.ident, self.identity_bits))
        return stages

    @property
    def latency(self):
        """Cycles from an input handshake to its result entering the output FIFO: input
        register, partial products and their adder tree, rounding bits
        (:attr:`branch_stages`), rounding add and saturation compares, [residual add with
        its compares], output register with the saturating select."""
        return 1 + self.branch_stages + 1 + int(self.identity) + 1

    @dataclass(frozen=True)
    class Workload(contract.Workload):
        """The workload of :meth:`cycle_model` (None: steady-state figures only)."""
        rows: int = None     # rows sent back to back

    def cycle_model(self, workload):
        """Cycle model without stalls: one beat per cycle, back to back across rows.

        ``latency_cycles`` runs from an input beat's handshake to its result's handshake;
        with ``rows``, ``cycles`` from the first input beat to the last result, as ``hwgen sim``
        measures them.
        """
        rows = workload.rows
        model = {"initiation_interval": 1, "beats_per_row": self.beats_per_row,
                 "elements_per_cycle": self.row / self.beats_per_row,
                 "latency_cycles": self.latency + OUTPUT_FIFO_CYCLES}
        if rows:
            model["cycles"] = rows * self.beats_per_row + model["latency_cycles"]
        return model

    def row_ports(self):
        """``i_x``: int(in_bits) rows of ``row`` on ``lanes`` lanes (with the residual ``id``
        field when ``identity``); ``o_y``: int(bits) rows."""
        extra = (("id", signed(self.identity_bits)),) if self.identity else ()
        return ([RowPort("i_x", "q", signed(self.in_bits), self.lanes, self.row, extra=extra)],
                RowPort("o_y", "y", signed(self.bits), self.lanes, self.row))

    def row_timing(self, m):
        """:meth:`RowKernel.row_timing`: one row every ``beats_per_row`` cycles."""
        cycles = self.performance(self.workload(rows=1)).cycles
        return cycles - self.beats_per_row, self.beats_per_row

    def derived(self):
        b, i = self.main, self.ident
        if self.per_column:
            d = {f"{name}_range": [int(b[k].min()), int(b[k].max())]
                 for name, k in (("m", "m"), ("e", "e"), ("multiplier", "mult"),
                                 ("shift", "shift"))}
            d.update(main_range=[b["lo"], b["hi"]],
                     multiplier_bits=int(b["mult"].max()).bit_length(),
                     branch_stages=self.branch_stages)
        else:
            d = {"m": b["m"], "e": b["e"], "multiplier": b["mult"], "shift": b["shift"],
                 "main_range": [b["lo"], b["hi"]],
                 "multiplier_bits": (b["mult"]).bit_length() if b["mult"] > 1 else 0,
                 "branch_stages": self.branch_stages}
        if i:
            d.update({"m1": i["m"], "e1": i["e"], "identity_multiplier": i["mult"],
                      "identity_shift": i["shift"], "identity_range": [i["lo"], i["hi"]]})
        d.update({"beats_per_row": self.beats_per_row,
                  "lanes_in_last_beat": lanes_in_last_beat(self.row, self.lanes),
                  "pipeline_latency": self.latency,
                  "output_fifo_depth": self.latency + 3})
        return d


def payload_in(config):
    """Input beat: ``q`` (and ``id`` with identity) per lane, ``last`` at the end of a row."""
    c = config
    fields = {"q": data.ArrayLayout(signed(c.in_bits), c.lanes)}
    if c.identity:
        fields["id"] = data.ArrayLayout(signed(c.identity_bits), c.lanes)
    fields["last"] = 1
    return data.StructLayout(fields)


def payload_out(config):
    """Output beat: ``y`` per lane (``bits`` signed), ``last`` at the end of a row."""
    return data.StructLayout({"y": data.ArrayLayout(signed(config.bits), config.lanes),
                              "last": 1})


class Requant(wiring.Component):
    """Dyadic requantisation of a stream of integer rows, ``lanes`` elements per cycle.

    Parameters
    ----------
    config : RequantConfig

    Members
    -------
    i_x : ``In(stream.Signature(payload_in(config)))``
        ``q[lanes]`` (``in_bits`` signed) and, with ``identity``, ``id[lanes]``
        (``identity_bits`` signed) of the same elements; ``last`` (TLAST) on a row's final
        beat. A row is ``ceil(row / lanes)`` beats; lanes past the row's end in its final beat
        are padding and ignored.
    o_y : ``Out(stream.Signature(payload_out(config)))``
        ``y[lanes]`` (``bits`` signed), ``last`` copied from the input beat; padding lanes are 0.

    Timing
    ------
    Initiation interval one beat per cycle, rows back to back. Latency from an ``i_x``
    handshake to the ``o_y`` beat: ``config.latency + 2`` cycles, 10 at the default
    configuration (11 with ``identity``): input register; per branch the split multiplier
    (input registers, partial products in one register, then one adder level per halving of
    their number: 4 stages for 32-bit inputs times a 31-bit ``m``, four partial products) and
    the rounding bits (floor, half, sticky: one stage when the shift is a right shift), the
    longer branch setting ``config.branch_stages``; the rounding add with the saturation
    compares; [the residual add with its compares]; the output register, which selects the
    saturated value; output FIFO (2).

    Every multiplier's input is a register and its product is written straight into a
    register (partial products of at most 18x18 signed); each stage holds at most one carry
    chain and a few LUTs: the compares ``rounded > hi`` and ``rounded < lo`` run beside the
    rounding add as sign bits of ``floor + inc - (hi + 1)`` and ``floor + inc - lo``, with the
    rounding increment ``inc`` folded into the constant.

    Backpressure: ``o_y`` may stall at any time; the pipeline never stalls, ``i_x.ready``
    drops while the output FIFO could not hold everything in flight (a registered compare, no
    combinational path from ``o_y.ready``).

    Each lane has one constant multiplier per branch (``in_bits x bits(m >> t)``, split into
    native-width DSP multipliers by :func:`hwgen.lib.wide_mul.split_multiply`), a rounding
    adder and two saturation compares.
    """

    def __init__(self, config):
        self.config = config
        super().__init__({
            "i_x": In(stream.Signature(payload_in(config))),
            "o_y": Out(stream.Signature(payload_out(config))),
        })

    @staticmethod
    def _branch(m, value, b, name):
        """``round(value * m / 2**e) == floor + inc``, as ``(floor, inc or None, stages)``:
        the split product, then (right shifts) one register stage holding ``floor`` and the
        round-half-to-even increment ``inc = half & (sticky | floor[0])``."""
        product, stages = (value, 0) if b["mult"] == 1 else \
            split_multiply(m, value, b["mult"], name=f"{name}_mul")
        shift = b["shift"]
        if shift <= 0:
            return product << -shift, None, stages
        qlo, qhi = -(1 << (len(value) - 1)), (1 << (len(value) - 1)) - 1
        floor = Signal(range_shape((qlo * b["mult"]) >> shift, (qhi * b["mult"]) >> shift),
                       name=f"{name}_floor")
        inc = Signal(name=f"{name}_inc")
        width = max(len(product), shift + 1)
        ext = product.as_signed() if len(product) == width else \
            Cat(product, product[-1].replicate(width - len(product))).as_signed()
        sticky = ext[:shift - 1].any() if shift >= 2 else Const(0)
        m.d.sync += [floor.eq(ext[shift:].as_signed()),
                     inc.eq(ext[shift - 1] & (sticky | ext[shift]))]
        return floor, inc, stages + 1

    @staticmethod
    def column_rom(config):
        """Per-column constants, as :meth:`_column_branch` reads them: ``(layout, init,
        pre, base)``. Beat ``j``, lane ``k`` holds column ``j * lanes + k``'s ``mult`` and ``v =
        shift + pre - base`` (0 past the row), where ``pre`` turns left shifts into right
        ones and ``base`` is the smallest ``shift + pre``."""
        c, b = config, config.main
        pre = max(0, -int(b["shift"].min()))
        base = int(b["shift"].min()) + pre
        v = b["shift"] + pre - base
        layout = data.StructLayout({"mult": unsigned(int(b["mult"].max()).bit_length()),
                                    "v": unsigned(max(int(v.max()).bit_length(), 1))})
        size = c.beats_per_row * c.lanes
        mult = np.zeros(size, dtype=np.int64)
        shift = np.zeros(size, dtype=np.int64)
        mult[:c.row], shift[:c.row] = b["mult"], v
        init = [[{"mult": int(mult[j * c.lanes + k]), "v": int(shift[j * c.lanes + k])}
                 for k in range(c.lanes)] for j in range(c.beats_per_row)]
        return data.ArrayLayout(layout, c.lanes), init, pre, base

    @staticmethod
    def _column_branch(m, value, coef, b, pre, base, name):
        """``round(value * mult / 2**shift) == floor + inc`` with the column's ``mult`` and
        ``v`` from the ROM (``coef``, valid with ``value``): registered multiplier inputs, the
        product registered twice, then the variable rounding shift into ``floor`` and ``inc``
        (:data:`COLUMN_STAGES` stages). With ``x = product << (pre + 1)`` and ``s = shift +
        pre = base + v``: ``floor = x >> (s + 1)``, ``half = x[s]``, ``sticky = x[:s] != 0``;
        the bits below ``base`` enter the sticky bit through a constant slice."""
        a = _register(m, value, f"{name}_a")
        mult = _register(m, coef.mult, f"{name}_m")
        v = delay(m, _register(m, coef.v, f"{name}_v"), 2, name=f"{name}_v")
        product = _register(m, a * mult, f"{name}_p")
        product = _register(m, product, f"{name}_p2")
        span = (1 << len(v)) - 1
        x = Cat(Const(0, pre + 1), product)
        top = base + span + 2 - len(x)              # sign-extend x up to the largest shift
        x = (Cat(x, product[-1].replicate(top)) if top > 0 else x).as_signed()
        low = x[:base].any() if base else Const(0)
        y = x[base:].as_signed()
        mask = ((Const(1, span + 1) << v) - 1)[:span]
        floor = Signal(range_shape(b["floor_lo"], b["floor_hi"]), name=f"{name}_floor")
        inc = Signal(name=f"{name}_inc")
        shifted = y >> (v + 1)
        sticky = low | (y[:span] & mask).any()
        m.d.sync += [floor.eq(shifted), inc.eq(y.bit_select(v, 1) & (sticky | shifted[0]))]
        return floor, inc, COLUMN_STAGES

    def elaborate(self, platform):
        c = self.config
        m = Module()
        main, ident = c.main, c.ident
        lo, hi = c.out_range
        total_lo, total_hi = c.sum_range
        stages = c.branch_stages
        # Saturation compares that can fire, as offsets: ``v > hi`` is ``v - (hi + 1) >= 0``,
        # ``v < lo`` is ``v - lo < 0``.
        thresholds = {}
        if total_hi > hi:
            thresholds["over"] = (-hi - 1, lambda v: ~_negative(v))
        if total_lo < lo:
            thresholds["under"] = (-lo, _negative)

        coefs = None
        if c.per_column:
            # The ROM is read with the input beat's position in the row: its data arrives
            # with the registered payload.
            layout, init, pre, base = self.column_rom(c)
            m.submodules.columns = rom = memory.Memory(shape=layout, depth=c.beats_per_row,
                                                       init=init)
            rd = rom.read_port()
            beat = Signal(range(c.beats_per_row))
            with m.If(self.i_x.valid & self.i_x.ready):
                m.d.sync += beat.eq(Mux(self.i_x.payload.last | (beat == c.beats_per_row - 1),
                                        0, beat + 1))
            m.d.comb += rd.addr.eq(beat)
            coefs = rd.data

        def branch(k, value, b, name):
            """Rounded branch, aligned to ``stages``: ``(floor, inc or None)``."""
            if coefs is not None and b is main:
                floor, inc, n = self._column_branch(m, value, coefs[k], b, pre, base,
                                                    f"{name}{k}")
            else:
                floor, inc, n = self._branch(m, value, b, f"{name}{k}")
            floor = delay(m, floor, stages - n, name=f"{name}{k}_floor")
            inc = None if inc is None else delay(m, inc, stages - n, name=f"{name}{k}_inc")
            return floor, inc

        def lane(m, k, p):
            floor, inc = branch(k, p.q[k], main, "q")
            result = Signal(range_shape(total_lo, total_hi), name=f"total{k}")
            flags = {key: Signal(name=f"{key}{k}") for key in thresholds}
            if not ident:
                # One stage: the rounding add, and each compare as one add of its own.
                m.d.sync += result.eq(_plus(floor, inc, 0))
                for key, (offset, test) in thresholds.items():
                    m.d.sync += flags[key].eq(test(_plus(floor, inc, offset)))
            else:
                # The rounding adds of both branches (and the residual's offsets by the
                # thresholds), then the sum and the compares as sums of registers.
                main_r = _register(m, _plus(floor, inc, 0), f"q{k}_round")
                floor, inc = branch(k, p.id[k], ident, "id")
                ident_r = _register(m, _plus(floor, inc, 0), f"id{k}_round")
                m.d.sync += result.eq(main_r + ident_r)
                for key, (offset, test) in thresholds.items():
                    shifted = _register(m, _plus(floor, inc, offset), f"id{k}_{key}")
                    m.d.sync += flags[key].eq(test(main_r + shifted))
            out = result
            if "over" in flags:
                out = Mux(flags["over"], hi, out)
            if "under" in flags:
                out = Mux(flags["under"], lo, out)
            return out, stages + 1 + int(c.identity)

        latency = elementwise(m, self.i_x, self.o_y, "y", lane, row=c.row, lanes=c.lanes)
        assert latency == c.latency
        return m


#: Kinds of rows in the stimulus; the first rows take them in this order so that even a short
#: run holds every extreme, later rows draw them at random (weights in ``_WEIGHTS``).
_KINDS = ("realistic", "max", "min", "saturating", "zero", "alternate", "equal", "ties",
          "wide", "boundary")
_WEIGHTS = (0.35, 0.04, 0.04, 0.15, 0.02, 0.04, 0.04, 0.12, 0.12, 0.08)


def branch_values(rng, kind, shape, in_bits, b, out_bits):
    """Inputs of one branch for a row of the given kind (see :data:`_KINDS`).

    ``realistic`` rows map to outputs spread over the output range, ``saturating`` to
    1.5x beyond it, ``boundary`` to the saturation thresholds +-2, ``ties`` are inputs whose
    product lies halfway between two integers after the shift (when the input width allows),
    ``wide`` covers the whole input range.
    """
    qlo, qhi = -(1 << (in_bits - 1)), (1 << (in_bits - 1)) - 1
    ratio = b["m"] / 2.0 ** b["e"]
    top = 1 << (out_bits - 1)

    def from_target(t):
        return np.clip(np.round(np.asarray(t, dtype=np.float64) / ratio), qlo, qhi) \
            .astype(np.int64)

    if kind == "realistic":
        return from_target(rng.normal(0.0, top / 4, size=shape))
    if kind == "saturating":
        return from_target(rng.uniform(-1.5 * top, 1.5 * top, size=shape))
    if kind == "boundary":
        t = rng.choice([-top - 1, -top, top - 1, top], size=shape) + rng.uniform(-2, 2, shape)
        return from_target(t)
    if kind == "max":
        return np.full(shape, qhi, dtype=np.int64)
    if kind == "min":
        return np.full(shape, qlo, dtype=np.int64)
    if kind == "zero":
        return np.zeros(shape, dtype=np.int64)
    if kind == "equal":
        return np.full(shape, rng.integers(qlo, qhi, endpoint=True), dtype=np.int64)
    if kind == "alternate":
        return np.where(np.arange(shape[-1]) % 2 == 0, qlo, qhi) * np.ones(shape, np.int64)
    if kind == "ties":
        s = b["shift"]                        # per column: a vector
        if np.all(1 <= np.asarray(s)) and np.all(np.asarray(s) - 1 <= in_bits - 2):
            # q = odd * 2**(s-1) exists in range
            limit = (qhi >> (s - 1)) // 2
            odd = 2 * rng.integers(-limit - 1, limit, size=shape, endpoint=True) + 1
            q = odd * (1 << (s - 1)) + rng.choice([-1, 0, 0, 0, 1], size=shape)
            return np.clip(q, qlo, qhi)
        return from_target(rng.normal(0.0, top / 4, size=shape))
    return rng.integers(qlo, qhi, size=shape, endpoint=True)


def row_kinds(rng, rows):
    """Kind of each stimulus row: every kind once first, then at random."""
    head = list(_KINDS[:rows])
    tail = rng.choice(len(_KINDS), size=max(0, rows - len(_KINDS)), p=_WEIGHTS)
    return head + [_KINDS[k] for k in tail]


class RequantModel(StreamModel):
    """Stream-level golden model and stimulus of :class:`Requant`. An item is a row."""

    #: How :meth:`stimulus` holds the rows of each element field (``{field: (stimulus key,
    #: form)}``; form ``mats``, ``array`` or ``list``: :class:`~hwgen.cluster.gateware.compute.KernelChain`).
    row_fields = {"q": ("q", "array"), "id": ("id", "array")}

    result_port = "o_y"
    latency_from = "i_x"

    @staticmethod
    def stimulus(config, items, rng):
        """``items`` rows of ``row`` elements: realistic values, saturating ones, exact
        rounding ties, every extreme (all maximum, all minimum, alternating, all equal, zero)
        and random values over the whole input range; the identity input draws its own kind
        per row. Padding lanes get random values (ignored by the kernel)."""
        c = config
        shape = (1, c.row)
        q = np.concatenate([branch_values(rng, k, shape, c.in_bits, c.main, c.bits)
                            for k in row_kinds(rng, items)])
        stim = {"q": q}
        pad = c.beats_per_row * c.lanes - c.row
        pads = {"q": rng.integers(-(1 << (c.in_bits - 1)), 1 << (c.in_bits - 1),
                                  size=pad * items)}
        if c.identity:
            kinds = row_kinds(rng, items)
            rng.shuffle(kinds)
            stim["id"] = np.concatenate([branch_values(rng, k, shape, c.identity_bits, c.ident,
                                                       c.bits) for k in kinds])
            pads["id"] = rng.integers(-(1 << (c.identity_bits - 1)),
                                      1 << (c.identity_bits - 1), size=pad * items)
        stim["pad"] = pads
        return stim

    @staticmethod
    def inputs(config, stim):
        """``i_x``: each row in ``beats_per_row`` beats of ``lanes`` elements
        (:func:`~hwgen.ibert.stream_rows.to_beats`): ``q`` and, with ``identity``, ``id``; padding
        lanes take ``stim["pad"]``; ``last`` on each row's final beat."""
        fields = {k: stim[k] for k in ("q", "id") if k in stim}
        return {"i_x": to_beats(fields, config.lanes, pad=stim["pad"])}

    @staticmethod
    def expect(config, stim):
        """``o_y``: :func:`hwgen.ibert.golden.requant` of all rows (``scale_in``, or the per-column
        scales of ``scale_in_file``, to ``scale_out`` at ``bits``, plus the identity branch when
        configured), packed like the input as ``y`` with
        zero padding lanes and ``last`` on each row's final beat."""
        c = config
        y, _ = golden.requant(stim["q"], c.scale_in_value, c.scale_out, c.bits,
                              identity=stim.get("id"),
                              identity_scale=c.identity_scale if c.identity else None)
        return {"o_y": to_beats({"y": y}, c.lanes)}


#: Simulated by ``tests/test_sim.py``: one lane with a row of 7 (ties: power-of-two ratio),
#: 3 lanes with padded rows and the residual branch at LayerNorm-input width (22 bits), left
#: shifts (e = -1, e1 = 0) at 32-bit output, 5 lanes of 16-bit outputs from 20-bit inputs,
#: 47-bit inputs (an i-GELU output) on 3 lanes, and the BERT-base size (H = 768, 16 lanes,
#: INT32 in, INT8 out).
TEST_CONFIGS = (
    {"scale_in": 0.25, "scale_out": 1.0, "bits": 8, "in_bits": 12, "lanes": 1, "row": 7},
    {"scale_in": 3.1e-4, "scale_out": 0.0021, "bits": 22, "in_bits": 32, "identity": True,
     "identity_scale": 0.07, "identity_bits": 8, "lanes": 3, "row": 10},
    {"scale_in": 3.0e9, "scale_out": 1.0, "bits": 32, "in_bits": 24, "identity": True,
     "identity_scale": 1.2e9, "identity_bits": 9, "lanes": 4, "row": 13},
    {"scale_in": 1.3e-3, "scale_out": 0.011, "bits": 16, "in_bits": 20, "lanes": 5, "row": 23},
    {"scale_in": 2.2e-9, "scale_out": 0.06, "bits": 8, "in_bits": 47, "lanes": 3, "row": 11},
    {},
)
