"""GMI collectives: golden model against MPI's definitions and against Open MPI (mpirun on
loopback, when installed), its packet-stream rules, config validation, and Verilator runs that
add to tests/test_sim.py's: heavy interleaving with drops at high stall, exact cycle counts,
and a check that wrong status counters are caught."""

import json
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from hwgen import registry
from hwgen.cluster.golden import collectives as golden
from hwgen.cluster.gateware.gmi import (KINDS, TEST_CONFIGS, Broadcast, Gather, Reduce, Scatter,
                                        gmi_component)
from hwgen.cluster.spec.gmi import GMIConfig
from hwgen.cluster.spec.packet import Packet
from hwgen.errors import ConfigError

from conftest import requires_mpi, requires_verilator

TYPES = {8: np.int8, 16: np.int16, 32: np.int32}


def _rand(rng, n, bits):
    info = np.iinfo(TYPES[bits])
    return rng.integers(info.min, info.max, size=n, endpoint=True)


# -- MPI semantics, element by element ---------------------------------------------------------

@pytest.mark.parametrize("bits", [8, 16, 32])
def test_reduce_is_elementwise_over_ranks_with_wraparound(bits):
    rng = np.random.default_rng(bits)
    bufs = [_rand(rng, 13, bits) for _ in range(5)]
    bufs[0][0], bufs[1][0] = (1 << (bits - 1)) - 1, 1        # max + 1 wraps to min
    got = golden.reduce(bufs, "sum", bits)
    for j in range(13):
        total = sum(int(b[j]) for b in bufs) % (1 << bits)
        if total >= 1 << (bits - 1):
            total -= 1 << bits
        assert got[j] == total
    # the same as numpy's own wrapping arithmetic in that type
    acc = np.zeros(13, dtype=TYPES[bits])
    with np.errstate(over="ignore"):
        for b in bufs:
            acc = (acc + b.astype(TYPES[bits])).astype(TYPES[bits])
    assert got.tolist() == acc.astype(np.int64).tolist()
    mx = golden.reduce(bufs, "max", bits)
    assert mx.tolist() == [max(int(b[j]) for b in bufs) for j in range(13)]


def test_reduce_max_is_signed():
    assert golden.reduce([[-1, 0x7F], [0, -128]], "max", 8).tolist() == [0, 127]


def test_scatter_gather_bcast_allgather_by_rank():
    members, n = 5, 7
    buf = np.arange(members * n) - 17
    chunks = golden.scatter(buf, members)
    for rank in range(members):
        assert chunks[rank].tolist() == [int(buf[rank * n + j]) for j in range(n)]
    sends = [np.full(n, 10 * r) + np.arange(n) for r in range(members)]
    gathered = golden.gather(sends)
    assert [int(gathered[r * n + j]) for r in range(members) for j in range(n)] == \
        [10 * r + j for r in range(members) for j in range(n)]
    assert all(b.tolist() == buf.tolist() for b in golden.bcast(buf, members))
    every = golden.allgather(sends)
    assert len(every) == members and all(e.tolist() == gathered.tolist() for e in every)
    with pytest.raises(ValueError):
        golden.scatter(np.arange(11), members)


# -- Open MPI on loopback --------------------------------------------------------------------

MPI_SCRIPT = textwrap.dedent('''
    import json, sys
    import numpy as np
    from mpi4py import MPI
    TYPES = {8: np.int8, 16: np.int16, 32: np.int32}

    def buffer(seed, who, n, bits):
        rng = np.random.default_rng([seed, who])
        info = np.iinfo(TYPES[bits])
        buf = rng.integers(info.min, info.max, size=n, endpoint=True).astype(TYPES[bits])
        buf[:2] = [info.max, info.min]
        return buf

    out_path, n, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    result = {"size": size}
    for bits, dtype in TYPES.items():
        mine = buffer(seed, rank, n, bits)
        root_buf = buffer(seed, 1000, size * n, bits)
        bc = root_buf[:n].copy() if rank == 0 else np.empty(n, dtype)
        comm.Bcast(bc, root=0)
        sc = np.empty(n, dtype)
        comm.Scatter(root_buf if rank == 0 else None, sc, root=0)
        ga = np.empty(size * n, dtype) if rank == 0 else None
        comm.Gather(mine, ga, root=0)
        rs = np.empty(n, dtype) if rank == 0 else None
        comm.Reduce(mine, rs, op=MPI.SUM, root=0)
        rm = np.empty(n, dtype) if rank == 0 else None
        comm.Reduce(mine, rm, op=MPI.MAX, root=0)
        ag = np.empty(size * n, dtype)
        comm.Allgather(mine, ag)
        per_rank = comm.gather({"bcast": bc.tolist(), "scatter": sc.tolist(),
                                "allgather": ag.tolist()}, root=0)
        if rank == 0:
            result[str(bits)] = {"per_rank": per_rank, "gather": ga.tolist(),
                                 "sum": rs.tolist(), "max": rm.tolist()}
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump(result, f)
''')


def _mpi_buffer(seed, who, n, bits):
    rng = np.random.default_rng([seed, who])
    buf = _rand(rng, n, bits)
    buf[:2] = [np.iinfo(TYPES[bits]).max, np.iinfo(TYPES[bits]).min]
    return buf


@requires_mpi
def test_golden_matches_open_mpi(tmp_path):
    """Bcast, Scatter, Gather, Reduce (SUM, MAX) and Allgather of Open MPI over 5 ranks on
    loopback equal the golden model's, for 8/16/32-bit elements."""
    mpirun = shutil.which("mpirun")
    script = tmp_path / "collectives.py"
    script.write_text(MPI_SCRIPT)
    out = tmp_path / "out.json"
    members, n, seed = 5, 11, 4
    # ``--mca op ^avx``: Open MPI 4.1's AVX reduction component sums 8/16-bit integers with
    # saturating instructions (open-mpi/ompi#8045, "wontfix"; Debian 12's 4.1.4 does so for
    # int16 here), unlike its own C reduction and the C semantics MPI_SUM is defined by.
    proc = subprocess.run([mpirun, "--oversubscribe", "--allow-run-as-root",
                           "--mca", "op", "^avx", "-n",
                           str(members), sys.executable, str(script), str(out), str(n),
                           str(seed)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    res = json.loads(out.read_text())
    assert res["size"] == members
    for bits in (8, 16, 32):
        mpi = res[str(bits)]
        sends = [_mpi_buffer(seed, r, n, bits) for r in range(members)]
        root_buf = _mpi_buffer(seed, 1000, members * n, bits)
        for rank, got in enumerate(mpi["per_rank"]):
            assert got["bcast"] == golden.bcast(root_buf[:n], members)[rank].tolist()
            assert got["scatter"] == golden.scatter(root_buf, members)[rank].tolist()
            assert got["allgather"] == golden.allgather(sends)[rank].tolist()
        assert mpi["gather"] == golden.gather(sends).tolist()
        assert mpi["sum"] == golden.reduce(sends, "sum", bits).tolist()
        assert mpi["max"] == golden.reduce(sends, "max", bits).tolist()
        assert mpi["sum"][0] == golden.wrap(members * np.iinfo(TYPES[bits]).max, bits)


# -- packet streams ----------------------------------------------------------------------------

def _msg(cfg, src, values):
    return Packet(cfg.kernel_id, src, golden.from_elems(values, cfg.elem_bits))


@pytest.mark.parametrize("kind", ["gather", "reduce"])
def test_stream_result_independent_of_arrival_order(kind):
    """Members' packets of up to ``depth`` rounds interleaved in any order give the same
    packets, equal to the MPI definition per round."""
    cfg = GMIConfig(members=4, length=5, elem_bits=16, depth=3, first_member=10, root=2,
                    kernel_id=30, cluster_id=3)
    rng = np.random.default_rng(1)
    rounds = 6
    data = [[_rand(rng, 5, 16) for _ in range(4)] for _ in range(rounds)]
    in_order = [_msg(cfg, 10 + s, data[r][s]) for r in range(rounds) for s in range(4)]
    want, status = golden.collective_stream(kind, cfg, in_order)
    assert status == {"rounds": rounds, "drop_source": 0, "drop_length": 0, "drop_overrun": 0}
    for r, p in enumerate(want):
        assert (p.dest, p.src, p.src_cluster, p.inter_cluster) == (2, 30, 3, False)
        ref = golden.gather(data[r]) if kind == "gather" else \
            golden.reduce(data[r], "sum", 16)
        assert golden.to_elems(p.payload, 16).tolist() == ref.tolist()
    for trial in range(20):
        # each member's packets stay in its own order; members shuffled within depth
        queues = [[(r, s) for r in range(rounds)] for s in range(4)]
        order, sent = [], [0] * 4
        while any(queues):
            ok = [s for s in range(4) if queues[s] and sent[s] - min(sent) < cfg.depth]
            s = int(rng.choice(ok))
            order.append(queues[s].pop(0))
            sent[s] += 1
        got, st = golden.collective_stream(kind, cfg, [_msg(cfg, 10 + s, data[r][s])
                                                       for r, s in order])
        assert got == want and st == status


def test_stream_drop_rules():
    cfg = GMIConfig(members=2, length=3, depth=1, first_member=4)
    a, b = [1, 2, 3], [10, 20, 30]
    packets = [
        _msg(cfg, 4, a),
        _msg(cfg, 3, a),                        # not a member
        _msg(cfg, 4, b),                        # member 0 one round ahead, round 0 incomplete
        Packet(cfg.kernel_id, 5, b"\x01\x02"),  # wrong length
        _msg(cfg, 5, b),                        # completes round 0
        _msg(cfg, 5, a), _msg(cfg, 4, b),       # round 1
    ]
    out, st = golden.collective_stream("reduce", cfg, packets)
    assert st == {"rounds": 2, "drop_source": 1, "drop_length": 1, "drop_overrun": 1}
    assert [golden.to_elems(p.payload, 8).tolist() for p in out] == [[11, 22, 33]] * 2
    out, st = golden.collective_stream("scatter", cfg, [_msg(cfg, 99, [1] * 6),
                                                        _msg(cfg, 1, [1] * 5)])
    assert st["drop_length"] == 1 and st["rounds"] == 1 and [p.dest for p in out] == [4, 5]


# -- configs -----------------------------------------------------------------------------------

@pytest.mark.parametrize("values, param", [
    ({"members": 200, "first_member": 100}, "members"),
    ({"members": 0}, "members"),
    ({"length": 4096, "members": 64, "elem_bits": 32}, "length"),
    ({"elem_bits": 12}, "elem_bits"),
    ({"op": "min"}, "op"),
    ({"data_bits": 128}, "data_bits"),
    ({"kernel_id": 256}, "kernel_id"),
    ({"depth": 0}, "depth"),
])
def test_invalid_configs_name_the_parameter(values, param):
    with pytest.raises(ConfigError) as e:
        GMIConfig.from_dict(values)
    assert e.value.param == param


def test_gmi_component_kinds():
    cfg = GMIConfig()
    assert [type(gmi_component(k, cfg)) for k in KINDS] == [Broadcast, Scatter, Gather, Reduce]
    with pytest.raises(ConfigError) as e:
        gmi_component("allreduce", cfg)
    assert e.value.param == "kind"
    for k in KINDS:
        assert registry.get(f"gmi-{k}").config is GMIConfig


# -- Verilator ---------------------------------------------------------------------------------

def _sim(kind, index, **kw):
    from hwgen.flow.simulate import simulate
    acc = registry.get(f"gmi-{kind}")
    return simulate(acc, acc.config.from_dict(TEST_CONFIGS[index]), **{"engine": "native", **kw})


@requires_verilator
@pytest.mark.parametrize("kind, index", [("gather", 0), ("reduce", 2)])
def test_heavy_interleaving_and_drops_at_high_stall(kind, index):
    """Many malformed, foreign and overrunning packets between members' packets arriving in
    random order, with stall 0.5 on both sides (the builds of tests/test_sim.py)."""
    r = _sim(kind, index, items=25, seed=21, stall=0.5,
             stimulus_options={"bad": 0.4, "overrun": 0.4})
    assert not r["timeout"]
    assert r["mismatches"] == 0, r["first_mismatches"]
    st = r["status_expected"]
    assert st["rounds"] == 25 and st["drop_overrun"] > 0 and st["drop_source"] > 0 \
        and st["drop_length"] > 0
    assert r["status"] == st


@requires_verilator
@pytest.mark.parametrize("kind", KINDS)
def test_cycles_match_model(kind):
    """Round by round at full rate: the measured cycles equal GMIConfig.cycles."""
    cfg = GMIConfig.from_dict(TEST_CONFIGS[0])
    r = _sim(kind, 0, items=40, seed=5, stall=0.0,
             stimulus_options={"bad": 0.0, "overrun": 0.0, "interleave": False})
    assert r["mismatches"] == 0
    assert r["cycles"] == cfg.cycles(kind, 40)


@requires_verilator
def test_wrong_status_counters_are_caught(monkeypatch):
    real = golden.collective_stream

    def off_by_one(kind, config, packets):
        out, st = real(kind, config, packets)
        return out, dict(st, drop_length=st["drop_length"] + 1)

    monkeypatch.setattr(golden, "collective_stream", off_by_one)
    r = _sim("scatter", 0, items=5, seed=2, stall=0.2)
    assert r["status_mismatches"] == 1 and r["mismatches"] == 1
