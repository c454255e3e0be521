"""Compute kernels of the cluster: a chain of registered accelerators behind one set of ports.

A layer description gives each compute kernel as a chain of ``modules`` (``[{"kind":
"ibert-linear", "params": {...}}, {"kind": "ibert-requant", "params": {...}}]``, see
:mod:`hwgen.cluster.spec.describe`). :class:`KernelChain` instantiates every module's component
through :mod:`hwgen.registry` and feeds module ``i``'s output into module ``i + 1``'s *feed*
input (the one a preceding layer drives: the model's ``latency_from``), through a
:class:`Regroup` that converts between the two beat formats.

Kernel row streams
------------------
:func:`kernel_ports` describes every stream of a chainable kernel as a :class:`RowPort` (the
kernel's configuration is a :class:`~hwgen.lib.row_ports.RowKernel`)
(checked against the kernels' own payload layouts when a chain is built). ``row`` is the
fixed row length in elements (``var`` rows: any length up to the bound, delimited by TLAST);
``beat`` framing is one row per beat with TLAST on a *matrix's* last row; ``last_row`` marks
the matrix's last row on its beats; ``count`` gives the elements of a row's final beat.

=====================  =======  =================  =======  ===========  ==================
kernel / member        field    element            lanes    row          framing
=====================  =======  =================  =======  ===========  ==================
linear ``i_x``         ``x``    int8               pes      K            row, last_row
linear ``o_y``         ``y``    int32              tiles    N            row, last_row
requant ``i_x``        ``q``    int(in_bits)       lanes    row          row; [``id``:
                                                                         int(identity_bits)]
requant ``o_y``        ``y``    int(bits)          lanes    row          row
gelu ``i_x``           ``q``    int(in_bits)       lanes    row          row
gelu ``o_y``           ``y``    int(out_bits)      lanes    row          row
softmax ``i_x``        ``q``    int(in_bits)       lanes    var max_len  row, count (lanes>1)
softmax ``o_y``        ``y``    uint(out_bits)     lanes    var max_len  row, count (lanes>1)
layernorm ``i_row``    ``q``    int(in_bits)       lanes    hidden       row
layernorm ``o_row``    ``y``    int(out_bits)      lanes    hidden       row
attn-dot ``i_k/i_q``   ``k/q``  int8               d        d            beat
attn-dot ``o_s``       ``s``    int32 (scalar)     1        var max_len  row, last_row
softmax-matmul ``i_v`` ``v``    int8               d        d            beat
softmax-matmul ``i_p`` ``p``    uint9              pes      var max_len  row, last_row
softmax-matmul ``o_o`` ``o``    int32              d        d            beat
=====================  =======  =================  =======  ===========  ==================

A row always starts at lane 0 of a beat; the lanes of a final beat past the row's end are
padding (ignored on input; the kernels and :class:`Regroup` drive zero there).

Links
-----
A link from output ``a`` to feed input ``b`` is refused (:class:`~hwgen.errors.ConfigError`
naming ``modules[i]``) unless ``b``'s element holds every value of ``a``'s (sign- or
zero-extension only: an element never narrows), a fixed-length ``b`` gets rows of exactly its
length, a variable ``b`` rows no longer than its bound, and a ``b`` that needs matrix
boundaries (``last_row`` or ``beat`` framing) gets them from ``a``. Further fields of ``b``'s
beat (the requantisation's residual ``id``) and ``b``'s module's other inputs become chain
inputs.

Ports of the chain
------------------
``i_<k>_<port>`` for each input of module ``k`` that the chain does not feed (``port`` is the
kernel member without ``i_``, e.g. ``i_0_x``, ``i_0_q``, ``i_0_k``), and ``i_<k>_<field>`` for a
further field of a fed beat (``i_1_id``: ``{"id": ArrayLayout(int(identity_bits), lanes),
"last"}``, the rows of the requantisation); the first module's ``latency_from`` input comes
first. ``o_y``: the last module's output stream, with its own payload layout. They are listed
in :attr:`KernelChain.inputs` and :attr:`KernelChain.output` (:class:`RowPort` with ``name``).

Timing
------
A :class:`Regroup` between equal lane counts is combinational (latency 0); otherwise a
register buffer (latency 1 cycle, one beat per cycle on its busier side). The chain's latency
is the sum of the modules' and the regroupers' latencies (:meth:`ChainPlan.cycle_model`; exact
where no regrouper widens: a widening one, ``dst.lanes > src.lanes``, also waits for the input
beats that fill its first output beat), its initiation interval the largest of the modules' (in
elements: the slowest module sets the pace). Backpressure: ``o_y`` may stall at any time; each
module and regrouper stalls its input through its own ``ready``. The kernels' ``ready``
outputs are registered; a regrouper of equal or whole-multiple lane counts derives its input's
``ready`` combinationally from the next kernel's (one level, never further up the chain).
"""

import math

from amaranth.hdl import Array, Cat, Const, Module, Mux, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from ... import registry
from ...flow.model import StreamModel
from ...ibert.stream_rows import beats_per_row, to_beats
from ...lib.row_ports import RowPort
from ..golden.compute import propagate
from ..spec.compute import OUTPUT, ChainPlan, KernelChainConfig, chain_plan
from .adapter import join_rows

__all__ = ["RowPort", "Regroup", "KernelChain", "KernelChainModel", "TEST_CONFIGS"]


class Regroup(wiring.Component):
    """Rows from one beat format into another: ``src.lanes`` elements per input beat to
    ``dst.lanes`` per output beat, rows kept (a row starts at lane 0 of a beat on both sides),
    elements extended to ``dst.shape``.

    Members
    -------
    i : ``In(stream.Signature(src.layout()))``
    o : ``Out(stream.Signature(dst.layout(extra=False)))``
        Padding lanes zero; ``count`` (with ``dst.count``) the elements of the beat; ``last``
        on a row's final beat (``row`` framing) or on a matrix's last row (``beat`` framing);
        ``last_row`` on every beat of a matrix's last row.

    The elements of an input beat: ``src.lanes``, except on a row's final beat (TLAST in
    ``row`` framing): the rest of a fixed-length row, ``count`` of a variable one.

    Structure and timing, by the ratio of the lane counts (one beat per cycle on the busier
    side in every case; latency 0 when equal, else 1 cycle):

    * equal: a combinational connection (``i.ready`` is ``o.ready``);
    * ``src.lanes = r * dst.lanes``: the input beat is held and sent in up to ``r`` pieces (an
      ``r``:1 select per output lane); ``i.ready`` when the held beat leaves this cycle;
    * ``dst.lanes = r * src.lanes``: up to ``r`` input beats are collected, a row end sends the
      beat early; ``i.ready`` while the output register is empty or leaves this cycle;
    * any other ratio: :attr:`lines` lines of ``L = lcm(src.lanes, dst.lanes)`` elements.
      The writer fills one line a beat at a time, zeroing padding lanes (a row end or a full
      line closes it and clears its later slots; it then moves to the next line once the
      reader has released that); the reader sends ``dst.lanes`` elements per beat from its
      line as soon as they are written (following the writer within a line), the rest of a
      closed line as the final piece, and then releases the line. ``i.ready`` is the written
      line's registered state, never combinational on ``o.ready``; the reader's decisions
      are the sign and zero test of one register (elements written, not read, minus
      ``dst.lanes``), no shifter and no count compare.
    """

    def __init__(self, src, dst):
        self.src, self.dst = src, dst
        super().__init__({"i": In(stream.Signature(src.layout())),
                          "o": Out(stream.Signature(dst.layout(extra=False)))})

    @property
    def line(self):
        """Elements of each line of a general lane ratio: the least common multiple of the
        lane counts (see the class docstring)."""
        return math.lcm(self.src.lanes, self.dst.lanes)

    @property
    def lines(self):
        """Lines of a general lane ratio: 2 when narrowing (the reader sets the pace), 3 when
        widening (a line's last pieces may still be read while the next two short rows are
        written)."""
        return 2 if self.src.lanes > self.dst.lanes else 3

    def _input(self, m):
        """``(elements, n, row_end, matrix_end)`` of the input beat."""
        src, p = self.src, self.i.payload
        raw = [p[src.field][k] for k in range(src.lanes)] if src.array else [p[src.field]]
        elems = []
        for k, value in enumerate(raw):
            ext = Signal(self.dst.shape, name=f"in{k}")
            m.d.comb += ext.eq(value)
            elems.append(ext)
        li = src.lanes
        if src.framing == "beat":
            return elems, Const(li), Const(1), p.last
        if src.count:
            n = Mux(p.last, p.count, li)
        else:
            tail = src.row - (beats_per_row(src.row, li) - 1) * li if src.row else li
            n = Mux(p.last, tail, li)
        return elems, n, p.last, p.last_row if src.last_row else Const(0)

    def _output(self, m, values, n, end, mat, used=None):
        """Drive ``o``'s payload: ``values`` in lanes below ``n`` (or where ``used[k]``), zero
        elsewhere."""
        dst, p = self.dst, self.o.payload
        if dst.array:
            for k, value in enumerate(values):
                m.d.comb += p[dst.field][k].eq(Mux(n > k if used is None else used[k], value, 0))
        else:
            m.d.comb += p[dst.field].eq(values[0])
        if dst.count:
            m.d.comb += p.count.eq(n)
        if dst.last_row:
            m.d.comb += p.last_row.eq(mat)
        m.d.comb += p.last.eq(mat if dst.framing == "beat" else end)

    def elaborate(self, platform):
        m = Module()
        beat = self._input(m)
        li, lo = self.src.lanes, self.dst.lanes
        if li == lo:
            self._output(m, *beat)
            m.d.comb += [self.o.valid.eq(self.i.valid), self.i.ready.eq(self.o.ready)]
        elif li % lo == 0:
            self._split(m, *beat)
        elif lo % li == 0:
            self._merge(m, *beat)
        else:
            self._lines(m, *beat)
        return m

    def _split(self, m, elems, n_in, row_end, mat_end):
        """``src.lanes = r * dst.lanes``: hold a beat, send it in up to ``r`` pieces."""
        li, lo = self.src.lanes, self.dst.lanes
        r = li // lo
        held = [Signal(self.dst.shape, name=f"held{k}") for k in range(li)]
        held_n = Signal(range(li + 1))
        held_end, held_mat, full = Signal(), Signal(), Signal()
        piece = Signal(range(r))
        rest = Signal(range(li + 1))
        values = [Array(held[c * lo + k] for c in range(r))[piece] for k in range(lo)]
        final = rest <= lo
        self._output(m, values, Mux(final, rest, lo), held_end & final, held_mat)
        fire_out, fire_in = Signal(), Signal()
        m.d.comb += [
            rest.eq(held_n - piece * lo),
            self.o.valid.eq(full),
            fire_out.eq(self.o.valid & self.o.ready),
            self.i.ready.eq(~full | (fire_out & final)),
            fire_in.eq(self.i.valid & self.i.ready),
        ]
        with m.If(fire_out):
            m.d.sync += piece.eq(Mux(final, 0, piece + 1))
            with m.If(final):
                m.d.sync += full.eq(0)
        with m.If(fire_in):
            m.d.sync += [full.eq(1), held_n.eq(n_in), held_end.eq(row_end),
                         held_mat.eq(mat_end)]
            m.d.sync += [h.eq(e) for h, e in zip(held, elems)]

    def _merge(self, m, elems, n_in, row_end, mat_end):
        """``dst.lanes = r * src.lanes``: collect up to ``r`` beats (a row end closes early)."""
        li, lo = self.src.lanes, self.dst.lanes
        r = lo // li
        part = [Signal(self.dst.shape, name=f"part{k}") for k in range(lo - li)]
        out = [Signal(self.dst.shape, name=f"out{k}") for k in range(lo)]
        out_n = Signal(range(lo + 1))
        out_end, out_mat, out_valid = Signal(), Signal(), Signal()
        slot = Signal(range(r))
        self._output(m, out, out_n, out_end, out_mat)
        fire_in = Signal()
        m.d.comb += [
            self.o.valid.eq(out_valid),
            self.i.ready.eq(~out_valid | self.o.ready),
            fire_in.eq(self.i.valid & self.i.ready),
        ]
        with m.If(self.o.valid & self.o.ready):
            m.d.sync += out_valid.eq(0)
        with m.If(fire_in):
            with m.If(row_end | (slot == r - 1)):
                m.d.sync += [out_valid.eq(1), out_n.eq(slot * li + n_in), out_end.eq(row_end),
                             out_mat.eq(mat_end), slot.eq(0)]
                for j, o in enumerate(out):
                    s, k = divmod(j, li)
                    m.d.sync += o.eq(elems[k] if s == r - 1 else
                                     Mux(slot == s, elems[k], part[j]))
            with m.Else():
                m.d.sync += slot.eq(slot + 1)
                with m.Switch(slot):
                    for s in range(r - 1):
                        with m.Case(s):
                            m.d.sync += [part[s * li + k].eq(e) for k, e in enumerate(elems)]

    def _lines(self, m, elems, n_in, row_end, mat_end):
        """Any other ratio: ``lines`` lines of ``line`` elements, written ``src.lanes`` per beat
        and read ``dst.lanes`` per beat (the reader may follow the writer within a line)."""
        li, lo, size, count = self.src.lanes, self.dst.lanes, self.line, self.lines
        pieces = size // lo
        lines = [[Signal(self.dst.shape, name=f"line{l}_{q}") for q in range(size)]
                 for l in range(count)]
        # the writer's state of each line
        written = Array(Signal(range(size + 1), name=f"written{l}") for l in range(count))
        closed = Array(Signal(name=f"closed{l}") for l in range(count))   # written to its end
        row_ends = Array(Signal(name=f"row_end{l}") for l in range(count))  # ... a row end
        mats = Array(Signal(name=f"mat{l}") for l in range(count))
        ws = Signal(range(count))
        slot = Signal(range(size // li))
        # the reader's: line rs, the pieces of all lines numbered in one counter, the elements
        # written and not read minus dst.lanes (its sign: a full piece is there), and copies of
        # line rs's flags, all updated from the next state so that no count is compared here
        rs = Signal(range(count))
        at = Signal(range(count * pieces))
        at_next = Signal(range(count * pieces), init=pieces)    # line following(rs)'s first
        slack = Signal(range(-lo, size + 1), init=-lo)
        cur_closed, cur_end, cur_mat = Signal(), Signal(), Signal()

        def following(index):
            return Mux(index == count - 1, 0, index + 1)

        final = Signal()
        m.d.comb += final.eq(cur_closed & (slack <= 0))
        # a line holds zeros past its written elements (the writer clears them), so the
        # output lanes need no mask
        values = [Array(lines[l][p * lo + k] for l in range(count) for p in range(pieces))[at]
                  for k in range(lo)]
        self._output(m, values, Mux(final, slack + lo, lo), cur_end & final, cur_mat,
                     used=[Const(1)] * lo)
        fire_out, fire_in, close = Signal(), Signal(), Signal()
        m.d.comb += [
            self.o.valid.eq(cur_closed | (slack >= 0)),
            fire_out.eq(self.o.valid & self.o.ready),
            self.i.ready.eq(~closed[ws]),
            fire_in.eq(self.i.valid & self.i.ready),
            close.eq(row_end | (slot == size // li - 1)),
        ]

        def after_write(line, reg, value):
            """``reg[line]`` after this cycle's write (``value`` where the writer closes it)."""
            return Mux(fire_in & (ws == line) & close, value, reg[line])

        nxt = following(rs)
        into_rs, into_nxt = fire_in & (ws == rs), fire_in & (ws == nxt)
        step = Signal(range(-lo, li - lo + 1))          # n_in - lo, one input beat's worth
        m.d.comb += step.eq(n_in - lo)
        with m.If(fire_out & final):
            m.d.sync += [rs.eq(nxt), at.eq(at_next),
                         at_next.eq(Mux(at_next == (count - 1) * pieces, 0, at_next + pieces)),
                         slack.eq(written[nxt] + Mux(into_nxt, step, -lo)),
                         cur_closed.eq(after_write(nxt, closed, 1)),
                         cur_end.eq(after_write(nxt, row_ends, row_end)),
                         cur_mat.eq(mats[nxt] | (into_nxt & mat_end)),
                         closed[rs].eq(0), written[rs].eq(0), mats[rs].eq(0)]
        with m.Elif(fire_out):
            m.d.sync += [at.eq(at + 1), slack.eq(slack + Mux(into_rs, step, -lo))]
        with m.Else():
            m.d.sync += slack.eq(slack + Mux(into_rs, n_in, 0))
        with m.If(~(fire_out & final)):
            m.d.sync += [cur_closed.eq(after_write(rs, closed, 1)),
                         cur_end.eq(after_write(rs, row_ends, row_end)),
                         cur_mat.eq(cur_mat | (into_rs & mat_end))]

        # the writer: only into a line the reader has released (never the one a final read
        # releases this cycle: that one is closed)
        with m.If(fire_in):
            m.d.sync += [slot.eq(Mux(close, 0, slot + 1)),
                         written[ws].eq(written[ws] + n_in), mats[ws].eq(mats[ws] | mat_end)]
            with m.If(close):
                m.d.sync += [ws.eq(following(ws)), closed[ws].eq(1), row_ends[ws].eq(row_end)]
            # the beat's elements, padding lanes zero; a closing beat also clears the line's
            # later slots
            masked = [Mux(n_in > k, e, 0) for k, e in enumerate(elems)]
            for l in range(count):
                for s in range(size // li):
                    with m.If((ws == l) & (slot == s)):
                        m.d.sync += [lines[l][s * li + k].eq(e) for k, e in enumerate(masked)]
                    with m.Elif((ws == l) & close & (slot < s)):
                        m.d.sync += [lines[l][s * li + k].eq(0) for k in range(li)]


# -- the chain ---------------------------------------------------------------------------------

class KernelChain(wiring.Component):
    """A compute kernel: the modules of a chain, each fed by the one before it.

    Parameters
    ----------
    modules : tuple of describe.Module, list of ``{"kind", "params"}``, their JSON, a
        :class:`ChainPlan` or a :class:`KernelChainConfig`

    Members
    -------
    ``i_<k>_<port>`` : ``In(stream.Signature(...))``
        Inputs not fed by the chain (module docstring), with the kernels' payload layouts.
    o_y : ``Out(stream.Signature(...))``
        The last module's output.

    Attributes
    ----------
    inputs : tuple of RowPort
        The chain's inputs in member order: ``name``, ``layout()``, ``elem_bits``, ``lanes``,
        ``row`` / ``max_row``, ``count``, ``last_row``, ``framing`` and ``module`` (index).
    output : RowPort
        The output (``name`` ``o_y``).
    plan : ChainPlan

    Timing
    ------
    Latency: the sum of the modules' and regroupers' (:meth:`cycle_model`); initiation
    interval: the slowest module's. Backpressure: ``o_y`` may stall at any time; stalls travel
    back through each module's registered ``ready``.
    """

    def __init__(self, modules):
        if isinstance(modules, KernelChainConfig):
            modules = modules.plan
        self.plan = plan = modules if isinstance(modules, ChainPlan) else chain_plan(modules)
        self.inputs, self.output = plan.inputs, plan.output
        members = {p.name: In(stream.Signature(p.layout())) for p in plan.inputs}
        members[OUTPUT] = Out(stream.Signature(plan.output.layout()))
        super().__init__(members)

    def cycle_model(self):
        """:meth:`ChainPlan.cycle_model`."""
        return self.plan.cycle_model()

    def elaborate(self, platform):
        m = Module()
        plan = self.plan
        kernels = [registry.get(kind).build_core(cfg)
                   for kind, cfg in zip(plan.kinds, plan.configs)]
        for k, kernel in enumerate(kernels):
            m.submodules[f"m{k}_{plan.kinds[k].replace('-', '_')}"] = kernel
            for p in (*plan.ports[k][0], plan.ports[k][2]):
                layout = kernel.signature.members[p.member].signature.members["payload"].shape
                assert layout == p.layout(), (plan.kinds[k], p.member, layout, p.layout())
        ext = {(p.module, p.member, p.field): getattr(self, p.name) for p in plan.inputs}
        for k, kernel in enumerate(kernels):
            for p in plan.ports[k][0]:
                target = getattr(kernel, p.member)
                if (k, p.member, p.field) in ext:
                    wiring.connect(m, wiring.flipped(ext[k, p.member, p.field]), target)
                    continue
                m.submodules[f"regroup{k}"] = rg = Regroup(plan.ports[k - 1][2], p)
                wiring.connect(m, getattr(kernels[k - 1], plan.ports[k - 1][2].member), rg.i)
                if not p.extra:
                    wiring.connect(m, rg.o, target)
                    continue
                join_rows(m, [(rg.o, p.field)] +
                          [(ext[k, p.member, f], f) for f, _ in p.extra], target)
        wiring.connect(m, getattr(kernels[-1], plan.output.member),
                       wiring.flipped(getattr(self, OUTPUT)))
        return m


# -- golden model ------------------------------------------------------------------------------

class KernelChainModel(StreamModel):
    """Stimulus and golden model of ``cluster-kernel-chain``: the composition of the modules'
    own models (:func:`propagate`). An item is whatever the first module's is."""

    result_port = OUTPUT
    latency_from = None          # the first input: the first module's latency_from

    @staticmethod
    def stimulus(config, items, rng):
        """The first module's stimulus of ``items`` items, and uniform random rows for every
        further input (``i_<k>_id``), as many as reach module ``k``."""
        plan = config.plan
        first = registry.get(plan.kinds[0]).model.stimulus(plan.configs[0], items, rng)
        stim = {"first": first, "extra": {}}
        propagate(plan, stim, rng)
        return stim

    @staticmethod
    def inputs(config, stim):
        """The first module's inputs under the chain's names; further fields as rows of
        ``lanes`` per beat (:func:`~hwgen.ibert.stream_rows.to_beats`), ``last`` per row."""
        plan = config.plan
        first = registry.get(plan.kinds[0]).model.inputs(plan.configs[0], stim["first"])
        out = {}
        for p in plan.inputs:
            if p.module == 0:
                out[p.name] = first[p.member]
            else:
                out[p.name] = to_beats({p.field: stim["extra"][p.name]}, p.lanes)
        return out

    @staticmethod
    def expect(config, stim):
        """``o_y``: the last module's expected output when each module's model is fed the rows
        of the one before."""
        plan = config.plan
        _, outputs = propagate(plan, stim)
        return {OUTPUT: outputs[-1][plan.output.member]}

    @staticmethod
    def cycles_bound(config, stim):
        plan = config.plan
        stims, _ = propagate(plan, stim)
        return sum(registry.get(kind).model.cycles_bound(cfg, s) + 50
                   for kind, cfg, s in zip(plan.kinds, plan.configs, stims))


def _chain(*modules):
    return {"modules": [{"kind": k, "params": p} for k, p in modules]}


#: Simulated by ``tests/test_sim.py``: Linear (5 tiles) into a requantisation of 4 lanes (a
#: row of 15: partial final beats); attention scores (one per beat, rows of any length up to
#: 11) into a 3-lane softmax with ``count``; Linear (3 tiles) into a 5-lane i-GELU; Linear into
#: a residual requantisation (second input ``i_1_id``) into LayerNorm (7 -> 2 -> 7 lanes);
#: softmax x V (rows of 8 in one beat) into 2 lanes; equal lane counts (a plain connection).
TEST_CONFIGS = (
    _chain(("ibert-linear", {"in_features": 37, "out_features": 15, "tiles": 5, "pes": 4,
                             "weight_seed": 7}),
           ("ibert-requant", {"row": 15, "lanes": 4})),
    _chain(("ibert-attn-dot", {"head_dim": 6, "max_len": 11, "pes": 3}),
           ("ibert-softmax", {"max_len": 11, "lanes": 3, "scale": 0.02})),
    _chain(("ibert-linear", {"in_features": 9, "out_features": 12, "tiles": 3, "pes": 3}),
           ("ibert-gelu", {"row": 12, "lanes": 5, "scale": 3e-4})),
    _chain(("ibert-linear", {"in_features": 10, "out_features": 14, "tiles": 7, "pes": 5,
                             "weight_seed": 4}),
           ("ibert-requant", {"row": 14, "lanes": 2, "identity": True, "bits": 22,
                              "scale_in": 3e-4, "scale_out": 0.002, "identity_scale": 0.05}),
           ("ibert-layernorm", {"hidden": 14, "lanes": 7, "in_bits": 22, "param_seed": 2})),
    _chain(("ibert-softmax-matmul", {"head_dim": 8, "max_len": 9, "pes": 2}),
           ("ibert-requant", {"row": 8, "lanes": 2, "scale_in": 1e-3, "scale_out": 0.5})),
    _chain(("ibert-linear", {"in_features": 6, "out_features": 8, "tiles": 4, "pes": 2}),
           ("ibert-requant", {"row": 8, "lanes": 4})),
)
