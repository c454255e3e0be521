"""Configuration of ``cluster-gateway`` (:class:`~hwgen.cluster.gateware.gateway.Gateway`
describes the decoder, switch, virtual GMI kernels and forwarding): the cluster's local kernel
ids, its virtual kernels as typed groups (:class:`GmiGroup`), and each virtual kernel's
:class:`~hwgen.cluster.spec.gmi.GMIConfig`."""

from dataclasses import dataclass

from ...config import Config, Record, param
from ...errors import ConfigError
from .describe import GMI_KINDS, GmiKind
from .gmi import GMIConfig

__all__ = ["GatewayConfig", "GmiGroup", "parse_groups", "GMI_DROPS", "REGISTER_STAGES"]


#: GMI kernel counters compared with the golden model (``rounds`` lags behind output
#: backpressure, so it is reported but not sampled as final).
GMI_DROPS = ("drop_source", "drop_length", "drop_overrun")
#: Cycles the register stages of :class:`~hwgen.cluster.gateware.gateway.Gateway` add to a
#: packet's path: one :class:`~hwgen.lib.pipeline.SkidBuffer` after the decoder's buffer (its
#: read is an asynchronous LUT-RAM read) and one after the header stripper (which passes
#: backpressure straight through), so that neither the buffer's read data nor the switch's
#: routing decision reaches the other side combinationally.
REGISTER_STAGES = 2


def _parse_ids(text):
    """``'1-3,28'`` -> ``(1, 2, 3, 28)``: ids and inclusive ranges (ValueError)."""
    out = []
    for part in filter(None, (t.strip() for t in text.split(","))):
        lo, _, hi = part.partition("-")
        out += range(int(lo), int(hi or lo) + 1)
    return tuple(out)


@dataclass(frozen=True)
class GmiGroup(Record):
    """One virtual GMI kernel of the gateway: its ``kind``, kernel ``id`` and ``members``
    (kernel ids in rank order)."""
    kind: str
    id: int
    members: tuple

    def check(self):
        if self.kind not in GMI_KINDS:
            raise ValueError("kinds are " + ", ".join(GMI_KINDS))
        if not isinstance(self.id, int) or not 1 <= self.id <= 255:
            raise ValueError("a virtual kernel id is in 1..255")
        ids = self.members
        if not ids or any(not isinstance(i, int) or not 0 <= i <= 255 for i in ids) \
                or len(set(ids)) != len(ids):
            raise ValueError("members are distinct ids 0..255, at least one")

    @classmethod
    def parse(cls, item):
        """``'broadcast@39:1-3,28'`` -> ``GmiGroup('broadcast', 39, (1, 2, 3, 28))``."""
        head, sep, members = item.strip().partition(":")
        kind, at, kid = head.partition("@")
        if not sep or not at:
            raise ValueError(f"{item!r} is not 'kind@id:a-b,c,...'")
        return cls(kind.strip(), int(kid), _parse_ids(members))


def parse_groups(text):
    """The text form of :attr:`GatewayConfig.groups`: ``'kind@id:a-b,c;...'``."""
    return tuple(GmiGroup.parse(item) for item in text.split(";") if item.strip())


def _parse_kinds(text):
    return tuple(k.strip() for k in text.split(",") if k.strip())


@dataclass(frozen=True)
class GatewayConfig(Config):
    """Gateway kernel parameters."""
    data_bits: int = param(64, "TDATA width", choices=(64, 512))
    members: int = param(4, "members of the virtual GMI kernels: local kernels 1..members",
                         lo=1, hi=200)
    length: int = param(16, "elements per member message of the GMI kernels", lo=1, hi=4096)
    elem_bits: int = param(8, "GMI element bits", choices=(8, 16, 32))
    op: str = param("sum", "reduce operation", choices=("sum", "max"))
    kernels: int = param(0, "local kernels 1..kernels reachable point to point "
                            "(0: as many as members)", lo=0, hi=250)
    virtual: tuple = param(("broadcast", "scatter", "gather", "reduce"),
                           "virtual GMI kernels, in id order after the local kernels "
                           "(--set: 'broadcast,scatter')", item=str,
                           choices=GMI_KINDS, parse=_parse_kinds)
    cluster_id: int = param(0, "this cluster's id", lo=0, hi=255)
    depth: int = param(2, "rounds buffered per GMI kernel", lo=1, hi=4096)
    local_ids: tuple = param((), "kernel ids reachable point to point (default: 1..kernels; "
                                 "--set: 'a-b,c,...')", item=int, lo=1, hi=255,
                             parse=_parse_ids)
    groups: tuple = param((), "virtual GMI kernels, [{kind, id, members}, ...] (--set: "
                              "'kind@id:a-b,c;...'; default: `virtual`, ids after the local "
                              "kernels, members 1..members); overrides virtual and members",
                          item=GmiGroup, parse=parse_groups)
    max_bytes: int = param(0, "longest point-to-point payload accepted, header excluded "
                              "(0: the largest GMI message)", lo=0, hi=65535)

    def check(self):
        if len(set(self.local_ids)) != len(self.local_ids):
            raise ConfigError("local_ids", "each id at most once", value=list(self.local_ids))
        local = self.local_list
        if self.groups:
            self._check_groups(local)
            return
        kinds = self.virtual_kinds
        if len(set(kinds)) != len(kinds):
            raise ConfigError("virtual", "each kind at most once", value=list(self.virtual))
        if self.kernels and self.kernels < self.members:
            raise ConfigError("kernels", f"must be 0 or >= members ({self.members})",
                              value=self.kernels)
        if self.local_kernels + len(kinds) > 255:
            raise ConfigError("kernels", "local plus virtual kernel ids must fit in 1..255",
                              value=self.kernels)
        if kinds:
            self.gmi_config(kinds[0])       # raises for oversize buffers

    def _check_groups(self, local):
        seen = set(local)
        kinds = []
        for k, group in enumerate(self.groups):
            where = f"groups[{k}]"
            if group.kind in kinds:
                raise ConfigError(where, f"each kind at most once ({group.kind} twice)",
                                  value=group.to_json())
            kinds.append(group.kind)
            if group.id in seen:
                raise ConfigError(where, f"id {group.id} is already a local or virtual kernel",
                                  value=group.to_json())
            seen.add(group.id)
            m = list(group.members)
            if GmiKind(group.kind).fan_in and m != list(range(m[0], m[0] + len(m))):
                raise ConfigError(where, f"{group.kind} members must be contiguous ids",
                                  value=group.to_json())
        for kind in kinds:
            self.gmi_config(kind)           # raises for oversize buffers

    @property
    def local_list(self):
        """Kernel ids reachable point to point (sorted)."""
        if self.local_ids:
            return sorted(self.local_ids)
        return list(range(1, self.local_kernels + 1))

    @property
    def _groups(self):
        if self.groups:
            return [(g.kind, g.id, list(g.members)) for g in self.groups]
        return [(kind, self.local_kernels + 1 + j, list(range(1, self.members + 1)))
                for j, kind in enumerate(self.virtual)]

    @property
    def virtual_kinds(self):
        """The virtual GMI kernels' kinds, in kernel-id order (from ``groups``, else
        ``virtual``)."""
        return [g[0] for g in self._groups]

    @property
    def local_kernels(self):
        """Number of local kernels reachable point to point by default: ``kernels``, or
        ``members`` when that is 0."""
        return self.kernels or self.members

    @property
    def virtual_ids(self):
        """``{kind: kernel id}`` of the virtual GMI kernels."""
        return {k: kid for k, kid, _ in self._groups}

    def member_ids(self, kind):
        """Member kernel ids (rank order) of the virtual kernel ``kind``."""
        return next(m for k, _, m in self._groups if k == kind)

    def remapped(self, kind):
        """True when ``kind``'s members are not contiguous: its GMI kernel then addresses
        ranks ``0 .. n-1`` (``first_member`` 0) and the gateway rewrites TDEST."""
        m = self.member_ids(kind)
        return m != list(range(m[0], m[0] + len(m)))

    def gmi_config(self, kind):
        """The :class:`~hwgen.cluster.spec.gmi.GMIConfig` of the virtual kernel ``kind``: its
        members (ranks from 0 when remapped), kernel id, root 1 and this gateway's element,
        width, cluster and depth parameters. Raises :class:`ConfigError` for an oversize buffer."""
        members = self.member_ids(kind)
        first = 0 if self.remapped(kind) else members[0]
        return GMIConfig(members=len(members), length=self.length, elem_bits=self.elem_bits,
                         op=self.op, data_bits=self.data_bits,
                         kernel_id=self.virtual_ids[kind], first_member=first, root=1,
                         cluster_id=self.cluster_id, depth=self.depth)

    @property
    def max_payload(self):
        """Largest payload (without header) of a legitimate packet: the largest message a
        virtual kernel takes or sends, point-to-point packets the same (or ``max_bytes``)."""
        eb = self.elem_bits // 8
        sizes = [self.length * eb * (len(self.member_ids(k)) if k in ("scatter", "gather")
                                     else 1) for k in self.virtual_kinds]
        return max(sizes + [self.max_bytes or self.length * eb])

    @property
    def max_beats(self):
        """Beats of the longest legitimate packet, :attr:`max_payload` plus the one-byte
        GMI header; the decoder drops longer packets as too long."""
        return -(-(self.max_payload + 1) // (self.data_bits // 8))

    def derived(self):
        return {"virtual_ids": self.virtual_ids, "max_payload": self.max_payload,
                "max_beats": self.max_beats}
