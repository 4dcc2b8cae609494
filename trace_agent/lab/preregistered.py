"""Pre-registered training comparisons: arm names, one compact file per (arm, seed) run, the table.

A comparison fixes its arms, seeds, evaluation steps and test in a plan before any run
(docs/paper/math/plan.md is one). ``scripts/paper_claims.py train --runs DIR`` writes one JSON
file per finished run, ``DIR/<arm>_s<seed>.json``; :func:`build_table` rebuilds every figure of
the comparison from those files alone, and :func:`table_markdown` renders it
(``scripts/paper_claims.py table --runs DIR``).

Arm names (:func:`parse_arm`): ``STRATEGY[@Kx][/MxN][+warmWxG]``: ``grpo@2x`` is GRPO at twice the
config's roots; ``trace/24x6`` is TRACE with 24 roots and 6 continuations per root; ``trace+warm45x4`` is
TRACE whose predictor is warmed up on 45 train tasks in groups of 4 roots before step 1
(``predictor.warm_start_tasks`` / ``warm_start_roots``, :mod:`trace_agent.warm_start`).

The metric: the area under the held-out learning curve (:func:`curve_auc_steps`: trapezoids
over the evaluated steps, divided by their span), compared between arms seed by seed with a
t 95% interval on the paired differences (:func:`paired_ci`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

from trace_agent.lab.analysis import spread
from trace_agent.lab.run_data import read_json, run_files

__all__ = [
    "Arm",
    "PLAN_PAIRS",
    "RUN_STEP_KEYS",
    "RUN_STEP_PREFIXES",
    "RunTableError",
    "arm_file_stem",
    "build_table",
    "curve_auc_steps",
    "fmt",
    "holm",
    "kept_step_metric",
    "load_runs",
    "paired_ci",
    "paired_p",
    "paired_power",
    "parse_arm",
    "run_figures",
    "table_markdown",
]

#: Step metrics kept in a run file: these prefixes, and the step's wall and predictor time.
RUN_STEP_PREFIXES = ("rollout/", "budget/", "update/", "predictor/")
RUN_STEP_KEYS = ("time/step_s", "time/predictor_s")

#: The paired comparisons docs/paper/math/plan.md names beside each arm against GRPO: (A, B) for A - B.
PLAN_PAIRS: tuple[tuple[str, str], ...] = (("trace", "treepo"), ("grpo@2x", "trace"))


class RunTableError(ValueError):
    """An arm name, a run file or a set of runs that a comparison's table cannot be built from."""


def kept_step_metric(key: str, value: Any) -> bool:
    """Whether a training step's metric goes into a run file (see :data:`RUN_STEP_PREFIXES`)."""
    return (key.startswith(RUN_STEP_PREFIXES) or key in RUN_STEP_KEYS) and isinstance(value, int | float)


class Arm(NamedTuple):
    """A parsed arm name (:func:`parse_arm`).

    Attributes:
        strategy: the rollout strategy (``rollout.strategy``).
        multiple: K of ``@Kx``: ``rollout.budget.roots`` times K (1 without it).
        shape: (M, N) of ``/MxN``: ``rollout.budget.roots`` and ``rollout.budget.continuations_per_root`` (None: the config's).
        warm: (W, G) of ``+warmWxG``: ``predictor.warm_start_tasks`` and ``warm_start_roots`` (None: the config's).
    """

    strategy: str
    multiple: int
    shape: tuple[int, int] | None
    warm: tuple[int, int] | None


_WARM = re.compile(r"warm([0-9]+)x([0-9]+)")


def parse_arm(arm: str) -> Arm:
    """An arm name: ``STRATEGY[@Kx][/MxN][+warmWxG]``.

    ``"grpo@2x"`` -> ``("grpo", 2, None, None)`` (``rollout.budget.roots`` times 2); ``"trace/24x6"`` -> ``("trace", 1,
    (24, 6), None)`` (``rollout.budget.roots = 24``, ``rollout.budget.continuations_per_root = 6``: a budget shape);
    ``"trace+warm45x4"`` -> ``("trace", 1, None, (45, 4))`` (the predictor warmed up on 45 train tasks x 4 roots:
    ``predictor.warm_start_tasks = 45``, ``predictor.warm_start_roots = 4``); ``"trace"`` -> ``("trace", 1, None,
    None)`` (the config's own rollout and predictor).
    """
    body, plus, warm_text = arm.partition("+")
    warm = None
    if plus:
        match = _WARM.fullmatch(warm_text)
        if match is None or int(match[1]) < 1 or int(match[2]) < 2:
            raise RunTableError(f"arm {arm!r}: a predictor warm-up is written like 'trace+warm45x4' "
                                "(W >= 1 train tasks x G >= 2 roots each)")
        warm = (int(match[1]), int(match[2]))
    head, _, shape_text = body.partition("/")
    name, _, mult = head.partition("@")
    shape = None
    if shape_text:
        m, _, n = shape_text.partition("x")
        if not (m.isdigit() and n.isdigit() and int(m) >= 1):
            raise RunTableError(f"arm {arm!r}: a budget shape is written like 'trace/24x6' (M roots x N)")
        shape = (int(m), int(n))
    if not mult:
        return Arm(name, 1, shape, warm)
    if not mult.endswith("x") or not mult[:-1].isdigit() or int(mult[:-1]) < 1:
        raise RunTableError(f"arm {arm!r}: a budget multiple is written like 'grpo@2x'")
    return Arm(name, int(mult[:-1]), shape, warm)


def arm_file_stem(arm: str) -> str:
    """``"grpo@2x"`` -> ``"grpo_2x"``, ``"trace/24x6"`` -> ``"trace_24x6"``, ``"trace+warm45x4"`` -> ``"trace_warm45x4"``:
    the arm's part of a run file name."""
    return arm.replace("@", "_").replace(":", "_").replace("/", "_").replace("+", "_")


def curve_auc_steps(evals: Sequence[dict[str, Any]]) -> float:
    """Area under the held-out curve (trapezoids over the evaluated steps), divided by the span of steps."""
    pts = sorted((int(e["step"]), float(e["success"])) for e in evals)
    if len(pts) < 2:
        raise RunTableError("a learning curve needs two evaluations or more")
    area = sum((s0 + s1) / 2 * (t1 - t0) for (t0, s0), (t1, s1) in zip(pts, pts[1:]))
    return area / (pts[-1][0] - pts[0][0])


def paired_ci(diffs: Sequence[float]) -> dict[str, float]:
    """Mean of paired differences, its standard error and the t 95% interval (n - 1 degrees of freedom)."""
    from scipy.stats import t as student_t

    n = len(diffs)
    if n == 0:
        return {"n": 0, "mean": math.nan, "se": math.nan, "low": math.nan, "high": math.nan}
    mean = sum(diffs) / n
    if n == 1:
        return {"n": 1, "mean": mean, "se": math.nan, "low": math.nan, "high": math.nan}
    se = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (n - 1) / n)
    q = float(student_t.ppf(0.975, n - 1))
    return {"n": n, "mean": mean, "se": se, "low": mean - q * se, "high": mean + q * se}


def paired_p(diffs: Sequence[float]) -> float:
    """Two-sided p-value of the paired t test that the mean of ``diffs`` is 0 (n - 1 degrees of freedom)."""
    from scipy.stats import t as student_t

    c = paired_ci(diffs)
    if c["n"] < 2 or not c["se"] > 0:
        return math.nan
    return float(2 * student_t.sf(abs(c["mean"]) / c["se"], c["n"] - 1))


def holm(pvalues: Sequence[float], *, alpha: float = 0.05) -> list[bool]:
    """Holm's step-down procedure: which hypotheses are rejected at family-wise error ``alpha``, in input order.

    The i-th smallest p-value (i = 0, 1, ...) is compared with ``alpha / (m - i)``; the first that fails stops
    the procedure and it and every larger p-value are kept.
    """
    order = sorted(range(len(pvalues)), key=lambda i: pvalues[i])
    rejected = [False] * len(pvalues)
    for rank, i in enumerate(order):
        if not pvalues[i] <= alpha / (len(pvalues) - rank):
            break
        rejected[i] = True
    return rejected


def paired_power(delta: float, sd: float, n: int, *, alpha: float = 0.05) -> float:
    """Power of the two-sided paired t test at level ``alpha`` to find a true mean difference ``delta`` with
    ``n`` pairs whose differences have standard deviation ``sd`` (the noncentral t distribution)."""
    from scipy.stats import nct
    from scipy.stats import t as student_t

    if n < 2 or not sd > 0:
        raise ValueError(f"power needs n >= 2 pairs and sd > 0, got n={n}, sd={sd}")
    df, nc = n - 1, delta / (sd / math.sqrt(n))
    q = float(student_t.ppf(1 - alpha / 2, df))
    return float(nct.sf(q, df, nc) + nct.cdf(-q, df, nc))


def load_runs(runs: str | Path) -> list[dict[str, Any]]:
    """The run files in ``runs`` (``*_s<seed>.json``, plain or gzip-compressed as ``.json.gz``), in name order;
    ``base.json`` is not a run."""
    out = []
    for path in run_files(runs):
        data = read_json(path)
        if not {"arm", "seed", "evals", "steps"} <= set(data):
            raise RunTableError(f"{path} is not a run file")
        out.append(data)
    return out


def _finite_mean(values: Sequence[float]) -> float:
    vals = [float(v) for v in values if math.isfinite(float(v))]
    return sum(vals) / len(vals) if vals else math.nan


def _per_run(r: dict[str, Any]) -> dict[str, float]:
    ratios = [float(s["rollout/effective_ratio"]) for s in r["steps"]
              if s.get("rollout/effective_ratio") is not None and math.isfinite(float(s["rollout/effective_ratio"]))]
    first = [float(s["rollout/effective_ratio"]) for s in r["steps"] if int(s["step"]) == 1]
    final = max(r["evals"], key=lambda e: int(e["step"]))
    return {"auc": curve_auc_steps(r["evals"]), "final": float(final["success"]),
            "effective_ratio": sum(ratios) / len(ratios) if ratios else math.nan,
            "effective_ratio_step1": first[0] if first else math.nan,
            "generated_tokens": float(r["generated_tokens"]), "paper_units": float(r["paper_units"]),
            "warm_start_generated_tokens": float((r.get("warm_start") or {}).get("generated_tokens", 0.0)),
            "seconds": float(r["seconds"])}


def run_figures(run: dict[str, Any]) -> dict[str, float]:
    """One run file's figures: ``auc``, ``final``, ``effective_ratio`` (mean over its steps),
    ``effective_ratio_step1``, ``generated_tokens``, ``paper_units`` (both with a predictor warm-up's included),
    ``warm_start_generated_tokens`` (the warm-up's alone; 0 without one), ``seconds``."""
    return _per_run(run)


def build_table(runs: Sequence[dict[str, Any]], reference: str = "grpo",
                pairs: Sequence[tuple[str, str]] = ()) -> dict[str, Any]:
    """Per arm: seeds, mean AUC / final / effective ratio (all steps and step 1) / tokens; paired vs ``reference``;
    under ``pairs``, A - B over the seeds both arms ran, for each (A, B) whose arms both have runs.

    Raises :class:`RunTableError` when the runs were evaluated at different steps (their curves do not pool).
    """
    arms: dict[str, list[dict[str, Any]]] = {}
    for r in runs:
        arms.setdefault(r["arm"], []).append(r)
    grid = {tuple(sorted(int(e["step"]) for e in r["evals"])) for r in runs}
    if len(grid) > 1:
        raise RunTableError(f"the runs were evaluated at different steps: {sorted(grid)}")
    commits = sorted({r.get("commit", "") for r in runs})
    values = {arm: {int(r["seed"]): _per_run(r) for r in rs} for arm, rs in arms.items()}
    table: dict[str, Any] = {"reference": reference, "commits": commits, "eval_steps": list(next(iter(grid), ())),
                             "arms": {}}
    for arm, by_seed in values.items():
        entry: dict[str, Any] = {"seeds": sorted(by_seed)}
        for k in ("auc", "final", "effective_ratio", "effective_ratio_step1", "generated_tokens", "paper_units",
                  "warm_start_generated_tokens", "seconds"):
            entry[k] = _finite_mean([v[k] for v in by_seed.values()])
        for k in ("effective_ratio", "effective_ratio_step1"):  # its spread over seeds (sample sd; 0 for one seed)
            entry[f"{k}_sd"] = spread(v[k] for v in by_seed.values())["std"]
        if arm != reference and reference in values:
            ref = values[reference]
            paired = sorted(set(by_seed) & set(ref))
            entry["vs_reference"] = {k: paired_ci([by_seed[s][k] - ref[s][k] for s in paired]) for k in ("auc", "final")}
            entry["vs_reference"]["seeds"] = paired
        table["arms"][arm] = entry
    table["pairs"] = {}
    for a, b in pairs:
        if a in values and b in values:
            both = sorted(set(values[a]) & set(values[b]))
            table["pairs"][f"{a} − {b}"] = {
                **{k: paired_ci([values[a][s][k] - values[b][s][k] for s in both]) for k in ("auc", "final")},
                "seeds": both}
    return table


def fmt(x: float | None, digits: int = 3) -> str:
    """``x`` with ``digits`` decimals; ``n/a`` for a missing or non-finite figure."""
    return "n/a" if x is None or (isinstance(x, float) and not math.isfinite(x)) else f"{x:.{digits}f}"


def table_markdown(table: dict[str, Any]) -> str:
    """:func:`build_table`'s result as Markdown: a line on what was compared, the arms, then the named pairs."""
    ref = table["reference"]

    def ci(c: dict[str, float]) -> str:
        if c["n"] == 0:
            return "-"
        if c["n"] == 1:
            return f"{c['mean']:+.3f} (1 seed: no interval)"
        return f"{c['mean']:+.3f} [{c['low']:+.3f}, {c['high']:+.3f}] (n = {c['n']})"

    lines = [f"Runs at commit(s) {', '.join(c[:10] for c in table['commits'])}; held-out evaluations at steps "
             f"{', '.join(map(str, table['eval_steps']))}; AUC = area under the held-out curve over those steps / their "
             f"span; paired differences against `{ref}` (same seed) with a t 95% interval.", "",
             f"| arm | seeds | held-out AUC | final held-out | AUC − {ref} [95% CI] | final − {ref} [95% CI] "
             "| effective ratio (step 1, ± sd over seeds) | effective ratio (all steps, ± sd) | paper units "
             "| generated tokens | s/run |",
             "|---|---:|---:|---:|---|---|---:|---:|---:|---:|---:|"]
    for arm, e in table["arms"].items():
        vs = e.get("vs_reference")
        lines.append(f"| {arm} | {len(e['seeds'])} | {fmt(e['auc'])} | {fmt(e['final'])} "
                     f"| {ci(vs['auc']) if vs else '-'} | {ci(vs['final']) if vs else '-'} "
                     f"| {fmt(e['effective_ratio_step1'], 2)} ± {fmt(e['effective_ratio_step1_sd'], 2)} "
                     f"| {fmt(e['effective_ratio'], 2)} ± {fmt(e['effective_ratio_sd'], 2)} | {e['paper_units']:.0f} "
                     f"| {e['generated_tokens']:.0f} | {e['seconds']:.0f} |")
    if table.get("pairs"):
        lines += ["", "| paired difference (same seed) | seeds | AUC [95% CI] | final held-out [95% CI] |",
                  "|---|---:|---|---|"]
        for name, d in table["pairs"].items():
            lines.append(f"| {name} | {len(d['seeds'])} | {ci(d['auc'])} | {ci(d['final'])} |")
    return "\n".join(lines) + "\n"
