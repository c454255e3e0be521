"""ChamLM end to end: SmolLM2 + a kNN-LM datastore served by ChamVS node processes.

:func:`prepare` makes (or reuses, cached by corpus, split and size under
``build/cache/ralm/``) the datastore and the node shards; :func:`perplexity` scores held-out
passages without and with retrieval, :func:`size_curve` on random subsets of the datastore;
:func:`generate` continues a prompt. ``hwgen ralm bench`` and ``hwgen ralm generate`` call them;
what retrieval costs (time per token, throughput, transport) is :mod:`hwgen.ralm.costs`.

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
from . import keys, knnlm

__all__ = ["Settings", "prepare", "perplexity", "generate", "default_corpus",
           "default_nlist", "size_curve", "subset", "store_sizes", "curve_entry", "WIKI_TOKENS"]


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

