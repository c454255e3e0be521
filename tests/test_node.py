"""ChamVS node: memory layout, golden model against faiss, cycle model against simulation."""

import numpy as np
import pytest

from hwgen import registry
from hwgen.errors import ConfigError
from hwgen.flow.simulate import simulate
from hwgen.vecsearch.layout import pack_index
from hwgen.vecsearch.node import ChamVSNodeConfig
from hwgen.vecsearch.node_model import exact_neighbours, node_search, prepare, recall_at

from conftest import requires_faiss, requires_verilator


def test_layout_round_trip():
    """Every code and id can be read back from the images at the documented places."""
    rng = np.random.default_rng(0)
    m, channels, word, idb = 16, 3, 64, 4
    sizes = [0, 1, 5, 13, 40]
    codes = [rng.integers(0, 256, size=(n, m), dtype=np.uint8) for n in sizes]
    ids = [rng.integers(0, 1 << 31, size=n) for n in sizes]
    lay = pack_index(codes, ids, channels=channels, word_bytes=word, m=m, id_bytes=idb)
    cpw = word // m
    for lst, n in enumerate(sizes):
        for ch in range(channels):
            img = lay.images[ch]
            assert lay.count[lst, ch] == len(range(ch, n, channels))
            assert lay.words(lst, ch) == max(1, -(-lay.count[lst, ch] // cpw))
            for pos, i in enumerate(range(ch, n, channels)):       # vector i -> (ch, pos)
                at = lay.code_word[lst, ch] * word + (pos // cpw) * word + (pos % cpw) * m
                assert img[at:at + m] == codes[lst][i].tobytes()
                at = lay.id_word[lst, ch] * word + pos * idb
                assert int.from_bytes(img[at:at + idb], "little") == ids[lst][i]
            pad_from = lay.code_word[lst, ch] * word + lay.count[lst, ch] * m
            pad_to = (lay.code_word[lst, ch] + lay.words(lst, ch)) * word
            assert img[pad_from:pad_to] == bytes(pad_to - pad_from)      # zero padding
        assert [e["count"] for e in lay.table_entries()[lst * channels:(lst + 1) * channels]] \
            == lay.count[lst].tolist()
    for ch in range(channels):
        assert len(lay.images[ch]) % word == 0


@pytest.mark.parametrize("values, message", [
    ({"board": "u280", "m": 64}, r"^m=64: must divide the 32-byte AXI word of u280"),
    ({"channels": 5}, r"^channels=5: must be in 0\.\.4 \(u250 has 4 DDR4 channels\)"),
    ({"dim": 96, "m": 64}, r"^m=64: must divide dim=96"),
    ({"board": "nope"}, r"^board='nope': must be one of"),
    ({"l1_len": 11}, r"^l1_len=11: must be in 0\.\.k=10"),
])
def test_node_config_errors(values, message):
    with pytest.raises(ConfigError, match=message):
        ChamVSNodeConfig(**values)


def test_node_derives_units_from_the_board():
    assert ChamVSNodeConfig(m=16).units == 4 * 64 // 16
    assert ChamVSNodeConfig(m=32, board="u280").units == 32 * 32 // 32
    assert ChamVSNodeConfig(m=8, channels=1).units == 8


@requires_faiss
def test_node_golden_agrees_with_faiss():
    """On all 200 held-out digits queries the node's recall@10 is within 0.01 of faiss's
    IndexIVFPQ on the same index, with an exact LUT (24-bit entries, no shift)."""
    cfg = ChamVSNodeConfig(k=10)
    data = prepare(cfg, count=200, rng=np.random.default_rng(0))
    found = [node_search(cfg, data, q, p)[1] for q, p in zip(data.queries, data.probes)]
    truth = exact_neighbours(data.base, data.queries, 10)
    data.index.index.nprobe = cfg.nprobe_max
    _, faiss_ids = data.index.index.search(data.queries.astype(np.float32), 10)
    node, faiss_r = recall_at(found, truth, 10), recall_at(faiss_ids, truth, 10)
    assert abs(node - faiss_r) <= 0.01
    same = np.mean([set(f.tolist()) == set(g.tolist()) for f, g in zip(found, faiss_ids)])
    assert same >= 0.9


@requires_faiss
def test_node_distances_equal_faiss_distances():
    """With exact K-selection, the node's top-k distances are faiss's, query by query."""
    cfg = ChamVSNodeConfig(k=10, l1_len=10)
    data = prepare(cfg, count=50, rng=np.random.default_rng(1))
    data.index.index.nprobe = cfg.nprobe_max
    dist, _ = data.index.index.search(data.queries.astype(np.float32), 10)
    for q, p, ref in zip(data.queries, data.probes, dist):
        assert node_search(cfg, data, q, p)[0].tolist() == ref.astype(np.int64).tolist()


@requires_verilator
@requires_faiss
@pytest.mark.parametrize("index", range(len(registry.get("chamvs-node").test_configs)))
def test_cycle_model_within_five_percent(index):
    from hwgen.vecsearch.bench import run_node_case
    acc = registry.get("chamvs-node")
    cfg = acc.config.from_dict(acc.test_configs[index])
    result, pairs = run_node_case(cfg, queries=6, seed=2, engine="native")
    assert result["mismatches"] == 0
    for measured, predicted in pairs:
        assert abs(predicted - measured) <= 0.05 * measured


@requires_verilator
@requires_faiss
def test_user_vectors_dimension_96(tmp_path):
    """The --base/--queries path: a user's float vectors of a non-power-of-two dimension."""
    from click.testing import CliRunner
    from hwgen.cli import main
    from hwgen.datasets import digits
    x, _ = digits()
    proj = np.random.default_rng(0).standard_normal((64, 96)).astype(np.float32) / 8
    v = x.astype(np.float32) @ proj
    np.save(tmp_path / "base.npy", v[:1500])
    np.save(tmp_path / "queries.npy", v[1500:])
    out = tmp_path / "n.json"
    res = CliRunner().invoke(main, ["sim", "chamvs-node", "--base", str(tmp_path / "base.npy"),
                                    "--queries", str(tmp_path / "queries.npy"), "--m", "32",
                                    "--nlist", "12", "--nprobe", "3", "--queries-count", "6",
                                    "--stall", "0.2", "--engine", "native",
                                    "--json", str(out)])
    assert res.exit_code == 0, res.output
    import json
    data = json.loads(out.read_text())
    assert data["mismatches"] == 0 and data["config"]["dim"] == 96 and data["nprobe"] == 3
    assert data["recall"]["recall@10"] == data["faiss_recall"]["recall@10"] or \
        abs(data["recall"]["recall@10"] - data["faiss_recall"]["recall@10"]) <= 0.01


@requires_verilator
@requires_faiss
def test_scan_loses_no_memory_cycle():
    """On the default digits index (LUT-bound) no memory cycle is lost (efficiency >= 0.95).
    The long-list case (digits replicated 32 times, nlist 4: the scan at 0.95 of channels x
    64 / m codes per cycle or more) is ``hwgen bench chamvs``'s, which asserts it (a
    51,104-vector simulation)."""
    from hwgen.vecsearch.bench import run_node_case
    default = ChamVSNodeConfig()
    result, _ = run_node_case(default, queries=4, engine="native")
    assert result["mismatches"] == 0 and result["scan_efficiency"] >= 0.95
