"""Compute kernels inside the FPGA tops (issue 14 item 2): the plan's adapter configuration
(source ids, chain inputs from the connections' ``port``, destinations, M), the tops built with
their kernel chains behind packet adapters (Verilator lint, expected submodules, status
ports), and the ConfigErrors of the port mapping."""

import copy
import json
import re
import subprocess

import pytest

from hwgen.cluster.run import builder
from hwgen.cluster.spec import describe
from hwgen.cluster.plan.placement import Role, fpga_plan, plan
from hwgen.errors import ConfigError

DESC_DIR = describe.DESCRIPTIONS_DIR


def _raw(name):
    """A description with its layer file inlined (so that tests can edit the layers)."""
    raw = json.loads((DESC_DIR / f"{name}.json").read_text())
    if isinstance(raw.get("layers"), str):
        raw["layers"] = json.loads((DESC_DIR / raw["layers"]).read_text())
    return raw


def _plans(raw):
    return plan(describe.parse(raw, base_dir=DESC_DIR))


def _fpga_plans(raw, kernels="inside"):
    desc = describe.parse(raw, base_dir=DESC_DIR)
    plans = plan(desc)
    n = max(p.cluster.id for p in plans) + 1
    return {f.name: fpga_plan(p, f, desc.data_bits, n, kernels=kernels, plans=plans,
                              seq_len=desc.sequence_length)
            for p in plans for f in p.cluster.fpgas}


def _expect(raw, field):
    with pytest.raises(ConfigError) as e:
        _fpga_plans(raw)
    assert e.value.param == field, str(e.value)
    return e.value


@pytest.fixture(scope="module")
def mini(tmp_path_factory):
    out = tmp_path_factory.mktemp("mini")
    return builder.build("mini_encoder", out, picture=False), out


# -- the plan ------------------------------------------------------------------------------------

def test_mini_sources_ports_and_destinations():
    fps = _fpga_plans(_raw("mini_encoder"))
    fa, fb = fps["fa"], fps["fb"]
    assert fa.external == fb.external == ()
    assert sorted(fa.computes) == [1, 2, 3, 4, 5] and sorted(fb.computes) == list(range(6, 13))
    c = {**fa.computes, **fb.computes}
    # the gateway's virtual broadcast (18) feeds Q, K, V and the first residual
    assert c[1].sources == ((18, "i_0_x", 10),) and c[1].r2p.dest == 13
    assert c[8].sources == ((16, "i_0_x", 4), (18, "i_1_id", 10))
    # attention: Q and K from the scatter GMI kernels (their own ids as TID)
    assert c[4].sources == ((13, "i_0_q", 0), (14, "i_0_k", 1)) and c[4].r2p.dest == 6
    assert c[5].r2p.dest == 7 and c[5].r2p.src == 5
    # softmax x V: P point to point from its head's attention (a compute id), V from scatter_v
    assert c[6].sources == ((4, "i_0_p", 3), (15, "i_0_v", 2))
    assert c[7].sources == ((5, "i_0_p", 3), (15, "i_0_v", 2))
    assert c[6].r2p.dest == c[7].r2p.dest == 16                 # the gather
    # LayerNorm after the residual: 22-bit elements travel as 32 bits
    assert c[8].r2p.dest == 9 and c[8].r2p.elem_bits == 32
    assert c[9].sources == ((8, "i_0_row", 5),) and c[9].r2p.dest == 17
    assert c[9].chain.kinds == ("ibert-layernorm", "ibert-requant")
    assert c[10].chain.kinds == ("ibert-linear", "ibert-gelu", "ibert-requant")
    # FFN down: from FFN up, the residual from the broadcast; ln2's output via the header
    assert c[11].sources == ((10, "i_0_x", 7), (17, "i_1_id", 6))
    assert c[12].header and c[12].r2p.dest == 18 and fb.headers == (12,)
    assert not any(c[i].header for i in c if i != 12)
    # M = sequence_length fixes the matrix formats: Q/K are M x head_dim elements
    fq = dict(c[4].p2r.source_formats)
    assert fq[13].row_elems == 3 * 8 and fq[13].lanes == 8 and fq[13].field == "q"
    p = dict(c[6].p2r.source_formats)[4]
    assert (p.field, p.rows, p.row_elems, p.elem_bits, p.signed) == ("p", 3, 3, 16, False)
    assert c[8].p2r.source_formats[1][1].field == "id"


def test_ibert_encoder_kernels_inside():
    """Every kernel of the BERT-base encoder gets its adapters (GELU and LayerNorm are
    requantised to 8 bits before they leave their kernel)."""
    fps = _fpga_plans(_raw("ibert_encoder"))
    c = {i: cp for fp in fps.values() for i, cp in fp.computes.items()}
    assert sorted(c) == list(range(1, 33))
    assert c[16].sources == ((4, "i_0_p", 3), (36, "i_0_v", 2)) and c[16].r2p.dest == 37
    assert c[28].sources == ((37, "i_0_x", 4), (39, "i_1_id", 10))
    assert c[31].sources == ((30, "i_0_x", 7), (38, "i_1_id", 6))
    assert c[32].header and c[32].r2p.dest == 39 and c[32].seq_len == 128
    assert all(cp.r2p.elem_bits == 8 for i, cp in c.items() if i not in (28, 31) + tuple(
        range(4, 16)))


def test_two_clusters_point_to_point_input_and_widening():
    """``input`` point to point carries the sending kernel's id of the other cluster; a
    requantisation's 32-bit input fed 8-bit elements gets an extending regrouper."""
    fps = _fpga_plans(_raw("two_clusters"))
    head = fps["a0"].computes[1]
    assert head.sources == ((3, "i_0_x", 0),)                   # c1's sink (id 3) -> c0's head
    assert head.widen == ("i_0_x",)
    assert dict(head.p2r.source_formats)[3].elem_bits == 8
    sink = fps["b1"].computes[3]
    assert sink.header and sink.r2p.dest == 1                   # -> cluster 0's head


def test_sequence_length_default_and_limit():
    raw = _raw("mini_encoder")
    del raw["sequence_length"]
    assert describe.parse(raw, base_dir=DESC_DIR).sequence_length == 0
    fps = _fpga_plans(raw)
    assert fps["fa"].computes[4].seq_len == 4                   # the kernels' max_len
    raw["sequence_length"] = 5
    _expect(raw, "sequence_length")
    raw["sequence_length"] = 0
    with pytest.raises(ConfigError) as e:
        describe.parse(raw, base_dir=DESC_DIR)
    assert e.value.param == "sequence_length"


# -- port mapping errors ---------------------------------------------------------------------

def _conn(raw, name):
    return next(c for c in raw["layers"]["connections"] if c.get("name") == name)


def test_port_names_an_input_of_the_chain():
    raw = _raw("mini_encoder")
    _conn(raw, "scatter_q")["port"] = "i_0_x"
    e = _expect(raw, "clusters[0].layers.connections[0].port")
    assert "i_0_q, i_0_k" in e.reason and e.value == "i_0_x"


def test_port_fed_twice():
    raw = _raw("mini_encoder")
    _conn(raw, "scatter_k")["port"] = "i_0_q"
    e = _expect(raw, "clusters[0].layers.connections[1].port")
    assert "already fed by connections[0]" in e.reason


def test_port_default_needs_one_unfed_input():
    raw = _raw("mini_encoder")
    del _conn(raw, "bcast_ln1")["port"]
    raw["layers"]["connections"][7].pop("port")                # ffn_up -> ffn_down
    e = _expect(raw, "clusters[0].layers.connections[6].port")
    assert "i_0_x, i_1_id" in e.reason
    # one explicit port leaves exactly one input: the default takes it
    raw["layers"]["connections"][7]["port"] = "i_0_x"
    assert _fpga_plans(raw)["fb"].computes[11].sources[1] == (17, "i_1_id", 6)


def test_input_fed_by_no_connection():
    raw = _raw("mini_encoder")
    bc = _conn(raw, "bcast_in")
    bc["to"] = ["q", "k", "v"]
    del bc["port"]["attn_out"]
    e = _expect(raw, "clusters[0].layers.connections")
    assert "attn_out" in e.reason and "i_1_id" in e.reason


def test_port_syntax_in_the_description():
    raw = _raw("mini_encoder")
    for bad, field in ((7, "clusters[0].layers.connections[8].port"),
                       ("i_0_x", "clusters[0].layers.connections[9].port"),
                       ({"nobody": "i_0_x"}, "clusters[0].layers.connections[8].port")):
        r = copy.deepcopy(raw)
        index = int(field.split("[")[2][0])
        r["layers"]["connections"][index]["port"] = bad        # ffn_down -> ln2, ln2 -> output
        with pytest.raises(ConfigError) as e:
            describe.parse(r, base_dir=DESC_DIR)
        assert e.value.param == field
    r = copy.deepcopy(raw)
    _conn(r, "bcast_ln1")["port"] = {"ffn_up": "i_0_x", "q": "i_0_x"}
    with pytest.raises(ConfigError) as e:
        describe.parse(r, base_dir=DESC_DIR)
    assert e.value.param == "clusters[0].layers.connections[6].port" and "q is not" in str(e.value)


def test_gmi_length_and_element_width_checked():
    raw = _raw("mini_encoder")
    _conn(raw, "scatter_q")["params"]["length"] = 4
    _expect(raw, "clusters[0].layers.connections[0].params.length")
    raw = _raw("mini_encoder")
    raw["layers"]["layers"][0]["modules"][1]["params"]["bits"] = 12
    _expect(raw, "clusters[0].layers.connections[0].params.elem_bits")


def test_wide_outputs_need_a_requantisation():
    """GELU (47 bits) and LayerNorm (33 bits) outputs fit no packet element."""
    raw = _raw("mini_encoder")
    raw["layers"]["layers"][7]["modules"].pop()                # ffn_up without its requant
    e = _expect(raw, "clusters[0].layers.layers[7].modules")
    assert "47 bits" in e.reason and e.value == 47
    raw = _raw("mini_encoder")
    raw["layers"]["layers"][6]["modules"].pop()                # ln1 without its requant
    e = _expect(raw, "clusters[0].layers.layers[6].modules")
    assert "33 bits" in e.reason


def test_external_mode_keeps_ports():
    fps = _fpga_plans(_raw("mini_encoder"), kernels="external")
    assert fps["fa"].external == (1, 2, 3, 4, 5) and not fps["fa"].computes
    with pytest.raises(ConfigError) as e:
        _fpga_plans(_raw("mini_encoder"), kernels="outside")
    assert e.value.param == "kernels"


# -- the tops --------------------------------------------------------------------------------

def test_mini_tops_contain_kernels_and_adapters(mini):
    result, out = mini
    (p,) = result["plans"]
    for fp in result["fpgas"]:
        fdir = out / p.cluster.name / fp.fpga.name
        text = (fdir / f"{fp.name}.v").read_text()
        inst = set(re.findall(r"^  \\\S+\s+(\w+) \(", text, re.M))
        for i in fp.computes:
            assert {f"kernel_k{i}", f"pkt2row_k{i}", f"row2pkt_k{i}", f"pktbuf_k{i}"} <= inst, i
        assert {f"gmi_k{i}" for i in fp.gmi_configs} <= inst
        assert {"out_switch", "in_switch", "router", "merge", "split"} <= inst
        assert ("gateway" in inst) == (fp.gateway is not None)
        assert {f"header_k{i}" for i in fp.headers} <= inst
        assert not re.search(r"s_axis_k\d+|m_axis_k\d+", text)     # no kernel ports left
        ports = json.loads((fdir / "ports.json").read_text())
        names = {s["name"] for s in ports["signals"]}
        assert {f"status_k{i}_{s}" for i in fp.computes for s in ("dropped", "pktbuf_dropped")} \
            <= names
        assert {f"status_k{i}_{s}" for i in fp.gmi_configs
                for s in ("rounds", "drop_source", "drop_length", "drop_overrun")} <= names
        compute = json.loads((fdir / "compute.json").read_text())
        assert sorted(map(int, compute)) == sorted(fp.computes)
    # the chain modules: linear + requant in Q, attention + softmax in the heads
    fa = next(fp for fp in result["fpgas"] if fp.fpga.name == "fa")
    assert fa.computes[1].chain.kinds == ("ibert-linear", "ibert-requant")
    assert fa.computes[4].chain.kinds == ("ibert-attn-dot", "ibert-softmax")


def _lint(result, out):
    from hwgen.flow.tools import use_verilator
    use_verilator()
    by_id = {p.cluster.id: p for p in result["plans"]}
    for fp in result["fpgas"]:
        v = out / by_id[fp.cluster_id].cluster.name / fp.fpga.name / f"{fp.name}.v"
        r = subprocess.run(["verilator", "--lint-only", "-Wno-fatal", "-Wno-WIDTH",
                            "--top-module", fp.name, str(v)],
                           capture_output=True, text=True, timeout=600)
        assert r.returncode == 0 and "%Error" not in r.stderr, r.stderr[-2000:]


def test_mini_tops_lint(mini):
    _lint(*mini)


def test_two_clusters_tops_inside_lint(tmp_path):
    """Point-to-point input from the other cluster, element-widening regroupers, a reduce."""
    result = builder.build(describe.DESCRIPTIONS_DIR / "two_clusters.json", tmp_path,
                           picture=False)
    assert all(fp.computes and not fp.external for fp in result["fpgas"])
    text = (tmp_path / "c0" / "a0" / "c0_a0.v").read_text()
    assert "widen_k1_i_0_x" in text
    _lint(result, tmp_path)


def test_roles_of_kernels_inside(mini):
    (p,) = mini[0]["plans"]
    inside = {i for fp in mini[0]["fpgas"] for i in fp.computes}
    assert inside == {k.id for k in p.with_role(Role.COMPUTE)}


# -- command line and resource table ---------------------------------------------------------

def test_cli_kernel_options(tmp_path):
    import sys
    base = [sys.executable, "-m", "hwgen.cli", "cluster", "build", "two_clusters", "--out",
            str(tmp_path)]
    r = subprocess.run(base + ["--no-tops", "--kernels", "nowhere"], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    r = subprocess.run(base + ["--no-tops", "--resources"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2 and "resources" in r.stderr and "Traceback" not in r.stderr


def test_resource_lines_name_what_does_not_fit():
    from hwgen.cluster.run.builder import _anonymous_p2r, resource_lines
    from hwgen.cluster.spec.adapter import PacketsToRowsConfig
    cap = {"lut": 100, "ff": 200, "bram": 10, "uram": 2, "dsp": 8, "scope": "device"}
    row = {"total": {"lut": 50, "ff": 10, "bram": 12, "uram": 0, "dsp": 1},
           "percent": {"lut": 50.0, "ff": 5.0, "bram": 120.0, "uram": 0.0, "dsp": 12.5},
           "fits": False}
    ok = {**row, "percent": {**row["percent"], "bram": 60.0}, "fits": True}
    lines = resource_lines({"capacity": {"sidewinder": cap}, "fpgas": {"t_a": row, "t_b": ok}})
    assert lines[-1] == "does not fit: t_a" and "NO" in lines[1] and "yes" in lines[2]
    cfg = PacketsToRowsConfig.from_dict({"sources": [{"id": 34, "field": "q"},
                                                     {"id": 35, "field": "k"}]})
    assert _anonymous_p2r(cfg).to_dict()["sources"] == [{"id": 0, "field": "q"},
                                                        {"id": 1, "field": "k"}]
