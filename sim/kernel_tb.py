"""cocotb testbenches of the Vitis kernel shell (run by :func:`hwgen.flow.verilator.run_testbench`).

``run_kernel_job`` drives a :class:`hwgen.flow.kernel.MemoryKernel` top the way XRT does: it
holds every ``m_axi_<member>`` in a cocotbext-axi ``AxiRamRead`` / ``AxiRamWrite`` (with a
random pause generator on each AXI channel when ``stall`` > 0: ARREADY/AWREADY/WREADY low and
RVALID/BVALID gaps, i.e. random memory latency and backpressure), writes the input records
into them, programs the arguments over ``s_axi_control`` with an ``AxiLiteMaster``, enables the
``ap_done`` interrupt, writes ``ap_start`` and waits (bounded) for ``interrupt``. It then checks
the control registers (``ap_done`` clear-on-read, ``ap_idle``, ISR toggle-on-write) and returns
each output buffer with a guard area on both sides.

``run_axi_job`` drives the AXI4Reader -> AXI4Writer copy harness of ``tests/test_kernel.py``:
copy commands go in on ``s_axis_rcmd`` / ``s_axis_wcmd``, one ``AxiRam`` serves both masters,
and every AR/AW burst is recorded so the host can check the burst rules.

Environment: ``HWGEN_JOB`` (job JSON path), ``HWGEN_RESULT`` (result JSON path).
"""

import json
import os
import random

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import RisingEdge
from cocotbext.axi import (AxiBus, AxiLiteBus, AxiLiteMaster, AxiRam, AxiRamRead, AxiRamWrite,
                           AxiReadBus, AxiStreamBus, AxiStreamFrame, AxiStreamSource,
                           AxiWriteBus)

CLOCK_NS = 4
GUARD_BYTE = 0xA5
PAGE = 4096

CTRL, GIE, IER, ISR = 0x00, 0x04, 0x08, 0x0C
AP_START, AP_DONE, AP_IDLE, AP_READY = 1, 2, 4, 8


def _load_job():
    with open(os.environ["HWGEN_JOB"]) as f:
        return json.load(f)


def _write_result(result):
    with open(os.environ["HWGEN_RESULT"], "w") as f:
        json.dump(result, f)


def _pauses(rng, probability):
    while True:
        yield rng.random() < probability


def _shape(channels, rng, stall):
    """Random pauses with probability ``stall`` on each cocotbext-axi channel model."""
    if stall > 0:
        for ch in channels:
            ch.set_pause_generator(_pauses(random.Random(rng.random()), stall))


def _ram_size(end):
    return -(-end // PAGE) * PAGE + PAGE


async def _start(dut):
    cocotb.start_soon(Clock(dut.ap_clk, CLOCK_NS, unit="ns").start())
    dut.ap_rst_n.value = 0
    for _ in range(8):
        await RisingEdge(dut.ap_clk)
    dut.ap_rst_n.value = 1
    await RisingEdge(dut.ap_clk)


class Handshakes:
    """Counts valid & ready cycles of named channels, from the first cycle it is started."""

    def __init__(self, dut, channels, record=None):
        self.dut = dut
        self.channels = channels            # {name: (valid, ready)}
        self.record = record or {}          # {name: [signals]} whose values to log per beat
        self.stats = {n: {"beats": 0, "first": None, "last": None} for n in channels}
        self.log = {n: [] for n in self.record}
        self.cycle = 0

    def sample(self):
        self.cycle += 1
        for name, (valid, ready) in self.channels.items():
            if valid.value and ready.value:
                st = self.stats[name]
                st["beats"] += 1
                st["first"] = self.cycle if st["first"] is None else st["first"]
                st["last"] = self.cycle
                if name in self.record:
                    self.log[name].append([int(s.value) for s in self.record[name]])


@cocotb.test()
async def run_kernel_job(dut):
    """Program, start and complete one kernel run; return the output buffers."""
    job = _load_job()
    rng = random.Random(job["seed"])
    guard, word = job["guard_bytes"], job["word_bytes"]
    rams, channels = {}, {}
    for mst in job["masters"]:
        port, base = mst["port"], mst["base"]
        end = base + mst["words"] * word + guard
        if mst["direction"] == "in":
            ram = AxiRamRead(AxiReadBus.from_prefix(dut, port), dut.ap_clk, dut.ap_rst_n,
                             reset_active_level=False, size=_ram_size(end))
            ram.write(base, bytes.fromhex(mst["image"]))
            _shape([ram.ar_channel, ram.r_channel], rng, job["stall"])
            channels[port] = (getattr(dut, f"{port}_rvalid"), getattr(dut, f"{port}_rready"))
        else:
            ram = AxiRamWrite(AxiWriteBus.from_prefix(dut, port), dut.ap_clk, dut.ap_rst_n,
                              reset_active_level=False, size=_ram_size(end))
            ram.write(base - guard, bytes([GUARD_BYTE]) * (end - base + guard))
            _shape([ram.aw_channel, ram.w_channel, ram.b_channel], rng, job["stall"])
            channels[port] = (getattr(dut, f"{port}_wvalid"), getattr(dut, f"{port}_wready"))
        rams[port] = ram
    ctl = AxiLiteMaster(AxiLiteBus.from_prefix(dut, "s_axi_control"), dut.ap_clk, dut.ap_rst_n,
                        reset_active_level=False)
    await _start(dut)

    control = {}
    for mst in job["masters"]:
        await ctl.write_dword(mst["ptr_offset"], mst["base"] & 0xFFFFFFFF)
        await ctl.write_dword(mst["ptr_offset"] + 4, mst["base"] >> 32)
        await ctl.write_dword(mst["count_offset"], mst["count"])
    control["args_readback"] = True
    for mst in job["masters"]:
        got = [await ctl.read_dword(mst["ptr_offset"] + k) for k in (0, 4)]
        got.append(await ctl.read_dword(mst["count_offset"]))
        if got != [mst["base"] & 0xFFFFFFFF, mst["base"] >> 32, mst["count"]]:
            control["args_readback"] = False
    control["idle_before"] = bool(await ctl.read_dword(CTRL) & AP_IDLE)
    await ctl.write_dword(GIE, 1)
    await ctl.write_dword(IER, 1)
    await ctl.write_dword(CTRL, AP_START)

    monitor = Handshakes(dut, channels)
    clk, timed_out = RisingEdge(dut.ap_clk), False
    while not dut.interrupt.value:
        await clk
        monitor.sample()
        if monitor.cycle >= job["timeout_cycles"]:
            timed_out = True
            break

    if not timed_out:
        first, second = await ctl.read_dword(CTRL), await ctl.read_dword(CTRL)
        control["done_set"] = bool(first & AP_DONE) and bool(first & AP_READY)
        control["done_cleared_on_read"] = not second & (AP_DONE | AP_READY)
        control["idle_after"] = bool(second & AP_IDLE)
        control["start_cleared"] = not second & AP_START
        control["isr"] = await ctl.read_dword(ISR)
        await ctl.write_dword(ISR, 1)
        await clk
        control["interrupt_cleared"] = not dut.interrupt.value
        control["isr_after_toggle"] = await ctl.read_dword(ISR)

    images = {}
    for mst in job["masters"]:
        if mst["direction"] == "out":
            images[mst["port"]] = rams[mst["port"]].read(
                mst["base"] - guard, mst["words"] * word + 2 * guard).hex()
    _write_result({"timeout": timed_out, "kernel_cycles": monitor.cycle, "images": images,
                   "handshakes": monitor.stats, "control": control})
    assert not timed_out, f"no interrupt within {monitor.cycle} cycles"


@cocotb.test()
async def run_axi_job(dut):
    """Copy runs of words with the reader/writer harness and record every burst."""
    job = _load_job()
    rng = random.Random(job["seed"])
    ram = AxiRam(AxiBus(AxiWriteBus.from_prefix(dut, "m_axi_wr"),
                        AxiReadBus.from_prefix(dut, "m_axi_rd")),
                 dut.ap_clk, dut.ap_rst_n, reset_active_level=False, size=job["ram_bytes"])
    ram.write(0, bytes.fromhex(job["image"]))
    _shape([ram.read_if.ar_channel, ram.read_if.r_channel, ram.write_if.aw_channel,
            ram.write_if.w_channel, ram.write_if.b_channel], rng, job["stall"])
    sources = {}
    for name in ("rcmd", "wcmd"):
        sources[name] = AxiStreamSource(AxiStreamBus.from_prefix(dut, f"s_axis_{name}"),
                                        dut.ap_clk, dut.ap_rst_n, reset_active_level=False,
                                        byte_lanes=1)
    await _start(dut)

    def sig(n):
        return getattr(dut, n)
    monitor = Handshakes(
        dut,
        {"ar": (sig("m_axi_rd_arvalid"), sig("m_axi_rd_arready")),
         "aw": (sig("m_axi_wr_awvalid"), sig("m_axi_wr_awready")),
         "r": (sig("m_axi_rd_rvalid"), sig("m_axi_rd_rready")),
         "w": (sig("m_axi_wr_wvalid"), sig("m_axi_wr_wready")),
         "b": (sig("m_axi_wr_bvalid"), sig("m_axi_wr_bready"))},
        record={"ar": [sig("m_axi_rd_araddr"), sig("m_axi_rd_arlen")],
                "aw": [sig("m_axi_wr_awaddr"), sig("m_axi_wr_awlen")],
                "w": [sig("m_axi_wr_wlast")]})
    for name in ("rcmd", "wcmd"):
        for word in job[name]:
            await sources[name].send(AxiStreamFrame([word]))
    words = job["total_words"]
    clk, timed_out, settled = RisingEdge(dut.ap_clk), False, 0
    while settled < 16:
        await clk
        monitor.sample()
        finished = (monitor.stats["w"]["beats"] >= words and dut.rd_idle.value
                    and dut.wr_idle.value and sources["rcmd"].empty()
                    and sources["wcmd"].empty())
        settled = settled + 1 if finished else 0
        if monitor.cycle >= job["timeout_cycles"]:
            timed_out = True
            break
    _write_result({"timeout": timed_out, "cycles": monitor.cycle,
                   "image": ram.read(0, job["ram_bytes"]).hex(),
                   "handshakes": monitor.stats, "bursts": monitor.log})
    assert not timed_out, f"copies not finished within {monitor.cycle} cycles"
