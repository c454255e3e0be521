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

Structured fields are typed too: a ``tuple`` field declared with ``item=`` holds a tuple of
integers, strings or :class:`Record` dataclasses (a switch's routes, a gateway's GMI groups, a
kernel chain's modules). Construction accepts lists and, for records, JSON objects (or lists of
their fields); :meth:`Config.to_dict` gives them back as JSON lists and objects, so a
configuration round-trips through JSON and digests as before. Only text (``--set``, and the
text spellings older configuration files used) is parsed: a JSON list, or the field's own
text form through its ``parse``.
"""

import dataclasses
import hashlib
import json
import math
import re

from .contract import Performance, Workload, jsonable
from .errors import ConfigError

__all__ = ["Config", "Record", "param"]

_DECIMAL = re.compile(r"[+-]?[0-9]+")


def param(default, doc, *, lo=None, hi=None, choices=None, item=None, parse=None):
    """Declare a configuration field.

    Parameters
    ----------
    default :
        Default value; the annotation (``int``, ``bool``, ``str``, ``float``, ``tuple``) is
        the field's type.
    doc : str
        One-line description, shown by ``hwgen list NAME``.
    lo, hi : number, optional
        Inclusive bounds of numeric fields (of every element of an ``int`` tuple).
    choices : sequence, optional
        Allowed values of an enumerated field (of every element of a ``str`` tuple).
    item : type, optional
        Element type of a ``tuple`` field: ``int``, ``str`` or a :class:`Record` subclass.
    parse : callable, optional
        ``parse(text) -> tuple`` of a ``tuple`` field's text form (``--set``); raises
        ``ValueError`` or :class:`ConfigError` on bad text.
    """
    meta = {"doc": doc, "lo": lo, "hi": hi, "choices": tuple(choices) if choices else None,
            "item": item, "parse": parse}
    return dataclasses.field(default=default, metadata=meta)


@dataclasses.dataclass(frozen=True)
class Record:
    """Base of the structured elements of a ``tuple`` configuration field.

    A subclass is a frozen dataclass of ``int``, ``str`` and ``tuple`` (of ints) fields;
    lists given for tuple fields become tuples. :meth:`check` validates one record (raise
    ``ValueError`` with a message; the configuration names the field and element).
    """

    def __post_init__(self):
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, list):
                object.__setattr__(self, f.name, tuple(value))
        self.check()

    def check(self):
        """Validate the record; override and raise ``ValueError``."""

    @classmethod
    def from_value(cls, value):
        """The record of ``value``: a record, a JSON object of its fields or a list of them
        in field order."""
        if isinstance(value, cls):
            return value
        names = [f.name for f in dataclasses.fields(cls)]
        if isinstance(value, dict):
            unknown = sorted(set(value) - set(names))
            if unknown:
                raise ValueError(f"unknown key {unknown[0]!r}; keys: {', '.join(names)}")
            return cls(**value)
        if isinstance(value, (list, tuple)) and len(value) == len(names):
            return cls(*value)
        raise ValueError(f"expected an object with {', '.join(names)}")

    def to_json(self):
        """The record as a JSON object (tuples as lists)."""
        return {f.name: jsonable(getattr(self, f.name)) for f in dataclasses.fields(self)}


def _kind(field):
    return field.type if isinstance(field.type, str) else field.type.__name__


def _allowed(field):
    meta = field.metadata
    kind = _kind(field)
    if kind == "tuple":
        item = meta.get("item")
        what = {int: "integers", str: "strings"}.get(item) or \
            f"{getattr(item, '__name__', 'value')} records"
        return f"a list of {what}" + _range_note(meta)
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


def _range_note(meta):
    if meta.get("choices"):
        return " (each one of " + ", ".join(str(c) for c in meta["choices"]) + ")"
    lo, hi = meta.get("lo"), meta.get("hi")
    return f" (each in {lo}..{hi})" if lo is not None and hi is not None else ""


def _tuple_value(field, value):
    """A ``tuple`` field's value from what was given: a JSON list (text starting with
    ``[``), its text form (through ``parse``), a list or a tuple; records from JSON objects or
    field lists. Raises :class:`ConfigError` naming the field (and the element)."""
    meta = field.metadata
    if isinstance(value, str) and value.lstrip().startswith("["):
        try:
            value = json.loads(value)
        except ValueError as e:
            raise ConfigError(field.name, f"is not a valid JSON list: {e}",
                              value=value) from None
    if isinstance(value, str):
        if meta.get("parse") is None:
            raise ConfigError(field.name, f"must be {_allowed(field)}", value=value)
        try:
            value = meta["parse"](value)
        except ConfigError:
            raise
        except ValueError as e:
            raise ConfigError(field.name, f"must be {_allowed(field)}: {e}",
                              value=value) from None
    if not isinstance(value, (list, tuple)):
        raise ConfigError(field.name, f"must be {_allowed(field)}", value=value)
    item = meta.get("item")
    out = []
    for k, element in enumerate(value):
        where = f"{field.name}[{k}]"
        if isinstance(item, type) and issubclass(item, Record):
            try:
                element = item.from_value(element)
            except ConfigError:
                raise
            except (TypeError, ValueError) as e:
                raise ConfigError(where, str(e), value=element) from None
        elif item is int:
            if not isinstance(element, int) or isinstance(element, bool):
                raise ConfigError(where, "must be an integer", value=element)
            lo, hi = meta.get("lo"), meta.get("hi")
            if (lo is not None and element < lo) or (hi is not None and element > hi):
                raise ConfigError(where, f"must be in {lo}..{hi}", value=element)
        elif item is str:
            if not isinstance(element, str):
                raise ConfigError(where, "must be a string", value=element)
            if meta.get("choices") and element not in meta["choices"]:
                raise ConfigError(where, "must be one of " + ", ".join(meta["choices"]),
                                  value=element)
        out.append(element)
    return tuple(out)


def _parse_text(field, text):
    """Parse a ``--set key=value`` string into the field's type."""
    kind = _kind(field)
    if kind == "tuple":
        return _tuple_value(field, text)
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
            if _kind(field) == "tuple":
                object.__setattr__(self, field.name,
                                   _tuple_value(field, getattr(self, field.name)))
            self._check_field(field, getattr(self, field.name))
        self.check()

    @staticmethod
    def _check_field(field, value):
        kind = _kind(field)
        if kind == "tuple":
            return                                  # checked element by element on entry
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
        """``{name: dataclasses.Field}`` of the parameters, in declaration order."""
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
        """Build from a JSON file holding an object of parameters (``--config``)."""
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
        """A copy with ``changes`` applied, validated again."""
        return dataclasses.replace(self, **changes)

    # -- views -------------------------------------------------------------------------------

    def to_dict(self):
        """``{field: value}`` in JSON form (tuples as lists, records as objects)."""
        return {f.name: jsonable(getattr(self, f.name)) for f in dataclasses.fields(self)}

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
