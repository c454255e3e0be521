"""I-BERT softmax matrix multiply of one head: ``O = P @ V`` (paper section 7.1.3, Fig. 13).

``P`` (``M x M``) is the 8-bit softmax output (unsigned values 0 .. 256, carried in 9 bits),
``V`` (``M x d``) int8 with ``d = H / A`` (64 in BERT-base), ``O`` (``M x d``) int32. ``pes``
PEs each own one row of P: at step ``k`` every PE takes one element ``P[i_p, k]`` of a different
row of P and the same row ``V[k]`` (broadcast), and accumulates ``P[i_p, k] * V[k, :]`` into the
partial result of its entire output row (``d`` MACs per PE per cycle). A group of ``pes`` rows
takes M steps: M is any length from 1 to ``max_len``, never padded to the maximum.

Minimum padding, ``pes * ceil(M / pes)`` (the paper's ``NUM_PE * ceil(M / NUM_PE)``): a row of
P travels in ``ceil(M / pes)`` beats of ``pes`` lanes (the lanes past M are ignored, never
multiplied), and the rows of P are grouped by ``pes``: the PEs of a matrix's last group that have
no row of P compute on whatever their buffer holds and their results are removed from the output
(no cycle is spent on them). O has exactly M rows.

Small configuration used for ``hwgen sim ibert-softmax-matmul``: ``--set head_dim=16 --set
max_len=40 --set pes=3``. The defaults are one BERT-base head (d = 64, M <= 128) with 4 PEs.
"""

from dataclasses import dataclass

import numpy as np
from amaranth.hdl import Cat, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, memory, stream, wiring
from amaranth.lib.wiring import In, Out

from .. import contract
from ..config import Config, param
from ..errors import ConfigError
from ..flow.model import StreamModel
from ..lib.pipeline import delay
from ..lib.row_ports import RowKernel, RowPort
from . import golden
from .layernorm import NO_COLLISIONS
from .matrix_common import GroupSerializer, ceil_div, matrix_int8, matrix_sizes

__all__ = ["SoftmaxMatmulConfig", "SoftmaxMatmul", "SoftmaxMatmulModel", "TEST_CONFIGS"]

#: Softmax outputs are 0 .. 2**8 (``int_softmax`` with 8 output bits): 9-bit unsigned lanes.
P_BITS = 9


@dataclass(frozen=True)
class SoftmaxMatmulConfig(Config, RowKernel):
    """Configuration of ``ibert-softmax-matmul`` (:class:`SoftmaxMatmul`): the row length
    ``head_dim`` of V and O, the longest sequence ``max_len`` and the number of PEs ``pes``
    (rows of P computed in parallel, also the P elements per input beat)."""
    head_dim: int = param(64, "d = H / A: row length of V and O", lo=1, hi=256)
    max_len: int = param(128, "largest sequence length M", lo=1, hi=4096)
    pes: int = param(4, "PEs: rows of P (output rows) computed in parallel, head_dim MACs "
                        "per cycle each; also the P elements per input beat", lo=1, hi=64)

    def check(self):
        if self.pes > self.max_len:
            raise ConfigError("pes", f"must be in 1..max_len={self.max_len}", value=self.pes)

    @property
    def max_beats(self):
        """Beats of the longest P row: ``ceil(max_len / pes)``."""
        return ceil_div(self.max_len, self.pes)

    @property
    def acc_bits(self):
        """A product of a 9-bit unsigned and an int8 fits 17 signed bits; M of them add
        ``ceil(log2 max_len)`` bits."""
        return P_BITS + 8 + (self.max_len - 1).bit_length()

    #: Cycles from issuing a group's last step to its rows reaching the serializer: memory
    #: read, read-data register, element select, multiplier-input register, product,
    #: accumulate.
    latency = 6

    @dataclass(frozen=True)
    class Workload(contract.Workload):
        """The workload of :meth:`cycle_model` (None: steady-state figures only)."""
        m: int = None     # M: tokens of the sentence (rows of V)
        m_q: int = None     # query rows of P to multiply

    def cycle_model(self, workload):
        """Cycle model (:func:`hwgen.ibert.model.softmax_matmul_cycles`) for M = ``m``."""
        m, m_q = workload.m, workload.m_q
        from .model import softmax_matmul_cycles
        return softmax_matmul_cycles(self, m, m_q)

    matrix_inputs = ("v",)

    def row_ports(self):
        """``i_v``: one int8 row of ``head_dim`` per beat; ``i_p``: uint(P_BITS) rows of up to
        ``max_len`` on ``pes`` lanes, last row marked; ``o_o``: int32 rows of ``head_dim``, one
        per beat."""
        d = self.head_dim
        return ([RowPort("i_v", "v", signed(8), d, d, framing="beat"),
                 RowPort("i_p", "p", unsigned(P_BITS), self.pes, max_row=self.max_len,
                         last_row=True)],
                RowPort("o_o", "o", signed(32), d, d, framing="beat"))

    def max_tokens(self):
        """:meth:`RowKernel.max_tokens`: ``max_len``."""
        return self.max_len

    def row_timing(self, m):
        """:meth:`RowKernel.row_timing`: a row's context after the whole V; ``pes`` rows share
        a pass, so the period is the full matrix interval over ``m``."""
        one = self.performance(self.workload(m=m, m_q=1))
        full = self.performance(self.workload(m=m, m_q=m))
        return one["cycles_per_matrix"] - -(-m // self.pes), full["matrix_interval"] / m

    def row_group(self):
        """``pes`` rows of P go through the PEs together."""
        return self.pes

    def derived(self):
        return {"max_beats": self.max_beats, "macs": self.pes * self.head_dim,
                "accumulator_bits": self.acc_bits, "pipeline_latency": self.latency,
                "output_fifo_rows": self.latency + 3 * self.pes + 4}


#: Multipliers fed by one copy of a PE's selected P element (the copies are registers
#: selected in parallel, so no register fans out to all ``head_dim`` multipliers).
OPERAND_FANOUT = 8


def _banked(bank, addr, bits):
    """The address ``addr`` (``bits`` wide) in bank ``bank`` (the bank bit on top)."""
    assert len(addr) == bits
    return Cat(addr, bank)


def v_layout(d):
    """Payload of ``i_v``: one row ``v`` of ``d`` int8 elements and ``last`` (TLAST, the
    matrix's last row)."""
    return data.StructLayout({"v": data.ArrayLayout(signed(8), d), "last": 1})


def p_layout(pes):
    """Payload of ``i_p``: ``pes`` unsigned 9-bit P elements ``p`` (0 .. 256), ``last_row``
    (the matrix's last row) and ``last`` (TLAST, the row's last beat)."""
    return data.StructLayout({"p": data.ArrayLayout(unsigned(P_BITS), pes), "last_row": 1,
                              "last": 1})


def o_layout(d, bits=32):
    """Payload of ``o_o``: one row ``o`` of ``d`` signed ``bits``-bit elements and ``last``
    (TLAST, the matrix's last row)."""
    return data.StructLayout({"o": data.ArrayLayout(signed(bits), d), "last": 1})


class SoftmaxMatmul(wiring.Component):
    """Softmax matrix multiply ``O = P @ V`` of one head.

    Parameters
    ----------
    config : SoftmaxMatmulConfig

    Members
    -------
    i_v : ``In(stream.Signature(v_layout(head_dim)))``
        V, one row per beat; TLAST on the matrix's last row (M_k rows, M_k <= max_len).
    i_p : ``In(stream.Signature(p_layout(pes)))``
        P, row by row; a row of M_k values is ``ceil(M_k / pes)`` beats of ``pes`` lanes
        (lanes past M_k in its last beat are ignored), TLAST on each row's last beat.
        ``last_row`` (read on TLAST beats) marks the matrix's last row. The number of rows
        M_q is free (usually M_q = M_k); matrices of P and V pair up in order.
    o_o : ``Out(stream.Signature(o_layout(head_dim)))``
        O, one row of ``head_dim`` int32 values per beat, rows ``0 .. M_q - 1`` only (padding
        removed); TLAST on the matrix's last row.

    Organisation
    ------------
    V is written into a memory (one row per address, double-buffered by head). Rows of P are
    collected in groups of ``pes`` (fewer in a matrix's last group): row ``s`` of a group goes
    to PE ``s``'s memory, one beat per address, double-buffered so the next group loads while
    the current one is computed. A group then takes ``M_k`` steps: at step ``k`` V row ``k``
    is read once and broadcast, each PE selects lane ``k mod pes`` of its beat ``k // pes``.
    The group's real rows are captured and sent one per cycle while the next group computes.

    Timing
    ------
    Loading a group of ``pes`` rows takes ``pes * ceil(M_k / pes) >= M_k`` beats, computing
    it ``M_k`` cycles: the input of P sets the pace, ``ceil(M_k / pes)`` cycles per row of a
    full group (one beat per cycle). The first row of O leaves ``max(n * ceil(M_k / pes), M_k)
    + M_k + 8`` cycles after the first beat of P (``n = min(pes, M_q)``, V arriving alongside);
    the group's other rows follow one per cycle. Exact formulas:
    :func:`hwgen.ibert.model.softmax_matmul_cycles`.

    Backpressure: ``o_o`` may stall at any time; a group waits at its last step while the
    output FIFO could fill (credits), never combinationally on ``o_o.ready``.
    """

    def __init__(self, config):
        self.config = c = config
        super().__init__({
            "i_v": In(stream.Signature(v_layout(c.head_dim))),
            "i_p": In(stream.Signature(p_layout(c.pes))),
            "o_o": Out(stream.Signature(o_layout(c.head_dim))),
        })

    def elaborate(self, platform):
        m = Module()
        v_rd, vfull, vrbank, mk, vdone = self._v_loader(m)
        pmems, pfull, prbank, rows, gend, pdone = self._p_loader(m)
        ser, k, kl, issue, final_k, rows_cur, group_last = self._issue(
            m, v_rd, vfull, vrbank, mk, vdone, pmems, pfull, prbank, rows, gend, pdone)
        self._datapath(m, ser, v_rd, pmems, k, kl, issue, final_k, rows_cur, group_last)
        return m

    def _v_loader(self, m):
        """V loader: ``i_v`` rows into the double-buffered V memory. Returns ``(v_rd, vfull,
        vrbank, mk, vdone)``: the read port, the banks loaded (updated by :meth:`_issue`),
        the bank read, each bank's last row index (M_k - 1) and the strobe of a matrix's last
        row."""
        c = self.config
        d = c.head_dim
        lbits = (c.max_len - 1).bit_length()
        # -- V loader ---------------------------------------------------------------------------
        # the loaders write only the bank not being computed: no_rw_check (NO_COLLISIONS)
        vmem = memory.Memory(shape=data.ArrayLayout(signed(8), d), depth=2 << lbits, init=[],
                             attrs=NO_COLLISIONS)
        m.submodules.vmem = vmem
        v_wr, v_rd = vmem.write_port(), vmem.read_port()
        vfull = Signal(range(3))
        vwbank, vrbank = Signal(), Signal()
        vrow = Signal(range(c.max_len))
        # each bank's last row index (M_k - 1), compared for equality by the issue: no
        # subtraction before the decision
        mk = [Signal(range(c.max_len), name=f"mk_last{b}") for b in range(2)]
        vload, vdone = Signal(), Signal()
        m.d.comb += [
            self.i_v.ready.eq(vfull < 2),
            vload.eq(self.i_v.valid & self.i_v.ready),
            vdone.eq(vload & self.i_v.payload.last),
            v_wr.addr.eq(_banked(vwbank, vrow, lbits)),
            v_wr.data.eq(self.i_v.payload.v),
            v_wr.en.eq(vload),
        ]
        with m.If(vload):
            m.d.sync += vrow.eq(vrow + 1)
            with m.If(self.i_v.payload.last):
                m.d.sync += [vrow.eq(0), vwbank.eq(~vwbank)]
                for b in range(2):
                    with m.If(vwbank == b):
                        m.d.sync += mk[b].eq(vrow)
        return v_rd, vfull, vrbank, mk, vdone

    def _p_loader(self, m):
        """P loader: groups of up to ``pes`` rows of ``i_p``, row ``s`` of a group into PE
        ``s``'s double-buffered memory. Returns ``(pmems, pfull, prbank, rows, gend, pdone)``:
        the memories' ports, the banks loaded (updated by :meth:`_issue`), the bank read,
        each bank's row count and end-of-matrix flag, and the strobe of a group's end."""
        c = self.config
        P = c.pes
        bbits = (c.max_beats - 1).bit_length()
        # -- P loader: groups of up to P rows, row s of a group into PE s's memory ----------------
        pmems = []
        for s in range(P):
            mem = memory.Memory(shape=data.ArrayLayout(unsigned(P_BITS), P),
                                depth=2 << bbits, init=[], attrs=NO_COLLISIONS)
            m.submodules[f"pmem{s}"] = mem
            pmems.append((mem.write_port(), mem.read_port()))
        pfull = Signal(range(3))
        pwbank, prbank = Signal(), Signal()
        slot = Signal(range(P))
        beat = Signal(range(c.max_beats))
        rows = [Signal(range(P + 1), name=f"rows{b}") for b in range(2)]
        gend = Signal(2)                 # the bank's group ends its matrix
        pload, pdone = Signal(), Signal()
        payload = self.i_p.payload
        m.d.comb += [
            self.i_p.ready.eq(pfull < 2),
            pload.eq(self.i_p.valid & self.i_p.ready),
            pdone.eq(pload & payload.last & ((slot == P - 1) | payload.last_row)),
        ]
        for s, (wr, _) in enumerate(pmems):
            m.d.comb += [wr.addr.eq(_banked(pwbank, beat, bbits)), wr.data.eq(payload.p),
                         wr.en.eq(pload & (slot == s))]
        with m.If(pload):
            m.d.sync += beat.eq(beat + 1)
            with m.If(payload.last):
                m.d.sync += [beat.eq(0), slot.eq(slot + 1)]
        with m.If(pdone):
            m.d.sync += [slot.eq(0), pwbank.eq(~pwbank)]
            for b in range(2):
                with m.If(pwbank == b):
                    m.d.sync += [rows[b].eq(slot + 1), gend[b].eq(payload.last_row)]
        return pmems, pfull, prbank, rows, gend, pdone

    def _issue(self, m, v_rd, vfull, vrbank, mk, vdone, pmems, pfull, prbank, rows, gend,
               pdone):
        """Issue: step ``k`` (V row ``k``) of the oldest loaded group, the last step waiting
        for the output serializer ``ser`` (created here, driving ``o_o``). Returns ``(ser, k,
        kl, issue, final_k, rows_cur, group_last)``."""
        c = self.config
        d, P = c.head_dim, c.pes
        lbits = (c.max_len - 1).bit_length()
        bbits = (c.max_beats - 1).bit_length()
        # -- issue: step k of the oldest group -----------------------------------------------------
        o_item = o_layout(d, c.acc_bits)
        m.submodules.ser = ser = GroupSerializer(o_item, lanes=P, latency=c.latency)
        m.d.comb += [
            self.o_o.valid.eq(ser.o.valid),
            ser.o.ready.eq(self.o_o.ready),
            self.o_o.payload.last.eq(ser.o.payload.last),
        ]
        for e in range(d):
            m.d.comb += self.o_o.payload.o[e].eq(ser.o.payload.o[e])

        k = Signal(range(c.max_len))
        kb = Signal(range(c.max_beats))
        kl = Signal(range(P))
        gap = Signal(range(P))          # cycles until the serializer takes another group
        gap_zero = Signal(init=1)       # gap == 0, kept as a register
        mk_last = Mux(vrbank, mk[1], mk[0])
        rows_cur = Mux(prbank, rows[1], rows[0])
        group_last = Signal()
        final_k, issue, group_done = Signal(), Signal(), Signal()
        m.d.comb += [
            group_last.eq(gend.bit_select(prbank, 1)),
            final_k.eq(k == mk_last),
            issue.eq((pfull != 0) & (vfull != 0) & (~final_k | (ser.ready & gap_zero))),
            ser.take.eq(issue & final_k),
            ser.count.eq(rows_cur),
            group_done.eq(issue & final_k),
            v_rd.addr.eq(_banked(vrbank, k, lbits)),
        ]
        for _, rd in pmems:
            m.d.comb += rd.addr.eq(_banked(prbank, kb, bbits))
        with m.If(group_done):
            m.d.sync += [gap.eq(rows_cur - 1), gap_zero.eq(rows_cur == 1)]
        with m.Elif(~gap_zero):
            m.d.sync += [gap.eq(gap - 1), gap_zero.eq(gap == 1)]
        with m.If(issue):
            m.d.sync += [k.eq(k + 1), kl.eq(kl + 1)]
            with m.If(kl == P - 1):
                m.d.sync += [kl.eq(0), kb.eq(kb + 1)]
            with m.If(final_k):
                m.d.sync += [k.eq(0), kl.eq(0), kb.eq(0), prbank.eq(~prbank)]
                with m.If(group_last):
                    m.d.sync += vrbank.eq(~vrbank)
        v_release = group_done & group_last
        m.d.sync += [vfull.eq(vfull + vdone - v_release), pfull.eq(pfull + pdone - group_done)]
        return ser, k, kl, issue, final_k, rows_cur, group_last

    def _datapath(self, m, ser, v_rd, pmems, k, kl, issue, final_k, rows_cur, group_last):
        """Datapath: each PE selects lane ``k mod pes`` of its P beat, multiplies it by the V
        row (``head_dim`` products) and accumulates over the group's steps; the group's
        results enter ``ser`` ``latency`` cycles after its last step."""
        c = self.config
        d = c.head_dim
        # -- datapath: lane select, d products per PE, accumulate ----------------------------------
        # read data registered (cycle 2: a block RAM's read data go through no logic first),
        # element select (3, one copy of the selected P element per OPERAND_FANOUT
        # multipliers), a register per multiplier input (4), product (5): the last two
        # reset-less, so that the ECP5 flow packs them into each MULT18X18D
        # (hwgen.flow.ecp5_dsp_pack) and the shared operands fan out from registers
        kl2 = delay(m, kl, 2, name="kl")
        v_prod = delay(m, issue, c.latency - 1, name="v")
        first_prod = delay(m, k == 0, c.latency - 1, name="first")
        v_row = Signal(data.ArrayLayout(signed(8), d), reset_less=True)
        v_row2 = Signal(data.ArrayLayout(signed(8), d), name="v_row2", reset_less=True)
        m.d.sync += [v_row.eq(v_rd.data), v_row2.eq(v_row)]
        done = issue & final_k
        lat = c.latency
        n_d = delay(m, rows_cur, lat, name="rows")
        end_d = delay(m, group_last, lat, name="group_last")
        m.d.comb += [ser.i_valid.eq(delay(m, done, lat, name="done")), ser.i_count.eq(n_d)]
        for s, (_, rd) in enumerate(pmems):
            p_row = Signal.like(rd.data, name=f"p_row{s}", reset_less=True)
            m.d.sync += p_row.eq(rd.data)
            p_es = []
            for g in range(0, d, OPERAND_FANOUT):
                p_e = Signal(unsigned(P_BITS), name=f"p{s}_{g // OPERAND_FANOUT}",
                             reset_less=True)
                m.d.sync += p_e.eq(p_row[kl2])
                p_es.append(p_e)
            item = ser.i_items[s]
            for e in range(d):
                p_e = p_es[e // OPERAND_FANOUT]
                p_op = Signal(unsigned(P_BITS), name=f"p_op{s}_{e}", reset_less=True)
                v_op = Signal(signed(8), name=f"v_op{s}_{e}", reset_less=True)
                prod = Signal(signed(P_BITS + 8), name=f"prod{s}_{e}", reset_less=True)
                acc = Signal(signed(c.acc_bits), name=f"acc{s}_{e}")
                m.d.sync += [p_op.eq(p_e), v_op.eq(v_row2[e]), prod.eq(p_op * v_op)]
                with m.If(v_prod):
                    with m.If(first_prod):
                        m.d.sync += acc.eq(prod)
                    with m.Else():
                        m.d.sync += acc.eq(acc + prod)
                m.d.comb += item.o[e].eq(acc)
            m.d.comb += item.last.eq(end_d & (n_d == s + 1))


class SoftmaxMatmulModel(StreamModel):
    """Stream-level golden model and stimulus of :class:`SoftmaxMatmul` for the testbench.

    The item unit of ``hwgen sim --items`` is one row of P (one row of O): ``items`` rows are
    split into heads of M = 1, 7, ``max_len`` and then random M
    (:func:`~hwgen.ibert.matrix_common.matrix_sizes`). The golden model is numpy's int64
    matrix product ``P @ V``.
    """

    #: How :meth:`stimulus` holds the rows of each element field (``{field: (stimulus key,
    #: form)}``; form ``mats``, ``array`` or ``list``: :class:`~hwgen.cluster.gateware.compute.KernelChain`).
    row_fields = {"p": ("p", "mats"), "v": ("v", "mats")}

    result_port = "o_o"
    latency_from = "i_p"

    #: (P, V) contents of successive heads, then repeated. P: "softmax" is
    #: :func:`hwgen.ibert.golden.int_softmax` of random int8 scores (realistic), "max" all 256,
    #: "zero" all 0, "random" uniform 0..256 with some 0 and 256 rows, "onehot" one 256 per row.
    KINDS = (("max", "min"), ("softmax", "realistic"), ("max", "max"), ("random", "random"),
             ("onehot", "alternate"), ("softmax", "random"), ("zero", "max"))

    @staticmethod
    def p_matrix(kind, shape, rng):
        """A P matrix (int64, values 0 .. 256) of ``shape`` for stimulus ``kind``: ``"max"``
        (all 256), ``"zero"``, ``"onehot"`` (one 256 per row), ``"softmax"``
        (:func:`golden.int_softmax` of random int8 scores), anything else uniform random (with
        more than two rows, the first row all 0 and the last all 256)."""
        rows, cols = shape
        if kind == "max":
            return np.full(shape, 256, dtype=np.int64)
        if kind == "zero":
            return np.zeros(shape, dtype=np.int64)
        if kind == "onehot":
            p = np.zeros(shape, dtype=np.int64)
            p[np.arange(rows), rng.integers(0, cols, size=rows)] = 256
            return p
        if kind == "softmax":
            scores = rng.integers(-128, 127, size=shape, endpoint=True)
            scale = float(rng.choice([0.02, 0.05, 0.1]))
            return golden.int_softmax(scores, scale)[0]
        p = rng.integers(0, 256, size=shape, endpoint=True)
        if rows > 2:
            p[0], p[-1] = 0, 256
        return p

    @classmethod
    def stimulus(cls, config, items, rng, sizes=None, k_sizes=None):
        """Heads of ``sizes`` P rows (default: ``items`` rows split by
        :func:`~hwgen.ibert.matrix_common.matrix_sizes`) of as many columns (V rows), or
        ``k_sizes`` columns. Without ``k_sizes``, every fourth head from the fourth on has a V
        of a different random length. Lanes past M_k in a row's last beat carry random values
        (the core must ignore them)."""
        c = config
        if sizes is None:
            sizes = matrix_sizes(items, c.max_len, rng)
            k_sizes = [int(rng.integers(1, c.max_len, endpoint=True)) if h % 4 == 3 else mq
                       for h, mq in enumerate(sizes)]
        sizes = list(sizes)
        k_sizes = list(k_sizes) if k_sizes is not None else sizes
        ps, vs, junk = [], [], []
        for h, (mq, mk) in enumerate(zip(sizes, k_sizes)):
            pk, vk = cls.KINDS[h % len(cls.KINDS)]
            ps.append(cls.p_matrix(pk, (mq, mk), rng))
            vs.append(matrix_int8(vk, (mk, c.head_dim), rng))
            junk.append(rng.integers(0, (1 << P_BITS) - 1, endpoint=True,
                                     size=(mq, ceil_div(mk, c.pes) * c.pes - mk)))
        return {"p": ps, "v": vs, "junk": junk}

    @staticmethod
    def inputs(config, stim):
        """``i_p``: each row of P in ``ceil(M_k / pes)`` beats of ``pes`` lanes ``p`` (the row, then
        its ``junk``), ``last`` on the row's final beat, ``last_row`` on every beat of the head's
        final row; ``i_v``: one beat per row of V (``head_dim`` int8 lanes ``v``), ``last`` on the
        head's final row."""
        c = config
        p_beats = []
        for p, junk in zip(stim["p"], stim["junk"]):
            beats = ceil_div(p.shape[1], c.pes)
            lanes = np.concatenate([p, junk], axis=1).reshape(len(p), beats, c.pes)
            for i, row in enumerate(lanes):
                p_beats += [{"p": b.tolist(), "last_row": int(i == len(p) - 1),
                             "last": int(t == beats - 1)} for t, b in enumerate(row)]
        v_beats = [{"v": row.tolist(), "last": int(i == len(v) - 1)}
                   for v in stim["v"] for i, row in enumerate(v)]
        return {"i_p": p_beats, "i_v": v_beats}

    @staticmethod
    def expect(config, stim):
        """``o_o``: per head ``O = P @ V`` (int64 numpy), one row of ``head_dim`` int32 lanes ``o``
        per beat, ``last`` on the head's final row."""
        beats = []
        for p, v in zip(stim["p"], stim["v"]):
            o = np.asarray(p, dtype=np.int64) @ np.asarray(v, dtype=np.int64)
            beats += [{"o": row.tolist(), "last": int(i == len(o) - 1)}
                      for i, row in enumerate(o)]
        return {"o_o": beats}

    @staticmethod
    def cycles_bound(config, stim):
        c = config
        return sum(len(p) * ceil_div(len(v), c.pes) + 2 * len(v) + len(p)
                   for p, v in zip(stim["p"], stim["v"])) + 100


#: Simulated by tests/test_sim.py (200 P rows each): odd sizes, one PE, one-element rows of V,
#: many PEs over short rows, and one BERT-base head (d = 64, M <= 128, 4 PEs).
TEST_CONFIGS = (
    {"head_dim": 16, "max_len": 40, "pes": 3},
    {"head_dim": 5, "max_len": 11, "pes": 1},
    {"head_dim": 1, "max_len": 9, "pes": 2},
    {"head_dim": 3, "max_len": 20, "pes": 8},
    {},
)
