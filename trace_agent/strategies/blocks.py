"""Pure building blocks of strategies, reusable by a user's strategy: uniform roots, random prefixes, the rest on
the root, the root seen as a prefix, the exact prefix allocation on values."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from numpy.typing import NDArray

from trace_agent.allocation import allocate_flip_once, allocate_prefixes, repeat_probability
from trace_agent.budget import proportional_split
from trace_agent.strategies.protocol import ExpansionRequest
from trace_agent.tree import Node, RolloutTree

__all__ = ["uniform_roots", "random_prefixes", "spend_rest_on_root", "root_repeat_probability", "exact_prefixes",
           "nearest_half"]


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


def nearest_half(values: NDArray[np.float64], keep: int) -> NDArray[np.int64]:
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


def exact_prefixes(request: ExpansionRequest, values: NDArray[np.float64],
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
