"""ChamVS PQ decoding unit (Chameleon paper section 4.1, Figure 5).

A unit holds a distance lookup table (LUT) of ``m x 256`` entries, one on-chip memory per
sub-space column, and turns each ``m``-byte PQ code into an approximate distance: ``m`` parallel
lookups, then a pipelined adder tree. LUT rows are forwarded unchanged to the next unit, so a
chain of units shares one LUT without a broadcast network.
"""

from dataclasses import dataclass

import numpy as np
from amaranth.hdl import Module, Signal, unsigned
from amaranth.lib import memory, stream, wiring
from amaranth.lib.wiring import In, Out

from .. import contract
from ..config import Config, param
from ..flow.model import StreamModel
from ..lib.pipeline import CreditBuffer, adder_tree, delay
from . import golden, layouts

__all__ = ["PQDecoderConfig", "PQDecoder", "PQDecoderModel"]


@dataclass(frozen=True)
class PQDecoderConfig(Config):
    """Configuration of the PQ decoding unit :class:`PQDecoder`: bytes per code (``m``), LUT entry
    and tag widths, LUT buffers and whether loaded LUT rows are forwarded to the next unit."""
    m: int = param(16, "sub-spaces: bytes per PQ code", lo=1, hi=64)
    lut_bits: int = param(16, "bits per LUT entry (unsigned)", lo=1, hi=32)
    tag_bits: int = param(32, "bits of the tag carried with each code (e.g. a vector id)",
                          lo=1, hi=64)
    lut_buffers: int = param(2, "LUT buffers: 2 loads the next LUT while codes are scanned",
                             lo=1, hi=2)
    forward_lut: bool = param(True, "forward loaded LUT rows on o_lut to the next unit")

    @property
    def dist_bits(self):
        """Distance width: a sum of m entries can never overflow it."""
        return golden.distance_bits(self.m, self.lut_bits)

    @property
    def tree_latency(self):
        """Pipeline stages (cycles) of the adder tree over ``m`` LUT entries: ``ceil(log2(m))``."""
        return (self.m - 1).bit_length()

    @property
    def latency(self):
        """Cycles from a code being accepted to its distance entering the output FIFO: the
        memory read, a register on the read data, then the adder tree."""
        return 2 + self.tree_latency

    @dataclass(frozen=True)
    class Workload(contract.Workload):
        """The workload of :meth:`cycle_model` (None: steady-state figures only)."""
        scans: tuple = None     # lengths of the code streams, one LUT each

    def cycle_model(self, workload):
        """Cycle model (no stalls). ``scans``: lengths of the code streams, one LUT each.

        A LUT load takes 256 cycles; scan ``k`` starts when LUT ``k`` is loaded and scan
        ``k-1`` has ended; LUT ``k`` starts loading when LUT ``k-1`` is loaded and a buffer is
        free (scan ``k - lut_buffers`` has ended). ``cycles`` runs from the first LUT row to the
        last distance, as ``hwgen sim`` measures it.
        """
        scans = workload.scans
        model = {"initiation_interval": 1, "latency_cycles": self.latency + 2,
                 "lut_load_cycles": 256}
        if scans:
            load_done, scan_end = [], []
            for k, length in enumerate(scans):
                start = max(load_done[k - 1] if k else 0,
                            scan_end[k - self.lut_buffers] if k >= self.lut_buffers else 0)
                load_done.append(start + 256)
                scan_end.append(max(load_done[k], scan_end[k - 1] if k else 0) + length)
            model["cycles"] = scan_end[-1] + self.latency + 2
            model["results_per_cycle"] = sum(scans) / (scan_end[-1] - 256)
        return model

    def derived(self):
        return {"dist_bits": self.dist_bits, "pipeline_latency": self.latency,
                "lut_memories": self.m,
                "lut_memory_depth": 256 * self.lut_buffers,
                "output_fifo_depth": self.latency + 3}


class PQDecoder(wiring.Component):
    """PQ decoding unit: one distance per cycle from an ``m``-column LUT.

    Parameters
    ----------
    config : PQDecoderConfig

    Members
    -------
    i_lut : ``In(stream.Signature(lut_row(m, lut_bits)))``
        LUT rows. A LUT is exactly 256 rows, row ``r`` first to last; row ``r`` is written at
        address ``r`` of every column memory, one row per cycle.
    o_lut : ``Out(stream.Signature(lut_row(m, lut_bits)))``
        The same rows, forwarded one cycle later (only with ``forward_lut``). A stalled
        ``o_lut`` stalls loading.
    i_codes : ``In(stream.Signature(pq_code(m, tag_bits)))``
        PQ codes. Code streams and LUTs pair up in order: the codes up to and including the
        first with ``last`` set are scanned with the first LUT loaded, and so on.
    o_dist : ``Out(stream.Signature(distance(dist_bits, tag_bits)))``
        ``dist = sum_i LUT[i][code[i]]``, with ``tag`` and ``last`` of the code.

    Timing
    ------
    Initiation interval 1 code per cycle. Latency ``4 + ceil(log2 m)`` cycles from code
    acceptance to ``o_dist.valid``: memory read, a register on the read data (block-RAM
    clock-to-out is long, so nothing follows it combinationally), one cycle per adder-tree
    level, output FIFO (2 cycles).

    With ``lut_buffers=2`` a LUT is loaded into the idle buffer while codes are scanned with the
    other, so loading never stalls codes if the next LUT arrives during the current scan.
    With ``lut_buffers=1`` loading waits for the end of the current scan and codes wait for the
    end of the load (256 cycles). ``i_codes`` is not ready until a LUT has been loaded.

    Backpressure: ``o_dist`` may stall at any time; ``i_codes.ready`` drops when the output FIFO
    could fill. ``i_codes.ready`` does not depend combinationally on ``o_dist.ready``.
    """

    def __init__(self, config):
        self.config = config
        c = config
        row = layouts.lut_row(c.m, c.lut_bits)
        members = {
            "i_lut": In(stream.Signature(row)),
            "i_codes": In(stream.Signature(layouts.pq_code(c.m, c.tag_bits))),
            "o_dist": Out(stream.Signature(layouts.distance(c.dist_bits, c.tag_bits))),
        }
        if c.forward_lut:
            members["o_lut"] = Out(stream.Signature(row))
        super().__init__(members)

    def elaborate(self, platform):
        c = self.config
        m = Module()
        buffers = c.lut_buffers
        bank_bits = buffers - 1      # 0 or 1 bank-select bit above the 8-bit row address

        # -- LUT buffer bookkeeping -----------------------------------------------------------
        row = Signal(8)
        wbank = Signal(bank_bits)
        rbank = Signal(bank_bits)
        full = Signal(range(buffers + 1))   # LUTs loaded and not yet consumed by a scan

        fwd_free = Signal()
        if c.forward_lut:
            m.d.comb += fwd_free.eq(~self.o_lut.valid | self.o_lut.ready)
            with m.If(self.o_lut.ready):
                m.d.sync += self.o_lut.valid.eq(0)
        else:
            m.d.comb += fwd_free.eq(1)

        load = Signal()
        m.d.comb += [
            self.i_lut.ready.eq((full < buffers) & fwd_free),
            load.eq(self.i_lut.valid & self.i_lut.ready),
        ]
        load_done = Signal()
        m.d.comb += load_done.eq(load & (row == 255))
        with m.If(load):
            m.d.sync += row.eq(row + 1)
            if bank_bits:
                with m.If(row == 255):
                    m.d.sync += wbank.eq(~wbank)
            if c.forward_lut:
                m.d.sync += [self.o_lut.valid.eq(1), self.o_lut.payload.eq(self.i_lut.payload)]

        # -- code scan --------------------------------------------------------------------------
        dist_shape = layouts.distance(c.dist_bits, c.tag_bits)
        m.submodules.out = out = CreditBuffer(dist_shape, latency=c.latency)
        wiring.connect(m, wiring.flipped(self.o_dist), out.o)

        accept = Signal()
        m.d.comb += [
            self.i_codes.ready.eq((full != 0) & out.ready),
            accept.eq(self.i_codes.valid & self.i_codes.ready),
            out.take.eq(accept),
        ]
        scan_done = Signal()
        m.d.comb += scan_done.eq(accept & self.i_codes.payload.last)
        if bank_bits:
            with m.If(scan_done):
                m.d.sync += rbank.eq(~rbank)
        with m.If(load_done & ~scan_done):
            m.d.sync += full.eq(full + 1)
        with m.Elif(~load_done & scan_done):
            m.d.sync += full.eq(full - 1)

        # One memory per LUT column; bank bit (if any) above the row address.
        # ``no_rw_check``: a read whose data is used never hits the row being written (with one
        # buffer, loads and scans exclude each other via ``full``; with two, ``wbank`` differs
        # from ``rbank`` whenever both are active), so yosys need not emulate read-old-data on
        # collisions, which put a mux between the block-RAM output and the register.
        looked_up = []
        for i in range(c.m):
            mem = memory.Memory(shape=unsigned(c.lut_bits), depth=256 * buffers, init=[],
                                attrs={"no_rw_check": 1})
            m.submodules[f"lut_col{i}"] = mem
            wr = mem.write_port()
            rd = mem.read_port()
            code_i = self.i_codes.payload.code[i]
            if bank_bits:
                m.d.comb += [wr.addr.eq(row | (wbank << 8)), rd.addr.eq(code_i | (rbank << 8))]
            else:
                m.d.comb += [wr.addr.eq(row), rd.addr.eq(code_i)]
            m.d.comb += [wr.data.eq(self.i_lut.payload.value[i]), wr.en.eq(load)]
            # Register the read data: block-RAM clock-to-out leaves no room for an adder.
            entry = Signal.like(rd.data, name=f"lut_entry{i}", reset_less=True)
            m.d.sync += entry.eq(rd.data)
            looked_up.append(entry)

        total, tree_latency = adder_tree(m, looked_up, name="dist")
        assert 2 + tree_latency == c.latency
        m.d.comb += [
            out.i.valid.eq(delay(m, accept, c.latency, name="valid")),
            out.i.payload.dist.eq(total),
            out.i.payload.tag.eq(delay(m, self.i_codes.payload.tag, c.latency, name="tag")),
            out.i.payload.last.eq(delay(m, self.i_codes.payload.last, c.latency, name="last")),
        ]
        return m


class PQDecoderModel(StreamModel):
    """Stream-level golden model and stimulus of :class:`PQDecoder` for the testbench."""

    result_port = "o_dist"
    latency_from = "i_codes"

    @staticmethod
    def scan_lengths(items, rng, min_scan=256):
        """Split ``items`` codes into scans of at least ``min_scan`` codes, the last one a
        single code when there are three scans or more.

        A LUT load takes 256 cycles, so a scan shorter than that exposes the next load even with
        double buffering; only the last scan can be short without a bubble.
        """
        scans = max(1, min(12, items // 600 + 1))
        while scans > 1 and min_scan * (scans - 1) + 1 > items:
            scans -= 1
        short_last = scans >= 3
        body = scans - 1 if short_last else scans
        rest = items - (1 if short_last else 0) - min_scan * body
        shares = rng.dirichlet([0.5] * body)        # uneven: some scans much longer than others
        lengths = [min_scan + int(x) for x in rng.multinomial(rest, shares)] \
            if rest >= 0 else [items]
        return lengths + ([1] if short_last else [])

    @classmethod
    def stimulus(cls, config, items, rng, min_scan=256):
        """``items`` codes split into scans (:meth:`scan_lengths`), each with its own random LUT
        whose entries include 0 and the maximum value."""
        c = config
        lengths = cls.scan_lengths(items, rng, min_scan)
        luts, codes = [], []
        top = (1 << c.lut_bits) - 1
        for length in lengths:
            lut = rng.integers(0, top, size=(c.m, 256), endpoint=True)
            lut[rng.random(lut.shape) < 0.02] = top
            lut[rng.random(lut.shape) < 0.02] = 0
            luts.append(lut)
            codes.append(rng.integers(0, 255, size=(length, c.m), endpoint=True))
        tags = rng.integers(0, (1 << c.tag_bits) - 1, size=items, endpoint=True, dtype=np.uint64)
        return {"luts": luts, "codes": codes, "tags": tags}

    @staticmethod
    def inputs(config, stim):
        """``i_lut``: per scan, 256 beats (no TLAST) whose ``value`` is ``lut[:, r]``, entry ``r``
        of every sub-space; ``i_codes``: one beat per code, ``code`` (``m`` bytes) and its ``tag``,
        with ``last`` on each scan's final code."""
        rows = [{"value": lut[:, r].tolist()} for lut in stim["luts"] for r in range(256)]
        beats, n = [], 0
        for scan in stim["codes"]:
            for k, code in enumerate(scan):
                beats.append({"code": code.tolist(), "tag": int(stim["tags"][n]),
                              "last": int(k == len(scan) - 1)})
                n += 1
        return {"i_lut": rows, "i_codes": beats}

    @staticmethod
    def expect(config, stim):
        """``o_dist``: one beat per code, ``dist`` = :func:`hwgen.vecsearch.golden.pq_distances` of
        the code with its scan's LUT, the code's ``tag``, ``last`` on each scan's final code; with
        ``forward_lut`` also ``o_lut``, the ``i_lut`` beats unchanged."""
        out, n = [], 0
        for lut, scan in zip(stim["luts"], stim["codes"]):
            dists = golden.pq_distances(scan, lut)
            for k, d in enumerate(dists):
                out.append({"dist": int(d), "tag": int(stim["tags"][n]),
                            "last": int(k == len(scan) - 1)})
                n += 1
        result = {"o_dist": out}
        if config.forward_lut:
            result["o_lut"] = [{"value": lut[:, r].tolist()}
                               for lut in stim["luts"] for r in range(256)]
        return result
