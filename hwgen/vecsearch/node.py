"""ChamVS memory node: IVF-PQ search from DRAM channels to the top-K (Chameleon section 4).

The node holds a shard of a PQ-compressed database in its memory channels (packed by
:mod:`hwgen.vecsearch.layout`) and answers (query vector, probed list ids) with the ``k``
nearest vector ids and their distances. Inside:

* the **distance-LUT builder** (:class:`LUTBuilder`), fed with the query and the coarse centroid
  of each probed list (coarse centroids live in on-chip memory);
* per memory channel an **AXI4 read master** (:class:`hwgen.lib.axi.AXI4Reader`) streaming the
  probed lists' PQ codes at one word per cycle, and a **splitter** handing the ``W / m`` codes
  of each word to as many **PQ decoding units** (:class:`PQDecoder`); the units form one chain
  along which each LUT is forwarded (double-buffered: the next list's LUT loads while this one
  is scanned);
* **K-selection** by the approximate hierarchical priority queue (:class:`HierPQ`), one L1
  stream per unit; items carry a *tag* (channel, probe, word, lane) rather than the vector id,
  so the scan reads only codes;
* **id retrieval**: the ``k`` survivors' tags are turned into addresses in the channels' id
  regions and their ids fetched (one word each), as the paper's code does.

Queries are processed one at a time. Per-query performance counters (``stat_*`` ports) record
cycles spent building the first LUT, scanning and draining.
"""

from dataclasses import dataclass

import numpy as np
from amaranth.hdl import Cat, Const, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, fifo, memory, stream, wiring
from amaranth.lib.wiring import In, Out

from ..boards import board_names, load_board
from ..config import Config, param
from ..errors import ConfigError
from ..lib.axi import AXI4Reader, AXI4Signature
from . import golden, layouts
from .hier_pq import HierPQ, HierPQConfig
from .lut_builder import LUTBuilder, LUTBuilderConfig
from .pq_decoder import PQDecoder, PQDecoderConfig

__all__ = ["ChamVSNodeConfig", "ChamVSNode", "STAT_PORTS"]

#: Per-query counters, latched when a query's last result leaves (32 bits each).
STAT_PORTS = ("stat_cycles", "stat_lut", "stat_scan", "stat_drain", "stat_words", "stat_starve",
              "stat_wait")
ADDR_BITS = 64


def _log2(n):
    return (n - 1).bit_length()


@dataclass(frozen=True)
class ChamVSNodeConfig(Config):
    """Configuration of the ChamVS memory node :class:`ChamVSNode`: the board and memory channels
    used, the index's shape (dimension, PQ sub-spaces, lists, probes), ``k``, the number formats
    (components, LUT entries, ids), the LUT builder's parallelism, the K-selection queues and the
    width of a segment's word offsets."""
    board: str = param("u250", "target board: fixes memory channels and AXI word width",
                       choices=board_names())
    channels: int = param(0, "memory channels used (0 = all of the board's primary memory)",
                          lo=0, hi=64)
    dim: int = param(64, "vector dimension D", lo=1, hi=4096)
    m: int = param(16, "PQ sub-spaces: bytes per code (a power of two dividing the AXI word)",
                   choices=(1, 2, 4, 8, 16, 32, 64))
    nlist: int = param(16, "IVF lists held by the node", lo=1, hi=1 << 20)
    nprobe_max: int = param(4, "most lists probed by one query", lo=1, hi=256)
    k: int = param(10, "results per query", lo=1, hi=1024)
    elem_bits: int = param(8, "bits of a signed vector component", lo=2, hi=16)
    lut_bits: int = param(24, "bits of a LUT entry (saturating)", lo=1, hi=32)
    lut_shift: int = param(0, "right shift of each squared distance in the LUT", lo=0, hi=48)
    lut_sub_par: int = param(0, "LUT builder sub-spaces per cycle (0 = all: a row per cycle)",
                             lo=0, hi=256)
    queue: str = param("insert", "L1/L2 queue kind of the K-selection", choices=("insert",
                                                                               "systolic"))
    l1_len: int = param(0, "L1 queue length (0 = sized for 99% exact queries)", lo=0, hi=1024)
    id_bits: int = param(32, "bits of a stored vector id", choices=(32, 64))
    segment_bits: int = param(16, "bits of a word offset inside one list's segment on one "
                                  "channel (segments of up to 2**segment_bits words)",
                              lo=1, hi=32)

    def check(self):
        board = load_board(self.board)
        mem = board.primary_memory
        if self.channels > mem.count:
            raise ConfigError("channels", f"must be in 0..{mem.count} ({board.name} has "
                              f"{mem.count} {mem.kind} channels)", value=self.channels)
        if self.word_bytes % self.m:
            raise ConfigError("m", f"must divide the {self.word_bytes}-byte AXI word of "
                              f"{board.name}", value=self.m)
        if self.dim % self.m:
            raise ConfigError("m", f"must divide dim={self.dim}", value=self.m)
        if self.lut_sub_par > self.m:
            raise ConfigError("lut_sub_par", f"must be in 0..m={self.m}", value=self.lut_sub_par)
        if self.l1_len > self.k:
            raise ConfigError("l1_len", f"must be in 0..k={self.k}", value=self.l1_len)

    # -- derived -------------------------------------------------------------------------------

    @property
    def memory(self):
        """The board's primary memory (:class:`~hwgen.boards.MemoryChannels`): the node's
        channels."""
        return load_board(self.board).primary_memory

    @property
    def n_channels(self):
        """Memory channels in use: ``channels``, or all of the primary memory's when it is 0."""
        return self.channels or self.memory.count

    @property
    def word_bytes(self):
        """Bytes W of one AXI data word of a channel."""
        return self.memory.axi_data_bits // 8

    @property
    def codes_per_word(self):
        """PQ codes in one word: ``W / m`` (also the PQ decoding units per channel)."""
        return self.word_bytes // self.m

    @property
    def units(self):
        """PQ decoding units: channels x W / m, one code per unit per cycle at full bandwidth."""
        return self.n_channels * self.codes_per_word

    @property
    def word_addr_bits(self):
        """Bits of a word address within one channel (its capacity)."""
        words = int(self.memory.capacity_gib * (1 << 30)) // self.word_bytes
        return max(1, _log2(words))

    @property
    def tag_fields(self):
        """(name, bits) of an item tag, least significant first."""
        return (("lane", _log2(self.codes_per_word)), ("word", self.segment_bits),
                ("probe", _log2(self.nprobe_max)), ("channel", _log2(self.n_channels)))

    @property
    def tag_bits(self):
        """Bits of an item tag (at least 1): the sum of :attr:`tag_fields`."""
        return max(1, sum(b for _, b in self.tag_fields))

    @property
    def dist_bits(self):
        """Bits of a distance: a sum of ``m`` LUT entries never overflows it."""
        return golden.distance_bits(self.m, self.lut_bits)

    @property
    def id_bytes(self):
        """Bytes of a stored vector id."""
        return self.id_bits // 8

    def lut_config(self):
        """The :class:`LUTBuilderConfig` of the node's LUT builder."""
        return LUTBuilderConfig(dim=self.dim, m=self.m, elem_bits=self.elem_bits,
                                lut_shift=self.lut_shift, lut_bits=self.lut_bits,
                                sub_par=self.lut_sub_par)

    def unit_config(self, forward):
        """The :class:`PQDecoderConfig` of a PQ decoding unit: double-buffered LUTs, forwarded on
        ``o_lut`` when ``forward`` (every unit but the chain's last), tags of ``tag_bits + 2`` bits
        (the item tag, a valid-code bit, the query's last-code bit)."""
        return PQDecoderConfig(m=self.m, lut_bits=self.lut_bits, tag_bits=self.tag_bits + 2,
                               lut_buffers=2, forward_lut=forward)

    def kselect_config(self):
        """The :class:`HierPQConfig` of the K-selection: one stream per PQ unit, items of
        ``dist_bits`` distances and ``tag_bits`` tags."""
        return HierPQConfig(streams=self.units, k=self.k, l1_len=self.l1_len, queue=self.queue,
                            dist_bits=self.dist_bits, id_bits=self.tag_bits)

    def memory_banks(self):
        """``{m_axi_ch<c>: bank}``: channel ``c`` of the node is the board's memory bank ``c``
        (``DDR[c]`` on u250), where the host loads that channel's image."""
        mem = self.memory
        if not mem.vitis_bank:
            return {}
        return {f"m_axi_ch{ch}": mem.bank(ch) for ch in range(self.n_channels)}

    def derived(self):
        ks = self.kselect_config()
        return {"channels": self.n_channels, "word_bytes": self.word_bytes,
                "codes_per_word": self.codes_per_word, "pq_units": self.units,
                "scan_limit_codes_per_cycle": self.units, "dist_bits": self.dist_bits,
                "tag_bits": self.tag_bits, "l1_len": ks.l1, "l1_queues": ks.l1_queues,
                "word_addr_bits": self.word_addr_bits}

    # -- stream layouts ------------------------------------------------------------------------

    def table_entry(self):
        """Payload of ``i_table``, one address-table entry per (list, channel): ``code_word`` (first
        word of the code segment), ``count`` (codes) and ``id_word`` (first word of the ids)."""
        return data.StructLayout({"code_word": unsigned(self.word_addr_bits),
                                  "count": unsigned(self.segment_bits + _log2(
                                      self.codes_per_word) + 1),
                                  "id_word": unsigned(self.word_addr_bits)})

    def query_layout(self):
        """Payload of ``i_query``: ``query`` (``dim`` signed ``elem_bits`` components), ``nprobe``
        and ``lists`` (``nprobe_max`` list ids, the first ``nprobe`` used)."""
        return data.StructLayout({
            "query": data.ArrayLayout(signed(self.elem_bits), self.dim),
            "nprobe": unsigned(_log2(self.nprobe_max + 1)),
            "lists": data.ArrayLayout(unsigned(max(1, _log2(self.nlist))), self.nprobe_max),
        })

    def result_layout(self):
        """Payload of ``o_result``: ``dist`` (``dist_bits``), ``id`` (``id_bits``) and ``last``."""
        return data.StructLayout({"dist": unsigned(self.dist_bits),
                                  "id": unsigned(self.id_bits), "last": unsigned(1)})


class ChamVSNode(wiring.Component):
    """The ChamVS near-memory search node.

    Parameters
    ----------
    config : ChamVSNodeConfig

    Members
    -------
    i_pq : ``In(stream.Signature(pq_centroid(D/m, elem_bits)))``
        PQ centroids, ``m * 256`` beats (faiss order), to the LUT builder.
    i_coarse : ``In(stream.Signature({elem: D x signed(elem_bits)}))``
        Coarse (IVF) centroids, ``nlist`` beats in list order, into on-chip memory.
    i_table : ``In(stream.Signature(table_entry))``
        The address table, ``nlist * channels`` beats, list major (see :mod:`layout`).
    i_query : ``In(stream.Signature(query_layout))``
        A query vector, ``nprobe`` (1..nprobe_max) and the probed list ids ``lists[0..]``.
        Accepted once all metadata (PQ centroids, coarse centroids, address table) has been
        loaded and the previous query has finished.
    o_result : ``Out(stream.Signature(result_layout))``
        ``min(k, candidates)`` results per query, ascending by (distance, tag), ``last`` on the
        final one.
    m_axi_ch<c> : ``Out(AXI4Signature(64, 8 * W, write=False))``
        One read master per memory channel.
    stat_cycles, stat_lut, stat_scan, stat_drain : ``Out(32)``
        Cycles of the last finished query: in total, from its acceptance to channel 0's first
        code word entering the units (the first LUT), from that word to channel 0's last code
        word, and from there to the last result.
    stat_words, stat_starve, stat_wait : ``Out(32)``
        Channel 0 during that scan window: cycles a code word entered the units, cycles no word
        had arrived from memory, cycles a word waited for the units (LUT not yet loaded or
        K-selection backpressure). ``words / (words + starve)`` is the memory-side scan
        efficiency.

    Throughput: every channel delivers one ``W``-byte word per cycle to its ``W / m`` units
    while they hold a LUT; a list's LUT takes 256 cycles to build and load, hidden behind the
    previous list's scan when that is long enough.
    """

    def __init__(self, config):
        self.config = c = config
        members = {
            "i_pq": In(stream.Signature(layouts.pq_centroid(c.dim // c.m, c.elem_bits))),
            "i_coarse": In(stream.Signature(data.StructLayout(
                {"elem": data.ArrayLayout(signed(c.elem_bits), c.dim)}))),
            "i_table": In(stream.Signature(c.table_entry())),
            "i_query": In(stream.Signature(c.query_layout())),
            "o_result": Out(stream.Signature(c.result_layout())),
        }
        for ch in range(c.n_channels):
            members[f"m_axi_ch{ch}"] = Out(AXI4Signature(ADDR_BITS, 8 * c.word_bytes,
                                                         write=False))
        for name in STAT_PORTS:
            members[name] = Out(32)
        super().__init__(members)

    def elaborate(self, platform):
        c = self.config
        m = Module()
        C, cpw, W = c.n_channels, c.codes_per_word, c.word_bytes
        q = self.i_query.payload
        coarse_rd, tables, loaded = self._metadata(m)

        # -- query registers and node state ----------------------------------------------------
        busy = Signal()
        fetching = Signal()          # the survivors' ids are being fetched
        query = Signal(data.ArrayLayout(signed(c.elem_bits), c.dim))
        lists = Signal(data.ArrayLayout(unsigned(max(1, _log2(c.nlist))), c.nprobe_max))
        nprobe = Signal(_log2(c.nprobe_max + 1))
        accept = Signal()
        done = Signal()              # the last result leaves this cycle
        m.d.comb += [self.i_query.ready.eq(loaded & ~busy),
                     accept.eq(self.i_query.valid & self.i_query.ready)]
        with m.If(accept):
            m.d.sync += busy.eq(1)
        # The query's registers follow the input while the node is idle (their enable is a
        # register, not the handshake: `accept` would otherwise fan out to every bit of them);
        # they hold what was on the input in the cycle it was accepted.
        with m.If(~busy):
            m.d.sync += [query.eq(q.query), lists.eq(q.lists), nprobe.eq(q.nprobe)]
        with m.If(done):
            m.d.sync += [busy.eq(0), fetching.eq(0)]
        builder = self._lut_feed(m, coarse_rd, accept, ~busy, query, lists, nprobe)

        # -- PQ decoding units, LUTs forwarded along the chain ----------------------------------
        units = []
        for u in range(c.units):
            unit = PQDecoder(c.unit_config(forward=u < c.units - 1))
            m.submodules[f"unit{u}"] = unit
            units.append(unit)
        wiring.connect(m, builder.o_lut, units[0].i_lut)
        for a, b in zip(units, units[1:]):
            wiring.connect(m, a.o_lut, b.i_lut)

        # -- K-selection over the units' distances -----------------------------------------------
        m.submodules.kselect = ks = HierPQ(c.kselect_config(), markers=True)
        for u, unit in enumerate(units):
            src, dst = unit.o_dist, getattr(ks, f"i_s{u}")
            tag = src.payload.tag
            m.d.comb += [dst.valid.eq(src.valid), src.ready.eq(dst.ready),
                         dst.payload.dist.eq(src.payload.dist),
                         dst.payload.id.eq(tag[:c.tag_bits]),
                         dst.payload.empty.eq(~tag[c.tag_bits]),
                         dst.payload.last.eq(tag[c.tag_bits + 1])]

        # -- memory channels: scan commands, code splitting, id fetch -------------------------
        readers = []
        for ch in range(C):
            reader = AXI4Reader(ADDR_BITS, 8 * W, words_width=c.segment_bits + 1,
                                max_burst=256, max_outstanding=8)
            m.submodules[f"reader{ch}"] = reader
            wiring.connect(m, wiring.flipped(getattr(self, f"m_axi_ch{ch}")), reader.bus)
            readers.append(reader)

        fetch_cmd, fetch_table_addr, fetch_words = self._id_fetch(m, ks, readers, tables, lists,
                                                                   fetching, done)
        fires = [self._scan_channel(m, ch, readers[ch], tables[ch][1],
                                    units[ch * cpw:(ch + 1) * cpw], accept, ~busy, q, lists,
                                    nprobe, fetching, fetch_cmd[ch], fetch_table_addr,
                                    fetch_words[ch])
                 for ch in range(C)]
        self._counters(m, busy, done, *fires[0], readers[0])
        return m

    def _metadata(self, m):
        """Metadata loaders: the coarse centroids (``i_coarse``) and the channels' address
        tables (``i_table``), and the count of PQ centroids passed on ``i_pq``. Returns
        ``(coarse_rd, tables, loaded)``: the centroid read port, each table's ``(write,
        read)`` ports and ``loaded`` once all of them are complete."""
        c = self.config
        C = c.n_channels
        # -- metadata: coarse centroids and address tables -------------------------------------
        coarse = memory.Memory(shape=data.ArrayLayout(signed(c.elem_bits), c.dim),
                               depth=c.nlist, init=[])
        m.submodules.coarse = coarse
        coarse_wr, coarse_rd = coarse.write_port(), coarse.read_port()
        tables = []
        for ch in range(C):
            mem = memory.Memory(shape=c.table_entry(), depth=c.nlist, init=[])
            m.submodules[f"table{ch}"] = mem
            tables.append((mem.write_port(), mem.read_port()))

        coarse_n = Signal(range(c.nlist + 1))
        table_list = Signal(range(c.nlist + 1))
        table_ch = Signal(range(C))
        m.d.comb += [self.i_coarse.ready.eq(coarse_n < c.nlist),
                     coarse_wr.addr.eq(coarse_n), coarse_wr.data.eq(self.i_coarse.payload.elem),
                     coarse_wr.en.eq(self.i_coarse.valid & self.i_coarse.ready)]
        with m.If(coarse_wr.en):
            m.d.sync += coarse_n.eq(coarse_n + 1)
        m.d.comb += self.i_table.ready.eq(table_list < c.nlist)
        table_load = self.i_table.valid & self.i_table.ready
        for ch, (wr, _) in enumerate(tables):
            m.d.comb += [wr.addr.eq(table_list), wr.data.eq(self.i_table.payload),
                         wr.en.eq(table_load & (table_ch == ch))]
        with m.If(table_load):
            with m.If(table_ch == C - 1):
                m.d.sync += [table_ch.eq(0), table_list.eq(table_list + 1)]
            with m.Else():
                m.d.sync += table_ch.eq(table_ch + 1)
        pq_n = Signal(range(c.m * 256 + 1))      # PQ centroids passed to the LUT builder
        with m.If(self.i_pq.valid & self.i_pq.ready):
            m.d.sync += pq_n.eq(pq_n + 1)
        # a register: the query handshake and everything `accept` enables see no counter compare
        loaded = Signal()
        m.d.sync += loaded.eq((coarse_n == c.nlist) & (table_list == c.nlist)
                              & (pq_n == c.m * 256))
        return coarse_rd, tables, loaded

    def _lut_feed(self, m, coarse_rd, accept, idle, query, lists, nprobe):
        """The LUT builder (returned; ``i_pq`` feeds its centroids), fed with (query, coarse
        centroid) for each probed list: the centroid is read from ``coarse_rd`` at the
        query's ``accept``, then after each pair the builder takes."""
        c = self.config
        q = self.i_query.payload
        # -- LUT builder, fed with (query, coarse centroid) per probed list ---------------------
        m.submodules.lut = builder = LUTBuilder(c.lut_config())
        wiring.connect(m, wiring.flipped(self.i_pq), builder.i_centroids)
        lut_p = Signal(range(c.nprobe_max + 1))
        lut_pending = Signal()        # coarse_rd.data holds the centroid of probe lut_p
        lut_next = builder.i_query.valid & builder.i_query.ready
        more = lut_p + 1 < nprobe
        m.d.comb += [builder.i_query.valid.eq(lut_pending),
                     builder.i_query.payload.query.eq(query),
                     builder.i_query.payload.centroid.eq(coarse_rd.data),
                     # read the first centroid in every idle cycle (the read has no effect
                     # but its data, wanted the cycle a query is accepted)
                     coarse_rd.en.eq(idle | (lut_next & more)),
                     coarse_rd.addr.eq(Mux(idle, q.lists[0], lists[(lut_p + 1)[
                         :max(1, _log2(c.nprobe_max))]]))]
        with m.If(accept):
            m.d.sync += [lut_p.eq(0), lut_pending.eq(1)]
        with m.Elif(lut_next):
            m.d.sync += lut_p.eq(lut_p + 1)
            with m.If(~more):
                m.d.sync += lut_pending.eq(0)
        return builder

    # ------------------------------------------------------------------------------------------

    def _scan_channel(self, m, ch, reader, table_rd, units, accept, idle, q, lists, nprobe,
                      fetching, fetch_cmd, fetch_table_addr, fetch_word):
        """Scan commands and code splitting of channel ``ch``. Returns ``(fire, final)``: a code
        word enters the units this cycle; it is the query's last word on this channel."""
        c = self.config
        cpw, W = c.codes_per_word, c.word_bytes
        lane_bits = _log2(cpw)
        pbits = max(1, _log2(c.nprobe_max))
        info_layout = data.StructLayout({"probe": unsigned(pbits),
                                         "words": unsigned(c.segment_bits + 1),
                                         "count": unsigned(c.segment_bits + lane_bits + 1),
                                         "final": unsigned(1)})
        info = fifo.SyncFIFOBuffered(width=info_layout.size, depth=max(2, c.nprobe_max))
        m.submodules[f"info{ch}"] = info

        # Commands: read the table entry of each probed list, then issue its code segment.
        p = Signal(range(c.nprobe_max + 1), name=f"scan_p{ch}")
        pending = Signal(name=f"scan_pending{ch}")
        entry = table_rd.data
        words = Signal(c.segment_bits + 1, name=f"scan_words{ch}")
        m.d.comb += words.eq(Mux(entry.count == 0, 1,
                                 (entry.count + cpw - 1) >> lane_bits))
        issue = Signal(name=f"scan_issue{ch}")
        more = p + 1 < nprobe
        m.d.comb += issue.eq(pending & reader.cmd.ready & info.w_rdy)
        with m.If(fetching):
            m.d.comb += [table_rd.addr.eq(fetch_table_addr), table_rd.en.eq(1),
                         reader.cmd.valid.eq(fetch_cmd.valid),
                         reader.cmd.payload.eq(fetch_cmd.payload),
                         fetch_cmd.ready.eq(reader.cmd.ready)]
        with m.Else():
            # the first list's entry is read in every idle cycle (see _lut_feed)
            m.d.comb += [table_rd.addr.eq(Mux(idle, q.lists[0], lists[(p + 1)[:pbits]])),
                         table_rd.en.eq(idle | (issue & more)),
                         reader.cmd.valid.eq(pending & info.w_rdy),
                         reader.cmd.payload.addr.eq(entry.code_word * W),
                         reader.cmd.payload.words.eq(words)]
        info_w = Signal(info_layout, name=f"info_w{ch}")
        m.d.comb += [info_w.probe.eq(p), info_w.words.eq(words), info_w.count.eq(entry.count),
                     info_w.final.eq(~more), info.w_data.eq(info_w),
                     info.w_en.eq(issue & ~fetching)]
        with m.If(accept):
            m.d.sync += [p.eq(0), pending.eq(1)]
        with m.Elif(issue & ~fetching):
            m.d.sync += p.eq(p + 1)
            with m.If(~more):
                m.d.sync += pending.eq(0)

        # Splitter: each word's codes go to the channel's units together.
        cur = Signal(info_layout, name=f"info_r{ch}")
        m.d.comb += cur.eq(info.r_data)
        w = Signal(c.segment_bits + 1, name=f"split_w{ch}")
        all_ready = Signal(name=f"units_ready{ch}")
        m.d.comb += all_ready.eq(Cat(u.i_codes.ready for u in units).all())
        word_valid = reader.o.valid & ~fetching
        fire = Signal(name=f"split_fire{ch}")
        m.d.comb += fire.eq(word_valid & info.r_rdy & all_ready)
        end = w == cur.words - 1
        for j, unit in enumerate(units):
            p_in = unit.i_codes.payload
            pos = Cat(Const(j, lane_bits), w[:c.segment_bits]) if lane_bits else w
            tag = Cat(Const(j, lane_bits), w[:c.segment_bits], cur.probe[:_log2(c.nprobe_max)],
                      Const(ch, _log2(c.n_channels)))
            m.d.comb += [unit.i_codes.valid.eq(word_valid & info.r_rdy & all_ready),
                         p_in.tag.eq(Cat(tag, pos < cur.count, cur.final & end)),
                         p_in.last.eq(end)]
            for i in range(c.m):
                m.d.comb += p_in.code[i].eq(reader.o.payload[8 * (j * c.m + i):
                                                             8 * (j * c.m + i + 1)])
        with m.If(fetching):
            m.d.comb += reader.o.ready.eq(fetch_word.ready)
        with m.Else():
            m.d.comb += reader.o.ready.eq(fire)
        m.d.comb += [fetch_word.valid.eq(reader.o.valid & fetching),
                     fetch_word.payload.eq(reader.o.payload),
                     info.r_en.eq(fire & end)]
        with m.If(fire):
            m.d.sync += w.eq(Mux(end, 0, w + 1))
        return fire, fire & end & cur.final

    def _id_fetch(self, m, ks, readers, tables, lists, fetching, done):
        """Turn the survivors' tags into id reads and results. Returns per-channel command and
        word streams and the table address used while fetching."""
        c = self.config
        C, cpw, W = c.n_channels, c.codes_per_word, c.word_bytes
        fields = dict(c.tag_fields)
        cmd_layout = readers[0].cmd.payload.shape()
        cmds = [stream.Signature(cmd_layout).create(path=(f"fetch_cmd{ch}",))
                for ch in range(C)]
        words = [stream.Signature(unsigned(8 * W)).create(path=(f"fetch_word{ch}",))
                 for ch in range(C)]

        item = ks.o_topk
        with m.If(item.valid):
            m.d.sync += fetching.eq(1)

        def field(tag, name):
            lo = 0
            for n, bits in c.tag_fields:
                if n == name:
                    return tag[lo:lo + bits] if bits else Const(0, 1)
                lo += bits

        # Stage A: take an item, read its list's table entry on its channel.
        a_valid = Signal()
        a_dist = Signal(c.dist_bits)
        a_tag = Signal(c.tag_bits)
        a_last = Signal()
        slots = W // c.id_bytes
        pend_layout = data.StructLayout({"dist": unsigned(c.dist_bits),
                                         "channel": unsigned(max(1, _log2(C))),
                                         "slot": unsigned(max(1, _log2(slots))),
                                         "last": unsigned(1)})
        pend = fifo.SyncFIFOBuffered(width=pend_layout.size, depth=16)
        m.submodules.fetch_pending = pend
        b_fire = Signal()
        m.d.comb += item.ready.eq(fetching & (~a_valid | b_fire))
        with m.If(item.valid & item.ready):
            m.d.sync += [a_valid.eq(1), a_dist.eq(item.payload.dist),
                         a_tag.eq(item.payload.id), a_last.eq(item.payload.last)]
        with m.Elif(b_fire):
            m.d.sync += a_valid.eq(0)
        table_addr = Signal(max(1, _log2(c.nlist)))
        pbits = max(1, _log2(c.nprobe_max))
        m.d.comb += table_addr.eq(lists[field(item.payload.id, "probe")[:pbits]])
        # The table entry arrives the cycle after the item is taken (read port enabled always
        # while fetching); stage B holds the item until its command and pending slot are free.
        a_ch = field(a_tag, "channel")
        entry = Signal(c.table_entry())
        with m.Switch(a_ch):
            for ch, (_, rd) in enumerate(tables):
                with m.Case(ch):
                    m.d.comb += entry.eq(rd.data)
        entry_hold = Signal(c.table_entry())
        entry_fresh = Signal()
        with m.If(item.valid & item.ready):
            m.d.sync += entry_fresh.eq(1)
        with m.Elif(entry_fresh):
            m.d.sync += [entry_fresh.eq(0), entry_hold.eq(entry)]
        b_entry = Signal(c.table_entry())
        m.d.comb += b_entry.eq(Mux(entry_fresh, entry, entry_hold))
        position = Cat(field(a_tag, "lane"), field(a_tag, "word")) if _log2(cpw) else \
            field(a_tag, "word")
        offset = Signal(c.segment_bits + _log2(cpw) + 8)
        m.d.comb += offset.eq(position * c.id_bytes)
        byte_bits = _log2(W)
        cmd_ready = Signal()
        m.d.comb += cmd_ready.eq(Cat(cmd.ready & (a_ch == ch)
                                     for ch, cmd in enumerate(cmds)).any() if C > 1
                                 else cmds[0].ready)
        m.d.comb += b_fire.eq(a_valid & cmd_ready & pend.w_rdy)
        for ch, cmd in enumerate(cmds):
            m.d.comb += [cmd.valid.eq(a_valid & pend.w_rdy & (a_ch == ch)),
                         cmd.payload.addr.eq((b_entry.id_word + (offset >> byte_bits)) * W),
                         cmd.payload.words.eq(1)]
        pend_w = Signal(pend_layout)
        m.d.comb += [pend_w.dist.eq(a_dist), pend_w.channel.eq(a_ch),
                     pend_w.slot.eq(offset[_log2(c.id_bytes):byte_bits]),
                     pend_w.last.eq(a_last), pend.w_data.eq(pend_w), pend.w_en.eq(b_fire)]

        # Results: the oldest pending item takes its channel's next word.
        head = Signal(pend_layout)
        m.d.comb += head.eq(pend.r_data)
        o = self.o_result
        word = Signal(8 * W)
        word_valid = Signal()
        with m.Switch(head.channel):
            for ch, wd in enumerate(words):
                with m.Case(ch):
                    m.d.comb += [word.eq(wd.payload), word_valid.eq(wd.valid),
                                 wd.ready.eq(pend.r_rdy & o.ready)]
        m.d.comb += [o.valid.eq(pend.r_rdy & word_valid),
                     o.payload.dist.eq(head.dist), o.payload.last.eq(head.last),
                     o.payload.id.eq(word.word_select(head.slot, c.id_bits)),
                     pend.r_en.eq(o.valid & o.ready),
                     done.eq(o.valid & o.ready & head.last)]
        return cmds, table_addr, words

    def _counters(self, m, busy, done, fire, final, reader):
        """Per-query cycle counters of channel 0, latched on ``done`` (see class docstring)."""
        running = {name: Signal(32, name=f"run_{name}") for name in STAT_PORTS}
        started = Signal()         # channel 0's first code word has entered the units
        scanning = Signal()        # ... and its last has not
        # cleared in every idle cycle (an enable from a register; a query's counts begin the
        # cycle after its acceptance either way)
        with m.If(~busy):
            m.d.sync += [started.eq(0), scanning.eq(0)]
            for sig in running.values():
                m.d.sync += sig.eq(0)
        with m.Else():
            m.d.sync += running["stat_cycles"].eq(running["stat_cycles"] + 1)
            with m.If(~started & ~fire):
                m.d.sync += running["stat_lut"].eq(running["stat_lut"] + 1)
            with m.If(fire | scanning):
                m.d.sync += running["stat_scan"].eq(running["stat_scan"] + 1)
                with m.If(fire):
                    m.d.sync += running["stat_words"].eq(running["stat_words"] + 1)
                with m.Elif(reader.o.valid):
                    m.d.sync += running["stat_wait"].eq(running["stat_wait"] + 1)
                with m.Else():
                    m.d.sync += running["stat_starve"].eq(running["stat_starve"] + 1)
            with m.If(started & ~scanning & ~fire):
                m.d.sync += running["stat_drain"].eq(running["stat_drain"] + 1)
            with m.If(fire):
                m.d.sync += [started.eq(1), scanning.eq(~final)]
        with m.If(done):
            for name, sig in running.items():
                inc = 1 if name in ("stat_cycles", "stat_drain") else 0
                m.d.sync += getattr(self, name).eq(sig + inc)
