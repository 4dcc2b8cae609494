"""Branching the sub-envs of a Gymnasium vector env through snapshot handles.

A :class:`~trace_envs.core.Snapshot` holds live state (a forked interpreter, a
lock) and cannot cross a process boundary, so ``AsyncVectorEnv.call("snapshot")``
fails. Each sub-env made by ``gym.make_vec`` is a
:class:`~trace_envs.wrappers.BranchingWrapper`, which keeps its snapshots in its
own process and hands out picklable :class:`~trace_envs.wrappers.SnapshotHandle` s:

    handles = venv.call("snapshot_handle")       # one handle per sub-env, index-aligned
    venv.call("restore_handle", handles)         # each sub-env restores its own one

``AsyncVectorEnv.call`` passes the same arguments to every sub-env, so each
picks the handle it owns. The helpers here add index alignment: ``None``
leaves a sub-env as it is, and a handle at the wrong index is refused in the
calling process, before any worker sees it (Gymnasium shuts down a worker
whose call raises). ``VectorEnv.call`` reaches the handle methods through
``get_wrapper_attr``, so handles cover each sub-env's whole chain: the wrappers given to
``make_vec(wrappers=...)`` (``RecordEpisodeStatistics``' counters, ...) are branched too.

``venv.call("snapshot")`` on an ``AsyncVectorEnv`` raises :class:`~trace_envs.errors.SnapshotError`
in the caller naming ``snapshot_handle``; the workers never see an error and keep serving calls
(the refusal is a value that pickles in the worker and raises when the caller unpickles it, after
reading the other workers' answers, so the vector env is ready for the next call).

With the default ``AutoresetMode.NEXT_STEP`` a sub-env whose episode ended is
reset by the next ``step`` whatever was restored in between; pass
``vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.DISABLED}`` to
branch from finished episodes' save points.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Sequence
from typing import Any

import gymnasium as gym

from trace_envs.errors import ForeignSnapshotError, SnapshotError
from trace_envs.wrappers import SnapshotHandle

__all__ = ["snapshot_handles", "restore_handles", "release_handles", "in_async_worker", "refused_snapshot"]


def snapshot_handles(venv: gym.vector.VectorEnv) -> tuple[SnapshotHandle, ...]:
    """Snapshot every sub-env; the handles, index-aligned with the sub-envs."""
    return tuple(venv.call("snapshot_handle"))


def _aligned(venv: gym.vector.VectorEnv, handles: Sequence[SnapshotHandle | None]) -> dict[str, SnapshotHandle]:
    if len(handles) != venv.num_envs:
        raise ValueError(f"{len(handles)} handles given for {venv.num_envs} sub-envs")
    owners = tuple(venv.get_attr("branch_owner"))
    routed: dict[str, SnapshotHandle] = {}
    for index, (owner, handle) in enumerate(zip(owners, handles)):
        if handle is None:
            continue
        if not isinstance(handle, SnapshotHandle):
            raise TypeError(f"handle {index} is a {type(handle).__name__}, not a SnapshotHandle")
        if handle.owner != owner:
            where = f"sub-env {owners.index(handle.owner)}" if handle.owner in owners else "no sub-env of this vector env"
            raise ForeignSnapshotError(f"handle {index} ({handle!r}) belongs to {where}, not to sub-env {index}")
        routed[owner] = handle
    return routed


def restore_handles(venv: gym.vector.VectorEnv, handles: Sequence[SnapshotHandle | None]) -> tuple[bool, ...]:
    """Restore sub-env ``i`` to ``handles[i]`` (``None``: leave it); which sub-envs were restored.

    Raises:
        ValueError: not one entry per sub-env.
        ForeignSnapshotError: a handle is not of the sub-env at its index (nothing is restored).
        SnapshotError: a handle was released (raised from the worker, which Gymnasium then shuts down).
    """
    return tuple(venv.call("restore_handle", _aligned(venv, handles)))


def release_handles(venv: gym.vector.VectorEnv, handles: Sequence[SnapshotHandle | None]) -> int:
    """Free the snapshots behind ``handles`` (index-aligned, ``None`` skipped); how many were freed.

    Raises:
        ValueError: not one entry per sub-env.
        ForeignSnapshotError: a handle is not of the sub-env at its index (nothing is freed).
    """
    return sum(venv.call("release_handle", _aligned(venv, handles)))


# --------------------------------------------------------------------------------------------------
# call("snapshot") on an AsyncVectorEnv: refused in the caller, the workers unharmed

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
