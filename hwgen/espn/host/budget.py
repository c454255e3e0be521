"""Memory budgets for the ESPN benchmark: a cgroup memory limit around a worker process.

The paper limits the retrieval process' memory with cgroups (§5.1). Here a worker process runs in
a fresh cgroup-v1 ``memory`` group (``/sys/fs/cgroup/memory/hwgen-espn-*``) whose
``memory.limit_in_bytes`` is the budget; the kernel charges the process' own memory *and the page
cache it brings in* (mmap'ed file pages) to the group, and reclaims or OOM-kills within it. That
needs root and a cgroup-v1 memory hierarchy (cgroup v2's ``memory.max`` is used where that is what
the machine mounts). Where neither is writable, :func:`available` says why and the benchmark
falls back to evicting the token file from the page cache before each query (``mmap-cold``).

Before each worker the token file is dropped from the page cache (``posix_fadvise(DONTNEED)``), so
every run starts cold.
"""

import os
import subprocess
import uuid
from pathlib import Path

from ...errors import ToolError

__all__ = ["available", "run_limited", "drop_cache"]

_V1 = Path("/sys/fs/cgroup/memory")
_V2 = Path("/sys/fs/cgroup/unified")


def _root():
    """``(folder, limit file, peak file)`` of the writable memory hierarchy, or None."""
    if (_V1 / "memory.limit_in_bytes").exists() and os.access(_V1, os.W_OK):
        return _V1, "memory.limit_in_bytes", "memory.max_usage_in_bytes"
    for base in (_V2, Path("/sys/fs/cgroup")):
        controllers = base / "cgroup.controllers"
        if controllers.exists() and "memory" in controllers.read_text().split() and \
                os.access(base, os.W_OK):
            return base, "memory.max", "memory.peak"
    return None


def available():
    """``(True, how)`` when budgets can be enforced here, else ``(False, why not)``."""
    root = _root()
    if root is None:
        return False, ("no writable cgroup memory controller (needs root and cgroup v1 "
                       "memory or v2 with the memory controller)")
    return True, f"cgroup memory limit ({root[0]}/<group>/{root[1]})"


def drop_cache(path):
    """Evict ``path``'s pages from the page cache (permitted for any reader of the file)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def run_limited(cmd, limit_bytes, timeout=None):
    """Run ``cmd`` in a new memory cgroup limited to ``limit_bytes`` (None: no limit).

    Returns ``(returncode, peak_bytes or None, oom)``; ``oom`` is True when the kernel killed it
    for memory (SIGKILL inside a limited group)."""
    if limit_bytes is None:
        proc = subprocess.run(cmd, timeout=timeout)
        return proc.returncode, None, False
    root = _root()
    if root is None:
        raise ToolError("memory budgets need a writable cgroup memory controller: " +
                           available()[1])
    base, limit_file, peak_file = root
    group = base / f"hwgen-espn-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    group.mkdir()
    try:
        (group / limit_file).write_text(str(int(limit_bytes)))
        procs = str(group / "cgroup.procs")

        def enter():                     # in the child, before exec: join the group
            with open(procs, "w") as f:
                f.write(str(os.getpid()))
        proc = subprocess.run(cmd, preexec_fn=enter, timeout=timeout)
        try:
            peak = int((group / peak_file).read_text())
        except (OSError, ValueError):
            peak = None
        return proc.returncode, peak, proc.returncode == -9
    finally:
        try:
            group.rmdir()
        except OSError:
            pass
