"""Real vector data sets available offline.

``digits``: the UCI optical handwritten digits (1,797 images of 8 x 8 pixels, values 0..16),
shipped inside scikit-learn (no download). Scaled to signed 8-bit integers as
``pixel * 15 - 120`` (range -120..120).
"""

import numpy as np

from .errors import ToolError

__all__ = ["digits"]


def digits():
    """(1797, 64) int64 vectors in -120..120 and their (1797,) labels."""
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        raise ToolError("the digits data set needs scikit-learn (make setup installs it)") \
            from None
    d = load_digits()
    return d.data.astype(np.int64) * 15 - 120, d.target.astype(np.int64)
