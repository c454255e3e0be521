"""Configuration of ``gmi-header`` (:class:`~hwgen.cluster.gateware.header.GMIHeader`):
the packet width and ids of the one-byte GMI header's attacher and stripper."""

from dataclasses import dataclass

from ...config import Config, param

__all__ = ["HeaderConfig"]


@dataclass(frozen=True)
class HeaderConfig(Config):
    """``gmi-header``: a header attacher and, behind it, a stripper (round trip visible)."""
    data_bits: int = param(64, "TDATA width", choices=(64, 512))
    members: int = param(4, "destination kernel ids used by the stimulus (1..members)",
                         lo=1, hi=255)
    length: int = param(16, "longest payload in bytes of the stimulus", lo=1, hi=4096)
    dest_cluster: int = param(1, "destination cluster id (TDEST of attached packets)",
                              lo=0, hi=255)
    cluster_id: int = param(0, "this cluster's id (TUSER bits 15:8)", lo=0, hi=255)
