"""The encoder inside the FPGA tops, simulated across FPGAs (issue 14 item 5).

``mini_encoder`` (H 16, two heads, two FPGAs) is built with its compute kernels inside the tops,
every top runs in its own Verilator process joined by the lock-step network model, a host at the
cluster's ``output.ip`` sends the M input rows through the gateway and receives the output rows,
which must equal :func:`hwgen.cluster.golden.layers.run` (the layers evaluated with the kernels'
golden models) bit for bit, under random stalls.
"""

import numpy as np
import pytest
from click.testing import CliRunner

from hwgen.cli import main
from hwgen.cluster.run import encoder_sim
from hwgen.cluster.golden import layers as layer_golden
from hwgen.cluster.plan import packet_model, router_load
from hwgen.errors import ConfigError

from conftest import requires_verilator


@requires_verilator
@pytest.mark.parametrize("tokens,stall", [(3, 0.3), (3, 0.0)])
def test_mini_encoder_end_to_end_is_bit_exact(tmp_path, tokens, stall):
    """Both runs share one build (M is fixed at build time; every test here builds for M 3);
    ``hwgen bench cluster`` simulates M 1 to 4 at stall 0 (and fails on a mismatch) and prints
    the packet model beside each."""
    r = encoder_sim.run("mini_encoder", tmp_path, tokens=tokens, stall=stall, seed=tokens)
    assert r["rows_expected"] == r["rows_received"] == tokens
    assert r["mismatches"] == 0 and r["malformed"] == 0 and not r["timeouts"]
    # the network's hop and the kernels' latencies put X, T in a plausible range
    assert r["hop_cycles"] < r["X"] <= r["T"] < r["cycles_run"]
    assert r["T"] - r["X"] == pytest.approx(r["I"] * (tokens - 1))
    # nothing dropped anywhere; the heads' gather completed one round per row
    assert r["drops"] == {} and r["stalled_at"] is None
    rounds = [v for st in r["status"].values() for k, v in st.items() if k.endswith("_rounds")]
    assert rounds and set(rounds) == {tokens}          # scatters, gather, broadcast
    # every packet an FPGA sent passed its router: the plan's count equals the router's
    load = router_load.description_load("mini_encoder", tokens)
    assert {n: v["packets"] for n, v in load.items()} == \
        {n: st["status_delivered"] for n, st in r["status"].items()}
    # every datagram is logged with its sender's cycle and kernel ids: the host's input
    # frames at cycle 0, the FPGAs' after, among them the output rows at the report's cycles
    import json
    log = [json.loads(line) for line in (tmp_path / "run" / "datagrams.jsonl").open()]
    assert len(log) == r["forwarded"]
    assert sum(d["cycle"] == 0 for d in log) == tokens
    assert all(isinstance(d[k], int) for d in log for k in ("cycle", "tid", "tdest"))
    assert set(r["output_cycles"]) <= {d["cycle"] for d in log}
    if stall == 0:
        # the packet model predicts the simulated X and T within the 5% goal
        model = packet_model.packet_timing("mini_encoder", tokens, r["hop_cycles"],
                                           r["input_beats"])
        assert model["X"] == pytest.approx(r["X"], rel=0.05)
        assert model["T"] == pytest.approx(r["T"], rel=0.05)


@requires_verilator
def test_a_wrong_golden_row_is_counted(tmp_path, monkeypatch):
    """The comparison is real: one element off in the expected rows is one mismatch."""
    true_run = layer_golden.run

    def off_by_one(layers, x, **kw):
        y = np.array(true_run(layers, x, **kw))
        y[1, 5] += 1
        return y
    monkeypatch.setattr(layer_golden, "run", off_by_one)
    r = encoder_sim.run("mini_encoder", tmp_path, tokens=3, stall=0.3, seed=3)
    assert r["mismatches"] == 1 and r["mismatched_rows"] == [1]


def test_needs_a_host_before_building(tmp_path):
    with pytest.raises(ConfigError) as e:
        encoder_sim.run("two_clusters", tmp_path, tokens=2)
    assert e.value.param == "clusters[0].output.ip"
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("opts,param", [({"tokens": 0}, "tokens"), ({"stall": 1.5}, "stall"),
                                        ({"hop": 3}, "hop"), ({"tokens": 9}, "sequence_length")])
def test_bad_options_name_the_parameter(tmp_path, opts, param):
    kw = {"tokens": 2, **opts}
    with pytest.raises(ConfigError) as e:
        encoder_sim.run("mini_encoder", tmp_path, **kw)
    assert e.value.param == param


@pytest.mark.parametrize("args,needle", [
    (["--tokens", "3", "--loss", "0.1"], "loss"),
    (["--tokens", "3", "--hub-delay-ms", "2"], "hub_delay_ms"),
    (["--tokens", "3", "--latency-ms", "2"], "hub_delay_ms"),     # the old spelling
    (["--tokens", "3", "--hop", "100", "--latency-ns", "500"], "hop"),
    (["--hop", "100"], "hop"),
    (["--latency-ns", "1100"], "latency_ns"),
    (["--clock-mhz", "250"], "clock_mhz"),
    (["--sentence", "Vector search"], "sentence"),
    (["--tokens", "3", "--sentence", "  "], "sentence"),
])
def test_cli_refuses_options_of_the_other_mode(tmp_path, args, needle):
    r = CliRunner().invoke(main, ["cluster", "sim", "mini_encoder", "--out", str(tmp_path)]
                           + args)
    assert r.exit_code == 2, r.output
    assert needle in r.output and "Traceback" not in r.output


def test_every_input_holds_a_whole_sentence():
    """Each input FIFO of a kernel holds a sentence (M rows), or the FPGA's one input path
    blocks behind a full FIFO: minilm_encoder deadlocked at 304 datagrams (attn_out's
    identity)."""
    from hwgen.cluster.spec.describe import load
    from hwgen.cluster.plan.placement import fpga_plan, plan
    d = load("minilm_encoder")
    ps = plan(d)
    depths = {}
    for f in d.clusters[0].fpgas:
        fp = fpga_plan(ps[0], f, d.data_bits, 2, plans=ps, seq_len=8)
        depths.update({c.name: c.p2r.depths for c in fp.computes.values()})
    beats = lambda nbytes: nbytes * 8 // d.data_bits + 2           # noqa: E731
    assert depths["attn_out"] == [beats(8 * 384)] * 2             # gathered x, identity
    assert depths["ffn_down"] == [beats(8 * 1536), beats(8 * 384)]
    assert depths["attn_dot[0]"] == [beats(8 * 32)] * 2             # Q and K of one head
    assert depths["q"] == [beats(8 * 384)]


def test_fifo_depths_are_checked():
    from hwgen.cluster.spec.adapter import PacketsToRowsConfig
    with pytest.raises(ConfigError) as e:
        PacketsToRowsConfig.from_dict({"sources": "1,2", "fifo_depths": "16"})
    assert e.value.param == "fifo_depths"
    assert PacketsToRowsConfig.from_dict({"sources": "1,2", "fifo_depths": "3,70"}).depths \
        == [3, 70]
