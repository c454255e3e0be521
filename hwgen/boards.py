"""Board data: the FPGA cards hwgen can target, read from ``boards/<name>.toml``.

Every figure in a board file carries a ``source`` string naming the document it comes from (or
saying plainly that it is unverified); see ``boards/README.md``. This module only loads and
validates those files; it never invents a number.

Typical use::

    from hwgen.boards import load_board
    u280 = load_board("u280")
    u280.primary_memory.kind           # "HBM"
    u280.primary_memory.bank(3)        # "HBM[3]"  (a Vitis connectivity sp= bank name)
    u280.percent({"lut": 100_000, "bram": 400})

Files are validated strictly: a missing or unknown key, a value of the wrong type, a count that
is not positive or a table without a ``source`` raises :class:`hwgen.errors.ConfigError` whose
message names the file and the key, e.g. ``u280.toml:memory[1].source: missing required key``.
"""

from __future__ import annotations

import math
import re
import tomllib
from dataclasses import dataclass, field
from importlib.resources import files
from pathlib import Path
from typing import Any

from hwgen.errors import ConfigError

#: The board files: the checkout's ``boards/``, installed as the package ``hwgen.board_files``.
BOARDS_DIR = Path(files("hwgen.board_files"))

RESOURCE_KEYS = ("lut", "ff", "bram36", "uram", "dsp")
"""Keys of ``[resources]`` (and of :attr:`Board.resources`)."""

PERCENT_KEYS = ("lut", "ff", "bram", "uram", "dsp")
"""Keys :meth:`Board.percent` accepts; ``bram`` counts BRAM18 blocks (yosys/Vivado style)."""

MEMORY_KINDS = ("HBM", "DDR4", "LPDDR4", "PLRAM")
RESOURCE_SCOPES = ("user", "device")
YOSYS_FAMILIES = ("xcup", "xcu", "xc7")
"""``synth_xilinx -family`` values a board may name (yosys has no Versal family)."""

_VERSAL_PART = re.compile(r"^xcv[cemph]\d")
_AXI_WIDTHS = (32, 64, 128, 256, 512, 1024)

_TOP_REQUIRED = ("name", "title", "part", "family", "vitis_platform", "kernel_clock_mhz",
                 "source", "resources", "memory")
_TOP_OPTIONAL = ("family_note", "vitis_platform_note", "network", "aie")
_RES_REQUIRED = RESOURCE_KEYS + ("scope", "source")
_MEM_REQUIRED = ("kind", "count", "axi_data_bits", "bandwidth_gbytes_per_s", "capacity_gib",
                 "vitis_bank", "source")
_NET_REQUIRED = ("kind", "count", "gbps", "source")
_AIE_REQUIRED = ("tiles", "source")


@dataclass(frozen=True)
class MemoryChannels:
    """One kind of off-chip (or PLRAM) memory of a board: ``count`` channels reachable by kernels.

    ``bandwidth_gbytes_per_s`` and ``capacity_gib`` are per channel. ``vitis_bank`` is the
    Vitis ``--connectivity.sp`` bank name pattern with ``{index}`` for the channel number
    (``"HBM[{index}]"``), a fixed name when there is one bank (``"DDR"``, ``"MC_NOC0"``), or
    ``""`` on a board without a Vitis platform.
    """

    kind: str
    count: int
    axi_data_bits: int
    bandwidth_gbytes_per_s: float
    capacity_gib: float
    vitis_bank: str
    source: str

    def bank(self, index: int) -> str:
        """The sp= bank name of channel ``index`` (0-based), e.g. ``HBM[7]``.

        Raises ConfigError if ``index`` is not an integer in ``0..count-1`` or the board has no
        Vitis bank names.
        """
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < self.count:
            raise ConfigError("index", f"must be an integer in 0..{self.count - 1} "
                              f"({self.count} {self.kind} channel(s))", value=index)
        if not self.vitis_bank:
            raise ConfigError("vitis_bank", f"this board's {self.kind} memory has no Vitis sp= "
                              "bank name (the board has no Vitis platform)")
        return self.vitis_bank.format(index=index)

    @property
    def total_bandwidth_gbytes_per_s(self) -> float:
        """Bandwidth of all ``count`` channels together, in GB/s."""
        return self.bandwidth_gbytes_per_s * self.count

    @property
    def total_capacity_gib(self) -> float:
        """Capacity of all ``count`` channels together, in GiB."""
        return self.capacity_gib * self.count

    @property
    def bytes_per_beat(self) -> int:
        """Bytes one kernel-side AXI data beat carries (``axi_data_bits / 8``)."""
        return self.axi_data_bits // 8


@dataclass(frozen=True)
class NetworkPorts:
    """A group of identical network ports (e.g. two QSFP28 cages at 100 Gb/s)."""

    kind: str
    count: int
    gbps: float
    source: str


@dataclass(frozen=True)
class Board:
    """A validated board file. Build one with :func:`load_board` or :func:`load_board_file`."""

    name: str
    title: str
    part: str
    family: str
    vitis_platform: str
    kernel_clock_mhz: float
    resources: dict[str, int] = field(hash=False)
    resources_scope: str
    memory: tuple[MemoryChannels, ...]
    network: tuple[NetworkPorts, ...]
    aie_tiles: int | None
    path: Path
    source: str = ""
    resources_source: str = ""
    aie_source: str = ""
    family_note: str = ""
    vitis_platform_note: str = ""

    @property
    def primary_memory(self) -> MemoryChannels:
        """The first ``[[memory]]`` table: HBM on HBM boards, DDR elsewhere."""
        return self.memory[0]

    @property
    def memory_kinds(self) -> tuple[str, ...]:
        """The ``kind`` of every ``[[memory]]`` table, in declared order (``("HBM", "DDR")``)."""
        return tuple(m.kind for m in self.memory)

    def memory_of(self, kind: str) -> MemoryChannels:
        """The ``[[memory]]`` table of ``kind``; ConfigError if the board has none."""
        for m in self.memory:
            if m.kind == kind:
                return m
        raise ConfigError("memory kind", f"board {self.name} has none; it has: "
                          f"{', '.join(self.memory_kinds)}", value=kind)

    def channels(self, kind: str | None = None) -> list[tuple[str, int, str | None]]:
        """``(kind, index, bank_name)`` for every memory channel, in declared order.

        With ``kind`` only that memory's channels (ConfigError if the board has none of it).
        ``bank_name`` is None on a board without Vitis bank names.
        """
        mems = self.memory if kind is None else (self.memory_of(kind),)
        return [(m.kind, i, m.bank(i) if m.vitis_bank else None)
                for m in mems for i in range(m.count)]

    def percent(self, counts: dict[str, float]) -> dict[str, float]:
        """Percentage of this board's resources that ``counts`` uses.

        ``counts`` may hold ``lut``, ``ff``, ``dsp``, ``uram`` and ``bram``; ``bram`` is a count
        of BRAM18 blocks and is compared with ``2 * bram36``. Missing keys count as 0. The
        result has all five keys. Percentages are of ``resources`` whose meaning is given by
        ``resources_scope`` ("user": after the static shell; "device": whole device).
        """
        if not isinstance(counts, dict):
            raise ConfigError("counts", "must be a dict of resource counts", value=counts)
        unknown = sorted(set(counts) - set(PERCENT_KEYS))
        if unknown:
            raise ConfigError("counts", f"unknown resource key(s) {', '.join(map(str, unknown))}; "
                              f"allowed: {', '.join(PERCENT_KEYS)}")
        capacity = {"lut": self.resources["lut"], "ff": self.resources["ff"],
                    "bram": 2 * self.resources["bram36"], "uram": self.resources["uram"],
                    "dsp": self.resources["dsp"]}
        out = {}
        for key in PERCENT_KEYS:
            used = counts.get(key, 0)
            if isinstance(used, bool) or not isinstance(used, (int, float)) \
                    or not math.isfinite(used) or used < 0:
                raise ConfigError(f"counts[{key!r}]", "must be a finite number >= 0", value=used)
            out[key] = 100.0 * used / capacity[key]
        return out


# --------------------------------------------------------------------------------------------
# Loading


def _dir(boards_dir: Path | str | None) -> Path:
    # Read the module attribute at call time so tests can monkeypatch BOARDS_DIR.
    return Path(boards_dir) if boards_dir is not None else Path(BOARDS_DIR)


#: A board name: a file stem without path separators (``u280``, ``ecpix5-85``).
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


def board_names(boards_dir: Path | str | None = None) -> list[str]:
    """Sorted names (file stems) of the ``*.toml`` board files."""
    d = _dir(boards_dir)
    if not d.is_dir():
        return []
    return sorted(p.stem for p in d.glob("*.toml") if p.is_file())


def load_board(name: str, boards_dir: Path | str | None = None) -> Board:
    """Load and validate ``<boards_dir>/<name>.toml`` (default: :data:`BOARDS_DIR`). Cached.

    Raises ConfigError("board", "unknown board; choose one of: ...") for a name with no file.
    """
    if isinstance(name, str) and _NAME.fullmatch(name):
        path = str(_dir(boards_dir) / f"{name}.toml")
        if path in _LOADED or Path(path).is_file():    # the golden models' hot path: no listing
            return _load_cached(path)
    names = board_names(boards_dir)
    raise ConfigError("board", f"unknown board; choose one of: {', '.join(names) or '(none)'}",
                      value=name)


def load_board_file(path: Path | str) -> Board:
    """Load and validate one board file at ``path`` (not cached)."""
    return _parse(Path(path))


#: Boards loaded by :func:`load_board`, by file path.
_LOADED: dict[str, Board] = {}


def _load_cached(path: str) -> Board:
    if path not in _LOADED:
        _LOADED[path] = _parse(Path(path))
    return _LOADED[path]


def clear_cache() -> None:
    """Forget boards loaded by :func:`load_board` (e.g. after editing a board file)."""
    _LOADED.clear()


# --------------------------------------------------------------------------------------------
# Validation helpers: every error names the file and the key path.


class _Ctx:
    def __init__(self, path: Path):
        self.file = path.name

    def err(self, key: str, message: str, value: Any = None) -> ConfigError:
        return ConfigError(f"{self.file}:{key}", message, value=value)

    def table(self, parent: dict, key: str, where: str, required: bool = True) -> dict | None:
        if key not in parent:
            if required:
                raise self.err(where, "missing required table")
            return None
        val = parent[key]
        if not isinstance(val, dict):
            raise self.err(where, f"must be a table, not {type(val).__name__}")
        return val

    def keys(self, table: dict, where: str, required: tuple, optional: tuple = ()) -> None:
        for k in required:
            if k not in table:
                raise self.err(f"{where}{k}", "missing required key")
        extra = sorted(set(table) - set(required) - set(optional))
        if extra:
            raise self.err(f"{where}{extra[0]}", "unknown key; allowed: "
                           f"{', '.join(required + optional)}")

    def string(self, table: dict, key: str, where: str, *, empty_ok: bool = False,
               choices: tuple | None = None) -> str:
        val = table[key]
        if not isinstance(val, str):
            raise self.err(f"{where}{key}", f"must be a string, not {type(val).__name__}",
                           value=val)
        if not empty_ok and not val.strip():
            raise self.err(f"{where}{key}", "must not be empty")
        if choices is not None and val not in choices:
            raise self.err(f"{where}{key}", f"must be one of: {', '.join(choices)}", value=val)
        return val

    def pos_int(self, table: dict, key: str, where: str) -> int:
        val = table[key]
        if isinstance(val, bool) or not isinstance(val, int):
            raise self.err(f"{where}{key}", f"must be an integer, not {type(val).__name__}",
                           value=val)
        if val <= 0:
            raise self.err(f"{where}{key}", "must be a positive integer", value=val)
        return val

    def pos_number(self, table: dict, key: str, where: str) -> float:
        val = table[key]
        if isinstance(val, bool) or not isinstance(val, (int, float)):
            raise self.err(f"{where}{key}", f"must be a number, not {type(val).__name__}",
                           value=val)
        if not math.isfinite(val) or val <= 0:
            raise self.err(f"{where}{key}", "must be a positive number", value=val)
        return val


def _parse(path: Path) -> Board:
    ctx = _Ctx(path)
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError("board", "board file not found", value=str(path)) from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(path.name, f"not valid TOML: {e}") from None

    ctx.keys(data, "", _TOP_REQUIRED, _TOP_OPTIONAL)
    name = ctx.string(data, "name", "")
    if name != path.stem:
        raise ctx.err("name", f"must equal the file name stem {path.stem!r}", value=name)
    title = ctx.string(data, "title", "")
    part = ctx.string(data, "part", "")
    if not re.fullmatch(r"xc[a-z0-9]+(-[A-Za-z0-9]+)+", part):
        raise ctx.err("part", "must be a Vivado part string such as xcu280-fsvh2892-2L-e",
                      value=part)
    family = ctx.string(data, "family", "", choices=YOSYS_FAMILIES)
    family_note = ""
    if "family_note" in data:
        family_note = ctx.string(data, "family_note", "")
    if _VERSAL_PART.match(part) and not family_note:
        raise ctx.err("family_note", "required for a Versal part: say which yosys family stands "
                      "in for it (yosys has no Versal family)")
    vitis_platform = ctx.string(data, "vitis_platform", "", empty_ok=True)
    vitis_platform_note = ""
    if "vitis_platform_note" in data:
        vitis_platform_note = ctx.string(data, "vitis_platform_note", "")
    if not vitis_platform and not vitis_platform_note:
        raise ctx.err("vitis_platform_note", "required when vitis_platform is empty: say why "
                      "the board has none")
    clock = ctx.pos_number(data, "kernel_clock_mhz", "")
    source = ctx.string(data, "source", "")

    res = ctx.table(data, "resources", "resources")
    ctx.keys(res, "resources.", _RES_REQUIRED)
    resources = {k: ctx.pos_int(res, k, "resources.") for k in RESOURCE_KEYS}
    scope = ctx.string(res, "scope", "resources.", choices=RESOURCE_SCOPES)
    resources_source = ctx.string(res, "source", "resources.")

    mem_list = data["memory"]
    if not isinstance(mem_list, list) or not mem_list:
        raise ctx.err("memory", "must be one or more [[memory]] tables")
    memory = []
    for i, m in enumerate(mem_list):
        where = f"memory[{i}]."
        if not isinstance(m, dict):
            raise ctx.err(f"memory[{i}]", "must be a table")
        ctx.keys(m, where, _MEM_REQUIRED)
        kind = ctx.string(m, "kind", where, choices=MEMORY_KINDS)
        if kind in (x.kind for x in memory):
            raise ctx.err(f"{where}kind", "duplicate memory kind: use one table per kind",
                          value=kind)
        count = ctx.pos_int(m, "count", where)
        bits = ctx.pos_int(m, "axi_data_bits", where)
        if bits not in _AXI_WIDTHS:
            raise ctx.err(f"{where}axi_data_bits", "must be one of: "
                          f"{', '.join(map(str, _AXI_WIDTHS))}", value=bits)
        bw = ctx.pos_number(m, "bandwidth_gbytes_per_s", where)
        cap = ctx.pos_number(m, "capacity_gib", where)
        bank = ctx.string(m, "vitis_bank", where, empty_ok=True)
        _check_bank(ctx, where, bank, count, bool(vitis_platform))
        msrc = ctx.string(m, "source", where)
        memory.append(MemoryChannels(kind, count, bits, bw, cap, bank, msrc))

    network = []
    if "network" in data:
        net_list = data["network"]
        if not isinstance(net_list, list):
            raise ctx.err("network", "must be [[network]] tables")
        for i, n in enumerate(net_list):
            where = f"network[{i}]."
            if not isinstance(n, dict):
                raise ctx.err(f"network[{i}]", "must be a table")
            ctx.keys(n, where, _NET_REQUIRED)
            network.append(NetworkPorts(ctx.string(n, "kind", where),
                                        ctx.pos_int(n, "count", where),
                                        ctx.pos_number(n, "gbps", where),
                                        ctx.string(n, "source", where)))

    aie_tiles, aie_source = None, ""
    aie = ctx.table(data, "aie", "aie", required=False)
    if aie is not None:
        ctx.keys(aie, "aie.", _AIE_REQUIRED)
        aie_tiles = ctx.pos_int(aie, "tiles", "aie.")
        aie_source = ctx.string(aie, "source", "aie.")

    return Board(name=name, title=title, part=part, family=family,
                 vitis_platform=vitis_platform, kernel_clock_mhz=clock, resources=resources,
                 resources_scope=scope, memory=tuple(memory), network=tuple(network),
                 aie_tiles=aie_tiles, path=path, source=source,
                 resources_source=resources_source, aie_source=aie_source,
                 family_note=family_note, vitis_platform_note=vitis_platform_note)


def _check_bank(ctx: _Ctx, where: str, bank: str, count: int, has_platform: bool) -> None:
    key = f"{where}vitis_bank"
    if not bank:
        if has_platform:
            raise ctx.err(key, "must not be empty on a board with a Vitis platform")
        return
    if not has_platform:
        raise ctx.err(key, "must be empty on a board without a Vitis platform", value=bank)
    fields = re.findall(r"\{([^{}]*)\}", bank)
    if any(f != "index" for f in fields) or bank.count("{") != len(fields) \
            or bank.count("}") != len(fields):
        raise ctx.err(key, "may only contain the placeholder {index}", value=bank)
    if not fields and count != 1:
        raise ctx.err(key, f"needs {{index}} to name {count} channels", value=bank)
    if fields and len({bank.format(index=i) for i in range(count)}) != count:
        raise ctx.err(key, "must give each channel a distinct name", value=bank)
