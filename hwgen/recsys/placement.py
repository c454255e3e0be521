"""Placement of a recommendation model's embedding tables in a board's memories (paper section
III-B1, after MicroRec).

Table sizes are very unbalanced (KBs to GBs), so each table goes to the memory that suits its
size:

1. **On chip** (BRAM/URAM): the smallest tables, smallest first, while they fit an on-chip byte
   budget. The default budget is :data:`ONCHIP_SHARE` of the board's BRAM36 and URAM bytes
   (:func:`onchip_capacity`); the rest is left to FIFOs and the FC layers' weights. On-chip
   tables cost no memory-channel time: each has its own memory, read once per inference.
2. **DDR** (DDR4/LPDDR4 channels): every table that does not fit an HBM pseudo-channel (larger
   than its capacity, or than ``hbm_table_max_bytes``), and, if DDR has lookup slots to spare,
   the largest of the rest.
3. **HBM** pseudo-channels: the medium tables. A board without HBM (or ``hbm_channels=0``)
   keeps them in DDR.

Every off-chip table costs its channel one random read per inference, so the off-chip tables
are spread to balance the **lookup rounds** (tables per inference) of the channels: the
placement searches the smallest number of rounds ``R`` for which every table finds a channel
with fewer than ``R`` tables and room for it (largest tables first, each to the channel with
the fewest tables, then the most free bytes). Within a kind the channels' rounds then differ by
at most one unless capacity forces otherwise. A table is never split across channels.

**Addresses.** Within its channel a table starts on a 4 KiB boundary (:data:`TABLE_ALIGN`) and
row ``r`` is at ``base + r * stride``, ``stride`` = the row's bytes (``dim * elem_bits / 8``)
rounded up to a power of two; elements are little-endian two's complement, padding bytes zero
(:func:`pack_tables`). A row thus never straddles an AXI data word (or, if wider, occupies
whole words) nor a 4 KiB page: one lookup is one AXI burst of ``max(1, stride / word)`` beats.

**Memory model** (:class:`MemoryModel`, per channel, at the kernel clock ``clock_mhz``): the
lookup unit issues one read request per cycle per channel; a channel moves at most one AXI data
word per cycle and at most its bandwidth (``bandwidth_gbytes_per_s`` of the board file); a
random read takes ``latency_ns`` from request to data. So an inference's lookups on a channel
take ``latency_ns + (beats - 1) / rate`` (``beats``: the data words of all its lookups, issued
back to back) and the channel sustains ``rate / beats`` inferences per second, ``rate`` being
``min(clock, bandwidth / word bytes)`` words per second. These are upper bounds: DRAM timing
(row activations, bank conflicts, refresh) lowers the random-read rate below one per cycle and
is not modelled. The figures assumed are in :data:`MEMORY_MODELS` with their sources.
"""

from dataclasses import dataclass, field

import numpy as np

from ..boards import Board, load_board
from ..errors import ConfigError

__all__ = ["MemoryModel", "MEMORY_MODELS", "ONCHIP_SHARE", "TABLE_ALIGN", "TableSlot",
           "ChannelPlan", "Placement", "place", "pack_tables", "onchip_capacity", "row_stride",
           "port_name"]

#: Share of the board's BRAM/URAM bytes given to embedding tables by default.
ONCHIP_SHARE = 0.5
#: Bytes of one BRAM36 (36 Kib, parity bits included: usable at 72-bit width) and one URAM
#: (288 Kib, 72 x 4096).
BRAM36_BYTES = 36 * 1024 // 8
URAM_BYTES = 288 * 1024 // 8
#: Alignment of each table's base address within its channel (one AXI4 page).
TABLE_ALIGN = 4096

#: Memory kinds that hold the largest tables ("DDR class") and the medium ones.
DDR_KINDS = ("DDR4", "LPDDR4")
HBM_KIND = "HBM"
#: Port name stem of each memory kind: ``m_axi_<stem><index>``.
PORT_STEMS = {"HBM": "hbm", "DDR4": "ddr", "LPDDR4": "lpddr"}


@dataclass(frozen=True)
class MemoryModel:
    """Random-read figures of one memory kind (see module docstring).

    Attributes
    ----------
    latency_ns : float
        One random read, from the read request leaving the kernel to its data arriving.
    reads_per_cycle : float
        Read requests a channel accepts per kernel cycle (AXI: at most one address handshake).
    source : str
        Where the figures come from.
    """
    latency_ns: float
    reads_per_cycle: float
    source: str


_LATENCY_SOURCE = (
    "Assumed, not measured here: 150 ns per random read through the Vitis memory subsystem. "
    "The recommendation paper gives no figure; its footnote 1 only says the Vitis memory "
    "controllers have 'close access latency to DDR and HBM', hence one figure for both. "
    "Published U280 micro-benchmarks (Shuhai, Wang et al., FCCM 2020) put single random reads "
    "of HBM and DDR4 at the AXI port in the order of 100-150 ns; that figure was recalled, not "
    "retrieved, so treat it as an estimate. One request per cycle: the AXI AR handshake rate, "
    "which the lookup unit (hwgen.recsys.embedding) achieves.")

#: Assumed figures per memory kind (override with ``place(..., memory_models=...)``).
MEMORY_MODELS = {
    "HBM": MemoryModel(150.0, 1.0, _LATENCY_SOURCE),
    "DDR4": MemoryModel(150.0, 1.0, _LATENCY_SOURCE),
    "LPDDR4": MemoryModel(150.0, 1.0, _LATENCY_SOURCE + " LPDDR4: same figure assumed."),
}
#: On-chip tables: a synchronous BRAM/URAM read, one per table per cycle.
ONCHIP_LATENCY_CYCLES = 2


def row_stride(dim, elem_bits):
    """Bytes a row occupies off chip: its bytes rounded up to a power of two."""
    return 1 << max(0, (dim * elem_bits // 8 - 1).bit_length())


def port_name(kind, index):
    """Core member / port prefix of a channel's read master: ``m_axi_hbm3``, ``m_axi_ddr0``."""
    return f"m_axi_{PORT_STEMS[kind]}{index}"


def onchip_capacity(board):
    """Bytes of all BRAM36 and URAM blocks of ``board``."""
    return board.resources["bram36"] * BRAM36_BYTES + board.resources["uram"] * URAM_BYTES


def _fmt(n):
    """Bytes in binary units, e.g. ``256 MiB``, ``14.1 GiB``."""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            value = n / size
            return f"{value:.3g} {unit}" if value < 100 else f"{value:.0f} {unit}"
    return f"{n} B"


@dataclass(frozen=True)
class TableSlot:
    """Where one table lives.

    Attributes
    ----------
    table : int
        Index in the model.
    where : str
        ``"onchip"`` or the port prefix of its channel (``m_axi_hbm3``).
    base : int
        Byte address of row 0 within the channel (0 on chip).
    stride : int
        Bytes per row off chip (a power of two); on chip the row's exact bytes.
    bytes : int
        Bytes the table occupies (``rows * stride``).
    beats : int
        AXI data words one lookup reads (0 on chip).
    """
    table: int
    where: str
    base: int
    stride: int
    bytes: int
    beats: int

    @property
    def onchip(self):
        """True when the table is in on-chip memory."""
        return self.where == "onchip"


@dataclass(frozen=True)
class ChannelPlan:
    """One used off-chip memory channel and its predicted lookup performance.

    Attributes
    ----------
    kind : str
        ``HBM``, ``DDR4`` or ``LPDDR4``.
    index : int
        Channel number within its kind (the Vitis bank index).
    port : str
        Port prefix of its read master (``m_axi_hbm3``).
    bank : str or None
        Vitis ``sp=`` bank name (``HBM[3]``).
    data_bits : int
        AXI data width.
    capacity : int
        Channel bytes.
    tables : tuple of int
        Tables on the channel, in lookup order (ascending base address).
    bytes : int
        End of the last table: the bytes of the channel's image.
    rounds : int
        Lookups per inference (``len(tables)``).
    beats : int
        AXI data words per inference.
    latency_ns : float
        Predicted time of one inference's lookups on this channel.
    lookups_per_s : float
        Predicted lookups per second at full load.
    inferences_per_s : float
        Predicted inferences per second this channel sustains.
    """
    kind: str
    index: int
    port: str
    bank: object
    data_bits: int
    capacity: int
    tables: tuple
    bytes: int
    rounds: int
    beats: int
    latency_ns: float
    lookups_per_s: float
    inferences_per_s: float

    @property
    def word_bytes(self):
        """Bytes of one AXI data word (``data_bits / 8``)."""
        return self.data_bits // 8


@dataclass(frozen=True)
class Placement:
    """The result of :func:`place`.

    Attributes
    ----------
    model : RecModel
    board : str
    clock_mhz : float
        Kernel clock of the performance figures.
    onchip_budget : int
        On-chip bytes available to tables.
    slots : tuple of TableSlot
        One per table, in table order.
    channels : tuple of ChannelPlan
        Used off-chip channels, HBM first, then DDR, by index.
    memory_models : dict
        The :class:`MemoryModel` of each kind used.
    """
    model: object
    board: str
    clock_mhz: float
    onchip_budget: int
    slots: tuple
    channels: tuple
    memory_models: dict = field(hash=False)

    @property
    def onchip(self):
        """Indices of the on-chip tables."""
        return tuple(s.table for s in self.slots if s.onchip)

    @property
    def onchip_bytes(self):
        """Bytes of the on-chip tables."""
        return sum(s.bytes for s in self.slots if s.onchip)

    def channel(self, port):
        """The :class:`ChannelPlan` whose read master is ``port`` (``m_axi_hbm3``); KeyError if
        none."""
        for ch in self.channels:
            if ch.port == port:
                return ch
        raise KeyError(port)

    def channels_of(self, kind):
        """The used channels of memory ``kind`` (``HBM``, ``DDR4``, ...), by index."""
        return tuple(ch for ch in self.channels if ch.kind == kind)

    @property
    def max_rounds(self):
        """Most lookups per inference on one channel (0 with every table on chip)."""
        return max((ch.rounds for ch in self.channels), default=0)

    @property
    def inferences_per_s(self):
        """Predicted inference rate of the lookups: the slowest channel (on-chip tables: one
        per cycle)."""
        rates = [ch.inferences_per_s for ch in self.channels]
        return min(rates + [self.clock_mhz * 1e6])

    @property
    def latency_ns(self):
        """Predicted lookup latency of one inference: the slowest channel."""
        onchip = ONCHIP_LATENCY_CYCLES * 1e3 / self.clock_mhz if self.onchip else 0.0
        return max([ch.latency_ns for ch in self.channels] + [onchip])

    def to_dict(self):
        """JSON form for reports: the figures, every used channel (tables, bytes, rounds, beats,
        predicted rates), every table's slot, the predicted latency and rate, and the memory
        models."""
        return {
            "model": self.model.name, "board": self.board, "clock_mhz": self.clock_mhz,
            "onchip_budget": self.onchip_budget, "onchip_tables": list(self.onchip),
            "onchip_bytes": self.onchip_bytes,
            "channels": [{"port": ch.port, "kind": ch.kind, "index": ch.index,
                          "bank": ch.bank, "tables": list(ch.tables), "bytes": ch.bytes,
                          "rounds": ch.rounds, "beats": ch.beats,
                          "latency_ns": round(ch.latency_ns, 2),
                          "lookups_per_s": ch.lookups_per_s,
                          "inferences_per_s": ch.inferences_per_s}
                         for ch in self.channels],
            "tables": [{"table": s.table, "where": s.where, "base": s.base, "stride": s.stride,
                        "bytes": s.bytes} for s in self.slots],
            "latency_ns": round(self.latency_ns, 2),
            "inferences_per_s": self.inferences_per_s,
            "memory_models": {k: {"latency_ns": v.latency_ns,
                                  "reads_per_cycle": v.reads_per_cycle, "source": v.source}
                              for k, v in self.memory_models.items()},
        }

    def summary(self):
        """A human-readable table of the placement."""
        m = self.model
        lines = [f"{m.name} on {self.board} at {self.clock_mhz:g} MHz: {len(m.tables)} tables, "
                 f"{_fmt(m.table_bytes)}",
                 f"  on chip: {len(self.onchip)} tables, {_fmt(self.onchip_bytes)} of a "
                 f"{_fmt(self.onchip_budget)} budget, {ONCHIP_LATENCY_CYCLES} cycles per lookup"]
        lines.append(f"  {'channel':<9} {'bank':<7} {'tables':>6} {'bytes':>10} {'rounds':>6} "
                     f"{'beats':>5} {'latency':>10} {'lookups/s':>10} {'inf/s':>10}  tables")
        for ch in self.channels:
            lines.append(
                f"  {ch.port[6:]:<9} {ch.bank or '-':<7} {len(ch.tables):>6} {_fmt(ch.bytes):>10} "
                f"{ch.rounds:>6} {ch.beats:>5} {ch.latency_ns:>7.1f} ns {ch.lookups_per_s:>10.3g} "
                f"{ch.inferences_per_s:>10.3g}  {','.join(map(str, ch.tables))}")
        lines.append(f"  bottleneck: {self.max_rounds} rounds; predicted "
                     f"{self.inferences_per_s:.3g} inferences/s, lookup latency "
                     f"{self.latency_ns:.1f} ns")
        return "\n".join(lines)


def _channel_kinds(board, hbm_channels, ddr_channels):
    """[(MemoryChannels, indices)] of the HBM and the DDR class, within the caps."""
    hbm, ddr = [], []
    for mem in board.memory:
        if mem.kind == HBM_KIND:
            n = mem.count if hbm_channels is None else min(hbm_channels, mem.count)
            hbm += [(mem, i) for i in range(n)]
        elif mem.kind in DDR_KINDS:
            ddr += [(mem, i) for i in range(mem.count)]
    if ddr_channels is not None:
        ddr = ddr[:ddr_channels]
    return hbm, ddr


def _cap(mem):
    return int(mem.capacity_gib * (1 << 30))


class _Bin:
    def __init__(self, mem, index):
        self.mem, self.index = mem, index
        self.capacity = _cap(mem)
        self.tables, self.end = [], 0

    def room(self, size):
        return -(-self.end // TABLE_ALIGN) * TABLE_ALIGN + size <= self.capacity

    def add(self, t, size):
        self.end = -(-self.end // TABLE_ALIGN) * TABLE_ALIGN + size
        self.tables.append(t)


def _pack(tables, sizes, bins, rounds):
    """Largest first, each to the bin with the fewest tables, then the most free bytes.
    Returns the tables that found no bin (and leaves the others in ``bins``)."""
    failed = []
    for t in sorted(tables, key=lambda t: (-sizes[t], t)):
        options = [b for b in bins if len(b.tables) < rounds and b.room(sizes[t])]
        if not options:
            failed.append(t)
            continue
        best = min(options, key=lambda b: (len(b.tables), b.end, b.index))
        best.add(t, sizes[t])
    return failed


def _assign(offchip, sizes, fits_hbm, hbm, ddr, rounds):
    """Bins of an assignment with at most ``rounds`` tables per channel, or the tables that
    did not fit."""
    forced = [t for t in offchip if not fits_hbm[t]]
    flexible = sorted((t for t in offchip if fits_hbm[t]), key=lambda t: (-sizes[t], t))
    # DDR takes the forced tables, plus the largest flexible ones HBM has no slots for; more
    # of them if HBM capacity requires it.
    least = max(0, len(flexible) - len(hbm) * rounds)
    failed = None
    for extra in range(least, min(len(flexible), max(0, len(ddr) * rounds - len(forced))) + 1):
        hbm_bins = [_Bin(mem, i) for mem, i in hbm]
        ddr_bins = [_Bin(mem, i) for mem, i in ddr]
        bad = _pack(forced + flexible[:extra], sizes, ddr_bins, rounds)
        bad += _pack(flexible[extra:], sizes, hbm_bins, rounds)
        if not bad:
            return hbm_bins + ddr_bins, []
        if failed is None or len(bad) < len(failed):
            failed = bad
        if not ddr:
            break
    return None, failed if failed is not None else forced + flexible


def _channel_plan(b, slots, clock_mhz, model_of):
    mem = b.mem
    word = mem.axi_data_bits // 8
    beats = sum(slots[t].beats for t in b.tables)
    mm = model_of(mem.kind)
    # words per second: one per cycle at most (and reads_per_cycle requests), and bandwidth
    words_per_s = min(clock_mhz * 1e6, mem.bandwidth_gbytes_per_s * 1e9 / word)
    reads_per_s = clock_mhz * 1e6 * mm.reads_per_cycle
    per_lookup = beats / len(b.tables)
    lookups_per_s = min(reads_per_s, words_per_s / per_lookup)
    latency = mm.latency_ns + (beats - 1) * 1e9 / words_per_s
    return ChannelPlan(
        kind=mem.kind, index=b.index, port=port_name(mem.kind, b.index),
        bank=mem.bank(b.index) if mem.vitis_bank else None, data_bits=mem.axi_data_bits,
        capacity=b.capacity, tables=tuple(b.tables), bytes=b.end, rounds=len(b.tables),
        beats=beats, latency_ns=latency, lookups_per_s=lookups_per_s,
        inferences_per_s=lookups_per_s / len(b.tables))


def place(model, board, *, onchip_bytes=None, hbm_channels=None, ddr_channels=None,
          hbm_table_max_bytes=None, clock_mhz=None, memory_models=None):
    """Place the tables of ``model`` in the memories of ``board`` (see module docstring).

    Parameters
    ----------
    model : RecModel
    board : Board or str
    onchip_bytes : int, optional
        On-chip bytes for tables; default :data:`ONCHIP_SHARE` of :func:`onchip_capacity`.
        0 keeps every table off chip.
    hbm_channels, ddr_channels : int, optional
        Use at most this many HBM pseudo-channels / DDR-class channels (the first ones);
        default all the board has. 0 uses none of the kind.
    hbm_table_max_bytes : int, optional
        Tables larger than this (row-padded bytes) go to DDR even if they fit an HBM
        pseudo-channel.
    clock_mhz : float, optional
        Kernel clock of the predictions; default the board's.
    memory_models : dict, optional
        ``{kind: MemoryModel}`` replacing entries of :data:`MEMORY_MODELS`.

    Returns
    -------
    Placement

    Raises
    ------
    ConfigError
        Naming what does not fit: the total off-chip bytes against the channels' capacity, or
        the tables that find no channel.
    """
    board = _check_place_args(board, onchip_bytes=onchip_bytes, hbm_channels=hbm_channels,
                              ddr_channels=ddr_channels, hbm_table_max_bytes=hbm_table_max_bytes)
    clock_mhz = clock_mhz or board.kernel_clock_mhz
    models = {**MEMORY_MODELS, **(memory_models or {})}
    eb = model.elem_bits
    n = len(model.tables)
    exact = [t.bytes(eb) for t in model.tables]
    strides = [row_stride(t.dim, eb) for t in model.tables]
    padded = [t.rows * s for t, s in zip(model.tables, strides)]

    # 1. on chip: smallest first within the budget
    budget = int(ONCHIP_SHARE * onchip_capacity(board)) if onchip_bytes is None else onchip_bytes
    onchip, used = [], 0
    for t in sorted(range(n), key=lambda t: (exact[t], t)):
        if used + exact[t] > budget:
            break
        onchip.append(t)
        used += exact[t]
    offchip = sorted(set(range(n)) - set(onchip))

    hbm, ddr = _channel_kinds(board, hbm_channels, ddr_channels)
    what = _describe(board, hbm, ddr)
    if offchip and not hbm and not ddr:
        size = _fmt(sum(padded[t] for t in offchip))
        raise ConfigError("tables", f"{len(offchip)} tables ({size}) do not fit the on-chip "
                          f"budget of {_fmt(budget)} and {board.name} has {what}")
    hbm_cap = min((_cap(mem) for mem, _ in hbm), default=0)
    limit = hbm_cap if hbm_table_max_bytes is None else min(hbm_cap, hbm_table_max_bytes)
    fits_hbm = {t: bool(hbm) and padded[t] <= limit for t in offchip}
    forced = [t for t in offchip if not fits_hbm[t]]
    if forced and not ddr:
        big = ", ".join(f"{t} ({_fmt(padded[t])})" for t in forced[:6])
        more = f" and {len(forced) - 6} more" if len(forced) > 6 else ""
        reason = f"larger than an HBM pseudo-channel of {board.name} ({_fmt(hbm_cap)})" \
            if hbm_table_max_bytes is None or hbm_table_max_bytes >= hbm_cap else \
            f"larger than hbm_table_max_bytes={hbm_table_max_bytes}"
        raise ConfigError("tables", f"tables {big}{more} are {reason} and no DDR channel is "
                          f"available ({what})")

    total = sum(padded[t] for t in offchip)
    capacity = sum(_cap(mem) for mem, _ in hbm + ddr)
    if total > capacity:
        raise ConfigError("tables", f"{_fmt(total)} of tables off chip do not fit "
                          f"{board.name}'s {what} ({_fmt(capacity)} in all; on chip: "
                          f"{len(onchip)} table{'s' if len(onchip) != 1 else ''}, "
                          f"{_fmt(used)})")

    # 2./3. off chip: the fewest rounds for which everything fits
    bins = None
    if offchip:
        bins = _fewest_rounds(offchip, padded, fits_hbm, hbm, ddr, forced,
                              f"{board.name}'s {what} ({_fmt(total)} off chip)")

    slots = _addresses(model, n, onchip, bins, exact, strides, padded)
    plans = []
    for b in bins or []:
        if b.tables:
            plans.append(_channel_plan(b, slots, clock_mhz, lambda kind: models[kind]))
    plans.sort(key=lambda p: (p.kind != HBM_KIND, p.kind, p.index))
    used_kinds = {p.kind for p in plans}
    return Placement(model=model, board=board.name, clock_mhz=clock_mhz, onchip_budget=budget,
                     slots=tuple(slots), channels=tuple(plans),
                     memory_models={k: v for k, v in models.items() if k in used_kinds})


def _check_place_args(board, **counts):
    """The :class:`Board` of ``board`` (a name or a Board), after checking the channel and
    byte ``counts`` of :func:`place` (integers >= 0 or None); ConfigError otherwise."""
    if isinstance(board, str):
        board = load_board(board)
    if not isinstance(board, Board):
        raise ConfigError("board", "must be a board name or a hwgen.boards.Board", value=board)
    for name, value in counts.items():
        if value is not None and (not isinstance(value, int) or value < 0):
            raise ConfigError(name, "must be an integer >= 0 (or None for the board's)",
                              value=value)
    return board


def _fewest_rounds(offchip, padded, fits_hbm, hbm, ddr, forced, where):
    """The bins of the off-chip tables at the fewest rounds (tables per channel) for which
    everything fits; ConfigError naming the tables that find no room in ``where``."""
    channels = len(hbm) + len(ddr)
    lo = max(-(-len(offchip) // channels), -(-len(forced) // len(ddr)) if ddr else 0)
    # without a limit on tables per channel first: if that fails, nothing will
    bins, failed = _assign(offchip, padded, fits_hbm, hbm, ddr, len(offchip))
    for rounds in range(lo, len(offchip)) if bins is not None else ():
        fewer, _ = _assign(offchip, padded, fits_hbm, hbm, ddr, rounds)
        if fewer is not None:
            bins = fewer
            break
    if bins is None:
        names = ", ".join(f"{t} ({_fmt(padded[t])})" for t in sorted(failed)[:6])
        raise ConfigError("tables", f"tables {names} find no channel with room left in "
                          f"{where}")
    return bins


def _addresses(model, n, onchip, bins, exact, strides, padded):
    """The :class:`TableSlot` of each of the ``n`` tables: on chip, or at an aligned base in
    its bin's channel (tables in table order; sets each bin's ``end``)."""
    slots = [None] * n
    for t in onchip:
        slots[t] = TableSlot(t, "onchip", 0, exact[t] // model.tables[t].rows, exact[t], 0)
    for b in bins or []:
        if not b.tables:
            continue
        b.tables.sort()                      # lookup order: table order
        word = b.mem.axi_data_bits // 8
        end = 0
        for t in b.tables:
            base = -(-end // TABLE_ALIGN) * TABLE_ALIGN
            slots[t] = TableSlot(t, port_name(b.mem.kind, b.index), base, strides[t],
                                 padded[t], max(1, strides[t] // word))
            end = base + padded[t]
        b.end = end
    return slots


def _describe(board, hbm, ddr):
    parts = []
    for group in (hbm, ddr):
        kinds = {}
        for mem, _ in group:
            kinds.setdefault(mem.kind, [mem, 0])[1] += 1
        parts += [f"{count} x {kind} of {_fmt(_cap(mem))}" for kind, (mem, count) in kinds.items()]
    return " + ".join(parts) if parts else "no HBM or DDR channel"


def pack_tables(model, placement, contents):
    """Channel images of the off-chip tables: ``{port prefix: bytes}``.

    ``contents`` holds one ``(rows, dim)`` integer array per table (e.g.
    :func:`hwgen.recsys.golden.table_contents`); values must fit signed ``elem_bits``. Each
    image spans the channel from address 0 to the end of its last table; rows are written at
    ``base + row * stride`` as little-endian two's complement, padding bytes zero. A host
    writes the image into the buffer bound to the channel (XRT: the buffer of that bank, at
    offset 0) before starting the kernel.
    """
    eb = model.elem_bits
    dtype = {8: "<i1", 16: "<i2"}[eb]
    lo, hi = -(1 << (eb - 1)), (1 << (eb - 1)) - 1
    if len(contents) != len(model.tables):
        raise ConfigError("contents", f"needs {len(model.tables)} tables, got {len(contents)}")
    images = {}
    for ch in placement.channels:
        image = bytearray(ch.bytes)
        for t in ch.tables:
            table, slot = model.tables[t], placement.slots[t]
            values = np.asarray(contents[t], dtype=np.int64)
            if values.shape != (table.rows, table.dim):
                raise ConfigError(f"contents[{t}]", f"must have shape ({table.rows}, "
                                  f"{table.dim})", value=values.shape)
            if values.size and (values.min() < lo or values.max() > hi):
                raise ConfigError(f"contents[{t}]", f"values must fit signed {eb} bits")
            rows = np.zeros((table.rows, slot.stride * 8 // eb), dtype=dtype)
            rows[:, :table.dim] = values
            image[slot.base:slot.base + slot.bytes] = rows.tobytes()
        images[ch.port] = bytes(image)
    return images
