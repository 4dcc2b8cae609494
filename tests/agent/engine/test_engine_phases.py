"""Where a collection's time goes (trace_agent.engine.phases), and the predictor's cheap paths:
prompt contexts without env resets, prompt states computed once (HiddenStateFeaturizer's prefix cache)."""

from __future__ import annotations

import numpy as np
import pytest

from trace_agent.contexts import format_messages, make_context
from trace_agent.engine.phases import PHASES, PhaseTimer, breakdown
from trace_agent.predictor import EmbeddingPredictor, HashedNGramFeaturizer
from trace_agent.rollout import PromptSpec, RolloutConfig, TreeCollector
from trace_agent.strategies import Budget, make_strategy

from ..test_rollout import make_math_env, scripted_setup


def test_exposed_time_partitions_the_wall_clock_by_phase_priority() -> None:
    intervals = [("generation", 0.0, 2.0), ("env", 1.0, 3.0), ("bookkeeping", 2.5, 4.0), ("allocation", 5.0, 7.0),
                 ("predictor", 5.5, 6.0), ("env", 20.0, 30.0)]  # the last one is outside the window
    b = breakdown(intervals, 0.0, 8.0)
    assert b.wall == 8.0
    assert b.busy == {"generation": 2.0, "env": 2.0, "predictor": 0.5, "allocation": 2.0, "bookkeeping": 1.5}
    assert b.exposed == {"generation": 2.0, "env": 1.0, "predictor": 0.5, "allocation": 1.5, "bookkeeping": 1.0,
                         "idle": 2.0}
    assert sum(b.exposed.values()) == pytest.approx(b.wall)
    assert sum(b.shares().values()) == pytest.approx(1.0)


@pytest.mark.parametrize("strategy", ["trace", "grpo", "treepo"])
def test_a_timed_collection_reports_its_phases_and_an_untimed_one_does_not(strategy) -> None:  # type: ignore[no-untyped-def]
    policy, prompts = scripted_setup(6)
    budget = Budget(roots=12, continuations_per_root=1, group_size=4)
    with TreeCollector(make_env=make_math_env, policy=policy,
                       predictor=EmbeddingPredictor(HashedNGramFeaturizer()), config=RolloutConfig(seed=0)) as c:
        plain = c.collect(prompts, make_strategy(strategy), budget, seed=1)
        c.phase_timer = PhaseTimer()
        timed = c.collect(prompts, make_strategy(strategy), budget, seed=1)
    assert plain.phases is None and timed.phases is not None
    p = timed.phases
    assert sum(p.exposed.values()) == pytest.approx(p.wall, rel=1e-9)
    assert p.wall <= timed.wall_seconds + 1e-3
    assert set(p.busy) == set(PHASES) and p.busy["env"] > 0 and p.busy["bookkeeping"] > 0
    assert p.busy["generation"] == pytest.approx(timed.engine.generate_seconds, rel=0.05, abs=5e-3)
    if strategy == "trace":
        assert p.busy["allocation"] > 0
    assert [t.to_dict() for t in timed.trees] == [t.to_dict() for t in plain.trees]  # timing changes nothing


def test_prompt_contexts_need_no_env_reset_and_equal_the_reset_ones(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from trace_envs.python_tool.env import PythonMathEnv

    env = make_math_env()
    try:
        ids = env.tasks.ids()[:4]
        expected = []
        for seed, task_id in enumerate(ids):
            assert env.opening_messages(task_id, seed=seed) is not None
            env.reset(seed=seed, options={"task_id": task_id})
            assert env.opening_messages(task_id, seed=seed) == env.messages
            expected.append(make_context(format_messages(env.messages), ""))
    finally:
        env.close()
    resets = []
    original = PythonMathEnv._start_episode
    monkeypatch.setattr(PythonMathEnv, "_start_episode", lambda self, task: resets.append(task) or original(self, task))
    policy, _ = scripted_setup(2)
    with TreeCollector(make_env=make_math_env, policy=policy) as c:
        got = c.prompt_contexts([PromptSpec(task_id=t, reset_seed=s) for s, t in enumerate(ids)])
    assert got == expected and resets == []


def test_hidden_state_features_compute_each_prompt_once_and_match_a_cold_featurizer() -> None:
    pytest.importorskip("torch")
    from trace_agent.demo.model import tiny_policy
    from trace_agent.predictor import HiddenStateFeaturizer

    policy = tiny_policy(seed=3)
    system = "You solve math problems with a python tool; answer in a box. " * 3
    prompts = [f"{system}\nQuestion {i}: what is {i} + {i}?" for i in range(5)]
    contexts = [make_context(p, "") for p in prompts] + [make_context(p, f"<|assistant|>\nprint({i}+{i})\n{2 * i}")
                                                          for i, p in enumerate(prompts)]
    warm = HiddenStateFeaturizer.from_policy(policy, batch_size=3)
    fed: list[int] = []
    forward = warm._forward

    def counting(rows):  # type: ignore[no-untyped-def]
        fed.extend(len(new) for _, _, new in rows)
        return forward(rows)

    warm._forward = counting  # type: ignore[method-assign]
    roots = warm.encode(contexts[:5])  # the shared system prompt once, then each question's own tokens
    first = sum(fed)
    full = sum(len(p) for p, _ in warm._token_ids(contexts[:5]))
    assert first < full / 2
    fed.clear()
    both = warm.encode(contexts)  # the prompts come from the cache: at most the histories are run
    assert 0 < sum(fed) <= sum(len(h) for _, h in warm._token_ids(contexts[5:]))
    cold = HiddenStateFeaturizer.from_policy(policy, batch_size=3, prefix_cache_mb=0)
    np.testing.assert_allclose(both, cold.encode(contexts), rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(both[:5], roots)
