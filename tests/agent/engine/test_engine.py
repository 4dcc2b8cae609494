"""The asynchronous engine against a simple synchronous lockstep reference, bit for bit.

``reference_collect`` below is written from the contract in docs/engine.md, not from the
engine's code: prompts start in pool order into ``slots`` env slots; every *round*, the turn
requests of every live rollout of every live prompt are sorted by their canonical key
(prompt index, phase, call, rollout id, turn), cut into chunks of ``max_batch`` and generated,
one ``generate`` call per chunk, with the documented per-request seeds; then each prompt
steps its rollouts on its own env, in order; a prompt whose roots all ended is expanded by
its strategy (its continuations join the next round); a prompt with nothing left finishes
and the next prompt in pool order takes its slot (its first turns join the next round).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

from trace_agent.contexts import format_messages, make_context
from trace_agent.engine.base import EnvWorkerError, Phase, prompt_key, request_seed
from trace_agent.engine.scheduler import EngineConfig, GenerationEngine, TurnRequest
from trace_agent.policy.base import Generation, SamplingConfig, TokenContext
from trace_agent.predictor import EmbeddingPredictor, HashedNGramFeaturizer, score_nodes
from trace_agent.rollout import Collection, PromptSpec, RolloutConfig, TreeCollector, node_context
from trace_agent.strategies import (
    GRPO,
    STRATEGY_NAMES,
    TRACE,
    Budget,
    ExpansionRequest,
    RootRequest,
    TreePO,
    make_strategy,
    reads_of,
)
from trace_agent.tree import RolloutTree, ground_truth_of

from ..test_rollout import _check_budget, make_math_env, scripted_setup, tiny_hf_policy  # noqa: F401

# --------------------------------------------------------------------------------------------------
# the reference


@dataclass(eq=False)
class _Roll:
    snapshot: Any
    context: TokenContext
    n_messages: int
    node: Any
    rid: int
    turn: int


@dataclass(eq=False)
class _Prompt:
    index: int
    spec: PromptSpec
    roots: int
    env: Any
    tree: RolloutTree
    phase: Phase = Phase.ROOTS
    rolls: list[_Roll] = field(default_factory=list)


def reference_collect(*, make_env, policy, predictor, strategy, budget: Budget, prompts: Sequence[PromptSpec],
                      cfg_seed: int, seed: int, max_batch: int, slots: int, max_new_tokens: int,
                      temperature: float = 1.0, top_p: float = 1.0) -> list[RolloutTree]:
    ids = tuple(p.prompt_id for p in prompts)
    free: list[Any] = []  # envs are reused across prompts (a sandbox boots once)

    def contexts_of_prompts():
        env = free.pop() if free else make_env()
        out = []
        for p in prompts:
            env.reset(seed=p.reset_seed, options={"task_id": p.task_id})
            out.append(make_context(format_messages(env.unwrapped.messages), ""))
        free.append(env)
        return out

    def predicted():
        return np.clip(np.asarray(predictor.predict(contexts_of_prompts()), dtype=np.float64), 0, 1)

    def no_oracle():
        raise AssertionError("the reference has no Monte-Carlo oracle")

    reads = reads_of(strategy)
    if "oracle" in reads.prompts:
        no_oracle()
    offered = {"predicted": predicted()} if "predicted" in reads.prompts else {}
    request = RootRequest(prompt_ids=ids, budget=budget, root_budget=budget.root_budget(strategy.branching),
                          rng=np.random.default_rng(request_seed(cfg_seed, seed, 5)), values=offered)
    roots = [int(m) for m in strategy.allocate_roots(request)]
    v = offered.get("predicted")
    queue = [(i, p, m) for i, (p, m) in enumerate(zip(prompts, roots)) if m > 0]
    finished: dict[int, RolloutTree] = {}

    def start(i, spec, m) -> _Prompt:
        env = free.pop() if free else make_env()
        env.reset(seed=spec.reset_seed, options={"task_id": spec.task_id})
        base = env.unwrapped
        messages, tools = list(base.messages), list(base.tools)
        snap = env.snapshot()
        ctx = policy.render(messages, tools)
        tree = RolloutTree(prompt_id=spec.prompt_id, task_id=spec.task_id, messages=messages, snapshot=snap,
                           value=None if v is None else float(v[i]), tools=tools,
                           ground_truth=ground_truth_of(getattr(getattr(base, "task", None), "data", None)),
                           metadata={"env_id": base.env_id, "strategy": strategy.name,
                                     "reset_seed": spec.reset_seed, "seed": seed})
        tree.root.observation_ids = list(ctx.token_ids)
        p = _Prompt(index=i, spec=spec, roots=m, env=env, tree=tree)
        p.rolls = [_Roll(snap, ctx, len(messages), tree.root, tree.start_rollout(), 0) for _ in range(m)]
        return p

    def expand(p: _Prompt) -> None:
        tree = p.tree
        cont = budget.prompt_continuations(p.roots, branching=strategy.branching)
        p.phase = Phase.CONTINUATIONS
        if cont <= 0:
            return
        cands = tuple(n for n in tree.nodes if not n.is_root and not n.is_leaf and n.snapshot is not None)
        if reads.expansion("oracle", tree, cands):
            no_oracle()
        scored = reads.expansion("predicted", tree, cands)
        values = ({"predicted": dict(zip((n.node_id for n in scored), score_nodes(predictor, tree, scored)))}
                  if scored else {})
        req = ExpansionRequest(tree=tree, budget=cont, candidates=cands, root_exchange=budget.root_exchange,
                               prefix_cap=budget.prefix_cap, values=values,
                               rng=np.random.default_rng(request_seed(cfg_seed, seed, prompt_key(tree.prompt_id), 4)))
        alloc = strategy.allocate_continuations(req)
        n_prompt = len(tree.root.messages)
        for node_id, k in sorted((int(a), int(b)) for a, b in alloc.items() if int(b) > 0):
            node = tree.nodes[node_id]
            ctx = node_context(tree, node)
            for _ in range(k):
                p.rolls.append(_Roll(node.snapshot, ctx, n_prompt + len(node.history()), node,
                                     tree.start_rollout(node), node.depth))

    def end(p: _Prompt) -> None:
        p.tree.release_snapshots()
        free.append(p.env)
        finished[p.index] = p.tree

    live: list[_Prompt] = []
    while queue and len(live) < slots:
        live.append(start(*queue.pop(0)))
    while live:
        requests = [((p.index, int(p.phase), 0, r.rid, r.turn), p, r) for p in live for r in p.rolls]
        requests.sort(key=lambda x: x[0])
        gens: dict[int, Generation] = {}
        for c in range(0, len(requests), max_batch):
            chunk = requests[c:c + max_batch]
            seeds = [request_seed(cfg_seed, seed, prompt_key(p.spec.prompt_id), k[1], 0, r.rid, r.turn)
                     for k, p, r in chunk]
            out = policy.generate([r.context for _, _, r in chunk],
                                  SamplingConfig(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p),
                                  seeds=seeds, sessions=[p.spec.prompt_id for _, p, _ in chunk])
            for (_, _, r), g in zip(chunk, out):
                gens[id(r)] = g
        still_live = []
        for p in live:
            keep = []
            for r in p.rolls:
                g = gens[id(r)]
                p.env.restore(r.snapshot)
                _, reward, term, trunc, _ = p.env.step(g.text)
                msgs = list(p.env.unwrapped.messages)
                added = msgs[r.n_messages:]
                done = bool(term or trunc)
                if done:
                    after = r.context.append(g.token_ids, generated=True, logprobs=g.logprobs)
                    if hasattr(policy, "finish"):
                        after = policy.finish(r.context, g)
                else:
                    after = policy.extend(r.context, g, added[1:])
                node = p.tree.add_turn(r.node, rollout_id=r.rid, generated_ids=g.token_ids,
                                       generated_logprobs=g.logprobs,
                                       observation_ids=list(after.token_ids[len(r.context) + len(g.token_ids):]),
                                       messages=added, snapshot=None if done else p.env.snapshot(),
                                       info={"finish_reason": g.finish_reason, "terminated": bool(term),
                                             "truncated": bool(trunc)})
                if done:
                    p.tree.finish(node, float(reward))
                else:
                    r.snapshot, r.context, r.n_messages, r.node, r.turn = node.snapshot, after, len(msgs), node, \
                        r.turn + 1
                    keep.append(r)
            p.rolls = keep
            if not p.rolls and p.phase == Phase.ROOTS:
                expand(p)
            if p.rolls:
                still_live.append(p)
            else:
                end(p)
                if queue:
                    still_live.append(start(*queue.pop(0)))
        live = sorted(still_live, key=lambda p: p.index)
    for env in free:
        env.close()
    return [finished[i] for i in sorted(finished)]


def _dump(trees: Sequence[RolloutTree]) -> list[str]:
    return [json.dumps(t.to_dict(), sort_keys=True) for t in trees]


def _predictor() -> EmbeddingPredictor:
    return EmbeddingPredictor(HashedNGramFeaturizer(dim=64))


def _slow_scripted(n: int):
    policy, prompts = scripted_setup(n, answer_slip=0.3)
    policy.slow = {p.task_id for p in prompts[::3]}  # some prompts take a turn more: rounds interleave
    return policy, prompts


def _collect(policy, prompts, strategy, budget, *, slots, max_batch, batching="deterministic", seed=3,
             make_env=make_math_env, max_new_tokens=256, backend="local", ray=None, workers=2) -> Collection:
    kwargs = {} if ray is None else {"ray": ray}
    config = RolloutConfig(seed=1, workers=workers, concurrent_prompts=slots, max_batch_size=max_batch,
                           batching=batching, sampling=SamplingConfig(max_new_tokens=max_new_tokens),
                           backend=backend, **kwargs)
    with TreeCollector(make_env=make_env, policy=policy, predictor=_predictor(), config=config) as collector:
        return collector.collect(prompts, strategy, budget, seed=seed)


# --------------------------------------------------------------------------------------------------
# bit-identical to the reference


@pytest.mark.parametrize("strategy", [GRPO(), TreePO(), TRACE()], ids=lambda s: s.name)
def test_async_engine_equals_the_lockstep_reference(strategy) -> None:
    policy, prompts = _slow_scripted(8)
    budget = Budget(roots=12, continuations_per_root=2, group_size=3)
    got = _collect(policy, prompts, strategy, budget, slots=3, max_batch=5)
    want = reference_collect(make_env=make_math_env, policy=policy, predictor=_predictor(), strategy=strategy,
                             budget=budget, prompts=prompts, cfg_seed=1, seed=3, max_batch=5, slots=3,
                             max_new_tokens=256)
    assert len(got.trees) == len(want) == budget.max_active
    assert _dump(got.trees) == _dump(want)
    assert got.engine.calls > 0 and max(got.engine.batch_sizes) <= 5
    _check_budget(got, budget, strategy.branching)


@pytest.mark.parametrize("strategy", [TreePO(), TRACE()], ids=lambda s: s.name)
def test_async_engine_equals_the_reference_with_the_real_transformers_backend(strategy, tiny_hf_policy) -> None:  # noqa: F811
    """Batched forward passes are only bit-identical for the same batch composition: the deterministic
    mode must reproduce the reference's batches exactly, chunking and slot hand-offs included."""
    from ..test_rollout import math_tasks

    prompts = [PromptSpec(task_id=t.task_id, reset_seed=7) for t in math_tasks(5)]
    budget = Budget(roots=8, continuations_per_root=1, group_size=2)
    got = _collect(tiny_hf_policy, prompts, strategy, budget, slots=3, max_batch=3, max_new_tokens=5)
    want = reference_collect(make_env=make_math_env, policy=tiny_hf_policy, predictor=_predictor(),
                             strategy=strategy, budget=budget, prompts=prompts, cfg_seed=1, seed=3, max_batch=3,
                             slots=3, max_new_tokens=5)
    assert _dump(got.trees) == _dump(want)
    _check_budget(got, budget, strategy.branching)


def test_deterministic_runs_repeat_bit_for_bit_and_the_seed_matters() -> None:
    policy, prompts = _slow_scripted(6)
    budget = Budget(roots=8, continuations_per_root=2, group_size=2)
    a = _collect(policy, prompts, TRACE(), budget, slots=2, max_batch=4)
    b = _collect(policy, prompts, TRACE(), budget, slots=2, max_batch=4, workers=1)  # env threads never matter
    c = _collect(policy, prompts, TRACE(), budget, slots=2, max_batch=4, seed=4)
    assert _dump(a.trees) == _dump(b.trees)
    assert a.engine.batch_sizes == b.engine.batch_sizes
    assert _dump(a.trees) != _dump(c.trees)


# --------------------------------------------------------------------------------------------------
# every strategy, both batching modes


@pytest.mark.parametrize("name", STRATEGY_NAMES)
def test_budget_and_token_invariants_hold_for_every_strategy(name) -> None:
    strategy = make_strategy(name)
    policy, prompts = _slow_scripted(6)
    budget = Budget(roots=8, continuations_per_root=2, group_size=2)
    config = RolloutConfig(seed=0, concurrent_prompts=3, max_batch_size=6, oracle_samples=2)
    with TreeCollector(make_env=make_math_env, policy=policy, predictor=_predictor(), config=config) as collector:
        batch = collector.collect(prompts, strategy, budget, seed=1)
    _check_budget(batch, budget, strategy.branching)
    for tree in batch.trees:
        for leaf in tree.leaves():
            ctx = node_context(tree, leaf)
            assert ctx.token_ids[:len(tree.root.observation_ids)] == tuple(tree.root.observation_ids)
            assert ctx.num_generated == sum(len(n.generated_ids) for n in leaf.path())
            assert all(np.isfinite(x) == g for x, g in zip(ctx.logprobs, ctx.generated, strict=True))
    if name.startswith("oracle"):
        assert batch.oracle_generated_tokens > 0 and batch.oracle_env_steps > 0


def test_dynamic_batching_gives_valid_trees_and_fuller_batches_in_any_order() -> None:
    policy, prompts = _slow_scripted(8)
    budget = Budget(roots=12, continuations_per_root=2, group_size=3)
    det = _collect(policy, prompts, TRACE(), budget, slots=4, max_batch=8)
    dyn = _collect(policy, prompts, TRACE(), budget, slots=4, max_batch=8, batching="dynamic")
    _check_budget(dyn, budget, True)
    assert max(dyn.engine.batch_sizes) <= 8
    assert dyn.engine.sequences == det.engine.sequences
    # this policy's turns depend on their own seeds only, so even dynamic batches give the same trees
    assert _dump(dyn.trees) == _dump(det.trees)


# --------------------------------------------------------------------------------------------------
# the scheduler itself


class _Recorder:
    """A batch-invariant policy: each turn's single token is its seed mod 97; records every call's seeds."""

    def __init__(self, delay: float = 0.0, fail_on: int | None = None) -> None:
        self.calls: list[list[int]] = []
        self.threads: set[str] = set()
        self.delay = delay
        self.fail_on = fail_on

    def generate(self, contexts, sampling=None, *, seeds=None, sessions=None):
        self.threads.add(threading.current_thread().name)
        self.calls.append(list(seeds))
        if self.fail_on is not None and len(self.calls) == self.fail_on:
            raise RuntimeError("backend exploded")
        time.sleep(self.delay)
        return [Generation(token_ids=(s % 97,), logprobs=(-1.0,), text="x", finish_reason="stop") for s in seeds]


def _run_engine(policy, config: EngineConfig, plan: dict[int, list[int]]) -> list[list[int]]:
    """Agents i submit len(plan[i]) rounds of plan[i][t] requests each; returns the seeds each got, per agent."""
    from concurrent.futures import ThreadPoolExecutor

    async def main():
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="trace-engine") as pool:
            engine = GenerationEngine(policy, config, executor=pool)
            got: dict[int, list[int]] = {}

            async def agent_work(i, agent):
                try:
                    for t, n in enumerate(plan[i]):
                        reqs = [TurnRequest(key=(i, 0, 0, k, t), context=TokenContext.from_prompt([1]),
                                            seed=1000 * i + 10 * t + k, session=str(i)) for k in range(n)]
                        gens = await agent.generate(reqs)
                        got.setdefault(i, []).extend(g.token_ids[0] for g in gens)
                        await asyncio.sleep(0.001 * ((i * 7 + t) % 3))  # jitter: timing must not matter
                finally:
                    agent.close()

            agents = [(i, engine.register()) for i in plan]
            await asyncio.gather(*(agent_work(i, a) for i, a in agents))
            return [got.get(i, []) for i in plan], engine.stats

    return asyncio.run(main())


def test_deterministic_rounds_are_sorted_chunked_and_independent_of_timing() -> None:
    plan = {0: [3, 2, 1], 1: [4], 2: [2, 2, 2, 2]}
    config = EngineConfig(max_batch_size=4, batching="deterministic")
    runs = []
    for delay in (0.0, 0.003):
        policy = _Recorder(delay=delay)
        results, stats = _run_engine(policy, config, plan)
        runs.append(policy.calls)
        assert policy.threads == {"trace-engine_0"}  # one engine thread only
        assert all(len(c) <= 4 for c in policy.calls)
    assert runs[0] == runs[1]
    # round 1 holds every agent's first turn (3 + 4 + 2 = 9 requests): chunks 4, 4, 1, in key order
    first = [s for c in runs[0][:3] for s in c]
    assert first == sorted(first) and len(first) == 9 and [len(c) for c in runs[0][:3]] == [4, 4, 1]
    assert results == [[(1000 * 0 + 10 * t + k) % 97 for t, n in enumerate(plan[0]) for k in range(n)],
                       [(1000 + k) % 97 for k in range(4)],
                       [(2000 + 10 * t + k) % 97 for t in range(4) for k in range(2)]]


def test_dynamic_mode_fills_batches_by_size_and_by_wait() -> None:
    policy = _Recorder(delay=0.002)
    results, stats = _run_engine(policy, EngineConfig(max_batch_size=3, max_wait_s=0.01, batching="dynamic"),
                                 {0: [1, 1, 1], 1: [5], 2: [2, 2]})
    assert stats.sequences == 3 + 5 + 4 and all(len(c) <= 3 for c in policy.calls)
    assert sorted(s for c in policy.calls for s in c) == sorted(
        [0, 10, 20] + [1000 + k for k in range(5)] + [2000, 2001, 2010, 2011])


def test_a_failing_backend_fails_the_collection_without_hanging() -> None:
    _, prompts = scripted_setup(4)
    policy = _Recorder(fail_on=2)

    class Render:  # _Recorder plus what the collector needs to build contexts
        stop_token_ids = (256,)

        def render(self, messages, tools=None):
            return TokenContext.from_prompt([1, 2, 3])

        def extend(self, context, generation, observation):
            return context.append(generation.token_ids, generated=True, logprobs=generation.logprobs)

        def generate(self, *a, **k):
            return policy.generate(*a, **k)

    t = time.perf_counter()
    with pytest.raises(RuntimeError, match="backend exploded"):
        _collect(Render(), prompts, GRPO(), Budget(roots=4, continuations_per_root=0, group_size=2), slots=2,
                 max_batch=8)
    assert time.perf_counter() - t < 60


class _AsyncScripted:
    """The scripted policy behind an ``agenerate`` (an AsyncPolicy): the engine must await it directly."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.async_calls = 0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    async def agenerate(self, contexts, sampling=None, *, seeds, sessions):
        self.async_calls += 1
        await asyncio.sleep(0)
        return self.inner.generate(contexts, sampling, seeds=seeds, sessions=sessions)


def test_an_async_policy_is_awaited_directly_and_gives_the_same_trees() -> None:
    policy, prompts = _slow_scripted(6)
    budget = Budget(roots=8, continuations_per_root=2, group_size=2)
    sync = _collect(policy, prompts, TreePO(), budget, slots=4, max_batch=8)
    wrapped = _AsyncScripted(policy)
    n_sync_calls = len(policy.calls)
    got = _collect(wrapped, prompts, TreePO(), budget, slots=4, max_batch=8)
    assert wrapped.async_calls > 0 and got.engine.calls == wrapped.async_calls
    assert len(policy.calls) - n_sync_calls == wrapped.async_calls
    assert _dump(got.trees) == _dump(sync.trees)


class _HoldingAsync(_AsyncScripted):
    """An async policy that holds each session's first request until a longer context of that session arrives.

    A longer context is a later turn of a sibling rollout: it can only arrive while the first request is held
    if siblings do not wait for each other. A request still held after ``hold_s`` goes on (``released`` says
    which sessions were released by a sibling).
    """

    def __init__(self, inner, hold_s: float = 2.0) -> None:
        super().__init__(inner)
        self.hold_s = hold_s
        self.held: dict[str, tuple[int, asyncio.Event]] = {}
        self.released: dict[str, bool] = {}

    async def agenerate(self, contexts, sampling=None, *, seeds, sessions):
        for session, context in zip(sessions, contexts, strict=True):
            held = self.held.get(session)
            if held is not None and len(context) > held[0]:
                held[1].set()
        session = sessions[0]
        if session not in self.held:
            event = asyncio.Event()
            self.held[session] = (min(len(c) for c in contexts), event)
            try:
                await asyncio.wait_for(event.wait(), self.hold_s)
                self.released[session] = True
            except asyncio.TimeoutError:
                self.released[session] = False
        return await super().agenerate(contexts, sampling, seeds=seeds, sessions=sessions)


def test_on_an_async_policy_a_rollout_does_not_wait_for_its_siblings_and_the_trees_are_unchanged() -> None:
    policy, prompts = _slow_scripted(6)
    budget = Budget(roots=24, continuations_per_root=1, group_size=4)
    sync = _collect(policy, prompts, TreePO(), budget, slots=6, max_batch=8)
    holding = _HoldingAsync(policy)
    got = _collect(holding, prompts, TreePO(), budget, slots=6, max_batch=8)
    assert _dump(got.trees) == _dump(sync.trees)
    assert len(holding.released) == len(prompts)
    assert any(holding.released.values()), "while one root's first turn was held, a sibling's next turn came in"


def _env_dying_at(nth: int):
    """make_env whose envs together raise on the ``nth`` env step (once): a sandbox that died."""
    count = [0]

    def make():
        env = make_math_env()
        inner = env.step

        def dying_step(action):
            count[0] += 1
            if count[0] == nth:
                raise RuntimeError("sandbox died")
            return inner(action)

        env.step = dying_step
        return env

    return make


@pytest.mark.parametrize("retries", [1, 0])
def test_on_an_async_policy_a_dead_env_regrows_its_prompt_or_fails_clearly(retries) -> None:
    policy, prompts = _slow_scripted(6)
    budget = Budget(roots=24, continuations_per_root=1, group_size=4)
    want = _collect(policy, prompts, TreePO(), budget, slots=6, max_batch=8)
    config = RolloutConfig(seed=1, workers=2, concurrent_prompts=6, max_batch_size=8, env_retries=retries)
    t = time.perf_counter()
    with TreeCollector(make_env=_env_dying_at(7), policy=_AsyncScripted(policy), predictor=_predictor(),
                       config=config) as collector:
        if retries == 0:
            with pytest.raises(EnvWorkerError, match="sandbox died"):
                collector.collect(prompts, TreePO(), budget, seed=3)
        else:
            got = collector.collect(prompts, TreePO(), budget, seed=3)
            assert _dump(got.trees) == _dump(want.trees)
    assert time.perf_counter() - t < 120


def test_an_engine_call_batches_across_prompts_far_beyond_one_group() -> None:
    """The issue's symptom: one call per prompt-turn (batch = group size). Now a call holds every live rollout."""
    policy, prompts = scripted_setup(8, answer_slip=0.0)
    budget = Budget(roots=16, continuations_per_root=0, group_size=4)
    batch = _collect(policy, prompts, GRPO(), budget, slots=8, max_batch=64)
    assert batch.engine.batch_sizes[0] == budget.flat_roots  # every root's first turn in one call
    assert batch.engine.mean_batch > budget.group_size
