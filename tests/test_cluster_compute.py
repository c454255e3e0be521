"""Compute kernels as chains of registered modules (:mod:`hwgen.cluster.gateware.compute`): the
kernel row-stream table against the kernels' own payload layouts, link checks and port naming, the
composed golden model against the golden functions, the regrouper alone on the Amaranth
simulator (random gaps and backpressure, odd rows, matrix ends), the layer description's chains,
and Verilator runs beyond ``tests/test_sim.py`` (which simulates every entry of
``compute.TEST_CONFIGS`` natively at 30% stalls and the first on cocotb)."""

import json
import random

import numpy as np
import pytest
from amaranth.hdl import Module as HDLModule, Signal, signed, unsigned
from amaranth.sim import Simulator

from hwgen import registry
from hwgen.cluster.gateware import compute as C
from hwgen.cluster.spec import compute as C_spec
from hwgen.cluster.gateware.compute import KernelChain, Regroup, RowPort
from hwgen.cluster.spec.compute import KernelChainConfig, chain_plan
from hwgen.cluster.golden.compute import decode_rows
from hwgen.cluster.spec.describe import DESCRIPTIONS_DIR, Module, parse_layers
from hwgen.errors import ConfigError
from hwgen.flow.simulate import simulate
from hwgen.ibert import golden

from conftest import requires_verilator

ACC = registry.get("cluster-kernel-chain")


def _cfg(index):
    return ACC.config.from_dict(ACC.test_configs[index])


def _mods(*pairs):
    return [{"kind": k, "params": p} for k, p in pairs]


LINEAR = ("ibert-linear", {"in_features": 37, "out_features": 15, "tiles": 5, "pes": 4})


# -- the kernel table ----------------------------------------------------------------------------

def test_the_chainable_kernels_are_the_ibert_kernels():
    """Every I-BERT kernel's configuration is a RowKernel, and nothing else is."""
    assert set(C_spec.chainable_kinds()) == {
        "ibert-linear", "ibert-requant", "ibert-gelu", "ibert-softmax", "ibert-layernorm",
        "ibert-attn-dot", "ibert-softmax-matmul"}


@pytest.mark.parametrize("kind", list(C_spec.chainable_kinds()))
def test_row_ports_are_the_kernels_payload_layouts(kind):
    acc = registry.get(kind)
    for values in acc.test_configs:
        cfg = acc.config.from_dict(values)
        core = acc.build_core(cfg)
        core._MustUse__silence = True           # never elaborated here
        ins, feed, out = C_spec.kernel_ports(kind, cfg)
        assert feed in [p.member for p in ins]
        for p in (*ins, out):
            member = core.signature.members[p.member]
            assert member.signature.members["payload"].shape == p.layout(), (kind, p.member)


# -- plans, ports and refusals -------------------------------------------------------------------

def test_port_names_and_records():
    names = [[p.name for p in _cfg(i).plan.inputs] for i in range(len(ACC.test_configs))]
    assert names == [["i_0_x"], ["i_0_q", "i_0_k"], ["i_0_x"], ["i_0_x", "i_1_id"],
                     ["i_0_p", "i_0_v"], ["i_0_x"]]
    plan = _cfg(3).plan
    x, ident = plan.inputs
    assert (x.elem_bits, x.lanes, x.row, x.last_row, x.module) == (8, 5, 10, True, 0)
    assert (ident.field, ident.elem_bits, ident.lanes, ident.row, ident.module) == \
        ("id", 8, 2, 14, 1)
    assert ident.layout().members.keys() == {"id", "last"}
    assert (plan.output.name, plan.output.member, plan.output.lanes) == ("o_y", "o_row", 7)
    chain = KernelChain(_cfg(3))
    assert chain.inputs == plan.inputs and chain.output == plan.output
    assert set(chain.signature.members) == {"i_0_x", "i_1_id", "o_y"}
    chain._MustUse__silence = True


def test_describe_modules_and_json_give_the_same_plan():
    mods = _mods(LINEAR, ("ibert-requant", {"row": 15, "lanes": 4}))
    a = chain_plan([Module(m["kind"], m["params"]) for m in mods])
    assert chain_plan(mods) == chain_plan(json.dumps(mods)) == a
    assert a.cycle_model()["regroup_latency"] == 1


@pytest.mark.parametrize("mods, where, needle", [
    (_mods(LINEAR, ("ibert-requant", {"row": 16, "lanes": 4})), "modules[1]",
     "needs exactly 16"),
    (_mods(LINEAR, ("ibert-requant", {"row": 15, "in_bits": 24})), "modules[1]",
     "never narrowed"),
    (_mods(("ibert-attn-dot", {"head_dim": 4, "max_len": 9, "pes": 2}),
           ("ibert-softmax", {"max_len": 8})), "modules[1]", "at most 8"),
    (_mods(("ibert-softmax", {"max_len": 8, "lanes": 2}),
           ("ibert-softmax-matmul", {"max_len": 8, "head_dim": 4, "pes": 2})), "modules[1]",
     "last rows"),
    (_mods(("ibert-softmax", {"max_len": 8, "output_bits": 9}),
           ("ibert-softmax-matmul", {"max_len": 8, "head_dim": 4, "pes": 2})), "modules[1]",
     "do not fit"),
    (_mods(("ibert-gelu", {"row": 8}), ("ibert-requant", {"row": 8})), "modules[1]",
     "do not fit"),
    (_mods(("pq-decoder", {})), "modules[0].kind", "must be one of"),
    (_mods(("ibert-linear", {"tiles": 7})), "modules[0].params.tiles", "must divide"),
    ([{"kind": "ibert-gelu", "colour": 1}], "modules[0]", "kind"),
    ([{"kind": ["x"]}], "modules[0].kind", "must be one of"),
    ([], "modules", "non-empty"),
    ("[{", "modules", "JSON"),
])
def test_bad_chains_are_refused_naming_the_module(mods, where, needle):
    with pytest.raises(ConfigError) as e:
        chain_plan(mods)
    assert e.value.param == where and needle in e.value.reason, str(e.value)
    if not isinstance(mods, str):
        with pytest.raises(ConfigError):
            KernelChainConfig(modules=json.dumps(mods))


def test_layer_description_chains_plan():
    """Every compute kernel of the BERT-base description is a valid chain."""
    desc = parse_layers(json.loads((DESCRIPTIONS_DIR / "ibert_encoder.layers.json")
                                   .read_text()))
    got = {layer.name: [p.name for p in chain_plan(layer.modules).inputs]
           for layer in desc.layers}
    assert got["attn_dot"] == ["i_0_q", "i_0_k"]
    assert got["softmax_matmul"] == ["i_0_p", "i_0_v"]
    assert got["attn_out"] == got["ffn_down"] == ["i_0_x", "i_1_id"]
    assert got["ln1"] == ["i_0_row"] and got["ffn_up"] == ["i_0_x"]


# -- the composed golden model -------------------------------------------------------------------

def test_golden_composition_is_the_golden_functions():
    """linear -> residual requant -> LayerNorm, recomputed from the golden functions."""
    cfg = _cfg(3)
    stim = ACC.model.stimulus(cfg, 12, np.random.default_rng(5))
    lin, req, ln = cfg.plan.configs
    w, b = lin.parameters
    y = np.concatenate([golden.linear(x, w, b)[0] for x in stim["first"]["x"]])
    q, _ = golden.requant(y, req.scale_in, req.scale_out, req.bits,
                          identity=stim["extra"]["i_1_id"], identity_scale=req.identity_scale)
    out, _ = golden.int_layernorm(q, 1.0, *ln.weight_bias, ln.shift)
    rows, ends = decode_rows(cfg.plan.output, ACC.model.expect(cfg, stim)["o_y"])
    assert ends == [None] * 12
    np.testing.assert_array_equal(np.array(rows), out)
    ins = ACC.model.inputs(cfg, stim)
    assert len(ins["i_1_id"]) == 12 * 7 and len(ins["i_0_x"]) == 12 * 2


def test_golden_attention_scores_into_softmax():
    cfg = _cfg(1)
    stim = ACC.model.stimulus(cfg, 20, np.random.default_rng(2))
    sm = cfg.plan.configs[1]
    want = [golden.int_softmax(row[None, :], sm.scale, sm.output_bits, act_scale=sm.act)[0][0]
            for q, k in zip(stim["first"]["q"], stim["first"]["k"]) for row in q @ k.T]
    rows, _ = decode_rows(cfg.plan.output, ACC.model.expect(cfg, stim)["o_y"])
    assert len(rows) == 20 and {len(r) for r in rows} != {11}
    for a, b in zip(rows, want):
        np.testing.assert_array_equal(a, b)


# -- the regrouper alone ---------------------------------------------------------------------------

def _encode(port, rows, ends, rng):
    """Beats of ``port`` for ``rows`` (padding random when ``rng``, else 0)."""
    beats = []
    for row, end in zip(rows, ends):
        nb = -(-len(row) // port.lanes)
        for k in range(nb):
            vals = [int(v) for v in row[k * port.lanes:(k + 1) * port.lanes]]
            n = len(vals)
            vals += [int(v) for v in rng.integers(0, 3, port.lanes - n)] if rng is not None else \
                [0] * (port.lanes - n)
            beat = {port.field: vals if port.array else vals[0]}
            if port.count:
                beat["count"] = n
            if port.last_row:
                beat["last_row"] = int(end)
            beat["last"] = int(end if port.framing == "beat" else k == nb - 1)
            beats.append(beat)
    return beats


def _rows(rng, port, n_rows, longest):
    lo, hi = (-(1 << (port.elem_bits - 1)), (1 << (port.elem_bits - 1)) - 1) if port.signed \
        else (0, (1 << port.elem_bits) - 1)
    lengths = [port.row or int(rng.integers(1, longest, endpoint=True)) for _ in range(n_rows)]
    if not port.row:
        lengths[:2] = [longest, 1]
    rows = [rng.integers(lo, hi, n, endpoint=True) for n in lengths]
    ends = [bool(rng.integers(3) == 0) or i == n_rows - 1 for i in range(n_rows)]
    return rows, ends


def _run_regroup(src, dst, beats, stall, seed):
    dut = Regroup(src, dst)
    top = HDLModule()                # a clock domain even around the combinational case
    top.submodules.dut = dut
    toggle = Signal()
    top.d.sync += toggle.eq(~toggle)
    got = []
    sim = Simulator(top)
    sim.add_clock(1e-8)
    rnd = random.Random(seed)

    cycles = {"first_in": None, "last_out": None}

    async def producer(ctx):
        cycle = 0
        for beat in beats:
            while rnd.random() < stall:
                ctx.set(dut.i.valid, 0)
                await ctx.tick()
                cycle += 1
            ctx.set(dut.i.payload, beat)
            ctx.set(dut.i.valid, 1)
            while True:
                _, _, ready = await ctx.tick().sample(dut.i.ready)
                cycle += 1
                if ready:
                    cycles["first_in"] = cycles["first_in"] or cycle
                    break
        ctx.set(dut.i.valid, 0)

    async def consumer(ctx):
        idle = cycle = 0
        while idle < 60:
            cycle += 1
            ready = int(rnd.random() >= stall)
            ctx.set(dut.o.ready, ready)
            _, _, valid, payload = await ctx.tick().sample(dut.o.valid, dut.o.payload)
            idle = 0 if valid else idle + 1
            if valid and ready:
                cycles["last_out"] = cycle
                beat = {}
                for name, _ in dst.layout(extra=False):
                    value = payload[name] if name != dst.field or not dst.array else \
                        [int(v) for v in payload[name]]
                    beat[name] = value if isinstance(value, list) else int(value)
                got.append(beat)

    sim.add_testbench(producer)
    sim.add_testbench(consumer)
    sim.run()
    return got, cycles["last_out"] - cycles["first_in"] + 1


REGROUPS = [
    # a Linear's 5 int32 lanes into 4 lanes of a 32-bit requant, rows of 13
    (RowPort("o_y", "y", signed(32), 5, 13, last_row=True), RowPort("i_x", "q", signed(32), 4,
                                                                     13)),
    # 2 lanes into 7 (a widening), rows of 9, 8-bit into 22-bit elements
    (RowPort("o_y", "y", signed(8), 2, 9), RowPort("i_row", "q", signed(22), 7, 9)),
    # rows longer than a line (lcm 6: rows of 13 span three lines), narrowing and widening
    (RowPort("o_y", "y", signed(16), 3, 13, last_row=True), RowPort("i_x", "q", signed(16), 2,
                                                                      13, last_row=True)),
    (RowPort("o_y", "y", signed(8), 2, max_row=17, count=True),
     RowPort("i_x", "q", signed(8), 3, max_row=17, count=True)),
    # scores one per beat into 3 lanes with count, rows of any length
    (RowPort("o_s", "s", signed(32), 1, max_row=10, last_row=True, array=False),
     RowPort("i_x", "q", signed(32), 3, max_row=10, count=True)),
    # softmax with count into softmax x V's P (9-bit unsigned, last_row from matrix ends)
    (RowPort("o_y", "y", unsigned(9), 3, max_row=10, count=True, last_row=True),
     RowPort("i_p", "p", unsigned(9), 4, max_row=10, last_row=True)),
    # one row per beat (TLAST = matrix end) into 3 lanes, and back into one row per beat
    (RowPort("o_o", "o", signed(32), 8, 8, framing="beat"),
     RowPort("i_x", "q", signed(32), 3, 8)),
    (RowPort("o_y", "y", unsigned(7), 3, 8, last_row=True),
     RowPort("i_q", "q", signed(8), 8, 8, framing="beat")),
    # equal lanes: a plain connection with a partial final beat and a wider element
    (RowPort("o_y", "y", signed(8), 4, 10), RowPort("i_x", "q", signed(12), 4, 10)),
    # whole multiples: softmax x V's rows of 8 into 2 lanes (BERT-base: 64 into 16), 6 into 2
    # lanes with rows of 13 (final beats of 1), 2 into 6 with count, 4 into one row per beat
    (RowPort("o_o", "o", signed(32), 8, 8, framing="beat"),
     RowPort("i_x", "q", signed(32), 2, 8)),
    (RowPort("o_y", "y", signed(32), 6, 13, last_row=True),
     RowPort("i_x", "q", signed(32), 2, 13)),
    (RowPort("o_y", "y", unsigned(9), 2, max_row=13, count=True, last_row=True),
     RowPort("i_p", "p", unsigned(9), 6, max_row=13, count=True, last_row=True)),
    (RowPort("o_y", "y", signed(8), 4, 8, last_row=True),
     RowPort("i_q", "q", signed(8), 8, 8, framing="beat")),
]


@pytest.mark.parametrize("index", range(len(REGROUPS)))
@pytest.mark.parametrize("stall", [0.0, 0.4])
def test_regroup_keeps_rows_and_matrix_ends(index, stall):
    src, dst = REGROUPS[index]
    rng = np.random.default_rng(index)
    rows, ends = _rows(rng, src, 14, src.longest)
    beats = _encode(src, rows, ends, rng)
    got, cycles = _run_regroup(src, dst, beats, stall, seed=index)
    want = _encode(dst, rows, ends if dst.has_matrices else [False] * len(rows), None)
    assert got == want
    if not stall:
        # full rate: one beat per cycle on the busier side; the first output beat waits for
        # the input beats that fill it
        assert cycles <= max(len(beats), len(want)) + -(-dst.lanes // src.lanes)


# -- Verilator --------------------------------------------------------------------------------

@requires_verilator
@pytest.mark.parametrize("index", range(len(C.TEST_CONFIGS)))
def test_chain_bit_exact_under_heavy_stalls(index):
    """Native engine, 60% input gaps and output backpressure (builds shared with
    test_sim.py)."""
    r = simulate(ACC, _cfg(index), items=20, seed=70 + index, stall=0.6, engine="native")
    assert not r["timeout"] and r["results"] > 0
    assert r["mismatches"] == 0, r["first_mismatches"]


@requires_verilator
@pytest.mark.parametrize("index", [0, 5])
def test_chain_latency_is_the_sum_without_stalls(index):
    """Linear into requant, narrowing (5 -> 4 lanes, one register) or equal lanes (a plain
    connection): the first result leaves after the sum of the modules' latencies, and the
    requant keeps up with the Linear (one row per Linear row interval)."""
    cfg = _cfg(index)
    r = simulate(ACC, cfg, items=30, seed=3, stall=0.0, engine="native")
    assert r["mismatches"] == 0 and not r["timeout"]
    model = cfg.plan.cycle_model()
    assert r["latency_cycles"] == model["latency_cycles"]
    lin = cfg.plan.configs[0]
    beats = -(-cfg.plan.output.row // cfg.plan.output.lanes)
    assert r["results_per_cycle"] == pytest.approx(beats / (lin.steps * lin.groups), rel=0.05)
