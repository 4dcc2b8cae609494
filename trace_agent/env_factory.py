"""Env factories: the one way a run makes its envs, its split arguments, and the ids of a split's tasks.

Env ids are Gymnasium's: a registered id (``trace_envs/PythonMath-v0``), or ``module.path:EnvName-v0``,
Gymnasium's own form for an env a module registers when imported (what ``gymnasium.make`` accepts). Every
function here takes either; the ``module.path`` form imports that module first (:func:`import_env_module`).
Importing a module runs its code, as ``python -m module.path`` would: the form is for the user's own code
named on the command line or in the user's own ``--config``. A run directory never chooses code: a
``module:EnvId`` read from its ``config.yaml`` is refused on resume unless the caller allows it
(:func:`trace_agent.rundir.resume_config`, ``TRACE_GYM_ALLOW_CODE``). The module is looked up on
``sys.path``, then in the current directory (appended to ``sys.path`` when missing, so an installed module
of the same name wins, as it does not under ``python -m``).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trace_agent.errors import EnvSetupError
from trace_envs.core import ALL_SPLITS
from trace_envs.errors import InvalidTaskError

__all__ = ["ALL_TASKS", "check_env_id", "env_class", "import_env_module", "make_env_factory", "split_env_id",
           "split_kwargs", "task_ids"]

#: Split names that mean every task of an env (:data:`trace_envs.core.ALL_SPLITS`).
ALL_TASKS = ALL_SPLITS


def split_env_id(env_id: str) -> tuple[str | None, str]:
    """``("module.path", "EnvName-v0")`` for ``"module.path:EnvName-v0"``; ``(None, env_id)`` for a plain id.

    Raises :class:`EnvSetupError` for an id with a ``:`` that is not a dotted module name, one colon and a
    non-empty registered id (a file path is not a module name).
    """
    if ":" not in env_id:
        return None, env_id
    module, _, registered = env_id.partition(":")
    if not registered or ":" in registered or not all(part.isidentifier() for part in module.split(".")):
        raise EnvSetupError(f"env id {env_id!r} is neither a registered id nor module.path:EnvName-v0 (a dotted "
                            f"module name, one colon, the id the module registers), e.g. mypkg.envs:Guess-v0")
    return module, registered


def import_env_module(env_id: str) -> str:
    """Import the module a ``module.path:EnvName-v0`` id names (nothing for a plain id); the registered id.

    The module is found on ``sys.path`` or in the current directory (appended to ``sys.path`` if
    missing). A module that cannot be found, or whose import fails for want of another module, is an
    :class:`EnvSetupError` naming it; any other exception its code raises propagates unchanged.
    """
    module, registered = split_env_id(env_id)
    if module is None:
        return registered
    import importlib

    cwd = Path.cwd().resolve()
    if not any(Path(entry or ".").resolve() == cwd for entry in sys.path if isinstance(entry, str)):
        sys.path.append(os.fspath(cwd))
    try:
        importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name and (module == exc.name or module.startswith(exc.name + ".")):
            raise EnvSetupError(f"env id {env_id!r}: no module named {exc.name!r} on the Python path or in the "
                                f"current directory ({cwd}): run from the directory that holds it, or install "
                                f"its package") from None
        raise EnvSetupError(f"env id {env_id!r}: importing {module!r} failed: {exc}") from None
    except ImportError as exc:
        raise EnvSetupError(f"env id {env_id!r}: importing {module!r} failed: {exc}") from None
    return registered


def check_env_id(env_id: str) -> None:
    """Raise :class:`EnvSetupError` unless ``env_id`` is registered (checked before any policy loads).

    A ``module.path:EnvName-v0`` id imports its module first (:func:`import_env_module`) and must name an
    id that the import registered.
    """
    import gymnasium as gym

    import trace_envs  # noqa: F401  (registers the suite)

    module, _ = split_env_id(env_id)
    registered = import_env_module(env_id)
    if registered not in gym.registry:
        import difflib

        ours = sorted(k for k in gym.registry if k.startswith("trace_envs/"))
        close = difflib.get_close_matches(registered, list(gym.registry), n=1, cutoff=0.8)
        hint = f" (did you mean {close[0]}?)" if close else ""
        if module is not None:
            raise EnvSetupError(f"env id {env_id!r}: importing {module!r} registered no env {registered!r}{hint}: "
                                f"it must call gymnasium.register(id={registered!r}, ...) when imported")
        raise EnvSetupError(f"unknown env id {env_id!r}{hint}; the suite has {', '.join(ours)} (an env of your "
                            f"own: module.path:EnvName-v0, its module registers it)")


def env_class(env_id: str) -> Any:
    """The class (or creator) registered for ``env_id``: its spec's entry point, loaded (registered ids only;
    a ``module.path:EnvName-v0`` id imports its module first)."""
    import gymnasium as gym
    from gymnasium.envs.registration import load_env_creator

    import trace_envs  # noqa: F401  (registers the suite)

    entry = gym.spec(import_env_module(env_id)).entry_point
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

        return gym.make(import_env_module(env_id), **kwargs).unwrapped  # a worker process imports it too

    return make


def task_ids(env_id: str, split: str | None, *, env_kwargs: dict[str, Any] | None = None) -> list[str]:
    """The task ids of ``env_id``'s ``split`` (see :func:`split_kwargs`)."""
    env = make_env_factory(env_id, split, max_turns=1, env_kwargs=env_kwargs)()
    try:
        return list(env.tasks.ids())
    finally:
        env.close()
