"""Consecutive tool-backend failures become a run-level error, never a quiet training signal.

An env whose tool backend fails during an episode (a retrieval server that stopped answering)
returns an error observation and ``info["backend_error"] = True`` with ``info["backend"]`` naming
the backend and its address; a turn whose backend answered has ``backend_error = False``; a turn
that did not ask the backend has no such key. :func:`watch_backend` wraps an env factory so that
every env it makes counts these flags on one counter per factory and process: after ``limit``
failures in a row (``TrainConfig.max_backend_failures``, default
:data:`DEFAULT_MAX_BACKEND_FAILURES`) the next ``step`` raises :class:`BackendFailureError`, which
ends the collection (training) or the evaluation with a message naming the backend. One answered
call resets the count. Under the Ray backend each actor process counts its own envs' calls.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from trace_agent.errors import TraceAgentError
from trace_envs.wrappers import BranchableWrapper

__all__ = ["BackendFailureError", "BackendCounter", "BackendWatch", "watch_backend", "DEFAULT_MAX_BACKEND_FAILURES"]

#: Backend failures in a row that end a run (``TrainConfig.max_backend_failures``).
DEFAULT_MAX_BACKEND_FAILURES = 8


class BackendFailureError(TraceAgentError, RuntimeError):
    """An env's tool backend failed on ``limit`` calls in a row; the message names it and its address."""


class BackendCounter:
    """Consecutive backend failures seen by the envs of one factory in one process (thread-safe)."""

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"limit must be >= 1, got {limit}")
        self.limit = limit
        self.failures = 0
        self.total = 0
        self._lock = threading.Lock()

    def record(self, info: dict[str, Any], env_id: str) -> None:
        """Count one step's ``info``; raise :class:`BackendFailureError` at ``limit`` failures in a row."""
        flag = info.get("backend_error")
        if flag is None:
            return
        with self._lock:
            if not flag:
                self.failures = 0
                return
            self.failures += 1
            self.total += 1
            failures = self.failures
        if failures >= self.limit:
            backend = info.get("backend") or "its tool backend"
            raise BackendFailureError(
                f"{env_id}: {backend} failed on {failures} tool call{'s' if failures > 1 else ''} in a row "
                f"(max_backend_failures="
                f"{self.limit}): the episodes would only see error messages. Start or fix the backend and "
                f"rerun (or resume); --set max_backend_failures=N changes the limit"
            )


class BackendWatch(BranchableWrapper):
    """Counts the wrapped env's ``info["backend_error"]`` flags on a shared :class:`BackendCounter`.

    Holds no branch state (its snapshot state is None); ``unwrapped`` is the env it wraps. Reads
    of public attributes it lacks fall through to the env (``.messages``, ``.tools``, ``.tasks``).
    """

    def __init__(self, env: Any, counter: BackendCounter) -> None:
        super().__init__(env)
        self._counter = counter

    def __getattr__(self, name: str) -> Any:
        inner = self.__dict__.get("env")
        if name.startswith("_") or inner is None:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        return inner.get_wrapper_attr(name)

    def step(self, action: str) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        out = self.env.step(action)
        self._counter.record(out[4], str(getattr(self.env.unwrapped, "env_id", type(self.env.unwrapped).__name__)))
        return out


class _Watched:
    """A picklable factory: ``make()`` wrapped in :class:`BackendWatch` on this process's counter."""

    def __init__(self, make: Callable[[], Any], limit: int) -> None:
        self.make = make
        self.limit = limit
        self._counter: BackendCounter | None = None
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        return {"make": self.make, "limit": self.limit}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["make"], state["limit"])  # type: ignore[misc]

    @property
    def counter(self) -> BackendCounter:
        with self._lock:
            if self._counter is None:
                self._counter = BackendCounter(self.limit)
            return self._counter

    def __call__(self) -> BackendWatch:
        return BackendWatch(self.make(), self.counter)


def watch_backend(make: Callable[[], Any], limit: int = DEFAULT_MAX_BACKEND_FAILURES) -> Callable[[], Any]:
    """``make`` whose envs raise :class:`BackendFailureError` after ``limit`` backend failures in a row."""
    return _Watched(make, limit)
