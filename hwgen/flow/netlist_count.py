"""Resource estimate of a design counted from its Amaranth netlist (UltraScale+ cells).

:func:`count` walks the cells of the netlist Amaranth builds while converting a design (no
synthesis: it runs in milliseconds beside the conversion) and maps each to the cells yosys
``synth_xilinx`` would use. It is an *estimate* for ranking and fitting designs; ``hwgen
synth`` (:func:`hwgen.flow.synth.synthesize`) maps the design for the figures to report.

Rules (UltraScale+):

=============================  ==============================================================
netlist cell                   counted as
=============================  ==============================================================
flip-flop                      one FF per bit; flip-flops with the same data, clock and
                               init count once (yosys ``opt_merge`` merges them)
``*`` (neither operand a       DSP48E2: ``ceil(a / 27) * ceil(b / 18)`` for the operand widths
power of two)                  after stripping sign and zero extension (``a >= b``; an
                               operand that was zero-extended gains a sign bit, the DSP being
                               signed only); products under 9 bits or of 1-bit operands: LUTs
``+`` ``-`` ``<`` ``>`` ...    one LUT per significant bit (carry chain; operands without
                               their sign or zero extension); ``==`` ``!=``: a LUT per 3 bits
``&`` ``|`` ``^``, 2:1 mux     a LUT per 4 bits (ABC packs them into their neighbours'
                               LUTs); ``~``: none (absorbed)
shift by a signal              ``ceil(steps / 2)`` LUTs per bit (a 4:1 mux each), ``steps``
                               the shift amount's non-constant bits (a shift by whole bytes
                               has 3 fewer), at most ``log2(width)``
variable slice (``Part``)      ``ceil((options - 1) / 3)`` LUTs per bit
reductions, ``bool``           a LUT per 5 bits
``Matches``                    a LUT per 3 bits per pattern
``AssignmentList``             a LUT per 2 bits per conditional assignment after the first
                               (the first is the flip-flop's enable or reset)
memory, asynchronous read or   distributed RAM: ``ceil(depth / 64)`` LUTs per bit per read
depth <= 64                    port, and its synchronous read ports' data in FFs
other memories                 RAMB18: the best of 512 x 36, 1K x 18, 2K x 9, 4K x 4, 8K x 2,
                               16K x 1, one copy per read port beyond the first of a written
                               memory; URAM288 (4K x 72) where ``ram_style`` is ``ultra``
=============================  ==============================================================
"""

import math

from amaranth.hdl import _nir

from ..contract import Resources

__all__ = ["count", "BRAM18_SHAPES"]

#: RAMB18E2 aspect ratios: (depth, width).
BRAM18_SHAPES = ((512, 36), (1024, 18), (2048, 9), (4096, 4), (8192, 2), (16384, 1))
#: URAM288: (depth, width).
URAM_SHAPE = (4096, 72)
#: Memories up to this depth (or with an asynchronous read port) go to distributed RAM.
LUTRAM_DEPTH = 64

_ARITH = {"+", "-", "<", "<=", ">", ">=", "u<", "u<=", "u>", "u>=", "s<", "s<=", "s>", "s>="}
_EQUALITY = {"==", "!="}
_BITWISE = {"&", "|", "^"}
_SHIFTS = {"<<", ">>", "u>>", "s>>"}
_REDUCE = {"r|", "r&", "r^", "b"}


def _all_const(value):
    """Whether every bit of netlist ``value`` is a constant."""
    return all(net.is_const for net in value)


def _significant(value):
    """``(bits, zero_extended)``: the width of ``value`` without its sign or zero extension."""
    nets = list(value)
    width = len(nets)
    zero = False
    while width > 1 and nets[width - 1] == _nir.Net.from_const(0):
        width -= 1
        zero = True
    if not zero:
        while width > 1 and nets[width - 1] == nets[width - 2]:
            width -= 1
    return width, zero


def _const_value(value):
    if not _all_const(value):
        return None
    return sum((n == _nir.Net.from_const(1)) << i for i, n in enumerate(value))


def _multiplier(cell, width):
    """``(dsp, lut)`` of one ``*`` operator."""
    a, b = cell.inputs
    for operand in (a, b):
        const = _const_value(operand)
        if const is not None and (const & (const - 1)) == 0:
            return 0, 0                                  # a shift or zero: wiring only
    (wa, za), (wb, zb) = _significant(a), _significant(b)
    wa, wb = wa + int(za), wb + int(zb)
    if width < 9 or min(wa, wb) < 2:
        return 0, width
    wa, wb = max(wa, wb), min(wa, wb)
    return math.ceil(wa / 27) * math.ceil(wb / 18), 0


def _operator_luts(cell, width):
    op = cell.operator
    widest = max(len(v) for v in cell.inputs)
    if op in _ARITH:
        if all(_all_const(v) for v in cell.inputs):
            return 0
        significant = max(sum(_significant(v)) for v in cell.inputs)
        return min(widest, significant + int(op in ("+", "-")))
    if op in _EQUALITY:
        return math.ceil(widest / 3)
    if op in _BITWISE or op == "m":
        return math.ceil(width / 4)
    if op in _SHIFTS:
        amount = cell.inputs[1]
        if _all_const(amount):
            return 0
        varying = sum(not net.is_const for net in amount)     # a byte shift: 3 bits fewer
        steps = max(1, min(varying, math.ceil(math.log2(max(2, widest)))))
        return width * math.ceil(steps / 2)
    if op in _REDUCE:
        return math.ceil(widest / 5)
    return 0                                             # "~", "-" unary folds into others


def _bram18(depth, width):
    return min(math.ceil(depth / d) * math.ceil(width / w) for d, w in BRAM18_SHAPES)


def _memory(memory, reads, writes):
    """``{"lut", "ff", "bram18", "uram"}`` of one memory with its read ports."""
    out = {"lut": 0, "ff": 0, "bram18": 0, "uram": 0}
    if not reads:
        return out
    asynchronous = any(isinstance(p, _nir.AsyncReadPort) for p in reads)
    if asynchronous or memory.depth <= LUTRAM_DEPTH:
        out["lut"] = math.ceil(memory.depth / 64) * memory.width * len(reads)
        out["ff"] = sum(p.width for p in reads if isinstance(p, _nir.SyncReadPort))
        return out
    copies = len(reads) if writes else math.ceil(len(reads) / 2)
    if (memory.attributes or {}).get("ram_style") == "ultra":
        d, w = URAM_SHAPE
        out["uram"] = copies * math.ceil(memory.depth / d) * math.ceil(memory.width / w)
    else:
        out["bram18"] = copies * _bram18(memory.depth, memory.width)
    return out


def count(netlist):
    """The :class:`~hwgen.contract.Resources` (``source="netlist"``) of an Amaranth
    ``_nir.Netlist`` by the rules of the module docstring."""
    total = {"lut": 0, "ff": 0, "bram18": 0, "uram": 0, "dsp": 0}
    reads, writes = {}, {}
    flip_flops = set()
    for cell in netlist.cells:
        if isinstance(cell, _nir.FlipFlop):
            key = (tuple(cell.data), cell.clk, cell.clk_edge, cell.arst, cell.init)
            total["ff"] += 0 if key in flip_flops else len(cell.data)
            flip_flops.add(key)
        elif isinstance(cell, _nir.Operator):
            width = len(cell.inputs[0]) if cell.operator in _REDUCE else None
            if width is None:
                width = max(len(v) for v in cell.inputs[1:] if v is not None) \
                    if cell.operator == "m" else max(len(v) for v in cell.inputs)
            if cell.operator == "*":
                dsp, lut = _multiplier(cell, width)
                total["dsp"] += dsp
                total["lut"] += lut
            else:
                total["lut"] += _operator_luts(cell, width)
        elif isinstance(cell, _nir.Part):
            options = max(1, math.ceil((len(cell.value) - cell.width) / cell.stride) + 1)
            total["lut"] += cell.width * math.ceil((options - 1) / 3)
        elif isinstance(cell, _nir.Matches):
            total["lut"] += len(cell.patterns) * math.ceil(len(cell.value) / 3)
        elif isinstance(cell, _nir.AssignmentList):
            # the first conditional assignment is the flip-flop's enable or reset
            total["lut"] += sum(math.ceil(len(a.value) / 2) for a in cell.assignments[1:])
        elif isinstance(cell, (_nir.AsyncReadPort, _nir.SyncReadPort)):
            reads.setdefault(cell.memory, []).append(cell)
        elif isinstance(cell, _nir.SyncWritePort):
            writes.setdefault(cell.memory, []).append(cell)
    for index, cell in enumerate(netlist.cells):
        if isinstance(cell, _nir.Memory):
            for name, value in _memory(cell, reads.get(index, []), writes.get(index, [])).items():
                total[name] += value
    return Resources(**total, source="netlist")

