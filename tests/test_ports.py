"""Stream payload packing (hwgen.flow.ports) and AXI-conventional top-level ports (emit)."""

import json

import pytest
from amaranth.hdl import signed, unsigned
from amaranth.lib import data

from hwgen import registry
from hwgen.flow.emit import emit_verilog, stream_port_name
from hwgen.flow.ports import StreamFormat

LAYOUT = data.StructLayout({
    "a": data.ArrayLayout(signed(5), 3),
    "b": unsigned(9),
    "last": unsigned(1),
    "c": signed(3),
})


def test_format_offsets():
    fmt = StreamFormat.from_shape(LAYOUT)
    assert [(f.name, f.offset, f.width) for f in fmt.fields] == [("a", 0, 15), ("b", 15, 9),
                                                                   ("c", 24, 3)]
    assert fmt.has_last and fmt.tdata_bits == 32 and fmt.data_bits == 27


def test_pack_known_word():
    fmt = StreamFormat.from_shape(LAYOUT)
    word = fmt.pack({"a": [1, -1, -16], "b": 300, "c": -4})
    # a0=00001, a1=11111, a2=10000 ; b=100101100 ; c=100
    expected = 0b00001 | 0b11111 << 5 | 0b10000 << 10 | 300 << 15 | 0b100 << 24
    assert word == expected
    assert fmt.unpack(word) == {"a": [1, -1, -16], "b": 300, "c": -4}


@pytest.mark.parametrize("beat, message", [
    ({"a": [16, 0, 0], "b": 0, "c": 0}, r"a\[0\] = 16 outside -16..15"),
    ({"a": [0, 0, 0], "b": 512, "c": 0}, "b.* = 512 outside 0..511"),
    ({"a": [0, 0], "b": 0, "c": 0}, "expected 3 elements"),
])
def test_pack_rejects_out_of_range(beat, message):
    with pytest.raises(ValueError, match=message):
        StreamFormat.from_shape(LAYOUT).pack(beat)


def test_non_struct_payload_rejected():
    with pytest.raises(TypeError, match="StructLayout"):
        StreamFormat.from_shape(unsigned(8))


def test_port_names():
    from amaranth.lib.wiring import In, Out
    assert stream_port_name("i_codes", In) == "s_axis_codes"
    assert stream_port_name("o_dist", Out) == "m_axis_dist"
    assert stream_port_name("i", In) == "s_axis"


def test_pq_decoder_ports_json(tmp_path):
    acc = registry.get("pq-decoder")
    cfg = acc.make_config(["m=5", "lut_bits=11", "tag_bits=3"])
    v_path, ports = emit_verilog(acc.build_core(cfg), acc.top_name, tmp_path)
    assert json.loads((tmp_path / "ports.json").read_text()) == ports
    streams = {s["port"]: s for s in ports["streams"]}
    assert set(streams) == {"s_axis_lut", "s_axis_codes", "m_axis_dist", "m_axis_lut"}
    codes = streams["s_axis_codes"]
    assert codes["tlast"] and codes["tdata_bits"] == 48       # 5 x 8 + 3 -> 43 -> 48
    assert [(f["name"], f["offset"], f["bits"], f["count"]) for f in codes["fields"]] == \
        [("code", 0, 8, 5), ("tag", 40, 3, 1)]
    dist = streams["m_axis_dist"]
    assert dist["fields"][0] == {"name": "dist", "offset": 0, "bits": 14, "count": 1,
                                 "signed": False, "array": False}   # 5 * 2047 < 2**14
    text = v_path.read_text()
    for port in ("ap_clk", "ap_rst_n", "s_axis_codes_tdata", "s_axis_codes_tlast",
                 "m_axis_dist_tready", "s_axis_lut_tvalid"):
        assert port in text
    assert "s_axis_lut_tlast" not in text


def test_sidebands_only_in_packet_streams():
    """keep/dest/id/user ride on TKEEP/TDEST/TID/TUSER only when the payload has ``keep``;
    elsewhere they are ordinary TDATA fields (e.g. an array named ``id``)."""
    from amaranth.hdl import signed as s
    from amaranth.lib import data as d
    from hwgen.cluster.spec.packet import packet_layout
    pkt = StreamFormat.from_shape(packet_layout(64))
    assert dict(pkt.sidebands) == {"keep": 8, "dest": 8, "id": 8, "user": 17}
    assert pkt.tdata_bits == 64 and [f.name for f in pkt.fields] == ["data"]
    plain = StreamFormat.from_shape(d.StructLayout({"x": 8, "id": d.ArrayLayout(s(8), 3),
                                                    "dest": 4, "last": 1}))
    assert plain.sidebands == () and [f.name for f in plain.fields] == ["x", "id", "dest"]
    assert plain.tdata_bits == 40
