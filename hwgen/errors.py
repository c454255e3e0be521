"""Errors a user of hwgen can hit.

Every error that reaches the command line is one of these; the CLI prints its message on one
line and exits non-zero, never with a traceback.
"""


class HwgenError(Exception):
    """Base class of the errors hwgen reports to a user."""


class ConfigError(HwgenError, ValueError):
    """An invalid configuration value.

    The message names the parameter, the offending value and the allowed range, e.g.
    ``m=0: must be an integer in 1..64``. The parts stay apart: ``param`` (where: a parameter
    name or a path such as ``clusters[0].fpgas[2].ip``), ``value`` (or None) and ``reason``
    (the message without the ``param=value: `` prefix).
    """

    def __init__(self, param, message, value=None):
        param = str(param)
        if not param or not param.isprintable():     # one line, never an empty name
            param = repr(param)
        self.param = param
        self.value = value
        self.reason = " ".join(str(message).split("\n"))
        text = f"{param}={value!r}: {self.reason}" if value is not None \
            else f"{param}: {self.reason}"
        super().__init__(text)

    def relocated(self, prefix):
        """The same error located inside ``prefix``: at ``<prefix>.<param>`` (e.g. a kernel
        parameter's error placed in a description by the path of its ``params`` object)."""
        return ConfigError(f"{prefix}.{self.param}", self.reason, value=self.value)


class ToolError(HwgenError):
    """A required external tool (Verilator, yosys, faiss, ...) is missing or failed."""


class SimulationMismatch(HwgenError):
    """Simulated hardware disagreed with the golden model."""
