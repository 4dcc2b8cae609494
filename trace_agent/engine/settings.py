"""The engine's settings a training config sets: env workers, env slots, batching, backend.

:class:`EngineSettings` is the training config's ``rollout.engine`` section
(:attr:`trace_agent.config.RolloutSettings.engine`) and the part of the collector's
:class:`~trace_agent.rollout.RolloutConfig` that the config decides (``RolloutConfig`` is an
``EngineSettings`` plus the sampling parameters, the seed and the collector's own knobs): each field,
its default and its check are declared here once. Pure Python; importing it imports nothing heavy.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from trace_agent.engine.ray_envs import RayConfig
from trace_agent.options import BATCHING, ENV_BACKENDS, Batching, EnvBackend, either

__all__ = ["EngineSettings"]


@dataclass(frozen=True, kw_only=True)
class EngineSettings:
    """Where envs live and how the shared engine batches (docs/engine.md).

    Attributes:
        workers: local backend: threads that run env calls (steps, snapshots, restores) at once.
        concurrent_prompts: env slots: prompts whose trees grow at once (one env each; the
            rest start in pool order as slots free up).
        max_batch_size: most sequences per engine call (None: the policy's own, ``policy.max_batch_size``
            in a training run; 64 for a policy without one).
        max_wait_s: dynamic batching: the longest a turn request waits for a fuller batch.
        batching: ``deterministic`` (barrier rounds: bit-identical trees, the default) or
            ``dynamic`` (continuous batching; statistically equivalent). See docs/engine.md.
        backend: ``local`` (envs in this process) or ``ray`` (env workers as Ray actors).
        ray: the Ray backend's settings, the backend's own
            :class:`~trace_agent.engine.ray_envs.RayConfig` (``rollout.engine.ray.workers``,
            ``rollout.engine.ray.address``, ...).

    Raises ``ValueError`` naming the field when a value is out of range.
    """

    workers: int = 2
    concurrent_prompts: int = 64
    max_batch_size: int | None = None
    max_wait_s: float = 0.05
    batching: Batching = "deterministic"
    backend: EnvBackend = "local"
    ray: RayConfig = field(default_factory=RayConfig)

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise ValueError(f"workers must be >= 1, got {self.workers}")
        if self.concurrent_prompts < 1:
            raise ValueError(f"concurrent_prompts must be >= 1, got {self.concurrent_prompts}")
        if self.max_batch_size is not None and self.max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1 or None, got {self.max_batch_size}")
        if not (math.isfinite(self.max_wait_s) and self.max_wait_s >= 0):
            raise ValueError(f"max_wait_s must be a finite number >= 0, got {self.max_wait_s}")
        if self.batching not in BATCHING:
            raise ValueError(f"batching must be {either(BATCHING)}, got {self.batching!r}")
        if self.backend not in ENV_BACKENDS:
            raise ValueError(f"backend must be {either(ENV_BACKENDS)}, got {self.backend!r}")
        if not isinstance(self.ray, RayConfig):
            raise TypeError(f"ray must be a RayConfig, got {type(self.ray).__name__}")

    def engine_fields(self) -> dict[str, Any]:
        """These settings as keyword arguments (each field's value as is), for a class that extends this one."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(EngineSettings)}
