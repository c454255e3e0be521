"""Latency model of L encoders chained over the network (multi-FPGA I-BERT paper, section 8.2.2,
equation 1, and section 9.3).

One encoder runs on one cluster; encoder ``l + 1`` starts when the first packet of encoder ``l``
reaches it, ``X + d`` after encoder ``l`` received its own first packet (``X``: cycles from an
encoder's first input packet to its first output packet; ``d``: the switch-to-switch hop). The
last encoder finishes ``T`` (one encoder's whole latency) after its start::

    latency(L) = T + (L - 1) * (X + d)                                   (paper, eq. 1)

Calibration against the paper. Table 2's values (0.416 ... 7.193 ms for L = 12) are
``T + (L - 1) * X`` of Table 1's cycle counts at a 200 MHz kernel clock, i.e. with ``d`` left
out; with the measured ``d = 1.1 us`` every entry rises by ``11 * 1.1 = 12.1 us``
(:func:`table2`). The Versal estimate of section 9.3 uses ``T = 124.1 us``, ``X = 65.8 us``,
``d = 1.1 us``, ``L = 12``: 860 us (:func:`versal_estimate`).

:func:`encoder_timing` composes ``T`` and ``X`` of hwgen's own encoder from the cycle models of
the generated I-BERT kernels (``hwgen/ibert``; each model equals the kernel's simulated cycle
count, see ``tests/test_ibert_matrix.py``/``test_ibert_softmax.py``) with a row-level dataflow
recurrence (documented there).
"""

from dataclasses import dataclass

from ...ibert.attn_dot import AttnDotConfig
from ...ibert.gelu import GeluConfig
from ...ibert.layernorm import LayerNormConfig
from ...ibert.linear import LinearConfig
from ...ibert.requant import RequantConfig
from ...ibert.softmax import SoftmaxConfig
from ...ibert.softmax_matmul import SoftmaxMatmulConfig

__all__ = ["PAPER_TABLE1", "PAPER_TABLE2_MS", "PAPER_SEQ_LENS", "PAPER_CLOCK_MHZ", "PAPER_D_US",
           "VERSAL", "chain_latency", "table2", "versal_estimate", "encoder_timing",
           "EncoderSizes", "sizes_from_layers"]


#: Sequence lengths of the paper's Tables 1 and 2.
PAPER_SEQ_LENS = (1, 2, 4, 8, 16, 32, 64, 128)

#: Table 1: components of one encoder's latency in clock cycles, per sequence length:
#: ``(X, T, I)`` (first output, whole encoder, packet interval).
PAPER_TABLE1 = {
    1: (6936, 6936, 0), 2: (10455, 11004, 275), 4: (13769, 15869, 525),
    8: (17122, 22318, 650), 16: (23393, 34781, 712), 32: (35828, 59600, 743),
    64: (61121, 109660, 759), 128: (111708, 209789, 767),
}

#: Table 2: the paper's estimated I-BERT (12 encoders) latency in ms per sequence length.
PAPER_TABLE2_MS = {1: 0.416, 2: 0.630, 4: 0.837, 8: 1.053, 16: 1.461, 32: 2.269, 64: 3.910,
                   128: 7.193}

#: Kernel clock that turns Table 1's cycles into Table 2's milliseconds (our reading; the paper
#: does not state it, the fit is exact to the printed digits).
PAPER_CLOCK_MHZ = 200.0
#: Measured hop between the 100G switches (section 8.2.2).
PAPER_D_US = 1.1
#: Section 9.3's Versal VCK190 estimate: microseconds and the paper's result.
VERSAL = {"T_us": 124.1, "X_us": 65.8, "d_us": 1.1, "L": 12, "paper_us": 860.0}


def chain_latency(T, X, L, d=0.0):
    """``T + (L - 1) * (X + d)`` in the unit of its arguments (paper, equation 1)."""
    if L < 1:
        raise ValueError("L (encoders) must be >= 1")
    return T + (L - 1) * (X + d)


def table2(L=12, clock_mhz=PAPER_CLOCK_MHZ, d_us=PAPER_D_US, table1=PAPER_TABLE1):
    """Rows reproducing Table 2 from Table 1: per sequence length ``seq``, ``X``/``T`` cycles,
    ``ms`` (d left out, as the paper's Table 2), ``paper_ms``, ``error_pct`` (relative to the
    paper) and ``ms_with_d`` (the hop included)."""
    rows = []
    for seq, (x, t, _i) in table1.items():
        ms = chain_latency(t, x, L) / (clock_mhz * 1e3)
        with_d = chain_latency(t / clock_mhz, x / clock_mhz, L, d_us) / 1e3
        paper = PAPER_TABLE2_MS.get(seq)
        rows.append({"seq": seq, "X": x, "T": t, "ms": ms, "paper_ms": paper,
                     "error_pct": None if paper is None else 100 * (ms - paper) / paper,
                     "ms_with_d": with_d})
    return rows


def versal_estimate(T_us=VERSAL["T_us"], X_us=VERSAL["X_us"], d_us=VERSAL["d_us"],
                    L=VERSAL["L"]):
    """Section 9.3's estimate in microseconds (860 us with the paper's numbers)."""
    return chain_latency(T_us, X_us, L, d_us)


# -- our encoder ------------------------------------------------------------------------------

@dataclass(frozen=True)
class EncoderSizes:
    """BERT-base encoder sizes and the parallelism of hwgen's kernels in it.

    ``tiles``/``pes``: the attention linears (Q, K, V, output: 768 x 768); ``ffn_tiles``: the
    feed-forward linears (768 -> 3072 -> 768, 48 PEs per tile; 32 x 48 = 1536 MACs fits one
    XCZU19EG's 1968 DSPs); ``dot_pes``/``smm_pes``: attention dot product and softmax x V PEs
    per head; ``lanes``: elements per beat of requant/GELU; ``ln_lanes``: LayerNorm."""
    hidden: int = 768
    heads: int = 12
    ffn: int = 3072
    tiles: int = 16
    pes: int = 48
    ffn_tiles: int = 32
    dot_pes: int = 16
    smm_pes: int = 4
    lanes: int = 16
    ln_lanes: int = 8
    max_len: int = 128
    down_tiles: int = 0          # tiles of the FFN's second linear (0: ffn_tiles)


def sizes_from_layers(layers):
    """The :class:`EncoderSizes` of a layers description structured as
    ``ibert_encoder.layers.json`` (layers ``q``, ``attn_dot``, ``softmax_matmul``, ``ffn_up``,
    ``ln1``; :mod:`hwgen.cluster.spec.describe`), from its modules' parameters. Stages the model
    does not have are left out."""
    by = {l.name: l for l in layers.layers}
    missing = [n for n in ("q", "attn_dot", "softmax_matmul", "ffn_up", "ln1") if n not in by]
    if missing:
        raise ValueError("not an I-BERT encoder layer description: no layer "
                         + ", ".join(missing))

    def params(layer, kind):
        return next(m.params for m in by[layer].modules if m.kind == kind)
    q, up = params("q", "ibert-linear"), params("ffn_up", "ibert-linear")
    dot, smm = params("attn_dot", "ibert-attn-dot"), params("softmax_matmul",
                                                            "ibert-softmax-matmul")
    return EncoderSizes(hidden=q["out_features"], heads=by["attn_dot"].count,
                        ffn=up["out_features"], tiles=q["tiles"], pes=q["pes"],
                        ffn_tiles=up["tiles"], dot_pes=dot["pes"], smm_pes=smm["pes"],
                        down_tiles=params("ffn_down", "ibert-linear")["tiles"]
                        if "ffn_down" in by else 0,
                        lanes=params("q", "ibert-requant").get("lanes", 16),
                        ln_lanes=params("ln1", "ibert-layernorm").get("lanes", 8),
                        max_len=dot["max_len"])


def _stage_params(sizes, m):
    """Per stage ``(latency, period)`` in cycles of the modules ``sizes`` describes (each
    configuration's :meth:`~hwgen.lib.row_ports.RowKernel.row_timing`)."""
    H, d = sizes.hidden, sizes.hidden // sizes.heads
    cfgs = {name: LinearConfig(in_features=k, out_features=n, tiles=t, pes=sizes.pes)
            for name, k, n, t in (("qkv", H, H, sizes.tiles), ("attn_out", H, H, sizes.tiles),
                                  ("ffn_up", H, sizes.ffn, sizes.ffn_tiles),
                                  ("ffn_down", sizes.ffn, H, sizes.down_tiles or sizes.ffn_tiles))}
    for name, row, ident in (("quant", H, False), ("quant_res", H, True), ("quant_head", d, False)):
        cfgs[name] = RequantConfig(row=row, lanes=min(sizes.lanes, row), identity=ident)
    cfgs["gelu"] = GeluConfig(row=sizes.ffn, lanes=sizes.lanes)
    cfgs["ln"] = LayerNormConfig(hidden=H, lanes=sizes.ln_lanes)
    cfgs["softmax"] = SoftmaxConfig(max_len=sizes.max_len)
    cfgs["attn_dot"] = AttnDotConfig(head_dim=d, max_len=sizes.max_len, pes=sizes.dot_pes)
    cfgs["softmax_matmul"] = SoftmaxMatmulConfig(head_dim=d, max_len=sizes.max_len,
                                                 pes=sizes.smm_pes)
    return {name: cfg.row_timing(m) for name, cfg in cfgs.items()}


def encoder_timing(m, sizes=EncoderSizes(), hop_cycles=0, input_period=None):
    """``X`` and ``T`` (cycles) of hwgen's I-BERT encoder for ``m`` tokens.

    The encoder is the chain of Fig. 10/14: Q/K/V linear + quant -> (scatter) -> per head
    attention dot product -> softmax -> softmax x V (+ V) -> quant -> (gather) -> linear +
    quant with residual -> LayerNorm -> (broadcast) -> linear + GELU -> linear + quant with
    residual -> LayerNorm. Row ``r`` of each stage completes at::

        out[r] = max(ready[r] + latency, out[r - 1] + period)

    where ``ready[r]`` is when the stage has the input row(s) it needs (all of K or V for the
    attention stages). The input arrives one row per ``input_period`` cycles (default: the Q/K/V
    linear's input rate). GMI kernels, switches and routers are counted as ``hop_cycles`` per
    hop between kernels (default 0: left out, like ``d`` inside the paper's T).

    Returns ``{"X", "T", "stages": {name: (first row, last row)}}``; ``X`` counts to the first
    output row's last beat.
    """
    st = _stage_params(sizes, m)
    steps = -(-sizes.hidden // sizes.pes)
    period_in = input_period or steps
    inp = [r * period_in + steps - 1 for r in range(m)]
    times = {}

    def stage(name, ready, key=None):
        lat, per = st[key or name]
        out, prev = [], None
        for t in ready:
            now = t + hop_cycles + lat
            if prev is not None:
                now = max(now, prev + per)
            out.append(now)
            prev = now
        times[name] = out
        return out

    qkv = stage("quant_qkv", stage("linear_qkv", inp, "qkv"), "quant")
    kv_done = qkv[-1]
    scores = stage("attn_dot", [max(t, kv_done + hop_cycles) for t in qkv])
    probs = stage("softmax", scores)
    ctx = stage("softmax_matmul", [max(t, kv_done + hop_cycles) for t in probs])
    ctx = stage("quant_head", ctx)
    res1 = [max(a, b) for a, b in zip(stage("linear_attn_out", ctx, "attn_out"), inp)]
    ln1 = stage("layernorm1", stage("quant_res1", res1, "quant_res"), "ln")
    up = stage("gelu", stage("linear_ffn_up", ln1, "ffn_up"))
    down = [max(a, b) for a, b in zip(stage("linear_ffn_down", up, "ffn_down"), ln1)]
    out = stage("layernorm2", stage("quant_res2", down, "quant_res"), "ln")
    ln_beats = st["ln"][1]
    return {"X": out[0] - (ln_beats - 1) + 1, "T": out[-1] + 1,
            "stages": {k: (v[0], v[-1]) for k, v in times.items()}}
