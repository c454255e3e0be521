"""Closed-form cycle model of the I-BERT matrix kernels (Linear, attention dot product,
softmax x V), at full input rate and an always-ready output (``hwgen sim --stall 0``).

Each function returns a dictionary:

``cycles_per_row``
    Steady-state cycles per output row (``matrix_interval / M``).
``matrix_interval``
    Cycles between the starts of consecutive matrices of the same shape streamed back to back.
``cycles_per_matrix``
    One matrix alone: from its first input beat to its last output beat, as ``hwgen sim``'s
    ``cycles`` measures it.
``cycles``
    The same figure under the name every accelerator's cycle model gives its whole workload
    (:class:`hwgen.contract.Performance`).
``latency_cycles``
    From the first beat of the model's ``latency_from`` input to the first output beat.

The constants come from the pipelines: a result leaves the output FIFO
(``SyncFIFOBuffered``) two cycles after entering it; the matrix kernels' datapaths take
``latency`` cycles from a group's last step to the result (``Config.latency``); the
attention kernels' serializer writes result ``k`` of a group ``k + 1`` cycles after that.
``tests/test_ibert_matrix.py`` checks every formula against simulation.
"""

from .matrix_common import ceil_div

__all__ = ["linear_cycles", "attn_dot_cycles", "softmax_matmul_cycles"]

#: Output FIFO: a result written in cycle t is valid at the output in cycle t + 2.
FIFO = 2


def linear_cycles(cfg, rows=None):
    """:class:`~hwgen.ibert.linear.Linear` with ``rows`` rows (M).

    A row is ``S = ceil(K / pes)`` input beats; it is computed in ``G = N / tiles`` groups of
    ``S`` cycles, rows back to back (double-buffered rows). The first row starts once loaded
    (``S`` cycles); a group's result enters the FIFO ``latency`` cycles after its last step.

    ``cycles_per_matrix = S + M * G * S + latency + 2``, ``matrix_interval = M * G * S``.
    """
    s, g, lat = cfg.steps, cfg.groups, cfg.latency
    out = {"cycles_per_row": g * s, "latency_cycles": 2 * s + lat + FIFO - 1,
           "macs_per_cycle": cfg.tiles * cfg.pes}
    if rows:
        out["matrix_interval"] = rows * g * s
        out["cycles_per_matrix"] = out["cycles"] = s + rows * g * s + lat + FIFO
    return out


def attn_dot_cycles(cfg, m=None, m_q=None):
    """:class:`~hwgen.ibert.attn_dot.AttnDot` for one head with ``m`` rows of K (M_k,
    default ``max_len``) and ``m_q`` rows of Q (default M_k).

    K loads one row per cycle and is padded to ``Mp = pes * R`` rows, ``R = ceil(M_k / pes)``
    (the padding costs one cycle per row); each Q row then takes ``R`` rounds of ``head_dim``
    cycles; the last round's ``n = M_k - (R - 1) * pes`` scores leave one per cycle.

    ``cycles_per_matrix = Mp + M_q * R * d + n + latency + 2``, ``matrix_interval = M_q * R *
    d`` (the next head's K, ``Mp <= R * d`` cycles, loads while this head is computed).
    """
    mk = m or cfg.max_len
    mq = m_q or mk
    d, p = cfg.head_dim, cfg.pes
    r = ceil_div(mk, p)
    padded = r * p
    n_last = mk - (r - 1) * p
    serial = cfg.latency + FIFO        # last step -> first score of the round at the output
    return {"cycles_per_row": r * d, "matrix_interval": mq * r * d,
            "cycles_per_matrix": padded + mq * r * d + n_last + serial,
            "cycles": padded + mq * r * d + n_last + serial,
            "latency_cycles": padded + d + serial, "macs_per_cycle": p}


def softmax_matmul_cycles(cfg, m=None, m_q=None):
    """:class:`~hwgen.ibert.softmax_matmul.SoftmaxMatmul` for one head with ``m`` rows of V
    (M_k, default ``max_len``) and ``m_q`` rows of P (default M_k).

    A row of P is ``B = ceil(M_k / pes)`` beats; rows are computed in ``G = ceil(M_q / pes)``
    groups, the last of ``n = M_q - (G - 1) * pes`` rows. A full group loads in ``pes * B >=
    M_k`` cycles and computes in ``M_k``: loading sets the pace, except that the last group
    (``n * B`` beats) may wait for the compute of the one before it.

    ``cycles_per_matrix = max(M_q * B, (M_q - n) * B + M_k) + M_k + n + latency + 2``,
    ``matrix_interval = (M_q - n) * B + max(n * B, M_k)``.

    Valid while a group's rows leave no faster than it computes (``min(pes, M_q) <= M_k``,
    always true for M_q = M_k); outside that the serializer sets the pace and ValueError is
    raised.
    """
    mk = m or cfg.max_len
    mq = m_q or mk
    p = cfg.pes
    if min(p, mq) > mk:
        raise ValueError(f"the model needs min(pes, M_q) <= M_k (pes={p}, M_q={mq}, M_k={mk})")
    b = ceil_div(mk, p)
    groups = ceil_div(mq, p)
    n_last = mq - (groups - 1) * p
    n_first = min(p, mq)
    serial = cfg.latency + FIFO
    last_start = max(mq * b, (mq - n_last) * b + mk)
    interval = (mq - n_last) * b + max(n_last * b, mk)
    return {"cycles_per_row": interval / mq, "matrix_interval": interval,
            "cycles_per_matrix": last_start + mk + n_last + serial,
            "cycles": last_start + mk + n_last + serial,
            "latency_cycles": max(n_first * b, mk) + mk + serial,
            "macs_per_cycle": p * cfg.head_dim}
