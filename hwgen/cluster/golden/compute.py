"""Golden model of a kernel chain (:class:`~hwgen.cluster.gateware.compute.KernelChain`): each
module's own golden model fed the rows decoded from the one before
(:func:`propagate`, :func:`decode_rows`)."""

from amaranth.hdl import Shape
import numpy as np

from ... import registry
from ...ibert.stream_rows import beats_per_row
from ...lib.row_ports import RowPort

__all__ = ["RowPort", "decode_rows"]


def decode_rows(port, beats):
    """``(rows, matrix_ends)`` of a stream's beats: the rows' elements (int64 arrays) and per
    row whether it is a matrix's last (None where the stream does not say)."""
    rows, ends, current = [], [], []
    for beat in beats:
        values = beat[port.field] if port.array else [beat[port.field]]
        if port.framing == "beat":
            rows.append(np.array(values, dtype=np.int64))
            ends.append(bool(beat["last"]))
            continue
        n = port.lanes
        if beat["last"]:
            n = beat["count"] if port.count else \
                port.row - (beats_per_row(port.row, n) - 1) * n if port.row else n
        current += list(values[:n])
        if beat["last"]:
            rows.append(np.array(current, dtype=np.int64))
            ends.append(bool(beat["last_row"]) if port.last_row else None)
            current = []
    return rows, ends


def _stim_value(form, rows, ends):
    if form == "list":
        return rows
    if form == "array":
        return np.array(rows, dtype=np.int64).reshape(len(rows), -1)
    mats, start = [], 0
    for i, end in enumerate(ends):
        if end:
            mats.append(np.array(rows[start:i + 1], dtype=np.int64))
            start = i + 1
    return mats


def _field_rows(rng, shape, n_rows, row):
    s = Shape.cast(shape)
    lo, hi = (-(1 << (s.width - 1)), (1 << (s.width - 1)) - 1) if s.signed \
        else (0, (1 << s.width) - 1)
    return rng.integers(lo, hi, size=(n_rows, row), endpoint=True)


def propagate(plan, stim, rng=None):
    """Run the chain's golden model: the first module's model on ``stim["first"]``, each next
    module's model on the rows decoded from the one before (and the further inputs in
    ``stim["extra"]``, drawn with ``rng`` when given). Returns ``(stims, outputs)``: every
    module's stimulus and expected beats ``{member: beats}``."""
    stims, outputs = [stim["first"]], []
    for k, (kind, cfg) in enumerate(zip(plan.kinds, plan.configs)):
        model = registry.get(kind).model
        if k:
            prev = plan.ports[k - 1][2]
            rows, ends = decode_rows(prev, outputs[-1][prev.member])
            feed = plan.feed_port(k)
            forms = model.row_fields
            s = {forms[feed.field][0]: _stim_value(forms[feed.field][1], rows, ends)}
            for field, shape in feed.extra:
                name = f"i_{k}_{field}"
                if rng is not None:
                    stim["extra"][name] = _field_rows(rng, shape, len(rows), feed.row)
                s[forms[field][0]] = stim["extra"][name]
            stims.append(s)
        outputs.append(model.expect(cfg, stims[-1]))
    return stims, outputs
