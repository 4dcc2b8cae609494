"""A trace-gym env behind TRL's ``GRPOTrainer(environment_factory=...)`` interface (TRL >= 1.16).

TRL's contract (``trl/trainer/grpo_trainer.py``): the factory is called with no arguments and returns
one instance per concurrent rollout (instances are pooled and reused across batches); every public
*function* of the instance's class other than ``reset`` and ``get_reward`` becomes a tool whose JSON
schema TRL builds from its type hints and Google-style docstring; ``reset(**row)`` gets every column of
the dataset row and returns None or a string appended to the row's last user message;
``get_reward()`` is called once per finished rollout. TRL never closes an instance, so the factory
keeps the instances it made and :meth:`TraceGymEnvFactory.close` closes them all (the instance class has
no public ``close``: it would be offered to the model as a tool).

Usage::

    from trace_agent.integrations.trl_env import TraceGymEnvFactory

    with TraceGymEnvFactory("trace_envs/PythonMath-v0") as factory:
        trainer = GRPOTrainer(model=..., train_dataset=rows, environment_factory=factory, args=...)
        trainer.train()

The demo policies the project ships train as they are: their chat template has ``{% generation %}``
markers and their tokenizer a ``response_template`` (:mod:`trace_agent.policy.chat`), which TRL needs
for a template it does not know.

Each instance owns one env made with ``gymnasium.make`` and plays it with the env's own action text:
a tool method builds exactly the turn the env parses (:mod:`trace_envs.actions`: a Qwen3/Hermes
``<tool_call>`` block, or ``<answer>...</answer>``), steps the env once and returns the env's
observation. ``answer`` ends the episode and ``get_reward`` returns the env's terminal reward (0.0
while the episode has not ended, e.g. when the model stopped without calling ``answer``).

Model output is hostile: a call after the episode ended, before a reset, with a wrong argument type, a
huge argument, or an env failure returns an ``Error: ...`` observation and never raises into TRL. A
string argument reaches the env verbatim: its ``<`` are JSON-escaped in the ``<tool_call>`` body, so
code that prints ``</tool_call>`` or ``<think>`` cannot cut the call short. An ``answer`` holding the
parser's own tags (``<answer>``, ``<tool_call>``, ``<think>`` and their closers) is refused without a
turn, because the env reads the answer as raw text between tags.

Supported envs: ``trace_envs/PythonMath-v0`` (tools ``python``, ``answer``) and
``trace_envs/WikiQA-v0`` (``search``, ``answer``; the ``tool_call`` action format).
An env is refused (:func:`unsupported_reason`, :data:`UNSUPPORTED`) when its class declares tools that
differ per task (``same_tools = False``), since TRL renders one fixed tool list per environment, read once
from a probe instance when the trainer is built, or several user turns per episode
(``multi_user_turn = True``), each ended by a reply *without* a call, whereas TRL ends the rollout at the
first such reply: ``trace_envs/BFCL-v0`` declares both.

Rows: ``reset`` reads ``task_id`` (what ``trace-gym export --format trl-grpo`` writes) and, when the
row has a non-empty ``data_source``, checks that it names this env. Without ``task_id`` the env draws a
task with its seeded RNG. When the row has no prompt or its last user message is empty, ``reset``
returns the env's opening observation (the question), which TRL appends there; when the prompt already
holds the task (exported rows do), nothing of it. Either way :data:`ANSWER_HINT` follows (the env's own
prompts ask for a text ``<answer>``, which TRL never passes to the env). :func:`prompt_rows` builds such
rows with a system message that names the tools.

TRL is not imported here: the module works (and is tested) without it.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, ClassVar

from trace_agent.demo.profiles import PROFILES, PYTHON_MATH, WIKI_QA
from trace_agent.errors import EnvSetupError

__all__ = [
    "SUPPORTED",
    "UNSUPPORTED",
    "unsupported_reason",
    "TOOL_SYSTEM_PROMPT",
    "ANSWER_HINT",
    "TraceGymEnvironment",
    "PythonMathEnvironment",
    "WikiQAEnvironment",
    "TraceGymEnvFactory",
    "prompt_rows",
]

def unsupported_reason(env_id: str) -> str | None:
    """Why TRL's ``environment_factory`` cannot drive ``env_id`` (None when it can), from what the env's class
    declares (:attr:`trace_envs.BranchableEnv.same_tools`, :attr:`~trace_envs.BranchableEnv.multi_user_turn`):
    TRL renders one fixed tool list per environment, read from a probe instance when the trainer is built,
    and ends the rollout at the first reply without a tool call."""
    from trace_agent.env_factory import env_class

    cls = env_class(env_id)
    problems = []
    if not getattr(cls, "same_tools", True):
        problems.append("its callable functions differ per task (and may be revealed mid-episode), while TRL "
                        "renders one fixed tool list per environment, read from a probe instance when the "
                        "trainer is built")
    if getattr(cls, "multi_user_turn", False):
        problems.append("an episode has several user turns, each ended by a reply without a function call, "
                        "whereas TRL ends the rollout at the first such reply")
    if not problems:
        return None
    return (f"{env_id.rpartition('/')[2]} cannot be exposed through TRL's environment_factory: "
            + "; and ".join(problems) + ". Train it with `trace-gym train` or export its trees "
            "(`trace-gym export`) instead.")


@functools.cache
def _suite_unsupported() -> dict[str, str]:
    import trace_envs

    reasons = {env_id: unsupported_reason(env_id) for env_id in trace_envs.registered_ids()}
    return {env_id: reason for env_id, reason in reasons.items() if reason is not None}


#: The suite's envs TRL's environment interface cannot drive, each with why (:func:`unsupported_reason`).
#: Computed on first access (it loads every env class of the suite), not when this module is imported.
UNSUPPORTED: dict[str, str]


def __getattr__(name: str) -> Any:
    if name == "UNSUPPORTED":
        return _suite_unsupported()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

#: The system message of :func:`prompt_rows`: the tools' schemas come from the chat template.
TOOL_SYSTEM_PROMPT = (
    "Solve the task with the tools you are given. When you know the final answer, call the `answer` tool "
    "with it; the episode ends there."
)

#: What ``reset`` appends to the row's last user message by default: the env's own prompts ask for a
#: text ``<answer>``, which TRL never shows the env (the rollout just ends), so only the tool counts.
ANSWER_HINT = "\n\n(Give your final answer by calling the `answer` tool: a text answer is not graded.)"

#: Tags the env's action parser reads; an ``answer`` holding one is refused (see the module docstring).
_PARSER_TAGS = ("<answer>", "</answer>", "<tool_call>", "</tool_call>", "<think>", "</think>")


def _call_text(name: str, arguments: Mapping[str, Any]) -> str:
    """The ``<tool_call>`` turn the env parses, with ``<`` escaped so no argument can close a tag early."""
    body = json.dumps({"name": name, "arguments": dict(arguments)}, ensure_ascii=False, default=repr)
    return "<tool_call>" + body.replace("<", "\\u003c") + "</tool_call>"


class TraceGymEnvironment:
    """One rollout's env for TRL: ``reset``, ``get_reward`` and the tool methods (see the module docstring).

    Subclasses add the env's own tools; every public function of the class is offered to the model, so
    helpers stay private and state is read through properties.

    Args:
        env_id: a registered trace-gym env id that :data:`SUPPORTED` lists.
        make_kwargs: ``gymnasium.make`` arguments (``tasks``, ``max_turns`` and the env's own).
        seed: seeds the env's first reset (later resets continue its RNG); None leaves it unseeded.
        answer_hint: appended by ``reset`` to the row's last user message (None: nothing).
    """

    #: the env id this class plays; set by subclasses.
    env_id: ClassVar[str] = ""

    def __init__(self, env_id: str | None = None, *, make_kwargs: Mapping[str, Any] | None = None,
                 seed: int | None = None, answer_hint: str | None = ANSWER_HINT) -> None:
        import gymnasium as gym

        import trace_envs  # noqa: F401  (registers the suite)

        env_id = env_id or self.env_id
        if env_id != self.env_id:
            raise EnvSetupError(f"{type(self).__name__} plays {self.env_id}, not {env_id}")
        self._env = gym.make(env_id, **dict(make_kwargs or {}))
        self._seed = seed
        self._answer_hint = answer_hint or ""
        self._started = False
        self._done = False
        self._reward = 0.0
        self._info: dict[str, Any] = {}
        self._task_id: str | None = None
        self._calls: list[str] = []
        self._closed = False

    # ------------------------------------------------------------- TRL contract
    def reset(self, task_id: str | None = None, prompt: Any = None, data_source: str | None = None,
              **row: Any) -> str | None:
        """Start the episode of the row's task.

        Args:
            task_id: the env's task to play (None: the env draws one).
            prompt: the row's prompt; when it is missing or its last message is empty, the opening
                observation is returned for TRL to append there.
            data_source: the env id the row was exported from; must match this env when given.
            **row: the row's other columns (ignored).

        Returns:
            What TRL appends to the row's last user message: the env's opening observation when the
            row's prompt does not hold the task, then the answer hint; None when both are empty.

        Raises:
            EnvSetupError: the row names another env, or the env refuses the task (an unknown id):
                a wrong dataset, not model output.
        """
        if self._closed:
            raise EnvSetupError(f"this {type(self).__name__} was closed")
        if data_source and str(data_source) != self.env_id:
            raise EnvSetupError(f"the row is from {data_source!r}, this environment plays {self.env_id!r}")
        options = {} if task_id is None else {"task_id": str(task_id)}
        seed, self._seed = self._seed, None
        try:
            observation, info = self._env.reset(seed=seed, options=options)
        except Exception as exc:
            raise EnvSetupError(f"{self.env_id} could not start task {task_id!r}: {exc}") from exc
        self._started, self._done, self._reward = True, False, 0.0
        self._info, self._calls = dict(info), []
        self._task_id = str(info.get("task_id", task_id))
        text = (str(observation) if _needs_opening(prompt) else "") + self._answer_hint
        return text or None

    def get_reward(self) -> float:
        """The env's terminal reward: the reward of the turn that ended the episode, 0.0 while it runs."""
        return float(self._reward) if self._done else 0.0

    def answer(self, answer: str) -> str:
        """Submit the final answer; this ends the episode.

        Args:
            answer: the final answer, as short as possible (a number, an expression, a name).

        Returns:
            The environment's reply to the answer.
        """
        if not isinstance(answer, str):
            answer = json.dumps(answer, ensure_ascii=False, default=repr)
        tags = [tag for tag in _PARSER_TAGS if tag in answer]
        if tags:
            return (f"Error: the answer may not contain the tags {', '.join(tags)}; give the bare answer "
                    f"text. The answer was not submitted.")
        return self._step(f"<answer>{answer}</answer>", "answer")

    # ------------------------------------------------------------- state (properties: never tools)
    @property
    def env(self) -> Any:
        """The gymnasium env this instance plays (as ``gymnasium.make`` returned it)."""
        return self._env

    @property
    def done(self) -> bool:
        """Whether the current episode has ended (an answer, or the env's turn limit)."""
        return self._done

    @property
    def task_id(self) -> str | None:
        """The task of the current episode (None before the first reset)."""
        return self._task_id

    @property
    def calls(self) -> list[str]:
        """The tool names called in this episode, in order (refused calls included)."""
        return list(self._calls)

    @property
    def info(self) -> dict[str, Any]:
        """The env's ``info`` after the last reset or turn."""
        return dict(self._info)

    @property
    def closed(self) -> bool:
        return self._closed

    # ------------------------------------------------------------- lifetime (private: never tools)
    def _close(self) -> None:
        """Close the env (idempotent); :meth:`TraceGymEnvFactory.close` calls it for every instance."""
        if not self._closed:
            self._closed = True
            self._env.close()

    def __enter__(self) -> TraceGymEnvironment:
        return self

    def __exit__(self, *exc: object) -> None:
        self._close()

    # ------------------------------------------------------------- one turn
    def _step(self, action: str, tool: str) -> str:
        """Play ``action`` as one env turn; every outcome is an observation string."""
        self._calls.append(tool)
        if self._closed:
            return "Error: the environment is closed."
        if not self._started:
            return "Error: no episode is running (the environment was not reset)."
        if self._done:
            return ("Error: the episode is over (an answer was given or the turn limit reached); "
                    "no more tool calls are accepted.")
        try:
            observation, reward, terminated, truncated, info = self._env.step(action)
        except Exception as exc:  # noqa: BLE001 - model output must never raise into TRL
            self._done = True
            return f"Error: the environment failed ({type(exc).__name__}: {str(exc)[:300]}); the episode is over."
        self._info = dict(info)
        if terminated or truncated:
            self._done, self._reward = True, float(reward)
        text = str(observation)
        if truncated and f"({self._env.unwrapped.max_turns})" not in text:
            text += f"\n(The turn limit of {self._env.unwrapped.max_turns} was reached: the episode is over.)"
        return text


def _needs_opening(prompt: Any) -> bool:
    """Whether a row's prompt lacks the task: missing, empty, or its last message has empty content."""
    if prompt is None:
        return True
    if isinstance(prompt, str):
        return not prompt.strip()
    if isinstance(prompt, Sequence) and prompt:
        last = prompt[-1]
        content = last.get("content") if isinstance(last, Mapping) else last
        return not content
    return not prompt


class PythonMathEnvironment(TraceGymEnvironment):
    """``trace_envs/PythonMath-v0`` for TRL: tools ``python`` and ``answer``."""

    env_id = PYTHON_MATH

    def python(self, code: str) -> str:
        """Run Python code in a persistent interpreter: variables and imports stay from one call to the next.

        Args:
            code: the Python source to run; what it prints (and the value of a final expression) is returned.

        Returns:
            The output of the code, or an error message.
        """
        return self._step(_call_text("python", {"code": code}), "python")


class WikiQAEnvironment(TraceGymEnvironment):
    """``trace_envs/WikiQA-v0`` (action format ``tool_call``) for TRL: tools ``search`` and ``answer``."""

    env_id = WIKI_QA

    def search(self, query: str) -> str:
        """Search the encyclopedia for passages.

        Args:
            query: keywords or a question.

        Returns:
            The top passages with their titles, or an error message.
        """
        return self._step(_call_text("search", {"query": query}), "search")


#: env id -> the instance class that plays it: the ``trl_environment`` of each env's profile
#: (:data:`trace_agent.demo.profiles.PROFILES`).
SUPPORTED: dict[str, type[TraceGymEnvironment]] = {
    env_id: globals()[p.trl_environment] for env_id, p in PROFILES.items() if p.trl_environment is not None}


class TraceGymEnvFactory:
    """``environment_factory`` for TRL's ``GRPOTrainer``: each call makes one instance over a new env.

    Args:
        env_id: a registered env id that :data:`SUPPORTED` lists (BFCL-v0 is refused: :data:`UNSUPPORTED`).
        split: the env's task split (:func:`trace_agent.env_factory.split_kwargs`; "train" by default).
        max_turns: turns per episode (None: the env's default); TRL's own ``max_tool_calling_iterations``
            bounds the calls too.
        env_kwargs: further ``gymnasium.make`` arguments; an explicit ``tasks`` wins over ``split``.
        seed: instance ``i`` seeds its env's first reset with ``seed + i`` (None: unseeded).
        answer_hint: what ``reset`` appends to the row's last user message (:data:`ANSWER_HINT`; None: nothing).

    Raises:
        EnvSetupError: an unknown env id, an unsupported one, or WikiQA's ``search-r1`` action format.
    """

    def __init__(self, env_id: str, *, split: str | None = "train", max_turns: int | None = None,
                 env_kwargs: Mapping[str, Any] | None = None, seed: int | None = 0,
                 answer_hint: str | None = ANSWER_HINT) -> None:
        from trace_agent.env_factory import check_env_id, split_kwargs

        check_env_id(env_id)
        reason = unsupported_reason(env_id)
        if reason is not None:
            raise EnvSetupError(reason)
        if env_id not in SUPPORTED:
            raise EnvSetupError(f"no TRL environment for {env_id!r}; supported: {', '.join(SUPPORTED)}")
        kwargs = split_kwargs(env_id, split, dict(env_kwargs or {}))
        if kwargs.get("action_format", "tool_call") != "tool_call":
            raise EnvSetupError(f"{env_id} is driven through tool calls: action_format must be 'tool_call', "
                                f"got {kwargs['action_format']!r}")
        if max_turns is not None:
            kwargs["max_turns"] = int(max_turns)
        self.env_id = env_id
        self.make_kwargs = kwargs
        self.seed = seed
        self.answer_hint = answer_hint
        self.instances: list[TraceGymEnvironment] = []

    def __call__(self) -> TraceGymEnvironment:
        seed = None if self.seed is None else self.seed + len(self.instances)
        instance = SUPPORTED[self.env_id](make_kwargs=self.make_kwargs, seed=seed,
                                               answer_hint=self.answer_hint)
        self.instances.append(instance)
        return instance

    def close(self) -> None:
        """Close every instance this factory made (TRL never does); safe to call twice."""
        for instance in self.instances:
            instance._close()

    def __enter__(self) -> TraceGymEnvFactory:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def prompt_rows(env_id: str, task_ids: Iterable[str], *, system_prompt: str = TOOL_SYSTEM_PROMPT,
                ) -> list[dict[str, Any]]:
    """TRL dataset rows whose prompt leaves the task to ``reset``.

    Each row is ``{"prompt": [system, user ""], "task_id", "data_source": env_id}``: the instance's
    ``reset`` returns the task's opening observation and TRL appends it to the empty user message.
    The tools' schemas are rendered by the chat template, so the system message only says to answer
    through ``answer``.
    """
    refused = _suite_unsupported()  # the suite's; another id is checked by the factory that plays it
    if env_id in refused:
        raise EnvSetupError(refused[env_id])
    messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
    return [{"prompt": [*messages, {"role": "user", "content": ""}], "task_id": str(task_id),
             "data_source": env_id} for task_id in task_ids]
