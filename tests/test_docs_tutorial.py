"""docs/tutorial.md ("add your own accelerator") cannot rot: its steps run here.

The package sources are copied into a temporary folder laid out as the wheel installs them
(``rtl_templates/``, ``boards/`` and ``sim/`` inside ``hwgen/`` as ``hwgen.rtl_templates``,
``hwgen.board_files`` and ``hwgen.sim``), so that with ``PYTHONPATH`` pointing at the copy every
hwgen module, template and testbench comes from the copy and none from the checkout (the
editable install's finder only answers what the path does not). Into the copy go:

* every code block of the page titled with a path (``title="hwgen/satadd/core.py"``); blocks
  with the same title are joined in page order (the test configurations are appended to
  ``config.py`` in a later step);
* the ``hwgen/registry.py`` block, inserted at the head of the ``ACCELERATORS`` list as the
  page says;
* the ``pyproject.toml`` diff: hunks without line numbers (``@@`` separates them), each
  one's old lines found exactly once and replaced.

Then every ``console`` block's commands (``$ hwgen ...``) run as ``python -m hwgen.cli`` in a
work folder, and each output line shown on the page (``...`` elides) must appear in the
command's output, numbers aside (cycle counts and MHz depend on tool versions and machines;
the facts behind them are checked from ``--json``). ``hwgen timing`` runs in a test of its own,
which needs the ECP5 tools and Debian yosys.

The copy shares the build cache of the checkout (``$HWGEN_CACHE`` when set, as ``make
test-profile`` sets it): entries are ``<name>-<config digest>`` and the new name is the
tutorial's own, the Verilog cache is keyed by the copy's source fingerprint and Verilator
builds by their Verilog text, so runs reuse the builds and never collide with the real
blocks'. Builds this file adds (``tests/build_budget.json``): the tutorial's commands build the
default configuration once per engine (1 cocotb, 1 native); the suite's per-accelerator tests
run on the block in the copy build its four test configurations on the native engine and the
first on cocotb (1 cocotb, 4 native): 2 ``verilator`` and 5 ``native`` in all.
"""

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hwgen.flow.tools import cache_dir

from conftest import requires_ecp5_flow, requires_verilator, requires_yosys

ROOT = Path(__file__).resolve().parents[1]
TUTORIAL = ROOT / "docs" / "tutorial.md"
NAME = "saturating-add"
PYTHON = os.path.abspath(sys.executable)
#: Where the checkout's folders go in the copy: where the wheel installs them.
LAYOUT = {"pyproject.toml": "pyproject.toml", "README.md": "README.md", "hwgen": "hwgen",
          "rtl_templates": "hwgen/rtl_templates", "boards": "hwgen/board_files",
          "sim": "hwgen/sim"}
IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
#: Where the registry entry goes (the page says so).
REGISTRY_ANCHOR = "ACCELERATORS = {a.name: a for a in [\n"
#: The suite's per-accelerator tests, run on the new block in the copy.
SUITE_TESTS = ("test_config.py", "test_contract.py", "test_model_contract.py", "test_sim.py")

pytestmark = pytest.mark.xdist_group("docs_tutorial")

_FENCE = re.compile(r"^```(\w+)([^\n]*)\n(.*?)^```$", re.M | re.S)
_TITLE = re.compile(r'title="([^"]+)"')
_NUMBER = re.compile(r"\d[\d,]*(?:\.\d+)?")


def blocks(text=None):
    """``[(language, title or None, body)]`` of the page's fenced code blocks, in order."""
    text = TUTORIAL.read_text() if text is None else text
    out = []
    for lang, attrs, body in _FENCE.findall(text):
        title = _TITLE.search(attrs)
        out.append((lang, title.group(1) if title else None, body))
    return out


def titled_files():
    """``{path: text}`` of the blocks titled with a path, same titles joined in page order."""
    files = {}
    for lang, title, body in blocks():
        if title and lang == "python":
            body = body.strip("\n") + "\n"
            files[title] = files[title] + "\n\n" + body if title in files else body
    return files


def diff_hunks(body):
    """``[(old lines, new lines)]`` of a diff block without line numbers."""
    hunks, current = [], []
    for line in body.splitlines():
        if line.startswith("@@"):
            current = []
            hunks.append(current)
        elif line[:1] in (" ", "-", "+"):
            current.append(line)
    return [([ln[1:] for ln in h if ln[0] in " -"], [ln[1:] for ln in h if ln[0] in " +"])
            for h in hunks]


def apply_diff(text, body):
    """``text`` with every hunk of ``body`` applied; each hunk's old lines must occur once."""
    lines = text.split("\n")
    for old, new in diff_hunks(body):
        at = [i for i in range(len(lines) - len(old) + 1) if lines[i:i + len(old)] == old]
        assert len(at) == 1, f"the tutorial's diff lines {old} occur {len(at)} times"
        lines[at[0]:at[0] + len(old)] = new
    return "\n".join(lines)


def console_steps():
    """``[(command, [expected output lines])]`` of the page's ``console`` blocks."""
    steps = []
    for lang, _, body in blocks():
        if lang != "console":
            continue
        for line in body.splitlines():
            if line.startswith("$ "):
                steps.append((line[2:], []))
            else:
                steps[-1][1].append(line)
    return steps


def _masked(line):
    return _NUMBER.sub("#", line).strip()


def make_copy(dest):
    """The sources in ``dest`` as the wheel lays them out, with the tutorial applied."""
    for src, where in LAYOUT.items():
        target = dest / where
        if (ROOT / src).is_dir():
            shutil.copytree(ROOT / src, target, ignore=IGNORE)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / src, target)
    files = titled_files()
    registry = files.pop("hwgen/registry.py")
    for path, text in files.items():
        target = dest / path
        assert not target.exists(), f"the tutorial's {path} would overwrite a file of the repo"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    reg = dest / "hwgen" / "registry.py"
    source = reg.read_text()
    assert source.count(REGISTRY_ANCHOR) == 1, "the tutorial names a place in the registry " \
        "that is gone: " + REGISTRY_ANCHOR
    reg.write_text(source.replace(REGISTRY_ANCHOR, REGISTRY_ANCHOR + registry))
    (diff,) = [body for lang, title, body in blocks() if title == "pyproject.toml"]
    pyproject = dest / "pyproject.toml"
    pyproject.write_text(apply_diff(pyproject.read_text(), diff))
    return dest


@pytest.fixture(scope="module")
def copy(tmp_path_factory):
    """The tutorial applied to a copy of the sources, and the environment that imports it."""
    root = make_copy(tmp_path_factory.mktemp("tutorial") / "src")
    cache = os.environ.get("HWGEN_CACHE") or str(cache_dir())
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}
    env.update(PYTHONPATH=str(root), HWGEN_CACHE=cache)
    work = root.parent / "work"
    work.mkdir()
    return {"root": root, "env": env, "work": work}


def hwgen(copy, command, timeout=600):
    """Run one ``hwgen ...`` command line of the page against the copy."""
    args = shlex.split(command)
    assert args[0] == "hwgen", f"the tutorial's commands are hwgen commands: {command}"
    return subprocess.run([PYTHON, "-m", "hwgen.cli", *args[1:]], cwd=copy["work"],
                          env=copy["env"], capture_output=True, text=True, timeout=timeout)


def run_step(copy, command, expected):
    """Run a console step; its shown output lines must appear in what it prints."""
    proc = hwgen(copy, command)
    said = proc.stdout + proc.stderr
    refused = any(line.startswith("hwgen: error:") for line in expected)
    assert proc.returncode == (2 if refused else 0), f"$ {command}\n{said[-3000:]}"
    got = {_masked(line) for line in said.splitlines()}
    for line in expected:
        if line.strip() != "...":
            assert _masked(line) in got, f"$ {command}: the page shows\n{line}\nnot in\n{said}"
    return proc


def test_the_page_has_every_step():
    files = titled_files()
    assert set(files) == {"hwgen/satadd/__init__.py", "hwgen/satadd/config.py",
                          "hwgen/satadd/core.py", "hwgen/satadd/model.py",
                          "hwgen/registry.py"}
    assert "TEST_CONFIGS = (" in files["hwgen/satadd/config.py"]
    commands = [c.split()[1] for c, _ in console_steps()]
    for verb in ("list", "config", "build", "sim", "timing"):
        assert verb in commands
    (diff,) = [b for _, t, b in blocks() if t == "pyproject.toml"]
    assert len(diff_hunks(diff)) == 2


def test_diffs_apply_by_their_lines():
    body = "@@ one\n a\n-b\n+c\n+d\n@@ two\n e\n+f\n"
    assert apply_diff("a\nb\ne\n", body) == "a\nc\nd\ne\nf\n"
    with pytest.raises(AssertionError, match="occur 0 times"):
        apply_diff("x\n", body)


def test_the_copy_is_what_runs(copy):
    """hwgen, its testbench, templates and board files, and the new block all come from the
    copy; the copy's pyproject lists the new package."""
    probe = ("import json, hwgen, hwgen.sim.stream_tb as tb, hwgen.flow.package as p, "
             "hwgen.boards as b, hwgen.satadd.core as c; print(json.dumps([hwgen.__file__, "
             "tb.__file__, str(p.TEMPLATES_DIR), str(b.BOARDS_DIR), c.__file__]))")
    proc = subprocess.run([PYTHON, "-c", probe], cwd=copy["work"], env=copy["env"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    root = copy["root"].resolve()
    for path in json.loads(proc.stdout):
        assert Path(path).resolve().is_relative_to(root), path
    import tomllib
    pyproject = tomllib.loads((copy["root"] / "pyproject.toml").read_text())
    assert "hwgen.satadd" in pyproject["tool"]["setuptools"]["packages"]


def test_the_new_block_keeps_the_repository_conventions(copy):
    """The page's modules have every docstring tests/test_docstrings.py asks for, and the
    copy keeps the import layers with the new package among the domains."""
    check = ("import json, sys; sys.path.insert(0, sys.argv[1]); "
             "from test_docstrings import public_definitions; failed = []; "
             "found = [(w, d) for w, d in public_definitions(failed) if 'hwgen.satadd' in w]; "
             "print(json.dumps({'found': len(found), 'failed': failed, "
             "'missing': [w for w, d in found if not d]}))")
    proc = subprocess.run([PYTHON, "-c", check, str(ROOT / "tests")], cwd=copy["work"],
                          env=copy["env"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout.splitlines()[-1])
    assert got["found"] >= 10 and not got["missing"] and not got["failed"], got
    lint = Path(sys.executable).with_name("lint-imports")
    if lint.is_file():
        run = subprocess.run([str(lint), "--no-cache", "--no-logo"], cwd=copy["root"],
                             env=copy["env"], capture_output=True, text=True, timeout=300)
        assert run.returncode == 0 and "0 broken" in run.stdout, run.stdout[-3000:]


@requires_verilator
def test_the_tutorial_commands(copy):
    """Every command of the page but ``hwgen timing``, in page order: listed, configured,
    refused, built, simulated bit-exact with stalls on both engines at the modelled cycles."""
    steps = [(c, e) for c, e in console_steps() if c.split()[1] != "timing"]
    for command, expected in steps:
        run_step(copy, command, expected)
    work = copy["work"]
    verilog = (work / "out" / NAME / "saturating_add.v").read_text()
    assert "module saturating_add(" in verilog
    ports = json.loads((work / "out" / NAME / "ports.json").read_text())
    assert [s["port"] for s in ports["streams"]] == ["s_axis_ab", "m_axis_y"]
    stalled = json.loads((work / "sim.json").read_text())
    assert stalled["mismatches"] == 0 and not stalled["timeout"]
    assert stalled["results"] == stalled["results_received"] == stalled["items"] == 200
    assert stalled["input_gaps"] > 0 and stalled["output_stalls"] > 0
    native = json.loads((work / "native.json").read_text())
    assert native["mismatches"] == 0 and native["engine"] == "native"
    assert native["cycles"] == 200 + native["latency_cycles"] == 205


@requires_verilator
def test_a_broken_golden_model_is_caught(copy, tmp_path):
    """The same Verilog against a golden model that saturates one below the top: ``hwgen
    sim`` reports the mismatches and exits 1."""
    broken = shutil.copytree(copy["root"], tmp_path / "src", ignore=IGNORE)
    model = broken / "hwgen" / "satadd" / "model.py"
    text = model.read_text()
    assert "lo, hi)" in text
    model.write_text(text.replace("lo, hi)", "lo, hi - 1)"))
    env = dict(copy["env"], PYTHONPATH=str(broken))
    proc = subprocess.run([PYTHON, "-m", "hwgen.cli", "sim", NAME, "--items", "200",
                           "--stall", "0.3", "--json", "broken.json"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    result = json.loads((tmp_path / "broken.json").read_text())
    assert result["mismatches"] > 0


@requires_verilator
def test_the_suite_accepts_the_new_block(copy):
    """The suite's per-accelerator tests, run in the copy on the new block only: valid
    configurations, the contracts, and every test configuration simulated bit-exact."""
    tests = copy["root"] / "tests"
    tests.mkdir(exist_ok=True)
    for name in ("conftest.py",) + SUITE_TESTS:
        shutil.copy2(ROOT / "tests" / name, tests / name)
    proc = subprocess.run([PYTHON, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", NAME,
                           *(f"tests/{n}" for n in SUITE_TESTS)], cwd=copy["root"],
                          env=copy["env"], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    passed = re.search(r"(\d+) passed", proc.stdout)
    assert passed and int(passed.group(1)) >= 10 and "skipped" not in proc.stdout, \
        proc.stdout[-2000:]


@requires_ecp5_flow
@requires_yosys
def test_the_tutorial_timing(copy):
    """``hwgen timing`` as the page shows it (about 20 s on 2 cores the first time, cached
    per Verilog text and seed afterwards)."""
    (step,) = [(c, e) for c, e in console_steps() if c.split()[1] == "timing"]
    proc = run_step(copy, *step)
    ratio = re.search(r"fmax_ratio ([\d.]+)", proc.stdout)
    assert ratio and float(ratio.group(1)) > 0
