"""The ``trace`` section of verl's config (:class:`TraceVerlConfig`), readable without verl installed.

:mod:`trace_agent.integrations.verl` (which imports verl) reads it; its defaults are the training config's
(:mod:`trace_agent.config`), and the two it sets otherwise are :data:`VERL_OVERRIDES`, each with its reason.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from trace_agent.config import PredictorSettings, RolloutSettings, SamplingSettings, TrainConfig
from trace_agent.options import PREDICTOR_PREFIXES
from trace_agent.strategies import STRATEGY_NAMES

__all__ = ["TraceVerlConfig", "VERL_OVERRIDES"]

#: Where verl's ``trace`` section departs from the training config's defaults (config key -> value), on purpose:
#:
#: - ``rollout.continuations_per_root``: 2, the paper's N (its (M, N) = (1024, 2) shape); a training run's 1 is
#:   the demo configs' small-CPU shape.
#: - ``sampling.max_new_tokens``: None, meaning verl's own ``rollout.response_length``, so that a turn never
#:   outgrows the response verl reserves for it.
VERL_OVERRIDES: dict[str, Any] = {"rollout.continuations_per_root": 2, "sampling.max_new_tokens": None}


@dataclass(frozen=True, kw_only=True)
class TraceVerlConfig:
    """The ``trace`` section of verl's config.

    Attributes:
        env_id: the trace-gym env of every prompt (a row's ``extra_info.env_id`` wins).
        split: the env's task split (its ``tasks`` argument).
        env_kwargs: extra env arguments.
        max_turns: most turns per episode.
        strategy: one of :data:`~trace_agent.strategies.STRATEGY_NAMES` (training only).
        continuations_per_root: N of the (M, N) budget (M = ``rollout.n`` x prompts in a chunk).
        continuation_cost: paper units per continuation.
        root_cap: most roots one prompt may get (None: 4 x ``rollout.n``).
        max_new_tokens: most tokens of one assistant turn (None: ``rollout.response_length``).
        env_threads: trace-gym envs (and threads growing trees) per agent-loop worker.
        predictor: ``"embedding"`` (MiniLM, hashed n-grams without it) or ``"hashed"``.
        predictor_prefixes: which prefixes the refresh trains on (``refresh_predictor``).
        seed: base seed of every tree (with the step and the row's dataset index).

    Every default is the training config's (:class:`~trace_agent.config.TrainConfig`), except the
    ones :data:`VERL_OVERRIDES` names.
    """

    env_id: str = TrainConfig.env_id
    split: str = TrainConfig.train_split
    env_kwargs: Mapping[str, Any] = field(default_factory=dict)
    max_turns: int = SamplingSettings.max_turns
    strategy: str = RolloutSettings.strategy
    continuations_per_root: int = VERL_OVERRIDES["rollout.continuations_per_root"]
    continuation_cost: float = RolloutSettings.continuation_cost
    root_cap: int | None = RolloutSettings.root_cap
    max_new_tokens: int | None = VERL_OVERRIDES["sampling.max_new_tokens"]
    env_threads: int = 4
    predictor: str = PredictorSettings.kind
    predictor_prefixes: str = PredictorSettings.prefixes
    seed: int = TrainConfig.seed

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGY_NAMES:
            raise ValueError(f"trace.strategy must be one of {STRATEGY_NAMES}, got {self.strategy!r}")
        if self.max_turns < 1 or self.env_threads < 1 or self.continuations_per_root < 0:
            raise ValueError("trace.max_turns and trace.env_threads must be >= 1, continuations_per_root >= 0")
        if self.max_new_tokens is not None and self.max_new_tokens < 1:
            raise ValueError(f"trace.max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.predictor not in ("embedding", "hashed"):
            raise ValueError(f"trace.predictor must be 'embedding' or 'hashed', got {self.predictor!r}")
        if self.predictor_prefixes not in PREDICTOR_PREFIXES:
            raise ValueError(f"trace.predictor_prefixes must be {'|'.join(PREDICTOR_PREFIXES)}, "
                             f"got {self.predictor_prefixes!r}")
        object.__setattr__(self, "env_kwargs", dict(self.env_kwargs))

    @classmethod
    def from_verl(cls, config: Any) -> TraceVerlConfig:
        """Read ``config.trace`` (a DictConfig or a mapping); unknown keys are refused."""
        section = config.get("trace", None) if hasattr(config, "get") else None
        if section is None:
            return cls()
        try:
            from omegaconf import OmegaConf

            data = OmegaConf.to_container(section, resolve=True) if OmegaConf.is_config(section) else dict(section)
        except ImportError:  # pragma: no cover - omegaconf ships with verl
            data = dict(section)
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown trace.* settings {unknown}; known: {sorted(known)}")
        return cls(**data)
