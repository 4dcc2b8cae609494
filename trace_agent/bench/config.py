"""The bench's configuration: a training config tree plus a ``bench`` section.

A bench reads the config tree ``trace-gym train`` reads (:mod:`trace_agent.config`: ``env_id``,
``env_kwargs``, ``seed``, ``sampling.*``, ``rollout.*``, ``predictor.kind`` and ``prefix_share``), through
:mod:`trace_agent.config_io` (``--config FILE.yaml``, ``--set key=value``), plus its own section
(:class:`BenchSettings`: ``bench.strategies``, ``seeds``, ``warmup_prompts``, ``oracle_samples``) that train
skips; :meth:`BenchConfig.from_train_config` turns the two into :class:`BenchConfig`, one benchmark run, and
:func:`load_bench_config` does it from a file and overrides. Without a file the tree's defaults take the
bench's departures (:data:`BENCH_OVERRIDES`); a file replaces them, as a training run's ``--config`` replaces
its env's demo config::

    # bench.yaml: a training config (docs/configs/demo.yaml works as is) plus
    bench: {strategies: [grpo, trace], seeds: 3, warmup_prompts: 48}

    trace-gym bench --config bench.yaml --set rollout.budget.roots=64 --set bench.seeds=5
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from trace_agent.config import PredictorSettings, SamplingSettings, TrainConfig
from trace_agent.config_flags import BENCH_PREDICTORS
from trace_agent.errors import ConfigError
from trace_agent.policy.base import SamplingConfig
from trace_agent.rollout import RolloutConfig
from trace_agent.strategies import Budget

__all__ = ["BENCH_OVERRIDES", "BENCH_PREDICTORS", "DEFAULT_STRATEGIES", "BenchSettings", "BenchConfig",
           "bench_base", "load_bench_config",
           "load_bench_sections"]

DEFAULT_STRATEGIES: tuple[str, ...] = ("grpo", "pcl", "treepo", "trace", "trace-root", "trace-prefix", "oracle")


#: Where the bench departs from the training config's defaults (config key -> value), on purpose; every other
#: knob it shares with ``trace-gym train`` takes the config tree's default (:mod:`trace_agent.config`):
#:
#: - ``rollout.budget.roots`` 32 and ``rollout.budget.continuations_per_root`` 2: a bench batch of
#:   (M, N) = (32, 2), the paper's N at eight groups of four: the batch the README's and
#:   docs/guides/benchmark.md's commands measure.
#: - ``rollout.prompts_per_step`` 16: the candidate pool of a batch, twice the most prompts the batch can
#:   train on (M / group size = 8), so that a strategy chooses which prompts to skip.
#: - ``sampling.max_new_tokens`` 160: the turn length of the demo configs (``docs/configs/demo.yaml``) that
#:   trained the bench's default policy, the shipped demo one.
#:
#: A ``--config`` file replaces them (its values, else the config tree's defaults).
BENCH_OVERRIDES: dict[str, Any] = {"rollout.budget.roots": 32, "rollout.budget.continuations_per_root": 2,
                                   "rollout.prompts_per_step": 16, "sampling.max_new_tokens": 160}


@dataclass(frozen=True, kw_only=True)
class BenchSettings:
    """The config file's ``bench`` section: what a bench adds to a training config (``trace-gym train`` skips it).

    Attributes:
        strategies: strategy names or ``module:attribute`` specs, in table order.
        seeds: number of seeds (0 .. seeds-1): one candidate pool and one batch per strategy each.
        warmup_prompts: tasks the predictor is warmed up on (disjoint from the measured ones).
        oracle_samples: Monte-Carlo rollouts per anchor when a strategy (Oracle, the claims' probe) asks for
            them (the collector's :attr:`~trace_agent.rollout.RolloutConfig.oracle_samples`).
    """

    strategies: tuple[str, ...] = DEFAULT_STRATEGIES
    seeds: int = 5
    warmup_prompts: int = 48
    oracle_samples: int = RolloutConfig.oracle_samples


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
    :data:`BENCH_OVERRIDES` names: ``BenchConfig()`` is :func:`load_bench_config` without a file.
    """

    env_id: str = TrainConfig.env_id
    env_kwargs: Mapping[str, Any] = field(default_factory=dict)
    max_turns: int = SamplingSettings.max_turns
    strategies: tuple[str, ...] = BenchSettings.strategies
    seeds: int = BenchSettings.seeds
    prompts: int = BENCH_OVERRIDES["rollout.prompts_per_step"]
    budget: Budget = field(default_factory=lambda: Budget(
        roots=BENCH_OVERRIDES["rollout.budget.roots"],
        continuations_per_root=BENCH_OVERRIDES["rollout.budget.continuations_per_root"]))
    warmup_prompts: int = BenchSettings.warmup_prompts
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

    @classmethod
    def from_train_config(cls, train: TrainConfig, bench: BenchSettings | None = None, *,
                          command: str = "") -> BenchConfig:
        """The bench of a training config and a ``bench`` section: ``env_id``, ``env_kwargs``,
        ``sampling.max_turns``, the sampling parameters, the rollout budget (``rollout.budget``),
        ``rollout.prompts_per_step`` (the pool), the collector's settings (``seed``,
        ``rollout.engine``: :func:`~trace_agent.collector.rollout_config`), ``predictor.kind``
        and ``predictor.prefix_share``; the rest of the tree (policy, objective, optimiser, evaluation, log)
        is training's alone. Raises :class:`ConfigError` when the two make no bench."""
        from trace_agent.collector import rollout_config

        bench = bench or BenchSettings()
        if train.predictor.kind not in BENCH_PREDICTORS:
            raise ConfigError(f"predictor.kind {train.predictor.kind!r}: the bench builds one of "
                              f"{', '.join(BENCH_PREDICTORS)}; choose one with --predictor (predictor.kind)")
        try:
            return cls(env_id=train.env_id, env_kwargs=dict(train.env_kwargs), max_turns=train.sampling.max_turns,
                       strategies=tuple(bench.strategies), seeds=bench.seeds, prompts=train.rollout.prompts_per_step,
                       budget=train.rollout.budget, warmup_prompts=bench.warmup_prompts,
                       prefix_share=train.predictor.prefix_share,
                       rollout=replace(rollout_config(train), oracle_samples=bench.oracle_samples),
                       predictor=train.predictor.kind, command=command)
        except ConfigError:
            raise
        except ValueError as exc:
            raise ConfigError(f"bench: {exc}") from None


def bench_base(path: str | Path | None) -> list[str]:
    """The overrides a bench starts from: :data:`BENCH_OVERRIDES` without a config file, none with one."""
    from trace_agent.config_io import override

    return [] if path is not None else [override(k, v) for k, v in BENCH_OVERRIDES.items()]


def load_bench_config(path: str | Path | None = None, overrides: Sequence[str] = (), *,
                      command: str = "") -> BenchConfig:
    """The :class:`BenchConfig` of a config file and ``section.field=value`` overrides (``bench.seeds=3``).

    The order is ``trace-gym train``'s: the config tree's defaults (with :data:`BENCH_OVERRIDES` when
    ``path`` is None), the file, then ``overrides`` (the last one given wins); values are read and refused as
    :func:`~trace_agent.config_io.load_config` reads them (an unknown key is a one-line
    :class:`~trace_agent.errors.ConfigError` naming the known ones).
    """
    return BenchConfig.from_train_config(*load_bench_sections(path, overrides), command=command)


def load_bench_sections(path: str | Path | None = None,
                        overrides: Sequence[str] = ()) -> tuple[TrainConfig, BenchSettings]:
    """The config tree and the ``bench`` section :func:`load_bench_config` builds its :class:`BenchConfig` from."""
    from trace_agent.config_io import load_sections

    train, sections = load_sections(path, [*bench_base(path), *overrides], sections={"bench": BenchSettings()})
    return train, sections["bench"]
