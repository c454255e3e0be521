"""ESPN MaxSim unit: the golden model against outside references, the int8 quantisation, the
configuration's validation, and simulations beyond tests/test_sim.py's (the cycle model, one-
token documents at the peak rate, queries longer than the unit holds)."""

import numpy as np
import pytest

from hwgen import registry
from hwgen.errors import ConfigError
from hwgen.espn.golden import maxsim_scores, quantize_int8, score_bits
from hwgen.espn.maxsim import MaxSimConfig
from hwgen.espn.model import MaxSimModel, batch_shapes

from conftest import requires_verilator


def _reference_float(query, docs):
    """MaxSim in float64 with numpy's einsum, one document at a time."""
    q = np.asarray(query, dtype=np.float64)
    return np.array([np.einsum("id,jd->ij", q, np.asarray(d, dtype=np.float64)).max(axis=1).sum()
                     for d in docs])


def _random_case(rng, dim, q_len, n_docs, max_len=20):
    query = rng.integers(-128, 127, size=(q_len, dim), endpoint=True, dtype=np.int8)
    lengths = [1 if k % 3 == 0 else int(rng.integers(1, max_len, endpoint=True))
               for k in range(n_docs)]
    docs = [rng.integers(-128, 127, size=(n, dim), endpoint=True, dtype=np.int8)
            for n in lengths]
    return query, docs, lengths


@pytest.mark.parametrize("dim, q_len", [(1, 1), (13, 5), (32, 32), (128, 32), (256, 7)])
def test_golden_matches_float64_einsum(dim, q_len):
    """Float64 is exact for these magnitudes (< 2**53), so the scores must be equal."""
    rng = np.random.default_rng(dim * 100 + q_len)
    query, docs, lengths = _random_case(rng, dim, q_len, 25)
    got = maxsim_scores(query, np.concatenate(docs), lengths)
    assert got.dtype == np.int64 and got.shape == (25,)
    np.testing.assert_array_equal(got, _reference_float(query, docs).astype(np.int64))


@pytest.mark.float_reference
def test_golden_matches_torch():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(5)
    query, docs, lengths = _random_case(rng, 24, 9, 30)
    q = torch.from_numpy(query.astype(np.float64))
    ref = [float((q @ torch.from_numpy(d.astype(np.float64)).T).amax(dim=1).sum()) for d in docs]
    np.testing.assert_array_equal(maxsim_scores(query, np.concatenate(docs), lengths),
                                  np.array(ref, dtype=np.int64))


def test_golden_extremes_fit_the_int32_output():
    """The largest and smallest scores of the largest unit need 29 bits: int32 never
    overflows (the unit neither wraps nor saturates)."""
    dim, q = 256, 32
    hi = maxsim_scores(np.full((q, dim), -128), np.full((3, dim), -128), [1, 2])
    lo = maxsim_scores(np.full((q, dim), -128), np.full((1, dim), 127), [1])
    assert list(hi) == [q * dim * 128 * 128] * 2 and lo[0] == -q * dim * 128 * 127
    assert score_bits(dim, q) == 29
    assert -(1 << 28) <= lo[0] and hi[0] < 1 << 28
    assert MaxSimConfig(dim=dim, q_tokens=q, lanes=1).score_bits == 29


def test_golden_max_is_per_query_token():
    # Two query tokens, each best matched by a different document token.
    query = np.array([[1, 0], [0, 1]])
    doc = np.array([[5, -3], [-2, 4]])
    assert maxsim_scores(query, doc, [2])[0] == 5 + 4
    assert list(maxsim_scores(query, doc, [1, 1])) == [5 - 3, -2 + 4]
    assert maxsim_scores(query, np.zeros((0, 2)), []).shape == (0,)


@pytest.mark.parametrize("query, docs, lengths, message", [
    (np.zeros((2, 3)), np.zeros((3, 3)), [1, 1],
     r"^doc_lengths add up to 2, doc_tokens has 3 tokens$"),
    (np.zeros((2, 3)), np.zeros((3, 3)), [3, 0], "^every document must have at least one token$"),
    (np.zeros((2, 3)), np.zeros((3, 4)), [3], "^doc_tokens have dim 4, the query has dim 3$"),
    (np.zeros((0, 3)), np.zeros((3, 3)), [3], "^query must have at least one token$"),
    (np.full((1, 3), 128), np.zeros((3, 3)), [3],
     r"^query holds values outside the int8 range -128\.\.127$"),
    (np.zeros((1, 3)), np.full((3, 3), -129), [3], "^doc_tokens holds values outside"),
    (np.full((1, 3), 0.5), np.zeros((3, 3)), [3], r"^query must hold integers \(int8 values\)$"),
    (np.ones((1, 3), dtype=bool), np.zeros((3, 3)), [3], "^query must hold integers"),
    (np.zeros((1, 3)), np.ones((3, 3), dtype=bool), [3], "^doc_tokens must hold integers"),
    (np.zeros(3), np.zeros((3, 3)), [3], r"^query must be a 2-D array \(tokens, dim\), got "
     r"shape \(3,\)$"),
])
def test_golden_rejects_bad_input(query, docs, lengths, message):
    with pytest.raises(ValueError, match=message):
        maxsim_scores(query, docs, lengths)


def test_quantize_int8_symmetric_per_tensor():
    rng = np.random.default_rng(2)
    x = rng.normal(0, 0.3, size=(40, 32))
    q, scale = quantize_int8(x)
    assert q.dtype == np.int8 and q.shape == x.shape
    assert scale == pytest.approx(np.abs(x).max() / 127)
    assert np.abs(q).max() == 127 and q.min() >= -127
    assert np.abs(q * scale - x).max() <= scale / 2 + 1e-12
    # a given scale is used as is; values beyond 127 steps clip
    q2, s2 = quantize_int8(x, scale=scale / 2)
    assert s2 == scale / 2 and np.abs(q2).max() == 127
    assert np.array_equal(quantize_int8(np.zeros(5))[0], np.zeros(5, dtype=np.int8))
    assert quantize_int8(np.zeros(5))[1] == 1.0
    assert list(quantize_int8([0.5, 1.5, -0.5, 2.5], scale=1.0)[0]) == [0, 2, 0, 2]  # to even
    for bad in ([np.nan], [np.inf]):
        with pytest.raises(ValueError, match="finite"):
            quantize_int8(bad)
    with pytest.raises(ValueError, match="positive"):
        quantize_int8(x, scale=0.0)


def test_golden_takes_integral_floats_and_returns_int64():
    """Embeddings and lengths given as integral floats give the int64 scores of the integers;
    no documents give an empty int64 array."""
    query, doc = np.array([[1, 0], [0, 1]]), np.array([[5, -3], [-2, 4]])
    want = maxsim_scores(query, doc, [1, 1])
    got = maxsim_scores(query.astype(np.float32), doc.astype(np.float64), [1.0, 1.0])
    assert got.dtype == np.int64 and got.tolist() == want.tolist() == [2, 2]
    assert maxsim_scores(query, np.zeros((0, 2)), []).dtype == np.int64


def test_quantize_int8_clips_both_ways_and_handles_empty():
    q, scale = quantize_int8([-200.0, -127.4, 126.6, 200.0], scale=1.0)
    assert q.tolist() == [-127, -127, 127, 127] and scale == 1.0
    q, scale = quantize_int8(np.zeros((0, 4)))
    assert q.shape == (0, 4) and scale == 1.0
    with pytest.raises(ValueError, match="^quantize_int8: x must be finite$"):
        quantize_int8([1.0, np.nan])


@pytest.mark.parametrize("dim, q_tokens", [(1, 1), (3, 2), (128, 32), (256, 32)])
def test_bit_widths_are_the_narrowest_that_hold_the_extremes(dim, q_tokens):
    """Signed widths: the extreme dot product (every element -128 x -128) fits in
    ``dot_bits`` and not in one bit fewer; the same for scores of ``q_tokens`` tokens."""
    from hwgen.espn.golden import dot_bits
    for bits, n in ((dot_bits(dim), 1), (score_bits(dim, q_tokens), q_tokens)):
        hi, lo = n * dim * 128 * 128, n * dim * -128 * 127
        assert -(1 << (bits - 1)) <= lo and hi < 1 << (bits - 1)
        assert hi >= 1 << (bits - 2)
    assert dot_bits(1) == 16                 # 16384 needs 15 magnitude bits and a sign


def test_quantised_scores_rank_like_float():
    """Float embeddings, quantised per tensor, give scores close to the float MaxSim."""
    rng = np.random.default_rng(3)
    qf = rng.normal(size=(8, 32))
    docs = [rng.normal(size=(int(n), 32)) for n in rng.integers(1, 30, size=40)]
    q8, sq = quantize_int8(qf)
    d8, sd = quantize_int8(np.concatenate(docs))
    approx = maxsim_scores(q8, d8, [len(d) for d in docs]) * sq * sd
    exact = _reference_float(qf, docs)
    assert np.abs(approx - exact).max() < 0.02 * np.abs(exact).max()
    assert np.corrcoef(approx, exact)[0, 1] > 0.999


# -- configuration ---------------------------------------------------------------------------

@pytest.mark.parametrize("sets, message", [
    (["dim=0"], r"^dim=0: must be an integer in 1\.\.256"),
    (["dim=257"], r"^dim=257: must be an integer in 1\.\.256"),
    (["q_tokens=0"], r"^q_tokens=0: must be an integer in 1\.\.32"),
    (["q_tokens=33"], r"^q_tokens=33: must be an integer in 1\.\.32"),
    (["lanes=0"], r"^lanes=0: must be an integer in 1\.\.32"),
    (["q_tokens=5", "lanes=6"], r"^lanes=6: must be in 1\.\.q_tokens=5"),
    (["dim=x"], r"^dim='x': must be an integer"),
])
def test_config_rejects(sets, message):
    with pytest.raises(ConfigError, match=message):
        registry.get("maxsim").make_config(sets)


def test_config_derived_and_round_trip():
    cfg = MaxSimConfig(dim=13, q_tokens=5, lanes=2)
    assert MaxSimConfig.from_dict(cfg.to_dict()) == cfg
    assert cfg.groups == 3                       # tokens 0-1, 2-3, 4
    assert cfg.derived()["multipliers"] == 26
    assert MaxSimConfig(q_tokens=32, lanes=32).groups == 1
    assert MaxSimConfig(q_tokens=7, lanes=1).performance()["initiation_interval"] == 7


def test_stimulus_shapes():
    cfg = MaxSimConfig(dim=5, q_tokens=6, lanes=4)
    stim = MaxSimModel.stimulus(cfg, 120, np.random.default_rng(1))
    shapes = batch_shapes(stim)
    assert sum(len(lengths) for _, lengths in shapes) == 120
    assert [len(lengths) for _, lengths in shapes[:3]] == [2, 1, 1]
    assert shapes[0][1][0] == 1                                  # first document: 1 token
    assert {q for q, _ in shapes} >= {1, 6} and all(1 <= q <= 6 for q, _ in shapes)
    assert sum(n == 1 for _, lengths in shapes for n in lengths) > 20
    beats = MaxSimModel.inputs(cfg, stim)
    assert sum(b["last"] for b in beats["i_query"]) == len(shapes)
    ends = [b for b in beats["i_docs"] if b["last"] and b["last_doc"]]
    assert len(ends) == len(shapes)
    assert any(b["last_doc"] and not b["last"] for b in beats["i_docs"])   # ignored noise
    out = MaxSimModel.expect(cfg, stim)["o_scores"]
    assert len(out) == 120 and sum(b["last"] for b in out) == len(shapes)


# -- simulation ------------------------------------------------------------------------------

@requires_verilator
def test_cycles_match_model_and_peak_rate():
    """Without stalls the cycle model is exact; with one-token documents in long batches the
    unit takes a document every ceil(q_tokens / lanes) cycles."""
    from hwgen.flow.simulate import simulate
    acc = registry.get("maxsim")
    cfg = acc.config.from_dict(acc.test_configs[0])           # dim 13, 5 tokens, 2 lanes
    result = simulate(acc, cfg, items=300, seed=11, stall=0.0, engine="native")
    assert result["mismatches"] == 0 and not result["timeout"]
    assert result["cycles"] == result["model_cycles"]
    assert result["latency_cycles"] == cfg.latency
    batches = [(5, [1] * 100), (5, [1] * 100)]
    stim = {"batches": [(np.full((q, cfg.dim), -128), [np.full((1, cfg.dim), k % 256 - 128)
                                                        for k in range(len(lengths))])
                        for q, lengths in batches], "noise": np.zeros(200, dtype=int)}
    peak = simulate(acc, cfg, stimulus=stim, seed=1, stall=0.0, engine="native")
    assert peak["mismatches"] == 0
    # 200 scores, one every `groups` cycles: first to last spans 199 * groups + 1 cycles
    assert peak["results_per_cycle"] == pytest.approx(200 / (199 * cfg.groups + 1), abs=1e-6)
    assert peak["cycles"] == cfg.performance(cfg.workload(batches=batches))["cycles"]


@requires_verilator
def test_query_longer_than_the_unit_is_cut():
    """Tokens beyond q_tokens are dropped; the golden model keeps the first q_tokens too."""
    from hwgen.flow.simulate import simulate
    acc = registry.get("maxsim")
    cfg = acc.config.from_dict(acc.test_configs[0])
    rng = np.random.default_rng(4)
    stim = MaxSimModel.stimulus(cfg, 40, rng)
    q0, docs0 = stim["batches"][0]
    long_query = np.concatenate([q0, np.full((3, cfg.dim), 127)])
    stim["batches"][0] = (long_query, docs0)
    result = simulate(acc, cfg, stimulus=stim, seed=2, stall=0.3, engine="native")
    assert result["mismatches"] == 0 and not result["timeout"]


@requires_verilator
@pytest.mark.parametrize("q_tokens", [3])
def test_two_group_ring_under_stalls(q_tokens):
    """G = 2, the shortest ring of the registered running maximum (one stored maximum and the
    pending step, written back one step after its comparison): exact under random stalls."""
    from hwgen.flow.simulate import simulate
    acc = registry.get("maxsim")
    cfg = acc.config.from_dict({"dim": 3, "q_tokens": q_tokens, "lanes": 2})
    assert cfg.groups == 2
    result = simulate(acc, cfg, items=200, seed=q_tokens, stall=0.5, engine="native")
    assert result["mismatches"] == 0 and not result["timeout"]
