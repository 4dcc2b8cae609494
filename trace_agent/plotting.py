"""Pictures of rollout trees and allocations (matplotlib, Agg canvas; no global backend change), and ``show-tree``.

matplotlib is imported inside the functions, so importing this module is cheap.

``trace-gym show-tree PATH`` draws saved trees to PNG: ``PATH`` is a run directory (its
``trees/step_<k>.jsonl``, written by ``trace-gym train``; the newest step unless ``--step``),
a bench directory (its ``trees.jsonl``, written by ``trace-gym bench``; ``--strategy`` and
``--seed`` pick a batch) or a ``.jsonl`` / ``.parquet`` tree file. Each picture carries a legend
of its colours, markers and dashed edges (:data:`TREE_LEGEND`).
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from trace_agent.contexts import format_messages
from trace_agent.tree import Node, RolloutTree

__all__ = ["TREE_LEGEND", "TREE_LEGEND_TITLE", "tree_layout", "tree_figure", "plot_tree", "plot_allocation",
           "tree_transcript", "find_trees", "show_trees",
           "add_show_tree_parser"]

_SUCCESS = "#2e9d4a"
_FAILURE = "#d1453b"
_OPEN = "#9a9a9a"


def tree_layout(tree: RolloutTree) -> dict[int, tuple[float, float]]:
    """(x, y) per node id: x = depth, leaves on consecutive rows, a parent at its children's mean row."""
    pos: dict[int, tuple[float, float]] = {}
    row = 0
    stack: list[tuple[Node, bool]] = [(tree.root, False)]
    while stack:  # post-order without recursion: a chain of any length
        node, children_done = stack.pop()
        if not node.children:
            pos[node.node_id] = (float(node.depth), float(row))
            row += 1
        elif children_done:
            ys = [pos[c.node_id][1] for c in node.children]
            pos[node.node_id] = (float(node.depth), sum(ys) / len(ys))
        else:
            stack.append((node, True))
            stack.extend((c, False) for c in reversed(node.children))
    return pos


#: The legend of :func:`tree_figure`: (marker or line style, colour, text), in drawing order.
TREE_LEGEND: tuple[tuple[str, str, str], ...] = (
    ("s", _SUCCESS, "leaf: success"),
    ("s", _FAILURE, "leaf: failure"),
    ("o", "#f0c419", "inner node: share of successes below (red 0 .. green 1)"),
    ("o", _OPEN, "inner node: nothing below it finished"),
    ("-", "#777777", "turn"),
    ("--", "#777777", "turn that starts a continuation (a branch)"),
)

#: The legend's title: what the node labels mean.
TREE_LEGEND_TITLE = "v^ predicted success, r reward"


def tree_figure(tree: RolloutTree, *, title: str | None = None, dpi: int = 100) -> Any:
    """A matplotlib ``Figure`` (Agg canvas) of ``tree``, with a legend (:data:`TREE_LEGEND`).

    Leaves are green (success) or red (failure) squares; inner nodes are circles coloured by their
    bottom-up target on a red-to-green scale and grey when nothing below them finished.
    Each node is labelled with its predicted value ``v^`` when it has one (leaves also with
    their reward ``r``), and edges that start a continuation are dashed.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.colors import LinearSegmentedColormap
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D

    pos = tree_layout(tree)
    targets, counts = tree.targets()
    n_rows = max(y for _, y in pos.values()) + 1
    depth = max(x for x, _ in pos.values()) + 1
    fig = Figure(figsize=(min(2.0 + 1.6 * depth, 30.0) + 3.2, min(1.5 + 0.45 * n_rows, 40.0) + 0.5), dpi=dpi)
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
    handles = [Line2D([], [], color=color, ls=style, lw=1.0) if style in ("-", "--") else
               Line2D([], [], ls="", marker=style, markersize=8, markerfacecolor=color, markeredgecolor="black",
                      markeredgewidth=0.6)
               for style, color, _ in TREE_LEGEND]
    ax.legend(handles, [text for *_, text in TREE_LEGEND], title=TREE_LEGEND_TITLE, fontsize=7,
              title_fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0, frameon=False)
    s, f = tree.outcome_counts()
    ax.set_title(title or f"{tree.prompt_id}: {s} success / {f} failure" + (" (mixed)" if s and f else ""))
    ax.set_xlabel("turn (depth)")
    ax.set_yticks([])
    ax.set_xticks(range(int(depth)))
    ax.invert_yaxis()
    ax.margins(x=0.15, y=0.1)
    fig.tight_layout()
    return fig


def plot_tree(tree: RolloutTree, path: str | Path, *, title: str | None = None, dpi: int = 100) -> Path:
    """Draw ``tree`` (:func:`tree_figure`, legend included) to a PNG at ``path`` and return the path."""
    fig = tree_figure(tree, title=title, dpi=dpi)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png", bbox_inches="tight")
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


def tree_transcript(tree: RolloutTree, *, max_chars: int = 4000) -> str:
    """The prompt, then the path of the best and of the worst leaf (text for TensorBoard / W&B samples)."""
    leaves = sorted(tree.leaves(), key=lambda n: (n.reward or 0.0, -n.node_id), reverse=True)
    s, f = tree.outcome_counts()
    parts = [f"{tree.prompt_id}: {s} success / {f} failure", format_messages(tree.root.messages)]
    picks = [("best", leaves[0])] + ([("worst", leaves[-1])] if len(leaves) > 1 else [])
    for label, leaf in picks:
        body = format_messages(leaf.history())
        if len(body) > max_chars:
            body = body[:max_chars] + f"... [{len(body) - max_chars} more characters]"
        parts.append(f"--- {label} leaf (node {leaf.node_id}, reward {leaf.reward:g}) ---\n{body}")
    return "\n\n".join(parts)


# --------------------------------------------------------------------------------------------------
# show-tree


def find_trees(path: str | Path, *, step: int | None = None) -> tuple[list[RolloutTree], str]:
    """Trees saved at ``path`` (run dir, bench dir or tree file) and a label of where they came from.

    Raises ``FileNotFoundError`` with what to do when there are none.
    """
    trees, label = _found_trees(path, step=step)
    return list(trees), label


def _found_trees(path: str | Path, *, step: int | None = None) -> tuple[Iterable[RolloutTree], str]:
    """:func:`find_trees`, with a JSONL file's trees read one at a time (:func:`~trace_agent.tree_io.iter_jsonl`)."""
    from trace_agent.tree_io import iter_jsonl, load_parquet

    p = Path(path)
    if p.is_file():
        trees = load_parquet(p) if p.suffix == ".parquet" else iter_jsonl(p)
        return trees, p.stem
    if (p / "trees.jsonl").is_file():  # a bench directory
        return iter_jsonl(p / "trees.jsonl"), "bench"
    files = sorted((p / "trees").glob("step_*.jsonl"))
    if not files:
        what = "a run directory (trees/step_<k>.jsonl)" if (p / "config.yaml").is_file() else "a run or bench directory"
        raise FileNotFoundError(f"no saved trees in {p}: expected {what}; runs save them with log.save_trees "
                                f"(on by default), the bench writes trees.jsonl")
    if step is not None:
        chosen = [f for f in files if f.stem == f"step_{step:06d}"]
        if not chosen:
            steps = ", ".join(str(int(f.stem.split("_")[1])) for f in files)
            raise FileNotFoundError(f"no trees of step {step} in {p}/trees (saved steps: {steps})")
        files = chosen
    return iter_jsonl(files[-1]), files[-1].stem


def show_trees(path: str | Path, out_dir: str | Path | None = None, *, step: int | None = None,
               prompt: str | None = None, strategy: str | None = None, seed: int | None = None,
               limit: int = 4, mixed_only: bool = False) -> list[Path]:
    """Draw up to ``limit`` trees saved at ``path`` (filtered) to PNGs in ``out_dir``; returns their paths.

    Trees are read within :class:`~trace_envs.limits.ReadLimits` (:mod:`trace_agent.tree_io`), a JSONL file one
    tree at a time (only the ``limit`` drawn are kept), and a tree of more than ``draw_nodes`` nodes is refused
    (:class:`~trace_agent.errors.TreeError`) before anything is drawn.
    """
    trees, label = _found_trees(path, step=step)
    chosen: list[RolloutTree] = []
    seen = 0
    for t in trees:  # one tree at a time from a JSONL file; only the ones drawn are kept
        seen += 1
        if (len(chosen) < limit and (prompt is None or t.prompt_id == prompt or t.task_id == prompt)
                and (strategy is None or t.metadata.get("strategy") == strategy)
                and (seed is None or t.metadata.get("seed") == seed)
                and (not mixed_only or t.is_mixed())):
            chosen.append(t)
    if not chosen:
        raise FileNotFoundError(f"none of the {seen} trees at {path} match the filters")
    from trace_agent.errors import TreeError
    from trace_envs.limits import limit_hint, read_limits

    most = read_limits().draw_nodes
    for tree in chosen[:limit]:
        if len(tree.nodes) > most:
            raise TreeError(f"tree {tree.prompt_id} at {path} has {len(tree.nodes)} nodes, more than the {most} a "
                            f"picture shows ({limit_hint('draw_nodes')}); trace-gym export reads trees of any size")
    base = Path(path)
    out = Path(out_dir) if out_dir is not None else (base.parent if base.is_file() else base) / "tree_pictures"
    paths = []
    for i, tree in enumerate(chosen[:limit]):
        tag = "_".join(str(x) for x in (label, tree.metadata.get("strategy"), tree.metadata.get("seed"), tree.prompt_id)
                       if x is not None)
        name = re.sub(r"[^A-Za-z0-9_.-]+", "-", tag)[:120] + f"_{i}.png"
        where = f" ({tree.metadata['strategy']}, seed {tree.metadata.get('seed')})" if "strategy" in tree.metadata else ""
        s, f = tree.outcome_counts()
        title = f"{label} {tree.prompt_id}{where}: {s} success / {f} failure" + (" (mixed)" if s and f else "")
        paths.append(plot_tree(tree, out / name, title=title))
    return paths


def _show_tree_main(args: argparse.Namespace) -> int:
    paths = show_trees(args.path, args.out, step=args.step, prompt=args.prompt, strategy=args.strategy,
                       seed=args.seed, limit=args.max, mixed_only=args.mixed)
    for p in paths:
        print(p)
    return 0


def add_show_tree_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``show-tree`` to a ``trace-gym`` subparsers object."""
    p = subparsers.add_parser("show-tree", help="draw saved rollout trees (from a run or a bench) to PNG",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("path", help="run directory, bench directory, or a trees .jsonl / .parquet file")
    p.add_argument("--out", help="where the PNGs go (default: <path>/tree_pictures)")
    p.add_argument("--step", type=int, help="run: the step whose trees to draw (default: the newest saved)")
    p.add_argument("--prompt", help="only the tree of this prompt / task id")
    p.add_argument("--strategy", help="bench: only trees of this strategy")
    p.add_argument("--seed", type=int, help="bench: only trees of this seed")
    p.add_argument("--mixed", action="store_true", help="only mixed trees (a success and a failure)")
    p.add_argument("--max", type=int, default=4, help="most trees drawn (default 4)")
    p.set_defaults(func=_show_tree_main)
    return p
