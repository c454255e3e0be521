"""I-BERT matrix kernels (Linear, attention dot product, softmax x V): the closed-form cycle
model against simulation, configuration rules, on-chip weights and the stimulus' coverage.

Bit-exactness with random stalls in every test configuration is tests/test_sim.py's job.
"""

import numpy as np
import pytest

from hwgen import registry
from hwgen.errors import ConfigError
from hwgen.flow.simulate import simulate
from hwgen.ibert import golden
from hwgen.ibert.attn_dot import AttnDotConfig, AttnDotModel
from hwgen.ibert.linear import LinearConfig, LinearModel
from hwgen.ibert.softmax_matmul import SoftmaxMatmulConfig, SoftmaxMatmulModel

from conftest import requires_verilator

LENGTHS = (1, 8, 38, 128)

#: Sizes of the model-vs-simulation table: one BERT-base head (d = 64, M <= 128) for the
#: attention kernels (their defaults); Linear with BERT-base's K = 768 and 16 tiles x 48 PEs but
#: N reduced from 768 to 48 for simulation time (the model covers N = 768: G = 48 instead of 3).
TABLE_CONFIGS = {
    "ibert-linear": {"in_features": 768, "out_features": 48, "tiles": 16, "pes": 48,
                     "weight_seed": 11},
    "ibert-attn-dot": {},
    "ibert-softmax-matmul": {},
}

KEYS = ("cycles_per_matrix", "matrix_interval", "cycles_per_row", "latency_cycles")


def measure(name, values, m, m_q=None):
    """Simulate one matrix and two back-to-back matrices of M_k = ``m`` (M_q = ``m_q``) at
    --stall 0: the first gives the matrix's cycles and latency, the difference the interval.
    On the native engine: without stalls it counts the cocotb testbench's cycles exactly
    (``tests/test_sim.py::test_engines_agree_without_stalls``)."""
    acc = registry.get(name)
    cfg = acc.config.from_dict(values)
    runs = []
    for count in (1, 2):
        options = {"sizes": [m_q or m] * count}
        if m_q is not None:
            options["k_sizes"] = [m] * count
        result = simulate(acc, cfg, items=(m_q or m) * count, seed=5, stall=0.0,
                          stimulus_options=options, engine="native")
        assert not result["timeout"]
        assert result["mismatches"] == 0, result["first_mismatches"]
        runs.append(result)
    interval = runs[1]["cycles"] - runs[0]["cycles"]
    return cfg, {"cycles_per_matrix": runs[0]["cycles"], "matrix_interval": interval,
                 "cycles_per_row": interval / (m_q or m),
                 "latency_cycles": runs[0]["latency_cycles"]}


def model_of(cfg, m, m_q=None):
    if isinstance(cfg, LinearConfig):
        return cfg.performance(cfg.workload(rows=m))
    return cfg.performance(cfg.workload(m=m, m_q=m_q))


@requires_verilator
@pytest.mark.parametrize("m", LENGTHS)
@pytest.mark.parametrize("name", list(TABLE_CONFIGS))
def test_cycle_model_matches_simulation(name, m):
    cfg, sim = measure(name, TABLE_CONFIGS[name], m)
    model = model_of(cfg, m)
    print(f"\n{name} M={m}: " + ", ".join(
        f"{k} model {model[k]:g} sim {sim[k]:g} ({(model[k] - sim[k]) / sim[k]:+.2%})"
        for k in KEYS))
    for key in KEYS:
        assert model[key] == pytest.approx(sim[key], rel=0.02), key


@requires_verilator
@pytest.mark.parametrize("name, m_k, m_q", [
    ("ibert-attn-dot", 38, 8), ("ibert-attn-dot", 8, 38),
    ("ibert-softmax-matmul", 38, 8), ("ibert-softmax-matmul", 8, 38)])
def test_cycle_model_cross_attention_shapes(name, m_k, m_q):
    """M_q != M_k (Q or P rows against K or V rows): the model follows both lengths."""
    values = {"head_dim": 24, "max_len": 40, "pes": 5}
    cfg, sim = measure(name, values, m_k, m_q)
    model = model_of(cfg, m_k, m_q)
    for key in KEYS:
        assert model[key] == pytest.approx(sim[key], rel=0.02), key


def test_model_at_bert_base_sizes():
    """BERT-base (H = 768, A = 12, M = 128): the model's per-row costs follow the organisation
    (Linear 768 x 768 on 16 x 48 MACs: 768 cycles per row; a head of Q K^T on 16 PEs: 8
    rounds of 64 cycles; softmax x V on 4 PEs: 32 beats per row of P)."""
    lin = model_of(LinearConfig(in_features=768, out_features=768, tiles=16, pes=48), 128)
    assert lin["cycles_per_row"] == 768 * 768 // (16 * 48)
    assert lin["matrix_interval"] == 128 * 768
    dot = model_of(AttnDotConfig(), 128)
    assert dot["cycles_per_row"] == 128 // 16 * 64
    smm = model_of(SoftmaxMatmulConfig(), 128)
    assert smm["cycles_per_row"] == 128 / 4
    # No padding to the maximum length: a short sequence costs proportionally less.
    assert model_of(AttnDotConfig(), 38)["matrix_interval"] \
        < model_of(AttnDotConfig(), 128)["matrix_interval"] * (38 / 128) * 1.1


def test_softmax_matmul_model_refuses_serializer_bound_shapes():
    with pytest.raises(ValueError, match="min\\(pes, M_q\\) <= M_k"):
        model_of(SoftmaxMatmulConfig(pes=8), 3, 20)


# -- configuration rules ----------------------------------------------------------------------

@pytest.mark.parametrize("cls, values, message", [
    (LinearConfig, {"out_features": 15, "tiles": 4},
     r"^tiles=4: must divide out_features=15 \(allowed: 1, 3, 5, 15\)"),
    (LinearConfig, {"in_features": 3, "pes": 4}, r"^pes=4: must be in 1\.\.in_features=3"),
    (AttnDotConfig, {"head_dim": 8, "pes": 9}, r"^pes=9: must be in 1\.\.head_dim=8"),
    (AttnDotConfig, {"head_dim": 8, "max_len": 4, "pes": 5},
     r"^pes=5: must be in 1\.\.max_len=4"),
    (SoftmaxMatmulConfig, {"max_len": 3, "pes": 4}, r"^pes=4: must be in 1\.\.max_len=3"),
])
def test_config_rules(cls, values, message):
    with pytest.raises(ConfigError, match=message):
        cls.from_dict(values)


# -- Linear weights ---------------------------------------------------------------------------

def test_linear_parameters_reproducible_and_int32_exact_at_the_limit():
    cfg = LinearConfig(in_features=37, out_features=15, tiles=5, pes=4, weight_seed=7)
    w, b = cfg.parameters
    w2, b2 = LinearConfig(in_features=37, out_features=15, tiles=5, pes=4,
                          weight_seed=7).parameters
    assert np.array_equal(w, w2) and np.array_equal(b, b2)
    w3, _ = cfg.replace(weight_seed=8).parameters
    assert not np.array_equal(w, w3)
    assert w.shape == (15, 37) and w.min() == -128 and w.max() == 127
    # Extreme inputs against the extreme weight rows reach both int32 limits' neighbourhood
    # but never leave int32.
    x = np.array([[-128] * 37, [127] * 37])
    y, _ = golden.linear(x, w, b)
    assert y.max() == 2 ** 31 - 1                    # -128 * -128 * K + largest bias
    assert y.min() >= -2 ** 31
    assert y.dtype == np.int64


def test_linear_weight_memory_layout():
    """Tile t, address g * S + j, lane p holds W[g * tiles + t, j * pes + p] (zero past K)."""
    cfg = LinearConfig(in_features=37, out_features=15, tiles=5, pes=4, weight_seed=7)
    w, _ = cfg.parameters
    words = cfg.weight_words()
    assert len(words) == cfg.tiles
    for t, tile in enumerate(words):
        assert len(tile) == cfg.groups * cfg.steps
        for addr, lanes in enumerate(tile):
            g, j = divmod(addr, cfg.steps)
            for p, value in enumerate(lanes):
                k = j * cfg.pes + p
                assert value == (w[g * cfg.tiles + t, k] if k < cfg.in_features else 0)


# -- stimulus coverage ------------------------------------------------------------------------

@pytest.mark.parametrize("model, cfg, key, max_len", [
    (LinearModel, LinearConfig(), "x", 128),
    (AttnDotModel, AttnDotConfig(head_dim=24, max_len=40, pes=5), "q", 40),
    (AttnDotModel, AttnDotConfig(head_dim=24, max_len=40, pes=5), "k", 40),
    (SoftmaxMatmulModel, SoftmaxMatmulConfig(head_dim=16, max_len=40, pes=3), "v", 40),
])
def test_stimulus_covers_lengths_and_extremes(model, cfg, key, max_len):
    stim = model.stimulus(cfg, 200, np.random.default_rng(2))
    mats = stim[key]
    lengths = [len(x) for x in mats]
    if key in ("x", "q"):
        assert sum(lengths) == 200                   # the item unit is one row
    assert 1 in lengths and max_len in lengths
    assert any(n % 2 and n > 1 for n in lengths)
    assert any((x == -128).all() for x in mats) and any((x == 127).all() for x in mats)
    values = np.concatenate([x.ravel() for x in mats])
    assert len(np.unique(values)) > 200              # random values over the whole range


def test_softmax_matmul_stimulus_has_softmax_rows_and_extremes():
    cfg = SoftmaxMatmulConfig(head_dim=16, max_len=40, pes=3)
    stim = SoftmaxMatmulModel.stimulus(cfg, 200, np.random.default_rng(2))
    ps = stim["p"]
    assert sum(len(p) for p in ps) == 200
    assert all(p.min() >= 0 and p.max() <= 256 for p in ps)
    assert any((p == 256).all() for p in ps) and any((p == 0).all() for p in ps)
    # Realistic heads: i-softmax rows, each adding up to 2**8 less its floor losses (< 1 each).
    kinds = SoftmaxMatmulModel.KINDS
    soft = [p for h, p in enumerate(ps) if kinds[h % len(kinds)][0] == "softmax"]
    assert soft
    for p in soft:
        sums = p.sum(axis=1)
        assert (sums <= 256).all() and (sums > 256 - p.shape[1]).all()


@requires_verilator
def test_linear_with_block_ram_weights_has_its_extra_register_in_the_model():
    """Weight memories deeper than distributed RAM (here G * S = 10 * 15 = 150 words) put one
    more register between the block RAM and the multiplier; the cycle model counts it, and
    the simulation (exact against the golden model) agrees."""
    values = {"in_features": 100, "out_features": 30, "tiles": 3, "pes": 7}
    cfg, sim = measure("ibert-linear", values, 3)
    assert cfg.groups * cfg.steps > 64 and cfg.operand_stages == 2
    model = model_of(cfg, 3)
    assert model["latency_cycles"] == sim["latency_cycles"]
    assert model["cycles_per_matrix"] == sim["cycles_per_matrix"]


@requires_verilator
@pytest.mark.parametrize("values", [{"head_dim": 2, "max_len": 9, "pes": 2}])
def test_attn_dot_registered_count_at_the_shortest_round(values):
    """head_dim = 2, the shortest round with a registered score count (one cycle between a
    round's change of K bank or column and its last step): exact under random stalls, with
    K matrices of 1 .. max_len rows."""
    acc = registry.get("ibert-attn-dot")
    cfg = acc.config.from_dict(values)
    result = simulate(acc, cfg, items=40, seed=6, stall=0.5, engine="native")
    assert result["mismatches"] == 0 and not result["timeout"]
