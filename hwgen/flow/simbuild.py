"""A Verilated build of one accelerator configuration, as both simulation engines see it (the
cocotb build of :mod:`hwgen.flow.simulate` and the native one of :mod:`hwgen.flow.native`)."""

from pathlib import Path

from .ports import StreamFormat

__all__ = ["SimBuild"]


class SimBuild:
    """A Verilated build of one configuration: its directory, top name and ports."""

    def __init__(self, directory, top, ports, cached, seconds):
        self.directory = Path(directory)
        self.top = top
        self.ports = ports
        self.cached = cached
        self.seconds = seconds

    def stream_formats(self):
        """``{member name: (port prefix, direction, StreamFormat)}``."""
        return {s["member"]: (s["port"], s["direction"], StreamFormat.from_dict(s))
                for s in self.ports["streams"]}
