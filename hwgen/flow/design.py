"""What the flow emits and synthesises: a :class:`Design`.

A registered accelerator at a configuration is one (:meth:`Design.of`); so is a part of a larger
top that has no configuration class of its own (the cluster builder's shell and packet buffers,
:mod:`hwgen.cluster.run.builder`), which the flow then emits, caches and synthesises the same way.
"""

import functools
from dataclasses import dataclass, field
from typing import Callable

from .tools import cache_dir

__all__ = ["Design"]


@dataclass(frozen=True)
class Design:
    """One top to emit (:func:`hwgen.flow.emit.cached_design`) and synthesise
    (:func:`hwgen.flow.synth.synthesize_design`).

    ``name`` names the work folder (``<cache>/<name>-<key>``) and log lines, ``top_name`` the
    Verilog module, ``key`` identifies the configuration (a configuration's ``digest()``),
    ``build()`` returns the Amaranth core and ``describe()`` the JSON-ready ``{"config",
    "derived"}`` the reports carry (called only when a report is written).
    """
    name: str
    top_name: str
    key: str
    build: Callable = field(compare=False)
    describe: Callable = field(default=lambda: {"config": {}, "derived": {}}, compare=False)

    @classmethod
    def of(cls, acc, config):
        """The design of registered accelerator ``acc`` at ``config``."""
        return cls(acc.name, acc.top_name, config.digest(),
                   functools.partial(acc.build_core, config),
                   lambda: {"config": config.to_dict(), "derived": config.derived()})

    @property
    def work_dir(self):
        """``<cache>/<name>-<key>``: the folder of this configuration's builds and results."""
        return cache_dir() / f"{self.name}-{self.key}"
