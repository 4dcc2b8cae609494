"""The rollout engine: asynchronous per-prompt tree growth on one shared, continuously batched generator.

Modules (each one job):

- :mod:`trace_agent.engine.base` - prompts, errors, per-request seeds, token contexts from trees;
- :mod:`trace_agent.engine.scheduler` - :class:`GenerationEngine`, the batching scheduler
  (deterministic barrier rounds or dynamic continuous batching) on one engine thread;
- :mod:`trace_agent.engine.growth` - one prompt's tree as an asyncio task, and the bounded
  runner of many (env slots, atomic hand-off, retries);
- :mod:`trace_agent.engine.envs` - the env-host protocol and the local (threaded) host;
- :mod:`trace_agent.engine.ray_envs` - env workers as Ray actors (imports Ray only when used);
- :mod:`trace_agent.engine.settings` - :class:`EngineSettings`, the engine's settings a training config sets
  (``rollout.engine``).

:class:`trace_agent.rollout.TreeCollector` puts them together; docs/engine.md is the contract.
"""

from __future__ import annotations

from trace_agent.engine.base import (
    CollectionError,
    EnvWorkerError,
    Phase,
    PromptSpec,
    node_context,
    path_token_ids,
    prompt_key,
    prompt_pool,
    request_seed,
)
from trace_agent.engine.envs import EnvHost, EnvSession, LocalEnvHost
from trace_agent.engine.ray_envs import RayConfig
from trace_agent.engine.scheduler import EngineConfig, EngineStats, GenerationEngine, TurnRequest
from trace_agent.engine.settings import EngineSettings

__all__ = [
    "CollectionError",
    "EnvWorkerError",
    "Phase",
    "PromptSpec",
    "node_context",
    "path_token_ids",
    "prompt_key",
    "prompt_pool",
    "request_seed",
    "EnvHost",
    "EnvSession",
    "LocalEnvHost",
    "RayConfig",
    "EngineConfig",
    "EngineSettings",
    "EngineStats",
    "GenerationEngine",
    "TurnRequest",
]
