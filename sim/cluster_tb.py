"""cocotb testbench of one FPGA of a multi-FPGA simulation (run by ``hwgen.cluster.run.netsim``).

The job names the FPGA top's kernel-side stream ports (driven from frames / collected, as in
``sim/stream_tb.py``, with the same random gaps and backpressure) and its network port pair,
which is bridged to the network hub over UDP on loopback: each frame leaving the network output
port is sent as one datagram addressed to the node address found in the frame's first beat
(``job["net"]["dst"]``: ``{"signal": "tdata"|"tdest"|"tid"|"tuser", "offset", "bits"}`` for
bits of the beat, ``{"port": name}`` for a top-level signal valid with the first beat, such
as the router's ``net_addr``, or ``{"stream": prefix}`` for a separate stream carrying one
address beat per frame in frame order, such as the FPGA top's ``m_axis_addr``; its TREADY is
held high and each beat's TDATA is the address), and each datagram arriving from the hub is driven into the
network input port.

Job entries beyond ``stream_tb``'s: ``address`` (this node), ``hub_port``, ``net`` (``{"out":
prefix, "in": prefix, "dst": {"signal": "tdata"|"tdest"|"tid"|"tuser", "offset", "bits"}}``),
``expect`` (``{port: beats}`` the kernels should receive, or absent), ``stop_file`` (the host
creates it when the whole cluster has settled) and ``progress_file`` (written every 256 cycles).

``lockstep`` (``{"hop": cycles}``, see :mod:`hwgen.cluster.run.netsim`): every datagram sent carries
this node's cycle; one received is driven into the network port ``hop`` cycles after its
sender's cycle; every ``hop`` cycles the node reports its cycle to the hub and blocks until the
hub releases it (or says stop). The network output is polled every cycle in this mode.
"""

import heapq
import json
import os
import socket

import cocotb
from cocotb.triggers import RisingEdge

from .stream_tb import StreamBench, _from_frame, _to_frame

POLL_CYCLES = 16
STATUS_CYCLES = 256
BARRIER_TIMEOUT_S = 300


def _barrier(sock, hub, address, cycle, pending, hop):
    """Report ``cycle`` to the hub and wait for its release; datagrams arriving meanwhile go to
    ``pending`` (due ``hop`` cycles after their sender's cycle). Returns the release's stop."""
    sock.sendto(json.dumps({"tick": address, "cycle": cycle}).encode(), hub)
    sock.settimeout(BARRIER_TIMEOUT_S)
    try:
        while True:
            try:
                msg = json.loads(sock.recv(1 << 16))
            except socket.timeout:
                raise RuntimeError(f"no release from the network hub for cycle {cycle} in "
                                   f"{BARRIER_TIMEOUT_S} s (another node died?)") from None
            if "release" in msg:
                return bool(msg["stop"])
            heapq.heappush(pending, (msg["cycle"] + hop, msg["seq"], msg["src"], msg["beats"]))
    finally:
        sock.setblocking(False)


@cocotb.test()
async def run_cluster_node(dut):
    with open(os.environ["HWGEN_JOB"]) as f:
        job = json.load(f)
    net = job["net"]
    ports = job["ports"] + [{"port": net["out"], "direction": "out"},
                            {"port": net["in"], "direction": "in", "frames": []}]
    tb = StreamBench(dut, dict(job, ports=ports))
    await tb.reset()

    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 22)
    sock.bind(("127.0.0.1", 0))
    sock.setblocking(False)
    hub = ("127.0.0.1", job["hub_port"])
    sock.sendto(json.dumps({"hello": job["address"]}).encode(), hub)

    kernel_in = [p["port"] for p in job["ports"] if p["direction"] == "in"]
    kernel_out = [p["port"] for p in job["ports"] if p["direction"] == "out"]
    for p in job["ports"]:
        if p["direction"] == "in":
            for frame in p["frames"]:
                tb.sources[p["port"]].send_nowait(_to_frame(frame, tb.sources[p["port"]]))
    received = {p: [] for p in kernel_out}
    expect = job.get("expect")
    net_out, net_in = tb.sinks[net["out"]], tb.sources[net["in"]]
    dst = net["dst"]
    addr_signal = getattr(dut, dst["port"]) if "port" in dst else None
    addr_stream = None
    if "stream" in dst:       # one beat per network frame on its own stream (router's o_addr)
        addr_stream = (getattr(dut, f"{dst['stream']}_tvalid"),
                       getattr(dut, f"{dst['stream']}_tdata"))
        getattr(dut, f"{dst['stream']}_tready").value = 1
    out_valid, out_ready = (getattr(dut, f"{net['out']}_{s}") for s in ("tvalid", "tready"))
    out_last = getattr(dut, f"{net['out']}_tlast")
    addresses, in_frame = [], False        # net_addr at the first beat of each frame
    sent = arrived = seq = 0
    cycle, clk = 0, RisingEdge(dut.ap_clk)
    lock = job.get("lockstep")
    hop = lock["hop"] if lock else 0
    pending, stop = [], False               # lock-step: (due cycle, seq, src, beats)
    while True:
        await clk
        cycle += 1
        if addr_signal is not None and out_valid.value and out_ready.value:
            if not in_frame:
                addresses.append(int(addr_signal.value))
            in_frame = not out_last.value
        if addr_stream is not None and addr_stream[0].value:
            addresses.append(int(addr_stream[1].value))
        if lock:
            while pending and pending[0][0] <= cycle:
                net_in.send_nowait(_to_frame(heapq.heappop(pending)[3], net_in))
                arrived += 1
            if cycle % hop == 0:
                stop = _barrier(sock, hub, job["address"], cycle, pending, hop)
            elif cycle % POLL_CYCLES and net_out.empty():
                continue
        while not net_out.empty():
            if addr_stream is not None and not addresses:
                break                     # the frame's address beat has not come out yet
            beats = _from_frame(net_out.recv_nowait(compact=False), net_out)
            if addr_signal is not None or addr_stream is not None:
                addr = addresses.pop(0)
            else:
                addr = (beats[0][dst["signal"]] >> dst.get("offset", 0)) & \
                    ((1 << dst["bits"]) - 1)
            seq += 1
            sock.sendto(json.dumps({"src": job["address"], "dst": addr, "seq": seq,
                                    "cycle": cycle, "beats": beats}).encode(), hub)
            sent += 1
        while not lock:
            try:
                raw = sock.recv(1 << 16)
            except (BlockingIOError, InterruptedError):
                break
            net_in.send_nowait(_to_frame(json.loads(raw)["beats"], net_in))
            arrived += 1
        for port in kernel_out:
            sink = tb.sinks[port]
            while not sink.empty():
                received[port].append(_from_frame(sink.recv_nowait(compact=False), sink))
        if cycle % STATUS_CYCLES == 0:
            got = {p: sum(len(f) for f in received[p]) for p in kernel_out}
            status = {
                "cycle": cycle, "sent": sent, "arrived": arrived,
                "received": sum(got.values()),
                "complete": bool(expect) and all(got[p] >= n for p, n in expect.items()),
                "sources_idle": all(tb.sources[p].idle() for p in kernel_in + [net["in"]])
                and net_out.empty(),
            }
            tmp = job["progress_file"] + ".tmp"
            with open(tmp, "w") as f:
                json.dump(status, f)
            os.replace(tmp, job["progress_file"])
            if not lock and (os.path.exists(job["stop_file"])
                             or cycle >= job["timeout_cycles"]):
                break
        if lock and cycle % hop == 0 and (stop or cycle >= job["timeout_cycles"]):
            break
    sock.close()
    status = {}
    for handle in dut:                          # the top's status counters, at the end
        name = handle._name
        if name.startswith("status_"):
            try:
                status[name] = int(handle.value)
            except ValueError:                  # X/Z bits
                status[name] = str(handle.value)
    result = {"cycles_run": cycle, "timeout": cycle >= job["timeout_cycles"],
              "status": status,
              "outputs": received, "sent": sent, "arrived": arrived}
    with open(os.environ["HWGEN_RESULT"], "w") as f:
        json.dump(result, f)
