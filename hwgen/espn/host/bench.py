"""``hwgen espn bench``: ESPN's measurements on a built index (paper §5, Tables 4-5, Figs. 6-8).

Queries are *known-item* queries: a span of 8-16 words cut from a random passage of the corpus; the
passage (and its noisy copies) is the relevant document, so MRR@10 measures quality without
human relevance labels (there are none offline for these corpora). The Lee corpus' human
similarity judgements are used separately (:mod:`.quality`).

What is measured, all on this machine:

* **latency** per query (p50/p99, ms) of each retrieval method on the same encoded queries, end to
  end (query encoding + ANN + embedding access + MaxSim) and without the encoding: ``in-memory``
  (all token embeddings in RAM), ``mmap``, ``ssd-sync`` (O_DIRECT, one read after another, no
  prefetch), ``ssd`` (O_DIRECT, all candidates read in parallel after the search, no prefetch),
  ``espn@S%`` (O_DIRECT with the ANN prefetcher at step S, deciding per query by equation (4)
  whether and how much to prefetch, and early re-ranking); each under memory budgets (a cgroup
  limit, :mod:`.budget`) of fractions of the token file. Methods run in a worker process per
  budget, after a warm-up on other queries (the ``O_DIRECT`` ones query by query in turn). Every
  method's top-k is compared with in-memory's, query by query; beside each ``O_DIRECT``
  method's read time on the critical path stands equation (4)'s prediction of it
  (:func:`_predict`);
* **hit rate** of the prefetcher against the prefetch step (Fig. 7), from the ANN alone;
* **partial re-ranking** (Fig. 6): MRR@10, agreement with the full re-ranking and bytes read per
  query against k';
* **batch size** (Fig. 8): the critical-path embedding access time of a batch of B queries, for
  DRAM, SSD without prefetch and ESPN (prefetching what equation (4) fits), with the prefetch
  budget of one query's remaining search;
* **int8 re-ranking** through the golden model of the ``maxsim`` unit, against float16.
"""

import json
import resource
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from ...errors import ConfigError, ToolError
from . import budget as budget_mod
from .index import Index
from .prefetch import ReadModel, measure
from .search import CANDIDATES, Query, Searcher, ann_steps
from .store import open_store

__all__ = ["known_item_queries", "encode_queries", "run", "METHODS", "percentiles"]

#: Method name -> (store kind, prefetch step).
METHODS = {"in-memory": ("ram", None), "mmap": ("mmap", None), "ssd-sync": ("direct-sync", None),
           "ssd": ("direct", None), "espn@5%": ("direct", 0.05), "espn@10%": ("direct", 0.10),
           "espn@30%": ("direct", 0.30)}


def _log(message, quiet=False):
    if not quiet:
        print(message, file=sys.stderr, flush=True)


def percentiles(values_ms):
    """``{"p50", "p99", "mean"}`` of latencies in milliseconds, rounded to 0.001 ms."""
    v = np.asarray(values_ms, float)
    return {"p50": round(float(np.percentile(v, 50)), 3),
            "p99": round(float(np.percentile(v, 99)), 3), "mean": round(float(v.mean()), 3)}


def known_item_queries(index, n, seed=0):
    """``n`` (text, passage) pairs: 8-16 consecutive words of a random passage."""
    rng = np.random.default_rng(seed)
    passages = index.passages()
    picks = rng.choice(len(passages), size=min(n, len(passages)), replace=False)
    out = []
    for p in picks:
        words = passages[p]["text"].split()
        length = int(rng.integers(8, 17))
        start = int(rng.integers(0, max(1, len(words) - length + 1)))
        out.append((" ".join(words[start:start + length]), int(p)))
    return out


def encode_queries(index, pairs, threads=None, quiet=False):
    """Encode the query texts once; returns (queries, relevant passages, encode ms per query)."""
    enc = index.encoder(threads=threads)
    enc.encode_query("warm up")
    queries, times = [], []
    for text, _ in pairs:
        t0 = time.perf_counter()
        pooled, tokens = enc.encode_query(text)
        times.append((time.perf_counter() - t0) * 1e3)
        queries.append(Query(pooled, tokens, text))
    return queries, [p for _, p in pairs], times


def _agreement(ids, reference, k=10):
    """Share of ``reference``'s first k ids that are among ``ids``' first k."""
    want = reference[:k].tolist()
    return len(set(ids[:k].tolist()) & set(want)) / max(1, len(want))


def _mean_mrr(results, origin, relevant):
    return float(np.mean([_mrr(r.ids, origin, p) for r, p in zip(results, relevant)]))


def _mrr(ids, origin, relevant, k=10):
    for rank, d in enumerate(ids[:k]):
        if origin[d] == relevant:
            return 1.0 / (rank + 1)
    return 0.0


# ---------------------------------------------------------------- worker (one memory budget)

def _rss():
    """This process' resident set now (bytes), from /proc."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def _method_out(searcher, results, bytes_read, step):
    """One method's entry of a worker's output: latencies, bytes, hits, its prefetch plans."""
    out = {"retrieval_ms": [r.times["total"] * 1e3 for r in results],
           "ann_ms": [r.times["ann"] * 1e3 for r in results],
           "after_ann_ms": [(r.times["total"] - r.times["ann"]) * 1e3 for r in results],
           "fetch_ms": [r.times["fetch"] * 1e3 for r in results],
           "bytes_per_query": bytes_read / max(1, len(results)),
           "reranked_per_query": float(np.mean([r.hits + r.missed for r in results])),
           "hit_rate": (float(np.mean([r.hit_rate for r in results])) if step else None),
           "ids": [r.ids.tolist() for r in results],
           "scores": [r.scores.tolist() for r in results],
           "resident_bytes": searcher.store.resident_bytes()}
    if step:
        plans = [r.plan for r in results]
        out["prefetch"] = {
            "queries": float(np.mean([r.prefetched > 0 for r in results])),
            "documents_per_query": float(np.mean([r.prefetched for r in results])),
            "budget_ms": [p["budget"] * 1e3 for p in plans],
            "overhead_ms": [p["overhead"] * 1e3 for p in plans],
            "threshold": [min(p["threshold"], 1e9) for p in plans],
            "fit": [p["fit"] for p in plans],
            "read_model": searcher.model.as_dict()}
    return out


def _searcher(index, spec, method, out):
    """A :class:`Searcher` of ``spec``'s ``method`` over its own store, or None with the
    store's error in ``out[method]`` when the store cannot be opened (no ``O_DIRECT``, no
    memory)."""
    kind, step = spec["methods"][method]
    try:
        store = open_store(kind, index.tokens_path, index.offsets, index.ntokens, index.dim,
                           threads=spec["threads"])
    except (ToolError, MemoryError) as e:
        out[method] = {"error": str(e)}
        return None
    return Searcher(index, store, nprobe=spec["nprobe"], candidates=spec["candidates"],
                    k=spec["k"], prefetch_step=step)


def _worker(spec_path, out_path):
    """Run the methods of ``spec`` on the saved queries; write per-method results.

    The methods that keep the token file in memory or in the page cache run one after another
    (each would evict the other's pages under a budget); the ``O_DIRECT`` methods (``ssd``,
    ``ssd-sync``, ``espn@*``) take the queries in turn, query by query, the method order
    rotated by one each query, so that they meet the same load on a shared machine and none
    always reads right after another."""
    spec = json.loads(Path(spec_path).read_text())
    index = Index(spec["index"])
    saved = np.load(spec["queries"], allow_pickle=False)
    queries = [Query(saved["pooled"][i], saved["tokens"][i][:saved["lengths"][i]])
               for i in range(len(saved["lengths"]))]
    warm, measured = queries[:spec["warmup"]], queries[spec["warmup"]:]
    out = {"base_rss_bytes": _rss()}
    methods = spec["methods"]
    direct = [m for m, (kind, _) in methods.items() if kind.startswith("direct")]
    for method in [m for m in methods if m not in direct]:
        step = methods[method][1]
        searcher = _searcher(index, spec, method, out)
        if searcher is None:
            continue
        with searcher.store as store:
            for q in warm:
                searcher.search(q)
            before = store.bytes_read
            results = [searcher.search(q) for q in measured]
            out[method] = _method_out(searcher, results, store.bytes_read - before, step)
        out[method]["peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    searchers = {m: _searcher(index, spec, m, out) for m in direct}
    searchers = {m: s for m, s in searchers.items() if s is not None}
    names = list(searchers)
    results = {m: [] for m in names}
    for phase, batch in (("warm", warm), ("measured", measured)):
        if phase == "measured":
            before = {m: searchers[m].store.bytes_read for m in names}
        for i, q in enumerate(batch):
            for m in names[i % len(names):] + names[:i % len(names)]:
                r = searchers[m].search(q)
                if phase == "measured":
                    results[m].append(r)
    for m in names:
        searcher = searchers[m]
        searcher.store.close()
        out[m] = _method_out(searcher, results[m], searcher.store.bytes_read - before[m],
                             methods[m][1])
        out[m]["peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    Path(out_path).write_text(json.dumps(out))


def _run_budget(index, qfile, methods, limit, params, tmp):
    # methods: {name: (store kind, prefetch step)}
    spec = dict(params, index=str(index.folder), queries=str(qfile), methods=methods)
    spec_path, out_path = Path(tmp) / "spec.json", Path(tmp) / "out.json"
    spec_path.write_text(json.dumps(spec))
    if out_path.exists():
        out_path.unlink()
    budget_mod.drop_cache(index.tokens_path)
    cmd = [sys.executable, "-m", "hwgen.espn.host.bench", str(spec_path), str(out_path)]
    code, peak, oom = budget_mod.run_limited(cmd, limit)
    if oom or code != 0 or not out_path.exists():
        return None, peak, "OOM" if oom else f"exit {code}"
    return json.loads(out_path.read_text()), peak, None


# ---------------------------------------------------------------- the measurements

def _hit_rates(index, queries, nprobe, candidates, steps, rerank=None):
    """Prefetch hit rate (mean over queries) for each step, from the ANN alone."""
    pooled = np.stack([q.pooled for q in queries])
    final = ann_steps(index.ivf, pooled, nprobe, candidates)
    out = {}
    for step in steps:
        split = max(1, int(round(step * nprobe)))
        if split >= nprobe:
            out[step] = 1.0
            continue
        first, _ = ann_steps(index.ivf, pooled, nprobe, candidates, split=split)
        out[step] = float(np.mean([_agreement(f[1], t[1], rerank or candidates)
                                   for f, t in zip(first, final)]))
    return out


def _partial(index, queries, relevant, nprobe, candidates, k, counts, threads):
    """MRR@10, agreement with the full re-ranking and bytes per query for each k'."""
    store = open_store("direct", index.tokens_path, index.offsets, index.ntokens, index.dim,
                       threads=threads)
    rows = []
    with store:
        full = [Searcher(index, store, nprobe, candidates, k).search(q) for q in queries]
        ann_only = [r.candidates for r in full]
        for kp in list(counts) + [None]:
            if kp is not None and kp > candidates:
                continue
            searcher = Searcher(index, store, nprobe, candidates, k, rerank=kp)
            before = store.bytes_read
            results = [searcher.search(q) for q in queries] if kp is not None else full
            spent = (store.bytes_read - before) if kp is not None else sum(
                r.bytes_read for r in full)
            rows.append({
                "rerank": kp if kp is not None else candidates,
                "mrr10": _mean_mrr(results, index.origin, relevant),
                "top10_agreement": float(np.mean([_agreement(r.ids, f.ids)
                                                  for r, f in zip(results, full)])),
                "bytes_per_query": spent / len(queries)})
        rows.append({"rerank": 0, "mrr10": float(np.mean([
            _mrr(c, index.origin, rel) for c, rel in zip(ann_only, relevant)])),
            "top10_agreement": float(np.mean([_agreement(c, f.ids)
                                              for c, f in zip(ann_only, full)])),
            "bytes_per_query": 0.0})
    return sorted(rows, key=lambda r: r["rerank"])


def _batch_guess(first, sel):
    """The first-step candidates of the queries ``sel``, best ranks first (rank 0 of every
    query, then rank 1, ...), each document once: a batch's prefetch order."""
    seen, order = set(), []
    lists = [first[i][1] for i in sel]
    for rank in range(max(len(x) for x in lists)):
        for x in lists:
            if rank < len(x) and int(x[rank]) not in seen:
                seen.add(int(x[rank]))
                order.append(int(x[rank]))
    return order


def _batches(index, queries, nprobe, candidates, step, sizes, threads, repeats=3):
    """Critical-path embedding access time (ms) of a batch of B queries (paper Fig. 8).

    The paper assumes enough cores that a batch's ANN takes one query's time, so the prefetch
    budget stays constant; here the B searches' remaining probes are likewise replaced by
    waiting one query's measured remaining-probe time (the budget) after the prefetch is issued.
    DRAM: copying the candidates' embeddings from memory. SSD: reading all of them after the
    search. ESPN: at ``step``, prefetch the batch's best-ranked first-step candidates that
    equation (4) fits in the budget (:class:`ReadModel` of the store), wait the budget, stop
    the prefetch, read the final candidates whose read had not started the faster way and
    wait for those in flight; no document is read twice. Each row also holds the prediction:
    equation (4)'s threshold and the read time the model predicts for ESPN."""
    ram = open_store("ram", index.tokens_path, index.offsets, index.ntokens, index.dim)
    ssd = open_store("direct", index.tokens_path, index.offsets, index.ntokens, index.dim,
                     threads=threads)
    split = max(1, int(round(step * nprobe)))
    pooled = np.stack([q.pooled for q in queries])
    # the prefetch budget: one query's probes after the split (median over the queries)
    budget = []
    for p in pooled[:32]:
        t0 = time.perf_counter()
        ann_steps(index.ivf, p[None], nprobe, candidates)
        full = time.perf_counter() - t0
        t0 = time.perf_counter()
        ann_steps(index.ivf, p[None], split, candidates)
        budget.append(max(0.0, full - (time.perf_counter() - t0)))
    budget_s = float(np.median(budget))
    first_all, finish = ann_steps(index.ivf, pooled, nprobe, candidates, split=split)
    final_all = finish()
    rows = []
    with ram, ssd:
        model = measure(ssd)
        for b in sizes:
            if b > len(queries):
                break
            dram, plain, espn, read_bytes, espn_bytes, fits, predicted = [], [], [], [], [], [], []
            for r in range(repeats):
                sel = [(r * b + i) % len(queries) for i in range(b)]
                want = sorted(set(int(d) for i in sel for d in final_all[i][1]))
                guess = _batch_guess(first_all, sel)
                t0 = time.perf_counter()
                {d: t.copy() for d, t in ram.read(want).items()}
                dram.append(time.perf_counter() - t0)
                budget_mod.drop_cache(index.tokens_path)
                before = ssd.bytes_read
                t0 = time.perf_counter()
                ssd.read(want)
                plain.append(time.perf_counter() - t0)
                read_bytes.append(ssd.bytes_read - before)
                fit = model.fitting(ssd.extents[np.asarray(guess, np.int64)], budget_s)
                before = ssd.bytes_read
                fetch = ssd.submit(guess[:fit]) if fit else None
                time.sleep(budget_s)                    # the batch's remaining probes
                t0 = time.perf_counter()
                started = set(fetch.stop()) if fetch is not None else set()
                missing = [d for d in want if d not in started]
                if missing:
                    model.read(ssd, missing)
                if fetch is not None:
                    fetch.wait([d for d in want if d in started])
                espn.append(time.perf_counter() - t0)
                if fetch is not None:
                    fetch.wait()
                espn_bytes.append(ssd.bytes_read - before)
                fits.append(fit / max(1, len(guess)))
                wanted = set(want)
                hidden = sum(ssd.extent(d) for d in guess[:fit] if d in wanted)
                predicted.append(model.seconds(read_bytes[-1] - hidden,
                                               model.best(read_bytes[-1])))
            rows.append({"batch": b, "dram_ms": 1e3 * float(np.median(dram)),
                         "ssd_ms": 1e3 * float(np.median(plain)),
                         "espn_ms": 1e3 * float(np.median(espn)),
                         "bytes": float(np.median(read_bytes)),
                         "espn_bytes": float(np.median(espn_bytes)),
                         "prefetch_share": float(np.median(fits)),
                         "threshold": model.threshold(budget_s,
                                                      float(np.median(read_bytes)) / b),
                         "predicted_espn_ms": 1e3 * float(np.median(predicted))})
    bandwidth = max(r["bytes"] / (r["ssd_ms"] / 1e3) for r in rows)
    per_query = rows[0]["bytes"]
    return {"step": step, "prefetch_budget_ms": budget_s * 1e3, "rows": rows,
            "ssd_bandwidth_bytes_per_s": bandwidth, "read_model": model.as_dict(),
            "batch_threshold_eq4": bandwidth * budget_s / per_query if per_query else None}


def _int8(index, queries, relevant, nprobe, candidates, k):
    """Re-ranking through the maxsim unit's golden model on int8 tokens, against float16."""
    ram = open_store("ram", index.tokens_path, index.offsets, index.ntokens, index.dim)
    with ram:
        f16 = [Searcher(index, ram, nprobe, candidates, k).search(q) for q in queries]
        i8 = [Searcher(index, ram, nprobe, candidates, k, precision="int8").search(q)
              for q in queries]
    same = [r.ids.tolist() == f.ids.tolist() for r, f in zip(i8, f16)]
    overlap = [_agreement(r.ids, f.ids, k) for r, f in zip(i8, f16)]
    top1 = [r.ids[0] == f.ids[0] for r, f in zip(i8, f16)]
    return {"identical_topk": float(np.mean(same)), "topk_overlap": float(np.mean(overlap)),
            "same_top1": float(np.mean(top1)),
            "mrr10_float16": _mean_mrr(f16, index.origin, relevant),
            "mrr10_int8": _mean_mrr(i8, index.origin, relevant)}


def _memory_sizes(index, threads):
    """The ``memory`` entry of :func:`run`: in-memory and ESPN bytes, the files' sizes."""
    token_bytes, file_bytes = index.meta["token_bytes"], index.meta["file_bytes"]
    espn_bytes = index.memory_bytes() + threads * 2 * 16 * 4096      # + read buffers
    # in memory, the embeddings need not be padded: count them compact (the smaller figure)
    return {"in_memory_bytes": index.memory_bytes() + token_bytes,
            "espn_bytes": espn_bytes, "token_bytes": token_bytes,
            "file_bytes": file_bytes, "ivf_bytes": index.meta["ivf_bytes"],
            "ratio": (index.memory_bytes() + token_bytes) / espn_bytes}


def _save_queries(qfile, encoded, dim):
    """The encoded queries into ``qfile`` (``.npz``: pooled, padded tokens, lengths) for the
    budget workers."""
    lengths = [q.tokens.shape[0] for q in encoded]
    tokens = np.zeros((len(encoded), max(lengths), dim), np.float16)
    for i, q in enumerate(encoded):
        tokens[i, :lengths[i]] = q.tokens
    np.savez(qfile, pooled=np.stack([q.pooled for q in encoded]), tokens=tokens,
             lengths=np.asarray(lengths))


def _method_rows(out, failure, methods, encode_ms, reference):
    """Each method's row of a memory budget from its worker's ``out`` (latency percentiles,
    end to end with the queries' ``encode_ms``; whether the results equal the in-memory
    ``reference``, taken from ``out`` when None). Returns ``(rows, reference)``."""
    if reference is None and "error" not in out.get("in-memory", {"error": 1}):
        reference = out["in-memory"]
    rows = {}
    for m in methods:
        r = out.get(m, {"error": failure or "not run"})
        if "error" in r:
            rows[m] = {"error": r["error"]}
            continue
        e2e = [a + b for a, b in zip(r["retrieval_ms"], encode_ms)]
        row = {"retrieval": percentiles(r["retrieval_ms"]),
               "end_to_end": percentiles(e2e), "ann_ms": percentiles(r["ann_ms"]),
               "after_ann_ms": percentiles(r["after_ann_ms"]),
               "fetch_ms": percentiles(r["fetch_ms"]),
               "bytes_per_query": r["bytes_per_query"], "hit_rate": r["hit_rate"],
               "reranked_per_query": r["reranked_per_query"],
               "resident_bytes": r["resident_bytes"],
               "peak_rss_bytes": r["peak_rss_bytes"]}
        if "prefetch" in r:
            pf = r["prefetch"]
            row["prefetch"] = {"queries": pf["queries"],
                               "documents_per_query": pf["documents_per_query"],
                               "budget_ms": float(np.median(pf["budget_ms"])),
                               "overhead_ms": float(np.median(pf["overhead_ms"])),
                               "threshold": float(np.median(pf["threshold"])),
                               "read_model": pf["read_model"]}
        if reference is not None:
            row["identical_to_in_memory"] = (r["ids"] == reference["ids"] and
                                             r["scores"] == reference["scores"])
        rows[m] = row
    return rows, reference


def _predict(rows, methods, mean_doc, hit_rates):
    """Equation (4)'s prediction beside each ``O_DIRECT`` method's measurement (``eq4`` of
    each row): the read time on the critical path that the store's :class:`ReadModel`
    predicts — all re-ranked candidates' bytes ``D`` one after another (``ssd-sync``),
    ``threads`` at once (``ssd``), and for ESPN at step s the bytes the prefetch did not hide:
    ``D x (1 - share x hit)``, where ``share`` is the part of ``D`` that fits the measured
    budget less the measured overhead (equation 4) and ``hit`` the ANN's hit rate at s, or
    all of ``D`` the faster way when the prefetch is predicted not to pay (the rule
    :meth:`Searcher.plan` applies per query)."""
    model = next((ReadModel(**row["prefetch"]["read_model"]) for row in rows.values()
                  if "prefetch" in row), None)
    if model is None:
        return
    for m, row in rows.items():
        kind, step = methods[m]
        if "error" in row or not kind.startswith("direct"):
            continue
        count = row["reranked_per_query"]
        total = count * mean_doc
        eq4 = {"bytes_per_query": total}
        if step is None:
            way = "sync" if kind == "direct-sync" else "parallel"
            eq4["predicted_fetch_ms"] = 1e3 * model.seconds(total, way)
        else:
            pf = row["prefetch"]
            budget, overhead = pf["budget_ms"] / 1e3, pf["overhead_ms"] / 1e3
            share = min(1.0, model.documents(budget - overhead, mean_doc) / max(1.0, count))
            hit = hit_rates.get(step, 1.0)
            way = model.best(total)
            saving = model.seconds(total, way) - model.seconds(total * (1 - share * hit), way)
            pays = share > 0 and saving > overhead
            eq4.update(threshold=model.threshold(budget, total), budget_ms=budget * 1e3,
                       overhead_ms=overhead * 1e3, share_fits=share, hit_rate=hit,
                       prefetch_pays=pays,
                       predicted_fetch_ms=1e3 * model.seconds(
                           total * (1 - share * hit) if pays else total, way))
        eq4["measured_fetch_ms"] = row["fetch_ms"]["p50"]
        row["eq4"] = eq4


def run(folder, queries=200, warmup=50, nprobe=None, candidates=CANDIDATES, k=10,
        steps=(0.05, 0.10, 0.30), budgets=(0.25, 0.5, 1.0, 2.0), threads=4,
        rerank_counts=(8, 16, 32, 64, 128, 256), batch_sizes=(1, 2, 4, 8, 16, 32, 64, 128),
        seed=0, encode_threads=None, quiet=False, lee=True):
    """All measurements (see the module docstring); returns the report dict. ``candidates``
    larger than the index is lowered to its documents, with a message."""
    index = Index(folder)
    nlist = index.ivf.nlist
    nprobe = nprobe or max(1, nlist // 4)
    pairs = known_item_queries(index, queries + warmup, seed)
    if len(pairs) <= warmup:
        raise ConfigError("queries", f"with {warmup} warm-up queries it needs more than the "
                          f"{len(pairs)} passages of the index to draw queries from",
                          value=queries)
    asked = candidates
    if candidates > index.meta["documents"]:
        candidates = index.meta["documents"]
        _log(f"espn bench: {asked:,} candidates asked, the index holds "
             f"{candidates:,} documents: re-ranking at most {candidates:,}", quiet)
    _log(f"espn bench: {index.meta['documents']} documents, nprobe {nprobe}/{nlist}, "
         f"{candidates} candidates, {len(pairs) - warmup} queries (+{warmup} warm-up)", quiet)
    encoded, relevant, encode_ms = encode_queries(index, pairs, threads=encode_threads)
    measured, measured_rel = encoded[warmup:], relevant[warmup:]
    report = {"index": dict(index.meta), "folder": str(index.folder), "nprobe": nprobe,
              "nlist": nlist, "candidates": candidates, "candidates_asked": asked, "k": k,
              "queries": len(measured),
              "warmup": warmup, "threads": threads, "encode_ms": percentiles(encode_ms[warmup:])}

    report["memory"] = _memory_sizes(index, threads)
    file_bytes = index.meta["file_bytes"]

    _log("  prefetch hit rate vs step ...", quiet)
    sweep = sorted({0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.7} | set(steps))
    report["hit_rate"] = {str(np): {f"{s:g}": v for s, v in
                                    _hit_rates(index, measured, np, candidates, sweep).items()}
                          for np in sorted({nprobe, min(nlist, 2 * nprobe)})}
    hits = {s: report["hit_rate"][str(nprobe)][f"{s:g}"] for s in steps}
    mean_doc = file_bytes / index.meta["documents"]

    # latency per method and budget
    ok, how = budget_mod.available()
    methods = {m: v for m, v in METHODS.items() if not m.startswith("espn@")}
    if not ok:
        del methods["mmap"]
        methods["mmap-cold"] = ("mmap-cold", None)
    methods.update({f"espn@{s * 100:g}%": ("direct", s) for s in steps})
    report["budget_method"] = how if ok else f"none ({how}); mmap evicted before every query"
    params = {"warmup": warmup, "threads": threads, "nprobe": nprobe, "candidates": candidates,
              "k": k}
    with tempfile.TemporaryDirectory(prefix="hwgen-espn-") as tmp:
        qfile = Path(tmp) / "queries.npz"
        _save_queries(qfile, encoded, index.dim)
        report["budgets"] = []
        limits, reference = [(None, None)], None
        for fraction, limit in limits:
            label = ("unlimited" if limit is None else
                     f"{100 * fraction:g}% ({limit / 2**20:,.0f} MiB)")
            _log(f"  latency, memory budget {label} ...", quiet)
            t0 = time.perf_counter()
            out, peak, failure = _run_budget(index, qfile, methods, limit, params, tmp)
            if out is None and failure == "OOM":           # in-memory alone does not fit
                out, peak, failure = _run_budget(
                    index, qfile, {m: v for m, v in methods.items() if m != "in-memory"},
                    limit, params, tmp)
                if out is not None:
                    out["in-memory"] = {"error": "OOM"}
            entry = {"fraction": fraction, "limit_bytes": limit, "label": label,
                     "peak_bytes": peak, "failure": failure, "methods": {}}
            if out is not None:
                entry["methods"], reference = _method_rows(out, failure, methods,
                                                           encode_ms[warmup:], reference)
                _predict(entry["methods"], methods, mean_doc, hits)
            entry["seconds"] = round(time.perf_counter() - t0, 1)
            report["budgets"].append(entry)
            if limit is None and out is not None and ok:
                # budgets: the worker's own memory before any embedding (python, numpy, faiss,
                # the IVF index, the queries) + 64 MiB of slack + a fraction of the token file
                report["worker_base_bytes"] = out["base_rss_bytes"]
                base = out["base_rss_bytes"] + 64 * 2**20
                limits += [(f, int(base + f * file_bytes)) for f in budgets]

    _log("  partial re-ranking ...", quiet)
    report["partial"] = _partial(index, measured, measured_rel, nprobe, candidates, k,
                                 rerank_counts, threads)
    _log("  batch size ...", quiet)
    report["batch"] = _batches(index, measured, nprobe, candidates, 0.10, batch_sizes, threads)
    _log("  int8 re-ranking (maxsim unit golden model) ...", quiet)
    report["int8"] = _int8(index, measured[:100], measured_rel[:100], nprobe, candidates, k)
    if lee:
        from .quality import lee_quality
        _log("  Lee corpus quality ...", quiet)
        report["lee"] = lee_quality(index.encoder(threads=encode_threads))
    return report


if __name__ == "__main__":      # the worker of one memory budget (see _run_budget)
    _worker(sys.argv[1], sys.argv[2])
