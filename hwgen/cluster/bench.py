"""``hwgen bench cluster``: the paper's latency model (Tables 1 and 2, the Versal estimate) and
the same model fed with the cycle counts of hwgen's own I-BERT encoder kernels."""

from . import latency as lat

__all__ = ["bench_cluster", "TOLERANCE_PCT"]

#: Largest allowed deviation of the Table 2 reproduction from the paper's printed values.
TOLERANCE_PCT = 0.5


def bench_cluster(echo=print, L=12, clock_mhz=lat.PAPER_CLOCK_MHZ, d_us=lat.PAPER_D_US):
    """Print the tables; return True when every Table 2 entry is within
    :data:`TOLERANCE_PCT` of the paper and the Versal estimate rounds to 860 us."""
    ok = True
    echo(f"Latency of L = {L} encoders: T + (L-1)(X+d) (paper eq. 1); Table 1 cycles at "
         f"{clock_mhz:g} MHz")
    echo(f"{'seq':>5} {'X cycles':>9} {'T cycles':>9} {'d left out ms':>14} {'paper ms':>9} "
         f"{'error':>8} {'with d ms':>10}")
    for r in lat.table2(L=L, clock_mhz=clock_mhz, d_us=d_us):
        err = r["error_pct"]
        bad = err is not None and abs(err) > TOLERANCE_PCT
        ok &= not bad
        echo(f"{r['seq']:>5} {r['X']:>9} {r['T']:>9} {r['ms']:>14.3f} {r['paper_ms']:>9.3f} "
             f"{err:>+7.3f}% {r['ms_with_d']:>10.4f}" + ("  OFF" if bad else ""))
    echo(f"with d = {d_us:g} us per hop every entry rises by (L-1) d = {(L - 1) * d_us:.1f} us")
    v = lat.VERSAL
    est = lat.versal_estimate(L=L) if L == v["L"] else lat.versal_estimate()
    ok &= round(est) == v["paper_us"]
    echo(f"Versal VCK190 (sec. 9.3): T = {v['T_us']} us, X = {v['X_us']} us, d = {v['d_us']} us, "
         f"L = {v['L']}: {est:.1f} us (paper {v['paper_us']:g} us)")
    sizes = lat.EncoderSizes()
    echo("")
    echo(f"hwgen's encoder (kernel cycle models of hwgen/ibert, H {sizes.hidden}, {sizes.heads} "
         f"heads, FFN {sizes.ffn}; linears {sizes.tiles}x{sizes.pes} MACs, FFN "
         f"{sizes.ffn_tiles}x{sizes.pes}; attention {sizes.dot_pes} PEs, softmax x V "
         f"{sizes.smm_pes} PEs per head; network hops and GMI kernels left out) at "
         f"{clock_mhz:g} MHz:")
    seqs = lat.PAPER_SEQ_LENS
    timing = {m: lat.encoder_timing(m, sizes) for m in seqs}
    echo(f"{'seq':>5} {'X cycles':>9} {'T cycles':>9} {'paper X':>9} {'paper T':>9} "
         f"{'L=12 ms':>8} {'+d ms':>8} {'paper ms':>9}")
    for m in seqs:
        x, t = timing[m]["X"], timing[m]["T"]
        px, pt, _ = lat.PAPER_TABLE1[m]
        ms = lat.chain_latency(t, x, L) / (clock_mhz * 1e3)
        ms_d = lat.chain_latency(t / clock_mhz, x / clock_mhz, L, d_us) / 1e3
        echo(f"{m:>5} {x:>9} {t:>9} {px:>9} {pt:>9} {ms:>8.3f} {ms_d:>8.3f} "
             f"{lat.PAPER_TABLE2_MS[m]:>9.3f}")
    echo("predicted latency of L = 1..12 encoders (ms, d included) for seq 38 and 128:")
    for m in (38, 128):
        x, t = lat.encoder_timing(m, sizes)["X"], lat.encoder_timing(m, sizes)["T"]
        row = " ".join(f"{lat.chain_latency(t / clock_mhz, x / clock_mhz, n, d_us) / 1e3:.3f}"
                       for n in range(1, 13))
        echo(f"  seq {m:>3}: {row}")
    echo("Table 2 reproduction " + ("within" if ok else "NOT within")
         + f" {TOLERANCE_PCT}% of the paper")
    return ok
