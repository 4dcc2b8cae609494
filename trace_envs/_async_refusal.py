"""``venv.call("snapshot")`` on an ``AsyncVectorEnv``: refused in the caller, the workers unharmed.

A :class:`~trace_envs.core.Snapshot` holds live state and cannot leave the worker process. Gymnasium's
worker ends on any exception, so the refusal is not raised there: the worker sends a value that pickles,
and unpickling it in the caller raises :class:`~trace_envs.errors.SnapshotError` naming
``snapshot_handle``, after reading the other workers' answers so that the vector env is ready for its
next call. :meth:`trace_envs.wrappers.BranchingWrapper.get_wrapper_attr` hands out :func:`refused_snapshot`
when it finds itself in an ``AsyncVectorEnv`` worker.
"""

from __future__ import annotations

import sys
import threading
from typing import Any

import gymnasium as gym

from trace_envs.errors import SnapshotError

__all__ = ["in_async_worker", "refused_snapshot"]


def in_async_worker(frame: Any) -> bool:
    """Whether this call runs inside Gymnasium's ``AsyncVectorEnv`` worker loop."""
    while frame is not None:
        if frame.f_code.co_name == "_async_worker" and "async_vector_env" in frame.f_code.co_filename:
            return True
        frame = frame.f_back
    return False


_REFUSED_SNAPSHOT = (
    "a Snapshot holds live state (processes, locks) and cannot leave the worker process of an "
    "AsyncVectorEnv: use venv.call(\"snapshot_handle\") / venv.call(\"restore_handle\", handles) "
    "(or trace_envs.vector.snapshot_handles / restore_handles), which keep the snapshots in the workers"
)
_draining = threading.local()


def _refuse_in_caller(message: str) -> None:
    """Unpickled in the process that called ``venv.call("snapshot")``: drain the other workers' answers, then raise.

    Gymnasium's ``AsyncVectorEnv.call_wait`` reads one answer per worker; an error while reading one
    would leave the others unread and the vector env stuck in its waiting state. So the first refusal
    read reads the rest (their refusals do not raise while it does), resets the vector env's state and
    raises :class:`SnapshotError`; the workers never saw an error and go on.
    """
    if getattr(_draining, "active", False):
        return None
    frame, venv, reading = sys._getframe(1), None, None
    while frame is not None:
        owner = frame.f_locals.get("self")
        if reading is None and frame.f_code.co_name == "recv":
            reading = owner  # the worker pipe whose answer is being read
        if frame.f_code.co_name == "call_wait" and isinstance(owner, gym.vector.AsyncVectorEnv):
            venv = owner
            break
        frame = frame.f_back
    if venv is not None and reading is not None:
        pipes = list(venv.parent_pipes)
        later = pipes[next((i for i, p in enumerate(pipes) if p is reading), len(pipes)) + 1:]
        _draining.active = True
        try:
            for pipe in later:  # each worker answers once; call_wait has not read these yet
                if pipe is not None:
                    pipe.recv()
        finally:
            _draining.active = False
        from gymnasium.vector.async_vector_env import AsyncState

        venv._state = AsyncState.DEFAULT
    raise SnapshotError(message)


def refused_snapshot(*args: Any, **kwargs: Any) -> _RefusedSnapshot:
    """``snapshot`` as an ``AsyncVectorEnv`` worker sees it: a refusal that raises on arrival in the caller."""
    return _RefusedSnapshot(_REFUSED_SNAPSHOT)


class _RefusedSnapshot:
    """What ``call("snapshot")`` returns in an async worker: it pickles, and unpickling it raises in the caller."""

    def __init__(self, message: str) -> None:
        self.message = message

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return _refuse_in_caller, (self.message,)
