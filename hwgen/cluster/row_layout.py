"""The payload of a kernel's row stream and the value range of an element shape: one
definition for the kernels' ports (:class:`hwgen.cluster.compute.RowPort`), the packet adapters'
formats (:class:`hwgen.cluster.adapter.RowFormat`) and the layers golden's range checks."""

from amaranth.hdl import Shape, unsigned
from amaranth.lib import data

__all__ = ["row_layout", "shape_range"]


def row_layout(field, shape, lanes, *, array=True, extra=(), count_bits=0, last_row=False):
    """``StructLayout``: ``field`` (``lanes`` elements of ``shape``, or one plain ``shape``
    without ``array``), each ``(name, shape)`` of ``extra`` as ``lanes`` elements, ``count``
    (``count_bits`` > 0), ``last_row`` (1 bit), ``last`` (TLAST, 1 bit), in this order."""
    fields = {field: data.ArrayLayout(shape, lanes) if array else shape}
    for name, s in extra:
        fields[name] = data.ArrayLayout(s, lanes)
    if count_bits:
        fields["count"] = unsigned(count_bits)
    if last_row:
        fields["last_row"] = 1
    fields["last"] = 1
    return data.StructLayout(fields)


def shape_range(shape):
    """``(lo, hi)``: the integers a value of ``shape`` (an Amaranth shape-castable) holds."""
    s = Shape.cast(shape)
    if s.signed:
        return -(1 << (s.width - 1)), (1 << (s.width - 1)) - 1
    return 0, (1 << s.width) - 1
