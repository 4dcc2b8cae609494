"""Strategies: the decisions against the exact allocators, equal budgets, every strategy on every env, a user plug-in."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

import trace_envs
from trace_agent.allocation import allocate_prefixes, allocate_roots, repeat_probability
from trace_agent.contexts import format_messages, make_context
from trace_agent.policy.base import SamplingConfig
from trace_agent.predictor import EmbeddingPredictor, HashedNGramFeaturizer, PredictionError
from trace_agent.rollout import RolloutConfig, TreeCollector, prompt_pool
from trace_agent.strategies import (
    GRPO,
    PCL,
    STRATEGY_NAMES,
    TRACE,
    Budget,
    ExpansionRequest,
    Oracle,
    Reads,
    RootRequest,
    Strategy,
    TreePO,
    make_strategy,
    random_prefixes,
    reads_of,
    rollout_ending,
    spend_rest_on_root,
    uniform_roots,
)
from trace_agent.tree import RolloutTree
from trace_envs.python_tool.env import PythonMathEnv

from .conftest import build_tree
from .test_rollout import _check_budget, make_math_env, scripted_setup, tiny_hf_policy  # noqa: F401

VALUES = np.array([0.02, 0.5, 0.9, 0.45, 0.99, 0.3, 0.7, 0.0])


def _root_request(budget: Budget, *, branching: bool, values=VALUES, oracle=None) -> RootRequest:
    return RootRequest(
        prompt_ids=tuple(f"p{i}" for i in range(len(values))), budget=budget,
        root_budget=budget.roots if branching else budget.flat_roots, rng=np.random.default_rng(0),
        values={"predicted": values, "oracle": values if oracle is None else oracle},
    )


def _expansion(tree: RolloutTree, budget: int, values: np.ndarray, oracle: np.ndarray | None = None) -> ExpansionRequest:
    cands = tuple(n for n in tree.nodes if not n.is_root and not n.is_leaf)
    def table(v: np.ndarray) -> dict[int, float]:
        out = {n.node_id: float(x) for n, x in zip(cands, v, strict=False)}
        if len(v):
            out.setdefault(0, float(v[0]))  # the root's own value, when a strategy reads it
        return out

    return ExpansionRequest(
        tree=tree, budget=budget, candidates=cands, root_exchange=2, prefix_cap=None, rng=np.random.default_rng(0),
        values={"predicted": table(values), "oracle": table(values if oracle is None else oracle)},
    )


def test_budget_shapes_cost_the_same_paper_units() -> None:
    a = Budget(roots=1024, continuations_per_root=2, group_size=8)
    b = Budget(roots=512, continuations_per_root=6, group_size=4)
    assert a.paper_units == b.paper_units == 2048
    assert a.flat_roots == b.flat_roots == 2048
    assert a.max_active == b.max_active == 128
    assert Budget.parse("32,2", group_size=4) == Budget(roots=32, continuations_per_root=2, group_size=4)
    with pytest.raises(ValueError, match="multiple"):
        Budget(roots=10, continuations_per_root=2, group_size=4)


def test_grpo_and_pcl_are_flat_and_spend_the_paper_units_as_roots() -> None:
    budget = Budget(roots=8, continuations_per_root=2, group_size=4)  # 2 prompts, 16 flat roots
    grpo = GRPO().allocate_roots(_root_request(budget, branching=False))
    assert grpo == [8, 8, 0, 0, 0, 0, 0, 0]
    pcl = PCL().allocate_roots(_root_request(budget, branching=False))
    assert pcl == [0, 8, 0, 8, 0, 0, 0, 0]  # v = 0.5 and 0.45 are nearest 1/2
    assert not GRPO().branching and not PCL().branching


def test_trace_roots_are_the_exact_allocation_and_oracle_uses_true_rates() -> None:
    budget = Budget(roots=8, continuations_per_root=2, group_size=2)
    got = TRACE().allocate_roots(_root_request(budget, branching=True))
    assert got == allocate_roots(VALUES, 8, cap=budget.effective_root_cap, max_active=budget.max_active)
    truth = VALUES[::-1].copy()
    got = Oracle().allocate_roots(_root_request(budget, branching=True, oracle=truth))
    assert got == allocate_roots(truth, 8, cap=budget.effective_root_cap, max_active=budget.max_active,
                                 objective="share")  # the effective-ratio bound (issue 13)
    got = make_strategy("oracle-sum").allocate_roots(_root_request(budget, branching=True, oracle=truth))
    assert got == allocate_roots(truth, 8, cap=budget.effective_root_cap, max_active=budget.max_active)
    uniform = TRACE(roots=False).allocate_roots(_root_request(budget, branching=True))
    assert uniform == [2, 2, 2, 2, 0, 0, 0, 0]


def test_trace_prefixes_are_the_exact_allocation_with_repeat_probabilities() -> None:
    tree = build_tree(roots=4, depth=3, continuations=0, rate=0.5, seed=2)
    request = _expansion(tree, 8, np.linspace(0.05, 0.95, 8))
    values = request.predicted()
    q = repeat_probability(values, request.endings())
    expected = allocate_prefixes(q, 8)
    got = TRACE().allocate_continuations(request)
    assert got == {n.node_id: k for n, k in zip(request.candidates, expected) if k}
    assert sum(got.values()) == 8
    # the ending of a prefix is the reward of its own rollout's leaf
    for node in request.candidates:
        leaf = next(n for n in node.subtree() if n.is_leaf and n.rollout_id == node.rollout_id)
        assert rollout_ending(node) == leaf.reward


def test_treepo_is_uniform_over_visited_prefixes() -> None:
    tree = build_tree(roots=4, depth=3, continuations=0, seed=1)
    cands = [n for n in tree.nodes if not n.is_root and not n.is_leaf]
    counts = np.zeros(len(tree.nodes))
    rng = np.random.default_rng(0)
    for _ in range(300):
        for k, v in random_prefixes(cands, 4, rng).items():
            counts[k] += v
    share = counts[[n.node_id for n in cands]] / counts.sum()
    assert np.all(np.abs(share - 1 / len(cands)) < 0.05)


def test_rest_of_the_budget_goes_to_root_rollouts_when_there_is_no_prefix() -> None:
    tree = build_tree(roots=3, depth=1, continuations=0)
    request = _expansion(tree, 7, np.zeros(0))
    assert request.candidates == ()
    assert TreePO().allocate_continuations(request) == {0: 3}
    assert TRACE().allocate_continuations(request) == {0: 3}
    assert spend_rest_on_root({}, request) == {0: 3}


def test_root_as_a_prefix_costs_two_units_and_follows_the_exact_dp() -> None:
    tree = build_tree(roots=3, depth=2, continuations=0, rate=0.0, seed=0)  # all leaves fail
    tree.root.value = 0.5
    cands = [n for n in tree.nodes if not n.is_root and not n.is_leaf]
    request = _expansion(tree, 6, np.full(len(cands), 0.02))
    got = TRACE(root_prefix=True).allocate_continuations(request)
    q = list(repeat_probability(np.full(len(cands), 0.02), request.endings())) + [0.5]
    expected = allocate_prefixes(q, 6, costs=[1] * len(cands) + [2])
    assert got == {n.node_id: k for n, k in zip([*cands, tree.root], expected) if k}
    assert got.get(0, 0) >= 1  # a failing prefix at v = 0.02 is worth less than a coin-flip root
    assert sum(v for k, v in got.items() if k) + 2 * got.get(0, 0) <= 6


def test_make_strategy_knows_every_name() -> None:
    for name in STRATEGY_NAMES:
        s = make_strategy(name)
        assert isinstance(s, Strategy) and s.name == name
    with pytest.raises(ValueError, match="unknown strategy"):
        make_strategy("nope")


# --------------------------------------------------------------------------------------------------
# the values a root request offers


def test_requests_carry_the_declared_values_checked_and_refuse_the_rest() -> None:
    budget = Budget(roots=8, continuations_per_root=1, group_size=2)

    def request(**values):
        return RootRequest(prompt_ids=tuple(f"p{i}" for i in range(len(VALUES))), budget=budget,
                           root_budget=budget.roots, rng=np.random.default_rng(0), values=values)

    bare = request()
    GRPO().allocate_roots(bare)
    TRACE(roots=False).allocate_roots(bare)  # trace-prefix reads no prompt value
    with pytest.raises(PredictionError, match="no predicted values of prompts"):
        TRACE().allocate_roots(bare)
    trace = request(predicted=VALUES)
    np.testing.assert_array_equal(trace.predicted(), VALUES)
    with pytest.raises(PredictionError, match="no oracle values"):
        trace.oracle()
    with pytest.raises(PredictionError, match="non-finite"):  # a bad value is refused when the request is made
        request(oracle=np.r_[VALUES[:-1], np.nan])
    with pytest.raises(ValueError, match="values for 3 prompts"):
        request(predicted=np.zeros(3))
    with pytest.raises(ValueError, match="unknown value kind"):
        request(guess=VALUES)
    with pytest.raises(ValueError, match="unknown value kind"):
        Reads(prompts={"guess"})
    with pytest.raises(TypeError, match="must be a Reads"):
        reads_of(type("Odd", (), {"reads": "predicted"})())


@pytest.mark.parametrize("name", STRATEGY_NAMES)
def test_each_strategy_runs_on_exactly_the_values_it_declares(name) -> None:
    strategy = make_strategy(name)
    reads = reads_of(strategy)
    assert reads.predictor == (name in ("pcl", "trace", "trace-root", "trace-prefix", "trace+rootprefix"))
    budget = Budget(roots=8, continuations_per_root=2, group_size=2)
    truth = VALUES[::-1].copy()
    offered = {"predicted": VALUES, "oracle": truth}
    roots = RootRequest(prompt_ids=tuple(f"p{i}" for i in range(len(VALUES))), budget=budget,
                        root_budget=budget.root_budget(strategy.branching), rng=np.random.default_rng(0),
                        values={k: v for k, v in offered.items() if k in reads.prompts})
    assert sum(strategy.allocate_roots(roots)) == roots.root_budget
    for root_value in (None, 0.4):  # a root without / with the value its roots were allocated on
        tree = build_tree(roots=3, depth=3, continuations=0, rate=0.0, seed=0)
        tree.root.value = root_value
        cands = tuple(n for n in tree.nodes if not n.is_root and not n.is_leaf)
        values = {kind: {n.node_id: 0.3 for n in reads.expansion(kind, tree, cands)} for kind in ("predicted", "oracle")}
        request = ExpansionRequest(tree=tree, budget=6, candidates=cands, root_exchange=2, prefix_cap=None,
                                   rng=np.random.default_rng(0), values={k: v for k, v in values.items() if v})
        strategy.allocate_continuations(request)


class LowestFirst:
    """A user's flat strategy that reads the predictor: equal groups on the prompts it rates hardest."""

    name = "lowest-first"
    branching = False
    reads = Reads(prompts={"predicted"})

    def allocate_roots(self, request):
        v = request.predicted()
        keep = np.argsort(v, kind="stable")[: request.budget.max_active]
        out = [0] * len(v)
        for i, k in zip(keep, uniform_roots(len(keep), request.root_budget, len(keep)), strict=True):
            out[int(i)] = k
        return out

    def allocate_continuations(self, request):
        return {}


class CountingPredictor(EmbeddingPredictor):
    def __init__(self) -> None:
        super().__init__(HashedNGramFeaturizer())
        self.seen: list[list[str]] = []

    def predict(self, contexts):
        self.seen.append(list(contexts))
        return super().predict(contexts)


class ResetCountingEnv(PythonMathEnv):
    resets = 0

    def reset(self, *, seed=None, options=None):
        type(self).resets += 1
        return super().reset(seed=seed, options=options)


class OpaqueOpeningEnv(ResetCountingEnv):
    """An env that does not tell its opening messages without a reset (the BranchableEnv default)."""

    def _opening_observation(self, task, seed):
        return None


@pytest.mark.parametrize(("env_cls", "describe_resets"), [(ResetCountingEnv, 0), (OpaqueOpeningEnv, 2)])
def test_prompt_values_reach_a_user_strategy_only_when_declared_and_prompt_contexts_are_kept(
        env_cls, describe_resets) -> None:
    policy, prompts = scripted_setup(4)
    budget = Budget(roots=4, continuations_per_root=2, group_size=2)
    predictor = CountingPredictor()
    fresh = ResetCountingEnv(max_turns=3)
    try:
        expected = []
        for p in prompts:
            fresh.reset(seed=p.reset_seed, options={"task_id": p.task_id})
            expected.append(make_context(format_messages(fresh.messages), ""))
    finally:
        fresh.close()
    with TreeCollector(make_env=lambda: env_cls(max_turns=3), policy=policy, predictor=predictor,
                       config=RolloutConfig(workers=2)) as collector:
        flat = collector.collect(prompts, GRPO(), budget)
        assert predictor.seen == [] and np.isnan(flat.root_values).all()  # GRPO never pays for scoring
        env_cls.resets = 0
        assert collector.prompt_contexts(prompts[:2]) == expected[:2]  # kept from the grown trees' roots
        assert env_cls.resets == 0
        batch = collector.collect(prompts, LowestFirst(), budget, seed=1)
        assert predictor.seen == [expected]  # one call, on the contexts a fresh reset gives
        # the two unseen prompts described (by opening_messages where the env tells them, else by a reset),
        # then each tree's own reset
        assert env_cls.resets == describe_resets + 2
        np.testing.assert_allclose(batch.root_values, predictor.predict(expected))
        assert sum(batch.roots) == budget.flat_roots
        active = [i for i, m in enumerate(batch.roots) if m]
        assert [t.root.value for t in batch.trees] == [batch.root_values[i] for i in active]


# --------------------------------------------------------------------------------------------------
# a user's strategy: entropy-triggered branching, written outside the library


class EntropyBranching:
    """Branch where the policy was least sure: the prefixes whose turn had the lowest mean log-prob."""

    name = "entropy"
    branching = True

    def allocate_roots(self, request):
        return TreePO().allocate_roots(request)

    def allocate_continuations(self, request):
        if not request.candidates:
            return {0: request.budget // request.root_exchange}
        surprise = [-np.mean(n.generated_logprobs) for n in request.candidates]
        top = np.argsort(surprise)[::-1][:2]
        split = [request.budget - request.budget // 2, request.budget // 2] if len(top) == 2 else [request.budget]
        return {request.candidates[i].node_id: k for i, k in zip(top, split) if k}


def test_a_user_strategy_plugs_into_the_collector() -> None:
    policy, prompts = scripted_setup(4)
    budget = Budget(roots=4, continuations_per_root=2, group_size=2)
    strategy = EntropyBranching()
    assert isinstance(strategy, Strategy)
    with TreeCollector(make_env=make_math_env, policy=policy, config=RolloutConfig(workers=2)) as collector:
        batch = collector.collect(prompts, strategy, budget)
    _check_budget(batch, budget, True)
    assert batch.strategy == "entropy"


# --------------------------------------------------------------------------------------------------
# every strategy on every env with the transformers backend


@pytest.mark.parametrize("env_id", [
    pytest.param(e, marks=pytest.mark.slow) if e.endswith("BFCL-v0") else e for e in trace_envs.registered_ids()
])
def test_every_strategy_runs_on_every_env_with_the_hf_policy(env_id, tiny_hf_policy) -> None:  # noqa: F811
    from trace_agent.predictor import EmbeddingPredictor, HashedNGramFeaturizer

    probe = gym.make(env_id).unwrapped
    task_ids = probe.tasks.ids()[:4]
    probe.close()
    budget = Budget(roots=4, continuations_per_root=1, group_size=2)
    config = RolloutConfig(workers=2, sampling=SamplingConfig(max_new_tokens=4), oracle_samples=2, seed=0)
    with TreeCollector(make_env=lambda: gym.make(env_id, max_turns=2).unwrapped, policy=tiny_hf_policy,
                       predictor=EmbeddingPredictor(HashedNGramFeaturizer(dim=64)), config=config) as collector:
        for name in STRATEGY_NAMES:
            strategy = make_strategy(name)
            batch = collector.collect(prompt_pool(task_ids), strategy, budget, seed=1)
            _check_budget(batch, budget, strategy.branching)
            if name == "oracle":
                assert batch.oracle_env_steps > 0
