"""I-BERT softmax kernel: the iterative divider against Python's divmod, the configuration's
width bounds and exactness limit against brute force and exact rationals, the stimulus's
coverage, the bank count and cycle model, and the cycle model against Verilator simulation
(``tests/test_sim.py`` runs the bit-exact comparisons with stalls)."""

import random
from fractions import Fraction

import numpy as np
import pytest
from amaranth.sim import Simulator

from hwgen import registry
from hwgen.errors import ConfigError
from hwgen.ibert import golden
from hwgen.ibert.softmax import TEST_CONFIGS, SoftmaxConfig, SoftmaxModel
from hwgen.lib.divider import Divider, divide

from conftest import requires_verilator


# -- divider -----------------------------------------------------------------------------------

def _run_divider(n, k, step, cases):
    """Divide each pair on the Amaranth simulator; returns results and, per division, the
    cycles from acceptance to o.valid and between acceptances (consumer always ready)."""
    dut = Divider(n, k, step)
    results, accepted, produced = [], [], []
    sim = Simulator(dut)
    sim.add_clock(1e-8)

    async def producer(ctx):
        cycle = 0
        for a, b in cases:
            ctx.set(dut.i.payload, {"dividend": a, "divisor": b})
            ctx.set(dut.i.valid, 1)
            while True:
                _, _, ready = await ctx.tick().sample(dut.i.ready)
                cycle += 1
                if ready:
                    accepted.append(cycle)
                    break
        ctx.set(dut.i.valid, 0)

    async def consumer(ctx):
        ctx.set(dut.o.ready, 1)
        cycle = 0
        async for _, _, valid, payload in ctx.tick().sample(dut.o.valid, dut.o.payload):
            cycle += 1
            if valid:
                results.append((payload.quotient, payload.remainder))
                produced.append(cycle)
                if len(results) == len(cases):
                    break

    sim.add_testbench(producer)
    sim.add_testbench(consumer)
    sim.run()
    return results, accepted, produced


@pytest.mark.parametrize("n, k, step", [(33, 22, 1), (33, 21, 3), (7, 3, 2), (6, 6, 6),
                                        (1, 1, 1)])
def test_divider_matches_divmod_and_timing(n, k, step):
    rng = random.Random(n * 100 + k * 10 + step)
    top = 1 << 32 if n == 33 else (1 << n) - 1
    cases = [(top, 1), (top, (1 << k) - 1), (0, 1), (top, 0), (1, (1 << k) - 1)]
    cases += [(rng.randrange(1 << n), rng.randrange(1, 1 << k)) for _ in range(30)]
    results, accepted, produced = _run_divider(n, k, step, cases)
    for (a, b), got in zip(cases, results):
        want = divmod(a, b) if b else ((1 << n) - 1, a % (1 << k))
        assert got == want == divide(a, b, n, k), (a, b)
    iterations = -(-n // step)
    assert [p - a for a, p in zip(accepted, produced)] == [iterations + 1] * len(cases)
    assert {b - a for a, b in zip(accepted, accepted[1:])} == {iterations + 2}


def test_divide_model_exhaustive_small():
    for a in range(64):
        for b in range(16):
            q, r = divide(a, b, 6, 4)
            if b:
                assert (q, r) == divmod(a, b)
            else:
                assert (q, r) == (63, a % 16)


# -- configuration ---------------------------------------------------------------------------

def _exact_e16(z, qq, m, e):
    """``clamp(round_half_even(z m / 2**(e - 30 + qq)), 0, 32767)`` in exact rationals."""
    value = Fraction(int(z) * m, 1) / Fraction(2) ** (e - golden.EXP_CONST + int(qq))
    return min(round(value), 32767)              # Python rounds half to even


@pytest.mark.parametrize("cfg", TEST_CONFIGS, ids=range(len(TEST_CONFIGS)))
def test_width_bounds_are_exact(cfg):
    """``z_max`` and ``qq_max`` (which size the datapath) are the true maxima over every
    input the configuration allows."""
    c = SoftmaxConfig.from_dict(cfg)
    k = c.constants
    x = np.arange(max(-((1 << c.in_bits) - 1), -31 * c.divisor - 5), 1,
                  dtype=np.int64)                 # every q - max the input width allows
    z, qq = golden.exp_parts(x, k["x0_int"], k["b_int"], k["c_int"])
    assert z.max() == c.z_max
    assert qq.max() == c.qq_max
    assert c.z_max * k["dyadic"][0] == c.t_max < 1 << 63


def test_default_act_scale_is_the_calibrated_one():
    """act_scale=0 uses what a reference IntSoftmax calibrates on real rows."""
    c = SoftmaxConfig()
    rng = np.random.default_rng(5)
    stim = SoftmaxModel.stimulus(c, 12, rng, length=64)
    q = np.stack(stim["rows"])
    assert np.float32(c.act) == golden.calibrate_softmax(q, c.scale)
    calibrated = golden.calibrate_softmax(q, c.scale)
    assert c.constants["dyadic"] == golden.dyadic(1.0 / float(calibrated))


@pytest.mark.parametrize("scale", [0.0033, 0.0032, 1e-3, 1e-4])
def test_golden_exp16_is_exact_at_small_scales(scale):
    """Typical attention-score scales need requantisation shifts beyond 63 bits: the golden
    model (and so the RTL) must still round exactly; configurations are accepted."""
    calibrated = golden.calibrate_softmax(np.zeros((1, 1), dtype=np.int64), scale)
    k = golden.softmax_constants(scale, calibrated)
    m, e = k["dyadic"]
    z = np.array([1, k["c_int"] // 3, k["c_int"]])
    assert all(int(golden.exp16(zz, qq, m, e)) == _exact_e16(zz, qq, m, e)
               for zz in z for qq in range(31))
    SoftmaxConfig(scale=scale)


def test_golden_exp16_is_exact_beyond_64_bit_products():
    """At a scores' scale near 8e-6 (a randomly initialised model's), ``z * m`` passes 2**63:
    the golden model computes it in Python integers instead of wrapping (it returned 0 where
    the exact value is 30,430); the RTL refuses such configurations."""
    scale = 8.089735274552368e-06
    calibrated = golden.calibrate_softmax(np.zeros((1, 1), dtype=np.int64), scale)
    k = golden.softmax_constants(scale, calibrated)
    m, e = k["dyadic"]
    z = np.array([1, k["c_int"] // 3, k["c_int"]])
    assert int(z.max()) * m >= 1 << 63
    assert all(int(golden.exp16(zz, qq, m, e)) == _exact_e16(zz, qq, m, e)
               for zz in z for qq in range(31))
    with pytest.raises(ConfigError, match="scale"):
        SoftmaxConfig(scale=scale)


def test_invalid_configurations():
    with pytest.raises(ConfigError, match="lanes"):
        SoftmaxConfig(max_len=3, lanes=4)
    with pytest.raises(ConfigError, match="scale"):
        SoftmaxConfig(scale=1e-6)                 # z * m beyond int64
    with pytest.raises(ConfigError, match="act_scale"):
        SoftmaxConfig(act_scale=float("inf"))


# -- stimulus ----------------------------------------------------------------------------------

def test_stimulus_covers_the_corner_cases():
    c = SoftmaxConfig()
    stim = SoftmaxModel.stimulus(c, 200, np.random.default_rng(2))
    rows = stim["rows"]
    lengths = [len(r) for r in rows]
    assert {1, 2, c.max_len} <= set(lengths)
    assert any(n % 2 and 1 < n < c.max_len for n in lengths)
    assert any(len(r) > 1 and np.all(r == r[0]) for r in rows)              # all equal
    clip = golden.EXP_CONST * c.divisor
    assert sum(int(np.any(r.max() - r > clip)) for r in rows) >= 5          # x clipped
    assert any(r.max() - r.min() >= (1 << 31) for r in rows)                # full range
    # Every quotient qq = 0..30 and many remainders occur.
    k = c.constants
    x = np.concatenate([r - r.max() for r in rows])
    z, qq = golden.exp_parts(x, k["x0_int"], k["b_int"], k["c_int"])
    assert set(qq.tolist()) == set(range(31))
    e16 = golden.exp16(z, qq, *k["dyadic"])
    assert e16.max() == 32767 and (e16 == 0).any()


# -- cycle model ---------------------------------------------------------------------------------

@pytest.mark.parametrize("cfg", [{}, {"max_len": 50, "lanes": 4, "div_bits_per_cycle": 3},
                                 {"max_len": 300, "div_bits_per_cycle": 11}])
def test_exp_banks_sustain_the_steady_state(cfg):
    """With ``exp_banks`` banks the schedule reaches one row per ``max(L, N + 2)`` cycles at
    every row length; with one bank fewer some length is slower."""
    c = SoftmaxConfig.from_dict(cfg)

    def gaps(config, M, rows=40):
        """Cycles between consecutive rows' first output beats, last 12 rows."""
        first = [r["first_out"] for r in config.schedule([M] * rows)]
        return [b - a for a, b in zip(first[-13:], first[-12:])]

    for M in range(1, c.max_len + 1):
        assert gaps(c, M) == [c.performance(c.workload(M=M))["cycles_per_row"]] * 12
    fewer = SoftmaxConfig.from_dict(cfg)
    fewer.__dict__["exp_banks"] = c.exp_banks - 1
    if fewer.exp_banks >= 2:
        assert any(sum(gaps(fewer, M)) > 12 * c.performance(c.workload(M=M))["cycles_per_row"]
                   for M in range(1, c.max_len + 1))


def _simulate(cfg, M, rows, seed=3):
    from hwgen.flow.simulate import simulate
    acc = registry.get("ibert-softmax")
    config = acc.config.from_dict(cfg)
    result = simulate(acc, config, items=rows, seed=seed, stall=0.0,
                      stimulus_options={"length": M} if M else None, engine="native")
    assert result["mismatches"] == 0 and not result["timeout"]
    return config, result


@requires_verilator
@pytest.mark.parametrize("M", [1, 8, 38, 128])
def test_cycle_model_matches_simulation(M):
    """Rows of M elements back to back: total cycles and latency exactly as modelled, and
    the steady-state row period measured from the run equals ``cycles_per_row``."""
    rows = 16
    config, result = _simulate({"max_len": 128}, M, rows)
    model = config.performance(config.workload(M=M, rows=[M] * rows))
    assert result["cycles"] == model["cycles"]
    assert result["latency_cycles"] == model["latency_cycles"]
    beats = model["beats_per_row"]
    measured_period = (result["cycles"] - result["latency_cycles"] - beats) / (rows - 1)
    assert measured_period == model["cycles_per_row"]
    assert model["cycles_per_row"] == max(M, config.divider_cycles + 2)


@requires_verilator
@pytest.mark.parametrize("cfg", [{"max_len": 128},
                                 {"max_len": 50, "lanes": 4, "in_bits": 20, "scale": 0.0037,
                                  "output_bits": 16, "div_bits_per_cycle": 3}])
def test_cycle_model_matches_simulation_mixed_rows(cfg):
    """The default stimulus (lengths from 1 to max_len, exp banks sometimes all busy):
    the schedule gives the simulated cycle count exactly."""
    rows = 60
    config, result = _simulate(cfg, 0, rows, seed=11)
    stim = SoftmaxModel.stimulus(config, rows, np.random.default_rng(11))
    lengths = [len(r) for r in stim["rows"]]
    assert result["cycles"] == config.performance(config.workload(rows=lengths))["cycles"]


@requires_verilator
def test_simulation_detects_a_wrong_golden_value(monkeypatch):
    """The comparison is live: a golden model that halves the 16-bit exponentials of the
    elements with an odd ``qq`` makes the simulated rows disagree."""
    from hwgen.flow.simulate import simulate
    real = golden.exp16
    monkeypatch.setattr(golden, "exp16", lambda z, q, m, e: np.where(
        np.asarray(q) % 2 == 1, real(z, q, m, e) // 2, real(z, q, m, e)))
    acc = registry.get("ibert-softmax")
    result = simulate(acc, acc.config.from_dict({"max_len": 128}), items=30, seed=4,
                      stall=0.3, engine="native")
    assert result["mismatches"] > 0
