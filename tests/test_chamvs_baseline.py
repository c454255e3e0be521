"""The node beside CPU faiss (``hwgen bench chamvs``): the same index searched by both, the
timing arithmetic, and the command's errors."""

import numpy as np
import pytest
from click.testing import CliRunner

from conftest import requires_faiss, requires_verilator
from hwgen.cli import main
from hwgen.vecsearch.baseline import BATCHES, compare, faiss_cpu, node_speed
from hwgen.vecsearch.node import ChamVSNodeConfig
from hwgen.vecsearch.node_model import node_search, prepare


def test_node_speed_is_clock_over_cycles():
    """1,000 and 2,000 cycles at 100 MHz: 10 and 20 us, 1 / 15 us = 66,667 QPS."""
    s = node_speed([1000, 2000], 100.0)
    assert s["qps"] == pytest.approx(1e6 / 15)
    assert s["p50_ms"] == pytest.approx(0.015)
    assert s["p99_ms"] == pytest.approx(0.0199)
    assert s["mean_cycles"] == 1500


@requires_faiss
def test_faiss_index_rebuilt_from_the_lists_is_the_trained_one():
    """A faiss index made from a node index's centroids and lists (as ChamLM rebuilds it
    from its shards) answers exactly as the trained faiss index: same ids, same distances."""
    from hwgen.vecsearch.ivfpq import faiss_index
    data = prepare(ChamVSNodeConfig(), count=30, seed=2)
    trained = data.index
    rebuilt = faiss_index(trained.coarse, trained.pq_centroids, trained.list_ids,
                          trained.list_codes)
    assert rebuilt.ntotal == trained.index.ntotal
    trained.index.nprobe = rebuilt.nprobe = 4
    q = data.queries.astype(np.float32)
    d1, i1 = trained.index.search(q, 10)
    d2, i2 = rebuilt.search(q, 10)
    assert np.array_equal(i1, i2) and np.array_equal(d1, d2)


@requires_faiss
def test_cpu_faiss_searches_the_nodes_index():
    """The baseline searches the node's own index at the node's nprobe: faiss's ids are the
    golden model's (the index has integer centroids, so float32 is exact), and the timing
    fields add up."""
    cfg = ChamVSNodeConfig()
    data = prepare(cfg, nprobe=3, count=12, seed=1)
    index = data.index.index
    index.nprobe = 3
    _, ids = index.search(data.queries.astype(np.float32), cfg.k)
    same = [set(ids[i].tolist()) == set(node_search(cfg, data, q, p)[1].tolist())
            for i, (q, p) in enumerate(zip(data.queries, data.probes))]
    assert np.mean(same) >= 0.9            # ties at the k-th distance may differ
    for batch in BATCHES:
        r = faiss_cpu(index, data.queries, cfg.k, 3, batch, threads=1, min_seconds=0.05)
        assert r["queries"] == 12 and r["passes"] >= 1 and r["threads"] == 1
        assert r["qps"] == pytest.approx(r["passes"] * 12 / r["seconds"])
        assert 0 < r["p50_ms"] <= r["p99_ms"]
    assert index.nprobe == 3


@requires_verilator
@requires_faiss
def test_compare_on_digits_is_bit_exact_and_consistent():
    """Three queries simulated (native engine), all 200 through the model and CPU faiss: no
    mismatch, the model within 5% of the simulation, the speedups the ratio of the QPS."""
    r = compare(ChamVSNodeConfig(), sim_queries=3, threads=1, min_seconds=0.05)
    assert r["ok"] and r["node_simulated"]["mismatches"] == 0
    assert r["queries"] == 200 and r["nprobe"] == 4 and r["vectors"] == 1597
    sim = r["node_simulated"]["speed"]
    model = r["node_model"]["speed"]
    assert len(r["node_simulated"]["cycles"]) == 3
    assert abs(model["mean_cycles"] - sim["mean_cycles"]) <= 0.05 * sim["mean_cycles"]
    assert [c["batch"] for c in r["cpu_faiss"]] == list(BATCHES)
    for c in r["cpu_faiss"]:
        assert r["speedup"][f"batch{c['batch']}"] == pytest.approx(sim["qps"] / c["qps"])
    assert r["gpu_faiss"] is None
    assert r["clock"]["mhz"] <= r["clock"]["kernel_mhz"]


@pytest.mark.parametrize("args, name", [
    (["--queries", "q.npy"], "queries"),
    (["--base", "missing.npy"], "base"),
    (["--sim-queries", "0"], "sim-queries"),
])
def test_bench_chamvs_errors_name_the_option(args, name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(main, ["bench", "chamvs", *args])
    assert r.exit_code != 0
    assert name in r.output


def test_syn_sets_are_the_paper_replication(tmp_path):
    """`dataset syn-512` from digits: every vector is eight copies of itself, so every squared
    distance is eight times the original and the exact neighbours are the same; queries are
    widened the same way; narrowing is refused naming the option."""
    from hwgen.datasets import digits, widened
    out = tmp_path / "s.npy"
    r = CliRunner().invoke(main, ["dataset", "syn-512", "--out", str(out)])
    assert r.exit_code == 0, r.output
    base, queries = np.load(out), np.load(tmp_path / "s_queries.npy")
    x = digits()[0]
    assert base.shape == (1597, 512) and queries.shape == (200, 512)
    np.testing.assert_array_equal(base[:, 64:128], x[:1597])
    d0 = ((x[-200:, None, :] - x[None, :1597, :]) ** 2).sum(-1)
    d1 = ((queries[:, None, :].astype(np.int64) - base[None, :, :]) ** 2).sum(-1)
    np.testing.assert_array_equal(d1, 8 * d0)
    assert widened(np.arange(6).reshape(2, 3), 7).tolist() == [[0, 1, 2, 0, 1, 2, 0],
                                                                [3, 4, 5, 3, 4, 5, 3]]
    np.save(tmp_path / "wide.npy", np.zeros((4, 600), np.float32))
    r = CliRunner().invoke(main, ["dataset", "syn-512", "--from", str(tmp_path / "wide.npy"),
                                  "--out", str(tmp_path / "n.npy")])
    assert r.exit_code != 0 and "from" in r.output and "narrow" in r.output
