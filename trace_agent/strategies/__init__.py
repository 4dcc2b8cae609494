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

from trace_agent.budget import Budget
from trace_agent.strategies.blocks import (
    random_prefixes,
    root_repeat_probability,
    spend_rest_on_root,
    uniform_roots,
)
from trace_agent.strategies.builtin import GRPO, PCL, STRATEGY_NAMES, TRACE, Oracle, TreePO, make_strategy
from trace_agent.strategies.protocol import (
    READS_NOTHING,
    VALUE_KINDS,
    ExpansionRequest,
    Reads,
    RootRequest,
    Strategy,
    ValueKind,
    check_continuations,
    check_roots,
    place_roots,
    reads_of,
    recorded_values,
    rollout_ending,
)

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
