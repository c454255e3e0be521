"""`hwgen windve cost` (hwgen.windve.cost): the paper's equations 4-6 against hand calculations.

The expected numbers are worked out by hand from the paper's formulas, not from the code:

* Eq. 6, the paper's Table 1 at 2 s (FlagEmbedding on the V100: 96; WindVE: 96 + 22),
  N_peak = 1000, D = 1, P = 1: main only 1000 / 96 = 10.41667, WindVE 1000 / 118 = 8.47458;
  saving 1 - 96/118 = 22/118 = 0.186441 -> the paper's 18.6%.
* At 1 s (44 + 8): 8 / 52 = 15.3846%.
* Eq. 4 with t_proc = 0.27 s, SLO 2 s: (2 - 0.27) / 0.27 = 6.407 -> n = 6; at 1 s:
  0.73 / 0.27 = 2.704 -> n = 2.
* Eq. 5 at 2 s, N = 100 q/s, T = C / SLO = 48 and 59 q/s: (100 / 6) / 48 = 0.347222 and
  (100 / 6) / 59 = 0.282486; saving 1 - 48/59 = 11/59 = 18.644%.
"""

import json

import pytest
from click.testing import CliRunner

from hwgen.cli import main
from hwgen.errors import ConfigError
from hwgen.windve import cost


def test_equation_6_reproduces_the_papers_saving():
    result = cost.costs(cost.paper_figures(2.0), peak=1000, qps=100)
    assert result["peak"]["main_only"] == pytest.approx(10.41667, abs=1e-5)
    assert result["peak"]["heterogeneous"] == pytest.approx(8.47458, abs=1e-5)
    assert result["peak"]["saving_percent"] == pytest.approx(18.6441, abs=1e-4)
    assert round(result["peak"]["saving_percent"], 1) == 18.6               # the paper
    assert result["concurrency_gain_percent"] == pytest.approx(22.9167, abs=1e-4)
    one = cost.costs(cost.paper_figures(1.0))
    assert one["peak"]["saving_percent"] == pytest.approx(15.3846, abs=1e-4)


def test_equations_4_and_5_by_hand():
    result = cost.costs(cost.paper_figures(2.0), peak=1000, qps=100)
    assert result["n"] == 6
    assert cost.queries_per_wait(1.0, 0.27) == 2
    assert cost.queries_per_wait(1.0, 0.6) == 0                  # no room to wait
    assert result["average"]["main_only"] == pytest.approx(0.347222, abs=1e-6)
    assert result["average"]["heterogeneous"] == pytest.approx(0.282486, abs=1e-6)
    assert result["average"]["saving_percent"] == pytest.approx(18.644, abs=1e-3)
    assert cost.average_cost(100, 0, 48) is None


def test_devices_and_price_scale_costs_not_savings():
    base = cost.costs(cost.paper_figures(2.0))
    scaled = cost.costs(cost.paper_figures(2.0), devices=2, price=3.5, peak=7, qps=9)
    assert scaled["peak"]["main_only"] == pytest.approx(7 / 96 * 2 * 3.5)
    assert scaled["peak"]["saving_percent"] == pytest.approx(base["peak"]["saving_percent"])
    assert scaled["average"]["saving_percent"] == pytest.approx(
        base["average"]["saving_percent"])


def _calibration(tmp_path, cpu=True):
    devices = [{"role": "main", "instances": ["cpu0"], "alpha": 0.01, "beta": 0.02,
                "depths": {"1.0": {"final": 90}, "2.0": {"final": 190}}}]
    if cpu:
        devices.append({"role": "cpu", "instances": ["cpu1"], "alpha": 0.04, "beta": 0.1,
                        "depths": {"1.0": {"final": 20}, "2.0": {"final": 45}}})
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"devices": devices, "table": []}))
    return path


def test_figures_from_a_calibration(tmp_path):
    # by hand: T_main = 90 / (0.01 * 90 + 0.02) = 90 / 0.92 = 97.826; T_cpu = 20 / 0.9 =
    # 22.222; WindVE 120.048; t_proc = 0.03; Eq. 6 saving 20 / 110 = 18.18%
    figures = cost.figures_from_file(_calibration(tmp_path), 1.0)
    assert figures["main_concurrency"] == 90 and figures["cpu_concurrency"] == 20
    assert figures["main_throughput"] == pytest.approx(97.826, abs=1e-3)
    assert figures["heterogeneous_throughput"] == pytest.approx(120.048, abs=1e-3)
    assert figures["t_proc"] == pytest.approx(0.03)
    assert cost.costs(figures)["peak"]["saving_percent"] == pytest.approx(18.1818, abs=1e-4)
    assert cost.figures_from_file(_calibration(tmp_path))["slo"] == 1.0      # the first


def test_figures_from_a_compare_report(tmp_path):
    report = {"slo": 1.0, "main_only": {"depth": 60, "throughput": 70.0, "t_proc": 0.05},
              "heterogeneous": {"cpu_depth": 12, "throughput": 80.5}, "gain": {}}
    path = tmp_path / "s.json"
    path.write_text(json.dumps(report))
    figures = cost.figures_from_file(path)
    assert (figures["main_concurrency"], figures["cpu_concurrency"]) == (60, 12)
    result = cost.costs(figures)
    assert result["peak"]["saving_percent"] == pytest.approx(100 * 12 / 72)
    assert result["average"]["saving_percent"] == pytest.approx(100 * (1 - 70 / 80.5))
    with pytest.raises(ConfigError, match="^slo"):
        cost.figures_from_file(path, 2.0)


def test_cli_defaults_say_so(tmp_path):
    out = tmp_path / "cost.json"
    result = CliRunner().invoke(main, ["serve", "cost", "--json", str(out)])
    assert result.exit_code == 0, result.output
    assert "defaults" in result.stdout and "Table 1" in result.stdout
    assert "saving: 18.6%" in result.stdout
    assert json.loads(out.read_text())["peak"]["saving_percent"] == pytest.approx(18.6441,
                                                                                abs=1e-4)


def test_cli_with_a_calibration(tmp_path):
    result = CliRunner().invoke(main, ["serve", "cost", "--calibration",
                                       str(_calibration(tmp_path)), "--slo", "2"])
    assert result.exit_code == 0, result.output
    assert "measured" in result.stdout and "saving: 19.1%" in result.stdout      # 45/235


@pytest.mark.parametrize("make, args, needle", [
    (None, ["--calibration", "/nonexistent/c.json"], "calibration"),
    ("text", ["--calibration", "{path}"], "calibration"),
    ("list", ["--calibration", "{path}"], "calibration"),
    ("nocpu", ["--calibration", "{path}"], "calibration"),
    ("badcompare", ["--calibration", "{path}"], "calibration"),
    ("cal", ["--calibration", "{path}", "--slo", "3"], "slo"),
    (None, ["--slo", "3"], "slo"),
    (None, ["--peak", "0"], "peak"),
    (None, ["--qps", "-1"], "qps"),
    (None, ["--devices-per-instance", "0"], "devices_per_instance"),
    (None, ["--price", "nan"], "price"),
])
def test_bad_input_is_one_line(tmp_path, make, args, needle):
    path = tmp_path / "f.json"
    if make == "text":
        path.write_text("not json")
    elif make == "list":
        path.write_text("[1, 2]")
    elif make == "nocpu":
        path = _calibration(tmp_path, cpu=False)
    elif make == "badcompare":
        path.write_text(json.dumps({"slo": 1, "main_only": {"depth": 0}, "heterogeneous": {}}))
    elif make == "cal":
        path = _calibration(tmp_path)
    result = CliRunner().invoke(main, ["serve", "cost", *[a.format(path=path) for a in args]])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hwgen: error:") and needle in lines[0]
