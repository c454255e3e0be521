"""Packet traffic for the router and gateway tests: good packets mixed with malformed ones
(every kind of :data:`hwgen.cluster.spec.packet.MALFORMED_KINDS` and unknown destinations), and the
golden bookkeeping of what a :class:`~hwgen.cluster.gateware.switch.PacketFilter` drops and passes.

The expected outcome of every beat group is never taken from how it was generated: it is
recomputed by :func:`hwgen.cluster.spec.packet.classify` on the beat stream as the hardware sees it
(split at TLAST), then the destination check.
"""

import numpy as np

from ..spec.packet import INTER_CLUSTER_BIT, MALFORMED_KINDS, classify, split_packets
from ..spec.switch import DROP_KINDS, status_name

__all__ = ["malform", "fuzz_stream", "filter_golden", "counter_report", "status_lines",
           "StatusLines", "FUZZ_KINDS"]


#: What the fuzzer makes: the malformations plus a well-formed packet to an unknown
#: destination (``make_unknown``).
FUZZ_KINDS = MALFORMED_KINDS + ("unknown",)


def malform(kind, beats, other, rng, data_bits, max_beats):
    """A corrupted copy of the beat list ``beats`` (a good packet); ``other`` is the beat list
    of another good packet with a different TDEST/TID/TUSER (for ``tlast-missing``)."""
    lanes = data_bits // 8
    full = (1 << lanes) - 1
    beats = [dict(b) for b in beats]
    if kind == "zero-length":
        k = int(rng.integers(len(beats)))
        beats[k]["keep"] = 0
    elif kind == "bad-keep":
        k = int(rng.integers(len(beats)))
        hole = int(rng.integers(1, lanes - 1))
        if not beats[k]["last"] and rng.random() < 0.5:     # contiguous, short before TLAST
            beats[k]["keep"] = (1 << int(rng.integers(1, lanes))) - 1
        else:                                               # a hole
            beats[k]["keep"] = full & ~(1 << hole)
    elif kind == "tlast-missing":
        beats[-1]["last"] = 0
        if beats[-1]["keep"] != full:       # keep the lost TLAST the only fault
            beats[-1]["keep"] = full
        beats = beats + [dict(b) for b in other]
    elif kind == "too-long":
        extra = int(rng.integers(1, 4))
        while len(beats) < max_beats + extra:
            beats[-1]["last"] = 0
            beats[-1]["keep"] = full
            nxt = dict(beats[-1], data=int(rng.integers(0, 1 << 62)), last=1)
            beats.append(nxt)
    elif kind == "truncated":
        b = dict(beats[0], keep=1, last=1)
        b["user"] |= 1 << INTER_CLUSTER_BIT
        beats = [b]
    else:
        raise ValueError(kind)
    return beats


def fuzz_stream(rng, n, make_good, make_unknown, data_bits, max_beats, fraction=0.3,
                last_good=None, make_victim=None):
    """Beats of ``n`` packets; each is malformed with probability ``fraction`` (kinds of
    :data:`FUZZ_KINDS` uniformly), else ``make_good(rng)``'s beats. ``last_good`` (a
    callable) makes the final packet (e.g. one to the result port, so the status counters
    sampled at its TLAST are final); ``make_victim`` (default ``make_good``) makes the good
    packets that get corrupted."""
    make_victim = make_victim or make_good
    beats = []
    for k in range(n):
        if k == n - 1 and last_good is not None:
            beats += last_good(rng)
            continue
        if rng.random() >= fraction:
            beats += make_good(rng)
            continue
        kind = FUZZ_KINDS[int(rng.integers(len(FUZZ_KINDS)))]
        if kind == "unknown":
            beats += make_unknown(rng)
            continue
        good = make_victim(rng)
        other = make_victim(rng)
        while all(other[0][f] == good[0][f] for f in ("dest", "id", "user")):
            other = [dict(b, id=(b["id"] + 1) % 256) for b in other]
        beats += malform(kind, good, other, rng, data_bits, max_beats)
    return beats


def filter_golden(beats, data_bits, max_beats, lookup):
    """What a :class:`PacketFilter` does with a beat stream: ``(passed, counts)``, where
    ``passed`` is a list of ``(beat list, info)`` for delivered packets (``lookup(first beat)``
    returns ``None`` for an unknown destination, else the packet's ``info``) and ``counts``
    maps ``delivered`` and every kind of :data:`~hwgen.cluster.spec.switch.DROP_KINDS` to a
    count."""
    counts = {"delivered": 0, **{k: 0 for k in DROP_KINDS}}
    passed = []
    for group in split_packets(beats):
        kind = classify(group, data_bits, max_beats)
        info = lookup(group[0]) if kind is None else None
        if kind is None and info is None:
            kind = "unknown"
        if kind is not None:
            counts[kind] += 1
        else:
            counts["delivered"] += 1
            passed.append((group, info))
    return passed, counts


def sample_signals():
    """Names of a :class:`~hwgen.cluster.gateware.switch.PacketFilter`'s counter outputs
    (``status_delivered`` and one drop counter per kind of
    :data:`~hwgen.cluster.spec.switch.DROP_KINDS`), for a model's ``sample_signals``."""
    return ("status_delivered",) + tuple(status_name(k) for k in DROP_KINDS)


def counter_report(expected_counts, summary, samples, names=None):
    """Model ``report``: the counters sampled after the result port's last TLAST against the
    golden counts (``names`` maps a count's key to its signal; default the
    :class:`~hwgen.cluster.gateware.switch.PacketFilter` counters); a difference adds to
    ``mismatches`` (so ``hwgen sim`` fails)."""
    names = names or {"delivered": "status_delivered",
                      **{k: status_name(k) for k in DROP_KINDS}}
    if not samples:
        return {"counter_mismatches": 1, "mismatches": summary["mismatches"] + 1,
                "status": None, "status_expected": expected_counts}
    last = samples[-1]
    got = {key: last[sig] for key, sig in names.items()}
    bad = sum(got[k] != expected_counts[k] for k in got)
    out = {"status": got, "status_expected": expected_counts, "counter_mismatches": bad}
    if bad:
        out["mismatches"] = summary["mismatches"] + bad
        out["first_mismatches"] = summary["first_mismatches"] + [
            {"port": "status", "expected": expected_counts, "received": got}]
    return out


def random_payload(rng, lo, hi):
    """``lo`` .. ``hi`` (inclusive) random bytes, the length drawn uniformly."""
    return rng.integers(0, 256, int(rng.integers(lo, hi, endpoint=True)),
                        dtype=np.uint8).tobytes()


def status_lines(result):
    """``hwgen sim``'s lines for the status counters: dropped (per kind, total) and delivered,
    sampled from the simulation, beside the golden model's."""
    want, got = result["status_expected"], result.get("status") or {}
    dropped = {k: v for k, v in want.items() if k != "delivered" and k != "rounds"}
    total = sum(want[k] for k in dropped)
    got_total = sum(got.get(k, 0) for k in dropped) if got else None
    return [f"  status counters (simulation / golden): delivered {got.get('delivered', '-')}"
            f" / {want.get('delivered', '-')}, dropped {got_total} / {total}"
            + ("" if got and all(got.get(k) == v for k, v in want.items() if k in got)
               else "  MISMATCH"),
            "    dropped by kind: " + ", ".join(
                f"{k} {got.get(k, '-')}/{v}" for k, v in dropped.items() if v or got.get(k))]


class StatusLines:
    """Mixin of the stream models whose ``report`` carries status counters
    (``status_expected``, :func:`counter_report`): ``hwgen sim`` prints
    :func:`status_lines`."""

    @staticmethod
    def report_lines(config, result):
        """:func:`status_lines` of ``result`` (none without sampled counters)."""
        return status_lines(result) if "status_expected" in result else []
