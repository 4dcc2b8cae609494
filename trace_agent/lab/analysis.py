"""Analyses behind the paper's claims in miniature (``scripts/paper_claims.py``; docs/paper.md).

Everything here is a pure function of trees, rows or arrays, except :class:`MonteCarloProbe`,
the strategy that measures the Monte-Carlo truth the predictor and contrast claims compare
against.

Monte-Carlo truth (what "true V" means here)
    An *anchor* is a save point: a prompt (depth 0) or a visited prefix (the state after a
    finished turn that did not end the episode). Its true success probability V is estimated
    by K fresh continuations sampled from its snapshot with the same policy and sampling
    settings (``RolloutConfig.oracle_samples``): ``t = s / K`` with s successes. ``t`` is
    unbiased with variance ``V(1 - V) / K``; ``t(1 - t) / (K - 1)`` estimates that variance
    without bias, so ``E[(p - t)^2] - E[t(1 - t)] / (K - 1)`` estimates the predictor's error
    against the *true* V (:func:`error_by_depth`, column ``mse_vs_true``).

Available contrast (what "contrast" means here)
    The contrast an anchor offers is the number of (success, failure) pairs among K
    continuations from it: ``s * (K - s)`` of its Monte-Carlo samples, an unbiased estimate
    of ``K (K - 1) V (1 - V)`` (``E[s(K - s)] = K^2 V - K V(1 - V) - K^2 V^2``). By the
    martingale identity (docs/design.md, "Allocation"), ``V(1 - V)`` is the expected
    squared movement of the success probability still to come below the anchor. :func:`capture_curve` gives the
    share of the total contrast held by the top-ranked ``k`` of ``n`` anchors, for
    ``k = 0..n``, under a ranking by any score (the paper ranks by ``v(1 - v)``); tied scores
    count as a uniformly random order among themselves (each tied position gets the tie
    group's mean), so a constant score gives the exact expected curve of a random ranking,
    the diagonal.
    Ranking by ``s(K - s)`` itself (``oracle``) scores the same samples it ranks; the
    out-of-sample version (:func:`split_contrast_summary`) ranks on one half of each anchor's
    samples and scores every ranking on the other half.

Error by depth (paper: the group-success error falls to about a third of its prompt-level
value by turn 4) and rank correlation (Spearman at prompts and at prefixes) are
:func:`error_by_depth` and :func:`rank_correlations`; :func:`budget_profile` is where a
strategy's budget went (skipped prompts, rollouts per active prompt, continuation start
depths), and :func:`shape_costs` checks two budget shapes spend equal paper units.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from trace_agent.predictor import spearman
from trace_agent.strategies import Budget, ExpansionRequest, Reads, RootRequest, uniform_roots
from trace_agent.tree import RolloutTree

__all__ = [
    "Anchor",
    "MonteCarloProbe",
    "anchors_from_trees",
    "spread",
    "capture_curve",
    "capture_at",
    "fraction_for_share",
    "curve_auc",
    "contrast_summary",
    "split_contrast_summary",
    "error_by_depth",
    "rank_correlations",
    "budget_profile",
    "shape_costs",
]

#: ``node.info`` key of an anchor's Monte-Carlo success rate (written by the collector's oracle).
ORACLE_KEY = "oracle_value"


# --------------------------------------------------------------------------------------------------
# the probe and its anchors


@dataclass(frozen=True, kw_only=True)
class MonteCarloProbe:
    """A measuring strategy: uniform roots, then the predictor's v-hat and a Monte-Carlo rate at every anchor.

    Roots: ``uniform_roots`` over the first ``max_active`` prompts of the pool (give the probe a
    budget whose ``max_active`` equals the pool, so every candidate is an anchor). Once a
    prompt's roots return, the root and every visited prefix are scored by the predictor
    (``node.value``) and estimated by ``oracle_samples`` fresh continuations each
    (``node.info["oracle_value"]``); no continuation is added to the tree, so each anchor's
    truth comes from its own samples only. Benchmark only: its Monte-Carlo cost lies outside
    the budget and is reported as ``oracle_generated_tokens``.
    """

    name: str = "probe"
    branching: bool = True
    reads: Reads = Reads(prefixes={"predicted", "oracle"}, root={"predicted", "oracle"})

    def allocate_roots(self, request: RootRequest) -> list[int]:
        return uniform_roots(len(request.prompt_ids), request.root_budget, request.budget.max_active)

    def allocate_continuations(self, request: ExpansionRequest) -> dict[int, int]:
        return {}  # the values it reads are kept on the nodes: node.value, node.info["oracle_value"]


@dataclass(frozen=True, kw_only=True)
class Anchor:
    """One save point with the predictor's value and its Monte-Carlo truth.

    Attributes:
        prompt_id: the tree's prompt.
        seed: the bench seed of the tree (``tree.metadata["seed"]``, -1 when absent).
        node_id: the node in its tree (0: the prompt).
        depth: turns from the prompt.
        predicted: the predictor's v-hat.
        truth: the Monte-Carlo success rate ``s / samples``.
        samples: K, continuations behind ``truth``.
        prompt_truth: the Monte-Carlo rate of the anchor's prompt (the same K).
    """

    prompt_id: str
    seed: int
    node_id: int
    depth: int
    predicted: float
    truth: float
    samples: int
    prompt_truth: float

    @property
    def successes(self) -> int:
        return int(round(self.truth * self.samples))

    @property
    def contrast(self) -> int:
        """(success, failure) pairs among the anchor's K continuations: ``s * (K - s)``."""
        s = self.successes
        return s * (self.samples - s)


def anchors_from_trees(trees: Iterable[RolloutTree], *, samples: int) -> list[Anchor]:
    """Every node of ``trees`` that carries both a predicted value and a Monte-Carlo rate (probe trees).

    Trees whose root has no Monte-Carlo rate are skipped (their prefixes have no ``prompt_truth``).
    Raises ValueError when ``samples < 1``.
    """
    if samples < 1:
        raise ValueError(f"samples must be >= 1, got {samples}")
    out: list[Anchor] = []
    for tree in trees:
        root = tree.root
        if ORACLE_KEY not in root.info:
            continue
        prompt_truth = float(root.info[ORACLE_KEY])
        seed = int(tree.metadata.get("seed", -1))
        for node in tree.nodes:
            if node.value is None or ORACLE_KEY not in node.info or node.is_leaf:
                continue
            out.append(Anchor(prompt_id=tree.prompt_id, seed=seed, node_id=node.node_id, depth=node.depth,
                              predicted=float(node.value), truth=float(node.info[ORACLE_KEY]), samples=samples,
                              prompt_truth=prompt_truth))
    return out


def spread(values: Iterable[float]) -> dict[str, float]:
    """Mean, sample std (ddof 1; 0 for one value), min, max and count over the finite ``values``."""
    v = np.asarray([float(x) for x in values], dtype=np.float64)
    v = v[np.isfinite(v)]
    if not v.size:
        return {"mean": math.nan, "std": math.nan, "min": math.nan, "max": math.nan, "n": 0}
    return {"mean": float(v.mean()), "std": float(v.std(ddof=1)) if v.size > 1 else 0.0, "min": float(v.min()),
            "max": float(v.max()), "n": int(v.size)}


# --------------------------------------------------------------------------------------------------
# contrast capture


def capture_curve(contrast: ArrayLike, scores: ArrayLike) -> NDArray[np.float64]:
    """Share of ``sum(contrast)`` held by the ``k`` highest-scored anchors, for ``k = 0..n`` (n + 1 points).

    Ties in ``scores`` are a uniformly random order among themselves: each tied position gets
    the tie group's mean contrast (the exact expectation over tie orders). The curve starts
    at 0, never decreases and ends at exactly 1. Raises ValueError for mismatched lengths,
    negative or non-finite contrast, non-finite scores, or no contrast at all.
    """
    c = np.asarray(contrast, dtype=np.float64).reshape(-1)
    s = np.asarray(scores, dtype=np.float64).reshape(-1)
    if c.shape != s.shape:
        raise ValueError(f"{c.shape[0]} contrasts for {s.shape[0]} scores")
    if not (np.all(np.isfinite(c)) and np.all(np.isfinite(s))):
        raise ValueError("contrast and scores must be finite")
    if np.any(c < 0):
        raise ValueError("contrast must be >= 0")
    total = float(c.sum())
    if c.size == 0 or total <= 0.0:
        raise ValueError("no available contrast: every anchor's continuations ended alike")
    order = np.argsort(-s, kind="stable")
    ranked_s, ranked_c = s[order], c[order]
    assigned = np.empty_like(ranked_c)
    start = 0
    while start < ranked_s.size:
        stop = start + 1
        while stop < ranked_s.size and ranked_s[stop] == ranked_s[start]:
            stop += 1
        assigned[start:stop] = ranked_c[start:stop].mean()
        start = stop
    curve = np.concatenate([[0.0], np.cumsum(assigned) / total])
    curve = np.minimum(np.maximum.accumulate(curve), 1.0)  # rounding never breaks monotonicity
    curve[-1] = 1.0
    return curve


def capture_at(curve: ArrayLike, fraction: float) -> float:
    """Share captured by the top ``fraction`` of anchors (linear between the curve's integer points)."""
    y = np.asarray(curve, dtype=np.float64)
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"fraction must be in [0, 1], got {fraction}")
    n = y.size - 1
    return float(np.interp(fraction * n, np.arange(n + 1), y))


def fraction_for_share(curve: ArrayLike, share: float) -> float:
    """Smallest ``k / n`` whose top-``k`` anchors capture at least ``share`` of the contrast."""
    y = np.asarray(curve, dtype=np.float64)
    if not 0.0 <= share <= 1.0:
        raise ValueError(f"share must be in [0, 1], got {share}")
    n = y.size - 1
    k = int(np.argmax(y >= share - 1e-12))
    return k / n


def curve_auc(curve: ArrayLike) -> float:
    """Area under the capture curve over fractions 0..1 (0.5 for a random ranking)."""
    y = np.asarray(curve, dtype=np.float64)
    n = y.size - 1
    return float(np.sum((y[1:] + y[:-1]) / 2.0) / n)


#: Fractions of anchors and shares of contrast the contrast table reports.
FRACTIONS: tuple[float, ...] = (0.1, 0.2, 0.3, 0.5)
SHARES: tuple[float, ...] = (0.5, 0.8, 0.9)


def contrast_summary(anchors: Sequence[Anchor]) -> dict[str, Any]:
    """Capture curves of the ``oracle`` (true contrast), ``predicted`` (v-hat(1 - v-hat)) and ``random`` rankings.

    Keys: ``anchors``, ``total_contrast``, ``degenerate_share`` (anchors whose K continuations
    all ended alike), and per ranking: ``curve`` (n + 1 points), ``at`` (share captured at each
    of :data:`FRACTIONS`), ``fraction_for`` (fraction of anchors needed for each of
    :data:`SHARES`), ``auc``. Raises ValueError when no anchor offers contrast.
    """
    c = np.asarray([a.contrast for a in anchors], dtype=np.float64)
    p = np.asarray([a.predicted for a in anchors], dtype=np.float64)
    rankings = {"oracle": c, "predicted": p * (1.0 - p), "random": np.zeros_like(c)}
    out: dict[str, Any] = {"anchors": len(anchors), "total_contrast": float(c.sum()),
                           "degenerate_share": float(np.mean(c == 0)) if c.size else math.nan}
    for name, score in rankings.items():
        curve = capture_curve(c, score)
        out[name] = {"curve": curve.tolist(), "at": {f"{f:g}": capture_at(curve, f) for f in FRACTIONS},
                     "fraction_for": {f"{s:g}": fraction_for_share(curve, s) for s in SHARES},
                     "auc": curve_auc(curve)}
    return out


def split_contrast_summary(anchors: Sequence[Anchor], *, splits: int = 500, seed: int = 0) -> dict[str, Any]:
    """Capture curves scored out of sample: each anchor's K continuations split into halves A and B.

    :func:`contrast_summary`'s ``oracle`` ranks anchors by the same samples it scores, so it is an
    upper bound no ranking made before the samples can reach. Here every ranking is scored on half
    B's contrast ``s_B (K_B - s_B)`` (``K_B = K - K // 2``): ``oracle`` ranks by half A's contrast
    ``s_A (K_A - s_A)`` (a Monte-Carlo estimate made beforehand from ``K_A = K // 2`` samples),
    ``predicted`` by ``v-hat (1 - v-hat)``, ``random`` by nothing. The split needs only each
    anchor's success count s: the K samples are exchangeable, so given s every choice of which
    samples succeeded is equally likely and ``s_A`` is hypergeometric (s successes among K, K_A
    drawn), the law a stored per-sample record would give. Curves are averaged over ``splits``
    random splits (seeded); a split whose half B offers no contrast at all is skipped and counted.

    Keys: ``anchors``, ``splits`` (used), ``skipped_splits``, ``half_samples`` ([K_A, K_B]), and per
    ranking ``curve`` (the mean curve), ``at``, ``fraction_for``, ``auc`` (of the mean curve) and
    ``auc_over_splits`` (:func:`spread` of each split's AUC). Raises ValueError when anchors differ
    in K, K < 4 (half B could never hold a pair), ``splits < 1``, or no split offers contrast.
    """
    ks = {a.samples for a in anchors}
    if len(ks) != 1:
        raise ValueError(f"anchors must share one K to be split, got {sorted(ks)}")
    k = ks.pop()
    if k < 4:
        raise ValueError(f"a split needs K >= 4 samples per anchor (2 per half), got K = {k}")
    if splits < 1:
        raise ValueError(f"splits must be >= 1, got {splits}")
    k_a = k // 2
    k_b = k - k_a
    s = np.asarray([a.successes for a in anchors], dtype=np.int64)
    p = np.asarray([a.predicted for a in anchors], dtype=np.float64)
    rng = np.random.default_rng(seed)
    names = ("oracle", "predicted", "random")
    curves: dict[str, list[NDArray[np.float64]]] = {name: [] for name in names}
    skipped = 0
    for _ in range(splits):
        s_a = rng.hypergeometric(s, k - s, k_a)
        s_b = s - s_a
        c_b = (s_b * (k_b - s_b)).astype(np.float64)
        if c_b.sum() <= 0:
            skipped += 1
            continue
        scores = {"oracle": (s_a * (k_a - s_a)).astype(np.float64), "predicted": p * (1.0 - p),
                  "random": np.zeros_like(p)}
        for name in names:
            curves[name].append(capture_curve(c_b, scores[name]))
    if not curves["oracle"]:
        raise ValueError("no available contrast: no split's half B holds a (success, failure) pair")
    out: dict[str, Any] = {"anchors": len(anchors), "splits": len(curves["oracle"]), "skipped_splits": skipped,
                           "half_samples": [k_a, k_b]}
    for name in names:
        mean = np.mean(curves[name], axis=0)
        out[name] = {"curve": mean.tolist(), "at": {f"{f:g}": capture_at(mean, f) for f in FRACTIONS},
                     "fraction_for": {f"{x:g}": fraction_for_share(mean, x) for x in SHARES},
                     "auc": curve_auc(mean), "auc_over_splits": spread(curve_auc(c) for c in curves[name])}
    return out


# --------------------------------------------------------------------------------------------------
# predictor error and rank correlation


def error_by_depth(anchors: Sequence[Anchor]) -> list[dict[str, float]]:
    """Per depth present (ascending): the predictor's error against the Monte-Carlo truth.

    Columns: ``depth``, ``anchors``, ``mse`` (mean (p - t)^2), ``mae``, ``noise`` (the Monte-Carlo
    share of ``mse``: mean t(1 - t)/(K - 1)), ``mse_vs_true`` (``mse - noise``, an unbiased
    estimate of mean (p - V)^2; may dip below 0 by chance), ``ratio_to_prompt`` (``mse_vs_true``
    over depth 0's; NaN without depth 0 or when that is <= 0), ``raw_ratio_to_prompt`` (the same on
    ``mse``, noise included), ``spearman`` (p vs t at that
    depth), ``prompt_rate_mse`` (the prompt's own Monte-Carlo rate used as the forecast: what a
    predictor that ignores the history could do at best, with both estimates' noise) and
    ``mean_truth``.
    """
    rows: list[dict[str, float]] = []
    depths = sorted({a.depth for a in anchors})
    for d in depths:
        mine = [a for a in anchors if a.depth == d]
        p = np.asarray([a.predicted for a in mine])
        t = np.asarray([a.truth for a in mine])
        k = np.asarray([a.samples for a in mine], dtype=np.float64)
        noise = np.where(k > 1, t * (1.0 - t) / np.maximum(k - 1.0, 1.0), np.nan)
        mse = float(np.mean((p - t) ** 2))
        rows.append({"depth": float(d), "anchors": float(len(mine)), "mse": mse, "mae": float(np.mean(np.abs(p - t))),
                     "noise": float(np.mean(noise)), "mse_vs_true": mse - float(np.mean(noise)),
                     "spearman": spearman(p, t),
                     "prompt_rate_mse": float(np.mean((np.asarray([a.prompt_truth for a in mine]) - t) ** 2)),
                     "mean_truth": float(t.mean())})
    base = next((r["mse_vs_true"] for r in rows if r["depth"] == 0.0), math.nan)
    raw = next((r["mse"] for r in rows if r["depth"] == 0.0), math.nan)
    for r in rows:
        r["ratio_to_prompt"] = r["mse_vs_true"] / base if base > 0 else math.nan
        r["raw_ratio_to_prompt"] = r["mse"] / raw if raw > 0 else math.nan
    return rows


def rank_correlations(anchors: Sequence[Anchor]) -> dict[str, Any]:
    """Spearman of v-hat vs the Monte-Carlo truth at prompts (depth 0) and at prefixes (depth >= 1).

    ``pooled`` over all anchors; ``per_seed`` (seed -> {root, prefix}) and ``over_seeds``
    (:func:`spread` of the per-seed values) show the spread.
    """

    def pair(sel: Sequence[Anchor]) -> dict[str, float]:
        roots = [a for a in sel if a.depth == 0]
        prefixes = [a for a in sel if a.depth > 0]
        return {"root": spearman([a.predicted for a in roots], [a.truth for a in roots]),
                "prefix": spearman([a.predicted for a in prefixes], [a.truth for a in prefixes]),
                "roots": float(len(roots)), "prefixes": float(len(prefixes))}

    seeds = sorted({a.seed for a in anchors})
    per_seed = {str(s): pair([a for a in anchors if a.seed == s]) for s in seeds}
    return {"pooled": pair(anchors), "per_seed": per_seed,
            "over_seeds": {k: spread(v[k] for v in per_seed.values()) for k in ("root", "prefix")}}


# --------------------------------------------------------------------------------------------------
# budget: where it goes, and equal shapes


def budget_profile(rows: Sequence[Mapping[str, Any]], *, prompts: int, budget: Budget) -> dict[str, dict[str, Any]]:
    """Per strategy, from bench rows (one per seed): where the batch budget went.

    Keys per strategy: ``skipped_share`` (skipped / candidate prompts; :func:`spread` over seeds),
    ``roots_per_active`` and ``rollouts_per_active`` (root rollouts, and root rollouts plus
    continuations, per active prompt), ``units_per_active`` (paper units per active prompt),
    ``continuation_depths`` (share of all continuations by start depth, pooled over seeds),
    ``deepest_continuation`` (the largest start depth seen; 0 when none), and the floor
    ``skip_floor = 1 - max_active / prompts`` that the budget rules impose on every strategy.
    """
    if prompts < 1:
        raise ValueError(f"prompts must be >= 1, got {prompts}")
    out: dict[str, dict[str, Any]] = {}
    for name in dict.fromkeys(r["strategy"] for r in rows):
        mine = [r for r in rows if r["strategy"] == name]

        def per_active(key: str, mine: list[Mapping[str, Any]] = mine) -> dict[str, float]:
            return spread(float(r[key]) / r["active_prompts"] for r in mine if r["active_prompts"])

        depths: dict[int, float] = {}
        for r in mine:
            for d, c in r["continuation_depths"].items():
                depths[int(d)] = depths.get(int(d), 0.0) + float(c)
        total = sum(depths.values())
        out[name] = {
            "skipped_share": spread(float(r["skipped"]) / prompts for r in mine),
            "roots_per_active": per_active("root_rollouts"),
            "rollouts_per_active": spread((float(r["root_rollouts"]) + float(r["continuations"])) / r["active_prompts"]
                                          for r in mine if r["active_prompts"]),
            "units_per_active": per_active("paper_units"),
            "active_prompts": spread(float(r["active_prompts"]) for r in mine),
            "continuation_depths": {str(d): c / total for d, c in sorted(depths.items())} if total else {},
            "deepest_continuation": max(depths, default=0),
            "skip_floor": 1.0 - budget.max_active / prompts,
        }
    return out


def shape_costs(shapes: Mapping[str, tuple[Budget, Sequence[Mapping[str, Any]]]]) -> dict[str, Any]:
    """Planned and measured paper units of each budget shape; ``equal`` when all agree.

    ``shapes``: label -> (budget, its bench rows). Planned is ``budget.paper_units`` (M(1 + N/2));
    measured is each row's spent paper units (min and max over strategies and seeds). ``equal``
    holds when every planned figure is the same and every measured figure equals it.
    """
    out: dict[str, Any] = {"shapes": {}}
    planned = set()
    measured_all: list[float] = []
    for label, (budget, rows) in shapes.items():
        spent = [float(r["paper_units"]) for r in rows]
        planned.add(budget.paper_units)
        measured_all += spent
        out["shapes"][label] = {"roots": budget.roots, "continuations_per_root": budget.continuations_per_root,
                                "group_size": budget.group_size, "max_active": budget.max_active,
                                "planned_units": budget.paper_units,
                                "measured_min": min(spent, default=math.nan),
                                "measured_max": max(spent, default=math.nan)}
    out["equal"] = len(planned) == 1 and all(math.isclose(x, next(iter(planned))) for x in measured_all)
    return out
