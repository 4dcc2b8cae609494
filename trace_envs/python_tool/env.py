"""PythonMath-v0: a math agent with a persistent, forkable Python interpreter."""

from __future__ import annotations

import hashlib
import json
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trace_envs.actions import parse_action
from trace_envs.core import BranchableEnv, Snapshot, Task, TaskSet, TurnResult
from trace_envs.errors import InvalidTaskError, SandboxError, SnapshotError, SnapshotLimitError
from trace_envs.python_tool.sandbox import FrozenInterpreter, Sandbox, SandboxConfig

__all__ = ["PythonMathEnv", "PythonState"]

SYSTEM_PROMPT = (
    "You solve math problems. You can run Python in a persistent interpreter: variables, imports and files "
    "stay from one call to the next. To run code, reply with\n"
    '<tool_call>{"name": "python", "arguments": {"code": "..."}}</tool_call>\n'
    "and you will see what it prints (the value of a final expression is shown too). "
    "When you know the result, reply with <answer>\\boxed{...}</answer>."
)

PYTHON_TOOL = {
    "type": "function",
    "function": {
        "name": "python",
        "description": "Run Python code in a persistent sandboxed interpreter and return its output.",
        "parameters": {
            "type": "object",
            "properties": {"code": {"type": "string", "description": "Python source to execute."}},
            "required": ["code"],
        },
    },
}


@dataclass(frozen=True, eq=False)
class PythonState:
    """The payload of a PythonMath snapshot.

    Attributes:
        frozen: a frozen copy of the interpreter process (exact memory and work-dir files), or None
            when the interpreter could not be copied (fds exhausted, a thread holding the import
            lock, the work-dir quota full): then restoring replays ``cells``.
        cells: every cell executed in this episode up to the snapshot (the replay log).
        seed: the seed ``random`` and numpy were given at the start of the episode.
    """

    frozen: FrozenInterpreter | None
    cells: tuple[str, ...]
    seed: int
    _let_go: list[bool] = field(default_factory=lambda: [False], repr=False)

    @property
    def released(self) -> bool:
        return self._let_go[0] or (self.frozen is not None and self.frozen.released)

    def release(self) -> None:
        self._let_go[0] = True
        if self.frozen is not None:
            self.frozen.release()

    def digest(self) -> str:
        return hashlib.sha256(repr((self.cells, self.seed)).encode()).hexdigest()


class PythonMathEnv(BranchableEnv):
    """Math problems solved with a persistent Python interpreter.

    **Description.** Each episode is one problem. The agent may run Python
    code, any number of cells over several turns, and then answers.

    **Tools.** ``python(code)``: runs ``code`` in a persistent interpreter in
    its own sandbox process (see :mod:`trace_envs.python_tool.sandbox` for the
    isolation layers; ``info["isolation"]`` lists the active ones). Variables,
    imports and files in the private work directory persist across turns.

    **Action format.** Qwen3/Hermes tool calls
    ``<tool_call>{"name": "python", "arguments": {"code": "..."}}</tool_call>``
    (up to ``max_calls_per_turn`` per turn, run in order), or a final
    ``<answer>...</answer>``, where ``\\boxed{...}`` inside is accepted.
    Text in ``<think>`` is ignored.

    **Observation.** The reset observation is the problem. A tool turn's
    observation is the cells' output (stdout, stderr, tracebacks, the repr
    of a final expression), capped at ``SandboxConfig.output_chars`` per cell
    with a note of what was cut. Malformed turns, unknown tools, time-outs,
    memory errors and a dead interpreter give an observation saying what went
    wrong; nothing raises. A killed interpreter (or one that broke the control
    protocol) is rebuilt from the last save point and the observation says so;
    if even that fails (a replayed cell crashes, the pristine interpreter is
    gone), the sandbox is restarted and the state rebuilt by replay, or, as a last
    resort, the interpreter starts fresh and the observation says the state was lost.
    A snapshot that cannot copy the interpreter (or its work dir: a quota, its branch's share of the
    snapshot store, ``snapshot_max_depth``, ``snapshot_max_entries``) holds the replay log only;
    ``info["replay_only_snapshots"]`` counts those and ``info["replay_only_reason"]`` says why; a
    cell that leaves the work dir past either cap ends its observation with an error line saying
    so; a restore that replayed sets
    ``info["restored_by_replay"]``. A snapshot beyond the env's memory budget raises
    :class:`~trace_envs.errors.SnapshotLimitError` instead.

    **Reward.** 1.0 when the answer equals the task's answer (``grading``: by default
    math-verify as verl's reward uses it, e.g. ``\\$5`` for ``5`` and ``0.333333`` for
    ``\\frac{1}{3}``; ``"strict"`` compares plain numbers exactly), else 0.0; tool turns give 0.

    **Episode end.** ``terminated`` at an answer; ``truncated`` after ``max_turns`` turns.

    **Snapshot contents.** Transcript, turn counter, env RNG, the replay log of
    cells and the episode seed, and a frozen ``fork`` of the interpreter:
    restore cost does not depend on history. ``export_snapshot`` /
    ``import_snapshot`` move a snapshot between processes as its replay log;
    replay reproduces the interpreter exactly only for deterministic code
    (``random`` and numpy's global RNG are seeded per episode and
    ``PYTHONHASHSEED=0``; time, pids, ``id()`` and the OS are not replayed).

    **Arguments.**
        tasks: "train" or "test" (the built-in generated problems), a TaskSet, or a
            path to a DeepScaleR-style JSON/JSONL/Parquet file.
        max_turns: turns per episode.
        max_calls_per_turn: tool calls allowed in one turn.
        sandbox: limits and isolation (:class:`SandboxConfig`).
        grading: "math-verify" (default: verl's math-verify semantics, decimals to 6 places) or
            "strict" (plain numbers as exact rationals); see :mod:`trace_envs.python_tool.grading`.
        render_mode: None or "ansi".
    """

    env_id = "trace_envs/PythonMath-v0"

    @classmethod
    def load_tasks(cls, tasks: str | TaskSet) -> TaskSet:
        """The task set ``tasks=`` names, read and checked as the constructor reads it, with no sandbox started
        (``trace-gym train --preflight`` validates every row of a task file through it)."""
        return _resolve_tasks(tasks)

    def __init__(
        self,
        *,
        tasks: str | TaskSet = "train",
        max_turns: int = 6,
        max_calls_per_turn: int = 4,
        sandbox: SandboxConfig | None = None,
        grading: str = "math-verify",
        render_mode: str | None = None,
    ) -> None:
        from trace_envs.python_tool.grading import GRADING_MODES

        if grading not in GRADING_MODES:
            raise ValueError(f"grading must be one of {GRADING_MODES}, got {grading!r}")
        super().__init__(tasks=_resolve_tasks(tasks), max_turns=max_turns, render_mode=render_mode)
        self.grading = grading
        self.max_calls_per_turn = max_calls_per_turn
        self.sandbox_config = sandbox or SandboxConfig()
        self._sandbox: Sandbox | None = None
        self._cells: tuple[str, ...] = ()
        self._seed = 0
        # the latest frozen copy on this branch (weak: dropping its snapshot frees it) and its cell count
        self._anchor: tuple[weakref.ref[FrozenInterpreter], int] | None = None

    # ----------------------------------------------------------------- spec
    @property
    def system_prompt(self) -> str:
        return SYSTEM_PROMPT

    @property
    def tools(self) -> list[dict[str, Any]]:
        return [PYTHON_TOOL]

    @property
    def config_key(self) -> str:
        return f"{super().config_key}|calls={self.max_calls_per_turn}|grading={self.grading}|{self.sandbox_config!r}"

    @property
    def isolation(self) -> tuple[str, ...]:
        """The sandbox's active isolation layers (starts the sandbox if needed)."""
        return self._ensure_sandbox().isolation

    def make_task(self, spec: Mapping[str, Any]) -> Task:
        """A user task: ``{"prompt": str, "answer": str, "task_id": optional str}``."""
        if not isinstance(spec, Mapping) or not isinstance(spec.get("prompt"), str) or "answer" not in spec:
            raise InvalidTaskError("a PythonMath task needs a 'prompt' string and an 'answer'")
        return super().make_task({**spec, "answer": str(spec["answer"])})

    def conformance_actions(self) -> list[str]:
        """Actions for the snapshot laws: RNG, variables, and the file operations a branch must keep to
        itself (a symlink made in the branch, truncation through it, a descriptor held across turns,
        a rename, chmod, a dir fd); each observation shows the files' state."""
        def call(code: str) -> str:
            return "<tool_call>" + json.dumps({"name": "python", "arguments": {"code": code}}) + "</tool_call>"

        state = ("sorted((n, open(n).read(), oct(os.lstat(n).st_mode & 0o777)) for n in os.listdir('.') "
                 "if os.path.isfile(n))")
        return [
            call("x = 41; import random, os; held = open('held.txt', 'a+')"),
            call("r = random.random(); open('notes.txt', 'w').write(str(x)); os.symlink('notes.txt', 'link'); r"),
            call(f"x += 1; open('link', 'a').write('+'); held.write('h'); held.flush(); "
                 f"print(x, random.randint(0, 10**9), {state})"),
            call(f"os.truncate('link', 1); os.rename('held.txt', 'kept.txt'); os.chmod('link', 0o600); {state}"),
            call("d = os.open('.', os.O_RDONLY); f = os.open('notes.txt', os.O_WRONLY | os.O_APPEND, dir_fd=d); "
                 f"os.write(f, b'!'); os.close(f); os.close(d); held.write('k'); held.flush(); y = x * 2; (y, {state})"),
            f"<answer>\\boxed{{{self.task.data['answer']}}}</answer>",
        ]

    # ------------------------------------------------------------- episodes
    def _ensure_sandbox(self) -> Sandbox:
        if self._sandbox is None:
            self._sandbox = Sandbox(self.sandbox_config)
        return self._sandbox

    def _opening_observation(self, task: Task, seed: int | None) -> str | None:
        return task.prompt if "answer" in task.data else None  # the seed only seeds the sandbox

    def _start_episode(self, task: Task) -> str:
        if "answer" not in task.data:
            raise InvalidTaskError(f"task {task.task_id!r} has no 'answer'")
        sandbox = self._ensure_sandbox()
        self._seed = int(self.np_random.integers(2**31))
        self._cells = ()
        try:
            self._fresh(sandbox)
        except SandboxError:  # the pristine interpreter is gone (or broken): a new process tree
            sandbox.restart()
            self._fresh(sandbox)
        self._episode_info = {"cells": 0, "sandbox_restarts": 0}
        return task.prompt

    def _fresh(self, sandbox: Sandbox) -> None:
        """A live interpreter copied from the pristine one, seeded with this episode's seed."""
        sandbox.thaw(sandbox.base)
        sandbox.seed(self._seed)
        self._anchor = (weakref.ref(sandbox.base), 0)

    def _run_turn(self, action: str) -> TurnResult:
        parsed = parse_action(action, max_tool_calls=self.max_calls_per_turn)
        if not parsed.ok:
            return TurnResult(parsed.error_message())
        if parsed.answer is not None:
            from trace_envs.python_tool.grading import grade_answer

            correct = grade_answer(parsed.answer, str(self.task.data["answer"]), mode=self.grading)
            text = "Correct." if correct else "Incorrect."
            return TurnResult(text, reward=float(correct), terminated=True, role="user",
                              info={"correct": correct, "answer": parsed.answer})
        outputs = []
        for call in parsed.tool_calls:
            code = call.arguments.get("code")
            if call.name != "python":
                outputs.append(f"Error: unknown tool {call.name!r}; the only tool is 'python'.")
            elif not isinstance(code, str) or not code.strip():
                outputs.append("Error: the python tool needs a non-empty 'code' string argument.")
            else:
                outputs.append(self._run_cell(code))
        return TurnResult("\n".join(outputs))

    def _run_cell(self, code: str) -> str:
        sandbox = self._ensure_sandbox()
        if sandbox.live_pid is None:  # lost when a snapshot's fork broke the interpreter
            self._rebuild()
        try:
            result = sandbox.run(code)
        except SandboxError as exc:
            note = self._rebuild()
            self._episode_info["sandbox_restarts"] = self._episode_info.get("sandbox_restarts", 0) + 1
            return f"Error: {exc}. {note}; this cell's effects are lost."
        self._cells += (code,)
        self._episode_info["cells"] = len(self._cells)
        text = result.output if result.output else "(no output)"
        if result.truncated_chars:
            text += f"\n[output truncated: {result.truncated_chars} more characters]"
        if result.tree_limit:
            text += f"\nError: {result.tree_limit}."
        return text

    def _rebuild(self) -> str:
        """A new live interpreter in the state after ``self._cells``; never raises for sandbox faults.

        Tried in order: the latest save point + the cells after it; the pristine interpreter + every
        cell; a restarted sandbox + every cell; a fresh interpreter with the state dropped (the log is
        cleared so later snapshots stay consistent). Returns a sentence for the observation.
        """
        sandbox = self._ensure_sandbox()
        ref, done = self._anchor if self._anchor is not None else (weakref.ref(sandbox.base), 0)
        anchor = ref()
        plans: list[tuple[FrozenInterpreter | None, int]] = []
        if anchor is not None and anchor.usable and anchor.owner() is sandbox and anchor is not sandbox.base:
            plans.append((anchor, done))
        plans += [(None, 0), (None, -1)]  # -1: restart the sandbox first
        for frozen, start in plans:
            try:
                if start < 0:
                    sandbox.restart()
                    start = 0
                if frozen is None:
                    self._fresh(sandbox)
                else:
                    sandbox.thaw(frozen)
                    self._anchor = (weakref.ref(frozen), start)
                for code in self._cells[start:]:
                    sandbox.run(code)
                replayed = len(self._cells) - start
                where = "the last save point" if frozen is not None else "the start of the episode"
                return f"The interpreter was restarted from {where} ({replayed} earlier cell(s) re-run)"
            except SandboxError:
                continue
        lost = len(self._cells)
        self._cells = ()
        try:
            self._fresh(sandbox)
        except SandboxError:
            sandbox.restart()
            self._fresh(sandbox)
        return f"The interpreter could not be rebuilt and was started fresh ({lost} earlier cell(s) lost)"

    # ------------------------------------------------------------ snapshots
    def _capture_state(self) -> PythonState:
        sandbox = self._ensure_sandbox()
        try:
            if sandbox.live_pid is None:
                self._rebuild()
            frozen: FrozenInterpreter | None = sandbox.freeze()
        except SnapshotLimitError:
            raise
        except SandboxError as exc:  # fds exhausted, the import lock held, a quota or cap, a broken copy
            frozen = None
            info = self._episode_info
            info["replay_only_snapshots"] = info.get("replay_only_snapshots", 0) + 1
            info["replay_only_reason"] = str(exc)[:300]
        if frozen is not None:
            self._anchor = (weakref.ref(frozen), len(self._cells))
        return PythonState(frozen=frozen, cells=self._cells, seed=self._seed)

    def _restore_state(self, payload: PythonState) -> None:
        sandbox = self._ensure_sandbox()
        self._cells, self._seed = payload.cells, payload.seed
        frozen = payload.frozen
        if frozen is not None and frozen.owner() is sandbox:
            try:
                sandbox.thaw(frozen)
                self._anchor = (weakref.ref(frozen), len(payload.cells))
                return
            except SandboxError:
                pass
        self._anchor = None  # another env's snapshot, a replay-only one, or its process was killed: replay
        self._rebuild()
        self._episode_info["restored_by_replay"] = True

    def export_snapshot(self, snapshot: Snapshot) -> dict[str, Any]:
        """A JSON-serialisable form of ``snapshot`` (its replay log); see the class docstring for limits."""
        if not isinstance(snapshot.payload, PythonState):
            raise SnapshotError("not a PythonMath snapshot")
        return {
            "env_id": snapshot.env_id, "config_key": snapshot.config_key,
            "task": {"task_id": snapshot.task.task_id, "prompt": snapshot.task.prompt, "data": dict(snapshot.task.data)},
            "turn": snapshot.turn, "done": snapshot.done, "messages": [dict(m) for m in snapshot.messages],
            "rng_state": snapshot.rng_state, "episode_info": dict(snapshot.episode_info),
            "cells": list(snapshot.payload.cells), "seed": snapshot.payload.seed,
        }

    def import_snapshot(self, data: Mapping[str, Any]) -> Snapshot:
        """Rebuild a snapshot from ``export_snapshot`` output by replaying its cells in this env's sandbox."""
        try:
            task = Task(task_id=data["task"]["task_id"], prompt=data["task"]["prompt"], data=data["task"]["data"])
            cells, seed = tuple(str(c) for c in data["cells"]), int(data["seed"])
            sandbox = self._ensure_sandbox()
            previous_live = sandbox.live_pid is not None
            saved = self._capture_state() if previous_live and self._task is not None else None
            sandbox.thaw(sandbox.base)
            sandbox.seed(seed)
            for code in cells:
                sandbox.run(code)
            frozen = sandbox.freeze()
            if saved is not None:
                sandbox.thaw(saved.frozen)
                self._anchor = (weakref.ref(saved.frozen), len(saved.cells))
            snap = Snapshot(
                env_id=data["env_id"], config_key=data["config_key"], task=task, turn=int(data["turn"]),
                done=bool(data["done"]), messages=tuple(tuple(m.items()) for m in data["messages"]),
                rng_state=data["rng_state"], episode_info=tuple(dict(data["episode_info"]).items()),
                payload=PythonState(frozen=frozen, cells=cells, seed=seed),
            )
        except (KeyError, TypeError, ValueError, AttributeError, SandboxError) as exc:
            raise SnapshotError(f"not an exported PythonMath snapshot: {exc}") from exc
        self._snapshots.add(snap)
        return snap

    def close(self) -> None:
        super().close()
        if self._sandbox is not None:
            self._sandbox.close()
            self._sandbox = None

    def _info(self, extra: Mapping[str, Any]) -> dict[str, Any]:
        info = super()._info(extra)
        if self._sandbox is not None:
            info["isolation"] = self._sandbox.isolation
        return info


def _resolve_tasks(tasks: str | TaskSet) -> TaskSet:
    if isinstance(tasks, TaskSet):
        return tasks
    if tasks in ("train", "test"):
        from trace_envs.tasks.math_gen import default_math_tasks

        return default_math_tasks(tasks)
    if isinstance(tasks, str) and Path(tasks).exists():
        from trace_envs.tasks.deepscaler import load_deepscaler

        return load_deepscaler(tasks)
    raise InvalidTaskError(f"tasks must be 'train', 'test', a TaskSet or an existing file path, got {tasks!r}")
