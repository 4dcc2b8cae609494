"""What a demonstrator is, the registry of them, and the loop that plays scripted episodes through the real env.

A :class:`Demonstrator` scripts one env's episodes from its task data; :func:`collect_demonstrations`
plays them through the env with the one episode player (:func:`~trace_agent.evaluation.play`;
the tool observations are the env's own) and returns
:class:`Demonstration` records that :func:`~trace_agent.demo.build.build_demo_policy` trains on.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from trace_agent.evaluation import EpisodeStart, play
from trace_agent.policy.base import PolicyError

if TYPE_CHECKING:
    from trace_envs.core import BranchableEnv, TaskSet

__all__ = ["Demonstration", "Demonstrator", "register_demonstrator", "demonstrator_for", "tool_call",
           "collect_demonstrations"]


@dataclass(frozen=True, kw_only=True)
class Demonstration:
    """A scripted episode: the env's messages and tools after it ended, and its reward."""

    env_id: str
    task_id: str
    messages: tuple[Mapping[str, Any], ...]
    tools: tuple[Mapping[str, Any], ...]
    reward: float
    flawed: bool


class Demonstrator(Protocol):
    """Scripts one env's episodes from its task data.

    ``act`` returns the next assistant turn's text for the episode ``env`` is in (its ``task``,
    ``messages`` with the tool observations so far, and any env-specific helper such as BFCL's
    ``ground_truth_actions``). ``flawed`` asks for a plausible mistake (the demonstration then
    usually fails), so a policy trained on the mix stays imperfect. ``rng`` is the only randomness.
    A demonstrator may also define ``covers(task) -> bool`` (tasks it does not cover are not demonstrated),
    ``demonstration_tasks() -> TaskSet`` (the pool demonstrated when no task ids are given; default:
    the env's train tasks) and ``env_kwargs`` (a mapping of extra ``gym.make`` arguments of the env the
    demos are played in, such as BFCL-v0's ``tool_detail="compact"``).
    """

    env_id: str

    def act(self, env: BranchableEnv, *, flawed: bool, rng: np.random.Generator) -> str:
        ...


_DEMONSTRATORS: dict[str, Callable[..., Demonstrator]] = {}


def register_demonstrator(env_id: str, factory: Callable[..., Demonstrator]) -> None:
    """Make :func:`build_demo_policy` able to demonstrate ``env_id`` (``factory(**options)`` makes one)."""
    _DEMONSTRATORS[env_id] = factory


def demonstrator_for(env_id: str, **options: Any) -> Demonstrator:
    """A new demonstrator of ``env_id``, made with ``options`` (its constructor's keyword arguments, e.g.
    BFCL-v0's ``num_tasks``)."""
    try:
        factory = _DEMONSTRATORS[env_id]
    except KeyError:
        raise PolicyError(
            f"no Demonstrator for {env_id!r} (have {sorted(_DEMONSTRATORS)}); register one with register_demonstrator()"
        ) from None
    try:
        inspect.signature(factory).bind(**options)
    except TypeError as exc:
        raise PolicyError(f"bad demonstrator options for {env_id!r} {dict(options)}: {exc}") from None
    return factory(**options)


def tool_call(name: str, arguments: Mapping[str, Any]) -> str:
    return "<tool_call>" + json.dumps({"name": name, "arguments": dict(arguments)}, ensure_ascii=False) + "</tool_call>"


class _Scripted:
    """A demonstrator as the episode player's :class:`~trace_agent.evaluation.Actor` (it reads the env itself)."""

    def __init__(self, demonstrator: Demonstrator, *, flawed: bool, rng: np.random.Generator) -> None:
        self.demonstrator = demonstrator
        self.flawed = flawed
        self.rng = rng
        self.envs: dict[int, Any] = {}

    def start(self, j: int, env: Any) -> None:
        self.envs[j] = env

    def act(self, alive: Sequence[int], turn: int) -> list[str]:
        return [self.demonstrator.act(self.envs[j], flawed=self.flawed, rng=self.rng) for j in alive]

    def observe(self, j: int, env: Any) -> None:
        pass


def _make_env(env_id: str, *, max_turns: int, tasks: TaskSet | None = None,
              env_kwargs: Mapping[str, Any] | None = None) -> BranchableEnv:
    import gymnasium as gym

    import trace_envs  # noqa: F401  (registers the suite)

    kwargs: dict[str, Any] = {**dict(env_kwargs or {}), "max_turns": max_turns}
    if tasks is not None:
        kwargs["tasks"] = tasks
    return gym.make(env_id, **kwargs).unwrapped


def collect_demonstrations(
    env_id: str,
    *,
    task_ids: Sequence[str] | None = None,
    limit: int | None = None,
    demos_per_task: int = 1,
    flawed_fraction: float = 0.0,
    seed: int = 0,
    max_turns: int = 4,
    options: Mapping[str, Any] | None = None,
) -> list[Demonstration]:
    """Play scripted episodes of ``env_id`` through the real env (its demonstrator made with ``options``).

    With ``task_ids``, on those tasks of the env's default (train) task set. Without, on the
    env's demonstration pool (PythonMath-v0: 3,000 generated problems, none equal to a test
    problem; other envs: their train tasks), its first ``limit`` tasks when given.
    """
    demonstrator = demonstrator_for(env_id, **dict(options or {}))
    rng = np.random.default_rng(seed)
    pool = getattr(demonstrator, "demonstration_tasks", None)
    env = _make_env(env_id, max_turns=max_turns, tasks=pool() if pool is not None and task_ids is None else None,
                    env_kwargs=getattr(demonstrator, "env_kwargs", None))
    demos: list[Demonstration] = []
    try:
        ids = list(task_ids) if task_ids is not None else env.tasks.ids()[:limit]
        covers = getattr(demonstrator, "covers", None)
        if covers is not None:
            ids = [task_id for task_id in ids if covers(env.tasks[task_id])]
        for task_id in ids:
            for _ in range(demos_per_task):
                flawed = bool(rng.random() < flawed_fraction)
                start = EpisodeStart(task_id=task_id, seed=int(rng.integers(2**31)))
                [reward] = play(_Scripted(demonstrator, flawed=flawed, rng=rng), [env], [start])
                demos.append(Demonstration(env_id=env_id, task_id=task_id, messages=tuple(env.messages),
                                           tools=tuple(env.tools), reward=reward, flawed=flawed))
    finally:
        env.close()
    return demos
