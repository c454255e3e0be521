"""Generic cocotb testbench for stream accelerators (run by ``hwgen.flow.simulate``).

The host side (``hwgen sim`` / pytest) writes a job file naming, for every AXI-Stream port of the
top level, the TDATA words to drive (inputs) or the number of beats to expect (outputs). This
testbench drives the inputs with cocotbext-axi ``AxiStreamSource``\\ s and collects the outputs with
``AxiStreamSink``\\ s, each with a random pause generator: every cycle a source idles and a sink
deasserts TREADY with probability ``stall``. A per-cycle monitor counts handshakes, stops the run
once every output has its beats (plus a drain period that catches extra beats) or when the cycle
budget runs out, and the results (received frames of words, handshake cycles) go back to the host, which
compares them with the golden model.

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

CLOCK_NS = 4
DRAIN_CYCLES = 64


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


@cocotb.test()
async def run_stream_job(dut):
    """Drive the job's inputs, collect its outputs, write the result file."""
    with open(os.environ["HWGEN_JOB"]) as f:
        job = json.load(f)
    progress_path = os.environ.get("HWGEN_PROGRESS")
    tb = StreamBench(dut, job)
    await tb.reset()

    handshakes = {}
    for port in job["ports"]:
        name = port["port"]
        handshakes[name] = {"count": 0, "first": None, "last": None,
                            "valid": getattr(dut, f"{name}_tvalid"),
                            "ready": getattr(dut, f"{name}_tready"),
                            "tlast": getattr(dut, f"{name}_tlast", None),
                            "frame_start": None, "frame_cycles": 0}
    for port in job["ports"]:
        if port["direction"] == "in":
            source = tb.sources[port["port"]]
            frames = port["frames"]
            for frame in frames:
                source.send_nowait(_to_frame(frame, source))

    expected = {p["port"]: p["beats"] for p in job["ports"] if p["direction"] == "out"}
    sample = job.get("sample")
    sample_tlast = getattr(dut, f"{sample['port']}_tlast") if sample else None
    samples, sample_next = [], False
    total_expected = sum(expected.values())
    budget = job["timeout_cycles"]
    cycle, done_at, timed_out = 0, None, False
    clk = RisingEdge(dut.ap_clk)
    while True:
        await clk
        cycle += 1
        if sample_next:
            samples.append({name: int(getattr(dut, name).value) for name in sample["signals"]})
        h = handshakes[sample["port"]] if sample else None
        sample_next = bool(sample and h["valid"].value and h["ready"].value
                           and sample_tlast.value)
        for h in handshakes.values():
            if h["valid"].value and h["ready"].value:
                h["count"] += 1
                if h["first"] is None:
                    h["first"] = cycle
                h["last"] = cycle
                if h["tlast"] is not None:      # per-frame windows: rate within frames
                    if h["frame_start"] is None:
                        h["frame_start"] = cycle
                    if h["tlast"].value:
                        h["frame_cycles"] += cycle - h["frame_start"] + 1
                        h["frame_start"] = None
        if done_at is None and all(handshakes[p]["count"] >= n for p, n in expected.items()):
            done_at = cycle
        if done_at is not None and cycle >= done_at + DRAIN_CYCLES:
            break
        if cycle >= budget:
            timed_out = True
            break
        if progress_path and cycle % 2048 == 0:
            got = sum(handshakes[p]["count"] for p in expected)
            with open(progress_path, "w") as f:
                f.write(f"{got} {total_expected} {cycle}\n")

    outputs = {}
    for name, sink in tb.sinks.items():
        frames = []
        while not sink.empty():
            frames.append(_from_frame(sink.recv_nowait(compact=False), sink))
        outputs[name] = frames
    result = {
        "cycles_run": cycle,
        "timeout": timed_out,
        "outputs": outputs,
        "handshakes": {p: {k: h[k] for k in ("count", "first", "last", "frame_cycles")}
                       for p, h in handshakes.items()},
        "samples": samples,
    }
    with open(os.environ["HWGEN_RESULT"], "w") as f:
        json.dump(result, f)
    assert not timed_out, f"timeout after {cycle} cycles"
