"""Latency model T + (L-1)(X+d) against the multi-FPGA I-BERT paper's Tables 1/2 and sec. 9.3.

The expected values are the paper's printed numbers (an outside reference), typed in here from
the paper text independently of hwgen/cluster/plan/latency.py's tables."""

import subprocess
import sys

import pytest

from hwgen.cluster.plan import latency as lat

# Table 1 (X, T cycles) and Table 2 (ms, L = 12) as printed in the paper.
TABLE1 = {1: (6936, 6936), 2: (10455, 11004), 4: (13769, 15869), 8: (17122, 22318),
          16: (23393, 34781), 32: (35828, 59600), 64: (61121, 109660), 128: (111708, 209789)}
TABLE2_MS = {1: 0.416, 2: 0.630, 4: 0.837, 8: 1.053, 16: 1.461, 32: 2.269, 64: 3.910,
             128: 7.193}


def test_tables_transcribed():
    assert {s: v[:2] for s, v in lat.PAPER_TABLE1.items()} == TABLE1
    assert lat.PAPER_TABLE2_MS == TABLE2_MS


@pytest.mark.parametrize("seq", sorted(TABLE1))
def test_table2_within_half_percent(seq):
    x, t = TABLE1[seq]
    ms = lat.chain_latency(t, x, 12) / (200e6 / 1e3)
    assert abs(ms - TABLE2_MS[seq]) / TABLE2_MS[seq] < 0.005
    row = next(r for r in lat.table2() if r["seq"] == seq)
    assert row["ms"] == pytest.approx(ms)
    assert abs(row["error_pct"]) < 0.5
    # with the 1.1 us hop every entry rises by 11 x 1.1 us = 12.1 us
    assert row["ms_with_d"] - row["ms"] == pytest.approx(0.0121)


def test_d_is_left_out_of_table2():
    """Including d in Table 2 would be off by more than the rounding of the paper's digits
    at short sequences: the reproduction really is d-free."""
    x, t = TABLE1[1]
    with_d = lat.chain_latency(t / 200, x / 200, 12, 1.1) / 1e3
    assert abs(with_d - TABLE2_MS[1]) / TABLE2_MS[1] > 0.02


def test_versal_860us():
    assert round(lat.versal_estimate()) == 860
    assert lat.versal_estimate(124.1, 65.8, 1.1, 12) == pytest.approx(124.1 + 11 * 66.9)


def test_chain_latency_rejects_no_encoders():
    with pytest.raises(ValueError):
        lat.chain_latency(1, 1, 0)


def test_encoder_timing_from_kernel_models():
    """Our encoder: X <= T, both grow with the sequence, a single token is the pipeline fill
    (X close to T), and the slowest stage's per-row period bounds T from below."""
    prev = None
    for m in (1, 8, 38, 128):
        e = lat.encoder_timing(m)
        assert 0 < e["X"] <= e["T"]
        if prev:
            assert e["X"] > prev["X"] and e["T"] > prev["T"]
        prev = e
    one = lat.encoder_timing(1)
    assert one["T"] - one["X"] < 200
    from hwgen.ibert.linear import LinearConfig
    ffn = LinearConfig(in_features=768, out_features=3072, tiles=32, pes=48)
    assert lat.encoder_timing(128)["T"] > 128 * ffn.performance()["cycles_per_row"]


def test_bench_cli_exit_zero():
    out = subprocess.run([sys.executable, "-m", "hwgen.cli", "bench", "cluster", "--no-sim"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "860.0 us" in out.stdout and "7.193" in out.stdout
    assert "within 0.5%" in out.stdout


def test_sizes_from_layers_reads_the_descriptions():
    from hwgen.cluster.spec.describe import load
    ib = lat.sizes_from_layers(load("ibert_encoder").clusters[0].layers)
    assert (ib.hidden, ib.heads, ib.ffn, ib.tiles, ib.pes) == (768, 12, 3072, 16, 48)
    mini = lat.sizes_from_layers(load("mini_encoder").clusters[0].layers)
    assert (mini.hidden, mini.heads, mini.ffn, mini.max_len, mini.dot_pes) == (16, 2, 32, 4, 2)
    mm = lat.sizes_from_layers(load("minilm_encoder").clusters[0].layers)
    assert (mm.hidden, mm.heads, mm.ffn, mm.down_tiles) == (384, 12, 1536, 16)


def test_bench_prints_a_measured_report_beside_the_model(tmp_path):
    """A report as ``hwgen cluster sim --tokens M --json`` writes it: the bench prints its X,
    T and I, and beside them each model's X and T with the error (model - simulated) /
    simulated, checked here by arithmetic on the printed cells (the models' own values are
    tested against simulations in tests/test_cluster_packet_model.py); a failed run is
    refused."""
    import json
    from hwgen.cluster.spec.describe import load
    report = {"description": "mini-encoder", "path": str(load("mini_encoder").path),
              "tokens": 2, "X": 600, "T": 700, "I": 30.0, "hop_cycles": 16, "mismatches": 0,
              "input_beats": 2}
    good = tmp_path / "m2.json"
    good.write_text(json.dumps(report))
    out = subprocess.run([sys.executable, "-m", "hwgen.cli", "bench", "cluster", "--no-sim",
                          "--measured", str(good)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    head = next(ln.split() for ln in lines if ln.split()[:3] == ["M", "X", "sim"])
    assert head[:12] == ["M", "X", "sim", "X", "pkt", "err", "X", "krn", "err", "T", "sim",
                         "T"]
    cells = next(ln.split() for ln in lines if ln.split()[:2] == ["2", "600"])
    # M, X sim, X pkt, err, X krn, err, T sim, T pkt, err, T krn, err, I sim
    assert cells[6] == "700" and cells[11] == "30.0"
    for sim, model, err in ((1, 2, 3), (1, 4, 5), (6, 7, 8), (6, 9, 10)):
        s_val, m_val = int(cells[sim]), int(cells[model])
        assert m_val > 0
        assert cells[err] == f"{100 * (m_val - s_val) / s_val:+.1f}%", (cells, err)
    bad = tmp_path / "failed.json"
    bad.write_text(json.dumps({k: v for k, v in report.items() if k not in ("X", "T")}))
    out = subprocess.run([sys.executable, "-m", "hwgen.cli", "bench", "cluster", "--no-sim",
                          "--measured", str(bad)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "measured" in out.stderr + out.stdout
    out = subprocess.run([sys.executable, "-m", "hwgen.cli", "bench", "cluster", "--no-sim",
                          "--minilm-tokens", "65"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "minilm_tokens" in out.stderr + out.stdout


def test_router_load_counts_packets_and_beats():
    """minilm_encoder at M 8: fpga1 sends, per token, q/k/v's rows (48 beats each) to its own
    scatters, the scatters' 12 chunks of 32 bytes (4 beats) each, and the gateway's broadcast
    of the input row to q, k, v and attn_out (4 x 48 beats): 43 packets, 480 beats a token
    (the simulation's status_delivered was 344 packets)."""
    from hwgen.cluster.plan.router_load import description_load, packet_beats
    assert packet_beats(0, 100, 64) == (0, 0)
    assert packet_beats(1536, 4095, 64) == (1, 192)
    assert packet_beats(10, 4, 64) == (3, 3)
    load = description_load("minilm_encoder", 8)
    assert load["minilm0_fpga1"]["packets"] == 8 * 43
    assert load["minilm0_fpga1"]["beats"] == 8 * (3 * 48 + 3 * 12 * 4 + 4 * 48)
    assert load["minilm0_fpga6"] == {"packets": 8, "beats": 8 * 192,
                                     "kernels": {30: (8, 8 * 192)}}
