"""The rollout budget in one place: the paper's (M, N) shape, its unit, and what was spent.

The paper's unit is a full rollout; a continuation from the middle of a trajectory costs
about half of one, so M root rollouts with N continuations each cost M * (1 + N/2)
(:func:`paper_budget`; with the default cost of 1/2, (1024, 2) and (512, 6) both cost 2048).

- :class:`Budget` - one batch's budget (M, N, the group size that bounds the active prompts,
  the continuation cost, the caps); ``RolloutSettings`` builds one
  (:attr:`trace_agent.config.RolloutSettings.budget`) and the strategies read it.
- :func:`paper_budget` - the planned cost of (M, N); :func:`spent_units` - the cost of
  rollouts that ran (roots at 1, continuations at the cost each).
- :class:`BudgetConfig` / :class:`BudgetAccount` - a running account in paper units (flat or
  depth-proportional continuation charges) and in real work (generated and appended
  observation tokens, env steps), side by side.

Pure Python; importing it imports nothing heavy.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from trace_agent.tree import RolloutTree

__all__ = [
    "Budget",
    "paper_budget",
    "spent_units",
    "BudgetConfig",
    "BudgetAccount",
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



def paper_budget(roots: int, continuations_per_root: float, *, continuation_cost: float = 0.5) -> float:
    """The paper's budget unit for M roots with N continuations each: M * (1 + N * continuation_cost).

    With the default cost of 1/2, (1024, 2) and (512, 6) both cost 2048.
    """
    m = whole_count("roots", roots)
    if continuations_per_root < 0 or continuation_cost < 0:
        raise ValueError("continuations_per_root and continuation_cost must be >= 0")
    return m * (1.0 + continuations_per_root * continuation_cost)


def spent_units(root_rollouts: int, continuations: int, *, continuation_cost: float = 0.5) -> float:
    """Paper units of rollouts that ran: 1 per root rollout, ``continuation_cost`` per continuation."""
    return root_rollouts + continuation_cost * continuations


@dataclass(frozen=True, kw_only=True)
class Budget:
    """The batch budget in the paper's (M, N) shape.

    Attributes:
        roots: M, root rollouts per batch for a branching strategy.
        continuations_per_root: N, continuation units per root rollout (a prompt with m roots
            gets ``N * m``).
        group_size: rollouts per prompt of the fixed-size baseline; ``roots / group_size`` is
            the most distinct prompts any strategy may activate (``max_active``).
        continuation_cost: paper units charged per continuation (1/2 in the paper).
        root_cap: most root rollouts one prompt may get (None: ``4 * group_size``).
        prefix_cap: most continuations from one prefix (None: no cap).
    """

    roots: int
    continuations_per_root: int
    group_size: int = 8
    continuation_cost: float = 0.5
    root_cap: int | None = None
    prefix_cap: int | None = None

    def __post_init__(self) -> None:
        if self.roots < 2 or self.group_size < 2:
            raise ValueError(f"roots and group_size must be >= 2, got {self.roots} and {self.group_size}")
        if self.roots % self.group_size:
            raise ValueError(f"roots ({self.roots}) must be a multiple of group_size ({self.group_size})")
        if self.continuations_per_root < 0:
            raise ValueError(f"continuations_per_root must be >= 0, got {self.continuations_per_root}")
        if not 0.0 < self.continuation_cost <= 1.0:
            raise ValueError(f"continuation_cost must be in (0, 1], got {self.continuation_cost}")
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

    def prompt_continuations(self, roots: int) -> int:
        """A prompt's continuation units: N per root rollout."""
        return self.continuations_per_root * int(roots)


@dataclass(frozen=True, kw_only=True)
class BudgetConfig:
    """How a continuation is charged in the paper's unit (a full rollout = 1).

    Attributes:
        continuation_cost: paper units charged for one continuation (default 1/2, the paper's
            "a replay from the middle costs about half a rollout").
        depth_proportional: when True and the depths are known, charge a continuation
            (turns it generated) / (depth of its leaf) instead, the share of a full
            rollout it actually re-ran; ``continuation_cost`` is the fallback.
    """

    continuation_cost: float = 0.5
    depth_proportional: bool = False

    def __post_init__(self) -> None:
        if not (math.isfinite(self.continuation_cost) and 0.0 <= self.continuation_cost <= 1.0):
            raise ValueError(f"continuation_cost must be in [0, 1], got {self.continuation_cost}")

    def charge(self, *, new_turns: int | None = None, leaf_depth: int | None = None) -> float:
        """Paper units for one continuation that generated ``new_turns`` turns ending at ``leaf_depth``."""
        if self.depth_proportional and new_turns is not None and leaf_depth:
            return min(1.0, max(0.0, new_turns / leaf_depth))
        return self.continuation_cost


@dataclass(kw_only=True)
class BudgetAccount:
    """Running totals of what rollouts cost, in the paper's unit and in real work.

    ``charge_root`` / ``charge_continuation`` add one rollout each; ``charge_tree`` adds
    every rollout of a finished :class:`~trace_agent.tree.RolloutTree` (its kind and depths
    come from the tree). ``summary()`` reports both views side by side.
    """

    config: BudgetConfig = field(default_factory=BudgetConfig)
    root_rollouts: int = 0
    continuations: int = 0
    paper_units: float = 0.0
    generated_tokens: int = 0
    observation_tokens: int = 0
    env_steps: int = 0

    def charge_root(self, *, generated_tokens: int = 0, observation_tokens: int = 0, env_steps: int = 0) -> float:
        """Add one full rollout from the prompt (1 paper unit); returns the units charged."""
        self.root_rollouts += 1
        self._real(generated_tokens, observation_tokens, env_steps)
        self.paper_units += 1.0
        return 1.0

    def charge_continuation(
        self,
        *,
        generated_tokens: int = 0,
        observation_tokens: int = 0,
        env_steps: int = 0,
        new_turns: int | None = None,
        leaf_depth: int | None = None,
    ) -> float:
        """Add one continuation from a visited prefix; returns the paper units charged."""
        units = self.config.charge(new_turns=new_turns, leaf_depth=leaf_depth)
        self.continuations += 1
        self._real(generated_tokens, observation_tokens, env_steps)
        self.paper_units += units
        return units

    def charge_tree(self, tree: RolloutTree) -> float:
        """Add every rollout of ``tree``; a rollout starting at the root is a root rollout. Returns units."""
        total = 0.0
        for r in tree.rollouts():
            if r.start_depth == 0:
                total += self.charge_root(
                    generated_tokens=r.generated_tokens, observation_tokens=r.observation_tokens,
                    env_steps=r.turns,
                )
            else:
                total += self.charge_continuation(
                    generated_tokens=r.generated_tokens, observation_tokens=r.observation_tokens,
                    env_steps=r.turns, new_turns=r.turns, leaf_depth=r.end_depth,
                )
        return total

    def _real(self, generated_tokens: int, observation_tokens: int, env_steps: int) -> None:
        self.generated_tokens += whole_count("generated_tokens", generated_tokens)
        self.observation_tokens += whole_count("observation_tokens", observation_tokens)
        self.env_steps += whole_count("env_steps", env_steps)

    def summary(self) -> dict[str, float]:
        """Both views: rollouts and paper units; generated/observation tokens and env steps."""
        return {
            "root_rollouts": float(self.root_rollouts),
            "continuations": float(self.continuations),
            "paper_units": self.paper_units,
            "generated_tokens": float(self.generated_tokens),
            "observation_tokens": float(self.observation_tokens),
            "env_steps": float(self.env_steps),
        }
