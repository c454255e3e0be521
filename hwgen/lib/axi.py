"""AXI4 memory-mapped gateware: bus signatures, burst read/write masters, Vitis control registers.

Signal names are the AXI signal names in lower case (``araddr``, ``rdata``, ...), so a component
member ``m_axi`` flattens to top-level ports ``m_axi_araddr`` ... that cocotbext-axi's
``AxiBus.from_prefix`` finds and Vivado's interface inference recognises.

:class:`AXI4Reader` and :class:`AXI4Writer` move runs of whole data words between memory and
streams. Both split a run into INCR bursts of at most ``max_burst`` beats that never cross a
4 KiB boundary (AXI4 rule), keep up to ``max_outstanding`` bursts in flight, and use full-width
beats only (``arsize``/``awsize`` = log2 of the word bytes, all write strobes set). Addresses are
byte addresses; their low bits below the word size are ignored (buffers must be word aligned,
which XRT's 4 KiB-aligned buffers are).

:class:`AXI4LiteControl` is the Vitis ``ap_ctrl_hs`` register file of an RTL kernel.

:class:`StreamUpsizer` and :class:`StreamDownsizer` convert between narrow items and the wide
words of a memory bus.
"""

from amaranth.hdl import Cat, Const, Module, Mux, Signal, unsigned
from amaranth.lib import data, fifo, stream, wiring
from amaranth.lib.wiring import In, Out

from .pipeline import BlockRAMFIFO, SkidBuffer

__all__ = ["AXI4Signature", "AXI4LiteSignature", "BurstSplitter", "AXI4Reader", "AXI4Writer",
           "AXI4LiteControl", "StreamUpsizer", "StreamDownsizer", "PAGE_BYTES", "burst_beats",
           "command_layout", "burst_layout"]

#: AXI4 bursts may not cross a boundary of this many bytes.
PAGE_BYTES = 4096

BURST_INCR = 0b01
RESP_OKAY = 0b00


def _log2(n, what):
    if n < 1 or n & (n - 1):
        raise ValueError(f"{what} must be a power of two, not {n}")
    return n.bit_length() - 1


def _less_than(m, a, b, name):
    """``a < b`` for unsigned ``a`` and ``b``, from the carry out of ``b + ~a`` (= ``b - a - 1``
    plus ``2**(W+1)``, ``W`` bits for either): one LUT level into a carry chain, where yosys maps a
    comparison to two on UltraScale+."""
    width = max(len(a), len(b))
    total = Signal(width + 2, name=name)
    m.d.comb += total.eq(b + ~Cat(a, Const(0, width + 1 - len(a))))
    return total[width + 1]


# (signal, flow seen from the master, width: bits or a key of the widths dict; 0 omits it)
_AXI4_READ = (
    ("arid", Out, "id"), ("araddr", Out, "addr"), ("arlen", Out, 8), ("arsize", Out, 3),
    ("arburst", Out, 2), ("arvalid", Out, 1), ("arready", In, 1),
    ("rid", In, "id"), ("rdata", In, "data"), ("rresp", In, 2), ("rlast", In, 1),
    ("rvalid", In, 1), ("rready", Out, 1))
_AXI4_WRITE = (
    ("awid", Out, "id"), ("awaddr", Out, "addr"), ("awlen", Out, 8), ("awsize", Out, 3),
    ("awburst", Out, 2), ("awvalid", Out, 1), ("awready", In, 1),
    ("wdata", Out, "data"), ("wstrb", Out, "strb"), ("wlast", Out, 1), ("wvalid", Out, 1),
    ("wready", In, 1),
    ("bid", In, "id"), ("bresp", In, 2), ("bvalid", In, 1), ("bready", Out, 1))
_AXI4_LITE = (
    ("awaddr", Out, "addr"), ("awvalid", Out, 1), ("awready", In, 1),
    ("wdata", Out, "data"), ("wstrb", Out, "strb"), ("wvalid", Out, 1), ("wready", In, 1),
    ("bresp", In, 2), ("bvalid", In, 1), ("bready", Out, 1),
    ("araddr", Out, "addr"), ("arvalid", Out, 1), ("arready", In, 1),
    ("rdata", In, "data"), ("rresp", In, 2), ("rvalid", In, 1), ("rready", Out, 1))


def _members(table, widths):
    members = {}
    for name, flow, width in table:
        width = widths[width] if isinstance(width, str) else width
        if width:
            members[name] = flow(unsigned(width))
    return members


class AXI4Signature(wiring.Signature):
    """AXI4 memory-mapped bus, from the master's point of view.

    Parameters
    ----------
    addr_width : int
        Byte address bits (Vitis requires 64).
    data_width : int
        Data bits per beat, a power of two from 8 to 1024.
    read, write : bool
        Include the read channels (AR, R) / write channels (AW, W, B).
    id_width : int
        Transaction ID bits (``arid``, ``rid``, ``awid``, ``bid``); 0 omits the ID signals.
        The masters here always use ID 0; the signals exist because AXI memory models and
        interconnects expect them.

    Members
    -------
    Read (with ``read``): ``araddr``, ``arlen`` (8), ``arsize`` (3), ``arburst`` (2), ``arvalid``
    (Out), ``arready`` (In); ``rdata``, ``rresp`` (2), ``rlast``, ``rvalid`` (In), ``rready`` (Out).
    Write (with ``write``): ``awaddr``, ``awlen``, ``awsize``, ``awburst``, ``awvalid`` (Out),
    ``awready`` (In); ``wdata``, ``wstrb`` (data_width/8), ``wlast``, ``wvalid`` (Out),
    ``wready`` (In); ``bresp`` (2), ``bvalid`` (In), ``bready`` (Out). The optional AXI4
    lock/cache/protection/QoS/region/user signals are left out.
    """

    def __init__(self, addr_width, data_width, *, read=True, write=True, id_width=1):
        _log2(data_width, "AXI data width")
        if not (read or write):
            raise ValueError("an AXI4 bus needs a read or a write side")
        self.addr_width, self.data_width = addr_width, data_width
        self.read, self.write, self.id_width = read, write, id_width
        widths = {"addr": addr_width, "data": data_width, "strb": data_width // 8,
                  "id": id_width}
        members = {**(_members(_AXI4_READ, widths) if read else {}),
                   **(_members(_AXI4_WRITE, widths) if write else {})}
        super().__init__(members)

    def __eq__(self, other):
        return (type(other) is type(self) and
                (self.addr_width, self.data_width, self.read, self.write, self.id_width) ==
                (other.addr_width, other.data_width, other.read, other.write, other.id_width))

    def __repr__(self):
        return (f"AXI4Signature({self.addr_width}, {self.data_width}, read={self.read}, "
                f"write={self.write}, id_width={self.id_width})")


class AXI4LiteSignature(wiring.Signature):
    """AXI4-Lite bus, from the master's point of view.

    Parameters
    ----------
    addr_width : int
        Byte address bits.
    data_width : int
        32 (Vitis control interfaces) or 64.

    Members
    -------
    ``awaddr``, ``awvalid`` (Out), ``awready`` (In); ``wdata``, ``wstrb``, ``wvalid`` (Out),
    ``wready`` (In); ``bresp`` (2), ``bvalid`` (In), ``bready`` (Out); ``araddr``, ``arvalid``
    (Out), ``arready`` (In); ``rdata``, ``rresp`` (2), ``rvalid`` (In), ``rready`` (Out).
    """

    def __init__(self, addr_width=12, data_width=32):
        if data_width not in (32, 64):
            raise ValueError(f"AXI4-Lite data width must be 32 or 64, not {data_width}")
        self.addr_width, self.data_width = addr_width, data_width
        super().__init__(_members(_AXI4_LITE, {"addr": addr_width, "data": data_width,
                                               "strb": data_width // 8}))

    def __eq__(self, other):
        return (type(other) is type(self) and
                (self.addr_width, self.data_width) == (other.addr_width, other.data_width))

    def __repr__(self):
        return f"AXI4LiteSignature({self.addr_width}, {self.data_width})"


def burst_beats(data_width, max_burst=256):
    """The largest burst the masters here emit: ``max_burst`` beats or one 4 KiB page."""
    return min(max_burst, PAGE_BYTES // (data_width // 8))


def command_layout(addr_width, words_width):
    """Payload of a transfer command: byte ``addr`` of the first word, number of ``words``."""
    return data.StructLayout({"addr": unsigned(addr_width), "words": unsigned(words_width)})


def burst_layout(addr_width):
    """Payload of one burst: byte ``addr`` and AXI ``len`` (beats - 1)."""
    return data.StructLayout({"addr": unsigned(addr_width), "len": unsigned(8)})


class BurstSplitter(wiring.Component):
    """Splits transfer commands into AXI4 INCR bursts.

    Parameters
    ----------
    addr_width, data_width : int
        Bus address bits and data bits (a power of two, at most 4096 bytes).
    words_width : int
        Bits of the word count of a command.
    max_burst : int
        Largest burst in beats, 1..256.

    Members
    -------
    cmd : ``In(stream.Signature(command_layout(addr_width, words_width)))``
        Transfers; a command of 0 words is accepted and ignored.
    o : ``Out(stream.Signature(burst_layout(addr_width)))``
        Bursts in address order, each at most ``max_burst`` beats and within one 4 KiB page.
        Payload and valid are registers.
    active : ``Out(1)``
        A command waits in the input register, is being split, or its last burst waits on
        ``o``.

    Timing
    ------
    ``cmd`` enters through a :class:`~hwgen.lib.pipeline.SkidBuffer` (its ``ready`` is a
    register). A command's first burst is on ``o`` 3 cycles after ``cmd`` accepts it; one-burst
    commands pass at one every two cycles. Further bursts follow one per cycle where the
    previous burst ended on a 4 KiB page (every burst after the first when ``max_burst`` covers
    a page) and every other cycle otherwise.

    The length of the next burst, ``min(words left, words to the page end, max_burst)``, is
    prepared in registers (``lim``, ``lim - 1``, whether the page end is nearer than
    ``max_burst``) from the word address alone, one cycle ahead; the cycle a burst leaves
    compares the words left with it (one carry chain) and updates the word address and count
    with subtractions of the registered length. No path holds more than one carry chain, and
    ``o.ready`` reaches only the enables of these registers.
    """

    def __init__(self, addr_width, data_width, *, words_width=32, max_burst=256):
        if not 1 <= max_burst <= 256:
            raise ValueError(f"max_burst must be in 1..256, not {max_burst}")
        self._aw, self._ww, self._max = addr_width, words_width, max_burst
        self._bytes_log2 = _log2(data_width // 8, "AXI data bytes")
        if (1 << self._bytes_log2) > PAGE_BYTES:
            raise ValueError("AXI data words wider than a 4 KiB page are not supported")
        super().__init__({
            "cmd": In(stream.Signature(command_layout(addr_width, words_width))),
            "o": Out(stream.Signature(burst_layout(addr_width))),
            "active": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        shift, top = self._bytes_log2, self._max
        page_words = PAGE_BYTES >> shift
        page_bits = page_words.bit_length() - 1
        burst = min(top, page_words)
        page = Signal(self._aw - shift - page_bits)      # word address above the page offset
        in_page = Signal(max(page_bits, 1))               # word offset in the page
        remaining = Signal(self._ww)                      # words left, >= 1 while busy
        rem_m1 = Signal(self._ww)                         # remaining - 1
        lim = Signal(range(burst + 1))                    # min(to the page end, max_burst)
        lim_m1 = Signal(8)                                # lim - 1
        to_end = Signal()                                 # lim reaches the page end
        busy, prepped = Signal(), Signal()
        o = self.o
        # commands enter through a register stage: the word count and the address reach the
        # length preparation and the counters from registers, not from the producer's logic
        m.submodules.cmd_reg = cmd_reg = SkidBuffer(command_layout(self._aw, self._ww))
        wiring.connect(m, wiring.flipped(self.cmd), cmd_reg.i)
        cmd = cmd_reg.o

        m.d.comb += [cmd.ready.eq(~busy), self.active.eq(busy | o.valid | cmd.valid)]
        accept = cmd.valid & ~busy & (cmd.payload.words != 0)
        prep = accept | (busy & ~prepped)

        # -- the next burst's length bound, from the word offset in the page alone --------------
        cmd_word = cmd.payload.addr[shift:]
        src = Mux(busy, in_page, cmd_word[:page_bits]) if page_bits else Const(0, 1)
        near_end = src >= page_words - top if top < page_words else Const(1, 1)
        with m.If(prep):
            m.d.sync += [to_end.eq(near_end), prepped.eq(1),
                         lim.eq(Mux(near_end, page_words - src, top)),
                         lim_m1.eq(Mux(near_end, (page_words - 1) - src, top - 1))]
        with m.If(accept):
            m.d.sync += [busy.eq(1), page.eq(cmd_word[page_bits:]),
                         remaining.eq(cmd.payload.words), rem_m1.eq(cmd.payload.words - 1)]
            if page_bits:
                m.d.sync += in_page.eq(cmd_word[:page_bits])

        # -- one burst leaves: the smaller of the words left and lim ----------------------------
        # last burst: words left <= lim, i.e. rem_m1 < lim; lim < 512, so the high bits of rem_m1
        # are tested for zero (a LUT tree) beside a 9-bit comparison (a short carry chain)
        low = min(9, self._ww)
        last = _less_than(m, rem_m1[:low], lim, "last_low") & \
            ((rem_m1[low:] == 0) if self._ww > low else 1)
        emit = busy & prepped & (~o.valid | o.ready)
        with m.If(emit):
            m.d.sync += [o.valid.eq(1),
                         o.payload.addr.eq(Cat(Const(0, shift), in_page[:page_bits], page)),
                         o.payload.len.eq(Mux(last, rem_m1[:8], lim_m1)),
                         remaining.eq(remaining - lim), rem_m1.eq(rem_m1 - lim)]
            with m.If(last):
                m.d.sync += busy.eq(0)
            with m.Elif(to_end):               # the next burst starts a page: its bound is known
                m.d.sync += [page.eq(page + 1),
                             lim.eq(burst), lim_m1.eq(burst - 1),
                             to_end.eq(page_words <= top)]
                if page_bits:
                    m.d.sync += in_page.eq(0)
            with m.Else():                     # lim was max_burst, short of the page end
                m.d.sync += [in_page.eq(in_page + top), prepped.eq(0)]
        with m.Elif(o.ready):
            m.d.sync += o.valid.eq(0)
        return m


class AXI4Reader(wiring.Component):
    """AXI4 read master: commands of (address, words) to a stream of data words.

    Parameters
    ----------
    addr_width, data_width : int
        Bus address bits and data bits.
    words_width : int
        Bits of a command's word count.
    max_burst : int
        Largest burst in beats (1..256); bursts also stop at 4 KiB boundaries.
    max_outstanding : int
        Bursts issued on AR whose last beat has not arrived, at most.
    depth : int, optional
        Data FIFO depth in words; default twice the largest burst. Reads are only issued for
        words the FIFO is sure to have room for (credits), so ``rready`` is always 1 and a
        stalled consumer never stalls the bus mid-burst. To stream one word per cycle from a
        memory with a read latency of ``L`` cycles, ``depth`` should exceed ``L + 9`` plus one
        burst (issue, FIFO latency and the credit's return take 9 cycles).

    Members
    -------
    bus : ``Out(AXI4Signature(addr_width, data_width, write=False))``
    cmd : ``In(stream.Signature(command_layout(addr_width, words_width)))``
        Transfers, executed in order; 0 words does nothing.
    o : ``Out(stream.Signature(unsigned(data_width)))``
        The words read, in address order. ``rresp`` is not checked.
    idle : ``Out(1)``
        No command in progress and every word read has left on ``o``.

    Throughput one word per cycle (given enough credit for the memory latency). Latency from a
    command to its first ``araddr`` is 5 cycles; from ``rvalid`` to ``o.valid`` 5 cycles
    (:class:`~hwgen.lib.pipeline.BlockRAMFIFO`: the block RAM's read data are registered).
    A word taken from ``o`` returns its credit the cycle after. ``bus.arvalid``/``araddr``/
    ``arlen`` are registers; the issue decision is ``len < free`` of two registers (one carry
    chain) and the free credits are updated by one adder.
    """

    def __init__(self, addr_width, data_width, *, words_width=32, max_burst=256,
                 max_outstanding=8, depth=None):
        self._split = {"addr_width": addr_width, "data_width": data_width,
                       "words_width": words_width, "max_burst": max_burst}
        self._dw = data_width
        burst = burst_beats(data_width, max_burst)
        self._depth = depth if depth is not None else 2 * burst
        if self._depth < max(4, burst):
            raise ValueError(f"reader FIFO depth {self._depth} must hold at least one burst "
                             f"({burst} words) and 4 words")
        if not 1 <= max_outstanding <= 64:
            raise ValueError(f"max_outstanding must be in 1..64, not {max_outstanding}")
        self._max_outstanding = max_outstanding
        super().__init__({
            "bus": Out(AXI4Signature(addr_width, data_width, write=False)),
            "cmd": In(stream.Signature(command_layout(addr_width, words_width))),
            "o": Out(stream.Signature(unsigned(data_width))),
            "idle": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        bus = self.bus
        m.submodules.splitter = splitter = BurstSplitter(**self._split)
        wiring.connect(m, wiring.flipped(self.cmd), splitter.cmd)
        # a skid register between the splitter and AR: the splitter's enables see a register,
        # not the credit comparison
        m.submodules.split = split = SkidBuffer(burst_layout(self._split["addr_width"]))
        wiring.connect(m, splitter.o, split.i)
        m.submodules.fifo = buf = BlockRAMFIFO(self._dw, self._depth)

        # Credits: FIFO words not yet promised to a burst on AR. A burst of len + 1 beats is
        # issued while len < free; a word delivered on `o` returns its credit a cycle later
        # (`returned`), so the update is one adder: free - (len + 1) + returned.
        depth_bits = range(self._depth + 1)
        free = Signal(depth_bits, init=self._depth)
        returned = Signal()
        # bursts in flight as a thermometer code (bit i: more than i), so that neither its
        # update nor `bursts < max_outstanding` needs an adder behind the issue decision
        bursts = Signal(self._max_outstanding)
        burst_ok = ~bursts[-1]
        length = split.o.payload.len
        w = len(free)
        fits = _less_than(m, length, free, "fits")          # len < free
        issue = Signal()
        m.d.comb += [
            split.o.ready.eq((~bus.arvalid | bus.arready) & fits & burst_ok),
            issue.eq(split.o.valid & split.o.ready),
        ]
        with m.If(issue):
            m.d.sync += [bus.arvalid.eq(1), bus.araddr.eq(split.o.payload.addr),
                         bus.arlen.eq(length)]
        with m.Elif(bus.arready):
            m.d.sync += bus.arvalid.eq(0)
        m.d.comb += [bus.arsize.eq(_log2(self._dw // 8, "AXI data bytes")),
                     bus.arburst.eq(BURST_INCR)]

        m.d.comb += [
            bus.rready.eq(1),
            buf.i.payload.eq(bus.rdata),       # always room: reads are issued on credit
            buf.i.valid.eq(bus.rvalid),
        ]
        wiring.connect(m, buf.o, wiring.flipped(self.o))
        m.d.sync += returned.eq(self.o.valid & self.o.ready)
        # free + ~len + returned in one carry chain: ({free, 1} + {~len, returned}) >> 1, modulo
        # 2**W (W bits of free; len < free <= depth, so len fits them too)
        inv_len = ~Cat(length[:w], Const(0, max(0, w - len(length))))
        spent = Signal(w + 2)
        m.d.comb += spent.eq(Cat(Const(1, 1), free) + Cat(returned, inv_len))
        with m.If(issue):
            m.d.sync += free.eq(spent[1:w + 1])
        with m.Else():
            m.d.sync += free.eq(free + returned)
        burst_done = bus.rvalid & bus.rlast
        with m.If(issue & ~burst_done):
            m.d.sync += bursts.eq(Cat(Const(1, 1), bursts[:-1]))
        with m.Elif(~issue & burst_done):
            m.d.sync += bursts.eq(bursts[1:])
        m.d.comb += self.idle.eq(~splitter.active & ~split.o.valid & ~self.cmd.valid
                                 & ~returned & (free == self._depth))
        return m


class AXI4Writer(wiring.Component):
    """AXI4 write master: a command of (address, words) plus a stream of words to AW/W bursts.

    Parameters
    ----------
    addr_width, data_width, words_width, max_burst, max_outstanding :
        As for :class:`AXI4Reader`; ``max_outstanding`` bounds bursts whose B response is
        still due.

    Members
    -------
    bus : ``Out(AXI4Signature(addr_width, data_width, read=False))``
    cmd : ``In(stream.Signature(command_layout(addr_width, words_width)))``
        Transfers, executed in order.
    i : ``In(stream.Signature(unsigned(data_width)))``
        The words to write, exactly the sum of the commands' word counts.
    idle : ``Out(1)``
        No command in progress and every burst's B response has arrived: all written data is
        in memory. ``bresp`` is not checked.

    Throughput one word per cycle. AW is issued ahead of the data (up to ``max_outstanding``
    bursts); ``wvalid`` follows ``i.valid`` and ``i.ready`` is ``wready`` while a burst is open,
    so a stalled producer stalls W mid-burst (legal AXI). Write strobes are all ones.
    """

    def __init__(self, addr_width, data_width, *, words_width=32, max_burst=256,
                 max_outstanding=8):
        self._split = {"addr_width": addr_width, "data_width": data_width,
                       "words_width": words_width, "max_burst": max_burst}
        self._dw = data_width
        self._max_outstanding = max_outstanding
        super().__init__({
            "bus": Out(AXI4Signature(addr_width, data_width, read=False)),
            "cmd": In(stream.Signature(command_layout(addr_width, words_width))),
            "i": In(stream.Signature(unsigned(data_width))),
            "idle": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        bus = self.bus
        m.submodules.split = split = BurstSplitter(**self._split)
        wiring.connect(m, wiring.flipped(self.cmd), split.cmd)
        # Lengths of bursts issued on AW whose data has not all been sent on W.
        m.submodules.lengths = lengths = fifo.SyncFIFO(width=8, depth=self._max_outstanding)

        unacked = Signal(range(self._max_outstanding + 1))
        issue = Signal()
        m.d.comb += [
            split.o.ready.eq((~bus.awvalid | bus.awready) & (unacked < self._max_outstanding)
                             & lengths.w_rdy),
            issue.eq(split.o.valid & split.o.ready),
            lengths.w_en.eq(issue),
            lengths.w_data.eq(split.o.payload.len),
        ]
        with m.If(issue):
            m.d.sync += [bus.awvalid.eq(1), bus.awaddr.eq(split.o.payload.addr),
                         bus.awlen.eq(split.o.payload.len)]
        with m.Elif(bus.awready):
            m.d.sync += bus.awvalid.eq(0)
        m.d.comb += [bus.awsize.eq(_log2(self._dw // 8, "AXI data bytes")),
                     bus.awburst.eq(BURST_INCR)]

        beat = Signal(8)
        sent = Signal()
        m.d.comb += [
            bus.wvalid.eq(self.i.valid & lengths.r_rdy),
            bus.wdata.eq(self.i.payload),
            bus.wstrb.eq((1 << (self._dw // 8)) - 1),
            bus.wlast.eq(beat == lengths.r_data),
            self.i.ready.eq(bus.wready & lengths.r_rdy),
            sent.eq(bus.wvalid & bus.wready),
            lengths.r_en.eq(sent & bus.wlast),
        ]
        with m.If(sent):
            m.d.sync += beat.eq(Mux(bus.wlast, 0, beat + 1))

        m.d.comb += bus.bready.eq(1)
        m.d.sync += unacked.eq(unacked + issue - bus.bvalid)
        m.d.comb += self.idle.eq(~split.active & ~self.cmd.valid & ~bus.awvalid & (unacked == 0))
        return m


class AXI4LiteControl(wiring.Component):
    """Vitis ``ap_ctrl_hs`` control registers of an RTL kernel, on an AXI4-Lite slave.

    Register map (byte offsets, 32-bit registers):

    ========  ===================================================================================
    0x00      control: bit 0 ``ap_start`` (R/W; writing 1 starts, cleared by the kernel at
              ``ap_ready`` unless auto-restart), bit 1 ``ap_done`` (R, clear on read), bit 2
              ``ap_idle`` (R), bit 3 ``ap_ready`` (R, clear on read; this kernel is ready when it
              is done), bit 7 ``auto_restart`` (R/W)
    0x04      global interrupt enable: bit 0 (R/W)
    0x08      IP interrupt enable: bit 0 ``ap_done``, bit 1 ``ap_ready`` (R/W)
    0x0C      IP interrupt status: bit 0 ``ap_done``, bit 1 ``ap_ready`` (R, toggle on write)
    0x10 ...  arguments, in order, each in an 8-byte slot: a 64-bit argument as two words
              (low word first), a 32-bit argument as one word and a reserved word
    ========  ===================================================================================

    Parameters
    ----------
    args : sequence of (str, int)
        Argument names and widths (32 or 64 bits).
    addr_width : int
        Byte address bits of the bus (the kernel.xml ``range`` is ``2**addr_width``).

    Members
    -------
    bus : ``In(AXI4LiteSignature(addr_width, 32))``
    start : ``Out(1)``
        ``ap_start``: the host asked for a run. The kernel starts when ``start`` and it is idle.
    done : ``In(1)``
        One-cycle pulse: the run is finished (``ap_done`` and ``ap_ready``).
    idle : ``In(1)``
        ``ap_idle``.
    args : ``Out(data.StructLayout({name: unsigned(bits)}))``
        The argument registers.
    interrupt : ``Out(1)``
        Global interrupt enable and any pending status bit.

    Writes complete when address and data are both valid (one cycle, response registered);
    reads take one cycle. Byte strobes are honoured for argument registers.
    """

    ARG_BASE = 0x10
    SLOT_BYTES = 8

    def __init__(self, args, *, addr_width=12):
        self._args = [(name, bits) for name, bits in args]
        self.offsets = self.arg_offsets(self._args, addr_width)
        self._addr_width = addr_width
        super().__init__({
            "bus": In(AXI4LiteSignature(addr_width, 32)),
            "start": Out(1),
            "done": In(1),
            "idle": In(1),
            "args": Out(data.StructLayout({name: unsigned(bits) for name, bits in self._args})),
            "interrupt": Out(1),
        })

    @classmethod
    def arg_offsets(cls, args, addr_width=12):
        """``{argument name: byte offset}`` of ``args`` [(name, bits)]; ValueError if an
        argument is not 32 or 64 bits wide or they do not fit the address space."""
        for name, bits in args:
            if bits not in (32, 64):
                raise ValueError(f"argument {name}: width must be 32 or 64, not {bits}")
        if cls.ARG_BASE + cls.SLOT_BYTES * len(args) > (1 << addr_width):
            raise ValueError(f"{len(args)} arguments do not fit {addr_width} address bits")
        return {name: cls.ARG_BASE + cls.SLOT_BYTES * k for k, (name, _) in enumerate(args)}

    @property
    def range(self):
        """Bytes of the register address space, ``2**addr_width`` (kernel.xml's ``range``)."""
        return 1 << self._addr_width

    def elaborate(self, platform):
        m = Module()
        bus = self.bus
        auto_restart, gie, done_flag = Signal(), Signal(), Signal()
        ier, isr = Signal(2), Signal(2)

        # Argument words: {word index: Signal(32)}.
        words = {}
        for (name, bits), offset in zip(self._args, self.offsets.values()):
            parts = [Signal(32, name=f"{name}_w{k}") for k in range(bits // 32)]
            for k, p in enumerate(parts):
                words[offset // 4 + k] = p
            m.d.comb += getattr(self.args, name).eq(Cat(*parts))

        ctrl_word = Cat(self.start, done_flag, self.idle, done_flag, Const(0, 3), auto_restart)

        # -- writes: address and data together ------------------------------------------------
        write = Signal()
        m.d.comb += [write.eq(bus.awvalid & bus.wvalid & ~bus.bvalid),
                     bus.awready.eq(write), bus.wready.eq(write), bus.bresp.eq(RESP_OKAY)]
        with m.If(write):
            m.d.sync += bus.bvalid.eq(1)
        with m.Elif(bus.bready):
            m.d.sync += bus.bvalid.eq(0)
        mask = Cat(*[Mux(bus.wstrb[k], 0xFF, 0x00) for k in range(4)])
        wa = bus.awaddr[2:]

        with m.If(self.done & ~auto_restart):
            m.d.sync += self.start.eq(0)
        with m.If(write):
            with m.Switch(wa):
                with m.Case(0):
                    with m.If(bus.wdata[0]):
                        m.d.sync += self.start.eq(1)
                    m.d.sync += auto_restart.eq(bus.wdata[7])
                with m.Case(1):
                    m.d.sync += gie.eq(bus.wdata[0])
                with m.Case(2):
                    m.d.sync += ier.eq(bus.wdata[:2])
                for index, reg in words.items():
                    with m.Case(index):
                        m.d.sync += reg.eq((reg & ~mask) | (bus.wdata & mask))

        # ISR: toggle on write, set on events (events win).
        isr_next = Signal(2)
        m.d.comb += isr_next.eq(Mux(write & (wa == 3), isr ^ bus.wdata[:2], isr))
        m.d.sync += isr.eq(isr_next | Mux(self.done, ier, 0))
        m.d.comb += self.interrupt.eq(gie & isr.any())

        # -- reads --------------------------------------------------------------------------------
        read = Signal()
        m.d.comb += [read.eq(bus.arvalid & bus.arready), bus.arready.eq(~bus.rvalid),
                     bus.rresp.eq(RESP_OKAY)]
        with m.If(read):
            m.d.sync += bus.rvalid.eq(1)
            with m.Switch(bus.araddr[2:]):
                with m.Case(0):
                    m.d.sync += bus.rdata.eq(ctrl_word)
                with m.Case(1):
                    m.d.sync += bus.rdata.eq(gie)
                with m.Case(2):
                    m.d.sync += bus.rdata.eq(ier)
                with m.Case(3):
                    m.d.sync += bus.rdata.eq(isr)
                for index, reg in words.items():
                    with m.Case(index):
                        m.d.sync += bus.rdata.eq(reg)
                with m.Default():
                    m.d.sync += bus.rdata.eq(0)
        with m.Elif(bus.rready):
            m.d.sync += bus.rvalid.eq(0)

        # ap_done / ap_ready: set at the end of a run, cleared when the control word is read.
        with m.If(self.done):
            m.d.sync += done_flag.eq(1)
        with m.Elif(read & (bus.araddr[2:] == 0)):
            m.d.sync += done_flag.eq(0)
        return m


class StreamUpsizer(wiring.Component):
    """Packs ``ratio`` narrow items into one wide word, first item in the lowest bits.

    Parameters
    ----------
    width : int
        Bits of a narrow item.
    ratio : int
        Items per word (>= 1).

    Members
    -------
    i : ``In(stream.Signature(StructLayout({"data": width, "last": 1})))``
        Items; ``last`` closes the word early, the unused upper items being zero.
    o : ``Out(stream.Signature(unsigned(width * ratio)))``
        Words.
    idle : ``Out(1)``
        No partly filled or undelivered word is held.

    One item per cycle; latency 1 cycle from the item completing a word to ``o.valid``.
    ``i.ready`` is ``~o.valid | o.ready``.
    """

    def __init__(self, width, ratio):
        self._width, self._ratio = width, ratio
        super().__init__({
            "i": In(stream.Signature(data.StructLayout({"data": unsigned(width),
                                                        "last": unsigned(1)}))),
            "o": Out(stream.Signature(unsigned(width * ratio))),
            "idle": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        index = Signal(range(self._ratio))
        m.d.comb += [self.i.ready.eq(~self.o.valid | self.o.ready),
                     self.idle.eq(~self.o.valid & (index == 0))]
        with m.If(self.o.valid & self.o.ready):
            m.d.sync += self.o.valid.eq(0)
        with m.If(self.i.valid & self.i.ready):
            with m.If(index == 0):
                m.d.sync += self.o.payload.eq(self.i.payload.data)     # clears the upper items
            with m.Else():
                m.d.sync += self.o.payload.word_select(index, self._width).eq(
                    self.i.payload.data)
            with m.If(self.i.payload.last | (index == self._ratio - 1)):
                m.d.sync += [self.o.valid.eq(1), index.eq(0)]
            with m.Else():
                m.d.sync += index.eq(index + 1)
        return m


class StreamDownsizer(wiring.Component):
    """Splits a wide word into ``ratio`` narrow items, lowest bits first.

    Parameters
    ----------
    width : int
        Bits of a narrow item.
    ratio : int
        Items per word (>= 1).

    Members
    -------
    i : ``In(stream.Signature(unsigned(width * ratio)))``
    o : ``Out(stream.Signature(unsigned(width)))``
    idle : ``Out(1)``
        No word is held.

    One item per cycle; a new word is accepted in the cycle its predecessor's last item leaves,
    so a stream of words yields items back to back. Latency 1 cycle.
    """

    def __init__(self, width, ratio):
        self._width, self._ratio = width, ratio
        super().__init__({
            "i": In(stream.Signature(unsigned(width * ratio))),
            "o": Out(stream.Signature(unsigned(width))),
            "idle": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        word = Signal(self._width * self._ratio)
        index = Signal(range(self._ratio))
        full = Signal()
        final = index == self._ratio - 1
        m.d.comb += [
            self.o.valid.eq(full),
            self.o.payload.eq(word.word_select(index, self._width)),
            self.i.ready.eq(~full | (self.o.ready & final)),
            self.idle.eq(~full),
        ]
        with m.If(self.o.valid & self.o.ready):
            m.d.sync += index.eq(Mux(final, 0, index + 1))
            with m.If(final):
                m.d.sync += full.eq(0)
        with m.If(self.i.valid & self.i.ready):
            m.d.sync += [word.eq(self.i.payload), full.eq(1), index.eq(0)]
        return m
