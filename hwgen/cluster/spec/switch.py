"""Configuration of the kernel switch (:class:`~hwgen.cluster.gateware.switch.KernelSwitch`) and
the packet filters' counters: typed routes (:class:`Route`), the drop kinds every filter counts
and their status port names."""

from dataclasses import dataclass

from ...config import Config, Record, param
from ...errors import ConfigError
from .packet import MALFORMED_KINDS

__all__ = ["SwitchConfig", "DROP_KINDS", "COUNTER_BITS", "status_name", "parse_routes", "Route"]


#: Kinds of dropped packets counted by :class:`PacketFilter`: the malformations of
#: :func:`~hwgen.cluster.spec.packet.classify`, then ``unknown`` (well-formed, destination not
#: configured).
DROP_KINDS = MALFORMED_KINDS + ("unknown",)
COUNTER_BITS = 32


def status_name(kind):
    """Output signal name of the drop counter of ``kind`` (``status_dropped_bad_keep``)."""
    return "status_dropped_" + kind.replace("-", "_")


@dataclass(frozen=True)
class Route(Record):
    """One entry of :attr:`SwitchConfig.routes`: packets for ``kernel`` leave on ``port``."""
    kernel: int
    port: int

    def check(self):
        if not all(isinstance(v, int) and not isinstance(v, bool)
                   for v in (self.kernel, self.port)):
            raise ValueError("kernel and port must be integers")
        if not 0 <= self.kernel < 256 or self.port < 0:
            raise ValueError("kernel ids are 0..255, ports from 0")


def parse_routes(text):
    """``"3:0,4:1"`` (the ``--set`` form) -> ``(Route(3, 0), Route(4, 1))``."""
    out = []
    for item in filter(None, (t.strip() for t in text.split(","))):
        key, sep, val = item.partition(":")
        if not sep:
            raise ValueError(f"{item!r} is not 'id:port'")
        out.append(Route(int(key, 0), int(val, 0)))
    return tuple(out)


@dataclass(frozen=True)
class SwitchConfig(Config):
    """Kernel switch parameters (ids are 8-bit TDEST values)."""
    data_bits: int = param(64, "TDATA width", choices=(64, 512))
    inputs: int = param(2, "packet input ports", lo=1, hi=64)
    outputs: int = param(2, "packet output ports", lo=1, hi=64)
    routes: tuple = param((), "kernel id -> output port, [{kernel, port}, ...] ('id:port,...' "
                              "with --set; default: id % outputs)", item=Route,
                          parse=parse_routes)
    drop_unmapped: bool = param(True, "consume packets whose TDEST is not in routes "
                                      "(False: they go to port 0)")

    def check(self):
        for k, route in enumerate(self.routes):
            if route.port >= self.outputs:
                raise ConfigError(f"routes[{k}]", f"ports are 0..{self.outputs - 1}",
                                  value=route.to_json())

    @property
    def route_map(self):
        """``{kernel id: output port}``: ``routes``, or ``id % outputs`` for every id 0..255
        when ``routes`` is empty."""
        return {r.kernel: r.port for r in self.routes} if self.routes else \
            {k: k % self.outputs for k in range(256)}
