"""The simulation engines behind ``hwgen sim --engine``: one interface, two implementations.

An engine builds a configuration (``build(acc, config) -> SimBuild``, cached per Verilog text)
and runs a job on that build (``run(acc, build, job, run_dir) -> (result, seconds)``); both
take the job of :mod:`hwgen.flow.scoreboard` and return the same result fields, so
:func:`hwgen.flow.simulate.simulate` never asks which engine it has.

- ``cocotb``: the accelerator's cocotb testbench (``acc.testbench``, cocotbext-axi sources,
  sinks and AXI memories) on a Verilator build with VPI; every model.
- ``native``: a C++ testbench generated from ``ports.json`` (:mod:`hwgen.flow.native`), about
  100 times faster; stream tops with AXI4 read memories.
"""

from ..errors import ConfigError
from .native import build_native, run_native
from .simbuild import build_sim
from .verilator import run_testbench

__all__ = ["ENGINES", "CocotbEngine", "NativeEngine", "get_engine"]


class CocotbEngine:
    """cocotb on Verilator: ``acc.testbench`` drives the top through VPI."""
    name = "cocotb"
    run_prefix = ""                       # run folders keep the bare name

    def build(self, acc, config, *, waves=False, log=None):
        """Emit and Verilate ``config`` with VPI (cached); a
        :class:`~hwgen.flow.simbuild.SimBuild`."""
        return build_sim(acc, config, waves=waves, log=log)

    def run(self, acc, build, job, run_dir, *, seed, waves=False, progress_label=None):
        """Run ``job`` with ``acc.testbench`` on ``build`` in ``run_dir``; ``(result, seconds)``."""
        return run_testbench(acc.testbench, build.top, build.directory, run_dir, job,
                             seed=seed, waves=waves, progress_label=progress_label)


class NativeEngine:
    """The generated C++ testbench (the job's own seed drives its stalls)."""
    name = "native"
    run_prefix = "native-"

    def build(self, acc, config, *, waves=False, log=None):
        """Emit ``config`` and compile it with the generated C++ testbench (cached); a
        :class:`~hwgen.flow.native.NativeBuild` (``waves``: a separate ``--trace`` build)."""
        return build_native(acc, config, waves=waves, log=log)

    def run(self, acc, build, job, run_dir, *, seed, waves=False, progress_label=None):
        """Run ``job`` on the ``build`` executable in ``run_dir``; ``(result, seconds)``. ``seed``
        and ``waves`` are unused: the job carries its own seed and waves are chosen at build time.
        """
        return run_native(build, job, run_dir, progress_label=progress_label)


#: Every engine by name (``hwgen sim --engine`` and sweep specs accept these names).
ENGINES = {e.name: e for e in (CocotbEngine(), NativeEngine())}


def get_engine(name, param="engine"):
    """The engine called ``name``; a :class:`ConfigError` naming ``param`` otherwise."""
    try:
        return ENGINES[name]
    except (KeyError, TypeError):
        raise ConfigError(param, "must be one of " + ", ".join(ENGINES), value=name) from None
