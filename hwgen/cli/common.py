"""What the groups of the ``hwgen`` command line share: loading a board and a configuration,
the ``--set``/``--config`` options, JSON output, and the hidden aliases that keep old spellings
working (the error reporter and the logger are :mod:`hwgen.cli_support`'s)."""

import copy
import json
import sys
from pathlib import Path

import click

from .. import checks, registry
from ..boards import load_board

__all__ = ["board", "config", "write_json", "seed", "progress", "with_config_options",
           "k_option", "alias_option", "alias_command"]


def board(name):
    """The board called ``name`` (None for None)."""
    return None if name is None else load_board(name)


def config(name, sets, config_file, board_obj):
    """``(accelerator, configuration)`` from defaults, ``--config`` and ``--set``."""
    acc = registry.get(name)
    return acc, acc.make_config(sets, config_file, board_obj)


def write_json(path, data):
    """Write ``data`` as indented JSON, creating the folder."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(data, indent=2) + "\n")


def seed(value):
    """Check a ``--seed``."""
    return checks.at_least("seed", value, 0, checks.SEED_MAX)


def progress():
    """Whether long runs draw a progress line (only on a terminal)."""
    return sys.stderr.isatty()


_CONFIG_OPTIONS = [
    click.option("--set", "sets", multiple=True, metavar="KEY=VALUE",
                 help="Override one parameter (repeatable)."),
    click.option("--config", "config_file", type=click.Path(dir_okay=False),
                 help="JSON file of parameters."),
]


def with_config_options(fn):
    """``--set KEY=VALUE`` (repeatable) and ``--config FILE``."""
    for option in reversed(_CONFIG_OPTIONS):
        fn = option(fn)
    return fn


def k_option(default, help):
    """``-k``/``--k``: results (neighbours) per query, spelt both ways in every command."""
    return click.option("-k", "--k", "k", type=int, default=default, show_default=True,
                        help=help)


def alias_option(flag, dest, **kwargs):
    """A hidden option: ``flag``, the old spelling of the option stored as ``dest``. click gives
    the slot to the option given on the command line, so the visible option's default does
    not override the old spelling."""
    return click.option(flag, dest, hidden=True, **kwargs)


def named_command(command, name):
    """``command`` under a second, visible name (``hwgen chamvs bench`` = ``hwgen bench
    chamvs``): a shallow copy named ``name``, so its usage line and the command reference
    (which names a command by its own name) show the path it was called by."""
    named = copy.copy(command)
    named.name = name
    return named


def alias_command(command):
    """``command`` under a second, hidden name (an old spelling): a shallow copy, so the
    visible command keeps showing in help."""
    hidden = copy.copy(command)
    hidden.hidden = True
    return hidden
