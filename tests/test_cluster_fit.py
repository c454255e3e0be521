"""``hwgen cluster fit``: folding to one interval, the model's description, the cap, and a fitted
design simulated end to end."""

import json

import pytest
from click.testing import CliRunner

from conftest import requires_verilator, requires_yosys
from hwgen import registry
from hwgen.cli import main
from hwgen.cluster.run import encoder_sim
from hwgen.cluster.plan.placement import plan
from hwgen.cluster.run import fit as F
from hwgen.cluster.run.builder import fpga_plans
from hwgen.cluster.spec import describe as D
from hwgen.errors import ConfigError

MODELS = D.DESCRIPTIONS_DIR / "models"


def _interval(kind, params, tokens):
    cfg = registry.get(kind).config.from_dict(params)
    field = {"ibert-attn-dot": "m", "ibert-softmax-matmul": "m"}.get(kind, "rows")
    return cfg.performance(cfg.workload(**{field: tokens}))["cycles_per_row"]


@pytest.mark.parametrize("target", [1, 5, 12, 40, 96, 200, 2000])
def test_linear_gets_the_fewest_multipliers_that_meet_the_interval(target):
    """Against every (tiles, pes) the Linear accepts, not only the candidates fit tries: no
    parallelism with fewer multipliers meets the target (K 40 and N 48: odd divisors)."""
    base = {"in_features": 40, "out_features": 48}
    pick = F._pick(F.choices("ibert-linear", base, 5), target)
    meeting = [t * p for t in range(1, 49) if 48 % t == 0 for p in range(1, 41)
               if _interval("ibert-linear", {**base, "tiles": t, "pes": p}, 5) <= target]
    params = dict(pick.params)
    assert _interval("ibert-linear", {**base, **params}, 5) == pick.interval <= target
    assert params["tiles"] * params["pes"] == pick.macs == min(meeting)


def test_attention_folding_follows_the_sentence_length():
    """At M 128 and the paper's I 767 one head's Q K^T needs about 11 MACs per cycle, not the
    hand-written 16 PEs: the pick is the fewest PEs (of every count attn-dot accepts) that
    meet it, and a shorter sentence needs fewer."""
    params = {"head_dim": 64, "max_len": 128, "pes": 16}
    for tokens in (128, 38):
        pick = F._pick(F.choices("ibert-attn-dot", params, tokens), 767)
        meeting = [p for p in range(1, 65)
                   if _accepts("ibert-attn-dot", {**params, "pes": p})
                   and _interval("ibert-attn-dot", {**params, "pes": p}, tokens) <= 767]
        assert dict(pick.params)["pes"] == pick.macs == min(meeting)
        assert pick.interval <= 767
    assert F._pick(F.choices("ibert-attn-dot", params, 128), 767).macs < 16


def _accepts(kind, params):
    try:
        registry.get(kind).config.from_dict(params)
        return True
    except ConfigError:
        return False


def test_bert_config_resizes_the_template(tmp_path):
    desc = F.model_description(str(MODELS / "bert-large-uncased.config.json"), 96, "sidewinder")
    layers = {la["name"]: la for la in desc["layers"]["layers"]}
    assert layers["attn_dot"]["count"] == 16
    assert layers["attn_dot"]["modules"][0]["params"]["head_dim"] == 64
    assert layers["attn_dot"]["modules"][0]["params"]["max_len"] == 96
    assert layers["ffn_up"]["modules"][0]["params"]["out_features"] == 4096
    assert layers["ffn_down"]["modules"][0]["params"]["in_features"] == 4096
    assert layers["ln1"]["modules"][0]["params"]["hidden"] == 1024
    assert desc["sequence_length"] == 96
    D.parse(desc)                                           # a valid description
    bad = tmp_path / "config.json"
    bad.write_text(json.dumps({"hidden_size": 768, "num_attention_heads": 5,
                               "intermediate_size": 3072}))
    with pytest.raises(ConfigError, match="num_attention_heads"):
        F.model_description(str(bad), 128, "sidewinder")
    bad.write_text(json.dumps({"hidden_size": 768, "num_attention_heads": 12}))
    with pytest.raises(ConfigError, match="intermediate_size"):
        F.model_description(str(bad), 128, "sidewinder")


def test_bert_large_plans_at_128_tokens():
    """16 heads move the kernel ids: the template's reserved id 33 (the paper's 12-head
    numbering) is dropped rather than falling among scatter_v's members, and FFN down's
    sentence-deep input FIFO (128 rows of 4,096 bytes: 65,538 beats) is accepted."""
    desc = F.model_description(str(MODELS / "bert-large-uncased.config.json"), 128,
                               "sidewinder")
    assert "reserved_ids" not in desc["clusters"][0]
    parsed = D.parse(desc)
    plans = plan(parsed)
    fpgas = [fp for p in plans for fp in fpga_plans(p, plans, parsed)]
    depths = [d for fp in fpgas for k in fp.computes.values() for d in k.p2r.depths]
    assert max(depths) == 128 * 4096 // 8 + 2
    base = F.model_description(str(MODELS / "bert-base-uncased.config.json"), 128,
                               "sidewinder")
    assert "33" in base["clusters"][0]["reserved_ids"]      # the paper's ids kept at 12 heads


def test_minilm_keeps_its_calibrated_files_and_token_limit():
    desc = F.model_description("minilm", 64, "sidewinder")
    q = desc["layers"]["layers"][0]["modules"][0]["params"]
    assert q["weights"].startswith("/") and q["weights"].endswith("layer0_q.npz")
    with pytest.raises(ConfigError, match="tokens"):
        F.model_description("minilm", 65, "sidewinder")


@requires_yosys
def test_too_small_a_cap_names_the_fpga_and_resource():
    runner = CliRunner()
    r = runner.invoke(main, ["cluster", "fit", "--model", str(D.DESCRIPTIONS_DIR /
                                                              "mini_encoder.json"),
                             "--tokens", "3", "--cap", "0.001", "--out", "/tmp/never.json"])
    assert r.exit_code != 0
    line = r.output.strip().splitlines()[-1]
    assert "nothing fits: mini0_f" in line and "% of its" in line


@pytest.fixture(scope="module")
def fitted():
    """The mini encoder folded to 40 cycles per row on its two FPGAs (softmax's divider allows
    no fewer than 35); its adapters and shell are counted with yosys."""
    if requires_yosys.args[0]:
        pytest.skip(requires_yosys.kwargs["reason"])
    desc = F.model_description(str(D.DESCRIPTIONS_DIR / "mini_encoder.json"), 3, "sidewinder")
    return F.fit(desc, 3, interval=40)


def test_fitted_mini_encoder_is_minimal_and_under_the_cap(fitted):
    """Every module meets the interval with the fewest multipliers; both FPGAs are under the
    cap; the hand-written description's 16 MACs per Linear (16 cycles per row) became 8."""
    assert fitted["interval"] <= 40
    assert len(fitted["fpgas"]) == 2
    for row in fitted["fpgas"].values():
        assert max(row["percent"].values()) <= 85 and row["fits"]
    for m in fitted["modules"]:
        assert m["interval"] <= 40
    q = [m for m in fitted["modules"] if m["kind"] == "ibert-linear" and m["layer"] == "q"]
    # 16 x 16 MACs per row in at most 40 cycles: 7 per cycle would do, but 7 PEs take
    # ceil(16 / 7) = 3 passes of 16 columns (48 cycles) and 7 tiles do not divide 16
    assert q[0]["macs_per_cycle"] == 8


@requires_verilator
def test_fitted_mini_encoder_is_bit_exact(fitted, tmp_path):
    """The fitted design, built and simulated on its two FPGAs under random stalls, equals the
    layers golden bit for bit."""
    path = tmp_path / "fitted.json"
    path.write_text(json.dumps(fitted["description"]))
    r = encoder_sim.run(str(path), tmp_path / "sim", tokens=3, stall=0.3, seed=3)
    assert r["rows_expected"] == r["rows_received"] == 3
    assert r["mismatches"] == 0


def test_router_load_of_minilm_is_ten_rows_a_token():
    """fpga1 of MiniLM forwards, per token, the input row to q, k, v and the residual (virtual
    broadcast), q/k/v's rows to their scatters and the scatters' 12 head slices: 10 rows of
    384 int8 = 48 beats of 64 bits, 480 beats; folding its kernels faster than that buys
    nothing."""
    rows = F.router_rows(F.model_description("minilm", 64, "sidewinder"), 64)
    assert rows["fpga1"] == 10 * 384 // 8


def test_kernels_are_folded_to_the_busiest_router(fitted, monkeypatch):
    """Without ``--interval`` the target is the smallest module interval at or above the
    busiest router's beats per row (here a stand-in of 100 per FPGA)."""
    assert fitted["router_bound"]["beats_per_row"] == max(
        f["router_beats_per_row"] for f in fitted["fpgas"].values())
    assert fitted["packet_model"]["T"] >= fitted["packet_model"]["X"] > 0
    monkeypatch.setattr(F, "router_rows", lambda desc, tokens: {
        f["name"]: 100.0 for f in desc["clusters"][0]["fpgas"]})
    desc = F.model_description(str(D.DESCRIPTIONS_DIR / "mini_encoder.json"), 3, "sidewinder")
    r = F.fit(desc, 3)
    reachable = {c.interval for _, _, kind, params in F._modules(desc)
                 for c in F.choices(kind, params, 3)}
    assert r["target"] == min(t for t in reachable if t >= 100)
    assert r["interval"] <= r["target"] and r["router_bound"]["beats_per_row"] == 100


@pytest.mark.parametrize("threshold", [1, 4, 5, 9, 10, 99])
@pytest.mark.parametrize("bound_from", [0, 3, 7])
def test_search_finds_the_smallest_fitting_target(threshold, bound_from):
    """Bisection over ascending targets with a monotone fit: the smallest that fits (or the
    largest tried when none does), never an attempt below the cheap bound."""
    targets = list(range(1, 11))
    tried = []

    def attempt(t):
        tried.append(t)
        return t >= threshold, t

    ok, t = F._smallest_fitting(targets, attempt, lambda t: t > bound_from)
    want = max(threshold, bound_from + 1)
    assert (ok, t) == ((True, want) if want <= 10 else (False, 10))
    # the first passing the bound, the least parallel, then a gallop and a bisection
    assert min(tried) > bound_from and len(tried) <= 2 + 2 * 4
    if threshold > 10:                                          # nothing fits: two attempts
        assert len(tried) <= 2


@requires_yosys
def test_fitted_mini_encoder_fits_by_yosys_too(fitted):
    """``hwgen cluster build --resources`` (yosys ``synth_xilinx`` of every part) agrees with
    the fit: every FPGA under the cap, and the netlist estimate the fit used at or above
    yosys's count on every FPGA and resource, so that an estimate under the cap
    is a design under the cap; ``fit --exact`` searches with these counts."""
    from hwgen.cluster.plan.placement import plan
    from hwgen.cluster.run.builder import fpga_plans, resource_table
    desc = D.parse(fitted["description"])
    plans = plan(desc)
    fpgas = [fp for p in plans for fp in fpga_plans(p, plans, desc)]
    exact = resource_table(fpgas, plans)
    for name, row in exact["fpgas"].items():
        assert row["fits"] and max(row["percent"].values()) <= 85, (name, row["percent"])
        est = fitted["table"]["fpgas"][name]["total"]
        for key in ("lut", "ff", "bram", "uram", "dsp"):
            assert est[key] >= row["total"][key], (name, key, est[key], row["total"][key])
    again = F.fit(F.model_description(str(D.DESCRIPTIONS_DIR / "mini_encoder.json"), 3,
                                      "sidewinder"), 3, interval=40, exact=True)
    assert again["counted_by"] == "yosys"
    assert {n: r["total"] for n, r in again["table"]["fpgas"].items()} == {
        n: r["total"] for n, r in exact["fpgas"].items()}
