"""The timing table of record (``hwgen/flow/timing_results.json``): the README's timing table is
generated from it, every row is consistent and current (its Verilog is what the gateware emits
today), ``hwgen build`` reads it, and a malformed file is one clear error."""

import copy
import hashlib
import json
from pathlib import Path
import statistics

import pytest

from hwgen import registry
from hwgen.errors import ConfigError
from hwgen.flow import sweep, timing_table
from hwgen.flow.emit import emit_accelerator
from hwgen.flow.timing import cached_timing
from hwgen.flow.timing_bench import BENCH_CONFIGS, row_key

TABLE = timing_table.load()
ROWS = list(TABLE["rows"].values())
BENCH = {row_key(n, s): (n, s) for n, s in BENCH_CONFIGS}


def _row(**changes):
    """A well-formed measured row (figures made up for the table's own checks)."""
    row = {"block": "gmi-header", "accelerator": "gmi-header", "config": {},
           "config_digest": "d", "verilog_sha256": "0" * 64, "device": "LFE5U-85F",
           "seeds": [1, 2, 3], "fmax_mhz_per_seed": [300.0, 310.5, 305.25],
           "fmax_mhz": 305.25, "failed_seeds": {}, "reference": {"fmax_mhz": 136.0,
                                                                 "per_seed": [136.0] * 3},
           "fmax_ratio": 2.245, "goal_ratio": 0.9, "critical_path": None,
           "ecp5_cells": {"lut4": 10, "ff": 20, "carry": 0, "dp16kd": 0, "mult18": 0,
                          "lutram": 0, "pfumx": 0},
           "ultrascale": {"lut_levels": 2, "carry_chains": 1, "dsp_ram_levels": 0,
                          "goal_met": True},
           "tools": {}, "measured": {"date": "2026-11-27", "machine": "m", "seconds": 1.0}}
    row.update(changes)
    return row


def test_readme_table_is_generated_from_the_results():
    """The timing page's block between the markers is exactly :func:`markdown` of the file, so
    a number edited by hand in either place fails here (regenerate with ``make timing`` or
    ``hwgen bench timing --readme docs/guides/timing.md``)."""
    text = (Path(__file__).resolve().parents[1] / "docs" / "guides" / "timing.md").read_text()
    start = text.index(timing_table.README_BEGIN) + len(timing_table.README_BEGIN)
    end = text.index(timing_table.README_END)
    assert text[start:end] == "\n" + timing_table.markdown(TABLE)


@pytest.mark.parametrize("row", ROWS, ids=[r["block"] for r in ROWS])
def test_row_is_consistent(row):
    """Each row names a bench configuration, its digest is that configuration's, the median
    and ratio follow from the per-seed figures and the reference of the same run."""
    assert row["block"] in BENCH, "a row the bench does not measure"
    name, sets = BENCH[row["block"]]
    acc = registry.get(name)
    assert row["accelerator"] == name
    cfg = acc.config.from_dict(row["config"])
    assert cfg.digest() == row["config_digest"] == acc.make_config(list(sets)).digest()
    if "error" in row:
        return
    fmax = [f for f in row["fmax_mhz_per_seed"] if f is not None]
    assert len(row["fmax_mhz_per_seed"]) == len(row["seeds"])
    assert row["fmax_mhz"] == round(statistics.median(fmax), 2)
    ref = row["reference"]
    assert ref["fmax_mhz"] == round(statistics.median([f for f in ref["per_seed"] if f]), 2)
    assert row["fmax_ratio"] == round(row["fmax_mhz"] / ref["fmax_mhz"], 3)


EMITTED = [r for r in ROWS if r["verilog_sha256"]]      # error rows of a failed emission: none


@pytest.mark.parametrize("row", EMITTED, ids=[r["block"] for r in EMITTED])
def test_row_is_current(row, tmp_path):
    """The Verilog each row measured is what its configuration emits now: gateware changed
    after a measurement makes its row stale, and it must be measured again."""
    acc = registry.get(row["accelerator"])
    v_path, _ = emit_accelerator(acc, acc.config.from_dict(row["config"]), tmp_path)
    assert hashlib.sha256(v_path.read_bytes()).hexdigest() == row["verilog_sha256"], \
        f"{row['block']}: gateware changed since {row['measured']['date']}; run " \
        f"hwgen bench timing --only {row['accelerator']} --readme docs/guides/timing.md"


def test_merge_replaces_measured_rows_and_keeps_the_rest():
    a, b = _row(), _row(block="pq-decoder", accelerator="pq-decoder")
    table = timing_table.merge({"rows": {"pq-decoder": b, "gmi-header": a}}, [])
    new = _row(fmax_mhz_per_seed=[200.0], fmax_mhz=200.0, seeds=[1])
    merged = timing_table.merge(table, [new], order=["pq-decoder", "gmi-header"])
    assert list(merged["rows"]) == ["pq-decoder", "gmi-header"]
    assert merged["rows"]["gmi-header"] == new and merged["rows"]["pq-decoder"] == b


@pytest.mark.parametrize("change, param", [
    ({"fmax_mhz": 300.0}, "fmax_mhz"),               # not the median of the seeds
    ({"block": "other"}, "block"),                   # not its key
])
def test_malformed_row_names_it(tmp_path, change, param):
    row = _row(**change)
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"format": 1, "rows": {"gmi-header": row}}))
    with pytest.raises(ConfigError) as e:
        timing_table.load(path)
    assert e.value.param == f"timing_results.rows['gmi-header'].{param}"


@pytest.mark.parametrize("text", ["not json", "[]", '{"format": 2, "rows": {}}',
                                  '{"format": 1, "rows": {"a": {"block": "a"}}}'])
def test_malformed_file_is_one_clear_error(tmp_path, text):
    path = tmp_path / "t.json"
    path.write_text(text)
    with pytest.raises(ConfigError, match="timing_results"):
        timing_table.load(path)


def test_build_report_reads_the_table(tmp_path, monkeypatch):
    """Without a ``hwgen timing`` run of its own, ``report.json``'s timing is the table's row
    that placed the same Verilog, with its source named; other Verilog gets none."""
    acc = registry.get("gmi-header")
    cfg = acc.make_config([])
    text = "module gmi_header(); endmodule\n"
    row = _row(verilog_sha256=hashlib.sha256(text.encode()).hexdigest())
    path = tmp_path / "timing_results.json"
    timing_table.save({"format": 1, "rows": {"gmi-header": row}}, path)
    monkeypatch.setattr(timing_table, "RESULTS", path)
    monkeypatch.setattr("hwgen.flow.timing.work_dir", lambda a, c: tmp_path / "none")
    got = cached_timing(acc, cfg, text)
    assert got["source"] == "timing_results.json"
    assert got["fmax_mhz"] == row["fmax_mhz"] and got["fmax_ratio"] == row["fmax_ratio"]
    assert got["reference"] == {"fmax_mhz": 136.0}
    assert cached_timing(acc, cfg, text + " ") is None
    failed = copy.deepcopy(row)
    failed["error"] = "does not fit"
    timing_table.save({"format": 1, "rows": {"gmi-header": failed}}, path)
    assert cached_timing(acc, cfg, text) is None


def test_markdown_says_what_was_not_measured():
    row = timing_table.error_row("chamvs-node", "chamvs-node", {}, "d", None, 3,
                                 "DP16KD 332/208")
    notes = {"chamvs-node": "stands for it", "maxsim": "not in the table: not printed"}
    lines = timing_table.markdown({"rows": {"chamvs-node": row, "gmi-header": _row()},
                                   "notes": notes})
    assert lines.endswith("\n\n- **chamvs-node**: stands for it\n")
    assert "| chamvs-node | - |" in lines and "not measured: DP16KD 332/208" in lines
    assert "| gmi-header | 305.2 (300.0, 310.5, 305.2) | 136.0 | 2.245 | 2L+1c | ratio ok, " \
           "depth ok |" in lines


@pytest.mark.parametrize("value", ["3", 0, 21, 2.5, [1]])
def test_sweep_timing_key_is_checked(value):
    with pytest.raises(ConfigError) as e:
        sweep.load_spec([{"accelerator": "gmi-header", "timing": value}])
    assert e.value.param == "spec[0].timing"


def test_sweep_timing_jobs_without_simulations():
    jobs = sweep.load_spec([{"accelerator": "gmi-header", "configs": [{}, {"data_bits": 512}],
                             "seeds": [], "timing": True}])
    assert [(j.kind, j.seed, j.params) for j in jobs] == \
        [("timing", 3, {}), ("timing", 3, {"data_bits": 512})]


def test_sum_of_parts_blocks_have_two_fitting_sizes():
    """Each block measured as the sum of its parts is measured in at least two other
    configurations (the two sizes that show the critical path does not grow), and has a
    note saying so; every note names a registered block."""
    from hwgen.flow.timing_bench import NOTES, SUM_OF_PARTS
    for name in SUM_OF_PARTS:
        assert sum(1 for n, sets in BENCH_CONFIGS if n == name and sets) >= 2
        assert name in NOTES
    for name in NOTES:
        registry.get(name)


def test_measured_clock_is_the_slowest_block_times_the_kernel_clock(tmp_path):
    path = tmp_path / "t.json"
    rows = {"gmi-header": _row(fmax_ratio=2.245),
            "pq-decoder": _row(block="pq-decoder", accelerator="pq-decoder", fmax_ratio=0.8),
            "maxsim": timing_table.error_row("maxsim", "maxsim", {}, "d", None, 1, "x")}
    timing_table.save({"format": 1, "rows": rows}, path)
    got = timing_table.measured_clock({"gmi-header", "pq-decoder"}, 300, path)
    assert got == {"clock_mhz": 240.0, "ratio": 0.8, "block": "pq-decoder"}
    assert timing_table.measured_clock({"gmi-header"}, 300, path)["clock_mhz"] == 300.0
    assert timing_table.measured_clock({"maxsim"}, 300, path) == \
        {"clock_mhz": None, "ratio": None, "block": None}


def test_only_picks_a_block_or_a_single_row():
    """``hwgen bench timing --only``: an accelerator's name picks all its rows, a row's name
    that row alone (so one configuration can be measured without the block's others)."""
    from hwgen.flow.timing_bench import selected_configs
    assert selected_configs(["ibert-linear"]) == [
        ("ibert-linear", ()), ("ibert-linear", ("tiles=2",)), ("ibert-linear", ("tiles=4",))]
    assert selected_configs(["ibert-linear tiles=4"]) == [("ibert-linear", ("tiles=4",))]
    assert selected_configs(["gmi-header"]) == [("gmi-header", ())]
    assert len(selected_configs()) == len(BENCH_CONFIGS)


@pytest.mark.parametrize("place_large", [False, True])
def test_large_defaults_stand_as_the_sum_of_their_parts(tmp_path, monkeypatch, place_large):
    """``make timing`` places every row but the defaults of the :data:`SUM_OF_PARTS` blocks
    (each fails to fit or runs into the flow's time limit): their rows are unmeasured and name
    the parts' measured ratios; ``--place-large`` submits them too."""
    from hwgen.flow import timing_bench
    submitted = []

    def fake_sweep(entries, out, **kw):      # places nothing: each part at ratio 0.95
        submitted.extend((e["accelerator"], e["configs"][0]) for e in entries)
        row = _row(fmax_ratio=0.95)
        report = {**{k: row[k] for k in ("verilog_sha256", "device", "seeds", "fmax_mhz",
                                          "fmax_mhz_per_seed", "reference", "fmax_ratio",
                                          "goal_ratio", "tools")},
                  "resources": row["ecp5_cells"]}
        return [{"job": i, "report": {**report, "accelerator": e["accelerator"],
                                      "config": e["configs"][0]}}
                for i, e in enumerate(entries)]
    monkeypatch.setattr(timing_bench, "run_sweep", fake_sweep)
    results = tmp_path / "t.json"
    rows = timing_bench.bench_timing(lambda _: None, names=["ibert-linear"], results=results,
                                     out_dir=tmp_path / "out", place_large=place_large)
    default = registry.get("ibert-linear").make_config([]).to_dict()
    assert (("ibert-linear", default) in submitted) == place_large
    assert len(submitted) == 3 - (not place_large) and len(rows) == 3
    row = timing_table.load(results)["rows"]["ibert-linear"]
    if place_large:
        assert row["fmax_ratio"] == 0.95
    else:
        assert "fmax_ratio" not in row and rows[-1]["block"] == "ibert-linear"
        assert row["error"].startswith("sum of its parts") and row["error"].endswith(
            "`ibert-linear tiles=2` 0.950, `ibert-linear tiles=4` 0.950")


def _gmi_header_sha(tmp_path):
    acc = registry.get("gmi-header")
    v_path, _ = emit_accelerator(acc, acc.make_config([]), tmp_path)
    return hashlib.sha256(v_path.read_bytes()).hexdigest()


@pytest.mark.parametrize("change, kept", [
    ({}, True),
    ({"flow": "another flow"}, False),              # other tools, passes or reference
    ({"flow": None}, False),                         # measured before fingerprints
    ({"seeds": [1, 2], "fmax_mhz_per_seed": [300.0, 310.5], "fmax_mhz": 305.25}, False),
    ({"failed_seeds": {"3": "timed out after 1200 s"}}, True),     # would stop there again
    ({"failed_seeds": {"3": "timed out after 600 s"}}, False),      # this run allows longer
    ({"failed_seeds": {"3": "timed out after 1200 s", "1": "nextpnr failed (exit 1)"}}, False),
    ({"verilog_sha256": "1" * 64}, False),           # the gateware changed since
    ({"error": "does not fit"}, False),
])
def test_a_row_is_kept_only_when_nothing_that_decides_it_changed(tmp_path, change, kept):
    """``make timing`` keeps a row of the table of record, instead of placing it again, only
    when its Verilog, seeds and flow fingerprint are this run's and no seed could end
    otherwise: every seed finished, or timed out under a limit at least this run's (1,200 s)."""
    from hwgen.flow.timing_bench import kept_rows
    row = _row(verilog_sha256=_gmi_header_sha(tmp_path), flow="f" * 16)
    row.update(change)
    table = {"rows": {"gmi-header": row}}
    got = kept_rows([("gmi-header", ())], 3, table, flow="f" * 16, timeout_s=1200)
    assert (got == {"gmi-header": row}) == kept


@pytest.mark.parametrize("remeasure", [False, True])
def test_kept_rows_are_not_placed_again(tmp_path, monkeypatch, remeasure):
    """A kept row is not submitted to the sweep and stays in the table as it was;
    ``--remeasure`` submits it."""
    from hwgen.flow import timing_bench
    submitted = []

    def fake_sweep(entries, out, **kw):
        submitted.extend(e["accelerator"] for e in entries)
        row = _row(fmax_ratio=0.95, fmax_mhz_per_seed=[129.2] * 3, fmax_mhz=129.2)
        report = {**{k: row[k] for k in ("verilog_sha256", "device", "seeds", "fmax_mhz",
                                          "fmax_mhz_per_seed", "reference", "fmax_ratio",
                                          "goal_ratio", "tools")},
                  "resources": row["ecp5_cells"], "flow": "f" * 16}
        return [{"job": i, "report": {**report, "accelerator": e["accelerator"],
                                      "config": e["configs"][0]}}
                for i, e in enumerate(entries)]
    monkeypatch.setattr(timing_bench, "run_sweep", fake_sweep)
    monkeypatch.setattr(timing_bench, "flow_fingerprint", lambda **_: "f" * 16)
    results = tmp_path / "t.json"
    old = _row(verilog_sha256=_gmi_header_sha(tmp_path / "v"), flow="f" * 16)
    timing_table.save({"format": timing_table.FORMAT, "rows": {"gmi-header": old}}, results)
    printed = []
    timing_bench.bench_timing(printed.append, names=["gmi-header"], results=results,
                              out_dir=tmp_path / "out", remeasure=remeasure)
    row = timing_table.load(results)["rows"]["gmi-header"]
    assert submitted == (["gmi-header"] if remeasure else [])
    assert row["fmax_ratio"] == (0.95 if remeasure else old["fmax_ratio"])
    assert any("kept: measured 2026-11-27" in line for line in printed) != remeasure
