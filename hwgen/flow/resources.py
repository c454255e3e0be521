"""The resources question of the accelerator contract (:mod:`hwgen.contract`).

:func:`estimate` answers it for any registered accelerator from the netlist Amaranth builds
for its Verilog (counted once per configuration and source tree, kept in the Verilog cache:
:func:`hwgen.flow.emit.cached_emission`); :func:`measured` maps the design with yosys
``synth_xilinx`` (minutes on large tops) for the figures ``hwgen synth`` reports.
"""

import json

from ..contract import RESOURCE_KEYS, Resources
from .emit import cached_emission
from .synth import synthesize

__all__ = ["estimate", "measured", "resources", "STATED_ERROR", "against_yosys"]

#: How far :func:`estimate` may be from yosys ``synth_xilinx`` (:func:`measured`), as bounds on
#: ``estimate / yosys`` per resource, from the designs synthesised to check it
#: (``tests/test_contract.py``: pq-decoder, ibert-linear and ChamVS nodes; ``hwgen chamvs
#: explore --validate`` checks every design it validates):
#:
#: * DSP48E2 and URAM exactly: every multiplier and UltraRAM survives optimisation.
#: * RAMB18 from the exact count up to 25% over: the estimate puts every synchronous memory
#:   deeper than 64 words in block RAM, yosys puts some shallow, wide ones (256-word LUT-builder
#:   centroids) in distributed RAM where that costs less.
#: * Flip-flops within 5% either way: the estimate keeps registers yosys finds constant or
#:   duplicate, and does not count the read registers yosys adds to distributed RAM.
#: * LUTs within a factor of 3 either way (ABC packs logic the estimate counts cell by cell).
#:
#: These bounds hold for the accelerators checked. The cluster builder's infrastructure is
#: further off, always over (``tests/test_cluster_fit.py``, the fitted ``mini_encoder``): LUT 3 to
#: 5 times yosys's for the packet adapters, packet buffers and the shell (per FPGA 3.1x and
#: 2.9x), FF up to 37% over (``cluster-row2pkt``), and ``ibert-layernorm`` at 5 DSP and 2 RAMB18
#: where yosys maps 4 and none; ``hwgen cluster fit`` relies on the estimate being over.
STATED_ERROR = {"dsp": (1.0, 1.0), "uram": (1.0, 1.0), "bram18": (1.0, 1.25),
                "ff": (0.95, 1.05), "lut": (1 / 3, 3.0)}


def estimate(acc, config):
    """:class:`~hwgen.contract.Resources` of ``acc`` at ``config`` counted from its netlist
    (``source="netlist"``; the rules: :mod:`hwgen.flow.netlist_count`)."""
    stored = cached_emission(acc, config)
    return Resources(**json.loads((stored / "resources.json").read_text()), source="netlist")


def measured(acc, config, *, board=None, log=None):
    """:class:`~hwgen.contract.Resources` of ``acc`` at ``config`` as yosys ``synth_xilinx``
    maps it (``source="yosys"``; needs yosys, see :func:`hwgen.flow.synth.synthesize`)."""
    report = synthesize(acc, config, board=board, log=log)
    return Resources(**{k: report["resources"][k] for k in RESOURCE_KEYS}, source="yosys")


def resources(acc, config, *, exact=False, board=None, log=None):
    """The contract's ``resources(config)``: :func:`estimate`, or with ``exact``
    :func:`measured`."""
    if exact:
        return measured(acc, config, board=board, log=log)
    return estimate(acc, config)


def against_yosys(est, real):
    """``est`` (:func:`estimate`) against ``real`` (:func:`measured`): per resource the two
    counts, ``ratio = estimate / yosys`` (None when yosys counts 0) and ``within`` the
    :data:`STATED_ERROR` bounds (two zeros agree; an estimate of 0 against a non-zero count
    never does); ``ok`` when every resource is within."""
    out = {}
    for key in RESOURCE_KEYS:
        e, r = getattr(est, key), getattr(real, key)
        low, high = STATED_ERROR[key]
        ratio = e / r if r else None
        within = (e == 0) if r == 0 else low - 1e-9 <= ratio <= high + 1e-9
        out[key] = {"estimate": e, "yosys": r,
                    "ratio": None if ratio is None else round(ratio, 3), "within": within}
    out["ok"] = all(v["within"] for v in out.values())
    return out
