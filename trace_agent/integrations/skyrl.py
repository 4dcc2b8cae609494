"""The suite as SkyRL-gym text environments: each env behind ``skyrl_gym``'s ``BaseTextEnv`` (skyrl-gym >= 0.4).

SkyRL's contract (``skyrl_gym/envs/base_text_env.py`` and its generator): the trainer builds one env per
trajectory with ``skyrl_gym.make(env_class, env_config=..., extras=...)``, where ``env_class`` is the
dataset row's ``env_class`` column, ``env_config`` the trainer's per-env config and ``extras`` every
other column of the row (the generator adds ``max_turns``). ``init(prompt)`` returns the chat the model
starts from and a metadata dict; ``step(action)`` gets the model's raw text for one turn and returns
``{"observations": [messages], "reward", "done", "metadata"}``; the generator appends the observations
to the chat (rendered with the tokenizer's chat template, without a ``tools`` argument) until ``done``;
``close()`` ends it. There is no reset: an env plays one episode.

:class:`TraceGymTextEnv` is that env for every id of the suite. It makes the suite env with
``gymnasium.make`` when built and resets it in ``init``, so the action text is the suite's own (a
Qwen3/Hermes ``<tool_call>`` JSON block, or ``<answer>...</answer>``: :mod:`trace_envs.actions`) and
the observations are the env's, with the env's role (``"tool"`` for a tool's output, ``"user"`` for a
BFCL user turn). Importing this module registers the suite in ``skyrl_gym``'s registry under the
Gymnasium ids (:func:`register_suite`), so ``env_class: trace_envs/PythonMath-v0`` works in a SkyRL
dataset.

Configuration. ``env_config`` (a dict or an OmegaConf ``DictConfig``) takes ``split`` (the task split,
:func:`trace_agent.env_factory.split_kwargs`; "train" by default), ``env_kwargs`` (further
``gymnasium.make`` arguments), ``max_turns`` and ``tool_detail`` (how the tools are written into the
prompt: "full", "compact" or "names", :mod:`trace_envs.tool_schemas`; "full" by default; set it to the
policy's own, e.g. the shipped BFCL policy's "names", so the prompt is the one it was trained on);
``env_class`` is ignored. ``extras`` takes ``task_id``
(at the top or in ``extra_info``; without it the env draws a task, seeded by ``seed`` when given),
``max_turns`` (wins over ``env_config``'s: SkyRL's generator sets it to the turns it will play) and
``data_source`` (when non-empty it must name this env). Anything else in a row is ignored.

The prompt. SkyRL renders without a ``tools`` argument, so ``init`` folds the env's tool schemas into
the system message (:func:`trace_agent.policy.chat.tools_system_text`: under the shipped chat template
the rendering is byte-identical to the template's own tool rendering). ``init`` returns the env's
opening messages so folded when the prompt is empty or its last message is empty
(:func:`skyrl_rows` writes such rows, or the full prompt), and the given prompt otherwise.

Branching. :meth:`TraceGymTextEnv.snapshot` / :meth:`TraceGymTextEnv.restore` save and load the
episode between turns: the suite env's snapshot (its whole wrapper chain) and the adapter's own turn
count and flags, as a frozen :class:`TextSnapshot`. Restoring into another instance of the same env id
and configuration works once ``init`` started it on the same task (the suite's rule); anything else
raises the suite's ``ForeignSnapshotError``.

Model output is hostile: any action text is one turn for the env (a malformed call, a huge or
non-UTF-8-clean string, a call that names no tool are error observations from the env itself); an env
failure ends the episode with an error observation, reward 0.0; a ``step`` after the episode ended
plays nothing and returns ``done`` with reward 0.0. Calling ``step`` before ``init`` is a caller's bug
and raises :class:`~trace_agent.errors.EnvSetupError`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import skyrl_gym
from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput

from trace_agent.errors import EnvSetupError

__all__ = ["ENTRY_POINT", "TextSnapshot", "TraceGymTextEnv", "register_suite", "skyrl_rows"]

#: The ``skyrl_gym`` entry point every suite id is registered with.
ENTRY_POINT = "trace_agent.integrations.skyrl:TraceGymTextEnv"

#: ``env_config`` keys the adapter reads (``env_class`` is SkyRL's own and ignored).
_CONFIG_KEYS = frozenset({"split", "env_kwargs", "max_turns", "tool_detail", "env_class"})


def _plain(value: Any) -> Any:
    """An OmegaConf container (SkyRL's configs) as plain dicts and lists; anything else as it is."""
    from omegaconf import DictConfig, ListConfig, OmegaConf

    if isinstance(value, (DictConfig, ListConfig)):
        return OmegaConf.to_container(value, resolve=True)
    return value


@dataclass(frozen=True, kw_only=True)
class TextSnapshot:
    """A save point of a :class:`TraceGymTextEnv` between turns.

    Attributes:
        env_id: the suite env it belongs to.
        env: the suite env's snapshot (its wrapper chain included).
        turns: the adapter's turn count (``BaseTextEnv.turns``).
        done: whether the episode had ended.
        reward: the reward of the turn that ended it (0.0 while it runs).
    """

    env_id: str
    env: Any
    turns: int
    done: bool
    reward: float


class TraceGymTextEnv(BaseTextEnv):
    """One episode of a suite env as a ``skyrl_gym`` ``BaseTextEnv`` (see the module docstring).

    Args:
        env_config: ``split``, ``env_kwargs``, ``max_turns``, ``tool_detail`` (a dict or a ``DictConfig``;
            None: defaults).
        extras: the dataset row's other columns: ``task_id``, ``max_turns``, ``data_source``, ``seed``.
        env_id: the suite id to play (:func:`register_suite` binds it per registered id).

    Raises:
        EnvSetupError: an unknown env id or split, an unknown ``env_config`` key, or a row whose
            ``data_source`` names another env.
    """

    def __init__(self, env_config: Any = None, extras: Mapping[str, Any] | None = None, *,
                 env_id: str | None = None) -> None:
        super().__init__()
        import gymnasium as gym

        import trace_envs  # noqa: F401  (registers the suite)
        from trace_agent.env_factory import check_env_id, split_kwargs
        from trace_envs.tool_schemas import check_tool_detail

        config = dict(_plain(env_config) or {})
        extras = dict(_plain(extras) or {})
        if not env_id:
            raise EnvSetupError("TraceGymTextEnv needs env_id=: make it through skyrl_gym.make(<suite id>, ...) "
                                "after register_suite(), or pass env_id")
        check_env_id(env_id)
        unknown = sorted(set(config) - _CONFIG_KEYS)
        if unknown:
            raise EnvSetupError(f"unknown env_config keys {unknown} for {env_id}; the adapter reads "
                                f"{sorted(_CONFIG_KEYS - {'env_class'})}")
        source = extras.get("data_source")
        if source and str(source) != env_id:
            raise EnvSetupError(f"the row is from {source!r}, this environment plays {env_id!r}")
        kwargs = split_kwargs(env_id, config.get("split", "train"), dict(config.get("env_kwargs") or {}))
        max_turns = extras.get("max_turns", config.get("max_turns"))
        if max_turns is not None:
            kwargs["max_turns"] = int(max_turns)
        try:
            self.tool_detail = check_tool_detail(str(config.get("tool_detail", "full")))
        except ValueError as exc:
            raise EnvSetupError(f"env_config tool_detail for {env_id}: {exc}") from None
        self.env_id = env_id
        self._env = gym.make(env_id, **kwargs)
        self.max_turns = int(self._env.unwrapped.max_turns)
        info = extras.get("extra_info") if isinstance(extras.get("extra_info"), Mapping) else {}
        task_id = extras.get("task_id", info.get("task_id"))
        self._task_id: str | None = None if task_id is None else str(task_id)
        seed = extras.get("seed", info.get("seed"))
        self._seed: int | None = None if seed is None else int(seed)
        self._started = False
        self._done = False
        self._reward = 0.0
        self._closed = False

    # ------------------------------------------------------------- skyrl_gym contract
    def init(self, prompt: Any = None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """Start the row's episode; return the chat the model starts from and ``{"env_id", "task_id"}``.

        Raises:
            EnvSetupError: the env refuses the task (an unknown id) or cannot start (its backend):
                a wrong dataset or a broken machine, not model output.
        """
        if self._closed:
            raise EnvSetupError(f"this {self.env_id} environment was closed")
        options = {} if self._task_id is None else {"task_id": self._task_id}
        try:
            self._env.reset(seed=self._seed, options=options)
        except Exception as exc:
            raise EnvSetupError(f"{self.env_id} could not start task {self._task_id!r}: {exc}") from exc
        self.turns, self._started, self._done, self._reward = 0, True, False, 0.0
        self._task_id = str(self._env.unwrapped.task.task_id)
        chat = _opening_chat(self._env.unwrapped, self.tool_detail) if _needs_opening(prompt) else [dict(m) for m in prompt]
        return chat, {"env_id": self.env_id, "task_id": self._task_id}

    def step(self, action: str) -> BaseTextEnvStepOutput:
        """Play ``action`` (the model's raw text) as one turn of the env."""
        if not self._started:
            raise EnvSetupError(f"step() before init(): call init(prompt) on this {self.env_id} environment first")
        if self._done or self._closed:
            return BaseTextEnvStepOutput(observations=[], reward=0.0, done=True, postprocessed_action=None,
                                         metadata={"error": "the episode is over; this action was not played"})
        self.turns += 1
        try:
            observation, reward, terminated, truncated, info = self._env.step(action)
        except Exception as exc:  # noqa: BLE001 - model output must never raise into the trainer
            self._done, self._reward = True, 0.0
            error = f"Error: the environment failed ({type(exc).__name__}: {str(exc)[:300]}); the episode is over."
            return BaseTextEnvStepOutput(observations=[{"role": "user", "content": error}], reward=0.0, done=True,
                                         postprocessed_action=None, metadata={"error": error, "turn": self.turns})
        done = bool(terminated or truncated)
        self._done, self._reward = done, float(reward) if done else 0.0
        messages = [] if done or not observation else [{"role": _last_role(self._env.unwrapped), "content":
                                                        str(observation)}]
        metadata = {"task_id": self._task_id, "turn": self.turns, "terminated": bool(terminated),
                    "truncated": bool(truncated), "info": dict(info)}
        return BaseTextEnvStepOutput(observations=messages, reward=float(reward), done=done,
                                     postprocessed_action=None, metadata=metadata)

    def close(self) -> None:
        """Close the suite env (its sandbox or worker processes); idempotent."""
        if not self._closed:
            self._closed = True
            self._env.close()

    def get_metrics(self) -> dict[str, Any]:
        """``turns`` and the episode's ``reward`` (numbers: SkyRL averages them over episodes)."""
        return {"turns": self.turns, "reward": self._reward}

    # ------------------------------------------------------------- branching
    def snapshot(self) -> TextSnapshot:
        """The episode after the last finished turn (see the module docstring)."""
        if not self._started:
            raise EnvSetupError("nothing to snapshot: call init(prompt) first")
        return TextSnapshot(env_id=self.env_id, env=self._env.snapshot(), turns=self.turns, done=self._done,
                            reward=self._reward)

    def restore(self, snapshot: TextSnapshot) -> None:
        """Put the episode back where :meth:`snapshot` took ``snapshot``; it can be restored any number of times.

        Raises:
            EnvSetupError: ``snapshot`` is not a :class:`TextSnapshot`, or this environment was closed.
            trace_envs.ForeignSnapshotError: it belongs to another env id or configuration, or this
                environment was not started (``init``) on the snapshot's task.
        """
        if not isinstance(snapshot, TextSnapshot):
            raise EnvSetupError(f"restore() takes a TextSnapshot from TraceGymTextEnv.snapshot(), got "
                                f"{type(snapshot).__name__}")
        if self._closed:
            raise EnvSetupError(f"this {self.env_id} environment was closed")
        self._env.restore(snapshot.env)
        self.turns, self._done, self._reward, self._started = snapshot.turns, snapshot.done, snapshot.reward, True
        self._task_id = str(self._env.unwrapped.task.task_id)

    # ------------------------------------------------------------- state
    @property
    def env(self) -> Any:
        """The suite env (as ``gymnasium.make`` returned it)."""
        return self._env

    @property
    def task_id(self) -> str | None:
        """The episode's task (the row's before ``init``; None when the env draws one)."""
        return self._task_id

    @property
    def done(self) -> bool:
        return self._done

    @property
    def closed(self) -> bool:
        return self._closed


def _needs_opening(prompt: Any) -> bool:
    """Whether a prompt lacks the task: missing, empty, or its last message has empty content."""
    if not prompt:
        return True
    if isinstance(prompt, str):
        return not prompt.strip()
    last = prompt[-1]
    return not (last.get("content") if isinstance(last, Mapping) else last)


def _opening_chat(env: Any, tool_detail: str = "full") -> list[dict[str, Any]]:
    """The env's messages so far, its tools (at ``tool_detail``) folded into the system message (a new one when
    it has none)."""
    from trace_agent.policy.chat import tools_system_text
    from trace_envs.tool_schemas import tool_schema

    messages = [dict(m) for m in env.messages]
    tools = [tool_schema(tool, tool_detail) for tool in env.tools]
    if not tools:
        return messages
    if messages and messages[0].get("role") == "system":
        return [{"role": "system", "content": tools_system_text(str(messages[0]["content"]), tools)}, *messages[1:]]
    return [{"role": "system", "content": tools_system_text("", tools)}, *messages]


def _last_role(env: Any) -> str:
    messages = env.messages
    return str(messages[-1].get("role", "user")) if messages else "user"


def register_suite(env_ids: Iterable[str] | None = None) -> list[str]:
    """Register suite ids (all of them by default) in ``skyrl_gym``'s registry, each under its Gymnasium id.

    Idempotent: an id this module already registered is left as it is.

    Returns:
        The ids now registered by this module.

    Raises:
        EnvSetupError: an id is not in the suite, or ``skyrl_gym`` already holds it with another entry point.
    """
    import gymnasium as gym

    import trace_envs  # noqa: F401  (registers the suite)
    from trace_agent.env_factory import check_env_id

    ids = list(env_ids) if env_ids is not None else sorted(k for k in gym.registry if k.startswith("trace_envs/"))
    for env_id in ids:
        check_env_id(env_id)
        spec = skyrl_gym.registry.get(env_id)
        if spec is not None:
            if spec.entry_point != ENTRY_POINT or spec.kwargs.get("env_id") != env_id:
                raise EnvSetupError(f"skyrl_gym already registers {env_id!r} with {spec.entry_point!r}; "
                                    f"deregister it (skyrl_gym.envs.registration.deregister) first")
            continue
        skyrl_gym.register(id=env_id, entry_point=ENTRY_POINT, kwargs={"env_id": env_id})
    return ids


def skyrl_rows(env_id: str, ids: Sequence[str], *, split: str | None = "train",
               env_kwargs: Mapping[str, Any] | None = None, tool_detail: str = "full") -> list[dict[str, Any]]:
    """SkyRL dataset rows for tasks ``ids``: ``prompt``, ``env_class``, ``data_source`` and ``task_id``.

    The prompt is the env's opening chat with its tools folded in at ``tool_detail``, exactly what
    ``init`` returns for an empty prompt under the same ``env_config`` ``tool_detail`` (read from one
    reset per task: a BFCL task's tools are its own).
    """
    from trace_envs.tool_schemas import check_tool_detail

    check_tool_detail(tool_detail)
    import gymnasium as gym

    import trace_envs  # noqa: F401
    from trace_agent.env_factory import check_env_id, split_kwargs

    check_env_id(env_id)
    rows = []
    with gym.make(env_id, **split_kwargs(env_id, split, dict(env_kwargs or {}))) as env:
        for task_id in ids:
            env.reset(options={"task_id": str(task_id)})
            rows.append({"prompt": _opening_chat(env.unwrapped, tool_detail), "env_class": env_id, "data_source": env_id,
                         "task_id": str(task_id)})
    return rows


register_suite()
