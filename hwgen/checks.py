"""Checks of user input shared by the CLI and the library entry points.

Every function raises :class:`~hwgen.errors.ConfigError` naming the parameter (or file) and the
offending value, so that bad input reaches a user as one line, never as a traceback, a hang or
a silent default. The CLI runs them before any long computation; the library functions run
them again, so that a caller who skips the CLI gets the same errors.
"""

import json
import math
import os
import stat
from pathlib import Path

from .errors import ConfigError

__all__ = ["MAX_JSON_BYTES", "probability", "positive", "at_least", "in_range", "stat_input",
           "read_text",
           "read_json",
           "output_dir", "output_file", "SEED_MAX"]

#: Largest JSON input file (configurations, descriptions, models) read.
MAX_JSON_BYTES = 16 << 20
#: Seeds are unsigned 32-bit so that the testbench's C and Python generators accept them.
SEED_MAX = 2**32 - 1


def _number(name, value):
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(name, "must be a number", value=value)
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(name, "must be a finite number", value=value)


def probability(name, value, hi=0.99):
    """``value`` in ``0 .. hi`` (``--stall``, ``--loss``)."""
    _number(name, value)
    if not 0.0 <= value <= hi:
        raise ConfigError(name, f"must be a probability in 0..{hi:g}", value=value)
    return float(value)


def positive(name, value):
    """A finite number > 0 (rates, bandwidths, clocks)."""
    _number(name, value)
    if value <= 0:
        raise ConfigError(name, "must be a positive number", value=value)
    return value


def at_least(name, value, lo, hi=None):
    """An integer ``>= lo`` (and ``<= hi`` when given)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(name, "must be an integer", value=value)
    if value < lo or (hi is not None and value > hi):
        what = f"in {lo}..{hi}" if hi is not None else f">= {lo}"
        raise ConfigError(name, f"must be an integer {what}", value=value)
    return value


def in_range(name, value, lo, hi):
    """A finite number in ``lo .. hi``."""
    _number(name, value)
    if not lo <= value <= hi:
        raise ConfigError(name, f"must be a number in {lo:g}..{hi:g}", value=value)
    return value


def stat_input(path, name, folders=False):
    """``os.stat`` of the input ``path`` (from the option ``name``), refusing anything but a
    regular file, or a folder when ``folders``: a FIFO would block a reader and a device
    (``/dev/zero``) be read forever."""
    try:
        st = os.stat(path)
    except OSError as e:
        raise ConfigError(name, f"cannot read: {e.strerror}", value=str(path)) from None
    if not (stat.S_ISREG(st.st_mode) or folders and stat.S_ISDIR(st.st_mode)):
        raise ConfigError(name, "is not a regular file" + (" or folder" if folders else ""),
                          value=str(path))
    return st


def read_text(path, name, limit=MAX_JSON_BYTES):
    """The UTF-8 text of the regular file ``path``; ``name`` is the option it came from.

    Refuses devices, FIFOs and directories (``/dev/zero`` would be read forever), files over
    ``limit`` bytes and text that is not UTF-8.
    """
    p = Path(path)
    st = stat_input(p, name)
    if st.st_size > limit:
        raise ConfigError(name, f"is {st.st_size:,} bytes; inputs are limited to {limit:,}",
                          value=str(path))
    try:
        with open(p, "rb") as f:
            raw = f.read(limit + 1)
    except OSError as e:
        raise ConfigError(name, f"cannot read: {e.strerror}", value=str(path)) from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(name, f"is not UTF-8 text (byte {e.start})",
                          value=str(path)) from None


def read_json(path, name, limit=MAX_JSON_BYTES):
    """The JSON document in the regular file ``path`` (see :func:`read_text`); JSON nested
    too deeply for Python's parser is refused too."""
    text = read_text(path, name, limit)
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(name, f"not valid JSON ({e.msg} at line {e.lineno})",
                          value=str(path)) from None
    except RecursionError:
        raise ConfigError(name, "JSON nested too deeply", value=str(path)) from None


def output_dir(name, path):
    """Create the output folder ``path`` now (before a long run) and check it is writable."""
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise ConfigError(name, "exists and is not a folder", value=str(path))
    try:
        p.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(name, f"cannot create the folder: {e.strerror}",
                          value=str(path)) from None
    if not os.access(p, os.W_OK | os.X_OK):
        raise ConfigError(name, "folder is not writable", value=str(path))
    return p


def output_file(name, path):
    """Check that the file ``path`` can be written (creating its folder) before a long run."""
    p = Path(path)
    if p.is_dir():
        raise ConfigError(name, "is a folder, not a file", value=str(path))
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(name, f"cannot create its folder: {e.strerror}",
                          value=str(path)) from None
    if not p.parent.is_dir() or not os.access(p.parent, os.W_OK | os.X_OK):
        raise ConfigError(name, "its folder is not writable", value=str(path))
    if p.exists() and not os.access(p, os.W_OK):
        raise ConfigError(name, "is not writable", value=str(path))
    return p
