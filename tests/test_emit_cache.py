"""The Verilog cache of :func:`hwgen.flow.emit.emit_accelerator`: a hit gives the text Amaranth
would emit, and whatever the Verilog depends on (configuration, accelerator, board files,
hwgen's sources) is in the key."""

import json

from hwgen import registry
from hwgen.flow import emit
from hwgen.flow.emit import emit_accelerator, emit_verilog


def _emit(tmp_path, monkeypatch, sub, acc, cfg):
    monkeypatch.setenv("HWGEN_CACHE", str(tmp_path / "cache"))
    return emit_accelerator(acc, cfg, tmp_path / sub)


def test_a_hit_is_the_emitted_text(tmp_path, monkeypatch):
    acc = registry.get("pq-decoder")
    cfg = acc.make_config(["m=5"])
    v1, p1 = _emit(tmp_path, monkeypatch, "a", acc, cfg)
    stored = list((tmp_path / "cache" / "verilog").iterdir())
    assert len(stored) == 1
    (stored[0] / f"{acc.top_name}.v").write_text("// a planted copy\n")
    v2, p2 = _emit(tmp_path, monkeypatch, "b", acc, cfg)
    assert v2.read_text() == "// a planted copy\n"          # served from the cache
    assert p2 == p1 == json.loads((tmp_path / "b" / "ports.json").read_text())
    fresh, _ = emit_verilog(acc.build_core(cfg), acc.top_name, tmp_path / "c")
    assert v1.read_text() == fresh.read_text()


def test_the_key_holds_config_and_sources(tmp_path, monkeypatch):
    acc = registry.get("pq-decoder")
    _emit(tmp_path, monkeypatch, "a", acc, acc.make_config(["m=5"]))
    _emit(tmp_path, monkeypatch, "b", acc, acc.make_config(["m=6"]))
    monkeypatch.setattr(emit, "_package_fingerprint", lambda: "an edited source tree")
    _emit(tmp_path, monkeypatch, "c", acc, acc.make_config(["m=5"]))
    assert len(list((tmp_path / "cache" / "verilog").iterdir())) == 3
    m5, m6 = (tmp_path / "a" / f"{acc.top_name}.v").read_text(), \
        (tmp_path / "b" / f"{acc.top_name}.v").read_text()
    assert m5 != m6


def test_board_files_are_in_the_key(tmp_path, monkeypatch):
    from hwgen import boards
    before = emit.source_fingerprint()
    board_dir = tmp_path / "boards"
    board_dir.mkdir()
    for path in sorted(boards.BOARDS_DIR.glob("*.toml")):
        (board_dir / path.name).write_text(path.read_text())
    monkeypatch.setattr(boards, "BOARDS_DIR", board_dir)
    assert emit.source_fingerprint() == before
    (board_dir / "u280.toml").write_text((board_dir / "u280.toml").read_text() + "\n# edited\n")
    assert emit.source_fingerprint() != before
