"""Sampling strategies: where a fixed rollout budget goes (which prompts, how many roots, which prefixes).

One plug point, :class:`Strategy`, with two decisions the collector
(:class:`~trace_agent.rollout.TreeCollector`) asks for:

1. ``allocate_roots(request: RootRequest) -> list[int]``: root rollouts per candidate
   prompt of the pool (0 skips a prompt). They must sum to ``request.root_budget``.
2. ``allocate_continuations(request: ExpansionRequest) -> dict[int, int]``: for one prompt
   whose root rollouts have all returned, how many continuations to sample from which
   visited prefix (node id -> count). Costs ``sum(k)`` continuation units, except that a
   continuation from the root (node 0) is a fresh root rollout and costs
   ``request.root_exchange`` units (2 at the paper's 1/2 cost). The total must not exceed
   ``request.budget``.

Values a strategy may ask for: a request's ``predicted(...)`` runs the success predictor and
``oracle(...)`` estimates true success rates by Monte-Carlo (R policy rollouts from each
anchor; benchmark only). They are computed when a strategy asks, so GRPO, TreePO and the
``trace-prefix`` ablation never pay for root predictions and only the Oracle pays for
Monte-Carlo rollouts. A root request holds its prompts' values in one :class:`PromptValues`
(each kind computed at most once, and what was computed is what
:attr:`~trace_agent.rollout.Collection.root_values` records); an expansion request calls the
collector's scoring functions on the nodes the strategy names. Values are not pushed up
front because a strategy's needs are not known before it runs: ``uses_predictor`` is a hint
for the trainer (a user's strategy may not have it), and TRACE with ``roots=False`` reads no
prompt value although it uses the predictor for its prefixes.

Equal budget (:class:`Budget`)
    The paper's (M, N) shape: M root rollouts per batch and N continuations per root, on at
    most ``M / group_size`` distinct prompts (the fixed-size baseline's batch: TRACE never
    trains on more prompts than GRPO). It costs ``M * (1 + N * continuation_cost)`` paper
    units (a continuation from the middle counts 1/2 of a full rollout). A *branching*
    strategy gets ``root_budget = M`` and, per prompt with m roots, ``N * m`` continuation
    units. A *flat* strategy (GRPO, PCL) spends the same paper units as root rollouts only:
    ``root_budget = flat_roots = M + floor(M * N * continuation_cost)`` (the paper's exchange
    rate: 2 continuations = 1 root). Real cost (generated tokens, env steps) is reported
    beside the paper units by the collector and the bench; it is not equalised (a
    continuation's real cost depends on where it starts).

Strategies here
    :class:`GRPO` (fixed n, no branching), :class:`PCL` (keeps the prompts whose predicted
    success is nearest 1/2, fixed n, no branching), :class:`TreePO` (uniform roots,
    continuations from uniformly random visited prefixes), :class:`TRACE` (exact
    :func:`~trace_agent.allocation.allocate_roots` + exact
    :func:`~trace_agent.allocation.allocate_prefixes`; ``roots=False`` / ``prefixes=False``
    give the two ablations), :class:`Oracle` (exact allocations on Monte-Carlo success rates
    that maximise the effective ratio; ``oracle-sum``: TRACE's objectives on those rates).
    :func:`make_strategy` builds them by name (:data:`STRATEGY_NAMES`).

A user's strategy is any object with ``name``, ``branching`` and the two methods; see
:class:`Strategy` and the README.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np
from numpy.typing import ArrayLike, NDArray

from trace_agent.allocation import (
    RootObjective,
    allocate_flip_once,
    allocate_prefixes,
    allocate_roots,
    repeat_probability,
)
from trace_agent.budget import Budget, proportional_split
from trace_agent.predictor import PredictionError, checked_predictions
from trace_agent.tree import Node, RolloutTree

__all__ = [
    "Budget",
    "PromptValues",
    "RootRequest",
    "ExpansionRequest",
    "Strategy",
    "GRPO",
    "PCL",
    "TreePO",
    "TRACE",
    "Oracle",
    "STRATEGY_NAMES",
    "make_strategy",
    "uniform_roots",
    "random_prefixes",
    "spend_rest_on_root",
    "rollout_ending",
    "root_repeat_probability",
]


# --------------------------------------------------------------------------------------------------
# requests


class PromptValues:
    """The candidate prompts' success values a root request offers, each kind computed on first ask, once.

    Args:
        count: number of candidate prompts (the values' length).
        predicted: computes the success predictor's v-hat of every prompt (None: asking raises
            :class:`~trace_agent.predictor.PredictionError`).
        oracle: computes every prompt's Monte-Carlo success rate (None: asking raises).

    The functions are the collector's (they may block on work done elsewhere: env resets for
    the prompts' contexts, Monte-Carlo rollouts); each runs at most once, and only when a
    strategy asks. Every read is checked (count, finiteness) by
    :func:`~trace_agent.predictor.checked_predictions`.
    """

    def __init__(self, count: int, *, predicted: Callable[[], ArrayLike] | None = None,
                 oracle: Callable[[], ArrayLike] | None = None) -> None:
        if count < 0:
            raise ValueError(f"count must be >= 0, got {count}")
        self.count = count
        self._compute = {"predicted": predicted, "oracle": oracle}
        self._values: dict[str, NDArray[np.float64]] = {}
        self._last: NDArray[np.float64] | None = None

    def _get(self, kind: str) -> NDArray[np.float64]:
        if kind not in self._values:
            compute = self._compute[kind]
            if compute is None:
                raise PredictionError(f"this request offers no {kind} values")
            self._values[kind] = self._last = np.asarray(compute(), dtype=np.float64)
        return checked_predictions(self._values[kind], self.count)

    def predicted(self) -> NDArray[np.float64]:
        """The predictor's v-hat for every prompt (computed on the first call)."""
        return self._get("predicted")

    def oracle(self) -> NDArray[np.float64]:
        """Monte-Carlo success rate of every prompt (computed on the first call; benchmark only)."""
        return self._get("oracle")

    @property
    def last(self) -> NDArray[np.float64] | None:
        """The values computed last (None: a strategy asked for none), as computed (not clipped)."""
        return self._last


@dataclass(frozen=True, kw_only=True)
class RootRequest:
    """Everything a strategy may use to place root rollouts on a candidate pool.

    Attributes:
        prompt_ids: the candidate pool, in pool order.
        budget: the batch budget.
        root_budget: root rollouts to place, exactly (``budget.roots`` for a branching
            strategy, ``budget.flat_roots`` for a flat one).
        rng: a seeded generator for random choices.
        values: the prompts' values on offer (read them through :meth:`predicted` / :meth:`oracle`).
    """

    prompt_ids: tuple[str, ...]
    budget: Budget
    root_budget: int
    rng: np.random.Generator
    values: PromptValues = field(repr=False)

    def __post_init__(self) -> None:
        if self.values.count != len(self.prompt_ids):
            raise ValueError(f"values for {self.values.count} prompts, the pool has {len(self.prompt_ids)}")

    def predicted(self) -> NDArray[np.float64]:
        """The predictor's v-hat for every candidate prompt (computed once, on first call).

        Raises :class:`~trace_agent.predictor.PredictionError` on a NaN/inf value or a wrong
        count (it would otherwise reach the allocator as a bare range error).
        """
        return self.values.predicted()

    def oracle(self) -> NDArray[np.float64]:
        """Monte-Carlo success rate of every candidate prompt (benchmark only; computed once)."""
        return self.values.oracle()


@dataclass(frozen=True, kw_only=True)
class ExpansionRequest:
    """One prompt's finished root rollouts and its continuation budget.

    Attributes:
        tree: the prompt's tree (root rollouts finished; nodes hold snapshots).
        budget: continuation units to spend (``N * m``).
        candidates: the visited prefixes a continuation may start from: non-root, non-leaf
            nodes with a snapshot, in node order.
        root_exchange: units one continuation from the root (a fresh root rollout) costs.
        prefix_cap: most continuations from one prefix (None: no cap).
        rng: a seeded generator for random choices.
    """

    tree: RolloutTree
    budget: int
    candidates: tuple[Node, ...]
    root_exchange: int
    prefix_cap: int | None
    rng: np.random.Generator
    predict_nodes: Callable[[Sequence[Node]], NDArray[np.float64]] = field(repr=False)
    oracle_nodes: Callable[[Sequence[Node]], NDArray[np.float64]] = field(repr=False)

    def predicted(self, nodes: Sequence[Node] | None = None) -> NDArray[np.float64]:
        """The predictor's v-hat for ``nodes`` (default: the candidates); stored in ``node.value``.

        Raises :class:`~trace_agent.predictor.PredictionError` on a NaN/inf value or a wrong count.
        """
        chosen = self.candidates if nodes is None else nodes
        return checked_predictions(self.predict_nodes(chosen), len(chosen))

    def oracle(self, nodes: Sequence[Node] | None = None) -> NDArray[np.float64]:
        """Monte-Carlo success rate from each node's snapshot (benchmark only; stored in ``node.info``)."""
        chosen = self.candidates if nodes is None else nodes
        return checked_predictions(self.oracle_nodes(chosen), len(chosen))

    def endings(self, nodes: Sequence[Node] | None = None) -> NDArray[np.float64]:
        """Reward of the rollout that went through each node (see :func:`rollout_ending`)."""
        return np.asarray([rollout_ending(n) for n in (self.candidates if nodes is None else nodes)])


def rollout_ending(node: Node) -> float:
    """The reward of the leaf that ``node``'s own rollout reached (its first leaf below by that rollout).

    Before any continuation a visited prefix lies on exactly one rollout, so this is the
    "original ending" of the prefix problem. Raises ValueError when the rollout is unfinished.
    """
    current = node
    while not current.is_leaf:
        same = [c for c in current.children if c.rollout_id == node.rollout_id]
        if not same:
            raise ValueError(f"node {node.node_id}'s rollout {node.rollout_id} has not finished")
        current = same[0]
    return float(current.reward)  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------------------
# protocol


@runtime_checkable
class Strategy(Protocol):
    """Where a batch's rollout budget goes. Implement this to plug a strategy into the collector and the bench.

    Attributes:
        name: a short label for tables and logs.
        branching: True when the strategy samples continuations (it then gets ``budget.roots``
            root rollouts and ``N * m`` continuation units per prompt); False for a flat
            strategy (``budget.flat_roots`` root rollouts, no continuations).
        uses_predictor: optional (default True); False tells the trainer the strategy never
            reads ``predicted()``, so it need not refresh the success predictor for it.

    Contract:
        * ``allocate_roots`` returns one non-negative int per ``request.prompt_ids`` entry,
          summing to ``request.root_budget``, with at most ``request.budget.max_active``
          positive entries. Prompts with 0 are skipped (no tree).
        * ``allocate_continuations`` returns ``{node_id: count}`` over ``request.candidates``
          (and optionally node 0, the root) whose cost ``sum(k) + (root_exchange - 1) * k_root``
          is at most ``request.budget``. It is called once per prompt, from that prompt's
          worker, as soon as its roots return; it must not depend on other prompts.
    """

    name: str
    branching: bool

    def allocate_roots(self, request: RootRequest) -> list[int]: ...

    def allocate_continuations(self, request: ExpansionRequest) -> dict[int, int]: ...


# --------------------------------------------------------------------------------------------------
# building blocks (pure, reusable by user strategies)


def uniform_roots(n_candidates: int, total: int, active: int) -> list[int]:
    """``total`` rollouts split as evenly as possible over the first ``active`` candidates (pool order).

    Raises ValueError when a prompt would get fewer than 2 rollouts.
    """
    active = min(active, n_candidates)
    if active <= 0 and total > 0:
        raise ValueError(f"cannot place {total} rollouts on {n_candidates} candidates")
    split = proportional_split([1.0] * active, total) if active else []
    if total > 0 and min(split) < 2:
        raise ValueError(f"{total} rollouts over {active} prompts leaves a prompt with fewer than 2")
    return split + [0] * (n_candidates - active)


def random_prefixes(candidates: Sequence[Node], budget: int, rng: np.random.Generator,
                    *, cap: int | None = None) -> dict[int, int]:
    """``budget`` continuations from uniformly random candidates (with replacement, at most ``cap`` each)."""
    out: dict[int, int] = {}
    if not candidates or budget <= 0:
        return out
    room = budget if cap is None else min(budget, cap * len(candidates))
    for _ in range(room):
        open_ = [n for n in candidates if cap is None or out.get(n.node_id, 0) < cap]
        node = open_[int(rng.integers(len(open_)))]
        out[node.node_id] = out.get(node.node_id, 0) + 1
    return out


def spend_rest_on_root(allocation: Mapping[int, int], request: ExpansionRequest) -> dict[int, int]:
    """Spend the units ``allocation`` leaves unused as fresh root rollouts (``root_exchange`` units each).

    Used when a prompt has no (or too few) visited prefixes, e.g. every root rollout ended
    after one turn, so the prompt still receives its share of the budget.
    """
    out = {int(k): int(v) for k, v in allocation.items() if v}
    used = sum(v for k, v in out.items() if k != 0) + request.root_exchange * out.get(0, 0)
    extra = (request.budget - used) // request.root_exchange
    if extra > 0:
        out[0] = out.get(0, 0) + extra
    return out


def _nearest_half(values: NDArray[np.float64], keep: int) -> NDArray[np.int64]:
    order = np.lexsort((np.arange(values.shape[0]), np.abs(values - 0.5)))
    return order[:keep]


def root_repeat_probability(tree: RolloutTree, value: float) -> float:
    """q for the root seen as a prefix: the chance a fresh root rollout makes no new mixed group.

    ``value`` when every leaf succeeded, ``1 - value`` when every leaf failed, and 1 when the
    tree is already mixed: its root group already holds both outcomes, so another root
    rollout cannot make it effective (0 here would make a fresh root a sure gain and have
    ``trace+rootprefix`` buy roots for trees that are already mixed).
    """
    s, f = tree.outcome_counts()
    if s and f:
        return 1.0
    return float(value) if s else 1.0 - float(value)


def _exact_prefixes(request: ExpansionRequest, values: NDArray[np.float64],
                    root_value: float | None = None, *, flip_once: bool = False) -> dict[int, int]:
    nodes = list(request.candidates)
    q = list(np.atleast_1d(repeat_probability(np.clip(values, 0.0, 1.0), request.endings()))) if nodes else []
    costs = [1] * len(nodes)
    if root_value is not None:
        nodes.append(request.tree.root)
        q.append(root_repeat_probability(request.tree, root_value))
        costs.append(request.root_exchange)
    if not nodes:
        return {}
    if flip_once and not request.tree.is_mixed():
        counts = allocate_flip_once(np.asarray(q), request.budget, cap=request.prefix_cap,
                                    costs=costs if root_value is not None else None)
    else:
        counts = allocate_prefixes(np.asarray(q), request.budget, cap=request.prefix_cap,
                                   costs=costs if root_value is not None else None)
    return {n.node_id: k for n, k in zip(nodes, counts, strict=True) if k}


# --------------------------------------------------------------------------------------------------
# strategies


def _uniform(request: RootRequest) -> list[int]:
    """Equal groups on the first ``max_active`` prompts of the request (:func:`uniform_roots`)."""
    return uniform_roots(len(request.prompt_ids), request.root_budget, request.budget.max_active)


@dataclass(frozen=True, kw_only=True)
class _Flat:
    """A strategy that never branches: no continuations (its whole budget is ``budget.flat_roots`` roots)."""

    name: str
    branching: bool = False
    uses_predictor: bool = False

    def allocate_continuations(self, request: ExpansionRequest) -> dict[int, int]:
        return {}


@dataclass(frozen=True, kw_only=True)
class GRPO(_Flat):
    """Fixed group size, no branching: the first ``max_active`` prompts of the pool, equal groups.

    Spends ``budget.flat_roots`` root rollouts (the paper units of the branching budget).
    """

    name: str = "grpo"

    def allocate_roots(self, request: RootRequest) -> list[int]:
        return _uniform(request)


@dataclass(frozen=True, kw_only=True)
class PCL(_Flat):
    """Prompt filtering by the predictor: keep the ``max_active`` prompts with v-hat nearest 1/2, fixed n each."""

    name: str = "pcl"
    uses_predictor: bool = True

    def allocate_roots(self, request: RootRequest) -> list[int]:
        n = len(request.prompt_ids)
        keep = min(request.budget.max_active, n)
        chosen = _nearest_half(request.predicted(), keep)
        split = proportional_split([1.0] * keep, request.root_budget)
        out = [0] * n
        for idx, k in zip(chosen, split, strict=True):
            out[int(idx)] = k
        return out


@dataclass(frozen=True, kw_only=True)
class TreePO:
    """TreePO-style: uniform roots, continuations from uniformly random visited prefixes."""

    name: str = "treepo"
    branching: bool = True
    uses_predictor: bool = False

    def allocate_roots(self, request: RootRequest) -> list[int]:
        return _uniform(request)

    def allocate_continuations(self, request: ExpansionRequest) -> dict[int, int]:
        alloc = random_prefixes(request.candidates, request.budget, request.rng, cap=request.prefix_cap)
        return spend_rest_on_root(alloc, request)


@dataclass(frozen=True, kw_only=True)
class TRACE:
    """TRACE: exact root allocation on v-hat(x), exact prefix allocation with q = repeat_probability(v-hat, r).

    ``roots=False`` replaces stage 1 by uniform roots (the "prefix allocation only" ablation);
    ``prefixes=False`` replaces stage 2 by uniformly random prefixes ("root allocation only").
    ``root_prefix=True`` (an extension beyond the paper) also offers the root itself to the
    prefix problem, at ``root_exchange`` units per fresh root rollout, with
    q = :func:`root_repeat_probability` (solved exactly by the cost-aware DP).
    ``root_objective="share"`` maximises the expected effective ratio in stage 1 instead of the
    expected number of mixed groups; ``flip_once=True`` spends stage 2 of a tree whose roots all
    ended alike on the chance it becomes mixed (:func:`~trace_agent.allocation.allocate_flip_once`)
    instead of the expected flips (both the Oracle's, below).
    """

    name: str = "trace"
    branching: bool = True
    uses_predictor: bool = True
    roots: bool = True
    prefixes: bool = True
    root_prefix: bool = False
    root_objective: RootObjective = "sum"
    flip_once: bool = False

    def _root_values(self, request: RootRequest) -> NDArray[np.float64]:
        return request.predicted()

    def _node_values(self, request: ExpansionRequest) -> NDArray[np.float64]:
        return request.predicted()

    def _prompt_value(self, request: ExpansionRequest) -> float:
        root = request.tree.root
        return float(root.value) if root.value is not None else float(request.predicted([root])[0])

    def allocate_roots(self, request: RootRequest) -> list[int]:
        if not self.roots:
            return _uniform(request)
        return allocate_roots(self._root_values(request), request.root_budget,
                              cap=request.budget.effective_root_cap, max_active=request.budget.max_active,
                              objective=self.root_objective)

    def allocate_continuations(self, request: ExpansionRequest) -> dict[int, int]:
        if not self.prefixes:
            alloc = random_prefixes(request.candidates, request.budget, request.rng, cap=request.prefix_cap)
        else:
            root_value = self._prompt_value(request) if self.root_prefix else None
            values = self._node_values(request) if request.candidates else np.zeros(0)
            alloc = _exact_prefixes(request, values, root_value, flip_once=self.flip_once)
        return spend_rest_on_root(alloc, request)


@dataclass(frozen=True, kw_only=True)
class Oracle(TRACE):
    """Exact allocations on true success rates (Monte-Carlo from each anchor) that maximise the effective ratio.

    Stage 1 maximises the expected share of active prompts whose root group is mixed
    (``root_objective="share"``, exact: brute-force tested); stage 2 spends a tree whose roots
    all ended alike on the chance that it becomes mixed (``flip_once``); a tree already mixed
    keeps TRACE's expected-flips allocation (its effective status cannot change). Each stage is
    optimal given the other's outcome; the two stages are not optimised jointly (stage 1 does
    not count the continuations a prompt's roots will earn), so this bounds each stage of
    TRACE, not every conceivable two-stage policy. ``oracle-sum`` is TRACE's own objectives on
    true rates (the like-for-like bound on what a perfect predictor gives TRACE).

    Benchmark only: every candidate prompt and every visited prefix costs R extra policy
    rollouts (``TreeCollector``'s ``oracle_samples``), outside the budget; the collector
    reports that cost (``oracle_generated_tokens``, ``oracle_env_steps``).
    """

    name: str = "oracle"
    uses_predictor: bool = False
    root_objective: RootObjective = "share"
    flip_once: bool = True

    def _root_values(self, request: RootRequest) -> NDArray[np.float64]:
        return request.oracle()

    def _node_values(self, request: ExpansionRequest) -> NDArray[np.float64]:
        return request.oracle()

    def _prompt_value(self, request: ExpansionRequest) -> float:
        root = request.tree.root  # root.value holds the Monte-Carlo rate the roots were allocated with
        return float(root.value) if root.value is not None else float(request.oracle([root])[0])


#: The built-in strategies by name: what :func:`make_strategy` builds.
_BUILDERS: dict[str, Callable[[], Strategy]] = {
    "grpo": GRPO,
    "pcl": PCL,
    "treepo": TreePO,
    "trace": TRACE,
    "trace-root": lambda: TRACE(name="trace-root", prefixes=False),
    "trace-prefix": lambda: TRACE(name="trace-prefix", roots=False),
    "oracle": Oracle,
    "trace+rootprefix": lambda: TRACE(name="trace+rootprefix", root_prefix=True),
    "oracle+rootprefix": lambda: Oracle(name="oracle+rootprefix", root_prefix=True),
    "oracle-sum": lambda: Oracle(name="oracle-sum", root_objective="sum", flip_once=False),
}

#: Names accepted by :func:`make_strategy` (the keys of its table, in order).
STRATEGY_NAMES: tuple[str, ...] = tuple(_BUILDERS)


def make_strategy(name: str) -> Strategy:
    """A built-in strategy by name (see :data:`STRATEGY_NAMES`)."""
    try:
        return _BUILDERS[name]()
    except KeyError:
        raise ValueError(f"unknown strategy {name!r}; choose from {', '.join(STRATEGY_NAMES)}") from None
