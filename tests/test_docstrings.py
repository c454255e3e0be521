"""Every public definition in hwgen has a docstring.

Public: a module-level function or class whose name does not start with ``_``, and each method
or property (``property``, ``functools.cached_property``) of such a class whose name does not
start with ``_`` (a dataclass field whose default is a function is not a method). Names a
module imports from elsewhere are checked where they are defined.

Documented: a function, method or property has a docstring of its own or inherits one
(``inspect.getdoc``, so an override of a documented base method needs none). A class needs its
own: a subclass does not inherit its base's docstring, and the ``Name(field, ...)`` text that
``@dataclass`` and ``NamedTuple`` generate does not count. Nested classes (a config's
``Workload``) are not walked.

Exempt: ``elaborate`` of Amaranth elaboratables (components document their ports, latency and
backpressure in the class docstring).

Importing every module must stay cheap and free of side effects (no server, no build): this
test imports them all, except ``__main__`` modules (``python -m`` entry points, which run).
"""

import dataclasses
import functools
import importlib
import inspect
import pkgutil

from amaranth.hdl import Elaboratable

import hwgen

#: Methods that need no docstring, by the kind of class that defines them.
EXEMPT = {"elaborate": Elaboratable}


def _modules(failed):
    """Every hwgen module; ``failed`` gets ``"name: error"`` for those that do not import."""
    names = [info.name for info in pkgutil.walk_packages(
        hwgen.__path__, "hwgen.", onerror=lambda name: failed.append(f"{name}: import failed"))
        if info.name.rpartition(".")[2] != "__main__"]
    modules = []
    for name in ["hwgen"] + sorted(names):
        try:
            modules.append(importlib.import_module(name))
        except Exception as e:
            failed.append(f"{name}: import failed ({type(e).__name__}: {e})")
    return modules


def _generated(cls, doc):
    """``doc`` is the signature text ``@dataclass`` or ``NamedTuple`` writes for ``cls``."""
    auto = dataclasses.is_dataclass(cls) or (issubclass(cls, tuple) and hasattr(cls, "_fields"))
    return auto and doc.startswith(cls.__name__ + "(")


def _class_documented(cls):
    doc = cls.__dict__.get("__doc__")
    return bool(doc and doc.strip()) and not _generated(cls, doc)


def _member_doc(cls, name, raw):
    """The docstring of member ``name`` of ``cls`` (``raw``: its ``cls.__dict__`` entry),
    inherited from a base class where it has none of its own."""
    if isinstance(raw, (staticmethod, classmethod)):
        raw = raw.__func__
    if isinstance(raw, functools.cached_property):
        raw = raw.func
    elif isinstance(raw, property):
        raw = raw.fget
    doc = inspect.getdoc(raw)
    for base in cls.__mro__[1:]:
        if doc is not None:
            break
        if name in base.__dict__:
            inherited = base.__dict__[name]
            if isinstance(inherited, (staticmethod, classmethod)):
                inherited = inherited.__func__
            doc = inspect.getdoc(inherited)
    return doc


def _is_member(raw):
    return isinstance(raw, (staticmethod, classmethod, property, functools.cached_property)) \
        or inspect.isfunction(raw)


def public_definitions(failed):
    """``(module:qualname, documented)`` of every public definition in hwgen (modules that do
    not import are added to ``failed``)."""
    out = []
    for module in _modules(failed):
        for name, obj in vars(module).items():
            if name.startswith("_") or getattr(obj, "__module__", None) != module.__name__:
                continue
            where = f"{module.__name__}:{name}"
            if inspect.isclass(obj):
                out.append((where, _class_documented(obj)))
                fields = {f.name for f in dataclasses.fields(obj)} \
                    if dataclasses.is_dataclass(obj) else set()
                for attr, raw in vars(obj).items():
                    if attr.startswith("_") or attr in fields or not _is_member(raw):
                        continue
                    if attr in EXEMPT and issubclass(obj, EXEMPT[attr]):
                        continue
                    out.append((f"{where}.{attr}", _member_doc(obj, attr, raw) is not None))
            elif inspect.isfunction(inspect.unwrap(obj)):
                out.append((where, inspect.getdoc(obj) is not None))
    return out


def test_every_public_definition_has_a_docstring():
    failed = []
    found = public_definitions(failed)
    missing = [where for where, documented in found if not documented]
    report = []
    if failed:
        report += [f"{len(failed)} modules that do not import:"] + failed
    if missing:
        report += [f"{len(missing)} public definitions without a docstring:"] + missing
    assert not report, "\n".join(report)
    assert len(found) > 500, f"only {len(found)} public definitions found: is the walk broken?"
