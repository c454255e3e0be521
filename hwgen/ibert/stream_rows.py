"""Rows of elements streamed ``lanes`` at a time, for the I-BERT elementwise kernels.

A row of ``row`` elements (one token's hidden vector, say) travels as
``ceil(row / lanes)`` beats: element ``j`` of the row is lane ``j % lanes`` of beat
``j // lanes``, and ``last`` (TLAST) is set on the row's final beat. When ``lanes`` does not
divide ``row``, the final beat is padded: its lanes ``row % lanes`` and up carry no element.
Kernels ignore padding lanes on input (any value) and drive zero there on output.

Gateware: :func:`elementwise` builds the free-running, credit-admitted pipeline shared by the
elementwise kernels; host side: :func:`to_beats` and :func:`from_rows` pack rows into beats.
"""

from amaranth.hdl import Signal
from amaranth.lib import wiring

from ..lib.pipeline import CreditBuffer, delay

__all__ = ["beats_per_row", "lanes_in_last_beat", "to_beats", "elementwise",
           "OUTPUT_FIFO_CYCLES"]

#: Cycles the output FIFO (:class:`~hwgen.lib.pipeline.CreditBuffer`) adds between a result
#: entering it and appearing on the output stream.
OUTPUT_FIFO_CYCLES = 2


def beats_per_row(row, lanes):
    """Beats carrying one row."""
    return -(-row // lanes)


def lanes_in_last_beat(row, lanes):
    """Lanes of a row's final beat that carry elements (the rest are padding)."""
    return row - (beats_per_row(row, lanes) - 1) * lanes


def to_beats(fields, lanes, pad=None):
    """Pack rows into beats.

    Parameters
    ----------
    fields : dict
        ``{payload field: 2-D integer array (rows, row)}``, all of the same shape.
    lanes : int
        Elements per beat.
    pad : dict, optional
        ``{payload field: 1-D array}`` of values for padding lanes, consumed in order (the
        testbench fills input padding with random values to show it is ignored); zero
        otherwise.

    Returns
    -------
    list of dict
        One dict per beat: each field a list of ``lanes`` ints, and ``last``.
    """
    names = list(fields)
    n_rows, row = fields[names[0]].shape
    beats = beats_per_row(row, lanes)
    used = {name: 0 for name in names}
    out = []
    for r in range(n_rows):
        for k in range(beats):
            beat = {}
            for name in names:
                values = [int(v) for v in fields[name][r, k * lanes:(k + 1) * lanes]]
                missing = lanes - len(values)
                if missing:
                    if pad is not None and name in pad:
                        start = used[name]
                        values += [int(v) for v in pad[name][start:start + missing]]
                        used[name] = start + missing
                    else:
                        values += [0] * missing
                beat[name] = values
            beat["last"] = int(k == beats - 1)
            out.append(beat)
    return out


def elementwise(m, i_stream, o_stream, field, lane_fn, *, row, lanes):
    """Free-running elementwise pipeline between two row streams.

    The input payload is registered (stage 1, no enable: the pipeline never stalls),
    ``lane_fn(m, lane, payload)`` builds the datapath of one lane from the registered payload
    and returns ``(value, stages)``, its result and the register stages it adds; a final
    register stage takes the result into ``o_stream.payload[field][lane]``, zero in the padding
    lanes of a beat with ``last`` set. Results enter a :class:`CreditBuffer`; the input is ready
    while the buffer has room for everything in flight (a registered compare, never a
    combinational path from ``o_stream.ready``).

    Returns the pipeline latency in cycles: from an input handshake to its result entering
    the output FIFO (``OUTPUT_FIFO_CYCLES`` more to the output stream).
    """
    payload = Signal.like(i_stream.payload, name="in_reg")
    m.d.sync += payload.eq(i_stream.payload)
    values, stages = [], set()
    for lane in range(lanes):
        value, lane_stages = lane_fn(m, lane, payload)
        values.append(value)
        stages.add(lane_stages)
    assert len(stages) == 1, "lanes must share one pipeline depth"
    latency = 1 + stages.pop() + 1

    out_shape = o_stream.payload.shape()
    m.submodules.out = out = CreditBuffer(out_shape, latency=latency)
    wiring.connect(m, wiring.flipped(o_stream), out.o)
    accept = Signal()
    m.d.comb += [
        i_stream.ready.eq(out.ready),
        accept.eq(i_stream.valid & i_stream.ready),
        out.take.eq(accept),
    ]
    last = delay(m, payload.last, latency - 2, name="last")
    result = Signal(out_shape, name="out_reg")
    full = lanes_in_last_beat(row, lanes)
    for lane, value in enumerate(values):
        target = getattr(result, field)[lane]
        m.d.sync += target.eq(value)
        if lane >= full:                    # a padding lane of the final beat
            with m.If(last):
                m.d.sync += target.eq(0)
    m.d.sync += result.last.eq(last)
    m.d.comb += [
        out.i.payload.eq(result),
        out.i.valid.eq(delay(m, accept, latency, name="valid")),
    ]
    return latency
