"""Multipliers of any width, split into native-width partial products and pipelined.

A product wider than one DSP multiplier (ECP5 ``MULT18X18D``: 18x18 signed; a DSP48E2's 27x18
holds that too) is cut into partial products of at most 18x18 signed bits. Each operand is
split from the bottom into 17-bit unsigned pieces, the top piece keeping the sign (at most 18
bits signed, or 17 unsigned); a constant operand is split the same way and its zero pieces
are dropped. The first stage registers the pieces, one copy for each multiplier that reads a
piece: measured with nextpnr-ecp5, 48 multipliers whose input registers each feed two
multipliers closed at 116 MHz, with one register per multiplier at 136 MHz (the routing from a
shared register to its far multiplier doubles). The second stage writes every partial product
straight into a register (nothing but the multiplier in that cycle). The partials are then
added by a pipelined binary tree, one register per level. A tree node adds
two terms of different weights as ``Cat(low, (low_term >> k) + high_term)``: the ``k`` low bits
of the lower term pass through, so every carry chain only spans the overlap; terms that do not
overlap at all are concatenated with no adder.

:func:`split_multiply` builds the logic, :func:`split_multiply_stages` gives its latency from
the operand shapes alone (for cycle models that must not elaborate anything).
"""

from amaranth.hdl import Cat, Const, Shape, Signal, Value, signed, unsigned

__all__ = ["split_multiply", "split_multiply_stages", "range_shape", "NATIVE_BITS"]

#: Signed operand bits of one native multiplier (ECP5 MULT18X18D; the B port of a DSP48E2).
NATIVE_BITS = 18
_PIECE = NATIVE_BITS - 1        # unsigned low pieces: zero-extended they are 18-bit signed


def _pieces(shape):
    """``[(offset, width, signed)]`` of an operand of ``shape``, lowest first."""
    shape = Shape.cast(shape)
    width, is_signed = shape.width, shape.signed
    out, offset = [], 0
    while width - offset > (NATIVE_BITS if is_signed else _PIECE):
        out.append((offset, _PIECE, False))
        offset += _PIECE
    out.append((offset, width - offset, is_signed))
    return out


def _const_pieces(value):
    """``[(offset, digit)]`` with ``value == sum(digit << offset)``: 17-bit unsigned digits from
    the bottom and a signed top digit of at most 18 bits; zero digits left out."""
    out, offset = [], 0
    while not -(1 << (NATIVE_BITS - 1)) <= value < (1 << (NATIVE_BITS - 1)):
        digit = value & ((1 << _PIECE) - 1)
        if digit:
            out.append((offset, digit))
        value >>= _PIECE
        offset += _PIECE
    if value:
        out.append((offset, value))
    return out


def range_shape(lo, hi):
    """Smallest shape holding ``lo..hi``, at any width (``Shape.cast(range())`` stops at 63
    bits of length)."""
    if lo >= 0:
        return unsigned(max(hi.bit_length(), 1))
    return signed(max((-lo - 1).bit_length(), hi.bit_length()) + 1)


def _range(shape):
    shape = Shape.cast(shape)
    if shape.signed:
        return -(1 << (shape.width - 1)), (1 << (shape.width - 1)) - 1
    return 0, (1 << shape.width) - 1


def _interval_product(a, b):
    corners = [x * y for x in a for y in b]
    return min(corners), max(corners)


def _operand_terms(operand_shape):
    """Pieces of a variable operand: ``[(offset, width, signed, (lo, hi))]``."""
    terms = []
    for offset, width, is_signed in _pieces(operand_shape):
        shape = signed(width) if is_signed else unsigned(width)
        terms.append((offset, width, is_signed, _range(shape)))
    return terms


def _partials(a_shape, b):
    """Partial products ``[(a piece, b piece, shift, (lo, hi))]``; a piece is
    ``(offset, width, signed)`` of a variable operand, or ``(offset, digit)`` of a constant."""
    a_terms = _operand_terms(a_shape)
    if isinstance(b, int):
        b_terms = [((off, digit), off, (digit, digit)) for off, digit in _const_pieces(b)]
    else:
        b_terms = [((off, w, s), off, rng) for off, w, s, rng in _operand_terms(b)]
    return [((ao, aw, asg), bp, ao + bo, _interval_product(arng, brng))
            for ao, aw, asg, arng in a_terms for bp, bo, brng in b_terms]


def _tree_levels(n):
    levels = 0
    while n > 1:
        n, levels = (n + 1) // 2, levels + 1
    return levels


def split_multiply_stages(a_shape, b):
    """Register stages of :func:`split_multiply` for an operand of ``a_shape`` times ``b`` (a
    shape-like for a variable operand, or an ``int`` constant): 1 for the multipliers' input
    registers, 1 for the partial products, plus ``ceil(log2(partials))`` adder levels; 0 for a
    constant 0."""
    n = len(_partials(a_shape, b))
    return 2 + _tree_levels(n) if n else 0


def _low_bits(value, k):
    """The ``k`` low bits of ``value``, sign- or zero-extended when it is narrower."""
    if len(value) >= k:
        return value[:k]
    fill = value[-1] if value.shape().signed else Const(0, 1)
    return Cat(value, fill.replicate(k - len(value)))


def _input_register(m, value, piece, uses, name):
    """Register the piece of ``value`` once per multiplier that reads it (one DSP per register,
    so that the placer can put each next to its DSP). Copies differ in their reset value (0 or
    all ones), which keeps synthesis from merging them; past two uses copies are shared."""
    offset, width, is_signed = piece
    bits = value[offset:offset + width]
    shape = signed(width) if is_signed else unsigned(width)
    copies = []
    for k in range(min(uses, 2)):
        init = 0 if k == 0 else (-1 if is_signed else (1 << width) - 1)
        reg = Signal(shape, init=init, name=f"{name}_{k}")
        m.d.sync += reg.eq(bits.as_signed() if is_signed else bits)
        copies.append(reg)
    return copies


def split_multiply(m, a, b, *, name):
    """Pipelined product ``a * b`` built from native-width partial products.

    Parameters
    ----------
    m : Module
        Receives the logic (``sync`` domain, no enable: the pipeline advances every cycle).
    a : Value
        Variable operand (any width, signed or unsigned; its shape sets the pieces, so give it
        the exact width). It may be an expression: its first stage registers it.
    b : Value or int
        Second operand: a variable like ``a`` or a constant of the design.
    name : str
        Prefix of the registers' names.

    Returns
    -------
    (Value, int)
        The exact product and its latency in cycles, :func:`split_multiply_stages`: the
        product of the operands present in one cycle is valid that many cycles later.
        Initiation interval 1. The value is a register, or a register shifted left by wiring
        when the constant's low digits are zero.

    Stage 1 registers the operands' pieces, one copy per multiplier that reads a piece (up to
    two; reset values 0 and all ones keep synthesis from merging the copies, and no logic
    stands between a copy and its multiplier). Stage 2 writes every partial product (at most
    18x18 signed: one ECP5 ``MULT18X18D``, one DSP48E2) straight into a register. Then a binary
    tree adds the partials, one register per level (see the module docstring for the carry
    lengths).

    For full speed ``a`` and ``b`` should be registers: a copy register written from logic
    (above all from an adder's carry chain) is placed by that logic, away from its
    multiplier.
    """
    a = Value.cast(a)
    const = isinstance(b, int)
    b_value = None if const else Value.cast(b)
    parts = _partials(a.shape(), b if const else b_value.shape())
    if not parts:
        return Const(0, 1), 0

    # Stage 1: per-multiplier copies of each variable piece.
    a_pieces = sorted({p[0] for p in parts})
    b_pieces = sorted({p[1] for p in parts}) if not const else []
    a_copies = {piece: _input_register(m, a, piece, sum(p[0] == piece for p in parts),
                                       f"{name}_a{piece[0]}") for piece in a_pieces}
    b_copies = {piece: _input_register(m, b_value, piece, sum(p[1] == piece for p in parts),
                                       f"{name}_b{piece[0]}") for piece in b_pieces}
    a_used = {piece: 0 for piece in a_pieces}
    b_used = {piece: 0 for piece in b_pieces}

    def take(copies, used, piece):
        reg = copies[piece][used[piece] % len(copies[piece])]
        used[piece] += 1
        return reg

    # Stage 2: the partial products, each straight into a register.
    terms = []                                   # (signal, shift, (lo, hi))
    for k, (apiece, bpiece, shift, rng) in enumerate(parts):
        av = take(a_copies, a_used, apiece)
        bv = Const(bpiece[1]) if const else take(b_copies, b_used, bpiece)
        reg = Signal(range_shape(*rng), name=f"{name}_pp{k}")
        m.d.sync += reg.eq(av * bv)
        terms.append((reg, shift, rng))

    level = 0
    while len(terms) > 1:
        terms.sort(key=lambda t: t[1])
        nxt = []
        for j in range(0, len(terms) - 1, 2):
            (lo_sig, lo_shift, lo_rng), (hi_sig, hi_shift, hi_rng) = terms[j], terms[j + 1]
            k = hi_shift - lo_shift
            rng = (lo_rng[0] + (hi_rng[0] << k), lo_rng[1] + (hi_rng[1] << k))
            reg = Signal(range_shape(*rng), name=f"{name}_s{level}_{j // 2}")
            if k == 0:
                value = lo_sig + hi_sig
            else:
                if lo_rng[0] >= 0 and lo_rng[1] < (1 << k):
                    high = hi_sig                               # no overlap: wiring only
                else:
                    high = (lo_sig >> k) + hi_sig
                value = Cat(_low_bits(lo_sig, k), high)
                if high.shape().signed:
                    value = value.as_signed()
            m.d.sync += reg.eq(value)
            nxt.append((reg, lo_shift, rng))
        if len(terms) % 2:
            sig, shift, rng = terms[-1]
            reg = Signal.like(sig, name=f"{name}_s{level}_pass")
            m.d.sync += reg.eq(sig)
            nxt.append((reg, shift, rng))
        terms, level = nxt, level + 1
    sig, shift, _ = terms[0]
    return (sig << shift if shift else sig), 2 + level
