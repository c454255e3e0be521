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
"""

import heapq
import json
import random
import socket
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["NetworkHub", "NodeRun", "run_cluster"]


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
    """

    def __init__(self, latency_s=0.0, loss=0.0, seed=1):
        if not 0.0 <= loss < 1.0:
            raise ValueError("loss must be in 0 .. 0.99")
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

    def start(self):
        self._thread.start()
        return self

    def stop(self):
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
            record = {"src": msg["src"], "dst": msg["dst"], "seq": msg["seq"],
                      "beats": len(msg["beats"])}
            if int(msg["dst"]) not in self.endpoints:
                self.pending.setdefault(int(msg["dst"]), []).append((record, raw))
            else:
                self._forward(record, raw)

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
        return {"forwarded": len(self.forwarded), "dropped": len(self.dropped),
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
                timeout_s=600, echo=None):
    """Simulate ``nodes`` (:class:`NodeRun`) concurrently joined by a :class:`NetworkHub`.

    Returns ``(results by node name, hub statistics and logs)``.
    """
    from ..flow.verilator import run_testbench

    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    stop_file = run_dir / "stop"
    stop_file.unlink(missing_ok=True)
    hub = NetworkHub(latency_s, loss, seed).start()
    errors, threads = {}, []
    try:
        for node in nodes:
            node_dir = run_dir / node.name
            node_dir.mkdir(parents=True, exist_ok=True)
            progress_file = node_dir / "net-progress.json"
            progress_file.unlink(missing_ok=True)      # a stale one would end the run early
            node.job.update({"hub_port": hub.port, "stop_file": str(stop_file),
                             "progress_file": str(progress_file)})

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
            if ready and sent_all and hub.in_flight == 0 and (complete or quiet):
                stop_file.write_text("stop")
            if echo and ready:
                got = sum(p["received"] for p in progress)
                echo(f"\r  cluster sim: {got} beats received, {len(hub.forwarded)} datagrams "
                     f"forwarded, {len(hub.dropped)} dropped   ", nl=False)
            if time.monotonic() - start > timeout_s:
                stop_file.write_text("stop")
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
    return {n.name: n.result for n in nodes}, stats
