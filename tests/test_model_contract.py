"""The written model contract (hwgen/flow/model.py) and the one scoreboard
(hwgen/flow/scoreboard.py) that every simulation engine shares; model-declared `hwgen sim` options."""

import inspect
import re
import subprocess
import sys

import pytest

from hwgen import registry
from hwgen.errors import ConfigError
from hwgen.flow import scoreboard
from hwgen.flow.model import REQUIRED_HOOKS, SimOption, StreamModel
from hwgen.flow.ports import StreamFormat

NAMES = registry.names()


@pytest.mark.parametrize("name", NAMES)
def test_every_model_follows_the_contract(name):
    """Each registered model derives from StreamModel, implements the required hooks itself
    with a docstring, names a result port, and declares well-formed sim options."""
    acc = registry.get(name)
    model = acc.model
    assert issubclass(model, StreamModel)
    assert isinstance(model.result_port, str) and model.result_port.startswith("o_")
    assert model.latency_from is None or model.latency_from.startswith("i_")
    for hook in REQUIRED_HOOKS:
        owner = next(cls for cls in model.__mro__ if hook in cls.__dict__)
        assert owner is not StreamModel, f"{name} does not implement {hook}"
        fn = owner.__dict__[hook]
        fn = getattr(fn, "__func__", fn)
        assert (fn.__doc__ or "").strip(), f"{owner.__name__}.{hook} has no docstring"
    fields = acc.config.fields()
    params = set(inspect.signature(model.stimulus).parameters)
    for opt in model.sim_options:
        assert isinstance(opt, SimOption) and opt.route in ("stimulus", "set", "items")
        if opt.route == "set":
            assert opt.name in fields, f"{name}: --{opt.name} sets no parameter"
        if opt.route == "stimulus":
            assert opt.name in params, f"{name}: stimulus() takes no {opt.name}"


def test_sim_option_flags_are_not_shared_with_common_options():
    from hwgen.cli.flow import sim
    common = {flag for p in sim.params for flag in getattr(p, "opts", [])}
    for name in NAMES:
        for opt in registry.get(name).model.sim_options:
            assert opt.flag not in common, f"{name}: {opt.flag} shadows a common option"


def test_base_class_defaults():
    assert StreamModel.memories(None, None) == {}
    assert StreamModel.cycles_bound(None, None) == 0
    assert StreamModel.report(None, None, {}, []) == {}
    assert StreamModel.sim_sets({}, []) == []
    with pytest.raises(NotImplementedError):
        StreamModel.stimulus(None, 1, None)


# -- the scoreboard ----------------------------------------------------------------------------

FMT = StreamFormat.from_dict({"fields": [{"name": "dist", "bits": 8, "offset": 0},
                                         {"name": "tag", "bits": 4, "offset": 8}],
                              "tdata_bits": 16, "tlast": True})


def test_compare_counts_wrong_missing_and_extra_beats():
    names = scoreboard.beat_names(FMT)
    assert names == ["dist", "tag", "last"]
    expected = [{"dist": 1, "tag": 2, "last": 0}, {"dist": 3, "tag": 4, "last": 1}]
    same = [scoreboard.normalise(b, names) for b in expected]
    assert scoreboard.compare(expected, same, names) == (0, [])
    wrong = [same[0], dict(same[1], dist=9)]
    count, examples = scoreboard.compare(expected, wrong, names)
    assert count == 1 and examples[0]["index"] == 1 and examples[0]["received"]["dist"] == 9
    assert scoreboard.compare(expected, same[:1], names)[0] == 1             # a beat missing
    assert scoreboard.compare(expected, same + same[:1], names)[0] == 1      # an extra beat


def test_timeout_grows_with_beats_and_stall():
    base = scoreboard.timeout_cycles(1000, 0.0)
    assert base == 1000 * scoreboard.TIMEOUT_CYCLES_PER_BEAT + scoreboard.TIMEOUT_SLACK_CYCLES
    assert scoreboard.timeout_cycles(2000, 0.0) > base
    assert scoreboard.timeout_cycles(1000, 0.5) == \
        4 * 1000 * scoreboard.TIMEOUT_CYCLES_PER_BEAT + scoreboard.TIMEOUT_SLACK_CYCLES


def test_run_folders_differ_in_anything_that_goes_into_the_run(tmp_path):
    job = {"seed": 1, "stall": 0.1, "ports": [{"frames": [[1, 2, 3]]}]}
    other = {"seed": 1, "stall": 0.1, "ports": [{"frames": [[1, 2, 4]]}]}
    a = scoreboard.run_folder(tmp_path, job, seed=1, stall=0.1, items=3)
    assert a.parent == tmp_path / "runs" and a.name.startswith("seed1-stall0.1-n3-")
    assert a != scoreboard.run_folder(tmp_path, other, seed=1, stall=0.1, items=3)
    from hwgen.flow.engine import ENGINES
    native = ENGINES["native"].run_prefix
    assert scoreboard.run_folder(tmp_path, job, seed=1, stall=0.1, items=3,
                                 prefix=native).name == "native-" + a.name


def test_workload_checks_options_before_drawing():
    acc = registry.get("pq-decoder")
    cfg = acc.config(m=4)
    with pytest.raises(ConfigError, match="nprobe: is not an option of pq-decoder"):
        scoreboard.workload(acc, cfg, items=10, stimulus_options={"nprobe": 3})
    with pytest.raises(ConfigError, match="items=0"):
        scoreboard.workload(acc, cfg, items=0)
    work = scoreboard.workload(acc, cfg, items=300, seed=4)
    again = scoreboard.workload(acc, cfg, items=300, seed=4)
    assert work.items == 300 and len(work.expected["o_dist"]) == 300
    assert work.expected == again.expected                   # seeded: reproducible


# -- model-declared CLI options ----------------------------------------------------------------

def _help(*args):
    from click.testing import CliRunner
    from hwgen.cli import main
    result = CliRunner().invoke(main, ["sim", *args, "--help"])
    assert result.exit_code == 0, result.output
    return result.output


def _lists(help_text, flag):
    """Whether ``flag`` is listed as an option (``  --nprobe INTEGER``), not just named."""
    return re.search(rf"^\s+{flag} [A-Z\[]", help_text, re.M) is not None


def test_sim_help_lists_the_named_models_own_options():
    node, decoder, router = _help("chamvs-node"), _help("pq-decoder"), _help("cluster-router")
    for flag in ("--base", "--queries", "--queries-count", "--nprobe", "--nlist", "--k", "--m"):
        assert _lists(node, flag)
        assert not _lists(decoder, flag)
    assert _lists(router, "--fuzz") and not _lists(node, "--fuzz")
    assert _lists(decoder, "--engine") and _lists(node, "--stall")


@pytest.mark.parametrize("args, needle", [
    (["sim", "pq-decoder", "--fuzz", "5"],
     "fuzz=5: is an option of cluster-router, cluster-gateway, not of pq-decoder"),
    (["sim", "cluster-router", "--fuzz", "0"], "fuzz=0: must be an integer >= 1"),
    (["sim", "chamvs-node", "--k", "0"], "k=0: must be an integer >= 1"),
    (["sim", "chamvs-node", "--queries-count", "5", "--items", "6"],
     "queries_count=5: and --items=6 disagree"),
    (["sim", "pq-decoder", "--no-such-flag"], "No such option '--no-such-flag'"),
])
def test_model_option_errors_are_one_line(args, needle):
    proc = subprocess.run([sys.executable, "-m", "hwgen.cli", *args], capture_output=True,
                          text=True)
    assert proc.returncode == 2, proc.stderr
    assert needle in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr
