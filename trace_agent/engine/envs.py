"""Where a prompt's env lives: the env-host protocol and the local (in-process) host.

A prompt's tree grows on ONE env for its whole life (an :class:`EnvSession`): it resets it
to the task, then moves it between rollouts with ``restore()``. A session refers to env
states by *handles* (:attr:`EpisodeStart.snapshot`, :attr:`StepOutcome.snapshot`): the local
host hands out the env's own :class:`~trace_envs.core.Snapshot` objects, the Ray host
(:mod:`trace_agent.engine.ray_envs`) small references to snapshots that never leave their
actor. Growth code (:mod:`trace_agent.engine.growth`) only sees handles, so it runs
unchanged on either host, and both give the same trees.

The local host runs every env call off the event loop, in a bounded thread pool
(``threads``), so env steps overlap with generation and with each other. Env operations
that raise (a dead sandbox, a failed restore) surface as
:class:`~trace_agent.engine.base.EnvWorkerError`; the collector retries the prompt on a
fresh env (``RolloutConfig.env_retries``) and then re-raises. Model output never raises
here: an env turns malformed actions into error observations.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

from trace_agent.engine.base import EnvWorkerError, PromptSpec
from trace_agent.engine.phases import PhaseTimer, timed

__all__ = [
    "EnvFactory",
    "EpisodeStart",
    "StepItem",
    "StepOutcome",
    "EnvSession",
    "EnvHost",
    "LocalEnvHost",
    "start_episode",
    "describe_episode",
    "step_episodes",
]

EnvFactory = Callable[[], Any]


@dataclass(frozen=True, kw_only=True)
class EpisodeStart:
    """A prompt's env right after ``reset``: the root state handle, chat messages, tool schemas, the task's data."""

    snapshot: Any
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    env_id: str
    task_data: dict[str, Any] | None = None


@dataclass(frozen=True, kw_only=True)
class StepItem:
    """One rollout's turn on a session's env: restore ``snapshot``, step ``action``.

    ``n_messages``: how many messages the state held (the outcome reports the ones added
    after them). ``release``: release ``snapshot`` after the step (Monte-Carlo rollouts own
    their intermediate states; tree nodes keep theirs).
    """

    snapshot: Any
    action: str
    n_messages: int
    release: bool = False


@dataclass(frozen=True, kw_only=True)
class StepOutcome:
    """What one step did: messages added (assistant turn first), reward, flags, the new state handle.

    ``snapshot`` is None when the episode ended (nothing continues from a finished episode).
    """

    added: list[dict[str, Any]]
    n_messages: int
    reward: float
    terminated: bool
    truncated: bool
    snapshot: Any


class EnvSession(Protocol):
    """One prompt's env, leased for its whole tree."""

    async def start(self, prompt: PromptSpec) -> EpisodeStart: ...

    async def step(self, items: Sequence[StepItem]) -> list[StepOutcome]: ...

    async def release(self, snapshots: Sequence[Any]) -> None: ...

    async def close(self, *, broken: bool = False) -> None: ...


class EnvHost(Protocol):
    """Hands out env sessions (local threads or Ray actors)."""

    async def open(self) -> EnvSession: ...

    async def describe(self, prompt: PromptSpec) -> list[dict[str, Any]]: ...

    def close(self) -> None: ...


# --------------------------------------------------------------------------------------------------
# the env calls themselves (shared by the local host and the Ray actor)


def _core(env: Any) -> Any:
    from trace_envs.wrappers import find_branchable

    return find_branchable(env)


def _env_id(env: Any) -> str:
    return str(getattr(env.unwrapped, "env_id", type(env.unwrapped).__name__))


def start_episode(env: Any, prompt: PromptSpec) -> tuple[Any, list[dict[str, Any]], list[dict[str, Any]], str,
                                                        dict[str, Any] | None]:
    """Reset ``env`` to the prompt's task; (root snapshot, messages, tools, env id, task data or None)."""
    env.reset(seed=prompt.reset_seed, options={"task_id": prompt.task_id})
    base = env.unwrapped
    task = getattr(base, "task", None)
    data = getattr(task, "data", None)
    return (_core(env).snapshot(), list(base.messages), list(base.tools), _env_id(env),
            dict(data) if isinstance(data, dict) else None)


def describe_episode(env: Any, prompt: PromptSpec) -> list[dict[str, Any]]:
    """The prompt's opening messages (no snapshot: nothing branches from it).

    From the env's ``opening_messages`` when it can tell without a reset (PythonMath-v0: the
    task's text), else by resetting ``env`` to the task.
    """
    opening = getattr(env.unwrapped, "opening_messages", None)
    messages = opening(prompt.task_id, seed=prompt.reset_seed) if callable(opening) else None
    if messages is not None:
        return list(messages)
    env.reset(seed=prompt.reset_seed, options={"task_id": prompt.task_id})
    return list(env.unwrapped.messages)


def step_episodes(env: Any, items: Sequence[tuple[Any, str, int, bool]]) -> list[
        tuple[list[dict[str, Any]], int, float, bool, bool, Any]]:
    """Run ``(snapshot, action, n_messages, release)`` items one after another on ``env``.

    Returns ``(added messages, message count, reward, terminated, truncated, new snapshot or None)``.
    """
    core = _core(env)
    base = env.unwrapped
    out = []
    for snapshot, action, n_messages, release in items:
        core.restore(snapshot)
        _, reward, terminated, truncated, _ = env.step(action)
        messages = list(base.messages)
        done = bool(terminated or truncated)
        snap = None if done else core.snapshot()
        if release:
            snapshot.release()
        out.append((messages[n_messages:], len(messages), float(reward), bool(terminated), bool(truncated), snap))
    return out


# --------------------------------------------------------------------------------------------------
# the local host


class _LocalSession:
    def __init__(self, host: LocalEnvHost, env: Any) -> None:
        self.host = host
        self.env = env
        self.prompt_id = "?"

    async def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self.host.pool(), timed(self.host.timer, "env", fn), *args)
        except (ValueError, TypeError, KeyError) as exc:  # a bad task id or a foreign snapshot: a caller's error
            raise exc
        except Exception as exc:
            raise EnvWorkerError(f"the env of prompt {self.prompt_id!r} failed: {type(exc).__name__}: {exc}") from exc

    async def start(self, prompt: PromptSpec) -> EpisodeStart:
        self.prompt_id = prompt.prompt_id
        snap, messages, tools, env_id, data = await self._call(start_episode, self.env, prompt)
        return EpisodeStart(snapshot=snap, messages=messages, tools=tools, env_id=env_id, task_data=data)

    async def step(self, items: Sequence[StepItem]) -> list[StepOutcome]:
        raw = await self._call(step_episodes, self.env, [(i.snapshot, i.action, i.n_messages, i.release)
                                                         for i in items])
        return [StepOutcome(added=a, n_messages=n, reward=r, terminated=te, truncated=tr, snapshot=s)
                for a, n, r, te, tr, s in raw]

    async def release(self, snapshots: Sequence[Any]) -> None:
        for snap in snapshots:
            if snap is not None:
                snap.release()

    async def close(self, *, broken: bool = False) -> None:
        self.host.give_back(self.env, broken=broken)


class LocalEnvHost:
    """Envs in this process, made by ``make_env`` on demand and reused across prompts and collections.

    Args:
        make_env: returns a fresh branchable env.
        threads: env calls run at once (a bounded thread pool).
    """

    def __init__(self, make_env: EnvFactory, *, threads: int = 2) -> None:
        if threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        self.make_env = make_env
        self.threads = threads
        self._free: list[Any] = []
        self._all: list[Any] = []
        self._lock = threading.Lock()
        self._executor: ThreadPoolExecutor | None = None
        #: records each env call as an ``env`` interval (None: no timing; the collector sets it).
        self.timer: PhaseTimer | None = None

    def pool(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(max_workers=self.threads, thread_name_prefix="trace-env")
            return self._executor

    def lease(self) -> Any:
        """An env for exclusive use (a free one, or a new one from ``make_env``); hand it back with :meth:`give_back`."""
        with self._lock:
            if self._free:
                return self._free.pop()
        env = self.make_env()
        with self._lock:
            self._all.append(env)
        return env

    def give_back(self, env: Any, *, broken: bool = False) -> None:
        """Return a leased env (``broken``: close and drop it instead)."""
        if broken:
            with self._lock:
                if env in self._all:
                    self._all.remove(env)
            try:
                env.close()
            except Exception:  # noqa: BLE001 - a broken env may fail to close; it is dropped either way
                pass
            return
        with self._lock:
            self._free.append(env)

    async def open(self) -> _LocalSession:
        loop = asyncio.get_running_loop()
        env = await loop.run_in_executor(self.pool(), self.lease)
        return _LocalSession(self, env)

    async def describe(self, prompt: PromptSpec) -> list[dict[str, Any]]:
        session = await self.open()
        try:
            session.prompt_id = prompt.prompt_id
            return await session._call(describe_episode, session.env, prompt)
        finally:
            await session.close()

    @property
    def envs(self) -> list[Any]:
        """Every env this host created and still holds."""
        with self._lock:
            return list(self._all)

    def close(self) -> None:
        """Shut the thread pool down and close every env (idempotent)."""
        with self._lock:
            executor, self._executor = self._executor, None
            envs, self._all, self._free = self._all, [], []
        if executor is not None:
            executor.shutdown(wait=True)
        for env in envs:
            env.close()
