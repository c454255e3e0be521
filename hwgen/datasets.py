"""Real vector data sets available offline.

``digits``: the UCI optical handwritten digits (1,797 images of 8 x 8 pixels, values 0..16),
shipped inside scikit-learn (no download). Scaled to signed 8-bit integers as
``pixel * 15 - 120`` (range -120..120).
"""

import numpy as np

from .errors import ToolError

__all__ = ["digits", "replicated", "widened", "SYN_DIMS"]

#: The paper's synthetic data sets: SIFT vectors widened to the transformers' dimensions.
SYN_DIMS = {"syn-512": 512, "syn-1024": 1024}


def digits():
    """(1797, 64) int64 vectors in -120..120 and their (1797,) labels."""
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        raise ToolError("the digits data set needs scikit-learn (make setup installs it)") \
            from None
    d = load_digits()
    return d.data.astype(np.int64) * 15 - 120, d.target.astype(np.int64)


def replicated(x, times, noise=3, seed=0, elem_bits=8):
    """``times`` copies of ``x`` with uniform integer noise in ``-noise..noise`` per component,
    clipped to signed ``elem_bits``: a larger data set with the structure of a real one (the
    Chameleon paper builds SYN-512/1024 by replicating SIFT vectors the same way)."""
    rng = np.random.default_rng(seed)
    top = (1 << (elem_bits - 1)) - 1
    out = np.concatenate([x + rng.integers(-noise, noise, size=x.shape, endpoint=True)
                          for _ in range(times)])
    return np.clip(out, -top - 1, top).astype(np.int64)


def widened(x, dim):
    """Each vector of ``x`` widened to ``dim`` components by replication, as the Chameleon
    paper builds SYN-512 and SYN-1024 from SIFT (``[v, v, v, v]`` for 128 -> 512): whole
    copies, then the first ``dim mod D`` components once more where ``D`` does not divide
    ``dim``. Distances scale with the copies, so neighbours are those of ``x`` (exactly so when
    ``D`` divides ``dim``)."""
    x = np.asarray(x)
    if x.ndim != 2 or x.shape[1] < 1:
        raise ValueError("widened() needs a 2-D array of vectors")
    if dim < x.shape[1]:
        raise ValueError(f"cannot widen {x.shape[1]}-d vectors to {dim}: replication only "
                         "adds components")
    return np.tile(x, (1, -(-dim // x.shape[1])))[:, :dim]
