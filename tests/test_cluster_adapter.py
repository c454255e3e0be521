"""Packet adapters (:mod:`hwgen.cluster.gateware.adapter`): golden model (rows -> packets -> rows
round trips, packet splitting, TKEEP, element encoding), configuration errors, the row formats of
the I-BERT kernels' streams (read from their ports.json entries, connectable without reshaping),
and Verilator runs beyond ``tests/test_sim.py`` (which simulates every entry of
``ROW2PKT_CONFIGS``/``PKT2ROW_CONFIGS`` natively with 30% stalls and the first on cocotb, as
for every registered accelerator)."""

from dataclasses import asdict

import numpy as np
import pytest
from amaranth.hdl import Module
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.sim import Simulator

from hwgen import registry
from hwgen.cluster.gateware import adapter as A
from hwgen.cluster.spec import adapter as A_spec
from hwgen.cluster.spec.adapter import PacketsToRowsConfig, RowFormat, RowToPacketsConfig
from hwgen.cluster.golden.rows import (beats_to_rows, decode_bytes, encode_rows, packets_to_rows,
                                       row_beats, rows_to_packets)
from hwgen.cluster.spec.packet import Packet, from_beats, split_packets, to_beats
from hwgen.errors import ConfigError
from hwgen.flow.ports import StreamFormat
from hwgen.flow.simulate import simulate

from conftest import requires_verilator

FORMATS = [
    RowFormat(lanes=3, row_elems=37),
    RowFormat(lanes=4, elem_bits=16, field_bits=9, signed=False, row_elems=29, count=True),
    RowFormat(lanes=5, elem_bits=32, row_elems=23),
    RowFormat(lanes=1, elem_bits=32, array=False, rows=7, row_elems=13),
    RowFormat(lanes=24, row_elems=120),
    RowFormat(lanes=2, elem_bits=16, field_bits=11, row_elems=1),
]


def _rows(fmt, n, seed=0):
    return A._random_rows(np.random.default_rng(seed), fmt, n)


# -- golden model ----------------------------------------------------------------------------

@pytest.mark.parametrize("fmt", FORMATS, ids=range(len(FORMATS)))
@pytest.mark.parametrize("max_bytes", [1, 7, 36, 1024])
@pytest.mark.parametrize("data_bits", [64, 512])
def test_round_trip_rows_packets_rows(fmt, max_bytes, data_bits):
    rows = _rows(fmt, 9)
    packets = rows_to_packets(rows, fmt, dest=4, src=17, max_packet_bytes=max_bytes)
    beats = [b for p in packets for b in to_beats(p, data_bits)]
    back = [from_beats(b, data_bits) for b in split_packets(beats)]
    assert back == packets
    got, dropped = packets_to_rows(back, {17: fmt})
    assert dropped == 0 and len(got[17]) == len(rows)
    for a, b in zip(got[17], rows):
        np.testing.assert_array_equal(a, b)
    # and through the kernel-side beats
    for a, b in zip(beats_to_rows(row_beats(rows, fmt), fmt), rows):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("row_bytes, max_bytes", [(37, 1024), (92, 36), (72, 36), (1, 1),
                                                  (120, 50)])
def test_split_sizes_and_tkeep(row_bytes, max_bytes):
    fmt = RowFormat(lanes=3, row_elems=row_bytes)
    packets = rows_to_packets(_rows(fmt, 2), fmt, 1, 2, max_bytes)
    sizes = [len(p.payload) for p in packets]
    per_row = [max_bytes] * (row_bytes // max_bytes) + \
        ([row_bytes % max_bytes] if row_bytes % max_bytes else [])
    assert sizes == per_row * 2
    for p in packets:
        beats = to_beats(p, 64)
        assert [b["last"] for b in beats] == [0] * (len(beats) - 1) + [1]
        assert all(b["keep"] == 0xFF for b in beats[:-1])
        tail = len(p.payload) % 8 or 8
        assert beats[-1]["keep"] == (1 << tail) - 1
        assert beats[-1]["data"] >> (8 * tail) == 0
        assert (p.dest, p.src, p.user) == (1, 2, 0)


def test_elements_little_endian_extended_and_truncated():
    s9 = RowFormat(elem_bits=16, field_bits=9)
    assert encode_rows([[-1, 255, -256]], s9) == bytes([0xFF, 0xFF, 0xFF, 0, 0, 0xFF])
    np.testing.assert_array_equal(decode_bytes(bytes([0xFF, 0xFF, 0x00, 0xFF, 0xFF, 0xFE]),
                                               s9), [-1, -256, 255])     # truncated to 9 bits
    u9 = RowFormat(elem_bits=16, field_bits=9, signed=False)
    assert encode_rows([[300]], u9) == bytes([0x2C, 0x01])
    np.testing.assert_array_equal(decode_bytes(bytes([0x2C, 0xFF, 0xAB]), u9), [300])
    i32 = RowFormat(elem_bits=32)
    assert encode_rows([[-2, 0x01020304]], i32) == bytes([0xFE, 0xFF, 0xFF, 0xFF, 4, 3, 2, 1])


def test_sources_cut_at_any_byte_and_unknown_dropped():
    """Rows are counted in elements: packets of any length, interleaved sources."""
    f1, f2 = RowFormat(elem_bits=32, row_elems=5), RowFormat(row_elems=3)
    r1, r2 = _rows(f1, 4, 1), _rows(f2, 6, 2)
    b1, b2 = encode_rows(r1, f1), encode_rows(r2, f2)
    pkts = [Packet(0, 1, b1[:7]), Packet(0, 9, b"x"), Packet(0, 2, b2[:1]),
            Packet(0, 1, b1[7:40]), Packet(0, 2, b2[1:]), Packet(0, 8, b"yz"),
            Packet(0, 1, b1[40:])]
    got, dropped = packets_to_rows(pkts, {1: f1, 2: f2})
    assert dropped == 2
    for got_rows, want in ((got[1], r1), (got[2], r2)):
        assert len(got_rows) == len(want)
        for a, b in zip(got_rows, want):
            np.testing.assert_array_equal(a, b)
    # an unfinished row is not output
    got, _ = packets_to_rows(pkts[:-1], {1: f1, 2: f2})
    assert len(got[1]) == 2          # 40 of 80 bytes


def test_rows_end_with_packets_when_row_elems_is_zero():
    """Rows of any length (the softmax's): the sender keeps one row per packet."""
    fmt = RowFormat(elem_bits=16, lanes=3, count=True, row_elems=0)
    sender = RowFormat(elem_bits=16, lanes=3, count=True, row_elems=40)
    rows = A._random_rows(np.random.default_rng(4), sender, 12, variable=True)
    assert {len(r) for r in rows} >= {1, 40}
    packets = rows_to_packets(rows, sender, 0, 6, max_packet_bytes=80)
    got, _ = packets_to_rows(packets, {6: fmt})
    assert [list(r) for r in got[6]] == [list(r) for r in rows]
    with pytest.raises(ValueError, match="inside an element"):
        packets_to_rows([Packet(0, 6, b"abc")], {6: fmt})


def test_row_beats_padding_count_and_last_row():
    fmt = RowFormat(field="p", lanes=4, row_elems=6, count=True, rows=2)
    beats = row_beats([[1, 2, 3, 4, 5, 6], [7, 8, 9, 10, 11, 12]], fmt)
    assert beats == [
        {"p": [1, 2, 3, 4], "count": 4, "last_row": 0, "last": 0},
        {"p": [5, 6, 0, 0], "count": 2, "last_row": 0, "last": 1},
        {"p": [7, 8, 9, 10], "count": 4, "last_row": 1, "last": 0},
        {"p": [11, 12, 0, 0], "count": 2, "last_row": 1, "last": 1}]
    scalar = RowFormat(field="s", array=False)
    assert row_beats([[5], [-3]], scalar) == [{"s": 5, "last": 1}, {"s": -3, "last": 1}]


def test_stimulus_has_every_source_and_ends_with_source_zero():
    cfg = PacketsToRowsConfig.from_dict(A.PKT2ROW_CONFIGS[3])
    stim = A.PacketsToRowsModel.stimulus(cfg, 20, np.random.default_rng(3))
    tids = [p.src for p in stim["packets"]]
    assert tids[-1] == 7 and {7, 3, 250} <= set(tids)
    rows, dropped = A.PacketsToRowsModel.golden(cfg, stim)
    assert dropped == len([t for t in tids if t not in (7, 3, 250)]) > 0
    assert all(len(rows[t]) == 20 for t in (7, 3, 250))


# -- configuration -----------------------------------------------------------------------------

@pytest.mark.parametrize("cls, values, name", [
    (RowToPacketsConfig, {"elem_bits": 12}, "elem_bits"),
    (RowToPacketsConfig, {"field": "last"}, "field"),
    (RowToPacketsConfig, {"field": "a b"}, "field"),
    (RowToPacketsConfig, {"field_bits": 17, "elem_bits": 16}, "field_bits"),
    (RowToPacketsConfig, {"array": False, "lanes": 2}, "array"),
    (RowToPacketsConfig, {"max_packet_bytes": 0}, "max_packet_bytes"),
    (RowToPacketsConfig, {"row_elems": 0, "count": True}, "row_elems"),
    (RowToPacketsConfig, {"dest": 256}, "dest"),
    (RowToPacketsConfig, {"data_bits": 48}, "data_bits"),
    (PacketsToRowsConfig, {"sources": ""}, "sources[0]"),
    (PacketsToRowsConfig, {"sources": "1,1"}, "sources"),
    (PacketsToRowsConfig, {"sources": "1,300"}, "sources[1]"),
    (PacketsToRowsConfig, {"sources": "1:lanes=x"}, "sources[0]"),
    (PacketsToRowsConfig, {"sources": "1:colour=2"}, "sources[0]"),
    (PacketsToRowsConfig, {"sources": "2,1:elem_bits=24"}, "sources[1]"),
    (PacketsToRowsConfig, {"sources": "1:signed=maybe"}, "sources[0]"),
    (PacketsToRowsConfig, {"sources": "1:field=count"}, "sources[0]"),
    (PacketsToRowsConfig, {"sources": ",".join(map(str, range(17)))}, "sources"),
    (PacketsToRowsConfig, {"fifo_depth": 1}, "fifo_depth"),
])
def test_config_errors_name_the_parameter(cls, values, name):
    with pytest.raises(ConfigError) as e:
        cls.from_dict(values)
    assert e.value.param == name and "\n" not in str(e.value)


def test_source_overrides():
    cfg = PacketsToRowsConfig(sources="4:field=p:elem_bits=16:field_bits=9:signed=false,5",
                              field="v", lanes=3, row_elems=11)
    (t0, f0), (t1, f1) = cfg.source_formats
    assert (t0, f0.field, f0.elem_bits, f0.bits, f0.signed, f0.lanes) == (4, "p", 16, 9, False, 3)
    assert (t1, f1) == (5, cfg.format)
    assert PacketsToRowsConfig.from_dict(cfg.to_dict()) == cfg


# -- the I-BERT kernels' streams -----------------------------------------------------------------

def _kernel(name):
    """``(core, row_elems or {member: row_elems}, rows per matrix)`` of a small kernel."""
    from hwgen.ibert import attn_dot, gelu, layernorm, linear, requant, softmax, softmax_matmul
    M, d = 5, 24
    make = {
        "requant": (lambda: requant.Requant(requant.RequantConfig(lanes=5, row=23)), 23, 0),
        "gelu": (lambda: gelu.Gelu(gelu.GeluConfig(lanes=4, row=30)), 30, 0),
        "layernorm": (lambda: layernorm.LayerNorm(
            layernorm.LayerNormConfig(hidden=48, lanes=8)), 48, 0),
        "softmax": (lambda: softmax.Softmax(softmax.SoftmaxConfig(lanes=3, max_len=M)), M, 0),
        "attn-dot": (lambda: attn_dot.AttnDot(
            attn_dot.AttnDotConfig(head_dim=d, max_len=8, pes=4)),
            {"i_q": M * d, "i_k": M * d, "o_s": M}, M),
        "softmax-matmul": (lambda: softmax_matmul.SoftmaxMatmul(
            softmax_matmul.SoftmaxMatmulConfig(head_dim=d, max_len=8, pes=3)),
            {"i_p": M, "i_v": M * d, "o_o": M * d}, M),
        "linear": (lambda: linear.Linear(
            linear.LinearConfig(in_features=40, out_features=16, tiles=4, pes=8)),
            {"i_x": 40, "o_y": 16}, M),
    }[name]
    core = make[0]()
    core._MustUse__silence = True           # never elaborated here
    return (core,) + make[1:]


#: Kernel streams an adapter feeds or drains directly.
KERNEL_PORTS = [(k, p) for k, ps in [
    ("requant", ("i_x", "o_y")), ("gelu", ("i_x",)), ("layernorm", ("i_row",)),
    ("softmax", ("i_x", "o_y")), ("attn-dot", ("i_q", "i_k", "o_s")),
    ("softmax-matmul", ("i_p", "i_v", "o_o")), ("linear", ("i_x", "o_y"))] for p in ps]


@pytest.mark.parametrize("kernel, member", KERNEL_PORTS)
def test_kernel_streams_connect_to_adapters(kernel, member):
    """A format read from the kernel's ports.json entry gives the kernel's own payload layout;
    the adapter then connects with ``wiring.connect`` (no reshaping)."""
    core, row, rows = _kernel(kernel)
    row = row[member] if isinstance(row, dict) else row
    sig = core.signature.members[member]
    layout = sig.signature.members["payload"].shape
    entry = StreamFormat.from_shape(layout).to_dict()
    fmt = A_spec.row_format_from_ports(entry, row, rows=rows)
    assert fmt.layout() == layout
    m = Module()
    if sig.flow == In:
        adapter = A.PacketsToRows(PacketsToRowsConfig(sources="3", **asdict(fmt)))
        wiring.connect(m, adapter.o_0, getattr(core, member))
    else:
        adapter = A.RowToPackets(RowToPacketsConfig(**asdict(fmt)))
        wiring.connect(m, getattr(core, member), adapter.i_row)
    m._MustUse__silence = adapter._MustUse__silence = True


@pytest.mark.parametrize("kernel, member", [("gelu", "o_y"), ("layernorm", "o_row")])
def test_too_wide_kernel_output_is_refused(kernel, member):
    """i-GELU's (47 bits) and LayerNorm's (33 bits) outputs are requantised before they
    travel (the reference's QuantAct follows both)."""
    core, row, _ = _kernel(kernel)
    layout = core.signature.members[member].signature.members["payload"].shape
    with pytest.raises(ConfigError, match="field_bits"):
        A_spec.row_format_from_ports(StreamFormat.from_shape(layout).to_dict(), row)


def test_join_rows_zips_two_sources_into_requant_identity_input():
    from hwgen.ibert import requant
    core = requant.Requant(requant.RequantConfig(lanes=2, row=3, identity=True))
    core._MustUse__silence = True
    fq = RowFormat(field="q", lanes=2, elem_bits=32, row_elems=3)
    fi = RowFormat(field="id", lanes=2, elem_bits=8, row_elems=3)

    class Top(wiring.Component):
        def __init__(self):
            super().__init__({"a": In(stream.Signature(fq.layout())),
                              "b": In(stream.Signature(fi.layout())),
                              "o": Out(stream.Signature(core.i_x.payload.shape()))})

        def elaborate(self, platform):
            m = Module()
            A.join_rows(m, [(self.a, "q"), (self.b, "id")], self.o)
            return m

    top = Top()
    sim = Simulator(top)
    seen = []

    async def bench(ctx):
        ctx.set(top.a.payload, {"q": [1, -70000], "last": 1})
        ctx.set(top.b.payload, {"id": [5, -7], "last": 0})
        for va, vb, rdy in [(1, 0, 1), (0, 1, 1), (1, 1, 0), (1, 1, 1)]:
            ctx.set(top.a.valid, va)
            ctx.set(top.b.valid, vb)
            ctx.set(top.o.ready, rdy)
            await ctx.delay(1e-6)
            seen.append((ctx.get(top.o.valid), ctx.get(top.a.ready), ctx.get(top.b.ready)))
        p = ctx.get(top.o.payload)
        seen.append(([int(x) for x in p.q], [int(x) for x in p.id], int(p.last)))

    sim.add_testbench(bench)
    sim.run()
    assert seen == [(0, 0, 0), (0, 0, 0), (1, 0, 0), (1, 1, 1), ([1, -70000], [5, -7], 1)]


# -- Verilator ---------------------------------------------------------------------------------

def _run(name, index, **kw):
    acc = registry.get(name)
    cfg = acc.config.from_dict(acc.test_configs[index])
    return simulate(acc, cfg, **kw)


@requires_verilator
@pytest.mark.parametrize("name, index", [("cluster-row2pkt", 1), ("cluster-row2pkt", 3),
                                         ("cluster-pkt2row", 1), ("cluster-pkt2row", 3)])
def test_cocotb_bit_exact_under_heavy_stalls(name, index):
    """cocotb engine (test_sim.py runs only each registry entry's first config on it)."""
    r = _run(name, index, items=25, seed=40 + index, stall=0.5, engine="cocotb")
    assert not r["timeout"] and r["results"] > 0
    assert r["mismatches"] == 0, r["first_mismatches"]
    if name == "cluster-pkt2row":
        assert r["status_dropped"] == r["status_dropped_expected"] > 0


@requires_verilator
def test_row2pkt_rates_without_stalls():
    """Input-bound (3 bytes per beat into 8-byte beats): one input beat per cycle; output-bound
    (24-byte beats): one packet beat per cycle."""
    r = _run("cluster-row2pkt", 0, items=60, seed=5, stall=0.0, engine="native")
    assert r["mismatches"] == 0 and r["input_items_per_cycle"] >= 0.99
    r = _run("cluster-row2pkt", 4, items=60, seed=5, stall=0.0, engine="native")
    assert r["mismatches"] == 0 and r["results_per_cycle"] >= 0.99


@requires_verilator
def test_pkt2row_rate_without_stalls():
    r = _run("cluster-pkt2row", 0, items=60, seed=5, stall=0.0, engine="native")
    assert r["mismatches"] == 0 and r["input_items_per_cycle"] >= 0.9
