"""Pictures of rollout trees and allocations (matplotlib, Agg canvas; no global backend change).

matplotlib is imported inside the functions, so importing this module is cheap.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from trace_agent.tree import Node, RolloutTree

__all__ = ["tree_layout", "plot_tree", "plot_allocation"]

_SUCCESS = "#2e9d4a"
_FAILURE = "#d1453b"
_OPEN = "#9a9a9a"


def tree_layout(tree: RolloutTree) -> dict[int, tuple[float, float]]:
    """(x, y) per node id: x = depth, leaves on consecutive rows, a parent at its children's mean row."""
    pos: dict[int, tuple[float, float]] = {}
    row = 0

    def place(node: Node) -> float:
        nonlocal row
        if not node.children:
            y = float(row)
            row += 1
        else:
            ys = [place(c) for c in node.children]
            y = sum(ys) / len(ys)
        pos[node.node_id] = (float(node.depth), y)
        return y

    place(tree.root)  # recursion depth = number of turns (tens), not the node count
    return pos


def plot_tree(tree: RolloutTree, path: str | Path, *, title: str | None = None, dpi: int = 100) -> Path:
    """Draw ``tree`` to a PNG at ``path`` and return the path.

    Leaves are green (success) or red (failure); inner nodes are coloured by their
    bottom-up target on a red-to-green scale and grey when nothing below them finished.
    Each node is labelled with its predicted value ``v^`` when it has one, and edges
    that start a continuation are dashed.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.colors import LinearSegmentedColormap
    from matplotlib.figure import Figure

    pos = tree_layout(tree)
    targets, counts = tree.targets()
    n_rows = max(y for _, y in pos.values()) + 1
    depth = max(x for x, _ in pos.values()) + 1
    fig = Figure(figsize=(min(2.0 + 1.6 * depth, 30.0), min(1.5 + 0.45 * n_rows, 40.0)), dpi=dpi)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    cmap = LinearSegmentedColormap.from_list("outcome", [_FAILURE, "#f0c419", _SUCCESS])
    continuation_start = {r.rollout_id: r.start_node for r in tree.rollouts() if r.start_depth > 0}
    for node in tree.nodes:
        x, y = pos[node.node_id]
        for child in node.children:
            cx, cy = pos[child.node_id]
            dashed = continuation_start.get(child.rollout_id) == node.node_id
            ax.plot([x, cx], [y, cy], color="#777777", lw=1.0, ls="--" if dashed else "-", zorder=1)
    for node in tree.nodes:
        x, y = pos[node.node_id]
        if node.is_leaf:
            color = _SUCCESS if node.is_success else _FAILURE
            marker = "s"
        elif counts[node.node_id]:
            color = cmap(float(targets[node.node_id]))
            marker = "o"
        else:
            color, marker = _OPEN, "o"
        ax.scatter([x], [y], s=160 if node.is_root else 90, c=[color], marker=marker, edgecolors="black",
                   linewidths=0.6, zorder=2)
        label = "" if node.value is None else f"v^={node.value:.2f}"
        if node.is_leaf:
            label = (label + " " if label else "") + f"r={node.reward:g}"
        if label:
            ax.annotate(label, (x, y), xytext=(6, 6), textcoords="offset points", fontsize=7)
    s, f = tree.outcome_counts()
    ax.set_title(title or f"{tree.prompt_id}: {s} success / {f} failure" + (" (mixed)" if s and f else ""))
    ax.set_xlabel("turn (depth)")
    ax.set_yticks([])
    ax.set_xticks(range(int(depth)))
    ax.invert_yaxis()
    ax.margins(x=0.15, y=0.1)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png")
    return path


def plot_allocation(
    budgets: Sequence[int],
    allocations: Sequence[Sequence[int]],
    labels: Sequence[str],
    path: str | Path,
    *,
    title: str = "Root allocation as the budget grows",
    dpi: int = 120,
) -> Path:
    """Stacked bars: for each budget, the rollouts each candidate gets (``allocations[i][x]``)."""
    import numpy as np
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    alloc = np.asarray(allocations, dtype=float)
    if alloc.shape != (len(budgets), len(labels)):
        raise ValueError(f"allocations has shape {alloc.shape}, expected ({len(budgets)}, {len(labels)})")
    fig = Figure(figsize=(9, 4.8), dpi=dpi)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    bottom = np.zeros(len(budgets))
    for i, label in enumerate(labels):
        ax.bar(budgets, alloc[:, i], bottom=bottom, label=label, width=0.85)
        bottom += alloc[:, i]
    ax.set_xlabel("root budget (rollouts)")
    ax.set_ylabel("rollouts per prompt (stacked)")
    ax.set_title(title)
    ax.legend(title="success rate", fontsize=8, loc="upper left")
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png")
    return path
