"""Network model for multi-FPGA simulation: several Verilator processes joined over UDP.

Each FPGA top runs in its own simulation process (cocotb on Verilator, ``sim/cluster_tb.py``).
Its network port pair (the router's ``m_axis_net`` / ``s_axis_net``) is bridged to a UDP socket
on loopback: every packet the FPGA sends to the network becomes one datagram to the
:class:`NetworkHub`, which forwards it to the socket of the destination node after a configurable
delay, or drops it with a configurable probability (and logs the drop). Datagrams are JSON:
``{"src": node address, "dst": node address, "seq": n, "beats": [beat dicts]}``; a node first
sends ``{"hello": address}`` so that the hub learns its endpoint.

The host side (:func:`run_cluster`) starts the hub, one thread per FPGA that runs its testbench
(each a separate simulator process), and stops all of them once the traffic has settled: every
node has sent all its kernels' packets, nothing is in flight in the hub, and no node has received
anything new for ``settle_s`` seconds (or every kernel has the beats the golden model expects).

**Lock-step mode** (``lockstep=HopCycles``): the simulators keep one clock. Every datagram
carries the cycle in which its sender put it on the network, and the receiver drives it into its
network port ``hop`` cycles later, in its own cycle count; every ``hop`` cycles each node reports
to the hub (``{"tick": address, "cycle": c}``) and waits until the hub has heard every node at
that cycle (``{"release": c, "stop": bool}``). A datagram sent in ``[c - hop, c)`` reaches the
hub before its sender's tick at ``c`` and is forwarded before the release, so it is in the
receiver's hands before the receiver passes ``c``, the earliest cycle it is due: cycle counts
of different FPGAs are comparable, and the network adds exactly ``hop`` cycles per datagram
(plus up to ``POLL_CYCLES - 1`` of the sender's polling, see ``sim/cluster_tb.py``). All nodes
stop at the same release, when the run is complete or out of time.

**A host** (:class:`Host`): an endpoint at an IP address with no simulator. Its frames are sent
at the start (cycle 0) to their destinations; frames addressed to it are kept, with the cycle
their sender sent them (lock-step mode), in :attr:`NetworkHub.host_received`. In lock-step mode
the run ends once the host has ``expect_frames`` frames.
"""

from dataclasses import dataclass, field
import heapq
import json
from pathlib import Path
import random
import socket
import threading
import time

from ...flow.verilator import run_testbench

__all__ = ["NetworkHub", "Host", "NodeRun", "run_cluster"]


def _record(msg):
    """What the hub logs of a datagram ``msg``: addresses, sequence number, beats, the
    sender's cycle (lock-step mode, else None) and the first beat's TDEST and TID."""
    first = msg["beats"][0] if msg["beats"] and isinstance(msg["beats"][0], dict) else {}
    return {"src": msg["src"], "dst": msg["dst"], "seq": msg["seq"],
            "beats": len(msg["beats"]), "cycle": msg.get("cycle"),
            "tdest": first.get("tdest"), "tid": first.get("tid")}


@dataclass
class Host:
    """A network endpoint without a simulator (the CPU host of the paper's experiments).

    ``address``: its IPv4 address as an integer; ``frames``: ``[(destination address, beats)]``
    sent at the start in this order; ``expect_frames``: how many frames it waits for (lock-step
    mode: the run ends when they are all in)."""
    address: int
    frames: list
    expect_frames: int = 0


class NetworkHub:
    """UDP forwarder on 127.0.0.1 with per-datagram delay and loss.

    Parameters
    ----------
    latency_s : float
        One-way delay added to every forwarded datagram (wall-clock seconds; the simulators run
        far slower than hardware, so this models ordering and overlap, not time).
    loss : float
        Probability of dropping a datagram (0 .. 0.99); drops are logged in :attr:`dropped`.
    seed : int
        Seed of the loss draws.
    idle_cycles : int
        Lock-step mode: at a barrier more than this many cycles after the sender's cycle of the
        last datagram, stop every node (:attr:`stalled_at` = that cycle); 0: never.
    """

    def __init__(self, latency_s=0.0, loss=0.0, seed=1, *, lockstep_nodes=0, host=None,
                 idle_cycles=0):
        if not 0.0 <= loss < 1.0:
            raise ValueError("loss must be in 0 .. 0.99")
        if lockstep_nodes and latency_s:
            raise ValueError("lock-step mode counts the network delay in cycles: latency_s "
                             "must be 0")
        self.latency_s, self.loss = latency_s, loss
        self.rng = random.Random(seed)
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 22)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(0.01)
        self.port = self.sock.getsockname()[1]
        self.endpoints = {}            # node address -> (host, port)
        self.pending = {}              # node address -> datagrams waiting for its hello
        self.forwarded, self.dropped = [], []
        self._queue, self._seq = [], 0
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.last_activity = time.monotonic()
        self.lockstep_nodes = lockstep_nodes
        self.ticks = {}                # cycle -> addresses that reported it
        self.cycle = 0                 # the last released cycle (lock-step mode)
        self.stop_requested = False
        self.idle_cycles = idle_cycles
        self.traffic_cycle = 0         # sender's cycle of the last datagram (lock-step mode)
        self.stalled_at = None         # traffic_cycle when idle_cycles ran out
        self.host = host
        self.host_received = []        # (sender's cycle or None, beats) of frames to the host
        if host is not None:
            for dst, beats in host.frames:
                self._seq += 1
                msg = {"src": host.address, "dst": dst, "seq": self._seq, "cycle": 0,
                       "beats": beats}
                record, raw = _record(msg), json.dumps(msg).encode()
                self.pending.setdefault(dst, []).append((record, raw))

    @property
    def host_complete(self):
        """Whether the host has received all the ``expect_frames`` frames it waits for (False
        without a host or with ``expect_frames`` 0)."""
        return self.host is not None and self.host.expect_frames > 0 and \
            len(self.host_received) >= self.host.expect_frames

    def request_stop(self):
        """Lock-step mode: every node stops at the next release."""
        self.stop_requested = True

    def start(self):
        """Start the forwarding thread; returns the hub."""
        self._thread.start()
        return self

    def stop(self):
        """Stop the forwarding thread (waiting up to 2 s for it) and close the socket."""
        self._stop.set()
        self._thread.join(2)
        self.sock.close()

    @property
    def in_flight(self):
        """Datagrams queued for delivery (held ones for nodes that never said hello are
        reported as ``unknown_destination`` at the end instead)."""
        with self._lock:
            return len(self._queue)

    def _run(self):
        while not self._stop.is_set():
            now = time.monotonic()
            with self._lock:
                while self._queue and self._queue[0][0] <= now:
                    _, _, dst, raw = heapq.heappop(self._queue)
                    self.sock.sendto(raw, dst)
            try:
                raw, sender = self.sock.recvfrom(1 << 16)
            except (socket.timeout, OSError):
                continue
            self.last_activity = time.monotonic()
            msg = json.loads(raw)
            if "hello" in msg:
                addr = int(msg["hello"])
                self.endpoints[addr] = sender
                for held in self.pending.pop(addr, []):     # sent before this node started
                    self._forward(*held)
                continue
            if "tick" in msg:
                self._tick(int(msg["tick"]), int(msg["cycle"]))
                continue
            record = _record(msg)
            self.traffic_cycle = max(self.traffic_cycle, int(msg.get("cycle") or 0))
            if self.host is not None and int(msg["dst"]) == self.host.address:
                self.forwarded.append(record)
                self.host_received.append((msg.get("cycle"), msg["beats"]))
                continue
            if int(msg["dst"]) not in self.endpoints:
                self.pending.setdefault(int(msg["dst"]), []).append((record, raw))
            else:
                self._forward(record, raw)

    def _tick(self, addr, cycle):
        """Lock-step barrier: release every node once all have reported ``cycle``, after
        flushing the datagrams forwarded before (they must reach their nodes first)."""
        got = self.ticks.setdefault(cycle, set())
        got.add(addr)
        if len(got) < self.lockstep_nodes:
            return
        del self.ticks[cycle]
        with self._lock:
            while self._queue:
                _, _, dst, raw = heapq.heappop(self._queue)
                self.sock.sendto(raw, dst)
        self.cycle = cycle
        if self.idle_cycles and self.stalled_at is None and \
                cycle - self.traffic_cycle > self.idle_cycles:
            self.stalled_at = self.traffic_cycle
            self.stop_requested = True
        release = json.dumps({"release": cycle, "stop": self.stop_requested
                              or self.host_complete}).encode()
        for a in got:
            self.sock.sendto(release, self.endpoints[a])

    def _forward(self, record, raw):
        if self.loss and self.rng.random() < self.loss:
            self.dropped.append(dict(record, frame=json.loads(raw)["beats"]))   # + its beats
            return
        self.forwarded.append(record)
        with self._lock:
            self._seq += 1
            heapq.heappush(self._queue, (time.monotonic() + self.latency_s, self._seq,
                                         self.endpoints[int(record["dst"])], raw))

    def stats(self):
        """Summary counts: datagrams ``forwarded`` and ``dropped``, the last released lock-step
        ``cycle``, ``host_frames`` received, datagrams held for nodes that never said hello
        (``unknown_destination``), ``nodes`` registered, and the ``latency_s`` and ``loss`` used."""
        return {"forwarded": len(self.forwarded), "dropped": len(self.dropped),
                "cycle": self.cycle, "host_frames": len(self.host_received),
                "unknown_destination": sum(map(len, self.pending.values())),
                "nodes": len(self.endpoints),
                "latency_s": self.latency_s, "loss": self.loss}


@dataclass
class NodeRun:
    """One FPGA's simulation: its Verilator build and its testbench job (see
    ``sim/cluster_tb.py``; :func:`run_cluster` fills in the hub and stop-file entries)."""
    name: str
    top: str
    build_dir: Path
    job: dict
    result: dict = field(default=None)


def _progress(path):
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


def run_cluster(nodes, run_dir, *, latency_s=0.0, loss=0.0, seed=1, settle_s=1.5,
                timeout_s=600, echo=None, lockstep=0, host=None, idle_cycles=0):
    """Simulate ``nodes`` (:class:`NodeRun`) concurrently joined by a :class:`NetworkHub`.

    ``lockstep``: the network hop in cycles (0: free-running simulators, see the module
    docstring); ``host``: a :class:`Host` on the network. Returns ``(results by node name, hub
    statistics and logs)``; with a host, ``stats["host_received"]`` lists its frames as
    ``(cycle, beats)``. ``idle_cycles`` (lock-step only; 0: off): stop every node at the first
    barrier more than this many cycles after the sender's cycle of the last datagram, a stalled
    cluster (``stats["stalled_at"]``: that sender's cycle, else None; :class:`NetworkHub`).
    Every forwarded datagram is written to ``run_dir/datagrams.jsonl``, one JSON object a line:
    source and destination node address, sequence number, beats, the sender's cycle (lock-step
    mode, else None) and the first beat's TDEST and TID (destination and source kernel).
    """

    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    stop_file = run_dir / "stop"
    stop_file.unlink(missing_ok=True)
    hub = NetworkHub(latency_s, loss, seed, lockstep_nodes=len(nodes) if lockstep else 0,
                     host=host, idle_cycles=idle_cycles).start()
    errors, threads = {}, []
    try:
        for node in nodes:
            node_dir = run_dir / node.name
            node_dir.mkdir(parents=True, exist_ok=True)
            progress_file = node_dir / "net-progress.json"
            progress_file.unlink(missing_ok=True)      # a stale one would end the run early
            node.job.update({"hub_port": hub.port, "stop_file": str(stop_file),
                             "progress_file": str(progress_file)})
            if lockstep:
                node.job["lockstep"] = {"hop": int(lockstep)}

            def run(node=node, node_dir=node_dir):
                try:
                    node.result, _ = run_testbench("hwgen.sim.cluster_tb", node.top, node.build_dir,
                                                   node_dir, node.job, seed=seed)
                except Exception as e:          # reported below, with the others
                    errors[node.name] = e

            thread = threading.Thread(target=run, daemon=True)
            thread.start()
            threads.append(thread)

        start, last_change, last_seen = time.monotonic(), time.monotonic(), None
        last_echo = 0.0
        while any(t.is_alive() for t in threads):
            time.sleep(0.2)
            progress = [_progress(n.job["progress_file"]) for n in nodes]
            seen = json.dumps([{k: v for k, v in p.items() if k != "cycle"} if p else None
                               for p in progress], sort_keys=True) + str(len(hub.forwarded))
            if seen != last_seen:
                last_seen, last_change = seen, time.monotonic()
            ready = all(p is not None for p in progress)
            sent_all = ready and all(p["sources_idle"] for p in progress)
            complete = ready and all(p["complete"] for p in progress)
            quiet = time.monotonic() - max(last_change, hub.last_activity) > settle_s
            if lockstep:
                pass                    # the hub stops the nodes (host complete, stalled, below)
            elif ready and sent_all and hub.in_flight == 0 and (complete or quiet):
                stop_file.write_text("stop")
            if echo and lockstep:
                if time.monotonic() - last_echo > 2:
                    last_echo = time.monotonic()
                    echo(f"\r  cluster sim: cycle {hub.cycle}, {len(hub.forwarded)} "
                         f"datagrams forwarded, host has {len(hub.host_received)}"
                         + (f" of {host.expect_frames}" if host else "") + " frames   ",
                         nl=False)
            elif echo and ready:
                got = sum(p["received"] for p in progress)
                echo(f"\r  cluster sim: {got} beats received, {len(hub.forwarded)} datagrams "
                     f"forwarded, {len(hub.dropped)} dropped   ", nl=False)
            if time.monotonic() - start > timeout_s:
                stop_file.write_text("stop")
                hub.request_stop()
        for t in threads:
            t.join()
        if echo:
            echo("")
    finally:
        hub.stop()
    if errors:
        name, err = next(iter(errors.items()))
        raise RuntimeError(f"simulation of node {name} failed: {err}")
    stats = hub.stats()
    stats["dropped_log"] = hub.dropped
    stats["unknown_log"] = [r for held in hub.pending.values() for r, _ in held]
    stats["unknown_destination"] = len(stats["unknown_log"])
    stats["host_received"] = hub.host_received
    stats["stalled_at"] = hub.stalled_at
    with open(Path(run_dir) / "datagrams.jsonl", "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in hub.forwarded)
    return {n.name: n.result for n in nodes}, stats
