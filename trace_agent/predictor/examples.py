"""Online training data and metrics: finished trees -> (contexts, targets, weights), prediction quality.

:func:`tree_examples` turns finished trees into examples: each node's bottom-up target
(mean leaf reward below it, :meth:`RolloutTree.targets`) weighted by its leaf count.
:func:`refresh_predictor` is step 4 of the loop: it scores every example first (the honest,
pre-update metrics: MSE, Brier, Spearman and MSE at root and prefix level, MSE by depth),
then updates on a batch whose share of prefix examples is a setting: the paper's predictor
batches are mostly prompt-level, about 6% prefixes (:data:`PAPER_PREFIX_SHARE`; docs/design.md,
"Objectives"), while every inner node of a tree would make prefixes 80-91% of the examples,
and the root predictions are what drive stage 1 (root allocation).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

from trace_agent.options import PREDICTOR_PREFIXES, PredictorPrefixes, either
from trace_agent.predictor.base import PAPER_PREFIX_SHARE, SuccessPredictor, checked_predictions
from trace_agent.tree import RolloutTree, bottom_up_targets

__all__ = [
    "TreeExamples",
    "tree_examples",
    "spearman",
    "prediction_metrics",
    "refresh_predictor",
]


@dataclass(frozen=True, kw_only=True)
class TreeExamples:
    """Training examples from finished trees, one per node kept.

    ``targets`` is the mean leaf reward below the node, ``weights`` its leaf count,
    ``second_moments`` the mean squared leaf reward (for the Brier score), ``depths`` the
    node depth (0 = prompt).
    """

    contexts: tuple[str, ...]
    targets: NDArray[np.float64]
    weights: NDArray[np.float64]
    second_moments: NDArray[np.float64]
    depths: NDArray[np.int64]
    prompt_ids: tuple[str, ...]
    node_ids: NDArray[np.int64]

    def __len__(self) -> int:
        return len(self.contexts)

    @property
    def is_root(self) -> NDArray[np.bool_]:
        return self.depths == 0


def tree_examples(
    trees: Iterable[RolloutTree],
    *,
    prefixes: PredictorPrefixes = "all",
    include_leaves: bool = False,
    prefix_share: float | None = None,
    seed: int = 0,
) -> TreeExamples:
    """Every node's bottom-up target, weighted by its leaf count.

    Args:
        trees: finished trees (nodes without a finished leaf below are skipped).
        prefixes: which non-root inner nodes to keep: ``"all"``; ``"branched"``, only those
            continuations were sampled from or that have several children (the scored,
            expanded prefixes); ``"none"``, prompts only.
        include_leaves: keep the leaves themselves (target = their own reward). Off by
            default: the predictor is never asked about a finished episode.
        prefix_share: when set, keep every prompt example and a uniformly random subset of
            the prefix examples (branched ones first) so that prefixes make up at most this
            share of the result (``round(share / (1 - share) * prompts)`` of them, at least
            one when any exist and the share is positive); None keeps them all.
        seed: seeds that subset (deterministic for a given seed).
    """
    if prefixes not in PREDICTOR_PREFIXES:
        raise ValueError(f"prefixes must be {either(PREDICTOR_PREFIXES)}, got {prefixes!r}")
    if prefix_share is not None and not (math.isfinite(prefix_share) and 0.0 <= prefix_share <= 1.0):
        raise ValueError(f"prefix_share must be in [0, 1] or None, got {prefix_share}")
    contexts: list[str] = []
    targets: list[float] = []
    weights: list[float] = []
    seconds: list[float] = []
    depths: list[int] = []
    pids: list[str] = []
    nids: list[int] = []
    branched: list[bool] = []
    for tree in trees:
        tgt, cnt = tree.targets()
        sq = _second_moments(tree)
        starts = {r.start_node for r in tree.rollouts() if r.start_depth > 0}
        for node in tree.nodes:
            if cnt[node.node_id] == 0:
                continue
            if node.is_leaf and not include_leaves:
                continue
            if not node.is_root and not node.is_leaf:
                if prefixes == "none":
                    continue
                if prefixes == "branched" and node.node_id not in starts and len(node.children) < 2:
                    continue
            contexts.append(tree.context(node))
            targets.append(float(tgt[node.node_id]))
            weights.append(float(cnt[node.node_id]))
            seconds.append(float(sq[node.node_id]))
            depths.append(node.depth)
            pids.append(tree.prompt_id)
            nids.append(node.node_id)
            branched.append(node.node_id in starts or len(node.children) >= 2)
    if prefix_share is not None:
        keep = _prefix_subset(np.asarray(depths), np.asarray(branched, dtype=bool), prefix_share, seed)
        contexts, targets, weights, seconds, depths, pids, nids = (
            [xs[i] for i in keep] for xs in (contexts, targets, weights, seconds, depths, pids, nids))
    return TreeExamples(
        contexts=tuple(contexts), targets=np.asarray(targets, dtype=np.float64),
        weights=np.asarray(weights, dtype=np.float64), second_moments=np.asarray(seconds, dtype=np.float64),
        depths=np.asarray(depths, dtype=np.int64), prompt_ids=tuple(pids), node_ids=np.asarray(nids, dtype=np.int64),
    )


def _prefix_subset(depths: NDArray[np.int64], branched: NDArray[np.bool_], share: float,
                   seed: int) -> list[int]:
    """Indices kept by ``prefix_share``: all prompts, then branched prefixes, then the rest, shuffled by seed."""
    roots = np.flatnonzero(depths == 0)
    inner = np.flatnonzero(depths > 0)
    if share >= 1.0 or inner.size == 0:
        return list(range(depths.shape[0]))
    want = int(math.floor(share / (1.0 - share) * roots.size + 0.5))
    if share > 0 and want == 0:
        want = 1
    rng = np.random.default_rng(seed)
    first = rng.permutation(inner[branched[inner]])
    rest = rng.permutation(inner[~branched[inner]])
    chosen = np.concatenate([first, rest])[:min(want, inner.size)]
    return sorted(int(i) for i in np.concatenate([roots, chosen]))


def _second_moments(tree: RolloutTree) -> NDArray[np.float64]:
    """Mean squared leaf reward below each node (NaN with no leaf below): the bottom-up walk on r**2."""
    squares = [None if n.reward is None else n.reward**2 for n in tree.nodes]
    return bottom_up_targets(tree.parent_ids(), squares)[0]


def spearman(a: ArrayLike, b: ArrayLike) -> float:
    """Spearman rank correlation, NaN (never a warning or an error) when undefined.

    Undefined: fewer than 3 pairs, or either side constant. The Pearson correlation of the
    average ranks (ties share the mean of their ranks), as ``scipy.stats.spearmanr`` computes it,
    in numpy: importing ``scipy.stats`` costs seconds on a busy 2-core machine, and the trainer's
    first pre-update metrics would pay it inside a training step.
    """
    x = np.asarray(a, dtype=np.float64).reshape(-1)
    y = np.asarray(b, dtype=np.float64).reshape(-1)
    ok = np.isfinite(x) & np.isfinite(y)
    x, y = x[ok], y[ok]
    if x.shape[0] < 3 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return math.nan
    rx, ry = _average_ranks(x), _average_ranks(y)
    rx -= rx.mean()
    ry -= ry.mean()
    rho = float(np.dot(rx, ry) / math.sqrt(float(np.dot(rx, rx)) * float(np.dot(ry, ry))))
    return max(-1.0, min(1.0, rho))


def _average_ranks(v: NDArray[np.float64]) -> NDArray[np.float64]:
    """1-based ranks of ``v``, ties given the mean of the ranks they span."""
    order = np.argsort(v, kind="mergesort")
    sv = v[order]
    first = np.concatenate([[True], sv[1:] != sv[:-1]])  # where each run of equal values starts
    group = np.cumsum(first) - 1
    starts = np.flatnonzero(first)
    ends = np.concatenate([starts[1:], [v.shape[0]]])
    ranks = np.empty(v.shape[0])
    ranks[order] = ((starts + ends + 1) / 2.0)[group]
    return ranks


def prediction_metrics(predictions: ArrayLike, examples: TreeExamples) -> dict[str, float]:
    """Quality of ``predictions`` on ``examples``.

    Keys: ``mse`` (leaf-weighted, against the bottom-up targets), ``brier`` (leaf-weighted
    mean of (p - r)^2 over the leaves below each node), ``spearman_root`` and
    ``spearman_prefix`` (unweighted rank correlation with the targets over prompt and
    over non-prompt examples; NaN when undefined), ``mse_root`` / ``mse_prefix`` (the
    leaf-weighted MSE over each; NaN when empty), ``mse_depth_<d>`` per depth,
    ``examples``, ``prefix_share`` (non-prompt examples / all) and ``prefix_weight_share``.
    """
    p = np.asarray(predictions, dtype=np.float64).reshape(-1)
    if p.shape[0] != len(examples):
        raise ValueError(f"{p.shape[0]} predictions for {len(examples)} examples")
    t, w = examples.targets, examples.weights
    out: dict[str, float] = {"examples": float(len(examples))}
    if len(examples) == 0:
        return out | {"mse": math.nan, "brier": math.nan, "spearman_root": math.nan,
                      "spearman_prefix": math.nan, "mse_root": math.nan, "mse_prefix": math.nan,
                      "prefix_share": math.nan, "prefix_weight_share": math.nan}
    wsum = float(w.sum()) or 1.0
    out["mse"] = float(np.sum(w * (p - t) ** 2) / wsum)
    out["brier"] = float(np.sum(w * (p**2 - 2 * p * t + examples.second_moments)) / wsum)
    root = examples.is_root
    out["spearman_root"] = spearman(p[root], t[root])
    out["spearman_prefix"] = spearman(p[~root], t[~root])
    for name, sel in (("root", root), ("prefix", ~root)):
        ws = float(w[sel].sum())
        out[f"mse_{name}"] = float(np.sum(w[sel] * (p[sel] - t[sel]) ** 2) / ws) if ws > 0 else math.nan
    out["prefix_share"] = float(np.mean(~root))
    out["prefix_weight_share"] = float(w[~root].sum() / wsum)
    for d in np.unique(examples.depths):
        sel = examples.depths == d
        ws = float(w[sel].sum()) or 1.0
        out[f"mse_depth_{int(d)}"] = float(np.sum(w[sel] * (p[sel] - t[sel]) ** 2) / ws)
    return out


def refresh_predictor(
    predictor: SuccessPredictor,
    trees: Iterable[RolloutTree],
    *,
    prefixes: PredictorPrefixes = "all",
    include_leaves: bool = False,
    evaluate: bool = True,
    prefix_share: float | None = PAPER_PREFIX_SHARE,
    seed: int = 0,
) -> dict[str, float]:
    """Step 4 of the loop: regress the predictor onto the bottom-up targets of finished trees.

    With ``evaluate``, every example (all kept nodes, whatever ``prefix_share``) is scored
    before the update and :func:`prediction_metrics` is reported (keys prefixed ``pre_``:
    root and prefix Spearman and MSE, MSE by depth). The update then trains on the batch
    :func:`tree_examples` keeps with ``prefix_share`` (default the paper's
    :data:`PAPER_PREFIX_SHARE`; None: every prefix) and ``seed``; its own metrics follow under
    ``update_``, its size and prefix share under ``train_examples`` / ``train_prefix_share``.
    Returns an empty-update report when no tree has a finished leaf. Ends with the predictor's
    ``end_step()`` when it has one (:mod:`~trace_agent.predictor.base`).
    """
    trees = list(trees)
    examples = tree_examples(trees, prefixes=prefixes, include_leaves=include_leaves)
    out: dict[str, float] = {}
    if evaluate:
        pred = checked_predictions(predictor.predict(examples.contexts), len(examples)) if len(examples) \
            else np.zeros(0)
        out.update({f"pre_{k}": v for k, v in prediction_metrics(pred, examples).items()})
    train = examples if prefix_share is None else tree_examples(
        trees, prefixes=prefixes, include_leaves=include_leaves, prefix_share=prefix_share, seed=seed)
    if len(train):
        out.update({f"update_{k}": v for k, v in
                    predictor.update(train.contexts, train.targets, train.weights).items()})
    out["examples"] = float(len(examples))
    out["train_examples"] = float(len(train))
    out["train_prefix_share"] = float(np.mean(~train.is_root)) if len(train) else math.nan
    end_step = getattr(predictor, "end_step", None)
    if callable(end_step):  # a step boundary: what is not in the checkpoint goes (exact resume)
        end_step()
    return out
