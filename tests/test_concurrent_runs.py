"""Simulations that run at once cannot collide: two processes start the same configuration with
the same seed, stall and item count but different stimulus, in a fresh build cache. One
Verilator build serves both (the second process waits for the first one's lock and finds it
cached), each run gets its own folder (keyed by the whole job), and both agree with their
golden model. Before, the run folder was named by seed, stall and items only, and one of two
such runs reported a false mismatch."""

import json
import os
import subprocess
import sys

from conftest import requires_verilator

SCRIPT = r"""
import json, sys
import numpy as np
from hwgen import registry
from hwgen.flow.simulate import simulate
acc = registry.get("pq-decoder")
cfg = acc.config(m=3)
stim = acc.model.stimulus(cfg, 300, np.random.default_rng(int(sys.argv[1])))
r = simulate(acc, cfg, items=300, seed=5, stall=0.2, stimulus=stim)
print(json.dumps({k: r[k] for k in ("mismatches", "results", "run_dir", "build_cached",
                                    "timeout")}))
"""


@requires_verilator
def test_two_processes_same_configuration_different_stimulus(tmp_path):
    env = dict(os.environ, HWGEN_CACHE=str(tmp_path / "cache"))
    procs = [subprocess.Popen([sys.executable, "-c", SCRIPT, str(stim_seed)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for stim_seed in (101, 202)]
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=900)
        assert proc.returncode == 0, err[-2000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
    assert all(r["mismatches"] == 0 and not r["timeout"] and r["results"] == 300
               for r in results), results
    assert results[0]["run_dir"] != results[1]["run_dir"]
    assert sorted(r["build_cached"] for r in results) == [False, True]
    builds = list((tmp_path / "cache").glob("pq-decoder-*/build/hwgen.stamp"))
    assert len(builds) == 1
