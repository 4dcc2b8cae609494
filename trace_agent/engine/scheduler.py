"""The shared generation engine: one batching scheduler over every prompt's live rollouts.

Every prompt's tree grows as its own asyncio task (:mod:`trace_agent.engine.growth`). A
task that needs its rollouts' next turns submits them here as :class:`TurnRequest` values
and awaits the results; the scheduler gathers the pending requests of *all* tasks into one
``policy.generate(contexts, sampling, seeds=[...], sessions=[...])`` call (``sampling``: the
engine's one :class:`~trace_agent.policy.base.SamplingConfig`), run on ONE dedicated engine
thread (so a synchronous backend such as ``vllm.LLM`` is only ever called from one thread).
Batch size never depends on a group size: it is bounded by ``max_batch_size`` only.

Two batching modes (docs/engine.md, "Reproducibility"):

``deterministic`` (the default; tests and the demo)
    A barrier. A *round* fires when the engine is idle and every registered task is waiting
    on generation; its requests are sorted by their canonical ``key`` and cut into chunks of
    ``max_batch_size``, run one after another (each chunk's results are handed back as soon as
    it finishes, so env steps overlap with the next chunk). The next round waits for the
    whole round to end. Batch composition is then a function of the algorithm alone, never
    of timing, so runs are bit-identical on the same backend and device. A task that ends
    hands its slot to the next one (:meth:`GenerationEngine.register` before
    :meth:`Agent.close`, with no ``await`` between) so a round never fires in the gap.

``dynamic``
    Continuous batching: whenever the engine is idle it takes up to ``max_batch_size`` pending
    requests as soon as that many are waiting, every task is waiting, or the oldest request
    has waited ``max_wait_s``. Per-request seeds keep each request's sampling stream its own,
    but batch composition depends on timing, so trees are only statistically equivalent
    across runs (floating-point results of a batched forward pass depend on its neighbours).

A policy that implements :class:`~trace_agent.policy.base.AsyncPolicy` batches continuously
by itself (vLLM's async engine, ``vllm serve`` servers): the engine then awaits
``policy.agenerate(contexts, sampling, seeds=[...], sessions=[...])`` per request group and does
no batching of its own.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import time
from collections.abc import Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field, replace
from typing import Any

from trace_agent.engine.phases import PhaseTimer
from trace_agent.options import BATCHING, Batching, either
from trace_agent.policy.base import AsyncPolicy, Generation, Policy, SamplingConfig, TokenContext

__all__ = ["Batching", "EngineConfig", "EngineStats", "TurnRequest", "Agent", "GenerationEngine"]



@dataclass(frozen=True, kw_only=True)
class EngineConfig:
    """How the shared engine samples and batches.

    Attributes:
        sampling: how every turn is sampled, handed to the backend as is with the requests' own
            seeds; its ``seed`` must be None (each request carries its seed).
        max_batch_size: most requests in one ``policy.generate`` call.
        max_wait_s: dynamic mode: the longest a pending request waits for a fuller batch.
        batching: ``deterministic`` (barrier rounds; bit-identical) or ``dynamic`` (continuous).
    """

    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    max_batch_size: int = 64
    max_wait_s: float = 0.05
    batching: Batching = "deterministic"

    def __post_init__(self) -> None:
        if not isinstance(self.sampling, SamplingConfig):
            raise TypeError(f"sampling must be a SamplingConfig, got {type(self.sampling).__name__}")
        if self.sampling.seed is not None:
            raise ValueError(f"sampling.seed must be None (every request carries its own seed), "
                             f"got {self.sampling.seed}")
        if self.max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {self.max_batch_size}")
        if not (math.isfinite(self.max_wait_s) and self.max_wait_s >= 0):
            raise ValueError(f"max_wait_s must be a finite number >= 0, got {self.max_wait_s}")
        if self.batching not in BATCHING:
            raise ValueError(f"batching must be {either(BATCHING)}, got {self.batching!r}")


@dataclass(frozen=True, slots=True)
class TurnRequest:
    """One rollout's next turn.

    Attributes:
        key: canonical sort key (prompt index, phase, call, rollout id, turn): unique in a collection.
        context: the exact token context to continue.
        seed: the request's own sampling seed (:func:`~trace_agent.engine.base.request_seed`).
        session: routing hint, the prompt id (every turn and branch of a tree shares it).
    """

    key: tuple[int, ...]
    context: TokenContext
    seed: int
    session: str


@dataclass
class EngineStats:
    """What the engine did: calls, their sizes, tokens, time inside the backend."""

    calls: int = 0
    sequences: int = 0
    generated_tokens: int = 0
    generate_seconds: float = 0.0
    batch_sizes: list[int] = field(default_factory=list)

    @property
    def mean_batch(self) -> float:
        """Mean sequences per engine call (NaN before the first call)."""
        return self.sequences / self.calls if self.calls else math.nan

    def add(self, other: EngineStats) -> None:
        self.calls += other.calls
        self.sequences += other.sequences
        self.generated_tokens += other.generated_tokens
        self.generate_seconds += other.generate_seconds
        self.batch_sizes.extend(other.batch_sizes)

    def as_dict(self) -> dict[str, float]:
        """Counts only: the time inside the backend is reported once, as the trainer's ``time/generation_s``."""
        return {"engine_calls": float(self.calls), "engine_sequences": float(self.sequences),
                "engine_mean_batch": self.mean_batch, "engine_generated_tokens": float(self.generated_tokens)}


@dataclass(eq=False)
class _Item:
    agent: Agent
    request: TurnRequest
    future: asyncio.Future[Generation]
    arrived: float


class Agent:
    """One registered unit of work (one prompt's task); it submits turn requests and awaits them."""

    def __init__(self, engine: GenerationEngine, ident: int) -> None:
        self.engine = engine
        self.ident = ident
        self.outstanding = 0
        self.closed = False

    async def generate(self, requests: Sequence[TurnRequest]) -> list[Generation]:
        """The next turn of every request, in order (the task waits until its batch has run)."""
        return await self.engine._submit(self, list(requests))

    def close(self) -> None:
        """Unregister (idempotent); pending requests of this agent are dropped."""
        if not self.closed:
            self.closed = True
            self.engine._unregister(self)


class GenerationEngine:
    """The scheduler (see the module docstring). Create it inside the event loop that uses it.

    Args:
        policy: the backend; ``generate`` is only ever called on ``executor``'s thread.
        config: sampling and batching settings.
        executor: a single-thread executor, the engine thread (the caller owns it).
        timer: records each backend call as a ``generation`` interval (None: no timing).
    """

    def __init__(self, policy: Policy, config: EngineConfig, *, executor: Executor,
                 timer: PhaseTimer | None = None) -> None:
        self.policy = policy
        self.timer = timer
        self.config = config
        self.executor = executor
        self.stats = EngineStats()
        self._loop = asyncio.get_running_loop()
        self._agents: dict[int, Agent] = {}
        self._pending: list[_Item] = []
        self._busy = False
        self._timer: asyncio.TimerHandle | None = None
        self._next_id = 0
        self._async = isinstance(policy, AsyncPolicy)
        self._takes_seeds = self._accepts(policy, "seeds")
        self._takes_sessions = self._accepts(policy, "sessions")
        self._dispatches: set[asyncio.Task[None]] = set()

    @staticmethod
    def _accepts(policy: Any, name: str) -> bool:
        try:
            params = inspect.signature(policy.generate).parameters
        except (TypeError, ValueError):  # pragma: no cover - builtins without a signature
            return False
        return name in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())

    # ---------------------------------------------------------------- agents
    def register(self) -> Agent:
        """A new agent; call it before closing the agent it replaces (atomic hand-off)."""
        agent = Agent(self, self._next_id)
        self._next_id += 1
        self._agents[agent.ident] = agent
        return agent

    def _unregister(self, agent: Agent) -> None:
        self._agents.pop(agent.ident, None)
        keep = []
        for item in self._pending:
            if item.agent is agent:
                item.future.cancel()
            else:
                keep.append(item)
        self._pending = keep
        self._maybe_fire()

    @property
    def streams(self) -> bool:
        """Whether the backend batches by itself (an AsyncPolicy): then no request waits for a round."""
        return self._async

    # ---------------------------------------------------------------- submission
    async def _submit(self, agent: Agent, requests: list[TurnRequest]) -> list[Generation]:
        if agent.closed:
            raise RuntimeError("a closed agent cannot generate")
        if not requests:
            return []
        if self._async:
            return await self._agenerate(requests)
        now = time.monotonic()
        items = [_Item(agent, r, self._loop.create_future(), now) for r in requests]
        agent.outstanding += len(items)
        self._pending.extend(items)
        self._maybe_fire()
        return list(await asyncio.gather(*(i.future for i in items)))

    async def _agenerate(self, requests: list[TurnRequest]) -> list[Generation]:
        cfg = self.config
        t, mono = time.perf_counter(), time.monotonic()
        gens = await self.policy.agenerate(  # type: ignore[attr-defined]
            [r.context for r in requests], cfg.sampling, seeds=[r.seed for r in requests],
            sessions=[r.session for r in requests])
        self._record(len(requests), gens, time.perf_counter() - t)
        if self.timer is not None:
            self.timer.add("generation", mono, time.monotonic())
        return list(gens)

    def _record(self, n: int, gens: Sequence[Generation], seconds: float) -> None:
        self.stats.calls += 1
        self.stats.sequences += n
        self.stats.generated_tokens += sum(len(g.token_ids) for g in gens)
        self.stats.generate_seconds += seconds
        self.stats.batch_sizes.append(n)

    # ---------------------------------------------------------------- firing
    def _all_waiting(self) -> bool:
        return all(a.outstanding > 0 for a in self._agents.values())

    def _maybe_fire(self) -> None:
        if self._busy or not self._pending:
            return
        cfg = self.config
        if cfg.batching == "deterministic":
            if not self._all_waiting():
                return
            batch = sorted(self._pending, key=lambda i: i.request.key)
            self._pending = []
            chunks = [batch[i:i + cfg.max_batch_size] for i in range(0, len(batch), cfg.max_batch_size)]
        else:
            oldest = min(i.arrived for i in self._pending)
            age = time.monotonic() - oldest
            if len(self._pending) < cfg.max_batch_size and not self._all_waiting() and age < cfg.max_wait_s:
                if self._timer is None:
                    self._timer = self._loop.call_later(cfg.max_wait_s - age, self._on_timer)
                return
            chunk = sorted(self._pending[:cfg.max_batch_size], key=lambda i: i.request.key)
            self._pending = self._pending[cfg.max_batch_size:]
            chunks = [chunk]
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._busy = True
        task = self._loop.create_task(self._dispatch(chunks))
        self._dispatches.add(task)
        task.add_done_callback(self._dispatches.discard)

    def _on_timer(self) -> None:
        self._timer = None
        self._maybe_fire()

    async def _dispatch(self, chunks: list[list[_Item]]) -> None:
        try:
            for k, chunk in enumerate(chunks):
                live = [i for i in chunk if not i.future.done()]
                for item in chunk:
                    if item.future.done():  # its task was cancelled while it waited
                        self._deliver(item, RuntimeError("cancelled"))
                if not live:
                    continue
                try:
                    gens, seconds = await self._loop.run_in_executor(self.executor, self._generate, live)
                except BaseException as exc:  # the backend failed: every waiting request of this round fails
                    for rest in chunks[k:]:
                        for item in rest:
                            self._deliver(item, exc)
                    if not isinstance(exc, Exception):
                        raise
                    return
                self._record(len(live), gens, seconds)
                for item, gen in zip(live, gens, strict=True):
                    self._deliver(item, gen)
        finally:
            self._busy = False
            self._maybe_fire()

    def _deliver(self, item: _Item, value: Generation | BaseException) -> None:
        if not item.future.done():
            if isinstance(value, BaseException):
                item.future.set_exception(value)
            else:
                item.future.set_result(value)
        item.agent.outstanding = max(0, item.agent.outstanding - 1)

    def _generate(self, items: list[_Item]) -> tuple[list[Generation], float]:
        """Runs on the engine thread: one backend call for ``items``."""
        sampling = self.config.sampling
        kwargs: dict[str, Any] = {}
        seeds = [i.request.seed for i in items]
        if self._takes_seeds:
            kwargs["seeds"] = seeds
        else:  # a legacy backend: one seed for the call (its turns then depend on the batch)
            from trace_agent.engine.base import request_seed

            sampling = replace(sampling, seed=request_seed(*seeds))
        if self._takes_sessions:
            kwargs["sessions"] = [i.request.session for i in items]
        t, mono = time.perf_counter(), time.monotonic()
        gens = self.policy.generate([i.request.context for i in items], sampling, **kwargs)
        seconds = time.perf_counter() - t
        if self.timer is not None:
            self.timer.add("generation", mono, time.monotonic())
        if len(gens) != len(items):
            raise RuntimeError(f"the policy returned {len(gens)} generations for {len(items)} contexts")
        return list(gens), seconds
