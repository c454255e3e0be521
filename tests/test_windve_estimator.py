"""WindVE's queue-depth estimator (hwgen.windve.estimator): the NNLS fit of paper eq. 12,
the depth it predicts, the step stress test it is compared with (Table 3), and input errors."""

import numpy as np
import pytest

from hwgen.errors import ConfigError
from hwgen.windve.estimator import (fit_linear, predict_depth, profile_points,
                                         stress_depth, table3)


def linear(alpha, beta):
    """A synthetic device whose latency at concurrency C is exactly alpha*C + beta."""
    return lambda c: alpha * c + beta


def test_fit_recovers_exact_line():
    cs = [1, 3, 8, 23, 64]
    alpha, beta = fit_linear(cs, [linear(0.015, 0.27)(c) for c in cs])
    assert alpha == pytest.approx(0.015, rel=1e-9)
    assert beta == pytest.approx(0.27, rel=1e-9)


def test_fit_accepts_numpy_and_repeated_concurrencies():
    cs = np.array([2, 2, 4, 4])
    alpha, beta = fit_linear(cs, np.array([0.5, 0.7, 0.9, 1.1]))     # means 0.6 and 1.0
    assert (alpha, beta) == (pytest.approx(0.2), pytest.approx(0.2))


def test_fit_clamps_negative_slope_to_zero():
    cs = [1, 2, 4, 8, 16]
    ts = [0.52, 0.50, 0.49, 0.47, 0.44]                  # noise that slopes downwards
    assert np.polyfit(cs, ts, 1)[0] < 0                  # unconstrained least squares would
    alpha, beta = fit_linear(cs, ts)
    assert alpha == 0.0
    assert beta == pytest.approx(np.mean(ts))            # best constant


def test_fit_clamps_negative_intercept_to_zero():
    cs = [4, 8, 16]
    alpha, beta = fit_linear(cs, [0.1, 0.3, 0.7])        # exact line 0.05*C - 0.1
    assert beta == 0.0 and alpha > 0
    assert alpha == pytest.approx(np.dot(cs, [0.1, 0.3, 0.7]) / np.dot(cs, cs))


@pytest.mark.parametrize("alpha, beta, slo, depth", [
    (0.02, 0.1, 1.0, 45),          # 0.02*45 + 0.1 == 1.0 exactly: equality meets the SLO
    (0.02, 0.1, 0.999, 44),
    (0.1, 0.2, 0.5, 3),            # 0.1*3 + 0.2 rounds to 0.5000000000000001, still met
    (0.25, 0.25, 1.0, 3),
    (0.3, 1.5, 1.0, 0),            # a lone request already misses
    (0.0, 1.5, 1.0, 0),            # flat but above the SLO
    (0.5, 1.0, 1.0, 0),            # only C = 0 meets it
])
def test_predict_depth(alpha, beta, slo, depth):
    assert predict_depth(alpha, beta, slo) == depth
    if depth:
        assert alpha * depth + beta <= slo + 1e-12
    assert alpha * (depth + 1) + beta > slo


def test_predict_depth_flat_fit_is_an_error():
    with pytest.raises(ConfigError, match=r"^slo=1\.0: .*flat"):
        predict_depth(0.0, 0.3, 1.0)


@pytest.mark.parametrize("args, param", [
    ((-0.1, 0.2, 1.0), "alpha"), ((0.1, -0.2, 1.0), "beta"), ((0.1, 0.2, 0.0), "slo"),
    ((float("nan"), 0.2, 1.0), "alpha"), ((0.1, float("inf"), 1.0), "beta"),
    ((0.1, 0.2, "1"), "slo"), ((True, 0.2, 1.0), "alpha"), ((1e-300, 0.0, 1.0), "alpha"),
])
def test_predict_depth_rejects(args, param):
    with pytest.raises(ConfigError) as err:
        predict_depth(*args)
    assert err.value.param == param


def test_stress_depth_stops_at_first_failure():
    calls = []

    def measure(c):
        calls.append(c)
        return linear(0.02, 0.1)(c)              # meets 1 s up to C = 45

    depth, trace = stress_depth(measure, 1.0)
    assert depth == 40
    assert [c for c, _ in trace] == calls == [8, 16, 24, 32, 40, 48]
    assert trace[-1][1] == pytest.approx(1.06)


def test_stress_depth_start_step_and_limit():
    depth, trace = stress_depth(linear(0.02, 0.1), 1.0, step=4, start=2)
    assert depth == 42 and [c for c, _ in trace][:3] == [2, 6, 10] and trace[-1][0] == 46
    depth, trace = stress_depth(linear(0.001, 0.1), 1.0, step=8, limit=30)   # never fails
    assert depth == 24 and [c for c, _ in trace] == [8, 16, 24]
    depth, trace = stress_depth(linear(0.02, 0.9), 1.0)                     # first one fails
    assert depth == 0 and trace == [(8, pytest.approx(1.06))]


@pytest.mark.parametrize("kwargs, param", [
    ({"measure": 3}, "measure"), ({"slo": 0}, "slo"), ({"step": 0}, "step"),
    ({"step": 2.5}, "step"), ({"start": 0}, "start"), ({"limit": 4}, "limit"),
    ({"measure": lambda c: float("nan")}, "measure"), ({"measure": lambda c: None}, "measure"),
    ({"measure": lambda c: -1.0}, "measure"),
])
def test_stress_depth_rejects(kwargs, param):
    args = {"measure": linear(0.02, 0.1), "slo": 1.0} | kwargs
    with pytest.raises(ConfigError) as err:
        stress_depth(**args)
    assert err.value.param == param


@pytest.mark.parametrize("kwargs, param", [
    ({"concurrency": [1, 2], "latency": [0.1]}, "latency"),
    ({"concurrency": [4, 4, 4], "latency": [0.1, 0.2, 0.3]}, "concurrency"),
    ({"concurrency": [4], "latency": [0.1]}, "concurrency"),
    ({"concurrency": [], "latency": []}, "concurrency"),
    ({"concurrency": [0, 2], "latency": [0.1, 0.2]}, "concurrency"),
    ({"concurrency": [1, float("nan")], "latency": [0.1, 0.2]}, "concurrency"),
    ({"concurrency": [1, 2], "latency": [0.1, -0.2]}, "latency"),
    ({"concurrency": [1, 2], "latency": [0.1, float("inf")]}, "latency"),
    ({"concurrency": [1, 2], "latency": [0.0, 0.2]}, "latency"),
    ({"concurrency": [[1, 2], [3, 4]], "latency": [0.1, 0.2]}, "concurrency"),
    ({"concurrency": ["a", "b"], "latency": [0.1, 0.2]}, "concurrency"),
])
def test_fit_rejects(kwargs, param):
    with pytest.raises(ConfigError) as err:
        fit_linear(**kwargs)
    assert err.value.param == param


def test_regression_beats_coarse_stress_test():
    """Table 3's observation: a step-8 stress test misses the peak that the fit finds."""
    device = linear(0.02, 0.07)                  # true maximum within 1 s: C = 46 (0.99 s)
    assert device(46) <= 1.0 < device(47)
    stress, _ = stress_depth(device, 1.0, step=8)
    cs = profile_points(32)
    predicted = predict_depth(*fit_linear(cs, [device(c) for c in cs]), 1.0)
    assert (stress, predicted) == (40, 46)


def test_regression_on_noisy_profile_close_to_truth():
    rng = np.random.default_rng(1)
    device = linear(0.0169, 0.27)                # roughly the paper's V100 fit: ~43 at 1 s
    cs = profile_points(40, 6)
    ts = [device(c) * (1 + rng.normal(0, 0.02)) for c in cs]
    assert abs(predict_depth(*fit_linear(cs, ts), 1.0) - 43) <= 3


@pytest.mark.parametrize("max_c, points, expected", [
    (64, 5, [1, 3, 8, 23, 64]), (32, 5, [1, 2, 6, 13, 32]), (5, 5, [1, 2, 3, 4, 5]),
    (3, 5, [1, 2, 3]), (2, 2, [1, 2]), (1000, 3, [1, 32, 1000]),
])
def test_profile_points(max_c, points, expected):
    assert profile_points(max_c, points) == expected


@pytest.mark.parametrize("max_c, points, param", [
    (1, 5, "max_c"), (0, 5, "max_c"), (8.0, 3, "max_c"), (8, 1, "points"), (8, "3", "points"),
])
def test_profile_points_rejects(max_c, points, param):
    with pytest.raises(ConfigError) as err:
        profile_points(max_c, points)
    assert err.value.param == param


def test_table3_lines():
    rows = [{"device": "Tesla V100", "slo": 1.0, "linear_regression": 40, "stress_test": 40,
             "final": 44},
            {"device": "Intel Xeon E5", "slo": 2, "linear_regression": 20, "stress_test": 18,
             "final": None}]
    lines = table3(rows)
    assert len(lines) == 4
    assert lines[0].split() == ["device", "SLO", "(s)", "linear", "regression", "stress",
                                "test", "final"]
    assert set(lines[1]) <= {"-", " "}
    assert lines[2].split() == ["Tesla", "V100", "1", "40", "40", "44"]
    assert lines[3].split() == ["Intel", "Xeon", "E5", "2", "20", "18", "-"]
    assert len({len(line) for line in lines}) == 1           # aligned columns
    assert table3([])[0].split() == lines[0].split() and len(table3([])) == 2
    with pytest.raises(ConfigError, match="^rows"):
        table3([("V100", 1.0)])
