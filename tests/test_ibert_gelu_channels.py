"""``ibert-gelu`` with one input scale per column (``scale_file``): after the FFN's first
QuantLinear (per-output-channel weight scales) the reference's ``IntGELU`` has per-channel
``b_int``, ``c_int`` and ``shift_int``. The kernel reads each column's ``b`` and ``(K1, K2)``
from ROMs by the beat's position in the row; checked against ``golden.int_gelu`` with the
vector scale, in the Amaranth simulator and under Verilator with random stalls, on a real
MiniLM slice, and bad files raise ConfigErrors naming ``scale_file``.
"""

import numpy as np
import pytest

from hwgen.ibert import golden
from hwgen.ibert.gelu import Gelu, GeluConfig, GeluModel

from test_ibert_elementwise import run_core
from test_ibert_real_params import assert_bad_files, column_scales, minilm_files, sim_exact

from conftest import requires_verilator

__all__ = ["minilm_files"]          # the calibrated MiniLM's exported files (a fixture)


#: Per-column configurations: (values without scale, scales of the columns).
COLUMN_CASES = {
    # odd row, lanes not dividing it, 32-bit inputs (a QuantLinear's int32 output)
    "odd": ({"in_bits": 32, "lanes": 5, "row": 23},
            lambda rng: column_scales(rng, 23, 3e-4, 2.0)),
    # 8-bit inputs at coarse scales: the clip |q| >= -b is reached in every column
    "coarse": ({"in_bits": 8, "lanes": 3, "row": 7},
               lambda rng: column_scales(rng, 7, 0.05, 1.0)),
    # one lane; b from -1 (scale 10) to a clip beyond the 12-bit input range
    "spread": ({"in_bits": 12, "lanes": 1, "row": 6},
               lambda rng: np.array([10.0, 1e-4, 0.3, 2e-3, 0.05, 1.0], np.float32)),
    # a single beat per row (lanes > row): the beat counter has no bits
    "one_beat": ({"in_bits": 16, "lanes": 4, "row": 3},
                 lambda rng: column_scales(rng, 3, 1e-3, 1.5)),
}


def column_config(tmp_path, case, seed=0, key="scale"):
    values, scales = COLUMN_CASES[case]
    path = tmp_path / f"{case}-{seed}.npz"
    np.savez(path, **{key: scales(np.random.default_rng(seed))})
    return GeluConfig(**values, scale_file=str(path))


@pytest.mark.parametrize("case", list(COLUMN_CASES))
def test_column_constants_are_golden(tmp_path, case):
    cfg = column_config(tmp_path, case)
    scales = cfg.scale_value
    assert scales.dtype == np.float32 and scales.shape == (cfg.row,)
    b, c, shift, out_scale = cfg.constants
    gb, gc, gshift, gout = golden.gelu_constants(scales)
    assert b.tolist() == gb.tolist() and c.tolist() == gc.tolist()
    assert shift.tolist() == gshift.tolist() and np.array_equal(out_scale, gout)
    # the per-column Python integers equal the vector form, column by column
    assert cfg.column_constants == list(zip(gb.tolist(), gc.tolist(), gshift.tolist()))
    roms = Gelu.column_roms(cfg)
    flat_b = [v for beat in roms["b"][1] for v in beat]
    flat_k = [v for beat in roms["k"][1] for v in beat]
    assert flat_b[:cfg.row] == gb.tolist()
    assert [k["pos"] for k in flat_k[:cfg.row]] == (gc + (gshift << 14)).tolist()
    assert [k["neg"] for k in flat_k[:cfg.row]] == (-gc + (gshift << 14)).tolist()
    assert all(v == 0 for v in flat_b[cfg.row:])
    assert all(k == {"pos": 0, "neg": 0} for k in flat_k[cfg.row:])


@pytest.mark.parametrize("case", list(COLUMN_CASES))
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_column_rtl_bit_exact_amaranth(tmp_path, case, seed):
    """The per-column datapath in the Amaranth simulator at several draws of the scales."""
    cfg = column_config(tmp_path, case, seed)
    stim = GeluModel.stimulus(cfg, 24, np.random.default_rng(seed))
    got = run_core(Gelu(cfg), GeluModel.inputs(cfg, stim)["i_x"], "y")
    assert got == GeluModel.expect(cfg, stim)["o_y"]


def test_equal_columns_match_the_scalar_kernel(tmp_path):
    """A file of one repeated scale gives the scalar configuration's results and widths."""
    scalar = GeluConfig(scale=1e-4, in_bits=12, lanes=3, row=11)
    path = tmp_path / "same.npz"
    np.savez(path, in_scale=np.full(11, 1e-4, np.float32))
    cfg = scalar.replace(scale_file=str(path))
    assert cfg.out_bits == scalar.out_bits and cfg.z_shape == scalar.z_shape
    assert cfg.latency == scalar.latency + 1
    stim = GeluModel.stimulus(cfg, 20, np.random.default_rng(5))
    want = GeluModel.expect(scalar, stim)["o_y"]
    assert GeluModel.expect(cfg, stim)["o_y"] == want
    assert run_core(Gelu(cfg), GeluModel.inputs(cfg, stim)["i_x"], "y") == want


def test_column_stimulus_reaches_clip_and_polynomial(tmp_path):
    """Every column sees inputs inside the polynomial's domain, and beyond its clip where
    the 8-bit range reaches it."""
    cfg = column_config(tmp_path, "coarse")
    stim = GeluModel.stimulus(cfg, 40, np.random.default_rng(3))
    b = cfg.folded[0]
    q = np.abs(stim["q"])
    assert (q < -b).any(axis=0).all()
    reach = -b <= 128
    assert 0 < reach.sum() < cfg.row and ((q >= -b) & (q < 128)).any(axis=0)[reach].all()


def test_bad_scale_files(tmp_path):
    row = 10
    ok = np.full(row, 1e-3, np.float32)
    cases = {
        "missing.npz": (None, r"cannot read the \.npz file"),
        "single.npy": (ok, r"must name an \.npz file"),
        "neither.npz": ({"scales": ok}, r"the file holds neither scale nor in_scale"),
        "length.npz": ({"scale": ok[:7]}, r"array scale must be a vector of 10, not 7"),
        "matrix.npz": ({"in_scale": ok.reshape(2, 5)},
                       r"array in_scale must be a vector of 10, not 2 x 5"),
        "text.npz": ({"scale": np.array(["a"] * row)}, r"array scale must hold numbers"),
        "zero.npz": ({"in_scale": np.where(np.arange(row) == 3, 0, ok)},
                     r"array in_scale must be positive \(it holds 0\)"),
        "inf.npz": ({"scale": np.where(np.arange(row) == 3, np.inf, ok)},
                    r"array scale must be finite"),
        "tiny.npz": ({"scale": np.where(np.arange(row) == 3, 1e-30, ok)},
                     r"is so small that i-GELU of 32-bit inputs exceeds int64"),
    }
    assert_bad_files(tmp_path, "scale_file",
                     lambda p: GeluConfig(row=row, lanes=4, scale_file=p), cases)


def test_scale_file_digest_follows_the_file(tmp_path):
    path = tmp_path / "s.npz"
    np.savez(path, scale=np.full(5, 1e-3, np.float32))
    first = GeluConfig(row=5, lanes=2, scale_file=str(path)).digest()
    np.savez(path, scale=np.full(5, 2e-3, np.float32))
    assert GeluConfig(row=5, lanes=2, scale_file=str(path)).digest() != first


@requires_verilator
@pytest.mark.parametrize("case", ["odd", "coarse", "spread"])
def test_column_simulates_bit_exact(tmp_path, case):
    """Verilator, 30% random stalls on both streams."""
    sim_exact("ibert-gelu", column_config(tmp_path, case), items=60)


@requires_verilator
def test_column_cycle_model(tmp_path):
    """The ROM's output register adds one stage; the cycle model follows."""
    cfg = column_config(tmp_path, "odd")
    result = sim_exact("ibert-gelu", cfg, items=20, stall=0.0)
    model = cfg.performance(cfg.workload(rows=20))
    assert result["latency_cycles"] == model["latency_cycles"]
    assert result["cycles"] == model["cycles"]


# -- the calibrated MiniLM's GELU, as minilm.export writes it -----------------------------------

def test_minilm_gelu_files_accepted(minilm_files):
    """Every layer's exported ``layer<L>_gelu.npz`` (``in_scale``: the ffn_up output scales)
    loads unchanged at the intermediate size and gives the exported ``b_int``, ``c_int``,
    ``shift_int``."""
    out, p = minilm_files
    for i, layer in enumerate(p["layers"]):
        path = out / f"layer{i}_gelu.npz"
        z = np.load(path)
        cfg = GeluConfig(row=len(z["in_scale"]), lanes=16, scale_file=str(path))
        b, c, shift, _ = cfg.constants
        assert b.tolist() == z["b_int"].tolist() and c.tolist() == z["c_int"].tolist()
        assert shift.tolist() == z["shift_int"].tolist()
        assert np.array_equal(cfg.scale_value, layer["constants"]["gelu"]["in_scale"])


@requires_verilator
def test_minilm_gelu_slice_simulates_bit_exact(minilm_files, tmp_path):
    """Layer 0's GELU after ffn_up, its first 20 channels (real per-channel scales), 32-bit
    inputs on 6 lanes (a padded last beat): bit-exact under stalls."""
    out, _ = minilm_files
    path = tmp_path / "gelu20.npz"
    np.savez(path, in_scale=np.load(out / "layer0_gelu.npz")["in_scale"][:20])
    cfg = GeluConfig(in_bits=32, lanes=6, row=20, scale_file=str(path))
    assert len(set(cfg.constants[0].tolist())) > 10           # really per channel
    sim_exact("ibert-gelu", cfg, items=40)


@pytest.mark.parametrize("case", ["odd", "coarse", "spread"])
def test_negate_per_column_amaranth(tmp_path, case):
    """``negate``: the per-column datapath gives exactly ``-int_gelu`` (the constants absorb
    the sign: ``-floor(w / 2**14) == floor((2**14 - 1 - w) / 2**14)``), the output range and
    scale are the negated ones."""
    from dataclasses import replace
    cfg = column_config(tmp_path, case, 1)
    neg = replace(cfg, negate=True)
    stim = GeluModel.stimulus(neg, 24, np.random.default_rng(3))
    want, _ = golden.int_gelu(stim["q"], cfg.scale_value)
    got = run_core(Gelu(neg), GeluModel.inputs(neg, stim)["i_x"], "y")
    assert got == GeluModel.expect(neg, stim)["o_y"]
    assert GeluModel.expect(neg, stim)["o_y"] != GeluModel.expect(cfg, stim)["o_y"]
    assert neg.out_range == tuple(-v for v in reversed(cfg.out_range))
    assert np.array_equal(neg.out_scale, -cfg.out_scale) and (neg.out_scale > 0).all()
    assert lo_hi_holds(neg.out_range, -want)


def lo_hi_holds(rng, y):
    return rng[0] <= int(y.min()) and int(y.max()) <= rng[1]


@pytest.mark.parametrize("values", [{"scale": 0.05, "in_bits": 8, "lanes": 3, "row": 7},
                                    {"scale": 1e-4, "in_bits": 12, "lanes": 2, "row": 5},
                                    {"scale": 3.7e-5, "in_bits": 32, "lanes": 4, "row": 9}])
def test_negate_scalar_amaranth(values):
    cfg = GeluConfig(**values, negate=True)
    stim = GeluModel.stimulus(cfg, 30, np.random.default_rng(5))
    y, _ = golden.int_gelu(stim["q"], cfg.scale_value)
    got = run_core(Gelu(cfg), GeluModel.inputs(cfg, stim)["i_x"], "y")
    assert got == GeluModel.expect(cfg, stim)["o_y"]
    assert lo_hi_holds(cfg.out_range, -y) and cfg.out_scale > 0
