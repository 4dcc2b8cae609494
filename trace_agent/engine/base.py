"""Shared vocabulary of the rollout engine: prompts, errors, request seeds, token contexts from trees.

Everything here is a value or a pure function; the scheduler
(:mod:`trace_agent.engine.scheduler`), the per-prompt growth
(:mod:`trace_agent.engine.growth`) and the env hosts (:mod:`trace_agent.engine.envs`,
:mod:`trace_agent.engine.ray_envs`) build on it. :mod:`trace_agent.rollout` re-exports the
public names.

Per-request seeds (docs/engine.md). Every turn request carries its own seed,
``request_seed(config seed, collect seed, prompt key, phase, rollout id, turn)``: a
backend that honours ``seeds=`` samples a request's tokens from its own generator, so
what a rollout says does not depend on which other rollouts share its batch (up to the
backend's floating-point numerics, which do depend on batch composition; see the
deterministic batching mode of the scheduler for bit-identical trees).
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum

import numpy as np

from trace_agent.errors import CollectionError, EnvWorkerError
from trace_agent.policy.base import TokenContext
from trace_agent.tree import Node, RolloutTree, path_token_ids

__all__ = [
    "PromptSpec",
    "CollectionError",
    "EnvWorkerError",
    "Phase",
    "prompt_pool",
    "prompt_key",
    "request_seed",
    "node_context",
    "path_token_ids",
]


class Phase(IntEnum):
    """Which part of a prompt's work a turn request belongs to (a seed component and a sort key)."""

    ROOTS = 0
    CONTINUATIONS = 1
    ORACLE_PROMPT = 2
    ORACLE_NODES = 3


@dataclass(frozen=True, kw_only=True)
class PromptSpec:
    """One candidate prompt: an env task and the seed its episodes are reset with.

    Attributes:
        task_id: id in the env's task set.
        prompt_id: id of the tree (default: ``task_id``); unique within a batch.
        reset_seed: ``env.reset(seed=...)`` for this prompt's episodes.
    """

    task_id: str
    prompt_id: str = ""
    reset_seed: int = 0

    def __post_init__(self) -> None:
        if not self.task_id:
            raise ValueError("a PromptSpec needs a task_id")
        if not self.prompt_id:
            object.__setattr__(self, "prompt_id", self.task_id)


def prompt_pool(task_ids: Sequence[str], *, reset_seed: int = 0) -> list[PromptSpec]:
    """PromptSpecs for ``task_ids`` (prompt id = task id)."""
    return [PromptSpec(task_id=t, reset_seed=reset_seed) for t in task_ids]


def prompt_key(prompt_id: str) -> int:
    """A stable 32-bit key of a prompt id (CRC-32 of its UTF-8 bytes): the prompt's seed component."""
    return zlib.crc32(prompt_id.encode("utf-8"))


def request_seed(*parts: int) -> int:
    """A 32-bit seed from integer parts (numpy ``SeedSequence`` over their low 32 bits).

    The collector calls it as ``request_seed(config_seed, collect_seed, prompt_key, phase,
    rollout_id, turn[, call])``; distinct part tuples give independent streams.
    """
    return int(np.random.SeedSequence([int(p) & 0xFFFFFFFF for p in parts]).generate_state(1)[0])


def node_context(tree: RolloutTree, node: Node) -> TokenContext:
    """The exact TokenContext the policy continues from at ``node``, rebuilt from the recorded ids.

    Prompt, template and observation ids are flagged not generated; generated ids carry their
    behaviour log-probs (NaN where a tree did not record them).
    """
    ctx = TokenContext.from_prompt(tree.root.observation_ids)
    for n in node.path()[1:]:
        if n.generated_ids:
            logps = n.generated_logprobs or [float("nan")] * len(n.generated_ids)
            ctx = ctx.append(n.generated_ids, generated=True, logprobs=logps)
        if n.observation_ids:
            ctx = ctx.append(n.observation_ids, generated=False)
    return ctx
