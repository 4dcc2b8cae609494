"""The one episode player: render -> generate -> step -> extend, episodes side by side, one batched call a turn.

:func:`play_episodes` plays one episode per env: it resets each env on its task and seed,
renders the chat once (:meth:`Policy.render`), then turn after turn asks the policy for one
batched ``generate`` over the live episodes, steps each env with its text and, while the
episode goes on, extends the context with the new observation messages
(:func:`observation_messages`; token ids are appended, never re-encoded). Used by
:func:`~trace_agent.policy.demo.evaluate_policy` and
:func:`~trace_agent.train_cli.evaluate_heldout`. The collector's turn loop
(:mod:`trace_agent.engine.growth`) is the asynchronous, branching form of the same loop and
stays there: its turns are scheduled one request at a time on a shared engine.

A model's text is hostile but never raises here: the env turns bad output into an error
observation (the env contract).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from trace_agent.errors import PolicyError
from trace_agent.policy.base import Message

__all__ = ["EpisodeStart", "observation_messages", "play_episodes"]


def observation_messages(messages: Sequence[Message]) -> list[Message]:
    """The messages after the last assistant turn: what ``Policy.extend`` appends after a step."""
    last = max((i for i, m in enumerate(messages) if m.get("role") == "assistant"), default=-1)
    if last < 0:
        raise PolicyError("no assistant turn in the messages")
    return [dict(m) for m in messages[last + 1:]]


@dataclass(frozen=True, kw_only=True, slots=True)
class EpisodeStart:
    """Where one episode starts: ``env.reset(seed=seed, options={"task_id": task_id})``."""

    task_id: str
    seed: int


def play_episodes(
    policy: Any,
    envs: Sequence[Any],
    starts: Sequence[EpisodeStart],
    *,
    turn_seed: Callable[[int], int],
    max_new_tokens: int,
    temperature: float,
    top_p: float,
    on_end: Callable[[int, float, Any], None] | None = None,
) -> list[float]:
    """Play ``starts[j]`` on ``envs[j]`` side by side; returns each episode's last reward.

    Args:
        policy: a :class:`~trace_agent.policy.base.Policy` (``render``, ``generate``, ``extend``).
        envs: at least ``len(starts)`` branchable envs (unwrapped: ``messages`` and ``tools``).
        starts: task and reset seed per episode.
        turn_seed: the ``generate`` seed of turn ``t`` (0, 1, ...), one call per turn over the
            episodes still running, in ``starts`` order.
        max_new_tokens, temperature, top_p: passed to ``generate``.
        on_end: called as ``on_end(j, reward, env)`` when episode ``j`` ends (terminated or
            truncated), right after its last step, before the next episode's step.
    """
    if len(starts) > len(envs):
        raise ValueError(f"{len(starts)} episodes for {len(envs)} envs")
    contexts = []
    for env, start in zip(envs, starts, strict=False):
        env.reset(seed=start.seed, options={"task_id": start.task_id})
        contexts.append(policy.render(env.messages, env.tools))
    rewards = [0.0] * len(starts)
    alive = list(range(len(starts)))
    turn = 0
    while alive:
        gens = policy.generate([contexts[j] for j in alive], max_new_tokens=max_new_tokens,
                               temperature=temperature, top_p=top_p, seed=turn_seed(turn))
        still = []
        for j, gen in zip(alive, gens, strict=True):
            env = envs[j]
            _, reward, terminated, truncated, _ = env.step(gen.text)
            rewards[j] = float(reward)
            if terminated or truncated:
                if on_end is not None:
                    on_end(j, rewards[j], env)
            else:
                contexts[j] = policy.extend(contexts[j], gen, observation_messages(env.messages))
                still.append(j)
        alive = still
        turn += 1
    return rewards
