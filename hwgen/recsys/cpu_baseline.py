"""The CPU baseline of the recommendation model, measured on this machine (``hwgen bench recsys
--cpu``): the model's inference in PyTorch on the CPU, at batch 1 and a large batch.

**The model** (:class:`CTRNet`) is the float equivalent of the integer golden model
(:mod:`hwgen.recsys.golden`) with the same tables, weights and biases:

* Embedding tables stay in the model's own integer format (``int16`` for ``paper-ctr``'s
  16-bit elements, 15.1 GB, the paper's size; ``int8`` for 8-bit models): all tables in one
  flat buffer, one gather per batch for every table (a table-batched lookup, as FBGEMM's
  table-batched embeddings do), the gathered rows converted to float32 and concatenated with
  the dense features. The conversion is exact, so the embedding vector equals
  :func:`golden.embed <hwgen.recsys.golden.embed>` bit for bit.
* FC layers in float32 (``torch.nn.Linear``): layer ``l`` holds the golden weights and biases
  times ``2**-shifts[l]`` (the requantisation's scale folded in; exact for the weights, one
  float32 rounding for a bias) followed by ``Hardtanh(0, 2**(act_bits[l+1]-1) - 1)``: the
  integer model's ReLU and saturation, without its rounding. The last layer is plain.
  It agrees with the golden model within a bound that follows from float32 arithmetic and the
  integer model's rounding (``tests/test_recsys_cpu_baseline.py`` derives it and checks it).

**Tables in memory or memory-mapped** (:func:`table_storage`): tables of at most
:data:`IN_MEMORY_LIMIT` bytes are held in memory; larger ones (``paper-ctr``: 15.1 GB) are
written once to a file under the build cache (about a minute for ``paper-ctr``; later runs
reuse it) and memory-mapped read-only, so the operating system pages them in from its page
cache or the disk. The measurement counts the page faults taken while timing: major faults
are reads from the disk. Contents: the golden model's (:func:`golden.table_content
<hwgen.recsys.golden.table_content>`) for tables of at most :data:`GOLDEN_CONTENT_LIMIT`
elements, seeded uniform values beyond (numpy cannot draw the golden contents of a 2 GB table
in memory; the values do not change the time of a lookup).

**Measurement** (:func:`time_batches`): every batch draws fresh indices, uniform over each
table's rows (one lookup per table per inference, the model's pattern; seeded), and dense
features; only the forward pass (``torch.inference_mode``) is timed, its embedding lookups
and its FC layers separately as well. :data:`WARMUP` batches first, then batches until
``seconds`` have been timed and at least :data:`MIN_REPEATS` batches; the rate is the batch
over the median batch time, with the 10th and 90th percentiles as the spread. Other work on
the machine slows it: the result records the load average when it started.
"""

import contextlib
import hashlib
import json
import mmap
import os
import resource
import shutil
import time
import warnings
from pathlib import Path

import numpy as np

from ..errors import ConfigError, ToolError
from . import golden
from .model import PRESETS, preset

__all__ = ["IN_MEMORY_LIMIT", "GOLDEN_CONTENT_LIMIT", "TABLE_MODES", "DEFAULT_BATCHES",
           "element_dtype", "table_chunks", "table_storage", "CTRNet", "mlp", "random_batch",
           "time_batches", "run_cpu_baseline", "check_options", "threads_text",
           "report_lines"]

#: Tables of at most this many bytes are held in memory by ``tables="auto"``.
IN_MEMORY_LIMIT = 4 << 30
#: Tables of at most this many elements get the golden model's contents.
GOLDEN_CONTENT_LIMIT = 1 << 22
#: Elements drawn at a time for larger tables.
CHUNK = 1 << 25
#: Where the tables live: ``auto`` (memory up to :data:`IN_MEMORY_LIMIT`), ``memory``, ``mmap``.
TABLE_MODES = ("auto", "memory", "mmap")
#: Batch sizes measured by default: one inference, and the paper's batch (section IV-B).
DEFAULT_BATCHES = (1, 1024)
#: Batches run before timing.
WARMUP = 2
#: Fewest timed batches per batch size.
MIN_REPEATS = 5
#: Most timed batches per batch size.
MAX_REPEATS = 100_000
#: Largest batch accepted.
MAX_BATCH = 16384
#: Version of the table files (part of their names): raise it whenever the bytes that
#: :func:`table_chunks` yields for a model change (layout, content rule, :data:`CHUNK`).
FORMAT = 1


def _torch():
    """The ``torch`` module; :class:`ToolError` saying how to install it otherwise."""
    try:
        import torch
    except ImportError:
        raise ToolError("the CPU baseline needs PyTorch: pip install torch==2.13.0 (the "
                        "serve and test extras include it)") from None
    return torch


def element_dtype(model):
    """numpy dtype of a table element: ``int8`` for 8-bit elements, ``int16`` for 16-bit."""
    return np.dtype(np.int8 if model.elem_bits == 8 else np.int16)


def _offsets(model):
    """Element offset of each table in the flat buffer, and the total (``tables + 1``)."""
    sizes = [t.rows * t.dim for t in model.tables]
    return np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)])


def table_chunks(model, golden_limit=GOLDEN_CONTENT_LIMIT):
    """The flat contents of every table, in table order and row-major, as arrays of
    :func:`element_dtype`: :func:`golden.table_content <hwgen.recsys.golden.table_content>`
    for a table of at most ``golden_limit`` elements, else uniform signed values drawn in
    chunks of :data:`CHUNK` with ``numpy.random.default_rng([model.seed, 0x4350, t])``."""
    dtype = element_dtype(model)
    lo, hi = golden.signed_range(model.elem_bits)
    for t, table in enumerate(model.tables):
        n = table.rows * table.dim
        if n <= golden_limit:
            yield golden.table_content(model, t).astype(dtype).ravel()
            continue
        rng = np.random.default_rng([model.seed, 0x4350, t])
        for start in range(0, n, CHUNK):
            yield rng.integers(lo, hi, size=min(CHUNK, n - start), dtype=dtype,
                               endpoint=True)


def _file_key(model, golden_limit):
    """Digest of what a table file holds: layout version, model and content rule."""
    text = json.dumps({"format": FORMAT, "model": model.to_dict(),
                       "golden_limit": golden_limit}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _write_table_file(model, path, golden_limit, log):
    """Write the flat contents of :func:`table_chunks` to ``path`` (through a temporary file
    and a rename); log progress every 2 GB."""
    total = int(_offsets(model)[-1]) * element_dtype(model).itemsize
    free = shutil.disk_usage(path.parent).free
    if free < total + (1 << 30):
        raise ConfigError("cpu-dir", f"needs {total / 1e9:.1f} GB for the memory-mapped "
                          f"tables plus 1 GB to spare; {free / 1e9:.1f} GB free",
                          value=str(path.parent))
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    written, mark = 0, 2e9
    try:
        with open(tmp, "wb") as f:
            for chunk in table_chunks(model, golden_limit):
                f.write(chunk.tobytes())
                written += chunk.nbytes
                if written >= mark:
                    log(f"wrote {written / 1e9:.1f} of {total / 1e9:.1f} GB")
                    mark += 2e9
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()


def _mapped_tables(model, directory, golden_limit, log):
    """The tables as a read-only numpy array over a memory map of the file
    ``<directory>/<model>-<key>.<dtype>``, written first unless a complete one is there;
    ``(array, path, seconds spent writing)``. The map is advised ``MADV_RANDOM``: a page fault
    reads its own page from the disk, not the read-ahead window around it (the lookups are
    random)."""
    from ..flow.tools import cache_dir, file_lock
    directory = Path(directory) if directory else cache_dir() / "recsys-cpu"
    directory.mkdir(parents=True, exist_ok=True)
    dtype = element_dtype(model)
    n = int(_offsets(model)[-1])
    path = directory / f"{model.name}-{_file_key(model, golden_limit)}.{dtype.name}"
    seconds = 0.0
    with file_lock(directory / f"{path.name}.lock"):
        if not path.is_file() or path.stat().st_size != n * dtype.itemsize:
            log(f"writing the {n * dtype.itemsize / 1e9:.2f} GB of {model.name}'s tables to "
                f"{path} (once; later runs reuse it) ...")
            start = time.perf_counter()
            _write_table_file(model, path, golden_limit, log)
            seconds = time.perf_counter() - start
    with open(path, "rb") as f:
        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    if hasattr(mapped, "madvise") and hasattr(mmap, "MADV_RANDOM"):
        mapped.madvise(mmap.MADV_RANDOM)
    return np.frombuffer(mapped, dtype=dtype, count=n), path, seconds


def _check_tables(tables):
    """ConfigError naming ``cpu-tables`` unless ``tables`` is one of :data:`TABLE_MODES`."""
    if tables not in TABLE_MODES:
        raise ConfigError("cpu-tables", "must be one of " + ", ".join(TABLE_MODES),
                          value=tables)


def table_storage(model, tables="auto", directory=None, golden_limit=GOLDEN_CONTENT_LIMIT,
                  log=lambda message: None):
    """The flat table buffer of ``model`` and a description of where it lives.

    ``tables``: ``"memory"`` (a numpy array), ``"mmap"`` (a read-only memory map of a file in
    ``directory``, default ``<build cache>/recsys-cpu``, written once) or ``"auto"`` (memory up
    to :data:`IN_MEMORY_LIMIT` bytes, else mmap). Returns ``(array, info)``, ``info`` holding
    ``mode``, ``why`` (the reason in words), ``bytes``, ``dtype``, ``path`` (None in memory)
    and ``write_s`` (seconds spent writing the file in this call, 0 when reused). ConfigError
    naming ``cpu-tables`` for ``memory`` beyond the available memory.
    """
    _check_tables(tables)
    dtype = element_dtype(model)
    n = int(_offsets(model)[-1])
    nbytes = n * dtype.itemsize
    mode = tables if tables != "auto" else ("memory" if nbytes <= IN_MEMORY_LIMIT else "mmap")
    why = (f"{'within' if mode == 'memory' else 'over'} the {IN_MEMORY_LIMIT >> 30} GiB limit "
           "for tables held in memory" if tables == "auto" else f"--cpu-tables {tables}")
    info = {"mode": mode, "why": why, "bytes": nbytes, "dtype": dtype.name, "path": None,
            "write_s": 0.0}
    if mode == "mmap":
        array, path, seconds = _mapped_tables(model, directory, golden_limit, log)
        info.update(path=str(path), write_s=seconds)
        return array, info
    from ..flow.tools import available_memory
    available = available_memory()
    if available is not None and nbytes > available - (1 << 30):
        raise ConfigError("cpu-tables", f"memory needs {nbytes / 1e9:.1f} GB for the tables, "
                          f"{available / 1e9:.1f} GB available: use mmap", value=tables)
    array = np.empty(n, dtype=dtype)
    at = 0
    for chunk in table_chunks(model, golden_limit):
        array[at:at + len(chunk)] = chunk
        at += len(chunk)
    return array, info


def mlp(model):
    """The FC layers of ``model`` as a float32 ``torch.nn.Sequential`` (module docstring):
    ``Linear`` layers holding the golden weights and biases times ``2**-shifts[l]``, each but
    the last followed by ``Hardtanh(0, 2**(act_bits[l+1]-1) - 1)``."""
    torch = _torch()
    last = len(model.layers) - 1
    modules = []
    for layer, (n_in, n_out) in enumerate(model.layer_shapes):
        w, b = golden.layer_params(model, layer)
        scale = 2.0 ** -model.shifts[layer] if layer < last else 1.0
        linear = torch.nn.Linear(n_in, n_out)
        with torch.no_grad():      # float64 products are exact; the copy rounds a bias once
            linear.weight.copy_(torch.from_numpy(w * scale))
            linear.bias.copy_(torch.from_numpy(b * scale))
        modules.append(linear)
        if layer < last:
            modules.append(torch.nn.Hardtanh(0.0, float((1 << (model.act_bits[layer + 1] - 1))
                                                        - 1)))
    return torch.nn.Sequential(*modules).eval().requires_grad_(False)


class CTRNet:
    """The recommendation model in PyTorch on the CPU (module docstring).

    Parameters
    ----------
    model : RecModel
    tables : ndarray
        The flat table buffer of :func:`table_storage` (in memory or memory-mapped; not
        copied).

    Members
    -------
    fc : torch.nn.Sequential
        The FC layers (:func:`mlp`).

    Call it with ``(indices, dense)``: ``(batch, tables)`` int64 indices (in range) and
    ``(batch, dense)`` float32 dense features; returns the ``(batch, layers[-1])`` float32
    outputs.
    """

    def __init__(self, model, tables):
        torch = _torch()
        self.model = model
        offsets = _offsets(model)
        if len(tables) != offsets[-1]:
            raise ValueError(f"table buffer of {len(tables)} elements, the model has "
                             f"{offsets[-1]}")
        with warnings.catch_warnings():    # a read-only memory map: torch only reads it
            warnings.filterwarnings("ignore", message=".*not writable.*")
            self._flat = torch.from_numpy(tables)
        table_of = np.repeat(np.arange(len(model.tables)), [t.dim for t in model.tables])
        dim = np.array([t.dim for t in model.tables], dtype=np.int64)[table_of]
        within = np.concatenate([np.arange(t.dim) for t in model.tables])
        # element index of column c of the embedding vector: idx[:, table] * dim + base
        self._table_of = torch.from_numpy(table_of)
        self._dim = torch.from_numpy(dim)
        self._base = torch.from_numpy(offsets[:-1][table_of] + within)
        self.fc = mlp(model)

    def embed(self, indices, dense):
        """The ``(batch, concat_len)`` float32 input of the FC layers: each table's row, in
        table order, then the dense features."""
        torch = _torch()
        where = indices.index_select(1, self._table_of).mul_(self._dim).add_(self._base)
        return torch.cat([self._flat.take(where).to(torch.float32), dense], dim=1)

    def layer_outputs(self, x):
        """The output of every FC layer (after its Hardtanh) for the FC input ``x``."""
        torch = _torch()
        outs = []
        for i, module in enumerate(self.fc):
            x = module(x)
            if isinstance(module, torch.nn.Hardtanh) or i == len(self.fc) - 1:
                outs.append(x)
        return outs

    def __call__(self, indices, dense):
        return self.fc(self.embed(indices, dense))


def random_batch(model, batch, rng):
    """``(indices, dense)`` of ``batch`` inferences drawn with the numpy Generator ``rng``:
    one index per table, uniform over its rows (int64), and dense features uniform over the
    signed ``elem_bits`` range (float32)."""
    rows = np.array([t.rows for t in model.tables], dtype=np.int64)
    indices = rng.integers(0, rows, size=(batch, len(rows)))
    lo, hi = golden.signed_range(model.elem_bits)
    dense = rng.integers(lo, hi, size=(batch, model.dense), endpoint=True).astype(np.float32)
    return indices, dense


def _faults():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return np.array([usage.ru_minflt, usage.ru_majflt])


def time_batches(net, batch, seconds, rng, min_repeats=MIN_REPEATS, warmup=WARMUP):
    """Time ``net``'s forward pass on fresh :func:`random_batch` batches (module docstring).

    Returns ``batch``, ``repeats``, ``median_s``, ``p10_s``, ``p90_s`` (seconds per batch),
    ``inferences_per_s`` (``batch / median_s``), ``lookup_share`` (the median time of the
    embedding lookups, :meth:`CTRNet.embed`, over the median batch time), and the page faults
    per inference while timing, ``minor_faults`` and ``major_faults`` (reads from the disk)."""
    torch = _torch()
    times, lookups, faults, runs = [], [], np.zeros(2), 0
    with torch.inference_mode():
        while len(times) < MAX_REPEATS and (len(times) < min_repeats or sum(times) < seconds):
            indices, dense = random_batch(net.model, batch, rng)
            indices, dense = torch.from_numpy(indices), torch.from_numpy(dense)
            before = _faults()
            start = time.perf_counter()
            x = net.embed(indices, dense)
            looked_up = time.perf_counter()
            net.fc(x)
            end = time.perf_counter()
            if runs >= warmup:
                times.append(end - start)
                lookups.append(looked_up - start)
                faults += _faults() - before
            runs += 1
    median = float(np.median(times))
    p10, p90 = (float(v) for v in np.percentile(times, [10, 90]))
    count = batch * len(times)
    return {"batch": batch, "repeats": len(times), "median_s": median, "p10_s": p10,
            "p90_s": p90, "inferences_per_s": batch / median,
            "lookup_share": float(np.median(lookups)) / median,
            "minor_faults": float(faults[0]) / count, "major_faults": float(faults[1]) / count}


def check_options(preset_name, batches, seconds, threads, tables):
    """ConfigError naming the option for a value ``hwgen bench recsys --cpu`` cannot use."""
    if preset_name not in PRESETS:
        raise ConfigError("cpu-preset", "unknown; choose one of: " + ", ".join(PRESETS),
                          value=preset_name)
    if not batches:
        raise ConfigError("batch", "needs at least one batch size")
    for b in batches:
        if isinstance(b, bool) or not isinstance(b, int) or not 1 <= b <= MAX_BATCH:
            raise ConfigError("batch", f"must be an integer in 1..{MAX_BATCH}", value=b)
    if not isinstance(seconds, (int, float)) or not 0 < seconds <= 600:
        raise ConfigError("cpu-seconds", "must be a number in (0, 600]", value=seconds)
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int)
                                or not 1 <= threads <= 256):
        raise ConfigError("threads", "must be an integer in 1..256", value=threads)
    _check_tables(tables)


def run_cpu_baseline(preset_name="paper-ctr", batches=DEFAULT_BATCHES, seconds=1.0,
                     threads=None, tables="auto", directory=None, seed=1,
                     log=lambda message: None):
    """Build ``preset_name`` in PyTorch and time it at each batch size (module docstring).

    ``threads``: PyTorch's intra-op threads for the run (default: its own, one per core;
    restored afterwards). Returns a JSON-ready dict: ``model``, ``machine``,
    ``load_average`` (1-minute, when the run started: other work on the machine slows it),
    ``framework``, ``threads``, ``tables`` (:func:`table_storage`'s description),
    ``numbers``, ``indices``, ``runs`` (one :func:`time_batches` result per batch size) and
    ``best`` (the run of the highest rate).
    """
    from ..flow.timing_table import machine
    check_options(preset_name, list(batches), seconds, threads, tables)
    torch = _torch()
    load = os.getloadavg()[0]
    model = preset(preset_name)
    array, info = table_storage(model, tables, directory, log=log)
    net = CTRNet(model, array)
    previous = torch.get_num_threads()
    try:
        if threads is not None:
            torch.set_num_threads(threads)
        runs = []
        for batch in batches:
            log(f"timing {model.name} on the CPU at batch {batch} ({seconds:g} s) ...")
            runs.append(time_batches(net, batch, seconds, np.random.default_rng([seed, batch])))
        used = torch.get_num_threads()
    finally:
        torch.set_num_threads(previous)
    return {"model": model.name, "machine": machine(), "load_average": load,
            "framework": f"PyTorch {torch.__version__}", "threads": used, "tables": info,
            "numbers": f"tables {info['dtype']} (the model's {model.elem_bits}-bit elements) "
                       "converted to float32 after the lookup; FC layers float32",
            "indices": f"uniform over each table's rows, one per table per inference, seed "
                       f"{seed}", "runs": runs,
            "best": max(runs, key=lambda r: r["inferences_per_s"])}


def threads_text(threads):
    """``"1 thread"``, ``"2 threads"``."""
    return f"{threads} thread" + ("s" if threads != 1 else "")


def report_lines(result):
    """The measurement in words: what ran where, then one line per batch size."""
    t = result["tables"]
    where = (f"memory-mapped from {t['path']} ({t['why']}; pages come from the page cache "
             "or the disk)" if t["mode"] == "mmap" else f"in memory ({t['why']})")
    size = f"{t['bytes'] / 1e9:.2f} GB" if t["bytes"] >= 1e8 else f"{t['bytes'] / 1e6:.2f} MB"
    lines = [f"CPU baseline measured here: {result['model']} in {result['framework']} on "
             f"{result['machine']} (load average {result['load_average']:.1f} when it "
             f"started), {threads_text(result['threads'])}; {result['numbers']}; {size} of "
             f"tables {where}"
             + (f", file written in {t['write_s']:.1f} s" if t["write_s"] else "")
             + f"; indices {result['indices']}"]
    for r in result["runs"]:
        lines.append(
            f"  batch {r['batch']}: {r['inferences_per_s']:,.0f} inferences/s; "
            f"{r['median_s'] * 1e3:.3f} ms per batch (median of {r['repeats']}, "
            f"p10-p90 {r['p10_s'] * 1e3:.3f}-{r['p90_s'] * 1e3:.3f} ms; embedding lookups "
            f"{100 * r['lookup_share']:.0f}% of it); page faults per inference "
            f"{r['minor_faults']:.1f} minor, {r['major_faults']:.2f} major (disk reads)")
    return lines
