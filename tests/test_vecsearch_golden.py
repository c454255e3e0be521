"""Golden models of ChamVS (hwgen.vecsearch.golden): hand-checked cases and agreement with faiss."""

import numpy as np
import pytest

from hwgen.vecsearch import golden

from conftest import requires_faiss


def test_build_lut_by_hand():
    # D = 4, m = 2, dsub = 2; centroid r of sub-space i is (r + i, -r)
    cents = np.zeros((2, 256, 2), dtype=np.int64)
    r = np.arange(256)
    cents[0, :, 0], cents[0, :, 1] = r, -r
    cents[1, :, 0], cents[1, :, 1] = r + 1, -r
    residual = np.array([3, -1, 0, 5])
    lut = golden.build_lut(residual, cents)
    assert lut.shape == (2, 256)
    assert lut[0, 0] == 3 * 3 + 1 * 1
    assert lut[0, 3] == 0 + (-1 + 3) ** 2
    assert lut[1, 2] == (0 - 3) ** 2 + (5 + 2) ** 2
    shifted = golden.build_lut(residual, cents, lut_shift=2, lut_bits=4)
    assert shifted[1, 2] == min((9 + 49) >> 2, 15) == 14
    assert shifted[0, 255] == 15          # (3-255)^2 + (255-1)^2 saturates
    assert golden.build_lut(residual, cents, lut_shift=3)[0, 0] == 10 >> 3


def test_pq_distances_by_hand():
    lut = np.arange(3 * 256).reshape(3, 256)
    codes = np.array([[0, 0, 0], [255, 1, 2], [7, 7, 7]], dtype=np.uint8)
    assert golden.pq_distances(codes, lut).tolist() == [0 + 256 + 512,
                                                         255 + 257 + 514,
                                                         7 + 263 + 519]


def test_bad_shapes_raise():
    with pytest.raises(ValueError, match=r"pq_centroids must have shape \(m, 256, dsub\)"):
        golden.build_lut(np.zeros(4), np.zeros((2, 255, 2)))
    with pytest.raises(ValueError, match=r"residual must have shape \(6,\), got \(5,\)"):
        golden.build_lut(np.zeros(5), np.zeros((2, 256, 3)))
    with pytest.raises(ValueError, match=r"codes must have shape \(n, 2\), got \(4, 3\)"):
        golden.pq_distances(np.zeros((4, 3)), np.zeros((2, 256)))
    with pytest.raises(ValueError, match="distances and ids must be 1-D arrays of the same "
                                         "length"):
        golden.topk([1, 2, 3], [1, 2], 2)                 # both 1-D, lengths differ
    with pytest.raises(ValueError, match="distances and ids must be 1-D"):
        golden.topk([[1, 2]], [[1, 2]], 2)                # same shape, not 1-D


@pytest.mark.parametrize("code", [256, -1])
def test_codes_outside_a_byte_raise(code):
    """A code of 256 (one past the last centroid) or -1 alone in an otherwise valid array."""
    codes = np.array([[0, 1], [code, 3]], dtype=np.int64)
    with pytest.raises(ValueError, match=r"^codes must be in 0\.\.255$"):
        golden.pq_distances(codes, np.zeros((2, 256)))


def test_integral_inputs_of_any_dtype_give_int64_results():
    """Inputs arrive as float arrays (integral values), narrow integers or lists: every result
    is int64 and equal to the int64 computation. In int8, 100 - (-100) would wrap; a float
    table would stay float."""
    c8 = np.full((1, 256, 1), -100, dtype=np.int8)
    lut = golden.build_lut(np.array([100], dtype=np.int8), c8)
    assert lut.dtype == np.int64 and (lut == 200 * 200).all()
    from_floats = golden.build_lut(np.array([100.0]), c8.astype(np.float64), lut_shift=2)
    assert from_floats.dtype == np.int64 and (from_floats == 200 * 200 >> 2).all()
    sat = golden.saturate_unsigned(np.array([70000, 3], dtype=np.int32), 16)
    assert sat.dtype == np.int64 and sat.tolist() == [65535, 3]
    assert golden.saturate_unsigned(np.array([2.0]), None).dtype == np.int64
    dist = golden.pq_distances(np.array([[1, 2]], dtype=np.uint8),
                               np.full((2, 256), 200, dtype=np.uint8))
    assert dist.dtype == np.int64 and dist.tolist() == [400]
    d, i = golden.topk(np.array([3.0, 1.0, 2.0]), np.array([7, 8, 9], dtype=np.uint8), 2)
    assert (d.dtype, i.dtype) == (np.int64, np.int64) and (d.tolist(), i.tolist()) == \
        ([1, 2], [8, 9])
    (qd, qi), = golden.l1_queues([(np.array([5, 4], dtype=np.uint8),
                                   np.array([1.0, 2.0]))], 1)
    assert (qd.dtype, qi.dtype) == (np.int64, np.int64)


def test_hier_topk_of_no_streams_is_empty():
    d, i = golden.hier_topk([], 4, 2)
    assert (d.shape, i.shape, d.dtype, i.dtype) == ((0,), (0,), np.int64, np.int64)


@pytest.mark.parametrize("m, lut_bits", [(1, 1), (7, 13), (16, 16), (64, 24), (64, 32)])
def test_distance_bits_never_overflow(m, lut_bits):
    bits = golden.distance_bits(m, lut_bits)
    assert m * ((1 << lut_bits) - 1) < (1 << bits)
    assert m * ((1 << lut_bits) - 1) >= (1 << (bits - 1))     # and is not wider than needed


def _digits(elem_bits=8):
    sklearn = pytest.importorskip("sklearn.datasets", reason="needs scikit-learn's digits")
    x = sklearn.load_digits().data.astype(np.int64)
    return x * 15 - 120          # 0..16 -> -120..120, signed 8-bit


@requires_faiss
@pytest.mark.parametrize("nlist, m", [(8, 16), (5, 8), (16, 32)])
def test_golden_equals_faiss_ivfpq(nlist, m):
    """With integer data and integer centroids written back into faiss, build_lut equals faiss's
    residual distance table and pq_distances equals faiss's search distances, exactly."""
    from hwgen.vecsearch import ivfpq
    x = _digits()
    idx = ivfpq.train_integer_ivfpq(x, nlist=nlist, m=m, elem_bits=8)
    assert idx.index.use_precomputed_table == -1 and idx.index.by_residual
    assert np.all(idx.pq_centroids == np.rint(idx.pq_centroids))
    queries = x[::97][:16]
    idx.index.nprobe = nlist
    dist, ids = idx.index.search(queries.astype(np.float32), len(x))
    lists = idx.probe(queries, nlist)
    compared = 0
    for qi, q in enumerate(queries):
        faiss_dist = dict(zip(ids[qi].tolist(), dist[qi].tolist()))
        assert len(faiss_dist) == len(x)
        for lst in lists[qi]:
            residual = q - idx.coarse[lst]
            lut = golden.build_lut(residual, idx.pq_centroids)
            table = ivfpq.distance_table(idx.index, residual)
            assert np.array_equal(lut, table.astype(np.int64))
            assert np.all(table == np.rint(table))
            ours = golden.pq_distances(idx.list_codes[lst], lut)
            theirs = [faiss_dist[i] for i in idx.list_ids[lst].tolist()]
            assert ours.tolist() == theirs
            compared += len(ours)
    assert compared == len(queries) * len(x)
    assert max(dist.max(), 0) < 2 ** 24       # float32 exact range: the comparison is exact


@requires_faiss
def test_faiss_agreement_detects_a_wrong_table():
    """The comparison above can fail: an off-by-one centroid changes faiss's table."""
    from hwgen.vecsearch import ivfpq
    x = _digits()
    idx = ivfpq.train_integer_ivfpq(x, nlist=4, m=8)
    residual = x[0] - idx.coarse[0]
    wrong = idx.pq_centroids.copy()
    wrong[3, 17, 0] += 1
    assert not np.array_equal(golden.build_lut(residual, wrong),
                              ivfpq.distance_table(idx.index, residual).astype(np.int64))
