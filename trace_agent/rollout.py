"""Rollout-tree collection through ``snapshot()`` / ``restore()``, on the shared asynchronous engine.

Public API::

    collector = TreeCollector(make_env=lambda: gym.make("trace_envs/PythonMath-v0", max_turns=4).unwrapped,
                              policy=policy, predictor=predictor,
                              config=RolloutConfig(sampling=SamplingConfig(max_new_tokens=128)))
    with collector:
        batch = collector.collect(prompts, TRACE(), Budget(roots=32, continuations_per_root=2, group_size=4))
    batch.trees          # one RolloutTree per active prompt (snapshots released)
    batch.stats()        # BatchStats: effective ratio, contrast pairs, depth histograms, tokens, env steps
    batch.engine         # EngineStats: engine calls, sequences per call, time inside the backend

One :meth:`TreeCollector.collect` call runs one asyncio event loop (docs/engine.md):

1. The collector computes the prompt values the strategy reads
   (:class:`~trace_agent.strategies.Reads`): predicted (the prompts' contexts, then the
   predictor) and/or Monte-Carlo (rollouts through the shared engine); then the strategy places
   root rollouts on the candidate pool with those values in hand
   (:func:`~trace_agent.strategies.place_roots`, on a thread of its own).
2. Each active prompt's tree grows as its own task (:class:`~trace_agent.engine.growth.Growth`)
   on its own env session: roots turn by turn, its own expansion as soon as its roots end
   (never waiting for the batch), snapshots released at the end. At most
   ``concurrent_prompts`` prompts (env slots) are alive at once; the rest start in pool order.
3. Every task's turn requests go to ONE shared engine
   (:class:`~trace_agent.engine.scheduler.GenerationEngine`), which batches the live rollouts of
   all prompts into ``policy.generate`` calls on one engine thread; env steps run off the
   event loop (local threads, or Ray actors with ``backend="ray"``) and overlap with generation.

Token ids on the tree. The root node's ``observation_ids`` hold the rendered prompt; every
turn node holds the ids the policy generated (``generated_ids`` / ``generated_logprobs``)
and the ids ``policy.extend`` appended after them in ``observation_ids``, so
``path_token_ids(node)`` is exactly the context the policy continued from at ``node``
(:func:`node_context` rebuilds the flagged TokenContext). A leaf's ``observation_ids`` hold
only what ``policy.finish`` adds, when the policy has ``finish``.

Seeds and reproducibility. Every turn request carries its own seed, a function of (config
seed, collect seed, prompt id, phase, rollout id, turn). With ``batching="deterministic"``
(the default) batch composition is fixed by the algorithm, so trees are bit-identical across
runs and across the local and Ray backends; ``batching="dynamic"`` fills the engine by time
and is only statistically equivalent. See docs/engine.md.
"""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Coroutine, MutableMapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np
from numpy.typing import NDArray

from trace_agent.config import TrainConfig
from trace_agent.contexts import format_messages, make_context
from trace_agent.engine.base import (
    CollectionError,
    EnvWorkerError,
    PromptSpec,
    node_context,
    path_token_ids,
    prompt_pool,
    request_seed,
)
from trace_agent.engine.envs import EnvFactory, EnvHost, LocalEnvHost, _LocalSession
from trace_agent.engine.growth import Growth, in_thread, run_prompts
from trace_agent.engine.phases import PhaseBreakdown, PhaseTimer, timed
from trace_agent.engine.scheduler import EngineConfig, EngineStats, GenerationEngine
from trace_agent.engine.settings import EngineSettings
from trace_agent.policy.base import Policy, SamplingConfig
from trace_agent.predictor import SuccessPredictor
from trace_agent.rundir import raises_keyboard_interrupt
from trace_agent.strategies import Budget, Strategy, ValueKind, place_roots, reads_of, recorded_values
from trace_agent.tree import RolloutTree
from trace_agent.tree_stats import BatchStats, batch_stats

__all__ = [
    "PromptSpec",
    "RolloutConfig",
    "Collection",
    "CollectionError",
    "EnvWorkerError",
    "TreeCollector",
    "node_context",
    "path_token_ids",
    "prompt_pool",
]

T = TypeVar("T")

#: Most prompt contexts a collector keeps (see :meth:`TreeCollector.prompt_contexts`).
CONTEXT_CACHE_SIZE = 16384


# --------------------------------------------------------------------------------------------------
# configuration and results


def run_interruptibly(make: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """``asyncio.run(make())``, except that a Ctrl-C always ends in :class:`KeyboardInterrupt`.

    ``asyncio.run`` turns SIGINT into a cancellation of the main task and raises
    ``KeyboardInterrupt`` only if that task ends cancelled; a coroutine that absorbs the
    cancellation somewhere down its await chain would return normally and the interrupt would be
    lost (a training run then goes on after Ctrl-C). Here the interrupt is recorded by our own
    handler (main thread, default handler only), the task is cancelled, and ``KeyboardInterrupt``
    is raised once the loop is done, whatever the task did; a second Ctrl-C raises at once. This
    applies where the SIGINT handler in force raises ``KeyboardInterrupt`` (Python's default, or a
    training run's :func:`~trace_agent.rundir.stop_signals`); that handler comes back afterwards.
    """
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.getsignal(signal.SIGINT)
    if not main_thread or not raises_keyboard_interrupt(previous):
        return asyncio.run(make())
    interrupted = False
    current: asyncio.Task[Any] | None = None

    async def main() -> T:
        nonlocal current
        current = asyncio.current_task()
        return await make()

    with asyncio.Runner() as runner:
        loop = runner.get_loop()

        def on_sigint(signum: int, frame: Any) -> None:
            nonlocal interrupted
            if interrupted or current is None:
                raise KeyboardInterrupt
            interrupted = True
            loop.call_soon_threadsafe(current.cancel)

        signal.signal(signal.SIGINT, on_sigint)
        try:
            result = runner.run(main())
        except asyncio.CancelledError:
            if interrupted:
                raise KeyboardInterrupt from None
            raise
        finally:
            signal.signal(signal.SIGINT, previous)
    if interrupted:
        raise KeyboardInterrupt
    return result


@dataclass(frozen=True, kw_only=True)
class RolloutConfig(EngineSettings):
    """How the collector samples, batches and where its envs live.

    The engine's settings (``workers``, ``concurrent_prompts``, ``max_batch_size``, ``max_wait_s``,
    ``batching``, ``backend``, ``ray``) are its base class's, :class:`~trace_agent.engine.settings.EngineSettings`
    (documented, defaulted and checked there): a training config's ``rollout.engine`` section is one, and
    :meth:`of` makes a run's collector settings from it. The fields added here:

    Attributes:
        sampling: how every turn is sampled (the engine hands it to the backend as is); its
            ``seed`` must be None: ``seed`` below seeds every request.
        seed: base seed of every request seed and strategy RNG (the training config's default).
        env_retries: times a prompt whose env died is regrown from scratch on a fresh env
            before the collection fails with :class:`EnvWorkerError`.
        oracle_samples: rollouts per anchor when a strategy asks for Monte-Carlo values.
        release_snapshots: release each tree's snapshots once it is expanded (keep them only
            to inspect or branch further by hand; PythonMath-v0 snapshots hold processes).
    """

    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    seed: int = TrainConfig.seed
    env_retries: int = 1
    oracle_samples: int = 8
    release_snapshots: bool = True

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.oracle_samples < 1:
            raise ValueError(f"oracle_samples must be >= 1, got {self.oracle_samples}")
        if self.env_retries < 0:
            raise ValueError(f"env_retries must be >= 0, got {self.env_retries}")
        EngineConfig(sampling=self.sampling)  # validates the sampling object

    @classmethod
    def of(cls, engine: EngineSettings, **kwargs: Any) -> RolloutConfig:
        """The collector settings of ``engine`` (a config's ``rollout.engine``) plus ``kwargs`` (``sampling``,
        ``seed``, ...)."""
        return cls(**engine.engine_fields(), **kwargs)


@dataclass(frozen=True, kw_only=True)
class Collection:
    """What one :meth:`TreeCollector.collect` call produced.

    Attributes:
        strategy: the strategy's name.
        budget: the budget it was given.
        prompt_ids: the candidate pool, in order.
        roots: root rollouts allocated per candidate (0: skipped).
        trees: one tree per active prompt, in pool order.
        wall_seconds: time of the whole call.
        oracle_generated_tokens / oracle_env_steps: Monte-Carlo estimation cost (Oracle only;
            outside the budget).
        root_values: the prompt values the strategy asked for (predicted or Monte-Carlo; the
            kind computed last when it asked for both), NaN where it asked for none.
        engine: what the shared engine did (calls, sequences per call, seconds in the backend).
        predictor_seconds: time inside ``predictor.predict`` / node scoring.
        phases: where the wall clock went, by phase, when the collector's ``phase_timer`` is set.
    """

    strategy: str
    budget: Budget
    prompt_ids: tuple[str, ...]
    roots: tuple[int, ...]
    trees: tuple[RolloutTree, ...]
    wall_seconds: float
    oracle_generated_tokens: int = 0
    oracle_env_steps: int = 0
    root_values: tuple[float, ...] = ()
    engine: EngineStats = field(default_factory=EngineStats)
    predictor_seconds: float = 0.0
    phases: PhaseBreakdown | None = None

    @property
    def skipped(self) -> tuple[str, ...]:
        """Candidate prompts that got no rollout."""
        return tuple(p for p, m in zip(self.prompt_ids, self.roots, strict=True) if m == 0)

    def stats(self) -> BatchStats:
        """Batch statistics of the trees (effective ratio = mixed trees / active prompts)."""
        return batch_stats(self.trees, continuation_cost=self.budget.continuation_cost)


class _TimedPredictor:
    """Delegates to a predictor, adding the seconds spent in ``predict`` to ``seconds``."""

    def __init__(self, predictor: Any, timer: PhaseTimer | None = None) -> None:
        self._predictor = predictor
        self._timer = timer
        self.seconds = 0.0

    def predict(self, contexts: Sequence[str]) -> Any:
        t, mono = time.perf_counter(), time.monotonic()
        try:
            return self._predictor.predict(contexts)
        finally:
            self.seconds += time.perf_counter() - t
            if self._timer is not None:
                self._timer.add("predictor", mono, time.monotonic())

    def __getattr__(self, name: str) -> Any:
        return getattr(self._predictor, name)


# --------------------------------------------------------------------------------------------------
# the collector


class TreeCollector:
    """Builds rollout trees for a prompt pool with a policy, a strategy and a budget (see the module docstring).

    Args:
        make_env: returns a fresh branchable env (a ``BranchableEnv`` or a wrapper with
            ``snapshot``/``restore``). Local backend: called once per env slot in use; Ray
            backend: shipped to the actors (it must pickle with cloudpickle).
        policy: the generation backend (:class:`~trace_agent.policy.Policy`). ``generate`` is
            only called from the collector's one engine thread; ``render``/``extend`` from the
            event loop's thread. An :class:`~trace_agent.policy.AsyncPolicy` is awaited directly.
        predictor: the success predictor strategies may pull values from (None: strategies
            that ask for predictions fail with a clear error).
        config: sampling, batching and backend settings.
        root_oracle: optional shared cache prompt id -> Monte-Carlo success rate, so that a
            benchmark with a fixed policy estimates each prompt once across seeds.

    Set :attr:`phase_timer` to a :class:`~trace_agent.engine.phases.PhaseTimer` to have each
    :meth:`collect` time its phases (``Collection.phases``); None (the default) times nothing.
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
        self._host: EnvHost | None = None
        self._local: LocalEnvHost | None = None
        self._engine_thread: ThreadPoolExecutor | None = None
        self._predict_lock = threading.Lock()
        self._lock = threading.Lock()
        self._contexts: OrderedDict[tuple[str, int], str] = OrderedDict()
        self.phase_timer: PhaseTimer | None = None

    # ---------------------------------------------------------------- lifecycle
    def __enter__(self) -> TreeCollector:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Shut the engine thread, the env threads and every env (or Ray actor) down (idempotent)."""
        with self._lock:
            host, self._host = self._host, None
            local, self._local = self._local, None
            engine_thread, self._engine_thread = self._engine_thread, None
        for h in {id(x): x for x in (host, local) if x is not None}.values():
            h.close()
        if engine_thread is not None:
            engine_thread.shutdown(wait=True)

    def _local_host(self) -> LocalEnvHost:
        with self._lock:
            if self._local is None:
                self._local = LocalEnvHost(self.make_env, threads=self.config.workers)
            return self._local

    def env_host(self) -> EnvHost:
        """The env host of the configured backend (created on first use)."""
        if self.config.backend == "local":
            return self._local_host()
        with self._lock:
            if self._host is None:
                from trace_agent.engine.ray_envs import RayEnvHost

                self._host = RayEnvHost(self.make_env, self.config.ray)
            return self._host

    def worker_env(self) -> Any:
        """An env of the local pool, leased for the caller's exclusive use until :meth:`close`."""
        return self._local_host().lease()

    def _engine_executor(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._engine_thread is None:
                self._engine_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="trace-engine")
            return self._engine_thread

    def engine_config(self) -> EngineConfig:
        """The shared engine's settings for this collector."""
        c = self.config
        size = c.max_batch_size or int(getattr(self.policy, "max_batch_size", 64) or 64)
        return EngineConfig(sampling=c.sampling, max_batch_size=size, max_wait_s=c.max_wait_s, batching=c.batching)

    # ---------------------------------------------------------------- running the loop
    def _run(self, make: Callable[[], Coroutine[Any, Any, T]]) -> T:
        """Run the coroutine ``make()`` in a fresh event loop (on a helper thread when one already runs here)."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return run_interruptibly(make)
        box: dict[str, Any] = {}

        def run() -> None:
            try:
                box["value"] = asyncio.run(make())
            except BaseException as exc:  # noqa: BLE001 - re-raised in the caller
                box["error"] = exc

        thread = threading.Thread(target=run, name="trace-collect")
        thread.start()
        thread.join()
        if "error" in box:
            raise box["error"]
        return box["value"]

    def _growth(self, engine: GenerationEngine, seed: int, predictor: Any) -> Growth:
        return Growth(policy=self.policy, engine=engine, predictor=predictor, predict_lock=self._predict_lock,
                      config_seed=self.config.seed, collect_seed=seed, oracle_samples=self.config.oracle_samples,
                      release_snapshots=self.config.release_snapshots, timer=engine.timer)

    # ---------------------------------------------------------------- prompt values
    def prompt_contexts(self, prompts: Sequence[PromptSpec]) -> list[str]:
        """The predictor's context of each prompt (what ``RolloutTree.context(root)`` will be).

        A context is the prompt's reset messages, formatted. It is kept per (task id, reset
        seed), at most :data:`CONTEXT_CACHE_SIZE` of them (least recently used dropped), and
        every tree this collector grows leaves its root's, so only a prompt this collector has
        not seen costs an env reset (``EnvHost.describe``). That reset cannot be shared with
        the tree's own: the values decide which prompts get a tree, and each tree's reset is
        the state its rollouts branch from.
        """
        return self._run(lambda: self._prompt_contexts(prompts))

    async def _prompt_contexts(self, prompts: Sequence[PromptSpec]) -> list[str]:
        host = self.env_host()
        gate = asyncio.Semaphore(self.config.workers)

        async def one(prompt: PromptSpec) -> str:
            known = self._known_context(prompt)
            if known is not None:
                return known
            async with gate:
                messages = await host.describe(prompt)
            context = make_context(format_messages(messages), "")
            self._keep_context(prompt, context)
            return context

        return list(await asyncio.gather(*(one(p) for p in prompts)))

    def _known_context(self, prompt: PromptSpec) -> str | None:
        key = (prompt.task_id, prompt.reset_seed)
        with self._lock:
            if key in self._contexts:
                self._contexts.move_to_end(key)
                return self._contexts[key]
        return None

    def _keep_context(self, prompt: PromptSpec, context: str) -> None:
        with self._lock:
            self._contexts[(prompt.task_id, prompt.reset_seed)] = context
            self._contexts.move_to_end((prompt.task_id, prompt.reset_seed))
            while len(self._contexts) > CONTEXT_CACHE_SIZE:
                self._contexts.popitem(last=False)

    def _keep_root_context(self, prompt: PromptSpec, tree: RolloutTree) -> None:
        try:
            context = tree.context()
        except ValueError:  # a prompt holding the context separator: describing it fails the same way
            return
        self._keep_context(prompt, context)

    def predict_prompts(self, prompts: Sequence[PromptSpec]) -> NDArray[np.float64]:
        """The predictor's v-hat for each prompt."""
        return self._predict(self.prompt_contexts(prompts), self.predictor)

    def _predict(self, contexts: Sequence[str], predictor: Any) -> NDArray[np.float64]:
        if predictor is None:
            raise CollectionError("this strategy asks for predicted values but the collector has no predictor")
        with self._predict_lock:
            return np.clip(np.asarray(predictor.predict(list(contexts)), dtype=np.float64), 0.0, 1.0)

    async def _prompt_values(self, strategy: Strategy, prompts: Sequence[PromptSpec], predictor: Any,
                             growth: Growth, engine: GenerationEngine) -> dict[ValueKind, NDArray[np.float64]]:
        """The prompt values ``strategy`` reads (:attr:`~trace_agent.strategies.Reads.prompts`), predicted first.

        Predicted: the prompts' contexts (env work, on this loop), then the predictor (on a
        thread of its own). Monte-Carlo: rollouts from each prompt's root through the shared engine.
        """
        kinds = reads_of(strategy).prompts
        values: dict[ValueKind, NDArray[np.float64]] = {}
        if "predicted" in kinds:
            values["predicted"] = await in_thread(self._predict, await self._prompt_contexts(prompts), predictor)
        if "oracle" in kinds:
            values["oracle"] = await self._oracle_prompts(growth, engine, prompts)
        return values

    def oracle_prompts(self, prompts: Sequence[PromptSpec], *, seed: int = 0) -> NDArray[np.float64]:
        """Monte-Carlo success rate of each prompt (``oracle_samples`` rollouts from its root; cached in ``root_oracle``)."""

        async def main() -> NDArray[np.float64]:
            engine = GenerationEngine(self.policy, self.engine_config(), executor=self._engine_executor())
            return await self._oracle_prompts(self._growth(engine, seed, self.predictor), engine, prompts)

        return self._run(main)

    async def _oracle_prompts(self, growth: Growth, engine: GenerationEngine,
                              prompts: Sequence[PromptSpec]) -> NDArray[np.float64]:
        cache = self.root_oracle
        todo = [i for i, p in enumerate(prompts) if cache is None or p.prompt_id not in cache]

        async def work(j: int, agent: Any, session: Any) -> float:
            i = todo[j]
            return await growth.oracle_root(agent, session, prompts[i], index=i)

        values = await run_prompts(engine, self.env_host(), len(todo), work, limit=self.config.concurrent_prompts,
                                   retries=self.config.env_retries)
        if cache is not None:
            for i, v in zip(todo, values, strict=True):
                cache[prompts[i].prompt_id] = float(v)
            return np.asarray([float(cache[p.prompt_id]) for p in prompts], dtype=np.float64)
        return np.asarray(values, dtype=np.float64)

    # ---------------------------------------------------------------- one prompt
    def grow_tree(self, env: Any, prompt: PromptSpec, *, roots: int, strategy: Strategy, budget: Budget,
                  seed: int = 0, value: float | None = None) -> RolloutTree:
        """One prompt's whole unit of work on ``env``: ``roots`` root rollouts, then its continuations.

        The continuation budget is ``budget.prompt_continuations(roots)`` for a branching
        strategy and 0 otherwise. Snapshots are released at the end when the config says so.
        ``env`` stays the caller's (it is not closed).
        """
        local = self._local_host()

        async def main() -> RolloutTree:
            engine = GenerationEngine(self.policy, self.engine_config(), executor=self._engine_executor())
            agent = engine.register()
            try:
                session = _LocalSession(local, env)
                return await self._growth(engine, seed, self.predictor).grow(
                    agent, session, prompt, index=0, roots=roots, strategy=strategy, budget=budget, value=value)
            finally:
                agent.close()

        tree = self._run(main)
        self._keep_root_context(prompt, tree)
        return tree

    # ---------------------------------------------------------------- a batch
    def collect(self, prompts: Sequence[PromptSpec], strategy: Strategy, budget: Budget, *,
                seed: int = 0) -> Collection:
        """Allocate roots over ``prompts`` with ``strategy``, grow one tree per active prompt.

        Raises:
            CollectionError: duplicate prompt ids, or a strategy allocation that breaks the
                budget (wrong total, too many active prompts, a prompt with 1 rollout, ...).
            EnvWorkerError: a prompt's env (or Ray actor) failed more than ``env_retries`` times.
        """
        ids = tuple(p.prompt_id for p in prompts)
        if len(set(ids)) != len(ids):
            raise CollectionError("prompt ids must be unique within a batch")
        return self._run(lambda: self._collect(list(prompts), strategy, budget, seed))

    async def _collect(self, prompts: list[PromptSpec], strategy: Strategy, budget: Budget, seed: int) -> Collection:
        t0 = time.perf_counter()
        ids = tuple(p.prompt_id for p in prompts)
        timer = self.phase_timer
        if timer is not None:
            timer.reset()
        host = self.env_host()
        if hasattr(host, "timer"):
            host.timer = timer
        predictor = None if self.predictor is None else _TimedPredictor(self.predictor, timer)
        engine = GenerationEngine(self.policy, self.engine_config(), executor=self._engine_executor(), timer=timer)
        growth = self._growth(engine, seed, predictor)
        offered = await self._prompt_values(strategy, prompts, predictor, growth, engine)
        rng = np.random.default_rng(request_seed(self.config.seed, seed, 5))
        roots = await in_thread(timed(timer, "allocation", lambda: place_roots(strategy, ids, budget, rng=rng,
                                                                                values=offered)))
        values = recorded_values(offered)
        jobs = [(i, p, m, None if values is None else float(values[i]))
                for i, (p, m) in enumerate(zip(prompts, roots, strict=True)) if m > 0]

        async def work(j: int, agent: Any, session: Any) -> RolloutTree:
            i, prompt, m, v = jobs[j]
            return await growth.grow(agent, session, prompt, index=i, roots=m, strategy=strategy, budget=budget,
                                     value=v)

        trees = await run_prompts(engine, host, len(jobs), work, limit=self.config.concurrent_prompts,
                                  retries=self.config.env_retries)
        for (_, prompt, _, _), tree in zip(jobs, trees, strict=True):
            self._keep_root_context(prompt, tree)
        return Collection(phases=None if timer is None else timer.breakdown(),
            strategy=strategy.name, budget=budget, prompt_ids=ids, roots=tuple(roots), trees=tuple(trees),
            wall_seconds=time.perf_counter() - t0,
            oracle_generated_tokens=growth.oracle_generated_tokens, oracle_env_steps=growth.oracle_env_steps,
            root_values=tuple(float("nan") for _ in ids) if values is None else tuple(float(v) for v in values),
            engine=engine.stats, predictor_seconds=0.0 if predictor is None else predictor.seconds,
        )
