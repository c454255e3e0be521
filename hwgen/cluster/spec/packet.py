"""Galapagos packet format and its golden model (multi-FPGA I-BERT paper, sections 2.1, 4, 5.2).

A *packet* is one AXI-Stream frame (TVALID ... TLAST) between kernels:

=========  ===========================================================================
signal     meaning
=========  ===========================================================================
TDATA      ``data_bits`` (64 or 512) of payload, byte 0 in bits 7:0 of the first beat
TKEEP      one bit per TDATA byte; all ones except in the last beat, whose valid bytes
           are the lowest ones (``0b0000_0111``: three bytes). A packet has >= 1 byte.
TLAST      set on the last beat of the packet
TDEST      8 bits. Intra-cluster (TUSER bit 16 = 0): the destination kernel id inside the
           cluster. Inter-cluster (bit 16 = 1): the destination *cluster* id; the packet
           goes to that cluster's gateway kernel (kernel 0).
TID        8 bits: the source kernel id (inside its own cluster)
TUSER      17 bits: bit 16 = inter-cluster flag (the paper's Fig. 4); bits 15:8 = the
           source cluster id; bits 7:0 reserved (0)
=========  ===========================================================================

Inter-cluster packets carry the one-byte **GMI header** as payload byte 0: the destination
kernel id inside the destination cluster (a compute kernel or one of the gateway's virtual GMI
kernels). Intra-cluster packets have no header. TDEST, TID and TUSER are the same on every beat
of a packet.

Malformed traffic, as the gateway and router classify it (see :func:`classify`): a beat with
TKEEP = 0 (*zero-length*), TKEEP not of the form ``2**n - 1`` or not all ones before TLAST
(*bad-keep*), TDEST/TID/TUSER changing inside a packet (*TLAST missing*: the beats of the next
packet ran into this one), a packet longer than ``max_beats`` (*too-long*, also what a missing
TLAST turns into), an inter-cluster packet without a byte after its header (*truncated*).
"""

from dataclasses import dataclass, field, replace

from amaranth.lib import data

__all__ = ["DEST_BITS", "ID_BITS", "USER_BITS", "INTER_CLUSTER_BIT", "Packet", "packet_layout",
           "to_beats", "from_beats", "split_packets", "attach_header", "strip_header", "classify",
           "MALFORMED_KINDS"]


DEST_BITS = 8
ID_BITS = 8
USER_BITS = 17
INTER_CLUSTER_BIT = 16
SRC_CLUSTER_SHIFT = 8

MALFORMED_KINDS = ("zero-length", "bad-keep", "tlast-missing", "too-long", "truncated")


def packet_layout(data_bits):
    """Stream payload of packet ports: ``data``, ``keep``, ``dest``, ``id``, ``user``, ``last``
    (the flow maps ``keep``/``dest``/``id``/``user`` to TKEEP/TDEST/TID/TUSER)."""
    if data_bits % 8 or data_bits < 8:
        raise ValueError("data_bits must be a positive multiple of 8")
    return data.StructLayout({"data": data_bits, "keep": data_bits // 8, "dest": DEST_BITS,
                              "id": ID_BITS, "user": USER_BITS, "last": 1})


@dataclass(frozen=True)
class Packet:
    """One message: ``payload`` bytes from kernel ``src`` to ``dest`` (a kernel id, or a
    cluster id when ``inter_cluster``)."""
    dest: int
    src: int
    payload: bytes
    inter_cluster: bool = False
    src_cluster: int = 0
    meta: dict = field(default_factory=dict, compare=False)

    @property
    def user(self):
        """TUSER of the packet's beats: the inter-cluster flag in bit 16, the source cluster
        in bits 15:8."""
        return (int(self.inter_cluster) << INTER_CLUSTER_BIT) | \
            (self.src_cluster << SRC_CLUSTER_SHIFT)

    def beats(self, data_bits):
        """The packet's beats on a ``data_bits`` stream (:func:`to_beats`)."""
        return to_beats(self, data_bits)


def to_beats(packet, data_bits):
    """The packet's beats as payload dicts (``data``, ``keep``, ``dest``, ``id``, ``user``,
    ``last``)."""
    lanes = data_bits // 8
    body = bytes(packet.payload)
    if not body:
        raise ValueError("a packet carries at least one byte")
    beats = []
    for k in range(0, len(body), lanes):
        chunk = body[k:k + lanes]
        beats.append({"data": int.from_bytes(chunk, "little"), "keep": (1 << len(chunk)) - 1,
                      "dest": packet.dest, "id": packet.src, "user": packet.user,
                      "last": int(k + lanes >= len(body))})
    return beats


def _keep_bytes(keep):
    n = keep.bit_length()
    return n if keep == (1 << n) - 1 else None


def from_beats(beats, data_bits):
    """The packet of a well-formed beat list (inverse of :func:`to_beats`)."""
    kind = classify(beats, data_bits)
    if kind is not None:
        raise ValueError(f"malformed packet: {kind}")
    lanes = data_bits // 8
    body = b"".join(int(b["data"]).to_bytes(lanes, "little")[:_keep_bytes(b["keep"])]
                    for b in beats)
    user = beats[0]["user"]
    return Packet(beats[0]["dest"], beats[0]["id"], body,
                  inter_cluster=bool(user >> INTER_CLUSTER_BIT & 1),
                  src_cluster=(user >> SRC_CLUSTER_SHIFT) & 0xFF)


def split_packets(beats):
    """Group a beat stream into packets at TLAST (a trailing packet without TLAST is kept)."""
    packets, current = [], []
    for beat in beats:
        current.append(beat)
        if beat["last"]:
            packets.append(current)
            current = []
    if current:
        packets.append(current)
    return packets


def classify(beats, data_bits, max_beats=None):
    """``None`` for a well-formed packet, else the malformation (one of
    :data:`MALFORMED_KINDS`), checked in that order beat by beat."""
    full = (1 << (data_bits // 8)) - 1
    head = beats[0]
    for k, beat in enumerate(beats):
        if beat["keep"] == 0:
            return "zero-length"
        if _keep_bytes(beat["keep"]) is None or (not beat["last"] and beat["keep"] != full):
            return "bad-keep"
        if any(beat[f] != head[f] for f in ("dest", "id", "user")):
            return "tlast-missing"
        if max_beats is not None and k >= max_beats:
            return "too-long"
    if not beats[-1]["last"]:
        return "tlast-missing"
    if head["user"] >> INTER_CLUSTER_BIT & 1 and len(beats) == 1 \
            and _keep_bytes(head["keep"]) < 2:
        return "truncated"
    return None


def attach_header(packet, dest_cluster, dest_kernel, src_cluster=0):
    """What the GMI header attacher sends: the one-byte header (``dest_kernel``) before the
    payload, TDEST = ``dest_cluster``, the inter-cluster flag set."""
    return replace(packet, dest=dest_cluster, payload=bytes([dest_kernel]) + packet.payload,
                   inter_cluster=True, src_cluster=src_cluster)


def strip_header(packet):
    """What the gateway's packet decoder makes of an inter-cluster packet: TDEST = the header
    byte, payload without it, the inter-cluster flag cleared (the source cluster kept)."""
    if not packet.inter_cluster or len(packet.payload) < 2:
        raise ValueError("not an inter-cluster packet with a payload")
    return replace(packet, dest=packet.payload[0], payload=packet.payload[1:],
                   inter_cluster=False)
