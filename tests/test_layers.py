"""hwgen's import layers and its freedom from import cycles, as pyproject.toml's
``[tool.importlinter]`` contracts state them (import-linter reads every import, function-level
ones included)."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_import_contracts_are_kept():
    lint = Path(sys.executable).with_name("lint-imports")     # the venv's, beside python
    assert lint.is_file(), "import-linter is a test dependency (pyproject.toml: " \
                           "[project.optional-dependencies] test)"
    run = subprocess.run([str(lint), "--no-cache", "--no-logo"], cwd=ROOT, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert "Contracts: 2 kept, 0 broken." in run.stdout, run.stdout[-2000:]
