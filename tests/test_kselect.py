"""K-selection: golden ordering, the hierarchical model, queue sizing, stimulus coverage."""

from fractions import Fraction

import numpy as np
import pytest
from click.testing import CliRunner

from hwgen import registry
from hwgen.cli import main
from hwgen.errors import ConfigError
from hwgen.vecsearch import golden
from hwgen.vecsearch.bench import queue_overflow_exact, wilson_interval
from hwgen.vecsearch.hier_pq import HierPQModel
from hwgen.vecsearch.queues import QueueModel
from hwgen.vecsearch.sizing import binomial_cdf, l1_queue_length, sizing_table


def test_topk_orders_by_distance_then_id():
    d, i = golden.topk([5, 3, 5, 1, 3, 9], [7, 2, 1, 8, 0, 3], 4)
    assert d.tolist() == [1, 3, 3, 5] and i.tolist() == [8, 0, 2, 1]
    d, i = golden.topk([4, 2], [1, 1], 5)          # fewer than k: all of them
    assert d.tolist() == [2, 4] and i.tolist() == [1, 1]


def test_l1_queues_alternate_items():
    queues = golden.l1_queues([([1, 2, 3, 4, 5], [10, 11, 12, 13, 14])], 2)
    assert [q[1].tolist() for q in queues] == [[10, 12, 14], [11, 13]]


def test_hier_topk_exact_with_full_queues_and_truncates_otherwise():
    rng = np.random.default_rng(0)
    streams = [(rng.integers(0, 1000, 50), np.arange(50) + 50 * s) for s in range(4)]
    exact = golden.topk(np.concatenate([s[0] for s in streams]),
                        np.concatenate([s[1] for s in streams]), 20)
    full = golden.hier_topk(streams, 20, 20)
    assert all(np.array_equal(a, b) for a, b in zip(full, exact))
    # all of the best items in stream 0: an L1 queue of 3 keeps only 3 of them
    streams[0] = (np.arange(50), streams[0][1])
    cut = golden.hier_topk(streams, 20, 3)
    assert cut[0][:3].tolist() == [0, 1, 2] and cut[0][3] > 2


def test_overflow_count_equals_golden_comparison():
    rng = np.random.default_rng(1)
    for _ in range(300):
        streams, k, n = int(rng.integers(1, 6)), int(rng.integers(1, 12)), int(rng.integers(1, 9))
        d = rng.integers(0, 20, size=(1, streams * n))
        i = rng.permutation(streams * n)[None]
        queue_of = (np.arange(streams * n) % streams)[None]
        l1 = int(rng.integers(1, k + 1))
        fast = queue_overflow_exact(d, i, queue_of, k, l1)[0]
        per_stream = [(d[0][queue_of[0] == s], i[0][queue_of[0] == s]) for s in range(streams)]
        hier = golden.hier_topk(per_stream, k, l1)
        exact = golden.topk(d[0], i[0], k)
        assert fast == (np.array_equal(hier[0], exact[0]) and np.array_equal(hier[1], exact[1]))


def test_sizing_paper_values():
    assert [l1_queue_length(100, s) for s in (4, 8, 16, 32)] == [38, 23, 15, 10]
    assert [l1_queue_length(100, s, criterion="per-queue") for s in (4, 8, 16, 32)] == \
        [35, 21, 12, 8]


@pytest.mark.parametrize("k", [1, 2, 10, 37, 100])
@pytest.mark.parametrize("streams", [1, 2, 3, 7, 16, 32])
@pytest.mark.parametrize("target", [0.5, 0.9, 0.99, 0.999])
def test_sizing_is_the_smallest_length_meeting_the_target(k, streams, target):
    for criterion in ("all-queues", "per-queue"):
        length = l1_queue_length(k, streams, target, criterion)
        assert 0 <= length <= k
        power = streams if criterion == "all-queues" else 1
        p = Fraction(1, streams)
        assert binomial_cdf(k, p, length) ** power >= Fraction(target)
        if length > 0 and streams > 1:
            assert binomial_cdf(k, p, length - 1) ** power < Fraction(target)
    assert l1_queue_length(k, streams, target, "per-queue") <= l1_queue_length(k, streams, target)
    assert l1_queue_length(k, streams, min(target + 0.0005, 1.0)) >= \
        l1_queue_length(k, streams, target)


def test_sizing_against_monte_carlo():
    """The binomial promise holds for random top-k placements (multinomial over queues)."""
    rng = np.random.default_rng(5)
    for k, streams in [(100, 16), (10, 8)]:
        length = l1_queue_length(k, streams)
        counts = rng.multinomial(k, [1 / streams] * streams, size=40000)
        exact = (counts.max(axis=1) <= length).mean()
        lo, hi = wilson_interval(round(exact * 40000), 40000)
        assert hi >= 0.99


@pytest.mark.parametrize("args", [(0, 4), (10, 0), (10, 4, 1.5), (10, 4, 0.9, "some")])
def test_sizing_rejects_bad_input(args):
    with pytest.raises(ConfigError):
        l1_queue_length(*args)


def test_sizing_table_and_cli():
    rows = sizing_table(100, [16])
    assert rows[0]["l1_len"] == 15 and rows[0]["l1_entries"] == 240
    out = CliRunner().invoke(main, ["size-queues", "--k", "100", "--streams", "16"]).output
    line = [l for l in out.splitlines() if l.split() and l.split()[0] == "16"][0]
    assert line.split()[1] == "15"


def test_hier_config_defaults_from_sizing():
    cls = registry.get("hier-pq").config
    assert cls(streams=8, k=50, queue="systolic").l1 == l1_queue_length(50, 16)  # two per stream
    assert cls(streams=8, k=50).l1 == l1_queue_length(50, 8)         # default: insert, one
    assert cls(streams=8, k=50, l1_len=7).l1 == 7
    with pytest.raises(ConfigError, match="l1_len=51"):
        cls(streams=8, k=50, l1_len=51)
    with pytest.raises(ConfigError, match="queue='heap'"):
        cls(queue="heap")


def test_queue_stimulus_covers_the_hard_cases():
    cfg = registry.get("insert-pq").config(k=37)
    stim = QueueModel.stimulus(cfg, 2500, np.random.default_rng(101))
    lengths = [len(d) for d, _ in stim["queries"]]
    assert 1 in lengths and any(1 < n < 37 for n in lengths) and any(n > 37 for n in lengths)
    assert any(len(set(d.tolist())) < len(d) for d, _ in stim["queries"])     # distance ties


def test_hier_stimulus_exercises_truncation():
    """Some expected results differ from the exact top-k, so the RTL tests check truncation."""
    cfg = registry.get("hier-pq").config(streams=3, k=5, l1_len=2, queue="systolic")
    stim = HierPQModel.stimulus(cfg, 3000, np.random.default_rng(7))
    differ = 0
    for streams in stim["queries"]:
        hier = golden.hier_topk(streams, cfg.k, cfg.l1, cfg.queues_per_stream)
        exact = golden.topk(np.concatenate([s[0] for s in streams]).astype(np.int64),
                            np.concatenate([s[1] for s in streams]).astype(np.int64), cfg.k)
        differ += not np.array_equal(hier[1], exact[1])
    assert differ > 0
