"""Recommendation embedding tables: placement over a board's memories, host-side packing, the
golden lookup against PyTorch's EmbeddingBag, and the lookup unit's cycle model and
out-of-range handling in simulation.

Bit-exactness with random stalls in every test configuration is tests/test_sim.py's job.
"""

import math

import numpy as np
import pytest
from amaranth.back import rtlil

from hwgen import registry
from hwgen.boards import load_board
from hwgen.errors import ConfigError
from hwgen.flow.simulate import simulate
from hwgen.recsys import golden
from hwgen.recsys.embedding import (TEST_CONFIGS, Embedding, EmbeddingConfig, EmbeddingModel,
                                    onchip_rows, synthetic_model)
from hwgen.recsys.model import RecModel, Table, preset
from hwgen.recsys.placement import onchip_capacity, pack_tables, place

from conftest import requires_verilator

GIB = 1 << 30


def small_model(rows, dims, elem_bits=16, dense=3, seed=5):
    return RecModel(name="t", tables=tuple(Table(r, d) for r, d in zip(rows, dims)),
                    dense=dense, layers=(1,), act_bits=(elem_bits,), shifts=(), seed=seed)


# -- placement ---------------------------------------------------------------------------------

CASES = [
    ("paper-ctr", "u280", {}),
    ("paper-ctr", "u250", {}),
    ("paper-ctr", "vck190", {}),
    ("paper-ctr", "u280", {"hbm_channels": 7, "onchip_bytes": 0}),
    ("small-ctr", "u280", {"onchip_bytes": 4096, "hbm_channels": 3, "ddr_channels": 1,
                           "hbm_table_max_bytes": 60000}),
    ("small-ctr", "u55c", {"onchip_bytes": 0}),
    ("small-ctr", "u250", {"onchip_bytes": 2000}),
    ("small-ctr", "u280", {"hbm_channels": 0, "onchip_bytes": 100}),
] + [("config", None, d) for d in TEST_CONFIGS]


def _case(name, board, caps):
    if name == "config":
        cfg = EmbeddingConfig.from_dict(caps)
        return cfg.rec_model, load_board(cfg.board), cfg.placement, {
            k: (None if v < 0 else v) for k, v in cfg.to_dict().items()
            if k in ("onchip_bytes", "hbm_channels", "ddr_channels", "hbm_table_max_bytes")}
    model, b = preset(name), load_board(board)
    return model, b, place(model, b, **caps), caps


def _hbm_limit(board, caps):
    hbm = [m for m in board.memory if m.kind == "HBM"]
    if not hbm or caps.get("hbm_channels") == 0:
        return -1
    cap = int(hbm[0].capacity_gib * GIB)
    limit = caps.get("hbm_table_max_bytes")
    return cap if limit is None else min(cap, limit)


@pytest.mark.parametrize("name, board, caps", CASES,
                         ids=[f"{n}-{b}-{i}" for i, (n, b, _) in enumerate(CASES)])
def test_placement_properties(name, board, caps):
    model, b, p, caps = _case(name, board, caps)
    eb = model.elem_bits
    n = len(model.tables)
    exact = [t.rows * t.dim * eb // 8 for t in model.tables]

    # every table placed exactly once
    assert [s.table for s in p.slots] == list(range(n))
    on_channels = sorted(t for ch in p.channels for t in ch.tables)
    assert sorted(on_channels + list(p.onchip)) == list(range(n))

    # on chip: the smallest tables, within the budget
    budget = caps.get("onchip_bytes")
    budget = onchip_capacity(b) // 2 if budget is None else budget
    assert sum(exact[t] for t in p.onchip) <= budget
    off = [t for t in range(n) if t not in p.onchip]
    if p.onchip and off:
        assert max(exact[t] for t in p.onchip) <= min(exact[t] for t in off)

    # channels: capacity, alignment, disjoint tables, power-of-two row strides
    mems = {m.kind: m for m in b.memory}
    limit = _hbm_limit(b, caps)
    for ch in p.channels:
        mem = mems[ch.kind]
        assert ch.index < mem.count
        assert ch.rounds == len(ch.tables) >= 1
        assert ch.bytes <= mem.capacity_gib * GIB
        end = 0
        for t in ch.tables:
            s, table = p.slots[t], model.tables[t]
            assert s.where == ch.port
            assert s.base % 4096 == 0 and s.base >= end
            assert s.stride >= table.dim * eb // 8 and s.stride & (s.stride - 1) == 0
            assert s.bytes == table.rows * s.stride
            assert s.beats == max(1, s.stride // ch.word_bytes)
            end = s.base + s.bytes
            if ch.kind == "HBM":
                assert s.bytes <= limit          # larger tables must go to DDR
        assert end == ch.bytes
        if ch.kind == "HBM" and caps.get("hbm_channels") is not None:
            assert ch.index < caps["hbm_channels"]
    ddr = [ch for ch in p.channels if ch.kind != "HBM"]
    if caps.get("ddr_channels") is not None:
        assert len(ddr) <= caps["ddr_channels"]
    for t in off:                              # too large for HBM -> DDR
        if p.slots[t].bytes > limit:
            assert not p.slots[t].where.startswith("m_axi_hbm")


@pytest.mark.parametrize("name, board, caps", CASES,
                         ids=[f"{n}-{b}-{i}" for i, (n, b, _) in enumerate(CASES)])
def test_placement_balance(name, board, caps):
    """Lookups (tables) per channel differ by at most one among the usable channels of a kind,
    and the busiest channel has as few rounds as the tables forced to DDR allow."""
    model, b, p, caps = _case(name, board, caps)
    limit = _hbm_limit(b, caps)
    hbm_usable = [m.count for m in b.memory if m.kind == "HBM"]
    hbm_usable = min(hbm_usable[0], caps.get("hbm_channels") or hbm_usable[0]) \
        if hbm_usable and caps.get("hbm_channels") != 0 else 0
    ddr_usable = sum(m.count for m in b.memory if m.kind in ("DDR4", "LPDDR4"))
    if caps.get("ddr_channels") is not None:
        ddr_usable = min(ddr_usable, caps["ddr_channels"])
    hbm_rounds = [ch.rounds for ch in p.channels if ch.kind == "HBM"]
    hbm_rounds += [0] * (hbm_usable - len(hbm_rounds))
    ddr_rounds = [ch.rounds for ch in p.channels if ch.kind != "HBM"]
    ddr_rounds += [0] * (ddr_usable - len(ddr_rounds))
    for rounds in (hbm_rounds, ddr_rounds):
        if rounds:
            assert max(rounds) - min(rounds) <= 1, rounds
    off = [t for t in range(len(model.tables)) if t not in p.onchip]
    forced = [t for t in off if p.slots[t].bytes > limit]
    bound = max(math.ceil(len(off) / (hbm_usable + ddr_usable)),
                math.ceil(len(forced) / ddr_usable) if forced else 0)
    assert p.max_rounds == bound


def test_paper_ctr_on_u280():
    """The paper's model fits a U280: every table above an HBM pseudo-channel (256 MiB) in the
    two DDR4 channels, the rest of the off-chip tables one per HBM pseudo-channel."""
    model = preset("paper-ctr")
    p = place(model, "u280")
    print("\n" + p.summary())
    big = {t for t, table in enumerate(model.tables) if table.rows * 16 > 256 << 20}
    assert big and {t for ch in p.channels_of("DDR4") for t in ch.tables} == big
    assert all(ch.rounds == 1 for ch in p.channels_of("HBM"))
    assert len(p.channels_of("DDR4")) == 2
    assert p.inferences_per_s == min(ch.inferences_per_s for ch in p.channels)
    assert p.latency_ns == max(ch.latency_ns for ch in p.channels)
    # the busier DDR channel is the bottleneck, and lookups cannot outrun one per cycle
    busiest = max(p.channels, key=lambda ch: ch.beats)
    assert p.inferences_per_s == busiest.inferences_per_s
    assert all(ch.lookups_per_s <= p.clock_mhz * 1e6 for ch in p.channels)


@pytest.mark.parametrize("board, caps, words", [
    ("sidewinder", {}, ("sidewinder", "DDR4", "do not fit")),
    ("vck5000", {}, ("vck5000", "do not fit")),
    ("u55c", {}, ("larger than an HBM pseudo-channel of u55c", "no DDR channel")),
    ("u280", {"ddr_channels": 0}, ("larger than an HBM pseudo-channel", "no DDR channel")),
    ("u280", {"ddr_channels": 0, "hbm_channels": 0, "onchip_bytes": 0},
     ("98 tables", "no HBM or DDR channel")),
])
def test_placement_errors_name_what_does_not_fit(board, caps, words):
    with pytest.raises(ConfigError) as e:
        place(preset("paper-ctr"), board, **caps)
    assert e.value.param == "tables"
    for w in words:
        assert w in str(e.value)


def test_placement_table_too_large_for_any_channel():
    model = small_model([10, 3 << 28], [4, 8])           # one table of 6 GiB, DDR holds 16 GiB
    p = place(model, "u280")
    assert p.slots[1].where == "m_axi_ddr0"
    huge = small_model([10, 5 << 28], [4, 8])            # 20 GiB: larger than any channel
    with pytest.raises(ConfigError, match="find no channel"):
        place(huge, "u280")


def test_placement_rejects_bad_caps():
    with pytest.raises(ConfigError, match="hbm_channels"):
        place(preset("small-ctr"), "u280", hbm_channels=-2)


def test_pack_tables_round_trip():
    """Rows read back from the images at base + row * stride equal the contents; padding and
    gaps are zero."""
    for elem_bits in (8, 16):
        model = small_model([1, 17, 300, 64, 5], [3, 8, 5, 1, 19], elem_bits=elem_bits)
        p = place(model, "u280", onchip_bytes=0, hbm_channels=2, ddr_channels=1,
                  hbm_table_max_bytes=2048)
        contents = golden.table_contents(model)
        images = pack_tables(model, p, contents)
        assert set(images) == {ch.port for ch in p.channels}
        dtype = np.int8 if elem_bits == 8 else np.dtype("<i2")
        for ch in p.channels:
            image = images[ch.port]
            assert len(image) == ch.bytes
            used = np.zeros(len(image), dtype=bool)
            for t in ch.tables:
                s, table = p.slots[t], model.tables[t]
                raw = np.frombuffer(image[s.base:s.base + s.bytes], dtype=dtype)
                rows = raw.reshape(table.rows, s.stride * 8 // elem_bits)
                assert np.array_equal(rows[:, :table.dim], contents[t])
                assert not rows[:, table.dim:].any()
                used[s.base:s.base + s.bytes] = True
            assert not np.frombuffer(image, dtype=np.uint8)[~used].any()


# -- golden model ------------------------------------------------------------------------------

def test_table_contents_reproducible_with_extremes():
    model = preset("small-ctr")
    a, b = golden.table_contents(model), golden.table_contents(model)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    other = golden.table_contents(RecModel.from_dict({**model.to_dict(), "seed": 8}))
    assert not all(np.array_equal(x, y) for x, y in zip(a, other))
    lo, hi = -128, 127
    for x, table in zip(a, model.tables):
        assert x.shape == (table.rows, table.dim) and x.dtype == np.int64
        assert x.min() >= lo and x.max() <= hi
    allv = np.concatenate([x.ravel() for x in a])
    assert (allv == lo).any() and (allv == hi).any()
    assert len(np.unique(allv)) == 256


@pytest.mark.parametrize("oob", ["clamp", "flag"])
@pytest.mark.parametrize("model", [preset("small-ctr"), synthetic_model(9, seed=4)],
                         ids=["small-ctr", "synthetic"])
def test_golden_matches_torch_embedding_bag(model, oob):
    """golden.embed against one torch.nn.EmbeddingBag(mode="sum") per table with one index per
    bag; out-of-range rows: the last row (clamp) or a per-sample weight of 0 (flag)."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(3)
    contents = golden.table_contents(model)
    n = 64
    rows = np.array([t.rows for t in model.tables])
    idx = (rng.random((n, len(rows))) * rows * 1.3).astype(np.int64)    # ~20% out of range
    idx[0] = 0
    idx[1] = rows - 1
    idx[2] = rows
    dense = golden.dense_features(model, n, rng)
    got = golden.embed(model, contents, idx, dense, oob=oob)

    parts = []
    for t, table in enumerate(model.tables):
        bag = torch.nn.EmbeddingBag(table.rows, table.dim, mode="sum").double()
        with torch.no_grad():
            bag.weight.copy_(torch.tensor(contents[t], dtype=torch.float64))
        valid = idx[:, t] < table.rows
        safe = torch.tensor(np.minimum(idx[:, t], table.rows - 1))
        offsets = torch.arange(n)
        weights = None if oob == "clamp" else torch.tensor(valid.astype(np.float64))
        out = bag(safe, offsets, per_sample_weights=weights)
        parts.append(out.detach().numpy())
    want = np.concatenate(parts + [dense.astype(np.float64)], axis=1)
    assert got.dtype == np.int64 and got.shape == (n, model.concat_len)
    assert np.array_equal(got, want.astype(np.int64))
    assert np.array_equal(golden.embed(model, contents, idx[5], dense[5], oob=oob), got[5])


def test_golden_rejects_negative_indices():
    model = preset("small-ctr")
    with pytest.raises(ValueError, match="unsigned"):
        golden.embed(model, golden.table_contents(model), [-1] + [0] * 12, [0] * 5)


# -- the lookup unit ---------------------------------------------------------------------------

def test_synthetic_model_shapes():
    for tables in (1, 2, 13, 40):
        m = synthetic_model(tables, dim_min=1, dim_max=20, rows_max=3000, seed=tables)
        rows = [t.rows for t in m.tables]
        dims = [t.dim for t in m.tables]
        assert len(rows) == tables and max(rows) == 3000 and min(dims) >= 1 and max(dims) <= 20
        if tables > 1:
            assert rows.count(1) >= 1 and any(d % 2 for d in dims)


def test_default_config_uses_all_three_memory_kinds():
    p = EmbeddingConfig().placement
    kinds = {ch.kind for ch in p.channels}
    assert p.onchip and kinds == {"HBM", "DDR4"}
    assert EmbeddingConfig(tables=13).placement.max_rounds >= 2


def test_config_errors():
    with pytest.raises(ConfigError, match="dim_min"):
        EmbeddingConfig(dim_min=9, dim_max=3)
    with pytest.raises(ConfigError, match="index_bits"):
        EmbeddingConfig(rows_max=3000, index_bits=11)
    with pytest.raises(ConfigError) as e:
        EmbeddingConfig(onchip_bytes=0, hbm_channels=0, ddr_channels=0)
    assert e.value.param == "tables"
    cfg = EmbeddingConfig(tables=3, onchip_bytes=-1)
    with pytest.raises(ConfigError, match="contents"):
        onchip_rows(cfg, cfg.contents[:2])
    bad = [x.copy() for x in cfg.contents]
    bad[2][0, 0] = 1 << 15
    with pytest.raises(ConfigError, match=r"contents\[2\]"):
        onchip_rows(cfg, bad)


def test_large_models_build_without_contents_but_do_not_simulate():
    """Only on-chip contents are generated for the design; simulating a model whose contents
    would not fit in host memory is refused with a clear error."""
    cfg = EmbeddingConfig(tables=60, rows_max=1 << 24, dim_max=64, hbm_channels=-1,
                          hbm_table_max_bytes=-1)
    assert cfg.rec_model.table_bytes > 1 << 30
    rows = onchip_rows(cfg)
    assert set(rows) == set(cfg.placement.onchip)
    eb = cfg.elem_bits
    for t, words in rows.items():
        x = golden.table_content(cfg.rec_model, t)
        assert len(words) == len(x)
        for r in (0, len(x) - 1):
            fields = [(words[r] >> (eb * e)) & ((1 << eb) - 1) for e in range(x.shape[1])]
            assert [f - (1 << eb) if f >> (eb - 1) else f for f in fields] == x[r].tolist()
    with pytest.raises(ConfigError, match="too large to simulate"):
        cfg.contents


def test_onchip_rows_pack_user_contents():
    """User tables replace the synthetic ones in the on-chip memories: element e of a row in
    bits [e * elem_bits, (e + 1) * elem_bits) of its word, two's complement."""
    cfg = EmbeddingConfig(tables=4, elem_bits=8, onchip_bytes=-1)
    assert set(cfg.placement.onchip) == {0, 1, 2, 3}
    mine = [np.full((t.rows, t.dim), -t.dim, dtype=np.int64) for t in cfg.rec_model.tables]
    words = onchip_rows(cfg, mine)
    for t, table in enumerate(cfg.rec_model.tables):
        assert len(words[t]) == table.rows
        byte = (-table.dim) & 0xFF
        assert words[t][0] == int.from_bytes(bytes([byte] * table.dim), "little")
    text = rtlil.convert(Embedding(cfg, contents=mine))     # elaborates with them
    assert "memory" in text


def test_stimulus_covers_row_zero_last_row_and_out_of_range():
    cfg = EmbeddingConfig()
    stim = EmbeddingModel.stimulus(cfg, 300, np.random.default_rng(1))
    idx = stim["indices"]
    rows = np.array([t.rows for t in cfg.rec_model.tables])
    for t in range(len(rows)):
        col = idx[:, t]
        assert (col == 0).any() and (col == rows[t] - 1).any()
        assert (col >= rows[t]).any() and (col == (1 << cfg.index_bits) - 1).any()
        assert len(np.unique(col[col < rows[t]])) > min(rows[t], 40) // 2
    assert (idx >= 0).all() and (idx < 1 << cfg.index_bits).all()


@requires_verilator
def test_cycle_model_matches_simulation():
    """Latency and total cycles at --stall 0 of one and of 40 inferences, every test
    configuration, on the cocotb engine: its cocotbext-axi RAM is the memory this model
    describes (the native engine's read-slave model serves fewer reads per cycle: 9.4 cycles
    per inference where the model and cocotb give 5). The testbench memory's AR-to-R latency
    is not assumed: it is what makes the first configuration's measured latency agree, and
    must then fit all the others."""
    acc = registry.get("recsys-embedding")
    memory_latency, bound = None, []
    for values in TEST_CONFIGS:
        cfg = acc.config.from_dict(values)
        for items in (1, 40):
            r = simulate(acc, cfg, items=items, seed=5, stall=0.0)
            assert not r["timeout"] and r["mismatches"] == 0, r["first_mismatches"]
            if memory_latency is None:
                memory_latency = r["latency_cycles"] - \
                    cfg.performance(cfg.workload(memory_latency=0))["latency_cycles"]
                assert 1 <= memory_latency <= 4
            model = cfg.performance(cfg.workload(items=items,
                                                          memory_latency=memory_latency))
            print(f"\n{values} x{items}: latency sim {r['latency_cycles']} model "
                  f"{model['latency_cycles']}, cycles sim {r['cycles']} model {model['cycles']}"
                  f", II {model['initiation_interval']}")
            assert r["latency_cycles"] == model["latency_cycles"]
            if model["credit_bound"]:        # an average interval: within 2%
                assert r["cycles"] == pytest.approx(model["cycles"], rel=0.02)
            else:
                assert r["cycles"] == model["cycles"]
            bound.append(model["credit_bound"])
    assert any(bound) and not all(bound)


@requires_verilator
def test_throughput_is_output_or_channel_bound():
    """Steady state: one inference per max(output beats, busiest channel's words) cycles, for
    an output-bound and a channel-bound configuration."""
    acc = registry.get("recsys-embedding")
    seen = set()
    for values in (TEST_CONFIGS[0], TEST_CONFIGS[3]):
        cfg = acc.config.from_dict(values)
        r = simulate(acc, cfg, items=200, seed=9, stall=0.0)
        assert r["mismatches"] == 0
        per_inference = cfg.out_beats / r["results_per_cycle"]
        busiest = max(cfg.channel_beats.values())
        assert per_inference == pytest.approx(max(cfg.out_beats, busiest), rel=0.01)
        seen.add("output" if cfg.out_beats > busiest else "channel")
    assert seen == {"output", "channel"}


@requires_verilator
@pytest.mark.parametrize("index", [0, 3], ids=["clamp", "flag"])
def test_out_of_range_indices(index):
    """Every index out of range (just beyond the table, or the largest index), then mixes of
    valid and invalid ones: clamp reads the last rows, flag gives zero vectors and raises
    error; the simulated unit agrees beat for beat."""
    acc = registry.get("recsys-embedding")
    cfg = acc.config.from_dict(TEST_CONFIGS[index])
    oob, top = cfg.oob, (1 << cfg.index_bits) - 1
    model = cfg.rec_model
    rows = np.array([t.rows for t in model.tables])
    rng = np.random.default_rng(2)
    n = 24
    idx = np.where(rng.random((n, len(rows))) < 0.5, rows, top)
    idx[n // 2:] = np.where(rng.random((n // 2, len(rows))) < 0.2, idx[n // 2:],
                            rng.integers(0, rows, size=(n // 2, len(rows))))
    idx[-3:] = rows - 1                         # all in range
    dense = golden.dense_features(model, n, rng)
    stim = {"indices": idx.astype(np.int64), "dense": dense}

    vec = golden.embed(model, cfg.contents, idx[:n // 2], dense[:n // 2], oob=oob)
    start = 0
    for t, table in enumerate(model.tables):
        part = vec[:, start:start + table.dim]
        want = 0 if oob == "flag" else cfg.contents[t][-1]
        assert (part == want).all()
        start += table.dim

    r = simulate(acc, cfg, stimulus=stim, seed=4, stall=0.3, keep_outputs=True,
                 engine="native")
    assert not r["timeout"] and r["mismatches"] == 0, r["first_mismatches"]
    if oob == "flag":
        beats = r["outputs"]["o_emb"]
        errors = [b["error"] for b in beats if b["last"]]
        bad = golden.out_of_range(model, idx).any(axis=1)
        assert errors == bad.astype(int).tolist() and 0 < sum(errors) < n
