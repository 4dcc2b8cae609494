"""Steps 1-3 of a training step: the trainer's view of the rollout collector.

The seam between the trainer and collection is one typed Protocol, :class:`CollectorProtocol`:
``collect(prompt_ids, *, step, seed) -> CollectedBatch``, the ``strategy`` it samples with,
and ``close()``. :class:`StrategyCollector` is the default implementation: a
:class:`~trace_agent.rollout.TreeCollector` on the shared asynchronous engine with the run's
strategy, (M, N) budget and rollout backend (local threads or Ray actors), reporting how
the collection's wall time split between generation, the predictor and the envs. Its envs count
tool-backend failures (:mod:`trace_agent.backend_watch`): ``config.max_backend_failures`` in a row
end the collection with a :class:`~trace_agent.backend_watch.BackendFailureError` naming the backend.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from trace_agent.env_factory import make_env_factory

if TYPE_CHECKING:  # pragma: no cover
    from trace_agent.budget import Budget
    from trace_agent.config import TrainConfig
    from trace_agent.rollout import Collection, RolloutConfig
    from trace_agent.strategies import Strategy
    from trace_agent.tree import RolloutTree

__all__ = ["CollectedBatch", "CollectorProtocol", "StrategyCollector", "default_collector", "rollout_config"]


@dataclass(frozen=True, kw_only=True)
class CollectedBatch:
    """What the trainer needs from one collection: the trees, who was skipped, the time split.

    ``timings`` partition the collection's wall clock (``wall``) with the collector's phase
    timer (:mod:`trace_agent.engine.phases`, its ``exposed`` view): ``generation`` (seconds
    inside the backend's ``generate``, on the engine thread), ``predictor`` (seconds when a
    predictor call ran and neither generation nor an env call did: what the collection waited
    for the predictor), ``env`` (the rest: env calls not hidden behind generation, bookkeeping).
    ``predictor_busy`` is the time inside the predictor's calls, on their own thread, whether
    or not generation and env calls ran beside them.
    ``engine``: the engine's counters (calls, sequences, mean batch, tokens).
    """

    trees: tuple[RolloutTree, ...]
    skipped: tuple[str, ...]
    timings: dict[str, float]
    engine: dict[str, float] = field(default_factory=dict)
    collection: Collection | None = None


@runtime_checkable
class CollectorProtocol(Protocol):
    """What the trainer needs from a rollout collector (steps 1-3 of a step)."""

    strategy: Strategy

    def collect(self, prompt_ids: Sequence[str], *, step: int, seed: int) -> CollectedBatch: ...

    def close(self) -> None: ...


def rollout_config(config: TrainConfig) -> RolloutConfig:
    """The :class:`~trace_agent.rollout.RolloutConfig` of a run: its ``rollout.engine`` section, the sampling
    parameters and the seed."""
    from trace_agent.rollout import RolloutConfig

    return RolloutConfig.of(config.rollout.engine, sampling=config.sampling.params, seed=config.seed)


class StrategyCollector:
    """Steps 1-3: a :class:`~trace_agent.rollout.TreeCollector` with the run's strategy and (M, N) budget.

    Args:
        config: the run.
        generator: the generation policy.
        predictor: the success predictor.
    """

    def __init__(self, config: TrainConfig, *, generator: Any, predictor: Any) -> None:
        from trace_agent.engine.phases import PhaseTimer
        from trace_agent.rollout import TreeCollector
        from trace_agent.wiring import resolve_strategy

        r, s = config.rollout, config.sampling
        self.strategy: Strategy = resolve_strategy(r.strategy)
        self.budget = r.budget
        from trace_agent.backend_watch import watch_backend

        make_env = make_env_factory(config.env_id, config.train_split, max_turns=s.max_turns,
                                    env_kwargs=config.env_kwargs)
        self.collector = TreeCollector(
            make_env=watch_backend(make_env, config.max_backend_failures),
            policy=generator, predictor=predictor, config=rollout_config(config),
        )
        self.collector.phase_timer = PhaseTimer()  # the time split below (a lock and a list append per call)

    def collect(self, prompt_ids: Sequence[str], *, step: int, seed: int, strategy: Strategy | None = None,
                budget: Budget | None = None) -> CollectedBatch:
        """One batch over ``prompt_ids`` (episode reset seed ``seed % 2**31``, request seeds from ``seed``).

        ``strategy`` and ``budget`` replace the run's for this batch only (the predictor's warm-up,
        :mod:`trace_agent.warm_start`, collects GRPO groups without continuations this way).
        """
        from trace_agent.rollout import PromptSpec

        prompts = [PromptSpec(task_id=t, reset_seed=seed % 2**31) for t in prompt_ids]
        batch = self.collector.collect(prompts, strategy or self.strategy, budget or self.budget, seed=seed)
        gen, busy = batch.engine.generate_seconds, batch.predictor_seconds
        pred = busy if batch.phases is None else min(batch.phases.exposed["predictor"], busy)  # two clocks
        timings = {"generation": gen, "predictor": pred, "env": max(batch.wall_seconds - gen - pred, 0.0),
                   "predictor_busy": busy, "wall": batch.wall_seconds}
        return CollectedBatch(trees=batch.trees, skipped=batch.skipped, timings=timings,
                              engine=batch.engine.as_dict(), collection=batch)

    def close(self) -> None:
        self.collector.close()


def default_collector(config: TrainConfig, *, generator: Any, predictor: Any) -> StrategyCollector:
    """The collector a :class:`~trace_agent.trainer.Trainer` uses unless told otherwise."""
    return StrategyCollector(config, generator=generator, predictor=predictor)
