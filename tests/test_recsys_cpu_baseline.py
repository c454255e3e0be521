"""The CPU baseline of ``hwgen bench recsys --cpu`` (hwgen.recsys.cpu_baseline): the PyTorch
model against the integer golden model within a bound derived from the arithmetic, tables in
memory and memory-mapped, and the command line. No timing thresholds: the rates are only
checked to be measured (positive, from the batches asked for)."""

import json
import os

import numpy as np
import pytest
from click.testing import CliRunner

from hwgen.cli import main
from hwgen.errors import ConfigError
from hwgen.recsys import cpu_baseline, golden
from hwgen.recsys.model import RecModel, Table, preset

torch = pytest.importorskip("torch")

#: Unit roundoff of float32.
U = 2.0 ** -24


def gamma(n):
    """Higham's gamma_n = n u / (1 - n u): a float32 sum of ``n`` terms (products of float32
    values each rounded once, or fused), in any order, differs from the exact sum by at most
    gamma_n times the sum of the terms' magnitudes."""
    return n * U / (1 - n * U)


def error_bound(net, layer_inputs):
    """Per layer, an elementwise bound on |torch output - golden output|.

    Layer ``l`` of the golden model computes ``y_g = clip(rhe(relu(W x_g + b) / 2**s))``; the
    torch layer computes ``y_f = clamp(fl(W' x_f + b'), 0, hi)`` with ``W' = W 2**-s`` (exact)
    and ``b'`` the float32 rounding of ``b 2**-s`` (``|b 2**-s - b'| <= gamma_1 |b'|``). The
    clamp is 1-Lipschitz and equals the golden clip of the ReLU for reals, and the rounding
    ``rhe`` moves a value by at most 0.5, so with ``E`` the bound on ``|x_f - x_g|``::

        |y_f - y_g| <= 0.5 + |W'| E + gamma_(n+1) (|W'| |x_f| + |b'|) + gamma_1 |b'|

    (``n`` inputs; the bias is the sum's (n+1)-th term). The last layer has no 0.5 and no
    clamp. ``E = 0`` for the embedding vector (the gather is exact). No subnormal numbers
    occur: every value of layer ``l`` is a multiple of ``2**-(s_0 + ... + s_l)``, above
    float32's smallest normal when the shifts add up to less than 126 (asserted). The bound
    is evaluated in float64 and widened by 2**-40 relative for that evaluation."""
    model = net.model
    assert sum(model.shifts) < 126
    linears = [m for m in net.fc if isinstance(m, torch.nn.Linear)]
    bounds, e = [], np.zeros(layer_inputs[0].shape)
    for layer, (linear, x) in enumerate(zip(linears, layer_inputs)):
        w = np.abs(linear.weight.detach().double().numpy())
        b = np.abs(linear.bias.detach().double().numpy())
        n = w.shape[1]
        d = e @ w.T + gamma(n + 1) * (np.abs(x) @ w.T + b) + gamma(1) * b
        e = (d + (0.5 if layer < len(linears) - 1 else 0.0)) * (1 + 2.0 ** -40)
        bounds.append(e)
    return bounds


def golden_layers(model, x):
    """The golden model's output of every FC layer (golden.fc_layer, as golden.mlp)."""
    outs, last = [], len(model.layers) - 1
    for layer in range(last + 1):
        w, b = golden.layer_params(model, layer)
        x = golden.fc_layer(x, w, b, relu=layer < last,
                            shift=model.shifts[layer] if layer < last else 0,
                            out_bits=model.act_bits[layer + 1] if layer < last else 0)
        outs.append(x)
    return outs


def odd_model():
    """16-bit elements and activations, odd sizes, a single-row table, 5 layers."""
    return RecModel(name="odd-16", tables=(Table(1, 3), Table(37, 5), Table(1000, 7),
                                           Table(9, 1)), dense=3, layers=(19, 11, 5, 3, 1),
                    weight_bits=16, act_bits=(16, 16, 8, 16, 8), shifts=(14, 13, 11, 12),
                    seed=3)


MODELS = {"small-ctr": preset("small-ctr"), "cluster-ctr": preset("cluster-ctr"),
          "odd-16": odd_model()}


def _inputs(model, n, seed):
    rng = np.random.default_rng(seed)
    rows = np.array([t.rows for t in model.tables])
    idx = rng.integers(0, rows, size=(n, len(rows)))
    idx[0], idx[1] = 0, rows - 1
    return idx, golden.dense_features(model, n, rng)


@pytest.mark.float_reference
@pytest.mark.parametrize("name", MODELS)
def test_torch_model_agrees_with_golden_model_within_the_derived_bound(name):
    """The embedding vector is bit-exact; every FC layer's output is within the bound of
    :func:`error_bound`, and the inputs reach the saturation of some hidden layer."""
    model = MODELS[name]
    array, info = cpu_baseline.table_storage(model)
    assert info["mode"] == "memory"
    net = cpu_baseline.CTRNet(model, array)
    idx, dense = _inputs(model, 300, seed=11)
    x = net.embed(torch.from_numpy(idx), torch.from_numpy(dense.astype(np.float32)))
    want = golden.embed(model, golden.table_contents(model), idx, dense)
    assert np.array_equal(x.numpy(), want.astype(np.float32))
    outs = [o.double().numpy() for o in net.layer_outputs(x)]
    gold = golden_layers(model, want)
    assert np.array_equal(gold[-1], golden.mlp(model, want))
    bounds = error_bound(net, [x.double().numpy()] + outs[:-1])
    for layer, (got, g, bound) in enumerate(zip(outs, gold, bounds)):
        assert got.shape == g.shape == bound.shape
        assert (np.abs(got - g) <= bound).all(), f"layer {layer}"
    saturated = [(g == (1 << (b - 1)) - 1).any() for g, b in zip(gold[:-1], model.act_bits[1:])]
    assert any(saturated)


def test_bound_catches_a_wrong_model():
    """The same check fails for a torch model with another model's weights (seed 8)."""
    model = preset("small-ctr")
    other = RecModel.from_dict({**model.to_dict(), "seed": 8})
    array, _ = cpu_baseline.table_storage(model)
    net = cpu_baseline.CTRNet(model, array)
    net.fc = cpu_baseline.mlp(other)
    idx, dense = _inputs(model, 50, seed=2)
    x = net.embed(torch.from_numpy(idx), torch.from_numpy(dense.astype(np.float32)))
    outs = [o.double().numpy() for o in net.layer_outputs(x)]
    gold = golden_layers(model, x.numpy().astype(np.int64))
    bounds = error_bound(net, [x.double().numpy()] + outs[:-1])
    assert (np.abs(outs[0] - gold[0]) > bounds[0]).any()


def test_memory_mapped_tables_equal_the_in_memory_ones(tmp_path):
    """The file holds the same contents; a second call reuses it; the two models agree bit
    for bit."""
    model = preset("small-ctr")
    memory, _ = cpu_baseline.table_storage(model, "memory")
    mapped, info = cpu_baseline.table_storage(model, "mmap", tmp_path)
    assert info["mode"] == "mmap" and not mapped.flags.writeable and not mapped.flags.owndata
    assert info["bytes"] == sum(t.rows * t.dim for t in model.tables)     # int8 elements
    assert np.array_equal(memory, mapped)
    again, info2 = cpu_baseline.table_storage(model, "mmap", tmp_path)
    assert info2["path"] == info["path"] and info2["write_s"] == 0.0
    idx, dense = cpu_baseline.random_batch(model, 17, np.random.default_rng(4))
    args = (torch.from_numpy(idx), torch.from_numpy(dense))
    with torch.inference_mode():
        a = cpu_baseline.CTRNet(model, memory)(*args)
        b = cpu_baseline.CTRNet(model, again)(*args)
    assert torch.equal(a, b)


def test_large_tables_get_seeded_uniform_contents():
    """Beyond the golden limit: reproducible values over the whole signed range."""
    model = MODELS["odd-16"]
    chunks = list(cpu_baseline.table_chunks(model, golden_limit=200))
    again = np.concatenate(list(cpu_baseline.table_chunks(model, golden_limit=200)))
    flat = np.concatenate(chunks)
    assert flat.dtype == np.int16 and np.array_equal(flat, again)
    assert len(flat) == sum(t.rows * t.dim for t in model.tables)
    exact = np.concatenate(list(cpu_baseline.table_chunks(model)))
    start = 3 + 37 * 5                    # tables 0, 1 and 3 (9 elements): golden contents
    assert np.array_equal(flat[:start], exact[:start]) and np.array_equal(flat[-9:], exact[-9:])
    assert not np.array_equal(flat[start:start + 7000], exact[start:start + 7000])
    assert flat.min() < -30000 and flat.max() > 30000


def test_paper_model_is_memory_mapped_by_default():
    """paper-ctr's 15.1 GB of 16-bit tables exceed the in-memory limit (nothing is written:
    only the decision is checked)."""
    model = preset("paper-ctr")
    assert cpu_baseline.element_dtype(model) == np.int16
    nbytes = sum(t.rows * t.dim for t in model.tables) * 2
    assert nbytes == pytest.approx(15.1e9, rel=1e-3) and nbytes > cpu_baseline.IN_MEMORY_LIMIT


def test_timing_reports_the_batches_asked_for():
    model = preset("cluster-ctr")
    array, _ = cpu_baseline.table_storage(model)
    net = cpu_baseline.CTRNet(model, array)
    r = cpu_baseline.time_batches(net, 3, 0.0, np.random.default_rng(1), min_repeats=4)
    assert r["batch"] == 3 and r["repeats"] == 4
    assert 0 < r["p10_s"] <= r["median_s"] <= r["p90_s"]
    assert r["inferences_per_s"] == pytest.approx(3 / r["median_s"])
    assert r["minor_faults"] >= 0 and r["major_faults"] >= 0


def test_cli_prints_a_measured_rate(tmp_path):
    out = tmp_path / "r.json"
    threads = torch.get_num_threads()
    result = CliRunner().invoke(main, [
        "bench", "recsys", "--no-sim", "--cpu", "--cpu-preset", "small-ctr", "--batch", "1",
        "--batch", "7", "--cpu-seconds", "0.05", "--threads", "1", "--cpu-tables", "mmap",
        "--cpu-dir", str(tmp_path / "tables"), "--json", str(out)])
    assert result.exit_code == 0, result.output
    assert torch.get_num_threads() == threads                  # restored
    for text in ("CPU baseline measured here: small-ctr in PyTorch", " thread",
                 "memory-mapped from", "| measured here | 1 |", "| measured here | 7 |",
                 "| the paper (section IV-C) | 1024 | 32,282 | 31.72 |",
                 "(the CPU ran small-ctr, not paper-ctr: no speed-up over it)",
                 "| 4 nodes |", "model/paper"):
        assert text in result.output, text
    report = json.loads(out.read_text())
    assert report["ok"] and report["simulation"] == []
    runs = report["cpu"]["runs"]
    assert [r["batch"] for r in runs] == [1, 7]
    assert all(r["inferences_per_s"] > 0 and r["repeats"] >= 5 for r in runs)
    assert report["cpu"]["tables"]["mode"] == "mmap"
    if not os.environ.get("HWGEN_TORCH_THREADS"):       # tests/conftest.py may pin torch's
        assert report["cpu"]["threads"] == 1
    assert [d["nodes"] for d in report["designs"]] == [1, 2, 4]
    assert all(d["speedup_over_measured_cpu"] is None for d in report["designs"])


def test_speed_up_over_the_measured_cpu():
    """With a paper-ctr measurement the designs table gains the column of speed-ups over it
    (a made-up rate: the real one needs the 15.1 GB table file)."""
    from hwgen.recsys import bench
    best = {"batch": 1024, "inferences_per_s": 5000.0, "median_s": 1024 / 5000.0}
    fake = {"model": "paper-ctr", "machine": "test machine", "threads": 2, "best": best}
    lines = []
    designs, rows = bench._designs_section(lines.append, preset("paper-ctr"), fake)
    text = "\n".join(lines)
    assert "speed-up model over the CPU measured here" in text
    assert "| CPU measured here (test machine, 2 threads), paper-ctr, batch 1024 |" in text
    for row in rows:
        assert row["speedup_over_measured_cpu"] == pytest.approx(row["inferences_per_s"]
                                                                 / 5000.0)
    four = next(line for line in lines if line.startswith("| 4 nodes |"))
    assert f"| {designs[4][0].inferences_per_s / 5000:.2f} |" in four


@pytest.mark.parametrize("args, param", [
    (["--cpu", "--batch", "0"], "batch=0"),
    (["--cpu", "--batch", "20000"], "batch=20000"),
    (["--cpu", "--threads", "0"], "threads=0"),
    (["--cpu", "--cpu-seconds", "0"], "cpu-seconds=0.0"),
    (["--cpu", "--cpu-preset", "nope"], "cpu-preset='nope'"),
    (["--batch", "4"], "batch=(4,)"),
    (["--threads", "2"], "threads=2"),
])
def test_invalid_options_give_one_clear_error(args, param):
    result = CliRunner().invoke(main, ["bench", "recsys", "--no-sim", *args])
    assert result.exit_code == 2
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and param in lines[0], result.output
    assert "Traceback" not in result.output


def test_bad_table_mode_is_refused():
    with pytest.raises(ConfigError) as e:
        cpu_baseline.table_storage(preset("small-ctr"), "disk")
    assert e.value.param == "cpu-tables"
    result = CliRunner().invoke(main, ["bench", "recsys", "--no-sim", "--cpu",
                                       "--cpu-tables", "disk"])
    assert result.exit_code == 2 and "cpu-tables" in result.output
