"""Vendor files for a kernel: Vitis ``kernel.xml``, Vivado packaging and synthesis Tcl, v++ config.

:func:`write_vendor_files` renders the jinja2 templates of ``rtl_templates/`` from the kernel
description returned by :func:`hwgen.flow.kernel.emit_kernel` and a board:

==================  ============================================================================
file                what it is for
==================  ============================================================================
``kernel.xml``      Vitis RTL kernel description: ``s_axi_control`` slave, one ``m_axi_*``
                    master per stream, arguments with the control-register offsets
``package_xo.tcl``  Vivado batch script: project for the board part, ``ipx::package_project``,
                    clock/reset associations, register map, ``package_xo -kernel_xml``
``link.cfg``        ``v++ --link --config``: ``nk=`` one compute unit, one ``sp=`` per master
                    (round-robin over the board's primary memory banks), ``[clock] freqHz``
``synth_ooc.tcl``   Vivado out-of-context synthesis at the board's kernel clock
                    (``<top>_ooc.xdc``), utilisation and timing reports
``build_xo.sh``     the two commands a Vitis user runs (package, then link)
``README_vitis.md`` those commands, the argument/register map and the record format
==================  ============================================================================

A board without a Vitis platform (e.g. ``sidewinder``) gets only ``synth_ooc.tcl`` and its XDC
for the AXI-Stream top ``<top>.v`` (written by :func:`hwgen.flow.emit.emit_verilog`), plus a
``README_vivado.md`` saying why there are no Vitis files.

Scripts are generated here and run elsewhere: nothing in this module calls Vivado or v++.
Templates may name hooks (``{{ hook("post_synth") }}``); a hook without text from the caller
renders as a placeholder comment, as in Amaranth's vendor platforms.
"""

import re
import stat
from importlib.resources import files
from pathlib import Path

import jinja2

__all__ = ["TEMPLATES_DIR", "render", "tcl_quote", "write_vendor_files"]

#: The templates: the checkout's ``rtl_templates/``, installed as package ``hwgen.rtl_templates``.
TEMPLATES_DIR = Path(files("hwgen.rtl_templates"))


def tcl_quote(value):
    """Quote ``value`` as one Tcl word: double quotes, with ``$ [ ] \\ "`` escaped."""
    return '"' + re.sub(r'([$\[\]\\"])', r"\\\1", str(value)) + '"'


def _env():
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATES_DIR)),
        autoescape=jinja2.select_autoescape(enabled_extensions=("xml.j2",),
                                            default_for_string=False),
        undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True,
        keep_trailing_newline=True)
    env.filters["tcl_quote"] = tcl_quote
    env.filters["hex"] = lambda n, digits=0: f"0x{int(n):0{digits}X}"
    return env


def render(template, **context):
    """Render ``rtl_templates/<template>`` with ``context``."""
    hooks = context.pop("hooks", None) or {}

    def hook(name):
        return hooks.get(name, f"# (hook {name}: nothing added)")
    return _env().get_template(template).render(hook=hook, **context)


def _clock(board):
    mhz = board.kernel_clock_mhz
    return {"mhz": mhz, "freq_hz": int(round(mhz * 1e6)), "period_ns": f"{1000.0 / mhz:.3f}"}


def write_vendor_files(acc, cfg, board, out_dir, kernel_description, *, hooks=None):
    """Render the vendor files for ``acc`` at ``cfg`` on ``board`` into ``out_dir``.

    ``kernel_description`` is what :func:`hwgen.flow.kernel.emit_kernel` returned (it may be
    None for a board without a Vitis platform). ``hooks`` maps hook names used by the
    templates (``pre_package``, ``post_synth``) to Tcl text. Returns ``{file name: path}``.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    clock = _clock(board)
    vitis = bool(board.vitis_platform)
    if vitis:
        k = kernel_description
        if k is None:
            raise ValueError(f"board {board.name} has a Vitis platform: a kernel description "
                             "(from emit_kernel) is needed")
        if any(m["bank"] is None for m in k["masters"]):
            raise ValueError("the kernel description has no memory banks: emit it with the "
                             f"board ({board.name})")
        top, sources = k["top"], [k["verilog"]]
    else:
        k, top = None, acc.top_name
        sources = [f"{top}.v"]
    context = {"acc": acc.name, "config": cfg.to_dict(), "board": board, "clock": clock,
               "kernel": k, "top": top, "sources": sources, "xo": f"{top}.xo",
               "xclbin": f"{top}.xclbin", "ip_dir": f"ip_{top}", "xdc": f"{top}_ooc.xdc",
               "hooks": hooks}
    files = {"synth_ooc.tcl": "synth_ooc.tcl.j2", context["xdc"]: "ooc.xdc.j2"}
    if vitis:
        files.update({"kernel.xml": "kernel.xml.j2", "package_xo.tcl": "package_xo.tcl.j2",
                      "link.cfg": "link.cfg.j2", "build_xo.sh": "build_xo.sh.j2",
                      "README_vitis.md": "README_vendor.md.j2"})
    else:
        files["README_vivado.md"] = "README_vendor.md.j2"
    written = {}
    for name, template in files.items():
        path = out_dir / name
        path.write_text(render(template, **context))
        written[name] = path
    if "build_xo.sh" in written:
        sh = written["build_xo.sh"]
        sh.chmod(sh.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return written

