"""Golden model of the packet adapters (:mod:`hwgen.cluster.gateware.adapter`): rows to the
bytes of a :class:`~hwgen.cluster.spec.adapter.RowFormat` and back, rows to packets of at most
``max_packet_bytes`` and back (per source), and rows to a row stream's beats and back."""

import numpy as np

from ..spec.packet import Packet

__all__ = ["encode_rows", "decode_bytes", "rows_to_packets", "packets_to_rows", "row_beats",
           "beats_to_rows"]


def encode_rows(rows, fmt):
    """Bytes of ``rows`` (sequences of integers in ``fmt``'s range): each element
    ``elem_bits`` wide (two's complement), little-endian, rows concatenated."""
    mask = (1 << fmt.elem_bits) - 1
    return b"".join((int(v) & mask).to_bytes(fmt.elem_bytes, "little")
                    for row in rows for v in row)


def decode_bytes(body, fmt):
    """Elements of ``body`` (whole elements only), truncated to ``field_bits`` and read
    signed or unsigned as ``fmt`` says (int64 array)."""
    n = len(body) // fmt.elem_bytes
    words = [int.from_bytes(body[k * fmt.elem_bytes:(k + 1) * fmt.elem_bytes], "little")
             for k in range(n)]
    b = fmt.bits
    vals = [w & ((1 << b) - 1) for w in words]
    if fmt.signed:
        vals = [v - (1 << b) if v >> (b - 1) else v for v in vals]
    return np.array(vals, dtype=np.int64)


def rows_to_packets(rows, fmt, dest, src, max_packet_bytes):
    """What :class:`RowToPackets` sends: per row, its bytes (:func:`encode_rows`) cut into
    packets of ``max_packet_bytes`` (the last one shorter)."""
    out = []
    for row in rows:
        body = encode_rows([row], fmt)
        out += [Packet(dest, src, body[k:k + max_packet_bytes])
                for k in range(0, len(body), max_packet_bytes)]
    return out


def packets_to_rows(packets, formats):
    """What :class:`PacketsToRows` makes of ``packets``: ``({tid: [row arrays]}, dropped)``
    for ``formats`` = ``{tid: RowFormat}``: each source's payload bytes concatenated in order
    and cut into rows of ``row_elems`` elements (trailing bytes of an unfinished row are left
    out), or with ``row_elems = 0`` one row per packet (whole elements); packets of other TIDs
    are dropped and counted."""
    streams = {tid: bytearray() for tid in formats}
    rows = {tid: [] for tid in formats}
    dropped = 0
    for p in packets:
        fmt = formats.get(p.src)
        if fmt is None:
            dropped += 1
        elif fmt.row_elems:
            streams[p.src] += p.payload
        elif len(p.payload) % fmt.elem_bytes:
            raise ValueError(f"a packet from {p.src} ends inside an element")
        else:
            rows[p.src].append(decode_bytes(p.payload, fmt))
    for tid, fmt in formats.items():
        if not fmt.row_elems:
            continue
        n = len(streams[tid]) // fmt.row_bytes
        body = bytes(streams[tid])
        rows[tid] += [decode_bytes(body[k * fmt.row_bytes:(k + 1) * fmt.row_bytes], fmt)
                      for k in range(n)]
    return rows, dropped


def row_beats(rows, fmt, rng=None):
    """Kernel-side beats of ``rows`` in ``fmt``'s layout (:mod:`hwgen.ibert.stream_rows`):
    padding lanes 0 (random with ``rng``: inputs whose padding the adapter ignores), ``count``
    per beat, ``last_row`` on every beat of each ``rows``-th row (random with ``rng``)."""
    beats = []
    lo, hi = fmt.value_range()
    for r, row in enumerate(rows):
        row = [int(v) for v in row]
        nb = -(-len(row) // fmt.lanes)
        for k in range(nb):
            vals = row[k * fmt.lanes:(k + 1) * fmt.lanes]
            n = len(vals)
            pad = fmt.lanes - n
            vals += [int(v) for v in rng.integers(lo, hi, pad, endpoint=True)] if rng is not None \
                else [0] * pad
            beat = {fmt.field: vals if fmt.array else vals[0]}
            if fmt.count:
                beat["count"] = n
            if fmt.rows:
                beat["last_row"] = int(rng.integers(2)) if rng is not None \
                    else int(r % fmt.rows == fmt.rows - 1)
            beat["last"] = int(k == nb - 1)
            beats.append(beat)
    return beats


def beats_to_rows(beats, fmt):
    """Rows of kernel-side beats (inverse of :func:`row_beats`): the elements of each beat
    (``count`` of them with ``count``, else ``lanes``, or :attr:`RowFormat.tail` on a final
    beat), a row ending at ``last``."""
    rows, cur = [], []
    for beat in beats:
        vals = beat[fmt.field] if fmt.array else [beat[fmt.field]]
        n = beat["count"] if fmt.count and beat["last"] else \
            (fmt.tail if beat["last"] else fmt.lanes)
        cur += list(vals[:n])
        if beat["last"]:
            rows.append(np.array(cur, dtype=np.int64))
            cur = []
    return rows


# -- gateware --------------------------------------------------------------------------------
