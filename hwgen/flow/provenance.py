"""Where a measurement came from: the command, the date, the machine and the commit.

A bench's ``--json`` carries :func:`measured` under ``"measured"``, so a table generated from
that file (the documentation site's, ``docs/hooks.py``) can say how its numbers were measured.
"""

import datetime
import shlex
import subprocess
import sys
from pathlib import Path

from .timing_table import machine

__all__ = ["measured", "commit"]


def commit():
    """The checkout's commit (short hash, ``+`` when the tree has changes), or None outside a
    git checkout."""
    root = Path(__file__).resolve().parents[2]
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, timeout=10, check=True)
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain",
                                "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return head.stdout.strip() + ("+" if dirty.stdout.strip() else "")


def measured(argv=None):
    """``{"command", "date", "machine", "commit"}`` of this run (``argv``: the command line,
    by default this process's, shown as ``hwgen ...``)."""
    args = list(sys.argv[1:] if argv is None else argv)
    return {"command": shlex.join(["hwgen", *args]),
            "date": datetime.date.today().isoformat(),
            "machine": machine(),
            "commit": commit()}
