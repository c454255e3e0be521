"""MkDocs hooks: the tables a bench prints are generated here, at build time, from the bench's
JSON in the repository, never copied by hand.

A page asks for one with a line ``<!-- hwgen-table: NAME -->``; :data:`TABLES` maps NAME to a
function returning markdown. An unknown NAME or a missing file fails the build.

============  ==========================================  ===================================
NAME          file                                        regenerate with
============  ==========================================  ===================================
timing        ``hwgen/flow/timing_results.json``          ``make timing``
sim-speed     ``docs/data/bench_sim.json``                ``hwgen bench sim --json FILE``
chamvs-cpu    ``docs/data/bench_chamvs.json``             ``hwgen bench chamvs --json FILE``
cluster       ``docs/data/bench_cluster.json``            ``hwgen bench cluster --json FILE``
============  ==========================================  ===================================
"""

import json
import re
from pathlib import Path

from hwgen.flow import timing_table
from hwgen.vecsearch.baseline import compare_lines

ROOT = Path(__file__).resolve().parents[1]
MARKER = re.compile(r"^<!-- hwgen-table: ([a-z0-9-]+) -->$", re.M)


def _load(rel):
    return json.loads((ROOT / rel).read_text())


def _source(rel, record):
    """How a table was measured: the command, machine, date and commit its JSON records."""
    m = record["measured"]
    commit = f", commit {m['commit']}" if m.get("commit") else ""
    return (f"\n*Generated from `{rel}`: measured by `{m['command']}` on {m['machine']}, "
            f"{m['date']}{commit}.*\n")


def sim_speed():
    """``hwgen bench sim``: simulated cycles per second, cocotb against the native engine."""
    rel = "docs/data/bench_sim.json"
    record = _load(rel)
    lines = ["| accelerator | configuration | engine | items | cycles | wall s | cycles/s "
             "| mismatches |", "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    for r in record["rows"]:
        conf = " ".join(f"{k}={v}" for k, v in r["config"].items()) or "default"
        lines.append(f"| {r['accelerator']} | {conf} | {r['engine']} | {r['items']:,} | "
                     f"{r['cycles']:,} | {r['wall_seconds']:.2f} | {r['cycles_per_second']:,} "
                     f"| {r['mismatches']} |")
    return "\n".join(lines) + "\n" + _source(rel, record)


def chamvs_cpu():
    """``hwgen bench chamvs``: the node beside CPU faiss on the same data, index and nprobe."""
    rel = "docs/data/bench_chamvs.json"
    record = _load(rel)
    # a text line between tables stands apart, so each table starts a paragraph
    text = "\n".join(l if l.startswith("|") else f"\n{l}\n" for l in compare_lines(record))
    return text + "\n" + _source(rel, record)


def cluster():
    """``hwgen bench cluster``: the latency model against the paper, as the bench prints it."""
    rel = "docs/data/bench_cluster.json"
    record = _load(rel)
    text = "\n".join(["```text", f"$ {record['measured']['command']}", *record["lines"], "```"])
    return text + "\n" + _source(rel, record)


TABLES = {
    "timing": lambda: timing_table.markdown(timing_table.load()),
    "sim-speed": sim_speed,
    "chamvs-cpu": chamvs_cpu,
    "cluster": cluster,
}


def on_page_markdown(markdown, page, **_):
    """Replace every ``<!-- hwgen-table: NAME -->`` line of a page with its table."""
    def table(match):
        name = match.group(1)
        if name not in TABLES:
            raise ValueError(f"{page.file.src_path}: no generated table {name!r} "
                             f"(known: {', '.join(sorted(TABLES))})")
        return TABLES[name]()
    return MARKER.sub(table, markdown)
