"""Performance model of the ChamVS node: cycles per query from the structure of the hardware.

A query passes through three phases, which the node's ``stat_*`` counters measure:

``lut``
    From acceptance until channel 0's first code word enters the units: the LUT builder's
    latency (``lut_builder.performance``), the first LUT's 256 rows (``ceil(m / sub_par)``
    cycles each) and the chain of ``W / m`` units the LUT passes before channel 0 is ready.
``scan``
    The lists are scanned one after the other, one word per cycle per channel; list ``p+1``
    may start when its LUT is loaded (256 rows after the previous LUT, and only once a LUT
    buffer is free: two per unit) and list ``p`` has been scanned. This is the PQ decoding
    unit's own cycle model (:meth:`PQDecoderConfig.performance`) with one code per word.
``drain``
    The units' pipeline, then every L1 queue emits its survivors into the L2 queue (one item a
    cycle into an insertion queue, one every two cycles into a systolic one), the L2 queue sorts
    (systolic: ``k`` phases) and emits, and each result's id is fetched from memory (one read
    command every two cycles, plus the memory latency for the first).

:func:`project` applies the model to the paper's billion-vector data sets.
"""

from dataclasses import dataclass

import numpy as np

__all__ = ["query_cycles", "layout_query_cycles", "queue_items", "PAPER_DATASETS", "project"]

#: cycles between the last result of the L2 queue entering the id fetch and leaving the node,
#: beyond two cycles per result: reader command (5 cycles to AR), AXI latency of an ideal
#: memory, the reader's FIFO (5 cycles: its block RAM's read data are registered), FIFOs.
FETCH_LATENCY = 14


def queue_items(config, unit_items):
    """Items each L1 queue receives, from the valid codes each unit scanned."""
    if config.kselect_config().queues_per_stream == 1:
        return list(unit_items)
    return [q for n in unit_items for q in ((n + 1) // 2, n // 2)]


def query_cycles(config, words, unit_items, results):
    """Predicted cycles of one query.

    Parameters
    ----------
    config : ChamVSNodeConfig
    words : list of int
        Code words per probed list on the busiest channel, in probe order.
    unit_items : list of int
        Valid codes scanned by each PQ unit.
    results : int
        Results of the query (``min(k, candidates)``).

    Returns
    -------
    dict with ``lut``, ``scan``, ``drain`` and ``total`` cycles.
    """
    c = config
    builder = c.lut_config()
    lut = 256 * builder.steps + builder.latency + 2 + c.codes_per_word - 1
    unit = c.unit_config(True)
    scan = unit.performance(unit.workload(scans=words)).cycles - (unit.latency + 2) \
        - 256 * builder.steps
    ks = c.kselect_config()
    l1 = ks.l1
    survivors = sum(max(1, min(l1, n)) for n in queue_items(c, unit_items))
    systolic = ks.queue == "systolic"
    drain = (unit.latency + 2) + 2 + survivors * (2 if systolic else 1) \
        + (c.k if systolic else 2) + FETCH_LATENCY + 2 * results
    return {"lut": lut, "scan": scan, "drain": drain, "total": lut + scan + drain}


def layout_query_cycles(config, layout, probes, results):
    """:func:`query_cycles` of one query probing list ids ``probes`` of a node whose memory
    holds ``layout`` (:func:`~hwgen.vecsearch.layout.pack_index`): the busiest channel's words
    per list and the valid codes each unit scans."""
    cpw = config.codes_per_word
    count = np.asarray(layout.count)[np.asarray(probes, dtype=np.int64)]   # probes x channels
    words = np.maximum(1, -(-count // cpw)).max(axis=1).tolist()
    # codes lane l of a word scans in a segment of n codes: len(range(l, n, cpw))
    lanes = np.arange(cpw)
    per_unit = np.maximum(0, -(-(count[:, :, None] - lanes) // cpw)).sum(axis=0).reshape(-1)
    unit_items = [0] * config.units
    unit_items[:per_unit.size] = per_unit.tolist()
    return query_cycles(config, words, unit_items, results)


@dataclass(frozen=True)
class Dataset:
    """A data set of the paper (Table 3) and Chameleon's reported resources (Table 4)."""
    name: str
    vectors: int
    dim: int
    m: int
    nlist: int = 32768
    nprobe: int = 32
    k: int = 100
    id_bytes: int = 8
    #: Chameleon's U250 utilisation (Table 4): LUT, FF, BRAM, URAM, DSP percent
    chameleon_percent: tuple = ()


PAPER_DATASETS = (
    Dataset("SIFT", 10 ** 9, 128, 16, chameleon_percent=(25.3, 16.2, 13.7, 4.4, 12.2)),
    Dataset("Deep", 10 ** 9, 96, 16, chameleon_percent=(23.7, 15.4, 13.0, 4.4, 10.4)),
    Dataset("SYN-512", 10 ** 9, 512, 32, chameleon_percent=(23.2, 15.5, 23.2, 4.4, 8.4)),
    Dataset("SYN-1024", 10 ** 9, 1024, 64, chameleon_percent=(28.0, 19.0, 35.7, 4.4, 11.9)),
)


def project(dataset, board="u250", clock_mhz=None):
    """Cycles and queries per second of one query on nodes of ``board`` holding the data set.

    The database is split over as many nodes as its PQ codes and ids need (each list shared
    by all nodes, the paper's first scheme); every node scans its share of the ``nprobe``
    lists in parallel, so a query takes one node's time. Lists are taken as equal in size.
    """
    from ..boards import load_board
    from .node import ChamVSNodeConfig
    b = load_board(board)
    mem = b.primary_memory
    cfg = ChamVSNodeConfig(board=board, dim=dataset.dim, m=dataset.m, nlist=dataset.nlist,
                           nprobe_max=dataset.nprobe, k=dataset.k,
                           id_bits=8 * dataset.id_bytes)
    bytes_total = dataset.vectors * (dataset.m + dataset.id_bytes)
    nodes = max(1, -(-bytes_total // int(mem.total_capacity_gib * (1 << 30))))
    per_list = dataset.vectors / dataset.nlist / nodes
    per_channel = per_list / cfg.n_channels
    words = int(np.ceil(per_channel / cfg.codes_per_word))
    unit_items = [int(per_channel / cfg.codes_per_word * dataset.nprobe)] * cfg.units
    cycles = query_cycles(cfg, [words] * dataset.nprobe, unit_items, dataset.k)
    clock = clock_mhz or b.kernel_clock_mhz
    return {"dataset": dataset.name, "nodes": nodes, "units": cfg.units,
            "words_per_list_channel": words, "cycles": cycles["total"],
            "scan_share": cycles["scan"] / cycles["total"], "clock_mhz": clock,
            "latency_ms": cycles["total"] / (clock * 1e3),
            "qps": clock * 1e6 / cycles["total"]}
