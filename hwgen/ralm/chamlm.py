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
           "PAPER"]

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
        return keys.split_documents(passages, every)
    return ([p for i, p in enumerate(passages) if i % every != every - 1],
            [p for i, p in enumerate(passages) if i % every == every - 1])


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
    ikey = knnlm.cache_key("index-v1", s.nodes, s.nlist, s.m, s.nprobe, s.k, s.elem_bits)
    index_dir = root / f"index-{ikey}"
    if not (index_dir / "index.json").exists():
        index_dir.mkdir(exist_ok=True)
        knnlm.make_index(store, index_dir, nodes=s.nodes, nlist=s.nlist, m=s.m,
                         nprobe=s.nprobe, k=s.k, elem_bits=s.elem_bits, log=say)
    return store, index_dir, held


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
    from ..vecsearch.model import layout_query_cycles
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
            cycles = max(layout_query_cycles(sv.config, sv._packed.layout, probes[0],
                                             sv.config.k)["total"] for sv in services)
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

