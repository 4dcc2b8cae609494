"""The one episode player: reset -> act -> step (-> observe), episodes side by side, one action call a turn.

:func:`play` plays one episode per env with an :class:`Actor`: it resets each env on its task
and seed, then turn after turn asks the actor for the next action of every live episode (one
call), steps each env with its text and, while the episode goes on, tells the actor to take
in the new observation. :func:`play_episodes` is :func:`play` with a policy
(:class:`PolicyActor`: the chat rendered once with :meth:`Policy.render`, one batched
``generate`` a turn, the observation messages appended with :meth:`Policy.extend`, token ids
appended, never re-encoded), used by :func:`evaluate_policy` (per-task rewards through the
env, summarised by :func:`success_histogram`) and :func:`~trace_agent.train_cli.evaluate_heldout`;
the scripted demonstrators play through :func:`play` too
(:func:`~trace_agent.demo.demonstrators.collect_demonstrations`). The
collector's turn loop (:mod:`trace_agent.engine.growth`) is the asynchronous, branching form
of the same loop and stays there: its turns are scheduled one request at a time on a shared
engine, from saved states rather than resets.

A model's text is hostile but never raises here: the env turns bad output into an error
observation (the env contract).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from trace_agent.errors import PolicyError
from trace_agent.policy.base import DEFAULT_MAX_NEW_TOKENS, Message
from trace_agent.success import success_rate

__all__ = ["EpisodeStart", "Actor", "PolicyActor", "observation_messages", "play", "play_episodes", "evaluate_policy",
           "success_histogram"]


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


class Actor(Protocol):
    """Writes the actions of the episodes :func:`play` runs (episode ``j`` is played on ``envs[j]``)."""

    def start(self, j: int, env: Any) -> None:
        """Episode ``j``'s env was just reset to its task."""

    def act(self, alive: Sequence[int], turn: int) -> list[str]:
        """The next action text of each episode in ``alive`` (in that order), for turn ``turn`` (0, 1, ...)."""
        ...

    def observe(self, j: int, env: Any) -> None:
        """Episode ``j``'s env took its last action and goes on (its new observation is in ``env.messages``)."""


class PolicyActor:
    """A policy as an :class:`Actor`: render once, one batched ``generate`` a turn, ``extend`` with each observation.

    Args:
        policy: a :class:`~trace_agent.policy.base.Policy` (``render``, ``generate``, ``extend``).
        turn_seed: the ``generate`` seed of turn ``t``.
        max_new_tokens, temperature, top_p: passed to ``generate``.
    """

    def __init__(self, policy: Any, *, turn_seed: Callable[[int], int], max_new_tokens: int, temperature: float,
                 top_p: float) -> None:
        self.policy = policy
        self.turn_seed = turn_seed
        self.sampling = {"max_new_tokens": max_new_tokens, "temperature": temperature, "top_p": top_p}
        self._contexts: dict[int, Any] = {}
        self._last: dict[int, Any] = {}

    def start(self, j: int, env: Any) -> None:
        self._contexts[j] = self.policy.render(env.messages, env.tools)

    def act(self, alive: Sequence[int], turn: int) -> list[str]:
        gens = self.policy.generate([self._contexts[j] for j in alive], seed=self.turn_seed(turn), **self.sampling)
        self._last.update(zip(alive, gens, strict=True))
        return [gen.text for gen in gens]

    def observe(self, j: int, env: Any) -> None:
        self._contexts[j] = self.policy.extend(self._contexts[j], self._last[j], observation_messages(env.messages))


def play(actor: Actor, envs: Sequence[Any], starts: Sequence[EpisodeStart], *,
         on_end: Callable[[int, float, Any], None] | None = None) -> list[float]:
    """Play ``starts[j]`` on ``envs[j]`` side by side with ``actor``; returns each episode's last reward.

    Args:
        actor: writes the actions (:class:`Actor`): one ``act`` call per turn over the episodes
            still running, in ``starts`` order.
        envs: at least ``len(starts)`` branchable envs (unwrapped: ``messages`` and ``tools``).
        starts: task and reset seed per episode.
        on_end: called as ``on_end(j, reward, env)`` when episode ``j`` ends (terminated or
            truncated), right after its last step, before the next episode's step.
    """
    if len(starts) > len(envs):
        raise ValueError(f"{len(starts)} episodes for {len(envs)} envs")
    for j, (env, start) in enumerate(zip(envs, starts, strict=False)):
        env.reset(seed=start.seed, options={"task_id": start.task_id})
        actor.start(j, env)
    rewards = [0.0] * len(starts)
    alive = list(range(len(starts)))
    turn = 0
    while alive:
        texts = actor.act(alive, turn)
        if len(texts) != len(alive):
            raise PolicyError(f"the actor wrote {len(texts)} actions for {len(alive)} live episodes")
        still = []
        for j, text in zip(alive, texts, strict=True):
            env = envs[j]
            _, reward, terminated, truncated, _ = env.step(text)
            rewards[j] = float(reward)
            if terminated or truncated:
                if on_end is not None:
                    on_end(j, rewards[j], env)
            else:
                actor.observe(j, env)
                still.append(j)
        alive = still
        turn += 1
    return rewards


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
    """Play ``starts[j]`` on ``envs[j]`` side by side with ``policy``; returns each episode's last reward.

    :func:`play` with a :class:`PolicyActor`. Args:
        policy: a :class:`~trace_agent.policy.base.Policy` (``render``, ``generate``, ``extend``).
        envs: at least ``len(starts)`` branchable envs (unwrapped: ``messages`` and ``tools``).
        starts: task and reset seed per episode.
        turn_seed: the ``generate`` seed of turn ``t`` (0, 1, ...), one call per turn over the
            episodes still running, in ``starts`` order.
        max_new_tokens, temperature, top_p: passed to ``generate``.
        on_end: called as ``on_end(j, reward, env)`` when episode ``j`` ends (terminated or
            truncated), right after its last step, before the next episode's step.
    """
    actor = PolicyActor(policy, turn_seed=turn_seed, max_new_tokens=max_new_tokens, temperature=temperature,
                        top_p=top_p)
    return play(actor, envs, starts, on_end=on_end)


def evaluate_policy(
    policy: Any,
    env_id: str,
    task_ids: Sequence[str],
    *,
    samples: int = 8,
    temperature: float = 1.0,
    top_p: float = 1.0,
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
    max_turns: int = 4,
    seed: int = 0,
    env_kwargs: Mapping[str, Any] | None = None,
) -> dict[str, list[float]]:
    """Rewards of ``samples`` episodes per task, played through the real env with ``policy``.

    The ``samples`` episodes of one task run side by side (one env each, one batched
    ``generate`` per turn; :func:`~trace_agent.policy.episodes.play_episodes`). Returns task
    id -> rewards.
    """
    from trace_agent.env_factory import make_env_factory

    make = make_env_factory(env_id, None, max_turns=max_turns, env_kwargs=dict(env_kwargs or {}))
    envs = [make() for _ in range(samples)]
    results: dict[str, list[float]] = {}
    try:
        for t, task_id in enumerate(task_ids):
            starts = [EpisodeStart(task_id=task_id, seed=seed + 1000 * t + k) for k in range(samples)]
            results[task_id] = play_episodes(policy, envs, starts, turn_seed=lambda turn, t=t: seed + 7919 * t + turn,
                                             max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p)
    finally:
        for env in envs:
            env.close()
    return results


def success_histogram(results: Mapping[str, Sequence[float]], *, bins: int = 5) -> dict[str, Any]:
    """Per-task success rates summarised: histogram over [0, 1], all-fail / mixed / all-success counts.

    Success is :func:`trace_agent.success.is_success` (reward >= 0.5; the suite's rewards are 0 or 1).
    """
    rates = [success_rate(rewards) for rewards in results.values() if rewards]
    edges = np.linspace(0.0, 1.0, bins + 1)
    counts, _ = np.histogram(rates, bins=edges)
    return {
        "tasks": len(rates),
        "mean_success": float(np.mean(rates)) if rates else math.nan,
        "all_fail": sum(r == 0.0 for r in rates),
        "all_success": sum(r == 1.0 for r in rates),
        "mixed": sum(0.0 < r < 1.0 for r in rates),
        "histogram": {f"[{edges[i]:.1f},{edges[i + 1]:.1f}{']' if i == bins - 1 else ')'}": int(c)
                      for i, c in enumerate(counts)},
        "rates": rates,
    }
