"""Emit Verilog and ``ports.json`` for an accelerator.

The core component of an accelerator uses Amaranth streams with named payload fields
(``i_<what>`` consumed, ``o_<what>`` produced). :class:`AXISTop` wraps it in a top-level module
whose ports follow AXI conventions, so cocotbext-axi drives it and Vitis packages it unchanged:

======================  ===================================================================
core member             top-level ports
======================  ===================================================================
``i_<x>`` (In stream)   ``s_axis_<x>_tdata``, ``_tvalid``, ``_tready``, ``_tlast`` (if the
                        payload has a ``last`` field)
``o_<x>`` (Out stream)  ``m_axis_<x>_tdata``, ``_tvalid``, ``_tready``, ``_tlast``
other interface ``n``   its signals flattened as ``n_<signal>`` (e.g. ``m_axi_ch0_araddr``)
plain port ``p``        ``p``
clock / reset           ``ap_clk``, ``ap_rst_n`` (active low, synchronous)
======================  ===================================================================

``ports.json`` records every port and, for each stream, how payload fields are packed in TDATA
(:class:`hwgen.flow.ports.StreamFormat`); ``resources.json`` the resource estimate counted from
the netlist Amaranth built for the Verilog (:mod:`hwgen.flow.netlist_count`).
"""

import contextlib
import functools
import hashlib
import json
import re
import sys
import threading
import time
from pathlib import Path

from amaranth.back import verilog
from amaranth.hdl import ClockDomain, Module, Shape, Value, _ir
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from . import amaranth_backports, netlist_count, profile
from .design import Design
from .ports import SIDEBANDS, StreamFormat
from .tools import cache_dir, write_atomic

__all__ = ["AXISTop", "emit_verilog", "to_verilog", "emit_accelerator", "cached_emission",
           "cached_design", "emit_design", "source_fingerprint", "stream_port_name",
           "drop_zero_memory_init"]

#: Files of a Verilog cache entry besides ``<top>.v`` (written last: the hit test).
CACHE_FILES = ("ports.json", "resources.json")

_ZERO_INIT = re.compile(r"^( *)initial begin\n(?:\1  \w+\[\d+\] = \d+'h0+;\n)+\1end\n",
                        re.MULTILINE)


def drop_zero_memory_init(text):
    """Remove the ``initial`` blocks that set every word of a memory to zero.

    hwgen's memories are loaded at run time, never initialised; Amaranth writes an explicit
    zero for every word, which makes vendor tools and yosys keep large memories out of URAM
    (which has no initial contents) and blows up synthesis. Memory words without an initial
    value power up as zero in BRAM/URAM and are zeroed by Verilator (``--x-initial fast``)."""
    return _ZERO_INIT.sub("", text)


def stream_port_name(member_name, flow):
    """AXI-Stream port prefix of a core stream member: ``i_codes`` -> ``s_axis_codes``."""
    base = member_name
    for prefix in ("i_", "o_"):
        if base.startswith(prefix):
            base = base[len(prefix):]
            break
    else:
        if base in ("i", "o"):
            base = ""
    head = "s_axis" if flow == In else "m_axis"
    return f"{head}_{base}" if base else head


def _resolve(obj, path):
    for part in path:
        obj = obj[part] if isinstance(part, int) else getattr(obj, part)
    return obj


class AXISTop(wiring.Component):
    """Top-level module with AXI-conventional port names around a core component.

    Parameters
    ----------
    core : wiring.Component
        The accelerator's core. Its ``sync`` domain is clocked by ``ap_clk`` and reset while
        ``ap_rst_n`` is low.

    Attributes
    ----------
    streams : dict
        ``{port prefix: {"member", "direction", "format": StreamFormat}}`` for every stream.
    """

    def __init__(self, core):
        self._core = core
        self.streams = {}
        self._plain = []          # (port name, path in core, flow)
        members = {"ap_clk": In(1), "ap_rst_n": In(1)}
        for name, member in core.signature.members.items():
            if member.is_signature and isinstance(member.signature, stream.Signature):
                prefix = stream_port_name(name, member.flow)
                fmt = StreamFormat.from_shape(member.signature.members["payload"].shape)
                self.streams[prefix] = {"member": name, "format": fmt,
                                        "direction": "in" if member.flow == In else "out"}
                fwd, back = (In, Out) if member.flow == In else (Out, In)
                members[f"{prefix}_tdata"] = fwd(fmt.tdata_bits)
                members[f"{prefix}_tvalid"] = fwd(1)
                members[f"{prefix}_tready"] = back(1)
                if fmt.has_last:
                    members[f"{prefix}_tlast"] = fwd(1)
                for field, bits in fmt.sidebands:
                    members[f"{prefix}_{SIDEBANDS[field]}"] = fwd(bits)
            elif member.is_signature:
                flip = member.flow == In
                for path, sub in member.signature.members.flatten():
                    if not sub.is_port:
                        continue
                    flow = sub.flow if not flip else (In if sub.flow == Out else Out)
                    port = "_".join([name, *map(str, path)])
                    members[port] = flow(sub.shape)
                    self._plain.append((port, (name, *path), flow))
            else:
                members[name] = member.flow(member.shape)
                self._plain.append((name, (name,), member.flow))
        super().__init__(members)

    def ports_description(self):
        """The content of ``ports.json`` (without the top-level name)."""
        streams = [{"port": prefix, "member": s["member"], "direction": s["direction"],
                    **s["format"].to_dict()} for prefix, s in self.streams.items()]
        signals = [{"name": port, "direction": "in" if flow == In else "out",
                    "bits": Shape.cast(self.signature.members[port].shape).width}
                   for port, _, flow in self._plain]
        return {"clock": "ap_clk", "reset": "ap_rst_n", "reset_active": "low",
                "streams": streams, "signals": signals}

    def elaborate(self, platform):
        m = Module()
        m.domains.sync = cd_sync = ClockDomain("sync")
        m.d.comb += [cd_sync.clk.eq(self.ap_clk), cd_sync.rst.eq(~self.ap_rst_n)]
        m.submodules.core = core = self._core

        for prefix, s in self.streams.items():
            port = getattr(core, s["member"])
            fmt = s["format"]
            tdata = getattr(self, f"{prefix}_tdata")
            if s["direction"] == "in":
                m.d.comb += [port.valid.eq(getattr(self, f"{prefix}_tvalid")),
                             getattr(self, f"{prefix}_tready").eq(port.ready)]
                for f in fmt.fields:
                    m.d.comb += getattr(port.payload, f.name).eq(
                        tdata[f.offset:f.offset + f.width])
                if fmt.has_last:
                    m.d.comb += port.payload.last.eq(getattr(self, f"{prefix}_tlast"))
                for field, _ in fmt.sidebands:
                    m.d.comb += getattr(port.payload, field).eq(
                        getattr(self, f"{prefix}_{SIDEBANDS[field]}"))
            else:
                m.d.comb += [getattr(self, f"{prefix}_tvalid").eq(port.valid),
                             port.ready.eq(getattr(self, f"{prefix}_tready"))]
                for f in fmt.fields:
                    m.d.comb += tdata[f.offset:f.offset + f.width].eq(
                        Value.cast(getattr(port.payload, f.name)))
                if fmt.has_last:
                    m.d.comb += getattr(self, f"{prefix}_tlast").eq(port.payload.last)
                for field, _ in fmt.sidebands:
                    m.d.comb += getattr(self, f"{prefix}_{SIDEBANDS[field]}").eq(
                        getattr(port.payload, field))

        for port, path, flow in self._plain:
            inner = _resolve(core, path)
            outer = getattr(self, port)
            m.d.comb += (outer.eq(inner) if flow == Out else inner.eq(outer))
        return m


_CAPTURE = threading.Lock()


@contextlib.contextmanager
def _netlists_built(sink):
    """Append every netlist Amaranth builds inside the block to ``sink`` (the conversion
    builds one; Amaranth has no public hook for it, so ``_ir.build_netlist`` is wrapped for the
    block's duration, under a lock)."""
    with _CAPTURE:
        original = _ir.build_netlist

        def build(*args, **kwargs):
            netlist = original(*args, **kwargs)
            sink.append(netlist)
            return netlist
        _ir.build_netlist = build
        try:
            yield sink
        finally:
            _ir.build_netlist = original


def to_verilog(fragment, name, *, netlists=None, **kwargs):
    """Amaranth's ``verilog.convert`` without source attributes, with
    :mod:`hwgen.flow.amaranth_backports` applied (same text, faster netlist checks). With a
    list ``netlists``, the netlist the conversion built is appended to it."""
    amaranth_backports.apply()
    if netlists is None:
        return verilog.convert(fragment, name=name, emit_src=False, **kwargs)
    with _netlists_built(netlists):
        return verilog.convert(fragment, name=name, emit_src=False, **kwargs)


def emit_verilog(core, name, out_dir):
    """Write ``<name>.v``, ``ports.json`` and ``resources.json`` (the netlist's
    :func:`~hwgen.flow.netlist_count.count`) for ``core`` into ``out_dir``.

    Returns ``(verilog_path, ports_dict)``.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    top = AXISTop(core)
    netlists = []
    text = drop_zero_memory_init(to_verilog(top, name, netlists=netlists))
    resources = netlist_count.count(netlists[-1])
    write_atomic(out_dir / "resources.json", json.dumps(resources.to_dict()) + "\n")
    ports = {"top": name, **top.ports_description()}
    write_atomic(out_dir / "ports.json", json.dumps(ports, indent=2) + "\n")
    v_path = out_dir / f"{name}.v"
    write_atomic(v_path, text)        # other processes may be reading the cached copy
    return v_path, ports


@functools.lru_cache(maxsize=None)
def _package_fingerprint():
    import amaranth
    root = Path(__file__).resolve().parents[1]
    h = hashlib.sha256(f"{sys.version_info[:2]} amaranth {amaranth.__version__}".encode())
    for path in sorted(root.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
            h.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    return h.hexdigest()


def source_fingerprint():
    """Hash of everything an accelerator's Verilog can depend on besides its configuration:
    hwgen's own files (read once per process), the board files (read at each call: tests
    point ``hwgen.boards.BOARDS_DIR`` elsewhere), the Amaranth and Python versions."""
    from .. import boards
    h = hashlib.sha256(_package_fingerprint().encode())
    board_dir = Path(boards.BOARDS_DIR)
    for path in sorted(board_dir.glob("*.toml")):
        h.update(path.name.encode() + b"\0" + path.read_bytes())
    return h.hexdigest()


def cached_design(design):
    """The Verilog cache entry of a :class:`~hwgen.flow.design.Design`:
    ``<cache>/verilog/<key>`` (the key hashing its name, top name, configuration key and
    :func:`source_fingerprint`) holding ``<top>.v``, ``ports.json`` and ``resources.json``,
    emitted on a miss. Amaranth's elaboration and netlist checks take up to a minute on large
    tops (its combinational-cycle check visits every bit-to-bit edge of wide operators); a
    configuration is emitted once per source tree, not once per simulation, synthesis, build
    or estimate."""
    name = design.top_name
    key = hashlib.sha256("\0".join([design.name, name, design.key, source_fingerprint()])
                         .encode()).hexdigest()[:24]
    stored = cache_dir() / "verilog" / key
    start = time.monotonic()
    hit = (stored / f"{name}.v").is_file() and all((stored / f).is_file() for f in CACHE_FILES)
    if not hit:
        emit_verilog(design.build(), name, stored)
    profile.record("emit", name, stored, time.monotonic() - start, hit)
    return stored


def cached_emission(acc, config):
    """:func:`cached_design` of registered accelerator ``acc`` at ``config``."""
    return cached_design(Design.of(acc, config))


def emit_design(design, out_dir):
    """The cached Verilog, ``ports.json`` and ``resources.json`` of ``design``
    (:func:`cached_design`) copied into ``out_dir``. Returns ``(verilog_path, ports_dict)``."""
    stored = cached_design(design)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for file in (f"{design.top_name}.v",) + CACHE_FILES:
        content = (stored / file).read_text()
        path = out_dir / file
        if not path.is_file() or path.read_text() != content:
            write_atomic(path, content)
    return out_dir / f"{design.top_name}.v", json.loads((stored / "ports.json").read_text())


def emit_accelerator(acc, config, out_dir):
    """:func:`emit_verilog` of ``acc.build_core(config)`` as ``acc.top_name`` into ``out_dir``,
    through the Verilog cache (:func:`emit_design`). Returns ``(verilog_path, ports_dict)``."""
    return emit_design(Design.of(acc, config), out_dir)
