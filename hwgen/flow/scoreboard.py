"""The one job and scoreboard behind every simulation engine.

``hwgen sim`` (the cocotb stream testbench and the native C++ testbench, :mod:`.simulate`) and
the Vitis kernel simulation (:func:`hwgen.flow.kernel.simulate_kernel`) all:

1. draw a seeded workload from the accelerator's :class:`~hwgen.flow.model.StreamModel` and
   compute the golden outputs before anything is built (:func:`workload`), so that bad data or
   options fail in a second, not after a Verilator build;
2. give the testbench one cycle budget, :func:`timeout_cycles`, and stop it
   :data:`DRAIN_CYCLES` after the last expected beat to catch extra beats;
3. run in a folder named by everything that goes into the run (:func:`run_folder`), so that
   concurrent runs never share one;
4. compare every received beat with the golden beat, field by field, as integers
   (:func:`compare`).
"""

import hashlib
import inspect
import json
from dataclasses import dataclass

import numpy as np

from .. import checks
from ..errors import ConfigError
from .tools import available_memory

__all__ = ["DRAIN_CYCLES", "Workload", "beat_names", "check_memory", "compare", "normalise",
           "run_folder", "run_name", "timeout_cycles", "workload"]

#: Cycles a testbench keeps running after every output has its beats (extra beats show up).
DRAIN_CYCLES = 64
#: Cycle budget: this many cycles per beat moved (inputs, outputs, memory words, the model's
#: ``cycles_bound``), stretched by the stall probability, plus a fixed slack.
TIMEOUT_CYCLES_PER_BEAT = 4
TIMEOUT_SLACK_CYCLES = 50_000
#: Items below this are never estimated (a trial would cost more than the run).
_MEMORY_TRIAL_FROM = 20_000
#: The testbench process holds the stimulus again, as packed frames.
_TESTBENCH_FACTOR = 2


@dataclass
class Workload:
    """A drawn stimulus (``stim``, in the model's own form), the input beats per member and
    the golden output beats per member."""
    items: int
    stim: object
    inputs: dict
    expected: dict


def workload(acc, config, *, items=None, seed=1, stimulus_options=None, stimulus=None,
             log=None):
    """Check the run's arguments, draw the stimulus (``np.random.default_rng(seed)``) unless
    ``stimulus`` is given, and compute the model's inputs and golden outputs."""
    model = acc.model
    items = items if items is not None else acc.default_items
    accepted = set(inspect.signature(model.stimulus).parameters) - {"config", "items", "rng"}
    unknown = set(stimulus_options or {}) - accepted
    if unknown:
        raise ConfigError(sorted(unknown)[0], f"is not an option of {acc.name}")
    checks.at_least("items", items, 1)
    checks.at_least("seed", seed, 0, checks.SEED_MAX)
    if stimulus is None:
        check_memory(acc, config, items, stimulus_options, log=log)
        stimulus = model.stimulus(config, items, np.random.default_rng(seed),
                                  **(stimulus_options or {}))
    return Workload(items, stimulus, model.inputs(config, stimulus),
                    model.expect(config, stimulus))


def timeout_cycles(beats, stall):
    """The cycle budget of a run moving ``beats`` beats (or words) at stall probability
    ``stall``: input gaps and output backpressure each cost a factor ``1 / (1 - stall)``."""
    return int(beats * TIMEOUT_CYCLES_PER_BEAT / (1.0 - stall) ** 2) + TIMEOUT_SLACK_CYCLES


def run_name(job, seed, stall, items):
    """A run folder's name: readable facts plus a digest of the whole job (stimulus, memory
    images, timeouts), so that runs differing in anything never share a folder."""
    digest = hashlib.sha256(json.dumps(job, sort_keys=True).encode()).hexdigest()[:12]
    return f"seed{seed}-stall{stall:g}-n{items}-{digest}"


def run_folder(parent, job, *, seed, stall, items, prefix=""):
    """``<parent>/runs/<prefix><run_name>`` (an engine's ``run_prefix``: the cocotb engine keeps
    the bare name, the native one ``native-``)."""
    return parent / "runs" / (prefix + run_name(job, seed, stall, items))


def beat_names(fmt, sidebands=True):
    """Field names a beat of stream format ``fmt`` is compared on: the payload fields, ``last``
    when the stream has TLAST, and the sideband fields (unless ``sidebands`` is false)."""
    return [f.name for f in fmt.fields] + (["last"] if fmt.has_last else []) + \
        ([name for name, _ in fmt.sidebands] if sidebands else [])


def normalise(beat, names):
    """``beat`` restricted to ``names``, every value a Python int (lists for array fields)."""
    return {n: (list(map(int, beat[n])) if isinstance(beat[n], (list, tuple, np.ndarray))
                else int(beat[n])) for n in names}


def compare(expected, received, names, limit=5):
    """``(mismatching beats, first few differences)``. A beat missing on either side counts as
    a mismatch; received beats must already be normalised."""
    mismatches, examples = 0, []
    for k in range(max(len(expected), len(received))):
        want = normalise(expected[k], names) if k < len(expected) else None
        have = received[k] if k < len(received) else None
        if want != have:
            mismatches += 1
            if len(examples) < limit:
                examples.append({"index": k, "expected": want, "received": have})
    return mismatches, examples


def _trial_bytes(acc, config, n, options):
    import tracemalloc
    tracemalloc.start()
    try:
        stim = acc.model.stimulus(config, n, np.random.default_rng(0), **(options or {}))
        kept = (stim, acc.model.inputs(config, stim), acc.model.expect(config, stim))
        return tracemalloc.get_traced_memory()[1], kept
    finally:
        tracemalloc.stop()


def check_memory(acc, config, items, options=None, log=None):
    """Refuse (or warn about) ``items`` whose stimulus, golden results and testbench copy would
    not fit in memory. Two trials (200 and 1,000 items) are measured with tracemalloc; the
    bytes per item are their difference over 800. Returns the projected bytes (0 when not
    estimated: small runs, and models whose ``memory_trial`` is false)."""
    if items < _MEMORY_TRIAL_FROM or not acc.model.memory_trial:
        return 0
    small, _ = _trial_bytes(acc, config, 200, options)
    large, _ = _trial_bytes(acc, config, 1000, options)
    projected = small + max(0, large - small) / 800 * items * _TESTBENCH_FACTOR
    available = available_memory()
    if available and projected > 0.8 * available:
        raise ConfigError("items", f"would need about {projected / 2**30:.1f} GiB for the "
                          f"stimulus, golden results and testbench ({available / 2**30:.1f} GiB "
                          f"available); lower --items", value=items)
    if projected > 2**30 and log:
        log(f"warning: {items:,} items will use about {projected / 2**30:.1f} GiB of memory")
    return projected
