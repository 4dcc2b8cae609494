"""The predictor's warm-up before step 1 (``predictor.warm_start_tasks``, ``predictor.warm_start_roots``).

TRACE's predictor starts cold: at step 1 it knows nothing of the prompts. A warm-up fits it on the
*starting* policy's rollouts of train tasks first, paid for out of the run's budget:

- **tasks**: W = ``warm_start_tasks`` of the run's train pool (the train split's ids in their order, or
  its first ``train_tasks``), ``numpy.random.default_rng(10_000 + seed).choice(pool size, W,
  replace=False)`` (:func:`warm_start_draw`); never a held-out task;
- **trees**: one collection through the run's own collector (same engine, envs and sampling) with
  GRPO's allocation at the :class:`~trace_agent.budget.Budget` ``roots = W * G, continuations_per_root = 0,
  group_size = G`` (G = ``warm_start_roots``): every task gets G root rollouts, no continuations
  (:func:`warm_start_budget`). Episode seeds are drawn as a training step's collection draws them (one
  ``integers(2**31)`` draw: the episodes' reset seed and the request seeds), from the same generator, after
  the task draw;
- **fit**: :func:`~trace_agent.predictor.refresh_predictor` on those trees with the run's ``prefixes``
  and ``prefix_share``, exactly as step 4 of a training step (with ``seed = 0``, step 0's);
- **nothing else moves**: the policy and its optimiser are not updated, and the run's prompt pool and
  its own generator (step 1's seeds, the update's shuffles) are untouched, so step 1 draws the same
  prompts and seeds as a cold run of the same seed; only the predictor differs.

Its cost (W * G paper units, the generated tokens and env steps) starts the run's budget totals; the
figures go into step 0 of the run's metrics (``warm_start/*`` and the refresh's ``predictor/*``).
:meth:`~trace_agent.trainer.Trainer.warm_start` runs it once per run (a checkpoint records it, so a
resumed run never repeats it); ``trace-gym train`` calls it before step 1.
"""

from __future__ import annotations

import inspect
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from trace_agent.budget import PAPER_CONTINUATION_COST, Budget
from trace_agent.errors import ConfigError

if TYPE_CHECKING:  # pragma: no cover
    from trace_agent.config import TrainConfig
    from trace_agent.tree import RolloutTree

__all__ = ["TOTALS", "WARM_START_SEED", "WarmStart", "check_warm_start", "warm_start_budget", "warm_start_draw",
           "warm_up_predictor"]

#: The task draw's generator is ``numpy.random.default_rng(WARM_START_SEED + seed)``.
WARM_START_SEED = 10_000

#: The budget figures a warm-up adds to the run's totals (``budget/total_<name>``).
TOTALS = ("paper_units", "generated_tokens", "env_steps")


@dataclass(frozen=True, kw_only=True)
class WarmStart:
    """A finished warm-up: the tasks it played, its trees (snapshots released) and its step-0 metrics.

    ``metrics``: ``warm_start/tasks``, ``warm_start/roots``, ``warm_start/paper_units``,
    ``warm_start/generated_tokens``, ``warm_start/env_steps``, ``warm_start/success_rate``,
    ``warm_start/effective_ratio``, ``warm_start/seconds`` (collection and fit),
    ``warm_start/refresh_seconds`` and the refresh's ``predictor/*`` (``pre_*``: before the fit).
    """

    task_ids: tuple[str, ...]
    trees: tuple[RolloutTree, ...]
    metrics: dict[str, float]


def check_warm_start(tasks: int, pool_size: int) -> None:
    """Refuse a warm-up of more tasks than the run's train pool holds (:class:`ConfigError`)."""
    if tasks > pool_size:
        raise ConfigError(f"predictor.warm_start_tasks is {tasks}, the run's train pool holds {pool_size} tasks: "
                          f"set it to {pool_size} or fewer (or 0: no warm-up)")


def warm_start_draw(pool_ids: Sequence[str], tasks: int, seed: int) -> tuple[tuple[str, ...], int]:
    """The warm-up's tasks and its collection seed for a run of ``seed``.

    Tasks: ``default_rng(10_000 + seed).choice(len(pool_ids), tasks, replace=False)`` over ``pool_ids`` in
    their order (the draw's order is kept); then one ``integers(2**31)`` draw from the same generator, the
    collection seed (as a training step draws its own from the run's generator).
    """
    check_warm_start(tasks, len(pool_ids))
    rng = np.random.default_rng(WARM_START_SEED + seed)
    chosen = rng.choice(len(pool_ids), tasks, replace=False)
    return tuple(pool_ids[int(i)] for i in chosen), int(rng.integers(2**31))


def warm_start_budget(tasks: int, roots: int, *, continuation_cost: float = PAPER_CONTINUATION_COST) -> Budget:
    """GRPO groups of ``roots`` on each of ``tasks`` prompts, no continuations: ``tasks * roots`` paper units."""
    return Budget(roots=tasks * roots, continuations_per_root=0, group_size=roots,
                  continuation_cost=continuation_cost)


def _check_collector(collector: Any) -> None:
    params = inspect.signature(collector.collect).parameters
    if not {"strategy", "budget"} <= set(params):
        raise ConfigError(f"the run's collector ({type(collector).__name__}) cannot collect the predictor's "
                          "warm-up: its collect() takes no strategy= and budget= (as StrategyCollector's does); "
                          "set predictor.warm_start_tasks=0")


def warm_up_predictor(config: TrainConfig, *, collector: Any, predictor: Any,
                      pool_ids: Sequence[str]) -> WarmStart:
    """Play the warm-up tasks with ``collector`` and fit ``predictor`` on the trees (see the module docstring).

    ``pool_ids``: the run's train pool (:attr:`~trace_agent.pool.PromptPool.prompt_ids`). Touches neither the
    policy nor the run's pool or generator. Raises :class:`ConfigError` for a warm-up the pool or the collector
    cannot give.
    """
    from trace_agent.predictor import refresh_predictor
    from trace_agent.strategies import GRPO
    from trace_agent.tree_stats import batch_stats

    s = config.predictor
    ids, seed = warm_start_draw(pool_ids, s.warm_start_tasks, config.seed)
    budget = warm_start_budget(s.warm_start_tasks, s.warm_start_roots,
                               continuation_cost=config.rollout.budget.continuation_cost)
    _check_collector(collector)
    t0 = time.perf_counter()
    batch = collector.collect(ids, step=0, seed=seed, strategy=GRPO(), budget=budget)
    trees = tuple(batch.trees)
    t_collect = time.perf_counter()
    pred = refresh_predictor(predictor, trees, prefixes=s.prefixes, prefix_share=s.prefix_share, seed=0)
    t_fit = time.perf_counter()
    for tree in trees:
        tree.release_snapshots()
    stats = batch_stats(trees, continuation_cost=config.rollout.budget.continuation_cost)
    metrics: dict[str, float] = {
        "warm_start/tasks": float(len(ids)), "warm_start/roots": float(s.warm_start_roots),
        "warm_start/paper_units": float(stats.paper_units),
        "warm_start/generated_tokens": float(stats.generated_tokens),
        "warm_start/env_steps": float(stats.env_steps),
        "warm_start/success_rate": stats.successes / stats.leaves if stats.leaves else math.nan,
        "warm_start/effective_ratio": stats.effective_ratio,
        "warm_start/seconds": t_fit - t0, "warm_start/refresh_seconds": t_fit - t_collect,
        **{f"predictor/{k}": v for k, v in pred.items()},
    }
    return WarmStart(task_ids=ids, trees=trees, metrics=metrics)
