"""Generic cocotb testbench for stream accelerators (run by ``hwgen.flow.simulate``).

The host side (``hwgen sim`` / pytest) writes a job file naming, for every AXI-Stream port of the
top level, the TDATA words to drive (inputs) or the number of beats to expect (outputs). This
testbench drives the inputs with cocotbext-axi ``AxiStreamSource``\\ s and collects the outputs with
``AxiStreamSink``\\ s, each with a random pause generator: every cycle a source idles and a sink
deasserts TREADY with probability ``stall``. A :class:`HandshakeMonitor` per port counts
handshakes as cocotbext-axi samples them (its counts are checked against the sinks' beats); the
run stops once every output has its beats (plus a drain period that catches extra beats) or when
the cycle budget runs out, and the results (received frames of words, handshake cycles) go back
to the host, which compares them with the golden model.

Optional job entries: ``memories`` (AXI4 read masters, each held by a cocotbext-axi
``AxiRamRead`` filled with an image; with ``stall`` its AR and R channels pause at random too)
and ``sample`` (plain output signals read one cycle after every TLAST beat of a given output
port, e.g. per-query performance counters).

Environment: ``HWGEN_JOB`` (job JSON path), ``HWGEN_RESULT`` (result JSON path),
``HWGEN_PROGRESS`` (optional progress file).
"""

import json
import os
import random

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import RisingEdge
from cocotbext.axi import (AxiRamRead, AxiReadBus, AxiStreamBus, AxiStreamFrame,
                           AxiStreamSink, AxiStreamSource)

from hwgen.flow.ports import SIDEBANDS
from hwgen.flow.scoreboard import DRAIN_CYCLES

CLOCK_NS = 4


def _pauses(rng, probability):
    while True:
        yield rng.random() < probability


#: AXI-Stream sideband signals, from the one list in hwgen.flow.ports: TKEEP is per byte,
#: the others are repeated on every byte of a beat.
_SIDEBANDS = tuple(SIDEBANDS.values())
_PER_BEAT = tuple(sig for sig in _SIDEBANDS if sig != "tkeep")


def _to_frame(beats, source):
    """A job frame (TDATA words, or dicts of TDATA and sideband values per beat) as a
    cocotbext-axi frame: per-byte lists when the port has TKEEP, sidebands repeated per byte."""
    if not beats or not isinstance(beats[0], dict):
        return AxiStreamFrame(beats)
    lanes, size = source.byte_lanes, source.byte_size
    mask = (1 << size) - 1
    tdata, side = [], {sig: [] for sig in _SIDEBANDS}
    for beat in beats:
        for lane in range(lanes):
            tdata.append((beat["tdata"] >> (lane * size)) & mask)
            side["tkeep"].append((beat.get("tkeep", (1 << lanes) - 1) >> lane) & 1)
            for sig in _PER_BEAT:
                side[sig].append(beat.get(sig, 0))
    return AxiStreamFrame(bytearray(tdata) if size == 8 else tdata, **side)


def _from_frame(frame, sink):
    """Inverse of :func:`_to_frame` for a received frame (not compacted)."""
    present = [sig for sig in _SIDEBANDS if hasattr(sink.bus, sig)]
    if not present:
        return [int(w) for w in frame.tdata]
    lanes, size = sink.byte_lanes, sink.byte_size
    beats = []
    for k in range(0, len(frame.tdata), lanes):
        beat = {"tdata": sum(int(frame.tdata[k + lane]) << (lane * size)
                             for lane in range(lanes))}
        if "tkeep" in present:
            beat["tkeep"] = sum(int(frame.tkeep[k + lane]) << lane for lane in range(lanes))
        for sig in _PER_BEAT:
            if sig in present:
                beat[sig] = int(getattr(frame, sig)[k])
        beats.append(beat)
    return beats


class StreamBench:
    """Clock, reset, and one cocotbext-axi model per stream port of ``dut``."""

    def __init__(self, dut, job):
        self.dut = dut
        self.job = job
        self.rng = random.Random(job["seed"])
        self.sources, self.sinks = {}, {}
        cocotb.start_soon(Clock(dut.ap_clk, CLOCK_NS, unit="ns").start())
        for port in job["ports"]:
            bus = AxiStreamBus.from_prefix(dut, port["port"])
            cls = AxiStreamSource if port["direction"] == "in" else AxiStreamSink
            lanes = {} if hasattr(bus, "tkeep") else {"byte_lanes": 1}   # TKEEP: per byte
            model = cls(bus, dut.ap_clk, dut.ap_rst_n, reset_active_level=False, **lanes)
            model.log.setLevel("WARNING")
            if job["stall"] > 0:
                model.set_pause_generator(_pauses(random.Random(self.rng.random()), job["stall"]))
            (self.sources if port["direction"] == "in" else self.sinks)[port["port"]] = model
        self.rams = {}
        for mem in job.get("memories", []):
            ram = AxiRamRead(AxiReadBus.from_prefix(dut, mem["prefix"]), dut.ap_clk,
                             dut.ap_rst_n, reset_active_level=False, size=mem["size"])
            ram.write(0, bytes.fromhex(mem["image"]))
            if job["stall"] > 0:
                for channel in (ram.ar_channel, ram.r_channel):
                    channel.set_pause_generator(
                        _pauses(random.Random(self.rng.random()), job["stall"]))
            self.rams[mem["prefix"]] = ram

    async def reset(self):
        self.dut.ap_rst_n.value = 0
        for _ in range(4):
            await RisingEdge(self.dut.ap_clk)
        self.dut.ap_rst_n.value = 1
        await RisingEdge(self.dut.ap_clk)


class HandshakeMonitor:
    """Counts the handshakes of one AXI-Stream port the way cocotbext-axi's sinks sample them:
    in a coroutine of its own, right after each rising clock edge, TVALID/TREADY/TLAST as the
    design presented them at that edge. cocotb applies testbench writes only after every
    coroutine woken by the edge has run, and each monitor counts its own edges, so the counts
    and cycles do not depend on the order in which the simulator resumes coroutines.

    With ``sample``, the named plain signals are read at the edge after every TLAST beat
    (performance counters updated by that beat)."""

    def __init__(self, dut, name, sample=()):
        self.clock = dut.ap_clk
        self.valid = getattr(dut, f"{name}_tvalid")
        self.ready = getattr(dut, f"{name}_tready")
        self.tlast = getattr(dut, f"{name}_tlast", None)
        self.signals = [(s, getattr(dut, s)) for s in sample]
        self.count, self.first, self.last, self.frame_cycles = 0, None, None, 0
        # cycles with TVALID low between two handshakes (an input's gaps: its source idled),
        # and with TVALID high and TREADY low (an output's stalls: its sink held a beat back)
        self.gaps, self.idle, self.held = 0, 0, 0
        self.samples = []

    async def run(self):
        edge = RisingEdge(self.clock)
        cycle, frame_start, sample_next = 0, None, False
        while True:
            await edge
            cycle += 1
            if sample_next:
                self.samples.append({n: int(sig.value) for n, sig in self.signals})
            valid = bool(self.valid.value)
            fired = valid and bool(self.ready.value)
            last = fired and self.tlast is not None and bool(self.tlast.value)
            sample_next = bool(self.signals) and last
            if not fired:
                if valid:
                    self.held += 1
                elif self.count:
                    self.idle += 1
                continue
            self.gaps += self.idle
            self.idle = 0
            self.count += 1
            if self.first is None:
                self.first = cycle
            self.last = cycle
            if self.tlast is not None:          # per-frame windows: rate within frames
                if frame_start is None:
                    frame_start = cycle
                if last:
                    self.frame_cycles += cycle - frame_start + 1
                    frame_start = None

    def report(self):
        return {"count": self.count, "first": self.first, "last": self.last,
                "frame_cycles": self.frame_cycles, "gaps": self.gaps, "held": self.held}


@cocotb.test()
async def run_stream_job(dut):
    """Drive the job's inputs, collect its outputs, write the result file."""
    with open(os.environ["HWGEN_JOB"]) as f:
        job = json.load(f)
    progress_path = os.environ.get("HWGEN_PROGRESS")
    tb = StreamBench(dut, job)
    await tb.reset()

    sample = job.get("sample")
    monitors = {p["port"]: HandshakeMonitor(
        dut, p["port"], sample["signals"] if sample and sample["port"] == p["port"] else ())
        for p in job["ports"]}
    for monitor in monitors.values():
        cocotb.start_soon(monitor.run())
    for port in job["ports"]:
        if port["direction"] == "in":
            source = tb.sources[port["port"]]
            for frame in port["frames"]:
                source.send_nowait(_to_frame(frame, source))

    expected = {p["port"]: p["beats"] for p in job["ports"] if p["direction"] == "out"}
    total_expected = sum(expected.values())
    budget = job["timeout_cycles"]
    cycle, done_at, timed_out = 0, None, False
    clk = RisingEdge(dut.ap_clk)
    while True:
        await clk
        cycle += 1
        if done_at is None and all(monitors[p].count >= n for p, n in expected.items()):
            done_at = cycle
        if done_at is not None and cycle >= done_at + DRAIN_CYCLES:
            break
        if cycle >= budget:
            timed_out = True
            break
        if progress_path and cycle % 2048 == 0:
            got = sum(monitors[p].count for p in expected)
            with open(progress_path, "w") as f:
                f.write(f"{got} {total_expected} {cycle}\n")

    outputs = {}
    for name, sink in tb.sinks.items():
        frames = []
        while not sink.empty():
            frames.append(_from_frame(sink.recv_nowait(compact=False), sink))
        outputs[name] = frames
    # the monitor and cocotbext-axi's sink sample independently: they must agree
    disagree = {name: [monitors[name].count, sum(map(len, frames))]
                for name, frames in outputs.items()
                if monitors[name].count != sum(map(len, frames))}
    result = {
        "cycles_run": cycle,
        "timeout": timed_out,
        "outputs": outputs,
        "handshakes": {p: m.report() for p, m in monitors.items()},
        "samples": monitors[sample["port"]].samples if sample else [],
        "monitor_disagrees": disagree,
    }
    with open(os.environ["HWGEN_RESULT"], "w") as f:
        json.dump(result, f)
    assert not timed_out, f"timeout after {cycle} cycles"
