"""Statistics of rollout trees and batches: outcome mix, contrast pairs, branch depths, costs.

:func:`tree_stats` (also :meth:`RolloutTree.stats <trace_agent.tree.RolloutTree.stats>`) counts one
tree; :func:`batch_stats` sums a batch and adds the paper's headline figure, the *effective
ratio* (mixed trees / active prompts). Both share the counted fields of :class:`RolloutCounts`,
declared once. :func:`prefix_mixing` counts, per strategy, the branch points below the prompt whose
continuations still had both outcomes. Success is :func:`trace_agent.success.is_success`; paper units are
:func:`trace_agent.budget.spent_units`.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING

from trace_agent.budget import PAPER_CONTINUATION_COST, spent_units

if TYPE_CHECKING:  # pragma: no cover
    from trace_agent.tree import RolloutTree

__all__ = ["RolloutCounts", "TreeStats", "BatchStats", "tree_stats", "batch_stats", "prefix_mixing"]


@dataclass(frozen=True, kw_only=True)
class RolloutCounts:
    """What a set of rollouts holds and cost; the fields a tree's and a batch's statistics share.

    Attributes:
        contrast_pairs: (success, failure) leaf pairs within a tree (summed over a batch).
        leaves: finished episodes.
        successes: leaves that are successes.
        root_rollouts: rollouts from the prompt.
        continuations: rollouts from a visited prefix.
        branch_depths: depth -> number of nodes with two or more children there.
        continuation_depths: depth -> continuations that started there.
        generated_tokens: tokens the policy generated.
        observation_tokens: tokens appended after generations (tool results, chat markup).
        env_steps: env steps (one per non-root node).
        paper_units: the paper's cost (:func:`~trace_agent.budget.spent_units`).
    """

    contrast_pairs: int
    leaves: int
    successes: int
    root_rollouts: int
    continuations: int
    branch_depths: dict[int, int]
    continuation_depths: dict[int, int]
    generated_tokens: int
    observation_tokens: int
    env_steps: int
    paper_units: float


#: The additive scalar fields of :class:`RolloutCounts` (a batch's value is the sum over its trees).
_SUMMED = tuple(f.name for f in fields(RolloutCounts) if f.type in ("int", "float"))
#: The depth histograms of :class:`RolloutCounts` (a batch's is the merged count).
_HISTOGRAMS = tuple(f.name for f in fields(RolloutCounts) if f.name.endswith("_depths"))


@dataclass(frozen=True, kw_only=True)
class TreeStats(RolloutCounts):
    """Per-tree statistics (see :func:`tree_stats`): the counts plus the tree's identity and shape."""

    prompt_id: str
    nodes: int
    failures: int
    mixed: bool
    max_depth: int


@dataclass(frozen=True, kw_only=True)
class BatchStats(RolloutCounts):
    """Per-batch statistics (see :func:`batch_stats`).

    ``effective_ratio`` = mixed trees / active prompts (trees with at least one leaf),
    NaN when no prompt is active.
    """

    trees: int
    active_prompts: int
    mixed_trees: int
    effective_ratio: float

    def as_dict(self) -> dict[str, float]:
        """Flat scalar metrics (histograms as ``branch_depth_<d>`` / ``continuation_depth_<d>``)."""
        out: dict[str, float] = {name: float(getattr(self, name)) for name in _AS_DICT_ORDER}
        out.update({f"branch_depth_{d}": float(c) for d, c in sorted(self.branch_depths.items())})
        out.update({f"continuation_depth_{d}": float(c) for d, c in sorted(self.continuation_depths.items())})
        return out


#: Key order of :meth:`BatchStats.as_dict` (the batch's own figures first, then the counts).
_AS_DICT_ORDER = ("trees", "active_prompts", "mixed_trees", "effective_ratio", *_SUMMED)


def tree_stats(tree: RolloutTree, *, continuation_cost: float = PAPER_CONTINUATION_COST) -> TreeStats:
    """Counts, outcome mix, contrast pairs, branch-point depth histogram and costs of ``tree``.

    ``paper_units`` charges 1 per rollout from the root and ``continuation_cost`` per
    continuation (:func:`~trace_agent.budget.spent_units`).
    """
    s, f = tree.outcome_counts()
    rollouts = tree.rollouts()
    roots = sum(1 for r in rollouts if r.start_depth == 0)
    conts = len(rollouts) - roots
    return TreeStats(
        prompt_id=tree.prompt_id, nodes=len(tree.nodes), leaves=s + f, successes=s, failures=f,
        mixed=s > 0 and f > 0, contrast_pairs=s * f, root_rollouts=roots, continuations=conts,
        max_depth=max(n.depth for n in tree.nodes),
        branch_depths=dict(sorted(Counter(n.depth for n in tree.branch_points()).items())),
        continuation_depths=dict(sorted(Counter(r.start_depth for r in rollouts if r.start_depth > 0).items())),
        generated_tokens=sum(r.generated_tokens for r in rollouts),
        observation_tokens=sum(r.observation_tokens for r in rollouts),
        env_steps=len(tree.nodes) - 1,
        paper_units=spent_units(roots, conts, continuation_cost=continuation_cost),
    )


def batch_stats(trees: Iterable[RolloutTree], *, continuation_cost: float = PAPER_CONTINUATION_COST) -> BatchStats:
    """Batch statistics: effective ratio (mixed trees / active prompts), contrast pairs, depth histograms, costs."""
    per = [tree_stats(t, continuation_cost=continuation_cost) for t in trees]
    active = sum(1 for s in per if s.leaves > 0)
    mixed = sum(1 for s in per if s.mixed)
    histograms: dict[str, Counter[int]] = {name: Counter() for name in _HISTOGRAMS}
    for s in per:
        for name, counter in histograms.items():
            counter.update(getattr(s, name))
    return BatchStats(
        trees=len(per), active_prompts=active, mixed_trees=mixed,
        effective_ratio=mixed / active if active else math.nan,
        **{name: sum(getattr(s, name) for s in per) for name in _SUMMED},
        **{name: dict(sorted(counter.items())) for name, counter in histograms.items()},
    )


def prefix_mixing(trees: Sequence[RolloutTree]) -> dict[str, dict[str, object]]:
    """Per strategy (``tree.metadata["strategy"]``): the branch points at depth >= 1 and how many are mixed.

    ``{"by_depth": {depth: {"branch_points", "mixed"}}, "depth>=1": {"branch_points", "mixed", "share_mixed"},
    "continuations_vs_first_child": {"leaves", "flipped"}}``; a mixed branch point at depth d means the
    outcome was still undecided after the policy's d-th turn.
    """
    out: dict[str, dict[str, object]] = {}
    counts: dict[str, dict[int, list[int]]] = defaultdict(lambda: defaultdict(lambda: [0, 0]))
    flips: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for tree in trees:
        strategy = str(tree.metadata.get("strategy", "?"))
        by_depth, flip = counts[strategy], flips[strategy]  # a strategy without deep branch points: zeros
        for node in tree.branch_points():
            if node.depth < 1:
                continue
            mixed = tree.is_mixed(node)
            cell = by_depth[node.depth]
            cell[0] += 1
            cell[1] += int(mixed)
            first = node.children[0].leaves()
            base = first[0].is_success if first else None
            for child in node.children[1:]:
                for leaf in child.leaves():
                    flip[0] += 1
                    flip[1] += int(base is not None and leaf.is_success != base)
    for strategy, by_depth in counts.items():
        n = sum(c[0] for c in by_depth.values())
        m = sum(c[1] for c in by_depth.values())
        out[strategy] = {
            "by_depth": {str(d): {"branch_points": c[0], "mixed": c[1]} for d, c in sorted(by_depth.items())},
            "depth>=1": {"branch_points": n, "mixed": m, "share_mixed": m / n if n else None},
            "continuations_vs_first_child": {"leaves": flips[strategy][0], "flipped": flips[strategy][1]},
        }
    return out
