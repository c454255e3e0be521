"""The WindVE device detector (paper section 4.3, Algorithm 2): which instances serve, and how.

:func:`detect` lists the devices of this machine, one :class:`Instance` each:

* CUDA GPUs (``torch.cuda``), ``cuda:N``;
* Ascend NPUs when ``torch_npu`` is installed (``torch_npu.npu.device_count()``), ``npu:N``;
* AMD/Xilinx FPGAs when ``xbutil`` is on the PATH (the ``[dddd:bb:dd.f]`` PCI addresses that
  ``xbutil examine`` prints). An FPGA has no PyTorch backend here, so it cannot run the model:
  it is recorded (``torch_device`` None, :attr:`Instance.usable` False) and :func:`plan` leaves
  it out with a note;
* one CPU instance with every core this process may run on (``os.sched_getaffinity``): the
  paper recommends one CPU instance per machine.

A failing probe (driver missing, ``xbutil`` hanging) counts as no device of that kind.

:func:`parse_devices` reads the ``--devices`` declaration instead, e.g. ``cpu:1,cpu:1`` or
``gpu:0,cpu:8@0-7``: entries ``KIND[:N][@CORES]``, ``N`` the device index of a gpu or npu and
the thread count of a cpu, ``CORES`` the CPU affinity of a cpu instance as ranges and single
cores joined by ``+`` (``0-3``, ``0+2+5``, ``0-1+4-5``; a ``,`` would split the entry).

:func:`plan` assigns the roles, following the paper's TEXT of section 4.3: accelerators (GPUs,
NPUs) are the main instances; the CPU instances take the overflow (auxiliary) only when
heterogeneous computing is on; "if only one type of device is detected, only one queue will be
created, and the heterogeneous computing option is forced to be disabled"; "if more than one type
of devices are available but the heterogeneous computing option is not enabled, only NPUs/GPUs
will establish a queue". Algorithm 2 (lines 13-17) instead makes the CPU the main device when an
NPU exists and heterogeneous computing is off, which contradicts that text and would leave the
accelerator idle: we follow the text.

On a machine without accelerators, declaring several CPU instances (``--devices cpu:1,cpu:1``)
reproduces the paper's set-up: the first declared CPU instance plays the accelerator's role
(main queue, ``emulates="accelerator"``), the others are the CPU overflow when heterogeneous
computing is on (and unused otherwise). Nothing else is emulated: each instance runs the real
model on its own device.
"""

import importlib.util
import os
import re
import shutil
import subprocess
from dataclasses import dataclass, replace

from hwgen.errors import ConfigError

__all__ = ["ACCELERATORS", "KINDS", "Instance", "Plan", "allowed_cores", "describe", "detect",
           "parse_devices", "plan"]

#: Device kinds, in the order instances are listed.
KINDS = ("gpu", "npu", "fpga", "cpu")
#: Kinds that can hold the main queue when PyTorch can drive them.
ACCELERATORS = ("gpu", "npu", "fpga")
_TORCH_PREFIX = {"gpu": "cuda", "npu": "npu"}
_XBUTIL_TIMEOUT = 10
_BDF = re.compile(r"\[([0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7])\]")


@dataclass(frozen=True)
class Instance:
    """One embedding instance: a device (or a set of CPU cores) with its own model copy.

    ``kind``: "gpu", "npu", "fpga" or "cpu"; ``index``: its number among instances of its kind;
    ``threads``: PyTorch CPU threads (None: PyTorch's default); ``cores``: CPU affinity (None:
    not pinned); ``torch_device``: "cuda:0", "npu:0", "cpu", or None for an FPGA (no PyTorch
    backend), by default the kind's own; ``declared``: given with ``--devices`` rather than
    detected; ``emulates``: "accelerator" for a declared CPU instance that holds the
    accelerator's (main) queue.
    """
    kind: str
    index: int
    threads: int | None = None
    cores: tuple | None = None
    torch_device: str | None = "auto"
    declared: bool = False
    emulates: str | None = None

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"Instance kind {self.kind!r}: must be one of {', '.join(KINDS)}")
        if self.torch_device == "auto":           # the kind's own device
            prefix = _TORCH_PREFIX.get(self.kind)
            device = f"{prefix}:{self.index}" if prefix else "cpu" if self.kind == "cpu" else None
            object.__setattr__(self, "torch_device", device)

    @property
    def name(self):
        """``gpu0``, ``cpu1``, ..."""
        return f"{self.kind}{self.index}"

    @property
    def usable(self):
        """Whether PyTorch can run the model on it (every kind but the FPGA)."""
        return self.torch_device is not None

    @property
    def accelerator(self):
        """An NPU/GPU/FPGA rather than the CPU."""
        return self.kind in ACCELERATORS


@dataclass(frozen=True)
class Plan:
    """The instances that serve: ``main`` hold the first queue, ``auxiliary`` the CPU overflow
    queue (only when ``heterogeneous``, the effective setting). ``main_kind``: "gpu", "npu",
    "gpu+npu" or "cpu"; ``note``: the decision in one line; ``unused``: instances that were
    detected or declared but serve in no queue (FPGAs, CPUs with heterogeneous computing off)."""
    main: tuple
    auxiliary: tuple
    heterogeneous: bool
    main_kind: str
    note: str
    unused: tuple = ()


# -- detection ------------------------------------------------------------------------------------

def allowed_cores():
    """The cores this process may run on, sorted."""
    try:
        return tuple(sorted(os.sched_getaffinity(0)))
    except (AttributeError, OSError):            # not Linux
        return tuple(range(os.cpu_count() or 1))


def _cuda_count():
    try:
        import torch
        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:                        # a broken driver is no GPU
        return 0


def _npu_count():
    if importlib.util.find_spec("torch_npu") is None:
        return 0
    try:
        import torch_npu
        return int(torch_npu.npu.device_count())
    except Exception:
        return 0


def _fpga_count():
    """FPGAs that ``xbutil examine`` lists (distinct PCI addresses); 0 on any failure."""
    xbutil = shutil.which("xbutil")
    if xbutil is None:
        return 0
    try:
        out = subprocess.run([xbutil, "examine"], capture_output=True, text=True,
                             timeout=_XBUTIL_TIMEOUT, check=False)
    except (OSError, subprocess.SubprocessError):
        return 0
    return len(set(_BDF.findall(out.stdout or "")))


def detect():
    """The instances of this machine: GPUs, NPUs, FPGAs, then one CPU instance (all its cores)."""
    found = [Instance("gpu", i, torch_device=f"cuda:{i}") for i in range(_cuda_count())]
    found += [Instance("npu", i, torch_device=f"npu:{i}") for i in range(_npu_count())]
    found += [Instance("fpga", i, torch_device=None) for i in range(_fpga_count())]
    cores = allowed_cores()
    found.append(Instance("cpu", 0, threads=len(cores), cores=cores, torch_device="cpu"))
    return found


# -- the --devices declaration --------------------------------------------------------------------

def _parse_cores(text, fail):
    """``0-3``, ``0+2+5``, ``0-1+4-5`` -> sorted tuple of cores, each allowed to this process."""
    cores = set()
    for part in text.split("+"):
        m = re.fullmatch(r"\s*([0-9]+)\s*(?:-\s*([0-9]+)\s*)?", part)
        if not m:
            fail(f"cores {text!r}: use ranges and single cores joined by '+', e.g. 0-3 or 0+2+5")
        lo, hi = int(m.group(1)), int(m.group(2) if m.group(2) is not None else m.group(1))
        if hi < lo:
            fail(f"cores {text!r}: range {lo}-{hi} is empty")
        cores.update(range(lo, hi + 1))
    allowed = allowed_cores()
    outside = sorted(cores.difference(allowed))
    if outside:
        fail(f"cores {_format_cores(outside)} are not available to this process "
             f"(available: {_format_cores(allowed)})")
    return tuple(sorted(cores))


def _parse_number(text, what, fail):
    if not re.fullmatch(r"\s*[0-9]+\s*", text):
        fail(f"{what} must be an integer, not {text!r}")
    return int(text)


def _device_count(kind, fail):
    if kind == "gpu":
        return _cuda_count()
    if importlib.util.find_spec("torch_npu") is None:
        fail("npu declared but torch_npu (the Ascend PyTorch backend) is not installed")
    return _npu_count()


def parse_devices(spec):
    """The instances a ``--devices`` spec declares (see the module docstring), checked against
    this machine; raises :class:`~hwgen.errors.ConfigError` naming "devices"."""
    def fail(message):
        raise ConfigError("devices", message, value=spec)

    if not isinstance(spec, str) or not spec.strip():
        fail("empty: give instances such as cpu:1,cpu:1 or gpu:0,cpu:8@0-7")
    instances, next_index = [], dict.fromkeys(KINDS, 0)
    for position, entry in enumerate(spec.split(","), 1):
        entry = entry.strip()
        if not entry:
            fail(f"entry {position} is empty")
        instances.append(_parse_entry(entry, instances, next_index, fail))
    return instances


def _parse_entry(entry, instances, next_index, fail_spec):
    """The :class:`Instance` of one ``KIND[:N][@CORES]`` entry (``instances``: those before)."""
    def fail(message):
        fail_spec(f"{entry!r}: {message}")

    head, at, cores_text = entry.partition("@")
    kind, colon, number = (s.strip() for s in head.partition(":"))
    kind = kind.lower()
    if kind == "fpga":
        fail("an FPGA has no PyTorch backend and cannot run the model; declare gpu, npu or "
             "cpu instances")
    if kind not in KINDS:
        fail(f"unknown kind {kind!r} (use gpu, npu or cpu)")
    if colon and not number:
        fail("nothing after ':'")
    if at and kind != "cpu":
        fail("@CORES applies to cpu instances only")
    if kind == "cpu":
        cores = _parse_cores(cores_text, fail) if at else None
        threads = len(cores) if cores is not None else None
        if colon:
            threads = _parse_number(number, "the thread count", fail)
            if threads < 1:
                fail("the thread count must be at least 1")
        next_index["cpu"] += 1
        return Instance("cpu", next_index["cpu"] - 1, threads=threads, cores=cores,
                        torch_device="cpu", declared=True)
    index = _parse_number(number, "the device index", fail) if colon else next_index[kind]
    count = _device_count(kind, fail)
    if index >= count:
        fail(f"{kind} index {index} does not exist (this machine has {count} "
             f"{kind.upper()}{'' if count == 1 else 's'})")
    if any(i.kind == kind and i.index == index for i in instances):
        fail(f"{kind}{index} is declared twice")
    next_index[kind] = max(next_index[kind], index + 1)
    return Instance(kind, index, torch_device=f"{_TORCH_PREFIX[kind]}:{index}", declared=True)


# -- roles ----------------------------------------------------------------------------------------

def _names(instances):
    return ", ".join(i.name for i in instances)


def plan(instances, heterogeneous):
    """The roles of ``instances`` (see the module docstring); heterogeneous computing is on in
    the result only when both a main and an auxiliary queue exist."""
    instances = list(instances)
    accelerators = [i for i in instances if i.accelerator and i.usable]
    skipped = [i for i in instances if not i.usable]
    cpus = [i for i in instances if i.kind == "cpu"]
    notes = [f"{_names(skipped)} skipped (no PyTorch backend for the model)"] if skipped else []
    source = "declared" if any(i.declared for i in instances) else "detected"

    if accelerators:
        main, candidates = accelerators, cpus
        main_kind = "+".join(k for k in KINDS if any(i.kind == k for i in accelerators))
        decision = f"{main_kind.upper()} main queue ({_names(main)})"
    elif source == "declared" and len(cpus) > 1:
        main = [replace(cpus[0], emulates="accelerator")]
        candidates, main_kind = cpus[1:], "cpu"
        decision = f"no accelerator: {main[0].name} emulates the accelerator's main queue"
    elif cpus:
        main, candidates, main_kind = cpus, [], "cpu"
        decision = (f"only CPU {source} ({_names(cpus)}): one queue, heterogeneous computing "
                    "forced off")
    else:
        raise ConfigError("devices", "; ".join(["no device can run the model"] + notes),
                          value=_names(instances) or None)

    if candidates and heterogeneous:
        auxiliary, unused = candidates, []
        decision += f"; overflow to {_names(auxiliary)} (heterogeneous computing on)"
    elif candidates:
        auxiliary, unused = [], candidates
        decision += f"; heterogeneous computing off: {_names(unused)} not used"
    else:
        auxiliary, unused = [], []
        if accelerators:
            decision += f"; no CPU {source}: one queue, heterogeneous computing forced off"
    return Plan(main=tuple(main), auxiliary=tuple(auxiliary),
                heterogeneous=bool(auxiliary), main_kind=main_kind,
                note="; ".join([decision] + notes), unused=tuple(skipped + unused))


def _format_cores(cores):
    """(0, 1, 2, 3, 6) -> "0-3,6"."""
    runs, cores = [], sorted(cores)
    for c in cores:
        if runs and c == runs[-1][1] + 1:
            runs[-1][1] = c
        else:
            runs.append([c, c])
    return ",".join(f"{a}-{b}" if b > a else f"{a}" for a, b in runs)


def describe(plan):
    """One line per instance of ``plan``: role, name, threads, cores, PyTorch device."""
    rows = [("main", i) for i in plan.main] + [("auxiliary", i) for i in plan.auxiliary] \
        + [("unused", i) for i in plan.unused]
    lines = []
    for role, inst in rows:
        threads = "default" if inst.threads is None else str(inst.threads)
        cores = "any" if inst.cores is None else _format_cores(inst.cores)
        line = (f"{role:<9} {inst.name:<6} threads={threads} cores={cores} "
                f"device={inst.torch_device or 'none (no PyTorch backend)'}")
        if inst.emulates:
            line += f", emulating the {inst.emulates}"
        if inst.declared:
            line += " (declared)"
        lines.append(line)
    return lines
