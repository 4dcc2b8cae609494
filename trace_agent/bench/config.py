"""The bench's configuration: :class:`BenchConfig`, one benchmark run, and where its defaults depart from the
training config tree's (:data:`BENCH_OVERRIDES`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from trace_agent.config import PredictorSettings, RolloutSettings, SamplingSettings, TrainConfig
from trace_agent.policy.base import SamplingConfig
from trace_agent.rollout import RolloutConfig
from trace_agent.strategies import Budget

__all__ = ["BENCH_OVERRIDES", "BENCH_PREDICTORS", "DEFAULT_STRATEGIES", "BenchConfig"]

DEFAULT_STRATEGIES: tuple[str, ...] = ("grpo", "pcl", "treepo", "trace", "trace-root", "trace-prefix", "oracle")


#: Where the bench departs from the training config's defaults (config key -> value), on purpose; every other
#: knob it shares with ``trace-gym train`` takes the config tree's default (:mod:`trace_agent.config`):
#:
#: - ``rollout.roots`` 32 and ``rollout.continuations_per_root`` 2: a bench batch of (M, N) = (32, 2), the
#:   paper's N at eight groups of four: the batch the README's and docs/guides/benchmark.md's commands measure.
#: - ``sampling.max_new_tokens`` 160: the turn length of the demo configs (``docs/configs/demo.yaml``) that
#:   trained the bench's default policy, the shipped demo one.
BENCH_OVERRIDES: dict[str, Any] = {"rollout.roots": 32, "rollout.continuations_per_root": 2,
                                   "sampling.max_new_tokens": 160}

#: Predictor kinds the bench builds itself (the LM critic needs a checkpoint: pass it as ``predictor``).
BENCH_PREDICTORS = ("embedding", "hashed", "policy-states")


@dataclass(frozen=True, kw_only=True)
class BenchConfig:
    """One benchmark run.

    Attributes:
        env_id: the registered env.
        env_kwargs: extra ``gym.make`` arguments (e.g. ``{"tasks": "test"}`` for PythonMath-v0).
        max_turns: the env's turn limit.
        strategies: strategy names or ``module:attribute`` specs, in table order.
        seeds: number of seeds (0 .. seeds-1): one candidate pool and one batch per strategy each.
        prompts: candidate pool size per batch (>= ``budget.max_active``).
        budget: the batch budget (same for every strategy).
        warmup_prompts: tasks the predictor is warmed up on (disjoint from the measured ones), in
            batches of ``budget.max_active`` prompts collected TreePO-style with ``budget``; the
            predictor is refreshed on each batch's trees as it returns (as in training).
        prefix_share: the most share of prefix examples in each warm-up refresh, as the trainer's
            ``predictor.prefix_share`` (default the same, the paper's 0.06); None: every prefix.
        rollout: the collector's settings (``sampling``, workers, oracle_samples...).
        predictor: the success predictor's kind when :func:`run_bench` builds it
            (:func:`~trace_agent.wiring.build_predictor`): ``embedding`` (MiniLM + logistic head),
            ``hashed`` or ``policy-states`` (the same head on a frozen copy of the benched policy's
            hidden states).
        command: the command line, recorded in the outputs.

    The knobs a training run shares take the config tree's defaults (``env_id``, ``max_turns``, the
    budget's group size and cost, the sampling and collector settings, ``predictor``), except the ones
    :data:`BENCH_OVERRIDES` names.
    """

    env_id: str = TrainConfig.env_id
    env_kwargs: Mapping[str, Any] = field(default_factory=dict)
    max_turns: int = SamplingSettings.max_turns
    strategies: tuple[str, ...] = DEFAULT_STRATEGIES
    seeds: int = 5
    prompts: int = 16
    budget: Budget = field(default_factory=lambda: Budget(
        roots=BENCH_OVERRIDES["rollout.roots"], continuations_per_root=BENCH_OVERRIDES["rollout.continuations_per_root"],
        group_size=RolloutSettings.group_size, continuation_cost=RolloutSettings.continuation_cost))
    warmup_prompts: int = 48
    prefix_share: float | None = PredictorSettings.prefix_share
    rollout: RolloutConfig = field(default_factory=lambda: RolloutConfig(
        sampling=SamplingConfig(max_new_tokens=BENCH_OVERRIDES["sampling.max_new_tokens"])))
    predictor: str = PredictorSettings.kind
    command: str = ""

    def __post_init__(self) -> None:
        if self.seeds < 1 or self.prompts < 1 or self.max_turns < 1 or self.warmup_prompts < 0:
            raise ValueError("seeds, prompts and max_turns must be >= 1, warmup_prompts >= 0")
        if self.prompts < self.budget.max_active:
            raise ValueError(f"the pool ({self.prompts}) must hold at least budget.max_active "
                             f"({self.budget.max_active}) prompts")
        if not self.strategies:
            raise ValueError("name at least one strategy")
        PredictorSettings(prefix_share=self.prefix_share)  # the trainer's one check of the share
        if self.predictor not in BENCH_PREDICTORS:
            raise ValueError(f"predictor must be one of {', '.join(BENCH_PREDICTORS)}, got {self.predictor!r}")
