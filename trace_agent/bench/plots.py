"""The bench's figures (:meth:`trace_agent.bench.result.BenchResult.write`): ``bench.png`` (effective ratio, leaf success,
contrast pairs and generated tokens per strategy: mean ± std over seeds, each seed a dot), ``effective_ratio.png``
and ``branch_depths.png`` (branch points per batch by depth: the table's "branch depths" column)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trace_agent.bench.result import BenchResult

__all__ = ["BENCH_PANELS", "plot_result"]


#: (row key, axis label) of the panels of ``bench.png``.
BENCH_PANELS: tuple[tuple[str, str], ...] = (
    ("effective_ratio", "effective ratio (mixed / active)"),
    ("success_rate", "leaf success rate"),
    ("contrast_pairs", "contrast pairs per batch"),
    ("generated_tokens", "generated tokens per batch (cost)"),
)


def _spread_panel(ax: Any, result: BenchResult, names: Sequence[str], key: str, label: str) -> None:
    """Bars at the mean over seeds, error bars of one std, each seed's value as a dot."""
    means = [result.summary[n][key]["mean"] for n in names]
    stds = [result.summary[n][key]["std"] for n in names]
    ax.bar(range(len(names)), [0.0 if math.isnan(m) else m for m in means], yerr=stds, color="#5b8cc0",
           capsize=4, alpha=0.85)
    for i, n in enumerate(names):
        vals = [float(r[key]) for r in result.rows if r["strategy"] == n and math.isfinite(float(r[key]))]
        ax.scatter([i] * len(vals), vals, color="black", s=8, zorder=3)
    ax.set_xticks(range(len(names)), names, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel(label, fontsize=8)
    ax.grid(axis="y", alpha=0.3)


def _title(result: BenchResult) -> str:
    b = result.config.budget
    return (f"{result.config.env_id.split('/')[-1]}: (M, N) = ({b.roots}, {b.continuations_per_root}), "
            f"group {b.group_size}, {result.config.seeds} seeds (mean ± std, dots = seeds)")


def plot_result(result: BenchResult, out_dir: Path) -> list[Path]:
    """``bench.png`` (four metrics with spread), ``effective_ratio.png`` and ``branch_depths.png``; returns the paths.

    The depth plot shows the same quantity as the table's "branch depths" column: branch points
    (nodes with more than one child) per batch by depth, averaged over seeds.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    names = list(result.summary)
    width = max(7.0, 0.9 * len(names) + 2.0)
    paths = []

    fig = Figure(figsize=(width * 1.6, 6.8), layout="constrained")
    FigureCanvasAgg(fig)
    for i, (key, label) in enumerate(BENCH_PANELS):
        ax = fig.add_subplot(2, 2, i + 1)
        _spread_panel(ax, result, names, key, label)
        if key in ("effective_ratio", "success_rate"):
            ax.set_ylim(0, 1.05)
    fig.suptitle(_title(result), fontsize=10)
    paths.append(out_dir / "bench.png")
    fig.savefig(paths[-1], dpi=100)

    fig = Figure(figsize=(width, 4.0), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    _spread_panel(ax, result, names, "effective_ratio", "effective ratio (mixed / active)")
    ax.set_ylim(0, 1.05)
    ax.set_title(_title(result), fontsize=9)
    paths.append(out_dir / "effective_ratio.png")
    fig.savefig(paths[-1], dpi=110)

    fig = Figure(figsize=(width, 4.0), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    depths = sorted({int(d) for n in names for d in result.summary[n]["branch_depths"]})
    bar_w = 0.8 / max(1, len(depths))
    for j, d in enumerate(depths):
        ax.bar([i - 0.4 + (j + 0.5) * bar_w for i in range(len(names))],
               [result.summary[n]["branch_depths"].get(str(d), 0.0) for n in names], width=bar_w,
               label=f"depth {d}")
    ax.set_xticks(range(len(names)), names, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("branch points per batch (mean over seeds)", fontsize=8)
    ax.set_title("branch points by depth (the table's branch depths column)", fontsize=9)
    if depths:
        ax.legend(fontsize=8)
    else:
        ax.text(0.5, 0.5, "no strategy branched", ha="center", va="center", transform=ax.transAxes)
    paths.append(out_dir / "branch_depths.png")
    fig.savefig(paths[-1], dpi=110)
    return paths
