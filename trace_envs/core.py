"""BranchableEnv: a Gymnasium text env whose state can be saved and restored per turn.

One ``step`` is one ReAct turn: the action is the model's raw text for the
turn, the observation is the text the env answers with (a tool result or an
error message). The full conversation is kept as OpenAI-style chat messages in
``env.messages`` so any chat template can render it, and ``env.tools`` holds
the tools' JSON schemas.

``snapshot()`` returns an immutable :class:`Snapshot` of the state after the
last finished turn, RNG included; ``restore(snapshot)`` puts the env exactly
there, as often as wanted. The laws (replay, reuse, isolation, longevity,
foreign snapshots refused) are checked by :func:`trace_envs.check_branchable_env`.

Subclasses implement four hooks: ``_start_episode`` (set up tool state for a
task), ``_run_turn`` (act on one parsed turn), ``_capture_state`` and
``_restore_state`` (their own state, beyond the transcript and RNG the base
class already saves).
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
import logging
import sys
import threading
import weakref
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import gymnasium as gym
import numpy as np

from trace_envs.actions import scrub_surrogates
from trace_envs.errors import (
    ForeignSnapshotError,
    InvalidTaskError,
    ResetNeededError,
    SnapshotError,
    TaskNotFoundError,
)
from trace_envs.text_space import FreeText, SharedTexts

__all__ = [
    "ALL_SPLITS",
    "FreeText",
    "SharedTexts",
    "Task",
    "TaskSet",
    "TurnResult",
    "Snapshot",
    "BranchableEnv",
]

Message = dict[str, Any]
_log = logging.getLogger(__name__)

#: Split names that mean every task of an env that has no single task file (see :meth:`BranchableEnv.split_kwargs`).
ALL_SPLITS: tuple[str, ...] = ("all", "default")


@dataclass(frozen=True)
class Task:
    """One episode's specification.

    Attributes:
        task_id: stable identifier within its task set (used by ``reset(options={"task_id": ...})``).
        prompt: the user message that opens the episode.
        data: env-specific fields (answer, gold passages, initial tool state, ...). Treat as read-only.
    """

    task_id: str
    prompt: str
    data: Mapping[str, Any] = field(default_factory=dict)

    @property
    def fingerprint(self) -> str:
        """A digest of the task's content: two tasks with the same id but other content differ."""
        blob = json.dumps([self.task_id, self.prompt, self.data], sort_keys=True, default=str)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


class TaskSet(Mapping[str, Task]):
    """An ordered, read-only collection of tasks keyed by id."""

    def __init__(self, tasks: Sequence[Task] | Iterator[Task], *, name: str = "tasks") -> None:
        self._tasks: dict[str, Task] = {}
        for task in tasks:
            if task.task_id in self._tasks:
                raise InvalidTaskError(f"duplicate task id {task.task_id!r} in {name}")
            self._tasks[task.task_id] = task
        self.name = name

    def __getitem__(self, task_id: str) -> Task:
        try:
            return self._tasks[task_id]
        except KeyError:
            sample = ", ".join(itertools.islice(self._tasks, 3))
            raise TaskNotFoundError(
                f"no task {task_id!r} in {self.name} ({len(self)} tasks, e.g. {sample})"
            ) from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._tasks)

    def __len__(self) -> int:
        return len(self._tasks)

    def ids(self) -> list[str]:
        return list(self._tasks)

    def sample(self, rng: np.random.Generator) -> Task:
        if not self._tasks:
            raise TaskNotFoundError(f"{self.name} is empty")
        return list(self._tasks.values())[int(rng.integers(len(self._tasks)))]


@dataclass(frozen=True)
class TurnResult:
    """What a subclass's ``_run_turn`` reports for one turn.

    ``observation`` is shown to the model as a message of ``role`` ("tool" for
    tool results, "user" for feedback or a new user question).
    """

    observation: str
    reward: float = 0.0
    terminated: bool = False
    role: str = "tool"
    info: Mapping[str, Any] = field(default_factory=dict)


_snapshot_ids = itertools.count(1)


@dataclass(frozen=True, eq=False)
class Snapshot:
    """The immutable state of a branchable env after a finished turn.

    The base fields are plain data; ``payload`` is the env's own state (a
    frozen copy or a handle to a frozen process) and is never mutated. A
    snapshot holding processes frees them when dropped, on ``release()`` or
    when its env is closed.
    """

    env_id: str
    config_key: str
    task: Task
    turn: int
    done: bool
    messages: tuple[tuple[tuple[str, Any], ...], ...]
    rng_state: Mapping[str, Any]
    episode_info: tuple[tuple[str, Any], ...]
    payload: Any
    wrapper_states: tuple[tuple[str, Any], ...] = ()
    snapshot_id: int = field(default_factory=lambda: next(_snapshot_ids))

    @property
    def task_id(self) -> str:
        return self.task.task_id

    def release(self) -> None:
        """Free the resources the payload holds (idempotent). Restoring afterwards raises."""
        release = getattr(self.payload, "release", None)
        if release is not None:
            release()

    @property
    def released(self) -> bool:
        return bool(getattr(self.payload, "released", False))

    def digest(self) -> str:
        """A digest of the plain-data part, used to check that nothing mutated a snapshot."""
        blob = json.dumps(
            [self.env_id, self.config_key, self.task.fingerprint, self.turn, self.done, self.messages,
             self.rng_state, self.episode_info, self.wrapper_states],
            sort_keys=True, default=str,
        )
        payload_digest = getattr(self.payload, "digest", None)
        extra = payload_digest() if callable(payload_digest) else ""
        return hashlib.sha256((blob + extra).encode()).hexdigest()

    def __repr__(self) -> str:
        return f"Snapshot(#{self.snapshot_id} {self.env_id} task={self.task_id!r} turn={self.turn} done={self.done})"


def _freeze_messages(messages: Sequence[Message]) -> tuple[tuple[tuple[str, Any], ...], ...]:
    return tuple(tuple(copy.deepcopy(m).items()) for m in messages)


def _thaw_messages(frozen: tuple[tuple[tuple[str, Any], ...], ...]) -> list[Message]:
    return [copy.deepcopy(dict(items)) for items in frozen]


class BranchableEnv(gym.Env[str, str]):
    """Base class of every trace_envs environment (see the module docstring).

    Args:
        tasks: the task set episodes are drawn from.
        max_turns: turns per episode; reaching it without an answer sets ``truncated``.
        render_mode: None or "ansi" (the transcript as text).
        max_action_chars / max_observation_chars: bounds of the text spaces.
    """

    metadata: ClassVar[dict[str, Any]] = {"render_modes": ["ansi"], "render_fps": 1}
    #: the registered id; subclasses set it.
    env_id: ClassVar[str] = "trace_envs/Branchable-v0"
    #: the named task splits the env serves (``tasks=<name>``), its default first: what a trainer's
    #: ``train_split`` / held-out ``split`` may name (with "all", and whatever :meth:`split_kwargs` accepts).
    splits: ClassVar[tuple[str, ...]] = ("train", "test")
    #: whether every task offers the same tools for the whole episode (``tools`` does not change with the
    #: task or mid-episode), so one tool list rendered up front serves every episode.
    same_tools: ClassVar[bool] = True
    #: whether an episode holds several user turns, each ended by a reply without a tool call (else the
    #: first reply without a call ends the episode's exchange).
    multi_user_turn: ClassVar[bool] = False

    @classmethod
    def load_tasks(cls, tasks: Any) -> TaskSet | None:
        """The task set the constructor's ``tasks=`` argument names, read and checked as the constructor reads
        it but with no process started (no sandbox, server or worker), or None when the env does not say.

        ``trace-gym train --preflight`` validates a task file through it: an env that reads task files
        overrides it so every row becomes a task (or an :class:`~trace_envs.errors.InvalidTaskError` naming
        the file and row) before a run starts. The default knows only a ready :class:`TaskSet`.
        """
        return tasks if isinstance(tasks, TaskSet) else None

    @classmethod
    def split_kwargs(cls, split: str, kwargs: Mapping[str, Any]) -> dict[str, Any]:
        """The constructor arguments that select the task split ``split``, over ``kwargs`` (the caller's
        other arguments, e.g. a category that a split is drawn from).

        This is how a trainer selects a split without knowing the env (it reads the class from the
        id's registered entry point). The default passes ``tasks=split`` to the constructor, which
        resolves it; an env whose split names need more (a file path, a category's partition, names
        that mean every task) overrides this. Raises :class:`~trace_envs.errors.InvalidTaskError`
        (a ``ValueError``) naming the splits it has for a split it does not have.
        """
        return {**kwargs, "tasks": split}

    def __init__(
        self,
        *,
        tasks: TaskSet,
        max_turns: int = 8,
        render_mode: str | None = None,
        max_action_chars: int = 200_000,
        max_observation_chars: int = 200_000,
    ) -> None:
        from trace_envs.validation import check_arguments

        check_arguments(self.env_id, BranchableEnv.__init__, locals())
        if max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}")
        if render_mode not in (None, "ansi"):
            raise ValueError(f"render_mode must be None or 'ansi', got {render_mode!r}")
        self.tasks = tasks
        self.max_turns = max_turns
        self.render_mode = render_mode
        self.action_space = FreeText(max_action_chars)
        self.observation_space = FreeText(max_observation_chars)
        self._task: Task | None = None
        self._turn = 0
        self._done = True
        self._messages: list[Message] = []
        self._episode_info: dict[str, Any] = {}
        self._snapshots: weakref.WeakSet[Any] = weakref.WeakSet()
        self._lock = threading.RLock()

    # ----------------------------------------------------------------- public
    @property
    def system_prompt(self) -> str:
        """The system message that opens every episode."""
        return ""

    @property
    def tools(self) -> list[dict[str, Any]]:
        """The tools' JSON schemas in OpenAI function format (for chat templates)."""
        return []

    @property
    def config_key(self) -> str:
        """Identifies the construction arguments that shape state; snapshots only move between equal keys."""
        return f"{self.env_id}|max_turns={self.max_turns}|tasks={self.tasks.name}"

    @property
    def task(self) -> Task:
        if self._task is None:
            raise ResetNeededError("no episode: call reset() first")
        return self._task

    @property
    def turn(self) -> int:
        """Finished turns in the current episode."""
        return self._turn

    @property
    def done(self) -> bool:
        return self._done

    @property
    def messages(self) -> list[Message]:
        """The conversation so far as chat messages (a copy)."""
        return copy.deepcopy(self._messages)

    def conformance_actions(self) -> list[str]:
        """Actions that change this env's state, for :func:`check_branchable_env`.

        Subclasses return turns that exercise their tools on the task the env
        is reset to; the default uses malformed turns, which only move the transcript.
        """
        return ["no tool call here", "<tool_call>{oops</tool_call>", "still thinking", "<answer></answer>"]

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        """Start an episode.

        ``options={"task_id": id}`` picks a task of the task set;
        ``options={"task": {...}}`` runs the caller's own task (fields as the
        env's ``make_task`` documents); otherwise a task is drawn with the
        env's seeded RNG.
        """
        super().reset(seed=seed)
        options = dict(options or {})
        if "task" in options and "task_id" in options:
            raise InvalidTaskError("pass either options['task'] or options['task_id'], not both")
        if "task" in options:
            task = options["task"] if isinstance(options["task"], Task) else self.make_task(options["task"])
        elif "task_id" in options:
            task = self.tasks[str(options["task_id"])]
        else:
            task = self.tasks.sample(self.np_random)
        with self._lock:
            self._task = task
            self._turn = 0
            self._done = False
            self._episode_info = {}
            self._messages = []
            if self.system_prompt:
                self._messages.append({"role": "system", "content": self.system_prompt})
            try:
                observation = scrub_surrogates(self._start_episode(task))
            except BaseException:  # a failed reset leaves no half-started episode behind
                self._task, self._done, self._messages = None, True, []
                raise
            self._messages.append({"role": "user", "content": observation})
            return observation, self._info({})

    def opening_messages(self, task_id: str, *, seed: int | None = None) -> list[Message] | None:
        """The messages ``reset(seed=seed, options={"task_id": task_id})`` opens with, without resetting.

        None when only a reset can tell (the default: an env opts in by overriding
        ``_opening_observation``). Touches no episode state: a running episode goes on.
        """
        observation = self._opening_observation(self.tasks[str(task_id)], seed)
        if observation is None:
            return None
        messages: list[Message] = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        return [*messages, {"role": "user", "content": scrub_surrogates(observation)}]

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Play one turn: ``action`` is the model's raw text for it."""
        with self._lock:
            if self._task is None or self._done:
                raise ResetNeededError("the episode is over or not started: call reset() first")
            text = scrub_surrogates(action) if isinstance(action, str) else repr(action)[:1000]
            self._turn += 1
            self._messages.append({"role": "assistant", "content": text})
            try:
                result = self._run_turn(action)
            except Exception as exc:  # noqa: BLE001 - the last line of "every step returns an observation"
                _log.exception("%s: _run_turn raised on a model action; returning an error observation", self.env_id)
                result = TurnResult(f"Error: the environment failed on this turn ({type(exc).__name__}: "
                                    f"{str(exc)[:300]}).", info={"env_error": type(exc).__name__})
            terminated = bool(result.terminated)
            truncated = not terminated and self._turn >= self.max_turns
            observation = scrub_surrogates(str(result.observation))
            if truncated and not observation:
                observation = f"Turn limit ({self.max_turns}) reached."
            if observation:
                self._messages.append({"role": result.role, "content": observation})
            self._done = terminated or truncated
            return observation, float(result.reward), terminated, truncated, self._info(result.info)

    def get_wrapper_attr(self, name: str) -> Any:
        """Gymnasium's ``get_wrapper_attr``; ``snapshot`` / ``restore`` reached through a wrapper are refused.

        ``TimeLimit(env, 5).get_wrapper_attr("snapshot")`` on a bare env (not made by ``gym.make``,
        so without its :class:`~trace_envs.wrappers.BranchingWrapper`) would branch the env and leave the
        wrappers' state behind; it raises :class:`SnapshotError` naming
        :func:`trace_envs.wrappers.snapshot` / :func:`~trace_envs.wrappers.restore` instead.
        """
        if name in ("snapshot", "restore"):
            caller = sys._getframe(1)
            wrapper = caller.f_locals.get("self") if caller.f_code.co_name == "get_wrapper_attr" else None
            if isinstance(wrapper, gym.Wrapper) and wrapper.__dict__.get("env") is self:
                raise SnapshotError(
                    f"{name}() reached through {type(wrapper).__name__} would leave the wrappers' state behind (a "
                    f"half {name}): use trace_envs.wrappers.snapshot(env) / trace_envs.wrappers.restore(env, snap) "
                    f"on the outermost wrapper, or make the env with gym.make (its BranchingWrapper branches the "
                    f"whole chain)"
                )
        return getattr(self, name)

    def snapshot(self) -> Snapshot:
        """The state after the last finished turn, as an immutable save point."""
        with self._lock:
            if self._task is None:
                raise ResetNeededError("nothing to snapshot: call reset() first")
            payload = self._capture_state()  # first: it may note in the info how it was taken
            snap = Snapshot(
                env_id=self.env_id,
                config_key=self.config_key,
                task=self._task,
                turn=self._turn,
                done=self._done,
                messages=_freeze_messages(self._messages),
                rng_state=copy.deepcopy(self.np_random.bit_generator.state),
                episode_info=tuple(copy.deepcopy(self._episode_info).items()),
                payload=payload,
            )
            self._snapshots.add(snap)
            return snap

    def restore(self, snapshot: Snapshot) -> None:
        """Put the env exactly where ``snapshot`` was taken.

        Raises:
            ForeignSnapshotError: the snapshot is of another env id or configuration, or
                another task than the current episode's (``reset(options={"task_id": ...})`` first).
            SnapshotError: the snapshot was released.
        """
        self._check_restorable(snapshot)
        with self._lock:
            previous = self._episode_info
            self._episode_info = dict(copy.deepcopy(snapshot.episode_info))
            try:  # what ``_restore_state`` notes in the info (e.g. that it replayed) stays
                self._restore_state(snapshot.payload)
            except BaseException:
                self._episode_info = previous
                raise
            self._turn = snapshot.turn
            self._done = snapshot.done
            self._messages = _thaw_messages(snapshot.messages)
            self.np_random.bit_generator.state = copy.deepcopy(dict(snapshot.rng_state))

    def render(self) -> str | None:
        if self.render_mode != "ansi":
            return None
        return "\n".join(f"[{m['role']}] {m['content']}" for m in self._messages)

    def close(self) -> None:
        """Free the env's resources and those of every snapshot it took."""
        for snap in list(self._snapshots):
            snap.release()
        super().close()

    # ------------------------------------------------------------ subclassing
    def make_task(self, spec: Mapping[str, Any]) -> Task:
        """Build a Task from a user's dict (``options={"task": ...}``). Subclasses validate their fields."""
        if not isinstance(spec, Mapping) or not isinstance(spec.get("prompt"), str):
            raise InvalidTaskError("a task needs at least a 'prompt' string")
        task_id = str(spec.get("task_id", "user-" + hashlib.sha256(spec["prompt"].encode()).hexdigest()[:10]))
        data = {k: v for k, v in spec.items() if k not in ("task_id", "prompt")}
        return Task(task_id=task_id, prompt=spec["prompt"], data=data)

    def _start_episode(self, task: Task) -> str:
        """Set up tool state for ``task``; return the opening user message."""
        return task.prompt

    def _opening_observation(self, task: Task, seed: int | None) -> str | None:
        """What ``_start_episode(task)`` returns after ``reset(seed=seed)``, if known without running it; else None.

        Override only when the opening message depends on nothing but the task (and the seed),
        and ``system_prompt`` on nothing an episode changes (:meth:`opening_messages`).
        """
        return None

    def _run_turn(self, action: str) -> TurnResult:
        """Act on one turn of model text. Must not raise on malformed text."""
        raise NotImplementedError

    def _capture_state(self) -> Any:
        """A frozen copy of the subclass's own state (never mutated afterwards)."""
        return None

    def _restore_state(self, payload: Any) -> None:
        """Load a payload made by ``_capture_state`` (it must stay reusable)."""

    def _info(self, extra: Mapping[str, Any]) -> dict[str, Any]:
        info = {"task_id": self.task.task_id, "turn": self._turn}
        info.update(self._episode_info)
        info.update(extra)
        return info

    def _check_restorable(self, snapshot: Any) -> None:
        if not isinstance(snapshot, Snapshot):
            raise SnapshotError(f"restore() takes a Snapshot, got {type(snapshot).__name__}")
        if snapshot.env_id != self.env_id:
            raise ForeignSnapshotError(f"snapshot of {snapshot.env_id!r} cannot be restored into {self.env_id!r}")
        if snapshot.config_key != self.config_key:
            raise ForeignSnapshotError(
                f"snapshot was taken with configuration {snapshot.config_key!r}, this env has {self.config_key!r}"
            )
        if self._task is None or snapshot.task.fingerprint != self._task.fingerprint:
            current = None if self._task is None else self._task.task_id
            raise ForeignSnapshotError(
                f"snapshot is of task {snapshot.task_id!r} but the env holds task {current!r}: "
                f"call reset(options={{'task_id': {snapshot.task_id!r}}}) before restoring it"
            )
        if snapshot.released:
            raise SnapshotError(f"{snapshot!r} was released (dropped, or its env was closed)")
