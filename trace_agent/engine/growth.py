"""One prompt's tree, grown as an asyncio task: roots turn by turn, then its own expansion.

:class:`Growth` holds what every prompt task of one collection shares (the policy, the
shared :class:`~trace_agent.engine.scheduler.GenerationEngine`, the predictor, seeds);
:meth:`Growth.grow` is the whole unit of work of one prompt on one
:class:`~trace_agent.engine.envs.EnvSession`:

1. reset the env to the task, snapshot the root, render the root TokenContext once;
2. sample the prompt's m root rollouts *turn by turn*: each turn submits one request per
   live rollout to the engine (batched there with every other prompt's requests), then
   steps them on the prompt's env (restore the rollout's last save point, step, snapshot);
   on an async backend each rollout instead runs its turns on its own (:meth:`Growth._stream`);
3. as soon as its own roots end, compute the values the strategy reads of its visited
   prefixes (:class:`~trace_agent.strategies.Reads`: the predictor's, on a thread of its own;
   Monte-Carlo rollouts through the shared engine), offer the prefixes with those values to
   ``Strategy.allocate_continuations`` (on a thread of its own), restore each chosen node and
   sample the continuations to the end from the node's exact token context
   (:func:`~trace_agent.engine.base.node_context`);
4. release the tree's snapshots (when the config says so).

:func:`run_prompts` runs many such tasks with a bound on the prompts alive at once (env
slots): prompts start in pool order and a finishing prompt hands its slot to the next one
atomically, so the deterministic barrier of the engine never fires in between.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
from numpy.typing import NDArray

from trace_agent.engine.base import (
    CollectionError,
    EnvWorkerError,
    Phase,
    PromptSpec,
    node_context,
    prompt_key,
    request_seed,
)
from trace_agent.engine.envs import EnvHost, EnvSession, StepItem, StepOutcome
from trace_agent.engine.phases import PhaseTimer, timed
from trace_agent.engine.scheduler import Agent, GenerationEngine, TurnRequest
from trace_agent.policy.base import Generation, Policy, TokenContext
from trace_agent.strategies import (
    VALUE_KINDS,
    Budget,
    ExpansionRequest,
    Strategy,
    ValueKind,
    check_continuations,
    reads_of,
)
from trace_agent.success import success_mask
from trace_agent.tree import Node, RolloutTree, ground_truth_of

__all__ = ["Growth", "run_prompts", "in_thread"]

T = TypeVar("T")


async def in_thread(fn: Callable[..., T], *args: Any) -> T:
    """Run ``fn(*args)`` on a fresh thread and await it.

    Keeps the event loop free while ``fn`` runs (a strategy's allocation, the predictor). When
    the loop has closed before ``fn`` returns (a Ctrl-C cancelled the awaiting task), the outcome
    is dropped quietly: the thread does not die with a traceback on the closed loop.
    """
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def settle(ok: bool, value: Any) -> None:
        if future.done():
            return
        if ok:
            future.set_result(value)
        else:
            future.set_exception(value)

    def deliver(ok: bool, value: Any) -> None:
        try:
            loop.call_soon_threadsafe(settle, ok, value)
        except RuntimeError:  # the loop is closed (Ctrl-C, or the caller gave up): nobody awaits this any more
            pass

    def run() -> None:
        try:
            result = fn(*args)
        except BaseException as exc:  # noqa: BLE001 - handed to the awaiting task
            deliver(False, exc)
        else:
            deliver(True, result)

    threading.Thread(target=run, name="trace-strategy", daemon=True).start()
    return await future


@dataclass(frozen=True)
class _Turn:
    """One stepped turn of a live: what the tree records of it."""

    gen: Generation
    out: StepOutcome
    observation_ids: list[int]
    done: bool


class _StepQueue:
    """One session's env steps, one call at a time: steps queued during a call go together in the next."""

    def __init__(self, session: EnvSession) -> None:
        self.session = session
        self._queue: list[tuple[StepItem, asyncio.Future[StepOutcome]]] = []
        self._worker: asyncio.Future[None] | None = None

    async def step(self, item: StepItem) -> StepOutcome:
        future: asyncio.Future[StepOutcome] = asyncio.get_running_loop().create_future()
        self._queue.append((item, future))
        if self._worker is None or self._worker.done():
            self._worker = asyncio.ensure_future(self._drain())
        return await future

    async def _drain(self) -> None:
        while self._queue:
            batch, self._queue = self._queue, []
            try:
                outcomes = await self.session.step([item for item, _ in batch])
            except Exception as exc:  # noqa: BLE001 - handed to every waiting live
                for _, future in batch:
                    if not future.done():
                        future.set_exception(exc)
                continue
            for (_, future), outcome in zip(batch, outcomes, strict=True):
                if not future.done():
                    future.set_result(outcome)

    async def drained(self) -> None:
        """Wait for the call in flight (the session is not touched after this returns)."""
        if self._worker is not None:
            await asyncio.gather(self._worker, return_exceptions=True)


@dataclass(eq=False)
class _Live:
    """A rollout in progress: the env state and token context at its tip."""

    snapshot: Any
    context: TokenContext
    n_messages: int
    node: Node | None = None
    rollout_id: int = -1
    turn: int = 0
    owns_snapshot: bool = False
    reward: float = 0.0


class Growth:
    """Grows prompts' trees on env sessions through one engine (see the module docstring).

    Args:
        policy: renders and extends contexts (on the event loop's thread); generation goes
            through ``engine``.
        engine: the shared generation engine.
        predictor: what strategies pull predicted values from (None: asking fails clearly).
        predict_lock: serialises predictor calls.
        config_seed / collect_seed: the first two parts of every request seed.
        oracle_samples: Monte-Carlo rollouts per anchor.
        release_snapshots: release each tree's snapshots when it is done.
        timer: records allocation and bookkeeping intervals (None: no timing).
    """

    def __init__(self, *, policy: Policy, engine: GenerationEngine, predictor: Any, predict_lock: threading.Lock,
                 config_seed: int, collect_seed: int, oracle_samples: int, release_snapshots: bool,
                 timer: PhaseTimer | None = None) -> None:
        self.timer = timer
        self.policy = policy
        self.engine = engine
        self.predictor = predictor
        self.predict_lock = predict_lock
        self.config_seed = config_seed
        self.collect_seed = collect_seed
        self.oracle_samples = oracle_samples
        self.release_snapshots = release_snapshots
        self.oracle_generated_tokens = 0
        self.oracle_env_steps = 0
        self._finish = getattr(policy, "finish", None)

    # ---------------------------------------------------------------- sampling core
    async def _advance(self, agent: Agent, session: EnvSession, tree: RolloutTree | None, lives: list[_Live], *,
                       index: int, pid: int, phase: Phase, call: int = 0, session_id: str = "") -> None:
        """Run ``lives`` to the end of their episodes.

        With a tree every finished turn becomes a node (with a snapshot unless it ends the
        episode); without one (Monte-Carlo) only rewards are kept and each snapshot is
        released as soon as it is passed. A batching engine gets one submission per turn of
        all ``lives`` (its rounds need every live's request); an engine over an async backend
        streams instead (:meth:`_stream`). Either way the tree gets the same nodes in the same
        order.
        """
        if self.engine.streams:
            await self._stream(agent, session, tree, lives, index=index, pid=pid, phase=phase, call=call,
                               session_id=session_id)
            return
        active = list(lives)
        while active:
            gens = await agent.generate([self._request(live, index, pid, phase, call, session_id) for live in active])
            outcomes = await session.step([self._step_item(live, gen) for live, gen in zip(active, gens, strict=True)])
            t_book = None if self.timer is None else self.timer.now()
            still: list[_Live] = []
            for live, gen, out in zip(active, gens, outcomes, strict=True):
                turn = self._settle(tree, live, gen, out)
                if tree is not None:
                    self._add_turn(tree, live, turn)
                if not turn.done:
                    still.append(live)
            active = still
            if t_book is not None:
                self.timer.add("bookkeeping", t_book, self.timer.now())

    async def _stream(self, agent: Agent, session: EnvSession, tree: RolloutTree | None, lives: list[_Live], *,
                      index: int, pid: int, phase: Phase, call: int, session_id: str) -> None:
        """:meth:`_advance` for an async backend: every live runs turn after turn on its own.

        A live submits its next turn as soon as its last one is stepped, so no rollout waits
        for its siblings' generations (a server batches continuously; a per-turn barrier would
        leave it idle while the slowest sibling finishes). The prompt's env still takes one
        call at a time (:class:`_StepQueue`; steps queued meanwhile go in one call). Turns are
        added to the tree afterwards, turn by turn in ``lives`` order, as the batching path
        adds them: the nodes and their ids do not depend on which live finished first.
        """
        steps = _StepQueue(session)

        async def run(live: _Live) -> list[_Turn]:
            turns: list[_Turn] = []
            while not turns or not turns[-1].done:
                (gen,) = await agent.generate([self._request(live, index, pid, phase, call, session_id)])
                out = await steps.step(self._step_item(live, gen))
                t_book = None if self.timer is None else self.timer.now()
                turns.append(self._settle(tree, live, gen, out))
                if t_book is not None:
                    self.timer.add("bookkeeping", t_book, self.timer.now())
            return turns

        tasks = [asyncio.ensure_future(run(live)) for live in lives]
        try:
            per_live = await asyncio.gather(*tasks)
        except BaseException:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise
        finally:
            await steps.drained()
        if tree is not None:
            for depth in range(max((len(turns) for turns in per_live), default=0)):
                for live, turns in zip(lives, per_live, strict=True):
                    if depth < len(turns):
                        self._add_turn(tree, live, turns[depth])

    def _request(self, live: _Live, index: int, pid: int, phase: Phase, call: int, session_id: str) -> TurnRequest:
        return TurnRequest(key=(index, int(phase), call, live.rollout_id, live.turn), context=live.context,
                           seed=request_seed(self.config_seed, self.collect_seed, pid, int(phase), call,
                                             live.rollout_id, live.turn),
                           session=session_id)

    @staticmethod
    def _step_item(live: _Live, gen: Generation) -> StepItem:
        return StepItem(snapshot=live.snapshot, action=gen.text, n_messages=live.n_messages,
                        release=live.owns_snapshot)

    def _settle(self, tree: RolloutTree | None, live: _Live, gen: Generation, out: StepOutcome) -> _Turn:
        """Move ``live`` past one stepped turn (its context, snapshot and reward); the turn for the tree."""
        done = out.terminated or out.truncated
        if done:
            after = self._finish(live.context, gen) if callable(self._finish) else live.context.append(
                gen.token_ids, generated=True, logprobs=gen.logprobs)
        else:
            after = self.policy.extend(live.context, gen, out.added[1:])
        appended = list(after.token_ids[len(live.context) + len(gen.token_ids):])
        if tree is None:
            self.oracle_generated_tokens += len(gen.token_ids)
            self.oracle_env_steps += 1
        live.reward = out.reward
        if not done:
            live.snapshot, live.context, live.n_messages = out.snapshot, after, out.n_messages
            live.owns_snapshot = tree is None
            live.turn += 1
        return _Turn(gen=gen, out=out, observation_ids=appended, done=done)

    @staticmethod
    def _add_turn(tree: RolloutTree, live: _Live, turn: _Turn) -> None:
        assert live.node is not None
        gen, out = turn.gen, turn.out
        node = tree.add_turn(
            live.node, rollout_id=live.rollout_id, generated_ids=gen.token_ids,
            generated_logprobs=gen.logprobs, observation_ids=turn.observation_ids, messages=out.added,
            snapshot=out.snapshot,
            info={"finish_reason": gen.finish_reason, "terminated": out.terminated, "truncated": out.truncated},
        )
        if turn.done:
            tree.finish(node, out.reward)
        live.node = node

    async def _monte_carlo(self, agent: Agent, session: EnvSession, anchors: Sequence[tuple[Any, TokenContext, int]],
                           *, index: int, pid: int, phase: Phase, call: int, session_id: str) -> NDArray[np.float64]:
        """Success rate of ``oracle_samples`` rollouts from each (snapshot, context, message count) anchor."""
        r = self.oracle_samples
        lives = [_Live(snapshot=s, context=c, n_messages=n, rollout_id=j * r + k)
                 for j, (s, c, n) in enumerate(anchors) for k in range(r)]
        await self._advance(agent, session, None, lives, index=index, pid=pid, phase=phase, call=call,
                            session_id=session_id)
        if not anchors:
            return np.zeros(0)
        rewards = np.asarray([live.reward for live in lives], dtype=np.float64).reshape(len(anchors), r)
        return success_mask(rewards).mean(axis=1)

    # ---------------------------------------------------------------- one prompt
    async def oracle_root(self, agent: Agent, session: EnvSession, prompt: PromptSpec, *, index: int) -> float:
        """Monte-Carlo success rate of ``prompt`` from its root."""
        start = await session.start(prompt)
        try:
            ctx = self.policy.render(start.messages, start.tools)
            values = await self._monte_carlo(agent, session, [(start.snapshot, ctx, len(start.messages))],
                                             index=index, pid=prompt_key(prompt.prompt_id),
                                             phase=Phase.ORACLE_PROMPT, call=0, session_id=prompt.prompt_id)
        finally:
            await session.release([start.snapshot])
        return float(values[0])

    async def grow(self, agent: Agent, session: EnvSession, prompt: PromptSpec, *, index: int, roots: int,
                   strategy: Strategy, budget: Budget, value: float | None = None) -> RolloutTree:
        """One prompt's tree: ``roots`` root rollouts, then its continuations (see the module docstring)."""
        if roots < 1:
            raise CollectionError(f"prompt {prompt.prompt_id!r} needs at least one root rollout, got {roots}")
        pid = prompt_key(prompt.prompt_id)
        start = await session.start(prompt)
        root_ctx = timed(self.timer, "bookkeeping", self.policy.render)(start.messages, start.tools)
        tree = RolloutTree(
            prompt_id=prompt.prompt_id, task_id=prompt.task_id, messages=start.messages, snapshot=start.snapshot,
            value=value, tools=start.tools, ground_truth=ground_truth_of(start.task_data),
            metadata={"env_id": start.env_id, "strategy": strategy.name,
                                   "reset_seed": prompt.reset_seed, "seed": self.collect_seed},
        )
        tree.root.observation_ids = list(root_ctx.token_ids)
        try:
            lives = [_Live(snapshot=start.snapshot, context=root_ctx, n_messages=len(start.messages), node=tree.root,
                           rollout_id=tree.start_rollout()) for _ in range(roots)]
            await self._advance(agent, session, tree, lives, index=index, pid=pid, phase=Phase.ROOTS,
                                session_id=prompt.prompt_id)
            cont_budget = budget.prompt_continuations(roots, branching=strategy.branching)
            if cont_budget > 0:
                await self._expand(agent, session, tree, strategy, budget, cont_budget, index=index, pid=pid)
        finally:
            if self.release_snapshots:
                handles = []
                for node in tree.nodes:
                    if node.snapshot is not None:
                        handles.append(node.snapshot)
                        node.snapshot = None
                await session.release(handles)
        return tree

    def _predict_nodes(self, tree: RolloutTree, nodes: Sequence[Node]) -> NDArray[np.float64]:
        """The predictor's v-hat of ``nodes`` of ``tree`` (kept in ``node.value``), one predictor call at a time."""
        from trace_agent.predictor import score_nodes

        if self.predictor is None:
            raise CollectionError("this strategy reads predicted values but the collector has no predictor")
        with self.predict_lock:
            return np.asarray(score_nodes(self.predictor, tree, list(nodes)), dtype=np.float64)

    async def _expand(self, agent: Agent, session: EnvSession, tree: RolloutTree, strategy: Strategy, budget: Budget,
                      cont_budget: int, *, index: int, pid: int) -> None:
        candidates = tuple(n for n in tree.nodes if not n.is_root and not n.is_leaf and n.snapshot is not None)
        n_prompt = len(tree.root.messages)
        reads = reads_of(strategy)
        values: dict[ValueKind, dict[int, float]] = {}
        anchors_of = {kind: reads.expansion(kind, tree, candidates) for kind in VALUE_KINDS}  # before any scoring
        for kind, nodes in anchors_of.items():
            if not nodes:
                continue
            if kind == "predicted":
                scores = await in_thread(self._predict_nodes, tree, nodes)
            else:
                anchors = [(n.snapshot, node_context(tree, n), n_prompt + len(n.history())) for n in nodes]
                scores = await self._monte_carlo(agent, session, anchors, index=index, pid=pid,
                                                 phase=Phase.ORACLE_NODES, call=0, session_id=tree.prompt_id)
                for n, v in zip(nodes, scores, strict=True):
                    n.info["oracle_value"] = float(v)
            values[kind] = {n.node_id: float(v) for n, v in zip(nodes, scores, strict=True)}
        request = ExpansionRequest(
            tree=tree, budget=cont_budget, candidates=candidates, root_exchange=budget.root_exchange,
            prefix_cap=budget.prefix_cap, values=values,
            rng=np.random.default_rng(request_seed(self.config_seed, self.collect_seed, pid, 4)),
        )
        allocation = await in_thread(timed(self.timer, "allocation", strategy.allocate_continuations), request)
        lives = []
        for node, k in check_continuations(allocation, request):
            ctx = node_context(tree, node)
            n_messages = n_prompt + len(node.history())
            for _ in range(k):
                lives.append(_Live(snapshot=node.snapshot, context=ctx, n_messages=n_messages, node=node,
                                   rollout_id=tree.start_rollout(node), turn=node.depth))
        await self._advance(agent, session, tree, lives, index=index, pid=pid, phase=Phase.CONTINUATIONS,
                            session_id=tree.prompt_id)


# --------------------------------------------------------------------------------------------------
# many prompts, bounded


async def run_prompts(engine: GenerationEngine, host: EnvHost, count_: int,
                      work: Callable[[int, Agent, EnvSession], Awaitable[T]], *, limit: int,
                      retries: int = 0) -> list[T]:
    """``work(i, agent, session)`` for i in 0..count_-1, at most ``limit`` alive at once, results in order.

    Prompts start in index order; when one ends, the next one is registered with the engine
    *before* the finished one unregisters (atomic hand-off). A prompt whose env fails
    (:class:`EnvWorkerError`) is run again from scratch on a fresh session, at most
    ``retries`` times; its request seeds are the same, so a retried tree is the tree it
    would have been. Any other error cancels the rest and propagates.
    """
    results: list[Any] = [None] * count_
    if count_ == 0:
        return []
    loop = asyncio.get_running_loop()
    order = iter(range(count_))
    tasks: set[asyncio.Task[None]] = set()
    errors: list[BaseException] = []
    finished = asyncio.Event()

    async def one(i: int, agent: Agent) -> None:
        ok = False
        try:
            for attempt in range(retries + 1):
                session = await host.open()
                try:
                    results[i] = await work(i, agent, session)
                except EnvWorkerError:
                    await session.close(broken=True)
                    if attempt == retries:
                        raise
                    continue
                except BaseException:
                    await session.close(broken=True)
                    raise
                await session.close()
                ok = True
                break
        finally:
            nxt = next(order, None) if ok and not errors else None
            if nxt is not None:
                launch(nxt)  # the successor is registered before this agent leaves: atomic hand-off
            agent.close()

    def settled(task: asyncio.Task[None]) -> None:
        tasks.discard(task)
        if not task.cancelled() and task.exception() is not None and not errors:
            errors.append(task.exception())  # type: ignore[arg-type]
            for other in list(tasks):
                other.cancel()
        if not tasks:
            finished.set()

    def launch(i: int) -> None:
        agent = engine.register()
        task = loop.create_task(one(i, agent))
        tasks.add(task)
        task.add_done_callback(settled)

    for _ in range(min(limit, count_)):
        launch(next(order))
    try:
        await finished.wait()
    except asyncio.CancelledError:
        for task in list(tasks):
            task.cancel()
        raise
    if errors:
        raise errors[0]
    return results
