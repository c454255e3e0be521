"""Integer arithmetic shared by configs, cycle models and gateware generators."""

__all__ = ["ceil_div"]


def ceil_div(a, b):
    """``ceil(a / b)`` for integers, ``b > 0``, exact for any size (no float)."""
    return -(-a // b)
