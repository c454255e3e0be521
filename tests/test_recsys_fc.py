"""Recommendation FC layer: the golden model against PyTorch, the weights' accumulator bound, the
closed-form cycle model against simulation at --stall 0, stimulus coverage (extremes,
saturation) and configuration rules.

Bit-exactness with 30% random stalls in every test configuration is tests/test_sim.py's job.
"""

import numpy as np
import pytest

from hwgen import registry
from hwgen.errors import ConfigError
from hwgen.flow.simulate import simulate
from hwgen.recsys import golden
from hwgen.recsys.fc import TEST_CONFIGS, FCConfig, FCModel
from hwgen.recsys.model import paper_ctr, small_ctr

from conftest import requires_verilator, requires_yosys

torch = pytest.importorskip("torch")


# -- golden model against torch.nn.Linear -------------------------------------------------------

def torch_layer(x, w, b, *, relu, shift, out_bits):
    """The layer in float64 torch (exact: every value stays below 2**53)."""
    lin = torch.nn.Linear(w.shape[1], w.shape[0], dtype=torch.float64)
    with torch.no_grad():
        lin.weight.copy_(torch.tensor(w, dtype=torch.float64))
        lin.bias.copy_(torch.tensor(b, dtype=torch.float64))
        y = lin(torch.tensor(x, dtype=torch.float64))
        if relu:
            y = torch.nn.functional.relu(y)
        if out_bits:
            # torch.round rounds half to even; dividing by a power of two is exact.
            y = torch.clamp(torch.round(y / 2.0 ** shift), -2.0 ** (out_bits - 1),
                            2.0 ** (out_bits - 1) - 1)
    return y.numpy()


@pytest.mark.parametrize("in_dim, out_dim, weight_bits, act_bits", [
    (1, 1, 8, 8), (37, 15, 16, 16), (100, 37, 8, 8), (876, 33, 16, 16), (50, 9, 16, 8)])
@pytest.mark.parametrize("relu, shift, out_bits", [
    (True, 8, 8), (False, 13, 16), (True, 0, 16), (False, 5, 0), (True, 35, 8)])
def test_fc_layer_matches_torch(in_dim, out_dim, weight_bits, act_bits, relu, shift, out_bits):
    rng = np.random.default_rng(in_dim * 1000 + shift)
    w, b = golden.fc_params(in_dim, out_dim, weight_bits, act_bits, rng, extremes=True)
    lo, hi = -(1 << (act_bits - 1)), (1 << (act_bits - 1)) - 1
    x = np.concatenate([
        np.full((1, in_dim), lo), np.full((1, in_dim), hi),
        rng.integers(lo, hi, size=(20, in_dim), endpoint=True),
        # small values: many results close to rounding ties after the shift
        rng.integers(-3, 3, size=(10, in_dim), endpoint=True)])
    got = golden.fc_layer(x, w, b, relu=relu, shift=shift, out_bits=out_bits)
    want = torch_layer(x, w, b, relu=relu, shift=shift, out_bits=out_bits)
    assert got.dtype == np.int64 and got.shape == (len(x), out_dim)
    assert np.array_equal(got, want.astype(np.int64))
    assert np.array_equal(got, want)          # torch's values are integers too


def test_fc_layer_rounds_ties_to_even():
    """Accumulators exactly between two outputs: 2.5 -> 2, 3.5 -> 4, -2.5 -> -2, and the clamp
    after rounding."""
    w = np.array([[1]])
    acc = np.array([[10], [14], [-10], [-14], [1000], [-1000]])
    got = golden.fc_layer(acc, w, np.array([0]), relu=False, shift=2, out_bits=8)
    assert got.ravel().tolist() == [2, 4, -2, -4, 127, -128]


def test_fc_layer_refuses_accumulator_overflow():
    w = np.array([[1 << 20]])
    with pytest.raises(ValueError, match="32-bit"):
        golden.fc_layer(np.array([[1 << 11]]), w, np.array([0]), relu=False, shift=0,
                        out_bits=0)


@pytest.mark.parametrize("make", [small_ctr, paper_ctr])
def test_mlp_matches_torch_sequential(make):
    model = make()
    rng = np.random.default_rng(5)
    bits = model.act_bits[0]
    x = rng.integers(-(1 << (bits - 1)), 1 << (bits - 1), size=(6, model.concat_len))
    want = torch.tensor(x, dtype=torch.float64)
    for layer in range(len(model.layers)):
        w, b = golden.layer_params(model, layer)
        last = layer == len(model.layers) - 1
        want = torch.tensor(torch_layer(
            want.numpy(), w, b, relu=not last, shift=0 if last else model.shifts[layer],
            out_bits=0 if last else model.act_bits[layer + 1]))
    got = golden.mlp(model, x)
    assert got.shape == (6, model.layers[-1])
    assert np.array_equal(got, want.numpy())


def test_layer_params_reproducible_bounded_and_per_layer():
    model = paper_ctr()
    w0, b0 = golden.layer_params(model, 0)
    w0b, b0b = golden.layer_params(model, 0)
    assert np.array_equal(w0, w0b) and np.array_equal(b0, b0b)
    assert w0.shape == (1024, 876) and b0.shape == (1024,)
    for layer, (n_in, _) in enumerate(model.layer_shapes):
        w, b = golden.layer_params(model, layer)
        # Worst case of the declared widths fits the 32-bit accumulator.
        worst = n_in * (1 << (model.act_bits[layer] - 1)) * int(np.abs(w).max(axis=1).max())
        assert worst + int(np.abs(b).max()) <= 2 ** 31 - 1
        assert np.abs(w).max() < 1 << (model.weight_bits - 1)
    w1, _ = golden.layer_params(model, 1)
    assert not np.array_equal(w0[:512, :512], w1[:512, :512])
    other = small_ctr()
    assert golden.layer_params(other, 0)[0].min() >= -128
    with pytest.raises(ValueError):
        golden.layer_params(model, 4)


def test_extreme_parameters_reach_the_accumulator_limits():
    """FC test weights: row 0 against the all-minimum input gives exactly 2**31 - 1; no input
    of the declared width leaves 32 bits (checked at its worst case per row)."""
    for values in TEST_CONFIGS + ({"in_dim": 876, "out_dim": 8, "pes": 8, "mults": 16,
                                   "weight_bits": 16, "act_bits": 16},):
        c = FCConfig.from_dict(values)
        w, b = c.parameters
        xmin = -(1 << (c.act_bits - 1))
        raw = golden.fc_layer(np.full((1, c.in_dim), xmin), w, b, relu=False, shift=0,
                              out_bits=0)
        assert raw[0, 0] == 2 ** 31 - 1
        worst_pos = np.where(w < 0, w * xmin, w * (-xmin - 1)).sum(axis=1) + b
        worst_neg = np.where(w > 0, w * xmin, w * (-xmin - 1)).sum(axis=1) + b
        assert worst_pos.max() <= 2 ** 31 - 1 and worst_neg.min() >= -2 ** 31


def test_weight_memory_layout():
    """PE p, address r * S + j, lane k holds W[r * pes + p, j * mults + k] (0 when padded)."""
    c = FCConfig(in_dim=37, out_dim=15, pes=4, mults=5, weight_seed=7)
    w, b = c.parameters
    words, biases = c.weight_words(), c.bias_words()
    assert len(words) == 4 and all(len(pe) == c.rounds * c.steps for pe in words)
    for p in range(4):
        for r in range(c.rounds):
            row = r * 4 + p
            flat = [v for j in range(c.steps) for v in words[p][r * c.steps + j]]
            want = list(w[row]) + [0] * 3 if row < 15 else [0] * 40
            assert flat == want
            assert biases[p][r] == (b[row] if row < 15 else 0)


# -- stimulus coverage --------------------------------------------------------------------------

def test_stimulus_reaches_saturation_and_extremes():
    """The expected outputs include both clamp limits (or 0 and the top with ReLU), the
    accumulator's top 2**31 - 1 in raw mode, and values strictly inside the range."""
    rng = np.random.default_rng(1)
    seen = {}
    for values in TEST_CONFIGS:
        c = FCConfig.from_dict(values)
        stim = FCModel.stimulus(c, 30, rng)
        y = FCModel.golden(c, stim["x"])
        if c.out_bits:
            hi = (1 << (c.out_bits - 1)) - 1
            lo = 0 if c.relu else -hi - 1
            assert (y == hi).any() and (y == lo).any(), values
            inside = (y > lo) & (y < hi)
            assert inside.mean() > 0.1, values
            seen["clamp"] = True
        else:
            assert y.max() == 2 ** 31 - 1, values
            if c.out_dim > 1:               # row 1: all-highest weights, lowest bias
                assert y.min() < -(1 << 30), values
            seen["raw"] = True
        # Lanes past in_dim carry junk the core must ignore.
        assert stim["junk"].shape == (30, c.in_beats * c.lanes - c.in_dim)
    assert seen == {"clamp": True, "raw": True}


def test_inputs_and_expect_beats():
    c = FCConfig(in_dim=37, out_dim=15, pes=4, mults=5, lanes=3, weight_seed=7)
    stim = FCModel.stimulus(c, 3, np.random.default_rng(0))
    beats = FCModel.inputs(c, stim)["i_x"]
    assert len(beats) == 3 * 13 and [b["last"] for b in beats[:13]] == [0] * 12 + [1]
    assert beats[12]["x"][0] == stim["x"][0][36]
    out = FCModel.expect(c, stim)["o_y"]
    assert len(out) == 3 * 5 and out[4]["last"] == 1
    assert out[4]["y"][:] == list(FCModel.golden(c, stim["x"])[0][12:15])   # 15 = 5 beats x 3


# -- configuration rules --------------------------------------------------------------------------

@pytest.mark.parametrize("values, message", [
    ({"out_dim": 7, "pes": 8}, r"^pes=8: must be in 1\.\.out_dim=7"),
    ({"in_dim": 5, "mults": 8}, r"^mults=8: must be in 1\.\.in_dim=5"),
    ({"out_bits": 12}, r"^out_bits=12: must be one of 0, 8, 16"),
])
def test_config_rules(values, message):
    with pytest.raises(ConfigError, match=message):
        FCConfig.from_dict(values)


def test_issue_sizes_are_accepted():
    c = FCConfig().with_overrides(["in_dim=100", "out_dim=37", "pes=8"])
    assert (c.steps, c.rounds) == (13, 5)       # 100 = 12 * 8 + 4; 37 = 4 * 8 + 5


# -- cycle model against simulation ---------------------------------------------------------------

def measure(values, n=24, seed=5):
    """Simulate 1 and ``n`` inferences at --stall 0: cycles of one, latency, and the
    initiation interval from the difference."""
    acc = registry.get("recsys-fc")
    cfg = FCConfig.from_dict(values)
    runs = []
    for count in (1, n):
        result = simulate(acc, cfg, items=count, seed=seed, stall=0.0, engine="native")
        assert not result["timeout"]
        assert result["mismatches"] == 0, result["first_mismatches"]
        runs.append(result)
    return cfg, {"cycles_single": runs[0]["cycles"],
                 "latency_cycles": runs[0]["latency_cycles"],
                 "cycles_per_inference": (runs[1]["cycles"] - runs[0]["cycles"]) / (n - 1),
                 "cycles": runs[1]["cycles"]}


@requires_verilator
@pytest.mark.parametrize("values", TEST_CONFIGS, ids=lambda v: "-".join(
    f"{k}{v[k]}" for k in ("in_dim", "out_dim", "pes", "mults", "lanes") if k in v) or "default")
def test_cycle_model_matches_simulation(values):
    cfg, sim = measure(values)
    model = cfg.performance(cfg.workload(inferences=24))
    print(f"\n{values}: " + ", ".join(
        f"{k} model {model[k]:g} sim {sim[k]:g}" for k in sim))
    for key in sim:
        assert model[key] == pytest.approx(sim[key], rel=0.05), key
    # Throughput is set by the slowest of compute, input and output, whatever the sizes:
    # the next vector loads during the compute and results wait in the output banks.
    bound = max(cfg.rounds * cfg.steps, cfg.in_beats, cfg.out_beats)
    assert sim["cycles_per_inference"] == pytest.approx(bound, rel=0.05)


@requires_verilator
def test_heavy_backpressure_stays_exact():
    """80% input gaps and output stalls on the odd 16-bit configuration."""
    acc = registry.get("recsys-fc")
    cfg = FCConfig.from_dict(TEST_CONFIGS[2])
    result = simulate(acc, cfg, items=40, seed=9, stall=0.8, engine="native")
    assert not result["timeout"] and result["mismatches"] == 0


def test_model_at_paper_slice():
    """876 inputs x 256 outputs on 16 PEs x 16 multipliers: 55 steps of 16 rows, compute bound
    at 880 cycles per inference; MACs busy 876 / 880 of the time."""
    c = FCConfig(in_dim=876, out_dim=256, pes=16, mults=16, weight_bits=16, act_bits=16,
                 out_bits=16, shift=12, lanes=16)
    perf = c.performance()
    assert perf["cycles_per_inference"] == 55 * 16
    assert perf["mac_utilisation"] == pytest.approx(876 / 880)
    # The first output beat (16 outputs, one round) waits for the vector and one round.
    assert perf["latency_cycles"] == c.in_beats + 55 + c.round_latency + 1


# -- resources ------------------------------------------------------------------------------------

@requires_yosys
@pytest.mark.parametrize("bits", [8, 16])
def test_synth_one_dsp_per_multiplier(bits):
    """yosys maps every PE multiplier (8 x 8 or 16 x 16 bits) to one DSP48E2 and nothing else
    to DSPs: a PE costs ``mults`` DSPs."""
    from hwgen.flow.synth import synthesize
    c = FCConfig(in_dim=40, out_dim=8, pes=2, mults=4, weight_bits=bits, act_bits=bits)
    report = synthesize(registry.get("recsys-fc"), c)
    assert report["resources"]["dsp"] == c.pes * c.mults
