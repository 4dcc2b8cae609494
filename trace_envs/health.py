"""Is an env's tool backend there? The checks ``trace-gym train/eval --preflight`` runs before a run.

:func:`check_backend` checks what ``gymnasium.make(env_id, **kwargs)`` would use, without making
the env: WikiQA-v0's retrieval server (one search, no retries, a short timeout) or its local
index's bm25s; BFCL-v0's backend worker process (started and stopped); PythonMath-v0's grading
worker (started, then kept in the pool for the run). Another registered env is asked through its
class's ``preflight_backend(kwargs)`` static method, when it has one. Each check raises
:class:`~trace_envs.errors.EnvSetupError` naming the backend and what to do.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from typing import Any

from trace_envs.errors import EnvSetupError

__all__ = ["check_backend"]


def _math(kwargs: Mapping[str, Any]) -> str:
    from trace_envs.python_tool._grading_worker import check_grading_worker

    check_grading_worker()
    return "the math grading worker starts"


def _wiki(kwargs: Mapping[str, Any]) -> str | None:
    from trace_envs.wiki_search.env import WikiQAEnv

    return WikiQAEnv.preflight_backend(kwargs)


def _bfcl(kwargs: Mapping[str, Any]) -> str:
    if importlib.util.find_spec("bfcl_eval") is None:
        raise EnvSetupError("BFCL-v0 needs bfcl-eval, which this Python lacks: pip install --no-deps bfcl-eval; "
                            "pip install 'trace-gym[bfcl]'")
    from trace_envs.function_calling.remote import WORKER_COMMAND, check_backend_worker

    check_backend_worker()
    return f"the BFCL backend worker starts ({WORKER_COMMAND})"


_CHECKS = {
    "trace_envs/PythonMath-v0": _math,
    "trace_envs/WikiQA-v0": _wiki,
    "trace_envs/BFCL-v0": _bfcl,
}


def check_backend(env_id: str, kwargs: Mapping[str, Any] | None = None) -> str | None:
    """Check ``env_id``'s tool backend for ``gymnasium.make(env_id, **kwargs)``; a line saying what was checked.

    Returns None for an env with no backend check.

    Raises:
        EnvSetupError: the backend is unreachable or broken (the message names it and what to do).
        gymnasium.error.Error: ``env_id`` is not registered.
    """
    kwargs = dict(kwargs or {})
    check = _CHECKS.get(env_id)
    if check is not None:
        return check(kwargs)
    import gymnasium as gym

    entry = gym.spec(env_id).entry_point
    cls = gym.envs.registration.load_env_creator(entry) if isinstance(entry, str) else entry
    hook = getattr(cls, "preflight_backend", None)
    return hook(kwargs) if callable(hook) else None
