"""Env factories: the one way a run makes its envs, its split arguments, and the ids of a split's tasks."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from trace_agent.errors import EnvSetupError
from trace_envs.core import ALL_SPLITS
from trace_envs.errors import InvalidTaskError

__all__ = ["ALL_TASKS", "check_env_id", "env_class", "make_env_factory", "split_kwargs", "task_ids"]

#: Split names that mean every task of an env (:data:`trace_envs.core.ALL_SPLITS`).
ALL_TASKS = ALL_SPLITS


def check_env_id(env_id: str) -> None:
    """Raise :class:`EnvSetupError` unless ``env_id`` is registered (checked before any policy loads)."""
    import gymnasium as gym

    import trace_envs  # noqa: F401  (registers the suite)

    if env_id not in gym.registry:
        import difflib

        ours = sorted(k for k in gym.registry if k.startswith("trace_envs/"))
        close = difflib.get_close_matches(env_id, list(gym.registry), n=1, cutoff=0.8)
        hint = f" (did you mean {close[0]}?)" if close else ""
        raise EnvSetupError(f"unknown env id {env_id!r}{hint}; the suite has {', '.join(ours)}")


def env_class(env_id: str) -> Any:
    """The class (or creator) registered for ``env_id``: its spec's entry point, loaded (registered ids only)."""
    import gymnasium as gym
    from gymnasium.envs.registration import load_env_creator

    import trace_envs  # noqa: F401  (registers the suite)

    entry = gym.spec(env_id).entry_point
    return load_env_creator(entry) if isinstance(entry, str) else entry


def split_kwargs(env_id: str, split: str | None, env_kwargs: dict[str, Any] | None = None) -> dict[str, Any]:
    """The ``gymnasium.make`` arguments that select ``split`` of ``env_id``'s tasks.

    The env says: its class's ``split_kwargs(split, env_kwargs)`` classmethod
    (:meth:`trace_envs.BranchableEnv.split_kwargs`, whose default is ``tasks=split``; an env whose split
    names need more overrides it, e.g. WikiQA-v0's files and BFCL-v0's per-category partitions). An env
    that is not a :class:`~trace_envs.BranchableEnv` gets ``tasks=split``.

    ``split=None`` leaves the env its own default task set (every env's is its train split).
    An explicit ``env_kwargs["tasks"]`` wins over ``split``. A split the env does not have is an
    :class:`EnvSetupError` with the env's message.
    """
    kwargs = dict(env_kwargs or {})
    if "tasks" in kwargs or split is None:
        return kwargs
    resolve = getattr(env_class(env_id), "split_kwargs", None)
    if not callable(resolve):
        return {**kwargs, "tasks": split}
    try:
        return dict(resolve(split, kwargs))
    except InvalidTaskError as exc:
        raise EnvSetupError(str(exc)) from None


def make_env_factory(env_id: str, split: str | None, *, max_turns: int,
                     env_kwargs: dict[str, Any] | None = None) -> Callable[[], Any]:
    """A zero-argument factory of the unwrapped ``gymnasium.make(env_id, max_turns=..., **split args)``.

    ``split`` is resolved by :func:`split_kwargs` once, when the factory is made (so an unknown
    split fails here, not in a worker); an explicit ``env_kwargs["tasks"]`` wins.
    """
    check_env_id(env_id)
    kwargs = {"max_turns": max_turns, **split_kwargs(env_id, split, env_kwargs)}

    def make() -> Any:
        import gymnasium as gym

        import trace_envs  # noqa: F401  (registers the suite)

        return gym.make(env_id, **kwargs).unwrapped

    return make


def task_ids(env_id: str, split: str | None, *, env_kwargs: dict[str, Any] | None = None) -> list[str]:
    """The task ids of ``env_id``'s ``split`` (see :func:`split_kwargs`)."""
    env = make_env_factory(env_id, split, max_turns=1, env_kwargs=env_kwargs)()
    try:
        return list(env.tasks.ids())
    finally:
        env.close()
