"""ESPN MaxSim unit: late-interaction re-ranking scores of documents streamed from storage.

ESPN (``shared/papers/espn-multivector-retrieval.txt``) keeps the per-token ("bag of words")
document embeddings of a multi-vector retriever on SSDs and re-ranks the candidates of a first
stage with the MaxSim operator, ``S(q, d) = sum_i max_j (E_q[i] . E_d[j])`` (equation 1). This
unit computes it near storage: the int8 query token embeddings are held on chip, the
candidates' token embeddings stream past, one token per beat, and one int32 score leaves per
document. :func:`hwgen.espn.golden.maxsim_scores` defines the exact result.

Default configuration: ColBERTer's 32-dimensional token embeddings, queries of up to 32 tokens,
4 query tokens per cycle (128 int8 multipliers, one document token every 8 cycles).
"""

from dataclasses import dataclass

from amaranth.hdl import Array, Cat, Module, Mux, Signal, signed
from amaranth.lib import data, memory, stream, wiring
from amaranth.lib.wiring import In, Out

from .. import contract
from ..config import Config, param
from ..errors import ConfigError
from ..lib.intmath import ceil_div
from ..lib.pipeline import CreditBuffer, adder_tree, delay, sum_shape
from . import golden

__all__ = ["MaxSimConfig", "MaxSim", "query_layout", "doc_layout", "SCORE", "TEST_CONFIGS",
           "OUTPUT_FIFO_CYCLES", "MAX_STAGES"]

#: Cycles the output FIFO adds between a score entering it and leaving on ``o_scores``.
OUTPUT_FIFO_CYCLES = 2
#: Cycles from a step's dot product to its updated running maximum: the maximum read and the
#: dot product registered side by side, then the registered comparison.
MAX_STAGES = 2


@dataclass(frozen=True)
class MaxSimConfig(Config):
    """Configuration of ``maxsim`` (:class:`MaxSim`): the embedding dimension ``dim``, the
    largest query ``q_tokens`` held on chip and the query tokens processed in parallel
    ``lanes`` (which set the cycles per document token, :attr:`groups`)."""
    dim: int = param(32, "embedding dimension: int8 values per token (ColBERTer: 32, "
                         "ColBERTv2: 128)", lo=1, hi=256)
    q_tokens: int = param(32, "largest query: query tokens held on chip (a query may have "
                              "fewer)", lo=1, hi=32)
    lanes: int = param(4, "query tokens processed in parallel (dim multipliers each); a "
                          "document token is taken every ceil(q_tokens / lanes) cycles",
                       lo=1, hi=32)

    def check(self):
        if self.lanes > self.q_tokens:
            raise ConfigError("lanes", f"must be in 1..q_tokens={self.q_tokens} (lanes beyond "
                              "the query's tokens would never work)", value=self.lanes)

    @property
    def groups(self):
        """Cycles per document token (the initiation interval): query token groups of
        ``lanes``, the last one partial when ``lanes`` does not divide ``q_tokens``."""
        return ceil_div(self.q_tokens, self.lanes)

    @property
    def dot_tree_latency(self):
        """Register stages of the adder tree summing a token dot product's ``dim`` products:
        ``ceil(log2(dim))``."""
        return (self.dim - 1).bit_length()

    @property
    def pipeline_latency(self):
        """Cycles from a step's issue to its score entering the output FIFO: lane 0's memory
        read, read-data register, two multiplier input registers, two product registers and
        the dot-product adder tree; the running maximum's :data:`MAX_STAGES` (its registered
        read beside the dot product, then the registered comparison); the lane's registered
        term; the ``lanes`` cycles of the systolic row (lane ``p`` runs ``p`` cycles behind
        lane 0; the lane sum, one adder per lane), the accumulator and its register feeding
        the FIFO."""
        return 7 + MAX_STAGES + self.dot_tree_latency + self.lanes

    @property
    def latency(self):
        """Cycles from the handshake of a document's last token (its last step) to its
        score's handshake."""
        return self.pipeline_latency + OUTPUT_FIFO_CYCLES

    @property
    def dot_bits(self):
        """Bits of a signed value that holds any dot product of two int8 vectors of ``dim``
        (:func:`hwgen.espn.golden.dot_bits`)."""
        return golden.dot_bits(self.dim)

    @property
    def score_bits(self):
        """Bits the scores need (at most 29: the int32 output never overflows)."""
        return golden.score_bits(self.dim, self.q_tokens)

    @dataclass(frozen=True)
    class Workload(contract.Workload):
        """The workload of :meth:`cycle_model` (None: steady-state figures only)."""
        # ((query tokens, (document lengths, ...)), ...) per batch, in stream order
        batches: tuple = None

    def cycle_model(self, workload):
        """Cycle model without stalls.

        ``batches``: ``[(query tokens, [document lengths]), ...]`` in stream order. Query
        ``k`` loads one token per cycle into a free buffer (two buffers: query ``k + 2``
        starts loading the cycle after the last step of batch ``k``) and is usable two
        cycles after its last token (a registered write). Every document token takes
        ``groups`` steps, one per cycle, and is acknowledged at its last; a batch's first
        step is issued when its query is usable and the previous token's steps are done.
        ``cycles`` runs from the first query token to the last score, as ``hwgen sim``
        measures it.
        """
        batches = workload.batches
        G = self.groups
        model = {"initiation_interval": G, "doc_tokens_per_cycle": 1 / G,
                 "latency_cycles": self.latency, "multipliers": self.lanes * self.dim}
        if batches:
            load_end, release, final = [], [], None
            for k, (q_len, lengths) in enumerate(batches):
                start = 0 if k == 0 else load_end[k - 1] + 1
                if k >= 2:
                    start = max(start, release[k - 2] + 1)
                load_end.append(start + q_len - 1)
                ready = load_end[k] + 2
                first = ready if final is None else max(ready, final + 1)
                final = first + sum(lengths) * G - 1
                release.append(final)
            model["cycles"] = final + self.latency + 1
            docs = sum(len(lengths) for _, lengths in batches)
            model["documents_per_cycle"] = docs / model["cycles"]
        return model

    def derived(self):
        return {"groups": self.groups, "initiation_interval_cycles": self.groups,
                "multipliers": self.lanes * self.dim, "dot_bits": self.dot_bits,
                "score_bits": self.score_bits, "pipeline_latency": self.pipeline_latency,
                "latency_cycles": self.latency,
                "query_memory_bits": 2 * self.lanes * (1 << (self.groups - 1).bit_length())
                * self.dim * 8}


def query_layout(dim):
    """One query token: ``q`` (``dim`` int8), ``last`` (TLAST) on the query's final token."""
    return data.StructLayout({"q": data.ArrayLayout(signed(8), dim), "last": 1})


def doc_layout(dim):
    """One document token: ``tok`` (``dim`` int8); ``last`` (TLAST) on a document's final
    token; ``last_doc`` with ``last`` on the final token of the last document scored against
    the current query."""
    return data.StructLayout({"tok": data.ArrayLayout(signed(8), dim), "last_doc": 1,
                              "last": 1})


#: One score per beat; TLAST on the score of a query's last document.
SCORE = data.StructLayout({"score": signed(32), "last": 1})


def _taps(m, value, cycles, name):
    """``value`` delayed by 0 .. cycles cycles (one register chain in ``m``)."""
    out = [value]
    for k in range(cycles):
        reg = Signal.like(value, name=f"{name}_d{k + 1}")
        m.d.sync += reg.eq(out[-1])
        out.append(reg)
    return out


class MaxSim(wiring.Component):
    """MaxSim scores of streamed documents against an on-chip query.

    Parameters
    ----------
    config : MaxSimConfig

    Members (AXI-Stream ports of the emitted top in brackets)
    ---------------------------------------------------------
    i_query : ``In(stream.Signature(query_layout(dim)))`` (``s_axis_query``)
        Query token embeddings, one token per beat, TLAST on the query's last token. A query
        has 1..``q_tokens`` tokens; tokens beyond ``q_tokens`` are dropped (the query is cut
        to ``q_tokens``). Two query buffers: the next query loads while documents are scored
        against the current one.
    i_docs : ``In(stream.Signature(doc_layout(dim)))`` (``s_axis_docs``)
        Document token embeddings, one token per beat, TLAST on a document's last token.
        Documents are scored against the oldest loaded query until a document whose last
        token has ``last_doc`` set (``last_doc`` is read only with TLAST); the following
        documents use the next query. Documents of one token are fine; a batch has at least
        one document.
    o_scores : ``Out(stream.Signature(SCORE))`` (``m_axis_scores``)
        One int32 ``score`` per document, in document order, ``score = sum_i max_j (q_i .
        tok_j)`` over the query's tokens ``i`` and the document's tokens ``j``; TLAST on the
        score of a batch's last document. Exact (no overflow: at most ``score_bits <= 29``
        bits are significant, sign-extended to 32; never saturates).

    Organisation
    ------------
    Query token ``t`` is stored at address ``t // lanes`` of lane memory ``t % lanes`` (one
    ``dim`` x int8 word per token, a bank bit above the address for the two buffers). Each
    document token takes ``G = ceil(q_tokens / lanes)`` steps, one per cycle: step ``g``
    reads group ``g`` of every lane memory and computes ``lanes`` dot products (``dim``
    multipliers and a pipelined adder tree per lane). The token is read where it stands on
    ``i_docs`` and acknowledged at its last step: AXI-Stream keeps TDATA stable while TVALID
    is high and TREADY low, so no capture register (and no enable fanning out to ``dim``
    bytes) is needed.

    The lanes form a systolic row: lane ``p`` works on a step ``p`` cycles after lane 0, and
    the memory address, the document token and the partial score pass from lane to lane
    through registers. Each lane keeps its ``G`` running maxima, one per group: step ``g``
    reads group ``g``'s maximum into a register beside its dot product's, compares the two
    registers and writes the larger back (a document's first token overwrites instead of
    comparing; :meth:`_running_max`), so the comparator runs from registers to a register;
    lane ``p`` then adds its updated maximum (zero for a query token beyond the query's
    length) to the sum of lanes ``0 .. p - 1``. On a document's last token the row's sums of
    the ``G`` steps are accumulated into the score.

    Registers: the lane memories' read data, both multiplier inputs (each token register
    feeds one lane's multipliers and the next lane's register: no fanout grows with
    ``lanes``), every product, every adder-tree level, the comparison and the running maxima,
    the lane sums and the accumulator; the multiplier input and product registers are
    reset-less, so that the ECP5 flow packs them into each MULT18X18D; no arithmetic follows
    a memory output or precedes a multiplier in the same cycle. The step counter's "last
    step" flag is a register, so ``i_docs.ready`` is one gate of registers.

    Timing
    ------
    Initiation interval ``G = ceil(q_tokens / lanes)`` cycles per document token (tokens of
    one document and of successive documents and batches follow without gaps while
    ``i_docs`` is valid); one score per document, so up to one score every ``G`` cycles
    (one-token documents). Latency ``11 + ceil(log2 dim) + lanes`` cycles from the
    handshake of a document's last token (its last step) to its score's handshake
    (:attr:`MaxSimConfig.latency`); ``G - 1`` cycles more from that token's first cycle of
    TVALID. A query loads one token per cycle; a batch's documents start two cycles after
    its query's last token. Cycle model of a whole run: :meth:`MaxSimConfig.performance`.

    Backpressure: ``o_scores`` may stall at any time. Scores go through an output FIFO with
    credit-based admission: a document's last step waits (and ``i_docs.ready`` stays low)
    while the FIFO could fill, and no step is issued while no query is loaded.
    ``i_docs.ready`` is a function of registers only (no combinational path from
    ``o_scores.ready``, from the other input, or from ``i_docs.valid``). ``i_query.ready``
    drops while both query buffers hold queries still in use.
    """

    def __init__(self, config):
        self.config = c = config
        super().__init__({
            "i_query": In(stream.Signature(query_layout(c.dim))),
            "i_docs": In(stream.Signature(doc_layout(c.dim))),
            "o_scores": Out(stream.Signature(SCORE)),
        })

    def elaborate(self, platform):
        c = self.config
        m = Module()
        D, P, G = c.dim, c.lanes, c.groups
        word = data.ArrayLayout(signed(8), D)
        abits = (G - 1).bit_length()

        # -- query buffers: lane memory p holds tokens p, p + P, ... at addresses 0, 1, ... ----
        mems = []
        for p in range(P):
            mem = memory.Memory(shape=word, depth=2 << abits, init=[],
                                attrs={"no_rw_check": 1})
            m.submodules[f"qmem{p}"] = mem
            mems.append((mem.write_port(), mem.read_port()))

        held, qfull, qload, loaded, rbank, qlen = self._loader(m, mems)
        out, g, base, doc_start, issue, handshake, release = self._issue(
            m, held, qfull, qload, loaded, rbank)
        dots, valid, first, live_at, t_dot = self._dot_lanes(
            m, mems, g, base, rbank, qlen, doc_start, issue)
        self._max_sum(m, out, dots, valid, first, live_at, t_dot, g, handshake, release)
        return m

    def _loader(self, m, mems):
        """Query loader: writes ``i_query`` tokens round-robin into the lane memories of
        ``mems`` (bank ``wbank``). Returns ``(held, qfull, qload, loaded, rbank, qlen)``:
        ``held``/``qfull`` count the queries loading/loaded (updated by :meth:`_issue`),
        ``qload`` is the token handshake, ``loaded`` strobes a cycle after a query's last
        token, ``rbank`` is the bank being read and ``qlen`` the two banks' query lengths."""
        c = self.config
        D, P, G, Q = c.dim, c.lanes, c.groups, c.q_tokens
        word = data.ArrayLayout(signed(8), D)
        abits = (G - 1).bit_length()
        # Loader: tokens counted per query; the write is registered (one cycle after the
        # handshake), so a query becomes usable (``qfull``) a cycle after its last write.
        held = Signal(range(3))            # queries loading or loaded, not yet released
        qfull = Signal(range(3))           # queries completely written, not yet released
        wbank, rbank = Signal(name="wbank"), Signal(name="rbank")
        w_lane = Signal(range(P))
        w_addr = Signal(range(G))
        w_count = Signal(range(Q + 1))     # tokens of the current query, saturating at Q
        qlen = [Signal(range(Q + 1), name=f"qlen{b}") for b in range(2)]
        qload = Signal()
        m.d.comb += [
            self.i_query.ready.eq(held < 2),
            qload.eq(self.i_query.valid & self.i_query.ready),
        ]
        wr_data = Signal(word, name="wr_data")
        wr_en = Signal(P, name="wr_en")
        wr_addr = Signal(abits + 1, name="wr_addr")
        loaded = Signal()                  # the registered write of a query's last token
        loaded_len = Signal(range(Q + 1))
        loaded_bank = Signal()
        room = Signal()
        m.d.comb += room.eq(w_count != Q)
        m.d.sync += [
            wr_data.eq(self.i_query.payload.q),
            wr_addr.eq(Cat(w_addr, wbank)),
            loaded.eq(qload & self.i_query.payload.last),
            loaded_len.eq(Mux(room, w_count + 1, Q)),
            loaded_bank.eq(wbank),
        ]
        for p in range(P):
            m.d.sync += wr_en[p].eq(qload & room & (w_lane == p))
        for p, (wr, _) in enumerate(mems):
            m.d.comb += [wr.addr.eq(wr_addr), wr.data.eq(wr_data), wr.en.eq(wr_en[p])]
        with m.If(qload):
            with m.If(self.i_query.payload.last):
                m.d.sync += [w_lane.eq(0), w_addr.eq(0), w_count.eq(0), wbank.eq(~wbank)]
            with m.Elif(room):
                m.d.sync += w_count.eq(w_count + 1)
                with m.If(w_lane == P - 1):
                    m.d.sync += [w_lane.eq(0), w_addr.eq(w_addr + 1)]
                with m.Else():
                    m.d.sync += w_lane.eq(w_lane + 1)
        with m.If(loaded):
            for b in range(2):
                with m.If(loaded_bank == b):
                    m.d.sync += qlen[b].eq(loaded_len)
        return held, qfull, qload, loaded, rbank, qlen

    def _issue(self, m, held, qfull, qload, loaded, rbank):
        """Issue: ``G`` steps per ``i_docs`` beat while a query is loaded, the beat
        acknowledged at its last step (which waits for an output credit of ``out``, the
        score FIFO created here). Returns ``(out, g, base, doc_start, issue, handshake,
        release)``; ``release`` frees the query after a batch's last document."""
        c = self.config
        P, G = c.lanes, c.groups
        # -- issue: G steps per document token --------------------------------------------------
        # A beat is read where it stands on i_docs (AXI-Stream holds TDATA while TVALID is high
        # and TREADY low) and acknowledged at its last step, so no enable fans out to a
        # capture register of dim bytes: the datapath takes the payload through plain delays.
        m.submodules.out = out = CreditBuffer(SCORE, latency=c.pipeline_latency,
                                              registered_ready=True)
        wiring.connect(m, wiring.flipped(self.o_scores), out.o)
        payload = self.i_docs.payload
        g = Signal(range(G))
        final_g = Signal(init=int(G == 1))  # g == G - 1, kept as a register
        base = Signal(range(G * P))        # g * P: the step's first query token
        doc_start = Signal(init=1)         # the beat on i_docs starts a document
        issue, handshake, release = (Signal(name=n) for n in ("issue", "handshake", "release"))
        loaded_any = Signal()
        m.d.comb += [
            loaded_any.eq(qfull != 0),
            # the last step waits for an output credit (a document's last token leaves a
            # score), earlier steps only for the query
            issue.eq(self.i_docs.valid & loaded_any & (~final_g | out.ready)),
            self.i_docs.ready.eq(final_g & loaded_any & out.ready),
            handshake.eq(self.i_docs.valid & self.i_docs.ready),
            out.take.eq(handshake & payload.last),
            release.eq(handshake & payload.last & payload.last_doc),
        ]
        m.d.sync += [held.eq(held + (qload & self.i_query.payload.last) - release),
                     qfull.eq(qfull + loaded - release)]
        with m.If(release):
            m.d.sync += rbank.eq(~rbank)
        with m.If(issue):
            m.d.sync += [g.eq(g + 1), base.eq(base + P), final_g.eq(g == G - 2)]
            with m.If(final_g):
                m.d.sync += [g.eq(0), base.eq(0), final_g.eq(G == 1)]
        with m.If(handshake):
            m.d.sync += doc_start.eq(payload.last)
        return out, g, base, doc_start, issue, handshake, release

    def _dot_lanes(self, m, mems, g, base, rbank, qlen, doc_start, issue):
        """Datapath, first half: each lane's dot product of its query token with the document
        token (lane ``p`` a cycle behind lane ``p - 1``). Returns ``(dots, valid, first,
        live_at, t_dot)``: the tap lists of the step's valid and first-token signals and of its
        lane-liveness bits (``live``, a cycle behind the others), and the cycle of lane 0's dot
        product."""
        c = self.config
        D, P, G, Q = c.dim, c.lanes, c.groups, c.q_tokens
        word = data.ArrayLayout(signed(8), D)
        payload = self.i_docs.payload
        # -- datapath: lanes in a systolic row --------------------------------------------------
        # Lane p works on a step p cycles after lane 0: its memory address, the document token
        # and the lane partial sums pass from lane to lane through registers, so every
        # register feeding a multiplier feeds that multiplier (and the next lane's copy) only,
        # and the maxima are added by a chain of adders, one per lane, in step with the row.
        # Step issued in cycle 0; lane p: address in cycle p, read data registered in p + 1,
        # the lane's operand registers in p + 2, each multiplier's own input registers in
        # p + 3, products in p + 4 and p + 5, dot product in p + t_dot. With most of the
        # device's DSPs in use they are spread over the die: a multiplier's own input and
        # product registers can sit beside it, and the registers before and after them take
        # the long routes with no logic in the path.
        t_dot = 5 + c.dot_tree_latency
        addr = _taps(m, Cat(g, rbank), P - 1, "addr")
        tok = _taps(m, payload.tok, P + 1, "tok")
        valid = _taps(m, issue, t_dot + P + MAX_STAGES + 1, "v")
        first = _taps(m, doc_start, t_dot + P - 1, "first")
        # query tokens of the step's group that exist: ``left`` (registered in cycle 1) is
        # the query's length minus the group's first token; ``live`` (cycle 2) holds lane p's
        # ``left > p`` in bit p, and only its register chain runs along the lanes (lane p
        # takes its bit in p + t_dot): no comparator sits at the end of a long route
        qlen_cur = Signal(range(Q + 1))
        left = Signal(range(-G * P, Q + 1))
        live = Signal(P)
        m.d.comb += qlen_cur.eq(Mux(rbank, qlen[1], qlen[0]))
        m.d.sync += [left.eq(qlen_cur - base), live.eq(Cat(left > p for p in range(P)))]
        live_at = _taps(m, live, t_dot + P + MAX_STAGES - 4, "live")

        dots = []
        for p, (_, rd) in enumerate(mems):
            m.d.comb += rd.addr.eq(addr[p])
            q_reg = Signal(word, name=f"q{p}")
            m.d.sync += q_reg.eq(rd.data)
            prods = []
            for k in range(D):
                # reset-less, so that ECP5 packing can move them into the MULT18X18D's
                # input and output registers (hwgen.flow.ecp5_dsp_pack); valid gates them
                q_op = Signal(signed(8), name=f"q_op{p}_{k}", reset_less=True)
                tok_op = Signal(signed(8), name=f"tok_op{p}_{k}", reset_less=True)
                prod = Signal(signed(16), name=f"prod{p}_{k}", reset_less=True)
                m.d.sync += [q_op.eq(q_reg[k]), tok_op.eq(tok[p + 2][k]),
                             prod.eq(q_op * tok_op)]
                prods.append(delay(m, prod, 1, name=f"prod{p}_{k}"))
            dot, tree = adder_tree(m, prods, name=f"dot{p}")
            assert tree == c.dot_tree_latency
            dots.append(dot)
        dot_shape = dots[0].shape()
        assert dot_shape.width <= c.dot_bits + 1
        return dots, valid, first, live_at, t_dot

    def _running_max(self, m, p, dot, first, valid, group):
        """Lane ``p``'s ``G`` running maxima, one per query token group; returns the step's
        updated maximum, valid :data:`MAX_STAGES` cycles after the step (``dot``, ``first``,
        ``valid`` and ``group`` are the step's, in its cycle).

        With ``G >= 3`` the maxima are ``G`` registers indexed by the group: the step reads
        its group's maximum into a register beside the dot product's (stage 1; a copy of each
        in offset binary, the old maximum of a query's first step as the smallest value),
        compares the two copies (stage 2: ``take``, the carry out of one unsigned subtraction)
        and writes the chosen one back in the next cycle, so the comparator's inputs and output
        are all registers and no path runs from the dot product's adder tree or from the maxima
        through the comparator. A group's maximum is
        read again ``G`` steps (at least ``G`` cycles) later and written two cycles after its
        step, hence ``G >= 3``. ``G == 2`` keeps a ring (one stored maximum and the latest
        step as ``(take, dot, old)``, resolved by a mux on its way into the ring) and ``G ==
        1`` compares and writes in one cycle; both delay the result by a register to the same
        latency."""
        G = self.config.groups
        shape = dot.shape()
        if G >= 3:
            maxima = [Signal(shape, name=f"max{p}_{j}", reset_less=True) for j in range(G)]
            dot_c = Signal(shape, name=f"dot_c{p}", reset_less=True)
            old_c = Signal(shape, name=f"old_c{p}", reset_less=True)
            old = Array(maxima)[group]
            m.d.sync += [dot_c.eq(dot), old_c.eq(old)]
            # The comparator's copies in offset binary (sign bit flipped: signed order becomes
            # unsigned order), a first step's old maximum as the smallest value: ``take`` is
            # the carry out of one unsigned subtraction, with no sign or ``first`` logic after
            # the carry chain. ``>=`` takes an equal dot product, the same value.
            sign = 1 << (shape.width - 1)
            dot_u = Signal(shape.width, name=f"dot_u{p}", reset_less=True)
            old_u = Signal(shape.width, name=f"old_u{p}", reset_less=True)
            m.d.sync += [dot_u.eq(dot.as_unsigned() ^ sign),
                         old_u.eq(Mux(first, 0, old.as_unsigned() ^ sign))]
            take = Signal(name=f"take{p}", reset_less=True)
            dot_d = Signal(shape, name=f"dot_d{p}", reset_less=True)
            old_d = Signal(shape, name=f"old_d{p}", reset_less=True)
            m.d.sync += [take.eq(dot_u >= old_u), dot_d.eq(dot_c), old_d.eq(old_c)]
            latest = Signal(shape, name=f"latest{p}")
            m.d.comb += latest.eq(Mux(take, dot_d, old_d))
            write = delay(m, valid, MAX_STAGES, name=f"max_we{p}")
            slot = delay(m, group, MAX_STAGES, name=f"max_slot{p}")
            for j in range(G):
                with m.If(write & (slot == j)):
                    m.d.sync += maxima[j].eq(latest)
            return latest
        if G == 1:
            regs = [Signal(shape, name=f"max{p}_0")]
            with m.If(valid):
                m.d.sync += regs[0].eq(Mux(first | (dot > regs[0]), dot, regs[0]))
            return delay(m, regs[0], MAX_STAGES - 1, name=f"upd{p}")
        regs = [Signal(shape, name=f"max{p}_{j}") for j in range(G - 1)]
        take = Signal(name=f"take{p}")
        dot_r, old_r = Signal(shape, name=f"dot_r{p}"), Signal(shape, name=f"old_r{p}")
        latest = Signal(shape, name=f"latest{p}")
        m.d.comb += latest.eq(Mux(take, dot_r, old_r))
        with m.If(valid):
            m.d.sync += [take.eq(first | (dot > regs[0])), dot_r.eq(dot), old_r.eq(regs[0]),
                         regs[G - 2].eq(latest)]
            for j in range(G - 2):
                m.d.sync += regs[j].eq(regs[j + 1])
        return delay(m, latest, MAX_STAGES - 1, name=f"upd{p}")

    def _max_sum(self, m, out, dots, valid, first, live_at, t_dot, g, handshake, release):
        """Datapath, second half: each lane's running maxima over the document (one per
        group), summed along the lanes and over the groups into the score, which enters
        ``out`` ``pipeline_latency`` cycles after its document's last handshake."""
        c = self.config
        P, Q = c.lanes, c.q_tokens
        dot_shape = dots[0].shape()
        payload = self.i_docs.payload
        # Running maxima: G per lane, one per group (_running_max). In cycle p + t_dot +
        # MAX_STAGES lane p registers its updated maximum (zero past the query's length) as
        # its term, and adds the term to the sum of lanes 0 .. p - 1 a cycle later: the
        # maximum's select (a mux after the comparison's register) and the lane's adder are in
        # different cycles.
        partial = None
        group = _taps(m, g, t_dot + P - 1, "g")
        for p, dot in enumerate(dots):
            t = t_dot + p
            updated = self._running_max(m, p, dot, first[t], valid[t], group[t])
            exists = Signal(name=f"exists{p}")
            m.d.sync += exists.eq(live_at[t + MAX_STAGES - 3][p])
            term = Signal(dot_shape, name=f"term{p}")
            m.d.sync += term.eq(Mux(exists, updated, 0))
            total = Signal(sum_shape([dot_shape] * (p + 1)), name=f"lanesum{p}")
            m.d.sync += total.eq(term if partial is None else partial + term)
            partial = total
        t_part = t_dot + P + MAX_STAGES + 1            # cycle of the sum over the lanes

        acc_shape = sum_shape([dot_shape] * Q)
        assert acc_shape.width <= 32
        acc = Signal(acc_shape, name="acc")
        g0_part = delay(m, g == 0, t_part, name="g0_part")
        with m.If(valid[t_part]):
            m.d.sync += acc.eq(Mux(g0_part, 0, acc) + partial)

        lat = c.pipeline_latency
        assert lat == t_part + 1
        m.d.comb += [
            out.i.valid.eq(delay(m, handshake & payload.last, lat, name="score_valid")),
            out.i.payload.score.eq(acc),
            out.i.payload.last.eq(delay(m, release, lat, name="score_last")),
        ]


#: Simulated by tests/test_sim.py: odd sizes with a partial last group (5 tokens in lanes of
#: 2), one lane and one-element tokens, every query token in parallel (one cycle per token),
#: ColBERTv2-sized tokens (128) with 3 lanes (a partial last group of 2), and the default
#: (ColBERTer, 32 x 32, 4 lanes).
TEST_CONFIGS = (
    {"dim": 13, "q_tokens": 5, "lanes": 2},
    {"dim": 1, "q_tokens": 3, "lanes": 1},
    {"dim": 6, "q_tokens": 7, "lanes": 7},
    {"dim": 128, "q_tokens": 32, "lanes": 3},
    {},
)
