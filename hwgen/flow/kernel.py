"""Vitis RTL kernel shell: any stream accelerator as a memory-to-memory kernel.

:class:`MemoryKernel` wraps an accelerator's core (a component whose stream members are
``i_<x>`` / ``o_<x>``) in the interface Vitis expects of an XRT-managed RTL kernel:

==========================  =================================================================
port                        role
==========================  =================================================================
``ap_clk``, ``ap_rst_n``    kernel clock and active-low synchronous reset
``s_axi_control_*``         AXI4-Lite control registers (``ap_ctrl_hs``), 12 address bits
``m_axi_<member>_*``        one AXI4 master per core stream, 64-bit addresses: read-only for an
                            input stream (``m_axi_i_codes``), write-only for an output stream
``interrupt``               level interrupt (global enable and enabled status bits)
==========================  =================================================================

Register map (byte offsets on ``s_axi_control``, see :class:`hwgen.lib.axi.AXI4LiteControl`):
0x00 control (bit 0 ``ap_start``, bit 1 ``ap_done`` clear-on-read, bit 2 ``ap_idle``, bit 3
``ap_ready`` clear-on-read, bit 7 ``auto_restart``), 0x04 global interrupt enable, 0x08 IP
interrupt enable (bit 0 done, bit 1 ready), 0x0C IP interrupt status (toggle on write), then the
kernel arguments from 0x10 in 8-byte slots, two per core stream in member order:

* ``<member>_ptr`` (64 bits, low word first): byte address of the stream's buffer in the memory
  bank of ``m_axi_<member>``. It must be a multiple of the AXI word size (XRT buffers are
  4 KiB aligned).
* ``<member>_count`` (32 bits, one word and a reserved word): the number of stream beats
  (records) to read from / write to that buffer.

Memory record format. Every stream beat is one *record* of ``R`` bytes, little endian: bytes
``0 .. T-1`` hold the beat's TDATA (``T = tdata_bits / 8``, payload fields packed as in
``ports.json``, see :mod:`hwgen.flow.ports`); if the stream has TLAST, byte ``T`` is a flags
byte whose bit 0 is TLAST (other bits zero); the remaining bytes are zero. ``R`` is the smallest
power of two not below ``T`` (``T + 1`` for a stream with TLAST). Records are stored back to
back from ``<member>_ptr``: with ``R`` <= the AXI word size ``W`` (the board's memory AXI width;
512 bits = 64 bytes when no board is given) a word holds ``W / R`` records and no record
straddles two words; a larger record spans ``R / W`` whole words. The kernel transfers whole
words, ``ceil(count * R / W)`` per buffer: an input buffer must span that many words (record
slots after the last record are ignored); an output buffer receives exactly that many, the
unused record slots of its last word written as zeros.

Operation. Writing ``ap_start`` makes the kernel read ``<member>_count`` records of every input
stream into the core and write the first ``<member>_count`` records of every output stream.
Beats an output produces beyond its count (or at all, with count 0) are dropped, so an output
the host does not want (e.g. forwarded LUT rows) never stalls the core. ``ap_done`` (and
``ap_ready``, and the interrupt if enabled) is raised once every input record has been
consumed by the core and every output record has been written and acknowledged (all B
responses received). The core is not reset between runs. The counts must agree with what the
core consumes and produces for the data given (as the golden model's ``inputs``/``expect``
do): an output count larger than the beats the core produces leaves the kernel running.

:func:`emit_kernel` writes the Verilog and returns the kernel description (ports, arguments
with offsets, record sizes, memory banks) that ``ports.json`` carries under ``"kernel"`` and
:mod:`hwgen.flow.package` turns into ``kernel.xml``; :func:`simulate_kernel` proves a kernel
against the accelerator's golden model with cocotbext-axi memory models.
"""

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from amaranth.hdl import Cat, ClockDomain, Module, Signal, Value
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from .. import checks
from ..lib.axi import (AXI4LiteControl, AXI4LiteSignature, AXI4Reader, AXI4Signature,
                       AXI4Writer, StreamDownsizer, StreamUpsizer)
from .emit import drop_zero_memory_init, to_verilog
from .ports import StreamFormat
from .scoreboard import beat_names, compare, run_folder, timeout_cycles, workload
from .tools import work_dir
from .verilator import run_testbench, verilate

__all__ = ["KernelStream", "MemoryKernel", "core_streams", "emit_kernel", "flat_ports",
           "kernel_name", "record_bytes", "simulate_kernel"]

ADDR_BITS = 64
CONTROL_ADDR_BITS = 12
DEFAULT_DATA_BITS = 512
#: Fill byte of simulated output memories: bytes outside a buffer must keep it.
GUARD_BYTE = 0xA5


def record_bytes(fmt):
    """Bytes of one memory record of a stream of format ``fmt`` (see module docstring)."""
    size = fmt.tdata_bits // 8 + (1 if fmt.has_last else 0)
    return 1 << (size - 1).bit_length()


def kernel_name(acc):
    """Verilog top / Vitis kernel name of accelerator ``acc``: ``<top>_kernel``."""
    return f"{acc.top_name}_kernel"


@dataclass(frozen=True)
class KernelStream:
    """One core stream as the kernel moves it between memory and the core."""
    member: str
    direction: str          # "in" (memory -> core) or "out" (core -> memory)
    format: StreamFormat
    record_bytes: int

    @property
    def port(self):
        """Name of the stream's AXI4 master on the kernel: ``m_axi_<member>``."""
        return f"m_axi_{self.member}"

    @property
    def ptr_arg(self):
        """Name of the kernel argument holding the buffer's byte address: ``<member>_ptr``."""
        return f"{self.member}_ptr"

    @property
    def count_arg(self):
        """Name of the kernel argument holding the number of records: ``<member>_count``."""
        return f"{self.member}_count"

    def words(self, count, word_bytes):
        """AXI words holding ``count`` records."""
        return -(-count * self.record_bytes // word_bytes)

    # -- host side ---------------------------------------------------------------------------

    def pack(self, beats):
        """Memory image (bytes) of ``beats`` (dicts of field values, ``last`` if any)."""
        out = bytearray()
        for beat in beats:
            value = self.format.pack(beat)
            if self.format.has_last:
                value |= int(beat["last"]) << self.format.tdata_bits
            out += value.to_bytes(self.record_bytes, "little")
        return bytes(out)

    def unpack(self, image, count):
        """``(beats, bad)``: the first ``count`` records of ``image`` as beat dicts, and the
        indices of records whose padding or unused flag bits are not zero."""
        beats, bad = [], []
        flag_bits = 1 if self.format.has_last else 0
        used = self.format.tdata_bits + flag_bits
        for k in range(count):
            value = int.from_bytes(image[k * self.record_bytes:(k + 1) * self.record_bytes],
                                   "little")
            beat = self.format.unpack(value & ((1 << self.format.tdata_bits) - 1))
            if self.format.has_last:
                beat["last"] = (value >> self.format.tdata_bits) & 1
            if value >> used or (value >> self.format.data_bits) & \
                    ((1 << (self.format.tdata_bits - self.format.data_bits)) - 1):
                bad.append(k)
            beats.append(beat)
        return beats, bad

    def to_dict(self):
        """JSON form (``ports.json``'s ``"kernel"`` streams): member, direction, port, record bytes,
        format."""
        return {"member": self.member, "direction": self.direction, "port": self.port,
                "record_bytes": self.record_bytes, "format": self.format.to_dict()}

    @classmethod
    def from_dict(cls, d):
        """Inverse of :meth:`to_dict` (``port`` is recomputed from ``member``)."""
        return cls(d["member"], d["direction"], StreamFormat.from_dict(d["format"]),
                   d["record_bytes"])


def core_memories(core):
    """``[(member name, AXI4Signature)]`` of the core's own AXI4 masters (memory it reads or
    writes by itself, e.g. a vector-search node's channels or embedding tables)."""
    return [(name, member.signature) for name, member in core.signature.members.items()
            if member.is_signature and isinstance(member.signature, AXI4Signature)
            and member.flow == Out]


def core_streams(core):
    """The :class:`KernelStream` of every stream member of ``core``, in member order."""
    streams = []
    for name, member in core.signature.members.items():
        if member.is_signature and isinstance(member.signature, stream.Signature):
            fmt = StreamFormat.from_shape(member.signature.members["payload"].shape)
            streams.append(KernelStream(name, "in" if member.flow == In else "out", fmt,
                                        record_bytes(fmt)))
    if not streams:
        raise ValueError("the core has no stream members to connect to memory")
    return streams


class MemoryKernel(wiring.Component):
    """Vitis RTL kernel moving a core's streams from and to memory (see module docstring).

    Parameters
    ----------
    core : wiring.Component
        The accelerator core; its ``sync`` domain runs on ``ap_clk``.
    board : hwgen.boards.Board, optional
        Gives the AXI data width (``board.primary_memory.axi_data_bits``); default 512 bits.
    memory_banks : dict, optional
        ``{core master member: Vitis bank}`` (the configuration's
        :meth:`~hwgen.config.Config.memory_banks`); other masters go round-robin.
    data_bits : int, optional
        Overrides the AXI data width.
    max_burst : int
        Largest AXI burst in beats (bursts also stop at 4 KiB boundaries).
    max_outstanding : int
        Bursts in flight per master.
    fifo_words : int, optional
        Read-data FIFO per input master (default two bursts; raise it to cover a memory read
        latency beyond one burst's duration).

    Members
    -------
    ap_clk, ap_rst_n : ``In(1)``
    s_axi_control : ``In(AXI4LiteSignature(12, 32))``
    m_axi_<member> : ``Out(AXI4Signature(64, data_bits, read=..., write=...))``
        One per core stream; read-only for inputs, write-only for outputs.
    <core master> : the core's own AXI4 masters (e.g. ``m_axi_ch0``), passed through with the
        kernel argument ``<name>_ptr`` added to every address: the base of the buffer the host
        loaded for that master. ``memory_banks`` (the configuration's
        :meth:`~hwgen.config.Config.memory_banks`) says which bank each needs.
    interrupt : ``Out(1)``

    When converted with :func:`flat_ports`, interface members become ``<member>_<signal>``
    ports (``s_axi_control_awaddr``, ``m_axi_i_codes_araddr``).

    Throughput: each input delivers one record per cycle to the core while its reader keeps up
    (one AXI word per cycle; ``W / R`` records per word, or one record every ``R / W`` words);
    each output accepts one record per cycle. Backpressure from memory (AR/R/AW/W/B stalls)
    propagates to the core's streams; nothing is lost or dropped except output beats beyond
    their count.
    """

    def __init__(self, core, board=None, *, memory_banks=None, data_bits=None, max_burst=256,
                 max_outstanding=8, fifo_words=None):
        self._core = core
        self._memory_banks = dict(memory_banks or {})
        self.data_bits = data_bits or (board.primary_memory.axi_data_bits if board is not None
                                       else DEFAULT_DATA_BITS)
        self.board = board
        self.streams = core_streams(core)
        self.memories = core_memories(core)
        self._master_opts = {"max_burst": max_burst, "max_outstanding": max_outstanding}
        self._fifo_words = fifo_words
        self._args = [arg for s in self.streams for arg in ((s.ptr_arg, 64), (s.count_arg, 32))]
        self._args += [(self._memory_arg(name), 64) for name, _ in self.memories]
        #: ``{argument name: control register offset}``.
        self.offsets = AXI4LiteControl.arg_offsets(self._args, CONTROL_ADDR_BITS)
        members = {"ap_clk": In(1), "ap_rst_n": In(1),
                   "s_axi_control": In(AXI4LiteSignature(CONTROL_ADDR_BITS, 32))}
        for s in self.streams:
            members[s.port] = Out(AXI4Signature(ADDR_BITS, self.data_bits,
                                                read=s.direction == "in",
                                                write=s.direction == "out"))
        for name, sig in self.memories:
            members[name] = Out(sig)
        members["interrupt"] = Out(1)
        super().__init__(members)

    @property
    def word_bytes(self):
        """Bytes of one AXI data word of the stream masters (``data_bits / 8``)."""
        return self.data_bits // 8

    @staticmethod
    def _memory_arg(name):
        return f"{name[len('m_axi_'):] if name.startswith('m_axi_') else name}_ptr"

    def banks(self):
        """``{m_axi port: bank name or None}``: the core's own masters where its
        ``memory_banks`` places them, the stream masters round-robin over the board's primary
        memory channels (HBM[0], HBM[1], ... on u280); None without a board or bank names."""
        mem = self.board.primary_memory if self.board is not None else None
        named = mem is not None and bool(mem.vitis_bank)
        out = {s.port: (mem.bank(k % mem.count) if named else None)
               for k, s in enumerate(self.streams)}
        wanted = self._memory_banks
        for k, (name, _) in enumerate(self.memories):
            out[name] = wanted.get(name) or (mem.bank(k % mem.count) if named else None)
        return out

    def description(self, name):
        """The ``"kernel"`` section of ``ports.json`` for a kernel whose top is ``name``."""
        banks = self.banks()
        args = []
        for s in self.streams:
            for arg, kind, bits, port in ((s.ptr_arg, "pointer", 64, s.port),
                                          (s.count_arg, "scalar", 32, "s_axi_control")):
                args.append({"id": len(args), "name": arg, "kind": kind, "bits": bits,
                             "offset": self.offsets[arg], "port": port, "stream": s.member})
        for master, _ in self.memories:
            arg = self._memory_arg(master)
            args.append({"id": len(args), "name": arg, "kind": "pointer", "bits": 64,
                         "offset": self.offsets[arg], "port": master, "stream": None})
        return {
            "top": name,
            "verilog": f"{name}.v",
            "clock": "ap_clk", "reset": "ap_rst_n", "reset_active": "low",
            "interrupt": "interrupt",
            "control": {"port": "s_axi_control", "addr_bits": CONTROL_ADDR_BITS,
                        "data_bits": 32, "range": 1 << CONTROL_ADDR_BITS, "protocol": "ap_ctrl_hs",
                        "registers": {"ctrl": 0x00, "gie": 0x04, "ier": 0x08, "isr": 0x0C}},
            "axi_addr_bits": ADDR_BITS,
            "axi_data_bits": self.data_bits,
            "args": args,
            "masters": [dict(s.to_dict(), kind="stream", bank=banks[s.port],
                             data_bits=self.data_bits, ptr_arg=s.ptr_arg, count_arg=s.count_arg)
                        for s in self.streams]
            + [{"kind": "memory", "port": master, "member": master, "bank": banks[master],
                "data_bits": sig.data_width, "ptr_arg": self._memory_arg(master),
                "direction": "read" if not sig.write else "read/write"}
               for master, sig in self.memories],
        }

    def elaborate(self, platform):
        m = Module()
        m.domains.sync = cd_sync = ClockDomain("sync")
        m.d.comb += [cd_sync.clk.eq(self.ap_clk), cd_sync.rst.eq(~self.ap_rst_n)]
        m.submodules.core = self._core
        m.submodules.control = ctrl = AXI4LiteControl(self._args, addr_width=CONTROL_ADDR_BITS)
        wiring.connect(m, wiring.flipped(self.s_axi_control), ctrl.bus)
        m.d.comb += self.interrupt.eq(ctrl.interrupt)

        running = Signal()
        start = Signal()
        m.d.comb += start.eq(ctrl.start & ~running)
        finished = [self._stream(m, ctrl, s, start) for s in self.streams]
        for name, sig in self.memories:
            self._pass_through(m, ctrl, name, sig)
        done = Signal()
        m.d.comb += [done.eq(running & Cat(*finished).all()),
                     ctrl.done.eq(done), ctrl.idle.eq(~running)]
        with m.If(start):
            m.d.sync += running.eq(1)
        with m.Elif(done):
            m.d.sync += running.eq(0)
        return m

    def _pass_through(self, m, ctrl, name, sig):
        """Connect the core's master ``name`` to the kernel port, adding the base argument."""
        inner, outer = getattr(self._core, name), getattr(self, name)
        base = getattr(ctrl.args, self._memory_arg(name))
        for signal, member in sig.members.items():
            i, o = getattr(inner, signal), getattr(outer, signal)
            if signal in ("araddr", "awaddr"):
                m.d.comb += o.eq(i + base)
            elif member.flow == Out:
                m.d.comb += o.eq(i)
            else:
                m.d.comb += i.eq(o)

    def _stream(self, m, ctrl, s, start):
        """Master, width converter and record gate of stream ``s``; returns its done flag."""
        core_port = getattr(self._core, s.member)
        word_bits, rec_bits = self.data_bits, s.record_bytes * 8
        log_ratio = (max(word_bits, rec_bits) // min(word_bits, rec_bits)).bit_length() - 1
        words_width = 32 + (log_ratio if rec_bits > word_bits else 0)
        if s.direction == "in":
            master = AXI4Reader(ADDR_BITS, word_bits, words_width=words_width,
                                depth=self._fifo_words, **self._master_opts)
        else:
            master = AXI4Writer(ADDR_BITS, word_bits, words_width=words_width,
                                **self._master_opts)
        m.submodules[f"{s.member}_master"] = master
        wiring.connect(m, wiring.flipped(getattr(self, s.port)), master.bus)

        # Command and record count, loaded at ap_start.
        count = getattr(ctrl.args, s.count_arg)
        remaining = Signal(32, name=f"{s.member}_remaining")
        pending = Signal(name=f"{s.member}_cmd_pending")
        words = (count << log_ratio) if rec_bits > word_bits else \
            (count + (1 << log_ratio) - 1) >> log_ratio
        with m.If(start):
            m.d.sync += [remaining.eq(count), pending.eq(count != 0),
                         master.cmd.payload.addr.eq(getattr(ctrl.args, s.ptr_arg)),
                         master.cmd.payload.words.eq(words)]
        with m.Elif(master.cmd.ready):
            m.d.sync += pending.eq(0)
        m.d.comb += master.cmd.valid.eq(pending)
        more = remaining != 0

        if s.direction == "in":
            if rec_bits <= word_bits:
                conv = StreamDownsizer(rec_bits, word_bits // rec_bits)
                wiring.connect(m, master.o, conv.i)
            else:
                conv = StreamUpsizer(word_bits, rec_bits // word_bits)
                m.d.comb += [conv.i.valid.eq(master.o.valid), master.o.ready.eq(conv.i.ready),
                             conv.i.payload.data.eq(master.o.payload)]
            records = conv.o
            # Records beyond the count (the tail of the last word) are dropped.
            m.d.comb += [core_port.valid.eq(records.valid & more),
                         records.ready.eq(core_port.ready | ~more)]
            _record_to_payload(m, s.format, records.payload, core_port.payload)
            moved = core_port.valid & core_port.ready
        else:
            record = _payload_to_record(m, s, core_port.payload)
            if rec_bits <= word_bits:
                conv = StreamUpsizer(rec_bits, word_bits // rec_bits)
                m.d.comb += [conv.i.payload.data.eq(record),
                             conv.i.payload.last.eq(remaining == 1)]
            else:
                conv = StreamDownsizer(word_bits, rec_bits // word_bits)
                m.d.comb += conv.i.payload.eq(record)
            wiring.connect(m, conv.o, master.i)
            # Beats beyond the count are dropped.
            m.d.comb += [conv.i.valid.eq(core_port.valid & more),
                         core_port.ready.eq(conv.i.ready | ~more)]
            moved = conv.i.valid & conv.i.ready
        m.submodules[f"{s.member}_records"] = conv
        with m.If(moved & ~start):
            m.d.sync += remaining.eq(remaining - 1)

        finished = Signal(name=f"{s.member}_finished")
        m.d.comb += finished.eq(~pending & ~more & conv.idle & master.idle)
        return finished


def _record_to_payload(m, fmt, record, payload):
    for f in fmt.fields:
        m.d.comb += getattr(payload, f.name).eq(record[f.offset:f.offset + f.width])
    if fmt.has_last:
        m.d.comb += payload.last.eq(record[fmt.tdata_bits])


def _payload_to_record(m, s, payload):
    record = Signal(s.record_bytes * 8, name=f"{s.member}_record")
    for f in s.format.fields:
        m.d.comb += record[f.offset:f.offset + f.width].eq(
            Value.cast(getattr(payload, f.name)))
    if s.format.has_last:
        m.d.comb += record[s.format.tdata_bits].eq(payload.last)
    return record


def flat_ports(component):
    """``convert(ports=...)`` dict naming interface signals ``<member>_<signal>`` (directions
    are inferred: a port the design drives is an output)."""
    return {"_".join(map(str, path)): (Value.cast(value), None)
            for path, _, value in component.signature.flatten(component)}


def emit_kernel(acc, cfg, board, out_dir, **options):
    """Write ``<top>_kernel.v`` for accelerator ``acc`` at config ``cfg`` into ``out_dir``.

    ``options`` go to :class:`MemoryKernel`. Returns the kernel description (see
    :meth:`MemoryKernel.description`) for the ``"kernel"`` section of ``ports.json``.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    name = kernel_name(acc)
    kernel = MemoryKernel(acc.build_core(cfg), board, memory_banks=cfg.memory_banks(), **options)
    text = drop_zero_memory_init(to_verilog(kernel, name, ports=flat_ports(kernel)))
    (out_dir / f"{name}.v").write_text(text)
    return kernel.description(name)


# -- simulation ----------------------------------------------------------------------------------

def simulate_kernel(acc, cfg, board=None, *, items=None, seed=1, stall=0.0, drop=(),
                    base=None, **options):
    """Run :class:`MemoryKernel` around ``acc`` at ``cfg`` on Verilator with cocotbext-axi
    memories and compare every output record with the golden model.

    ``stall`` is the per-cycle probability of a pause on each AXI channel of the memories;
    outputs named in ``drop`` get count 0 (their beats must be dropped). Buffers start at
    ``base`` (default three words before a 4 KiB boundary, so bursts get split there).
    ``options`` go to :class:`MemoryKernel`.

    Returns a dict with ``mismatches`` (output records differing from the model),
    ``bad_records`` (records with non-zero padding), ``overwrites`` (bytes outside the records
    of an output buffer that are not as expected: zero in the last word, untouched beyond),
    ``kernel_cycles`` (ap_start write to interrupt), per-master data-beat ``handshakes``
    (``beats``, ``first``, ``last`` cycle) and the control-register checks.
    """
    name = kernel_name(acc)
    board_tag = board.name if board is not None else "noboard"
    opt_tag = hashlib.sha256(json.dumps(options, sort_keys=True).encode()).hexdigest()[:8]
    work = work_dir(acc, cfg, f"-kernel-{board_tag}-{opt_tag}")
    checks.probability("stall", stall)
    # stimulus and golden model first: bad data fails before the Verilator build
    work_load = workload(acc, cfg, items=items, seed=seed)
    items, inputs, expected = work_load.items, work_load.inputs, work_load.expected

    desc = emit_kernel(acc, cfg, board, work / "rtl", **options)
    cached, _ = verilate(work / "rtl" / f"{name}.v", name, work / "build")
    word_bytes = desc["axi_data_bits"] // 8
    base = base if base is not None else 0x3000 - 3 * word_bytes
    offsets = {a["name"]: a["offset"] for a in desc["args"]}
    streams = [KernelStream.from_dict(d) for d in desc["masters"]]
    masters = []
    for s in streams:
        if s.direction == "in":
            beats = inputs.get(s.member, [])
            count, image = len(beats), s.pack(beats).hex()
        else:
            count, image = (0 if s.member in drop else len(expected[s.member])), None
        masters.append({"port": s.port, "direction": s.direction, "base": base, "count": count,
                        "words": s.words(count, word_bytes), "image": image,
                        "ptr_offset": offsets[s.ptr_arg],
                        "count_offset": offsets[s.count_arg]})
    total_words = sum(mst["words"] for mst in masters)
    guard = 4 * word_bytes
    job = {"seed": seed, "stall": stall, "word_bytes": word_bytes, "guard_bytes": guard,
           "masters": masters,
           "timeout_cycles": timeout_cycles(
               total_words + sum(mst["count"] for mst in masters), stall)}
    result, _ = run_testbench("hwgen.sim.kernel_tb", name, work / "build",
                              run_folder(work, job, seed=seed, stall=stall, items=items), job,
                              testcase="run_kernel_job", seed=seed)

    mismatches, bad, overwrites, examples = 0, 0, 0, []
    for s, mst in zip(streams, masters):
        if s.direction != "out":
            continue
        region = bytes.fromhex(result["images"][s.port])       # guard, buffer words, guard
        image = region[guard:guard + mst["words"] * word_bytes]
        got, bad_idx = s.unpack(image, mst["count"])
        count, ex = compare(expected[s.member][:mst["count"]], got,
                            beat_names(s.format, sidebands=False))
        mismatches += count
        examples += [dict(e, member=s.member) for e in ex][:5 - len(examples)]
        bad += len(bad_idx)
        padding = image[mst["count"] * s.record_bytes:]
        outside = region[:guard] + region[guard + mst["words"] * word_bytes:]
        overwrites += sum(b != 0 for b in padding) + sum(b != GUARD_BYTE for b in outside)
    return {"accelerator": acc.name, "kernel": name, "items": items, "seed": seed,
            "stall": stall, "mismatches": mismatches, "first_mismatches": examples,
            "bad_records": bad, "overwrites": overwrites, "timeout": result["timeout"],
            "kernel_cycles": result["kernel_cycles"], "handshakes": result["handshakes"],
            "control": result["control"], "build_cached": cached, "description": desc}

