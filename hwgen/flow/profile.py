"""Where a test run's time goes: tool events and their report (``make test-profile``,
``hwgen bench tests``).

With ``HWGEN_PROFILE`` set to a file, every Verilator build (cocotb or native testbench),
every simulation run, every yosys run and every nextpnr run appends one JSON line to it:
``kind``, ``name`` (the top), ``build`` (the cached build folder: one per configuration),
``seconds``, ``cached`` (a cache hit) and ``test`` (pytest's current test, when there is one).
Appends of one short line are atomic, so pytest-xdist workers and the ``hwgen`` processes
that tests start share one file.

:func:`summarize` joins those events with pytest's JUnit XML (per-test call time) and the
set-up time into one report (JSON, and a table from :func:`table`), and checks the number of
distinct Verilator builds against the budget declared in ``tests/build_budget.json``: a suite
that needs more builds than declared fails until the budget is raised in the same commit.
"""

import json
import os
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

from ..errors import ConfigError

__all__ = ["ENV", "record", "read_events", "summarize", "table", "check_budget"]

ENV = "HWGEN_PROFILE"
#: Event kinds that are builds of a simulator (counted against the budget).
BUILD_KINDS = ("verilator", "native")


def record(kind, name, build, seconds, cached, **extra):
    """Append one event to ``$HWGEN_PROFILE`` (nothing when it is unset)."""
    path = os.environ.get(ENV)
    if not path:
        return
    test = os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" ", 1)[0]
    event = {"kind": kind, "name": name, "build": str(build), "seconds": round(seconds, 3),
             "cached": bool(cached), "test": test, "pid": os.getpid(), **extra}
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(event) + "\n").encode())
    finally:
        os.close(fd)


def read_events(path):
    """The events of a profile file (lines that are not a JSON event are skipped: a process
    killed mid-write leaves a torn last line)."""
    events = []
    for line in Path(path).read_text().splitlines():
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(event, dict) and "kind" in event:
            events.append(event)
    return events


def _junit_tests(path):
    """``[(test id, seconds, outcome)]`` from a pytest JUnit XML file."""
    tests = []
    try:
        root = ET.parse(path).getroot()
    except ET.ParseError as e:          # pytest died mid-write (a full disk, a kill)
        raise ConfigError("junit", f"{path} is not a complete JUnit XML file ({e}); "
                          "the pytest run that should have written it did not finish") from None
    for case in root.iter("testcase"):
        outcome = "passed"
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = child.tag
        name = f"{case.get('classname', '').replace('.', '/')}.py::{case.get('name')}"
        tests.append((name, float(case.get("time", 0.0)), outcome))
    return tests


def summarize(events, junit=None, setup_seconds=None, wall_seconds=None, slowest=30):
    """The profile report: totals per event kind, every build, the slowest tests."""
    kinds = defaultdict(lambda: {"events": 0, "misses": 0, "hits": 0, "seconds": 0.0})
    builds = {}
    for e in events:
        k = kinds[e["kind"]]
        k["events"] += 1
        k["hits" if e["cached"] else "misses"] += 1
        k["seconds"] = round(k["seconds"] + e["seconds"], 3)
        if e["kind"] in BUILD_KINDS:
            b = builds.setdefault((e["kind"], e["build"]), {
                "kind": e["kind"], "name": e["name"], "build": e["build"], "seconds": 0.0,
                "misses": 0, "hits": 0, "first_test": e["test"]})
            b["seconds"] = round(b["seconds"] + e["seconds"], 3)
            b["misses" if not e["cached"] else "hits"] += 1
    report = {"setup_seconds": setup_seconds, "wall_seconds": wall_seconds,
              "kinds": dict(kinds),
              "builds": sorted(builds.values(), key=lambda b: -b["seconds"]),
              "distinct_builds": {kind: sum(1 for b in builds.values() if b["kind"] == kind)
                                  for kind in BUILD_KINDS}}
    if junit and Path(junit).exists():
        tests = _junit_tests(junit)
        report["tests"] = {"count": len(tests),
                           "seconds": round(sum(t for _, t, _ in tests), 1),
                           "outcomes": {o: sum(1 for *_, oo in tests if oo == o)
                                        for o in sorted({o for *_, o in tests})}}
        report["slowest_tests"] = [{"test": n, "seconds": round(t, 2), "outcome": o}
                                   for n, t, o in sorted(tests, key=lambda x: -x[1])[:slowest]]
    return report


def table(report, builds=15):
    """The report as text lines."""
    lines = []
    if report.get("setup_seconds") is not None:
        lines.append(f"set-up (venv, Debian packages): {report['setup_seconds']:.0f} s")
    if report.get("wall_seconds") is not None:
        lines.append(f"pytest wall time: {report['wall_seconds']:.0f} s")
    if "tests" in report:
        t = report["tests"]
        lines.append(f"tests: {t['count']} ({t['outcomes']}), {t['seconds']:.0f} s of call "
                     f"time summed over workers")
    lines.append("")
    lines.append(f"{'tool':<12}{'runs':>7}{'misses':>8}{'hits':>7}{'seconds':>10}")
    for kind, k in sorted(report["kinds"].items()):
        lines.append(f"{kind:<12}{k['events']:>7}{k['misses']:>8}{k['hits']:>7}"
                     f"{k['seconds']:>10.1f}")
    lines.append(f"distinct builds: {report['distinct_builds']}")
    lines.append("")
    lines.append(f"slowest {builds} builds (Verilator + C++ compile; hits add 0 s):")
    for b in report["builds"][:builds]:
        lines.append(f"  {b['seconds']:>7.1f} s  {b['kind']:<9} {b['name']:<24} "
                     f"miss {b['misses']} hit {b['hits']}  {Path(b['build']).parent.name}")
    if report.get("slowest_tests"):
        lines.append("")
        lines.append(f"slowest {len(report['slowest_tests'])} tests (call time):")
        for t in report["slowest_tests"]:
            lines.append(f"  {t['seconds']:>7.1f} s  {t['test']}")
    return lines


def check_budget(report, budget_path):
    """Error messages when the distinct Verilator builds exceed ``budget_path``'s numbers."""
    budget = json.loads(Path(budget_path).read_text())
    errors = []
    for kind in BUILD_KINDS:
        have, allowed = report["distinct_builds"].get(kind, 0), budget.get(kind)
        if allowed is not None and have > allowed:
            errors.append(f"{have} distinct {kind} builds, over the budget of {allowed} in "
                          f"{budget_path}: share a configuration, or raise the budget in "
                          f"the same commit")
    return errors
