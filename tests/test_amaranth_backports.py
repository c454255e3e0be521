"""hwgen.flow.amaranth_backports: the faster combinational-cycle check finds the same cycles
as Amaranth's own and accepts the same designs, and hwgen's Verilog goes through it."""

import pytest
from amaranth.back import rtlil
from amaranth.hdl import Cat, Module, Mux, Signal
from amaranth.hdl._nir import CombinationalCycle, Netlist

from hwgen.flow import amaranth_backports
from hwgen.flow.amaranth_backports import ORIGINAL_CHECK, comb_edges_are_per_bit


def _cycle_through_adder():
    m = Module()
    s = Signal(8)
    m.d.comb += s.eq(s + 1)
    return m, [s]


def _cycle_through_another_bit_of_the_adder():
    m = Module()
    s = Signal(8)
    m.d.comb += s.eq((s + 1)[1:])                 # s[0] <- sum bit 1 <- every bit of s
    return m, [s]


def _cycle_through_a_variable_slice():
    m = Module()
    t, s = Signal(16), Signal(4)
    m.d.comb += s.eq(t.bit_select(s[1:], 4))      # Part whose offset is its own output
    return m, [t, s]


def _cycle_through_a_bitwise_chain():
    m = Module()
    a, b = Signal(6), Signal(6)
    m.d.comb += [a.eq(~b), b.eq(a ^ 0b101)]
    return m, [a, b]


def _wide_acyclic():
    """Wide arithmetic, comparisons, shifts and variable slices feeding one another, no cycle."""
    m = Module()
    a, b, c = Signal(96), Signal(96), Signal(7)
    total, shifted, part, flag = Signal(97), Signal(200), Signal(12), Signal()
    m.d.comb += [total.eq(a + b), shifted.eq(total << c), part.eq(shifted.bit_select(c, 12)),
                 flag.eq((part == a[:12]) | (total > b))]
    m.d.sync += b.eq(b + part)                    # a register breaks this loop
    return m, [a, c, flag]


def _bit_ripples_through_per_bit_cells():
    """Bit i of each signal comes from bit i + 1 of the same cell's output, through a NOT, an
    XOR, a mux and a conditional assignment: no cycle, but a check that took these cells' output
    bits as one (as it may for an adder) would report one."""
    m = Module()
    x, sel = Signal(), Signal()
    a, b, c, d = Signal(5), Signal(5), Signal(5), Signal(5)
    m.d.comb += [a.eq(~Cat(a[1:], x)), b.eq(Cat(b[1:], x) ^ 0b10110),
                 c.eq(Mux(sel, Cat(c[1:], x), 0b01011))]
    with m.If(sel):
        m.d.comb += d.eq(Cat(d[1:], x))
    return m, [x, sel, a, b, c, d]


ACYCLIC = [_wide_acyclic, _bit_ripples_through_per_bit_cells]

CYCLIC = [_cycle_through_adder, _cycle_through_another_bit_of_the_adder,
          _cycle_through_a_variable_slice, _cycle_through_a_bitwise_chain]


def _check_with(monkeypatch, check, design):
    monkeypatch.setattr(Netlist, "check_comb_cycles", check)
    m, ports = design()
    return rtlil.convert(m, ports=ports)


@pytest.mark.parametrize("design", CYCLIC, ids=lambda d: d.__name__)
@pytest.mark.parametrize("check", ["original", "backport"])
def test_both_checks_find_the_cycle(monkeypatch, check, design):
    fn = ORIGINAL_CHECK if check == "original" else amaranth_backports._check_comb_cycles
    with pytest.raises(CombinationalCycle, match="Combinational cycle detected"):
        _check_with(monkeypatch, fn, design)


@pytest.mark.parametrize("design", ACYCLIC, ids=lambda d: d.__name__)
def test_both_checks_accept_acyclic_logic_and_emit_the_same_text(monkeypatch, design):
    original = _check_with(monkeypatch, ORIGINAL_CHECK, design)
    backport = _check_with(monkeypatch, amaranth_backports._check_comb_cycles, design)
    assert backport == original


def test_per_bit_classification():
    from amaranth.hdl import _nir
    add = _nir.Operator(0, operator="+", inputs=[_nir.Value.zeros(4), _nir.Value.zeros(4)], src_loc=None)
    xor = _nir.Operator(0, operator="^", inputs=[_nir.Value.zeros(4), _nir.Value.zeros(4)], src_loc=None)
    inv = _nir.Operator(0, operator="~", inputs=[_nir.Value.zeros(4)], src_loc=None)
    reduce_or = _nir.Operator(0, operator="r|", inputs=[_nir.Value.zeros(4)], src_loc=None)
    assert not comb_edges_are_per_bit(add) and not comb_edges_are_per_bit(reduce_or)
    assert comb_edges_are_per_bit(xor) and comb_edges_are_per_bit(inv)


def test_hwgen_verilog_uses_the_backport_while_amaranth_lacks_it():
    from amaranth.hdl import _nir

    from hwgen.flow.emit import to_verilog
    m, ports = _wide_acyclic()
    to_verilog(m, "wide", ports=ports)
    if hasattr(_nir.Cell, "comb_edges_is_per_bit"):
        assert Netlist.check_comb_cycles is ORIGINAL_CHECK        # upstream fix installed
    else:
        assert Netlist.check_comb_cycles is amaranth_backports._check_comb_cycles
