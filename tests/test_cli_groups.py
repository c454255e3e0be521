"""The hwgen command line by domain: the command tree, the old spellings as hidden aliases (of
commands and of options), one meaning per shared option name, ``hwgen list --json`` and
``hwgen chamvs serve``."""

import json
import socket
import subprocess
import sys

import click
import pytest
from click.testing import CliRunner

from hwgen import registry
from hwgen.cli import main
from hwgen.contract import RESOURCE_KEYS
from hwgen.vecsearch.host.protocol import recv_message, send_message
from hwgen.vecsearch.host.shard import save_shard

TREE = {
    "": {"list", "config", "build", "sim", "synth", "timing", "sweep", "bench", "dataset", "demo",
         "chamvs", "recsys", "cluster", "windve", "espn", "ralm"},
    "chamvs": {"demo", "serve", "shard", "size-queues", "bench", "explore"},
    "recsys": {"partition", "cluster-sim", "bench"},
    "cluster": {"build", "fit", "sim", "bench"},
    "windve": {"run", "stress", "calibrate", "cost"},
    "espn": {"index", "bench", "query"},
    "ralm": {"bench", "generate"},
    "bench": {"timing", "tests", "mutation", "sim", "pq-decoder", "lut-builder", "kselect",
              "queues", "chamvs", "recsys", "cluster"},
}

#: old spelling -> the command it still runs
COMMAND_ALIASES = {"serve": ("windve",), "partition": ("recsys", "partition"),
                   "size-queues": ("chamvs", "size-queues"),
                   "recsys-cluster-sim": ("recsys", "cluster-sim")}


def _command(path):
    cmd = main
    for name in path:
        cmd = cmd.commands[name]
    return cmd


def _visible(group):
    return {name for name, cmd in group.commands.items() if not cmd.hidden}


@pytest.mark.parametrize("group", sorted(TREE))
def test_every_group_lists_its_commands(group):
    path = group.split()
    assert _visible(_command(path)) == TREE[group]
    out = CliRunner().invoke(main, [*path, "--help"]).output
    for name in TREE[group]:
        assert f"\n  {name} " in out, (name, out)


def test_old_command_names_are_hidden_aliases_that_still_run():
    out = CliRunner().invoke(main, ["--help"]).output
    for old, new in COMMAND_ALIASES.items():
        cmd = main.commands[old]
        assert cmd.hidden and f"\n  {old} " not in out
        assert cmd.callback is _command(new).callback, old
        assert {p.name for p in cmd.params} == {p.name for p in _command(new).params}
    assert main.commands["demo"] is _command(["chamvs", "demo"])       # visible: make demo
    assert set(main.commands["serve"].commands) == {"run", "stress", "calibrate", "cost"}


@pytest.mark.parametrize("old, new", [
    (["size-queues", "--k", "10", "--streams", "8"], ["chamvs", "size-queues", "-k", "10",
                                                     "--streams", "8"]),
    (["partition", "--preset", "small-ctr", "--nodes", "2"],
     ["recsys", "partition", "--preset", "small-ctr", "--nodes", "2"]),
])
def test_old_and_new_spellings_print_the_same(old, new):
    a, b = CliRunner().invoke(main, old), CliRunner().invoke(main, new)
    assert a.exit_code == b.exit_code == 0, a.output + b.output
    assert a.output == b.output


def _parsed(path, args):
    """The values command ``path`` receives for ``args`` (parsed, not run)."""
    cmd = _command(path)
    with cmd.make_context(path[-1], list(args)) as ctx:
        return ctx.params


@pytest.mark.parametrize("path, fixed, old, new, dest, value", [
    (["espn", "bench"], ["IDX"], "--plot", "--plot-dir", "plot_dir", "plots"),
    (["espn", "bench"], ["IDX"], "--prefetch-step", "--prefetch-steps", "steps", "0.2,0.4"),
    (["espn", "bench"], ["IDX"], "--threads", "--read-threads", "threads", 8),
    (["ralm", "generate"], ["hello"], "--tokens", "--new-tokens", "tokens", 7),
    (["ralm", "bench"], [], "--tokens-in-store", "--store-tokens", "max_tokens", 5000),
    (["cluster", "sim"], ["two_clusters", "--out", "o"], "--rounds", "--messages", "messages",
     5),
    (["cluster", "sim"], ["two_clusters", "--out", "o"], "--latency-ms", "--hub-delay-ms",
     "hub_delay_ms", 2.5),
    (["recsys", "cluster-sim"], [], "--gbps", "--link-gbps", "link_gbps", 25.0),
])
def test_renamed_options_keep_their_old_spelling_hidden(tmp_path, path, fixed, old, new, dest,
                                                        value):
    fixed = [str(tmp_path) if a == "IDX" else a for a in fixed]
    assert _parsed(path, [*fixed, old, str(value)])[dest] == value
    assert _parsed(path, [*fixed, new, str(value)])[dest] == value
    visible = next(p for p in _command(path).params if p.name == dest and not p.hidden)
    default = visible.default if isinstance(visible.default, (int, float, str)) else None
    assert _parsed(path, fixed)[dest] == default        # the alias leaves the default alone
    out = CliRunner().invoke(main, [*path, "--help"]).output
    assert new in out and f"{old} " not in out


def _options(cmd, path=()):
    if isinstance(cmd, click.Group):
        for name, sub in cmd.commands.items():
            if not sub.hidden:
                yield from _options(sub, (*path, name))
        return
    for p in cmd.params:
        if isinstance(p, click.Option) and not p.hidden:
            yield " ".join(path), p


def test_k_is_spelt_both_ways_and_network_latency_in_ns():
    """docs/guides/commands.md "Shared options": -k/--k everywhere; simulated network latency in ns."""
    for where, p in _options(main):
        if "-k" in p.opts or "--k" in p.opts:
            assert {"-k", "--k"} <= set(p.opts), where
        assert not any(o in ("--latency-ms", "--hop", "--gbps") for o in p.opts), where
        if any(o.startswith("--latency") for o in p.opts):
            assert p.opts == ["--latency-ns"], where


def test_shared_option_names_keep_one_type():
    """A shared name has one type everywhere (--plot a PNG file, --threads a count, ...);
    `hwgen list --json` is the one flag (it prints the JSON instead of writing a file)."""
    kinds = {}
    for where, p in _options(main):
        if where == "list":
            continue
        for o in p.opts:
            kinds.setdefault(o, set()).add(
                "dir" if isinstance(p.type, click.Path) and not p.type.file_okay else
                "file" if isinstance(p.type, click.Path) else p.type.name)
    for name in ("--seed", "--stall", "--threads", "--tokens", "--plot", "--board", "--k",
                 "--rounds", "--nodes", "--prefetch-step", "--latency-ns", "--json"):
        assert len(kinds.get(name, {"-"})) == 1, (name, kinds[name])


def test_list_json_answers_every_question_of_every_accelerator():
    result = CliRunner().invoke(main, ["list", "--json"])
    assert result.exit_code == 0, result.output[-2000:]
    rows = json.loads(result.stdout)                        # progress goes to stderr
    assert [r["name"] for r in rows] == registry.names()
    for row in rows:
        acc = registry.get(row["name"])
        assert set(row) == {"name", "summary", "config", "workload", "performance",
                            "resources"}, row["name"]
        assert row["summary"] == acc.summary
        assert row["config"] == acc.make_config().to_dict()
        assert isinstance(row["workload"], dict) and isinstance(row["performance"], dict)
        assert set(row["resources"]) == set(RESOURCE_KEYS) == {"lut", "ff", "bram18", "uram",
                                                               "dsp"}
        assert all(isinstance(v, int) and v >= 0 for v in row["resources"].values())


def _hwgen(*args, **kw):
    return subprocess.Popen([sys.executable, "-m", "hwgen.cli", *map(str, args)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def test_chamvs_serve_runs_the_node_server(tmp_path):
    from hwgen.vecsearch.node import ChamVSNodeConfig
    from test_node_server import _shard, CFG
    assert isinstance(CFG, ChamVSNodeConfig)
    path = tmp_path / "node0.npz"
    save_shard(path, CFG, _shard())
    proc = _hwgen("chamvs", "serve", path, "--port", 0, "--max-queries", 4)
    try:
        line = proc.stdout.readline()
        assert line.startswith("listening on"), (line, proc.stderr.read() if proc.poll() else "")
        with socket.create_connection(("127.0.0.1", int(line.split()[-1])), timeout=10) as s:
            send_message(s, {"op": "stats"})
            assert recv_message(s)["limits"]["max_queries"] == 4
    finally:
        proc.kill()
        _, err = proc.communicate()
    assert "Traceback" not in err


@pytest.mark.parametrize("args, needle", [
    (["MISSING"], "node_server: error: "),
    (["SHARD", "--port", "70000"], "hwgen: error: "),
    (["SHARD", "--timeout", "0"], "hwgen: error: "),
])
def test_chamvs_serve_startup_errors_are_one_line(tmp_path, args, needle):
    args = [str(tmp_path / "missing.npz") if a == "MISSING" else
            str(tmp_path / "x.npz") if a == "SHARD" else a for a in args]
    proc = _hwgen("chamvs", "serve", *args)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 2 and err.count("\n") == 1 and err.startswith(needle), err
