"""Recommendation fully-connected layer: broadcast-and-gather PEs (paper section III-B2, Fig. 4).

``y = requant(relu(x @ W^T + b))`` for one input vector per inference. The input vector is
broadcast to ``pes`` processing elements; PE ``p`` holds output rows ``p, p + pes, p + 2 pes,
...`` of ``W`` (and their biases) in its own on-chip memory and computes their dot products one
after the other with ``mults`` parallel multipliers and an adder tree: ``S = ceil(in_dim /
mults)`` cycles per row. All PEs work in lock step on the same broadcast input word, so every
``S`` cycles a *round* of ``pes`` consecutive outputs (rows ``r * pes .. r * pes + pes - 1``)
finishes together; bias, ReLU and requantisation follow in each PE and the results are gathered
in output order. The paper prefers this broadcast to a systolic array for its latency.

Sizes need not divide: the last input word and the last round are partial (zero weights past
``in_dim``; PEs without a row in the last round compute padding that is never sent).

Default configuration (``hwgen sim recsys-fc``): 64 -> 32, 8 PEs x 8 multipliers, 8-bit
weights and activations. The paper's first layer on one node of four is about ``--set
in_dim=876 --set out_dim=256 --set pes=16 --set mults=16 --set weight_bits=16 --set
act_bits=16 --set out_bits=16 --set shift=12`` (256 multipliers).
"""

from dataclasses import dataclass
from functools import cached_property

import numpy as np
from amaranth.hdl import Array, Cat, Const, Module, Mux, Signal, signed
from amaranth.lib import data, memory, stream, wiring
from amaranth.lib.wiring import In, Out

from .. import contract
from ..config import Config, param
from ..errors import ConfigError
from ..flow.model import StreamModel
from ..lib.intmath import ceil_div
from ..lib.pipeline import adder_tree, delay, sum_shape
from ..lib.registered import register_copies
from . import golden

__all__ = ["FCConfig", "FC", "FCModel", "TEST_CONFIGS", "input_layout", "output_layout"]


@dataclass(frozen=True)
class FCConfig(Config):
    """Configuration of the fully-connected layer :class:`FC`: the layer's shape (``in_dim`` ->
    ``out_dim``), the PE array (``pes`` x ``mults``), the number formats (weights, activations,
    requantised outputs, shift, ReLU), the stream width (``lanes``) and the seed of the weights."""
    in_dim: int = param(64, "input vector length (columns of W)", lo=1, hi=4096)
    out_dim: int = param(32, "output vector length (rows of W)", lo=1, hi=4096)
    pes: int = param(8, "PEs; PE p computes output rows p, p + pes, ... (at most out_dim)",
                     lo=1, hi=512)
    mults: int = param(8, "multipliers per PE: input elements per cycle (at most in_dim)",
                       lo=1, hi=64)
    weight_bits: int = param(8, "bits of a weight (signed)", choices=(8, 16))
    act_bits: int = param(8, "bits of an input element (signed)", choices=(8, 16))
    out_bits: int = param(8, "bits of an output element after requantisation (signed); 0: "
                          "the raw 32-bit accumulator", choices=(0, 8, 16))
    relu: bool = param(True, "ReLU before requantisation")
    shift: int = param(8, "requantisation: round half to even of acc / 2**shift, then clamp "
                       "(ignored when out_bits=0)", lo=0, hi=40)
    lanes: int = param(8, "elements per input and per output beat", lo=1, hi=64)
    weight_seed: int = param(1, "seed of numpy's default_rng drawing W and b "
                             "(hwgen.recsys.golden.fc_params with extremes)",
                             lo=0, hi=2 ** 32 - 1)

    def check(self):
        if self.pes > self.out_dim:
            raise ConfigError("pes", f"must be in 1..out_dim={self.out_dim} (a PE computes "
                              "at least one output row)", value=self.pes)
        if self.mults > self.in_dim:
            raise ConfigError("mults", f"must be in 1..in_dim={self.in_dim}", value=self.mults)

    # -- derived sizes ------------------------------------------------------------------------

    @property
    def steps(self):
        """S: cycles per output row (broadcast words per input vector), ``ceil(in_dim /
        mults)``."""
        return ceil_div(self.in_dim, self.mults)

    @property
    def rounds(self):
        """R: output rows per PE, ``ceil(out_dim / pes)``."""
        return ceil_div(self.out_dim, self.pes)

    @property
    def in_beats(self):
        """Input beats per inference: ``ceil(in_dim / lanes)``."""
        return ceil_div(self.in_dim, self.lanes)

    @property
    def out_beats(self):
        """Output beats per inference: ``ceil(out_dim / lanes)``."""
        return ceil_div(self.out_dim, self.lanes)

    @property
    def result_bits(self):
        """Bits of an output element: ``out_bits``, or the 32-bit accumulator when it is 0."""
        return self.out_bits or golden.ACC_BITS

    @property
    def tree_latency(self):
        """Pipeline stages (cycles) of a PE's adder tree over ``mults`` products:
        ``ceil(log2(mults))``."""
        return (self.mults - 1).bit_length()

    @property
    def copy_levels(self):
        """Register levels of the tree that gives each of the ``pes`` PEs its own copy of a
        value (:func:`~hwgen.lib.registered.register_copies`): ``ceil(log2(pes))``."""
        return (self.pes - 1).bit_length()

    @property
    def broadcast_latency(self):
        """Cycles from issuing a step to its operands in the multipliers' input registers: the
        PEs' copies of the address counters' control (:attr:`copy_levels`), the counter, the
        memory read and the weight register beside the multiplier (2); the input word follows
        the same delay."""
        return self.copy_levels + 2

    @property
    def partial_shape(self):
        """Shape of a multiplier's sum over a row's ``S`` steps: exact for ``S`` products of
        ``act_bits x weight_bits`` signed, at most the ``ACC_BITS`` accumulator (which the
        weights keep the whole row's sum within; a narrower wrap-around is exact)."""
        prod = signed(self.act_bits + self.weight_bits)
        shape = sum_shape([prod] * self.steps)
        return shape if shape.width <= golden.ACC_BITS else signed(golden.ACC_BITS)

    @property
    def round_latency(self):
        """Cycles from issuing a round's last step to its results in the output bank: operands
        (:attr:`broadcast_latency`), product, the multipliers' sums (the first starts from the
        bias), adder tree, ReLU + rounding, clamp, bank write."""
        return 5 + self.broadcast_latency + self.tree_latency

    def beat_rounds(self, beat):
        """Rounds that must be complete before output beat ``beat`` can be sent."""
        return ceil_div(min((beat + 1) * self.lanes, self.out_dim), self.pes)

    @cached_property
    def out_banks(self):
        """Output banks (inferences whose results are held): the fewest (at least 2) with
        which the cycle model reaches ``max(R * S, in_beats, out_beats)`` cycles per inference
        (more than 2 only when a round is short next to the pipeline latency)."""
        bound = max(self.rounds * self.steps, self.in_beats, self.out_beats)
        for banks in range(2, 17):
            if self._schedule(48, banks)["interval"] <= bound:
                return banks
        return 16

    @cached_property
    def parameters(self):
        """``(W, b)``: ``W`` (out_dim x in_dim, ``weight_bits``) and ``b`` (out_dim, int32) from
        :func:`hwgen.recsys.golden.fc_params` with ``extremes`` (row 0 all the lowest weight
        with the highest bias, row 1 all the highest weight with the lowest bias) and
        ``numpy.random.default_rng(weight_seed)``."""
        rng = np.random.default_rng(self.weight_seed)
        return golden.fc_params(self.in_dim, self.out_dim, self.weight_bits, self.act_bits,
                                rng, extremes=True)

    def weight_words(self):
        """Init of PE ``p``'s weight memory: address ``r * S + j`` holds ``W[r * pes + p, j *
        mults .. j * mults + mults - 1]`` (zero past in_dim and for rows past out_dim)."""
        w, _ = self.parameters
        S, R, P, K = self.steps, self.rounds, self.pes, self.mults
        padded = np.zeros((R * P, S * K), dtype=np.int64)
        padded[:self.out_dim, :self.in_dim] = w
        blocks = padded.reshape(R, P, S, K)           # [r, p, j, k]
        return [blocks[:, p].reshape(R * S, K).tolist() for p in range(P)]

    def bias_words(self):
        """Init of PE ``p``'s bias memory: address ``r`` holds ``b[r * pes + p]`` (0 past
        out_dim)."""
        _, b = self.parameters
        padded = np.zeros(self.rounds * self.pes, dtype=np.int64)
        padded[:self.out_dim] = b
        return [padded[p::self.pes].tolist() for p in range(self.pes)]

    # -- cycle model --------------------------------------------------------------------------

    def _schedule(self, n, banks):
        """Cycle-level schedule of ``n`` inferences sent back to back with an always-ready
        output (see :meth:`performance`)."""
        S, R, Bi = self.steps, self.rounds, self.in_beats
        needs = [self.beat_rounds(b) for b in range(self.out_beats)]
        starts, releases, takes = [], [], []
        in_first, take = 0, -1
        for i in range(n):
            t = in_first + Bi                          # vector complete in the load buffer
            if i:
                t = max(t, starts[-1] + R * S)         # compute free (last issue of i - 1)
            if i >= banks:
                t = max(t, releases[i - banks] + 1)    # an output bank free
            starts.append(t)
            for need in needs:
                take = max(take + 1, t + need * S + self.round_latency)
                takes.append(take)
            releases.append(take)
            in_first = t                               # the next vector loads from the start
        # Steady state: over the second half of the run.
        h = n // 2
        interval = (starts[-1] - starts[h]) / (n - 1 - h) if n > 2 else \
            (starts[-1] - starts[0]) / max(n - 1, 1)
        return {"starts": starts, "takes": takes, "interval": interval}

    @dataclass(frozen=True)
    class Workload(contract.Workload):
        """The workload of :meth:`cycle_model` (None: steady-state figures only)."""
        inferences: int = None     # inferences back to back

    def cycle_model(self, workload):
        """Cycle model at full input rate and an always-ready output (``hwgen sim --stall 0``).

        An inference's vector loads in ``in_beats`` cycles; its compute starts in the cycle
        after its last beat once the PEs have issued the previous inference's last step and
        an output bank is free, and issues ``R * S`` steps, one per cycle. The next vector's
        first beat is accepted in that start cycle. The results of round ``r`` reach the
        output bank ``round_latency`` cycles after the round's last step, ``(r + 1) * S``
        cycles after the start; output beat ``b`` leaves one cycle after its rounds are
        complete and the beat before it has left.

        Returns ``cycles_per_inference`` (steady-state initiation interval, ``max(R * S,
        in_beats, out_beats)`` with :attr:`out_banks` banks), ``inferences_per_cycle``,
        ``latency_cycles`` (first input beat to first output beat, as ``hwgen sim``
        measures), ``cycles_single`` (one inference: first input beat to last output beat),
        ``macs_per_cycle``; with ``inferences``, ``cycles`` for that many back to back.
        """
        inferences = workload.inferences
        n = max(inferences or 0, 48)
        sched = self._schedule(n, self.out_banks)
        single = self._schedule(1, self.out_banks)
        ii = sched["interval"]
        out = {"cycles_per_inference": ii, "inferences_per_cycle": 1 / ii,
               "latency_cycles": single["takes"][0] + 1,
               "cycles_single": single["takes"][-1] + 2,
               "compute_cycles": self.rounds * self.steps,
               "macs_per_cycle": self.pes * self.mults,
               "mac_utilisation": self.in_dim * self.out_dim / (ii * self.pes * self.mults)}
        if inferences:
            run = self._schedule(inferences, self.out_banks)
            out["cycles"] = run["takes"][-1] + 2
        return out

    def derived(self):
        perf = self.performance()
        return {"steps": self.steps, "rounds": self.rounds, "in_beats": self.in_beats,
                "out_beats": self.out_beats, "multipliers": self.pes * self.mults,
                "round_latency": self.round_latency, "out_banks": self.out_banks,
                "weight_memory_bits": self.pes * self.rounds * self.steps * self.mults
                * self.weight_bits,
                "weight_range": list(golden.fc_weight_range(self.in_dim, self.weight_bits,
                                                            self.act_bits)),
                "cycles_per_inference": perf["cycles_per_inference"],
                "latency_cycles": perf["latency_cycles"]}


# Nothing of the PEs' datapath has a reset (only the control does): a synchronous reset is one
# net to thousands of flip-flops, which the placer pulls together, away from the multipliers.
# In a test design of 8 x 8 multipliers with adder trees (nextpnr-ecp5, LFE5U-85F), a reset on
# the trees' registers and half the input copies took the Fmax from 135.6 to 101.7 MHz.


def input_layout(config):
    """Payload of :class:`FC`'s ``i_x``: ``x`` (``lanes`` signed ``act_bits`` elements) and
    ``last``."""
    return data.StructLayout({"x": data.ArrayLayout(signed(config.act_bits), config.lanes),
                              "last": 1})


def output_layout(config):
    """Payload of :class:`FC`'s ``o_y``: ``y`` (``lanes`` signed ``result_bits`` elements) and
    ``last``."""
    return data.StructLayout({"y": data.ArrayLayout(signed(config.result_bits), config.lanes),
                              "last": 1})


class FC(wiring.Component):
    """Fully-connected layer ``y = requant(relu(x @ W^T + b))`` with on-chip weights,
    broadcast input and gathered outputs.

    Parameters
    ----------
    config : FCConfig

    Members
    -------
    i_x : ``In(stream.Signature(input_layout(config)))``
        Input vectors, one per inference: ``in_beats = ceil(in_dim / lanes)`` beats, beat ``k``
        carrying ``x[k * lanes .. k * lanes + lanes - 1]`` (signed ``act_bits``; lanes past
        ``in_dim`` in the last beat are ignored). TLAST on the last beat; the core counts beats
        and does not read it.
    o_y : ``Out(stream.Signature(output_layout(config)))``
        Output vectors, one per inference, in input order: ``out_beats = ceil(out_dim /
        lanes)`` beats, beat ``k`` carrying ``y[k * lanes .. k * lanes + lanes - 1]`` (signed
        ``out_bits``, or the signed 32-bit accumulator when ``out_bits`` is 0; lanes past
        ``out_dim`` are 0). TLAST on the last beat of each vector.

    Organisation
    ------------
    * Load buffer: a register per input element, written directly from its beat lane (no
      alignment network); a complete vector is copied in one cycle into the compute buffer,
      which frees the load buffer for the next vector.
    * Broadcast: the compute buffer rotates by one word per cycle, so that its first word is
      step ``j``'s ``x[j * mults ..]`` (no multiplexer); a binary tree of registers
      (:func:`~hwgen.lib.registered.register_copies`) gives every PE its own copy of that
      word, one register per multiplier input.
    * PE ``p`` (``pes`` of them): ``mults`` multipliers, each with its own weight memory of
      ``R * S`` weights (address ``r * S + j``, from its own counter), weight and product
      registers and a sum over the row's ``S`` steps; a pipelined adder tree over those sums,
      a bias memory of ``R`` words, ReLU, round half to even and clamp. Apart from the
      control, nothing in the PEs has a reset (see the note above :func:`input_layout`).
    * Gather: ``out_banks`` banks of ``out_dim`` result registers; round ``r`` of PE ``p``
      writes output ``r * pes + p`` of its inference's bank, and output beats are read from
      the banks in order, each as soon as the rounds it needs are complete (beats do not
      have to align with rounds).

    Timing
    ------
    The PEs take ``R * S`` cycles per inference (``R = ceil(out_dim / pes)``, ``S =
    ceil(in_dim / mults)``), back to back: the next vector loads while the current one is
    computed, and up to ``out_banks`` inferences' results wait for the output. Initiation
    interval ``max(R * S, in_beats, out_beats)`` cycles per inference. The first output beat
    leaves ``in_beats + need * S + round_latency + 1`` cycles after the first input beat,
    ``need`` being the rounds the first beat needs (``ceil(min(lanes, out_dim) / pes)``);
    exact model: :meth:`FCConfig.performance`.

    Backpressure: ``o_y`` may stall at any time; it is a register stage whose ``ready`` only
    advances the bank read pointer. An inference starts only when an output bank is free (a
    registered count), so the PE pipeline never stalls once started. ``i_x.ready`` is high
    while the load buffer is not holding a complete vector, or in the cycle the compute buffer
    takes it: a function of registers only, never of ``o_y.ready``.
    """

    def __init__(self, config):
        self.config = config
        super().__init__({
            "i_x": In(stream.Signature(input_layout(config))),
            "o_y": Out(stream.Signature(output_layout(config))),
        })

    def elaborate(self, platform):
        m = Module()
        load, loaded, start = self._load(m)
        busy, j, r, step, ibank, release, comp = self._issue(m, load, loaded, start)
        results = self._pes(m, comp, j, r, step)
        self._gather(m, results, busy, j, r, ibank, release)
        return m

    def _load(self, m):
        """Load buffer: ``i_x`` beats into ``load`` (element ``k`` from lane ``k % lanes`` of
        beat ``k // lanes``). Returns ``(load, loaded, start)``: ``loaded`` while it holds a
        complete vector; ``start`` (driven by :meth:`_issue`) when the compute buffer takes
        it."""
        c = self.config
        Bi, L = c.in_beats, c.lanes
        xs = signed(c.act_bits)
        # -- load buffer: element k <- lane k % lanes of beat k // lanes ------------------------
        load = [Signal(xs, name=f"load{k}", reset_less=True) for k in range(c.in_dim)]
        beat = Signal(range(Bi))
        loaded = Signal()                  # the load buffer holds a complete vector
        start = Signal()                   # the compute buffer takes it this cycle
        accept = Signal()
        m.d.comb += [
            self.i_x.ready.eq(~loaded | start),
            accept.eq(self.i_x.valid & self.i_x.ready),
        ]
        with m.If(accept):
            m.d.sync += beat.eq(Mux(beat == Bi - 1, 0, beat + 1))
            with m.Switch(beat):
                for b in range(Bi):
                    with m.Case(b):
                        for k in range(b * L, min((b + 1) * L, c.in_dim)):
                            m.d.sync += load[k].eq(self.i_x.payload.x[k - b * L])
        with m.If(accept & (beat == Bi - 1)):
            m.d.sync += loaded.eq(1)
        with m.Elif(start):
            m.d.sync += loaded.eq(0)
        return load, loaded, start

    def _issue(self, m, load, loaded, start):
        """Issue: copies a loaded vector into the compute buffer ``comp`` (driving ``start``)
        when an output bank is free, then steps ``j`` (weight word) of round ``r``, one per
        cycle. Returns ``(busy, j, r, step, ibank, release, comp)``: ``step`` is ``(start,
        advance)``, what the weight address ``r * S + j`` does at the end of the cycle (restart
        at 0, or count on); ``release`` (driven by :meth:`_gather`) frees an output bank.

        ``comp`` holds ``S`` words of ``mults`` elements (zeros past in_dim) and rotates by one
        word every cycle it does not load, so that its word 0 is the word of step ``j`` while
        busy: the broadcast needs no multiplexer."""
        c = self.config
        S, R, K, NB = c.steps, c.rounds, c.mults, c.out_banks
        xs = signed(c.act_bits)
        # -- issue: step j of round r, one per cycle while busy ---------------------------------
        comp = [[Signal(xs, name=f"comp{w * K + k}", reset_less=True) for k in range(K)]
                for w in range(S)]
        busy = Signal()
        j, r = Signal(range(S)), Signal(range(R))
        ibank = Signal(range(NB))          # output bank of the inference being issued
        nbank = Signal(range(NB))          # bank of the next inference to start
        reserved = Signal(range(NB + 1))   # banks of started inferences not yet sent out
        release = Signal()
        # registered flags, so that ``start`` is one gate of registers: this cycle issues the
        # inference's last step (``left`` counts the steps after it); every bank is reserved
        last_step, full = Signal(), Signal()
        left = Signal(range(R * S), reset_less=True)
        m.d.comb += start.eq(loaded & (~busy | last_step) & ~full)
        # rotates every cycle; a load (below) takes precedence
        m.d.sync += [comp[w][k].eq(comp[(w + 1) % S][k]) for w in range(S) for k in range(K)]
        step = Cat(start, busy & ~last_step)
        with m.If(start):
            m.d.sync += [busy.eq(1), j.eq(0), r.eq(0), ibank.eq(nbank),
                         nbank.eq(Mux(nbank == NB - 1, 0, nbank + 1)),
                         left.eq(R * S - 1), last_step.eq(R * S == 1)]
            m.d.sync += [comp[w][k].eq(load[w * K + k] if w * K + k < c.in_dim else 0)
                         for w in range(S) for k in range(K)]
        with m.Elif(last_step):
            m.d.sync += [busy.eq(0), last_step.eq(0)]
        with m.Elif(busy):
            m.d.sync += [j.eq(Mux(j == S - 1, 0, j + 1)), left.eq(left - 1),
                         last_step.eq(left == 1)]
            with m.If(j == S - 1):
                m.d.sync += r.eq(r + 1)
        reserved_next = Signal.like(reserved)
        m.d.comb += reserved_next.eq(reserved + start - release)
        m.d.sync += [reserved.eq(reserved_next), full.eq(reserved_next == NB)]
        return busy, j, r, step, ibank, release, comp

    def _pes(self, m, comp, j, r, step):
        """The PEs. Each multiplier is an island: its own weight memory (the column of the PE's
        weights it multiplies) read at the address of its own counter, the weight and input
        registers beside it, the product register and an accumulator over the row's steps
        (the first multiplier's starts from the row's bias). The PE adds its multipliers' sums
        with a pipelined tree and requantises. Returns the PEs' results (``round_latency``
        after a round's last step).

        Nothing ties the islands together but registers of bounded fanout (see
        :func:`~hwgen.lib.registered.register_copies`): per PE, copies of the input word (one
        register per multiplier input), of the address counters' ``step`` control, of the
        first-step flag and of the bias address. A multiplier's critical paths (its input
        registers to its product register) then stay inside its island, wherever the placer
        puts the DSP."""
        c = self.config
        S, R, K = c.steps, c.rounds, c.mults
        xs, ws = signed(c.act_bits), signed(c.weight_bits)
        acc_shape = signed(golden.ACC_BITS)
        T, L, Lc, P = c.tree_latency, c.broadcast_latency, c.copy_levels, c.pes

        def copies(value, extra, name):          # one per PE, Lc + extra cycles later
            value = delay(m, value, extra, name=name, reset_less=True)
            return register_copies(m, value, P, Lc, name=name, reset_less=True)
        xws = copies(Cat(*comp[0]), L - Lc, "x")
        steps = copies(step, 0, "step")
        firsts = copies(j == 0, 1 + L - Lc, "first")
        bias_addrs = copies(r, L - Lc, "bias_addr")
        results = []
        for p, (wwords, bwords) in enumerate(zip(c.weight_words(), c.bias_words())):
            xw = data.ArrayLayout(xs, K)(xws[p])
            start, advance = steps[p][0], steps[p][1]
            bmem = memory.Memory(shape=acc_shape, depth=R, init=bwords)
            m.submodules[f"pe{p}_b"] = bmem
            b_rd = bmem.read_port()
            m.d.comb += b_rd.addr.eq(bias_addrs[p])
            sums = []
            for k in range(K):
                # the step's weight address r * S + j, Lc cycles late (as its control)
                addr = Signal(range(R * S), name=f"pe{p}_addr{k}", reset_less=True)
                m.d.sync += addr.eq(Mux(start, 0, Mux(advance, addr + 1, addr)))
                wmem = memory.Memory(shape=ws, depth=R * S, init=[w[k] for w in wwords])
                m.submodules[f"pe{p}_w{k}"] = wmem
                w_rd = wmem.read_port()
                m.d.comb += w_rd.addr.eq(addr)
                wq = delay(m, w_rd.data, 1, name=f"pe{p}_wq{k}", reset_less=True)
                prod = Signal(signed(c.act_bits + c.weight_bits), name=f"pe{p}_prod{k}",
                              reset_less=True)
                m.d.sync += prod.eq(xw[k] * wq)
                # the multiplier's sum over the row's steps: the first step restarts it, from
                # the row's bias for the first multiplier, from 0 for the others
                part = Signal(acc_shape if k == 0 else c.partial_shape, name=f"pe{p}_part{k}",
                              reset_less=True)
                m.d.sync += part.eq(prod + Mux(firsts[p], b_rd.data if k == 0 else 0, part))
                sums.append(part)
            total, lat = adder_tree(m, sums, name=f"pe{p}_sum", shape=acc_shape,
                                    reset_less=True)
            assert lat == T
            results.append(self._requantise(m, total, p))
        return results

    def _gather(self, m, results, busy, j, r, ibank, release):
        """Gather: each round's ``results`` into the inference's output bank, and the output
        stage: a beat of ``o_y`` is sent once its bank holds the rounds it needs; the last
        beat drives ``release``."""
        c = self.config
        S, R, P, L = c.steps, c.rounds, c.pes, c.lanes
        Bo, NB = c.out_beats, c.out_banks
        ys = signed(c.result_bits)
        # -- gather: result banks ------------------------------------------------------------------
        res_valid = delay(m, busy & (j == S - 1), c.round_latency - 1, name="res_valid")
        res_round = delay(m, r, c.round_latency - 1, name="res_round")
        res_bank = delay(m, ibank, c.round_latency - 1, name="res_bank")
        banks = [[Signal(ys, name=f"bank{n}_y{o}", reset_less=True) for o in range(c.out_dim)]
                 for n in range(NB)]
        done = [Signal(range(R + 1), name=f"bank{n}_rounds") for n in range(NB)]
        obank = Signal(range(NB))
        obeat = Signal(range(Bo))
        with m.If(res_valid):
            with m.Switch(res_bank):
                for n in range(NB):
                    with m.Case(n):
                        with m.Switch(res_round):
                            for rr in range(R):
                                with m.Case(rr):
                                    m.d.sync += [banks[n][rr * P + p].eq(results[p])
                                                 for p in range(min(P, c.out_dim - rr * P))]
        for n in range(NB):
            with m.If(release & (obank == n)):
                m.d.sync += done[n].eq(0)
            with m.Elif(res_valid & (res_bank == n)):
                m.d.sync += done[n].eq(done[n] + 1)

        needs = Array([Const(c.beat_rounds(b), range(R + 1)) for b in range(Bo)])
        beat_ready = Signal()
        take = Signal()
        m.d.comb += [
            beat_ready.eq(Array(done)[obank] >= needs[obeat]),
            take.eq(beat_ready & (~self.o_y.valid | self.o_y.ready)),
            release.eq(take & (obeat == Bo - 1)),
        ]
        with m.If(take):
            m.d.sync += [self.o_y.valid.eq(1), self.o_y.payload.last.eq(obeat == Bo - 1),
                         obeat.eq(Mux(obeat == Bo - 1, 0, obeat + 1))]
            with m.If(obeat == Bo - 1):
                m.d.sync += obank.eq(Mux(obank == NB - 1, 0, obank + 1))
            with m.Switch(obank):
                for n in range(NB):
                    with m.Case(n):
                        with m.Switch(obeat):
                            for b in range(Bo):
                                with m.Case(b):
                                    m.d.sync += [
                                        self.o_y.payload.y[i].eq(
                                            banks[n][b * L + i] if b * L + i < c.out_dim
                                            else 0)
                                        for i in range(L)]
        with m.Elif(self.o_y.ready):
            m.d.sync += self.o_y.valid.eq(0)

    def _requantise(self, m, y, p):
        """ReLU and rounding (one register), clamp (one register) of PE ``p``'s result ``y``
        (``x @ W^T + b``, signed ``ACC_BITS``).

        ReLU tests the sign bit (no comparator). Round half to even of ``pos / 2**s`` is one
        adder, ``(pos + 2**(s-1) - 1 + pos[s]) >> s`` (``pos[s]`` is the quotient's lowest bit),
        with ``pos[s]`` as its carry-in: one carry chain between the registers."""
        c = self.config
        s = c.shift if c.out_bits else 0
        pos = Signal(y.shape(), name=f"pe{p}_relu")
        m.d.comb += pos.eq(Mux(y[-1], 0, y) if c.relu else y)
        if s:
            width = max(golden.ACC_BITS + 1, s + 2)
            wide = Signal(signed(width), name=f"pe{p}_wide")
            m.d.comb += wide.eq(pos)
            rounded = Signal(signed(width - s + 1), name=f"pe{p}_rounded", reset_less=True)
            # 2**(s-1) - 1 + pos[s] as one s-bit operand: pos[s] above s - 1 copies of ~pos[s]
            odd = wide[s]
            m.d.sync += rounded.eq((wide + Cat(*([~odd] * (s - 1)), odd)) >> s)
        else:
            rounded = Signal(y.shape(), name=f"pe{p}_rounded", reset_less=True)
            m.d.sync += rounded.eq(pos)
        out = Signal(signed(c.result_bits), name=f"pe{p}_out", reset_less=True)
        if c.out_bits:
            lo, hi = -(1 << (c.out_bits - 1)), (1 << (c.out_bits - 1)) - 1
            m.d.sync += out.eq(Mux(rounded > hi, hi, Mux(rounded < lo, lo, rounded)))
        else:
            m.d.sync += out.eq(rounded)
        return out


class FCModel(StreamModel):
    """Stream-level golden model and stimulus of :class:`FC` for the testbench.

    The item unit of ``hwgen sim --items`` is one inference (one input vector).
    """

    result_port = "o_y"
    latency_from = "i_x"

    #: Contents of successive vectors (then repeated): all the lowest value, all the
    #: highest, a lowest/highest alternation, uniform over the whole range, activation-like
    #: (ReLU of a rounded normal of sigma 2**(act_bits - 3)), its negation, all zero.
    KINDS = ("min", "max", "alternate", "random", "realistic", "negative", "zero")

    @classmethod
    def vector(cls, kind, n, bits, rng):
        """One input vector of ``kind`` (one of :attr:`KINDS`): ``n`` signed ``bits``-bit values
        (int64), random ones drawn from ``rng``."""
        lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
        if kind == "min":
            return np.full(n, lo, dtype=np.int64)
        if kind == "max":
            return np.full(n, hi, dtype=np.int64)
        if kind == "alternate":
            return np.where(np.arange(n) % 2 == 0, lo, hi).astype(np.int64)
        if kind == "random":
            return rng.integers(lo, hi, size=n, endpoint=True)
        if kind == "zero":
            return np.zeros(n, dtype=np.int64)
        act = np.clip(np.rint(rng.normal(0, 1 << (bits - 3), size=n)), 0, hi).astype(np.int64)
        return act if kind == "realistic" else -act

    @classmethod
    def stimulus(cls, config, items, rng, kinds=None):
        """``items`` vectors cycling through ``kinds`` (default :attr:`KINDS`); lanes past
        in_dim in the last input beat carry random values (the core must ignore them)."""
        kinds = kinds or cls.KINDS
        c = config
        x = np.stack([cls.vector(kinds[i % len(kinds)], c.in_dim, c.act_bits, rng)
                      for i in range(items)])
        pad = c.in_beats * c.lanes - c.in_dim
        junk = rng.integers(-(1 << (c.act_bits - 1)), 1 << (c.act_bits - 1), size=(items, pad))
        return {"x": x, "junk": junk}

    @staticmethod
    def inputs(config, stim):
        """``i_x``: each vector in ``in_beats`` beats of ``lanes`` elements ``x`` (the vector, then
        its ``junk`` padding), ``last`` on the vector's final beat."""
        c = config
        beats = []
        for x, junk in zip(stim["x"], stim["junk"]):
            words = np.concatenate([x, junk]).reshape(c.in_beats, c.lanes)
            beats += [{"x": w.tolist(), "last": int(k == c.in_beats - 1)}
                      for k, w in enumerate(words)]
        return {"i_x": beats}

    @staticmethod
    def golden(config, x):
        """The layer's outputs for input vectors ``x`` (``(items, in_dim)``):
        :func:`hwgen.recsys.golden.fc_layer` with the config's ``parameters``, ``relu``, ``shift``
        and ``out_bits``."""
        c = config
        w, b = c.parameters
        return golden.fc_layer(x, w, b, relu=c.relu, shift=c.shift, out_bits=c.out_bits)

    @classmethod
    def expect(cls, config, stim):
        """``o_y``: :meth:`golden` (:func:`hwgen.recsys.golden.fc_layer` with the config's
        ``parameters``, ``relu``, ``shift``, ``out_bits``) of every vector, zero-padded to
        ``out_beats * lanes``, in ``out_beats`` beats of ``y`` with ``last`` on the final one."""
        c = config
        y = cls.golden(c, stim["x"])
        padded = np.zeros((len(y), c.out_beats * c.lanes), dtype=np.int64)
        padded[:, :c.out_dim] = y
        beats = []
        for row in padded:
            beats += [{"y": w.tolist(), "last": int(k == c.out_beats - 1)}
                      for k, w in enumerate(row.reshape(c.out_beats, c.lanes))]
        return {"o_y": beats}

    @staticmethod
    def cycles_bound(config, stim):
        perf = config.performance()
        return int(len(stim["x"]) * perf["cycles_per_inference"] + perf["cycles_single"] + 100)


#: Simulated by tests/test_sim.py (200 inferences each): the issue's odd acceptance size (R = 5
#: rounds, the last of 5 rows; S = 13 steps, the last of 4 elements), the smallest (one
#: multiplier, one lane, raw accumulator), 16-bit odd sizes with lanes dividing neither pes nor
#: mults, a single round of a single step (input-bound, more than two output banks), more
#: lanes than PEs with 16-bit weights, one output per beat (output-bound), and the default.
TEST_CONFIGS = (
    {"in_dim": 100, "out_dim": 37, "pes": 8},
    {"in_dim": 1, "out_dim": 1, "pes": 1, "mults": 1, "lanes": 1, "out_bits": 0,
     "relu": False},
    {"in_dim": 37, "out_dim": 15, "pes": 4, "mults": 5, "lanes": 3, "weight_bits": 16,
     "act_bits": 16, "out_bits": 16, "shift": 13, "weight_seed": 7},
    {"in_dim": 24, "out_dim": 10, "pes": 10, "mults": 24, "lanes": 4, "act_bits": 16,
     "out_bits": 0, "relu": False, "weight_seed": 3},
    {"in_dim": 50, "out_dim": 33, "pes": 3, "mults": 7, "lanes": 16, "weight_bits": 16,
     "shift": 14, "weight_seed": 5},
    {"in_dim": 8, "out_dim": 40, "pes": 20, "mults": 8, "lanes": 1, "act_bits": 16,
     "out_bits": 16, "shift": 3, "relu": False, "weight_seed": 11},
    {},
)
