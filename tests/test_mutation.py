"""hwgen.flow.mutation: the kill-rate report of `make mutate`, on hand-written mutmut results."""

import json
import tomllib
from pathlib import Path

import pytest

from hwgen.errors import ConfigError
from hwgen.flow.mutation import PACKAGES, check_floors, read_results, summarize, table

ROOT = Path(__file__).resolve().parents[1]


def _meta(root, source, codes):
    path = root / (source + ".meta")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"exit_code_by_key": codes, "hash_by_function_name": {},
                                "type_check_error_by_key": {}, "durations_by_key": {},
                                "estimated_durations_by_key": {}}))


def test_the_report_groups_the_files_mutmut_mutates():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mutmut"]
    reported = sorted(f for files in PACKAGES.values() for f in files)
    assert sorted(config["only_mutate"]) == reported
    for f in reported:
        assert (ROOT / f).is_file(), f
    for selected in config["pytest_add_cli_args_test_selection"]:
        assert (ROOT / selected).is_file(), selected


def test_counts_and_kill_rate(tmp_path):
    # vecsearch: 3 killed (exit 1, 1, 3), 1 survived, 1 without tests, 1 timeout, 1 unchecked:
    # 3 kills of 6 checked mutants
    _meta(tmp_path, "hwgen/vecsearch/golden.py",
          {"a__mutmut_1": 1, "a__mutmut_2": 1, "b__mutmut_1": 3, "b__mutmut_2": 0,
           "c__mutmut_1": 33, "c__mutmut_2": 36, "d__mutmut_1": None})
    _meta(tmp_path, "hwgen/ralm/knnlm.py", {"f__mutmut_1": 1})
    _meta(tmp_path, "hwgen/ralm/chamlm.py", {"g__mutmut_1": 0})
    _meta(tmp_path, "hwgen/ralm/costs.py", {"h__mutmut_1": 3, "h__mutmut_2": 0})
    report = summarize(read_results(tmp_path))
    v = report["packages"]["golden: vecsearch"]
    assert (v["total"], v["killed"], v["survived"], v["no tests"], v["timeout"],
            v["not checked"]) == (7, 3, 1, 1, 1, 1)
    assert v["kill_rate"] == 0.5
    ralm = report["packages"]["host: ralm"]
    assert (ralm["total"], ralm["killed"], ralm["kill_rate"], ralm["missing"]) == (4, 2, 0.5, [])
    assert report["packages"]["golden: ibert"]["missing"] == ["hwgen/ibert/golden.py"]
    lines = table(report)
    assert any(line.startswith("golden: vecsearch") and "50.0 %" in line for line in lines)
    assert any("no results: hwgen/ibert/golden.py" in line for line in lines)


def test_floors(tmp_path):
    _meta(tmp_path, "hwgen/vecsearch/golden.py", {f"a__mutmut_{i}": 1 for i in range(8)}
          | {"b__mutmut_1": 0, "b__mutmut_2": 0})                   # 80 %: at the floor
    _meta(tmp_path, "hwgen/espn/golden.py", {"a__mutmut_1": 1, "a__mutmut_2": 0})   # 50 %
    report = summarize(read_results(tmp_path))
    errors = check_floors(report, {"golden: vecsearch": 0.8, "golden: espn": 0.8,
                                   "golden: ibert": 0.8})
    assert errors == ["golden: espn: kill rate 50.0 % is below the 80 % floor",
                      "golden: ibert: no mutation results"]


def test_bad_results_name_the_parameter(tmp_path):
    with pytest.raises(ConfigError, match="results: .* is not a folder"):
        read_results(tmp_path / "absent")
    with pytest.raises(ConfigError, match="results: no .meta files"):
        read_results(tmp_path)
    (tmp_path / "x.py.meta").write_text("{not json")
    with pytest.raises(ConfigError, match="results: .*x.py.meta is not a mutmut .meta file"):
        read_results(tmp_path)
