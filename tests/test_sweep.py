"""``hwgen sweep`` on a Dask LocalCluster: every job runs and is checked against the golden
model, builds are shared per configuration, a worker killed mid-job loses no job (the table says
which job took more than one attempt), and bad specs are refused before anything runs."""

import csv
import json

import pytest
from click.testing import CliRunner

from hwgen.cli import main
from hwgen.errors import ConfigError
from hwgen.flow.sweep import load_spec, spec_path

from conftest import requires_verilator


@requires_verilator
def test_sweep_survives_a_dead_worker(tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_text("accelerator: pq-decoder\n"
                    "grid: {m: [3, 5]}\n"
                    "seeds: [1, 2]\n"
                    "stall: [0.0, 0.3]\n"
                    "items: 200\n"
                    "fault: {kill_worker_on_job: 2}\n")
    out = tmp_path / "out"
    result = CliRunner().invoke(main, ["sweep", str(spec), "--workers", "2", "--out", str(out)])
    assert result.exit_code == 0, (result.stdout, result.stderr)
    data = json.loads((out / "sweep.json").read_text())
    rows = data["rows"]
    assert data["jobs"] == 8 and data["failed"] == 0
    assert sorted(r["job"] for r in rows) == list(range(8))          # no job lost
    assert all(r["mismatches"] == 0 and not r["timeout"] for r in rows)
    by_job = {r["job"]: r for r in rows}
    assert by_job[2]["attempts"] >= 2 and by_job[2]["retried"]
    assert {r["config"] for r in rows} and len({r["config"] for r in rows}) == 2
    with open(out / "sweep.csv") as f:
        assert len(list(csv.DictReader(f))) == 8
    assert (out / "sweep.png").stat().st_size > 10_000
    assert "1 retried" in result.stdout or "2 retried" in result.stdout


@pytest.mark.parametrize("doc, needle", [
    ({"accelerator": "pq-decoder", "grid": {"m": [3, 0]}}, "m=0: must be an integer in 1..64"),
    ({"accelerator": "pq-decoder", "colour": 1}, "spec[0].colour: unknown key"),
    ({"accelerator": "nope"}, "accelerator='nope': unknown"),
    ({"accelerator": "pq-decoder", "stall": [1.5]}, "spec[0].stall=1.5: must be a probability"),
    ({"accelerator": "pq-decoder", "seeds": []}, "spec[0].seeds=[]: must be a non-empty list"),
    ({"accelerator": "pq-decoder", "engine": "spice"}, "spec[0].engine='spice'"),
    ([], "spec: holds no job"),
])
def test_bad_specs_are_refused_before_anything_runs(tmp_path, doc, needle):
    path = tmp_path / "s.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(ConfigError) as err:
        load_spec(path)
    assert needle in str(err.value)


def test_shipped_regression_spec_has_over_200_jobs():
    jobs = load_spec(spec_path("regression"))
    assert len(jobs) >= 200
    assert {j.accelerator for j in jobs} == {"pq-decoder", "insert-pq", "cluster-router"}
