"""Root and prefix allocation (exact) and the probabilities behind them.

Everything here is a pure numpy function of its arguments. The root and the two prefix problems
share their validation and their tie rules, and each proof sits in its function's docstring
beside its brute-force-tested code, so they stay in one module.

Probabilities
    ``mixed_probability(v, m)``: chance that m rollouts at success rate v hold
    both a success and a failure, ``1 - v**m - (1 - v)**m`` for m >= 2, else 0.
    ``flip_probability(q, k)``: chance that k continuations from a prefix whose
    original ending repeats with probability q flip it at least once, ``1 - q**k``.

Root problem (:func:`allocate_roots`)
    maximise  sum_x P_mixed(v(x), m(x))                       (``objective="sum"``, the paper's)
    or        sum_x P_mixed(v(x), m(x)) / #{x : m(x) > 0}     (``objective="share"``: the expected
              effective ratio, the share of active prompts whose group is mixed)
    over      m(x) in {0, 2, 3, ..., cap},  sum_x m(x) == budget,
              #{x : m(x) > 0} <= max_active.
    Degenerate prompts (v exactly 0 or 1) are worth 0 at any count; rollouts an optimum must
    place on them are spread evenly over as many of them as the active limit allows.

Mixed-tree prefix problem (:func:`allocate_flip_once`)
    maximise  1 - prod_j q_j**k_j   over  k_j in {0, ..., cap},  sum_j k_j * cost_j <= budget:
    the chance that a tree whose rollouts all ended alike becomes mixed (the Oracle's stage 2).

Prefix problem (:func:`allocate_prefixes`)
    maximise  sum_j (1 - q_j**k_j)   over  k_j in {0, ..., cap},  sum_j k_j * cost_j <= budget.

The budget itself, its paper unit and its division between prompts and prefixes
(:func:`~trace_agent.budget.continuation_budget`, :func:`~trace_agent.budget.proportional_split`)
live in :mod:`trace_agent.budget`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray

from trace_agent.budget import proportional_split
from trace_agent.budget import whole_count as _whole
from trace_agent.errors import InfeasibleAllocation
from trace_agent.success import success_mask

if TYPE_CHECKING:  # pragma: no cover
    pass

__all__ = [
    "mixed_probability",
    "flip_probability",
    "repeat_probability",
    "root_objective",
    "prefix_objective",
    "allocate_roots",
    "allocate_prefixes",
    "allocate_flip_once",
    "spread_degenerate",
    "RootObjective",
]

#: Relative tolerance under which two root objectives count as tied (the smaller active count wins).
ROOT_TIE_RTOL = 1e-12
RootObjective = Literal["sum", "share"]


# --------------------------------------------------------------------------------------------------
# probabilities


def _as_unit_interval(name: str, x: ArrayLike) -> NDArray[np.float64]:
    arr = np.asarray(x, dtype=np.float64)
    if not np.all(np.isfinite(arr)) or np.any(arr < 0.0) or np.any(arr > 1.0):
        raise ValueError(f"{name} must be probabilities in [0, 1]; got values outside that range or NaN")
    return arr


def mixed_probability(v: ArrayLike, m: ArrayLike) -> NDArray[np.float64] | np.float64:
    """P_mixed(v, m) = 1 - v**m - (1 - v)**m for m >= 2, and 0 for m < 2 (vectorised, ufunc-like).

    The chance that m independent rollouts at success rate ``v`` contain at least
    one success and one failure. Broadcasts ``v`` against ``m``; returns a numpy
    scalar for scalar inputs and an array otherwise.
    """
    vv = _as_unit_interval("v", v)
    mm = np.asarray(m)
    if not np.issubdtype(mm.dtype, np.integer):
        if not np.all(np.equal(np.mod(mm, 1), 0)):
            raise ValueError("m must hold whole numbers of rollouts")
        mm = mm.astype(np.int64)
    safe = np.maximum(mm, 2)
    out = 1.0 - vv**safe - (1.0 - vv) ** safe
    out = np.where(mm >= 2, np.maximum(out, 0.0), 0.0)
    return out[()]


def flip_probability(q: ArrayLike, k: ArrayLike) -> NDArray[np.float64] | np.float64:
    """P_flip(q, k) = 1 - q**k (vectorised): k continuations flip an ending that repeats w.p. q at least once.

    ``k`` must be non-negative whole numbers; ``k = 0`` gives 0.
    """
    qq = _as_unit_interval("q", q)
    kk = np.asarray(k)
    if np.any(kk < 0):
        raise ValueError("k must be non-negative")
    return (1.0 - qq**kk)[()]


def repeat_probability(value: ArrayLike, reward: ArrayLike) -> NDArray[np.float64] | np.float64:
    """q for a prefix: the predicted chance a fresh continuation repeats the original ending.

    ``q = value`` where the original rollout succeeded
    (:func:`~trace_agent.success.success_mask`: reward >= 0.5) and ``1 - value`` where it
    failed. Vectorised.
    """
    vv = _as_unit_interval("value", value)
    return np.where(success_mask(reward), vv, 1.0 - vv)[()]


def root_objective(values: ArrayLike, counts: ArrayLike) -> float:
    """sum_x P_mixed(values[x], counts[x]): the root problem's objective for an allocation."""
    return float(np.sum(mixed_probability(np.asarray(values, dtype=np.float64), np.asarray(counts))))


def prefix_objective(repeat_probs: ArrayLike, counts: ArrayLike) -> float:
    """sum_j (1 - q_j**k_j): the prefix problem's objective for an allocation."""
    return float(np.sum(flip_probability(np.asarray(repeat_probs, dtype=np.float64), np.asarray(counts))))


# --------------------------------------------------------------------------------------------------
# validation helpers


def _optional_whole(name: str, x: Any) -> int | None:
    return None if x is None else _whole(name, x)


def _vector(name: str, x: ArrayLike) -> NDArray[np.float64]:
    arr = _as_unit_interval(name, x)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be one-dimensional, got shape {arr.shape}")
    return arr


# --------------------------------------------------------------------------------------------------
# root allocation


def allocate_roots(
    values: ArrayLike,
    budget: int,
    *,
    cap: int | None = None,
    max_active: int | None = None,
    objective: RootObjective = "sum",
) -> list[int]:
    """The exact optimum of the root problem: m(x) in {0, 2, ..., cap}, sum m == budget, <= max_active active.

    Args:
        values: predicted success rates v(x) in [0, 1], one per candidate prompt.
        budget: root rollouts to spend, exactly.
        cap: most rollouts one prompt may get (None: no cap beyond the budget).
        max_active: most prompts with m > 0 (None: no limit).
        objective: ``"sum"`` maximises sum_x P_mixed (the paper's TRACE); ``"share"`` maximises
            sum_x P_mixed / (active prompts), the expected effective ratio (the Oracle's).

    Returns:
        m, one int per candidate, maximising the objective. Among optima, the rollouts on
        degenerate prompts (v exactly 0 or 1, worth 0 at any count) are spread evenly over as
        many of them as ``max_active`` allows (:func:`spread_degenerate`), so a saturated or
        tied predictor does not put the root budget on one prompt.

    Raises:
        InfeasibleAllocation: no allocation meets the constraints (budget 1; cap < 2 with a
            positive budget; budget > cap * min(#candidates, max_active); an odd budget with
            cap 2; ...). The message names the binding constraint.

    Algorithm and proof of exactness. Write u = min(v, 1 - v); P_mixed depends on v only
    through u, and f(u, m) = 1 - u**m - (1 - u)**m has df/du = m((1 - u)**(m-1) - u**(m-1)) >= 0
    on [0, 1/2]: for every m a prompt closer to 1/2 is worth at least as much.

    1. Prefix lemma. Sort the candidates by u descending (ties: lower index first). Some
       optimum activates a prefix of that order: if an optimum activates i but not j with
       j before i, moving i's whole allocation to j keeps the budget and the active count
       and changes the objective by f(u_j, m_i) - f(u_i, m_i) >= 0. Repeating gives an
       optimum whose active set is the first ``a`` candidates, for some a.
    2. Fixed active set. With the first ``a`` candidates active, each gets 2 + e_i rollouts,
       e_i in [0, cap - 2], sum e_i = budget - 2a. h_i(e) = f(u_i, 2 + e) is concave in e:
       its increments g(u, m) = f(u, m+1) - f(u, m) = u**m (1 - u) + (1 - u)**m u decrease in
       m. A separable concave maximisation under one sum constraint is solved exactly by
       taking the budget - 2a largest increments over all items (each item's increments
       are non-increasing, so any top set is a union of per-item prefixes; Gross 1956).
    3. Enumerate a over every feasible size: ceil(budget / cap) <= a <= min(n, max_active,
       budget // 2), and keep the best. Steps 1-3 cover every optimum's value, so the result
       is optimal. Ties between sizes within ``ROOT_TIE_RTOL`` go to the smaller active count.
       Steps 1 and 2 hold for "exactly a active prompts" as well (the exchange in step 1 keeps
       the active count), so the per-size optima T(a) also give the exact ``share`` optimum,
       max_a T(a) / a.

    Evaluating every size. The sizes are processed in doubling groups [a, 2a - 1]. Within a
    group the increments of its candidates are sorted once in a strict, deterministic order
    (gain desc, then candidate, then rollout index), and 2-D prefix tables over (blocks of
    that order) x (candidates) give every "sum of the R_a largest increments among the first
    a candidates" at once, R_a = budget - 2a. Pruning is exact: the R_a-th largest increment
    t_a never decreases with a (a larger set, a smaller rank), so increments below the last
    threshold of the previous group are never taken by a later size and are not generated.
    With a cap this costs O(N log N) for N = a_max * (cap - 2) increments (about 10-30 ms for
    4,096 candidates, budget 16,384, cap 32, max_active 1,024); without a cap the pruning keeps
    the work near O(budget * log(a_max)) on typical pools, but a cap is the safe choice for big budgets.
    """
    v = _vector("values", values)
    n = int(v.shape[0])
    budget = _whole("budget", budget)
    cap = _optional_whole("cap", cap)
    max_active = _optional_whole("max_active", max_active)
    if objective not in ("sum", "share"):
        raise ValueError(f"objective must be 'sum' or 'share', got {objective!r}")
    if budget == 0:
        return [0] * n
    cap_eff = budget if cap is None else min(cap, budget)
    active_limit = n if max_active is None else min(n, max_active)
    if budget == 1:
        raise InfeasibleAllocation("budget 1 cannot be spent: an active prompt needs at least 2 rollouts")
    if cap_eff < 2:
        raise InfeasibleAllocation(f"cap {cap} < 2 leaves no allowed rollout count for budget {budget}")
    if active_limit == 0:
        why = "there are no candidates" if n == 0 else "max_active is 0"
        raise InfeasibleAllocation(f"budget {budget} cannot be spent: {why}")
    a_lo = -(-budget // cap_eff)
    a_hi = min(active_limit, budget // 2)
    if a_lo > a_hi:
        if a_lo > active_limit:
            raise InfeasibleAllocation(
                f"budget {budget} exceeds cap * min(candidates, max_active) = {cap_eff} * {active_limit}"
                f" = {cap_eff * active_limit}; raise cap or max_active, or lower the budget"
            )
        raise InfeasibleAllocation(
            f"budget {budget} cannot be split into counts in [2, {cap_eff}]: it needs at least {a_lo}"
            f" active prompts but at most {budget // 2} fit"
        )

    u = np.minimum(v, 1.0 - v)
    order = np.lexsort((np.arange(n), -u))[:a_hi]  # u desc, index asc
    us = u[order]
    base = 2.0 * us * (1.0 - us)  # f(u, 2)
    extra = cap_eff - 2
    sizes = np.arange(a_lo, a_hi + 1)
    remaining = budget - 2 * sizes  # extra rollouts to place for each size

    if extra == 0:
        totals = np.cumsum(base)[sizes - 1]
        best_a = int(sizes[_best_index(totals / sizes if objective == "share" else totals)])
        counts = np.full(best_a, 2, dtype=np.int64)
    else:
        # Candidate p only ever sits in prefixes a > p, where at most budget - 2(p + 1) extra
        # rollouts exist, so it needs at most that many increments.
        per_item = np.minimum(extra, budget - 2 * np.arange(a_hi) - 2)
        base_cum = np.cumsum(base)
        totals = np.empty(sizes.shape[0])
        floors = np.empty(sizes.shape[0])
        floor = 0.0
        a_s = a_lo
        while a_s <= a_hi:  # sizes in doubling groups [a_s, a_e], each pruned by the last threshold
            a_e = min(a_hi, 2 * a_s - 1) if a_s > 1 else 1
            sel = slice(a_s - a_lo, a_e - a_lo + 1)
            s_gain, s_item = _sorted_increments(us[:a_e], per_item[:a_e], floor)
            totals[sel] = base_cum[sizes[sel] - 1] + _top_sums_by_prefix(
                s_gain, s_item, a_e, sizes[sel], remaining[sel]
            )
            floors[sel] = floor
            floor = _threshold(s_gain, s_item, a_e, budget - 2 * a_e)
            a_s = a_e + 1
        best = _best_index(totals / sizes if objective == "share" else totals)
        best_a = int(sizes[best])
        r_best = int(remaining[best])
        s_gain, s_item = _sorted_increments(us[:best_a], per_item[:best_a], float(floors[best]))
        chosen = np.cumsum(np.ones_like(s_item)) <= r_best
        counts = 2 + np.bincount(s_item[chosen], minlength=best_a)[:best_a]

    result = np.zeros(n, dtype=np.int64)
    result[order[:best_a]] = counts
    out = [int(x) for x in result]
    if objective == "share":  # more active degenerate prompts would lower the share: keep the fewest
        return out
    return spread_degenerate(v, out, cap=cap_eff, max_active=active_limit)


def spread_degenerate(values: ArrayLike, counts: Sequence[int], *, cap: int, max_active: int) -> list[int]:
    """Spread the rollouts on degenerate prompts (v exactly 0 or 1) evenly over as many of them as fit.

    A degenerate prompt's P_mixed is 0 for every count, so moving rollouts among degenerate
    prompts leaves the ``sum`` objective unchanged (``allocate_roots`` applies it to that
    objective only: under ``share`` more active prompts would lower the share). The T
    rollouts they hold go to k = min(free active slots, degenerate candidates, T // 2) of them
    in candidate order, split by :func:`proportional_split` (each gets 2..cap). Why: an
    estimate of exactly 0 or 1 (a saturated predictor, a Monte-Carlo rate from a few samples)
    is the least trustworthy; spreading keeps the most prompts in play at no predicted cost.
    """
    v = np.asarray(values, dtype=np.float64)
    m = np.asarray(counts, dtype=np.int64).copy()
    zero = (v == 0.0) | (v == 1.0)
    total = int(m[zero].sum())
    if total == 0:
        return [int(x) for x in m]
    free = max_active - int(np.count_nonzero((m > 0) & ~zero))
    k = min(free, int(np.count_nonzero(zero)), total // 2)
    if k < 1 or -(-total // k) > cap:  # pragma: no cover - the optimum's own placement always fits
        return [int(x) for x in m]
    idx = np.flatnonzero(zero)[:k]
    m[zero] = 0
    m[idx] = proportional_split([1.0] * k, total)
    return [int(x) for x in m]


def _increment(u: NDArray[np.float64], m: NDArray[np.int64]) -> NDArray[np.float64]:
    """g(u, m) = f(u, m + 1) - f(u, m) = u**m (1 - u) + (1 - u)**m u, computed without cancellation."""
    return u**m * (1.0 - u) + (1.0 - u) ** m * u


def _sorted_increments(
    us: NDArray[np.float64], per_item: NDArray[np.int64], floor: float
) -> tuple[NDArray[np.float64], NDArray[np.int64]]:
    """The increments g(u_p, 2 + j), j < per_item[p], that are >= floor, in the strict allocation order.

    The order is (gain desc, item asc, j asc). Each item's increments decrease in j, so the
    kept ones are a per-item prefix, found by a vectorised binary search.
    """
    if floor > 0.0:
        lo = np.zeros_like(per_item)
        hi = per_item.copy()
        while np.any(lo < hi):
            mid = (lo + hi + 1) // 2
            ok = _increment(us, 2 + np.maximum(mid - 1, 0)) >= floor
            lo = np.where(lo < hi, np.where(ok, mid, lo), lo)
            hi = np.where(lo < hi, np.where(ok, hi, mid - 1), hi)
        keep = lo
    else:
        keep = per_item
    total = int(keep.sum())
    item = np.repeat(np.arange(us.shape[0]), keep)
    starts = np.cumsum(keep) - keep
    j = np.arange(total) - np.repeat(starts, keep)
    gain = _increment(us[item], 2 + j)
    rank = np.argsort(-gain, kind="stable")  # generated in (item, j) order: stable = the tie-break
    return gain[rank], item[rank]


def _threshold(s_gain: NDArray[np.float64], s_item: NDArray[np.int64], size: int, r: int) -> float:
    """The gain of the r-th increment taken by prefix ``size`` (+inf when r == 0: nothing is ever taken)."""
    if r <= 0:
        return math.inf
    pos = np.flatnonzero(s_item < size)
    return float(s_gain[pos[r - 1]])


def _best_index(totals: NDArray[np.float64]) -> int:
    best = float(np.max(totals))
    tol = ROOT_TIE_RTOL * max(1.0, abs(best))
    return int(np.flatnonzero(totals >= best - tol)[0])


def _top_sums_by_prefix(
    s_gain: NDArray[np.float64],
    s_item: NDArray[np.int64],
    n_items: int,
    sizes: NDArray[np.int64],
    remaining: NDArray[np.int64],
) -> NDArray[np.float64]:
    """For each size a: the sum of the first remaining[a] entries of s_gain among items < a.

    ``s_gain`` is sorted in the strict allocation order, ``s_item`` gives each entry's item;
    ``sizes`` is increasing and at most ``n_items``. Blocked 2-D prefix counts/sums over
    (block of the order, item column) locate, for every size at once, the block holding the
    R-th qualifying entry; one masked cumsum inside that block finishes the job. Items below
    the smallest size belong to every size and share one column. Sizes with R = 0 get 0.
    """
    n_units = int(s_gain.shape[0])
    n_sizes = int(sizes.shape[0])
    first = int(sizes[0])
    width = n_items - first + 2  # column 0: items < first; column p - first + 1: item p; last: padding
    block = max(32, int(math.sqrt(n_units * width / max(n_sizes, 1))))
    n_blocks = max(1, -(-n_units // block))
    pad = n_blocks * block - n_units
    item_p = np.concatenate([s_item, np.full(pad, n_items, dtype=s_item.dtype)])
    gain_p = np.concatenate([s_gain, np.zeros(pad)])
    col = np.maximum(item_p - first + 1, 0)
    key = (np.arange(n_blocks * block) // block) * width + col
    cnt = np.bincount(key, minlength=n_blocks * width).reshape(n_blocks, width)
    sm = np.bincount(key, weights=gain_p, minlength=n_blocks * width).reshape(n_blocks, width)
    # members of size a = columns < a - first + 1: exclusive prefix over columns, then over blocks
    cols = sizes - first + 1
    c_cnt = np.cumsum(np.cumsum(cnt, axis=1)[:, cols - 1], axis=0)  # (n_blocks, n_sizes)
    c_sum = np.cumsum(np.cumsum(sm, axis=1)[:, cols - 1], axis=0)

    target_block = np.sum(c_cnt < remaining[None, :], axis=0)  # first block reaching R
    positive = remaining > 0
    tb = np.minimum(target_block, n_blocks - 1)
    prev = tb - 1
    at = np.arange(n_sizes)
    before_cnt = np.where(prev >= 0, c_cnt[np.maximum(prev, 0), at], 0)
    before_sum = np.where(prev >= 0, c_sum[np.maximum(prev, 0), at], 0.0)
    need = remaining - before_cnt
    idx = tb[:, None] * block + np.arange(block)[None, :]
    member = item_p[idx] < sizes[:, None]
    take = member & (np.cumsum(member, axis=1) <= need[:, None])
    partial = np.sum(np.where(take, gain_p[idx], 0.0), axis=1)
    return np.where(positive, before_sum + partial, 0.0)


# --------------------------------------------------------------------------------------------------
# prefix allocation


def allocate_prefixes(
    repeat_probs: ArrayLike,
    budget: int,
    *,
    cap: int | None = None,
    costs: Sequence[int] | None = None,
) -> list[int]:
    """The exact optimum of the prefix problem: maximise sum_j (1 - q_j**k_j), sum_j k_j * cost_j <= budget.

    Args:
        repeat_probs: q_j in [0, 1], the predicted chance that a continuation from prefix j
            repeats its original ending (see :func:`repeat_probability`).
        budget: continuation budget of the prompt (in cost units).
        cap: most continuations one prefix may get (None: no cap beyond the budget).
        costs: positive integer cost of one continuation from each prefix (None: all 1).

    Returns:
        k, one int per prefix.

    Unit costs (exact greedy). The increment of prefix j's k-th continuation is
    q_j**k (1 - q_j), non-increasing in k, so the objective is separable concave and
    taking the min(budget, sum of caps) largest increments is optimal (Gross 1956). Ties
    are broken by (k, prefix index): tied increments go round-robin over the prefixes, so the
    result is deterministic and a tied or degenerate set of prefixes shares the budget;
    zero-gain increments are taken too, so the whole budget is spent whenever the caps allow it. O(P * min(cap,
    budget)) time and memory (one prompt's prefixes: tens of microseconds).

    General costs (exact DP). A bounded knapsack with concave item values: dynamic
    programming over the exact cost spent, O(P * budget * K) time for P prefixes and
    K = max per-prefix count. Among optimal allocations the one spending the most budget
    is returned; remaining ties go to fewer continuations on later prefixes.

    Raises:
        ValueError: on probabilities outside [0, 1], negative budget or cap, non-positive costs.
    """
    q, budget, cap, cost = _prefix_inputs(repeat_probs, budget, cap, costs)
    n = int(q.shape[0])
    if n == 0 or budget == 0 or cap == 0:
        return [0] * n
    if np.all(cost == 1):
        return _prefix_greedy(q, budget, budget if cap is None else min(cap, budget))
    return _prefix_dp(q, budget, cap, cost)



def _prefix_inputs(repeat_probs: Sequence[float], budget: int, cap: int | None,
                   costs: Sequence[int] | None) -> tuple[NDArray[np.float64], int, int | None, NDArray[np.int64]]:
    """The validated inputs of a prefix problem: (q, budget, cap, per-prefix integer costs, default 1)."""
    q = _vector("repeat_probs", repeat_probs)
    n = int(q.shape[0])
    budget, cap = _whole("budget", budget), _optional_whole("cap", cap)
    if costs is None:
        cost = np.ones(n, dtype=np.int64)
    else:
        cost = np.asarray([_whole("costs[j]", c, minimum=1) for c in costs], dtype=np.int64)
        if cost.shape[0] != n:
            raise ValueError(f"costs has {cost.shape[0]} entries for {n} prefixes")
    return q, budget, cap, cost

def _prefix_greedy(q: NDArray[np.float64], budget: int, cap: int) -> list[int]:
    n = q.shape[0]
    take_total = min(budget, n * cap)
    k = np.arange(cap)
    gains = (q[:, None] ** k[None, :]) * (1.0 - q[:, None])
    # column-major: (k, prefix) order = the tie-break order, so tied increments (equal q, or the
    # zero gains of q = 1 prefixes) go round-robin over the prefixes; within a prefix k ascends,
    # so every chosen set is still a union of per-prefix prefixes (the greedy stays exact)
    flat = gains.T.ravel()
    if take_total == flat.shape[0]:
        return [cap] * n
    threshold = np.partition(flat, flat.shape[0] - take_total)[flat.shape[0] - take_total]
    above = flat > threshold
    at = np.flatnonzero(flat == threshold)
    chosen = above.copy()
    chosen[at[: take_total - int(np.count_nonzero(above))]] = True
    return [int(x) for x in chosen.reshape(cap, n).sum(axis=0)]


def _prefix_dp(q: NDArray[np.float64], budget: int, cap: int | None, cost: NDArray[np.int64]) -> list[int]:
    n = q.shape[0]
    neg = -np.inf
    dp = np.full(budget + 1, neg)
    dp[0] = 0.0
    choice = np.zeros((n, budget + 1), dtype=np.int64)
    for j in range(n):
        c = int(cost[j])
        kmax = budget // c if cap is None else min(cap, budget // c)
        ks = np.arange(kmax + 1)
        value = 1.0 - q[j] ** ks
        cand = np.full((kmax + 1, budget + 1), neg)
        for k in range(kmax + 1):
            shift = k * c
            cand[k, shift:] = dp[: budget + 1 - shift] + value[k]
        best_k = np.argmax(cand, axis=0)  # first maximum: the fewest continuations
        dp = cand[best_k, np.arange(budget + 1)]
        choice[j] = best_k
    best = float(np.max(dp))
    b = int(np.flatnonzero(dp == best)[-1])  # spend the most budget among optima
    out = [0] * n
    for j in range(n - 1, -1, -1):
        k = int(choice[j, b])
        out[j] = k
        b -= k * int(cost[j])
    return out


def allocate_flip_once(
    repeat_probs: ArrayLike,
    budget: int,
    *,
    cap: int | None = None,
    costs: Sequence[int] | None = None,
) -> list[int]:
    """The exact optimum of ``1 - prod_j q_j**k_j`` over ``sum_j k_j cost_j <= budget``, ``k_j <= cap``.

    The chance that at least one continuation flips its prefix's ending: for a tree whose
    rollouts all ended alike, the chance it becomes mixed (the Oracle's stage 2; TRACE's
    prefix problem maximises the expected number of flips instead). Equivalent to minimising
    sum_j k_j log q_j: a bounded knapsack with linear values, solved exactly by dynamic
    programming over the budget (O(P * budget * K)). A prefix with q = 0 flips surely: one
    continuation there is optimal. Ties go to spending more budget, then to fewer
    continuations on later prefixes (as :func:`allocate_prefixes`' DP).
    """
    q, budget, cap, cost = _prefix_inputs(repeat_probs, budget, cap, costs)
    n = int(q.shape[0])
    if n == 0 or budget == 0 or cap == 0:
        return [0] * n
    sure = np.flatnonzero((q == 0.0) & (cost <= budget))
    if sure.size:  # a sure flip: the product is 0, nothing can do better
        out = [0] * n
        out[int(sure[np.argmin(cost[sure])])] = 1
        return out
    with np.errstate(divide="ignore"):
        logq = np.log(q)  # <= 0; -inf only for q == 0 prefixes that cost more than the budget (k = 0 there)
    neg = np.inf
    dp = np.full(budget + 1, neg)  # minimal sum k log q at exact spend
    dp[0] = 0.0
    choice = np.zeros((n, budget + 1), dtype=np.int64)
    for j in range(n):
        c = int(cost[j])
        kmax = budget // c if cap is None else min(cap, budget // c)
        cand = np.full((kmax + 1, budget + 1), neg)
        for k in range(kmax + 1):
            shift = k * c
            cand[k, shift:] = dp[: budget + 1 - shift] + (k * logq[j] if k else 0.0)
        best_k = np.argmin(cand, axis=0)
        dp = cand[best_k, np.arange(budget + 1)]
        choice[j] = best_k
    best = float(np.min(dp))
    b = int(np.flatnonzero(dp <= best + 1e-12 * max(1.0, abs(best)))[-1])
    out = [0] * n
    for j in range(n - 1, -1, -1):
        k = int(choice[j, b])
        out[j] = k
        b -= k * int(cost[j])
    return out
