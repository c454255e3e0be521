"""Kill rates of a mutmut run, per package, and the floor they must keep (``make mutate``).

mutmut 3 (``[tool.mutmut]`` in ``pyproject.toml``) copies ``hwgen/`` into ``mutants/``, changes
one operator, constant or call at a time in the files it is told to mutate (the golden models,
the host packages), and runs the tests that execute the changed function. It records each
mutant's pytest exit code in ``mutants/<file>.meta``; this module reads those files. A mutant
is *killed* when a test failed (exit code 1 or 3), *survived* when every covering test passed,
*no tests* when no selected test executes the function, *timeout* when the tests ran past
mutmut's limit. The kill rate is killed / (every checked mutant), so an untested function
lowers it; timeouts are shown apart and not counted as kills.

Standard library only; no test runs this against a live mutmut run (it takes tens of minutes),
the suite tests it on hand-written ``.meta`` files.
"""

import json
from pathlib import Path

from ..errors import ConfigError

__all__ = ["PACKAGES", "FLOORS", "read_results", "summarize", "table", "check_floors"]

#: The mutated files, grouped as the report shows them (``[tool.mutmut] only_mutate`` lists the
#: same files; ``tests/test_mutation.py`` checks that the two agree).
PACKAGES = {
    "golden: vecsearch": ["hwgen/vecsearch/golden.py"],
    "golden: ibert": ["hwgen/ibert/golden.py"],
    "golden: espn": ["hwgen/espn/golden.py"],
    "golden: recsys": ["hwgen/recsys/golden.py"],
    "golden: cluster": ["hwgen/cluster/golden/collectives.py"],
    "host: ralm": ["hwgen/ralm/knnlm.py", "hwgen/ralm/chamlm.py",
                   "hwgen/ralm/costs.py"],
}

#: Kill-rate floors the bench enforces (issue 37: 80 % on the golden models).
FLOORS = {name: 0.8 for name in PACKAGES if name.startswith("golden:")}

STATUS_BY_EXIT_CODE = {1: "killed", 3: "killed", 0: "survived", 5: "no tests", 33: "no tests",
                       None: "not checked", 34: "skipped", 36: "timeout", 24: "timeout",
                       -24: "timeout", 152: "timeout", 255: "timeout", -11: "segfault",
                       -9: "segfault", 37: "caught by type check", 2: "interrupted"}
STATUSES = ("killed", "survived", "no tests", "timeout", "not checked", "other")


def _status(code):
    status = STATUS_BY_EXIT_CODE.get(code, "other")
    return status if status in STATUSES else "other"


def read_results(results_dir):
    """``{source file: {mutant name: status}}`` from the ``.meta`` files under
    ``results_dir`` (mutmut's ``mutants/``)."""
    results_dir = Path(results_dir)
    if not results_dir.is_dir():
        raise ConfigError("results", f"{results_dir} is not a folder (run `make mutate` first)")
    out = {}
    for meta in sorted(results_dir.rglob("*.py.meta")):
        try:
            codes = json.loads(meta.read_text())["exit_code_by_key"]
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise ConfigError("results", f"{meta} is not a mutmut .meta file ({e})") from None
        source = meta.relative_to(results_dir).as_posix()[:-len(".meta")]
        out[source] = {name: _status(code) for name, code in codes.items()}
    if not out:
        raise ConfigError("results", f"no .meta files under {results_dir} (run `make mutate`)")
    return out


def _counts(statuses):
    counts = {s: 0 for s in STATUSES}
    for status in statuses:
        counts[status] += 1
    total = len(statuses)
    counts["total"] = total
    checked = total - counts["not checked"]
    counts["kill_rate"] = round(counts["killed"] / checked, 4) if checked else None
    return counts


def summarize(results, packages=None):
    """Counts and kill rate per package of ``packages`` (default :data:`PACKAGES`) and per
    file. A file of a package without results is reported as missing, not as zero."""
    packages = PACKAGES if packages is None else packages
    report = {"packages": {}, "files": {}}
    for name, files in packages.items():
        statuses = []
        missing = []
        for f in files:
            if f in results:
                report["files"][f] = _counts(list(results[f].values()))
                statuses += results[f].values()
            else:
                missing.append(f)
        report["packages"][name] = {**_counts(statuses), "missing": missing}
    return report


def table(report):
    """The report as text lines, one per package."""
    head = f"{'package':22s} {'mutants':>7s} {'killed':>6s} {'surv.':>6s} {'no test':>7s} " \
           f"{'timeout':>7s} {'kill rate':>9s}"
    lines = [head]
    for name, c in report["packages"].items():
        rate = "-" if c["kill_rate"] is None else f"{100 * c['kill_rate']:.1f} %"
        lines.append(f"{name:22s} {c['total']:7d} {c['killed']:6d} {c['survived']:6d} "
                     f"{c['no tests']:7d} {c['timeout']:7d} {rate:>9s}"
                     + (f"  (no results: {', '.join(c['missing'])})" if c["missing"] else ""))
    return lines


def check_floors(report, floors=None):
    """The packages below their kill-rate floor (or without results), as error strings."""
    floors = FLOORS if floors is None else floors
    errors = []
    for name, floor in floors.items():
        c = report["packages"].get(name)
        if c is None or c["missing"] or c["kill_rate"] is None:
            errors.append(f"{name}: no mutation results")
        elif c["kill_rate"] < floor:
            errors.append(f"{name}: kill rate {100 * c['kill_rate']:.1f} % is below the "
                          f"{100 * floor:.0f} % floor")
    return errors
