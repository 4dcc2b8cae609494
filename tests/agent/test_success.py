"""One definition of success, and one budget: every place that splits outcomes or prices rollouts agrees."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tests.agent.conftest import build_tree
from trace_agent.allocation import repeat_probability
from trace_agent.budget import Budget, paper_budget, spent_units
from trace_agent.config import RolloutSettings
from trace_agent.config_io import load_config, override
from trace_agent.errors import ConfigError
from trace_agent.evaluation import success_histogram
from trace_agent.success import SUCCESS_THRESHOLD, is_success, success_mask, success_rate
from trace_agent.success import SUCCESS_THRESHOLD as TREE_THRESHOLD
from trace_agent.tree import Node

#: Rewards on both sides of the threshold, the threshold itself, and non-outcomes.
REWARDS = [-1.0, 0.0, 1e-9, 0.3, 0.4999999, 0.5, 0.7, 1.0, 2.0, math.nan]


def test_success_is_reward_at_least_the_threshold() -> None:
    assert TREE_THRESHOLD is SUCCESS_THRESHOLD == 0.5
    assert [is_success(r) for r in REWARDS] == [False, False, False, False, False, True, True, True, True, False]
    assert is_success(None) is False
    assert success_mask(REWARDS).tolist() == [is_success(r) for r in REWARDS]
    assert success_rate([0.0, 1.0, 0.3, 0.5]) == 0.5 and math.isnan(success_rate([]))


def test_tree_allocation_and_evaluation_use_the_same_split() -> None:
    """A leaf's is_success, the repeat probability and the evaluation histogram classify every reward alike."""
    for r in REWARDS:
        leaf = Node(node_id=0, parent=None, depth=0)
        leaf.reward = r
        assert leaf.is_success == is_success(r)
        assert float(repeat_probability(0.8, r)) == pytest.approx(0.8 if is_success(r) else 0.2)
    hist = success_histogram({"a": [0.3, 0.3], "b": [0.5, 0.0], "c": [1.0, 0.7]})
    assert hist["rates"] == [0.0, 0.5, 1.0]  # 0.3 is a failure everywhere (it was a success in evaluation)
    assert (hist["all_fail"], hist["mixed"], hist["all_success"]) == (1, 1, 1)


def test_tree_outcomes_follow_the_threshold() -> None:
    tree = build_tree(roots=4, depth=1, continuations=0, seed=0)
    leaves = tree.leaves()
    for leaf, r in zip(leaves, [0.3, 0.3, 0.3, 0.6], strict=True):
        leaf.reward = r
    assert tree.outcome_counts() == (1, 3) and tree.is_mixed()
    for leaf in leaves:
        leaf.reward = 0.3
    assert tree.outcome_counts() == (0, 4) and not tree.is_mixed()


@pytest.mark.parametrize(("m", "n", "cost"), [(16, 1, 0.5), (1024, 2, 0.5), (512, 6, 0.5), (12, 3, 0.3), (8, 0, 1.0)])
def test_one_budget_arithmetic(m: int, n: int, cost: float) -> None:
    budget = Budget(roots=m, continuations_per_root=n, group_size=4, continuation_cost=cost)
    settings = RolloutSettings(budget=budget, prompts_per_step=m // 4)
    assert settings.budget == budget
    assert settings.paper_budget == budget.paper_units == paper_budget(m, n, continuation_cost=cost)
    assert budget.paper_units == pytest.approx(spent_units(m, m * n, continuation_cost=cost))
    assert settings.max_active == budget.max_active == m // 4


def test_rollout_settings_refuse_what_the_budget_refuses() -> None:
    for bad in ({"roots": 5}, {"group_size": 1, "roots": 4}, {"continuations_per_root": -1},
                {"continuation_cost": 0.0}, {"root_cap": 1}, {"prefix_cap": 0}):
        with pytest.raises(ConfigError, match=r"^rollout\.budget: "):
            load_config(None, [override(f"rollout.{key}", value) for key, value in bad.items()])
        with pytest.raises(ValueError):
            Budget(**{"roots": 16, "continuations_per_root": 1, "group_size": 4, **bad})  # type: ignore[arg-type]


def test_spent_units_of_a_tree() -> None:
    tree = build_tree(roots=3, depth=2, continuations=2, seed=1)
    stats = tree.stats(continuation_cost=0.25)
    assert stats.paper_units == spent_units(stats.root_rollouts, stats.continuations, continuation_cost=0.25)
    assert stats.paper_units == 3 + 0.25 * 2
    assert np.isfinite(stats.paper_units)
