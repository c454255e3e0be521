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
from amaranth.hdl import Array, Const, Module, Mux, Signal, signed
from amaranth.lib import data, memory, stream, wiring
from amaranth.lib.wiring import In, Out

from .. import contract
from ..config import Config, param
from ..errors import ConfigError
from ..flow.model import StreamModel
from ..lib.intmath import ceil_div
from ..lib.pipeline import adder_tree, delay
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
    def round_latency(self):
        """Cycles from issuing a round's last step to its results in the output bank: input
        word and weight read, product, adder tree, accumulate, bias, ReLU + rounding, clamp,
        bank write."""
        return 7 + self.tree_latency

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
    * Broadcast: in each step ``j`` the compute buffer's word ``x[j * mults ..]`` is
      registered and fanned out to all PEs.
    * PE ``p`` (``pes`` of them): weight memory of ``R * S`` words of ``mults`` weights
      (address ``r * S + j``), ``mults`` multipliers, a pipelined adder tree, an accumulator
      over the ``S`` steps, a bias memory of ``R`` words, ReLU, round half to even and clamp.
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
        busy, j, r, waddr, ibank, release, comp = self._issue(m, load, loaded, start)
        results = self._pes(m, comp, j, r, waddr)
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
        cycle. Returns ``(busy, j, r, waddr, ibank, release, comp)``; ``release`` (driven by
        :meth:`_gather`) frees an output bank."""
        c = self.config
        S, R, NB = c.steps, c.rounds, c.out_banks
        xs = signed(c.act_bits)
        # -- issue: step j of round r, one per cycle while busy ---------------------------------
        comp = [Signal(xs, name=f"comp{k}", reset_less=True) for k in range(c.in_dim)]
        busy = Signal()
        j, r = Signal(range(S)), Signal(range(R))
        waddr = Signal(range(R * S))       # r * S + j
        ibank = Signal(range(NB))          # output bank of the inference being issued
        nbank = Signal(range(NB))          # bank of the next inference to start
        reserved = Signal(range(NB + 1))   # banks of started inferences not yet sent out
        release = Signal()
        last_step = Signal()
        m.d.comb += [
            last_step.eq(busy & (j == S - 1) & (r == R - 1)),
            start.eq(loaded & (~busy | last_step) & (reserved < NB)),
        ]
        with m.If(start):
            m.d.sync += [busy.eq(1), j.eq(0), r.eq(0), waddr.eq(0), ibank.eq(nbank),
                         nbank.eq(Mux(nbank == NB - 1, 0, nbank + 1))]
            m.d.sync += [dst.eq(src) for dst, src in zip(comp, load)]
        with m.Elif(last_step):
            m.d.sync += busy.eq(0)
        with m.Elif(busy):
            m.d.sync += [j.eq(Mux(j == S - 1, 0, j + 1)), waddr.eq(waddr + 1)]
            with m.If(j == S - 1):
                m.d.sync += r.eq(r + 1)
        m.d.sync += reserved.eq(reserved + start - release)
        return busy, j, r, waddr, ibank, release, comp

    def _pes(self, m, comp, j, r, waddr):
        """The broadcast word (``mults`` elements of ``comp``, registered) and the PEs: each
        multiplies it by its weight word, sums, accumulates over a round's steps, adds the
        bias and requantises. Returns the PEs' results (``round_latency`` after the step)."""
        c = self.config
        S, R, K = c.steps, c.rounds, c.mults
        xs = signed(c.act_bits)
        acc_shape = signed(golden.ACC_BITS)
        # -- broadcast word (registered; zero past in_dim) ---------------------------------------
        xw = Signal(data.ArrayLayout(xs, K), reset_less=True)
        with m.Switch(j):
            for jj in range(S):
                with m.Case(jj):
                    m.d.sync += [xw[k].eq(comp[jj * K + k] if jj * K + k < c.in_dim else 0)
                                 for k in range(K)]

        # -- PEs ----------------------------------------------------------------------------------
        T = c.tree_latency
        first = delay(m, j == 0, 2 + T, name="first")          # with the tree's sum
        bias_addr = delay(m, r, 2 + T, name="bias_addr")        # read with the final acc
        results = []
        for p, (wwords, bwords) in enumerate(zip(c.weight_words(), c.bias_words())):
            wmem = memory.Memory(shape=data.ArrayLayout(signed(c.weight_bits), K),
                                 depth=R * S, init=wwords)
            bmem = memory.Memory(shape=acc_shape, depth=R, init=bwords)
            m.submodules[f"pe{p}_w"], m.submodules[f"pe{p}_b"] = wmem, bmem
            w_rd, b_rd = wmem.read_port(), bmem.read_port()
            m.d.comb += [w_rd.addr.eq(waddr), b_rd.addr.eq(bias_addr)]
            prods = []
            for k in range(K):
                prod = Signal(signed(c.act_bits + c.weight_bits), name=f"pe{p}_prod{k}",
                              reset_less=True)
                m.d.sync += prod.eq(xw[k] * w_rd.data[k])
                prods.append(prod)
            total, lat = adder_tree(m, prods, name=f"pe{p}_sum", shape=acc_shape)
            assert lat == T
            # Accumulates every cycle; the first step of each row restarts it.
            acc = Signal(acc_shape, name=f"pe{p}_acc", reset_less=True)
            m.d.sync += acc.eq(Mux(first, total, acc + total))
            y = Signal(acc_shape, name=f"pe{p}_y", reset_less=True)
            m.d.sync += y.eq(acc + b_rd.data)
            results.append(self._requantise(m, y, p))
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
        """ReLU and rounding (one register), clamp (one register) of PE ``p``'s result."""
        c = self.config
        s = c.shift if c.out_bits else 0
        pos = Signal(y.shape(), name=f"pe{p}_relu")
        m.d.comb += pos.eq(Mux(y < 0, 0, y) if c.relu else y)
        if s:
            width = max(golden.ACC_BITS + 1, s + 2)
            wide = Signal(signed(width), name=f"pe{p}_wide")
            m.d.comb += wide.eq(pos)
            q = wide >> s
            rem = wide[:s]
            half = 1 << (s - 1)
            up = (rem > half) | ((rem == half) & q[0])
            rounded = Signal(signed(width - s + 1), name=f"pe{p}_rounded", reset_less=True)
            m.d.sync += rounded.eq(q + up)
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
