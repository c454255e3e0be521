"""The answers every accelerator gives: its workload, its performance and its resources.

Tools that choose designs (the cluster's latency model, folding, design-space exploration,
``hwgen list --json``) ask any registered accelerator the same three questions through
:class:`~hwgen.config.Config`, without knowing which accelerator it is:

``config.workload(**fields)``
    A typed :class:`Workload`: the dataclass ``Config.Workload`` the accelerator declares
    (``rows``, ``queries``, ``items``, ...), every field with a default.
``config.performance(workload=None) -> Performance``
    The analytical cycle model at that workload (the default workload when None). Its figures
    are the accelerator's own (``latency_cycles``, ``initiation_interval``, ``cycles`` for the
    whole workload where the workload names one); ``hwgen sim`` measures the same quantities.
:func:`hwgen.flow.resources.estimate(acc, config) <hwgen.flow.resources.estimate>`
    A :class:`Resources` estimate (LUT, FF, BRAM18, URAM, DSP) counted from the Amaranth
    netlist (it needs the accelerator to build the core, so it lives in the flow);
    :func:`hwgen.flow.resources.measured` maps the design with yosys instead.

The classes here are plain data: this module imports nothing of hwgen but its errors.
"""

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass

from .errors import ConfigError

__all__ = ["Workload", "Performance", "Resources", "RESOURCE_KEYS", "jsonable"]

#: The keys of :meth:`Resources.to_dict`, in report order.
RESOURCE_KEYS = ("lut", "ff", "bram18", "uram", "dsp")


@dataclass(frozen=True)
class Workload:
    """Base of the workloads accelerators declare (as ``Config.Workload``).

    A subclass is a frozen dataclass whose fields all have defaults; an integer field is a
    count (refused below 0), a tuple field a list of counts (per query, per row, ...), and None
    means "not given" (the cycle model then reports steady-state figures only). The base
    workload has no fields: accelerators without a workload-dependent cycle count use it.
    """

    def __post_init__(self):
        for field in dataclasses.fields(self):
            value = _freeze(getattr(self, field.name))
            object.__setattr__(self, field.name, value)
            if not _counts(value):
                raise ConfigError(f"workload.{field.name}", "must be a non-negative integer, "
                                  "a (nested) list of them or None", value=value)

    @classmethod
    def from_dict(cls, values):
        """The workload with ``values`` (``{field: value}``) over the defaults; an unknown
        field is refused naming the known ones."""
        known = [f.name for f in dataclasses.fields(cls)]
        for key in values:
            if key not in known:
                raise ConfigError(f"workload.{key}", "unknown workload field; known fields: "
                                  + (", ".join(known) or "none"), value=values[key])
        return cls(**values)

    def to_dict(self):
        """``{field: value}`` (tuples as lists), for JSON."""
        return {f.name: jsonable(getattr(self, f.name)) for f in dataclasses.fields(self)}


def _freeze(value):
    return tuple(_freeze(v) for v in value) if isinstance(value, (list, tuple)) else value


def _counts(value):
    """Whether ``value`` is None, a count or a (nested) tuple of counts."""
    if isinstance(value, tuple):
        return all(v is not None and _counts(v) for v in value)
    return value is None or (isinstance(value, int) and not isinstance(value, bool)
                             and value >= 0)


def jsonable(value):
    """``value`` in JSON form: tuples and lists as lists, objects with a ``to_json()`` (the
    configuration records) as what it returns, anything else as it is."""
    if hasattr(value, "to_json"):
        return value.to_json()
    if isinstance(value, (tuple, list)):
        return [jsonable(v) for v in value]
    return value


@dataclass(frozen=True)
class Performance(Mapping):
    """An accelerator's cycle model at one workload.

    ``figures`` holds every figure by name (read them as ``perf["latency_cycles"]``: a
    Performance is a read-only mapping); :attr:`cycles`, :attr:`latency_cycles` and
    :attr:`initiation_interval` are the ones every tool looks for, None where the model has no
    such figure.
    """
    figures: dict
    workload: Workload = None

    def __getitem__(self, key):
        return self.figures[key]

    def __iter__(self):
        return iter(self.figures)

    def __len__(self):
        return len(self.figures)

    @property
    def cycles(self):
        """Cycles of the whole workload (first input to last output), or None."""
        return self.figures.get("cycles")

    @property
    def latency_cycles(self):
        """Cycles from an item's input to its first result, or None."""
        return self.figures.get("latency_cycles")

    @property
    def initiation_interval(self):
        """Steady-state cycles between successive items, or None."""
        return self.figures.get("initiation_interval")

    def to_dict(self):
        """The figures as a plain dict (what ``hwgen build`` has always written)."""
        return dict(self.figures)


@dataclass(frozen=True)
class Resources:
    """FPGA resources of one design (UltraScale+ cells; BRAM in 18 Kb blocks).

    ``source`` says where the figures come from: ``"netlist"`` (counted from the Amaranth
    netlist by :func:`hwgen.flow.resources.estimate`: an estimate) or ``"yosys"`` (mapped by
    yosys ``synth_xilinx``).
    """
    lut: int
    ff: int
    bram18: int
    uram: int
    dsp: int
    source: str = "netlist"

    def __post_init__(self):
        for key in RESOURCE_KEYS:
            value = getattr(self, key)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ConfigError(f"resources.{key}", "must be a non-negative integer",
                                  value=value)

    def to_dict(self):
        """``{lut, ff, bram18, uram, dsp}``."""
        return {key: getattr(self, key) for key in RESOURCE_KEYS}

    def __add__(self, other):
        return Resources(**{k: getattr(self, k) + getattr(other, k) for k in RESOURCE_KEYS},
                         source=self.source if self.source == other.source else "mixed")

    def fits(self, budget, fraction=1.0):
        """Whether every resource is at most ``fraction`` of ``budget`` (a Resources or a
        ``{key: available}`` mapping; missing keys are unlimited)."""
        avail = budget.to_dict() if isinstance(budget, Resources) else budget
        return all(getattr(self, k) <= math.floor(fraction * avail[k])
                   for k in RESOURCE_KEYS if avail.get(k) is not None)
