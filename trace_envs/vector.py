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
reading the other workers' answers, so the vector env is ready for the next call; see
:mod:`trace_envs._async_refusal`).

With the default ``AutoresetMode.NEXT_STEP`` a sub-env whose episode ended is
reset by the next ``step`` whatever was restored in between; pass
``vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.DISABLED}`` to
branch from finished episodes' save points.
"""

from __future__ import annotations

from collections.abc import Sequence

import gymnasium as gym

from trace_envs.errors import ForeignSnapshotError
from trace_envs.wrappers import SnapshotHandle

__all__ = ["snapshot_handles", "restore_handles", "release_handles"]


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

