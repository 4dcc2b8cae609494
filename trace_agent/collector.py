"""Steps 1-3 of a training step: the trainer's view of the rollout collector.

:class:`StrategyCollector` wraps a :class:`~trace_agent.rollout.TreeCollector` with the
run's strategy and (M, N) budget and reports how the collection's wall time split between
generation, the predictor and the envs (:class:`CollectedBatch`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from trace_agent.wiring import make_env_factory

if TYPE_CHECKING:  # pragma: no cover
    from trace_agent.trainer import Trainer
    from trace_agent.tree import RolloutTree

__all__ = ["CollectedBatch", "StrategyCollector", "default_collector"]


@dataclass(frozen=True, kw_only=True)
class CollectedBatch:
    """What the trainer needs from one collection: the trees, who was skipped, the time split.

    ``timings``: ``generation`` (seconds inside ``policy.generate``, summed over worker threads),
    ``predictor`` (inside ``predictor.predict``), ``env`` (the rest of the collection's wall
    time: env steps, snapshots, restores, bookkeeping), ``wall``.
    """

    trees: tuple[RolloutTree, ...]
    skipped: tuple[str, ...]
    timings: dict[str, float]
    collection: Any = None


class _Timer:
    def __init__(self) -> None:
        import threading

        self.seconds = 0.0
        self._lock = threading.Lock()

    def add(self, dt: float) -> None:
        with self._lock:
            self.seconds += dt


class _TimedPolicy:
    """Delegates to a policy, adding the time spent in ``generate`` to a timer."""

    def __init__(self, policy: Any, timer: _Timer) -> None:
        self._policy = policy
        self._timer = timer

    def generate(self, *args: Any, **kwargs: Any) -> Any:
        t = time.perf_counter()
        try:
            return self._policy.generate(*args, **kwargs)
        finally:
            self._timer.add(time.perf_counter() - t)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._policy, name)


class _TimedPredictor:
    """Delegates to a predictor, adding the time spent in ``predict`` to a timer."""

    def __init__(self, predictor: Any, timer: _Timer) -> None:
        self._predictor = predictor
        self._timer = timer

    def predict(self, contexts: Sequence[str]) -> Any:
        t = time.perf_counter()
        try:
            return self._predictor.predict(contexts)
        finally:
            self._timer.add(time.perf_counter() - t)

    def update(self, *args: Any, **kwargs: Any) -> Any:
        return self._predictor.update(*args, **kwargs)


class StrategyCollector:
    """Steps 1-3: a :class:`~trace_agent.rollout.TreeCollector` with the run's strategy and (M, N) budget."""

    def __init__(self, trainer: Trainer) -> None:
        from trace_agent.rollout import RolloutConfig, TreeCollector
        from trace_agent.strategies import Budget
        from trace_agent.wiring import resolve_strategy

        cfg = trainer.config
        r, s = cfg.rollout, cfg.sampling
        self.strategy = resolve_strategy(r.strategy)
        self.budget = Budget(roots=r.roots, continuations_per_root=r.continuations_per_root, group_size=r.group_size,
                             continuation_cost=r.continuation_cost, root_cap=r.root_cap, prefix_cap=r.prefix_cap)
        self._gen = _Timer()
        self._pred = _Timer()
        self.collector = TreeCollector(
            make_env=make_env_factory(cfg.env_id, cfg.train_split, max_turns=s.max_turns, env_kwargs=cfg.env_kwargs),
            policy=_TimedPolicy(trainer.engine, self._gen),
            predictor=_TimedPredictor(trainer.predictor, self._pred),
            config=RolloutConfig(max_new_tokens=s.max_new_tokens, temperature=s.temperature, top_p=s.top_p,
                                 seed=cfg.seed, workers=r.workers),
        )

    def collect(self, prompt_ids: Sequence[str], *, step: int, seed: int) -> CollectedBatch:
        from trace_agent.rollout import PromptSpec

        g0, p0 = self._gen.seconds, self._pred.seconds
        prompts = [PromptSpec(task_id=t, reset_seed=seed % 2**31) for t in prompt_ids]
        batch = self.collector.collect(prompts, self.strategy, self.budget, seed=seed)
        gen, pred = self._gen.seconds - g0, self._pred.seconds - p0
        timings = {"generation": gen, "predictor": pred, "env": max(batch.wall_seconds - gen - pred, 0.0),
                   "wall": batch.wall_seconds}
        return CollectedBatch(trees=batch.trees, skipped=batch.skipped, timings=timings, collection=batch)

    def close(self) -> None:
        self.collector.close()


def default_collector(trainer: Trainer) -> StrategyCollector:
    """The collector a :class:`Trainer` uses unless told otherwise."""
    return StrategyCollector(trainer)
