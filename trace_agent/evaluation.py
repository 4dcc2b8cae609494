"""The one episode player and the one evaluator: episodes played through the real env, side by side.

The player: :func:`play` plays one episode per env with an :class:`Actor`: it resets each env on
its task and seed, then turn after turn asks the actor for the next action of every live episode
(one call), steps each env with its text and, while the episode goes on, tells the actor to take in
the new observation. :func:`play_episodes` is :func:`play` with a policy (:class:`PolicyActor`: the
chat rendered once with :meth:`Policy.render`, one batched ``generate`` a turn, the observation
messages appended with :meth:`Policy.extend`, token ids appended, never re-encoded). The scripted
demonstrators play through :func:`play` too
(:func:`~trace_agent.demo.demonstrators.collect_demonstrations`). The collector's turn loop
(:mod:`trace_agent.engine.growth`) is the asynchronous, branching form of the same loop: its turns
are scheduled one request at a time on a shared engine, from saved states rather than resets.

The evaluator: :func:`evaluate` plays ``samples`` episodes of each task with a policy, in waves
(its one seeding rule is in its docstring) and returns each task's rewards;
:func:`evaluate_heldout` runs it on a training config's held-out tasks and summarises the rewards
as an :class:`EvalResult`; :func:`success_histogram` summarises per-task rewards as a histogram of
success rates. Success is :func:`trace_agent.success.is_success` throughout.

A model's text is hostile but never raises here: the env turns bad output into an error
observation (the env contract).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from trace_agent.errors import PolicyError
from trace_agent.policy.base import Message, SamplingConfig
from trace_agent.success import success_rate

if TYPE_CHECKING:
    from trace_agent.config import TrainConfig

__all__ = [
    "EpisodeStart",
    "Actor",
    "PolicyActor",
    "observation_messages",
    "play",
    "play_episodes",
    "evaluate",
    "EvalResult",
    "evaluate_heldout",
    "success_histogram",
]


# --------------------------------------------------------------------------------------------------
# the episode player


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
        sampling: how each turn is sampled; its ``seed`` is replaced by ``turn_seed(turn)``.
        turn_seed: the ``generate`` seed of turn ``t``.
    """

    def __init__(self, policy: Any, *, sampling: SamplingConfig, turn_seed: Callable[[int], int]) -> None:
        self.policy = policy
        self.sampling = sampling
        self.turn_seed = turn_seed
        self._contexts: dict[int, Any] = {}
        self._last: dict[int, Any] = {}

    def start(self, j: int, env: Any) -> None:
        self._contexts[j] = self.policy.render(env.messages, env.tools)

    def act(self, alive: Sequence[int], turn: int) -> list[str]:
        sampling = replace(self.sampling, seed=self.turn_seed(turn))
        gens = self.policy.generate([self._contexts[j] for j in alive], sampling)
        self._last.update(zip(alive, gens, strict=True))
        return [gen.text for gen in gens]

    def observe(self, j: int, env: Any) -> None:
        self._contexts[j] = self.policy.extend(self._contexts[j], self._last[j], observation_messages(env.messages))


def play(actor: Actor, envs: Sequence[Any], starts: Sequence[EpisodeStart], *,
         on_step: Callable[[int, Mapping[str, Any]], None] | None = None,
         on_end: Callable[[int, float, Any], None] | None = None) -> list[float]:
    """Play ``starts[j]`` on ``envs[j]`` side by side with ``actor``; returns each episode's last reward.

    Args:
        actor: writes the actions (:class:`Actor`): one ``act`` call per turn over the episodes
            still running, in ``starts`` order.
        envs: at least ``len(starts)`` branchable envs (unwrapped: ``messages`` and ``tools``).
        starts: task and reset seed per episode.
        on_step: called as ``on_step(j, info)`` right after each step of episode ``j``, with the
            step's ``info``.
        on_end: called as ``on_end(j, reward, env)`` when episode ``j`` ends (terminated or
            truncated), right after its last step (and its ``on_step``), before the next episode's step.
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
            _, reward, terminated, truncated, info = env.step(text)
            rewards[j] = float(reward)
            if on_step is not None:
                on_step(j, info)
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
    sampling: SamplingConfig,
    turn_seed: Callable[[int], int],
    on_step: Callable[[int, Mapping[str, Any]], None] | None = None,
    on_end: Callable[[int, float, Any], None] | None = None,
) -> list[float]:
    """Play ``starts[j]`` on ``envs[j]`` side by side with ``policy``; returns each episode's last reward.

    :func:`play` with a :class:`PolicyActor`. Args:
        policy: a :class:`~trace_agent.policy.base.Policy` (``render``, ``generate``, ``extend``).
        envs: at least ``len(starts)`` branchable envs (unwrapped: ``messages`` and ``tools``).
        starts: task and reset seed per episode.
        sampling: how each turn is sampled; its ``seed`` is replaced by ``turn_seed``.
        turn_seed: the ``generate`` seed of turn ``t`` (0, 1, ...), one call per turn over the
            episodes still running, in ``starts`` order.
        on_step, on_end: as for :func:`play`.
    """
    actor = PolicyActor(policy, sampling=sampling, turn_seed=turn_seed)
    return play(actor, envs, starts, on_step=on_step, on_end=on_end)


# --------------------------------------------------------------------------------------------------
# the evaluator


def evaluate(
    policy: Any,
    make_env: Callable[[], Any],
    task_ids: Sequence[str],
    *,
    samples: int,
    sampling: SamplingConfig,
    seed: int,
    on_episode: Callable[[str, int, float, list[dict[str, Any]]], None] | None = None,
    on_step: Callable[[str, int, Mapping[str, Any]], None] | None = None,
    progress: bool = False,
) -> dict[str, list[float]]:
    """The rewards of ``samples`` episodes on each of ``task_ids`` (distinct), played with ``policy``.

    Episode ``(t, k)`` is sample ``k`` of ``task_ids[t]``; episodes are taken in that order
    (task by task) in waves of ``policy.max_batch_size`` (32 when it has none) side by side, one
    env each from ``make_env`` (reused across waves, closed at the end): one batched ``generate``
    per turn over the wave's live episodes, whatever task they belong to (:func:`play_episodes`).

    Seeds, the one rule: episode ``(t, k)`` resets with ``seed + 1000 * t + k``; turn ``turn`` of
    the wave that starts at episode ``w0`` is generated with seed ``seed + 7919 * turn + w0``. So
    the draw is fixed by ``seed``, the tasks, ``samples`` and the batch size (same weights: same
    episodes). ``sampling.seed`` is not used.

    ``on_episode(task_id, sample, reward, messages)`` is called as each episode ends, with a copy
    of the env's chat messages (e.g. to keep transcripts); ``on_step(task_id, sample, info)`` after
    each step. ``progress`` shows a bar over the episodes (with ETA) on stderr. Returns task id ->
    the rewards of its samples, in order.
    """
    from tqdm import tqdm

    if len(set(task_ids)) != len(task_ids):
        raise ValueError("evaluate needs distinct task ids")
    episodes = [(t, k) for t in range(len(task_ids)) for k in range(samples)]
    rewards: dict[str, list[float]] = {task_id: [] for task_id in task_ids}
    if not episodes:
        return rewards
    wave = max(1, min(len(episodes), getattr(policy, "max_batch_size", 32)))
    envs: list[Any] = []
    bar = tqdm(total=len(episodes), desc="eval", unit="episode", disable=not progress, dynamic_ncols=True,
               leave=False)
    try:
        envs += [make_env() for _ in range(wave)]
        for w0 in range(0, len(episodes), wave):
            batch = episodes[w0:w0 + wave]

            def stepped(j: int, info: Mapping[str, Any], batch: list[tuple[int, int]] = batch) -> None:
                if on_step is not None:
                    t, k = batch[j]
                    on_step(task_ids[t], k, info)

            def ended(j: int, reward: float, env: Any, batch: list[tuple[int, int]] = batch) -> None:
                bar.update(1)
                if on_episode is not None:
                    t, k = batch[j]
                    on_episode(task_ids[t], k, reward, [dict(m) for m in env.messages])

            starts = [EpisodeStart(task_id=task_ids[t], seed=seed + 1000 * t + k) for t, k in batch]
            wave_rewards = play_episodes(policy, envs, starts, sampling=sampling,
                                         turn_seed=lambda turn, w0=w0: seed + 7919 * turn + w0,
                                         on_step=stepped if on_step is not None else None, on_end=ended)
            for (t, _), reward in zip(batch, wave_rewards, strict=True):
                rewards[task_ids[t]].append(reward)
    finally:
        bar.close()
        for env in envs:
            env.close()
    return rewards


@dataclass(frozen=True, kw_only=True)
class EvalResult:
    """Held-out success: mean reward over ``tasks`` x ``samples`` episodes, and per-task rates.

    ``success_se`` is the standard error of ``success`` with tasks as clusters: the standard
    deviation of the per-task success rates over sqrt(tasks) (episodes of one task are not
    independent draws; with equal samples per task the overall rate is the mean of the
    per-task rates; e.g. Cameron & Miller 2015, "A Practitioner's Guide to Cluster-Robust
    Inference"). 0 with one task.
    """

    success: float
    success_se: float
    tasks: int
    samples: int
    episodes: int
    solved_tasks: int
    seconds: float
    per_task: dict[str, float]

    @classmethod
    def of(cls, rewards: Mapping[str, Sequence[float]], *, samples: int, seconds: float) -> EvalResult:
        """The result of :func:`evaluate`'s ``rewards`` (task id -> rewards), which took ``seconds``."""
        per_task = {task_id: success_rate(r) for task_id, r in rewards.items()}
        every = [x for r in rewards.values() for x in r]
        rates = list(per_task.values())
        se = (math.sqrt(sum((r - sum(rates) / len(rates)) ** 2 for r in rates) / (len(rates) - 1) / len(rates))
              if len(rates) > 1 else 0.0)
        return cls(success=success_rate(every) if every else 0.0, success_se=se, tasks=len(per_task),
                   samples=samples, episodes=len(every), solved_tasks=sum(v > 0 for v in rates), seconds=seconds,
                   per_task=per_task)


def evaluate_heldout(policy: Any, config: TrainConfig, *, seed: int = 12345,
                     on_episode: Callable[[str, int, float, list[dict[str, Any]]], None] | None = None,
                     progress: bool = False) -> EvalResult:
    """Play ``config.eval.samples`` episodes on each of ``config.eval.tasks`` held-out tasks (:func:`evaluate`).

    The tasks are a deterministic sample of the ``config.eval.split`` split stratified over the
    tasks' kinds (:func:`trace_envs.tasks.splits.stratified_ids`: WikiQA's question kinds,
    PythonMath's families; round robin over the kinds, each kind's tasks in split order), so a
    sample smaller than the split covers every kind it can; ``eval.tasks`` null plays every task.
    Turns are sampled as ``config.sampling`` says, at ``config.eval.temperature``, with at most
    ``config.sampling.max_turns`` turns. The draw is fixed by ``seed`` (:func:`evaluate`'s rule).
    ``on_episode`` and ``progress`` are :func:`evaluate`'s. ``config.max_backend_failures`` tool-backend
    failures in a row raise :class:`~trace_agent.backend_watch.BackendFailureError` (no score from error messages).
    """
    from trace_agent.env_factory import make_env_factory
    from trace_envs.tasks.splits import stratified_ids

    e, s = config.eval, config.sampling
    t0 = time.perf_counter()
    make = make_env_factory(config.env_id, e.split, max_turns=s.max_turns, env_kwargs=config.env_kwargs)
    env = make()
    try:
        ids = stratified_ids(env.tasks, e.tasks)
    finally:
        env.close()
    sampling = replace(s.params, temperature=e.temperature)
    from trace_agent.backend_watch import watch_backend

    rewards = evaluate(policy, watch_backend(make, config.max_backend_failures), ids, samples=e.samples, sampling=sampling, seed=seed, on_episode=on_episode,
                       progress=progress)
    return EvalResult.of(rewards, samples=e.samples, seconds=time.perf_counter() - t0)


def success_histogram(results: Mapping[str, Sequence[float]], *, bins: int = 5) -> dict[str, Any]:
    """Per-task success rates summarised: histogram over [0, 1], all-fail / mixed / all-success counts.

    ``results`` maps task id -> rewards (:func:`evaluate`'s answer). Success is
    :func:`trace_agent.success.is_success` (reward >= 0.5; the suite's rewards are 0 or 1).
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
