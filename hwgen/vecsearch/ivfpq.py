"""IVF-PQ indexes trained by faiss, made integer for the hardware.

ChamVS hardware works on integers: vector components are ``elem_bits``-bit signed integers, and
the coarse (IVF) and PQ centroids it holds are integers too. :func:`train_integer_ivfpq` trains a
faiss ``IndexIVFPQ`` (by residual, 8-bit codes) on integer data, rounds the trained coarse and
PQ centroids to integers, writes them back into the faiss index, and only then encodes the
database. faiss and hwgen's golden model therefore describe the same index, and with small
integers faiss's float32 arithmetic is exact, so its distances must equal ours bit for bit.
"""

from dataclasses import dataclass

import numpy as np

from ..errors import ConfigError, ToolError
from ..lib.quant import quantize
from .golden import KSUB

__all__ = ["faiss_index", "IntegerIVFPQ", "train_integer_ivfpq", "quantize_vectors", "import_faiss"]


def import_faiss():
    """The ``faiss`` module; :class:`~hwgen.errors.ToolError` saying how to install it if
    missing."""
    try:
        import faiss
    except ImportError:
        raise ToolError("faiss is not installed: pip install faiss-cpu (make setup does)") \
            from None
    return faiss


def quantize_vectors(x, elem_bits, inv_scale=None):
    """Map float vectors to signed ``elem_bits`` integers: ``round(x * inv_scale)``, clipped to
    ``-2**(elem_bits-1) .. 2**(elem_bits-1) - 1``.

    :func:`hwgen.lib.quant.quantize` with ``bits=elem_bits, symmetric=False`` and the
    multiplier ``inv_scale`` (integers per unit: the reciprocal of the step ``scale``), which
    defaults to ``"peak"``: the largest factor that keeps ``max |x|`` representable,
    ``(2**(elem_bits-1) - 1) / max|x|``. Returns ``(int64 array, inv_scale)``; apply the same
    ``inv_scale`` to queries.
    """
    q = quantize(x, inv_scale="peak" if inv_scale is None else inv_scale, bits=elem_bits,
                 symmetric=False)
    return q.values.astype(np.int64), q.inv_scale if inv_scale is None else inv_scale


@dataclass
class IntegerIVFPQ:
    """A trained integer IVF-PQ index.

    Attributes
    ----------
    index : faiss.IndexIVFPQ
        The faiss index holding the rounded centroids and the encoded database
        (``use_precomputed_table = -1``: residual tables computed per list, as ChamVS does).
    coarse : (nlist, D) int64
    pq_centroids : (m, 256, dsub) int64
    list_ids : list of (n_l,) int64
    list_codes : list of (n_l, m) uint8
    """
    index: object
    elem_bits: int
    coarse: np.ndarray
    pq_centroids: np.ndarray
    list_ids: list
    list_codes: list

    @property
    def dim(self):
        """Vector dimension D."""
        return self.coarse.shape[1]

    @property
    def m(self):
        """PQ sub-spaces: bytes per code."""
        return self.pq_centroids.shape[0]

    @property
    def nlist(self):
        """Number of IVF lists."""
        return self.coarse.shape[0]

    def probe(self, queries, nprobe):
        """faiss's coarse quantizer: the ``nprobe`` nearest lists of each query, nearest first."""
        _, lists = self.index.quantizer.search(np.asarray(queries, dtype=np.float32), nprobe)
        return lists.astype(np.int64)


def train_integer_ivfpq(data, *, nlist, m, elem_bits=8, seed=1234, train_size=None):
    """Train faiss IVF-PQ on integer vectors and make all its centroids integer.

    Parameters
    ----------
    data : (n, D) integers in the signed ``elem_bits`` range
    nlist, m : int
        IVF lists and PQ sub-spaces (``D % m == 0``).
    """
    faiss = import_faiss()
    data = np.asarray(data)
    n, dim = data.shape
    lo, hi = -(1 << (elem_bits - 1)), (1 << (elem_bits - 1)) - 1
    if data.min() < lo or data.max() > hi:
        raise ConfigError("elem_bits", f"data outside the signed {elem_bits}-bit range",
                          value=elem_bits)
    if dim % m:
        raise ConfigError("m", f"must divide the dimension {dim}", value=m)
    if n < KSUB:     # checked before nlist: no nlist helps a base this small
        raise ConfigError("base", f"holds {n} vectors; 8-bit product quantisation trains "
                          f"{KSUB} centroids per sub-space and needs at least {KSUB}")
    if nlist < 1 or nlist > n:
        raise ConfigError("nlist", f"must be in 1..{n} (number of vectors)", value=nlist)
    xb = data.astype(np.float32)
    quantizer = faiss.IndexFlatL2(dim)
    index = faiss.IndexIVFPQ(quantizer, dim, nlist, m, 8)
    index.by_residual = True
    for cp in (index.cp, index.pq.cp):
        cp.seed = seed
        cp.min_points_per_centroid = 1    # small data sets are fine; silence faiss's warning
    rng = np.random.default_rng(seed)
    train = xb if train_size is None or train_size >= n else \
        xb[rng.choice(n, size=train_size, replace=False)]
    index.train(train)

    coarse = np.clip(np.rint(quantizer.reconstruct_n(0, nlist)), lo, hi).astype(np.int64)
    quantizer.reset()
    quantizer.add(coarse.astype(np.float32))
    dsub = dim // m
    pq = faiss.vector_to_array(index.pq.centroids).reshape(m, KSUB, dsub)
    pq = np.clip(np.rint(pq), -(1 << elem_bits), (1 << elem_bits) - 1).astype(np.int64)
    faiss.copy_array_to_vector(pq.astype(np.float32).ravel(), index.pq.centroids)
    index.use_precomputed_table = -1
    index.add(xb)

    invlists = index.invlists
    ids, codes = [], []
    for lst in range(nlist):
        size = invlists.list_size(lst)
        if size:
            ids.append(faiss.rev_swig_ptr(invlists.get_ids(lst), size).astype(np.int64).copy())
            codes.append(faiss.rev_swig_ptr(invlists.get_codes(lst), size * index.code_size)
                         .reshape(size, index.code_size).copy())
        else:
            ids.append(np.zeros(0, dtype=np.int64))
            codes.append(np.zeros((0, m), dtype=np.uint8))
    return IntegerIVFPQ(index, elem_bits, coarse, pq, ids, codes)


def faiss_index(coarse, pq_centroids, list_ids, list_codes):
    """A faiss ``IndexIVFPQ`` holding exactly a node index: the integer coarse centroids
    (nlist, D), the PQ centroids (m, 256, D/m), and per list its ids and m-byte codes (the
    lists of one or several shards, concatenated). It searches what the node searches, so
    CPU faiss can be timed on the same index and nprobe."""
    faiss = import_faiss()
    coarse = np.asarray(coarse, dtype=np.float32)
    pq_centroids = np.asarray(pq_centroids, dtype=np.float32)
    nlist, dim = coarse.shape
    m = pq_centroids.shape[0]
    quantizer = faiss.IndexFlatL2(dim)
    quantizer.add(coarse)
    index = faiss.IndexIVFPQ(quantizer, dim, nlist, m, 8)
    index.by_residual = True
    faiss.copy_array_to_vector(pq_centroids.ravel(), index.pq.centroids)
    index.is_trained = True
    index.use_precomputed_table = -1
    for lst, (ids, codes) in enumerate(zip(list_ids, list_codes)):
        if len(ids):
            ids = np.ascontiguousarray(ids, dtype=np.int64)
            codes = np.ascontiguousarray(codes, dtype=np.uint8)
            index.invlists.add_entries(lst, len(ids), faiss.swig_ptr(ids),
                                       faiss.swig_ptr(codes))
    index.ntotal = int(sum(len(i) for i in list_ids))
    return index


def distance_table(index, residual):
    """faiss's PQ distance table of one residual (``ProductQuantizer.compute_distance_table``)."""
    faiss = import_faiss()
    pq = index.pq
    table = np.zeros(pq.M * pq.ksub, dtype=np.float32)
    x = np.ascontiguousarray(residual, dtype=np.float32)
    pq.compute_distance_table(faiss.swig_ptr(x), faiss.swig_ptr(table))
    return table.reshape(pq.M, pq.ksub)
