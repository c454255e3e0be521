"""Cluster Builder: descriptions, id assignment, GMI insertion, Galapagos files, routing images,
per-FPGA tops (Verilator lint)."""

import copy
import ipaddress
import json
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

from hwgen.cluster.run import builder
from hwgen.cluster.spec import describe
from hwgen.errors import ConfigError

DESC_DIR = describe.DESCRIPTIONS_DIR
TWO = DESC_DIR / "two_clusters.json"


def _raw(name):
    return json.loads((DESC_DIR / name).read_text())


@pytest.fixture(scope="module")
def ibert_build(tmp_path_factory):
    out = tmp_path_factory.mktemp("ibert")
    return builder.build("ibert_encoder", out, tops=False), out


@pytest.fixture(scope="module")
def two_build(tmp_path_factory):
    out = tmp_path_factory.mktemp("two")
    return builder.build(TWO, out, tops=True, kernels="external"), out


# -- the paper's I-BERT encoder (Fig. 14) ------------------------------------------------------

def test_ibert_38_kernels_six_fpgas(ibert_build):
    result, _ = ibert_build
    (p,) = result["plans"]
    assert len(p.cluster.fpgas) == 6
    assert len(p.physical) == 38
    assert p.counts() == {"gateway": 1, "compute": 32, "communication": 5, "virtual": 1}
    assert sum(len(v) for v in p.fpga_kernels.values()) == 39   # + the virtual broadcast


def test_ibert_paper_ids(ibert_build):
    (p,) = ibert_build[0]["plans"]
    k = p.kernels
    assert k[0].role == "gateway"
    assert [k[i].name for i in (1, 2, 3)] == ["q", "k", "v"]
    assert all(k[i].kind == "Dot-Product+Softmax" for i in range(4, 16))
    assert all(k[i].kind == "Softmax MatMul+Quant" for i in range(16, 28))
    assert [k[i].kind for i in (28, 29, 30, 31, 32)] == [
        "Linear+Quant (output, residual)", "LayerNorm+Quant", "Linear+GELU+Quant",
        "Linear+Quant (residual)", "LayerNorm+Quant"]
    assert 33 not in k                       # the paper's missing Kern_33 (reserved)
    assert [k[i].kind for i in (34, 35, 36, 37, 38)] == [
        "scatter", "scatter", "scatter", "gather", "broadcast"]
    assert all(k[i].role == "communication" for i in range(34, 39))
    assert k[39].role == "virtual" and k[39].kind == "broadcast" and k[39].fpga == k[0].fpga


def test_gmi_insertion_members(ibert_build):
    (p,) = ibert_build[0]["plans"]
    k = p.kernels
    assert k[34].members == tuple(range(4, 16)) and (1, 34) in p.edges
    assert k[35].members == tuple(range(4, 16)) and (2, 35) in p.edges
    assert k[36].members == tuple(range(16, 28)) and (3, 36) in p.edges
    assert k[37].members == tuple(range(16, 28)) and k[37].dests == [28]
    assert all((s, 37) in p.edges for s in range(16, 28))
    assert k[38].members == (30, 31) and (29, 38) in p.edges
    assert k[39].members == (1, 2, 3, 28) and ("input", 39) in p.edges
    assert k[32].dests == ["output"]
    # head i -> head i point-to-point, no GMI kernel
    assert all(k[4 + h].dests == [16 + h] for h in range(12))


def test_ids_contiguous(ibert_build):
    for p in ibert_build[0]["plans"] + builder.plan(describe.load(TWO)):
        ids = sorted(p.kernels) + sorted(p.cluster.reserved_ids)
        assert sorted(ids) == list(range(p.size))
        roles = [p.kernels[i].role for i in sorted(p.kernels)]
        order = ["gateway", "compute", "communication", "virtual"]
        assert roles == sorted(roles, key=order.index)       # paper's order


def test_logical_and_map_xml(ibert_build):
    result, out = ibert_build
    (p,) = result["plans"]
    logical = ET.parse(out / "encoder0" / "logical.xml").getroot()
    nums = sorted(int(k.find("num").text) for k in logical.findall("kernel"))
    assert nums == sorted(k.id for k in p.physical)
    for k in logical.findall("kernel"):
        n = k.find("num").text.strip()
        assert k.find("s_axis/name").text.strip() == f"s_axis_k{n}"
        assert k.find("clk").text.strip() == "ap_clk"
    cmap = ET.parse(out / "encoder0" / "map.xml").getroot()
    nodes = cmap.findall("node")
    assert len(nodes) == 6
    mapped = [int(k.text) for n in nodes for k in n.findall("kernel")]
    assert sorted(mapped) == nums                             # every kernel on one node
    for n in nodes:
        fpga = n.find("name").text.strip()
        for k in n.findall("kernel"):
            assert p.kernels[int(k.text)].fpga == fpga


def test_routing_images_match_map(ibert_build):
    _, out = ibert_build
    cmap = ET.parse(out / "encoder0" / "map.xml").getroot()
    where = {int(k.text): n.find("ip").text.strip() for n in cmap.findall("node")
             for k in n.findall("kernel")}
    gw_ip = where[0]
    for fdir in sorted((out / "encoder0").glob("fpga*")):
        words = [int(x, 16) for x in (fdir / "kernel_table.hex").read_text().split()]
        assert len(words) == 256
        for kid in range(256):
            valid, ip = words[kid] >> 32, str(ipaddress.IPv4Address(words[kid] & 0xFFFFFFFF))
            if kid in where:
                assert valid and ip == where[kid]
            elif kid == 39:
                assert valid and ip == gw_ip       # the virtual kernel lives in the gateway
            else:
                assert words[kid] == 0             # incl. the reserved Kern_33
        clusters = [int(x, 16) for x in (fdir / "cluster_table.hex").read_text().split()]
        assert clusters[0] == (1 << 32) | int(ipaddress.IPv4Address(gw_ip))
        assert not any(clusters[1:])


def test_graph_files(ibert_build):
    _, out = ibert_build
    dot = (out / "encoder0" / "graph.dot").read_text()
    assert dot.count("subgraph") == 6 and "k39" in dot and "k33 " not in dot
    import shutil
    if shutil.which("dot"):
        assert (out / "encoder0" / "graph.svg").read_text().lstrip().startswith("<?xml")
        assert (out / "encoder0" / "graph.png").read_bytes()[:4] == b"\x89PNG"


# -- two clusters, tops ------------------------------------------------------------------------

def test_two_cluster_tables(two_build):
    result, out = two_build
    p0, p1 = result["plans"]
    assert p0.counts() == {"gateway": 1, "compute": 5, "communication": 2, "virtual": 0}
    assert p1.counts() == {"gateway": 1, "compute": 3, "communication": 1, "virtual": 1}
    r = json.loads((out / "c0" / "a1" / "routing.json").read_text())
    assert r["cluster_table"] == {"0": "192.168.10.1", "1": "192.168.11.1"}
    assert r["kernel_table"]["6"] == "192.168.10.1" and r["kernel_table"]["7"] == "192.168.10.2"
    cfg = json.loads((out / "c0" / "a1" / "router_cfg.json").read_text())
    assert [b["index"] for b in cfg if b["table"] == 0] == list(range(8))
    assert cfg[-1]["last"] == 1 and sum(b["last"] for b in cfg) == 1


def test_tops_ports_and_lint(two_build):
    from hwgen.flow.tools import use_verilator
    result, out = two_build
    use_verilator()
    for p in result["plans"]:
        for f in p.cluster.fpgas:
            ports = json.loads((out / p.cluster.name / f.name / "ports.json").read_text())
            names = {s["port"] for s in ports["streams"]}
            ext = [i for i in p.fpga_kernels[f.name] if p.kernels[i].role == "compute"]
            assert names == {"s_axis_cfg", "s_axis_net", "m_axis_net", "m_axis_addr"} | \
                {f"{d}_axis_k{i}" for i in ext for d in "sm"}
            # the gateway is inside the top of its FPGA, configured as the builder assigned
            gw = out / p.cluster.name / f.name / "gateway.json"
            assert gw.exists() == (f.name == p.kernels[0].fpga)
            if gw.exists():
                g = json.loads(gw.read_text())
                virt = [k for k in p.kernels.values() if k.role == "virtual"]
                assert g["derived"]["virtual_ids"] == {k.kind: k.id for k in virt}
                assert g["groups"] == [{"kind": k.kind, "id": k.id, "members": list(k.members)}
                                       for k in virt]
                assert g["cluster_id"] == p.cluster.id
                assert "status_gw_delivered" in {q["name"] for q in ports["signals"]}
            v = out / p.cluster.name / f.name / f"{ports['top']}.v"
            r = subprocess.run(["verilator", "--lint-only", "-Wno-fatal", "-Wno-WIDTH",
                                "--top-module", ports["top"], str(v)],
                               capture_output=True, text=True, timeout=300)
            assert r.returncode == 0 and "%Error" not in r.stderr, r.stderr[-2000:]
        gmi = json.loads((out / p.cluster.name / p.cluster.fpgas[-1].name / "gmi.json")
                         .read_text())
        for kid, cfg in gmi.items():
            k = p.kernels[int(kid)]
            assert cfg["kernel_id"] == k.id and cfg["members"] == len(k.members)
            assert cfg["first_member"] == k.members[0]


def test_cli_build(tmp_path):
    r = subprocess.run([sys.executable, "-m", "hwgen.cli", "cluster", "build", str(TWO), "--out", str(tmp_path),
                        "--no-tops"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "cluster 1 (c1): 5 kernels" in r.stdout and "+ 1 virtual" in r.stdout
    bad = tmp_path / "bad.json"
    raw = _raw("two_clusters.json")
    raw["clusters"][1]["id"] = 300
    bad.write_text(json.dumps(raw))
    r = subprocess.run([sys.executable, "-m", "hwgen.cli", "cluster", "build", str(bad), "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "clusters[1].id=300" in r.stderr and "Traceback" not in r.stderr


# -- invalid descriptions ----------------------------------------------------------------------

def _expect(raw, field, base=DESC_DIR):
    with pytest.raises(ConfigError) as e:
        builder.plan(describe.parse(raw, base_dir=base))
    assert e.value.param == field, str(e.value)


def test_bad_cluster_fields():
    raw = _raw("two_clusters.json")
    r = copy.deepcopy(raw); r["clusters"][0]["id"] = 256
    _expect(r, "clusters[0].id")
    r = copy.deepcopy(raw); r["clusters"][1]["id"] = 0
    _expect(r, "clusters[1].id")
    r = copy.deepcopy(raw); r["clusters"][0]["fpgas"][1]["ip"] = "10.0.0.300"
    _expect(r, "clusters[0].fpgas[1].ip")
    r = copy.deepcopy(raw); r["clusters"][1]["fpgas"][0]["ip"] = "192.168.10.1"
    _expect(r, "clusters[1].fpgas[0].ip")
    r = copy.deepcopy(raw); r["clusters"][0]["fpgas"][0]["board"] = "zcu999"
    _expect(r, "clusters[0].fpgas[0].board")
    r = copy.deepcopy(raw); r["clusters"][0]["fpgas"][0]["kernels"].append("nope")
    _expect(r, "clusters[0].fpgas[0].kernels")
    r = copy.deepcopy(raw); r["clusters"][0]["fpgas"][1]["kernels"].append("head")
    _expect(r, "clusters[0].fpgas[1].kernels")
    r = copy.deepcopy(raw); r["clusters"][0]["fpgas"][1]["kernels"].remove("tail")
    _expect(r, "clusters[0].fpgas")
    r = copy.deepcopy(raw); r["clusters"][0]["output"]["kernel"] = 3
    _expect(r, "clusters[0].output.kernel")
    r = copy.deepcopy(raw); r["data_bits"] = 32
    _expect(r, "data_bits")


def test_bad_layer_fields():
    raw = _raw("two_clusters.json")
    lay = ["clusters", 0, "layers"]

    def edit(fn):
        r = copy.deepcopy(raw)
        fn(r["clusters"][0]["layers"])
        return r
    _expect(edit(lambda l: l["layers"][0]["modules"][0].update(kind="ibert-convolution")),
            "clusters[0].layers.layers[0].modules[0].kind")
    _expect(edit(lambda l: l["layers"][1]["modules"][0]["params"].update(lanes=0)),
            "clusters[0].layers.layers[1].modules[0].params.lanes")
    _expect(edit(lambda l: l["connections"][1].update(to="missing")),
            "clusters[0].layers.connections[1].to")
    _expect(edit(lambda l: l["connections"][1].update(to="work[3]")),
            "clusters[0].layers.connections[1].to")
    _expect(edit(lambda l: l["connections"][1].pop("gmi") and l["connections"][1].pop("params")),
            "clusters[0].layers.connections[1].gmi")
    _expect(edit(lambda l: l["connections"][1].update(gmi="allreduce")),
            "clusters[0].layers.connections[1].gmi")
    _expect(edit(lambda l: l["connections"][2].update(gmi="scatter")),
            "clusters[0].layers.connections[2].from")
    assert lay


def test_over_256_kernels():
    raw = _raw("two_clusters.json")
    raw["clusters"][0]["layers"]["layers"][1]["count"] = 255
    _expect(raw, "clusters[0]")
    raw = _raw("two_clusters.json")
    raw["clusters"][0]["fpgas"][1]["kernels"] = [f"k{i}" for i in range(257)]
    _expect(raw, "clusters[0].fpgas[1].kernels")


def test_gmi_params_checked_against_gmi_config(tmp_path):
    raw = _raw("two_clusters.json")
    raw["clusters"][1]["layers"]["connections"][1]["params"]["op"] = "median"
    with pytest.raises(ConfigError) as e:
        builder.build(describe.parse(raw, base_dir=DESC_DIR), tmp_path)
    assert e.value.param == "clusters[1].layers.connections[1].params.op"


def test_gateway_config_from_plan():
    """The gateway inside the top gets the builder's ids; what it cannot hold is a ConfigError
    naming the connection."""
    from hwgen.cluster.plan.placement import gateway_config
    plans = builder.plan(describe.load("ibert_encoder"))
    g = gateway_config(plans[0], 64)
    assert g.virtual_ids == {"broadcast": 39} and g.member_ids("broadcast") == [1, 2, 3, 28]
    assert g.remapped("broadcast") and 33 not in g.local_list and 0 not in g.local_list
    assert g.local_list == sorted(k.id for k in plans[0].physical if k.id)
    raw = _raw("two_clusters.json")
    raw["clusters"][1]["layers"]["connections"].append(
        {"name": "bcast2", "from": "input", "to": ["branch[0]", "sink"], "gmi": "broadcast",
         "params": {"length": 48}})
    with pytest.raises(ConfigError) as e:
        gateway_config(builder.plan(describe.parse(raw, base_dir=DESC_DIR))[1], 64)
    assert "clusters[1].layers.connections[3].gmi" in str(e.value)
    raw["clusters"][1]["layers"]["connections"][-1].update(gmi="scatter", params={"length": 8})
    with pytest.raises(ConfigError) as e:
        gateway_config(builder.plan(describe.parse(raw, base_dir=DESC_DIR))[1], 64)
    assert "clusters[1].layers.connections[3].params.length" in str(e.value)
