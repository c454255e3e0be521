"""The test-time profile (``hwgen/flow/profile.py``, ``hwgen bench tests``): events written
by several processes, their summary, the JUnit join and the build budget."""

import json
import subprocess
import sys

from click.testing import CliRunner

from hwgen.cli import main
from hwgen.flow import profile

JUNIT = """<?xml version="1.0"?><testsuites><testsuite>
<testcase classname="tests.test_a" name="test_one" time="2.5"/>
<testcase classname="tests.test_a" name="test_two" time="0.5"><skipped/></testcase>
<testcase classname="tests.test_b" name="test_three[x]" time="7.0"><failure/></testcase>
</testsuite></testsuites>"""


def _events(tmp_path, monkeypatch):
    path = tmp_path / "events.jsonl"
    monkeypatch.setenv(profile.ENV, str(path))
    profile.record("verilator", "top_a", "/c/a/build", 10.0, False)
    profile.record("verilator", "top_a", "/c/a/build", 0.0, True)
    profile.record("native", "top_a", "/c/a/native", 4.0, False)
    profile.record("native", "top_b", "/c/b/native", 3.0, False)
    profile.record("yosys", "top_a", "/c/a/synth", 6.0, False)
    # a second process appends to the same file
    code = ("from hwgen.flow import profile; "
            "profile.record('native', 'top_b', '/c/b/native', 0.0, True)")
    subprocess.run([sys.executable, "-c", code], check=True)
    return path


def test_record_does_nothing_without_the_variable(tmp_path, monkeypatch):
    monkeypatch.delenv(profile.ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    profile.record("native", "x", "/b", 1.0, False)
    assert list(tmp_path.iterdir()) == []


def test_summary_counts_builds_hits_and_misses(tmp_path, monkeypatch):
    events = profile.read_events(_events(tmp_path, monkeypatch))
    assert len(events) == 6 and events[-1]["pid"] != events[0]["pid"]
    report = profile.summarize(events, setup_seconds=60, wall_seconds=100)
    assert report["kinds"]["verilator"] == {"events": 2, "misses": 1, "hits": 1, "seconds": 10.0}
    assert report["kinds"]["native"] == {"events": 3, "misses": 2, "hits": 1, "seconds": 7.0}
    assert report["distinct_builds"] == {"verilator": 1, "native": 2}
    assert [b["seconds"] for b in report["builds"]] == [10.0, 4.0, 3.0]
    text = "\n".join(profile.table(report))
    assert "set-up (venv, Debian packages): 60 s" in text and "yosys" in text


def test_junit_join_and_slowest_tests(tmp_path, monkeypatch):
    junit = tmp_path / "junit.xml"
    junit.write_text(JUNIT)
    report = profile.summarize([], junit=junit, slowest=2)
    assert report["tests"] == {"count": 3, "seconds": 10.0,
                               "outcomes": {"failure": 1, "passed": 1, "skipped": 1}}
    assert [t["test"] for t in report["slowest_tests"]] == [
        "tests/test_b.py::test_three[x]", "tests/test_a.py::test_one"]


def test_budget_fails_one_build_over(tmp_path, monkeypatch):
    report = profile.summarize(profile.read_events(_events(tmp_path, monkeypatch)))
    budget = tmp_path / "budget.json"
    budget.write_text(json.dumps({"verilator": 1, "native": 2}))
    assert profile.check_budget(report, budget) == []
    budget.write_text(json.dumps({"verilator": 1, "native": 1}))
    (error,) = profile.check_budget(report, budget)
    assert "2 distinct native builds, over the budget of 1" in error


def test_cli_prints_the_table_and_fails_over_budget(tmp_path, monkeypatch):
    events = _events(tmp_path, monkeypatch)
    budget = tmp_path / "budget.json"
    budget.write_text(json.dumps({"verilator": 0}))
    out = tmp_path / "report.json"
    result = CliRunner().invoke(main, ["bench", "tests", "--events", str(events), "--budget",
                                       str(budget), "--json", str(out)])
    assert result.exit_code == 1
    assert "distinct builds" in result.output and "over the budget of 0" in result.output
    assert json.loads(out.read_text())["budget_errors"]


def test_torn_profile_lines_are_skipped(tmp_path, monkeypatch):
    path = _events(tmp_path, monkeypatch)
    with path.open("a") as f:
        f.write('{}\n[1, 2]\n{"kind": "native", "top": "to')      # a killed writer's tail
    assert len(profile.read_events(path)) == 6


def test_cli_names_a_truncated_junit_file(tmp_path, monkeypatch):
    junit = tmp_path / "junit.xml"
    junit.write_text(JUNIT[:120])                   # pytest died mid-write (a full disk)
    result = CliRunner().invoke(main, ["bench", "tests", "--events",
                                       str(_events(tmp_path, monkeypatch)),
                                       "--junit", str(junit)])
    assert result.exit_code == 2, result.output
    assert "junit" in result.output and "not a complete JUnit XML file" in result.output
