"""Cluster plan layer: roles as an enum, per-FPGA plans, router configuration packing through
the layout, structured ConfigError, and the plan importable without the gateware."""

import json
import subprocess
import sys

import pytest

from hwgen.cluster.spec import describe
from hwgen.cluster.plan.placement import (FPGAPlan, Role, fpga_plan, plan, router_cfg_beats,
                                          routing_tables, top_name)
from hwgen.errors import ConfigError

TWO = describe.DESCRIPTIONS_DIR / "two_clusters.json"


@pytest.fixture(scope="module")
def ibert():
    return plan(describe.load("ibert_encoder"))[0]


def test_role_strings_round_trip(ibert):
    assert [r.value for r in Role] == ["gateway", "compute", "communication", "virtual"]
    for r in Role:
        assert Role(r.value) is r and r == r.value and str(r) == f"{r}" == r.value
        assert json.dumps(r) == json.dumps(r.value)
    d = ibert.kernels[0].to_dict()
    assert d["role"] == "gateway" and type(d["role"]) is str
    assert json.loads(json.dumps(ibert.counts())) == {
        "gateway": 1, "compute": 32, "communication": 5, "virtual": 1}
    assert all(isinstance(k.role, Role) for k in ibert.kernels.values())


def test_fpga_plan_ports_and_configs(ibert):
    plans = [ibert]
    by_name = {f.name: f for f in ibert.cluster.fpgas}
    fp = fpga_plan(ibert, by_name["fpga1"], 64, 1, kernels="external")
    assert isinstance(fp, FPGAPlan) and fp.name == top_name(ibert, by_name["fpga1"])
    assert fp.external == (1, 2, 3)                # compute kernels only: ports of the top
    assert not fp.computes
    inside = fpga_plan(ibert, by_name["fpga1"], 64, 1)
    assert inside.external == () and sorted(inside.computes) == [1, 2, 3]
    assert inside.computes[1].sources == ((39, "i_0_x", 10),)   # the virtual broadcast
    assert inside.computes[1].r2p.dest == 34 and inside.computes[1].seq_len == 128
    assert fp.gateway is not None and fp.gateway.virtual_ids == {"broadcast": 39}
    assert set(fp.gmi_configs) == set(fp.gmi_kinds) == {34, 35, 36}
    assert fp.gmi_kinds[34] == "scatter" and fp.gmi_configs[34].kernel_id == 34
    assert fp.router.members == ibert.size and fp.router.node_address == 0x0A010265
    fp2 = fpga_plan(ibert, by_name["fpga2"], 64, 1, kernels="external")
    assert fp2.gateway is None and fp2.external == tuple(range(4, 16)) and not fp2.gmi_configs
    fp2 = fpga_plan(ibert, by_name["fpga2"], 64, 1)
    assert all(c.sources == ((34, "i_0_q", 0), (35, "i_0_k", 1)) and c.r2p.dest == i + 12
               for i, c in fp2.computes.items())
    assert routing_tables(ibert, plans)["kernels"][39] == by_name["fpga1"].ip


def test_header_attachers_where_kernels_send_to_output():
    plans = plan(describe.load(TWO))
    for p in plans:
        n = max(q.cluster.id for q in plans) + 1
        for f in p.cluster.fpgas:
            for mode in ("inside", "external"):
                fp = fpga_plan(p, f, 64, n, kernels=mode, plans=plans)
                ids = fp.external or tuple(fp.computes)
                want = tuple(i for i in ids if "output" in p.kernels[i].dests)
                assert fp.headers == (want if p.cluster.output else ())
                assert fp.dest_cluster == (p.cluster.output or {}).get("cluster")
                assert all(c.header == (i in want) for i, c in fp.computes.items())
    assert any(fpga_plan(p, f, 64, 2, plans=plans).headers
               for p in plans for f in p.cluster.fpgas)


def test_cfg_packing_is_the_layouts(ibert):
    from hwgen.cluster.gateware.router import cfg_layout, pack_cfg
    layout = cfg_layout()
    beats = router_cfg_beats(routing_tables(ibert, [ibert]))
    assert beats[-1]["last"] == 1 and sum(b["last"] for b in beats) == 1
    for b in beats + [{"table": 1, "index": 255, "address": 2 ** 32 - 1, "valid": 1,
                       "last": 1}]:
        by_fields = sum(b[name] << f.offset for name, f in layout)
        assert pack_cfg(b) == by_fields < 1 << layout.size
        # the hand-written packing the builder used before (router_cfg.hex stays the same)
        assert pack_cfg(b) == (b["table"] | b["index"] << 1 | b["address"] << 9
                               | b["valid"] << 41 | b["last"] << 42)


def test_config_error_reason_and_location():
    e = ConfigError("m", "must be an integer in 1..64", value=0)
    assert str(e) == "m=0: must be an integer in 1..64"
    assert (e.param, e.value, e.reason) == ("m", 0, "must be an integer in 1..64")
    e = ConfigError("op", "two\nlines")
    assert str(e) == "op: two lines" and e.reason == "two lines" and e.value is None
    # a value whose repr holds ": " (splitting the message text would cut it there)
    e = ConfigError("params", "must be numbers", value={"a": "b"})
    moved = e.relocated("clusters[0].layers.connections[1]")
    assert moved.param == "clusters[0].layers.connections[1].params"
    assert moved.reason == e.reason and moved.value == e.value
    assert str(moved) == "clusters[0].layers.connections[1].params={'a': 'b'}: must be numbers"


def test_gmi_error_names_the_connection():
    raw = json.loads(TWO.read_text())
    raw["clusters"][1]["layers"]["connections"][1]["params"]["op"] = "median"
    plans = plan(describe.parse(raw, base_dir=describe.DESCRIPTIONS_DIR))
    p = plans[1]
    f = next(f for f in p.cluster.fpgas
             if any(p.kernels[i].role is Role.COMMUNICATION for i in p.fpga_kernels[f.name]))
    with pytest.raises(ConfigError) as e:
        fpga_plan(p, f, 64, 2)
    assert e.value.param == "clusters[1].layers.connections[1].params.op"
    assert e.value.value == "median" and str(e.value).endswith(": " + e.value.reason)


def test_plan_imports_no_gateware():
    """Planning a cluster (ids, routes, every block's configuration) loads no module of the
    cluster's gateware or run layers, and importing the plan loads no Amaranth component
    library module beyond the value types the block configurations describe rows with
    (``amaranth.hdl`` shapes, ``amaranth.lib.data`` layouts): no FIFOs, memories or streams.
    pyproject's layers contract forbids the imports; this checks what is loaded."""
    code = ("import sys\n"
            "from hwgen.cluster.spec import describe\n"
            "from hwgen.cluster.plan import placement as P\n"
            "heavy = ('amaranth.lib.fifo', 'amaranth.lib.memory', 'amaranth.lib.stream',\n"
            "         'amaranth.back', 'amaranth.sim')\n"
            "assert not [m for m in sys.modules if m.startswith(heavy)]\n"
            "plans = P.plan(describe.load('two_clusters'))\n"
            "f = plans[0].cluster.fpgas[0]\n"
            "P.fpga_plan(plans[0], f, 64, 2, plans=plans)\n"
            "P.fpga_plan(plans[0], f, 64, 2, kernels='external')\n"
            "layers = ('hwgen.cluster.gateware', 'hwgen.cluster.run')\n"
            "assert not [m for m in sys.modules if m.startswith(layers)], sys.modules\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_gather_buffers_a_sentence_of_rounds(ibert):
    """A gather's members (the heads) run independently and a member ``depth`` rounds ahead
    of the slowest loses packets: without ``params.depth`` the builder buffers M rounds (the
    depth of 2 lost rows of minilm_encoder's 12 heads at M = 8); broadcast and scatter too
    (they stall their input, which comes through the router their output needs); an explicit
    depth wins."""
    by_name = {f.name: f for f in ibert.cluster.fpgas}
    for m, want in ((8, 8), (1, 2), (128, 128)):
        fp = fpga_plan(ibert, by_name["fpga3"], 64, 1, seq_len=m)
        (gid,) = [i for i, k in fp.gmi_kinds.items() if k == "gather"]
        assert fp.gmi_configs[gid].depth == want
    fp = fpga_plan(ibert, by_name["fpga1"], 64, 1, seq_len=8)
    assert {c.depth for c in fp.gmi_configs.values()} == {8}
    fp = fpga_plan(ibert, by_name["fpga3"], 64, 1, kernels="external")
    assert [c.depth for c in fp.gmi_configs.values()] == [128]    # the default M, max_len


def test_explicit_gather_depth_wins(tmp_path):
    src = describe.DESCRIPTIONS_DIR
    d = json.loads((src / "ibert_encoder.json").read_text())
    layers = json.loads((src / d["layers"]).read_text())
    gather = next(c for c in layers["connections"] if c.get("gmi") == "gather")
    gather["params"]["depth"] = 5
    (tmp_path / d["layers"]).write_text(json.dumps(layers))
    (tmp_path / "enc.json").write_text(json.dumps(d))
    p = plan(describe.load(tmp_path / "enc.json"))[0]
    fpga = next(f for f in p.cluster.fpgas
                if any(p.kernels[i].kind == "gather" for i in p.fpga_kernels[f.name]))
    fp = fpga_plan(p, fpga, 64, 1, seq_len=8)
    assert [c.depth for c in fp.gmi_configs.values()] == [5]
