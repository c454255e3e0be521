"""The paper's scalability sweeps (section 5.4): query length (Fig. 5) and CPU cores (Fig. 6).

For each point of a sweep the queue-depth estimator of :mod:`.calibrate` runs on each role, as
the paper's Table 3 "linear regression" (profile a few concurrencies directly on the instances'
queue, no HTTP; fit ``t = alpha * C + beta``; predict the depth per SLO) followed by one check
measurement at the predicted depth, lowered until it meets the SLO (the "final" depth, no
step-8 stress test). The result has the shape of the paper's figures: per point and SLO the
"original" concurrency (the main device alone, ``C_main``) and the "additional" concurrency
the CPU queue brings (``C_cpu``), with the improvement ``100 * C_cpu / C_main``.

* :func:`sweep_lengths` (Fig. 5): texts of exactly ``L`` tokens ([CLS] and [SEP] included;
  all-MiniLM-L6-v2 takes at most 256, the paper's bge 512), each role's instances started once.
* :func:`sweep_cores` (Fig. 6): the main side fixed (measured once, with texts of the paper's
  default 75 tokens), the CPU side one instance of ``k`` threads pinned to the last ``k``
  cores this process may use (the paper: cores with large indices do better, the service
  runs on the first ones), restarted for each ``k``.

:func:`plot_sweep` draws either. Errors on input are ConfigError naming the parameter.
"""

from dataclasses import replace

from .. import checks
from ..errors import ConfigError
from ..models.minilm import MAX_TOKENS, count_tokens
from ..plots import new_axes, save_axes
from .calibrate import Profiler, fit_role
from .devices import allowed_cores

__all__ = ["PAPER_TOKENS", "texts_of_length", "sweep_lengths", "sweep_cores", "plot_sweep"]

#: The paper's default query length (section 5.1.3), tokens.
PAPER_TOKENS = 75
#: Deepest depth a sweep point checks by measurement.
LIMIT = 512
#: Words that are one token each to the model's tokenizer (checked by :func:`texts_of_length`).
_WORDS = ("the engineer measured a long list of documents before the deadline and the new "
          "service shipped every query in the afternoon while our customer reviewed release "
          "notes for whole department").split()


def texts_of_length(tokens, n=16):
    """``n`` different texts of exactly ``tokens`` tokens each ([CLS] and [SEP] included),
    ``tokens`` in 3..256. Raises ConfigError naming ``tokens`` outside that range."""
    checks.at_least("tokens", tokens, 3, MAX_TOKENS)
    checks.at_least("n", n, 1)
    words = tokens - 2
    texts = [" ".join(_WORDS[(k + j) % len(_WORDS)] for j in range(words)) for k in range(n)]
    counts = count_tokens(texts)
    if any(c != tokens for c in counts):            # the word list no longer tokenizes 1:1
        raise ConfigError("tokens", f"texts of {tokens} tokens came out as {sorted(set(counts))}",
                          value=tokens)
    return texts


def _check(slos, points, name, lo, hi):
    for slo in slos:
        checks.positive("slo", slo)
    if not points:
        raise ConfigError(name, "needs at least one value")
    for x in points:
        checks.at_least(name, x, lo, hi)
    return sorted(set(points))


def _rows(xs, slos, main_fits, cpu_fits):
    rows = []
    for x, main, cpu in zip(xs, main_fits, cpu_fits):
        for slo in slos:
            original = main["depths"][slo]["final"]
            additional = cpu["depths"][slo]["final"]
            rows.append({"x": x, "slo": slo, "original": original, "additional": additional,
                         "improvement_percent": (100.0 * additional / original
                                                 if original else None)})
    return rows


def sweep_lengths(plan, slos, lengths, *, max_profile=32, points=5, rounds=2, progress=None):
    """Fig. 5: depths of the main and CPU roles of ``plan`` for texts of each of ``lengths``
    tokens (see the module docstring). Returns ``{"sweep": "lengths", "x_label", "slos",
    "main", "cpu", "rows": [{"x", "slo", "original", "additional",
    "improvement_percent"}], "fits": {"main": [...], "cpu": [...]}}`` (one :func:`fit_role`
    result per length)."""
    lengths = _check(slos, lengths, "sweep-lengths", 3, MAX_TOKENS)
    if not plan.auxiliary:
        raise ConfigError("devices", "the sweep needs a main and a CPU instance")
    say = progress or (lambda line: None)
    options = {"max_profile": max_profile, "points": points, "rounds": rounds}
    fits = {}
    for role, instances in (("main", plan.main), ("cpu", plan.auxiliary)):
        say(f"{role}: starting {'+'.join(i.name for i in instances)} ...")
        prof = Profiler(role, instances, texts_of_length(lengths[0]))
        try:
            fits[role] = []
            for tokens in lengths:
                prof.texts = texts_of_length(tokens)
                say(f"{role}: texts of {tokens} tokens")
                fits[role].append(fit_role(prof, slos, limit=LIMIT, progress=say, **options))
        finally:
            prof.close()
    return {"sweep": "lengths", "x_label": "query length (tokens)", "slos": list(slos),
            "main": [i.name for i in plan.main], "cpu": [i.name for i in plan.auxiliary],
            "rows": _rows(lengths, slos, fits["main"], fits["cpu"]), "fits": fits}


def sweep_cores(plan, slos, cores, *, max_profile=32, points=5, rounds=2, progress=None):
    """Fig. 6: the main role of ``plan`` once, then its first CPU instance with each of
    ``cores`` threads, pinned to that many of the last cores this process may use (see the
    module docstring), all with texts of :data:`PAPER_TOKENS` tokens. Returns the shape of
    :func:`sweep_lengths` with ``"sweep": "cores"`` (``fits["main"]`` has one entry)."""
    available = allowed_cores()
    cores = _check(slos, cores, "sweep-cores", 1, len(available))
    if not plan.auxiliary:
        raise ConfigError("devices", "the sweep needs a main and a CPU instance")
    say = progress or (lambda line: None)
    options = {"max_profile": max_profile, "points": points, "rounds": rounds}
    texts = texts_of_length(PAPER_TOKENS)
    say(f"main: starting {'+'.join(i.name for i in plan.main)} ...")
    prof = Profiler("main", plan.main, texts)
    try:
        main = fit_role(prof, slos, limit=LIMIT, progress=say, **options)
    finally:
        prof.close()
    cpu_fits, names = [], []
    for k in cores:
        inst = replace(plan.auxiliary[0], threads=k, cores=tuple(available[-k:]))
        names.append(f"{inst.name}: {k} thread{'s' if k != 1 else ''} on cores "
                     + ",".join(map(str, inst.cores)))
        say(f"cpu: starting {names[-1]} ...")
        prof = Profiler("cpu", [inst], texts)
        try:
            cpu_fits.append(fit_role(prof, slos, limit=LIMIT, progress=say, **options))
        finally:
            prof.close()
    return {"sweep": "cores", "x_label": "CPU cores of the overflow instance",
            "slos": list(slos), "tokens": PAPER_TOKENS,
            "main": [i.name for i in plan.main], "cpu": names,
            "rows": _rows(cores, slos, [main] * len(cores), cpu_fits),
            "fits": {"main": [main], "cpu": cpu_fits}}


def plot_sweep(report, path):
    """Per SLO, the "original" (main alone) and "additional" (CPU) concurrency against the
    swept quantity, the improvement labelled at each point (the paper's Figs. 5-6); saved as
    a PNG at ``path``. Returns ``path``."""
    fig, ax = new_axes()
    colors = ("tab:blue", "tab:orange", "tab:green", "tab:red")
    for slo, color in zip(report["slos"], colors):
        rows = [r for r in report["rows"] if r["slo"] == slo]
        xs = [r["x"] for r in rows]
        ax.plot(xs, [r["original"] for r in rows], "-o", color=color,
                label=f"original (main alone), {slo:g} s")
        ax.plot(xs, [r["additional"] for r in rows], "--s", color=color, ms=4,
                label=f"additional (CPU queue), {slo:g} s")
        for r in rows:
            if r["improvement_percent"] is not None:
                ax.annotate(f"+{r['improvement_percent']:.0f}%", (r["x"], r["additional"]),
                            textcoords="offset points", xytext=(0, 5), ha="center",
                            fontsize="x-small", color=color)
    xs = sorted({r["x"] for r in report["rows"]})
    ax.set_xticks(xs)
    ax.set_xticklabels([str(x) for x in xs])
    ax.set_title("WindVE scalability with "
                 + ("query length (Fig. 5)" if report["sweep"] == "lengths"
                    else f"CPU cores (Fig. 6), {report.get('tokens')}-token queries"))
    return save_axes(fig, ax, path, report["x_label"], "concurrency within the SLO")
