"""hwgen's import layers and its freedom from import cycles, as pyproject.toml's
``[tool.importlinter]`` contracts state them (import-linter reads every import, function-level
ones included)."""

import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_import_contracts_are_kept():
    lint = Path(sys.executable).with_name("lint-imports")     # the venv's, beside python
    assert lint.is_file(), "import-linter is a test dependency (pyproject.toml: " \
                           "[project.optional-dependencies] test)"
    run = subprocess.run([str(lint), "--no-cache", "--no-logo"], cwd=ROOT, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"][
        "contracts"]
    assert f"Contracts: {len(contracts)} kept, 0 broken." in run.stdout, run.stdout[-2000:]


def test_contracts_state_the_floors():
    """The contracts that keep the layers: hwgen's (lib under flow under the domains under the
    command line), the cluster package's five (spec under golden | plan under gateware under
    run) and no cycles anywhere; a contract removed from pyproject.toml fails here."""
    contracts = {c["name"]: c for c in tomllib.loads((ROOT / "pyproject.toml").read_text())[
        "tool"]["importlinter"]["contracts"]}
    top = next(c for c in contracts.values() if c["type"] == "layers" and "containers" not in c)
    order = [layer.split(" | ") for layer in top["layers"]]
    rank = {name: i for i, names in enumerate(order) for name in names}
    assert rank["hwgen.cli"] < rank["hwgen.cluster"] < rank["hwgen.flow"] < rank["hwgen.lib"]
    cluster = next(c for c in contracts.values() if c.get("containers") == ["hwgen.cluster"])
    assert cluster["layers"] == ["run", "gateware", "golden | plan", "spec"]
    assert any(c["type"] == "acyclic_siblings" and c["ancestors"] == ["hwgen"]
               for c in contracts.values())
