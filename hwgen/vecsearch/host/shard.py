"""ChamVS node shards on disk: a format that cannot run code, and the command that makes them.

A shard file is an uncompressed ``.npz`` archive (read with ``np.load(..., allow_pickle=False)``,
so loading one never executes anything) holding:

``meta``
    ``uint8`` bytes of a UTF-8 JSON object: ``{"format": "hwgen-chamvs-shard", "version": 1,
    "config": {...node configuration...}, ...}``; :func:`make_shards` adds ``node``, ``nodes``,
    ``scheme``, ``vectors`` and ``scale`` (the float -> integer factor to apply to queries);
``coarse``
    ``int64 (nlist, dim)``: the IVF centroids (every node holds all of them);
``pq_centroids``
    ``int64 (m, 256, dim / m)``;
``codes``
    ``uint8 (n, m)``: the PQ codes of every list this node holds, list after list;
``ids``
    ``int64 (n,)``: their vector ids;
``offsets``
    ``int64 (nlist + 1,)``: list ``l`` is ``codes[offsets[l]:offsets[l + 1]]``.

:func:`load_shard` checks every key, dtype, shape and range and reports any problem as one
:class:`~hwgen.errors.ConfigError` line naming the file.
"""

import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np

from ... import checks
from ...errors import ConfigError

__all__ = ["save_shard", "load_shard", "shard_metadata", "make_shards", "SHARD_FORMAT"]

SHARD_FORMAT = "hwgen-chamvs-shard"
SHARD_VERSION = 1
_KEYS = ("meta", "coarse", "pq_centroids", "codes", "ids", "offsets")
_KSUB = 256


def _concat(list_codes, list_ids, m):
    sizes = [len(i) for i in list_ids]
    offsets = np.zeros(len(sizes) + 1, dtype=np.int64)
    np.cumsum(sizes, out=offsets[1:])
    codes = np.concatenate([np.asarray(c, dtype=np.uint8).reshape(-1, m) for c in list_codes]) \
        if list_codes else np.zeros((0, m), np.uint8)
    ids = np.concatenate([np.asarray(i, dtype=np.int64).reshape(-1) for i in list_ids]) \
        if list_ids else np.zeros(0, np.int64)
    return codes, ids, offsets


def save_shard(path, config, shard, **meta):
    """Write a node's configuration and shard (:class:`~hwgen.vecsearch.node_model.Shard`) to
    ``path`` as an ``.npz`` (the name is used as given). ``meta``: extra JSON-able facts kept
    beside the configuration (see :func:`shard_metadata`)."""
    path = Path(path)
    if len(shard.list_codes) != len(shard.list_ids):
        raise ConfigError("shard", "list_codes and list_ids differ in length")
    codes, ids, offsets = _concat(shard.list_codes, shard.list_ids, config.m)
    info = {"format": SHARD_FORMAT, "version": SHARD_VERSION, **meta,
            "config": config.to_dict()}
    arrays = {"meta": np.frombuffer(json.dumps(info).encode(), dtype=np.uint8),
              "coarse": np.asarray(shard.coarse, dtype=np.int64),
              "pq_centroids": np.asarray(shard.pq_centroids, dtype=np.int64),
              "codes": codes, "ids": ids, "offsets": offsets}
    # write beside the target, then rename: a reader never sees half a shard
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent or ".")
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **arrays)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return path


def _one_line(e):
    return " ".join(f"{type(e).__name__}: {e}".split())


def _read(path):
    """The arrays of a shard file, or ConfigError."""
    def bad(message):
        return ConfigError("shard", message, value=str(path))

    try:
        f = open(path, "rb")
    except OSError as e:
        raise bad(f"cannot read: {e.strerror or e}") from None
    with f:
        head = f.read(4)
        if head[:1] == b"\x80":
            raise bad("is a pickle file; pickled shards are not loaded (they can run code): "
                      "remake it with `hwgen chamvs shard`") from None
        if head != b"PK\x03\x04":
            raise bad("not an .npz shard (write one with save_shard or `hwgen chamvs shard`)")
        f.seek(0)
        try:
            with np.load(f, allow_pickle=False) as npz:
                missing = [k for k in _KEYS if k not in npz.files]
                if missing:
                    raise bad("not a ChamVS shard: missing " + ", ".join(missing))
                return {k: npz[k] for k in _KEYS}
        except ConfigError:
            raise
        except Exception as e:       # BadZipFile, ValueError (object arrays), EOFError, ...
            raise bad(f"cannot read as .npz: {_one_line(e)}") from None


def _meta(path, raw):
    def bad(message):
        return ConfigError("shard", message, value=str(path))

    if raw.dtype != np.uint8 or raw.ndim != 1:
        raise bad("meta must be 1-D uint8 JSON bytes")
    try:
        info = json.loads(raw.tobytes().decode("utf-8"))
    except (ValueError, RecursionError) as e:
        raise bad(f"meta is not UTF-8 JSON: {_one_line(e)}") from None
    if not isinstance(info, dict) or info.get("format") != SHARD_FORMAT:
        raise bad(f"meta is not a {SHARD_FORMAT} header")
    if info.get("version") != SHARD_VERSION:
        raise bad(f"shard format version {info.get('version')!r}, this hwgen reads "
                  f"{SHARD_VERSION}")
    if not isinstance(info.get("config"), dict):
        raise bad("meta holds no node configuration")
    return info


def shard_metadata(path):
    """The JSON header of a shard file (``config`` and whatever :func:`make_shards` noted)."""
    return _meta(path, _read(path)["meta"])


def load_shard(path):
    """``(ChamVSNodeConfig, Shard)`` from a file written by :func:`save_shard`; every problem
    (missing file, not an npz, pickle, missing keys, wrong dtypes, shapes or ranges) is one
    :class:`~hwgen.errors.ConfigError` line naming the file."""
    from ..node import ChamVSNodeConfig
    from ..node_model import Shard

    def bad(message):
        return ConfigError("shard", message, value=str(path))

    a = _read(path)
    info = _meta(path, a["meta"])
    try:
        config = ChamVSNodeConfig.from_dict(info["config"])
    except (ValueError, TypeError) as e:
        raise bad(f"bad node configuration: {_one_line(e)}") from None
    c = config

    def ints(name, shape):
        x = a[name]
        if x.dtype.kind not in "iu":
            raise bad(f"{name} must hold integers, not {x.dtype}")
        if x.shape != shape:
            raise bad(f"{name} has shape {x.shape}, expected {shape}")
        return x

    coarse = ints("coarse", (c.nlist, c.dim))
    pq = ints("pq_centroids", (c.m, _KSUB, c.dim // c.m))
    offsets = ints("offsets", (c.nlist + 1,))
    total = int(offsets[-1]) if offsets.size else 0
    if a["codes"].dtype != np.uint8:
        raise bad(f"codes must be uint8, not {a['codes'].dtype}")
    codes = ints("codes", (total, c.m))
    ids = ints("ids", (total,))
    if offsets[0] != 0 or np.any(np.diff(offsets) < 0):
        raise bad("offsets must start at 0 and never decrease")
    lo, hi = -(1 << (c.elem_bits - 1)), (1 << (c.elem_bits - 1)) - 1
    if coarse.size and (coarse.min() < lo or coarse.max() > hi):
        raise bad(f"coarse centroids outside the signed {c.elem_bits}-bit range")
    top = 1 << c.elem_bits
    if pq.size and (pq.min() < -top or pq.max() > top - 1):
        raise bad(f"PQ centroids outside -{top}..{top - 1}")
    if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= (1 << c.id_bits)):
        raise bad(f"ids must be in 0..2**{c.id_bits}-1")
    coarse, pq, ids = (x.astype(np.int64) for x in (coarse, pq, ids))
    bounds = offsets.tolist()
    list_codes = [codes[s:e] for s, e in zip(bounds, bounds[1:])]
    list_ids = [ids[s:e] for s, e in zip(bounds, bounds[1:])]
    return config, Shard(coarse, pq, list_codes, list_ids)


def make_shards(config, base_vectors, nodes, scheme, out_dir, log=None):
    """Train the node's integer IVF-PQ index on ``base_vectors`` and write one shard per node.

    Parameters
    ----------
    config : ChamVSNodeConfig
        The configuration every node runs (``dim``, ``nlist``, ``m``, ``elem_bits``, ...).
    base_vectors : path of an ``.npy`` file, or an array
        ``(n, dim)`` vectors: floats are quantised to ``elem_bits`` with one scale (recorded in
        each shard's metadata as ``scale``: multiply queries by it), integers are used as they
        are. At least ``max(256, nlist)`` vectors are needed to train 8-bit PQ.
    nodes : int
        Number of memory nodes (>= 1).
    scheme : ``"split-lists"`` or ``"whole-lists"``
        (:func:`hwgen.vecsearch.host.coordinator.shard_lists`)
    out_dir : directory (created if missing) receiving ``node0.npz`` ... ``node{N-1}.npz``
    log : callable taking one line of text, optional

    Returns the list of written paths. The index is trained exactly as ``hwgen sim chamvs-node
    --base`` does (:func:`hwgen.vecsearch.node_model.prepare`).
    """
    from ..node import ChamVSNodeConfig
    from ..node_model import Shard, load_vectors, prepare
    from .coordinator import SCHEMES, shard_lists

    say = log or (lambda line: None)
    if not isinstance(config, ChamVSNodeConfig):
        raise ConfigError("config", "must be a ChamVSNodeConfig", value=type(config).__name__)
    if isinstance(nodes, bool) or not isinstance(nodes, (int, np.integer)) or nodes < 1:
        raise ConfigError("nodes", "must be an integer >= 1", value=nodes)
    nodes = int(nodes)
    if scheme not in SCHEMES:
        raise ConfigError("scheme", "must be one of " + ", ".join(SCHEMES), value=scheme)
    if isinstance(base_vectors, (str, os.PathLike)):
        base = load_vectors(str(base_vectors), "base")
    else:
        base = np.asarray(base_vectors)
        if base.ndim != 2 or base.dtype.kind not in "fiu":
            raise ConfigError("base", f"must be a 2-D float array, got {base.dtype} of shape "
                              f"{base.shape}")
        if base.dtype.kind == "f" and not np.all(np.isfinite(base)):
            raise ConfigError("base", "holds NaN or infinite values")
    n, dim = base.shape
    if dim != config.dim:
        raise ConfigError("dim", f"must equal the base vectors' dimension {dim}",
                          value=config.dim)
    need = max(_KSUB, config.nlist)
    if n < need:
        raise ConfigError("base", f"has {n} vectors; at least {need} are needed (256 to train "
                          f"8-bit PQ, nlist={config.nlist} lists)", value=n)
    out = checks.output_dir("out", out_dir)

    start = time.monotonic()
    # prepare() trains, quantises and checks the segment size exactly as the simulation does;
    # a float base needs a query pool, so hand it one base vector (its queries are unused)
    data = prepare(config, base=base, queries=base[:1], count=1)
    index = data.index
    say(f"trained IVF-PQ on {n} vectors (dim={dim}, nlist={config.nlist}, m={config.m}, "
        f"scale={data.scale:g}) in {time.monotonic() - start:.1f} s")
    paths = []
    for node, (codes, ids) in enumerate(shard_lists(index.list_codes, index.list_ids, nodes,
                                                    scheme)):
        path = out / f"node{node}.npz"
        held = sum(len(i) for i in ids)
        try:
            save_shard(path, config, Shard(index.coarse, index.pq_centroids, codes, ids),
                       node=node, nodes=nodes, scheme=scheme, vectors=held,
                       scale=float(data.scale))
        except OSError as e:
            raise ConfigError("out_dir", f"cannot write {path.name}: {e.strerror or e}",
                              value=str(out)) from None
        say(f"wrote {path} ({held} vectors)")
        paths.append(path)
    return paths
