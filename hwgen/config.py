"""Validated, JSON-round-trip configuration dataclasses.

Every accelerator's parameters are a frozen dataclass deriving from :class:`Config`; each field is
declared with :func:`param`, which records its allowed range and a one-line description. Values
are checked on construction, so an invalid configuration never reaches elaboration: the error is a
:class:`~hwgen.errors.ConfigError` naming the parameter, the value and the allowed range.

Example::

    @dataclass(frozen=True)
    class PQDecoderConfig(Config):
        m: int = param(16, "sub-spaces: bytes per PQ code", lo=1, hi=64)

        def check(self):            # cross-field rules, after the per-field checks
            ...

    PQDecoderConfig.from_dict({"m": 24})
    PQDecoderConfig().with_overrides(["m=24"])    # strings as given to `hwgen --set`
"""

import dataclasses
import hashlib
import json
import math
import re

from .contract import Performance, Workload
from .errors import ConfigError

__all__ = ["Config", "param"]

_DECIMAL = re.compile(r"[+-]?[0-9]+")


def param(default, doc, *, lo=None, hi=None, choices=None):
    """Declare a configuration field.

    Parameters
    ----------
    default :
        Default value; its type (``int``, ``bool``, ``str``, ``float``) is the field's type.
    doc : str
        One-line description, shown by ``hwgen list NAME``.
    lo, hi : number, optional
        Inclusive bounds of numeric fields.
    choices : sequence, optional
        Allowed values of an enumerated field.
    """
    meta = {"doc": doc, "lo": lo, "hi": hi, "choices": tuple(choices) if choices else None}
    return dataclasses.field(default=default, metadata=meta)


def _allowed(field):
    meta = field.metadata
    kind = field.type if isinstance(field.type, str) else field.type.__name__
    if meta.get("choices"):
        return "one of " + ", ".join(str(c) for c in meta["choices"])
    lo, hi = meta.get("lo"), meta.get("hi")
    if lo is not None and hi is not None:
        return f"{'an integer' if kind == 'int' else 'a number'} in {lo}..{hi}"
    if lo is not None:
        return f"{'an integer' if kind == 'int' else 'a number'} >= {lo}"
    if hi is not None:
        return f"{'an integer' if kind == 'int' else 'a number'} <= {hi}"
    return {"int": "an integer", "bool": "true or false", "str": "a string",
            "float": "a number"}.get(kind, kind)


def _parse_text(field, text):
    """Parse a ``--set key=value`` string into the field's type."""
    kind = field.type if isinstance(field.type, str) else field.type.__name__
    try:
        if kind == "bool":
            low = text.strip().lower()
            if low in ("1", "true", "yes", "on"):
                return True
            if low in ("0", "false", "no", "off"):
                return False
            raise ValueError(text)
        if kind == "int":
            # Decimal only (``08`` is 8): a hex or octal prefix is refused, not reinterpreted.
            if not _DECIMAL.fullmatch(text.strip()):
                raise ConfigError(field.name, f"must be {_allowed(field)}, written in decimal",
                                  value=text)
            return int(text.strip(), 10)
        if kind == "float":
            value = float(text)
            if not math.isfinite(value):
                raise ValueError(text)
            return value
        return text
    except ConfigError:
        raise
    except ValueError:
        raise ConfigError(field.name, f"must be {_allowed(field)}", value=text) from None


@dataclasses.dataclass(frozen=True)
class Config:
    """Base of all accelerator configurations (see module docstring)."""

    def __post_init__(self):
        for field in dataclasses.fields(self):
            self._check_field(field, getattr(self, field.name))
        self.check()

    @staticmethod
    def _check_field(field, value):
        kind = field.type if isinstance(field.type, str) else field.type.__name__
        meta = field.metadata
        ok_type = {
            "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
            "bool": lambda v: isinstance(v, bool),
            "str": lambda v: isinstance(v, str),
            "float": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)
            and math.isfinite(v),
        }.get(kind, lambda v: True)
        if not ok_type(value):
            raise ConfigError(field.name, f"must be {_allowed(field)}", value=value)
        if meta.get("choices") and value not in meta["choices"]:
            raise ConfigError(field.name, f"must be {_allowed(field)}", value=value)
        lo, hi = meta.get("lo"), meta.get("hi")
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            raise ConfigError(field.name, f"must be {_allowed(field)}", value=value)

    def check(self):
        """Cross-field validation; override and raise :class:`ConfigError`."""

    # -- construction ------------------------------------------------------------------------

    @classmethod
    def fields(cls):
        return {f.name: f for f in dataclasses.fields(cls)}

    @classmethod
    def from_dict(cls, values):
        """Build from a mapping, rejecting unknown keys."""
        known = cls.fields()
        for key in values:
            if key not in known:
                raise ConfigError(key, "unknown parameter; known parameters: "
                                  + ", ".join(known), value=values[key])
        return cls(**values)

    @classmethod
    def from_json(cls, path):
        from .checks import read_json
        values = read_json(path, "config")
        if not isinstance(values, dict):
            raise ConfigError("config", "must hold a JSON object of parameters", value=str(path))
        return cls.from_dict(values)

    def with_overrides(self, assignments):
        """Apply ``key=value`` strings (the CLI's ``--set``) and re-validate."""
        known = self.fields()
        values = self.to_dict()
        for text in assignments:
            key, sep, raw = text.partition("=")
            key = key.strip()
            if not sep or not key:
                raise ConfigError("set", "expected key=value", value=text)
            if key not in known:
                raise ConfigError(key, "unknown parameter; known parameters: "
                                  + ", ".join(known), value=raw)
            values[key] = _parse_text(known[key], raw)
        return type(self).from_dict(values)

    def replace(self, **changes):
        return dataclasses.replace(self, **changes)

    # -- views -------------------------------------------------------------------------------

    def to_dict(self):
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def derived(self):
        """Parameters that follow from the configuration (widths, latencies); for reports."""
        return {}

    #: The accelerator's workload type (a :class:`~hwgen.contract.Workload` dataclass);
    #: accelerators with a workload-dependent cycle model declare their own.
    Workload = Workload

    def workload(self, **fields):
        """The accelerator's :attr:`Workload` with ``fields`` over its defaults (an unknown
        field raises :class:`ConfigError` naming it)."""
        return self.Workload.from_dict(fields)

    def performance(self, workload=None):
        """The analytical cycle model at ``workload`` (an instance of :attr:`Workload`; the
        default workload when None) as a :class:`~hwgen.contract.Performance`; shown by
        ``hwgen build`` beside the last simulation and by ``hwgen list --json``."""
        if workload is None:
            workload = self.workload()
        elif not isinstance(workload, self.Workload):
            raise ConfigError("workload", f"must be a {type(self).__name__}.Workload "
                              f"({', '.join(self.Workload().to_dict()) or 'no fields'})",
                              value=workload)
        return Performance(self.cycle_model(workload), workload)

    def cycle_model(self, workload):
        """``{figure: value}`` of :meth:`performance` (override); {} for an accelerator
        without an analytical cycle model."""
        return {}

    def memory_banks(self):
        """``{AXI4 master member: Vitis bank}`` where a kernel shell must connect each memory
        master of the top (``sp=`` lines); {} places them round-robin."""
        return {}

    def for_board(self, board):
        """This configuration adapted to ``board`` (e.g. memory widths); unchanged by default."""
        return self

    def digest(self):
        """Short stable hash of the configuration, for build-cache keys and file names."""
        text = json.dumps({"type": type(self).__name__, **self.to_dict()}, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:12]

    @classmethod
    def describe(cls):
        """Rows (name, default, allowed, doc) for help output."""
        return [(f.name, f.default, _allowed(f), f.metadata.get("doc", ""))
                for f in dataclasses.fields(cls)]
