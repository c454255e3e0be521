"""UltraScale+ logic depth of a yosys ``synth_xilinx`` netlist.

No open tool times UltraScale+. What the open flow can measure is the logic between registers
of the mapped netlist: on the longest register-to-register path, how many LUT levels and how
many carry chains (and carry cells) a signal crosses. yosys's own ``ltp -noff`` does not treat
Xilinx flip-flops (``FDRE``...) as registers, so this module walks the netlist itself
(``write_json`` of a flattened ``synth_xilinx -family xcup`` run).

Cells and what they count as
----------------------------
* ``FD*``, ``SRL*`` data inputs: registers (a path starts at their outputs and ends at their
  inputs). Top-level ports are path ends too (the block is timed out of context).
* ``LUT1``..``LUT6``, ``INV``, ``MUXF7/8/9``, distributed RAM read ports (``RAM32M`` ...) and
  SRL address inputs: one LUT level each.
* ``CARRY4``/``CARRY8``: a carry cell; cells cascaded through ``CI`` form one chain.
* ``DSP48E2``: registered when its internal A/B and P registers are on, or when every data
  input comes straight from a flip-flop and every used output goes straight into flip-flops
  (the vendor's synthesis packs those fabric registers into AREG/BREG/PREG; yosys 0.23 packs
  none itself). Otherwise it counts as one level (``dsp_unregistered``).
* ``RAMB18E2``/``RAMB36E2``/``URAM288``: inputs are synchronous. The output is registered when
  ``DOA_REG``/``DOB_REG`` (``OREG_*``) is on or every output bit drives only flip-flops (packed
  into the output register by the vendor's synthesis); otherwise it starts a path with one level
  (``ram_unregistered``).
* A fixed-length shift register (``SRL16E``/``SRLC32E`` read at a constant tap) stands for a
  chain of flip-flops: yosys 0.23 maps a delay line into one without first packing its last
  stage into the DSP's AREG/BREG (or its first stage into a block RAM's output register),
  whereas Vivado infers the DSP's and block RAM's registers before it extracts shift
  registers. So an SRL driving a DSP data input, or fed by a block-RAM output, counts as a
  flip-flop there; its output into logic still counts as one LUT level.

The worst path maximises LUT levels plus carry chains plus DSP/RAM levels. The goal of issue 11:
at most 4 LUT levels and one carry chain, and no DSP or block RAM counted as a level.
"""

import json

__all__ = ["logic_depth", "netlist_depth"]

_FF = ("FDRE", "FDSE", "FDCE", "FDPE", "LDCE", "LDPE")
_SRL = ("SRL16E", "SRLC16E", "SRLC32E")
_CARRY = ("CARRY4", "CARRY8")
_BRAM = ("RAMB18E2", "RAMB36E2", "RAMB18E1", "RAMB36E1", "URAM288")
_DSP = ("DSP48E2", "DSP48E1")
_DSP_DATA = ("A", "B", "C", "D", "ACIN", "BCIN", "PCIN")


def _is_lut(kind):
    return kind.startswith(("LUT", "MUXF")) or kind == "INV" or \
        (kind.startswith("RAM") and not kind.startswith("RAMB"))


def _param_on(cell, *names):
    for n in names:
        v = cell.get("parameters", {}).get(n)
        if v is not None:
            try:
                if int(str(v), 2 if set(str(v)) <= set("01") else 10):
                    return True
            except ValueError:
                pass
    return False


class _Netlist:
    def __init__(self, module):
        self.cells = module["cells"]
        self.driver = {}          # bit -> (cell name, port)
        self.sinks = {}           # bit -> [(cell name, port)]
        for name, cell in self.cells.items():
            for port, bits in cell["connections"].items():
                direction = cell.get("port_directions", {}).get(port, "input")
                for b in bits:
                    if isinstance(b, str):
                        continue          # constant
                    if direction == "output":
                        self.driver[b] = (name, port)
                    else:
                        self.sinks.setdefault(b, []).append((name, port))
        for pname, port in module.get("ports", {}).items():
            if port["direction"] == "output":
                for b in port["bits"]:
                    if not isinstance(b, str):
                        self.sinks.setdefault(b, []).append(("<port>", pname))

    def kind(self, name):
        return self.cells[name]["type"]

    def fixed_srl(self, name):
        """``name`` is a shift register read at a constant tap: a chain of flip-flops."""
        if self.kind(name) not in _SRL:
            return False
        return all(isinstance(b, str) for _, bits in _comb_inputs(self, name) for b in bits)

    def from_ff(self, bits):
        """Every non-constant bit is driven by a flip-flop, a fixed-length shift register or
        a top-level input."""
        for b in bits:
            if isinstance(b, str):
                continue
            d = self.driver.get(b)
            if d is not None and self.kind(d[0]) not in _FF and not self.fixed_srl(d[0]):
                return False
        return True

    def into_ff(self, bits):
        """Every used bit drives only flip-flops (or the data input of a fixed-length shift
        register)."""
        for b in bits:
            if isinstance(b, str):
                continue
            for cell, port in self.sinks.get(b, []):
                if cell == "<port>":
                    return False
                if self.kind(cell) in _FF or (port == "D" and self.fixed_srl(cell)):
                    continue
                return False
        return True


def _classify(net, name):
    """'seq' (register), 'comb' (one level), or the registered status of DSP/RAM cells."""
    cell = net.cells[name]
    kind = cell["type"]
    outs = [p for p, d in cell.get("port_directions", {}).items() if d == "output"]
    out_bits = [b for p in outs for b in cell["connections"].get(p, [])]
    if kind in _DSP:
        data = [b for p in _DSP_DATA for b in cell["connections"].get(p, [])]
        in_reg = _param_on(cell, "AREG") and _param_on(cell, "BREG") or net.from_ff(data)
        out_reg = _param_on(cell, "PREG") or net.into_ff(out_bits)
        return {"in_reg": in_reg, "out_reg": out_reg}
    if kind in _BRAM:
        out_reg = _param_on(cell, "DOA_REG", "DOB_REG", "OREG_A", "OREG_B") or \
            net.into_ff(out_bits)
        return {"in_reg": True, "out_reg": out_reg}
    return None


def netlist_depth(netlist, top):
    """Worst register-to-register path of ``netlist`` (yosys JSON, dict) module ``top``."""
    net = _Netlist(netlist["modules"][top])
    special = {n: _classify(net, n) for n, c in net.cells.items()
               if c["type"] in _DSP + _BRAM}
    memo = {}

    def comb_inputs(name):
        return _comb_inputs(net, name)

    def arrival(bit):
        """Worst path into ``bit``: (cost, luts, chains, carry_cells, dsp_ram, path)."""
        d = net.driver.get(bit)
        if d is None:
            return (0, 0, 0, 0, 0, ())
        name, port = d
        key = name if net.kind(name) not in _CARRY else (name, port)
        if key in memo:
            return memo[key]
        memo[key] = (0, 0, 0, 0, 0, ())          # cut any combinational loop
        kind = net.kind(name)
        if kind in _FF:
            result = (0, 0, 0, 0, 0, (name,))
        elif kind in _DSP + _BRAM:
            st = special[name]
            if st["out_reg"]:
                result = (0, 0, 0, 0, 0, (name,))
            else:
                base = (0, 0, 0, 0, 0, (name,)) if st["in_reg"] else max(
                    (arrival(b) for p, bits in comb_inputs(name) if p in _DSP_DATA
                     for b in bits if not isinstance(b, str)), default=(0, 0, 0, 0, 0, ()))
                cost, luts, chains, cc, dr, path = base
                result = (cost + 1, luts, chains, cc, dr + 1, path + (name,))
        elif kind in _CARRY:
            best = (0, 0, 0, 0, 0, ())
            for p, bits in comb_inputs(name):
                for b in bits:
                    if isinstance(b, str):
                        continue
                    cost, luts, chains, cc, dr, path = arrival(b)
                    src = net.driver.get(b)
                    cascaded = p == "CI" and src is not None and net.kind(src[0]) in _CARRY
                    cand = (cost + (0 if cascaded else 1), luts, chains + (0 if cascaded else 1),
                            cc + 1, dr, path if cascaded else path + (name,))
                    best = max(best, cand)
            result = best
        elif _is_lut(kind) or kind in _SRL:
            base = max((arrival(b) for p, bits in comb_inputs(name) for b in bits
                        if not isinstance(b, str)), default=(0, 0, 0, 0, 0, ()))
            cost, luts, chains, cc, dr, path = base
            result = (cost + 1, luts + 1, chains, cc, dr, path + (name,))
        else:                                     # buffers, unknown cells: transparent
            result = max((arrival(b) for p, bits in comb_inputs(name) for b in bits
                          if not isinstance(b, str)), default=(0, 0, 0, 0, 0, ()))
        memo[key] = result
        return result

    worst, end = (0, 0, 0, 0, 0, ()), None
    ends = _path_ends(net, special, netlist["modules"][top])

    import sys
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(max(old, 200000))
    try:
        for bit, name in ends:
            a = arrival(bit)
            if a[0] > worst[0]:
                worst, end = a, name
    finally:
        sys.setrecursionlimit(old)
    return _depth_report(net, special, worst, end)


def _comb_inputs(net, name):
    """(port, bits) of ``name``'s inputs that propagate combinationally to its outputs."""
    cell = net.cells[name]
    kind = cell["type"]
    ins = [(p, bits) for p, bits in cell["connections"].items()
           if cell.get("port_directions", {}).get(p, "input") == "input"]
    if kind in _SRL:
        return [(p, b) for p, b in ins if p.startswith("A")]
    if kind.startswith("RAM") and not kind.startswith("RAMB"):
        return [(p, b) for p, b in ins if p.startswith(("A", "ADDR", "DPRA"))]
    return ins


def _path_ends(net, special, module):
    """Path ends, ``(bit, name)``: inputs of registers, synchronous inputs of DSP/RAM cells,
    top-level outputs of ``module``."""
    ends = []
    for name, cell in net.cells.items():
        kind = cell["type"]
        if kind in _FF + _SRL or (kind in _DSP and special[name]["in_reg"]) or kind in _BRAM:
            for p, bits in cell["connections"].items():
                if cell.get("port_directions", {}).get(p, "input") == "input":
                    ends.extend((b, name) for b in bits if not isinstance(b, str))
    for pname, port in module.get("ports", {}).items():
        if port["direction"] == "output":
            ends.extend((b, f"<port {pname}>") for b in port["bits"] if not isinstance(b, str))
    return ends


def _depth_report(net, special, worst, end):
    """The result of :func:`netlist_depth` from the ``worst`` arrival (ending at ``end``)
    and the DSP/RAM cells' register states ``special``."""
    cost, luts, chains, carry_cells, dsp_ram, path = worst
    counts = {}
    for c in net.cells.values():
        counts[c["type"]] = counts.get(c["type"], 0) + 1
    return {
        "levels": cost,
        "lut_levels": luts,
        "carry_chains": chains,
        "carry_cells": carry_cells,
        "dsp_ram_levels": dsp_ram,
        "path": list(path) + ([end] if end and (not path or path[-1] != end) else []),
        "dsp48e2": sum(1 for n, s in special.items() if net.kind(n) in _DSP),
        "dsp_unregistered": sum(1 for n, s in special.items()
                                if net.kind(n) in _DSP and not (s["in_reg"] and s["out_reg"])),
        "block_rams": sum(1 for n in special if net.kind(n) in _BRAM),
        "ram_unregistered": sum(1 for n, s in special.items()
                                if net.kind(n) in _BRAM and not s["out_reg"]),
        "goal_met": luts <= 4 and chains <= 1 and dsp_ram == 0 and not any(
            not (s["in_reg"] and s["out_reg"]) for s in special.values()),
    }


def logic_depth(json_path, top):
    """:func:`netlist_depth` of a yosys ``write_json`` file."""
    with open(json_path) as f:
        return netlist_depth(json.load(f), top)
