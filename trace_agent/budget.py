"""The rollout budget in one place: the paper's (M, N) shape, its unit, and what was spent.

The paper's unit is a full rollout; a continuation from the middle of a trajectory costs
about half of one, so M root rollouts with N continuations each cost M * (1 + N/2)
(:func:`paper_budget`; with the default cost of 1/2, (1024, 2) and (512, 6) both cost 2048).

- :class:`Budget` - one batch's budget (M, N, the group size that bounds the active prompts,
  the continuation cost, the caps); the training config holds one
  (:attr:`trace_agent.config.RolloutSettings.budget`, ``rollout.budget.*``) and the strategies read it.
- :func:`paper_budget` - the planned cost of (M, N); :func:`spent_units` - the cost of
  rollouts that ran (roots at 1, continuations at the cost each).
- :func:`continuation_cost` - the one validation of a continuation's price, (0, 1].
- :func:`continuation_budget` and :func:`proportional_split` - a budget divided between prompts
  and prefixes (whole rollouts, summing exactly).

What a batch really cost (generated and observation tokens, env steps) is counted from its trees
(:func:`trace_agent.tree_stats.batch_stats`), beside its paper units.

Pure Python; importing it imports nothing heavy.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    pass

__all__ = [
    "PAPER_CONTINUATION_COST",
    "Budget",
    "continuation_budget",
    "continuation_cost",
    "paper_budget",
    "proportional_split",
    "spent_units",
    "whole_count",
]


def whole_count(name: str, x: Any, *, minimum: int = 0) -> int:
    """``x`` as an int >= ``minimum``: ``TypeError`` for a bool or a non-integer, ``ValueError`` below ``minimum``."""
    if isinstance(x, bool):
        raise TypeError(f"{name} must be an int, got bool")
    try:
        value = operator.index(x)
    except TypeError:
        raise TypeError(f"{name} must be an int, got {type(x).__name__}") from None
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value



#: The paper's price of one continuation in full-rollout units: the one default of every ``continuation_cost``
#: (:class:`Budget`, the functions here, ``rollout.budget.continuation_cost``, the trees' statistics, verl's section).
PAPER_CONTINUATION_COST: float = 0.5


def continuation_cost(x: Any) -> float:
    """``x`` as the paper-unit price of one continuation: a finite number in (0, 1] (1/2 in the paper)."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        raise TypeError(f"continuation_cost must be a number, got {type(x).__name__}")
    if not (math.isfinite(x) and 0.0 < x <= 1.0):
        raise ValueError(f"continuation_cost must be in (0, 1], got {x}")
    return float(x)


def paper_budget(roots: int, continuations_per_root: float, *,
                 continuation_cost: float = PAPER_CONTINUATION_COST) -> float:
    """The paper's budget unit for M roots with N continuations each: M * (1 + N * continuation_cost).

    With the default cost of 1/2, (1024, 2) and (512, 6) both cost 2048.
    """
    m = whole_count("roots", roots)
    if continuations_per_root < 0:
        raise ValueError(f"continuations_per_root must be >= 0, got {continuations_per_root}")
    return m * (1.0 + continuations_per_root * _price(continuation_cost))


def spent_units(root_rollouts: int, continuations: int, *,
                continuation_cost: float = PAPER_CONTINUATION_COST) -> float:
    """Paper units of rollouts that ran: 1 per root rollout, ``continuation_cost`` per continuation."""
    return root_rollouts + _price(continuation_cost) * continuations


_price = continuation_cost  # the parameters above share the function's name


@dataclass(frozen=True, kw_only=True)
class Budget:
    """The batch budget in the paper's (M, N) shape.

    It is the training config's ``rollout.budget`` section (:attr:`trace_agent.config.RolloutSettings.budget`):
    its defaults are every entry point's, and its checks are the config's.

    Attributes:
        roots: M, root rollouts per batch for a branching strategy.
        continuations_per_root: N, continuation units per root rollout (a prompt with m roots
            gets ``N * m``).
        group_size: rollouts per prompt of the fixed-size baseline; ``roots / group_size`` is
            the most distinct prompts any strategy may activate (``max_active``). Its default is every
            entry point's (``rollout.budget.group_size``, ``trace-gym bench --group-size``).
        continuation_cost: paper units charged per continuation (:data:`PAPER_CONTINUATION_COST`, the paper's 1/2).
        root_cap: most root rollouts one prompt may get (None: ``4 * group_size``).
        prefix_cap: most continuations from one prefix (None: no cap).
    """

    roots: int = 16
    continuations_per_root: int = 1
    group_size: int = 4
    continuation_cost: float = PAPER_CONTINUATION_COST
    root_cap: int | None = None
    prefix_cap: int | None = None

    def __post_init__(self) -> None:
        if self.roots < 2 or self.group_size < 2:
            raise ValueError(f"roots and group_size must be >= 2, got {self.roots} and {self.group_size}")
        if self.roots % self.group_size:
            raise ValueError(f"roots ({self.roots}) must be a multiple of group_size ({self.group_size})")
        if self.continuations_per_root < 0:
            raise ValueError(f"continuations_per_root must be >= 0, got {self.continuations_per_root}")
        _price(self.continuation_cost)
        if self.root_cap is not None and self.root_cap < 2:
            raise ValueError(f"root_cap must be >= 2 or None, got {self.root_cap}")
        if self.prefix_cap is not None and self.prefix_cap < 1:
            raise ValueError(f"prefix_cap must be >= 1 or None, got {self.prefix_cap}")

    @classmethod
    def parse(cls, text: str, **kwargs: Any) -> Budget:
        """``"M,N"`` (e.g. ``"32,2"``) plus keyword fields."""
        try:
            m, n = (int(x) for x in text.split(","))
        except ValueError:
            raise ValueError(f"a budget is 'M,N' (root rollouts, continuations per root), got {text!r}") from None
        return cls(roots=m, continuations_per_root=n, **kwargs)

    @property
    def max_active(self) -> int:
        """Most prompts with a positive root count: the fixed-size baseline's prompts per batch."""
        return self.roots // self.group_size

    @property
    def continuations(self) -> int:
        """M * N: the batch's continuation units for a branching strategy."""
        return self.roots * self.continuations_per_root

    @property
    def paper_units(self) -> float:
        """M * (1 + N * continuation_cost) (:func:`paper_budget`)."""
        return paper_budget(self.roots, self.continuations_per_root, continuation_cost=self.continuation_cost)

    @property
    def root_exchange(self) -> int:
        """Continuation units one extra root rollout costs (1 / continuation_cost, rounded)."""
        return max(1, round(1.0 / self.continuation_cost))

    @property
    def flat_roots(self) -> int:
        """Root rollouts a non-branching strategy spends for the same paper units."""
        return self.roots + self.continuations // self.root_exchange

    @property
    def effective_root_cap(self) -> int:
        return 4 * self.group_size if self.root_cap is None else self.root_cap

    def root_budget(self, branching: bool) -> int:
        """Root rollouts a strategy places: M when it branches, :attr:`flat_roots` when it does not.

        With :meth:`prompt_continuations` this is the one flat-vs-branching rule: a flat
        strategy spends the batch's paper units as root rollouts only.
        """
        return self.roots if branching else self.flat_roots

    def prompt_continuations(self, roots: int, *, branching: bool = True) -> int:
        """A prompt's continuation units: N per root rollout for a branching strategy, 0 for a flat one."""
        return self.continuations_per_root * int(roots) if branching else 0


def continuation_budget(root_rollouts: int, ratio: float) -> int:
    """A prompt's continuation budget, proportional to its root rollouts: round(ratio * root_rollouts).

    Rounds to the nearest integer with halves rounded up (a 1e-9 slack absorbs binary
    representation error, so 0.1 * 30 gives 3, and 0.5 * 3 gives 2). A prompt with no
    root rollouts gets 0.
    """
    m = whole_count("root_rollouts", root_rollouts)
    if not (math.isfinite(ratio) and ratio >= 0.0):
        raise ValueError(f"ratio must be a finite number >= 0, got {ratio}")
    return int(math.floor(ratio * m + 0.5 + 1e-9))


def proportional_split(shares: Sequence[float], total: int) -> list[int]:
    """Split an integer ``total`` proportionally to non-negative ``shares``, summing exactly to ``total``.

    Largest-remainder (Hamilton) rounding: floor of each quota, then the leftover units
    go to the largest fractional parts, ties to the lower index. All-zero shares with a
    positive total raise ValueError.
    """
    total = whole_count("total", total)
    import numpy as np  # here, so that importing this module stays light

    s = np.asarray(shares, dtype=np.float64)
    if s.ndim != 1 or not np.all(np.isfinite(s)) or np.any(s < 0):
        raise ValueError("shares must be a 1-D sequence of finite numbers >= 0")
    if total == 0:
        return [0] * int(s.shape[0])
    if s.sum() <= 0:
        raise ValueError(f"cannot split {total} units over shares that are all zero")
    quota = s / s.sum() * total
    base = np.floor(quota).astype(np.int64)
    left = total - int(base.sum())
    frac = quota - base
    order = np.lexsort((np.arange(s.shape[0]), -frac))
    base[order[:left]] += 1
    return [int(x) for x in base]
