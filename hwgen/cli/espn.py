"""``hwgen espn index | bench | query``: ESPN multi-vector retrieval from the command line."""

import json
from pathlib import Path

import click

from .. import checks
from ..cli_support import reports_errors
from ..errors import ConfigError
from .common import alias_option, k_option

__all__ = ["espn"]

# The caps below are stated in --help; hwgen.espn.host's modules enforce them again for
# library callers (tests/test_espn_bad_input.py checks that the two agree).
MAX_COPIES = 1000               # hwgen.espn.host.index.MAX_COPIES
MAX_DOCUMENTS = 1_000_000       # hwgen.espn.host.index.MAX_DOCUMENTS
MAX_CANDIDATES = 100_000        # hwgen.espn.host.search.MAX_CANDIDATES
CANDIDATES = 1000               # hwgen.espn.host.search.CANDIDATES (the paper's re-ranking depth)
MAX_CORPUS_MIB = 64             # hwgen.espn.host.corpus.MAX_CORPUS_BYTES
DIMS = (16, 32, 64, 128, 384)   # hwgen.espn.host.encoder.DIMS


def _fractions(name, text):
    """``0.05,0.1,0.3`` -> tuple of positive numbers."""
    try:
        values = tuple(float(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise ConfigError(name, "expected numbers separated by commas", value=text) from None
    if not values or any(not 0 < v < float("inf") for v in values):
        raise ConfigError(name, "expected positive finite numbers separated by commas",
                          value=text)
    return values


@click.group()
def espn():
    """ESPN: multi-vector re-ranking with the token embeddings on SSD and an ANN prefetcher."""


@espn.command("index")
@click.argument("corpus")
@click.option("--out", required=True, type=click.Path(file_okay=False),
              help="Index folder to write.")
@click.option("--dim", type=int, default=32, show_default=True,
              help="Token embedding width after projection (16, 32, 64, 128 or 384).")
@click.option("--nlist", type=int, help="IVF lists (default about 2 sqrt(documents)).")
@click.option("--ivf", "ivf_kind", type=click.Choice(["sq8", "flat"]), default="sq8",
              show_default=True, help="IVF codes of the pooled vectors: 8-bit or float32.")
@click.option("--copies", type=int, default=1, show_default=True,
              help=f"Noisy copies of every passage, to scale the store beyond the corpus "
                   f"(1..{MAX_COPIES:,}; passages x copies at most {MAX_DOCUMENTS:,}).")
@click.option("--noise", type=float, default=0.05, show_default=True,
              help="Standard deviation of the copies' Gaussian noise per element (0..1).")
@click.option("--limit", type=int, help="Use only the first N passages.")
@click.option("--words", type=int, default=80, show_default=True,
              help="Most words per passage (8..400).")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--threads", type=int,
              help="PyTorch threads for the encoder (1..256; default: all).")
@reports_errors
def espn_index(corpus, out, dim, nlist, ivf_kind, copies, noise, limit, words, seed, threads):
    """Encode CORPUS (papers, lee, wiki, pydoc, all, pysource, A+B, or a .txt/.jsonl file
    or folder) into an ESPN index folder: token embeddings on disk, IVF index of pooled
    vectors. pysource: the standard library's docstrings and comments, read from its source.

    CORPUS files must be regular files (no FIFOs, devices or /proc) holding at most
    64 MiB together; a folder at most 10,000 .txt files."""
    from ..espn.host import corpus as corpus_mod
    from ..espn.host.index import build, check_copies
    if dim not in DIMS:
        raise ConfigError("dim", f"choose one of {', '.join(map(str, DIMS))}", value=dim)
    check_copies(copies)
    checks.in_range("noise", noise, 0, 1)
    for name, value in (("nlist", nlist), ("limit", limit)):
        if value is not None:
            checks.at_least(name, value, 1)
    checks.at_least("words", words, 8, 400)
    checks.at_least("seed", seed, 0, checks.SEED_MAX)
    if threads is not None:
        checks.at_least("threads", threads, 1, 256)
    corpus_mod.check(corpus)
    checks.output_dir("out", out)
    meta = build(corpus, out, dim=dim, nlist=nlist, copies=copies, noise=noise, limit=limit,
                 words=words, seed=seed, threads=threads, ivf_kind=ivf_kind)
    click.echo(f"{out}: {meta['documents']:,} documents, {meta['tokens']:,} tokens, "
               f"token file {meta['file_bytes'] / 2**20:,.1f} MiB, IVF index "
               f"{meta['ivf_bytes'] / 2**20:,.1f} MiB ({meta['ivf']}, {meta['nlist']} lists), "
               f"{meta['build_seconds']} s")


@espn.command("bench")
@click.argument("index_dir", type=click.Path(exists=True, file_okay=False))
@click.option("--json", "json_path", type=click.Path(dir_okay=False))
@click.option("--plot-dir", "plot_dir", type=click.Path(file_okay=False),
              help="Folder for hit_rate.png, batch.png and partial.png.")
@alias_option("--plot", "plot_dir", type=click.Path(file_okay=False))
@click.option("--queries", type=int, default=200, show_default=True)
@click.option("--warmup", type=int, default=50, show_default=True)
@click.option("--nprobe", type=int, help="IVF lists probed (default: a quarter of them).")
@click.option("--candidates", type=int, default=CANDIDATES, show_default=True,
              help=f"Candidates from the ANN that are re-ranked (1..{MAX_CANDIDATES:,}; the "
                   "paper re-ranks 1,000; lowered, with a message, to the index's documents).")
@k_option(10, "Passages returned per query.")
@click.option("--prefetch-steps", "steps", default="0.05,0.1,0.3", show_default=True,
              help="Prefetch steps to measure: fractions of nprobe (delta / eta) after which "
                   "the prefetch may start (each query prefetches only what equation (4) "
                   "fits in the rest of the search).")
@alias_option("--prefetch-step", "steps")
@click.option("--budgets", default="0.25,0.5,1,2", show_default=True,
              help="Memory budgets: fractions of the token file (plus 400 MiB for the "
                   "process), each enforced by a cgroup; 'none' to skip.")
@click.option("--read-threads", "threads", type=int, default=4, show_default=True,
              help="Reading threads per pool (reads in flight). On 2 cores 4 measured best: "
                   "ESPN@10% 17.2 ms vs 22.7 ms with 16, the reads and early MaxSim then "
                   "compete with the ANN for the CPU.")
@alias_option("--threads", "threads", type=int)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--no-lee", is_flag=True, help="Skip the Lee corpus quality check.")
@reports_errors
def espn_bench(index_dir, json_path, plot_dir, queries, warmup, nprobe, candidates, k, steps,
               budgets, threads, seed, no_lee):
    """Latency per retrieval method and memory budget, prefetch hit rates, partial
    re-ranking, batch size, int8 re-ranking, Lee quality (the paper's Tables 4-5, Figs. 6-8)."""
    from ..espn.host import bench, report
    checks.at_least("queries", queries, 1)
    checks.at_least("warmup", warmup, 0)
    checks.at_least("candidates", candidates, 1, MAX_CANDIDATES)
    checks.at_least("k", k, 1, candidates)
    checks.at_least("read_threads", threads, 1, 256)
    if nprobe is not None:
        checks.at_least("nprobe", nprobe, 1)
    step_values = _fractions("prefetch-steps", steps)
    if any(s >= 1 for s in step_values):
        raise ConfigError("prefetch-steps", "each step is a fraction of nprobe below 1 "
                          "(0.1 = after 10% of the lists)", value=steps)
    budget_values = () if budgets.strip().lower() == "none" else _fractions("budgets", budgets)
    if json_path:
        checks.output_file("json", json_path)
    result = bench.run(index_dir, queries=queries, warmup=warmup, nprobe=nprobe,
                       candidates=candidates, k=k, steps=step_values, budgets=budget_values,
                       threads=threads, seed=seed, lee=not no_lee)
    for line in report.tables(result):
        click.echo(line)
    if json_path:
        Path(json_path).write_text(json.dumps(result, indent=2) + "\n")
        click.echo(f"json: {json_path}")
    if plot_dir:
        for path in report.plot(result, plot_dir):
            click.echo(f"plot: {path}")
    broken = [f"{m} under {b['label']}" for b in result["budgets"]
              for m, row in b["methods"].items() if row.get("identical_to_in_memory") is False]
    if broken:
        raise ConfigError("bench", "top-k differs from the in-memory pipeline for " +
                          ", ".join(broken))


@espn.command("query")
@click.argument("index_dir", type=click.Path(exists=True, file_okay=False))
@click.argument("text")
@click.option("--store", type=click.Choice(["ram", "mmap", "direct", "direct-sync"]),
              default="direct", show_default=True)
@click.option("--prefetch-step", type=float, default=0.1, show_default=True,
              help="Fraction of nprobe (delta / eta) after which the prefetch may start, "
                   "when equation (4) says it fits in the rest of the search (0: no "
                   "prefetch).")
@click.option("--nprobe", type=int, help="IVF lists probed (default: a quarter of them).")
@click.option("--candidates", type=int, default=CANDIDATES, show_default=True,
              help=f"Candidates from the ANN that are re-ranked (1..{MAX_CANDIDATES:,}; the "
                   "paper re-ranks 1,000; an index of fewer documents gives them all).")
@click.option("--rerank-count", type=int, help="Re-rank only the ANN's first k' candidates.")
@click.option("--rerank", type=click.Choice(["float16", "int8"]), default="float16",
              show_default=True, help="int8: score with the maxsim unit's golden model.")
@k_option(10, "Passages returned.")
@reports_errors
def espn_query(index_dir, text, store, prefetch_step, nprobe, candidates, rerank_count, rerank,
               k):
    """Search INDEX_DIR for TEXT and print the top-k passages with their MaxSim scores."""
    from ..espn.host.index import Index
    from ..espn.host.search import Query, Searcher
    from ..espn.host.store import open_store
    checks.in_range("prefetch-step", prefetch_step, 0, 0.99)
    checks.at_least("candidates", candidates, 1, MAX_CANDIDATES)
    checks.at_least("k", k, 1)
    if nprobe is not None:
        checks.at_least("nprobe", nprobe, 1)
    if rerank_count is not None:
        checks.at_least("rerank-count", rerank_count, 1, candidates)
    if not text.strip():
        raise ConfigError("text", "the query is empty")
    index = Index(index_dir)
    if nprobe is None:
        nprobe = max(1, index.ivf.nlist // 4)
    step = prefetch_step if prefetch_step and store == "direct" else None
    passages = index.passages()          # a damaged index is refused before the model loads
    if candidates > index.meta["documents"]:
        click.echo(f"espn query: {candidates:,} candidates asked, the index holds "
                   f"{index.meta['documents']:,} documents: re-ranking at most "
                   f"{index.meta['documents']:,}", err=True)
    with open_store(store, index.tokens_path, index.offsets, index.ntokens,
                    index.dim) as reader:
        searcher = Searcher(index, reader, nprobe=nprobe, candidates=candidates, k=k,
                            prefetch_step=step, rerank=rerank_count, precision=rerank)
        pooled, tokens = index.encoder().encode_query(text)
        result = searcher.search(Query(pooled, tokens, text))
    for rank, (doc, score) in enumerate(zip(result.ids, result.scores), 1):
        p = passages[index.origin[doc]]
        copy = doc // len(passages)
        click.echo(f"{rank:3d}. {float(score):9.4f}  {p['source']}"
                   f"{f' (copy {copy})' if copy else ''}: {p['text'][:100]}")
    t = result.times
    plan = result.plan
    click.echo(f"ANN {1e3 * t['ann']:.2f} ms, after the ANN {1e3 * (t['total'] - t['ann']):.2f} "
               f"ms, {result.bytes_read / 1024:,.0f} KiB read"
               + ("" if not step else
                  (f", {result.prefetched} prefetched, hit rate "
                   f"{100 * result.hit_rate:.0f}%" if result.prefetched else
                   ", no prefetch")
                  + f" (eq. (4): budget {1e3 * plan['budget']:.2f} ms, overhead "
                  f"{1e3 * plan['overhead']:.2f} ms, threshold {plan['threshold']:.2f})"))
