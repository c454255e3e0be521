"""Upstream Amaranth fixes that hwgen's pinned release (0.5.x) does not have yet.

Each backport is applied only when the installed Amaranth lacks it, changes no emitted
Verilog, and names the upstream commit it copies; drop it when the pin moves past that commit.

``Netlist.check_comb_cycles`` (amaranth-lang/amaranth#1628, fixed on main by 47c6b78c,
"hdl._nir: speed up combinational cycle detection", in no 0.5 release): the check walks the
fan-in of every output bit separately, so a ``w``-bit adder, comparator, shift or ``Part``
costs ``w * (its input bits)`` steps although all its output bits have the same fan-in.
cluster-gateway's second test configuration spent 60 s of its 61 s emission there. The fix
visits the fan-in of such a cell once and marks all its output bits together; cycles are
found exactly as before (the same nets are visited, the same error is raised). One deviation
from 47c6b78c: a cycle that closes on another output bit of the cell being visited raises
``CombinationalCycle`` there (upstream compares with the visited bit only and would end in an
``AssertionError``); 0.5's own check raises ``CombinationalCycle`` for it too.
"""

from amaranth.hdl import _nir

__all__ = ["apply", "comb_edges_are_per_bit"]

_BITWISE_BINARY = ("&", "|", "^")

#: The installed release's own check, kept for the tests that compare the two.
ORIGINAL_CHECK = _nir.Netlist.check_comb_cycles


def comb_edges_are_per_bit(cell):
    """True where ``cell.comb_edges_to(bit)`` depends on ``bit`` (upstream's
    ``Cell.comb_edges_is_per_bit``). False only for the cells whose every output bit has the
    same combinational fan-in in Amaranth 0.5: arithmetic, comparison, shift and reduction
    operators, and ``Part`` (variable slices); every other cell keeps the per-bit walk."""
    if isinstance(cell, _nir.Operator):
        if len(cell.inputs) == 1:
            return cell.operator == "~"
        if len(cell.inputs) == 2:
            return cell.operator in _BITWISE_BINARY
        return True                                  # "m" (mux): select bit + bit of each arm
    return not isinstance(cell, _nir.Part)


def _check_comb_cycles(self):
    """Upstream 47c6b78c's ``Netlist.check_comb_cycles`` over 0.5's cell classes."""
    class Cycle:
        def __init__(self, start):
            self.start = start
            self.path = []

    checked = set()
    busy = set()

    def traverse(net):
        if net in checked:
            return None
        if net in busy:
            return Cycle(net)
        busy.add(net)

        cycle = None
        extra_nets = []
        if net.is_const:
            pass
        elif net.is_late:
            cycle = traverse(self.connections[net])
            if cycle is not None:
                sig, bit = self.late_to_signal[net]
                cycle.path.append((sig, bit, sig.src_loc))
        else:
            cell = self.cells[net.cell]
            if not comb_edges_are_per_bit(cell):
                extra_nets = [n for n in cell.output_nets(net.cell) if n != net]
                for extra in extra_nets:
                    busy.add(extra)
            for src, src_loc in cell.comb_edges_to(net.bit):
                cycle = traverse(src)
                if cycle is not None:
                    cycle.path.append((cell, net.bit, src_loc))
                    break

        if cycle is not None and cycle.start in (net, *extra_nets):
            msg = ["Combinational cycle detected, path:\n"]
            for obj, bit, src_loc in reversed(cycle.path):
                if isinstance(obj, _nir._ast.Signal):
                    obj = f"signal {obj.name}"
                elif isinstance(obj, _nir.Operator):
                    obj = f"operator {obj.operator}"
                else:
                    obj = f"cell {obj.__class__.__qualname__}"
                src_loc = "<unknown>:0" if src_loc is None else f"{src_loc[0]}:{src_loc[1]}"
                msg.append(f"  {src_loc}: {obj} bit {bit}\n")
            raise _nir.CombinationalCycle("".join(msg))

        busy.remove(net)
        checked.add(net)
        for extra in extra_nets:
            busy.remove(extra)
            checked.add(extra)
        return cycle

    for cell_idx, cell in enumerate(self.cells):
        for net in cell.output_nets(cell_idx):
            assert traverse(net) is None
    for value in self.signals.values():
        for net in value:
            assert traverse(net) is None


def apply():
    """Install the backports the installed Amaranth lacks (idempotent)."""
    if hasattr(_nir.Cell, "comb_edges_is_per_bit"):      # upstream fix present
        return
    if _nir.Netlist.check_comb_cycles is not _check_comb_cycles:
        _nir.Netlist.check_comb_cycles = _check_comb_cycles
