"""Stream payload layouts shared by the ChamVS blocks.

A LUT travels as 256 rows; row ``r`` holds, for every sub-space ``i``, the distance from the
query's sub-vector ``i`` to centroid ``r`` of that sub-space. The LUT builder produces rows in
this layout and the PQ decoding units consume and forward them unchanged.
"""

from amaranth.hdl import signed, unsigned
from amaranth.lib import data

__all__ = ["lut_row", "pq_code", "distance", "pq_centroid", "query_pair", "item"]


def lut_row(m, lut_bits):
    """One LUT row: ``value[i]`` for sub-spaces ``i = 0..m-1``."""
    return data.StructLayout({"value": data.ArrayLayout(unsigned(lut_bits), m)})


def pq_code(m, tag_bits):
    """One PQ-coded vector: ``code[i]`` for every sub-space, an opaque tag, end-of-scan flag."""
    return data.StructLayout({
        "code": data.ArrayLayout(unsigned(8), m),
        "tag": unsigned(tag_bits),
        "last": unsigned(1),
    })


def distance(dist_bits, tag_bits):
    """An approximate distance with the tag of the vector it belongs to."""
    return data.StructLayout({
        "dist": unsigned(dist_bits),
        "tag": unsigned(tag_bits),
        "last": unsigned(1),
    })


def pq_centroid(dsub, elem_bits):
    """One PQ centroid (sub-space ``i``, index ``r``): ``dsub`` signed residual components.

    Residual components span twice the data range, hence ``elem_bits + 1`` bits.
    """
    return data.StructLayout({"elem": data.ArrayLayout(signed(elem_bits + 1), dsub)})


def query_pair(dim, elem_bits):
    """A query vector and the coarse centroid of the IVF list it probes."""
    return data.StructLayout({
        "query": data.ArrayLayout(signed(elem_bits), dim),
        "centroid": data.ArrayLayout(signed(elem_bits), dim),
    })


def item(dist_bits, id_bits, markers=False):
    """A (distance, id) item of a priority queue; ``last`` closes a query.

    With ``markers``, an ``empty`` flag marks a beat that carries no item, only ``last``: a
    query to which a stream contributed nothing (used inside the hierarchical queue).
    """
    fields = {"dist": unsigned(dist_bits), "id": unsigned(id_bits), "last": unsigned(1)}
    if markers:
        fields["empty"] = unsigned(1)
    return data.StructLayout(fields)
