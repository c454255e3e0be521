"""Under ``CI=true`` a skipped test fails (``tests/conftest.py``): the tools a test needs are
installed by CI, so a skip there is a lost tool, never a pass."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent

SKIPPING = '''
import pytest

from conftest import requires_yosys


@pytest.mark.skipif(True, reason="needs a tool this machine lacks")
def test_needs_a_missing_tool():
    pass


def test_plain():
    pass
'''


def _run(tmp_path, ci):
    shutil.copy(HERE / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "test_skipping.py").write_text(SKIPPING)
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    if ci is not None:
        env["CI"] = ci
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "-p", "no:xdist", str(tmp_path)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("ci", ["true", "1"])
def test_a_skip_fails_under_ci(tmp_path, ci):
    run = _run(tmp_path, ci)
    assert run.returncode == 1, run.stdout
    assert "1 passed, 1 error" in run.stdout          # skipif acts in set-up: an error
    assert "skipped under CI=true" in run.stdout and "needs a tool this machine lacks" in run.stdout


@pytest.mark.parametrize("ci", [None, "false"])
def test_a_skip_is_a_skip_outside_ci(tmp_path, ci):
    run = _run(tmp_path, ci)
    assert run.returncode == 0, run.stdout
    assert "1 passed, 1 skipped" in run.stdout
