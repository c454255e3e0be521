"""ESPN's adaptive prefetch: equation (4) and the decision on hand-worked numbers, and on a real
O_DIRECT store over a synthetic index (no encoder): no document is read twice, a query that the
rule keeps from prefetching reads exactly as the better SSD method, and re-ranking 1,000
candidates gives the in-memory top-k."""

import threading
import time
from collections import Counter
from types import SimpleNamespace

import numpy as np
import pytest

faiss = pytest.importorskip("faiss")

from hwgen.espn.host.prefetch import (Observed, ReadModel, batch_threshold, decide,  # noqa: E402
                                      fitting, prefetch_budget)
from hwgen.espn.host.search import CANDIDATES, Query, Searcher  # noqa: E402
from hwgen.espn.host.store import DirectStore, RamStore, StoreWriter  # noqa: E402

DIM = 16


# ---------------------------------------------------------------- equation (4) by hand

def test_budget_and_batch_threshold_follow_the_paper():
    # eq. (2)-(3): the paper's Fig. 5 example, a 10% step leaves ~28 ms of a 31.1 ms search
    assert prefetch_budget(0.0311, 0.10) == pytest.approx(0.02799)
    # eq. (4): 1 GB/s x 28 ms / (1,000 documents x 4,096 B) = 28e6 / 4.096e6 = 6.8359375
    assert batch_threshold(1e9, 0.028, 1000 * 4096) == pytest.approx(6.8359375)
    # twice the bandwidth (PCIe 3.0 -> 4.0), twice the batch (the paper: 12 -> 24)
    assert batch_threshold(2e9, 0.028, 1000 * 4096) == pytest.approx(13.671875)
    assert batch_threshold(1e9, 0.028, 0) == float("inf")


def test_fitting_documents_by_hand():
    # 8,192 B/ms for 1 ms: 8,192 bytes fit = two 4 KiB documents
    assert fitting([4096] * 10, 0.001, 8.192e6) == 2
    # a 0.5 ms read latency leaves 0.5 ms: one document
    assert fitting([4096] * 10, 0.001, 8.192e6, latency=0.0005) == 1
    # a budget below the latency: none
    assert fitting([4096] * 10, 0.0004, 8.192e6, latency=0.0005) == 0
    # two queries share the bandwidth: 4,096 bytes each
    assert fitting([4096] * 10, 0.001, 8.192e6, batch=2) == 1
    # sizes add up in prefetch order: 4,096 + 8,192 = 12,288 fits in 12,288, + 4,096 does not
    assert fitting([4096, 8192, 4096], 0.0015, 8.192e6) == 2
    model = ReadModel(0.0, 40e6, 0.0005, 8.192e6, threads=4)
    assert model.fitting([4096] * 10, 0.001) == 1
    assert model.documents(0.001, 4096) == 1 and model.documents(0.0004, 4096) == 0
    # threshold with the latency: 8.192e6 x (1 ms - 0.5 ms) / 4,096 B = 1 query
    assert model.threshold(0.001, 4096) == pytest.approx(1.0)


def test_faster_way_to_read_by_hand():
    # sync D / 40 MB/s against parallel 0.2 ms + D / 160 MB/s: equal at
    # D (1/40e6 - 1/160e6) = 2e-4, D = 10,666.7 bytes
    model = ReadModel(0.0, 40e6, 2e-4, 160e6, threads=4)
    assert model.seconds(4096, "sync") == pytest.approx(4096 / 40e6)
    assert model.seconds(4096, "parallel") == pytest.approx(2e-4 + 4096 / 160e6)
    assert model.best(4096) == "sync" and model.best(10_000) == "sync"
    assert model.best(11_000) == "parallel" and model.best(409_600) == "parallel"
    assert model.seconds(0, "parallel") == 0.0
    assert ReadModel(0.0, 1.0, 0.0, 1e12, threads=1).best(10**9) == "sync"   # one thread


def test_decision_by_hand():
    model = ReadModel(0.0, 1e7, 0.0, 1e8, threads=4)
    seen = Observed(ann=[0.010] * 3, overhead=[0.001], precision=[1.0], count=[100])
    plan = decide(seen, 0.10, model, 8192, 1000)
    # budget 10 ms x 0.9 = 9 ms; room 9 - 1 = 8 ms; 1e8 B/s x 8 ms / 8,192 B = 97.66 -> 97
    assert plan["budget"] == pytest.approx(0.009) and plan["room"] == pytest.approx(0.008)
    assert plan["fit"] == 97
    # 100 x 8,192 B read in parallel (0.0082 s) vs one by one (0.082 s): parallel; the 97
    # prefetched leave 3, saving 97 x 8,192 / 1e8 = 7.946 ms > 1 ms of overhead
    assert plan["saving"] == pytest.approx(97 * 8192 / 1e8) and plan["prefetch"]
    # a tenth of the prefetched documents re-ranked: 0.795 ms saved < 1 ms: no prefetch
    seen.precision = [0.1]
    assert not decide(seen, 0.10, model, 8192, 1000)["prefetch"]
    # a 1 ms search: budget 0.9 ms < 1 ms of overhead: nothing fits
    plan = decide(Observed(ann=[0.001], overhead=[0.001]), 0.10, model, 8192, 1000)
    assert plan["fit"] == 0 and not plan["prefetch"]
    # nothing observed of the prefetch yet: overhead 0, hit 1, count from the caller
    plan = decide(Observed(ann=[0.002]), 0.5, model, 10_000, 7)
    assert plan["fit"] == 7 and plan["hit"] == 1.0 and plan["prefetch"]   # 1e8 x 1 ms = 10


# ---------------------------------------------------------------- a synthetic index on disk

@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    """1,500 documents of 3..60 unit float16 tokens in a real token file, an IVF of their
    random pooled vectors (12 lists), and 6 queries."""
    rng = np.random.default_rng(11)
    n = 1500
    path = tmp_path_factory.mktemp("espn-synthetic") / "tokens.bin"
    writer = StoreWriter(path, DIM)
    for size in rng.integers(3, 61, size=n):
        t = rng.standard_normal((int(size), DIM)).astype(np.float32)
        writer.add((t / np.linalg.norm(t, axis=1, keepdims=True)).astype(np.float16))
    offsets, ntokens = writer.close()
    pooled = rng.standard_normal((n, 384)).astype(np.float32)
    pooled /= np.linalg.norm(pooled, axis=1, keepdims=True)
    ivf = faiss.IndexIVFFlat(faiss.IndexFlatIP(384), 384, 12, faiss.METRIC_INNER_PRODUCT)
    ivf.cp.seed = 1
    ivf.train(pooled)
    ivf.add(pooled)
    queries = []
    for _ in range(6):
        q = rng.standard_normal((8, DIM)).astype(np.float32)
        queries.append(Query(pooled[int(rng.integers(n))] + 0.1 * rng.standard_normal(384)
                             .astype(np.float32),
                             (q / np.linalg.norm(q, axis=1, keepdims=True)).astype(np.float16)))
    index = SimpleNamespace(ivf=ivf, dim=DIM)
    return index, (path, offsets, ntokens, DIM), queries


def _reference(index, files, queries, **kw):
    with RamStore(*files) as ram:
        return [Searcher(index, ram, **kw).search(q) for q in queries]


def _counting(store, slow=0.0):
    """Record every document ``store`` reads (in call order); ``slow`` seconds per read."""
    reads, lock = [], threading.Lock()
    read_one = store._read_one

    def counted(doc):
        with lock:
            reads.append(int(doc))
        if slow:
            time.sleep(slow)
        return read_one(doc)
    store._read_one = counted
    return reads


def _patient(store, seconds=0.02):
    """Make ``store.submit`` return only ``seconds`` after the prefetch is issued, as if the
    search went on that long (this index's search is faster than a thread starts)."""
    submit = store.submit

    def later(*args, **kw):
        fetch = submit(*args, **kw)
        time.sleep(seconds)
        return fetch
    store.submit = later


#: A store that reads at 100 MB/s either way with no latency: everything fits a long budget.
FAST = ReadModel(0.0, 1e8, 0.0, 1e8, threads=4)


def test_no_document_is_read_twice(synthetic):
    index, files, queries = synthetic
    kw = dict(nprobe=6, candidates=200, k=10)
    reference = _reference(index, files, queries, **kw)
    outcomes = []
    for q, ref in zip(queries, reference):
        with DirectStore(*files, threads=4) as store:
            s = Searcher(index, store, prefetch_step=0.2, read_model=FAST, **kw)
            # a 1 s search as measured: the whole first-step list fits the budget
            s.observed = Observed(ann=[1.0])
            reads = _counting(store, slow=0.002)      # the search ends mid-prefetch
            _patient(store)
            r = s.search(q)
        counts = Counter(reads)                       # the store closed: every read is in
        assert max(counts.values()) == 1, counts.most_common(3)
        assert set(r.candidates.tolist()) <= set(counts)
        assert r.hits + r.missed == len(r.candidates) == 200
        assert len(counts) == r.prefetched + r.missed  # reads = prefetch started + misses
        assert r.ids.tolist() == ref.ids.tolist() and r.scores.tolist() == ref.scores.tolist()
        outcomes.append((r.hits, r.missed, r.prefetched))
    assert all(p > 0 for _, _, p in outcomes)
    # stopped mid-way: some candidates came from the prefetch, some were read after it
    assert any(h > 0 and m > 0 for h, m, _ in outcomes), outcomes


def test_prefetch_off_reads_exactly_as_the_better_ssd_mode(synthetic):
    index, files, queries = synthetic
    kw = dict(nprobe=6, candidates=120, k=10)
    # one read after another is faster; a 1 s latency keeps every prefetch out of the budget
    sync_better = ReadModel(0.0, 1e9, 1.0, 1e9, threads=4)
    # reading in parallel is faster (1 B/s one by one), the same latency
    parallel_better = ReadModel(0.0, 1.0, 1.0, 1e9, threads=4)
    for model, ssd_threads in ((sync_better, 1), (parallel_better, 4)):
        with DirectStore(*files, threads=ssd_threads) as ssd_store, \
                DirectStore(*files, threads=4) as espn_store:
            ssd = Searcher(index, ssd_store, **kw)
            espn = Searcher(index, espn_store, prefetch_step=0.1, read_model=model, **kw)
            ssd_reads, espn_reads = _counting(ssd_store), _counting(espn_store)
            for q in queries:
                a, b = ssd.search(q), espn.search(q)
                assert not b.plan["prefetch"] and b.prefetched == 0 and b.hits == 0
                assert a.bytes_read == b.bytes_read and a.missed == b.missed
                assert a.ids.tolist() == b.ids.tolist()
                assert a.scores.tolist() == b.scores.tolist()
        if ssd_threads == 1:          # the same reads in the same order, one after another
            assert espn_reads == ssd_reads
        else:                         # the same reads, in the order the threads took them
            assert sorted(espn_reads) == sorted(ssd_reads)


def test_rerank_depth_of_a_thousand(synthetic):
    index, files, queries = synthetic
    assert CANDIDATES == 1000
    kw = dict(nprobe=12, k=25)                      # every list: all 1,500 documents reachable
    reference = _reference(index, files, queries, **kw)
    with RamStore(*files) as ram:
        assert Searcher(index, ram, candidates=5000).candidates == 1500    # lowered to the index
        docs = ram.read(range(1500))
    for q, ref in zip(queries, reference):
        assert len(ref.candidates) == 1000 and ref.missed == 1000
        qf = q.tokens.astype(np.float64)
        brute = {int(d): float(np.max(docs[int(d)].astype(np.float64) @ qf.T, axis=0).sum())
                 for d in ref.candidates}
        best = sorted(brute, key=lambda d: (-brute[d], d))[:25]
        assert set(ref.ids.tolist()) == set(best)
        for d, s in zip(ref.ids, ref.scores):
            assert abs(s - brute[int(d)]) <= 1e-5 * q.tokens.shape[0]
    with DirectStore(*files, threads=4) as store:
        espn = Searcher(index, store, prefetch_step=0.3, read_model=FAST, **kw)
        espn.observed = Observed(ann=[1.0])
        _patient(store)
        for q, ref in zip(queries, reference):
            r = espn.search(q)
            assert r.prefetched > 0 and r.hits + r.missed == 1000
            assert r.ids.tolist() == ref.ids.tolist() and r.scores.tolist() == ref.scores.tolist()
