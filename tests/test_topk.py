"""hwgen.lib.topk.merge_topk: the one merge of top-k lists (ChamVS coordinator, ESPN ANN)."""

import numpy as np

from hwgen.lib.topk import merge_topk


def test_smallest_first_ties_by_id_padding_dropped():
    d, i = merge_topk([([5, 9, 1], [3, 1, -1]), ([5, 2], [2, 8])], 3)
    assert d.tolist() == [2, 5, 5] and i.tolist() == [8, 2, 3]


def test_largest_first_keeps_the_value_type():
    s, i = merge_topk([(np.array([0.5, 0.9], np.float32), [7, 3]),
                       (np.array([0.9, 0.1], np.float32), [1, 4])], 3, largest=True)
    assert s.dtype == np.float32
    assert s.tolist() == [np.float32(0.9), np.float32(0.9), np.float32(0.5)]
    assert i.tolist() == [1, 3, 7]


def test_fewer_items_than_k_and_no_parts():
    d, i = merge_topk([([4], [0])], 5, dtype=np.int64)
    assert d.tolist() == [4] and i.tolist() == [0]
    d, i = merge_topk([], 5, dtype=np.int64)
    assert d.dtype == np.int64 and len(d) == len(i) == 0
