"""I-BERT elementwise kernels (requantisation, i-GELU).

The rounding circuit exhaustively; the constants the RTL is built from against golden.py and
against the Hugging Face reference; the RTL itself at many scales in the Amaranth simulator
(cheap, no Verilator build per scale); the configuration domain (where golden.py is exact in
int64) and derived widths; stimulus coverage; and the cycle model against Verilator simulation
at --stall 0. Bit-exactness with 30% stalls in every TEST_CONFIGS entry is in test_sim.py.
"""

import numpy as np
import pytest
from amaranth.hdl import Module, Signal, signed
from amaranth.sim import Simulator

from hwgen import registry
from hwgen.errors import ConfigError
from hwgen.flow.simulate import simulate
from hwgen.ibert import gelu, golden, requant
from hwgen.ibert.gelu import Gelu, GeluConfig, GeluModel, signed_bits
from hwgen.ibert.requant import Requant, RequantConfig, RequantModel, round_half_even, \
    round_shift_int
from hwgen.ibert.stream_rows import to_beats

from conftest import requires_verilator


# -- helpers ------------------------------------------------------------------------------------

def exact_gelu(q, scale):
    """i-GELU in Python integers (no int64), straight from the formula."""
    b, c, shift, _ = golden.gelu_constants(scale)
    sign = (q > 0) - (q < 0)
    poly = sign * ((min(abs(q), -b) + b) ** 2 + c)
    return q * ((poly >> golden.GELU_CONST) + shift)


def run_core(core, beats, out_field):
    """Drive ``beats`` into ``core.i_x`` back to back (output always ready) in the Amaranth
    simulator; returns the output beats as dicts of ``out_field`` and ``last``."""
    in_layout = core.i_x.payload.shape()
    got = []

    async def bench(ctx):
        ctx.set(core.o_y.ready, 1)
        k = 0
        for _ in range(len(beats) + 64):
            if k < len(beats):
                ctx.set(core.i_x.valid, 1)
                ctx.set(core.i_x.payload, in_layout.const(beats[k]))
            else:
                ctx.set(core.i_x.valid, 0)
            taken = ctx.get(core.i_x.valid) and ctx.get(core.i_x.ready)
            if ctx.get(core.o_y.valid):
                beat = ctx.get(core.o_y.payload)
                got.append({out_field: [int(v) for v in getattr(beat, out_field)],
                            "last": int(beat.last)})
            await ctx.tick()
            k += int(bool(taken))

    sim = Simulator(core)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    return got


# -- rounding -----------------------------------------------------------------------------------

def test_python_rounding_equals_golden():
    xs = np.arange(-300, 301)
    for e in range(-3, 12):
        assert [round_shift_int(int(x), e) for x in xs] == golden.round_shift(xs, e).tolist()


@pytest.mark.parametrize("e", [-30, -2, 0, 1, 2, 31, 61, 62, 63, 64, 70])
def test_round_shift_exact_at_int64_extremes(e):
    """Against Python's own round-half-even of the exact fraction x / 2**e (``round`` of a
    ``Fraction``), at the int64 extremes, ties and values whose left shift leaves int64."""
    from fractions import Fraction
    xs = [0, 1, -1, 3, -3, 5, -5, (1 << 62), -(1 << 62), (1 << 62) + 1, -(1 << 62) - 1,
          3 << 40, -(3 << 40), (1 << 63) - 1, -(1 << 63), (1 << 61) + (1 << 60)]
    got = golden.round_shift(np.array(xs, dtype=np.int64), e)
    want = [round(Fraction(x, 1 << e)) if e > 0 else x << -e for x in xs]
    assert [int(v) for v in got] == want
    # the same with e as an array broadcast against x (one exponent per element)
    per = golden.round_shift(np.array(xs, dtype=np.int64), np.full(len(xs), e))
    assert [int(v) for v in per] == want


@pytest.mark.parametrize("width", [1, 2, 7])
def test_round_half_even_circuit_exhaustive(width):
    """Every input of a ``width``-bit signed value at every shift from a left shift to one
    beyond the width (sign-extension bits enter the sticky bit there)."""
    shifts = range(-2, width + 3)
    x = Signal(signed(width))
    outs = {s: Signal(signed(width + 4), name=f"r{s + 2}") for s in shifts}
    m = Module()
    for s, o in outs.items():
        m.d.comb += o.eq(round_half_even(x, s))
    seen = []

    async def bench(ctx):
        for v in range(-(1 << (width - 1)), 1 << (width - 1)):
            ctx.set(x, v)
            for s, o in outs.items():
                seen.append((v, s, ctx.get(o)))

    sim = Simulator(m)
    sim.add_testbench(bench)
    sim.run()
    assert len(seen) == len(shifts) << width
    for v, s, got in seen:
        assert got == round_shift_int(v, s), (v, s)


# -- constants ----------------------------------------------------------------------------------

REQUANT_SCALES = [(1.9e-4, 0.08), (0.25, 1.0), (3.1e-4, 0.0021), (3.0e9, 1.0), (1e-3, 7.3e-3),
                  (1.5 * 2.0 ** -33, 1.0)]
GELU_SCALES = [2e-4, 1e-4, 3.7e-5, 1e-3, 0.05, 1.0, 10.0]


@pytest.mark.parametrize("scale_in, scale_out", REQUANT_SCALES)
def test_requant_rtl_constants_are_golden(scale_in, scale_out):
    cfg = RequantConfig(scale_in=scale_in, scale_out=scale_out, identity=True,
                        identity_scale=scale_out * 0.37)
    main, ident = golden.requant_constants(scale_in, scale_out, scale_out * 0.37)
    assert cfg.constants == (main, ident)
    for (m, e), b in ((main, cfg.main), (ident, cfg.ident)):
        # The RTL multiplies by b["mult"] and shifts by b["shift"]: the same m / 2**e.
        assert b["mult"] % 2 == 1 and b["mult"] << (e - b["shift"]) == m
        assert e - b["shift"] >= 0


@pytest.mark.float_reference
@pytest.mark.parametrize("scale_in, scale_out", REQUANT_SCALES)
def test_requant_constants_match_reference(scale_in, scale_out):
    torch = pytest.importorskip("torch")
    quant_modules = pytest.importorskip("transformers.models.ibert.quant_modules")
    a = torch.tensor([scale_in], dtype=torch.float32).type(torch.double)
    b = torch.tensor([scale_out], dtype=torch.float32).type(torch.double)
    m, e = quant_modules.batch_frexp(a / b)           # as FixedPointMul derives them
    assert RequantConfig(scale_in=scale_in, scale_out=scale_out).constants[0] == \
        (int(m), int(e))


@pytest.mark.parametrize("scale", GELU_SCALES)
def test_gelu_rtl_constants_are_golden(scale):
    cfg = GeluConfig(scale=scale)
    b, c, shift, _ = golden.gelu_constants(scale)
    assert cfg.constants[:3] == (b, c, shift)
    _, k1, k2 = cfg.folded
    # The folded constants reproduce floor(+-P / 2**14) + shift for every polynomial value.
    for sq in (0, 1, b * b // 3, b * b):
        p = sq + c
        assert (sq + k1) >> 14 == (p >> 14) + shift
        assert (k2 - sq) >> 14 == ((-p) >> 14) + shift


def _reference_gelu_constants(scale):
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers.models.ibert.quant_modules")
    from transformers.models.ibert.quant_modules import IntGELU
    ref = IntGELU(quant_mode=True)
    s = torch.tensor([scale], dtype=torch.float32) / ref.k       # as IntGELU.forward
    b = torch.floor(ref.coeff[1] / s)
    c = torch.floor(ref.coeff[2] / s ** 2)
    shift = 1.0 // (s ** 2 * ref.coeff[0] * 2 ** ref.const)
    return int(b), int(c), int(shift)


def _assert_gelu_constants_agree(got, scale):
    """``b`` and ``c`` are ``floor(coeff * (1 / s))`` with torch's vector reciprocal, which is
    allowed two units in the last place (``tests/ibert_float32.py``): where ``coeff / s`` lies
    within that (``2**-21`` relative, with the product's rounding) of an integer, the
    reference may floor to the neighbour, and the golden's correctly rounded constant may
    differ from it by one there and only there. ``shift`` is IEEE-exact: equal."""
    ref = _reference_gelu_constants(scale)
    s = float(np.float32(np.float32(scale) / np.float32(1.4142)))
    assert got[2] == ref[2]
    for k, value in ((0, -1.769 / s), (1, (1 / -0.2888) / (s * s))):
        near = abs(value - round(value)) <= abs(value) * 2.0 ** -20
        assert got[k] == ref[k] or (near and abs(got[k] - ref[k]) == 1), (k, got, ref)


@pytest.mark.float_reference
@pytest.mark.parametrize("scale", GELU_SCALES)
def test_gelu_constants_match_reference(scale):
    _assert_gelu_constants_agree(GeluConfig(scale=scale).constants[:3], scale)


@pytest.mark.float_reference
def test_gelu_shift_constant_matches_reference_at_a_known_divergent_scale():
    """The reference's ``1.0 // x`` is torch's fmod-based floor division, one less than
    floor(1 / x) at some scales; golden emulates it."""
    scale = 0.00024202153117226267
    _assert_gelu_constants_agree(golden.gelu_constants(scale)[:3], scale)


# -- the RTL at many scales (Amaranth simulator) -----------------------------------------------

@pytest.mark.parametrize("scale_in, scale_out", REQUANT_SCALES)
@pytest.mark.parametrize("identity", [False, True])
def test_requant_rtl_bit_exact_at_many_scales(scale_in, scale_out, identity):
    cfg = RequantConfig(scale_in=scale_in, scale_out=scale_out, bits=12, in_bits=24,
                        identity=identity, identity_scale=scale_out * 3.3, identity_bits=10,
                        lanes=2, row=5)
    stim = RequantModel.stimulus(cfg, 14, np.random.default_rng(5))
    got = run_core(Requant(cfg), RequantModel.inputs(cfg, stim)["i_x"], "y")
    assert got == RequantModel.expect(cfg, stim)["o_y"]


@pytest.mark.parametrize("scale", GELU_SCALES)
def test_gelu_rtl_bit_exact_at_many_scales(scale):
    cfg = GeluConfig(scale=scale, in_bits=20, lanes=2, row=5)
    stim = GeluModel.stimulus(cfg, 14, np.random.default_rng(6))
    got = run_core(Gelu(cfg), GeluModel.inputs(cfg, stim)["i_x"], "y")
    assert got == GeluModel.expect(cfg, stim)["o_y"]


# -- configuration domain and widths -----------------------------------------------------------

def _exact_requant(q, idv, cfg):
    (m, e), ident = cfg.constants
    y = round_shift_int(q * m, e)
    if ident:
        y += round_shift_int(idv * ident[0], ident[1])
    lo, hi = cfg.out_range
    return min(max(y, lo), hi)


@pytest.mark.parametrize("values", [
    {"scale_in": 1.5 * 2.0 ** -33, "scale_out": 1.0},                  # e = 63: largest shift
    {"scale_in": 3.0e9, "scale_out": 1.0, "bits": 32},                   # e = -1 at 32-bit input
    {"scale_in": 3.0e9, "scale_out": 1.0, "bits": 32, "in_bits": 31, "identity": True,
     "identity_scale": 1.2e9, "identity_bits": 31},
])
def test_requant_golden_exact_at_domain_edges(values):
    """At the edges of the accepted configurations golden.requant still equals exact integer
    arithmetic for the extreme inputs, so the domain check is sufficient."""
    cfg = RequantConfig(**values)
    qlo, qhi = -(1 << (cfg.in_bits - 1)), (1 << (cfg.in_bits - 1)) - 1
    ilo, ihi = -(1 << (cfg.identity_bits - 1)), (1 << (cfg.identity_bits - 1)) - 1
    q = np.array([qlo, qlo + 1, -1, 0, 1, qhi - 1, qhi])
    ids = np.array([ihi, ilo, 0, 1, -1, ihi, ilo]) if cfg.identity else None
    y, _ = golden.requant(q, cfg.scale_in, cfg.scale_out, cfg.bits, identity=ids,
                          identity_scale=cfg.identity_scale if cfg.identity else None)
    want = [_exact_requant(int(a), int(b) if ids is not None else 0, cfg)
            for a, b in zip(q, ids if ids is not None else q)]
    assert y.tolist() == want
    lo, hi = cfg.main["lo"], cfg.main["hi"]
    assert lo == round_shift_int(qlo * cfg.constants[0][0], cfg.constants[0][1])
    assert hi == round_shift_int(qhi * cfg.constants[0][0], cfg.constants[0][1])


@pytest.mark.parametrize("values, param", [
    ({"scale_in": 1e-12, "scale_out": 1.0}, "scale_in"),                # e = 70
    ({"scale_in": 6.0e9, "scale_out": 1.0}, "scale_in"),                # e = -2 at 32 bits
    ({"identity": True, "identity_scale": 1e-15}, "identity_scale"),
    ({"scale_in": 3.0e9, "scale_out": 1.0, "identity": True, "identity_scale": 3.0e9,
      "identity_bits": 32}, "identity_scale"),                           # the sum overflows
    ({"scale_in": 0.0}, "scale_in"),
    ({"scale_out": float("nan")}, "scale_out"),
    ({"scale_in": 1e39}, "scale_in"),                                    # not a float32
])
def test_requant_rejects_configurations_golden_cannot_model(values, param):
    with pytest.raises(ConfigError) as err:
        RequantConfig(**values)
    assert err.value.param == param


def test_requant_golden_exact_where_configs_are_rejected():
    """Golden rounds exactly beyond the datapath's range (e = 70; left shifts past 64 bits);
    the configuration rejects those ratios as beyond its 63-bit shifter and 64-bit results."""
    assert golden.requant([5], 1e-12, 1.0, 8)[0].tolist() == [0]
    assert golden.requant([2 ** 31 - 1], 6.0e9, 1.0, 8)[0].tolist() == [127]
    for scale_in in (1e-12, 6.0e9):
        with pytest.raises(ConfigError):
            RequantConfig(scale_in=scale_in, scale_out=1.0, in_bits=32)


def test_gelu_rejects_scales_beyond_int64():
    with pytest.raises(ConfigError) as err:
        GeluConfig(scale=1e-9)
    assert err.value.param == "scale"
    GeluConfig(scale=1e-9, in_bits=8)          # narrow inputs stay within int64
    with pytest.raises(ConfigError):
        GeluConfig(scale=-0.1)


@pytest.mark.parametrize("scale, in_bits", [(0.05, 8), (10.0, 12), (1e-3, 16), (1e-4, 12),
                                            (1.0, 16), (1e-9, 8)])
def test_gelu_output_width_holds_every_result(scale, in_bits):
    """Exhaustive over the input range: golden equals exact integers, every result fits
    ``out_bits``, and where the clip is reachable the width is the smallest possible."""
    cfg = GeluConfig(scale=scale, in_bits=in_bits)
    qlo, qhi = cfg.q_range
    q = np.arange(qlo, qhi + 1)
    y, _ = golden.int_gelu(q, scale)
    sample = q[:: max(1, len(q) // 2000)].tolist() + [qlo, qhi, -1, 0, 1]
    assert [exact_gelu(v, scale) for v in sample] == \
        golden.int_gelu(np.array(sample), scale)[0].tolist()
    lo, hi = cfg.out_range
    assert lo <= y.min() and y.max() <= hi
    if -cfg.constants[0] <= qhi:
        assert cfg.out_bits == max(signed_bits(int(y.min())), signed_bits(int(y.max())))


def test_gelu_bert_base_width():
    """INT32 inputs at a realistic scale: the clip is reached, the extreme is attained at the
    largest input, so the output width is exact."""
    cfg = GeluConfig()
    qlo, qhi = cfg.q_range
    ys = [exact_gelu(v, cfg.scale) for v in (qlo, qhi)]
    assert cfg.out_bits == max(signed_bits(v) for v in ys) and cfg.out_bits <= 64


# -- stimulus and row packing ------------------------------------------------------------------

def test_to_beats_pads_the_final_beat():
    rows = np.arange(1, 15).reshape(2, 7)
    beats = to_beats({"q": rows}, 3, pad={"q": np.array([-1, -2, -3, -4])})
    assert [b["q"] for b in beats] == [[1, 2, 3], [4, 5, 6], [7, -1, -2],
                                       [8, 9, 10], [11, 12, 13], [14, -3, -4]]
    assert [b["last"] for b in beats] == [0, 0, 1, 0, 0, 1]
    assert to_beats({"q": rows}, 7)[1] == {"q": list(range(8, 15)), "last": 1}


def test_requant_stimulus_covers_extremes_ties_and_saturation():
    cfg = RequantConfig.from_dict(requant.TEST_CONFIGS[0])    # power-of-two ratio: ties
    stim = RequantModel.stimulus(cfg, 40, np.random.default_rng(0))
    q = stim["q"]
    qlo, qhi = -(1 << (cfg.in_bits - 1)), (1 << (cfg.in_bits - 1)) - 1
    assert (q == qlo).any() and (q == qhi).any() and (q == 0).any()
    (m, e), _ = cfg.constants
    rem = (q * m) % (1 << e)
    ties = q[rem == 1 << (e - 1)]
    assert ((ties * m >> e) % 2 == 0).any() and ((ties * m >> e) % 2 == 1).any()
    y = RequantModel.expect(cfg, stim)["o_y"]
    flat = [v for b in y for v in b["y"]]
    assert min(flat) == -(1 << (cfg.bits - 1)) and max(flat) == (1 << (cfg.bits - 1)) - 1
    assert len(set(flat)) > 50                      # realistic values spread over the range


def test_requant_stimulus_residual_and_padding():
    cfg = RequantConfig.from_dict(requant.TEST_CONFIGS[1])
    stim = RequantModel.stimulus(cfg, 30, np.random.default_rng(1))
    ilo, ihi = -(1 << (cfg.identity_bits - 1)), (1 << (cfg.identity_bits - 1)) - 1
    assert (stim["id"] == ilo).any() and (stim["id"] == ihi).any()
    beats = RequantModel.inputs(cfg, stim)["i_x"]
    finals = [b for b in beats if b["last"]]
    assert len(finals) == 30 and any(b["q"][-1] != 0 for b in finals)   # garbage padding
    assert all(b["y"][1:] == [0, 0] for b in RequantModel.expect(cfg, stim)["o_y"]
               if b["last"])


def test_gelu_stimulus_covers_the_polynomial_and_the_extremes():
    cfg = GeluConfig.from_dict(gelu.TEST_CONFIGS[0])
    stim = GeluModel.stimulus(cfg, 40, np.random.default_rng(2))
    q = stim["q"]
    b = cfg.constants[0]
    qlo, qhi = cfg.q_range
    for v in (qlo, qhi, 0, b, -b, b + 1, -b - 1):
        assert (q == v).any(), v
    assert len(np.unique(q[np.abs(q) < -b])) > 40


# -- cycle model against Verilator -------------------------------------------------------------

CYCLE_CASES = [("ibert-requant", 0), ("ibert-requant", 1), ("ibert-requant", 3),
               ("ibert-gelu", 0), ("ibert-gelu", 1), ("ibert-gelu", 3)]


@requires_verilator
@pytest.mark.parametrize("name, index", CYCLE_CASES, ids=[f"{n}-{i}" for n, i in CYCLE_CASES])
def test_cycle_model_matches_simulation_without_stalls(name, index):
    """One beat per cycle, rows back to back, latency and total cycles as the model says."""
    acc = registry.get(name)
    cfg = acc.config.from_dict(acc.test_configs[index])
    rows = 37
    result = simulate(acc, cfg, items=rows, seed=11, stall=0.0, engine="native")
    assert result["mismatches"] == 0 and not result["timeout"]
    model = cfg.performance(cfg.workload(rows=rows))
    assert result["latency_cycles"] == model["latency_cycles"]
    assert result["cycles"] == model["cycles"]
    assert result["results_per_cycle"] == 1.0
    assert result["input_items_per_cycle"] == 1.0
