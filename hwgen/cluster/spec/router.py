"""Configuration of ``cluster-router`` (:class:`~hwgen.cluster.gateware.router.Router`, which
describes the routing tables, the configuration stream and the timing): table sizes, widths and
the address space of the cluster's kernels."""

from dataclasses import dataclass

from ...config import Config, param
from ...errors import ConfigError

__all__ = ["RouterConfig"]


ADDR_BITS = 32


@dataclass(frozen=True)
class RouterConfig(Config):
    """Router parameters."""
    data_bits: int = param(64, "TDATA width", choices=(64, 512))
    members: int = param(8, "kernel table entries: kernel ids 0..members-1 of the cluster",
                         lo=1, hi=256)
    clusters: int = param(4, "cluster table entries: cluster ids 0..clusters-1", lo=1, hi=256)
    length: int = param(64, "longest packet payload in bytes (longer packets are dropped "
                            "as too-long)", lo=1, hi=65536)
    node_address: int = param(0x0A000001, "this FPGA's node address (10.0.0.1)",
                              lo=0, hi=(1 << ADDR_BITS) - 1)

    @property
    def max_beats(self):
        """Beats of the longest packet accepted (``length`` bytes at ``data_bits``); longer
        ones are dropped as too long."""
        return -(-self.length // (self.data_bits // 8))

    def check(self):
        if self.max_beats > 4096:
            raise ConfigError("length", "at most 4096 beats per packet", value=self.length)

    def derived(self):
        return {"max_beats": self.max_beats}
