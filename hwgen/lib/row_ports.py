"""Row streams of chainable kernels: what the cluster asks of a kernel it chains.

A kernel the cluster can put in a chain (:mod:`hwgen.cluster.gateware.compute`) has a configuration that
is a :class:`RowKernel`: it describes its row streams as :class:`RowPort` objects, and answers
the cluster's timing question (:meth:`RowKernel.row_timing`) from its own cycle model. The
payload of a row stream is :func:`row_layout`: one definition for the kernels' ports, the
packet adapters' formats (:class:`hwgen.cluster.spec.adapter.RowFormat`) and the layers golden's
range checks (:func:`shape_range`).
"""

from dataclasses import dataclass, replace

from amaranth.hdl import Shape, unsigned
from amaranth.lib import data

__all__ = ["row_layout", "shape_range", "shape_holds", "RowPort", "RowKernel"]


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


def shape_holds(src, dst):
    """Whether element shape ``dst`` holds every value of ``src``."""
    s, d = Shape.cast(src), Shape.cast(dst)
    if s.signed and not d.signed:
        return False
    return d.width >= s.width + int(d.signed and not s.signed)


@dataclass(frozen=True)
class RowPort:
    """One row stream of a kernel (see the module docstring's table)."""
    member: str                 # kernel member (``i_x``)
    field: str                  # element field of the payload
    shape: object               # element shape
    lanes: int
    row: int = 0                # fixed elements per row; 0: variable, up to ``max_row``
    max_row: int = 0
    framing: str = "row"        # "row": TLAST on a row's final beat; "beat": one row per beat
    last_row: bool = False
    count: bool = False
    array: bool = True
    extra: tuple = ()           # ((field, shape), ...): further element fields of the beat
    name: str = ""              # the chain's port name (chain ports only)
    module: int = -1            # index of the module in the chain (chain ports only)

    @property
    def longest(self):
        """Most elements in a row: ``row`` when fixed, else ``max_row``."""
        return self.row or self.max_row

    @property
    def elem_bits(self):
        """Bits of an element (the width of ``shape``)."""
        return Shape.cast(self.shape).width

    @property
    def signed(self):
        """Whether the elements are signed."""
        return Shape.cast(self.shape).signed

    @property
    def has_matrices(self):
        """Whether the stream marks matrix boundaries: ``last_row`` on a matrix's last row, or
        ``beat`` framing (TLAST on a matrix's last row)."""
        return self.last_row or self.framing == "beat"

    @property
    def count_bits(self):
        """Bits of the ``count`` field: elements of a row's final beat, ``0..lanes``."""
        return self.lanes.bit_length()

    def layout(self, extra=True):
        """The payload: ``field`` [, ``extra`` fields][, ``count``][, ``last_row``], ``last``
        (:func:`row_layout`)."""
        return row_layout(self.field, self.shape, self.lanes, array=self.array,
                          extra=self.extra if extra else (),
                          count_bits=self.count_bits if self.count else 0,
                          last_row=self.last_row)

    def extra_port(self, field, shape):
        """The row stream of a further field of this beat, as its own input."""
        return replace(self, field=field, shape=shape, extra=(), count=False, last_row=False)


class RowKernel:
    """Mixin of the configurations of kernels a chain can hold (the I-BERT kernels).

    Subclasses define :meth:`row_ports` and :meth:`row_timing`; :attr:`matrix_inputs` and
    :meth:`row_group` have defaults. Their stream models say how a stimulus holds rows
    (``row_fields``, see :class:`hwgen.ibert.stream_rows.RowModel`).
    """

    #: Element fields of inputs whose whole matrix must have arrived before any output row
    #: (K of the attention scores, V of the context): the packet model waits for all of it.
    matrix_inputs = ()

    def row_ports(self):
        """``([input RowPort, ...], output RowPort)``: the kernel's row streams."""
        raise NotImplementedError

    def row_timing(self, m):
        """``(latency, period)`` in cycles for a sentence of ``m`` tokens, from the kernel's
        own cycle model: ``period`` cycles per output row in steady state, ``latency`` from
        the cycle its last needed input beat arrives to its output row's last beat (for the
        attention kernels, after the whole K or V)."""
        raise NotImplementedError

    def max_tokens(self):
        """The longest sentence (rows of a matrix) the kernel takes; None: no bound."""
        return None

    def row_group(self):
        """Rows the kernel takes as one group on its fed input (the packet model waits for
        the rest of a row's group); 1 by default."""
        return 1
