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

__all__ = ["estimate", "measured", "resources"]


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
