"""Golden model of the GMI collectives (multi-FPGA I-BERT paper, section 5).

Two levels:

* **MPI semantics on arrays** (:func:`bcast`, :func:`scatter`, :func:`gather`, :func:`reduce`,
  :func:`allgather`), rank ``i`` = member ``i`` of the group:

  - ``MPI_Bcast``: every rank receives the root's buffer unchanged.
  - ``MPI_Scatter``: the root's buffer of ``members * length`` elements is split into
    ``members`` equal consecutive chunks; rank ``i`` receives chunk ``i`` (elements
    ``i * length .. i * length + length - 1``).
  - ``MPI_Gather``: the root receives the ranks' buffers concatenated in rank order.
  - ``MPI_Reduce``: the root receives the elementwise ``op`` over the ranks' buffers.
    ``sum`` **wraps around** (two's complement, modulo ``2**elem_bits``, as ``MPI_SUM`` on
    ``MPI_INT8_T``/``MPI_INT16_T``/``MPI_INT32_T`` does with Open MPI on every platform we
    know); ``max`` is the signed maximum. Elements are signed ``elem_bits`` integers.
  - ``MPI_Allgather`` = gather to a root, then broadcast of the gathered buffer (the paper's
    composition, section 5.1).

* **Packet streams** (:func:`collective_stream`): what a GMI kernel of
  :mod:`hwgen.cluster.gateware.gmi` sends for a sequence of arriving
  :class:`~hwgen.cluster.spec.packet.Packet`\\ s, including its drop rules and status counters.
  Packets are processed in arrival order:

  1. *source*: gather/reduce accept only packets whose source (TID) is a member
     (``first_member .. first_member + members - 1``); others are dropped
     (``drop_source``). Broadcast and scatter accept any source.
  2. *overrun*: gather/reduce buffer ``depth`` rounds. A member's ``n``-th accepted packet
     belongs to round ``n``. A packet from a member that is already ``depth`` rounds ahead of
     the oldest incomplete round (``n_member - min(n) >= depth``) is dropped
     (``drop_overrun``): waiting for it could deadlock, since the packets completing the
     oldest round may be behind it on the same stream. (When the oldest round is complete and
     only waiting to be sent, the hardware stalls instead; that never changes the result.)
  3. *length*: a packet of any length other than the message size (``length`` elements, or
     ``members * length`` for scatter) is dropped (``drop_length``).
  4. Otherwise the packet is accepted; once every member (one sender for broadcast/scatter)
     has a packet for the oldest incomplete round, that round's result is sent: broadcast
     ``members`` packets in member order, scatter ``members`` chunks in member order, gather
     and reduce one packet to ``root``. Rounds are sent in order.

  Every packet sent has TID = ``kernel_id``, the inter-cluster flag clear and source cluster
  ``cluster_id``.
"""

import numpy as np

from ..spec.describe import GMI_KINDS, GmiKind
from ..spec.gmi import OPS
from ..spec.packet import Packet

__all__ = ["OPS", "KINDS", "STATUS", "wrap", "to_elems", "from_elems", "bcast", "scatter",
           "gather", "reduce", "allgather", "message_elems", "collective_stream",
           "gateway_collective"]


KINDS = GMI_KINDS
STATUS = ("rounds", "drop_source", "drop_length", "drop_overrun")

_DTYPES = {8: "<i1", 16: "<i2", 32: "<i4"}


def wrap(x, bits):
    """Two's complement wrap-around of int64 values to signed ``bits``."""
    x = np.asarray(x, dtype=np.int64)
    half = 1 << (bits - 1)
    return ((x + half) & ((1 << bits) - 1)) - half


def to_elems(payload, bits):
    """Little-endian signed ``bits`` elements of a payload (int64 array)."""
    if len(payload) % (bits // 8):
        raise ValueError(f"payload of {len(payload)} bytes is not a whole number of "
                         f"{bits}-bit elements")
    return np.frombuffer(bytes(payload), dtype=_DTYPES[bits]).astype(np.int64)


def from_elems(values, bits):
    """Payload bytes of signed ``bits`` elements (wrapped)."""
    return wrap(values, bits).astype(_DTYPES[bits]).tobytes()


# -- MPI semantics ---------------------------------------------------------------------------

def bcast(buf, members):
    """MPI_Bcast: each of ``members`` ranks gets a copy of the root's ``buf``."""
    return [np.array(buf, dtype=np.int64) for _ in range(members)]


def scatter(buf, members):
    """MPI_Scatter: ``buf`` split into ``members`` equal consecutive chunks, chunk i to rank i."""
    buf = np.asarray(buf, dtype=np.int64)
    if len(buf) % members:
        raise ValueError("scatter: buffer length must be a multiple of members")
    n = len(buf) // members
    return [buf[i * n:(i + 1) * n].copy() for i in range(members)]


def gather(bufs):
    """MPI_Gather: the ranks' buffers concatenated in rank order (at the root)."""
    return np.concatenate([np.asarray(b, dtype=np.int64) for b in bufs])


def reduce(bufs, op, bits):
    """MPI_Reduce: elementwise ``op`` over the ranks' buffers; ``sum`` wraps to signed
    ``bits``, ``max`` is signed."""
    stack = np.stack([np.asarray(b, dtype=np.int64) for b in bufs])
    if op == "sum":
        return wrap(stack.sum(axis=0), bits)
    if op == "max":
        return stack.max(axis=0)
    raise ValueError(f"op must be one of {OPS}")


def allgather(bufs):
    """MPI_Allgather as GMI composes it: gather at a root, then broadcast the result."""
    return bcast(gather(bufs), len(bufs))


# -- packet streams ----------------------------------------------------------------------------

def message_elems(kind, config):
    """Elements of one arriving message (``members * length`` for scatter)."""
    return config.members * config.length if kind == "scatter" else config.length


def _out(config, dest, values):
    return Packet(dest, config.kernel_id, from_elems(values, config.elem_bits),
                  src_cluster=config.cluster_id)


def _result(kind, config, bufs):
    c = config
    ids = range(c.first_member, c.first_member + c.members)
    if kind == "broadcast":
        return [_out(c, d, v) for d, v in zip(ids, bcast(bufs[0], c.members))]
    if kind == "scatter":
        return [_out(c, d, v) for d, v in zip(ids, scatter(bufs[0], c.members))]
    if kind == "gather":
        return [_out(c, c.root, gather(bufs))]
    return [_out(c, c.root, reduce(bufs, c.op, c.elem_bits))]


def collective_stream(kind, config, packets):
    """Packets a GMI kernel of ``kind`` sends for ``packets`` arriving in this order, and its
    status counters (:data:`STATUS`); rules in the module docstring.

    ``config`` needs ``members``, ``length``, ``elem_bits``, ``op``, ``kernel_id``,
    ``first_member``, ``root``, ``cluster_id`` and ``depth`` (a
    :class:`hwgen.cluster.spec.gmi.GMIConfig`).
    """
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}")
    c = config
    multi = GmiKind(kind).fan_in
    slots = c.members if multi else 1
    nbytes = message_elems(kind, c) * c.elem_bits // 8
    accepted = [0] * slots
    pending = [[] for _ in range(slots)]       # per slot: element arrays of unsent rounds
    status = dict.fromkeys(STATUS, 0)
    out = []
    for p in packets:
        if multi:
            slot = p.src - c.first_member
            if not 0 <= slot < c.members:
                status["drop_source"] += 1
                continue
        else:
            slot = 0
        if accepted[slot] - min(accepted) >= c.depth:
            status["drop_overrun"] += 1
            continue
        if len(p.payload) != nbytes:
            status["drop_length"] += 1
            continue
        accepted[slot] += 1
        pending[slot].append(to_elems(p.payload, c.elem_bits))
        if all(pending):
            out += _result(kind, c, [q.pop(0) for q in pending])
            status["rounds"] += 1
    return out, status


def gateway_collective(config, kind, packets):
    """What a gateway's virtual kernel ``kind`` (its
    :class:`~hwgen.cluster.spec.gateway.GatewayConfig` ``config``) sends for ``packets`` (in
    arrival order), TDEST remapped to the member ids, and its status counters
    (:func:`collective_stream` at the kernel's :meth:`GatewayConfig.gmi_config`)."""
    cfg = config.gmi_config(kind)
    sent, status = collective_stream(kind, cfg, packets)
    if config.remapped(kind) and GmiKind(kind).fan_out:
        ids = config.member_ids(kind)
        sent = [Packet(ids[p.dest - cfg.first_member], p.src, p.payload,
                       p.inter_cluster, p.src_cluster) for p in sent]
    return sent, status
