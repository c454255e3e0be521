"""The accelerator contract (hwgen.contract): every registered accelerator answers the same
questions (workload, performance, resources, report lines, memory banks) at its default
configuration, and the typed workloads refuse bad input naming the field."""

import json

import pytest

from hwgen import registry
from hwgen.cluster.golden.traffic import status_lines
from hwgen.config import Config
from hwgen.contract import RESOURCE_KEYS, Performance, Resources, Workload
from hwgen.errors import ConfigError
from hwgen.flow.resources import estimate
from hwgen.ibert.linear import LinearConfig
from hwgen.ibert.softmax import SoftmaxConfig
from hwgen.vecsearch.node_model import ChamVSNodeModel


@pytest.mark.parametrize("name", registry.names())
def test_every_accelerator_answers_every_question(name):
    acc = registry.get(name)
    cfg = acc.config()
    perf = cfg.performance()
    assert isinstance(perf, Performance)
    assert isinstance(perf.workload, cfg.Workload)
    assert perf.workload == cfg.workload()
    json.dumps({"workload": perf.workload.to_dict(), "performance": perf.to_dict()})
    res = estimate(acc, cfg)
    assert isinstance(res, Resources) and res.source == "netlist"
    assert set(res.to_dict()) == set(RESOURCE_KEYS)
    assert res.ff > 0 and res.lut > 0            # every top has registers and logic
    assert acc.model.report_lines(cfg, {}) == []  # no fields of its own: nothing to add
    banks = cfg.memory_banks()
    assert isinstance(banks, dict)


def test_the_estimate_counts_what_the_design_holds():
    """ibert-linear at its default: tiles x pes int8 x int8 multipliers, one DSP each; no
    memories. pq-decoder: one memory per sub-space of 256 x lut_buffers words of lut_bits
    bits; 512 x 16 fits one 18 Kb block (512 x 36)."""
    lin = registry.get("ibert-linear")
    cfg = lin.config()
    res = estimate(lin, cfg)
    assert res.dsp == cfg.tiles * cfg.pes
    assert res.bram18 == 0 and res.uram == 0
    pq = registry.get("pq-decoder")
    cfg = pq.config()
    assert 256 * cfg.lut_buffers <= 512 and cfg.lut_bits <= 36
    assert estimate(pq, cfg).bram18 == cfg.m


@pytest.mark.parametrize("name", ["pq-decoder", "ibert-linear"])
def test_the_estimate_against_yosys(name):
    """yosys synth_xilinx maps the same design: DSPs and block RAMs agree exactly (every
    multiplier and memory of these designs survives optimisation); the estimate counts every
    register, yosys removes the constant and duplicate ones (at most 5 % here); LUTs within
    the estimate's stated accuracy, a factor of 3 either way."""
    from hwgen.flow.resources import against_yosys, measured
    from hwgen.flow.tools import yosys_path
    if yosys_path() is None:
        pytest.skip("yosys not installed (make setup installs it)")
    acc = registry.get(name)
    cfg = acc.config()
    est, real = estimate(acc, cfg), measured(acc, cfg)
    assert real.source == "yosys"
    assert (est.dsp, est.bram18, est.uram) == (real.dsp, real.bram18, real.uram)
    assert real.ff <= est.ff <= 1.05 * real.ff
    assert real.lut / 3 <= est.lut <= 3 * real.lut
    assert against_yosys(est, real)["ok"]        # and so within the stated error


def test_the_stated_error_bounds_each_resource():
    """against_yosys: DSP and URAM exact; block RAM up to 25% over, never under; flip-flops
    5% either way; LUTs a factor of 3; a resource yosys counts 0 agrees only with 0."""
    from hwgen.contract import Resources
    from hwgen.flow.resources import against_yosys
    real = Resources(lut=1000, ff=1000, bram18=100, uram=0, dsp=10, source="yosys")

    def check(**change):
        return against_yosys(Resources(**{**real.to_dict(), **change}), real)
    assert check()["ok"] and check()["lut"]["ratio"] == 1.0
    assert check(bram18=125)["ok"] and not check(bram18=126)["ok"]
    assert not check(bram18=99)["ok"] and not check(dsp=11)["ok"] and not check(dsp=9)["ok"]
    assert check(ff=950)["ok"] and check(ff=1050)["ok"]
    assert not check(ff=949)["ff"]["within"] and not check(ff=1051)["ok"]
    assert check(lut=334)["ok"] and check(lut=3000)["ok"] and not check(lut=3001)["ok"]
    bad = check(uram=1)
    assert not bad["ok"] and bad["uram"] == {"estimate": 1, "yosys": 0, "ratio": None,
                                             "within": False}


def test_performance_is_the_cycle_model_at_the_workload():
    cfg = LinearConfig()
    perf = cfg.performance(cfg.workload(rows=3))
    assert perf.cycles == perf["cycles"] and perf.workload.rows == 3
    assert dict(perf) == perf.to_dict()
    assert cfg.performance().cycles is None          # steady state only by default
    soft = SoftmaxConfig()
    assert soft.performance(soft.workload(rows=[5, 7])).workload.rows == (5, 7)


def test_a_workload_refuses_unknown_fields_negative_counts_and_other_types():
    cfg = LinearConfig()
    with pytest.raises(ConfigError, match="workload.row"):
        cfg.workload(row=3)
    with pytest.raises(ConfigError, match="workload.rows"):
        cfg.workload(rows=-1)
    with pytest.raises(ConfigError, match="workload.rows"):
        cfg.workload(rows=1.5)
    with pytest.raises(ConfigError, match="workload"):
        cfg.performance(SoftmaxConfig().workload())
    with pytest.raises(ConfigError, match="workload"):
        cfg.performance({"rows": 3})


def test_a_config_without_a_cycle_model_answers_empty():
    assert Config().performance().to_dict() == {}
    assert Config().performance().workload == Workload()


def test_resources_refuse_negative_counts_and_add_up():
    with pytest.raises(ConfigError, match="resources.dsp"):
        Resources(lut=1, ff=1, bram18=0, uram=0, dsp=-1)
    a = Resources(lut=10, ff=20, bram18=1, uram=0, dsp=2)
    b = Resources(lut=1, ff=2, bram18=3, uram=4, dsp=5)
    assert (a + b).to_dict() == {"lut": 11, "ff": 22, "bram18": 4, "uram": 4, "dsp": 7}
    assert a.fits({"lut": 10, "ff": 20, "bram18": 1, "uram": 0, "dsp": 2})
    assert not a.fits({"lut": 10, "ff": 20, "bram18": 1, "uram": 0, "dsp": 2}, fraction=0.9)


def test_status_lines_by_hand():
    result = {"status_expected": {"delivered": 5, "bad_length": 2, "unknown_dest": 0},
              "status": {"delivered": 5, "bad_length": 1, "unknown_dest": 0}}
    assert status_lines(result) == [
        "  status counters (simulation / golden): delivered 5 / 5, dropped 1 / 2  MISMATCH",
        "    dropped by kind: bad_length 1/2"]


def test_node_report_lines_by_hand():
    result = {"dataset": "digits", "queries": 4, "nprobe": 2,
              "recall": {"recall@1": 0.5}, "faiss_recall": {"recall@1": 0.75},
              "identical_topk_fraction": 0.25}
    assert ChamVSNodeModel.report_lines(None, result) == [
        "  digits, 4 queries, nprobe 2: node recall@1 0.500; faiss IndexIVFPQ recall@1 0.750; "
        "identical top-k ids in 25.0% of queries"]
