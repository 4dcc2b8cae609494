"""What a strategy is given and what it answers: the values it reads, its two requests, its protocol, the checks.

See :mod:`trace_agent.strategies` for the contract as a whole.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal, Protocol, runtime_checkable

import numpy as np
from numpy.typing import NDArray

from trace_agent.budget import Budget
from trace_agent.errors import CollectionError
from trace_agent.predictor import PredictionError, checked_predictions
from trace_agent.tree import Node, RolloutTree

__all__ = [
    "VALUE_KINDS",
    "ValueKind",
    "Reads",
    "READS_NOTHING",
    "reads_of",
    "recorded_values",
    "RootRequest",
    "ExpansionRequest",
    "rollout_ending",
    "Strategy",
    "place_roots",
    "check_roots",
    "check_continuations",
]

#: A kind of success value: the predictor's v-hat, or a Monte-Carlo rate (benchmark only).
ValueKind = Literal["predicted", "oracle"]

#: The value kinds, in the order a request's values are computed.
VALUE_KINDS: tuple[ValueKind, ...] = ("predicted", "oracle")


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
