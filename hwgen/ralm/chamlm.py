"""ChamLM end to end: SmolLM2 + a kNN-LM datastore served by ChamVS node processes.

:func:`prepare` makes (or reuses, cached by corpus, split and size under
``build/cache/ralm/``) the datastore and the node shards; :func:`perplexity` scores held-out
passages without and with retrieval; :func:`time_split` times one generation token by token;
:func:`generate` continues a prompt. ``hwgen ralm bench`` and ``hwgen ralm generate`` call them.

**Split.** The corpus's passages (:func:`hwgen.espn.host.corpus.load`) are split into the
datastore's and the held-out ones for perplexity. ``heldout="documents"`` (the default) holds out
every ``heldout_every``-th document whole (:func:`hwgen.ralm.keys.split_documents`: a document is
a passage's source up to its last ``/``: a Wikipedia article, a Lee news story, a pydoc object,
a section of a paper), so no held-out text shares a document with the datastore;
``heldout="passages"`` holds out every ``heldout_every``-th passage, so the held-out text's
neighbours include other passages of its own document (the in-document split).
"""

import itertools
import math
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy.special import softmax

from ..errors import ConfigError
from ..flow.timing_table import measured_clock
from . import keys, knnlm

__all__ = ["Settings", "prepare", "perplexity", "time_split", "split_entry", "generate",
           "default_corpus", "default_nlist", "size_curve", "subset", "transport_probe",
           "store_sizes", "throughput", "rtl_sample", "curve_entry", "PAPER",
           "WIKI_TOKENS"]

#: Chameleon's observations on retrieval frequency (section 6.3, Table 2, Figures 10 and 11).
PAPER = {
    "Dec-S": "dim 512, 24 layers, 101M parameters, retrieves every token (interval 1), K 100",
    "EncDec-S": "dim 512, 2+24 layers, 158M parameters, retrieves every 8/64/512 tokens, K 10",
    "latency": "at steps with retrieval, FPGA-GPU Chameleon is 1.94-4.11x faster than CPU-GPU "
               "(Dec-S); steps without retrieval are the LM's alone",
    "throughput": "the lower the retrieval interval, the larger Chameleon's advantage: 3.18x "
                  "(Dec-S) and 2.34x (Dec-L) at interval 1",
}


#: How the held-out text is chosen (:func:`split`).
HELDOUT = ("documents", "passages")

#: Datastore sizes up to which the default corpus is the Wikipedia extract (about 3.0 million
#: characters, some 680,000 tokens outside its held-out documents); larger ones take the
#: ``hwgen dataset ralm-keys`` mix (:data:`hwgen.ralm.keys.DEFAULT_CORPUS`).
WIKI_TOKENS = 500_000


def default_corpus(store_tokens):
    """``wiki`` for datastores of at most :data:`WIKI_TOKENS` entries, else the ralm-keys mix
    (the papers, Lee, the Wikipedia extract, pydoc, then the standard library's source)."""
    return "wiki" if store_tokens <= WIKI_TOKENS else keys.DEFAULT_CORPUS


def default_nlist(entries):
    """IVF lists for a datastore of ``entries`` keys: the largest power of two at most
    ``sqrt(entries) / 2``, and at least 32 (32 at 12,000 entries, 128 at 10^5, 256 at 10^6;
    with nprobe 8 a query scans about 3% of a 10^6 datastore)."""
    return max(32, 1 << int(math.floor(math.log2(max(math.sqrt(entries) / 2, 1)))))


def store_sizes(entries, smallest=10_000):
    """The datastore-size curve's sizes below ``entries``: 10^4, 10^5, ... (kNN-LM's
    Figure 2 varies the datastore by powers of ten)."""
    sizes, n = [], smallest
    while n < entries:
        sizes.append(n)
        n *= 10
    return sizes


@dataclass(frozen=True)
class Settings:
    """One ChamLM setup (``hwgen ralm`` options)."""
    corpus: str = "wiki"
    max_tokens: int = 12000          # datastore entries (tokens of the datastore passages)
    heldout_every: int = 10
    heldout: str = "documents"       # or "passages" (the in-document split)
    eval_tokens: int = 1200          # held-out tokens scored
    nodes: int = 2
    nlist: int = 32
    m: int = 32
    nprobe: int = 8
    k: int = 16
    elem_bits: int = 8
    backend: str = "golden"

    def check(self):
        """Validate the settings; returns ``self``, or raises :class:`~hwgen.errors.ConfigError`
        naming the first bad one."""
        for name in ("max_tokens", "heldout_every", "eval_tokens", "nodes", "nlist", "nprobe",
                     "k"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(name, "must be an integer >= 1", value=v)
        if self.heldout_every < 2:
            raise ConfigError("heldout_every", "must be >= 2 (one passage in N is held out)",
                              value=self.heldout_every)
        if self.heldout not in HELDOUT:
            raise ConfigError("heldout", "must be " + " or ".join(HELDOUT), value=self.heldout)
        if self.backend not in ("golden", "rtl"):
            raise ConfigError("backend", "must be golden or rtl", value=self.backend)
        return self


def _cache_root():
    from ..flow.tools import cache_dir
    return Path(cache_dir()) / "ralm"


def split(passages, every, heldout="passages"):
    """``(datastore passages, held-out passages)``: every ``every``-th passage held out, or
    with ``heldout="documents"`` every ``every``-th document whole."""
    if heldout == "documents":
        store, held = keys.split_documents(passages, every)
    else:
        store = [p for i, p in enumerate(passages) if i % every != every - 1]
        held = [p for i, p in enumerate(passages) if i % every == every - 1]
    return store, _interleave(held)


def _interleave(passages):
    """``passages`` of a mix taken round-robin over its corpora (one passage of each in turn,
    in their order), so that the first held-out tokens scored come from every corpus; a single
    corpus's passages are returned as they are."""
    by_corpus = {}
    for p in passages:
        by_corpus.setdefault(keys.corpus_of(p.source), []).append(p)
    if len(by_corpus) < 2:
        return passages
    turns = itertools.zip_longest(*by_corpus.values())
    return [p for turn in turns for p in turn if p is not None]


def prepare(model, settings, log=None):
    """``(datastore, index_dir, heldout passages)`` for ``settings``, built once and cached."""
    from ..espn.host.corpus import load as load_corpus
    s = settings.check()
    say = log or (lambda line: None)
    passages = load_corpus(s.corpus)
    store_p, held = split(passages, s.heldout_every, s.heldout)
    if not held:
        raise ConfigError("corpus", f"has too few {s.heldout} ({len(passages)} passages) to "
                          f"hold one in {s.heldout_every} out")
    # the passage split keeps the key it had before the document split existed (its caches)
    split_key = (s.heldout_every,) if s.heldout == "passages" else (s.heldout_every, s.heldout)
    key = knnlm.cache_key("datastore-v1", s.corpus, len(passages), *split_key,
                          s.max_tokens, model.config.__dict__)
    root = _cache_root() / key
    root.mkdir(parents=True, exist_ok=True)
    ds_path = root / "datastore.npz"
    if ds_path.exists():
        store = knnlm.Datastore.load(ds_path)
        say(f"datastore: {len(store.values)} entries from {len(store.texts)} passages "
            f"(cached {ds_path})")
    else:
        say(f"datastore: encoding up to {s.max_tokens} tokens of {len(store_p)} {s.corpus} "
            "passages ...")
        start = time.monotonic()
        store = knnlm.build_datastore(model, store_p, s.max_tokens, log=say)
        store.save(ds_path)
        say(f"datastore: {len(store.values)} entries in {time.monotonic() - start:.0f} s")
    if len(store.values) < s.max_tokens:
        say(f"datastore: the {s.corpus} corpus holds only {len(store.values):,} tokens outside "
            f"its held-out {s.heldout}, not the {s.max_tokens:,} asked for")
    return store, _index(store, root, s, s.nlist, say), held


def _index(store, root, s, nlist, say):
    """The node shards of ``store`` under ``root`` for the settings ``s`` (cached)."""
    ikey = knnlm.cache_key("index-v1", s.nodes, nlist, s.m, s.nprobe, s.k, s.elem_bits)
    index_dir = root / f"index-{ikey}"
    if not (index_dir / "index.json").exists():
        index_dir.mkdir(parents=True, exist_ok=True)
        knnlm.make_index(store, index_dir, nodes=s.nodes, nlist=nlist, m=s.m,
                         nprobe=s.nprobe, k=s.k, elem_bits=s.elem_bits, log=say)
    return index_dir


def subset(store, entries, seed=0):
    """A datastore of ``entries`` entries of ``store`` drawn at random (seeded, kept in their
    order): the smaller datastores of the size curve. Its ids are positions in the subset and
    ``passage`` keeps each entry's passage, but the entry after one is no longer the next
    token, so a subset is only scored at interval 1, where no neighbour is followed."""
    if not 1 <= entries <= len(store.values):
        raise ConfigError("sizes", f"each must be in 1..{len(store.values)} (the datastore)",
                          value=entries)
    pick = np.sort(np.random.default_rng(seed).choice(len(store.values), entries,
                                                      replace=False))
    return knnlm.Datastore(store.keys[pick], store.values[pick], store.passage[pick],
                           store.texts, store.sources)


def size_curve(model, store, root, held, settings, sizes, *, nlist=None, ks=None, lams=(0.25,),
               timeout=10.0, log=None):
    """Perplexity at interval 1 on the same held-out text with random subsets of ``store``
    (:func:`subset`) of each of ``sizes`` entries, each with its own index (``nlist``, default
    :func:`default_nlist` of its size; cached under ``root``) served by its own node
    processes: the datastore-size curve. Returns one entry per size:
    ``{"store_tokens", "nlist", "temperature", "lm", "runs": [{"k", "lambda", "ppl"}],
    "best"}``."""
    s = settings.check()
    say = log or (lambda line: None)
    out = []
    for n in sizes:
        sub = subset(store, n)
        lists = nlist or default_nlist(n)
        index_dir = _index(sub, Path(root) / f"subset-{n}-seed0", s, lists, say)
        say(f"size curve: {n:,} entries (nlist {lists}) ...")
        with knnlm.Retriever(index_dir, backend=s.backend, timeout=timeout) as r:
            ppl = perplexity(model, r, sub, held, s.eval_tokens, (1,), ks, lams)
        out.append(curve_entry(n, lists, ppl))
    return out


def curve_entry(entries, nlist, ppl):
    """One size of the curve from a :func:`perplexity` result: its interval-1 runs (K, λ,
    perplexity) and, if there are any, the ``best``."""
    runs = [{"k": r["k"], "lambda": r["lambda"], "ppl": r["ppl"]} for r in ppl["runs"]
            if r["interval"] == 1]
    entry = {"store_tokens": int(entries), "nlist": nlist, "temperature": ppl["temperature"],
             "tokens": ppl["tokens"], "lm": ppl["lm"], "runs": runs}
    if runs:
        entry["best"] = min(runs, key=lambda r: r["ppl"])
    return entry


def _model_cycles(service, probes):
    """The generated node's cycles per query (:func:`~hwgen.vecsearch.model.layout_query_cycles`,
    the cycle model checked against the node's simulation) for each row of ``probes`` on the
    node ``service``'s own shard, at its K."""
    from ..vecsearch.model import layout_query_cycles
    return [layout_query_cycles(service.config, service._packed.layout, p,
                                service.config.k)["total"] for p in probes]


def rtl_sample(retriever, states, count=4, log=None):
    """The nodes' generated Verilog on the native engine (Verilator) for the first ``count``
    of ``states``, on every node's own shard: mismatches against the golden model and each
    query's simulated cycles (the node's counters) beside the cycle model's. Returns
    ``{"queries", "mismatches", "timeout", "cycles": [per query, the slowest node],
    "model_cycles": [...], "model_error_mean"}``, or ``{"queries": 0, "reason"}`` when
    Verilator is missing."""
    import dataclasses

    from ..errors import ToolError
    from ..vecsearch.baseline import simulate_sample
    ints, probes = retriever.encode(states[:count])
    per_node, mismatches, timeout = [], 0, False
    for sv in retriever.local_services:
        data = dataclasses.replace(sv._packed, queries=ints, probes=probes)
        try:
            res, cycles = simulate_sample(sv.config, data, len(ints), 1, log)
        except ToolError as e:
            return {"queries": 0, "reason": str(e)}
        mismatches += res["mismatches"]
        timeout = timeout or bool(res["timeout"])
        per_node.append((cycles, _model_cycles(sv, probes)))
    cycles = [max(c[q] for c, _ in per_node) for q in range(len(per_node[0][0]))]
    model = [max(m[q] for _, m in per_node) for q in range(len(ints))]
    error = (float(abs(np.mean(model) - np.mean(cycles)) / np.mean(cycles)) if cycles
             else None)
    return {"queries": len(ints), "nodes": len(per_node), "mismatches": mismatches,
            "timeout": timeout, "cycles": cycles, "model_cycles": model,
            "model_error_mean": error}


def transport_probe(retriever, states, repeats=64):
    """The transport alone: ``repeats`` searches of one query each (the rows of ``states`` in
    turn) with nothing else running in this process, timed like :func:`time_split`'s round
    trip, through the retriever's coordinator (every node) and through a coordinator to node 0
    alone (``one_node``: one node process besides this one, so on a 2-core machine no process
    waits for a core). Returns medians in ms: ``round_trip_ms``, ``node_ms`` (the slowest
    node's own search, reported in its reply) and ``transport_overhead_ms`` (per search, round
    trip minus it), its 90th percentile, the ``k`` and the number of searches; and the
    transport split in two by the nodes' ``handled_us``: ``node_handling_ms`` (the node's
    reading, decoding and validation around its search) and ``network_and_wakeups_ms`` (the
    rest: the coordinator's encoding and merging, the sockets, and both ends' wake-ups)."""
    from ..vecsearch.host.coordinator import Coordinator
    out = _probe(retriever.coordinator, retriever, states, repeats)
    one = Coordinator(retriever.addresses[:1], timeout=retriever.coordinator.timeout)
    try:
        out["one_node"] = _probe(one, retriever, states, repeats)
    finally:
        one.close()
    return out


def _probe(coordinator, retriever, states, repeats):
    ints, probes = retriever.encode(states)
    k = retriever.config.k
    rt, node, over, handling, network = [], [], [], [], []
    for i in range(repeats):
        q = i % len(ints)
        t0 = time.perf_counter()
        res = coordinator.search(ints[q:q + 1], probes[q:q + 1], k)
        t1 = time.perf_counter()
        if res.node_seconds is None or res.partial:
            continue
        rt.append(t1 - t0)
        node.append(res.node_seconds)
        over.append(t1 - t0 - res.node_seconds)
        if res.node_handled_seconds is not None:
            handling.append(res.node_handled_seconds - res.node_seconds)
            network.append(t1 - t0 - res.node_handled_seconds)
    if not rt:
        return {"k": k, "searches": 0}
    out = {"k": k, "searches": len(rt), "round_trip_ms": float(np.median(rt)) * 1e3,
           "node_ms": float(np.median(node)) * 1e3,
           "transport_overhead_ms": float(np.median(over)) * 1e3,
           "transport_overhead_p90_ms": float(np.percentile(over, 90)) * 1e3}
    if handling:
        out.update(node_handling_ms=float(np.median(handling)) * 1e3,
                   network_and_wakeups_ms=float(np.median(network)) * 1e3)
    return out


def perplexity(model, retriever, store, held, eval_tokens, intervals=(1, 8, 64),
               ks=None, lams=(0.25,), temperature=None, log=None):
    """Perplexity of the first ``eval_tokens`` next-token predictions of the held-out passages,
    without retrieval and, for each (interval, K, λ), with it. One retrieval per position is
    made (the state at a position does not depend on the interval); an interval uses the
    retrievals at positions ``0, interval, 2·interval, ...`` of each passage and follows
    their neighbours in between (:func:`~hwgen.ralm.knnlm.follow`). Returns
    ``{"tokens", "lm", "runs": [{"interval", "k", "lambda",
    "ppl", "retrievals"}], "partial_retrievals"}``."""
    T = temperature or retriever.temperature
    ks = ks or (retriever.config.k,)
    V = model.config.vocab
    nll_lm, runs, scored, partial = 0.0, {}, 0, 0
    start = time.monotonic()
    for text in (p.text if hasattr(p, "text") else p for p in held):
        ids = model.tokenizer.encode(text)[:model.config.context]
        ids = ids[:eval_tokens - scored + 1]
        if len(ids) < 2:
            continue
        logits, hidden = model.forward(ids)
        n = len(ids) - 1
        p_lm = softmax(logits[:n].astype(np.float64), axis=-1)
        target = np.asarray(ids[1:])
        nll_lm -= np.log(p_lm[np.arange(n), target]).sum()
        dist, nbr, res = retriever.search(hidden[:n])
        partial += bool(res.partial)
        for interval in intervals:
            at = (np.arange(n) // interval) * interval         # the retrieval in force
            moved = np.stack([knnlm.follow(nbr[a], t - a, store.passage)
                              for t, a in enumerate(at)])
            for k in ks:
                p_knn = knnlm.knn_distribution(dist[at, :k], moved[:, :k], store.values, V, T)
                for lam in lams:
                    p = knnlm.interpolate(p_lm, p_knn, lam)[np.arange(n), target]
                    r = runs.setdefault((interval, k, lam), [0.0, 0])
                    r[0] -= np.log(np.maximum(p, 1e-300)).sum()
                    r[1] += -(-n // interval)                  # retrievals made
        scored += n
        if log:
            log(f"perplexity: {scored}/{eval_tokens} held-out tokens scored "
                f"({time.monotonic() - start:.0f} s)")
        if scored >= eval_tokens:
            break
    if not scored:
        raise ConfigError("eval_tokens", "no held-out passage has two or more tokens")
    return {"tokens": scored, "temperature": T, "lm": math.exp(nll_lm / scored),
            "runs": [{"interval": i, "k": k, "lambda": lam, "ppl": math.exp(v[0] / scored),
                      "retrievals": v[1]} for (i, k, lam), v in sorted(runs.items())],
            "partial_retrievals": partial}


def time_split(model, retriever, prompt, tokens=32, interval=1, clock_mhz=None):
    """Generate ``tokens`` greedily after ``prompt`` (ids), retrieving every ``interval``
    tokens, and time each token: ``lm_s`` (one decoding step with the KV cache),
    ``encode_s`` (quantise the state and probe the coarse centroids), ``round_trip_s`` (the
    coordinator's search over TCP, the nodes' work included), ``node_reported_s`` (the
    slowest node's own search time, reported in its reply) and ``transport_s`` (the round
    trip minus it: what the transport costs), ``node_search_s`` (node 0's golden search of
    the same query, run in this process), ``cpu_faiss_s`` (CPU faiss ``IndexIVFPQ`` over the
    same index with the same nprobe and k, :attr:`Retriever.cpu_index`; every core) and
    ``hw_cycles`` / ``hw_s``: the
    generated node's cycles for the query (:func:`~hwgen.vecsearch.model.layout_query_cycles`,
    the cycle model checked against the node's simulation; the slowest node, as they search
    in parallel) at ``clock_mhz`` (default the board's kernel clock). ``measured``: the kernel
    clock scaled by the node's measured ``fmax_ratio``
    (:func:`hwgen.flow.timing_table.measured_clock`) and the mean hardware time at it
    (``hw_s``: None when the node has not been measured). Returns per-token lists and means."""
    from ..boards import load_board
    services = retriever.local_services
    service = services[0]
    cpu = retriever.cpu_index
    clock = clock_mhz or load_board(service.config.board).kernel_clock_mhz
    cache = model.new_cache()
    logits, hidden = model.forward(prompt, cache)
    rows = []
    for t in range(tokens):
        row = {"token": t, "retrieval": t % interval == 0}
        if row["retrieval"]:
            t0 = time.perf_counter()
            ints, probes = retriever.encode(hidden[-1:])
            t1 = time.perf_counter()
            res = retriever.coordinator.search(ints, probes, retriever.config.k)
            t2 = time.perf_counter()
            service.run_search(ints, probes)
            t3 = time.perf_counter()
            cpu.search(ints.astype(np.float32), retriever.config.k)
            t4 = time.perf_counter()
            cycles = max(_model_cycles(sv, probes[:1])[0] for sv in services)
            row.update(encode_s=t1 - t0, round_trip_s=t2 - t1, node_search_s=t3 - t2,
                       cpu_faiss_s=t4 - t3, hw_cycles=cycles, hw_s=cycles / (clock * 1e6),
                       partial=bool(res.partial))
            if res.node_seconds is not None:
                row.update(node_reported_s=res.node_seconds,
                           transport_s=row["round_trip_s"] - res.node_seconds)
        nxt = int(np.argmax(logits[-1]))
        t5 = time.perf_counter()
        logits, hidden = model.forward([nxt], cache)
        row["lm_s"] = time.perf_counter() - t5
        rows.append(row)
    mean = {k: float(np.mean([r[k] for r in rows if k in r]))
            for k in ("lm_s", "encode_s", "round_trip_s", "node_reported_s", "transport_s",
                      "node_search_s", "cpu_faiss_s", "hw_cycles", "hw_s")
            if any(k in r for r in rows)}
    median = {k: float(np.median([r[k] for r in rows if k in r]))
              for k in ("round_trip_s", "node_reported_s", "transport_s")
              if any(k in r for r in rows)}
    kernel = load_board(service.config.board).kernel_clock_mhz
    measured = measured_clock({"chamvs-node"}, kernel)
    measured["hw_s"] = mean["hw_cycles"] / (measured["clock_mhz"] * 1e6) \
        if measured["clock_mhz"] and "hw_cycles" in mean else None
    return {"tokens": tokens, "interval": interval, "clock_mhz": clock, "per_token": rows,
            "mean": mean, "median": median, "measured": measured}


def split_entry(t):
    """One interval's entry of ``hwgen ralm bench``'s ``time_split``, in ms (``us`` for the
    projected node) from a :func:`time_split` result: the LM step, the query encoding, the
    round trip, the transport overhead (median round trip minus the node's own search time),
    the node's search (golden, in this process), CPU faiss on the same index, the projected
    node hardware (at the measured clock when there is one, else the declared), and per token
    the time with retrieval on CPU faiss and on the projected node, with their ratios."""
    m, med, i = t["mean"], t["median"], t["interval"]
    hw_s = t["measured"]["hw_s"] if t["measured"]["hw_s"] else m.get("hw_s")
    e = {"interval": i, "lm_ms": m["lm_s"] * 1e3, "encode_ms": m.get("encode_s", 0) * 1e3,
         "round_trip_ms": med.get("round_trip_s", 0) * 1e3,
         "transport_overhead_ms": med["transport_s"] * 1e3 if "transport_s" in med else None,
         "node_search_ms": m.get("node_search_s", 0) * 1e3,
         "cpu_faiss_ms": m.get("cpu_faiss_s", 0) * 1e3,
         "node_projected_us": hw_s * 1e6 if hw_s else None,
         "node_clock": "measured" if t["measured"]["hw_s"] else "declared"}
    if hw_s and e["cpu_faiss_ms"]:
        e["retrieval_speedup"] = e["cpu_faiss_ms"] / (hw_s * 1e3)
        cpu_token = e["lm_ms"] + (e["encode_ms"] + e["cpu_faiss_ms"]) / i
        node_token = e["lm_ms"] + (e["encode_ms"] + (e["transport_overhead_ms"] or 0)
                                   + hw_s * 1e3) / i
        e.update(token_ms_cpu=cpu_token, token_ms_node=node_token,
                 end_to_end_speedup=cpu_token / node_token)
    return e


def throughput(model, retriever, store, prompts, tokens=32, interval=1, lam=0.25,
               clock_mhz=None):
    """Batched generation: the B equal-length ``prompts`` (ids, ``(B, n)``) continued
    ``tokens`` tokens at once, greedily with the kNN-LM (K the nodes', ``lam``), one batched
    LM step (:meth:`~hwgen.ralm.lm.Llama.forward_batch`) per token and, every ``interval``
    tokens, one coordinator search of the B states (each node answers the batch in one
    request). Timed per phase, in seconds over the run: ``lm_s``, ``encode_s``,
    ``round_trip_s`` (the nodes on this CPU), ``mix_s`` (the kNN distribution and the
    interpolation); and, for the same B queries of every retrieval, ``cpu_faiss_s`` (CPU
    faiss over the same index) and ``hw_s`` (the projected node: the generated node's cycles
    for the batch, queries one after another, nodes in parallel, at ``clock_mhz``, default
    the measured clock, else the board's). ``tokens_per_s``: measured (B x tokens / wall),
    and with the retrieval on CPU faiss or on the projected node in place of the round trip
    (LM, encoding and mixing as measured; the node's round trip replaced by the measured
    per-search transport overhead plus ``hw_s``)."""
    from ..boards import load_board
    prompts = np.asarray(prompts, dtype=np.int64)
    B, k, V = len(prompts), retriever.config.k, model.config.vocab
    services, cpu = retriever.local_services, retriever.cpu_index
    kernel = load_board(services[0].config.board).kernel_clock_mhz
    measured = measured_clock({"chamvs-node"}, kernel)
    clock = clock_mhz or measured["clock_mhz"] or kernel
    t = dict.fromkeys(("lm_s", "encode_s", "round_trip_s", "node_reported_s", "mix_s",
                       "cpu_faiss_s", "hw_s"), 0.0)
    searches = 0
    start = time.perf_counter()
    cache = model.new_cache()
    logits, hidden = model.forward_batch(prompts, cache)
    t["lm_s"] += time.perf_counter() - start
    for step in range(tokens):
        if step % interval == 0:
            t0 = time.perf_counter()
            ints, probes = retriever.encode(hidden[:, -1])
            t1 = time.perf_counter()
            res = retriever.coordinator.search(ints, probes, k)
            t2 = time.perf_counter()
            cpu.search(ints.astype(np.float32), k)
            t3 = time.perf_counter()
            t["encode_s"] += t1 - t0
            t["round_trip_s"] += t2 - t1
            t["cpu_faiss_s"] += t3 - t2
            t["node_reported_s"] += res.node_seconds or 0.0
            searches += 1
            t["hw_s"] += max(sum(_model_cycles(sv, probes)) for sv in services) / (clock * 1e6)
            dist, nbr = retriever.arrays(res, B)
        t4 = time.perf_counter()
        moved = knnlm.follow(nbr, step % interval, store.passage)
        p_knn = knnlm.knn_distribution(dist, moved, store.values, V, retriever.temperature)
        p = knnlm.interpolate(softmax(logits[:, -1].astype(np.float64), axis=-1), p_knn, lam)
        nxt = np.argmax(p, axis=-1)
        t5 = time.perf_counter()
        logits, hidden = model.forward_batch(nxt[:, None], cache)
        t["mix_s"] += t5 - t4
        t["lm_s"] += time.perf_counter() - t5
    wall = time.perf_counter() - start
    transport = t["round_trip_s"] - t["node_reported_s"]
    rest = t["lm_s"] + t["encode_s"] + t["mix_s"]
    made = B * tokens
    return {"batch": B, "tokens": tokens, "interval": interval, "searches": searches,
            "clock_mhz": clock, "clock": "measured" if clock == measured["clock_mhz"] else
            ("given" if clock_mhz else "declared"), "wall_s": wall, **t,
            "tokens_per_s": made / wall,
            "tokens_per_s_cpu_faiss": made / (rest + t["cpu_faiss_s"]),
            "tokens_per_s_node": made / (rest + transport + t["hw_s"])}


def generate(model, retriever, store, prompt, tokens=32, interval=8, k=None, lam=0.25,
             temperature=None, on_token=None, on_retrieval=None):
    """Greedy continuation of ``prompt`` (text) with the kNN-LM: every ``interval`` tokens the
    current state retrieves K neighbours (followed in their passages in between).
    ``on_token(text_so_far)`` and
    ``on_retrieval(step, neighbours, missing)`` report progress; ``neighbours`` lists
    ``{"distance", "token", "source", "snippet"}``. If no node answers, the step goes on with
    the LM alone (``missing`` names the nodes). Returns ``{"text", "retrievals",
    "lm_only_steps"}``."""
    if not isinstance(prompt, str) or not prompt.strip():
        raise ConfigError("prompt", "must be non-empty text")
    if isinstance(interval, bool) or not isinstance(interval, int) or interval < 1:
        raise ConfigError("interval", "must be an integer >= 1", value=interval)
    k = k or retriever.config.k
    T = temperature or retriever.temperature
    V = model.config.vocab
    ids = model.tokenizer.encode(prompt)
    cache = model.new_cache()
    logits, hidden = model.forward(ids, cache)
    out, retrievals, lm_only = [], [], 0
    for step in range(tokens):
        if step % interval == 0:
            dist, nbr, res = retriever.search(hidden[-1:])
            found = [{"distance": float(d), "token": model.tokenizer.decode([store.values[i]]),
                      "source": store.sources[store.passage[i]],
                      "snippet": _snippet(store.texts[store.passage[i]])}
                     for d, i in zip(dist[0, :k], nbr[0, :k]) if i >= 0]
            retrievals.append({"step": step, "neighbours": found, "missing": res.missing})
            if on_retrieval:
                on_retrieval(step, found, res.missing)
        moved = knnlm.follow(nbr[:, :k], step % interval, store.passage)
        p_knn = knnlm.knn_distribution(dist[:, :k], moved, store.values, V, T)
        if not retrievals[-1]["neighbours"]:            # no node answered this retrieval
            lm_only += 1
        p = knnlm.interpolate(softmax(logits[-1:].astype(np.float64), axis=-1), p_knn,
                              lam)[0]
        nxt = int(np.argmax(p))
        out.append(nxt)
        if on_token:
            on_token(model.tokenizer.decode(out))
        if model.tokenizer.eos is not None and nxt == model.tokenizer.eos:
            break
        logits, hidden = model.forward([nxt], cache)
    return {"text": model.tokenizer.decode(out), "tokens": out, "retrievals": retrievals,
            "lm_only_steps": lm_only}


def _snippet(text, words=18):
    w = text.split()
    return " ".join(w[:words]) + (" ..." if len(w) > words else "")

