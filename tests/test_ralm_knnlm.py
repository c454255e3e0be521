"""The kNN-LM of hwgen.ralm: its distribution and interpolation, retrieval through two
ChamVS node processes over TCP against one node, and bad input (empty prompt, an unknown node,
nodes killed mid-generation). The LM here is a tiny random-weight llama with a byte-level
tokenizer, so that the tests need no model file."""

import socket

import numpy as np
import pytest

pytest.importorskip("torch", reason="the ralm LM needs torch")

from conftest import requires_verilator  # noqa: E402
from hwgen.errors import ConfigError  # noqa: E402
from hwgen.vecsearch.node import ChamVSNodeConfig  # noqa: E402
from hwgen.vecsearch.host.coordinator import same_results  # noqa: E402
from hwgen.ralm import chamlm, costs, keys, knnlm, lm  # noqa: E402
from test_ralm_lm import tiny_weights  # noqa: E402


def test_knn_distribution_sums_softmax_weights_per_token():
    values = np.array([7, 3, 7, 1])
    d = np.array([[0.0, 1.0, 2.0, np.inf]])
    ids = np.array([[0, 1, 2, -1]])
    p = knnlm.knn_distribution(d, ids, values, vocab=10, temperature=1.0)
    w = np.exp([0.0, -1.0, -2.0])
    w /= w.sum()
    assert p.shape == (1, 10)
    assert p[0, 7] == pytest.approx(w[0] + w[2])
    assert p[0, 3] == pytest.approx(w[1])
    assert p[0, 1] == 0 and p.sum() == pytest.approx(1.0)
    # a larger temperature flattens the weights
    flat = knnlm.knn_distribution(d, ids, values, 10, temperature=100.0)
    assert flat[0, 3] > p[0, 3]
    # no neighbours at all: all zeros, and interpolation keeps the LM's distribution
    none = knnlm.knn_distribution([[np.inf]], [[-1]], values, 10)
    assert not none.any()
    p_lm = np.full((1, 10), 0.1)
    np.testing.assert_allclose(knnlm.interpolate(p_lm, none, 0.5), p_lm)
    mix = knnlm.interpolate(p_lm, p, 0.25)
    np.testing.assert_allclose(mix, 0.25 * p + 0.75 * p_lm)
    assert mix.sum() == pytest.approx(1.0)
    with pytest.raises(ConfigError, match="lambda"):
        knnlm.interpolate(p_lm, p, 1.5)
    with pytest.raises(ConfigError, match="temperature"):
        knnlm.knn_distribution(d, ids, values, 10, temperature=0)


def test_follow_moves_neighbours_along_their_passages():
    passage = np.array([0, 0, 0, 1, 1, 2])
    ids = np.array([[0, 2, 3, -1, 5]])
    assert knnlm.follow(ids, 0, passage).tolist() == ids.tolist()
    # entry 0 -> 1 (same passage); 2 -> 3 crosses into passage 1; 3 -> 4; 5 runs off the end
    assert knnlm.follow(ids, 1, passage).tolist() == [[1, -1, 4, -1, -1]]
    assert knnlm.follow(ids, 2, passage).tolist() == [[2, -1, -1, -1, -1]]


def test_quantize_keys_clips_outliers_at_the_percentile():
    keys = np.concatenate([np.linspace(-1, 1, 999), [50.0]])[None, :]
    ints, scale = knnlm.quantize_keys(keys, 8)
    assert ints.max() == 127 and ints.min() >= -128
    assert scale > 100          # set by the bulk (|x| <= 1), not by the one outlier
    again, same = knnlm.quantize_keys(keys, 8, scale)
    assert same == scale and np.array_equal(again, ints)


TINY = lm.LlamaConfig(dim=24, layers=2, heads=6, kv_heads=2, ffn=40, vocab=256,
                      rope_base=500.0, context=512)
TEXTS = [
    "Chameleon retrieves every token from memory nodes near the vector data.",
    "The coordinator broadcasts each query to the nodes and merges their results.",
    "Product quantization compresses vectors into short codes of one byte each.",
    "An inverted file index probes the nearest lists and scans their codes.",
    "The language model interpolates its distribution with the neighbours' tokens.",
    "FPGAs stream the codes from DRAM and select the top results in hardware.",
]


@pytest.fixture(scope="module")
def tiny():
    from tokenizers import pre_tokenizers
    tokens = sorted(pre_tokenizers.ByteLevel.alphabet())        # one token per byte
    model = lm.Llama(TINY, tiny_weights(TINY, seed=11), lm.Tokenizer(tokens, []))
    store = knnlm.build_datastore(model, [(t, f"tiny/{i}") for i, t in enumerate(TEXTS)])
    return model, store


@pytest.fixture(scope="module")
def indexes(tiny, tmp_path_factory):
    _, store = tiny
    out = {}
    for nodes in (1, 2):
        d = tmp_path_factory.mktemp(f"index{nodes}")
        knnlm.make_index(store, d, nodes=nodes, nlist=8, m=8, nprobe=4, k=4)
        out[nodes] = d
    return out


def test_datastore_holds_every_next_token(tiny):
    model, store = tiny
    n = sum(len(model.tokenizer.encode(t)) - 1 for t in TEXTS)
    assert store.keys.shape == (n, TINY.dim) and len(store.values) == n
    first = model.tokenizer.encode(TEXTS[0])
    assert store.values[:len(first) - 1].tolist() == first[1:]
    assert store.texts[store.passage[-1]] == TEXTS[-1]


def test_two_node_processes_answer_as_one(tiny, indexes):
    """The same index split over two node processes (TCP, coordinator merge) gives the one
    node's results: same distances, same ids below the k-th distance."""
    _, store = tiny
    queries = store.keys[::37] + np.random.default_rng(0).normal(0, 0.05, (1, TINY.dim))
    with knnlm.Retriever(indexes[1]) as one, knnlm.Retriever(indexes[2]) as two:
        assert len(two.addresses) == 2 and one.inv_scale == two.inv_scale
        _, i1, r1 = one.search(queries)
        _, _, r2 = two.search(queries)
    assert not r1.partial and not r2.partial
    for q in range(len(queries)):
        assert same_results((r1.distances[q], r1.ids[q]), (r2.distances[q], r2.ids[q]))
    assert (i1 >= 0).all()
    # the nodes' integer distances, every query
    assert [list(map(int, d)) for d in r1.distances] == [list(map(int, d)) for d in r2.distances]


def _closed_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unknown_node_is_reported_missing(tiny, indexes):
    model, store = tiny
    with knnlm.Retriever(indexes[1], timeout=2.0,
                         addresses=[("127.0.0.1", _closed_port())]) as r:
        d, i, res = r.search(store.keys[:2])
        assert res.partial and len(res.missing) == 1
        assert (i == -1).all()
        g = chamlm.generate(model, r, store, "Chameleon", tokens=4, interval=2)
    assert g["lm_only_steps"] == 4 and all(x["missing"] for x in g["retrievals"])


def test_empty_prompt_and_bad_interval(tiny, indexes):
    model, store = tiny
    with knnlm.Retriever(indexes[1]) as r:
        with pytest.raises(ConfigError, match="prompt"):
            chamlm.generate(model, r, store, "   ")
        with pytest.raises(ConfigError, match="interval"):
            chamlm.generate(model, r, store, "x", interval=0)
    with pytest.raises(ConfigError, match="index"):
        knnlm.Retriever(indexes[1] / "nowhere")


@pytest.mark.parametrize("text", ['{"scale": 1.0}', '[1, 2]', '{"scale": "x", "nodes": 1}',
                                  '{"scale": 1.0, "nodes": 0}', 'not json',
                                  '{"inv_scale": 0.0, "nodes": 1}',
                                  '{"inv_scale": -3.0, "scale": 2.0, "nodes": 1}'])
def test_bad_index_json_is_one_clear_error(tmp_path, text):
    (tmp_path / "index.json").write_text(text)
    with pytest.raises(ConfigError, match="index"):
        knnlm.Retriever(tmp_path)


def test_nodes_killed_mid_generation(tiny, indexes):
    """One node killed: the other still answers (partial results); both killed: the
    generation goes on with the LM alone and says which nodes are missing."""
    model, store = tiny
    events = []
    with knnlm.Retriever(indexes[2], timeout=2.0) as r:
        def on_retrieval(step, found, missing):
            events.append((step, len(found), list(missing)))
            if step == 2:
                r.kill_node(0)
            if step == 4:
                r.kill_node(1)
        g = chamlm.generate(model, r, store, "The coordinator", tokens=8, interval=2,
                            on_retrieval=on_retrieval)
    assert len(g["tokens"]) == 8
    assert events[0][1] > 0 and not events[0][2]              # both nodes answered
    assert events[2][1] > 0 and len(events[2][2]) == 1        # one node left
    assert events[3][1] == 0 and len(events[3][2]) == 2       # none: LM alone
    assert g["lm_only_steps"] == 2


@pytest.mark.parametrize("args, param", [
    (["generate", "   "], "prompt"),
    (["generate", "x", "--interval", "0"], "interval"),
    (["generate", "x", "--lambda", "1.5"], "lambda"),
    (["bench", "--lambdas", "0.1,2"], "lambdas"),
    (["bench", "--ks", "32"], "ks"),
    (["bench", "--intervals", "1,x"], "intervals"),
    (["generate", "x", "--timeout", "0"], "timeout"),
    (["bench", "--batch", "0"], "batch"),
    (["bench", "--batch", "4,x"], "batch"),
    (["bench", "--sizes", "100"], "sizes"),
    (["bench", "--probes", "0"], "probes"),
    (["bench", "--store-tokens", "0"], "store_tokens"),
])
def test_cli_bad_options_name_the_parameter(args, param):
    """Checked before the model loads: one line naming the parameter, no traceback."""
    from click.testing import CliRunner

    from hwgen.cli import main
    r = CliRunner().invoke(main, ["ralm", *args])
    assert r.exit_code != 0
    assert param in r.output and "Traceback" not in r.output


# -- the kNN-LM's result ------------------------------------------------------------------------

def test_calibrated_temperature_is_the_median_nearest_distance():
    """Keys 0, 1, 3, 7 (and a duplicate of 7, which is not its own neighbour): nearest other
    keys at squared distances 1, 1, 4, 16, 16; the median is 4."""
    keys = np.array([[0.0], [1.0], [3.0], [7.0], [7.0]])
    assert knnlm.calibrate_temperature(keys, sample=5) == pytest.approx(4.0)
    assert knnlm.calibrate_temperature(keys * 2, sample=5) == pytest.approx(16.0)


def _perplexity_by_hand(model, retriever, store, held, eval_tokens, interval, lam, T):
    """The kNN-LM perplexity written out position by position, neighbour by neighbour (no
    hwgen helper but the model's forward pass and the retriever's search)."""
    k = retriever.config.k
    nll, scored = 0.0, 0
    for text in held:
        ids = model.tokenizer.encode(text)[:eval_tokens - scored + 1]
        logits, hidden = model.forward(ids)
        n = len(ids) - 1
        dist, nbr, _ = retriever.search(hidden[:n])
        for t in range(n):
            row = logits[t].astype(np.float64)
            e = np.exp(row - row.max())
            p_lm = e[ids[t + 1]] / e.sum()
            a = t - t % interval                       # the retrieval in force at t
            weights, hits = [], []
            for j in range(k):
                i = int(nbr[a, j])
                if i < 0:
                    continue
                moved = i + (t - a)                    # the neighbour followed t - a tokens
                if moved >= len(store.passage) or store.passage[moved] != store.passage[i]:
                    continue
                weights.append(np.exp(-dist[a, j] / T))
                hits.append(store.values[moved] == ids[t + 1])
            if weights:
                top = max(-dist[a, j] / T for j in range(k) if nbr[a, j] >= 0)
                w = [x / np.exp(top) for x in weights]
                p_knn = sum(x for x, hit in zip(w, hits) if hit) / sum(w)
                p = lam * p_knn + (1 - lam) * p_lm
            else:
                p = p_lm
            nll -= np.log(max(p, 1e-300))
        scored += n
        if scored >= eval_tokens:
            break
    return float(np.exp(nll / scored))


def test_perplexity_equals_the_hand_computed_value(tiny, indexes):
    """Held-out text that is in the datastore: retrieval must lower the perplexity, every
    (interval, lambda) equals the hand computation, lambda 0 is the LM alone, and interval
    and temperature each change the result."""
    model, store = tiny
    held = TEXTS[1:3]
    with knnlm.Retriever(indexes[1]) as r:
        T = r.temperature
        out = chamlm.perplexity(model, r, store, held, eval_tokens=90, intervals=(1, 4),
                                lams=(0.0, 0.25, 0.6), temperature=T)
        hot = chamlm.perplexity(model, r, store, held, eval_tokens=90, intervals=(1,),
                                lams=(0.25,), temperature=T * 50)
        runs = {(x["interval"], x["lambda"]): x for x in out["runs"]}
        assert out["tokens"] == 90 and set(runs) == {(i, lam) for i in (1, 4)
                                                      for lam in (0.0, 0.25, 0.6)}
        lm_alone = _perplexity_by_hand(model, r, store, held, 90, 1, 0.0, T)
        assert out["lm"] == pytest.approx(lm_alone, rel=1e-9)
        for (interval, lam), run in runs.items():
            want = _perplexity_by_hand(model, r, store, held, 90, interval, lam, T)
            assert run["ppl"] == pytest.approx(want, rel=1e-9), (interval, lam)
        ns = []
        for text in held:                              # scored positions per passage
            ns.append(min(len(model.tokenizer.encode(text)) - 1, 90 - sum(ns)))
        assert runs[1, 0.25]["retrievals"] == 90
        assert runs[4, 0.25]["retrievals"] == sum(-(-n // 4) for n in ns)
        hot_want = _perplexity_by_hand(model, r, store, held, 90, 1, 0.25, T * 50)
    assert hot["runs"][0]["ppl"] == pytest.approx(hot_want, rel=1e-9)
    # lambda 0 is the LM; the neighbours of a text in the datastore lower the perplexity
    assert runs[1, 0.0]["ppl"] == pytest.approx(out["lm"], rel=1e-12)
    assert runs[1, 0.6]["ppl"] < runs[1, 0.25]["ppl"] < out["lm"] / 2
    # following the neighbours between retrievals keeps most of the gain; the temperature
    # matters
    assert runs[1, 0.25]["ppl"] != runs[4, 0.25]["ppl"] < out["lm"] / 2
    assert hot["runs"][0]["ppl"] != pytest.approx(runs[1, 0.25]["ppl"], rel=1e-3)


def _greedy_lm(model, prompt, tokens):
    ids = model.tokenizer.encode(prompt)
    out = []
    for _ in range(tokens):
        logits, _ = model.forward(ids + out)
        out.append(int(np.argmax(logits[-1])))
    return out


def test_generation_follows_the_datastore_only_with_its_weight(tiny, indexes):
    """A prompt from a datastore text: with the kNN weight at 0.9 the continuation starts as
    the stored text's (until the approximate search, on a random-weight LM's states, strays);
    at 0 it is the LM's own greedy continuation (computed here without the KV cache), which
    does not."""
    model, store = tiny
    text = TEXTS[3]
    prompt, rest = text[:24], text[24:]
    with knnlm.Retriever(indexes[1]) as r:
        knn = chamlm.generate(model, r, store, prompt, tokens=12, interval=1, lam=0.9)
        plain = chamlm.generate(model, r, store, prompt, tokens=12, interval=1, lam=0.0)
        followed = chamlm.generate(model, r, store, prompt, tokens=12, interval=4, lam=0.9)
    print(f"\nstored {rest[:12]!r}, kNN {knn['text']!r}, followed {followed['text']!r}, "
          f"LM {plain['text']!r}")
    assert knn["text"][:4] == rest[:4]
    assert followed["text"][:4] == rest[:4]        # neighbours followed for 3 of 4 tokens
    assert plain["tokens"] == _greedy_lm(model, prompt, 12)
    assert plain["text"][0] != rest[0]
    assert len(followed["retrievals"]) == 3 and len(knn["retrievals"]) == 12


def test_cpu_index_finds_what_the_nodes_find(tiny, indexes):
    """CPU faiss over the shards' lists searches the nodes' index: every entry, and the same
    neighbours as the two node processes, ties aside (24-d 8-bit keys: every squared
    distance is below 2**24, so faiss's float32 holds it exactly)."""
    model, store = tiny
    rng = np.random.default_rng(2)
    states = store.keys[rng.choice(len(store.keys), size=12, replace=False)]
    with knnlm.Retriever(indexes[2]) as r:
        index = r.cpu_index
        assert index.ntotal == len(store.values) and index.nprobe == r.nprobe
        ints, _ = r.encode(states)
        dist, ids, _ = r.search(states)
        fd, fi = index.search(ints.astype(np.float32), r.config.k)
    same = [same_results((np.rint(f).astype(np.int64), i), (np.rint(d * r.inv_scale ** 2)
                                                             .astype(np.int64), j))
            for f, i, d, j in zip(fd, fi, dist, ids)]
    assert all(same), same


def test_time_split_retrieves_every_interval(tiny, indexes):
    model, store = tiny
    prompt = model.tokenizer.encode("The coordinator")
    with knnlm.Retriever(indexes[2]) as r:
        t = costs.time_split(model, r, prompt, tokens=6, interval=3, clock_mhz=300.0)
    assert [row["retrieval"] for row in t["per_token"]] == [True, False, False] * 2
    for row in t["per_token"]:
        assert row["lm_s"] > 0
        if row["retrieval"]:
            assert row["hw_cycles"] > 0 and row["hw_s"] == row["hw_cycles"] / 300e6
            assert not row["partial"]
            # the nodes report their own search time, part of the round trip
            assert 0 < row["node_reported_s"] < row["round_trip_s"]
            assert row["transport_s"] == row["round_trip_s"] - row["node_reported_s"]
            # ... and their handling around it, which splits the transport in two
            assert 0 <= row["node_handling_s"] < row["transport_s"]
            assert row["network_s"] > 0
            assert abs(row["node_handling_s"] + row["network_s"] - row["transport_s"]) < 1e-9
            assert row["cpu_faiss_s"] > 0
    assert t["mean"]["hw_cycles"] > 0
    e = costs.split_entry(t)
    assert e["interval"] == 3 and e["transport_overhead_ms"] == t["median"]["transport_s"] * 1e3
    assert e["node_handling_ms"] == t["median"]["node_handling_s"] * 1e3
    assert e["network_and_wakeups_ms"] == t["median"]["network_s"] * 1e3
    assert e["cpu_faiss_ms"] == t["mean"]["cpu_faiss_s"] * 1e3 and e["node_projected_us"] > 0
    assert e["end_to_end_speedup"] == e["token_ms_cpu"] / e["token_ms_node"]
    m = t["measured"]              # the node's measured clock, or None before make timing
    assert set(m) == {"clock_mhz", "ratio", "block", "hw_s"}
    if m["clock_mhz"] is None:
        assert m["hw_s"] is None
    else:
        assert m["clock_mhz"] == round(300.0 * min(m["ratio"], 1.0), 1)
        assert m["hw_s"] == t["mean"]["hw_cycles"] / (m["clock_mhz"] * 1e6)


def test_prepare_builds_and_caches_the_datastore_and_index(tiny, tmp_path, monkeypatch):
    """``hwgen ralm``'s set-up path (``chamlm.prepare``, which every ``ralm bench`` and
    ``ralm generate`` runs first): the Lee corpus split, the datastore encoded and cached
    under the build cache, the shards written; a second call reads the cache."""
    pytest.importorskip("gensim", reason="the Lee corpus comes with gensim")
    model, _ = tiny
    monkeypatch.setenv("HWGEN_CACHE", str(tmp_path))
    s = chamlm.Settings(corpus="lee", max_tokens=300, nodes=2, nlist=8, m=8, nprobe=4, k=4)
    lines = []
    store, index_dir, held = chamlm.prepare(model, s, log=lines.append)
    assert len(store.values) == 300 and held
    held_docs = {keys.document_of(p.source) for p in held}
    assert held_docs and not held_docs & {keys.document_of(t) for t in store.sources}
    assert index_dir.is_relative_to(tmp_path / "ralm")
    assert sorted(p.name for p in index_dir.glob("node*.npz")) == ["node0.npz", "node1.npz"]
    again, same_dir, _ = chamlm.prepare(model, s, log=lines.append)
    assert same_dir == index_dir and np.array_equal(again.keys, store.keys)
    assert any("cached" in line for line in lines)


def test_document_split_keeps_held_out_documents_out_of_the_datastore():
    """``heldout="documents"``: no held-out passage shares a document with a datastore one;
    ``"passages"`` (the in-document split) holds out passages of the datastore's documents."""
    from hwgen.espn.host.corpus import Passage
    from hwgen.ralm.keys import document_of
    passages = [Passage(f"text {d} {i}", f"wiki/Doc{d}/{i}") for d in range(25)
                for i in range(4)]
    store, held = chamlm.split(passages, 10, "documents")
    assert {document_of(p.source) for p in held} == {"wiki/Doc9", "wiki/Doc19"}
    assert not {document_of(p.source) for p in held} & {document_of(p.source) for p in store}
    store, held = chamlm.split(passages, 10, "passages")
    assert len(held) == 10 and {document_of(p.source) for p in held} & \
        {document_of(p.source) for p in store}
    with pytest.raises(ConfigError, match="heldout"):
        chamlm.Settings(heldout="sentences").check()


def test_a_mix_is_held_out_round_robin_over_its_corpora():
    """With several corpora the held-out passages alternate between them (the first tokens
    scored come from each); one corpus keeps its order."""
    from hwgen.espn.host.corpus import Passage
    passages = [Passage(f"{c} {d} {i}", f"{c}/Doc{d}/{i}") for c in ("papers", "wiki")
                for d in range(20) for i in range(3)]
    _, held = chamlm.split(passages, 10, "documents")
    assert [p.source for p in held[:4]] == ["papers/Doc9/0", "wiki/Doc9/0", "papers/Doc9/1",
                                            "wiki/Doc9/1"]
    assert sorted(p.source for p in held) == sorted(
        p.source for p in passages if p.source.split("/")[1] in ("Doc9", "Doc19"))
    wiki = [p for p in passages if p.source.startswith("wiki")]
    assert chamlm.split(wiki, 10, "documents")[1] == [p for p in wiki if "Doc9/" in p.source
                                                      or "Doc19/" in p.source]


def test_defaults_scale_with_the_datastore():
    """The corpus and the IVF lists follow --store-tokens; the size curve's sizes are the
    powers of ten from 10^4 below it."""
    assert chamlm.default_corpus(12_000) == "wiki"
    assert chamlm.default_corpus(chamlm.WIKI_TOKENS + 1) == keys.DEFAULT_CORPUS
    assert [chamlm.default_nlist(n) for n in (300, 12_000, 100_000, 1_000_000, 4_000_000)] == \
        [32, 32, 128, 256, 512]
    assert chamlm.store_sizes(1_000_000) == [10_000, 100_000]
    assert chamlm.store_sizes(1_000_001) == [10_000, 100_000, 1_000_000]
    assert chamlm.store_sizes(10_000) == []


def test_subset_keeps_entries_and_their_tokens(tiny):
    _, store = tiny
    sub = chamlm.subset(store, 40)
    assert len(sub.values) == 40 and sub.keys.shape == (40, TINY.dim)
    rows = [int(np.flatnonzero((store.keys == k).all(1))[0]) for k in sub.keys]
    assert rows == sorted(rows) and len(set(rows)) == 40
    assert sub.values.tolist() == store.values[rows].tolist()
    assert sub.passage.tolist() == store.passage[rows].tolist()
    assert np.array_equal(chamlm.subset(store, 40).keys, sub.keys)        # seeded
    with pytest.raises(ConfigError, match="sizes"):
        chamlm.subset(store, len(store.values) + 1)


def test_size_curve_scores_each_subset_with_its_own_nodes(tiny, tmp_path):
    """Each size gets its own index and node processes; at the full size the curve equals
    the perplexity of the whole datastore at interval 1."""
    model, store = tiny
    s = chamlm.Settings(corpus="tiny", max_tokens=len(store.values), nodes=2, nlist=8, m=8,
                        nprobe=4, k=4, eval_tokens=60)
    held = [TEXTS[1], TEXTS[4]]
    curve = chamlm.size_curve(model, store, tmp_path, held, s, [300, len(store.values)],
                              nlist=8, ks=(4,), lams=(0.25,))
    assert [c["store_tokens"] for c in curve] == [300, len(store.values)]
    assert all(c["tokens"] == 60 and c["best"] == c["runs"][0] for c in curve)
    assert len(list(tmp_path.glob("subset-300-seed0/index-*/node*.npz"))) == 2
    full = curve[1]
    sub = chamlm.subset(store, len(store.values))
    with knnlm.Retriever(next(tmp_path.glob(f"subset-{len(store.values)}-seed0/index-*"))) as r:
        ppl = chamlm.perplexity(model, r, sub, held, 60, (1,), (4,), (0.25,))
    assert full["lm"] == ppl["lm"] and full["runs"][0]["ppl"] == ppl["runs"][0]["ppl"]


def test_transport_goal_follows_k():
    from hwgen.cli.ralm import transport_goal_ms
    assert [transport_goal_ms(k) for k in (4, 16, 17, 100)] == [1.0, 1.0, 3.0, 3.0]


def test_transport_probe_times_one_query_per_search(tiny, indexes):
    model, store = tiny
    with knnlm.Retriever(indexes[2]) as r:
        p = costs.transport_probe(r, store.keys[:5], repeats=7)
    assert p["k"] == 4 and p["searches"] == 7
    assert 0 < p["node_ms"] < p["round_trip_ms"]
    assert 0 < p["transport_overhead_ms"] <= p["transport_overhead_p90_ms"]
    assert p["node_handling_ms"] > 0 and p["network_and_wakeups_ms"] > 0
    one = p["one_node"]                                # node 0 alone, its own coordinator
    assert one["k"] == 4 and one["searches"] == 7 and 0 < one["node_ms"] < one["round_trip_ms"]


def test_batched_throughput_generates_every_sequence(tiny, indexes):
    """``throughput``: B sequences, one LM step and (at each interval) one coordinator search
    of B queries per token; the time of each phase and the tokens/s three ways."""
    model, store = tiny
    prompts = [model.tokenizer.encode(t)[:12] for t in TEXTS[:3]]
    with knnlm.Retriever(indexes[2]) as r:
        t = costs.throughput(model, r, store, prompts, tokens=5, interval=2, clock_mhz=300.0)
    assert t["batch"] == 3 and t["searches"] == 3 and t["clock"] == "given"
    assert t["tokens_per_s"] == pytest.approx(15 / t["wall_s"])
    parts = sum(t[k] for k in ("lm_s", "encode_s", "round_trip_s", "mix_s", "cpu_faiss_s"))
    assert 0 < parts <= t["wall_s"]
    assert 0 < t["node_reported_s"] < t["round_trip_s"] and t["hw_s"] > 0
    rest = t["lm_s"] + t["encode_s"] + t["mix_s"]
    assert t["tokens_per_s_cpu_faiss"] == pytest.approx(15 / (rest + t["cpu_faiss_s"]))


@requires_verilator
def test_rtl_sample_runs_each_nodes_verilog_bit_exact(tmp_path):
    """The nodes' Verilog on the native engine for queries of the time split: a datastore of
    the digits (64-d keys) indexed with the default node configuration (the build the
    simulation tests share), two shards: no mismatch, cycles within 5% of the model."""
    from hwgen.datasets import digits
    x, _ = digits()
    x = x.astype(np.float32)
    store = knnlm.Datastore(x, np.arange(len(x)) % 7, np.zeros(len(x), np.int32), ["d"], ["d"])
    knnlm.make_index(store, tmp_path, nodes=2, nlist=16, m=16, nprobe=4, k=10)
    with knnlm.Retriever(tmp_path) as r:
        assert r.config == ChamVSNodeConfig()
        s = costs.rtl_sample(r, x[5:8] + 0.5, count=2)
    assert s["queries"] == 2 and s["nodes"] == 2
    assert s["mismatches"] == 0 and not s["timeout"]
    assert len(s["cycles"]) == 2 and s["model_error_mean"] <= 0.05
