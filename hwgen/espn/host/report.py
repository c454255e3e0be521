"""Tables and plots of an ``hwgen espn bench`` report, beside the paper's numbers."""

from ...plots import new_axes, save_axes

__all__ = ["tables", "plot", "PAPER"]

#: The paper's results the tables are printed beside (ESPN, arXiv 2312.05417).
PAPER = {
    "table4_ms": "MS MARCO v1, 10-30 GB budgets: mmap 183.2-53.4, swap 76.0-45.6, ESPN (GDS) "
                 "54.2-52.9, ESPN + prefetch @10% 46.5-47.2 (all-in-memory: ~45.6)",
    "table5_ms": "MS MARCO v2, 32-256 GB: mmap 271.5-188.6, swap OOM, ESPN (GDS) 91.2-90.0, "
                 "ESPN + prefetch @30% 85.8-84.9",
    "fig7": "hit rate 74-85% at a 5% step (v1), >90% at 30%",
    "fig6": "re-ranking the top 64-128 costs 0.3-0.7% MRR@10, 8-16x less SSD traffic",
    "fig8": "ESPN matches DRAM up to batch 12 on a PCIe 3.0 SSD; GDS alone is 7.2x DRAM",
}


def _mib(n):
    return f"{n / 2**20:,.1f} MiB"


def _cell(row, key, stat):
    if "error" in row:
        return row["error"]
    return f"{row[key][stat]:.2f}"


def tables(report):
    """The report as markdown tables (a list of lines)."""
    out = []
    idx = report["index"]
    mem = report["memory"]
    asked = report.get("candidates_asked", report["candidates"])
    out += [f"index: {idx['documents']:,} documents ({idx['passages']:,} passages x "
            f"{idx['copies']} copies) of {idx['corpus']!r}, {idx['tokens']:,} tokens of "
            f"{idx['dim']} float16; nprobe {report['nprobe']}/{report['nlist']}, "
            f"{report['candidates']:,} candidates"
            + (f" ({asked:,} asked; the index holds {report['candidates']:,} documents)"
               if asked != report["candidates"] else "")
            + f", top {report['k']}, {report['queries']} queries",
            f"query encoding (MiniLM on the CPU): p50 {report['encode_ms']['p50']:.2f} ms, "
            f"p99 {report['encode_ms']['p99']:.2f} ms",
            "",
            "| memory | bytes |", "| --- | --- |",
            f"| token embeddings (float16, unpadded) | {_mib(mem['token_bytes'])} |",
            f"| token file (4 KiB-aligned) | {_mib(mem['file_bytes'])} |",
            f"| IVF index ({idx.get('ivf', 'flat')}, pooled 384-d) | {_mib(mem['ivf_bytes'])} |",
            f"| in-memory pipeline (index + table + embeddings) | {_mib(mem['in_memory_bytes'])} |",
            f"| ESPN (index + offset table + read buffers) | {_mib(mem['espn_bytes'])} |",
            f"| ratio | {mem['ratio']:.1f}x |", ""]
    out.append(f"memory budgets: {report['budget_method']}")
    budgets = report["budgets"]
    methods = []
    for b in budgets:
        methods += [m for m in b["methods"] if m not in methods]
    head = "| method | " + " | ".join(f"{b['label']} p50 / p99" for b in budgets) + \
        " | bytes/query | hit rate | prefetching queries | top-k = in-memory |"
    reranked = next((row["reranked_per_query"] for b in budgets
                     for row in b["methods"].values() if "reranked_per_query" in row), None)
    out += ["", "end-to-end latency per query (ms; encoding + ANN + embedding access + MaxSim)"
            + (f"; {reranked:,.0f} candidates re-ranked per query on average"
               if reranked is not None else "") + ":",
            head, "|" + " --- |" * (len(budgets) + 5)]
    for m in methods:
        cells, last = [], None
        for b in budgets:
            row = b["methods"].get(m, {"error": b.get("failure") or "-"})
            cells.append(row["error"] if "error" in row else
                         f"{row['end_to_end']['p50']:.2f} / {row['end_to_end']['p99']:.2f}")
            last = row if "error" not in row else last
        if last is None:
            out.append(f"| {m} | " + " | ".join(cells) + " | | | | |")
            continue
        hit = "" if last["hit_rate"] is None else f"{100 * last['hit_rate']:.1f}%"
        pf = last.get("prefetch")
        prefetching = "" if pf is None else (f"{100 * pf['queries']:.0f}% "
                                             f"({pf['documents_per_query']:,.0f} docs)")
        same = last.get("identical_to_in_memory")
        out.append(f"| {m} | " + " | ".join(cells) +
                   f" | {last['bytes_per_query'] / 1024:,.0f} KiB | {hit} | {prefetching} | "
                   f"{'-' if same is None else ('yes' if same else 'NO')} |")
    out += [""] + _against_ssd(budgets) + [""] + _eq4_table(budgets)
    out += ["", "retrieval only (ms, without query encoding), p50 / p99, and the part after "
            "the ANN (embedding access + MaxSim on the critical path), p50:",
            "| method | " + " | ".join(b["label"] for b in budgets) + " | after ANN p50 |",
            "|" + " --- |" * (len(budgets) + 2)]
    for m in methods:
        cells, after = [], ""
        for b in budgets:
            row = b["methods"].get(m, {"error": "-"})
            cells.append(row["error"] if "error" in row else
                         f"{row['retrieval']['p50']:.2f} / {row['retrieval']['p99']:.2f}")
            if "error" not in row:
                after = f"{row['after_ann_ms']['p50']:.2f}"
        out.append(f"| {m} | " + " | ".join(cells) + f" | {after} |")
    out += ["", f"paper, Table 4: {PAPER['table4_ms']}", f"paper, Table 5: {PAPER['table5_ms']}"]

    out += ["", "prefetch hit rate vs prefetch step (Fig. 7):"]
    for nprobe, rates in report["hit_rate"].items():
        out.append(f"  nprobe {nprobe}: " + ", ".join(
            f"{100 * float(s):g}% -> {100 * v:.1f}%" for s, v in rates.items()))
    out.append(f"  paper: {PAPER['fig7']}")

    full = max(report["partial"], key=lambda r: r["rerank"])
    out += ["", "partial re-ranking (Fig. 6; k' = 0: the ANN order, no re-ranking):",
            "| k' | MRR@10 | vs full | top-10 = full re-ranking | bytes/query |",
            "| --- | --- | --- | --- | --- |"]
    for r in report["partial"]:
        rel = r["mrr10"] / full["mrr10"] if full["mrr10"] else float("nan")
        out.append(f"| {r['rerank']} | {r['mrr10']:.4f} | {100 * rel:.1f}% | "
                   f"{100 * r['top10_agreement']:.1f}% | {r['bytes_per_query'] / 1024:,.0f} KiB |")
    out.append(f"  paper: {PAPER['fig6']}")

    b = report["batch"]
    out += ["", f"batch size (Fig. 8; prefetch step {100 * b['step']:g}%, budget "
            f"{b['prefetch_budget_ms']:.2f} ms = one query's remaining probes): critical-path "
            "embedding access (ms); ESPN prefetches the share of the batch's first-step "
            "candidates that equation (4) fits in the budget",
            "| batch | DRAM | SSD | ESPN | ESPN predicted | eq. (4) threshold (queries) | "
            "prefetched | bytes |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in b["rows"]:
        out.append(f"| {r['batch']} | {r['dram_ms']:.2f} | {r['ssd_ms']:.2f} | "
                   f"{r['espn_ms']:.2f} | {r['predicted_espn_ms']:.2f} | "
                   f"{r['threshold']:.2f} | {100 * r['prefetch_share']:.0f}% | "
                   f"{r['bytes'] / 2**20:.1f} MiB |")
    thr = b["batch_threshold_eq4"]
    out.append(f"  measured SSD bandwidth {b['ssd_bandwidth_bytes_per_s'] / 2**20:,.0f} MiB/s; "
               f"eq. (4) batch threshold = {thr:.1f}" if thr else "")
    out.append(f"  paper: {PAPER['fig8']}")

    i8 = report["int8"]
    out += ["", "int8 re-ranking through the maxsim unit's golden model, against float16: "
            f"identical top-{report['k']} for {100 * i8['identical_topk']:.1f}% of queries, "
            f"overlap {100 * i8['topk_overlap']:.1f}%, same top-1 {100 * i8['same_top1']:.1f}%; "
            f"MRR@10 {i8['mrr10_int8']:.4f} (int8) vs {i8['mrr10_float16']:.4f} (float16)"]
    if "lee" in report:
        lee = report["lee"]
        out += ["", f"Lee corpus, {lee['pairs']} document pairs against human similarity:",
                "| similarity | Spearman | nDCG@10 |", "| --- | --- | --- |"]
        for name, v in lee.items():
            if isinstance(v, dict):
                out.append(f"| {name} | {v['spearman']:.4f} | {v['ndcg10']:.4f} |")
    return out


def _against_ssd(budgets):
    """Each ESPN method's end-to-end p50 over the better SSD method's, per budget."""
    out = ["ESPN end-to-end p50 / min(ssd, ssd-sync) p50 (goal: at most 1.05):"]
    for b in budgets:
        rows = b["methods"]
        ssd = [rows[m]["end_to_end"]["p50"] for m in ("ssd", "ssd-sync")
               if m in rows and "error" not in rows[m]]
        espn = {m: row["end_to_end"]["p50"] for m, row in rows.items()
                if m.startswith("espn@") and "error" not in row}
        if ssd and espn:
            alone = min(rows[m]["retrieval"]["p50"] for m in ("ssd", "ssd-sync")
                        if m in rows and "error" not in rows[m])
            out.append(f"  {b['label']}: " + ", ".join(
                f"{m} {v / min(ssd):.3f} (retrieval alone "
                f"{rows[m]['retrieval']['p50'] / alone:.3f})" for m, v in espn.items()))
    return out


def _eq4_table(budgets):
    """Equation (4)'s prediction beside the measured critical-path reads (first budget)."""
    rows = {m: row for m, row in budgets[0]["methods"].items() if "eq4" in row} if budgets \
        else {}
    if not rows:
        return []
    out = [f"equation (4) beside the measurement ({budgets[0]['label']}): budget = median "
           "search time without a prefetch x (1 - step); overhead = what a prefetch in flight "
           "added to the search; threshold = BW x (budget - latency) / bytes of the "
           "re-ranked candidates (queries whose prefetch fits); reads on the critical path "
           "predicted by the store's measured latency + bytes / bandwidth",
           "| method | budget | overhead | threshold | fits | hit rate (Fig. 7) | "
           "prefetch pays | reads predicted | reads measured p50 | prefetching queries |",
           "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for m, row in rows.items():
        e = row["eq4"]
        if "threshold" not in e:
            out.append(f"| {m} | | | | | | | {e['predicted_fetch_ms']:.2f} ms | "
                       f"{e['measured_fetch_ms']:.2f} ms | |")
            continue
        out.append(f"| {m} | {e['budget_ms']:.2f} ms | {e['overhead_ms']:.2f} ms | "
                   f"{e['threshold']:.3f} | {100 * e['share_fits']:.0f}% | "
                   f"{100 * e['hit_rate']:.1f}% | {'yes' if e['prefetch_pays'] else 'no'} | "
                   f"{e['predicted_fetch_ms']:.2f} ms | {e['measured_fetch_ms']:.2f} ms | "
                   f"{100 * row['prefetch']['queries']:.0f}% |")
    return out


def plot(report, folder):
    """Hit rate vs step, partial re-ranking and batch size as PNGs in ``folder``; the paths."""
    from pathlib import Path
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    fig, ax = new_axes()
    for nprobe, rates in report["hit_rate"].items():
        xs = [100 * float(s) for s in rates]
        ax.plot(xs, [100 * v for v in rates.values()], marker="o", label=f"nprobe {nprobe}")
    ax.set_title("ESPN prefetcher hit rate (paper Fig. 7: 74-85% at 5%, >90% at 30%)")
    paths.append(save_axes(fig, ax, folder / "hit_rate.png", "prefetch step (% of nprobe)",
                           "hit rate (%)"))
    fig, ax = new_axes()
    rows = report["batch"]["rows"]
    for key, label in (("dram_ms", "DRAM"), ("ssd_ms", "SSD, no prefetch"),
                       ("espn_ms", "ESPN, prefetch")):
        ax.plot([r["batch"] for r in rows], [r[key] for r in rows], marker="o", label=label)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_title("critical-path embedding access vs batch size (paper Fig. 8)")
    paths.append(save_axes(fig, ax, folder / "batch.png", "queries per batch",
                           "embedding access on the critical path (ms)"))
    fig, ax = new_axes()
    part = [r for r in report["partial"] if r["rerank"] > 0]
    ax.plot([r["rerank"] for r in part], [r["mrr10"] for r in part], marker="o", label="MRR@10")
    ax2 = ax.twinx()
    ax2.plot([r["rerank"] for r in part], [r["bytes_per_query"] / 1024 for r in part],
             marker="s", color="tab:gray", label="KiB read per query")
    ax2.set_ylabel("KiB read per query")
    ax.set_xscale("log", base=2)
    ax.set_title("partial re-ranking: quality and SSD traffic vs k' (paper Fig. 6)")
    paths.append(save_axes(fig, ax, folder / "partial.png", "re-ranked candidates k'",
                           "MRR@10 (known-item queries)"))
    return paths
