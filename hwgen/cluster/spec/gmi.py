"""Configuration of the GMI collective kernels (:mod:`hwgen.cluster.gateware.gmi` describes the
datapath, ports and timing; :mod:`hwgen.cluster.golden.collectives` the golden model): group,
message size, reduce operation, ids and buffered rounds, with each kind's buffer geometry and
its cycle model."""

from dataclasses import dataclass

from ...config import Config, param
from ...errors import ConfigError
from ...lib.intmath import ceil_div
from .describe import GMI_KINDS as KINDS, GmiKind

__all__ = ["GMIConfig"]


#: Reduce operations (:func:`hwgen.cluster.golden.collectives.reduce`).
OPS = ("sum", "max")
MAX_BUFFER_BITS = 1 << 22


@dataclass(frozen=True)
class GMIConfig(Config):
    """Configuration of a GMI collective kernel (:class:`Broadcast`, :class:`Scatter`,
    :class:`Gather`, :class:`Reduce`; one configuration serves all four): the group
    (``members`` kernel ids from ``first_member``), the message size (``length`` elements of
    ``elem_bits``), the reduce ``op``, the packet width ``data_bits``, the ids the kernel
    sends with (``kernel_id``, ``cluster_id``, ``root``) and the rounds it buffers
    (``depth``)."""
    members: int = param(4, "group size: member kernel ids first_member .. first_member + "
                         "members - 1 (MPI ranks 0 .. members - 1)", lo=1, hi=255)
    length: int = param(16, "elements per member message (scatter's input is members * "
                        "length elements, gather's output the same)", lo=1, hi=4096)
    elem_bits: int = param(8, "bits of an element (signed, little-endian)", choices=(8, 16, 32))
    op: str = param("sum", "reduce operation: sum (wraps around modulo 2**elem_bits) or max "
                    "(signed)", choices=OPS)
    data_bits: int = param(64, "TDATA bits of the packet streams", choices=(64, 512))
    kernel_id: int = param(5, "this GMI kernel's own kernel id (TID of what it sends)",
                           lo=0, hi=255)
    first_member: int = param(1, "kernel id of member (rank) 0", lo=0, hi=255)
    root: int = param(0, "kernel id receiving gather/reduce results", lo=0, hi=255)
    cluster_id: int = param(0, "this cluster's id, sent in TUSER bits 15:8", lo=0, hi=255)
    depth: int = param(2, "rounds buffered (a member may run this many rounds ahead of the "
                       "oldest incomplete round; a round waits here while being sent)",
                       lo=1, hi=4096)

    def check(self):
        last = self.first_member + self.members - 1
        if last > 255:
            raise ConfigError("members", f"member ids {self.first_member}..{last} must be "
                              "kernel ids <= 255 (first_member + members - 1)",
                              value=self.members)
        for kind in KINDS:
            bits = self.buffer_bits(kind)
            if bits > MAX_BUFFER_BITS:
                raise ConfigError("length", f"buffer of {kind} would need {bits} bits "
                                  f"(depth x members x length x elem_bits); at most "
                                  f"{MAX_BUFFER_BITS}", value=self.length)

    @property
    def member_ids(self):
        """Kernel ids of the members in rank order (``first_member .. first_member + members
        - 1``)."""
        return list(range(self.first_member, self.first_member + self.members))

    @property
    def lanes(self):
        """Elements per beat."""
        return self.data_bits // self.elem_bits

    def geometry(self, kind):
        """Sizes of ``kind``'s datapath: ``in_elems`` per arriving message, ``in_beats`` per
        message, ``slots`` (messages per round), ``out_elems``/``out_beats`` per sent packet,
        ``out_packets`` per round, ``rows`` (buffer words per round and lane bank)."""
        L, M, n = self.lanes, self.members, self.length
        in_elems = M * n if kind == "scatter" else n
        out_elems = M * n if kind == "gather" else n
        in_beats = ceil_div(in_elems, L)
        slots = M if GmiKind(kind).fan_in else 1
        rows = {"broadcast": in_beats, "scatter": in_beats, "gather": ceil_div(M * n, L),
                "reduce": M * in_beats}[kind]
        return {"in_elems": in_elems, "in_beats": in_beats, "slots": slots,
                "out_elems": out_elems, "out_beats": ceil_div(out_elems, L),
                "out_packets": M if GmiKind(kind).fan_out else 1, "rows": rows}

    def buffer_bits(self, kind):
        """Bits of round buffer that kernel ``kind`` needs: ``depth`` rounds of
        ``geometry(kind)["rows"]`` words of ``data_bits``."""
        return self.depth * self.geometry(kind)["rows"] * self.data_bits

    def round_cycles(self, kind):
        """Steady-state cycles per round with an always-ready output and inputs back to back:
        the larger of the input beats of a round and the output engine's cycles (one per
        output beat; ``members`` per output beat for reduce, which reads each member's word),
        plus the output engine's restart cycle between rounds. For ``depth >= 2``; with
        ``depth = 1`` a round's input waits for the previous round's output to be read."""
        g = self.geometry(kind)
        inp = g["slots"] * g["in_beats"]
        out = self.members * g["in_beats"] if kind == "reduce" else \
            g["out_packets"] * g["out_beats"]
        return max(inp, out + 1)

    def cycles(self, kind, rounds):
        """Cycles from the first input beat to the last output beat for ``rounds`` rounds
        whose packets arrive back to back round by round (members in order, ``hwgen sim
        --stall 0`` with ``interleave=False``), for ``depth >= 2``: the output of a round
        starts 3 cycles after its last input beat, and rounds follow each other at the
        input's pace or at the output engine's (``out + 1`` cycles), whichever is slower."""
        if self.depth < 2:
            return None
        g = self.geometry(kind)
        inp = g["slots"] * g["in_beats"]
        out = self.members * g["in_beats"] if kind == "reduce" else \
            g["out_packets"] * g["out_beats"]
        return max(rounds * inp + out + 3, inp + rounds * (out + 1) + 2)

    def derived(self):
        return {kind: {**self.geometry(kind), "buffer_bits": self.buffer_bits(kind),
                       "round_cycles": self.round_cycles(kind)} for kind in KINDS}
