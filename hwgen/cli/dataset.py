"""``hwgen dataset``: data sets that exist offline, written as ``.npy`` files for ``--base``."""

import click

from .. import checks
from ..cli_support import log as _log
from ..cli_support import reports_errors
from ..datasets import SYN_DIMS
from .common import k_option
from .common import seed as _seed

__all__ = ["dataset"]


@click.group()
def dataset():
    """Data sets that exist offline, written as .npy files for --base."""


@dataset.command("digits-syn")
@click.option("--vectors", type=int, default=1_000_000, show_default=True,
              help="At least this many vectors (whole copies of the base).")
@click.option("--noise", type=int, default=3, show_default=True,
              help="Uniform integer noise -N..N per component of each copy.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--out", "out_path", required=True, type=click.Path(dir_okay=False),
              help="The .npy file to write (int16 vectors).")
@reports_errors
def dataset_digits_syn(vectors, noise, seed, out_path):
    """scikit-learn's digits (1,597 base vectors; the last 200 stay queries), noisy copies of
    every vector to reach a count: integer vectors of signed 8-bit range, 64 dimensions. A
    scale test (each vector has hundreds of near-copies, so recall is low); the paper's SYN
    sets widen vectors instead: ``dataset syn-512`` / ``syn-1024``."""
    import numpy as np
    from ..datasets import digits, replicated
    from ..vecsearch.node_model import QUERY_POOL
    checks.at_least("vectors", vectors, 1, 100_000_000)
    checks.at_least("noise", noise, 0, 127)
    _seed(seed)
    checks.output_file("out", out_path)
    base = digits()[0][:-QUERY_POOL]
    x = replicated(base, -(-vectors // len(base)), noise=noise, seed=seed).astype(np.int16)
    np.save(out_path, x)
    click.echo(f"{out_path}: {x.shape[0]:,} vectors of {x.shape[1]} dimensions (int16)")


@dataset.command("ralm-keys")
@click.option("--tokens", type=int, default=1_000_000, show_default=True,
              help="Keys in the base: one per token of the corpus outside its held-out "
                   "documents.")
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False),
              help="Folder receiving base.npy, base_int8.npy, values.npy, queries.npy, "
                   "queries_int8.npy, gt.npy and meta.json (a finished folder is reused).")
@click.option("--corpus", default="all+pysource", show_default=True,
              help="Offline corpora in order (as `hwgen espn index --corpus`).")
@click.option("--queries", type=int, default=1000, show_default=True,
              help="Query keys drawn from the held-out documents' tokens.")
@k_option(100, "Exact neighbours per query in gt.npy.")
@click.option("--seed", type=int, default=0, show_default=True)
@reports_errors
def dataset_ralm_keys(tokens, out_dir, corpus, queries, k, seed):
    """SmolLM2-135M's kNN-LM keys (576-d, the state before the LM head) of the offline corpora,
    float32 and the node's int8, with held-out query keys and exact ground truth: a real
    retrieval data set (one document in ten held out; resumable, cached)."""
    from ..ralm.keys import build_ralm_keys
    _seed(seed)
    meta = build_ralm_keys(out_dir, tokens, corpus=corpus, queries=queries, gt_k=k, seed=seed,
                           log=_log)
    mix = ", ".join(f"{c} {n:,}" for c, n in sorted(meta["mix"].items(), key=lambda i: -i[1]))
    click.echo(f"{out_dir}: {meta['tokens']:,} keys of {meta['dim']} dimensions ({mix}); "
               f"{meta['queries']:,} held-out query keys, exact top-{meta['gt_k']}; "
               f"encoding {meta['build_seconds']:.0f} s, ground truth "
               f"{meta['gt_seconds']:.0f} s")


def _syn_command(name, dim):
    @dataset.command(name, help=f"{name.upper()} the paper's way: every vector widened to "
                     f"{dim} dimensions by replication (SIFT's 128 x {dim // 128} in the "
                     "paper), from the digits set (1,597 vectors and its 200 queries) or "
                     "your vectors.")
    @click.option("--from", "source", default="digits", show_default=True,
                  help="digits (scikit-learn's 1,597 base and 200 query vectors, 64-d) or a "
                       ".npy file of vectors of at most the target dimension.")
    @click.option("--queries", "queries_path", type=click.Path(dir_okay=False),
                  help="A .npy file of query vectors to widen the same way (with --from FILE).")
    @click.option("--out", "out_path", required=True, type=click.Path(dir_okay=False),
                  help="The .npy file to write; the widened queries go beside it as "
                       "NAME_queries.npy.")
    @reports_errors
    def command(source, queries_path, out_path):
        import numpy as np
        from ..datasets import digits, widened
        from ..errors import ConfigError
        from ..vecsearch.node_model import QUERY_POOL, load_vectors
        checks.output_file("out", out_path)
        if source == "digits":
            if queries_path is not None:
                raise ConfigError("queries", "the digits set brings its own queries; give "
                                  "--queries with --from FILE")
            x = digits()[0].astype(np.int16)
            base, queries = x[:-QUERY_POOL], x[-QUERY_POOL:]
        else:
            base = load_vectors(source, "from")
            queries = load_vectors(queries_path, "queries") if queries_path else None
        for what, v in (("from", base), ("queries", queries)):
            if v is not None and v.shape[1] > dim:
                raise ConfigError(what, f"holds {v.shape[1]}-d vectors: replication widens "
                                  f"to {dim}, it cannot narrow")
        if queries is not None and queries.shape[1] != base.shape[1]:
            raise ConfigError("queries", f"dimension {queries.shape[1]} differs from the "
                              f"base's {base.shape[1]}")
        out = widened(base, dim)
        np.save(out_path, out)
        lines = [f"{out_path}: {len(out):,} vectors of {dim} dimensions ({base.shape[1]}-d "
                 f"vectors x {dim / base.shape[1]:g} by replication, {out.dtype})"]
        if queries is not None:
            qpath = str(out_path)[:-4] + "_queries.npy" if str(out_path).endswith(".npy") \
                else str(out_path) + "_queries.npy"
            np.save(qpath, widened(queries, dim))
            lines.append(f"{qpath}: {len(queries):,} query vectors")
        for line in lines:
            click.echo(line)
    return command


for _name, _dim in SYN_DIMS.items():
    _syn_command(_name, _dim)
