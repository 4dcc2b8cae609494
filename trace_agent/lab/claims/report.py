"""A claim's outputs: its JSON, its Markdown table (printed too) and its figures, and the pieces they share."""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from trace_agent.bench import BenchConfig, BenchResult
from trace_agent.lab.analysis import spread
from trace_agent.lab.claims.settings import PAPER
from trace_agent.lab.preregistered import fmt
from trace_agent.lab.run_data import REPO_ROOT, portable, portable_text


def fmt_spread(s: dict[str, float], digits: int = 3) -> str:
    """A :func:`~trace_agent.lab.analysis.spread` as ``mean ± sd [min, max]`` (mean and sd to ``digits``)."""
    return f"{fmt(s['mean'], digits)} ± {fmt(s['std'], digits)} [{fmt(s['min'], 2)}, {fmt(s['max'], 2)}]"


def claim_header(claim: str, args: argparse.Namespace, config: BenchConfig | None) -> list[str]:
    """The Markdown lines a claim's table starts with: the paper's figure, the command, and the setting of
    ``config`` (the rows' own command too when they come from ``--bench-json``)."""
    lines = [f"### {claim}", "", f"Paper: {PAPER[claim]}.", "", f"Command: `{args.command_line}`", ""]
    if getattr(args, "bench_json", None) and config is not None:
        lines += [f"Rows from `{args.bench_json}`, measured by: `{config.command}`", ""]
    if config is not None:
        b = config.budget
        policy = "" if getattr(args, "bench_json", None) else f"policy `{args.policy}`, "
        lines += [f"Env `{config.env_id}`, {policy}{config.seeds} seeds (0..{config.seeds - 1}), pool of "
                  f"{config.prompts} candidate prompts, budget (M, N) = ({b.roots}, {b.continuations_per_root}), group "
                  f"{b.group_size} (at most {b.max_active} active prompts), {b.paper_units:g} paper units per batch; "
                  f"predictor warmed up on {config.warmup_prompts} other tasks; max {config.max_turns} turns, "
                  f"{config.rollout.sampling.max_new_tokens} new tokens, "
                  f"temperature {config.rollout.sampling.temperature:g}. "
                  "Mean ± sample sd over seeds [min, max].", ""]
    return lines


def write_claim(out: str | Path, claim: str, data: dict[str, Any], markdown: str,
                figures: Sequence[Callable[[Path], Path]] = ()) -> list[Path]:
    """``<claim>.json``, ``<claim>.md`` and each figure under ``out``; prints the Markdown; returns the paths.
    The JSON and Markdown hold no machine paths (:func:`trace_agent.lab.run_data.portable`)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"{claim}.json", out / f"{claim}.md"]
    record = json.loads(json.dumps({"claim": claim, "paper": PAPER[claim], **data}, default=_jsonable, allow_nan=True))
    paths[0].write_text(json.dumps(portable(record, REPO_ROOT), separators=(",", ":"), allow_nan=True))
    markdown = portable_text(markdown, REPO_ROOT)
    paths[1].write_text(markdown)
    paths += [make(out) for make in figures]
    print(markdown)
    print("wrote " + ", ".join(str(p) for p in paths))
    return paths


def _jsonable(obj: Any) -> Any:
    if hasattr(obj, "item"):
        return obj.item()
    return str(obj)


def new_figure(width: float = 7.0, height: float = 4.0) -> Any:
    """A matplotlib Figure of ``width`` x ``height`` inches on the Agg canvas (no display, no pyplot state)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def bar_plot(path: Path, groups: dict[str, list[float]], ylabel: str, title: str) -> Path:
    """Bars at the mean of each group, an error bar of one sd, every value as a dot."""
    fig = new_figure(max(6.0, 1.1 * len(groups) + 2.0))
    ax = fig.add_subplot(1, 1, 1)
    names = list(groups)
    for i, n in enumerate(names):
        s = spread(groups[n])
        ax.bar(i, 0.0 if math.isnan(s["mean"]) else s["mean"], yerr=0.0 if math.isnan(s["std"]) else s["std"],
               color="#5b8cc0", capsize=4, alpha=0.85)
        ax.scatter([i] * len(groups[n]), groups[n], color="black", s=10, zorder=3)
    ax.set_xticks(range(len(names)), names, rotation=20, ha="right", fontsize=8)
    ax.set_ylabel(ylabel, fontsize=9)
    ax.set_ylim(0, 1.05)
    ax.set_title(title, fontsize=9)
    ax.grid(axis="y", alpha=0.3)
    fig.savefig(path, dpi=110)
    return path


def per_seed_values(result: BenchResult, key: str = "effective_ratio") -> dict[str, list[float]]:
    """Per strategy, the row value ``key`` of each seed, in row order."""
    out: dict[str, list[float]] = {}
    for r in result.rows:
        out.setdefault(r["strategy"], []).append(float(r[key]))
    return out


def ratio_table(result: BenchResult, label: Callable[[str], str] | None = None) -> list[str]:
    """Markdown rows of the effective ratio per strategy (``label(name)``: a stage column), then the comparisons."""
    seeds = per_seed_values(result)
    head = "| strategy |" + (" stage |" if label else "") + " effective ratio | per seed | mixed / active | skipped | " \
        "contrast pairs | paper units | gen. tokens |"
    lines = [head, "|---|" + ("---|" if label else "") + "---|---|---:|---:|---:|---:|---:|"]
    for name, s in result.summary.items():
        lines.append(f"| {name} |" + (f" {label(name)} |" if label else "")
                     + f" {fmt_spread(s['effective_ratio'])} | {' / '.join(fmt(x, 2) for x in seeds[name])} "
                     f"| {s['mixed_trees']['mean']:.1f} / {s['active_prompts']['mean']:.1f} | {s['skipped']['mean']:.1f} "
                     f"| {s['contrast_pairs']['mean']:.1f} | {s['paper_units']['mean']:.1f} "
                     f"| {s['generated_tokens']['mean']:.0f} |")
    comp = result.comparisons()
    if comp:
        lines += ["", "On mean effective ratio: " + ", ".join(f"{k} = {fmt(v, 2)}" for k, v in comp.items())]
    return lines


def rows_data(result: BenchResult) -> dict[str, Any]:
    """A bench result as a claim's JSON data: config, rows, summary, comparisons, the predictor's measured metrics."""
    return {"config": json.loads(result.to_json())["config"], "rows": list(result.rows), "summary": result.summary,
            "comparisons": result.comparisons(), "predictor": result.predictor.get("measured", {})}
