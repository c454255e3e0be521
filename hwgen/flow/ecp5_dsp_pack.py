"""Pack the fabric registers around each ECP5 ``MULT18X18D`` into the DSP's own registers.

yosys ``synth_ecp5`` maps a multiply to a ``MULT18X18D`` with every register of the block left
in the fabric (it has no register-absorption pass for ECP5, unlike ``dsp48e2`` packing on
Xilinx). A product written ``p <= a_reg * b_reg`` then times as FF -> routing -> multiplier ->
routing -> FF: the multiplier's 3.9 ns of combinational delay plus two long routes to and from
the DSP column, the critical path of every multiplier-heavy block. The DSP has input registers
(``REG_INPUTA_CLK``, ``REG_INPUTB_CLK``) and an output register (``REG_OUTPUT_CLK``) for exactly
this; Lattice's own flow packs them, and nextpnr-ecp5 times a cell that uses them from its
clocked timing database (``MULT18X18D_REGS_INPUT/OUTPUT/ALL``).

:func:`pack_dsp_registers` does that packing on the JSON netlist ``synth_ecp5`` writes, before
nextpnr reads it. It moves a group of registers into the DSP only when the move cannot change
what the design computes from its first clock edge on:

* **inputs** (A and B together; nextpnr times a cell with one registered input as if neither
  were): every bit of the group is a constant or the ``Q`` of a ``TRELLIS_FF`` clocked by one
  clock on the rising edge, with no set/reset (``LSR`` tied to 0), one clock enable per group
  (or none), and a power-up value of 0 or an enable tied to 1 (the DSP registers power up to
  0; a register enabled on every edge holds its D from the first edge on). The DSP pin then
  takes the flip-flop's ``DI``; a flip-flop that also drives other cells stays for them.
* **output**: every used ``P`` bit drives exactly one cell, the ``DI`` of a ``TRELLIS_FF`` that
  meets the same conditions on the same clock; those flip-flops are removed and ``P`` drives
  their ``Q`` nets.

The emitted Verilog, and so every simulation of it, is unchanged: this is a mapping step of the
ECP5 timing flow, like yosys' ``dsp48e2`` register packing for UltraScale+ (``synth_xilinx``
already absorbs the A/B/M/P registers, which is why the UltraScale+ depth check reports
``dsp_unregistered == 0`` for these blocks).
"""

from collections import defaultdict

__all__ = ["pack_dsp_registers"]

_A = [f"A{i}" for i in range(18)]
_B = [f"B{i}" for i in range(18)]
_P = [f"P{i}" for i in range(36)]


def _top(netlist):
    tops = [m for m in netlist["modules"].values()
            if str(m.get("attributes", {}).get("top", "0")).strip("0 ") != ""]
    if len(tops) != 1:
        raise ValueError(f"expected one top module in the netlist, found {len(tops)}")
    return tops[0]


class _Nets:
    """Driver and sinks of every net bit of a flat module."""

    def __init__(self, cells):
        self.driver, self.sinks = {}, defaultdict(list)
        for name, cell in cells.items():
            for port, bits in cell["connections"].items():
                out = cell["port_directions"].get(port) == "output"
                for bit in bits:
                    if isinstance(bit, int):
                        if out:
                            self.driver[bit] = (name, port)
                        else:
                            self.sinks[bit].append((name, port))


def _plain_ff(cell):
    """(clock, enable) of a ``TRELLIS_FF`` a DSP register can replace, or None.

    ``enable`` is the ``CE`` net bit, or ``"1"`` for a flip-flop enabled on every edge.
    """
    if cell["type"] != "TRELLIS_FF":
        return None
    par, con = cell["parameters"], cell["connections"]
    if par.get("CLKMUX", "CLK").strip() != "CLK" or con.get("LSR", ["0"]) != ["0"]:
        return None
    if par.get("LSRMUX", "LSR").strip() != "LSR" or par.get("GSR", "DISABLED").strip() != "DISABLED":
        return None
    cemux = par.get("CEMUX", "CE").strip()
    if cemux == "1":
        enable = "1"
    elif cemux == "CE":
        enable = con.get("CE", ["1"])[0]
    else:                                   # an inverted enable
        return None
    if enable != "1" and par.get("REGSET", "RESET").strip() != "RESET":
        return None                         # powers up to 1 and may hold it: not a DSP register
    return con["CLK"][0], enable


def _input_group(cells, nets, dsp, pins):
    """``(clock, enable, new bits)`` for registering ``pins`` inside the DSP, or None."""
    clock = enable = None
    new_bits, ffs = [], []
    for pin in pins:
        bit = dsp["connections"].get(pin, ["0"])[0]
        if not isinstance(bit, int):
            new_bits.append(bit)            # a constant: the same registered or not
            continue
        name, port = nets.driver.get(bit, (None, None))
        ff = _plain_ff(cells[name]) if port == "Q" else None
        if ff is None or (clock is not None and ff != (clock, enable)):
            return None
        clock, enable = ff
        new_bits.append(cells[name]["connections"]["DI"][0])
        ffs.append(name)
    return (clock, enable, new_bits, ffs) if clock is not None else None


def _output_group(cells, nets, dsp):
    """``(clock, enable, {pin: Q bit}, flip-flops)`` for registering ``P``, or None."""
    clock = enable = None
    moves, ffs = {}, []
    for pin in _P:
        bit = dsp["connections"].get(pin, [None])[0]
        if not isinstance(bit, int) or not nets.sinks[bit]:
            continue                        # an unused product bit
        if len(nets.sinks[bit]) != 1 or nets.sinks[bit][0][1] != "DI":
            return None
        name = nets.sinks[bit][0][0]
        ff = _plain_ff(cells[name])
        if ff is None or (clock is not None and ff != (clock, enable)):
            return None
        clock, enable = ff
        moves[pin] = cells[name]["connections"]["Q"][0]
        ffs.append(name)
    return (clock, enable, moves, ffs) if moves else None


def _set_register(dsp, which, clock, ce_port, enable):
    dsp["parameters"][f"REG_{which}_CLK"] = "CLK0"
    dsp["parameters"][f"REG_{which}_CE"] = ce_port
    dsp["parameters"][f"REG_{which}_RST"] = "RST0"
    for port, bit in (("CLK0", clock), (ce_port, enable), ("RST0", "0")):
        dsp["connections"][port] = [bit]
        dsp["port_directions"][port] = "input"


def _pack_one(cells, nets, dsp):
    """Pack one DSP's registers; returns ``(inputs packed, output packed, output flip-flops
    deleted, input flip-flops whose D the DSP now reads)``."""
    a = _input_group(cells, nets, dsp, _A)
    b = _input_group(cells, nets, dsp, _B)
    out = _output_group(cells, nets, dsp)
    clocks = {g[0] for g in (a, b, out) if g}
    if len(clocks) > 1:                     # every DSP register runs on CLK0
        return False, False, set(), set()
    inputs = a is not None and b is not None
    ce_ports = {}                            # one CE port per distinct enable net
    removed = set()
    if inputs:
        for group, pins, which in ((a, _A, "INPUTA"), (b, _B, "INPUTB")):
            clock, enable, new_bits, ffs = group
            ce = ce_ports.setdefault(enable, f"CE{len(ce_ports)}")
            _set_register(dsp, which, clock, ce, enable)
            for pin, bit in zip(pins, new_bits):
                dsp["connections"][pin] = [bit]
            removed |= set(ffs)
    if out is not None:
        clock, enable, moves, ffs = out
        ce = ce_ports.setdefault(enable, f"CE{len(ce_ports)}")
        _set_register(dsp, "OUTPUT", clock, ce, enable)
        for pin, bit in moves.items():
            dsp["connections"][pin] = [bit]
            dsp["port_directions"][pin] = "output"
        for name in ffs:
            del cells[name]
    if inputs or out is not None:
        dsp["parameters"].setdefault("RESETMODE", "SYNC")
        dsp["parameters"].setdefault("GSR", "DISABLED")
    return inputs, out is not None, set(out[3]) if out else set(), removed


def pack_dsp_registers(netlist):
    """Pack registers into every ``MULT18X18D`` of a ``synth_ecp5`` JSON netlist, in place.

    Returns the counts ``{"dsp": n, "inputs": i, "outputs": o, "ffs_removed": r}``: DSPs seen,
    DSPs whose A/B registers and whose P register were packed, and fabric flip-flops deleted.
    """
    cells = _top(netlist)["cells"]
    counts = {"dsp": 0, "inputs": 0, "outputs": 0, "ffs_removed": 0}
    input_ffs = set()
    for name in sorted(n for n, c in cells.items() if c["type"] == "MULT18X18D"):
        nets = _Nets(cells)             # rebuilt per DSP: an earlier packing moved nets
        inputs, output, out_ffs, in_ffs = _pack_one(cells, nets, cells[name])
        counts["dsp"] += 1
        counts["inputs"] += inputs
        counts["outputs"] += output
        counts["ffs_removed"] += len(out_ffs)
        input_ffs |= in_ffs
    # An input flip-flop goes once no cell reads its Q any more (another DSP or logic may).
    nets = _Nets(cells)
    for name in sorted(input_ffs):
        if name in cells and not nets.sinks[cells[name]["connections"]["Q"][0]]:
            del cells[name]
            counts["ffs_removed"] += 1
    return counts
