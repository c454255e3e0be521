"""Cluster and layer description files of the Cluster Builder (multi-FPGA I-BERT paper, sec. 6).

Two JSON files describe an application, as in the paper:

**Layer description** (which kernels exist and how they connect)::

    {"name": "...",
     "layers": [{"name": "q", "count": 1, "label": "Linear+Quant",
                 "modules": [{"kind": "ibert-linear", "params": {...}},
                             {"kind": "ibert-requant", "params": {...}}]}, ...],
     "connections": [{"name": "scatter_q", "from": "q", "to": "attn_dot", "gmi": "scatter",
                      "params": {"length": 64}}, ...]}

A layer is ``count`` identical compute kernels (instances ``name[0]`` ... ; with ``count`` 1
the instance is just ``name``); each kernel is a chain of ``modules``, each a registered hwgen
accelerator (``hwgen list``) with its parameters (checked by the accelerator's config class).
A connection goes ``from`` one or more instances (a layer name means all its instances, or
``name[i]``; ``input`` is what arrives at the cluster's gateway from another cluster) ``to``
one or more (``output``: the cluster's output, sent to another cluster). Its ``gmi`` is
``broadcast`` or ``scatter`` for a fan-out (one sender, several receivers), ``gather`` or
``reduce`` for a fan-in; without ``gmi``, equal counts connect pairwise (``a[i] -> b[i]``) and
1 -> 1 is point-to-point. ``params`` go to the GMI kernel's config (``length``, ``elem_bits``,
``op``). A GMI connection from ``input`` becomes a *virtual* kernel inside the gateway.
``port`` names the input of each receiving kernel's chain that the connection feeds (the
chain's ``i_<module>_<port>`` names, :mod:`hwgen.cluster.gateware.compute`: ``"i_0_k"`` for K of the
attention, ``"i_1_id"`` for the residual of a requantisation with identity): a string for
every receiver, or ``{"<layer or instance>": "<input>"}`` per receiver. Without it a receiver
with exactly one input left unfed takes it (:func:`hwgen.cluster.plan.placement.kernel_plan`).
File parameters of the modules (:data:`FILE_PARAMS`: ``ibert-linear``'s ``weights``,
``ibert-layernorm``'s ``params``, ``ibert-requant``'s ``scale_in_file``, ``ibert-gelu``'s
``scale_file``) are paths relative to the layer description's file (an inline description:
to the cluster description's); a missing file is a :class:`~hwgen.errors.ConfigError` naming
the parameter (``layers[0].modules[0].params.weights``).

**Cluster description** (where everything goes)::

    {"name": "...", "data_bits": 64, "layers": "file.layers.json",
     "clusters": [{"id": 0, "name": "encoder0", "reserved_ids": {"33": "why"},
                   "output": {"cluster": 1, "kernel": 39},
                   "fpgas": [{"name": "fpga1", "board": "sidewinder", "ip": "10.0.0.1",
                              "kernels": ["gateway", "q", "scatter_q", ...]}, ...]}]}

``layers`` (a path relative to the cluster description, or an inline object) may be given per
cluster. ``kernels`` lists instance references, layer names, GMI connection names and
``gateway`` (exactly once per cluster); a GMI kernel not listed is placed with its sender
(broadcast, scatter) or its receiver (gather, reduce). ``reserved_ids`` are kernel ids the
builder leaves unassigned (their routing entries stay invalid). ``output`` may carry ``ip``
when its cluster is not in the description (a host, or FPGAs simulated elsewhere): the routers'
cluster table then sends that cluster's packets to this address. ``sequence_length`` (M, default:
the smallest ``max_len`` of the layers' modules, or 1) is a build-time limit of the compute
kernels placed inside the tops: their packet adapters count the rows of a matrix (Linear's
``last_row`` every M rows, attention Q/K/V matrices of M x head_dim elements), so a built
encoder takes exactly M tokens. ``kernels`` (default ``"inside"``) says where the builder puts
the compute kernels: inside the tops behind packet adapters, or ``"external"`` (packet ports of
the tops, the kernels built apart); ``hwgen cluster build --kernels`` overrides it.

:func:`load` parses and validates both; every problem raises
:class:`~hwgen.errors.ConfigError` naming the offending field by its JSON path
(``clusters[0].fpgas[2].ip``).
"""

from dataclasses import dataclass, field
from enum import StrEnum
import ipaddress
from pathlib import Path
import re

from ... import registry
from ...boards import board_names
from ...checks import read_json
from ...errors import ConfigError

__all__ = ["Module", "Layer", "Connection", "LayerDescription", "FPGA", "Cluster", "Description",
           "load", "parse", "parse_layers", "GmiKind", "GMI_KINDS", "FAN_OUT", "FAN_IN",
           "MAX_KERNELS", "MAX_CLUSTERS", "DESCRIPTIONS_DIR", "FILE_PARAMS", "PortError",
           "assign_ports"]


class GmiKind(StrEnum):
    """A GMI collective (paper sec. 4): broadcast and scatter fan one message out to the
    members, gather and reduce fan the members' messages in to one. A member equals its name
    (``GmiKind.GATHER == "gather"``), as descriptions and configurations spell it."""
    BROADCAST = "broadcast"
    SCATTER = "scatter"
    GATHER = "gather"
    REDUCE = "reduce"

    @property
    def fan_out(self):
        """True for broadcast and scatter: one message in, one per member out."""
        return self in (GmiKind.BROADCAST, GmiKind.SCATTER)

    @property
    def fan_in(self):
        """True for gather and reduce: one message per member in, one out."""
        return not self.fan_out


GMI_KINDS = tuple(GmiKind)


class Boundary(StrEnum):
    """The cluster's boundary as the end of a connection, in place of a kernel: ``INPUT`` (what
    the gateway delivers from the network) and ``OUTPUT`` (the cluster's output: another
    cluster or the host). A member equals its name (``Boundary.OUTPUT == "output"``), as
    descriptions spell it, and never equals a kernel id or an instance name (those names are
    reserved)."""
    INPUT = "input"
    OUTPUT = "output"


FAN_OUT = tuple(k for k in GmiKind if k.fan_out)
FAN_IN = tuple(k for k in GmiKind if k.fan_in)
#: Kernel ids per cluster (8-bit TDEST) and cluster ids (8-bit), paper sec. 4.
MAX_KERNELS = 256
MAX_CLUSTERS = 256
DESCRIPTIONS_DIR = Path(__file__).parents[1] / "descriptions"

_REF = re.compile(r"^([A-Za-z_][\w-]*)(?:\[(\d+)\])?$")


@dataclass(frozen=True)
class Module:
    """One module of a layer's kernel chain: a registered accelerator ``kind``
    (``hwgen list``) and its ``params`` (checked by its config class; file parameters
    resolved to paths)."""
    kind: str
    params: dict


@dataclass(frozen=True)
class Layer:
    """A layer of the layer description: ``count`` identical compute kernels named
    ``name`` (``name[i]`` when ``count`` > 1), each the chain of :class:`Module` ``modules``;
    ``label`` is the display name (default: the module kinds joined by ``+``)."""
    name: str
    count: int
    modules: tuple
    label: str

    def instances(self):
        """The layer's instance names: ``[name]`` for one kernel, else ``name[0]`` ...
        ``name[count - 1]``."""
        return [self.name] if self.count == 1 else [f"{self.name}[{i}]" for i in range(self.count)]


@dataclass(frozen=True)
class Connection:
    """Connection ``index`` of the layer description: from the instances ``src``
    (``(Boundary.INPUT,)``: the cluster's gateway input) to ``dst`` (``(Boundary.OUTPUT,)``: the
    cluster's output), through GMI kernel ``gmi`` (None: pairwise or point-to-point) configured by
    ``params``; ``port`` names the receivers' chain inputs (see the module docstring)."""
    index: int
    name: str
    src: tuple          # instance names, or (Boundary.INPUT,)
    dst: tuple          # instance names, or (Boundary.OUTPUT,)
    gmi: object         # None or one of GMI_KINDS
    params: dict
    port: object = None  # None, a chain input name, or {layer or instance name: input name}

    def port_of(self, instance):
        """The chain input this connection feeds in ``instance`` (None: the default)."""
        if isinstance(self.port, dict):
            return self.port.get(instance, self.port.get(instance.split("[")[0]))
        return self.port

    @property
    def virtual(self):
        """Whether this is a GMI connection from ``input``, which becomes a virtual kernel
        inside the gateway rather than a GMI kernel of its own."""
        return self.gmi is not None and self.src == (Boundary.INPUT,)


class PortError(ValueError):
    """:func:`assign_ports` could not match a connection to a chain input: ``connection`` (a
    :class:`Connection`), ``value`` (the ``port`` given, if any)."""

    def __init__(self, connection, message, value=None):
        super().__init__(message)
        self.connection, self.value = connection, value


def assign_ports(instance, names, feeds, connection=lambda feed: feed):
    """``{chain input name: feed}`` of compute kernel ``instance`` whose chain inputs are
    ``names``: first the feeds whose connection names a ``port`` for it, then each other one
    takes the single input left. ``connection(feed)`` is a feed's :class:`Connection` (feeds
    are connections by default). Raises :class:`PortError` for an unknown input, an input fed
    twice, or a default with not exactly one input left; inputs left unfed are the caller's
    to report."""
    fed = {}
    for explicit in (True, False):
        for feed in feeds:
            c = connection(feed)
            port = c.port_of(instance)
            if (port is not None) != explicit:
                continue
            if port is None:
                free = [n for n in names if n not in fed]
                if len(free) != 1:
                    raise PortError(c, f"{instance} has inputs " + ", ".join(free or ["none"])
                                    + " left: name the one this connection feeds with `port`")
                port = free[0]
            elif port not in names:
                raise PortError(c, f"{instance} has no input {port}; its chain inputs: "
                                + ", ".join(names), port)
            if port in fed:
                raise PortError(c, f"input {port} of {instance} is already fed by "
                                f"connections[{connection(fed[port]).index}]", port)
            fed[port] = feed
    return fed


@dataclass(frozen=True)
class LayerDescription:
    """A parsed layer description: its ``name``, the :class:`Layer` ``layers`` and the
    :class:`Connection` ``connections``, in file order."""
    name: str
    layers: tuple
    connections: tuple

    def instances(self):
        """Every compute kernel instance name, layer by layer in file order."""
        return [i for layer in self.layers for i in layer.instances()]

    def layer_of(self, instance):
        """The :class:`Layer` that instance name ``instance`` belongs to (StopIteration
        for an unknown name)."""
        return next(l for l in self.layers if instance in l.instances())


@dataclass(frozen=True)
class FPGA:
    """One FPGA of a cluster: its ``name``, ``board`` (a board name of
    :mod:`hwgen.boards`), IPv4 address ``ip`` and the ``kernels`` placed on it, as the
    references were written (instances, layer names, GMI connection names, ``gateway``)."""
    name: str
    board: str
    ip: str
    kernels: tuple      # references as written


@dataclass(frozen=True)
class Cluster:
    """One cluster of the cluster description: cluster ``id`` (0..255), ``name``, its
    :class:`FPGA` ``fpgas``, its :class:`LayerDescription` ``layers``, ``reserved_ids``
    (``{kernel id: why}``, left unassigned) and ``output`` (``{"cluster": c, "kernel": k}``
    [+ ``"ip"``] where the cluster's output goes, or None)."""
    id: int
    name: str
    fpgas: tuple
    layers: LayerDescription
    reserved_ids: dict = field(default_factory=dict)
    output: object = None      # {"cluster": c, "kernel": k} or None


@dataclass(frozen=True)
class Description:
    """A parsed and validated cluster description (:func:`load`, :func:`parse`): its
    ``name``, packet ``data_bits`` (64 or 512), the :class:`Cluster` ``clusters``, the file
    ``path`` it came from (None: parsed from an object), ``sequence_length`` (M of the compute
    kernels inside the tops; 0: the default) and where the compute kernels go, ``kernels``
    (``"inside"`` or ``"external"``)."""
    name: str
    data_bits: int
    clusters: tuple
    path: object = None
    sequence_length: int = 0    # M of the compute kernels inside the tops (0: the default)
    kernels: str = "inside"     # compute kernels "inside" the tops or "external" (ports)


# -- helpers --------------------------------------------------------------------------------

def _need(obj, key, where, kind=None):
    if not isinstance(obj, dict) or key not in obj:
        raise ConfigError(f"{where}.{key}" if where else key, "missing")
    value = obj[key]
    if kind is not None and not (isinstance(value, kind) and not isinstance(value, bool)
                                 or kind is bool and isinstance(value, bool)):
        raise ConfigError(f"{where}.{key}" if where else key, f"must be {_kind_name(kind)}",
                          value=value)
    return value


_KIND_NAMES = {int: "an integer", str: "a string", list: "a list", dict: "an object",
               bool: "true or false", float: "a number"}


def _kind_name(kind):
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join(_KIND_NAMES.get(k, k.__name__) for k in kinds)


def _unknown_keys(obj, allowed, where):
    for key in obj:
        if key not in allowed:
            raise ConfigError(f"{where}.{key}" if where else key,
                              "unknown field; known fields: " + ", ".join(allowed))


def _name(value, where):
    if not isinstance(value, str) or not _REF.match(value) or "[" in value:
        raise ConfigError(where, "must be a name (letters, digits, _ and -)", value=value)
    if value in (*Boundary, "gateway"):
        raise ConfigError(where, "is a reserved name", value=value)
    return value


def _load_json(path, what):
    return read_json(path, what)


# -- layer description ----------------------------------------------------------------------

def _check_module(kind, params, where):
    if kind not in registry.ACCELERATORS:
        raise ConfigError(f"{where}.kind", "unknown kernel kind; see `hwgen list` (e.g. "
                          + ", ".join(n for n in registry.ACCELERATORS if n.startswith("ibert"))
                          + ")", value=kind)
    if not isinstance(params, dict):
        raise ConfigError(f"{where}.params", "must be an object", value=params)
    try:
        registry.get(kind).config.from_dict(params)
    except ConfigError as e:
        raise e.relocated(f"{where}.params") from None


#: Module parameters that name a file (``.npz`` constants of a real model), per kernel kind.
FILE_PARAMS = {"ibert-linear": ("weights",), "ibert-layernorm": ("params",),
               "ibert-requant": ("scale_in_file",), "ibert-gelu": ("scale_file",)}


def _resolve_files(kind, params, base_dir, where):
    """``params`` with its file parameters (:data:`FILE_PARAMS`) resolved: a relative path is
    relative to ``base_dir`` (the layer description's folder; the working directory when
    None); a file that does not exist raises :class:`ConfigError` naming the parameter."""
    out = dict(params)
    for name in FILE_PARAMS.get(kind, ()):
        value = out.get(name)
        if not value or not isinstance(value, str):
            continue
        path = Path(value).expanduser()
        if not path.is_absolute() and base_dir is not None:
            path = Path(base_dir) / path
        if not path.is_file():
            raise ConfigError(f"{where}.params.{name}", "no such file"
                              + (f" (relative paths are relative to {base_dir})"
                                 if base_dir is not None else ""), value=value)
        out[name] = str(path.resolve())
    return out


def parse_layers(obj, where="layers", base_dir=None):
    """A :class:`LayerDescription` from the layer description's JSON object; file parameters
    of the modules (:data:`FILE_PARAMS`, e.g. ``ibert-linear``'s ``weights``) that are relative
    paths are relative to ``base_dir`` (the folder of the layer description's file) and are
    replaced by absolute paths."""
    if not isinstance(obj, dict):
        raise ConfigError(where, "must be a JSON object")
    _unknown_keys(obj, ("name", "layers", "connections", "comment"), where)
    pre = f"{where}." if where != "layers" else ""
    layers, seen = [], {}
    for i, lobj in enumerate(_need(obj, "layers", where, list)):
        layer = _parse_layer(lobj, f"{pre}layers[{i}]", seen, base_dir)
        seen[layer.name] = layer
        layers.append(layer)
    instances = {i for l in layers for i in l.instances()}

    def refs(value, w, end):
        return _refs(value, w, end, seen, instances)

    connections, names = [], set(seen)
    conns = obj.get("connections", [])
    if not isinstance(conns, list):
        raise ConfigError(f"{pre}connections", "must be a list", value=conns)
    for i, cobj in enumerate(conns):
        w = f"{pre}connections[{i}]"
        if not isinstance(cobj, dict):
            raise ConfigError(w, "must be an object")
        _unknown_keys(cobj, ("name", "from", "to", "gmi", "params", "port", "comment"), w)
        src = refs(_need(cobj, "from", w), f"{w}.from", Boundary.INPUT)
        dst = refs(_need(cobj, "to", w), f"{w}.to", Boundary.OUTPUT)
        gmi = cobj.get("gmi")
        if gmi is not None and gmi not in GMI_KINDS:
            raise ConfigError(f"{w}.gmi", "must be one of " + ", ".join(GMI_KINDS), value=gmi)
        if gmi in FAN_OUT and len(src) != 1:
            raise ConfigError(f"{w}.from", f"a {gmi} has one sender", value=cobj["from"])
        if gmi in FAN_IN and (len(dst) != 1 or dst == (Boundary.OUTPUT,)):
            raise ConfigError(f"{w}.to", f"a {gmi} has one receiver kernel", value=cobj["to"])
        if gmi in FAN_IN and src == (Boundary.INPUT,):
            raise ConfigError(f"{w}.from", f"a {gmi} needs several sender kernels")
        if gmi in FAN_OUT and dst == (Boundary.OUTPUT,):
            raise ConfigError(f"{w}.to", f"a {gmi} needs several receiver kernels")
        if gmi is None and len(src) != len(dst) and 1 not in (len(src), len(dst)):
            raise ConfigError(f"{w}.to", f"{len(src)} senders and {len(dst)} receivers "
                              "connect neither pairwise nor through a GMI kernel")
        if gmi is None and len(src) != len(dst):
            need = "broadcast or scatter" if len(src) == 1 else "gather or reduce"
            raise ConfigError(f"{w}.gmi", f"a fan-{'out' if len(src) == 1 else 'in'} of "
                              f"{len(src)} -> {len(dst)} kernels needs a GMI kernel ({need})")
        if gmi is None and src == (Boundary.INPUT,) and dst != (Boundary.OUTPUT,) \
                and len(dst) != 1:
            raise ConfigError(f"{w}.gmi", "input to several kernels needs a GMI kernel")
        default_name = f"{gmi}_{i}" if gmi else f"conn_{i}"
        name = _name(cobj.get("name", default_name), f"{w}.name")
        if gmi and name in names:
            raise ConfigError(f"{w}.name", "duplicate name (layers and GMI kernels share "
                              "one name space)", value=name)
        names.add(name)
        params = cobj.get("params", {})
        if not isinstance(params, dict):
            raise ConfigError(f"{w}.params", "must be an object", value=params)
        if params and gmi is None:
            raise ConfigError(f"{w}.params", "parameters belong to GMI connections")
        port = _port(cobj.get("port"), dst, f"{w}.port")
        connections.append(Connection(i, name, src, dst, gmi, dict(params), port))
    return LayerDescription(obj.get("name", ""), tuple(layers), tuple(connections))


def _parse_layer(lobj, w, seen, base_dir):
    """The :class:`Layer` of the layer object ``lobj`` at ``w`` (its name not in ``seen``,
    the layers before it)."""
    if not isinstance(lobj, dict):
        raise ConfigError(w, "must be an object")
    _unknown_keys(lobj, ("name", "count", "label", "modules", "comment"), w)
    name = _name(_need(lobj, "name", w), f"{w}.name")
    if name in seen:
        raise ConfigError(f"{w}.name", "duplicate layer name", value=name)
    count = lobj.get("count", 1)
    if not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= 255:
        raise ConfigError(f"{w}.count", "must be an integer in 1..255", value=count)
    mods = _need(lobj, "modules", w, list)
    if not mods:
        raise ConfigError(f"{w}.modules", "needs at least one module")
    modules = []
    for j, m in enumerate(mods):
        mw = f"{w}.modules[{j}]"
        if not isinstance(m, dict):
            raise ConfigError(mw, "must be an object")
        _unknown_keys(m, ("kind", "params"), mw)
        kind = _need(m, "kind", mw, str)
        params = m.get("params", {})
        if isinstance(params, dict):
            params = _resolve_files(kind, params, base_dir, mw)
        _check_module(kind, params, mw)
        modules.append(Module(kind, dict(params)))
    label = lobj.get("label", "+".join(m.kind for m in modules))
    return Layer(name, count, tuple(modules), label)


def _refs(value, w, end, seen, instances):
    """The kernels a connection's ``from``/``to`` at ``w`` names: ``(end,)`` (a
    :class:`Boundary`), or instances of the layers ``seen`` (a layer name: all its instances)."""
    items = value if isinstance(value, list) else [value]
    if not items:
        raise ConfigError(w, "names no kernel")
    out = []
    for item in items:
        if item == end:
            if len(items) != 1:
                raise ConfigError(w, f"`{end}` stands alone", value=value)
            return (end,)
        m = _REF.match(item) if isinstance(item, str) else None
        if m is None or m.group(1) not in seen:
            raise ConfigError(w, "names no layer of the description (layers: "
                              + ", ".join(seen) + f", or {end})", value=item)
        layer = seen[m.group(1)]
        if m.group(2) is None:
            out.extend(layer.instances())
        elif item in instances:
            out.append(item)
        else:
            raise ConfigError(w, f"layer {layer.name} has {layer.count} instance(s)",
                              value=item)
    if len(set(out)) != len(out):
        raise ConfigError(w, "names a kernel twice", value=value)
    return tuple(out)


def _port(value, dst, where):
    """The ``port`` of a connection: None, an input name, or {receiver: input name}."""
    if value is None:
        return None
    if dst == (Boundary.OUTPUT,):
        raise ConfigError(where, "`output` has no chain inputs", value=value)
    names = value.values() if isinstance(value, dict) else [value]
    for name in names:
        if not isinstance(name, str) or not _PORT.match(name):
            raise ConfigError(where, "must name a chain input (i_<module>_<port>, e.g. "
                              "\"i_1_id\"), or map receivers to them", value=value)
    if isinstance(value, dict):
        layers = {d.split("[")[0] for d in dst}
        for key in value:
            if key not in dst and key not in layers:
                raise ConfigError(where, f"{key} is not a receiver of this connection ("
                                  + ", ".join(dst) + ")", value=value)
        return dict(value)
    return value


_PORT = re.compile(r"^i_\d+_[A-Za-z_]\w*$")


# -- cluster description --------------------------------------------------------------------

def parse(obj, base_dir=None, path=None):
    """A :class:`Description` from the cluster description's JSON object; ``layers`` paths are
    relative to ``base_dir``."""
    if not isinstance(obj, dict):
        raise ConfigError("description", "must be a JSON object")
    _unknown_keys(obj, ("name", "data_bits", "sequence_length", "kernels", "layers",
                        "clusters", "comment"), "")
    kmode = obj.get("kernels", "inside")
    if kmode not in ("inside", "external"):
        raise ConfigError("kernels", "must be \"inside\" or \"external\"", value=kmode)
    data_bits = obj.get("data_bits", 64)
    if type(data_bits) is not int or data_bits not in (64, 512):
        raise ConfigError("data_bits", "must be one of 64, 512", value=data_bits)
    seq = obj.get("sequence_length", 0)
    if "sequence_length" in obj and (type(seq) is not int or not 1 <= seq <= 4096):
        raise ConfigError("sequence_length", "must be an integer in 1..4096", value=seq)
    base = Path(base_dir) if base_dir else Path(".")
    cache = {}

    def layers_of(value, where):
        if isinstance(value, dict):
            return parse_layers(value, where, base_dir=base)
        if isinstance(value, str):
            if value not in cache:
                cache[value] = parse_layers(_load_json(base / value, where), "layers",
                                            base_dir=(base / value).parent)
            return cache[value]
        raise ConfigError(where, "must be a file name or a layer description object",
                          value=value)

    default_layers = obj.get("layers")
    clusters, ids, ips = [], {}, {}
    for i, cobj in enumerate(_need(obj, "clusters", "", list)):
        w = f"clusters[{i}]"
        if not isinstance(cobj, dict):
            raise ConfigError(w, "must be an object")
        _unknown_keys(cobj, ("id", "name", "layers", "fpgas", "reserved_ids", "output",
                             "comment"), w)
        cid = _need(cobj, "id", w, int)
        if not 0 <= cid < MAX_CLUSTERS:
            raise ConfigError(f"{w}.id", f"must be an integer in 0..{MAX_CLUSTERS - 1}",
                              value=cid)
        if cid in ids:
            raise ConfigError(f"{w}.id", f"duplicate cluster id (also clusters[{ids[cid]}])",
                              value=cid)
        ids[cid] = i
        lval = cobj.get("layers", default_layers)
        if lval is None:
            raise ConfigError(f"{w}.layers", "missing (no layer description for this cluster)")
        layers = layers_of(lval, f"{w}.layers")
        reserved = _reserved_ids(cobj, w)
        output = _cluster_output(cobj, w, layers)
        fpgas, fnames = [], set()
        for j, fobj in enumerate(_need(cobj, "fpgas", w, list)):
            fpgas.append(_parse_fpga(fobj, f"{w}.fpgas[{j}]", fnames, ips))
        if not fpgas:
            raise ConfigError(f"{w}.fpgas", "a cluster needs at least one FPGA")
        clusters.append(Cluster(cid, cobj.get("name", f"cluster{cid}"), tuple(fpgas), layers,
                                reserved, output))
    if not clusters:
        raise ConfigError("clusters", "needs at least one cluster")
    ids = {c.id for c in clusters}
    for i, c in enumerate(clusters):
        out = c.output or {}
        if "ip" in out and out["cluster"] in ids:
            raise ConfigError(f"clusters[{i}].output.ip", "only for a receiver outside the "
                              f"description (cluster {out['cluster']} is in it)", value=out["ip"])
        if out.get("ip") in ips:
            raise ConfigError(f"clusters[{i}].output.ip", f"already used by {ips[out['ip']]}",
                              value=out["ip"])
    return Description(obj.get("name", ""), data_bits, tuple(clusters), path, seq, kmode)


def _reserved_ids(cobj, w):
    """The ``reserved_ids`` of the cluster object ``cobj`` at ``w``: ``{kernel id: why}``."""
    reserved = {}
    reserved_obj = cobj.get("reserved_ids", {})
    if not isinstance(reserved_obj, dict):
        raise ConfigError(f"{w}.reserved_ids", "must be an object {\"<kernel id>\": "
                          "\"why\"}", value=reserved_obj)
    for key, why in reserved_obj.items():
        try:
            kid = int(key)
        except ValueError:
            raise ConfigError(f"{w}.reserved_ids", "keys must be kernel ids",
                              value=key) from None
        if not 1 <= kid < MAX_KERNELS:
            raise ConfigError(f"{w}.reserved_ids", f"ids are 1..{MAX_KERNELS - 1} "
                              "(0 is the gateway)", value=kid)
        reserved[kid] = str(why)
    return reserved


def _cluster_output(cobj, w, layers):
    """The ``output`` of the cluster object ``cobj`` at ``w`` (None when absent; required
    when ``layers`` send to ``output``)."""
    output = cobj.get("output")
    if output is not None:
        if not isinstance(output, dict):
            raise ConfigError(f"{w}.output", "must be {\"cluster\": c, \"kernel\": k}")
        _unknown_keys(output, ("cluster", "kernel", "ip"), f"{w}.output")
        for key, hi in (("cluster", MAX_CLUSTERS), ("kernel", MAX_KERNELS)):
            v = _need(output, key, f"{w}.output", int)
            if not 0 <= v < hi:
                raise ConfigError(f"{w}.output.{key}", f"must be in 0..{hi - 1}", value=v)
        if "ip" in output:
            _check_ip(output["ip"], f"{w}.output.ip")
    elif any(c.dst == (Boundary.OUTPUT,) for c in layers.connections):
        raise ConfigError(f"{w}.output", "missing: the layers send to `output`")
    return output


def _parse_fpga(fobj, fw, fnames, ips):
    """The :class:`FPGA` of the FPGA object ``fobj`` at ``fw``; its name is added to
    ``fnames`` (the cluster's FPGA names) and its IP to ``ips`` (``{ip: where}``, all
    clusters)."""
    if not isinstance(fobj, dict):
        raise ConfigError(fw, "must be an object")
    _unknown_keys(fobj, ("name", "board", "ip", "kernels", "comment"), fw)
    fname = _name(_need(fobj, "name", fw, str), f"{fw}.name")
    if fname in fnames:
        raise ConfigError(f"{fw}.name", "duplicate FPGA name", value=fname)
    fnames.add(fname)
    board = _need(fobj, "board", fw, str)
    if board not in board_names():
        raise ConfigError(f"{fw}.board", "unknown board; one of "
                          + ", ".join(board_names()), value=board)
    ip = _check_ip(_need(fobj, "ip", fw, str), f"{fw}.ip")
    if ip in ips:
        raise ConfigError(f"{fw}.ip", f"already used by {ips[ip]}", value=ip)
    ips[ip] = fw
    kernels = _need(fobj, "kernels", fw, list)
    for k, ref in enumerate(kernels):
        if not isinstance(ref, str):
            raise ConfigError(f"{fw}.kernels[{k}]", "must be a kernel name (a "
                              "string such as \"layer[0]\")", value=ref)
    if len(kernels) > MAX_KERNELS:
        raise ConfigError(f"{fw}.kernels", f"an FPGA holds at most {MAX_KERNELS} "
                          "kernels", value=len(kernels))
    return FPGA(fname, board, ip, tuple(kernels))


def _check_ip(ip, where):
    try:
        ipaddress.IPv4Address(ip)
    except (ValueError, TypeError):
        raise ConfigError(where, "must be an IPv4 address", value=ip) from None
    return ip


def load(path):
    """Parse and validate the cluster description file ``path`` (a name of a shipped
    description, e.g. ``ibert_encoder``, also works)."""
    p = Path(path)
    if not p.exists() and not p.suffix:
        shipped = DESCRIPTIONS_DIR / f"{path}.json"
        if shipped.exists():
            p = shipped
    return parse(_load_json(p, "description"), base_dir=p.parent, path=p)
