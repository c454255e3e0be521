"""The written contract between an accelerator's golden model and the simulation flow.

Every registered accelerator names a *stream model* (``Accelerator.model_path``): a class, used
without instances, that derives from :class:`StreamModel`. The flow (``hwgen sim`` with either
engine, the Vitis kernel simulation, the sweeps, ``hwgen build``'s self-test) calls only the
hooks below; optional hooks have defaults here, so no caller asks ``hasattr``.

Required (a model that leaves one out fails ``tests/test_model_contract.py``):

``result_port``
    Output stream member whose beats are the results (``results_per_cycle`` and the latency
    are measured on it).
``stimulus(config, items, rng, **options)``
    A seeded random workload of ``items`` items (the unit is the accelerator's: codes, rows,
    queries, packets) in whatever structure the other hooks understand. ``options`` are the
    keywords the model's :attr:`~StreamModel.sim_options` route to it.
``inputs(config, stim)``
    ``{input member: [beat, ...]}``; a beat is a dict of the stream's payload fields (lists for
    array fields) plus ``last`` where the stream has TLAST and sideband values by their
    :data:`hwgen.flow.ports.SIDEBANDS` names.
``expect(config, stim)``
    ``{output member: [beat, ...]}``, the golden model's beats in the same form, one entry per
    output member of the top (an output the host does not check still needs its beats).

Optional (defaults in :class:`StreamModel`): :attr:`~StreamModel.latency_from`,
:attr:`~StreamModel.sample_signals`, :attr:`~StreamModel.sim_options`,
:attr:`~StreamModel.memory_trial`, :meth:`~StreamModel.memories`,
:meth:`~StreamModel.cycles_bound`, :meth:`~StreamModel.report`,
:meth:`~StreamModel.report_lines`, :meth:`~StreamModel.sim_sets`.

The configuration answers the questions every tool asks of any accelerator (see
:mod:`hwgen.contract`): ``config.workload(...)``, ``config.performance(workload)``,
``config.memory_banks()``; :func:`hwgen.flow.resources.estimate` counts its resources.
"""

from dataclasses import dataclass

__all__ = ["SimOption", "StreamModel", "REQUIRED_HOOKS"]

#: Hooks every model must define itself.
REQUIRED_HOOKS = ("stimulus", "inputs", "expect")


@dataclass(frozen=True)
class SimOption:
    """One ``hwgen sim`` option that a model declares for itself.

    ``name`` is the Python name (``queries_count``); the flag is ``--queries-count``.
    ``kind`` is ``int`` or ``"path"`` (a file that must exist). ``route`` says where the value
    goes: ``"stimulus"`` (a keyword argument of the model's ``stimulus``), ``"set"`` (the
    configuration parameter of the same name, as ``--set NAME=VALUE``) or ``"items"`` (another
    name for ``--items``). Integer options below ``minimum`` are refused naming the option.
    """
    name: str
    help: str
    kind: object = int
    route: str = "stimulus"
    minimum: int = 1

    @property
    def flag(self):
        """The command-line flag: ``--`` and the name with ``-`` for ``_``."""
        return "--" + self.name.replace("_", "-")


class StreamModel:
    """Base of every accelerator's stream-level golden model (see module docstring).

    All hooks are static or class methods: the flow never instantiates a model.
    """

    #: Output member of the results (required).
    result_port: str = None
    #: Input member the latency is measured from; None: the first input port of the top.
    latency_from: str = None
    #: Plain output signals read one cycle after each TLAST beat on :attr:`result_port`
    #: (performance counters); handed to :meth:`report` as a list of dicts.
    sample_signals: tuple = ()
    #: ``hwgen sim`` options of this model (:class:`SimOption`), beside the common ones.
    sim_options: tuple = ()
    #: Whether ``hwgen sim`` may project memory use from two small stimulus trials (False for
    #: a model whose items are bounded by its data, e.g. the node's queries).
    memory_trial: bool = True

    @staticmethod
    def stimulus(config, items, rng, **options):
        """Seeded random workload of ``items`` items (required; see module docstring)."""
        raise NotImplementedError

    @staticmethod
    def inputs(config, stim):
        """``{input member: [beat dict, ...]}`` for ``stim`` (required)."""
        raise NotImplementedError

    @staticmethod
    def expect(config, stim):
        """``{output member: [beat dict, ...]}``: the golden model's outputs (required)."""
        raise NotImplementedError

    @staticmethod
    def memories(config, stim):
        """``{AXI4 read master prefix: bytes}``: images of the memories the top reads by
        itself (a simulated AXI4 read slave serves each). Default: none."""
        return {}

    @staticmethod
    def cycles_bound(config, stim):
        """Cycles the run may need beyond one per beat (memory scans, per-query LUT loads);
        added to the simulation's timeout budget. Default 0."""
        return 0

    @staticmethod
    def report(config, stim, summary, samples):
        """Extra result fields (recall, counters) from the finished run's ``summary`` and the
        :attr:`sample_signals` ``samples``. Default: none."""
        return {}

    @staticmethod
    def report_lines(config, result):
        """Lines ``hwgen sim`` prints below its summary line for ``result`` (the dict
        :func:`hwgen.flow.simulate.simulate` returns, :meth:`report`'s fields included).
        Default: none."""
        return []

    @staticmethod
    def sim_sets(options, sets):
        """Configuration overrides (``key=value`` strings) implied by the given
        ``hwgen sim`` option values (``{name: value}`` of :attr:`sim_options`, None when not
        given), on top of the user's ``sets``. Default: none."""
        return []
