"""Per-prompt rollout-tree collection through ``snapshot()`` / ``restore()``.

Public API::

    collector = TreeCollector(make_env=lambda: gym.make("trace_envs/PythonMath-v0", max_turns=4).unwrapped,
                              policy=policy, predictor=predictor, config=RolloutConfig(max_new_tokens=128))
    with collector:
        batch = collector.collect(prompts, TRACE(), Budget(roots=32, continuations_per_root=2, group_size=4))
    batch.trees          # one RolloutTree per active prompt (snapshots released)
    batch.stats()        # BatchStats: effective ratio, contrast pairs, depth histograms, tokens, env steps
    batch.account        # BudgetAccount: paper units and real cost side by side

One step of :meth:`TreeCollector.collect`:

1. The strategy places root rollouts on the candidate pool (``Strategy.allocate_roots``;
   it may pull predicted or Monte-Carlo prompt values from the request).
2. Each active prompt is one unit of work, run by one worker of a local thread pool with
   its own env (``make_env()`` is called once per worker thread): reset to the task,
   snapshot the root, render the root :class:`~trace_agent.policy.TokenContext` once,
   then sample the prompt's m root rollouts *turn by turn*, one batched
   ``policy.generate`` per turn over its live rollouts. The single env moves between
   rollouts with ``restore()``: before a rollout's step the env is restored to that
   rollout's last save point, after it a snapshot is taken and kept on the new tree node
   (leaves get none: nothing continues from a finished episode).
3. As soon as *its own* roots return (never waiting for the batch), the prompt's visited
   prefixes are offered to ``Strategy.allocate_continuations`` with its continuation
   budget (``N * m`` units); each chosen node's snapshot is restored and continuations
   are sampled to the end from the node's exact token context (:func:`node_context`:
   the path's recorded ids, never re-encoded).
4. The tree's snapshots are released (``RolloutTree.release_snapshots``).

Token ids on the tree. The root node's ``observation_ids`` hold the rendered prompt
(the root context); every turn node holds the ids the policy generated
(``generated_ids`` / ``generated_logprobs``) and the ids ``policy.extend`` appended
after them (end-of-turn glue, the env's observation, the next assistant header) in
``observation_ids``. So ``path_token_ids(node)`` is exactly the context the policy
continued from at ``node``; :func:`node_context` rebuilds the flagged TokenContext.
A leaf's ``observation_ids`` hold only what ``policy.finish`` adds (an end-of-turn token
after a turn cut by length), when the policy has ``finish``.

Seeds. Every ``generate`` call gets a seed derived from (config seed, collect seed,
prompt id, phase, turn), and a prompt's calls only batch its own rollouts, so results do
not depend on thread scheduling.

Distribution. :meth:`TreeCollector.grow_tree` is the whole unit of work for one prompt
(env, policy and strategy in, tree out); a Ray actor holding one env and one policy can
call it per prompt unchanged.
"""

from __future__ import annotations

import threading
import time
import zlib
from collections.abc import Callable, MutableMapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from trace_agent.allocation import BudgetAccount, BudgetConfig
from trace_agent.policy.base import Generation, Policy, TokenContext
from trace_agent.predictor import SuccessPredictor, score_nodes
from trace_agent.strategies import Budget, ExpansionRequest, RootRequest, Strategy
from trace_agent.tree import (
    BatchStats,
    Node,
    RolloutTree,
    batch_stats,
    format_messages,
    ground_truth_of,
    make_context,
)

__all__ = [
    "PromptSpec",
    "RolloutConfig",
    "Collection",
    "CollectionError",
    "TreeCollector",
    "node_context",
    "path_token_ids",
    "prompt_pool",
]

EnvFactory = Callable[[], Any]


class CollectionError(ValueError):
    """A strategy returned an allocation the collector cannot honour (the message says which rule it broke)."""


# --------------------------------------------------------------------------------------------------
# configuration and results


@dataclass(frozen=True, kw_only=True)
class PromptSpec:
    """One candidate prompt: an env task and the seed its episodes are reset with.

    Attributes:
        task_id: id in the env's task set.
        prompt_id: id of the tree (default: ``task_id``); unique within a batch.
        reset_seed: ``env.reset(seed=...)`` for this prompt's episodes.
    """

    task_id: str
    prompt_id: str = ""
    reset_seed: int = 0

    def __post_init__(self) -> None:
        if not self.task_id:
            raise ValueError("a PromptSpec needs a task_id")
        if not self.prompt_id:
            object.__setattr__(self, "prompt_id", self.task_id)


def prompt_pool(task_ids: Sequence[str], *, reset_seed: int = 0) -> list[PromptSpec]:
    """PromptSpecs for ``task_ids`` (prompt id = task id)."""
    return [PromptSpec(task_id=t, reset_seed=reset_seed) for t in task_ids]


@dataclass(frozen=True, kw_only=True)
class RolloutConfig:
    """How the collector samples.

    Attributes:
        max_new_tokens: most tokens of one assistant turn.
        temperature: sampling temperature.
        top_p: nucleus mass.
        seed: base seed of every ``generate`` call and strategy RNG.
        workers: prompts expanded at once (threads, one env each).
        oracle_samples: rollouts per anchor when a strategy asks for Monte-Carlo values.
        release_snapshots: release each tree's snapshots once it is expanded (keep them only
            to inspect or branch further by hand; PythonMath-v0 snapshots hold processes).
    """

    max_new_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int = 0
    workers: int = 2
    oracle_samples: int = 8
    release_snapshots: bool = True

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1 or self.workers < 1 or self.oracle_samples < 1:
            raise ValueError("max_new_tokens, workers and oracle_samples must be >= 1")
        if not (self.temperature >= 0.0 and 0.0 < self.top_p <= 1.0):
            raise ValueError("temperature must be >= 0 and top_p in (0, 1]")


@dataclass(frozen=True, kw_only=True)
class Collection:
    """What one :meth:`TreeCollector.collect` call produced.

    Attributes:
        strategy: the strategy's name.
        budget: the budget it was given.
        prompt_ids: the candidate pool, in order.
        roots: root rollouts allocated per candidate (0: skipped).
        trees: one tree per active prompt, in pool order.
        account: the budget spent, in paper units and in real cost (tokens, env steps).
        wall_seconds: time of the whole call.
        oracle_generated_tokens / oracle_env_steps: Monte-Carlo estimation cost (Oracle only;
            outside the budget).
        root_values: the prompt values the strategy pulled (predicted or Monte-Carlo), NaN
            where it pulled none.
    """

    strategy: str
    budget: Budget
    prompt_ids: tuple[str, ...]
    roots: tuple[int, ...]
    trees: tuple[RolloutTree, ...]
    account: BudgetAccount
    wall_seconds: float
    oracle_generated_tokens: int = 0
    oracle_env_steps: int = 0
    root_values: tuple[float, ...] = ()

    @property
    def skipped(self) -> tuple[str, ...]:
        """Candidate prompts that got no rollout."""
        return tuple(p for p, m in zip(self.prompt_ids, self.roots, strict=True) if m == 0)

    def stats(self) -> BatchStats:
        """Batch statistics of the trees (effective ratio = mixed trees / active prompts)."""
        return batch_stats(self.trees, continuation_cost=self.budget.continuation_cost)


# --------------------------------------------------------------------------------------------------
# token contexts from trees


def path_token_ids(node: Node) -> list[int]:
    """Every token id from the root's prompt to the end of ``node``'s turn (generated + appended)."""
    return [t for n in node.path() for t in (*n.generated_ids, *n.observation_ids)]


def node_context(tree: RolloutTree, node: Node) -> TokenContext:
    """The exact TokenContext the policy continues from at ``node``, rebuilt from the recorded ids.

    Prompt, template and observation ids are flagged not generated; generated ids carry their
    behaviour log-probs (NaN where a tree did not record them).
    """
    ctx = TokenContext.from_prompt(tree.root.observation_ids)
    for n in node.path()[1:]:
        if n.generated_ids:
            logps = n.generated_logprobs or [float("nan")] * len(n.generated_ids)
            ctx = ctx.append(n.generated_ids, generated=True, logprobs=logps)
        if n.observation_ids:
            ctx = ctx.append(n.observation_ids, generated=False)
    return ctx


# --------------------------------------------------------------------------------------------------
# the collector


@dataclass(eq=False)
class _Live:
    """A rollout in progress: the env state and token context at its tip."""

    snapshot: Any
    context: TokenContext
    n_messages: int
    node: Node | None = None
    rollout_id: int = -1
    owns_snapshot: bool = False
    reward: float = 0.0


@dataclass
class _Counter:
    generated_tokens: int = 0
    env_steps: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, tokens: int, steps: int) -> None:
        with self.lock:
            self.generated_tokens += tokens
            self.env_steps += steps


def _seed(*parts: int) -> int:
    return int(np.random.SeedSequence([int(p) & 0xFFFFFFFF for p in parts]).generate_state(1)[0])


def _key(text: str) -> int:
    return zlib.crc32(text.encode("utf-8"))


class TreeCollector:
    """Builds rollout trees for a prompt pool with a policy, a strategy and a budget (see the module docstring).

    Args:
        make_env: returns a fresh branchable env (a ``BranchableEnv`` or a wrapper with
            ``snapshot``/``restore``); called once per worker thread.
        policy: the generation backend (:class:`~trace_agent.policy.Policy`). It is called
            from several threads at once; one call only ever batches one prompt's rollouts.
        predictor: the success predictor strategies may pull values from (None: strategies
            that ask for predictions fail with a clear error).
        config: sampling settings.
        root_oracle: optional shared cache prompt id -> Monte-Carlo success rate, so that a
            benchmark with a fixed policy estimates each prompt once across seeds.
    """

    def __init__(
        self,
        *,
        make_env: EnvFactory,
        policy: Policy,
        predictor: SuccessPredictor | None = None,
        config: RolloutConfig | None = None,
        root_oracle: MutableMapping[str, float] | None = None,
    ) -> None:
        self.make_env = make_env
        self.policy = policy
        self.predictor = predictor
        self.config = config or RolloutConfig()
        self.root_oracle = root_oracle
        self._local = threading.local()
        self._envs: list[Any] = []
        self._lock = threading.Lock()
        self._predict_lock = threading.Lock()
        self._executor: ThreadPoolExecutor | None = None

    # ---------------------------------------------------------------- lifecycle

    def __enter__(self) -> TreeCollector:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Shut the worker pool down and close every env it created (idempotent)."""
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None
        with self._lock:
            envs, self._envs = self._envs, []
            self._local = threading.local()
        for env in envs:
            env.close()

    def _pool(self) -> ThreadPoolExecutor:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=self.config.workers, thread_name_prefix="trace-rollout")
        return self._executor

    def worker_env(self) -> Any:
        """This thread's env (created on first use with ``make_env``)."""
        env = getattr(self._local, "env", None)
        if env is None:
            env = self.make_env()
            self._local.env = env
            with self._lock:
                self._envs.append(env)
        return env

    def _map(self, fn: Callable[[Any], Any], items: Sequence[Any]) -> list[Any]:
        if self.config.workers == 1 or len(items) <= 1:
            return [fn(x) for x in items]
        return list(self._pool().map(fn, items))

    # ---------------------------------------------------------------- env helpers

    @staticmethod
    def _core(env: Any) -> Any:
        from trace_envs.core import find_branchable

        return find_branchable(env)

    def _start(self, env: Any, prompt: PromptSpec) -> tuple[Any, list[dict[str, Any]], list[dict[str, Any]]]:
        env.reset(seed=prompt.reset_seed, options={"task_id": prompt.task_id})
        base = env.unwrapped
        return self._core(env).snapshot(), base.messages, base.tools

    def prompt_contexts(self, prompts: Sequence[PromptSpec]) -> list[str]:
        """The predictor's context of each prompt (what ``RolloutTree.context(root)`` will be)."""

        def one(prompt: PromptSpec) -> str:
            env = self.worker_env()
            snap, messages, _ = self._start(env, prompt)
            snap.release()
            return make_context(format_messages(messages), "")

        return self._map(one, prompts)

    def predict_prompts(self, prompts: Sequence[PromptSpec]) -> NDArray[np.float64]:
        """The predictor's v-hat for each prompt."""
        contexts = self.prompt_contexts(prompts)
        return self._predict(contexts)

    def _predict(self, contexts: Sequence[str]) -> NDArray[np.float64]:
        if self.predictor is None:
            raise CollectionError("this strategy asks for predicted values but the collector has no predictor")
        with self._predict_lock:
            return np.clip(np.asarray(self.predictor.predict(list(contexts)), dtype=np.float64), 0.0, 1.0)

    # ---------------------------------------------------------------- sampling core

    def _advance(self, env: Any, tree: RolloutTree | None, lives: list[_Live], seed_parts: Sequence[int],
                 counter: _Counter | None = None) -> None:
        """Run ``lives`` to the end of their episodes, one batched ``generate`` per turn.

        With a tree, every finished turn becomes a node (with a snapshot unless it ends the
        episode); without one (Monte-Carlo), only the rewards are kept and snapshots are
        released as soon as they are passed.
        """
        cfg = self.config
        core = self._core(env)
        base = env.unwrapped
        finish = getattr(self.policy, "finish", None)
        active = list(lives)
        turn = 0
        while active:
            gens: list[Generation] = self.policy.generate(
                [live.context for live in active], max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature,
                top_p=cfg.top_p, seed=_seed(*seed_parts, turn),
            )
            still: list[_Live] = []
            for live, gen in zip(active, gens, strict=True):
                core.restore(live.snapshot)
                _, reward, terminated, truncated, _ = env.step(gen.text)
                messages = base.messages
                added = messages[live.n_messages:]
                done = bool(terminated or truncated)
                if done:
                    snap = None
                    after = finish(live.context, gen) if callable(finish) else live.context.append(
                        gen.token_ids, generated=True, logprobs=gen.logprobs)
                else:
                    snap = core.snapshot()
                    after = self.policy.extend(live.context, gen, added[1:])
                appended = list(after.token_ids[len(live.context) + len(gen.token_ids):])
                if counter is not None:
                    counter.add(len(gen.token_ids), 1)
                if tree is not None:
                    assert live.node is not None
                    node = tree.add_turn(
                        live.node, rollout_id=live.rollout_id, generated_ids=gen.token_ids,
                        generated_logprobs=gen.logprobs, observation_ids=appended, messages=added, snapshot=snap,
                        info={"finish_reason": gen.finish_reason, "terminated": bool(terminated),
                              "truncated": bool(truncated)},
                    )
                    if done:
                        tree.finish(node, float(reward))
                    live.node = node
                elif live.owns_snapshot:
                    live.snapshot.release()
                live.reward = float(reward)
                if not done:
                    live.snapshot, live.context, live.n_messages = snap, after, len(messages)
                    live.owns_snapshot = tree is None
                    still.append(live)
            active = still
            turn += 1

    def _monte_carlo(self, env: Any, anchors: Sequence[tuple[Any, TokenContext, int]], seed_parts: Sequence[int],
                     counter: _Counter) -> NDArray[np.float64]:
        """Mean reward of ``oracle_samples`` rollouts from each (snapshot, context, message count) anchor."""
        r = self.config.oracle_samples
        lives = [_Live(snapshot=s, context=c, n_messages=n) for s, c, n in anchors for _ in range(r)]
        self._advance(env, None, lives, seed_parts, counter)
        rewards = np.asarray([live.reward for live in lives], dtype=np.float64).reshape(len(anchors), r)
        return (rewards >= 0.5).mean(axis=1) if len(anchors) else np.zeros(0)

    def oracle_prompts(self, prompts: Sequence[PromptSpec], *, seed: int = 0,
                       counter: _Counter | None = None) -> NDArray[np.float64]:
        """Monte-Carlo success rate of each prompt (``oracle_samples`` rollouts from its root; cached in ``root_oracle``)."""
        counter = counter or _Counter()

        def one(prompt: PromptSpec) -> float:
            if self.root_oracle is not None and prompt.prompt_id in self.root_oracle:
                return float(self.root_oracle[prompt.prompt_id])
            env = self.worker_env()
            snap, messages, tools = self._start(env, prompt)
            try:
                ctx = self.policy.render(messages, tools)
                value = float(self._monte_carlo(env, [(snap, ctx, len(messages))],
                                                (self.config.seed, seed, _key(prompt.prompt_id), 2), counter)[0])
            finally:
                snap.release()
            if self.root_oracle is not None:
                self.root_oracle[prompt.prompt_id] = value
            return value

        return np.asarray(self._map(one, prompts), dtype=np.float64)

    # ---------------------------------------------------------------- one prompt

    def grow_tree(
        self,
        env: Any,
        prompt: PromptSpec,
        *,
        roots: int,
        strategy: Strategy,
        budget: Budget,
        seed: int = 0,
        value: float | None = None,
        oracle_counter: _Counter | None = None,
    ) -> RolloutTree:
        """One prompt's whole unit of work: ``roots`` root rollouts, then its continuations, on ``env``.

        The continuation budget is ``budget.prompt_continuations(roots)`` for a branching
        strategy and 0 otherwise. Snapshots are released at the end when the config says so.
        """
        if roots < 1:
            raise CollectionError(f"prompt {prompt.prompt_id!r} needs at least one root rollout, got {roots}")
        counter = oracle_counter or _Counter()
        pid = _key(prompt.prompt_id)
        root_snap, messages, tools = self._start(env, prompt)
        root_ctx = self.policy.render(messages, tools)
        tree = RolloutTree(
            prompt_id=prompt.prompt_id, task_id=prompt.task_id, messages=messages, snapshot=root_snap, value=value,
            tools=tools, ground_truth=ground_truth_of(getattr(getattr(root_snap, "task", None), "data", None)),
            metadata={"env_id": getattr(env.unwrapped, "env_id", type(env.unwrapped).__name__),
                      "strategy": strategy.name, "reset_seed": prompt.reset_seed, "seed": seed},
        )
        tree.root.observation_ids = list(root_ctx.token_ids)
        try:
            lives = [_Live(snapshot=root_snap, context=root_ctx, n_messages=len(messages), node=tree.root,
                           rollout_id=tree.start_rollout()) for _ in range(roots)]
            self._advance(env, tree, lives, (self.config.seed, seed, pid, 0))
            cont_budget = budget.prompt_continuations(roots) if strategy.branching else 0
            if cont_budget > 0:
                self._expand(env, tree, strategy, budget, cont_budget, seed, pid, counter)
        finally:
            if self.config.release_snapshots:
                tree.release_snapshots()
        return tree

    def _expand(self, env: Any, tree: RolloutTree, strategy: Strategy, budget: Budget, cont_budget: int,
                seed: int, pid: int, counter: _Counter) -> None:
        candidates = tuple(n for n in tree.nodes if not n.is_root and not n.is_leaf and n.snapshot is not None)
        n_prompt = len(tree.root.messages)

        def predict_nodes(nodes: Sequence[Node]) -> NDArray[np.float64]:
            if self.predictor is None:
                raise CollectionError("this strategy asks for predicted values but the collector has no predictor")
            with self._predict_lock:
                return score_nodes(self.predictor, tree, list(nodes))

        def oracle_nodes(nodes: Sequence[Node]) -> NDArray[np.float64]:
            anchors = [(n.snapshot, node_context(tree, n), n_prompt + len(n.history())) for n in nodes]
            values = self._monte_carlo(env, anchors, (self.config.seed, seed, pid, 3), counter)
            for n, v in zip(nodes, values, strict=True):
                n.info["oracle_value"] = float(v)
            return values

        request = ExpansionRequest(
            tree=tree, budget=cont_budget, candidates=candidates, root_exchange=budget.root_exchange,
            prefix_cap=budget.prefix_cap,
            rng=np.random.default_rng(_seed(self.config.seed, seed, pid, 4)),
            predict_nodes=predict_nodes, oracle_nodes=oracle_nodes,
        )
        allocation = strategy.allocate_continuations(request)
        starts = self._check_continuations(allocation, request)
        lives = []
        for node, k in starts:
            ctx = node_context(tree, node)
            n_messages = n_prompt + len(node.history())
            for _ in range(k):
                lives.append(_Live(snapshot=node.snapshot, context=ctx, n_messages=n_messages, node=node,
                                   rollout_id=tree.start_rollout(node)))
        self._advance(env, tree, lives, (self.config.seed, seed, pid, 1))

    @staticmethod
    def _check_continuations(allocation: Any, request: ExpansionRequest) -> list[tuple[Node, int]]:
        allowed = {n.node_id: n for n in request.candidates}
        allowed[0] = request.tree.root
        out: list[tuple[Node, int]] = []
        cost = 0
        for key, count in dict(allocation).items():
            node_id, k = int(key), int(count)
            if node_id not in allowed:
                raise CollectionError(
                    f"continuation from node {node_id} of {request.tree.prompt_id!r}: only the root and visited "
                    f"non-leaf prefixes with a snapshot ({sorted(allowed)}) can be continued")
            if k < 0:
                raise CollectionError(f"negative continuation count {k} for node {node_id}")
            if k:
                out.append((allowed[node_id], k))
                cost += k * (request.root_exchange if node_id == 0 else 1)
        if cost > request.budget:
            raise CollectionError(
                f"continuations of {request.tree.prompt_id!r} cost {cost} units but its budget is {request.budget}")
        out.sort(key=lambda item: item[0].node_id)
        return out

    # ---------------------------------------------------------------- a batch

    def collect(self, prompts: Sequence[PromptSpec], strategy: Strategy, budget: Budget, *,
                seed: int = 0) -> Collection:
        """Allocate roots over ``prompts`` with ``strategy``, grow one tree per active prompt, account the budget.

        Raises:
            CollectionError: duplicate prompt ids, or a strategy allocation that breaks the
                budget (wrong total, too many active prompts, a prompt with 1 rollout, ...).
        """
        t0 = time.perf_counter()
        ids = tuple(p.prompt_id for p in prompts)
        if len(set(ids)) != len(ids):
            raise CollectionError("prompt ids must be unique within a batch")
        counter = _Counter()
        pulled: dict[str, NDArray[np.float64]] = {}

        def predicted() -> NDArray[np.float64]:
            pulled["v"] = self.predict_prompts(prompts)
            return pulled["v"]

        def oracle() -> NDArray[np.float64]:
            pulled["v"] = self.oracle_prompts(prompts, seed=seed, counter=counter)
            return pulled["v"]

        root_budget = budget.roots if strategy.branching else budget.flat_roots
        request = RootRequest(prompt_ids=ids, budget=budget, root_budget=root_budget,
                              rng=np.random.default_rng(_seed(self.config.seed, seed, 5)),
                              predict_values=predicted, oracle_values=oracle)
        roots = [int(m) for m in strategy.allocate_roots(request)]
        self._check_roots(roots, request)
        values = pulled.get("v")
        jobs = [(p, m, None if values is None else float(values[i]))
                for i, (p, m) in enumerate(zip(prompts, roots, strict=True)) if m > 0]

        def one(job: tuple[PromptSpec, int, float | None]) -> RolloutTree:
            prompt, m, v = job
            return self.grow_tree(self.worker_env(), prompt, roots=m, strategy=strategy, budget=budget, seed=seed,
                                  value=v, oracle_counter=counter)

        trees = self._map(one, jobs)
        account = BudgetAccount(config=BudgetConfig(continuation_cost=budget.continuation_cost))
        for tree in trees:
            account.charge_tree(tree)
        return Collection(
            strategy=strategy.name, budget=budget, prompt_ids=ids, roots=tuple(roots), trees=tuple(trees),
            account=account, wall_seconds=time.perf_counter() - t0,
            oracle_generated_tokens=counter.generated_tokens, oracle_env_steps=counter.env_steps,
            root_values=tuple(float("nan") for _ in ids) if values is None else tuple(float(v) for v in values),
        )

    @staticmethod
    def _check_roots(roots: list[int], request: RootRequest) -> None:
        if len(roots) != len(request.prompt_ids):
            raise CollectionError(f"{len(roots)} root counts for {len(request.prompt_ids)} candidate prompts")
        if any(m < 0 for m in roots):
            raise CollectionError("root counts must be >= 0")
        if sum(roots) != request.root_budget:
            raise CollectionError(f"root counts sum to {sum(roots)}, the root budget is {request.root_budget}")
        active = sum(1 for m in roots if m > 0)
        if active > request.budget.max_active:
            raise CollectionError(f"{active} active prompts, at most {request.budget.max_active} allowed")

