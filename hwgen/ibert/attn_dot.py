"""I-BERT attention dot product of one head: ``S = Q @ K^T`` (paper section 7.1.2, Fig. 12).

``Q`` (``M x d``) and ``K`` (``M x d``) int8 stream in on two AXI-Streams, one row per beat
(``d = H / A``, 64 in BERT-base); ``S`` (``M x M``) int32 leaves one score per beat. ``pes``
PEs compute dot products: a row of Q is broadcast to every PE and the rows of K (the columns of
``K^T``) are scattered over the PEs, K row ``c`` to PE ``c mod pes``. K is padded inside the
core to the minimum ``pes * ceil(M / pes)`` rows (zero rows written one per cycle after the
last real row) and the padding columns are removed from the output: S has exactly M columns.
M is any length from 1 to ``max_len``; no padding to the maximum length.

Small configuration used for ``hwgen sim ibert-attn-dot``: ``--set head_dim=24 --set
max_len=40 --set pes=5``. The defaults are one BERT-base head (d = 64, M <= 128) with 16 PEs.
"""

from dataclasses import dataclass

import numpy as np
from amaranth.hdl import Array, Cat, Module, Mux, Signal, Value, signed
from amaranth.lib import data, memory, stream, wiring
from amaranth.lib.wiring import In, Out

from .. import contract
from ..config import Config, param
from ..errors import ConfigError
from ..flow.model import StreamModel
from ..lib.pipeline import delay
from ..lib.row_ports import RowKernel, RowPort
from .layernorm import NO_COLLISIONS
from .matrix_common import GroupSerializer, ceil_div, matrix_int8, matrix_sizes

__all__ = ["AttnDotConfig", "AttnDot", "AttnDotModel", "TEST_CONFIGS", "SELECT_CHUNK"]


@dataclass(frozen=True)
class AttnDotConfig(Config, RowKernel):
    """Configuration of ``ibert-attn-dot`` (:class:`AttnDot`): the row length ``head_dim``
    of Q and K, the longest sequence ``max_len`` and the number of PEs ``pes`` (score columns
    computed in parallel, at most ``head_dim`` and ``max_len``)."""
    head_dim: int = param(64, "d = H / A: row length of Q and K", lo=1, hi=256)
    max_len: int = param(128, "largest sequence length M", lo=1, hi=4096)
    pes: int = param(16, "PEs: K rows (score columns) computed in parallel, one MAC per "
                         "cycle each", lo=1, hi=256)

    def check(self):
        if self.pes > self.head_dim:
            raise ConfigError("pes", f"must be in 1..head_dim={self.head_dim} (a round of "
                              "pes scores takes head_dim cycles and leaves one score per cycle)",
                              value=self.pes)
        if self.pes > self.max_len:
            raise ConfigError("pes", f"must be in 1..max_len={self.max_len}", value=self.pes)

    @property
    def max_rounds(self):
        """Rows of K per PE: ``ceil(max_len / pes)``."""
        return ceil_div(self.max_len, self.pes)

    @property
    def chunk(self):
        """Elements per word of the K memories: the largest of 4, 3, 2, 1 that divides
        ``head_dim`` and leaves at least ``pes`` words per row (so every PE has a memory of
        its own in each cycle)."""
        return next(cs for cs in range(SELECT_CHUNK, 0, -1)
                    if self.head_dim % cs == 0 and self.head_dim // cs >= self.pes)

    @property
    def chunks(self):
        """K memories (words per row): ``head_dim / chunk``."""
        return self.head_dim // self.chunk

    @property
    def acc_bits(self):
        """Bits of a PE's signed accumulator: a 16-bit int8 product plus
        ``ceil(log2(head_dim))`` bits of growth over the ``head_dim`` products."""
        return 16 + (self.head_dim - 1).bit_length()

    #: Cycles from issuing a round's last step to its scores reaching the serializer:
    #: memory read, read-data register and a second word register, element select (two
    #: registered steps: the PE's word, then its element), multiplier-input register,
    #: product, accumulate.
    latency = 8

    @dataclass(frozen=True)
    class Workload(contract.Workload):
        """The workload of :meth:`cycle_model` (None: steady-state figures only)."""
        m: int = None     # M: tokens of the sentence (rows of K)
        m_q: int = None     # query rows

    def cycle_model(self, workload):
        """Cycle model (:func:`hwgen.ibert.model.attn_dot_cycles`) for M = ``m``."""
        m, m_q = workload.m, workload.m_q
        from .model import attn_dot_cycles
        return attn_dot_cycles(self, m, m_q)

    matrix_inputs = ("k",)

    def row_ports(self):
        """``i_k``, ``i_q``: one int8 row of ``head_dim`` per beat, TLAST on the matrix's last
        row; ``o_s``: int32 scores, one per beat, rows of up to ``max_len``."""
        d = self.head_dim
        return ([RowPort("i_k", "k", signed(8), d, d, framing="beat"),
                 RowPort("i_q", "q", signed(8), d, d, framing="beat")],
                RowPort("o_s", "s", signed(32), 1, max_row=self.max_len, last_row=True,
                        array=False))

    def max_tokens(self):
        """:meth:`RowKernel.max_tokens`: ``max_len``."""
        return self.max_len

    def row_timing(self, m):
        """:meth:`RowKernel.row_timing`: a query row's scores after the whole K."""
        a = self.performance(self.workload(m=m, m_q=1))
        return a["cycles_per_matrix"] - m, a["cycles_per_row"]

    def derived(self):
        return {"max_rounds": self.max_rounds, "macs": self.pes,
                "accumulator_bits": self.acc_bits, "pipeline_latency": self.latency,
                "k_memories": self.chunks, "k_word_elements": self.chunk,
                "k_memory_bits": self.k_memory_bits}

    @property
    def k_words(self):
        """Words of each K memory: two banks of ``2**ceil(log2 max_rounds) *
        2**ceil(log2 pes)`` (address: bank, round, PE)."""
        return 2 << ((self.max_rounds - 1).bit_length() + (self.pes - 1).bit_length())

    @property
    def k_memory_bits(self):
        """Bits of the K memories: ``chunks`` memories of :attr:`k_words` words of ``chunk``
        int8 elements."""
        return self.chunks * self.k_words * self.chunk * 8


def _banked(bank, addr):
    """The address ``addr`` in bank ``bank`` (the bank bit on top)."""
    return Cat(addr, bank)


def row_layout(d, name):
    """Payload of ``i_q``/``i_k``: one row, field ``name`` (``d`` int8 elements), and
    ``last`` (TLAST, the matrix's last row)."""
    return data.StructLayout({name: data.ArrayLayout(signed(8), d), "last": 1})


SCORE = data.StructLayout({"s": signed(32), "last_row": 1, "last": 1})


#: Most int8 elements in a word of a K memory (32 bits: one ECP5 DP16KD or UltraScale+
#: RAMB18 word; the element select after it is at most 4:1).
SELECT_CHUNK = 4


def _rotating_index(m, start, n, step, name, down=False):
    """A register that starts at ``start`` and counts modulo ``n`` (up, or ``down``) on
    ``step``."""
    idx = Signal(range(n), init=start, name=name)
    with m.If(step):
        if down:
            m.d.sync += idx.eq(Mux(idx == 0, n - 1, idx - 1))
        else:
            m.d.sync += idx.eq(Mux(idx == n - 1, 0, idx + 1))
    return idx


def _rotate_left(m, words, shifts, step, name):
    """``words`` rotated left by ``shift * step``, registered: output ``i`` is
    ``words[(i + shifts[i] * step) mod len(words)]`` a cycle later, a ``len(shifts[i])``-bit
    select (at most 4:1 here). Each output has its own shift register (``shifts[i]``), so no
    select fans out to every word."""
    n = len(words)
    count = -(-n // step) if step > 1 else min(n, SELECT_CHUNK)
    out = []
    for i in range(n):
        word = Signal(len(words[0]), name=f"{name}{i}", reset_less=True)
        options = [words[(i + s * step) % n] for s in range(count)]
        m.d.sync += word.eq(Array(options)[shifts[i]] if count > 1 else options[0])
        out.append(word)
    return out


def _rotated_words(m, words, win, name):
    """``words`` (one per K memory, or the Q row's) registered and rotated left by the window
    ``win`` (``win`` as it was two cycles before ``words``' first register): two registered
    steps of at most 4:1 (by ``win mod 4``, then by ``4 * (win // 4)``), so output ``p`` is
    word ``(win + p) mod chunks``, PE ``p``'s. Returns the outputs, three registers after
    ``words``."""
    n = len(words)
    first = [Signal(len(w), name=f"{name}_d1_{i}", reset_less=True) for i, w in enumerate(words)]
    m.d.sync += [f.eq(w) for f, w in zip(first, words)]
    low = [delay(m, win[:2], 2, name=f"{name}_lo{i}") for i in range(n)]
    high = [delay(m, win[2:], 3, name=f"{name}_hi{i}") for i in range(n)]
    by_low = _rotate_left(m, first, low, 1, f"{name}_d2_")
    return _rotate_left(m, by_low, high, SELECT_CHUNK, f"{name}_rot")


def _select_element(m, word, elem_idx, name):
    """Element ``elem_idx`` of ``word`` (int8 elements), registered (at most
    :data:`SELECT_CHUNK`:1)."""
    parts = [word[k:k + 8].as_signed() for k in range(0, len(word), 8)]
    elem = Signal(signed(8), name=f"{name}_e", reset_less=True)
    m.d.sync += elem.eq(Array(parts)[elem_idx] if len(parts) > 1 else parts[0])
    return elem


class AttnDot(wiring.Component):
    """Attention dot product ``S = Q @ K^T`` of one head.

    Parameters
    ----------
    config : AttnDotConfig

    Members
    -------
    i_k : ``In(stream.Signature(row_layout(head_dim, "k")))``
        K, one row per beat; TLAST on the matrix's last row (its count is M_k <= max_len).
    i_q : ``In(stream.Signature(row_layout(head_dim, "q")))``
        Q, one row per beat; TLAST on the matrix's last row. Matrices of Q and K pair up in
        order; Q may have a different row count M_q (cross-attention), usually M_q = M_k.
    o_s : ``Out(stream.Signature(SCORE))``
        S, row by row, one int32 score per beat, ``S[i, c] = Q[i] . K[c]`` for ``c < M_k`` only
        (padding removed). TLAST on each row's last score; ``last_row`` on every score of the
        matrix's last row.

    Organisation
    ------------
    K row ``c`` belongs to PE ``c mod pes``, round ``c // pes``; after the last row, zero rows
    pad K to ``Mp = pes * ceil(M_k / pes)`` rows, one per cycle. A row is stored as
    ``chunks = head_dim / chunk`` words of ``chunk`` (at most 4) elements, word ``w`` in K
    memory ``w`` at address (bank, round, PE): one write to every memory per row, and
    ``chunks`` memories for all the PEs (not a row-wide memory per PE). Every Q row is
    computed in ``R = Mp / pes`` rounds of ``head_dim`` cycles; in round ``r`` PE ``p``
    multiplies, in cycle ``j``, element ``e`` of the Q row with element ``e`` of K row
    ``r * pes + p``, where ``e`` is element ``j mod chunk`` of word ``(j // chunk + p) mod
    chunks``: the PEs walk the words in rotated order, so in each cycle every memory serves
    at most one PE (``pes <= chunks``) and is read at that PE's address. The round's real
    scores (``c < M_k``) are then sent one per cycle, which keeps up because ``pes <=
    head_dim``. K is double-buffered: the next head's K loads while the current head is
    computed; Q rows are double-buffered.

    Timing
    ------
    A Q row takes ``R * head_dim`` cycles (initiation interval), rows and heads follow without
    gaps. The first score leaves ``Mp + head_dim + 10`` cycles after the first Q beat when K
    arrives alongside (K load and padding, one round, accumulate and output FIFO); a round's
    scores follow one per cycle. Exact formulas: :func:`hwgen.ibert.model.attn_dot_cycles`.

    Backpressure: ``o_s`` may stall at any time; rounds wait at their last step while the
    output FIFO could fill (credits), never combinationally on ``o_s.ready``.
    """

    def __init__(self, config):
        self.config = c = config
        super().__init__({
            "i_k": In(stream.Signature(row_layout(c.head_dim, "k"))),
            "i_q": In(stream.Signature(row_layout(c.head_dim, "q"))),
            "o_s": Out(stream.Signature(SCORE)),
        })

    def elaborate(self, platform):
        m = Module()
        kmems, kfull, mk, rounds, kdone = self._k_loader(m)
        q_rd, qslots, qrbank, qflag = self._q_loader(m)
        ser, j, issue, final_j, final_r, count, row_last, sub, win = self._issue(
            m, kmems, kfull, mk, rounds, kdone, q_rd, qslots, qrbank, qflag)
        self._datapath(m, ser, kmems, q_rd, j, issue, final_j, final_r, count, row_last, sub,
                       win)
        return m

    def _k_loader(self, m):
        """K loader: row ``c`` of ``i_k``, word ``w``, into K memory ``w`` at address (bank,
        round ``c // pes``, PE ``c % pes``), then zero rows up to a multiple of ``pes``.
        Returns ``(kmems, kfull, mk, rounds, kdone)``: the memories' ports, the banks loaded
        (updated by :meth:`_issue`), each bank's row count and last round index, the strobe
        of a matrix's end."""
        c = self.config
        P, cs = c.pes, c.chunk
        word_shape = data.ArrayLayout(signed(8), cs)
        # -- K loader: row c -> round c // P, PE c % P; then zero rows up to a multiple of P
        kmems = []
        for w in range(c.chunks):
            # the loader writes only the bank not being computed: no_rw_check (NO_COLLISIONS)
            mem = memory.Memory(shape=word_shape, depth=c.k_words, init=[],
                                attrs=NO_COLLISIONS)
            m.submodules[f"kmem{w}"] = mem
            kmems.append((mem.write_port(), mem.read_port()))
        kfull = Signal(range(3))
        kwbank, kpad = Signal(), Signal()
        kpe = Signal(range(P))
        kaddr = Signal(range(c.max_rounds))
        kcount = Signal(range(c.max_len + 1))
        mk = [Signal(range(c.max_len + 1), name=f"mk{b}") for b in range(2)]
        # each bank's last round index (rounds - 1), compared for equality by the issue: no
        # subtraction before the decision
        rounds = [Signal(range(c.max_rounds), name=f"last_round{b}") for b in range(2)]
        kload, kwrite, kdone = Signal(), Signal(), Signal()
        m.d.comb += [
            self.i_k.ready.eq((kfull < 2) & ~kpad),
            kload.eq(self.i_k.valid & self.i_k.ready),
            kwrite.eq(kload | kpad),
            kdone.eq(kwrite & (kpe == P - 1) & (kpad | self.i_k.payload.last)),
        ]
        k_row = Value.cast(self.i_k.payload.k)
        for w, (wr, _) in enumerate(kmems):
            m.d.comb += [wr.addr.eq(_banked(kwbank, Cat(kpe, kaddr))),
                         wr.data.eq(Mux(kpad, 0, k_row[w * cs * 8:(w + 1) * cs * 8])),
                         wr.en.eq(kwrite)]
        with m.If(kwrite):
            m.d.sync += kpe.eq(kpe + 1)
            with m.If(kpe == P - 1):
                m.d.sync += [kpe.eq(0), kaddr.eq(kaddr + 1)]
        with m.If(kload):
            m.d.sync += kcount.eq(kcount + 1)
            with m.If(self.i_k.payload.last & ~kdone):
                m.d.sync += kpad.eq(1)
        with m.If(kdone):
            m.d.sync += [kpad.eq(0), kaddr.eq(0), kcount.eq(0), kwbank.eq(~kwbank)]
            for b in range(2):
                with m.If(kwbank == b):
                    m.d.sync += [mk[b].eq(kcount + kload), rounds[b].eq(kaddr)]
        return kmems, kfull, mk, rounds, kdone

    def _q_loader(self, m):
        """Q loader: ``i_q`` rows into two row slots. Returns ``(q_rd, (qheld, qtake, qfull,
        qload), qrbank, qflag)``: the read port, the slots taken and written (both counts
        updated by :meth:`_issue`) with the strobes of a handshake and of a row's write, the
        slot read and each slot's end-of-matrix flag.

        The write is registered (a cycle after the handshake): the handshake's decision then
        reaches one enable register, not the row memory's ``head_dim`` bytes, which with
        many PEs sit across the die. ``qheld`` counts the slots taken (``i_q.ready``),
        ``qfull`` the slots written."""
        c = self.config
        row_shape = data.ArrayLayout(signed(8), c.head_dim)
        # -- Q loader: two row slots --------------------------------------------------------------
        qmem = memory.Memory(shape=row_shape, depth=2, init=[])
        m.submodules.qmem = qmem
        q_wr, q_rd = qmem.write_port(), qmem.read_port()
        qheld = Signal(range(3))
        qfull = Signal(range(3))
        qwbank, qrbank = Signal(), Signal()
        qflag = Signal(2)                     # the slot's row is its matrix's last
        qtake, qload = Signal(), Signal()
        wr_data = Signal(row_shape, name="q_wr_data", reset_less=True)
        wr_bank, wr_last = Signal(), Signal()
        m.d.comb += [
            self.i_q.ready.eq(qheld < 2),
            qtake.eq(self.i_q.valid & self.i_q.ready),
            q_wr.addr.eq(wr_bank), q_wr.data.eq(wr_data), q_wr.en.eq(qload),
        ]
        m.d.sync += [wr_data.eq(self.i_q.payload.q), wr_bank.eq(qwbank),
                     wr_last.eq(self.i_q.payload.last), qload.eq(qtake)]
        with m.If(qtake):
            m.d.sync += qwbank.eq(~qwbank)
        with m.If(qload):
            for b in range(2):
                with m.If(wr_bank == b):
                    m.d.sync += qflag[b].eq(wr_last)
        return q_rd, (qheld, qtake, qfull, qload), qrbank, qflag

    def _issue(self, m, kmems, kfull, mk, rounds, kdone, q_rd, qslots, qrbank, qflag):
        """Issue: round ``r``, step ``j`` of the oldest Q row, a round's last step waiting
        for the output serializer ``ser`` (created here, driving ``o_s``). Returns ``(ser, j,
        issue, final_j, final_r, count, row_last)``."""
        c = self.config
        d, P = c.head_dim, c.pes
        qfull = qslots[2]
        # -- issue: round r, step j of the oldest Q row ------------------------------------------
        m.submodules.ser = ser = GroupSerializer(SCORE, lanes=P, latency=c.latency)
        wiring.connect(m, wiring.flipped(self.o_s), ser.o)
        krbank = Signal()
        j = Signal(range(d))
        r = Signal(range(c.max_rounds))
        col = Signal(range(c.max_rounds * P + 1))     # r * P
        mk_cur = Mux(krbank, mk[1], mk[0])
        rounds_cur = Mux(krbank, rounds[1], rounds[0])
        final_j, final_r, issue, row_done, row_last = (Signal(name=n) for n in (
            "final_j", "final_r", "issue", "row_done", "row_last"))
        left = Signal(range(c.max_len + 1))
        count = Signal(range(P + 1))
        m.d.comb += [
            final_j.eq(j == d - 1),
            final_r.eq(r == rounds_cur),
            left.eq(mk_cur - col),
            issue.eq((qfull != 0) & (kfull != 0) & (~final_j | ser.ready)),
            ser.take.eq(issue & final_j),
            ser.count.eq(count),
            row_done.eq(issue & final_j & final_r),
            row_last.eq(qflag.bit_select(qrbank, 1)),
            q_rd.addr.eq(qrbank),
        ]
        # The round's score count changes only with col and the K bank (at a round's last
        # step) and with a K load completing; a round's last step comes head_dim - 1 cycles
        # or more after any of them, so the count can be min(head_dim - 1, 2) registers
        # late: the rows left (a subtraction) registered, then their minimum with the PEs (a
        # comparison), so neither reaches the serializer's credit counter in the same cycle.
        rows_left = left
        if d >= 3:
            rows_left = Signal.like(left, name="left_r")
            m.d.sync += rows_left.eq(left)
        count_now = Mux(rows_left < P, rows_left, P)
        if d >= 2:
            m.d.sync += count.eq(count_now)
        else:
            m.d.comb += count.eq(count_now)
        # j = window * chunk + sub; memory w serves PE (w - window) mod chunks, PE p reads
        # word (window + p) mod chunks: indices kept as registers stepped with the window, so
        # no arithmetic lies before a memory address or a select
        sub = _rotating_index(m, 0, c.chunk, issue, name="sub")
        next_word = issue & (sub == c.chunk - 1)
        pbits = (P - 1).bit_length()
        for w, (_, rd) in enumerate(kmems):
            pe = _rotating_index(m, w, c.chunks, next_word, name=f"pe_of{w}", down=True)
            m.d.comb += rd.addr.eq(_banked(krbank, Cat(pe[:pbits], r)))
        win = _rotating_index(m, 0, c.chunks, next_word, name="window")
        with m.If(issue):
            m.d.sync += j.eq(j + 1)
            with m.If(final_j):
                m.d.sync += [j.eq(0), r.eq(r + 1), col.eq(col + P)]
                with m.If(final_r):
                    m.d.sync += [r.eq(0), col.eq(0), qrbank.eq(~qrbank)]
                    with m.If(row_last):
                        m.d.sync += krbank.eq(~krbank)
        k_release = row_done & row_last
        qheld, qtake, _, qload = qslots
        m.d.sync += [kfull.eq(kfull + kdone - k_release), qfull.eq(qfull + qload - row_done),
                     qheld.eq(qheld + qtake - row_done)]
        return ser, j, issue, final_j, final_r, count, row_last, sub, win

    def _datapath(self, m, ser, kmems, q_rd, j, issue, final_j, final_r, count, row_last,
                  sub, win):
        """Datapath: each PE multiplies its element of the Q row (:class:`AttnDot`'s
        rotated order) by the same element of its K row and accumulates over the round; the
        round's scores enter ``ser`` ``latency`` cycles after its last step."""
        c = self.config
        cs = c.chunk
        # -- datapath: select the PE's element, multiply, accumulate -------------------------
        # memory read (cycle 1), its words registered (2: a block RAM's read data go through
        # no logic first), rotated so that word p is PE p's in two registered steps of at most
        # 4:1 (3, 4), the PE's element selected (5: at most 4:1), a register per multiplier
        # input (6), product (7): the last two reset-less, so that the ECP5 flow packs them
        # into each MULT18X18D (hwgen.flow.ecp5_dsp_pack)
        v_prod = delay(m, issue, self.config.latency - 1, name="v")
        first_prod = delay(m, j == 0, self.config.latency - 1, name="first")
        q_row = Value.cast(q_rd.data)
        q_words = _rotated_words(m, [q_row[w * cs * 8:(w + 1) * cs * 8]
                                     for w in range(c.chunks)], win, "q_word")
        k_words = _rotated_words(m, [Value.cast(rd.data) for _, rd in kmems], win, "k_word")
        accs = []
        for p in range(c.pes):
            # each PE its own copy of the element index: no register fans out to every PE
            elem_idx = delay(m, sub, 4, name=f"sub{p}_d")
            q_e = _select_element(m, q_words[p], elem_idx, f"q{p}")
            k_e = _select_element(m, k_words[p], elem_idx, f"k{p}")
            q_op, k_op = (Signal(signed(8), name=f"{n}{p}", reset_less=True)
                          for n in ("q_op", "k_op"))
            prod = Signal(signed(16), name=f"prod{p}", reset_less=True)
            acc = Signal(signed(c.acc_bits), name=f"acc{p}")
            m.d.sync += [q_op.eq(q_e), k_op.eq(k_e), prod.eq(q_op * k_op)]
            with m.If(v_prod):
                with m.If(first_prod):
                    m.d.sync += acc.eq(prod)
                with m.Else():
                    m.d.sync += acc.eq(acc + prod)
            accs.append(acc)

        done = issue & final_j
        lat = c.latency
        n_d = delay(m, count, lat, name="count")
        last_round_d = delay(m, final_r, lat, name="final_r")
        row_last_d = delay(m, row_last, lat, name="row_last")
        m.d.comb += [ser.i_valid.eq(delay(m, done, lat, name="done")), ser.i_count.eq(n_d)]
        for p, acc in enumerate(accs):
            item = ser.i_items[p]
            m.d.comb += [item.s.eq(acc), item.last_row.eq(row_last_d),
                         item.last.eq(last_round_d & (n_d == p + 1))]


class AttnDotModel(StreamModel):
    """Stream-level golden model and stimulus of :class:`AttnDot` for the testbench.

    The item unit of ``hwgen sim --items`` is one row of Q (one row of S): ``items`` rows are
    split into heads of M = 1, 7, ``max_len`` and then random M
    (:func:`~hwgen.ibert.matrix_common.matrix_sizes`). The golden model is numpy's int64
    matrix product ``Q @ K.T``.
    """

    #: How :meth:`stimulus` holds the rows of each element field (``{field: (stimulus key,
    #: form)}``; form ``mats``, ``array`` or ``list``: :class:`~hwgen.cluster.gateware.compute.KernelChain`).
    row_fields = {"q": ("q", "mats"), "k": ("k", "mats")}

    result_port = "o_s"
    latency_from = "i_q"

    #: (Q, K) contents of successive heads, then repeated: the extremes give the largest
    #: (-128 * -128 * d) and smallest (-128 * 127 * d) scores.
    KINDS = (("min", "min"), ("max", "min"), ("random", "random"), ("alternate", "max"),
             ("realistic", "realistic"), ("random", "random"))

    @classmethod
    def stimulus(cls, config, items, rng, sizes=None, k_sizes=None):
        """Heads of ``sizes`` Q rows (default: ``items`` rows split by
        :func:`~hwgen.ibert.matrix_common.matrix_sizes`) with as many K rows, or ``k_sizes``
        K rows. Without ``k_sizes``, every fourth head from the fourth on has a K of a
        different random length (cross-attention shapes)."""
        c = config
        if sizes is None:
            sizes = matrix_sizes(items, c.max_len, rng)
            k_sizes = [int(rng.integers(1, c.max_len, endpoint=True)) if h % 4 == 3 else mq
                       for h, mq in enumerate(sizes)]
        sizes = list(sizes)
        k_sizes = list(k_sizes) if k_sizes is not None else sizes
        qs, ks = [], []
        for h, (mq, mk) in enumerate(zip(sizes, k_sizes)):
            qk, kk = cls.KINDS[h % len(cls.KINDS)]
            qs.append(matrix_int8(qk, (mq, c.head_dim), rng))
            ks.append(matrix_int8(kk, (mk, c.head_dim), rng))
        return {"q": qs, "k": ks}

    @staticmethod
    def inputs(config, stim):
        """``i_q`` / ``i_k``: one beat per row of Q / K, ``head_dim`` int8 lanes ``q`` / ``k``,
        ``last`` on each head's final row."""
        def rows(mats, name):
            return [{name: row.tolist(), "last": int(i == len(x) - 1)}
                    for x in mats for i, row in enumerate(x)]
        return {"i_q": rows(stim["q"], "q"), "i_k": rows(stim["k"], "k")}

    @staticmethod
    def expect(config, stim):
        """``o_s``: per head ``S = Q @ K.T`` (int64 numpy), one score ``s`` per beat in row-major
        order, ``last`` on each row's final score, ``last_row`` on every beat of the head's final
        row."""
        beats = []
        for q, k in zip(stim["q"], stim["k"]):
            s = np.asarray(q, dtype=np.int64) @ np.asarray(k, dtype=np.int64).T
            for i, row in enumerate(s):
                beats += [{"s": int(v), "last_row": int(i == len(s) - 1),
                           "last": int(col == len(row) - 1)} for col, v in enumerate(row)]
        return {"o_s": beats}

    @staticmethod
    def cycles_bound(config, stim):
        c = config
        return sum(len(q) * ceil_div(len(k), c.pes) * c.head_dim + len(k) + c.pes
                   for q, k in zip(stim["q"], stim["k"])) + 100


#: Simulated by tests/test_sim.py (200 Q rows each): odd sizes, one PE, one-element rows with
#: one PE (one cycle per round), PEs = d, and one BERT-base head (d = 64, M <= 128, 16 PEs).
TEST_CONFIGS = (
    {"head_dim": 24, "max_len": 40, "pes": 5},
    {"head_dim": 7, "max_len": 13, "pes": 1},
    {"head_dim": 1, "max_len": 9, "pes": 1},
    {"head_dim": 6, "max_len": 50, "pes": 6},
    {},
)
