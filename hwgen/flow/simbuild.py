"""A Verilated build of one accelerator configuration, as both simulation engines see it, and
the cocotb engine's build (:func:`build_sim`; the native one is :func:`hwgen.flow.native.build_native`)."""

from pathlib import Path

from .emit import emit_accelerator
from .ports import StreamFormat
from .tools import work_dir
from .verilator import verilate

__all__ = ["SimBuild", "build_sim"]


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


def build_sim(acc, config, *, waves=False, log=None):
    """Emit and Verilate ``config`` of accelerator ``acc`` (cached). Returns a :class:`SimBuild`."""
    work = work_dir(acc, config)
    v_path, ports = emit_accelerator(acc, config, work / "rtl")
    build_dir = work / ("build-waves" if waves else "build")
    cached, seconds = verilate(v_path, acc.top_name, build_dir, waves=waves, log=log)
    return SimBuild(build_dir, acc.top_name, ports, cached=cached, seconds=seconds)
