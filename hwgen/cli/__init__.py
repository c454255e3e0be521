"""The ``hwgen`` command line, one group per domain.

Flow verbs, the same for every registered accelerator (:mod:`.flow`): ``list``, ``config``,
``build``, ``sim``, ``synth``, ``timing``, ``sweep``, with ``bench`` (:mod:`.bench`) and
``dataset`` (:mod:`.dataset`). Domains: ``chamvs`` (:mod:`.chamvs`), ``recsys``
(:mod:`.recsys`), ``cluster`` (:mod:`.cluster`), ``windve`` (:mod:`.windve`), ``espn``
(:mod:`.espn`), ``ralm`` (:mod:`.ralm`). ``hwgen demo`` is ``hwgen chamvs demo``. Old spellings
stay as hidden aliases: ``serve`` (``windve``), ``partition``, ``size-queues``,
``recsys-cluster-sim``, and the renamed options of each command (docs/guides/commands.md: "Shared options").

Every command takes the accelerator's parameters from its defaults, then ``--config FILE.json``,
then ``--set key=value`` (repeatable). Invalid input is reported on one line naming the parameter
and its allowed range, with exit status 2; a simulation that disagrees with the golden model
exits with status 1 (:mod:`hwgen.cli_support`).

The commands import their domain's modules when they run, not here (measured on this 2-core
machine: ``hwgen --help`` starts in 0.2 s, most of it numpy for the node server's defaults;
torch alone, for WindVE, ESPN and ChamLM, takes 1.7 s to import).
"""

import sys

import click

from ..cli_support import DEBUG as _DEBUG
from ..cli_support import _fail, _report
from . import bench, chamvs, cluster, dataset, espn, flow, ralm, recsys, windve
from .common import alias_command

__all__ = ["main"]


class _Main(click.Group):
    """The ``hwgen`` group: click's own usage errors also become one line."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True,
             **extra):
        try:
            rv = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except click.exceptions.ClickException as e:
            hint = ""
            if isinstance(e, click.UsageError) and e.ctx is not None:
                hint = f" (see `{e.ctx.command_path} --help`)"
            _fail(" ".join(e.format_message().split()) + hint, e.exit_code)
        except click.exceptions.Abort:
            _fail("aborted", 1)
        except (click.exceptions.Exit, SystemExit):
            raise
        except Exception as e:      # raised while parsing (e.g. loading a model's options)
            if _DEBUG["on"]:
                raise
            _report(e)
        if standalone_mode:
            sys.exit(rv if isinstance(rv, int) else 0)
        return rv


@click.group(cls=_Main, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="hwgen")
@click.option("--debug", is_flag=True, help="Show tracebacks instead of one-line errors "
              "(also HWGEN_DEBUG=1).")
def main(debug):
    """hwgen: generate, simulate and size data-centre ML accelerators.

    Flow verbs work on any accelerator of `hwgen list`; the domain groups (chamvs, recsys,
    cluster, windve, espn, ralm) hold each domain's services, planners and benchmarks."""
    if debug:
        _DEBUG["on"] = True


for _command in flow.COMMANDS:
    main.add_command(_command)
main.add_command(bench.bench)
main.add_command(dataset.dataset)
main.add_command(chamvs.demo)              # `make demo`: the main job, kept at the top
for _group in (chamvs.chamvs, recsys.recsys, cluster.cluster, windve.windve, espn.espn,
               ralm.ralm):
    main.add_command(_group)

# Old spellings, hidden from --help but still working.
main.add_command(alias_command(windve.windve), "serve")
main.add_command(alias_command(recsys.partition), "partition")
main.add_command(alias_command(recsys.cluster_sim), "recsys-cluster-sim")
main.add_command(alias_command(chamvs.size_queues), "size-queues")
