"""The collector: budgets in both units, exact restored branches, per-prompt expansion, snapshots released.

``ScriptedPolicy`` (also used by the strategy and bench tests) implements the Policy protocol
on a byte-level token space: contexts are JSON lines of chat messages, and each turn is
what PythonMath-v0's scripted demonstrator would say, flawed with a per-task probability,
so groups come out mixed for some prompts and pure for others.
"""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

import trace_envs  # noqa: F401
from trace_agent.policy.base import Generation, SamplingConfig, TokenContext
from trace_agent.rollout import (
    Collection,
    CollectionError,
    PromptSpec,
    RolloutConfig,
    TreeCollector,
    node_context,
    path_token_ids,
    prompt_pool,
)
from trace_agent.strategies import GRPO, TRACE, Budget, TreePO
from trace_agent.tree import RolloutTree
from trace_agent.tree_io import load_jsonl, save_jsonl
from trace_envs.core import Task
from trace_envs.python_tool.env import PythonMathEnv

MATH = "trace_envs/PythonMath-v0"
EOT = 256


class ScriptedPolicy:
    """A Policy whose turns script PythonMath-v0 episodes, flawed with probability ``flaw(task_id)``.

    Token ids are UTF-8 bytes plus 256 (end of turn); the context is one JSON line per
    message, so the policy can read the transcript back from its own token ids. The first
    turn runs the task's program (perturbed when flawed); the next boxes the program's
    output, and with probability ``answer_slip`` boxes a wrong number instead.
    """

    def __init__(self, tasks: Mapping[str, Task], flaw: Mapping[str, float], *, answer_slip: float = 0.0) -> None:
        self.by_prompt = {t.prompt: t for t in tasks.values()}
        self.flaw = dict(flaw)
        self.answer_slip = answer_slip
        self.slow: set[str] = set()
        self.calls: list[list[tuple[int, ...]]] = []
        self._lock = threading.Lock()

    @property
    def stop_token_ids(self) -> tuple[int, ...]:
        return (EOT,)

    @staticmethod
    def _line(message: Mapping[str, Any]) -> list[int]:
        return list((json.dumps(dict(message), sort_keys=True) + "\n").encode())

    def render(self, messages: Sequence[Mapping[str, Any]], tools: Any = None) -> TokenContext:
        return TokenContext.from_prompt([t for m in messages for t in self._line(m)])

    def decode(self, token_ids: Sequence[int]) -> str:
        return bytes(t for t in token_ids if t < 256).decode()

    def _messages(self, context: TokenContext) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.decode(context.token_ids).splitlines() if line]

    def generate(self, contexts: Sequence[TokenContext], sampling: SamplingConfig | None = None, *,
                 seeds: Sequence[int] | None = None, sessions: Sequence[str] | None = None) -> list[Generation]:
        with self._lock:
            self.calls.append([c.token_ids for c in contexts])
        shared = np.random.default_rng(None if sampling is None else sampling.seed)
        out = []
        for i, ctx in enumerate(contexts):
            rng = shared if seeds is None else np.random.default_rng(seeds[i])
            messages = self._messages(ctx)
            task = self.by_prompt[next(m["content"] for m in messages if m["role"] == "user")]
            flawed = bool(rng.random() < self.flaw.get(task.task_id, 0.0))
            text = self._act(task, messages, flawed, slow=task.task_id in self.slow)
            if text.startswith("<answer>") and rng.random() < self.answer_slip:
                text = "<answer>\\boxed{-1}</answer>"
            ids = self._line({"role": "assistant", "content": text})[:-1] + [EOT]
            out.append(Generation(token_ids=tuple(ids), logprobs=tuple(-0.5 for _ in ids), text=text,
                                  finish_reason="stop"))
        return out

    @staticmethod
    def _act(task: Task, messages: Sequence[Mapping[str, Any]], flawed: bool, *, slow: bool = False) -> str:
        """Run the task's program (a wrong one when flawed), then box the last line it printed.

        ``slow``: first print a warm-up line (one turn more)."""
        outputs = [m["content"] for m in messages if m["role"] == "tool"]
        if slow and not outputs:
            return '<tool_call>' + json.dumps({"name": "python", "arguments": {"code": "print(0)"}}) + '</tool_call>'
        if slow:
            outputs = outputs[1:]
        if not outputs:
            answer = str(task.data["answer"])
            code = f"print({answer!r} + '7')" if flawed else str(task.data.get("solution_code") or f"print({answer!r})")
            return '<tool_call>' + json.dumps({"name": "python", "arguments": {"code": code}}) + '</tool_call>'
        lines = outputs[-1].strip().splitlines()
        return f"<answer>\\boxed{{{lines[-1].strip() if lines else ''}}}</answer>"

    def extend(self, context: TokenContext, generation: Generation,
               observation: Mapping[str, Any] | Sequence[Mapping[str, Any]]) -> TokenContext:
        obs = [observation] if isinstance(observation, Mapping) else list(observation)
        ctx = context.append(generation.token_ids, generated=True, logprobs=generation.logprobs)
        return ctx.append([10] + [t for m in obs for t in self._line(m)], generated=False)

    def logprobs(self, contexts: Sequence[TokenContext], targets: Sequence[Sequence[int]], *,
                 temperature: float = 1.0) -> list[tuple[float, ...]]:
        return [tuple(-0.5 for _ in t) for t in targets]


class RecordingMathEnv(PythonMathEnv):
    """The real PythonMath-v0, recording the transcript it holds right before every step."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.before_step: list[tuple[list[dict[str, Any]], str]] = []

    def step(self, action: str):  # type: ignore[override]
        self.before_step.append((self.messages, action))
        return super().step(action)


def math_tasks(n: int) -> list[Task]:
    env = gym.make(MATH).unwrapped
    try:
        return [env.tasks[t] for t in env.tasks.ids()[:n]]
    finally:
        env.close()


def scripted_setup(n_prompts: int = 6, *, answer_slip: float = 0.25) -> tuple[ScriptedPolicy, list[PromptSpec]]:
    tasks = math_tasks(n_prompts)
    rates = np.linspace(0.0, 1.0, n_prompts)
    policy = ScriptedPolicy({t.task_id: t for t in tasks}, {t.task_id: float(r) for t, r in zip(tasks, rates)},
                            answer_slip=answer_slip)
    return policy, prompt_pool([t.task_id for t in tasks])


def make_math_env() -> PythonMathEnv:
    return gym.make(MATH, max_turns=3).unwrapped


@pytest.fixture(scope="module")
def tiny_hf_policy():
    """The real transformers backend on the demo architecture, untrained, with a tokenizer trained on the
    three envs' opening prompts (so BFCL's long tool schemas stay a few thousand tokens)."""
    from trace_agent.demo.model import DemoModelConfig, make_demo_model, train_demo_tokenizer
    from trace_agent.policy.hf import HFPolicy

    texts = []
    for env_id in trace_envs.registered_ids():
        env = gym.make(env_id).unwrapped
        try:
            for task_id in env.tasks.ids()[:3]:
                env.reset(seed=0, options={"task_id": task_id})
                texts.append(json.dumps(env.messages) + json.dumps(env.tools))
        finally:
            env.close()
    tokenizer = train_demo_tokenizer(texts, vocab_size=1024)
    cfg = DemoModelConfig(vocab_size=1024, hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=1, head_dim=32,
                          intermediate_size=128)
    return HFPolicy(make_demo_model(tokenizer, cfg, seed=0), tokenizer, device="cpu")


# --------------------------------------------------------------------------------------------------


def _check_budget(batch: Collection, budget: Budget, branching: bool) -> None:
    stats = batch.stats()
    # paper units: every strategy spends the same, exactly
    assert stats.paper_units == pytest.approx(budget.paper_units)
    roots_allocated = sum(batch.roots)
    assert roots_allocated == (budget.roots if branching else budget.flat_roots)
    # real units: tokens and env steps are exactly what the trees hold
    gen_tokens = sum(len(n.generated_ids) for t in batch.trees for n in t.nodes)
    steps = sum(len(t.nodes) - 1 for t in batch.trees)
    assert stats.generated_tokens == gen_tokens
    assert stats.env_steps == steps
    for tree, m in zip(batch.trees, [m for m in batch.roots if m > 0], strict=True):
        s = tree.stats(continuation_cost=budget.continuation_cost)
        extra_roots = s.root_rollouts - m
        cont_units = s.continuations + budget.root_exchange * extra_roots
        assert cont_units == (budget.prompt_continuations(m) if branching else 0)
        assert all(n.snapshot is None for n in tree.nodes)  # released after expansion


@pytest.mark.parametrize("strategy", [GRPO(), TreePO(), TRACE()], ids=lambda s: s.name)
def test_trees_spend_exactly_the_budget_in_both_units(strategy) -> None:
    from trace_agent.predictor import EmbeddingPredictor, HashedNGramFeaturizer

    policy, prompts = scripted_setup(6)
    budget = Budget(roots=8, continuations_per_root=2, group_size=4)
    predictor = EmbeddingPredictor(HashedNGramFeaturizer(dim=64))
    with TreeCollector(make_env=make_math_env, policy=policy, predictor=predictor,
                       config=RolloutConfig(workers=2, seed=1)) as collector:
        batch = collector.collect(prompts, strategy, budget, seed=3)
    _check_budget(batch, budget, strategy.branching)
    assert len(batch.trees) == budget.max_active
    assert set(batch.skipped) | {t.prompt_id for t in batch.trees} == {p.prompt_id for p in prompts}


def test_restored_branches_start_from_exactly_the_recorded_state() -> None:
    policy, prompts = scripted_setup(3)
    envs: list[RecordingMathEnv] = []

    def factory() -> RecordingMathEnv:
        env = RecordingMathEnv(max_turns=3)
        envs.append(env)
        return env

    budget = Budget(roots=4, continuations_per_root=3, group_size=2)
    with TreeCollector(make_env=factory, policy=policy, config=RolloutConfig(workers=1, seed=0)) as collector:
        batch = collector.collect(prompts[1:3], TreePO(), budget, seed=0)
    assert 1 <= len(envs) <= len(batch.trees)  # one env per prompt alive at once
    contexts_seen = {ids for call in policy.calls for ids in call}
    transcripts = [(json.dumps(m, sort_keys=True), a) for env in envs for m, a in env.before_step]
    checked = 0
    for tree in batch.trees:
        for r in tree.rollouts():
            if r.start_depth == 0:
                continue
            start = tree.nodes[r.start_node]
            first = next(n for n in start.children if n.rollout_id == r.rollout_id)
            # token ids: the continuation was sampled from the path's exact ids
            ctx = node_context(tree, start)
            assert list(ctx.token_ids) == path_token_ids(start)
            assert ctx.token_ids in contexts_seen
            assert ctx.num_generated == sum(len(n.generated_ids) for n in start.path())
            # env state: the env held exactly the node's transcript when the branch's first step ran
            expected = tree.root.messages + start.history()
            action = first.messages[0]["content"]
            assert (json.dumps(expected, sort_keys=True), action) in transcripts
            checked += 1
    assert checked > 0


def test_restored_interpreter_state_is_the_recorded_one() -> None:
    """A branch from a depth-1 prefix sees the variables the prefix's program defined (fork-restored)."""
    policy, prompts = scripted_setup(2, answer_slip=0.0)
    collector = TreeCollector(make_env=make_math_env, policy=policy,
                              config=RolloutConfig(workers=1, release_snapshots=False))
    with collector:
        env = collector.worker_env()
        tree = collector.grow_tree(env, prompts[0], roots=2, strategy=GRPO(), budget=Budget(roots=2,
                                   continuations_per_root=0, group_size=2))
        node = next(n for n in tree.nodes if n.depth == 1 and not n.is_leaf)
        env.restore(node.snapshot)
        assert env.messages == tree.root.messages + node.history()
        probe = '<tool_call>{"name": "python", "arguments": {"code": "print(sorted(k for k in globals() if not k.startswith(\'_\'))[:50])"}}</tool_call>'
        obs1, *_ = env.step(probe)
        env.restore(node.snapshot)
        obs2, *_ = env.step(probe)
        assert obs1 == obs2
        tree.release_snapshots()


def test_token_ids_round_trip_and_rebuild_the_policy_context(tmp_path) -> None:
    policy, prompts = scripted_setup(3)
    with TreeCollector(make_env=make_math_env, policy=policy, config=RolloutConfig(workers=1)) as collector:
        batch = collector.collect(prompts[:2], TreePO(), Budget(roots=4, continuations_per_root=2, group_size=2))
    (loaded,) = [load_jsonl(save_jsonl(batch.trees, tmp_path / "t.jsonl"))]
    for a, b in zip(batch.trees, loaded, strict=True):
        for leaf in a.leaves():
            other = b.nodes[leaf.node_id]
            assert path_token_ids(other) == path_token_ids(leaf)
            ctx = node_context(b, other)
            assert all(math.isfinite(x) == g for x, g in zip(ctx.logprobs, ctx.generated, strict=True))


class _Greedy:
    """A broken strategy: returns more than the budget."""

    name = "greedy"
    branching = True

    def allocate_roots(self, request):
        return TreePO().allocate_roots(request)

    def allocate_continuations(self, request):
        return {n.node_id: request.budget for n in request.candidates[:2]} or {0: request.budget}


def test_overspending_strategy_is_refused() -> None:
    policy, prompts = scripted_setup(2)
    with TreeCollector(make_env=make_math_env, policy=policy, config=RolloutConfig(workers=1)) as collector:
        with pytest.raises(CollectionError, match="cost"):
            collector.collect(prompts, _Greedy(), Budget(roots=4, continuations_per_root=2, group_size=2))


def test_prompts_expand_independently() -> None:
    """A prompt's continuations are sampled as soon as its own roots end, batched with the roots of a
    prompt that is still running (one engine call holds both), never after all roots of the batch."""
    policy, prompts = scripted_setup(3, answer_slip=0.0)
    fast, slow = prompts[1], prompts[2]
    policy.slow = {slow.task_id}  # its episodes take one turn more
    with TreeCollector(make_env=make_math_env, policy=policy, config=RolloutConfig(workers=1)) as collector:
        batch = collector.collect([fast, slow], TreePO(), Budget(roots=4, continuations_per_root=2, group_size=2))
    fast_tree = next(t for t in batch.trees if t.prompt_id == fast.prompt_id)
    assert max(leaf.depth for t in batch.trees if t.prompt_id == slow.prompt_id for leaf in t.leaves()) == 3
    assert all(leaf.depth == 2 for r in fast_tree.rollouts() if r.start_depth == 0
               for leaf in fast_tree.leaves() if leaf.rollout_id == r.rollout_id)
    fast_prompt = json.dumps(fast_tree.root.messages[-1]["content"])
    mixed = 0
    for call in policy.calls:
        texts = [policy.decode(ids) for ids in call]
        slow_third_turn = any(fast_prompt not in t and t.count('"role": "tool"') == 2 for t in texts)
        if slow_third_turn and any(fast_prompt in t for t in texts):
            mixed += 1  # the fast prompt's roots all ended at turn 2: these are its continuations
    assert mixed >= 1
    assert batch.engine.calls == len(policy.calls)
    assert batch.engine.mean_batch > 4


@pytest.mark.parametrize("env_id", trace_envs.registered_ids())
def test_hf_tiny_policy_collects_on_every_env(env_id, tiny_hf_policy) -> None:
    """The real transformers backend, untrained: malformed turns become error observations, episodes truncate."""
    env0 = gym.make(env_id).unwrapped
    task_ids = env0.tasks.ids()[:3]
    env0.close()

    def factory():
        return gym.make(env_id, max_turns=2).unwrapped

    budget = Budget(roots=4, continuations_per_root=1, group_size=2)
    with TreeCollector(make_env=factory, policy=tiny_hf_policy,
                       config=RolloutConfig(workers=2, sampling=SamplingConfig(max_new_tokens=6),
                                            seed=0)) as collector:
        batch = collector.collect(prompt_pool(task_ids), TreePO(), budget)
    _check_budget(batch, budget, True)
    for tree in batch.trees:
        assert all(leaf.reward == 0.0 for leaf in tree.leaves())
        for leaf in tree.leaves():
            ctx = node_context(tree, leaf)
            assert ctx.token_ids[: len(tree.root.observation_ids)] == tuple(tree.root.observation_ids)
            assert tiny_hf_policy.decode(path_token_ids(leaf)).count("<|im_start|>assistant") == leaf.depth


def test_grow_tree_is_one_unit_of_work() -> None:
    policy, prompts = scripted_setup(2)
    with TreeCollector(make_env=make_math_env, policy=policy, config=RolloutConfig(workers=1)) as collector:
        tree = collector.grow_tree(collector.worker_env(), prompts[1], roots=3, strategy=TreePO(),
                                   budget=Budget(roots=4, continuations_per_root=2, group_size=2))
    assert isinstance(tree, RolloutTree)
    s = tree.stats()
    assert s.root_rollouts + s.continuations >= 3
    assert s.continuations + 2 * (s.root_rollouts - 3) == 6
