"""Every number of docs/paper.md's claims table, rebuilt from committed files.

The claims table (the first table under ``## Claims``) has, per row, a column ``our figure`` and a
column ``verdict``. Every number printed in those two columns has an entry in :data:`FIGURES`: the
number as printed, the committed files it is computed from, and the function that computes it from
them. :func:`check_table` parses the table, extracts the numbers of each row in order
(:func:`numbers_in`), and reports every disagreement: a printed number with no entry (a figure with
no file behind it), an entry whose number is no longer printed, a computed value that does not print
as the table prints it (compared at the table's own precision: ``0.745``, ``+0.004``, ``3.0%``), a
source file that does not exist. The paper's own figures (column ``paper's figure``) are quotes and
are not checked; neither are the ``claim`` and ``command`` columns.

Functions read the files under ``docs/`` and use the project's own arithmetic
(:mod:`trace_agent.lab.preregistered`, :mod:`trace_agent.lab.analysis`), so a number here is the number the
table-building commands print.
"""

from __future__ import annotations

import glob
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from trace_agent.lab.run_data import read_json

__all__ = [
    "DOCS",
    "FIGURES",
    "SECTION8_SECONDARY",
    "Figure",
    "TableCheckError",
    "check_table",
    "holm_section8",
    "claims_rows",
    "numbers_in",
    "printed_as",
    "rebuilt_from_problems",
]

#: The repository's docs/ directory, where the committed files live.
DOCS = Path(__file__).resolve().parents[3] / "docs"


class TableCheckError(ValueError):
    """docs/paper.md has no claims table that can be parsed (no ``## Claims`` heading or no table under it)."""


@dataclass(frozen=True, kw_only=True)
class Figure:
    """One printed number: its text as the table prints it, the files (globs under ``docs/``) it is computed
    from, and the computation (``docs`` directory -> value in the printed unit: a percentage as 3.0, not 0.03)."""

    text: str
    sources: tuple[str, ...]
    compute: Callable[[Path], float]


# ------------------------------------------------------------------------------------------- parsing

_SKIP = (re.compile(r"`[^`]*`"), re.compile(r"\]\([^)]*\)"), re.compile(r"§\d+"), re.compile(r"\*+"))
_NUMBER = re.compile(r"(?<![\w.])[+\-−]?\d+(?:\.\d+)?%?")


def numbers_in(cell: str) -> list[str]:
    """The numbers printed in a table cell, in order; inline code, link targets and ``§N`` references are not
    numbers. A sign counts only when it touches its digits (``−0.025``; the operator in ``a − b`` does not)."""
    for pattern in _SKIP:
        cell = pattern.sub(" ", cell)
    return [m.group(0).replace("−", "-") for m in _NUMBER.finditer(cell)]


def claims_rows(markdown: str) -> dict[int, dict[str, str]]:
    """The claims table of docs/paper.md: row number -> {column header: cell}."""
    head, sep, rest = markdown.partition("\n## Claims\n")
    if not sep:
        raise TableCheckError("docs/paper.md has no '## Claims' section")
    lines = [ln for ln in rest.split("\n## ", 1)[0].splitlines() if ln.startswith("|")]
    if len(lines) < 3:
        raise TableCheckError("the '## Claims' section has no table")

    def cells(line: str) -> list[str]:
        return [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]

    header = cells(lines[0])
    rows: dict[int, dict[str, str]] = {}
    for line in lines[2:]:
        row = dict(zip(header, cells(line), strict=True))
        rows[int(row["#"])] = row
    return rows


def printed_as(value: float, text: str) -> str:
    """``value`` printed the way ``text`` prints its number: the same decimals, a sign where ``text`` has one,
    ``%`` where it has one."""
    body = text.rstrip("%")
    decimals = len(body.split(".", 1)[1]) if "." in body else 0
    signed = body[0] in "+-"
    out = f"{value:+.{decimals}f}" if signed else f"{value:.{decimals}f}"
    if out.lstrip("+-").strip("0.") == "" and out.startswith("-"):
        out = "+" + out[1:] if signed else out[1:]  # no "-0.00"
    return out + ("%" if text.endswith("%") else "")


# ------------------------------------------------------------------------------------------- file readers

@cache
def _json(docs: Path, rel: str) -> Any:
    return read_json(docs / rel)


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


def _bench_mean(docs: Path, rel: str, strategy: str, key: str = "effective_ratio") -> float:
    """Mean over the bench's seeds (its rows) of ``key`` for ``strategy``."""
    return _mean([float(r[key]) for r in _json(docs, rel)["rows"] if r["strategy"] == strategy])


def _budget(docs: Path, rel: str) -> dict[str, Any]:
    from trace_agent.lab.analysis import budget_profile
    from trace_agent.strategies import Budget

    data = _json(docs, rel)
    b = data["config"]["budget"]
    budget = Budget(roots=b["roots"], continuations_per_root=b["continuations_per_root"], group_size=b["group_size"])
    return budget_profile(data["rows"], prompts=int(data["config"]["prompts"]), budget=budget)


@cache
def _runs(docs: Path, rel: str) -> dict[str, dict[int, dict[str, float]]]:
    """Per arm, per seed: the run file's figures (:func:`trace_agent.lab.preregistered` arithmetic)."""
    from trace_agent.lab.preregistered import load_runs, run_figures

    out: dict[str, dict[int, dict[str, float]]] = {}
    for r in load_runs(docs / rel):
        steps = r["steps"]
        out.setdefault(r["arm"], {})[int(r["seed"])] = {
            **run_figures(r), "predictor_s": sum(float(s["time/predictor_s"]) for s in steps),
            "step_s": sum(float(s["time/step_s"]) for s in steps), "steps": float(len(steps)),
            "units_per_step": float(r["paper_units"]) / len(steps), "multiple": float(r.get("budget_multiple", 1)),
            "warm_tasks": float((r.get("warm_start") or {}).get("tasks", 0.0)),
            **{f"shape_{i}": float(v) for i, v in enumerate(r.get("shape") or ())}}
    return out


def _paired(docs: Path, rel: str, a: str, b: str, key: str) -> list[float]:
    runs = _runs(docs, rel)
    return [runs[a][s][key] - runs[b][s][key] for s in sorted(set(runs[a]) & set(runs[b]))]


def _ci(docs: Path, rel: str, a: str, b: str, key: str, part: str) -> float:
    from trace_agent.lab.preregistered import paired_ci

    return paired_ci(_paired(docs, rel, a, b, key))[part]


def _p(docs: Path, rel: str, a: str, b: str, key: str = "auc") -> float:
    from trace_agent.lab.preregistered import paired_p

    return paired_p(_paired(docs, rel, a, b, key))


def _arm_mean(docs: Path, rel: str, arm: str, key: str) -> float:
    return _mean([v[key] for v in _runs(docs, rel)[arm].values()])


def _predictor_share(docs: Path, rel: str, arm_prefix: str) -> float:
    """Predictor seconds / step seconds, pooled over every step of the arm's runs, in percent."""
    runs = [v for arm, by_seed in _runs(docs, rel).items() if arm.startswith(arm_prefix) for v in by_seed.values()]
    return 100 * sum(v["predictor_s"] for v in runs) / sum(v["step_s"] for v in runs)


def _train_paired(docs: Path, rel: str, a: str, b: str) -> list[float]:
    rows = _json(docs, rel)["rows"]
    val = {(r["strategy"], int(r["seed"])): float(r["after"]) for r in rows}
    return [val[(a, s)] - val[(b, s)] for s in sorted({s for (st, s) in val if st == a}) if (b, s) in val]


def _sd(values: Sequence[float]) -> float:
    m = _mean(values)
    return math.sqrt(sum((v - m) ** 2 for v in values) / (len(values) - 1))


# ------------------------------------------------------------------------------------------- the figures

def _f(text: str, sources: str | tuple[str, ...], compute: Callable[[Path], float]) -> Figure:
    return Figure(text=text, sources=(sources,) if isinstance(sources, str) else sources, compute=compute)


_POOL_RATIO = "paper/math/pool/ratio/ratio.json"
_RUNS = "paper/math/runs"
_RUN_FILES = "paper/math/runs/*_s*.json*"
_SHAPE = "paper/math/shape_runs"
_SHAPE_FILES = "paper/math/shape_runs/*_s*.json*"
_BFCL10 = "paper/bfcl/ratio10/ratio.json"
_BFCL_FULL = "paper/bfcl/ratio_full_states/ratio.json"
_MATH_RATIO = "paper/math/ratio/ratio.json"
_WIKI_RATIO = "paper/wiki/ratio/ratio.json"
_BFCL_RATIO = "paper/bfcl/ratio/ratio.json"
_WIKI_PREFIXES = "paper/wiki/ratio/prefixes.json"
_WIKI48 = "paper/wiki/train48_all/train.json"
_WARM = "paper/math/warm/runs"
_WARM_FILES = "paper/math/warm/runs/*_s*.json*"
_WARM_ARMS = ("trace+warm45x4", "grpo/60x1")


def _pred(rel: str) -> Callable[[Path], dict[str, Any]]:
    return lambda d: _json(d, f"paper/{rel}/predictor.json")


def _oos(rel: str, level: str, ranking: str) -> Callable[[Path], float]:
    return lambda d: _json(d, f"paper/{rel}/contrast.json")["out_of_sample"][level][ranking]["auc"]


_CONTRAST = "paper/math/contrast/contrast.json"


def _level_key(docs: Path, field: str, key: str) -> float:
    """A share the contrast file was computed at (a key of its ``field``), in percent; NaN when it has none."""
    return 100 * float(key) if key in _json(docs, _CONTRAST)["levels"]["all anchors"]["oracle"][field] else math.nan
_OOS_FILES = tuple(f"paper/math/contrast_{s}/contrast.json" for s in ("ps006", "ps025", "all"))

#: Row number -> the numbers of its ``our figure`` cell, then of its ``verdict`` cell, in printed order.
FIGURES: dict[int, tuple[Figure, ...]] = {
    1: (
        _f("48", _POOL_RATIO, lambda d: _json(d, _POOL_RATIO)["config"]["warmup_prompts"]),
        _f("5", _POOL_RATIO, lambda d: _json(d, _POOL_RATIO)["config"]["seeds"]),
        _f("0.745", _POOL_RATIO, lambda d: _bench_mean(d, _POOL_RATIO, "trace")),
        _f("0.317", _POOL_RATIO, lambda d: _bench_mean(d, _POOL_RATIO, "grpo")),
        _f("2.35", _POOL_RATIO, lambda d: _bench_mean(d, _POOL_RATIO, "trace") / _bench_mean(d, _POOL_RATIO, "grpo")),
        _f("0.35", _RUN_FILES, lambda d: _arm_mean(d, _RUNS, "trace", "effective_ratio_step1")),
        _f("0.38", _RUN_FILES, lambda d: _arm_mean(d, _RUNS, "grpo", "effective_ratio_step1")),
        _f("0.38", _RUN_FILES, lambda d: _arm_mean(d, _RUNS, "trace", "effective_ratio")),
        _f("0.27", _RUN_FILES, lambda d: _arm_mean(d, _RUNS, "grpo", "effective_ratio")),
        _f("16", _RUN_FILES, lambda d: _arm_mean(d, _RUNS, "grpo", "steps")),
        _f("45", _WARM_FILES, lambda d: _arm_mean(d, _WARM, _WARM_ARMS[0], "warm_tasks")),
        _f("32", _WARM_FILES, lambda d: len(_paired(d, _WARM, *_WARM_ARMS, "effective_ratio_step1"))),
        _f("0.70", _WARM_FILES, lambda d: _arm_mean(d, _WARM, _WARM_ARMS[0], "effective_ratio_step1")),
        _f("0.50", _WARM_FILES, lambda d: _arm_mean(d, _WARM, _WARM_ARMS[1], "effective_ratio_step1")),
        _f("0.52", _WARM_FILES, lambda d: _arm_mean(d, _WARM, _WARM_ARMS[0], "effective_ratio")),
        _f("0.38", _WARM_FILES, lambda d: _arm_mean(d, _WARM, _WARM_ARMS[1], "effective_ratio")),
        _f("10", _WARM_FILES, lambda d: _arm_mean(d, _WARM, _WARM_ARMS[1], "steps")),
        _f("10", _BFCL10, lambda d: _json(d, _BFCL10)["config"]["seeds"]),
        _f("0.917", _BFCL10, lambda d: _bench_mean(d, _BFCL10, "trace")),
        _f("0.750", _BFCL10, lambda d: _bench_mean(d, _BFCL10, "grpo")),
        _f("0.750", _BFCL10, lambda d: _bench_mean(d, _BFCL10, "treepo")),
        _f("0.537", _BFCL_FULL, lambda d: _bench_mean(d, _BFCL_FULL, "trace")),
        _f("0.350", _BFCL_FULL, lambda d: _bench_mean(d, _BFCL_FULL, "grpo")),
        _f("18", _MATH_RATIO, lambda d: _json(d, _MATH_RATIO)["config"]["prompts"]),
        _f("0.600", _MATH_RATIO, lambda d: _bench_mean(d, _MATH_RATIO, "trace")),
        _f("0.500", _MATH_RATIO, lambda d: _bench_mean(d, _MATH_RATIO, "grpo")),
        _f("0.600", _WIKI_RATIO, lambda d: _bench_mean(d, _WIKI_RATIO, "trace")),
        _f("0.533", _WIKI_RATIO, lambda d: _bench_mean(d, _WIKI_RATIO, "grpo")),
    ),
    2: (
        _f("0.733", _BFCL_RATIO, lambda d: _bench_mean(d, _BFCL_RATIO, "treepo")),
        _f("0.767", _BFCL_RATIO, lambda d: _bench_mean(d, _BFCL_RATIO, "trace-prefix")),
        _f("0.867", _BFCL_RATIO, lambda d: _bench_mean(d, _BFCL_RATIO, "trace-root")),
        _f("0.933", _BFCL_RATIO, lambda d: _bench_mean(d, _BFCL_RATIO, "trace")),
        _f("0.28", _WIKI_PREFIXES, lambda d: _json(d, _WIKI_PREFIXES)["trace-root"]["depth>=1"]["share_mixed"]),
        _f("0.40", _WIKI_PREFIXES, lambda d: _json(d, _WIKI_PREFIXES)["trace"]["depth>=1"]["share_mixed"]),
    ),
    3: (
        _f("3.0", "paper/math/shape/shape.json",
           lambda d: _json(d, "paper/math/shape/shape.json")["shapes"]["wide"]["summary"]["trace"]["mixed_trees"]["mean"]),
        _f("2.0", "paper/math/shape/shape.json",
           lambda d: _json(d, "paper/math/shape/shape.json")["shapes"]["deep"]["summary"]["trace"]["mixed_trees"]["mean"]),
        _f("5.3", "paper/bfcl/shape/shape.json",
           lambda d: _json(d, "paper/bfcl/shape/shape.json")["shapes"]["wide"]["summary"]["trace"]["mixed_trees"]["mean"]),
        _f("3.0", "paper/bfcl/shape/shape.json",
           lambda d: _json(d, "paper/bfcl/shape/shape.json")["shapes"]["deep"]["summary"]["trace"]["mixed_trees"]["mean"]),
        _f("20", _SHAPE_FILES, lambda d: len(_paired(d, _SHAPE, "trace/24x6", "trace/48x2", "auc"))),
        _f("16", _SHAPE_FILES, lambda d: _arm_mean(d, _SHAPE, "trace/48x2", "steps")),
        _f("96", _SHAPE_FILES, lambda d: _arm_mean(d, _SHAPE, "trace/48x2", "units_per_step")),
        _f("24", _SHAPE_FILES, lambda d: _arm_mean(d, _SHAPE, "trace/24x6", "shape_0")),
        _f("6", _SHAPE_FILES, lambda d: _arm_mean(d, _SHAPE, "trace/24x6", "shape_1")),
        _f("48", _SHAPE_FILES, lambda d: _arm_mean(d, _SHAPE, "trace/48x2", "shape_0")),
        _f("2", _SHAPE_FILES, lambda d: _arm_mean(d, _SHAPE, "trace/48x2", "shape_1")),
        _f("-0.025", _SHAPE_FILES, lambda d: _ci(d, _SHAPE, "trace/24x6", "trace/48x2", "auc", "mean")),
        _f("-0.030", _SHAPE_FILES, lambda d: _ci(d, _SHAPE, "trace/24x6", "trace/48x2", "auc", "low")),
        _f("-0.019", _SHAPE_FILES, lambda d: _ci(d, _SHAPE, "trace/24x6", "trace/48x2", "auc", "high")),
    ),
    4: (
        _f("10", _BFCL_FULL, lambda d: _json(d, _BFCL_FULL)["config"]["seeds"]),
        _f("0.67", _BFCL_FULL, lambda d: _budget(d, _BFCL_FULL)["trace"]["skipped_share"]["mean"]),
        _f("0.09", _BFCL_FULL, lambda d: _budget(d, _BFCL_FULL)["trace"]["skipped_share"]["std"]),
        _f("0.50", _BFCL_FULL, lambda d: _budget(d, _BFCL_FULL)["trace"]["skip_floor"]),
        _f("6", _BFCL_FULL, lambda d: _json(d, _BFCL_FULL)["config"]["budget"]["roots"]
           // _json(d, _BFCL_FULL)["config"]["budget"]["group_size"]),
        _f("12", _BFCL_FULL, lambda d: _json(d, _BFCL_FULL)["config"]["prompts"]),
        _f("14", _BFCL_FULL, lambda d: _budget(d, _BFCL_FULL)["trace"]["deepest_continuation"]),
        _f("16", _BFCL_FULL, lambda d: _json(d, _BFCL_FULL)["config"]["max_turns"]),
        _f("6.5", _BFCL_FULL, lambda d: _budget(d, _BFCL_FULL)["trace"]["roots_per_active"]["mean"]),
        _f("13.0", _BFCL_FULL, lambda d: _budget(d, _BFCL_FULL)["trace"]["rollouts_per_active"]["mean"]
           - _budget(d, _BFCL_FULL)["trace"]["roots_per_active"]["mean"]),
    ),
    5: (
        _f("0.56", "paper/math/predictor/predictor.json",
           lambda d: _pred("math/predictor")(d)["rank_correlations"]["pooled"]["root"]),
        _f("0.29", "paper/math/predictor/predictor.json",
           lambda d: _pred("math/predictor")(d)["rank_correlations"]["pooled"]["prefix"]),
        _f("0.72", "paper/math/predictor_ps006/predictor.json",
           lambda d: _pred("math/predictor_ps006")(d)["rank_correlations"]["pooled"]["root"]),
        _f("0.16", "paper/math/predictor_ps006/predictor.json",
           lambda d: _pred("math/predictor_ps006")(d)["rank_correlations"]["pooled"]["prefix"]),
        _f("25%", "paper/math/predictor_ps025/predictor.json",
           lambda d: 100 * _pred("math/predictor_ps025")(d)["config"]["prefix_share"]),
        _f("0.73", "paper/math/predictor_ps025/predictor.json",
           lambda d: _pred("math/predictor_ps025")(d)["rank_correlations"]["pooled"]["root"]),
        _f("0.61", "paper/math/predictor_ps025/predictor.json",
           lambda d: _pred("math/predictor_ps025")(d)["rank_correlations"]["pooled"]["prefix"]),
        _f("2.09", "paper/math/predictor/predictor.json",
           lambda d: _pred("math/predictor")(d)["error_by_depth"][1]["ratio_to_prompt"]),
        _f("2.44", "paper/math/predictor_ps025/predictor.json",
           lambda d: _pred("math/predictor_ps025")(d)["error_by_depth"][1]["ratio_to_prompt"]),
        _f("-0.11", "paper/wiki/predictor/predictor.json",
           lambda d: _pred("wiki/predictor")(d)["rank_correlations"]["pooled"]["root"]),
        _f("0.01", "paper/wiki/predictor/predictor.json",
           lambda d: _pred("wiki/predictor")(d)["rank_correlations"]["pooled"]["prefix"]),
        _f("-0.04", "paper/bfcl/predictor/predictor.json",
           lambda d: _pred("bfcl/predictor")(d)["rank_correlations"]["pooled"]["root"]),
        _f("-0.03", "paper/bfcl/predictor/predictor.json",
           lambda d: _pred("bfcl/predictor")(d)["rank_correlations"]["pooled"]["prefix"]),
    ),
    6: (
        _f("90%", _CONTRAST, lambda d: 100 * _json(d, _CONTRAST)["levels"]["all anchors"]["degenerate_share"]),
        _f("8%", _CONTRAST,
           lambda d: 100 * _json(d, _CONTRAST)["levels"]["all anchors"]["oracle"]["fraction_for"]["0.8"]),
        _f("80%", _CONTRAST, lambda d: _level_key(d, "fraction_for", "0.8")),
        _f("20%", _CONTRAST, lambda d: _level_key(d, "at", "0.2")),
        _f("35%", _CONTRAST, lambda d: 100 * _json(d, _CONTRAST)["levels"]["all anchors"]["predicted"]["at"]["0.2"]),
        _f("0.74", _OOS_FILES, lambda d: min(_oos(f"math/contrast_{s}", "all anchors", "predicted")(d)
                                             for s in ("ps006", "ps025", "all"))),
        _f("0.79", _OOS_FILES, lambda d: max(_oos(f"math/contrast_{s}", "all anchors", "predicted")(d)
                                             for s in ("ps006", "ps025", "all"))),
        _f("0.85", _OOS_FILES[0], _oos("math/contrast_ps006", "all anchors", "oracle")),
        _f("4", _OOS_FILES[0],
           lambda d: _json(d, _OOS_FILES[0])["out_of_sample"]["all anchors"]["half_samples"][0]),
        _f("0.96", _OOS_FILES[0], lambda d: _json(d, _OOS_FILES[0])["levels"]["all anchors"]["oracle"]["auc"]),
        _f("0.70", _OOS_FILES, lambda d: min(_oos(f"math/contrast_{s}", "prompts", "predicted")(d)
                                             for s in ("ps006", "ps025", "all"))),
        _f("0.72", _OOS_FILES, lambda d: max(_oos(f"math/contrast_{s}", "prompts", "predicted")(d)
                                             for s in ("ps006", "ps025", "all"))),
        _f("0.72", _OOS_FILES[0], _oos("math/contrast_ps006", "prompts", "oracle")),
    ),
    7: (
        _f("20", _RUN_FILES, lambda d: len(_paired(d, _RUNS, "trace", "grpo", "final"))),
        _f("16", _RUN_FILES, lambda d: _arm_mean(d, _RUNS, "trace", "steps")),
        _f("+0.011", _RUN_FILES, lambda d: _ci(d, _RUNS, "trace", "grpo", "final", "mean")),
        _f("-0.002", _RUN_FILES, lambda d: _ci(d, _RUNS, "trace", "grpo", "final", "low")),
        _f("+0.024", _RUN_FILES, lambda d: _ci(d, _RUNS, "trace", "grpo", "final", "high")),
        _f("32", _WARM_FILES, lambda d: len(_paired(d, _WARM, *_WARM_ARMS, "auc"))),
        _f("10", _WARM_FILES, lambda d: _arm_mean(d, _WARM, _WARM_ARMS[0], "steps")),
        _f("+0.001", _WARM_FILES, lambda d: _ci(d, _WARM, *_WARM_ARMS, "auc", "mean")),
        _f("-0.005", _WARM_FILES, lambda d: _ci(d, _WARM, *_WARM_ARMS, "auc", "low")),
        _f("+0.006", _WARM_FILES, lambda d: _ci(d, _WARM, *_WARM_ARMS, "auc", "high")),
        _f("0.000", _WARM_FILES, lambda d: _ci(d, _WARM, *_WARM_ARMS, "final", "mean")),
        _f("-0.009", _WARM_FILES, lambda d: _ci(d, _WARM, *_WARM_ARMS, "final", "low")),
        _f("+0.008", _WARM_FILES, lambda d: _ci(d, _WARM, *_WARM_ARMS, "final", "high")),
        _f("10", _WIKI48, lambda d: len(_train_paired(d, _WIKI48, "trace", "grpo"))),
        _f("48", _WIKI48, lambda d: _json(d, _WIKI48)["config"]["steps"]),
        _f("+0.007", _WIKI48, lambda d: _mean(_train_paired(d, _WIKI48, "trace", "grpo"))),
        _f("0.021", _WIKI48, lambda d: _sd(_train_paired(d, _WIKI48, "trace", "grpo"))),
        _f("0.007", _WIKI48, lambda d: _sd(_train_paired(d, _WIKI48, "trace", "grpo"))
           / math.sqrt(len(_train_paired(d, _WIKI48, "trace", "grpo")))),
    ),
    8: (
        _f("20", _RUN_FILES, lambda d: min(len(v) for v in _runs(d, _RUNS).values())),
        _f("16", _RUN_FILES, lambda d: _arm_mean(d, _RUNS, "grpo", "steps")),
        _f("+0.004", _RUN_FILES, lambda d: _ci(d, _RUNS, "trace", "grpo", "auc", "mean")),
        _f("-0.003", _RUN_FILES, lambda d: _ci(d, _RUNS, "trace", "grpo", "auc", "low")),
        _f("+0.010", _RUN_FILES, lambda d: _ci(d, _RUNS, "trace", "grpo", "auc", "high")),
        _f("2", _RUN_FILES, lambda d: _arm_mean(d, _RUNS, "grpo@2x", "multiple")),
        _f("+0.012", _RUN_FILES, lambda d: _ci(d, _RUNS, "grpo@2x", "trace", "auc", "mean")),
        _f("+0.007", _RUN_FILES, lambda d: _ci(d, _RUNS, "grpo@2x", "trace", "auc", "low")),
        _f("+0.017", _RUN_FILES, lambda d: _ci(d, _RUNS, "grpo@2x", "trace", "auc", "high")),
        _f("+0.008", _RUN_FILES, lambda d: _ci(d, _RUNS, "trace", "treepo", "auc", "mean")),
        _f("+0.001", _RUN_FILES, lambda d: _ci(d, _RUNS, "trace", "treepo", "auc", "low")),
        _f("+0.014", _RUN_FILES, lambda d: _ci(d, _RUNS, "trace", "treepo", "auc", "high")),
        _f("0.03", _RUN_FILES, lambda d: _p(d, _RUNS, "trace", "treepo")),
        _f("0.38", _RUN_FILES, lambda d: _arm_mean(d, _RUNS, "trace", "effective_ratio")),
        _f("0.27", _RUN_FILES, lambda d: _arm_mean(d, _RUNS, "grpo", "effective_ratio")),
    ),
    9: (
        _f("3.0%", _RUN_FILES, lambda d: _predictor_share(d, _RUNS, "trace")),
        _f("20", _RUN_FILES, lambda d: len(_runs(d, _RUNS)["trace"])),
        _f("2.4%", _SHAPE_FILES, lambda d: _predictor_share(d, _SHAPE, "trace")),
        _f("40", _SHAPE_FILES, lambda d: sum(len(v) for v in _runs(d, _SHAPE).values())),
    ),
}

#: The secondary tests of §8 (AUC, paired over seeds), the order :func:`holm_section8` reports them in.
SECTION8_SECONDARY: tuple[tuple[str, str], ...] = (("trace", "treepo"), ("grpo@2x", "trace"), ("grpo@2x", "grpo"))


def holm_section8(docs: Path = DOCS, *, with_primary: bool = False) -> dict[str, bool]:
    """Which of §8's secondary AUC tests Holm's procedure keeps at 0.05 (over the three, or with the primary
    ``trace - grpo`` in the family)."""
    from trace_agent.lab.preregistered import holm

    tests = ((("trace", "grpo"),) if with_primary else ()) + SECTION8_SECONDARY
    kept = holm([_p(docs, _RUNS, a, b) for a, b in tests])
    return {f"{a} − {b}": k for (a, b), k in zip(tests, kept, strict=True)}


# ------------------------------------------------------------------------------------------- the check

def _source_problems(row: int, fig: Figure, docs: Path) -> list[str]:
    return [f"row {row}, {fig.text}: its source {src} matches no file under docs/"
            for src in fig.sources if not glob.glob(str(docs / src))]


def _expand(pattern: str) -> list[str]:
    """``a/{b,c}/d`` -> ``a/b/d``, ``a/c/d`` (one level of braces, as the table writes them)."""
    m = re.search(r"\{([^{}]*)\}", pattern)
    if not m:
        return [pattern]
    return [x for alt in m.group(1).split(",") for x in _expand(pattern[:m.start()] + alt + pattern[m.end():])]


def rebuilt_from_problems(row: int, cell: str, docs: Path = DOCS) -> list[str]:
    """The paths in a ``rebuilt from`` cell (inline code with a ``/``; globs and ``{a,b}`` allowed) that match
    no file under ``docs/``."""
    return [f"row {row}: 'rebuilt from' names {path}, which matches no file under docs/"
            for code in re.findall(r"`([^`]*)`", cell) if "/" in code
            for path in _expand(code) if not glob.glob(str(docs / path.rstrip("/")))]


def check_table(markdown: str, docs: Path = DOCS,
                figures: dict[int, tuple[Figure, ...]] | None = None) -> list[str]:
    """Every disagreement between the claims table in ``markdown`` and :data:`FIGURES` (empty: the table is
    rebuilt). Rows without numbers in ``our figure`` and ``verdict`` need no entry."""
    figures = FIGURES if figures is None else figures
    problems: list[str] = []
    rows = claims_rows(markdown)
    for num, row in rows.items():
        problems += rebuilt_from_problems(num, row.get("rebuilt from", ""), docs)
        printed = numbers_in(row.get("our figure", "")) + numbers_in(row.get("verdict", ""))
        expected = [f.text for f in figures.get(num, ())]
        if printed != expected:
            extra = [p for p in printed if p not in expected]
            problems.append(f"row {num}: the table prints {printed}, the figures with files behind them are "
                            f"{expected}" + (f" (no file behind {extra})" if extra else ""))
            continue
        for fig in figures.get(num, ()):
            found = _source_problems(num, fig, docs)
            if found:
                problems += found
                continue
            value = float(fig.compute(docs))
            if printed_as(value, fig.text) != fig.text:
                problems.append(f"row {num}: prints {fig.text}, its files give {printed_as(value, fig.text)} "
                                f"({value!r} from {', '.join(fig.sources)})")
    for num in figures:
        if num not in rows:
            problems.append(f"row {num} has figures but the table has no row {num}")
    return problems
