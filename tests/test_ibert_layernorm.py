"""I-BERT integer LayerNorm: configuration rules, the bounds the datapath widths rely on, the
exact division of the row sum by H, and the cycle model against Verilator simulation.
(Bit-exactness under random stalls in every TEST_CONFIGS entry: ``tests/test_sim.py``.)"""

import numpy as np
import pytest

from hwgen import registry
from hwgen.errors import ConfigError
from hwgen.flow.simulate import simulate
from hwgen.ibert import golden
from hwgen.ibert.layernorm import (TEST_CONFIGS, LayerNormConfig, LayerNormModel,
                                   layernorm_params)

from conftest import requires_verilator


# -- configuration -------------------------------------------------------------------------------

def test_config_round_trip_and_defaults():
    cfg = LayerNormConfig()
    assert (cfg.hidden, cfg.in_bits) == (768, 22)           # BERT-base, I-BERT's LN input QuantAct
    assert LayerNormConfig.from_dict(cfg.to_dict()) == cfg
    for values in TEST_CONFIGS:
        assert LayerNormConfig.from_dict(values).to_dict()["hidden"] == values["hidden"]
    assert any(v["hidden"] == 768 for v in TEST_CONFIGS)
    assert len(TEST_CONFIGS) >= 4


def test_lanes_must_divide_hidden():
    with pytest.raises(ConfigError) as e:
        LayerNormConfig(hidden=768, lanes=7)
    assert e.value.param == "lanes" and "16" in str(e.value)


@pytest.mark.parametrize("hidden, in_bits", [(768, 22), (768, 16), (1024, 22), (5, 32), (1, 2),
                                             (3072, 8), (8192, 32)])
def test_shift_must_keep_variance_below_2_pow_62(hidden, in_bits):
    """The square root and the int64 golden model take variances below 2**62."""
    lanes = 1
    s = LayerNormConfig(hidden=hidden, lanes=lanes, in_bits=in_bits, shift=31).min_shift()
    assert LayerNormConfig(hidden=hidden, lanes=lanes, in_bits=in_bits, shift=s).var_max < 1 << 62
    if s:
        with pytest.raises(ConfigError) as e:
            LayerNormConfig(hidden=hidden, lanes=lanes, in_bits=in_bits, shift=s - 1)
        assert e.value.param == "shift" and f"at least {s}" in str(e.value)


def test_weights_are_reproducible_float32_in_range():
    w, b = layernorm_params(768, 5)
    w2, b2 = layernorm_params(768, 5)
    assert w.dtype == np.float32 and b.dtype == np.float32
    np.testing.assert_array_equal(w, w2)
    np.testing.assert_array_equal(b, b2)
    assert 0.5 <= w.min() and w.max() <= 1.5 and -0.5 <= b.min() and b.max() <= 0.5
    assert not np.array_equal(w, layernorm_params(768, 6)[0])
    cfg = LayerNormConfig(param_seed=5)
    np.testing.assert_array_equal(cfg.constants["bias_int"],
                                  golden.layernorm_constants(w, b, 768)["bias_int"])


# -- bounds behind the datapath widths -----------------------------------------------------------

def _adversarial_rows(cfg, rng, count):
    """Rows that push the variance and |y| * factor up: two levels at the range ends in every
    proportion, one element far from all others, random extremes, and uniform rows."""
    h, b = cfg.hidden, cfg.in_bits
    lo, hi = -(1 << (b - 1)), (1 << (b - 1)) - 1
    rows = []
    for k in range(count):
        kind = k % 4
        if kind == 0:
            n_lo = int(rng.integers(0, h, endpoint=True))
            row = np.where(np.arange(h) < n_lo, lo, hi)
        elif kind == 1:
            row = np.full(h, int(rng.choice([lo, hi])))
            row[rng.integers(h)] = hi if row[0] == lo else lo
        elif kind == 2:
            row = np.where(rng.random(h) < 0.5, lo, hi) + rng.integers(-3, 4, size=h)
        else:
            row = rng.integers(lo, hi, size=h, endpoint=True)
        rows.append(np.clip(row, lo, hi))
    return np.array(rows, dtype=np.int64)


def _variance(cfg, rows):
    mean = golden._round_div(rows.sum(axis=-1, keepdims=True), cfg.hidden)
    ys = (rows - mean) >> np.int64(cfg.shift)
    return (ys * ys).sum(axis=-1)


CONFIG_SWEEP = [dict(hidden=h, lanes=1, in_bits=b) for h, b in
                [(768, 22), (768, 16), (5, 16), (3, 32), (21, 8), (64, 12), (2, 2), (1000, 9)]]


@pytest.mark.parametrize("values", CONFIG_SWEEP, ids=lambda v: f"H{v['hidden']}-b{v['in_bits']}")
def test_variance_bound_holds_and_is_tight(values):
    rng = np.random.default_rng(values["hidden"] * 100 + values["in_bits"])
    probe = LayerNormConfig(**values, shift=31)
    for shift in sorted({probe.min_shift(), probe.min_shift() + 1, probe.min_shift() + 3}):
        cfg = LayerNormConfig(**values, shift=shift)
        var = _variance(cfg, _adversarial_rows(cfg, rng, 400))
        assert var.max() <= cfg.var_max
        assert var.max() < 1 << cfg.var_bits
        if cfg.hidden > 1 and cfg.in_bits - cfg.shift >= 4:
            assert var.max() >= 0.75 * cfg.var_max         # the bound is not loose


@pytest.mark.parametrize("values", TEST_CONFIGS[:5], ids=lambda v: f"H{v['hidden']}")
def test_output_fits_out_bits(values):
    """|floor(y * factor / 2)| stays in -2**30 .. 2**31 - 1 (norm_range) on adversarial rows,
    so the output width from it and the bias range is enough."""
    cfg = LayerNormConfig.from_dict(values)
    rows = _adversarial_rows(cfg, np.random.default_rng(3), 400)
    out = cfg.normalise(rows)
    norm = out - cfg.constants["bias_int"]
    lo, hi = cfg.norm_range
    assert lo <= norm.min() and norm.max() <= hi
    assert norm.max() >= hi // 4                  # rows reach the upper part of the range
    lim = 1 << (cfg.out_bits - 1)
    assert -lim <= out.min() and out.max() < lim


# -- mean: reciprocal multiply and one correction ------------------------------------------------

def _hardware_mean(cfg, total):
    """The mean unit's arithmetic (offset, multiply by recip, shift, remainder from the low
    ``rem_bits`` bits, correct, round from decisions taken for either correction), in Python
    integers (the product exceeds 64 bits)."""
    x = total.astype(object) + cfg.mean_offset
    h, mask = cfg.hidden, (1 << cfg.rem_bits) - 1
    q0 = (x * cfg.recip) >> cfg.recip_shift
    r0 = x - q0 * h
    assert ((r0 >= 0) & (r0 < 2 * h)).all()                # at most one correction
    r_hw = ((x & mask) - ((q0 & mask) * h & mask)) & mask  # the hardware's low bits
    assert (r_hw == r0).all()
    over = r0 >= h
    odd = q0 % 2 == 1
    up0 = (2 * r0 > h) | ((2 * r0 == h) & odd)             # rounding if not corrected
    up1 = (2 * (r0 - h) > h) | ((2 * (r0 - h) == h) & ~odd)  # if corrected: parity flips
    q = q0 + over + np.where(over, up1, up0)
    assert (q < 1 << cfg.in_bits).all()                    # the b-bit sum does not wrap
    return (q - (1 << (cfg.in_bits - 1))).astype(np.int64)


@pytest.mark.parametrize("hidden, in_bits", [(768, 22), (768, 32), (1, 9), (3, 32), (5, 16),
                                             (21, 8), (64, 12), (8191, 32), (1000, 2)])
def test_reciprocal_mean_is_exact(hidden, in_bits):
    """Against golden rounding on every sum for small ranges, and on the ends of the range,
    around every multiple of H/2 near them, and random sums otherwise."""
    cfg = LayerNormConfig(hidden=hidden, lanes=1, in_bits=in_bits, shift=31)
    lo, hi = hidden * -(1 << (in_bits - 1)), hidden * ((1 << (in_bits - 1)) - 1)
    if hi - lo < 1 << 22:
        totals = np.arange(lo, hi + 1, dtype=np.int64)
    else:
        rng = np.random.default_rng(hidden)
        k = np.arange(-4 * hidden, 4 * hidden + 1, dtype=np.int64)
        centres = np.concatenate([[lo, 0, hi], rng.integers(lo, hi, size=64, dtype=np.int64)])
        totals = np.concatenate([
            (c // hidden) * hidden + k for c in centres] + [
            rng.integers(lo, hi, size=200_000, endpoint=True, dtype=np.int64)])
        totals = totals[(totals >= lo) & (totals <= hi)]
    np.testing.assert_array_equal(_hardware_mean(cfg, totals), golden._round_div(totals, hidden))


# -- cycle model against simulation --------------------------------------------------------------

@requires_verilator
@pytest.mark.parametrize("index", [0, 1, 2])
def test_cycles_match_model(index):
    """Without stalls rows stream back to back: one beat per cycle in and out, and the first
    input to last output cycle count and latency equal the model exactly."""
    acc = registry.get("ibert-layernorm")
    cfg = acc.config.from_dict(TEST_CONFIGS[index])
    rows = 60
    result = simulate(acc, cfg, items=rows, seed=5, stall=0.0, engine="native")
    assert result["mismatches"] == 0, result["first_mismatches"]
    model = cfg.performance(cfg.workload(rows=rows))
    assert result["latency_cycles"] == model["latency_cycles"]
    assert result["cycles"] == model["cycles"]
    assert result["results_per_cycle"] == 1.0
    assert result["input_items_per_cycle"] == 1.0
    assert model["initiation_interval"] == cfg.hidden // cfg.lanes


@requires_verilator
def test_harness_detects_wrong_rounding(monkeypatch):
    """A golden mean rounding ties up instead of to even must produce mismatches (the
    stimulus has mean ties)."""
    acc = registry.get("ibert-layernorm")
    cfg = acc.config.from_dict(TEST_CONFIGS[0])

    def round_up(a, n):
        a = np.asarray(a, dtype=np.int64)
        return (2 * a + n) // (2 * n)

    monkeypatch.setattr(golden, "_round_div", round_up)
    result = simulate(acc, cfg, items=40, seed=8, stall=0.2, engine="native")
    assert result["mismatches"] > 0


def test_stimulus_covers_corner_cases():
    cfg = LayerNormConfig.from_dict(TEST_CONFIGS[0])
    rows = LayerNormModel.stimulus(cfg, 200, np.random.default_rng(2))["rows"]
    h = cfg.hidden
    total = rows.sum(axis=1)
    var = _variance(cfg, rows)
    lo, hi = -(1 << (cfg.in_bits - 1)), (1 << (cfg.in_bits - 1)) - 1
    assert rows.min() == lo and rows.max() == hi
    assert ((2 * (total % h)) == h).sum() >= 5                  # mean ties
    assert (var == 0).sum() >= 5                                 # zero variance
    assert var.max() >= 0.9 * cfg.var_max                        # variance near its bound
    beats = LayerNormModel.inputs(cfg, {"rows": rows})["i_row"]
    assert len(beats) == 200 * cfg.beats and sum(b["last"] for b in beats) == 200
