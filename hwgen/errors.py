"""Errors a user of hwgen can hit.

Every error that reaches the command line is one of these; the CLI prints its message on one
line and exits non-zero, never with a traceback.
"""


class HwgenError(Exception):
    """Base class of the errors hwgen reports to a user."""


class ConfigError(HwgenError, ValueError):
    """An invalid configuration value.

    The message names the parameter, the offending value and the allowed range, e.g.
    ``m=0: must be an integer in 1..64``.
    """

    def __init__(self, param, message, value=None):
        param = str(param)
        if not param or not param.isprintable():     # one line, never an empty name
            param = repr(param)
        message = " ".join(str(message).split("\n"))
        self.param = param
        self.value = value
        text = f"{param}={value!r}: {message}" if value is not None else f"{param}: {message}"
        super().__init__(text)


class ToolError(HwgenError):
    """A required external tool (Verilator, yosys, faiss, ...) is missing or failed."""


class SimulationMismatch(HwgenError):
    """Simulated hardware disagreed with the golden model."""
