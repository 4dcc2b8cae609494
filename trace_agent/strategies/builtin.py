"""The built-in strategies: GRPO, PCL, TreePO, TRACE (and its ablations), the Oracle; :func:`make_strategy` by name."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
from numpy.typing import NDArray

from trace_agent.allocation import RootObjective, allocate_roots
from trace_agent.budget import proportional_split
from trace_agent.strategies.blocks import (
    exact_prefixes,
    nearest_half,
    random_prefixes,
    spend_rest_on_root,
    uniform_roots,
)
from trace_agent.strategies.protocol import (
    READS_NOTHING,
    ExpansionRequest,
    Reads,
    RootRequest,
    Strategy,
    ValueKind,
)

__all__ = ["GRPO", "PCL", "TreePO", "TRACE", "Oracle", "STRATEGY_NAMES", "make_strategy"]


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
        chosen = nearest_half(request.predicted(), keep)
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
            alloc = exact_prefixes(request, values, root_value, flip_once=self.flip_once)
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
