"""Recommendation model descriptions and the multi-FPGA partitioner."""

import json

import pytest
from click.testing import CliRunner

from hwgen.boards import load_board
from hwgen.cli import main
from hwgen.errors import ConfigError
from hwgen.recsys.model import RecModel, Table, paper_ctr, preset, small_ctr
from hwgen.recsys.partition import partition


def test_paper_preset_matches_table_one():
    m = paper_ctr()
    assert len(m.tables) == 98 and m.concat_len == 876
    assert m.layers[:3] == (1024, 512, 256)
    assert abs(m.table_bytes - 15.1e9) < 0.01e9
    sizes = sorted(t.bytes(m.elem_bits) for t in m.tables)
    assert sizes[0] < 10 ** 4 and sizes[-1] > 10 ** 9          # "from KBs to GBs"


def test_model_json_round_trip(tmp_path):
    for m in (paper_ctr(), small_ctr()):
        path = tmp_path / f"{m.name}.json"
        m.to_json(path)
        assert RecModel.from_json(path) == m


@pytest.mark.parametrize("change, param", [
    ({"tables": []}, "tables"), ({"layers": [0]}, "layers"), ({"weight_bits": 4}, "weight_bits"),
    ({"act_bits": [8]}, "act_bits"), ({"shifts": [1, 2, 3]}, "shifts"), ({"colour": 1}, "colour"),
])
def test_model_validation(change, param):
    d = small_ctr().to_dict()
    d.update(change)
    with pytest.raises(ConfigError) as err:
        RecModel.from_dict(d)
    assert err.value.param == param


def test_paper_four_node_allocation():
    """Section III-C and Table II: 1024 / 512 / 128 PEs at 18 DSPs; 7,488 DSPs (82.98%) on
    nodes 1-3 and 7,497 (83.08%) on node 4 of four U280s."""
    plan = partition(paper_ctr(), load_board("u280"), 4)
    assert plan.layer_pes == [1024, 512, 128] and plan.ratios == [8, 4, 1]
    assert [n.dsp for n in plan.nodes] == [7488, 7488, 7488, 7497]
    assert [n.dsp_percent for n in plan.nodes] == [82.98, 82.98, 82.98, 83.08]
    layers = [{s.layer for s in n.slices} for n in plan.nodes]
    assert layers == [{0}, {0}, {0, 1}, {1, 2}]               # layer 1 over nodes 1-3, ...
    assert plan.nodes[0].embedding and plan.nodes[3].output_unit
    # the second node carries the most traffic (section III-C3)
    load = [max(n.recv_bytes, n.send_bytes) for n in plan.nodes]
    assert load[1] == max(load)
    assert plan.feasible


def test_every_pe_assigned_once():
    for nodes in (1, 2, 3, 4, 7):
        plan = partition(paper_ctr(), load_board("u280"), nodes)
        for layer, pes in enumerate(plan.layer_pes):
            got = sorted((s.pe_start, s.pes) for n in plan.nodes for s in n.slices
                         if s.layer == layer)
            covered = []
            for start, count in got:
                covered += range(start, start + count)
            assert covered == list(range(pes))


def test_infeasible_splits_say_why():
    plan = partition(paper_ctr(), load_board("u280"), 4, inferences_per_s=5e6)
    assert not plan.feasible and all("network" in p for p in plan.problems)
    big = RecModel(name="big", tables=(Table(10, 8),), dense=20000, layers=(20000, 10),
                   act_bits=(16, 16), shifts=(8,), weight_bits=16)
    plan = partition(big, load_board("u280"), 1)
    assert any("BRAM" in p for p in plan.problems)
    with pytest.raises(ConfigError, match="nodes"):
        partition(paper_ctr(), load_board("u280"), 1, dsp_per_pe=5000)


def test_partition_cli(tmp_path):
    res = CliRunner().invoke(main, ["partition", "--preset", "paper-ctr", "--board", "u280",
                                    "--nodes", "4", "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    assert "1024 / 512 / 128" in res.output and "82.98%" in res.output
    node4 = json.loads((tmp_path / "node4.json").read_text())
    assert node4["dsp"] == 7497 and node4["board"] == "u280"
    res = CliRunner().invoke(main, ["partition", "--preset", "nope"])
    assert res.exit_code == 2 and "preset" in res.output
    assert preset("small-ctr") == small_ctr()
