"""Golden model of a whole layer description, at the row level (pure numpy).

:func:`run` evaluates a :class:`~hwgen.cluster.spec.describe.LayerDescription` (the ``layers`` of a
parsed cluster description) on one matrix of ``M`` input rows, the way the cluster computes it
once every packet has arrived:

* every compute kernel instance is its chain of modules evaluated with the chain's golden
  model, :func:`hwgen.cluster.golden.compute.propagate` (each module's registered ``StreamModel``
  fed the rows decoded from the one before, residual inputs ``i_<k>_id`` as given): exactly
  what :class:`~hwgen.cluster.gateware.compute.KernelChain` is checked against;
* a stream between kernels is one matrix: ``M`` rows (an int64 array ``(M, width)``; the
  attention scores and probabilities are rows of ``M`` elements); each instance takes one
  matrix per chain input and produces one;
* connections, with the GMI semantics on rows (members in the connection's instance order,
  ``describe`` expands a layer name to its instances ``name[0]``, ``name[1]``, ...):
  ``broadcast`` copies the rows to every member; ``scatter`` sends columns
  ``[i * length, (i + 1) * length)`` of each row to member ``i`` (a row must hold ``members *
  length`` elements); ``gather`` concatenates the members' rows in member order (each of
  ``length`` elements); ``reduce`` is the elementwise ``sum`` (wrapping modulo
  ``2**elem_bits``, signed) or ``max`` over the members; without ``gmi`` rows pass
  point-to-point (pairwise ``a[i] -> b[i]`` for equal counts); elements through a GMI kernel
  must fit its signed ``elem_bits`` (default 8);
* ``port`` says which chain input a connection feeds (``Connection.port_of``); a connection
  without one feeds the receiver's single input left unfed by the others, as
  :func:`hwgen.cluster.plan.placement.kernel_plan` assigns them;
* ``input`` is ``x``; the result is the rows of the one connection to ``output``.

A description it cannot evaluate (an input fed twice or not at all, a cycle, no or several
connections to ``output``, a scatter/gather whose widths do not match, values outside a
port's elements) raises :class:`LayerGoldenError` saying which kernel and connection.

The sequence length is free (the hardware's ``sequence_length`` is a build-time limit; the
kernels' ``max_len`` bounds it here too).
"""

from amaranth.hdl import Shape
import numpy as np

from ... import registry
from ...lib.row_ports import shape_range
from ..spec.compute import chain_plan
from ..spec.describe import Boundary, PortError, assign_ports
from .compute import decode_rows, propagate

__all__ = ["LayerGoldenError", "run", "ports", "evaluate_chain"]


class LayerGoldenError(ValueError):
    """A layer description that :func:`run` cannot evaluate."""


def _instances(layers):
    return {inst: layer for layer in layers.layers for inst in layer.instances()}


def ports(layers):
    """``{instance: {chain input name: connection}}`` of every compute kernel instance:
    connections with a ``port`` first, then each one without takes the single input left
    (as :func:`hwgen.cluster.plan.placement.kernel_plan`)."""
    plans = {inst: chain_plan(layer.modules) for inst, layer in _instances(layers).items()}
    out = {}
    for inst, plan in plans.items():
        names = [p.name for p in plan.inputs]
        feeds = [c for c in layers.connections if inst in c.dst]
        try:
            fed = assign_ports(inst, names, feeds)
        except PortError as e:
            c = e.connection
            raise LayerGoldenError(f"connections[{c.index}] ({c.name}) -> {inst}: {e}") \
                from None
        missing = [n for n in names if n not in fed]
        if missing:
            raise LayerGoldenError(f"{inst}: no connection feeds input(s) {', '.join(missing)}")
        out[inst] = fed
    return out


def _fits(rows, shape):
    lo, hi = shape_range(shape)
    return not rows.size or (rows.min() >= lo and rows.max() <= hi)


def _check_rows(rows, port, where):
    if rows.ndim != 2:
        raise LayerGoldenError(f"{where}: rows must be a 2-D array")
    width = rows.shape[1]
    if port.row and width != port.row:
        raise LayerGoldenError(f"{where}: {port.name} takes rows of {port.row} elements, "
                               f"it gets {width}")
    if not port.row and width > port.max_row:
        raise LayerGoldenError(f"{where}: {port.name} takes rows of at most {port.max_row} "
                               f"elements, it gets {width}")
    if not _fits(rows, port.shape):
        raise LayerGoldenError(f"{where}: values {rows.min()}..{rows.max()} do not fit "
                               f"{port.name}'s {port.elem_bits}-bit "
                               f"{'signed' if port.signed else 'unsigned'} elements")


def evaluate_chain(modules, inputs, where="chain"):
    """The output rows (int64 ``(M, width)``) of a compute kernel's chain (``modules``, as
    :func:`~hwgen.cluster.spec.compute.chain_plan` takes them) on one matrix per chain input
    (``{"i_0_x": rows, "i_1_id": rows}``), by :func:`~hwgen.cluster.golden.compute.propagate`."""
    plan = chain_plan(modules)
    first, extra = {}, {}
    for p in plan.inputs:
        if p.name not in inputs:
            raise LayerGoldenError(f"{where}: input {p.name} not given")
        rows = np.asarray(inputs[p.name], dtype=np.int64)
        _check_rows(rows, p, where)
        if p.module == 0:
            if p.extra:
                raise LayerGoldenError(f"{where}: input {p.name} carries several fields")
            key, form = registry.get(plan.kinds[0]).model.row_fields[p.field]
            first[key] = [rows] if form == "mats" else list(rows) if form == "list" else rows
        else:
            extra[p.name] = rows
    _, outputs = propagate(plan, {"first": first, "extra": extra})
    rows, _ = decode_rows(plan.output, outputs[-1][plan.output.member])
    return np.array(rows, dtype=np.int64).reshape(len(rows), -1)


def _delivered(c, dst, values):
    """The rows connection ``c`` delivers to its receiver ``dst`` (``values``: rows of every
    evaluated sender and of ``input``)."""
    where = f"connections[{c.index}] ({c.name})"
    srcs = [values[s] for s in c.src]
    if c.gmi is not None:
        length, bits = c.params.get("length", 16), c.params.get("elem_bits", 8)
        for s, rows in zip(c.src, srcs):
            if not _fits(rows, Shape(bits, True)):
                raise LayerGoldenError(f"{where}: {s} sends values {rows.min()}..{rows.max()}, "
                                       f"beyond the GMI's signed {bits}-bit elements")
    if c.gmi is None:
        return srcs[c.dst.index(dst)] if len(c.src) == len(c.dst) else srcs[0]
    if c.gmi == "broadcast":
        return srcs[0].copy()
    if c.gmi == "scatter":
        rows, n = srcs[0], len(c.dst)
        if rows.shape[1] != n * length:
            raise LayerGoldenError(f"{where}: a scatter to {n} members of length {length} "
                                   f"takes rows of {n * length} elements, not {rows.shape[1]}")
        i = c.dst.index(dst)
        return rows[:, i * length:(i + 1) * length].copy()
    for s, rows in zip(c.src, srcs):
        if rows.shape[1] != length:
            raise LayerGoldenError(f"{where}: {s} sends rows of {rows.shape[1]} elements, the "
                                   f"{c.gmi} takes {length}")
    if len({rows.shape[0] for rows in srcs}) != 1:
        raise LayerGoldenError(f"{where}: the members send different numbers of rows")
    if c.gmi == "gather":
        return np.concatenate(srcs, axis=1)
    op = c.params.get("op", "sum")
    if op == "max":
        return np.max(srcs, axis=0)
    if op != "sum":
        raise LayerGoldenError(f"{where}: unknown reduce op {op!r}")
    total = np.sum(srcs, axis=0)
    half = 1 << (bits - 1)
    return (total + half) % (1 << bits) - half


def run(layers, x, trace=None):
    """The rows that reach ``output`` (int64 ``(M, width)``) when ``x`` (int64 ``(M, H)``:
    the rows arriving at ``input``) goes through the layer description ``layers``
    (``describe.load(...).clusters[0].layers``); semantics in the module docstring.
    ``trace``: a dict that receives every instance's output rows by instance name."""
    x = np.asarray(x, dtype=np.int64)
    if x.ndim != 2:
        raise LayerGoldenError("x must be a 2-D array (M rows)")
    instances = _instances(layers)
    fed = ports(layers)
    outs = [c for c in layers.connections if c.dst == (Boundary.OUTPUT,)]
    if len(outs) != 1:
        raise LayerGoldenError(f"{len(outs)} connections reach `output`; run needs one")
    values = {Boundary.INPUT: x}
    pending = list(instances)
    while pending:
        ready = [i for i in pending
                 if all(s in values for c in fed[i].values() for s in c.src)]
        if not ready:
            raise LayerGoldenError("cannot evaluate " + ", ".join(pending) + ": their inputs "
                                   "wait on each other (a cycle) or on them")
        for inst in ready:
            inputs = {port: _delivered(c, inst, values) for port, c in fed[inst].items()}
            values[inst] = evaluate_chain(instances[inst].modules, inputs, inst)
            if trace is not None:
                trace[inst] = values[inst]
            pending.remove(inst)
    c = outs[0]
    if c.src == (Boundary.INPUT,) or len(c.src) != 1:
        raise LayerGoldenError(f"connections[{c.index}]: `output` needs one compute kernel "
                               "sending to it")
    return values[c.src[0]]
