"""Stream payload formats: how a payload's named fields are packed into AXI-Stream TDATA.

A stream payload is a flat :class:`amaranth.lib.data.StructLayout` whose fields are scalars or
one-dimensional :class:`~amaranth.lib.data.ArrayLayout`\\ s of scalars. A field named ``last``
(1 bit) travels on TLAST. In a *packet stream* (a payload with a field named ``keep``, see
:mod:`hwgen.cluster.spec.packet`) the unsigned scalar fields ``keep``, ``dest``, ``id`` and ``user``
travel on TKEEP, TDEST, TID and TUSER; in other streams those names are ordinary fields. Every
other field is packed into TDATA in declaration order, least significant bits first, array
element 0 lowest. A stream with a ``keep`` field has one TKEEP bit per TDATA byte. TDATA is padded with zeros to a whole number of
bytes. :class:`StreamFormat` records this and packs/unpacks beats on the host side; it is written
into ``ports.json`` so that drivers outside hwgen can do the same.
"""

from dataclasses import dataclass

from amaranth.hdl import Shape
from amaranth.lib import data

__all__ = ["Field", "StreamFormat", "SIDEBANDS"]

#: Payload field name -> the AXI-Stream sideband signal that carries it.
SIDEBANDS = {"keep": "tkeep", "dest": "tdest", "id": "tid", "user": "tuser"}


@dataclass(frozen=True)
class Field:
    """One payload field: ``count`` elements of ``bits`` each, starting at TDATA bit ``offset``."""
    name: str
    offset: int
    bits: int
    count: int = 1          # 1 for a scalar; array length otherwise
    signed: bool = False
    array: bool = False

    @property
    def width(self):
        """Bits the field occupies in TDATA: ``bits * count``."""
        return self.bits * self.count

    def to_dict(self):
        """JSON form, as written into ``ports.json``."""
        return {"name": self.name, "offset": self.offset, "bits": self.bits,
                "count": self.count, "signed": self.signed, "array": self.array}


def _scalar(shape, where):
    if isinstance(shape, data.Layout):
        raise TypeError(f"{where}: nested layouts are not supported in stream payloads")
    shape = Shape.cast(shape)
    return shape.width, shape.signed


@dataclass(frozen=True)
class StreamFormat:
    """Packing of one stream's payload (see module docstring)."""
    fields: tuple
    tdata_bits: int
    has_last: bool
    sidebands: tuple = ()   # ((field name, bits), ...) carried on TKEEP/TDEST/TID/TUSER

    @classmethod
    def from_shape(cls, shape):
        """Describe an Amaranth payload layout."""
        if not isinstance(shape, data.StructLayout):
            raise TypeError(f"stream payloads must be data.StructLayout, not {shape!r}")
        fields, offset, has_last, sidebands = [], 0, False, []
        packet = any(name == "keep" for name, _ in shape)
        for name, member in shape:
            if name == "last":
                if member.width != 1:
                    raise TypeError("payload field 'last' must be 1 bit wide")
                has_last = True
                continue
            if packet and name in SIDEBANDS:
                bits, signed = _scalar(member.shape, name)
                if signed:
                    raise TypeError(f"sideband payload field {name!r} must be unsigned")
                sidebands.append((name, bits))
                continue
            sub = member.shape
            if isinstance(sub, data.ArrayLayout):
                bits, signed = _scalar(sub.elem_shape, name)
                fields.append(Field(name, offset, bits, sub.length, signed, array=True))
            else:
                bits, signed = _scalar(sub, name)
                fields.append(Field(name, offset, bits, 1, signed))
            offset += fields[-1].width
        tdata_bits = max(8, -(-offset // 8) * 8)
        keep = dict(sidebands).get("keep")
        if keep is not None and keep * 8 != tdata_bits:
            raise TypeError(f"payload field 'keep' has {keep} bits for {tdata_bits} TDATA bits "
                            "(one per byte expected)")
        return cls(tuple(fields), tdata_bits, has_last, tuple(sidebands))

    @classmethod
    def from_dict(cls, d):
        """Inverse of :meth:`to_dict` (reads a stream of ``ports.json``)."""
        return cls(tuple(Field(**f) for f in d["fields"]), d["tdata_bits"], d["tlast"],
                   tuple((name, bits) for name, bits in d.get("sidebands", {}).items()))

    def to_dict(self):
        """JSON form, as written into ``ports.json``: ``tdata_bits``, ``tlast``, ``fields`` and,
        when there are any, ``sidebands`` (``{field name: bits}``)."""
        out = {"tdata_bits": self.tdata_bits, "tlast": self.has_last,
               "fields": [f.to_dict() for f in self.fields]}
        if self.sidebands:
            out["sidebands"] = {name: bits for name, bits in self.sidebands}
        return out

    @property
    def byte_lanes(self):
        """TKEEP bits (1 when the stream has no ``keep`` field: TDATA is one unit)."""
        return dict(self.sidebands).get("keep", 1)

    @property
    def data_bits(self):
        """Bits of TDATA carrying fields (the rest is zero padding)."""
        return sum(f.width for f in self.fields)

    def field(self, name):
        """The :class:`Field` called ``name``; KeyError if the payload has none (``last`` and
        sideband fields are not TDATA fields)."""
        for f in self.fields:
            if f.name == name:
                return f
        raise KeyError(name)

    # -- host-side packing ---------------------------------------------------------------------

    def pack_sidebands(self, beat):
        """``{signal name (tkeep, tdest, ...): value}`` of a beat's sideband fields."""
        out = {}
        for name, bits in self.sidebands:
            v = int(beat[name])
            if not 0 <= v < 1 << bits:
                raise ValueError(f"field {name} = {v} outside 0..{(1 << bits) - 1}")
            out[SIDEBANDS[name]] = v
        return out

    def pack(self, beat):
        """Pack a beat (mapping field name -> int or sequence of ints) into a TDATA integer
        (sideband fields are left to :meth:`pack_sidebands`).

        Values are checked against their field's range; out-of-range values raise ValueError
        rather than being silently truncated.
        """
        word = 0
        for f in self.fields:
            values = beat[f.name]
            if not f.array:
                values = (values,)
            elif len(values) != f.count:
                raise ValueError(f"field {f.name}: expected {f.count} elements, got {len(values)}")
            lo, hi = (-(1 << (f.bits - 1)), (1 << (f.bits - 1)) - 1) if f.signed \
                else (0, (1 << f.bits) - 1)
            mask = (1 << f.bits) - 1
            for i, v in enumerate(values):
                v = int(v)
                if not lo <= v <= hi:
                    raise ValueError(f"field {f.name}[{i}] = {v} outside {lo}..{hi}")
                word |= (v & mask) << (f.offset + i * f.bits)
        return word

    def unpack(self, word):
        """Inverse of :meth:`pack`: a TDATA integer to a dict of ints / lists of ints."""
        beat = {}
        for f in self.fields:
            mask = (1 << f.bits) - 1
            values = []
            for i in range(f.count):
                v = (word >> (f.offset + i * f.bits)) & mask
                if f.signed and v >> (f.bits - 1):
                    v -= 1 << f.bits
                values.append(v)
            beat[f.name] = values if f.array else values[0]
        return beat
