"""Row formats and configurations of the packet adapters
(:mod:`hwgen.cluster.gateware.adapter` describes the packet layout, the ports and the timing;
:mod:`hwgen.cluster.golden.rows` is the golden codec): :class:`RowFormat` (a row stream's
fields, elements and framing), the typed sources and FIFO depths of ``cluster-pkt2row``, and
both adapters' configurations."""

from dataclasses import dataclass, fields as dc_fields, replace
import re

from amaranth.hdl import signed, unsigned

from ...config import Config, Record, param
from ...errors import ConfigError
from ...lib.row_ports import row_layout, shape_range

__all__ = ["ELEM_BITS", "RowFormat", "row_format_from_ports", "RowToPacketsConfig",
           "PacketsToRowsConfig", "Source", "parse_sources"]


#: Element widths in packets (whole bytes, a power of two so elements never straddle lanes).
ELEM_BITS = (8, 16, 32)
#: Payload fields of the row layout besides the data field.
RESERVED = ("count", "last_row", "last")
COUNTER_BITS = 32
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


# -- row formats ---------------------------------------------------------------------------

@dataclass(frozen=True)
class RowFormat:
    """One kernel-side row stream (see the module docstring for the payload)."""
    field: str = "x"
    lanes: int = 1
    elem_bits: int = 8
    field_bits: int = 0
    signed: bool = True
    row_elems: int = 1
    count: bool = False
    rows: int = 0
    array: bool = True

    def check(self, where=None):
        """Raise :class:`ConfigError` naming ``where`` (default: the parameter) on a bad
        value."""
        def bad(name, msg):
            raise ConfigError(where or name, f"{name}: {msg}" if where else msg,
                              value=getattr(self, name))
        if not isinstance(self.field, str) or not _NAME.fullmatch(self.field) \
                or self.field in RESERVED:
            bad("field", "must be an identifier other than " + ", ".join(RESERVED))
        if self.elem_bits not in ELEM_BITS:
            bad("elem_bits", "must be one of 8, 16, 32 (elements fill whole bytes)")
        if not 1 <= self.lanes <= 256:
            bad("lanes", "must be an integer in 1..256")
        if not 0 <= self.field_bits <= self.elem_bits:
            bad("field_bits", f"must be in 0..elem_bits={self.elem_bits} (0: elem_bits)")
        if not 0 <= self.row_elems <= 1 << 20:
            bad("row_elems", "must be an integer in 0..1048576 (0: a row is a packet)")
        if not 0 <= self.rows <= 1 << 16:
            bad("rows", "must be an integer in 0..65536 (0: no last_row field)")
        if not self.array and self.lanes != 1:
            bad("array", "a plain (non-array) field needs lanes=1")

    @property
    def bits(self):
        """Bits of the kernel's element field: ``field_bits``, or ``elem_bits`` when that is 0."""
        return self.field_bits or self.elem_bits

    @property
    def shape(self):
        """Amaranth shape of one kernel-side element: ``signed``/``unsigned(bits)``."""
        return signed(self.bits) if self.signed else unsigned(self.bits)

    @property
    def elem_bytes(self):
        """Bytes of one element in packets (``elem_bits // 8``)."""
        return self.elem_bits // 8

    @property
    def beat_bytes(self):
        """Packet bytes of one full kernel beat (``lanes * elem_bytes``)."""
        return self.lanes * self.elem_bytes

    @property
    def row_bytes(self):
        """Packet bytes of a fixed-length row (``row_elems * elem_bytes``; 0 when a row
        ends with each packet)."""
        return self.row_elems * self.elem_bytes

    @property
    def tail(self):
        """Elements in a fixed-length row's final beat."""
        return self.row_elems - (-(-self.row_elems // self.lanes) - 1) * self.lanes

    @property
    def count_bits(self):
        """Width of the ``count`` field: enough bits for 0 .. ``lanes``."""
        return self.lanes.bit_length()

    def layout(self):
        """The kernel-side payload: ``field``, [``count``], [``last_row``], ``last``
        (:func:`~hwgen.lib.row_ports.row_layout`)."""
        return row_layout(self.field, self.shape, self.lanes, array=self.array,
                          count_bits=self.count_bits if self.count else 0,
                          last_row=bool(self.rows))

    def value_range(self):
        """``(lo, hi)``: the integers an element of the kernel field holds (:attr:`shape`)."""
        return shape_range(self.shape)


FORMAT_KEYS = tuple(f.name for f in dc_fields(RowFormat))


def row_format_from_ports(entry, row_elems, rows=0):
    """The :class:`RowFormat` of a kernel stream from its ``ports.json`` entry (``{"fields":
    [{"name", "bits", "count", "signed", "array"}, ...]}``): the data field is the first one
    that is not ``count``/``last_row``; ``elem_bits`` the smallest of :data:`ELEM_BITS` that
    holds it; ``rows`` (needed when the stream has ``last_row``) and ``row_elems`` as given."""
    found = {f["name"]: f for f in entry["fields"]}
    main = next((f for f in entry["fields"] if f["name"] not in RESERVED), None)
    if main is None:
        raise ConfigError("field", "the stream has no element field",
                          value=[f["name"] for f in entry["fields"]])
    if main["bits"] > ELEM_BITS[-1]:
        raise ConfigError("field_bits", "elements wider than 32 bits do not fit a packet "
                          "element", value=main["bits"])
    if "last_row" in found and not rows:
        raise ConfigError("rows", "the stream has last_row: give the rows of a matrix",
                          value=rows)
    fmt = RowFormat(field=main["name"], lanes=main["count"], field_bits=main["bits"],
                    elem_bits=next(b for b in ELEM_BITS if b >= main["bits"]),
                    signed=main["signed"], row_elems=row_elems, count="count" in found,
                    rows=rows if "last_row" in found else 0, array=main["array"])
    fmt.check()
    return fmt


@dataclass(frozen=True)
class _FormatConfig(Config):
    """Row-format parameters shared by both adapters (the defaults of every source)."""
    data_bits: int = param(64, "TDATA bits of the packet stream", choices=(64, 128, 256, 512))
    field: str = param("x", "name of the kernel payload's element field (q, y, p, s ...)")
    lanes: int = param(4, "elements per kernel beat", lo=1, hi=256)
    elem_bits: int = param(8, "bits per element in packets", choices=ELEM_BITS)
    field_bits: int = param(0, "bits of the kernel's element field (0: elem_bits; fewer: "
                               "sign/zero-extended into elem_bits)", lo=0, hi=32)
    signed: bool = param(True, "elements are signed")
    row_elems: int = param(37, "elements per row (with count on the row side: the longest "
                               "row); packets to rows: 0 = a row ends with each packet",
                           lo=0, hi=1 << 20)
    count: bool = param(False, "the kernel payload has a count field (elements in the beat)")
    rows: int = param(0, "rows per matrix: a last_row field set on every rows-th row "
                         "(0: none)", lo=0, hi=1 << 16)
    array: bool = param(True, "the element field is an array of lanes (false: a plain "
                              "integer, lanes=1)")

    @property
    def format(self):
        """The :class:`RowFormat` of these parameters (every source's default)."""
        return RowFormat(**{k: getattr(self, k) for k in FORMAT_KEYS})

    def check(self):
        self.format.check()


@dataclass(frozen=True)
class RowToPacketsConfig(_FormatConfig):
    """``cluster-row2pkt``: kernel rows to packets (:class:`RowToPackets`). With ``count`` the
    rows have any length 1..``row_elems`` (the ``count`` of the final beat says)."""
    dest: int = param(2, "TDEST: the destination kernel id", lo=0, hi=255)
    src: int = param(1, "TID: this kernel's id", lo=0, hi=255)
    max_packet_bytes: int = param(1024, "longest packet payload; longer rows are split",
                                  lo=1, hi=1 << 16)

    def check(self):
        super().check()
        if not self.row_elems:
            raise ConfigError("row_elems", "must be at least 1 (rows of any length: set count "
                              "and give the longest row)", value=self.row_elems)

    def derived(self):
        f = self.format
        return {"beat_bytes": f.beat_bytes, "row_bytes": f.row_bytes,
                "buffer_bytes": f.beat_bytes + self.data_bits // 8,
                "packets_per_row": -(-f.row_bytes // self.max_packet_bytes)}


def _parse_value(key, text, where):
    kind = type(getattr(RowFormat, key))
    if kind is str:
        return text
    if kind is bool:
        low = text.strip().lower()
        if low in ("1", "true", "yes", "on"):
            return True
        if low in ("0", "false", "no", "off"):
            return False
        raise ConfigError(where, f"{key} must be true or false", value=text)
    if not re.fullmatch(r"[0-9]+", text.strip()):
        raise ConfigError(where, f"{key} must be a decimal integer", value=text)
    return int(text.strip())


@dataclass(frozen=True)
class Source(Record):
    """One source of :class:`PacketsToRowsConfig`: kernel id ``id`` (TID) and the row-format
    parameters that differ from the configuration's (None: the configuration's value)."""
    id: int
    field: str = None
    lanes: int = None
    elem_bits: int = None
    field_bits: int = None
    signed: bool = None
    row_elems: int = None
    count: bool = None
    rows: int = None
    array: bool = None

    def check(self):
        if not isinstance(self.id, int) or isinstance(self.id, bool) or \
                not 0 <= self.id <= 255:
            raise ValueError("a source id must be an integer in 0..255")
        for key in FORMAT_KEYS:
            value = getattr(self, key)
            want = type(getattr(RowFormat, key))
            if value is not None and (type(value) is not want):
                raise ValueError(f"{key} must be {want.__name__}")

    @property
    def overrides(self):
        """``{format key: value}`` of the parameters this source sets."""
        return {k: getattr(self, k) for k in FORMAT_KEYS if getattr(self, k) is not None}

    def to_json(self):
        """``{"id", <overridden format keys>}``."""
        return {"id": self.id, **self.overrides}

    @classmethod
    def parse(cls, entry):
        """One entry of the text form: ``id[:key=value...]`` (``4:field=p:lanes=3``)."""
        head, *pairs = entry.strip().split(":")
        if not re.fullmatch(r"[0-9]{1,3}", head.strip()):
            raise ValueError(f"{entry!r}: a source id must be an integer in 0..255")
        changes = {}
        for pair in pairs:
            key, sep, text = pair.partition("=")
            key = key.strip()
            if not sep or key not in FORMAT_KEYS:
                raise ValueError(f"{pair!r}: expected key=value with key one of "
                                 + ", ".join(FORMAT_KEYS))
            changes[key] = _parse_value(key, text, "sources")
        return cls(int(head), **changes)


def parse_sources(text):
    """The text form of :attr:`PacketsToRowsConfig.sources` (``'id[:key=value...],...'``)
    as :class:`Source` records."""
    out = []
    for k, entry in enumerate(text.split(",")):
        try:
            out.append(Source.parse(entry))
        except ConfigError as e:
            raise ConfigError(f"sources[{k}]", e.reason, value=entry) from None
        except ValueError as e:
            raise ConfigError(f"sources[{k}]", str(e), value=entry) from None
    return tuple(out)


def _parse_depths(text):
    return tuple(int(v) for v in text.split(",") if v.strip())


@dataclass(frozen=True)
class PacketsToRowsConfig(_FormatConfig):
    """``cluster-pkt2row``: packets from ``sources`` to one row stream each
    (:class:`PacketsToRows`)."""
    sources: tuple = param((Source(1), Source(2)),
                           "source kernels, one output o_<k> each: [{id[, format keys]}, ...]; "
                           "format keys override the row format for that source (--set: "
                           "'id[:key=value...],...', e.g. '4:field=p:lanes=3,5:field=v')",
                           item=Source, parse=parse_sources)
    fifo_depth: int = param(16, "packet beats buffered per source", lo=2, hi=1 << 20)
    fifo_depths: tuple = param((), "per-source FIFO depths in beats, in the order of sources "
                                   "(empty: fifo_depth for every source; --set: 'd0,d1,...')",
                               item=int, lo=2, hi=1 << 20, parse=_parse_depths)

    @property
    def depths(self):
        """The FIFO depth of each source, in ``sources`` order."""
        if not self.fifo_depths:
            return [self.fifo_depth] * len(self.sources)
        return list(self.fifo_depths)

    @property
    def source_formats(self):
        """``[(tid, RowFormat), ...]`` in output order."""
        out = []
        for k, source in enumerate(self.sources):
            fmt = replace(self.format, **source.overrides)
            fmt.check(f"sources[{k}]")
            out.append((source.id, fmt))
        return out

    def check(self):
        super().check()
        if self.fifo_depths and len(self.fifo_depths) != len(self.sources):
            raise ConfigError("fifo_depths", f"needs {len(self.sources)} depths (one per "
                              "source)", value=list(self.fifo_depths))
        ids = [tid for tid, _ in self.source_formats]
        if len(set(ids)) != len(ids):
            raise ConfigError("sources", "source ids must differ", value=ids)
        if not ids or len(ids) > 16:
            raise ConfigError("sources", "1 to 16 sources", value=ids)

    def derived(self):
        return {"outputs": {f"o_{k}": {"tid": tid, "beat_bytes": f.beat_bytes,
                                       "row_bytes": f.row_bytes}
                            for k, (tid, f) in enumerate(self.source_formats)}}


# -- golden model ----------------------------------------------------------------------------
