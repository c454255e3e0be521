"""Tests of hwgen.boards and the board files in boards/."""

import re
import shutil

import pytest

import hwgen.boards as boards
from hwgen.boards import BOARDS_DIR, board_names, load_board, load_board_file
from hwgen.errors import ConfigError

EXPECTED = ["sidewinder", "u250", "u280", "u55c", "vck190", "vck5000"]

# A small valid board file; the malformed-file tests each break one thing in it.
MINIMAL = """\
name = "tiny"
title = "Tiny test board"
part = "xcu280-fsvh2892-2L-e"
family = "xcup"
vitis_platform = "test_platform"
kernel_clock_mhz = 250
source = "test"

[resources]
lut = 1000
ff = 2000
bram36 = 50
uram = 10
dsp = 40
scope = "user"
source = "test"

[[memory]]
kind = "HBM"
count = 4
axi_data_bits = 256
bandwidth_gbytes_per_s = 14.375
capacity_gib = 0.25
vitis_bank = "HBM[{index}]"
source = "test"

[[memory]]
kind = "DDR4"
count = 2
axi_data_bits = 512
bandwidth_gbytes_per_s = 19.25
capacity_gib = 16
vitis_bank = "DDR[{index}]"
source = "test"
"""


def write(tmp_path, text, name="tiny"):
    path = tmp_path / f"{name}.toml"
    path.write_text(text)
    return path


# --------------------------------------------------------------------------- the real files


def test_board_names_are_the_six_files():
    assert board_names() == EXPECTED
    assert sorted(p.stem for p in BOARDS_DIR.glob("*.toml")) == EXPECTED


@pytest.mark.parametrize("name", EXPECTED)
def test_every_board_loads_and_is_cited(name):
    b = load_board(name)
    assert b.name == name == b.path.stem
    assert b.path.parent == BOARDS_DIR
    assert set(b.resources) == {"lut", "ff", "bram36", "uram", "dsp"}
    assert all(isinstance(v, int) and v > 0 for v in b.resources.values())
    assert b.resources_scope in ("user", "device")
    assert b.kernel_clock_mhz > 0
    assert b.memory and b.primary_memory is b.memory[0]
    # every table carries a non-empty source
    assert b.source.strip() and b.resources_source.strip()
    assert all(m.source.strip() for m in b.memory)
    assert all(n.source.strip() for n in b.network)
    if b.aie_tiles is not None:
        assert b.aie_source.strip()


def test_load_board_is_cached():
    assert load_board("u280") is load_board("u280")


def test_u280_hbm_and_ddr():
    b = load_board("u280")
    hbm = b.primary_memory
    assert (hbm.kind, hbm.count, hbm.axi_data_bits) == ("HBM", 32, 256)
    assert hbm.bank(0) == "HBM[0]"
    assert hbm.bank(31) == "HBM[31]"
    for bad in (32, -1, 1.0, True, "0"):
        with pytest.raises(ConfigError, match="index"):
            hbm.bank(bad)
    # 8 GB in 32 pseudo-channels, 460 GB/s in all (UG1393)
    assert hbm.total_capacity_gib == pytest.approx(8.0)
    assert hbm.total_bandwidth_gbytes_per_s == pytest.approx(460.0)
    ddr = b.memory_of("DDR4")
    assert (ddr.count, ddr.capacity_gib) == (2, 16)
    # channels() walks HBM then DDR in declared order
    ch = b.channels()
    assert len(ch) == 34
    assert ch[0] == ("HBM", 0, "HBM[0]") and ch[31] == ("HBM", 31, "HBM[31]")
    assert ch[32:] == [("DDR4", 0, "DDR[0]"), ("DDR4", 1, "DDR[1]")]
    assert b.channels("DDR4") == ch[32:]


def test_u250_four_ddr4_channels_512_bit():
    b = load_board("u250")
    assert b.memory_kinds == ("DDR4",)
    ddr = b.primary_memory
    assert (ddr.kind, ddr.count, ddr.axi_data_bits) == ("DDR4", 4, 512)
    assert ddr.bytes_per_beat == 64            # Chameleon: 64 bytes per channel per cycle
    assert ddr.total_capacity_gib == 64
    assert [bank for _, _, bank in b.channels()] == ["DDR[0]", "DDR[1]", "DDR[2]", "DDR[3]"]
    with pytest.raises(ConfigError, match="memory kind"):
        b.channels("HBM")


def test_single_bank_and_no_platform_boards():
    vck190 = load_board("vck190")
    assert vck190.channels() == [("DDR4", 0, "DDR"), ("LPDDR4", 0, "LPDDR")]
    assert vck190.aie_tiles == 400 and vck190.family_note
    assert load_board("vck5000").primary_memory.bank(0) == "MC_NOC0"
    sw = load_board("sidewinder")
    assert sw.vitis_platform == "" and sw.vitis_platform_note
    assert sw.channels() == [("DDR4", 0, None)]
    with pytest.raises(ConfigError, match="no Vitis"):
        sw.primary_memory.bank(0)


# --------------------------------------------------------------------------- percent()


def test_percent_hand_computed(tmp_path):
    b = load_board_file(write(tmp_path, MINIMAL))
    # lut 250/1000, ff 500/2000, bram 30 BRAM18 of 2*50=100, uram 1/10, dsp 10/40
    got = b.percent({"lut": 250, "ff": 500, "bram": 30, "uram": 1, "dsp": 10})
    assert got == pytest.approx({"lut": 25.0, "ff": 25.0, "bram": 30.0, "uram": 10.0,
                                 "dsp": 25.0})
    # missing keys count as 0
    assert b.percent({"dsp": 4}) == pytest.approx({"lut": 0.0, "ff": 0.0, "bram": 0.0,
                                                   "uram": 0.0, "dsp": 10.0})


def test_percent_on_u250_user_resources():
    b = load_board("u250")
    got = b.percent({"lut": 134_100, "bram": 400, "dsp": 11_508})
    assert got["lut"] == pytest.approx(10.0)        # of 1,341,000
    assert got["bram"] == pytest.approx(10.0)       # 400 BRAM18 of 2 * 2,000
    assert got["dsp"] == pytest.approx(100.0)


@pytest.mark.parametrize("counts, key", [({"luts": 1}, "counts"), ({"lut": -1}, "lut"),
                                         ({"dsp": "3"}, "dsp"), ({"ff": float("nan")}, "ff")])
def test_percent_rejects_bad_counts(counts, key):
    with pytest.raises(ConfigError, match=key):
        load_board("u280").percent(counts)


# --------------------------------------------------------------------------- errors


def test_unknown_board():
    with pytest.raises(ConfigError) as e:
        load_board("u999")
    assert e.value.param == "board"
    msg = str(e.value)
    assert msg.startswith("board='u999'")
    assert "unknown board; choose one of: " + ", ".join(EXPECTED) in msg


def test_path_like_names_are_unknown():
    with pytest.raises(ConfigError, match="unknown board"):
        load_board("../boards/u280")


def test_monkeypatched_boards_dir(tmp_path, monkeypatch):
    write(tmp_path, MINIMAL)
    monkeypatch.setattr(boards, "BOARDS_DIR", tmp_path)
    assert board_names() == ["tiny"]
    assert load_board("tiny").channels("HBM")[3] == ("HBM", 3, "HBM[3]")
    with pytest.raises(ConfigError, match="choose one of: tiny"):
        load_board("u280")


def test_missing_memory_source_names_file_and_key(tmp_path, monkeypatch):
    # A copy of the real u280 file with the DDR4 table's source removed.
    text = (BOARDS_DIR / "u280.toml").read_text()
    ddr_at = text.index('kind = "DDR4"')
    head, tail = text[:ddr_at], text[ddr_at:]
    tail = re.sub(r'\nsource = """.*?"""\n', "\n", tail, count=1, flags=re.S)
    assert "source" not in tail.split("[[network]]")[0]
    (tmp_path / "u280.toml").write_text(head + tail)
    monkeypatch.setattr(boards, "BOARDS_DIR", tmp_path)
    with pytest.raises(ConfigError) as e:
        load_board("u280")
    assert str(e.value) == "u280.toml:memory[1].source: missing required key"


@pytest.mark.parametrize("old, new, key, reason", [
    ('kernel_clock_mhz = 250\n', "", "kernel_clock_mhz", "missing required key"),
    ('[resources]\nlut = 1000\n', "[resources]\n", "resources.lut", "missing required key"),
    ('count = 4\n', 'count = "4"\n', "memory[0].count", "must be an integer"),
    ('count = 4\n', "count = 0\n", "memory[0].count", "positive"),
    ('count = 2\n', "count = -2\n", "memory[1].count", "positive"),
    ('dsp = 40\n', "dsp = 40.0\n", "resources.dsp", "must be an integer"),
    ('uram = 10\n', "uram = true\n", "resources.uram", "must be an integer"),
    ('capacity_gib = 0.25\n', "capacity_gib = 0\n", "memory[0].capacity_gib", "positive"),
    ('kernel_clock_mhz = 250\n', 'kernel_clock_mhz = "fast"\n', "kernel_clock_mhz",
     "must be a number"),
    ('kind = "HBM"\n', 'kind = "SRAM"\n', "memory[0].kind", "must be one of"),
    ('kind = "DDR4"\n', 'kind = "HBM"\n', "memory[1].kind", "duplicate"),
    ('axi_data_bits = 256\n', "axi_data_bits = 100\n", "memory[0].axi_data_bits", "one of"),
    ('"HBM[{index}]"', '"HBM"', "memory[0].vitis_bank", "needs {index}"),
    ('"HBM[{index}]"', '"HBM[{i}]"', "memory[0].vitis_bank", "only contain"),
    ('scope = "user"\n', 'scope = "shell"\n', "resources.scope", "must be one of"),
    ('family = "xcup"\n', 'family = "versal"\n', "family", "must be one of"),
    ('name = "tiny"\n', 'name = "other"\n', "name", "file name stem"),
    ('title = "Tiny test board"\n', 'title = ""\n', "title", "must not be empty"),
    ('source = "test"\n\n[resources]', 'source = "test"\nsauce = 1\n\n[resources]', "sauce",
     "unknown key"),
    ('vitis_platform = "test_platform"\n', 'vitis_platform = ""\n', "vitis_platform_note",
     "required when vitis_platform is empty"),
    ('part = "xcu280-fsvh2892-2L-e"\n', 'part = "xcvc1902-vsva2197-2MP-e-S"\n', "family_note",
     "Versal"),
    ('part = "xcu280-fsvh2892-2L-e"\n', 'part = "U280 card"\n', "part", "Vivado part"),
])
def test_malformed_file(tmp_path, old, new, key, reason):
    assert old in MINIMAL
    path = write(tmp_path, MINIMAL.replace(old, new, 1))
    with pytest.raises(ConfigError) as e:
        load_board_file(path)
    msg = str(e.value)
    assert e.value.param == f"tiny.toml:{key}"
    assert msg.startswith(f"tiny.toml:{key}")
    assert reason in msg


def test_memory_table_without_source(tmp_path):
    text = MINIMAL.rsplit('source = "test"\n', 1)[0]     # drop the DDR4 table's source
    with pytest.raises(ConfigError, match=re.escape("tiny.toml:memory[1].source: missing")):
        load_board_file(write(tmp_path, text))


def test_no_memory_and_bad_toml(tmp_path):
    no_mem = MINIMAL.split("[[memory]]")[0]
    with pytest.raises(ConfigError, match=re.escape("tiny.toml:memory: missing required key")):
        load_board_file(write(tmp_path, no_mem))
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_board_file(write(tmp_path, MINIMAL + "\nlut = = 3\n"))


def test_minimal_file_is_valid(tmp_path):
    # guards the malformed-file tests: the unbroken template must load
    b = load_board_file(write(tmp_path, MINIMAL))
    assert b.memory_kinds == ("HBM", "DDR4") and b.primary_memory.bank(3) == "HBM[3]"


def test_copy_of_real_board_loads_from_other_dir(tmp_path):
    shutil.copy(BOARDS_DIR / "vck5000.toml", tmp_path / "vck5000.toml")
    b = load_board("vck5000", boards_dir=tmp_path)
    assert b.path.parent == tmp_path.resolve() and b.aie_tiles == 400
