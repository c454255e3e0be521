"""``hwgen dataset``: data sets that exist offline, written as ``.npy`` files for ``--base``."""

import click

from .. import checks
from ..cli_support import reports_errors
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
    """scikit-learn's digits (1,597 base vectors; the last 200 stay queries) replicated with
    noise, as the Chameleon paper builds its SYN data sets from SIFT: integer vectors of signed
    8-bit range, 64 dimensions."""
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
