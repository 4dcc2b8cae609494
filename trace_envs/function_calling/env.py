"""BFCL-v0: BFCL v4 multi-turn function calling on bfcl-eval's executable backends."""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from trace_envs.actions import (
    PythonCall,
    format_tool_call,
    looks_like_call_list,
    parse_action,
    parse_call_list,
    strip_thinking,
)
from trace_envs.core import ALL_SPLITS, BranchableEnv, Task, TaskSet, TurnResult
from trace_envs.errors import EnvSetupError, InvalidTaskError
from trace_envs.function_calling.backends import CallOutcome
from trace_envs.function_calling.remote import (
    CALL_TIMEOUT_S,
    WORKER_COMMAND,
    BackendFailure,
    BackendState,
    RemoteBackends,
)
from trace_envs.function_calling.schemas import function_doc_to_tool
from trace_envs.function_calling.scoring import GroundTruth, TurnCheck, check_turn
from trace_envs.tasks.bfcl import (
    BFCL_SPLITS,
    bfcl_split,
    entry_to_task,
    load_bfcl_tasks,
    load_function_docs,
    normalize_category,
)
from trace_envs.tool_schemas import TOOL_DETAILS, tool_schema
from trace_envs.validation import check_arguments

__all__ = ["BFCLEnv", "SYSTEM_PROMPT", "ADDED_FUNCTIONS_PROMPT", "MAX_STEPS_PER_TURN"]

#: BFCL's MAXIMUM_STEP_LIMIT: more steps than this in one user turn force-quits the episode (a failure).
MAX_STEPS_PER_TURN = 20

#: BFCL's message for the turn that reveals held-back functions (DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_FC).
ADDED_FUNCTIONS_PROMPT = "I have updated some more functions you can choose from. What about now?"

SYSTEM_PROMPT = (
    "You are an expert in composing functions. You are given a question and a set of possible functions. "
    "Based on the question, you will need to make one or more function/tool calls to achieve the purpose. "
    "If none of the functions can be used, point it out. If the given question lacks the parameters required "
    "by the function, also point it out.\n\n"
    "Call functions with one <tool_call>{\"name\": ..., \"arguments\": {...}}</tool_call> block per call, "
    "or with a Python-style list [func_name1(param=value), func_name2(param=value)]. Arguments must be "
    "literal values. You will see the results of your calls.\n\n"
    "At each turn, you should try your best to complete the tasks requested by the user within the current "
    "turn. Continue to output functions to call until you have fulfilled the user's request to the best of "
    "your ability. Once you have no more functions to call, reply without any function call: the system will "
    "consider the current turn complete and proceed to the next turn or task."
)

_TRUTH_CACHE_SIZE = 32


@dataclass(frozen=True, eq=False)
class _BFCLState:
    """Snapshot payload: the backend state (opaque bytes the worker froze, or its recipe) plus the turn
    bookkeeping; immutable."""

    backends: BackendState
    user_turn: int
    steps_in_turn: int
    calls_in_turn: int
    results: tuple[str, ...]
    checks: tuple[TurnCheck, ...]

    def digest(self) -> str:
        rest = repr((self.user_turn, self.steps_in_turn, self.calls_in_turn, self.results, self.checks))
        return hashlib.sha256(self.backends.digest().encode() + rest.encode()).hexdigest()


class BFCLEnv(BranchableEnv):
    """BFCL v4 multi-turn function calling (``trace_envs/BFCL-v0``).

    **Description.** One episode is one BFCL multi-turn entry of the chosen
    category (200 each). The user's questions arrive one at a time. Within a
    user turn the agent makes function calls and sees their results; a step
    without any call ends the user turn and the next question arrives (the end
    of the last user turn ends the episode). The functions run on bfcl-eval's
    own executable backends (file system, messaging, posting, tickets, trading,
    travel booking, vehicle control, math), imported from the installed
    package (``pip install --no-deps bfcl-eval mpmath``); each env owns its instances.

    **Tools.** ``env.tools``: the involved classes' function docs as JSON
    schemas in OpenAI function format (BFCL's ``dict`` → ``object``, ``float``
    → ``number`` ...). In ``multi_turn_miss_func`` the held-back functions are
    absent (and refused if called) until the turn the data names in
    ``missed_function``; that turn's user message lists the new functions'
    schemas followed by BFCL's "I have updated some more functions ..." and
    ``info["new_tools"]`` names them, so an agent re-renders its tools.
    With ``tool_detail="compact"`` the schemas (and the revealed ones) carry
    no ``description`` / ``default`` text (:func:`~trace_envs.function_calling.schemas.compact_tool`:
    names, parameter names, types, enums, required); with ``"names"`` only the
    function names -- for small models whose context the descriptions would
    fill (multi_turn_base: 14.8k characters of schemas per entry on average,
    5.4k compact, 0.7k names); calls and grading are the same.
    As in BFCL's executor, a held-back function called before its reveal
    still runs (one ground truth, ``multi_turn_miss_func_49``, relies on it);
    ``refuse_held_back=True`` refuses such calls instead.

    **Action format.** One step is the model's text for one assistant turn
    (``<think>`` spans ignored), either

    * Qwen3/Hermes blocks, several per step:
      ``<tool_call>{"name": "cd", "arguments": {"folder": "document"}}</tool_call>``, or
    * BFCL's Python-style list: ``[cd(folder='document'), mkdir(dir_name='temp')]``
      (a single call without brackets and a Markdown code fence are accepted).

    Calls are parsed with ``json`` / ``ast`` (literal arguments only) and
    dispatched to the backend methods directly, never evaluated. A step with no
    call (plain text, or ``[]``) ends the user turn. A malformed step (broken
    JSON, non-literal arguments, ``__import__(...)``, attribute access,
    ``_private`` names) runs nothing and its observation says what was wrong.

    **Observation.** The opening observation is the first user question. After
    a step with calls: the call results (role "tool"), as BFCL renders them
    (a ``str`` as is, a ``dict`` as JSON, exceptions as "Error during
    execution: ..."); with several calls, one ``[i] name: result`` line each.
    Unknown functions and bad arguments give "Error: ..." results. After a
    turn-ending step: the next user question (role "user"); after the last one:
    the empty string. ``info["calls"]`` holds each call's name, arguments and
    result; ``info["user_turn"]`` the current user turn. A step with calls also has
    ``info["backend_error"]`` (True when no backend worker could be started to run them: their
    results are errors) and ``info["backend"]`` naming the worker; a worker that cannot load a
    task's scenario at ``reset`` raises :class:`~trace_envs.errors.EnvSetupError`.

    **Reward.** 0 until the episode ends; then 1 if BFCL's multi-turn checker
    would accept the conversation, else 0: for every user turn with a
    non-empty ground truth, the model made a call in the turn, the public
    state (attributes not starting with "_") of every involved backend equals
    the state after executing the ground truth of turns 0..t from the same
    start, and the ground-truth results of the turn are among all the model's
    results so far (see :mod:`trace_envs.function_calling.scoring`).
    ``info["turn_checks"]`` reports each turn (also after each turn:
    ``info["turn_check"]``); ``info["valid"]`` the verdict.

    **Episode end.** ``terminated`` when the last user turn ends, or when a user
    turn exceeds ``max_steps_per_turn`` steps (BFCL's force quit: reward 0,
    ``info["force_quit"]``). ``truncated`` after ``max_turns`` steps in all.

    **Isolation.** The backend instances live in a worker process of this env
    (:class:`~trace_envs.function_calling.remote.RemoteBackends`), kept warm across
    steps and episodes; a step's calls go there in one request. Each call has a
    wall-clock deadline (``backend_timeout_s``) and the worker a memory cap: a call
    past them (``du()`` on a directory DAG built with ``cp``, say) gets the result
    "Error during execution: the call exceeded its 2 s limit", has no effect (the
    worker is killed and rebuilt from the last frozen state and the calls since) and
    the episode goes on. A turn whose state cannot be compared with the ground truth
    within the limits fails its state check. Nothing the worker sends is unpickled
    by the host.

    **Snapshot contents.** The backend instances as the worker froze them (a
    pickle that keeps private attributes, the file system's current directory
    and the backends' private ``random.Random`` generators; opaque bytes to the
    host), or, for a state too deep or too slow to freeze, its recipe (the last
    frozen state and the calls run since, replayed on restore); the user-turn
    index, the step and call counts of the current user turn, every call result
    so far and the finished turns' checks; plus the transcript and env RNG (base
    class). Restoring thaws a fresh copy in the worker, so a snapshot is reusable.

    **Arguments.**
        category: "multi_turn_base" (default), "multi_turn_long_context",
            "multi_turn_miss_func" or "multi_turn_miss_param" ("base" etc. also accepted).
        tasks: a split name of the category: "train" (the default; None means it too) or "test"
            (:func:`trace_envs.tasks.bfcl.bfcl_split`, 150 / 50 of its 200 entries), "all" (every entry),
            or a TaskSet (tasks made by :func:`trace_envs.tasks.bfcl.entry_to_task`).
        tool_detail: "full" (default: BFCL's docs), "compact" (no description text) or "names" (see Tools).
        task_ids: keep only these entries of ``tasks`` (in this order; an unknown id raises TaskNotFoundError naming it),
            e.g. ``--env-kwargs '{"tasks": "train", "task_ids": [...]}'`` from the command line.
        max_steps_per_turn: BFCL's per-user-turn step limit (20).
        refuse_held_back: refuse calls to miss_func's held-back functions before their reveal
            (default False: run them, as BFCL does).
        max_turns: steps per episode before truncation (default 160).
        render_mode, max_action_chars, max_observation_chars: as :class:`BranchableEnv`;
            observations longer than ``max_observation_chars`` are cut (the checks use the full results).
        backend_timeout_s: wall-clock deadline of one backend call (default 2 s; state requests get 5x).

    **Task set.** By default the env serves the category's train split only: a held-out (test)
    entry is played only by an env made with ``tasks="test"`` (or ``"all"``).

    ``reset(options={"task_id": "multi_turn_base_0"})`` picks an entry of the env's task set (the id
    of an entry of the other split raises ``TaskNotFoundError`` naming the split that holds it);
    ``options={"task": {...}}`` runs a BFCL-format entry of the caller's
    (``question``, ``initial_config``, ``involved_classes``, ``ground_truth``,
    optional ``id``, ``missed_function``, ``long_context``).
    """

    env_id = "trace_envs/BFCL-v0"
    splits = BFCL_SPLITS
    same_tools = False  # the functions differ per entry, and multi_turn_miss_func reveals more mid-episode
    multi_user_turn = True

    @classmethod
    def split_kwargs(cls, split: str, kwargs: Mapping[str, Any]) -> dict[str, Any]:
        """"train" / "test": the fixed partition of the category's entries
        (:func:`trace_envs.tasks.bfcl.bfcl_split`, resolved by the constructor for the category in
        ``kwargs``); "all" / "default": the whole category."""
        if split in ALL_SPLITS:
            return {**kwargs, "tasks": "all"}
        if split not in BFCL_SPLITS:
            raise InvalidTaskError(f"BFCL-v0 has no split {split!r}: use train, test or all "
                                   f"(set the category with env_kwargs.category)")
        return {**kwargs, "tasks": split}

    def __init__(
        self,
        *,
        category: str = "multi_turn_base",
        tasks: TaskSet | str | None = "train",
        tool_detail: str = "full",
        task_ids: Sequence[str] | None = None,
        max_steps_per_turn: int = MAX_STEPS_PER_TURN,
        refuse_held_back: bool = False,
        max_turns: int = 160,
        render_mode: str | None = None,
        max_action_chars: int = 200_000,
        max_observation_chars: int = 200_000,
        backend_timeout_s: float = CALL_TIMEOUT_S,
    ) -> None:
        check_arguments(self.env_id, BFCLEnv.__init__, locals())
        self.category = normalize_category(category)
        if max_steps_per_turn < 1:
            raise ValueError(f"max_steps_per_turn must be >= 1, got {max_steps_per_turn}")
        if tool_detail not in TOOL_DETAILS:
            raise ValueError(f"tool_detail must be one of {', '.join(TOOL_DETAILS)}, got {tool_detail!r}")
        if tasks is None:
            tasks = "train"
        if isinstance(tasks, str):
            if tasks not in (*BFCL_SPLITS, "all"):
                raise ValueError(f"tasks={tasks!r}: give a TaskSet or a split name ({', '.join(BFCL_SPLITS)}, all)")
            tasks = bfcl_split(self.category, tasks) if tasks in BFCL_SPLITS else load_bfcl_tasks(self.category)
        self.tool_detail = tool_detail
        if task_ids is not None:
            if isinstance(task_ids, str) or not task_ids:
                raise ValueError("task_ids must be a non-empty list of entry ids")
            tasks = TaskSet([tasks[str(t)] for t in dict.fromkeys(task_ids)],
                            name=f"{tasks.name}/ids-{hashlib.sha256(' '.join(map(str, task_ids)).encode()).hexdigest()[:8]}")
        super().__init__(
            tasks=tasks,
            max_turns=max_turns,
            render_mode=render_mode,
            max_action_chars=max_action_chars,
            max_observation_chars=max_observation_chars,
        )
        self.max_steps_per_turn = max_steps_per_turn
        self.refuse_held_back = refuse_held_back
        self._backends = RemoteBackends(timeout_s=backend_timeout_s)
        self._started = False
        self._user_turn = 0
        self._steps_in_turn = 0
        self._calls_in_turn = 0
        self._results: list[str] = []
        self._checks: list[TurnCheck] = []
        self._truth_cache: OrderedDict[str, GroundTruth] = OrderedDict()
        # derived from the task at reset (not state: a snapshot only restores into the same task)
        self._doc_names: frozenset[str] = frozenset()
        self._reveals: dict[int, list[str]] = {}

    # ----------------------------------------------------------------- public
    @property
    def system_prompt(self) -> str:
        return SYSTEM_PROMPT

    @property
    def config_key(self) -> str:
        return (f"{super().config_key}|category={self.category}|max_steps_per_turn={self.max_steps_per_turn}"
                f"|refuse_held_back={self.refuse_held_back}|tool_detail={self.tool_detail}")

    @property
    def tools(self) -> list[dict[str, Any]]:
        """JSON schemas (OpenAI function format) of the functions available now; [] before reset."""
        if self._task is None:
            return []
        return [self._tool(doc) for doc in self._available_docs()]

    @property
    def user_turn(self) -> int:
        """Index of the current user turn (equals the number of user turns once the episode is over)."""
        return self._user_turn

    @property
    def num_user_turns(self) -> int:
        return len(self.task.data["questions"])

    def ground_truth(self) -> GroundTruth:
        """The current task's ground truth, executed (calls, results and states per user turn)."""
        return self._ground_truth(self.task)

    def ground_truth_actions(self, *, style: str = "python", end_text: str = "Done.") -> list[str]:
        """Steps that replay the current task's ground truth: per user turn, one step with its calls
        (omitted when the turn's ground truth is empty), then ``end_text`` to end the turn.

        ``style`` is "python" (``[f(a=1)]``) or "json" (``<tool_call>`` blocks).
        """
        actions: list[str] = []
        for turn in self.ground_truth().turns:
            if turn.calls:
                actions.append(render_calls(self._keywords(turn.calls) if style == "json" else turn.calls,
                                            style=style))
            actions.append(end_text)
        return actions

    def keyword_calls(self, calls: Sequence[PythonCall]) -> list[PythonCall]:
        """``calls`` with positional arguments turned into keywords (as the JSON call format needs them),
        by the current task's backends' signatures; call after ``reset()``."""
        return self._keywords(calls)

    def conformance_actions(self) -> list[str]:
        """Steps for :func:`~trace_envs.check_branchable_env` on the current task: a state-changing probe
        call, the ground truth (turns alternating between both call formats), then a second, different
        probe before the last user turn ends. The probes (``touch`` a file, set the climate control,
        fund the account, ...) are chosen among calls that really change this entry's backend state,
        so both the prefix before the snapshot and the branches after it mutate state."""
        turns = self.ground_truth().turns
        first, second = self._probe(0), self._probe(1)
        actions: list[str] = [render_calls([first])] if first else []
        for index, turn in enumerate(turns):
            if turn.calls:
                style = "python" if index % 2 == 0 else "json"
                actions.append(render_calls(self._keywords(turn.calls) if style == "json" else turn.calls,
                                            style=style))
            if index == len(turns) - 1 and second:
                actions.append(render_calls([second], style="json"))
            actions.append("Done.")
        return actions

    def _probe(self, k: int) -> PythonCall | None:
        """A call that changes the current backend state (tried on throwaway copies in the worker), or None."""
        config = self.task.data["initial_config"]
        twitter = config.get("TwitterAPI", {})
        candidates = [
            PythonCall("touch", (), {"file_name": f"trace_gym_probe_{k}.txt"}),
            PythonCall("adjustClimateControl", (), {"temperature": 17.5 + k, "fanSpeed": 13 + k}),
            PythonCall("fund_account", (), {"amount": 12.5 + k}),
            PythonCall("authenticate_travel", (), {
                "client_id": f"trace{k}", "client_secret": "gym", "refresh_token": "probe", "grant_type": "read_write",
                "user_first_name": "Trace", "user_last_name": "Gym"}),
            PythonCall("authenticate_twitter", (), {"username": twitter.get("username", ""),
                                                    "password": twitter.get("password", "")}),
            PythonCall("post_tweet", (), {"content": f"trace-gym probe {k}"}),
            PythonCall("create_ticket", (), {"title": f"trace-gym probe {k}"}),
            PythonCall("add_contact", (), {"user_name": f"trace_gym_{k}"}),
        ]
        symbols = list(config.get("TradingBot", {}).get("stocks", {})) or ["AAPL", "GOOG", "TSLA", "MSFT", "NVDA"]
        candidates += [PythonCall("add_to_watchlist", (), {"stock": s}) for s in (symbols[::-1] if k else symbols)]
        index = self._backends.probe([(c.name, c.args, c.kwargs) for c in candidates])
        return None if index is None else candidates[index]

    def close(self) -> None:
        """Release the snapshots and stop the backend worker (a later reset starts a new one)."""
        super().close()
        self._backends.close()

    def make_task(self, spec: Mapping[str, Any]) -> Task:
        """A BFCL-format entry (``question``, ``initial_config``, ``involved_classes``, ``ground_truth``,
        optional ``id``, ``missed_function``, ``long_context``) → Task; validated, including its ground truth."""
        if not isinstance(spec, Mapping):
            raise InvalidTaskError("options['task'] must be a mapping in BFCL's entry format")
        entry = dict(spec)
        if "id" not in entry:
            blob = json.dumps(entry, sort_keys=True, default=str).encode()
            entry["id"] = "user-" + hashlib.sha256(blob).hexdigest()[:10]
        task = entry_to_task(entry, str(entry.get("category", self.category)))
        self._ground_truth(task)  # fails early on unknown classes or non-literal ground truth
        return task

    # ------------------------------------------------------------ subclassing
    def _start_episode(self, task: Task) -> str:
        self._ground_truth(task)
        data = task.data
        self._doc_names = frozenset(str(d["name"]) for d in load_function_docs(data["involved_classes"]))
        self._reveals = self._reveal_turns()
        try:
            self._backends.start(data["involved_classes"], data["initial_config"],
                                 long_context=bool(data.get("long_context", False)))
        except BackendFailure as exc:
            raise EnvSetupError(f"BFCL-v0's backend worker ({WORKER_COMMAND}) cannot load task {task.task_id!r}: "
                                f"{exc}. Check that this Python imports bfcl_eval (pip install --no-deps "
                                f"bfcl-eval; pip install 'trace-gym[bfcl]')") from None
        self._started = True
        self._user_turn = 0
        self._steps_in_turn = 0
        self._calls_in_turn = 0
        self._results = []
        self._checks = []
        return self._question(0)

    def _run_turn(self, action: str) -> TurnResult:
        calls, error = self._parse(action)
        if error is not None:
            self._steps_in_turn += 1
            return self._limit_or(TurnResult(error, role="user", info=self._turn_info(parse_error=error)))
        if calls:
            outcomes = self._backends.call_many([(c.name, c.args, c.kwargs) for c in calls],
                                                allowed=self._callable_names())
            self._results.extend(o.result for o in outcomes)
            self._steps_in_turn += 1
            self._calls_in_turn += len(outcomes)
            observation = self._clip(render_outcomes(outcomes))
            info = self._turn_info(calls=[o.as_dict() for o in outcomes], backend_error=self._backends.unavailable,
                                   backend=f"BFCL backend worker ({WORKER_COMMAND})")
            return self._limit_or(TurnResult(observation, role="tool", info=info))
        return self._end_user_turn()

    def _capture_state(self) -> _BFCLState:
        return _BFCLState(
            backends=self._backends.state(),
            user_turn=self._user_turn,
            steps_in_turn=self._steps_in_turn,
            calls_in_turn=self._calls_in_turn,
            results=tuple(self._results),
            checks=tuple(self._checks),
        )

    def _restore_state(self, payload: _BFCLState) -> None:
        self._backends.restore(payload.backends)
        self._user_turn = payload.user_turn
        self._steps_in_turn = payload.steps_in_turn
        self._calls_in_turn = payload.calls_in_turn
        self._results = list(payload.results)
        self._checks = list(payload.checks)

    # -------------------------------------------------------------- internals
    def _ground_truth(self, task: Task) -> GroundTruth:
        key = task.fingerprint
        truth = self._truth_cache.get(key)
        if truth is None:
            truth = GroundTruth.compute(task)
            self._truth_cache[key] = truth
            while len(self._truth_cache) > _TRUTH_CACHE_SIZE:
                self._truth_cache.popitem(last=False)
        else:
            self._truth_cache.move_to_end(key)
        return truth

    def _tool(self, doc: Mapping[str, Any]) -> dict[str, Any]:
        return tool_schema(function_doc_to_tool(doc), self.tool_detail)

    def _keywords(self, calls: Sequence[PythonCall]) -> list[PythonCall]:
        """The calls with positional arguments turned into keywords (for the JSON format)."""
        if not self._started:
            raise RuntimeError("call reset() first")
        return [PythonCall(c.name, (), self._backends.with_keywords(c.name, c.args, c.kwargs)) for c in calls]

    def _callable_names(self) -> frozenset[str]:
        """Names a call may use now: every documented function, or only the revealed ones if refusing."""
        held = self._held_back_now() if self.refuse_held_back else frozenset()
        return self._doc_names - held

    def _held_back_now(self) -> frozenset[str]:
        return frozenset(n for turn, names in self._reveals.items() if turn > self._user_turn for n in names)

    def _reveal_turns(self) -> dict[int, list[str]]:
        return {int(k): list(v) for k, v in self.task.data.get("missed_function", {}).items()}

    def _available_docs(self) -> list[dict[str, Any]]:
        """BFCL's order: the docs of the involved classes minus held-back ones, then each revealed group appended."""
        docs = load_function_docs(self.task.data["involved_classes"])
        reveals = self._reveal_turns()
        held = {name for names in reveals.values() for name in names}
        available = [d for d in docs if d["name"] not in held]
        by_name = {d["name"]: d for d in docs}
        for turn in sorted(reveals):
            if turn <= self._user_turn:
                available.extend(by_name[n] for n in reveals[turn] if n in by_name)
        return available

    def _question(self, turn: int) -> str:
        messages = self.task.data["questions"][turn]
        text = "\n\n".join(str(m.get("content", "")) for m in messages if m.get("role", "user") == "user")
        added = self._reveal_turns().get(turn)
        if added:
            by_name = {d["name"]: d for d in load_function_docs(self.task.data["involved_classes"])}
            schemas = [self._tool(by_name[n]) for n in added if n in by_name]
            prefix = json.dumps(schemas, ensure_ascii=False) + "\n" + ADDED_FUNCTIONS_PROMPT
            text = prefix + ("\n\n" + text if text else "")
        return text

    def _parse(self, action: str) -> tuple[list[PythonCall], str | None]:
        """(calls, None), or ([], error observation). No calls and no error means the user turn ends."""
        if not isinstance(action, str):
            return [], f"Error: the action must be text, got {type(action).__name__}."
        visible = strip_thinking(action)
        if "<tool_call>" in visible or "</tool_call>" in visible:
            parsed = parse_action(action)
            if not parsed.ok:
                return [], parsed.error_message()
            return [PythonCall(c.name, (), dict(c.arguments)) for c in parsed.tool_calls], None
        if looks_like_call_list(visible):
            listed = parse_call_list(visible)
            if not listed.ok:
                return [], listed.error_message()
            return list(listed.calls), None
        return [], None

    def _limit_or(self, result: TurnResult) -> TurnResult:
        """``result``, or BFCL's force quit when the user turn has run over its step limit."""
        if self._steps_in_turn <= self.max_steps_per_turn:
            return result
        note = f"Step limit ({self.max_steps_per_turn}) of this user turn exceeded: the episode ends."
        info = dict(result.info, force_quit=True, valid=False, turn_checks=[c.as_dict() for c in self._checks])
        return TurnResult(self._clip(result.observation + "\n\n" + note), reward=0.0, terminated=True,
                          role=result.role, info=info)

    def _end_user_turn(self) -> TurnResult:
        truth = self.ground_truth().turns[self._user_turn]
        check = check_turn(self._user_turn, truth, self._backends, calls_in_turn=self._calls_in_turn,
                           all_results=self._results)
        self._checks.append(check)
        self._user_turn += 1
        self._steps_in_turn = 0
        self._calls_in_turn = 0
        if self._user_turn >= self.num_user_turns:
            valid = all(c.valid for c in self._checks)
            info = self._turn_info(turn_check=check.as_dict(), turn_checks=[c.as_dict() for c in self._checks],
                                   valid=valid, force_quit=False)
            return TurnResult("", reward=float(valid), terminated=True, role="user", info=info)
        new_tools = self._reveal_turns().get(self._user_turn, [])
        info = self._turn_info(turn_check=check.as_dict(), new_tools=list(new_tools))
        return TurnResult(self._clip(self._question(self._user_turn)), role="user", info=info)

    def _turn_info(self, **extra: Any) -> dict[str, Any]:
        return {"category": self.category, "user_turn": self._user_turn, "num_user_turns": self.num_user_turns,
                **extra}

    def _clip(self, text: str) -> str:
        limit = self.observation_space.max_length
        if len(text) <= limit:
            return text
        note = f"\n... [observation truncated: {len(text) - limit} more characters]"
        return text[: max(0, limit - len(note))] + note


def render_calls(calls: Sequence[PythonCall], *, style: str = "python") -> str:
    """Calls as one step of model text: ``[f(a=1), g('x')]`` or ``<tool_call>`` blocks (keyword arguments only)."""
    if style == "python":
        return "[" + ", ".join(c.to_source() for c in calls) + "]"
    if style == "json":
        if any(c.args for c in calls):
            raise ValueError("JSON tool calls take keyword arguments only; use style='python' for positional ones")
        return "\n".join(format_tool_call(c.name, dict(c.kwargs)) for c in calls)
    raise ValueError(f"style must be 'python' or 'json', got {style!r}")


def render_outcomes(outcomes: Sequence[CallOutcome]) -> str:
    """The observation text of one step's calls."""
    if len(outcomes) == 1:
        return outcomes[0].result
    return "\n".join(f"[{i}] {o.name}: {o.result}" for i, o in enumerate(outcomes, start=1))
