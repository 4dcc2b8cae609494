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

Values a strategy reads are pushed, not pulled. A strategy declares them in ``reads``
(:class:`Reads`: which kinds of value, ``predicted`` or ``oracle``, of the candidate prompts,
of the visited prefixes and of the prompt itself); the collector computes exactly those
before it asks the strategy and passes them in the request, so an allocation is a pure
function of its request. ``predicted`` values come from the success predictor, ``oracle``
values are Monte-Carlo success rates (R policy rollouts from each anchor; benchmark only).
GRPO, TreePO and the ``trace-prefix`` ablation declare no prompt value and so never pay for
root predictions; only the Oracle pays for Monte-Carlo rollouts. A strategy reads its
request's values through ``predicted()`` / ``oracle()``; asking for a value it did not
declare raises :class:`~trace_agent.predictor.PredictionError`.

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
from types import MappingProxyType
from typing import Any, ClassVar, Literal, Protocol, runtime_checkable

import numpy as np
from numpy.typing import NDArray

from trace_agent.allocation import (
    RootObjective,
    allocate_flip_once,
    allocate_prefixes,
    allocate_roots,
    repeat_probability,
)
from trace_agent.budget import Budget, proportional_split
from trace_agent.errors import CollectionError
from trace_agent.predictor import PredictionError, checked_predictions
from trace_agent.tree import Node, RolloutTree

__all__ = [
    "Budget",
    "VALUE_KINDS",
    "ValueKind",
    "Reads",
    "READS_NOTHING",
    "reads_of",
    "recorded_values",
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
    "place_roots",
    "check_roots",
    "check_continuations",
]

#: A kind of success value: the predictor's v-hat, or a Monte-Carlo rate (benchmark only).
ValueKind = Literal["predicted", "oracle"]

#: The value kinds, in the order a request's values are computed.
VALUE_KINDS: tuple[ValueKind, ...] = ("predicted", "oracle")


# --------------------------------------------------------------------------------------------------
# requests


@dataclass(frozen=True, kw_only=True)
class Reads:
    """The success values a strategy reads: the collector computes exactly these and passes them in.

    Each field is a set of value kinds (:data:`VALUE_KINDS`: ``"predicted"``, the success
    predictor's v-hat; ``"oracle"``, a Monte-Carlo success rate, benchmark only), given as
    any iterable of them.

    Attributes:
        prompts: the kinds of every candidate prompt's value a :class:`RootRequest` carries.
        prefixes: the kinds of every visited prefix's value (the candidates) an
            :class:`ExpansionRequest` carries.
        root: the kinds of the prompt's own value an :class:`ExpansionRequest` carries for the
            tree's root, scored with the prefixes. Computed only when the root holds no value
            from root allocation (judged before any of the request's values are computed); when
            it does, a strategy reads that one as ``tree.root.value``.

    Within one request the kinds are computed in :data:`VALUE_KINDS` order, the root first
    and then the candidates in node order, in one call per kind.
    """

    prompts: frozenset[ValueKind] = frozenset()
    prefixes: frozenset[ValueKind] = frozenset()
    root: frozenset[ValueKind] = frozenset()

    def __post_init__(self) -> None:
        for name in ("prompts", "prefixes", "root"):
            chosen = frozenset(getattr(self, name))
            unknown = sorted(chosen - set(VALUE_KINDS))
            if unknown:
                raise ValueError(f"Reads.{name}: unknown value kind(s) {unknown}; the kinds are {list(VALUE_KINDS)}")
            object.__setattr__(self, name, chosen)

    @property
    def predictor(self) -> bool:
        """True when any value read is the predictor's (the trainer then keeps the predictor fitted)."""
        return "predicted" in self.prompts | self.prefixes | self.root

    def expansion(self, kind: ValueKind, tree: RolloutTree, candidates: Sequence[Node]) -> list[Node]:
        """The nodes whose ``kind`` values an expansion request of ``tree`` carries (root first)."""
        nodes: list[Node] = [tree.root] if kind in self.root and tree.root.value is None else []
        return nodes + list(candidates) if kind in self.prefixes else nodes


#: What a strategy without a ``reads`` attribute reads: nothing.
READS_NOTHING = Reads()


def reads_of(strategy: Any) -> Reads:
    """The :class:`Reads` a strategy declares (``strategy.reads``; :data:`READS_NOTHING` when it has none)."""
    reads = getattr(strategy, "reads", READS_NOTHING)
    if not isinstance(reads, Reads):
        raise TypeError(f"strategy {getattr(strategy, 'name', strategy)!r}: reads must be a Reads, "
                        f"got {type(reads).__name__}")
    return reads


def recorded_values(values: Mapping[ValueKind, NDArray[np.float64]]) -> NDArray[np.float64] | None:
    """The prompt values a collection records (``Collection.root_values``): the oracle's, else the predictor's."""
    for kind in reversed(VALUE_KINDS):
        if kind in values:
            return values[kind]
    return None


def _undeclared(kind: str, where: str) -> PredictionError:
    return PredictionError(f"this request carries no {kind} values of {where}: declare the kind in the "
                           f"strategy's reads (Reads.{where})")


@dataclass(frozen=True, kw_only=True)
class RootRequest:
    """Everything a strategy may use to place root rollouts on a candidate pool.

    Attributes:
        prompt_ids: the candidate pool, in pool order.
        budget: the batch budget.
        root_budget: root rollouts to place, exactly (:meth:`Budget.root_budget`).
        rng: a seeded generator for random choices.
        values: kind -> every candidate prompt's value, for the kinds the strategy reads
            (:attr:`Reads.prompts`); read them through :meth:`predicted` / :meth:`oracle`.
            Checked on construction (one finite value per prompt,
            :func:`~trace_agent.predictor.checked_predictions`).
    """

    prompt_ids: tuple[str, ...]
    budget: Budget
    root_budget: int
    rng: np.random.Generator
    values: Mapping[ValueKind, NDArray[np.float64]] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        checked = {}
        for kind, v in self.values.items():
            if kind not in VALUE_KINDS:
                raise ValueError(f"unknown value kind {kind!r}; the kinds are {list(VALUE_KINDS)}")
            if np.shape(v) != (len(self.prompt_ids),):
                raise ValueError(f"{kind} values for {np.size(v)} prompts, the pool has {len(self.prompt_ids)}")
            checked[kind] = checked_predictions(np.asarray(v, dtype=np.float64), len(self.prompt_ids))
        object.__setattr__(self, "values", MappingProxyType(checked))

    def _read(self, kind: ValueKind) -> NDArray[np.float64]:
        if kind not in self.values:
            raise _undeclared(kind, "prompts")
        return self.values[kind]

    def predicted(self) -> NDArray[np.float64]:
        """The predictor's v-hat for every candidate prompt (raises PredictionError when not declared)."""
        return self._read("predicted")

    def oracle(self) -> NDArray[np.float64]:
        """Monte-Carlo success rate of every candidate prompt (benchmark only; raises when not declared)."""
        return self._read("oracle")


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
        values: kind -> node id -> value, for the kinds and nodes the strategy reads
            (:meth:`Reads.expansion`); read them through :meth:`predicted` / :meth:`oracle`.
            The collector also keeps them on the nodes: ``node.value`` (predicted) and
            ``node.info["oracle_value"]``.
    """

    tree: RolloutTree
    budget: int
    candidates: tuple[Node, ...]
    root_exchange: int
    prefix_cap: int | None
    rng: np.random.Generator
    values: Mapping[ValueKind, Mapping[int, float]] = field(default_factory=dict, repr=False)

    def _read(self, kind: ValueKind, nodes: Sequence[Node] | None) -> NDArray[np.float64]:
        chosen = self.candidates if nodes is None else nodes
        table = self.values.get(kind, {})
        missing = [n.node_id for n in chosen if n.node_id not in table]
        if missing:
            raise _undeclared(kind, "root" if missing == [0] else "prefixes")
        return checked_predictions(np.asarray([table[n.node_id] for n in chosen], dtype=np.float64), len(chosen))

    def predicted(self, nodes: Sequence[Node] | None = None) -> NDArray[np.float64]:
        """The predictor's v-hat of ``nodes`` (default: the candidates); raises PredictionError when not carried."""
        return self._read("predicted", nodes)

    def oracle(self, nodes: Sequence[Node] | None = None) -> NDArray[np.float64]:
        """Monte-Carlo success rate from each node's snapshot (benchmark only; raises when not carried)."""
        return self._read("oracle", nodes)

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
            strategy (``budget.flat_roots`` root rollouts, no continuations):
            :meth:`Budget.root_budget`, :meth:`Budget.prompt_continuations`.
        reads: optional (default :data:`READS_NOTHING`): the values the strategy reads
            (:class:`Reads`); the collector computes exactly those and passes them in. The
            trainer keeps the success predictor fitted only for a strategy that reads it.

    Contract:
        * ``allocate_roots`` returns one non-negative int per ``request.prompt_ids`` entry,
          summing to ``request.root_budget``, with at most ``request.budget.max_active``
          positive entries. Prompts with 0 are skipped (no tree). Checked by :func:`check_roots`.
        * ``allocate_continuations`` returns ``{node_id: count}`` over ``request.candidates``
          (and optionally node 0, the root) whose cost ``sum(k) + (root_exchange - 1) * k_root``
          is at most ``request.budget`` (checked by :func:`check_continuations`). It is called
          once per prompt, on a thread of its own, as soon as the prompt's roots return; it
          must not depend on other prompts.
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
    reads: Reads = READS_NOTHING

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
    reads: Reads = Reads(prompts={"predicted"})

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
    roots: bool = True
    prefixes: bool = True
    root_prefix: bool = False
    root_objective: RootObjective = "sum"
    flip_once: bool = False
    #: The kind of value both stages read (the Oracle's: Monte-Carlo rates).
    source: ClassVar[ValueKind] = "predicted"

    @property
    def reads(self) -> Reads:
        """Prompt values for stage 1 (``roots``), prefix values for stage 2 (``prefixes``), and the
        prompt's own value at expansion when ``root_prefix`` (``tree.root.value`` when roots were
        allocated on values)."""
        kind = {self.source}
        return Reads(prompts=kind if self.roots else (), prefixes=kind if self.prefixes else (),
                     root=kind if self.prefixes and self.root_prefix else ())

    def _values(self, request: RootRequest | ExpansionRequest) -> NDArray[np.float64]:
        return request.predicted() if self.source == "predicted" else request.oracle()

    def _prompt_value(self, request: ExpansionRequest) -> float:
        root = request.tree.root
        if root.value is not None:
            return float(root.value)
        return float((request.predicted if self.source == "predicted" else request.oracle)([root])[0])

    def allocate_roots(self, request: RootRequest) -> list[int]:
        if not self.roots:
            return _uniform(request)
        return allocate_roots(self._values(request), request.root_budget,
                              cap=request.budget.effective_root_cap, max_active=request.budget.max_active,
                              objective=self.root_objective)

    def allocate_continuations(self, request: ExpansionRequest) -> dict[int, int]:
        if not self.prefixes:
            alloc = random_prefixes(request.candidates, request.budget, request.rng, cap=request.prefix_cap)
        else:
            root_value = self._prompt_value(request) if self.root_prefix else None
            values = self._values(request) if request.candidates else np.zeros(0)
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
    root_objective: RootObjective = "share"
    flip_once: bool = True
    source: ClassVar[ValueKind] = "oracle"


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


# --------------------------------------------------------------------------------------------------
# one root-allocation step, and the checks of a strategy's answers


def place_roots(strategy: Strategy, prompt_ids: Sequence[str], budget: Budget, *, rng: np.random.Generator,
                values: Mapping[ValueKind, NDArray[np.float64]]) -> list[int]:
    """Steps 1-2 of a batch: the strategy's root counts over ``prompt_ids``, checked.

    ``values`` are the prompt values the strategy reads (:attr:`Reads.prompts`); the root
    budget follows the flat-vs-branching rule (:meth:`Budget.root_budget`). Raises
    :class:`~trace_agent.errors.CollectionError` when the answer breaks the budget rules
    (:func:`check_roots`), :class:`~trace_agent.predictor.PredictionError` on a bad value.
    """
    request = RootRequest(prompt_ids=tuple(prompt_ids), budget=budget, root_budget=budget.root_budget(strategy.branching),
                          rng=rng, values=values)
    roots = [int(m) for m in strategy.allocate_roots(request)]
    check_roots(roots, request)
    return roots


def check_roots(roots: list[int], request: RootRequest) -> None:
    """Raise :class:`CollectionError` unless ``roots`` honours the root budget rules."""
    if len(roots) != len(request.prompt_ids):
        raise CollectionError(f"{len(roots)} root counts for {len(request.prompt_ids)} candidate prompts")
    if any(m < 0 for m in roots):
        raise CollectionError("root counts must be >= 0")
    if sum(roots) != request.root_budget:
        raise CollectionError(f"root counts sum to {sum(roots)}, the root budget is {request.root_budget}")
    active = sum(1 for m in roots if m > 0)
    if active > request.budget.max_active:
        raise CollectionError(f"{active} active prompts, at most {request.budget.max_active} allowed")


def check_continuations(allocation: Any, request: ExpansionRequest) -> list[tuple[Node, int]]:
    """The (node, count) pairs of a continuation allocation, in node order; raises when it breaks a rule."""
    allowed = {n.node_id: n for n in request.candidates}
    allowed[0] = request.tree.root
    out: list[tuple[Node, int]] = []
    cost = 0
    for key, amount in dict(allocation).items():
        node_id, k = int(key), int(amount)
        if node_id not in allowed:
            raise CollectionError(
                f"continuation from node {node_id} of {request.tree.prompt_id!r}: only the root and visited "
                f"non-leaf prefixes with a snapshot ({sorted(allowed)}) can be continued")
        if k < 0:
            raise CollectionError(f"negative continuation count {k} for node {node_id}")
        if k:
            out.append((allowed[node_id], k))
            cost += k * (request.root_exchange if node_id == 0 else 1)
    if cost > request.budget:
        raise CollectionError(
            f"continuations of {request.tree.prompt_id!r} cost {cost} units but its budget is {request.budget}")
    out.sort(key=lambda item: item[0].node_id)
    return out
