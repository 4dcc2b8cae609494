"""The small exception hierarchy of trace_envs.

Model output never raises: malformed actions become observations. These errors
are for programming mistakes by the *caller* (wrong snapshot, unknown task,
bad configuration) and for resources that ran out.
"""

from __future__ import annotations

__all__ = [
    "TraceEnvError",
    "TaskNotFoundError",
    "InvalidTaskError",
    "SnapshotError",
    "ForeignSnapshotError",
    "SnapshotLimitError",
    "SandboxError",
    "ResetNeededError",
    "EnvSetupError",
    "EnvArgumentError",
]


class TraceEnvError(Exception):
    """Base class of every error raised by trace_envs."""


class TaskNotFoundError(TraceEnvError, KeyError):
    """`reset(options={"task_id": ...})` named a task the env's task set does not hold."""

    def __str__(self) -> str:  # KeyError quotes its message; keep it readable
        return str(self.args[0]) if self.args else ""


class InvalidTaskError(TraceEnvError, ValueError):
    """A user task passed as `options={"task": {...}}` lacks fields or has wrong types."""


class ResetNeededError(TraceEnvError, RuntimeError):
    """`step()` or `snapshot()` was called before `reset()` or after the episode ended."""


class SnapshotError(TraceEnvError):
    """A snapshot cannot be taken or restored."""


class ForeignSnapshotError(SnapshotError, ValueError):
    """The snapshot belongs to another env id, another configuration or another task."""


class SnapshotLimitError(SnapshotError, RuntimeError):
    """Too many live snapshots hold resources (processes); release some first."""


class SandboxError(TraceEnvError, RuntimeError):
    """The code sandbox cannot be started or controlled (not raised for user code failures)."""


class EnvSetupError(TraceEnvError, RuntimeError):
    """An env's tool backend cannot be reached or does not work (a retrieval server that does not answer).

    Raised by ``gymnasium.make`` where the check is cheap and by ``reset`` (before an episode that
    would only see error observations); the message names the backend and its address. A backend
    that fails during an episode gives error observations and ``info["backend_error"] = True``
    instead (see each env's docstring), so a trainer can count the failures and stop.
    """


class EnvArgumentError(TraceEnvError, TypeError):
    """A constructor argument (``gym.make(id, **kwargs)``) has the wrong type; the message names it."""
