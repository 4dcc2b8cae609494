"""Env factories: the one way a run makes its envs, its split arguments, and the ids of a split's tasks."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from trace_agent.errors import EnvSetupError

__all__ = ["ALL_TASKS", "check_env_id", "make_env_factory", "split_kwargs", "task_ids"]

#: Split names that mean every task of an env.
ALL_TASKS = ("all", "default")


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


def split_kwargs(env_id: str, split: str | None, env_kwargs: dict[str, Any] | None = None) -> dict[str, Any]:
    """The ``gymnasium.make`` arguments that select ``split`` of ``env_id``'s tasks.

    * PythonMath-v0 (and any env not named below): ``tasks=split`` ("train", "test" or a task file).
    * WikiQA-v0: "train" / "test" are the synthetic encyclopedia's disjoint question sets
      (:func:`trace_envs.tasks.wiki.wiki_split`); "all" / "default" every question; anything
      else must be an existing HotpotQA-format file (a split name is never looked up on the hub).
    * BFCL-v0: "train" / "test" are the fixed partition of the category's entries
      (:func:`trace_envs.tasks.bfcl.bfcl_split`, category from ``env_kwargs``); "all" / "default"
      the whole category.

    ``split=None`` leaves the env its own default task set (every env's is its train split).
    An explicit ``env_kwargs["tasks"]`` wins over ``split``.
    """
    kwargs = dict(env_kwargs or {})
    if "tasks" in kwargs or split is None:
        return kwargs
    if env_id == "trace_envs/WikiQA-v0":
        if split in ALL_TASKS:
            return {**kwargs, "tasks": "all"}
        from trace_envs.tasks.wiki import WIKI_SPLITS, wiki_split

        if split in WIKI_SPLITS:
            return {**kwargs, "tasks": wiki_split(split)}
        if not Path(split).is_file():
            raise EnvSetupError(f"WikiQA-v0 has no split {split!r}: use train, test, all, or the path of a "
                                f"HotpotQA-format file (none exists at {split})")
        return {**kwargs, "tasks": split}
    if env_id == "trace_envs/BFCL-v0":
        if split in ALL_TASKS:
            return {**kwargs, "tasks": "all"}
        from trace_envs.tasks.bfcl import BFCL_SPLITS, bfcl_split

        if split not in BFCL_SPLITS:
            raise EnvSetupError(f"BFCL-v0 has no split {split!r}: use train, test or all "
                                f"(set the category with env_kwargs.category)")
        return {**kwargs, "tasks": bfcl_split(str(kwargs.get("category", "multi_turn_base")), split)}
    return {**kwargs, "tasks": split}


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
