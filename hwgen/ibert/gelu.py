"""I-BERT integer GELU (i-GELU; the reference's ``IntGELU``).

``y = q * (floor(sign(q) * ((min(|q|, -b) + b)**2 + c) / 2**14) + shift)`` with
``(b, c, shift)`` from :func:`hwgen.ibert.golden.gelu_constants` at the input scale, exactly as
:func:`~hwgen.ibert.golden.int_gelu`; the output scale (negative, as in the reference) is
``gelu_constants(scale)[3]``.

Rewritten for hardware without changing a bit of the result:

* ``min(|q|, -b) + b == min(|q| + b, 0)``: one adder on ``q`` (``q + b`` or ``b - q`` by the
  sign) and a select on its sign bit give ``d``, ``-b >= -d >= 0``;
* ``floor(X / 2**14) + shift == floor((X + shift * 2**14) / 2**14)``, so the sign, the
  polynomial's ``c`` and ``shift`` fold into one adder: ``w = d*d + K1`` for ``q > 0``,
  ``w = K2 - d*d`` for ``q < 0`` with ``K1 = c + shift * 2**14``, ``K2 = -c + shift * 2**14``
  (for ``q == 0`` the product below is 0 whatever ``w`` is), and the floor division is the
  arithmetic shift ``w >> 14`` (wiring);
* ``y = q * (w >> 14)``.

Two multipliers per element: ``d*d`` (``bits(b)`` squared) and ``q * (w >> 14)``, each split
into native-width partial products with registered inputs and outputs, summed by a pipelined
adder tree (:func:`hwgen.lib.wide_mul.split_multiply`); ``w`` itself is never stored, only
``z = w >> 14``.

After a per-channel QuantLinear the input scale differs per column of the row (``scale_file``,
a vector of ``row`` scales; the reference's ``IntGELU`` then has per-channel ``b``, ``c`` and
``shift``): each column's ``b`` and ``(K1, K2)`` sit in two ROMs read by the element's position
in the row, ``b`` at the input and ``(K1, K2)`` where ``d*d`` leaves its multiplier (the second
ROM's address is the delayed beat counter, so the constants are not carried down the pipeline);
both ROMs' outputs are registered once more before use (one stage more than the scalar path).

``negate`` gives ``y = -i-GELU(q)`` at the positive output scale ``-out_scale`` with no logic
added: ``-floor(w / 2**14) == floor((2**14 - 1 - w) / 2**14)``, so ``-z`` is ``(K1' - d*d) >> 14``
for ``q > 0`` and ``(d*d + K2') >> 14`` for ``q < 0`` with ``K1' = 2**14 - 1 - K1`` and
``K2' = 2**14 - 1 - K2``: the same adder with the sign's roles swapped and other constants.
(A requantisation takes positive scales only: ``minilm_encoder``'s GELU runs negated so that
its requantisation gets the positive scale, and needs no negation kernel.)
"""

from dataclasses import dataclass
from functools import cached_property

import numpy as np
from amaranth.hdl import Module, Mux, Shape, Signal, signed
from amaranth.lib import data, memory, stream, wiring
from amaranth.lib.wiring import In, Out

from .. import contract
from ..config import Config, param
from ..errors import ConfigError
from ..flow.model import StreamModel
from ..lib.pipeline import delay
from ..lib.wide_mul import split_multiply, split_multiply_stages
from ..lib.row_ports import RowKernel, RowPort
from . import golden
from .param_files import scale_vector, with_file_digest
from .stream_rows import OUTPUT_FIFO_CYCLES, beats_per_row, elementwise, lanes_in_last_beat, \
    to_beats

__all__ = ["GeluConfig", "Gelu", "GeluModel", "TEST_CONFIGS"]

INT64 = (-(1 << 63), (1 << 63) - 1)
SHIFT = golden.GELU_CONST
#: ``-floor(w / 2**SHIFT) == floor((NEG_FLOOR - w) / 2**SHIFT)`` (``negate``).
NEG_FLOOR = (1 << SHIFT) - 1


def _interval_product(a, b):
    """Range of ``x * y`` for ``x`` in ``a = (lo, hi)`` and ``y`` in ``b``."""
    corners = [x * y for x in a for y in b]
    return min(corners), max(corners)


def _z_ranges(b, k1, k2):
    """Ranges of ``w >> 14`` for positive and for negative inputs (``d*d`` in ``0..b*b``)."""
    return ((k1 >> SHIFT, (k1 + b * b) >> SHIFT), ((k2 - b * b) >> SHIFT, k2 >> SHIFT))


def _out_range(q_range, b, k1, k2):
    """Range of ``y`` for one column's folded constants (:attr:`GeluConfig.out_range`)."""
    qlo, qhi = q_range
    pos, neg = _z_ranges(b, k1, k2)
    parts = [(0, 0)]
    if min(qhi, -b - 1) >= 1:
        parts.append(_interval_product((1, min(qhi, -b - 1)), pos))
    if qhi >= -b:
        parts.append(_interval_product((-b, qhi), (k1 >> SHIFT,) * 2))
    parts.append(_interval_product((max(qlo, b + 1), -1), neg))
    if qlo <= b:
        parts.append(_interval_product((qlo, b), (k2 >> SHIFT,) * 2))
    return min(p[0] for p in parts), max(p[1] for p in parts)


def _union(ranges):
    ranges = list(ranges)
    return min(r[0] for r in ranges), max(r[1] for r in ranges)


@dataclass(frozen=True)
class GeluConfig(Config, RowKernel):
    """Configuration of ``ibert-gelu`` (:class:`Gelu`): the input scale (``scale`` or the
    per-column vector of ``scale_file``), the input width ``in_bits``, the beat width
    ``lanes``, the row length ``row`` and whether the output is negated (``negate``)."""
    scale: float = param(2e-4, "scale of the input integers (after a linear layer: input "
                               "scale x weight scale)")
    in_bits: int = param(32, "input bits (signed)", lo=2, hi=32)
    lanes: int = param(16, "elements per beat (one result per lane per cycle)", lo=1, hi=64)
    row: int = param(3072, "elements per row: TLAST after each row; a row is ceil(row/lanes) "
                           "beats, the last one padded", lo=1, hi=1 << 16)
    scale_file: str = param("", "path of an .npz file with a float32 vector scale (or "
                                "in_scale, as in hwgen.ibert.minilm.export's layer<L>_gelu.npz) "
                                "of row scales, one per column (after a per-channel "
                                "QuantLinear); replaces scale (empty: scale for every column)")
    negate: bool = param(False, "output -i-GELU(q) at the positive scale -out_scale (exact, "
                                "no extra logic: the constants absorb the sign)")

    def check(self):
        if self.scale_file:
            field, value = "scale_file", self.scale_file
        else:
            field, value = "scale", self.scale
            with np.errstate(over="ignore"):
                s = golden.f32(self.scale)
            if not (np.isfinite(s) and s > 0):
                raise ConfigError("scale", "must be a positive number representable in "
                                  "float32", value=self.scale)
        try:
            with np.errstate(divide="ignore", over="ignore"):
                columns = self.column_constants
        except OverflowError:                  # a scale so small that s**2 is 0 in float32
            columns = [(INT64[0] - 1, 0, 0)]
        for b, c, shift in columns:
            # golden.int_gelu computes (a + b)**2 + c and the product in int64.
            k1, k2 = c + (shift << SHIFT), -c + (shift << SHIFT)
            out = _out_range(self.q_range, b, k1, k2)
            if b * b > INT64[1] or c < INT64[0] or max(-out[0], out[1]) > INT64[1]:
                raise ConfigError(field, f"is so small that i-GELU of {self.in_bits}-bit "
                                  "inputs exceeds int64, where golden.int_gelu wraps",
                                  value=value)

    # -- constants and widths ------------------------------------------------------------------

    def digest(self):
        return with_file_digest(super().digest(), self.scale_file)

    @cached_property
    def scale_value(self):
        """The input scale: ``scale``, or the float32 vector (``row``) of the file
        :attr:`scale_file` (its array ``scale`` or ``in_scale``), checked positive."""
        path = self.scale_file
        if not path:
            return self.scale
        return scale_vector("scale_file", path, ("scale", "in_scale"), self.row)

    @property
    def per_column(self):
        """The input scale is a vector: one ``(b, K1, K2)`` per column of the row."""
        return bool(self.scale_file)

    @property
    def constants(self):
        """``(b_int, c_int, shift_int, out_scale)`` from :func:`golden.gelu_constants` (int64
        and float32 vectors with :attr:`per_column`)."""
        return golden.gelu_constants(self.scale_value)

    @cached_property
    def column_constants(self):
        """``[(b_int, c_int, shift_int)]`` as Python integers, one per column (one entry, the
        scalar's, without :attr:`per_column`)."""
        scales = self.scale_value if self.per_column else [self.scale]
        return [golden.gelu_constants(s)[:3] for s in scales]

    @cached_property
    def column_folded(self):
        """``[(b, K1, K2)]`` of :attr:`column_constants`, Python integers."""
        return [(b, c + (shift << SHIFT), -c + (shift << SHIFT))
                for b, c, shift in self.column_constants]

    @property
    def folded(self):
        """``(b, K1, K2)``: ``K1 = c + shift * 2**14`` (q > 0), ``K2 = -c + shift * 2**14``;
        with :attr:`per_column` ``b`` an int64 vector, ``K1`` and ``K2`` tuples."""
        if not self.per_column:
            b, c, shift, _ = self.constants
            return b, c + (shift << SHIFT), -c + (shift << SHIFT)
        b, k1, k2 = zip(*self.column_folded)
        return np.array(b, dtype=np.int64), k1, k2

    @property
    def hw_folded(self):
        """``(b, K1, K2)`` as the datapath adds them (:attr:`folded`, or with :attr:`negate`
        ``2**14 - 1 - K1`` and ``2**14 - 1 - K2``, the sign's roles swapped)."""
        b, k1, k2 = self.folded
        if not self.negate:
            return b, k1, k2
        if self.per_column:
            return b, tuple(NEG_FLOOR - k for k in k1), tuple(NEG_FLOOR - k for k in k2)
        return b, NEG_FLOOR - k1, NEG_FLOOR - k2

    @property
    def out_scale(self):
        """The output scale: ``gelu_constants(scale)[3]`` (negative), positive with
        :attr:`negate` (float32; a vector with :attr:`per_column`)."""
        s = self.constants[3]
        return -s if self.negate else s

    @property
    def b_min(self):
        """The most negative ``b`` over the columns."""
        return min(f[0] for f in self.column_folded)

    @property
    def q_range(self):
        """``(lo, hi)``: the values of a signed ``in_bits`` input."""
        return -(1 << (self.in_bits - 1)), (1 << (self.in_bits - 1)) - 1

    @property
    def z_ranges(self):
        """Ranges of ``w >> 14`` for positive and for negative inputs (``d*d`` in ``0..b*b``),
        over all columns."""
        pos, neg = zip(*(_z_ranges(*f) for f in self.column_folded))
        if self.negate:
            return tuple((-hi, -lo) for lo, hi in (_union(pos), _union(neg)))
        return _union(pos), _union(neg)

    @property
    def z_range(self):
        """Range of ``z = w >> 14`` over both signs."""
        (plo, phi), (nlo, nhi) = self.z_ranges
        return min(plo, nlo), max(phi, nhi)

    @property
    def z_shape(self):
        """Shape of ``z``, the register the hardware holds it in."""
        return Shape.cast(range(self.z_range[0], self.z_range[1] + 1))

    @property
    def d_shape(self):
        """Shape of ``d = min(|q| + b, 0)``: ``b..0``."""
        return Shape.cast(range(self.b_min, 1))

    @property
    def square_stages(self):
        """Register stages of ``d*d`` (:func:`~hwgen.lib.wide_mul.split_multiply`)."""
        return split_multiply_stages(self.d_shape, self.d_shape)

    @property
    def product_stages(self):
        """Register stages of ``q * z`` (:func:`~hwgen.lib.wide_mul.split_multiply`)."""
        return split_multiply_stages(signed(self.in_bits), self.z_shape)

    @property
    def out_range(self):
        """Range of ``y``, per input sign: where ``|q| >= -b`` the clip makes ``z`` constant
        (``K1 >> 14`` or ``K2 >> 14``: these extremes are attained), below it an interval
        product with the whole range of ``z``; and 0."""
        lo, hi = _union(_out_range(self.q_range, *f) for f in self.column_folded)
        return (-hi, -lo) if self.negate else (lo, hi)

    @property
    def out_bits(self):
        """Output width: signed, the smallest that holds every result."""
        lo, hi = self.out_range
        return max(signed_bits(lo), signed_bits(hi))

    @property
    def beats_per_row(self):
        """Beats of one row, ``ceil(row / lanes)`` (the last one padded)."""
        return beats_per_row(self.row, self.lanes)

    @property
    def latency(self):
        """Cycles from an input handshake to its result entering the output FIFO: input
        register, ``d = min(|q| + b, 0)`` (adder, select), ``d*d`` (:attr:`square_stages`),
        ``z = w >> 14`` (adder), ``q * z`` (:attr:`product_stages`), output register; with
        :attr:`per_column` one more, the register of the ROM's output before ``d``."""
        return 1 + int(self.per_column) + 1 + self.square_stages + 1 + self.product_stages + 1

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
        """``i_x``: int(in_bits) rows of ``row`` on ``lanes`` lanes; ``o_y``: int(out_bits)."""
        return ([RowPort("i_x", "q", signed(self.in_bits), self.lanes, self.row)],
                RowPort("o_y", "y", signed(self.out_bits), self.lanes, self.row))

    def row_timing(self, m):
        """:meth:`RowKernel.row_timing`: one row every ``beats_per_row`` cycles."""
        cycles = self.performance(self.workload(rows=1)).cycles
        return cycles - self.beats_per_row, self.beats_per_row

    def derived(self):
        b, c, shift, _ = self.constants
        out_scale = self.out_scale
        _, k1, k2 = self.hw_folded
        if self.per_column:
            d = {f"{n}_range": [int(min(v)), int(max(v))]
                 for n, v in (("b_int", b), ("c_int", c), ("shift_int", shift), ("k_pos", k1),
                              ("k_neg", k2))}
            d["out_scale_range"] = [float(out_scale.min()), float(out_scale.max())]
        else:
            d = {"b_int": b, "c_int": c, "shift_int": shift, "out_scale": float(out_scale),
                 "k_pos": k1, "k_neg": k2}
        d.update({"out_bits": self.out_bits,
                  "out_range": list(self.out_range),
                  "square_bits": (-self.b_min).bit_length(),
                  "z_bits": max(signed_bits(v) for r in self.z_ranges for v in r),
                  "square_stages": self.square_stages, "product_stages": self.product_stages,
                  "beats_per_row": self.beats_per_row,
                  "lanes_in_last_beat": lanes_in_last_beat(self.row, self.lanes),
                  "pipeline_latency": self.latency, "output_fifo_depth": self.latency + 3})
        return d


def signed_bits(v):
    """Bits of the smallest signed integer holding ``v``."""
    return (v.bit_length() if v >= 0 else (-v - 1).bit_length()) + 1


def payload_in(config):
    """Input beat: ``q`` per lane (``in_bits`` signed), ``last`` at the end of a row."""
    return data.StructLayout({"q": data.ArrayLayout(signed(config.in_bits), config.lanes),
                              "last": 1})


def payload_out(config):
    """Output beat: ``y`` per lane (``out_bits`` signed), ``last`` at the end of a row."""
    return data.StructLayout({"y": data.ArrayLayout(signed(config.out_bits), config.lanes),
                              "last": 1})


class Gelu(wiring.Component):
    """i-GELU of a stream of integer rows, ``lanes`` elements per cycle.

    Parameters
    ----------
    config : GeluConfig

    Members
    -------
    i_x : ``In(stream.Signature(payload_in(config)))``
        ``q[lanes]`` (``in_bits`` signed); ``last`` (TLAST) on a row's final beat. A row is
        ``ceil(row / lanes)`` beats; lanes past the row's end in its final beat are padding
        and ignored.
    o_y : ``Out(stream.Signature(payload_out(config)))``
        ``y[lanes]`` (``config.out_bits`` signed: every result fits), ``last`` copied from the
        input beat; padding lanes are 0. Output scale ``config.out_scale`` (negative, or
        positive with ``negate``: then ``y`` is the negated i-GELU).

    Timing
    ------
    Initiation interval one beat per cycle, rows back to back. Latency from an ``i_x``
    handshake to the ``o_y`` beat: ``config.latency + 2`` cycles, 11 at the default
    configuration: input register, ``d`` (``|q| + b`` and the select), ``d*d``
    (``config.square_stages``: ``d`` copied into the multiplier's input register, the product
    written into a register; 2 while ``d`` fits 18 signed bits, 15 bits at the default),
    ``z``, ``q * z`` (``config.product_stages``: ``q`` and ``z`` copied into the multipliers'
    input registers, the partial products in one register, then one adder level per halving
    of their number; 3 at the default, a 32-bit ``q`` in two pieces times a 16-bit ``z``),
    output register, output FIFO (2).

    Every multiplier's inputs are registers of its own and its product is written straight
    into a register (at most 18x18 signed per multiplier); each register stage holds at most
    one adder carry chain and a few LUTs.

    With ``config.scale_file`` (per-column scales) ``b``, ``K1`` and ``K2`` are read from two
    ROMs (``rom_b``, ``rom_k``: ``beats_per_row`` words of ``lanes`` columns) by the beat's
    position in the row (``beat``, counting input handshakes, 0 after ``last``); each ROM's
    synchronous output is registered once more (``rom_b_reg``, ``rom_k_reg``), ``q`` waits
    beside ``rom_b_reg``, and ``rom_k`` is addressed by the beat counter delayed to meet
    ``d*d``, so the constants are not carried down the pipeline: one stage more than the scalar
    path, the same adders and multipliers, now with register operands.

    Backpressure: ``o_y`` may stall at any time; the pipeline never stalls, ``i_x.ready``
    drops while the output FIFO could not hold everything in flight (a registered compare, no
    combinational path from ``o_y.ready``).
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
        if c.per_column:
            return self._elaborate_columns(m)
        b, k1, k2 = c.hw_folded
        qlo, _ = c.q_range

        def lane(m, k, p):
            return self._lane(m, k, p.q[k], b, k1, k2, range(b, b - qlo + 1))

        latency = elementwise(m, self.i_x, self.o_y, "y", lane, row=c.row, lanes=c.lanes)
        assert latency == c.latency
        return m

    def _lane(self, m, k, q, b, k1, k2, u_range):
        """One lane from ``q`` on: ``(y, stages)``. ``b``, ``K1``, ``K2``: constants, or
        registers valid with ``q`` (``b``) and with ``d*d`` (``K1``, ``K2``)."""
        c = self.config
        u = Signal(u_range, name=f"u{k}")                      # |q| + b
        d = Signal(c.d_shape, name=f"d{k}")                    # min(|q| + b, 0)
        z = Signal(c.z_shape, name=f"z{k}")                    # w >> 14
        negative = q[-1]
        # d and z get registers of their own, which the multipliers' input registers copy
        # (a multiplier's input register written from logic is placed by that logic,
        # measured 1.5 ns further from the multiplier than one written from a register).
        m.d.comb += u.eq(Mux(negative, b - q, q + b))
        m.d.sync += d.eq(Mux(u[-1], u, 0))
        sq, sq_stages = split_multiply(m, d, d, name=f"sq{k}")
        neg_w = delay(m, negative, 1 + sq_stages, name=f"neg{k}")
        if c.negate:                                           # -z (module docstring)
            m.d.sync += z.eq(Mux(neg_w, sq + k2, k1 - sq) >> SHIFT)
        else:
            m.d.sync += z.eq(Mux(neg_w, k2 - sq, sq + k1) >> SHIFT)
        q_z = delay(m, q, 2 + sq_stages, name=f"q{k}")
        y, y_stages = split_multiply(m, q_z, z, name=f"y{k}")
        return y, 2 + sq_stages + y_stages

    @staticmethod
    def column_roms(config):
        """Per-column constants, as :meth:`_elaborate_columns` reads them: ``{name: (layout,
        init)}`` of the ROMs ``b`` (``b``) and ``k`` (``pos``: ``K1``, ``neg``: ``K2``). Beat
        ``j``, lane ``i`` holds column ``j * lanes + i`` (0 past the row)."""
        c = config
        b, k1, k2 = c.hw_folded
        cols = list(zip(b.tolist(), k1, k2)) + [(0, 0, 0)] * (c.beats_per_row * c.lanes - c.row)

        def beats(entry):
            return [[entry(*cols[j * c.lanes + i]) for i in range(c.lanes)]
                    for j in range(c.beats_per_row)]

        k_layout = data.StructLayout({
            "pos": Shape.cast(range(min(0, *k1), max(0, *k1) + 1)),
            "neg": Shape.cast(range(min(0, *k2), max(0, *k2) + 1))})
        return {"b": (data.ArrayLayout(c.d_shape, c.lanes), beats(lambda b, _k1, _k2: b)),
                "k": (data.ArrayLayout(k_layout, c.lanes),
                      beats(lambda _b, p, n: {"pos": p, "neg": n}))}

    def _elaborate_columns(self, m):
        """The per-column datapath: the lanes of :meth:`elaborate` with ``b``, ``K1`` and
        ``K2`` read from ROMs by the element's beat in the row (``beat``, counting input
        handshakes, 0 after ``last``). ``b``'s ROM is read with the input beat, its output
        registered beside the input register's copy of ``q``; ``k``'s with the beat counter
        delayed to reach its registered output as ``d*d`` leaves its multiplier."""
        c = self.config
        qlo, _ = c.q_range
        b_hi = max(f[0] for f in c.column_folded)
        beat = Signal(range(c.beats_per_row), name="beat")
        with m.If(self.i_x.valid & self.i_x.ready):
            m.d.sync += beat.eq(Mux(self.i_x.payload.last | (beat == c.beats_per_row - 1),
                                    0, beat + 1))
        roms = {}
        for name, (layout, init) in self.column_roms(c).items():
            rom = memory.Memory(shape=layout, depth=c.beats_per_row, init=init)
            m.submodules[f"rom_{name}"] = rom
            port = rom.read_port()
            addr = beat if name == "b" else delay(m, beat, 1 + c.square_stages, name="beat_k")
            m.d.comb += port.addr.eq(addr)
            roms[name] = Signal(layout, name=f"rom_{name}_reg")    # the ROM's output register
            m.d.sync += roms[name].eq(port.data)

        def lane(m, k, p):
            q = delay(m, p.q[k], 1, name=f"q1_{k}")               # beside the ROM's register
            kk = roms["k"][k]
            y, stages = self._lane(m, k, q, roms["b"][k], kk.pos, kk.neg,
                                   range(c.b_min, b_hi - qlo + 1))
            return y, 1 + stages

        latency = elementwise(m, self.i_x, self.o_y, "y", lane, row=c.row, lanes=c.lanes)
        assert latency == c.latency
        return m


_KINDS = ("realistic", "max", "min", "clip_edges", "zero", "alternate", "equal", "small",
          "wide", "polynomial")
_WEIGHTS = (0.35, 0.03, 0.03, 0.12, 0.02, 0.03, 0.04, 0.08, 0.12, 0.18)


def gelu_values(rng, kind, shape, config):
    """Inputs for a row of the given kind: ``realistic`` (real values ~ N(0, 1.5) at the
    input scale), ``polynomial`` (uniform over the polynomial's domain ``|q| <= -b`` and a
    little beyond), ``clip_edges`` (``+-(-b) + {-2..2}``), ``small`` (``-3..3``), ``wide``
    (whole input range) and the extremes."""
    qlo, qhi = config.q_range
    b = config.folded[0]
    if kind == "realistic":
        x = rng.normal(0.0, 1.5, size=shape) / golden.f32(config.scale_value).astype(float)
        return np.clip(np.round(x), qlo, qhi).astype(np.int64)
    if kind == "polynomial":
        return np.clip(rng.integers(b - 4, -b + 4, size=shape, endpoint=True), qlo, qhi)
    if kind == "clip_edges":
        q = rng.choice([-1, 1], size=shape) * (-b) + rng.integers(-2, 2, size=shape,
                                                                 endpoint=True)
        return np.clip(q, qlo, qhi)
    if kind == "small":
        return rng.integers(-3, 3, size=shape, endpoint=True).clip(qlo, qhi)
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
    return rng.integers(qlo, qhi, size=shape, endpoint=True)


class GeluModel(StreamModel):
    """Stream-level golden model and stimulus of :class:`Gelu`. An item is a row."""

    #: How :meth:`stimulus` holds the rows of each element field (``{field: (stimulus key,
    #: form)}``; form ``mats``, ``array`` or ``list``: :class:`~hwgen.cluster.gateware.compute.KernelChain`).
    row_fields = {"q": ("q", "array")}

    result_port = "o_y"
    latency_from = "i_x"

    @staticmethod
    def stimulus(config, items, rng):
        """``items`` rows of ``row`` elements, every kind of :func:`gelu_values` once first,
        then at random; padding lanes get random values (ignored by the kernel)."""
        c = config
        kinds = list(_KINDS[:items]) + [_KINDS[k] for k in rng.choice(
            len(_KINDS), size=max(0, items - len(_KINDS)), p=_WEIGHTS)]
        q = np.concatenate([gelu_values(rng, k, (1, c.row), c) for k in kinds])
        pad = (c.beats_per_row * c.lanes - c.row) * items
        qlo, qhi = c.q_range
        return {"q": q, "pad": {"q": rng.integers(qlo, qhi, size=pad, endpoint=True)}}

    @staticmethod
    def inputs(config, stim):
        """``i_x``: each row in ``beats_per_row`` beats of ``lanes`` elements ``q``
        (:func:`~hwgen.ibert.stream_rows.to_beats`), padding lanes from ``stim["pad"]``, ``last`` on
        each row's final beat."""
        return {"i_x": to_beats({"q": stim["q"]}, config.lanes, pad=stim["pad"])}

    @staticmethod
    def expect(config, stim):
        """``o_y``: :func:`hwgen.ibert.golden.int_gelu` of all rows at ``scale`` (or the
        per-column scales of ``scale_file``), packed like the input as ``y`` with zero padding
        lanes and ``last`` on each row's final beat."""
        y, _ = golden.int_gelu(stim["q"], config.scale_value)
        if config.negate:
            y = -y
        return {"o_y": to_beats({"y": y}, config.lanes)}


#: Simulated by ``tests/test_sim.py``: 8-bit inputs at a coarse scale (b = -51: the clip is
#: reached), 1 lane with a row of 5; 3 lanes with padded rows of 12-bit inputs at a fine scale
#: (b = -25018: the clip lies beyond the input range); a scale so coarse that b = -1; 7 lanes
#: of 32-bit inputs;
#: the BERT-base size (intermediate row 3072, 16 lanes, INT32 in); and ``negate`` with the clip
#: reached and padded rows.
TEST_CONFIGS = (
    {"scale": 0.05, "in_bits": 8, "lanes": 1, "row": 5},
    {"scale": 1e-4, "in_bits": 12, "lanes": 3, "row": 11},
    {"scale": 10.0, "in_bits": 12, "lanes": 2, "row": 9},
    {"scale": 3.7e-5, "in_bits": 32, "lanes": 7, "row": 40},
    {},
    # negate: -i-GELU, clip reached (b = -51) and padded rows
    {"scale": 0.05, "in_bits": 8, "lanes": 3, "row": 7, "negate": True},
)
