"""WindVE device detector: the --devices declaration, the roles of plan() (paper section 4.3,
following its text), detection on this machine."""

import importlib.util
import os

import pytest

from hwgen.errors import ConfigError
from hwgen.windve.devices import Instance, describe, detect, parse_devices, plan

CORES = sorted(os.sched_getaffinity(0))
GPU = Instance("gpu", 0, torch_device="cuda:0")
CPU = Instance("cpu", 0, threads=len(CORES), cores=tuple(CORES), torch_device="cpu")
FPGA = Instance("fpga", 0, torch_device=None)


def test_parse_valid():
    a, b = parse_devices("cpu:1,cpu:1")
    assert (a.name, b.name) == ("cpu0", "cpu1")
    assert a.threads == b.threads == 1 and a.cores is None and a.torch_device == "cpu"
    assert a.declared and b.declared and a.emulates is None
    first = CORES[0]
    (pinned,) = parse_devices(f"cpu@{first}")
    assert pinned.cores == (first,) and pinned.threads == 1
    (two,) = parse_devices(f" CPU:2@{first}-{first} ")
    assert two.threads == 2 and two.cores == (first,)
    (listed,) = parse_devices("cpu:3@" + "+".join(map(str, CORES)))
    assert listed.cores == tuple(CORES) and listed.threads == 3
    (plain,) = parse_devices("cpu")
    assert plain.threads is None and plain.cores is None


@pytest.mark.parametrize("spec", [
    "", "  ", "tpu:0", "cpu:0", "cpu:x", "cpu:-1", "cpu:", "cpu:1,,cpu:1", "cpu@a",
    "cpu@3-1", f"cpu@{max(CORES) + 1}", "cpu@0-100000", "fpga:0", "gpu@0",
    "gpu:100000", "gpu:x",
])
def test_parse_invalid(spec):
    with pytest.raises(ConfigError, match="devices") as err:
        parse_devices(spec)
    assert err.value.param == "devices"


@pytest.mark.skipif(importlib.util.find_spec("torch_npu") is not None,
                    reason="checks the refusal of npu:N where torch_npu is missing; this "
                           "machine has torch_npu")
def test_parse_npu_without_torch_npu():
    with pytest.raises(ConfigError, match="torch_npu"):
        parse_devices("npu:0")


def test_plan_only_cpu_detected():
    for heterogeneous in (True, False):
        p = plan([CPU], heterogeneous)
        assert p.main == (CPU,) and p.auxiliary == () and not p.heterogeneous
        assert p.main_kind == "cpu" and "forced off" in p.note


def test_plan_declared_cpus():
    on = plan(parse_devices("cpu:1,cpu:1"), True)
    assert [i.name for i in on.main] == ["cpu0"] and on.main[0].emulates == "accelerator"
    assert [i.name for i in on.auxiliary] == ["cpu1"] and on.auxiliary[0].emulates is None
    assert on.heterogeneous and on.main_kind == "cpu"
    off = plan(parse_devices("cpu:1,cpu:1"), False)
    assert [i.name for i in off.main] == ["cpu0"] and off.auxiliary == ()
    assert not off.heterogeneous and "cpu1 not used" in off.note
    assert any("emulating the accelerator" in line for line in describe(off))
    single = plan(parse_devices("cpu:2"), True)
    assert len(single.main) == 1 and single.main[0].emulates is None
    assert single.auxiliary == () and not single.heterogeneous


def test_plan_gpu_and_cpu():
    on = plan([GPU, CPU], True)
    assert on.main == (GPU,) and on.auxiliary == (CPU,) and on.heterogeneous
    assert on.main_kind == "gpu"
    off = plan([GPU, CPU], False)
    assert off.main == (GPU,) and off.auxiliary == () and not off.heterogeneous
    alone = plan([GPU], True)
    assert alone.main == (GPU,) and not alone.heterogeneous and "forced off" in alone.note
    lines = describe(on)
    assert len(lines) == 2 and "gpu0" in lines[0] and "cuda:0" in lines[0]
    assert lines[1].startswith("auxiliary") and "cpu0" in lines[1]


def test_plan_fpga_skipped():
    p = plan([FPGA, CPU], True)
    assert p.main == (CPU,) and not p.heterogeneous and "fpga0" in p.note
    assert FPGA in p.unused and not FPGA.usable
    with pytest.raises(ConfigError, match="devices"):
        plan([FPGA], True)


def test_instance_defaults():
    assert Instance("gpu", 1).torch_device == "cuda:1"
    assert Instance("npu", 0).torch_device == "npu:0"
    assert Instance("fpga", 0).torch_device is None
    assert Instance("cpu", 2).name == "cpu2"
    with pytest.raises(ValueError):
        Instance("tpu", 0)


def test_detect_this_machine():
    found = detect()
    cpus = [i for i in found if i.kind == "cpu"]
    assert len(cpus) == 1 and cpus[0].torch_device == "cpu" and not cpus[0].declared
    assert cpus[0].cores == tuple(CORES) and cpus[0].threads == len(CORES)
    p = plan(found, True)
    assert p.main and all(i.usable for i in p.main)
    assert len(describe(p)) == len(p.main) + len(p.auxiliary) + len(p.unused)
