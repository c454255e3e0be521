"""Constants of a real, calibrated model for the I-BERT kernels, read from ``.npz`` files.

A kernel's configuration names a file (e.g. ``LinearConfig.weights``) written by
:func:`hwgen.ibert.minilm.export` or by hand with ``numpy.savez``; these helpers read its arrays
and check them, raising :class:`~hwgen.errors.ConfigError` naming the configuration parameter
with the reason (unreadable file, missing array, wrong shape, non-integer or out-of-range
values), so a bad file never reaches elaboration.
"""

import hashlib
import zipfile
from pathlib import Path

import numpy as np

from ..errors import ConfigError

__all__ = ["load_arrays", "int_array", "float_array", "scale_vector", "with_file_digest"]


def load_arrays(field, path, names, optional=()):
    """``{name: array}`` of the arrays ``names`` in the ``.npz`` file ``path`` (no pickles),
    and of those of ``optional`` that the file holds."""
    try:
        npz = np.load(path, allow_pickle=False)
        if not isinstance(npz, np.lib.npyio.NpzFile):
            raise ConfigError(field, "must name an .npz file (numpy.savez), not a single "
                              ".npy array", value=path)
        with npz:
            missing = [n for n in names if n not in npz.files]
            if missing:
                raise ConfigError(field, f"the file has no array {', '.join(missing)} (it "
                                  f"holds: {', '.join(npz.files) or 'nothing'})", value=path)
            return {n: npz[n] for n in (*names, *optional) if n in npz.files}
    except ConfigError:
        raise
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:
        reason = " ".join(str(e).split()) or type(e).__name__
        raise ConfigError(field, f"cannot read the .npz file: {reason}", value=path) from None


def _check_shape(field, path, name, a, shape):
    if a.shape != tuple(shape):
        want = " x ".join(map(str, shape)) if len(shape) > 1 else f"a vector of {shape[0]}"
        got = " x ".join(map(str, a.shape)) or "a scalar"
        raise ConfigError(field, f"array {name} must be {want}, not {got}", value=path)


def int_array(field, path, name, a, shape, lo, hi):
    """``a`` as int64 after checking its shape, integer dtype and range ``lo .. hi``."""
    _check_shape(field, path, name, a, shape)
    if a.dtype.kind not in "iub":
        raise ConfigError(field, f"array {name} must hold integers, not {a.dtype}", value=path)
    a = a.astype(np.int64)
    if a.size and (a.min() < lo or a.max() > hi):
        bad = int(a.min()) if a.min() < lo else int(a.max())
        raise ConfigError(field, f"array {name} must lie in {lo}..{hi} (it holds {bad})",
                          value=path)
    return a


def float_array(field, path, name, a, shape, positive=False):
    """``a`` as float32 after checking its shape, numeric dtype, finiteness (and sign)."""
    _check_shape(field, path, name, a, shape)
    if a.dtype.kind not in "iuf":
        raise ConfigError(field, f"array {name} must hold numbers, not {a.dtype}", value=path)
    a = a.astype(np.float32)
    if not np.isfinite(a).all():
        raise ConfigError(field, f"array {name} must be finite in float32", value=path)
    if positive and a.size and a.min() <= 0:
        raise ConfigError(field, f"array {name} must be positive (it holds {a.min():g})",
                          value=path)
    return a


def scale_vector(field, path, names, length):
    """The float32 vector of ``length`` positive scales in the ``.npz`` file ``path``: its
    first array of ``names`` (alternative names, e.g. the configuration's and the one
    :func:`hwgen.ibert.minilm.export` writes)."""
    a = load_arrays(field, path, (), optional=names)
    if not a:
        raise ConfigError(field, f"the file holds neither {' nor '.join(names)}", value=path)
    name = next(n for n in names if n in a)
    return float_array(field, path, name, a[name], (length,), positive=True)


def with_file_digest(digest, *paths):
    """A configuration's ``digest`` extended with the contents of its parameter files (so that
    build caches follow a file rewritten in place); unchanged when every path is empty."""
    paths = [p for p in paths if p]
    if not paths:
        return digest
    h = hashlib.sha256(digest.encode())
    for p in paths:
        h.update(Path(p).read_bytes())
    return h.hexdigest()[:12]
