"""Kernel chains as configuration (:class:`~hwgen.cluster.gateware.compute.KernelChain` is the
gateware; its module docstring tables every kernel's row streams and states the link rules
and timing): the row ports of every chainable kernel (:func:`kernel_ports`), the link checks
(:func:`check_link`), the checked chain (:func:`chain_plan`, :class:`ChainPlan`) and
``cluster-kernel-chain``'s configuration with typed modules (:class:`ChainModule`)."""

from dataclasses import dataclass, replace
from functools import cached_property
import json

from ... import registry
from ...config import Config, Record, param
from ...errors import ConfigError
from ...lib.row_ports import RowKernel, RowPort, shape_holds

__all__ = ["RowPort", "kernel_ports", "chainable", "chainable_kinds", "ChainPlan", "chain_plan",
           "ChainModule", "KernelChainConfig"]


OUTPUT = "o_y"


def kernel_ports(kind, config):
    """``(inputs, feed, output)``: the :class:`RowPort` of every input, the fed input's member
    (the model's ``latency_from``) and the output of a chainable kernel (its configuration a
    :class:`~hwgen.lib.row_ports.RowKernel`) at ``config``."""
    inputs, output = config.row_ports()
    return inputs, registry.get(kind).model.latency_from, output


def chainable(kind):
    """Whether ``kind`` names a registered accelerator whose configuration is a
    :class:`~hwgen.lib.row_ports.RowKernel` (it can be a module of a chain)."""
    return kind in registry.names() and issubclass(registry.get(kind).config, RowKernel)


def chainable_kinds():
    """The registered accelerators a chain can hold (:func:`chainable`), in registry order."""
    return tuple(name for name in registry.names() if chainable(name))


def check_link(src, dst, where):
    """Refuse a link from output ``src`` to input ``dst`` that :class:`Regroup` cannot make
    exact (see the module docstring); ``where`` names the consuming module."""
    def bad(msg):
        raise ConfigError(where, f"cannot take {src.member} of the module before: {msg}")
    if not shape_holds(src.shape, dst.shape):
        bad(f"its {src.elem_bits}-bit {'signed' if src.signed else 'unsigned'} elements do not "
            f"fit {dst.member}'s {dst.elem_bits}-bit {'signed' if dst.signed else 'unsigned'} "
            "ones (elements are only extended, never narrowed)")
    if not src.row and src.lanes > 1 and not src.count:
        bad("its rows have no length the regrouper can read")
    if dst.row and src.row != dst.row:
        bad(f"rows of {src.row or f'up to {src.max_row}'} elements, {dst.member} needs "
            f"exactly {dst.row}")
    if not dst.row and src.longest > dst.max_row:
        bad(f"rows of up to {src.longest} elements, {dst.member} takes at most "
            f"{dst.max_row}")
    if dst.has_matrices and not src.has_matrices:
        bad(f"{dst.member} needs the matrices' last rows, which {src.member} does not mark")


# -- regrouping -------------------------------------------------------------------------------

@dataclass(frozen=True)
class ChainPlan:
    """A checked chain: per module its kind, configuration, input ports, fed member and
    output; the chain's external inputs (:class:`RowPort` with ``name`` and ``module``)."""
    kinds: tuple
    configs: tuple
    ports: tuple            # per module: (inputs, feed member, output)
    inputs: tuple
    output: RowPort

    def feed_port(self, k):
        """The :class:`RowPort` of module ``k``'s fed input (the one the module before
        drives)."""
        inputs, feed, _ = self.ports[k]
        return next(p for p in inputs if p.member == feed)

    def cycle_model(self):
        """``{"modules": [performance dict, ...], "latency_cycles": sum or None,
        "regroup_latency": cycles}`` without stalls (each module's ``performance()`` at its
        defaults; None where a module's model needs a row length)."""
        perf = [cfg.performance().to_dict() for cfg in self.configs]
        lat = [p.get("latency_cycles") for p in perf]
        regroup = sum(int(self.ports[k - 1][2].lanes != self.feed_port(k).lanes)
                      for k in range(1, len(self.kinds)))
        total = None if None in lat else sum(lat) + regroup
        return {"modules": perf, "latency_cycles": total, "regroup_latency": regroup}


def _modules(modules):
    """``[(kind, params), ...]`` from describe.Module objects, dicts or a JSON string."""
    if isinstance(modules, str):
        try:
            modules = json.loads(modules)
        except (ValueError, RecursionError):
            raise ConfigError("modules", "must be a JSON list of {\"kind\", \"params\"} "
                              "objects", value=modules[:80]) from None
    if not isinstance(modules, (list, tuple)) or not modules:
        raise ConfigError("modules", "must be a non-empty list of modules",
                          value=str(modules)[:80])
    out = []
    for k, mod in enumerate(modules):
        where = f"modules[{k}]"
        if isinstance(mod, dict):
            if set(mod) - {"kind", "params"} or "kind" not in mod:
                raise ConfigError(where, "must be an object with \"kind\" and \"params\"",
                                  value=str(mod)[:80])
            kind, params = mod["kind"], mod.get("params", {})
        else:
            kind, params = getattr(mod, "kind", None), getattr(mod, "params", None)
        if not isinstance(kind, str) or not chainable(kind):
            raise ConfigError(f"{where}.kind", "must be one of " + ", ".join(chainable_kinds()),
                              value=str(kind)[:80])
        if not isinstance(params, dict):
            raise ConfigError(f"{where}.params", "must be an object", value=str(params)[:80])
        out.append((kind, params))
    return out


def chain_plan(modules):
    """Check a chain (describe.Module objects, ``{"kind", "params"}`` dicts or their JSON) and
    return its :class:`ChainPlan`; :class:`ConfigError` names the module at fault."""
    kinds, configs, ports, inputs = [], [], [], []
    for k, (kind, params) in enumerate(_modules(modules)):
        where = f"modules[{k}]"
        try:
            cfg = registry.get(kind).config.from_dict(params)
        except ConfigError as e:
            raise e.relocated(f"{where}.params") from None
        except TypeError:
            raise ConfigError(f"{where}.params", "has a value of the wrong type") from None
        ins, feed, out = kernel_ports(kind, cfg)
        order = sorted(ins, key=lambda p: p.member != feed)
        for p in order:
            if k and p.member == feed:
                check_link(ports[-1][2], p, where)
                inputs += [replace(p.extra_port(f, s), name=f"i_{k}_{f}", module=k)
                           for f, s in p.extra]
            else:
                inputs.append(replace(p, name=f"i_{k}_{p.member[2:]}", module=k))
        kinds.append(kind)
        configs.append(cfg)
        ports.append((tuple(ins), feed, out))
    output = replace(ports[-1][2], name=OUTPUT, module=len(kinds) - 1)
    return ChainPlan(tuple(kinds), tuple(configs), tuple(ports), tuple(inputs), output)


@dataclass(frozen=True)
class ChainModule(Record):
    """One module of :attr:`KernelChainConfig.modules`: a chainable accelerator ``kind`` and
    its configuration ``params`` (held as sorted ``(name, value)`` pairs; JSON: an object)."""
    kind: str
    params: tuple = ()

    def __post_init__(self):
        if isinstance(self.params, dict):
            object.__setattr__(self, "params", tuple(sorted(self.params.items())))
        super().__post_init__()

    def check(self):
        if not isinstance(self.kind, str):
            raise ValueError("kind must be a string")
        if not all(isinstance(p, tuple) and len(p) == 2 and isinstance(p[0], str)
                   for p in self.params):
            raise ValueError("params must be an object of parameters")

    @classmethod
    def from_value(cls, value):
        """A record, ``{"kind", "params"}`` or an object with ``kind`` and ``params``
        attributes (:class:`hwgen.cluster.spec.describe.Module`)."""
        if isinstance(value, dict):
            if set(value) - {"kind", "params"} or "kind" not in value:
                raise ValueError('must be an object with "kind" and "params"')
            if not isinstance(value.get("params", {}), dict):
                raise ValueError("params must be an object")
            return cls(value["kind"], value.get("params", {}))
        if not isinstance(value, cls) and hasattr(value, "kind") and hasattr(value, "params"):
            return cls(value.kind, dict(value.params))
        return super().from_value(value)

    def to_json(self):
        """``{"kind", "params": {...}}``."""
        return {"kind": self.kind, "params": dict(self.params)}


@dataclass(frozen=True)
class KernelChainConfig(Config):
    """``cluster-kernel-chain``: registered kernels in a chain, each feeding the next."""
    modules: tuple = param(
        (ChainModule("ibert-linear", {"in_features": 37, "out_features": 15, "tiles": 5,
                                      "pes": 4}),
         ChainModule("ibert-requant", {"row": 15, "lanes": 4})),
        "the chain, [{\"kind\": \"ibert-...\", \"params\": {...}}, ...] (--set: that JSON), "
        "each module feeding the next (hwgen.cluster.gateware.compute)", item=ChainModule)

    def check(self):
        _ = self.plan

    @cached_property
    def plan(self):
        """The checked chain (:func:`chain_plan`)."""
        return chain_plan([m.to_json() for m in self.modules])

    def cycle_model(self, workload):
        """The chain's :meth:`ChainPlan.cycle_model`: every module's performance at its
        default workload, the chain's latency and the regroupers'."""
        return self.plan.cycle_model()

    def derived(self):
        return {"kinds": list(self.plan.kinds),
                "inputs": [p.name for p in self.plan.inputs], "output": OUTPUT}
