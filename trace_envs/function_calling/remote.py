"""One BFCL-v0 env's backends, run in a worker process with a deadline and a memory cap per request.

The stateful backends (GorillaFileSystem, TwitterAPI, ...) do unbounded work on state a model
builds: ``cp`` shares subdirectories, so a short action makes a directory DAG on which one ``du()``
or ``find()`` runs for minutes, and a chain of thousands of ``mkdir``/``cd`` makes a state too deep
to pickle or compare on the host's stack. :class:`RemoteBackends` keeps the live instances in a
child process (``_backend_worker``), one per env, kept warm across steps and episodes:

* every request has a wall-clock deadline (:data:`CALL_TIMEOUT_S` per call, more for whole-state
  requests); a worker that misses it, dies or breaks the protocol is killed (SIGKILL, its own child)
  and the next request starts a fresh one, rebuilt from the **recipe** this object keeps: the last
  frozen state (or the scenario) plus the calls run since. A call past its deadline therefore has no
  effect, its result is an error, and the env stays usable;
* the host never unpickles anything the worker sends: replies are JSON, and frozen states are
  opaque bytes that only go back to a worker;
* a state that cannot be frozen (too deep, too slow) is snapshotted as its recipe instead
  (:class:`BackendState` with calls), so ``snapshot()`` and ``restore()`` never fail on model-built
  state;
* after a ``fork`` the child leaves its parent's worker alone and starts its own, rebuilt from the recipe.

All of one step's calls go to the worker in one request, their results stream back one by one.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import select
import struct
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from trace_envs.function_calling.backends import (
    Backends,
    CallOutcome,
    backend_class,
    keyword_arguments,
    method_owners,
)

__all__ = ["BackendState", "RemoteBackends", "CALL_TIMEOUT_S", "MEMORY_LIMIT_BYTES", "WORKER_COMMAND",
           "check_backend_worker"]

#: How a worker is started (named in errors): ``python -I -m`` this module, the parent's pid, the memory cap.
WORKER_COMMAND = "python -I -m trace_envs.function_calling._backend_worker"

#: Wall-clock deadline of one backend call (ordinary calls take well under a millisecond).
CALL_TIMEOUT_S = 2.0
#: Whole-state requests (load, thaw, freeze, state check, probe) get this many call deadlines.
STATE_FACTOR = 5.0
#: Address-space cap of a worker (bfcl-eval and a long-context state need about 0.1 GB of it).
MEMORY_LIMIT_BYTES = 3 << 30
#: A worker that has not said it is ready by then is given up.
STARTUP_TIMEOUT_S = 30.0
_MAX_REPLY_BYTES = 1 << 20
_MAX_STATE_BYTES = 1 << 30
_PROTOCOL = pickle.HIGHEST_PROTOCOL


class BackendFailure(Exception):
    """The worker missed its deadline, died or broke the protocol (it has been killed)."""


@dataclass(frozen=True)
class BackendState:
    """A frozen backend state: ``base`` (a worker's frozen bytes, or None for the task's scenario) with
    ``calls`` (pickled ``(name, args, kwargs)``) replayed on it. Immutable; restorable any number of times."""

    base: bytes | None
    calls: tuple[bytes, ...] = ()

    def digest(self) -> str:
        h = hashlib.sha256(b"-" if self.base is None else b"+" + self.base)
        for call in self.calls:
            h.update(struct.pack(">I", len(call)) + call)
        return h.hexdigest()


class _Worker:
    """One child process and its pipes, with deadline-bounded frame reads."""

    def __init__(self) -> None:
        self.pid_of_parent = os.getpid()
        self.proc = subprocess.Popen(
            [sys.executable, "-I", "-m", "trace_envs.function_calling._backend_worker", str(os.getpid()),
             str(MEMORY_LIMIT_BYTES)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            close_fds=True, start_new_session=True,
        )
        self.known: set[str] = set()
        self._pending = bytearray()
        self._finalizer = weakref.finalize(self, _kill, self.proc, self.pid_of_parent)
        if self.read(time.monotonic() + STARTUP_TIMEOUT_S, 64) != b"ready":
            self.kill()
            raise BackendFailure("the backend worker did not start")

    def send(self, request: Mapping[str, Any]) -> None:
        body = pickle.dumps(dict(request), protocol=_PROTOCOL)
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(struct.pack(">I", len(body)) + body)
            self.proc.stdin.flush()
        except OSError as exc:
            raise BackendFailure("the backend worker is gone") from exc

    def read(self, deadline: float, limit: int = _MAX_REPLY_BYTES) -> bytes:
        (size,) = struct.unpack(">I", self._read_exactly(4, deadline))
        if size > limit:
            raise BackendFailure("oversized reply")
        return self._read_exactly(size, deadline)

    def reply(self, deadline: float) -> dict[str, Any]:
        """The next JSON reply; BackendFailure on timeout, death or garbage."""
        try:
            obj = json.loads(self.read(deadline))
        except ValueError as exc:
            raise BackendFailure("reply off the protocol") from exc
        if not isinstance(obj, dict) or obj.get("ok") is not True:
            raise _Refused(str(obj.get("error", "?")) if isinstance(obj, dict) else "?")
        return obj

    def _read_exactly(self, size: int, deadline: float) -> bytes:
        """``size`` bytes from the worker's stdout (read ahead in chunks: replies streamed together are
        taken in one read) before ``deadline``."""
        assert self.proc.stdout is not None
        fd, buf = self.proc.stdout.fileno(), self._pending
        while len(buf) < size:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
                raise _TimedOut
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                raise BackendFailure("the backend worker died")
            buf += chunk
        data = bytes(buf[:size])
        del buf[:size]
        return data

    def kill(self) -> None:
        """Kill and reap the process (in a forked child: only drop the pipes, the parent owns it)."""
        if self.pid_of_parent == os.getpid():
            self._finalizer()
        else:
            self._finalizer.detach()
            _close_pipes(self.proc)


class _TimedOut(BackendFailure):
    """The worker missed the request's deadline."""


class _Refused(Exception):
    """The worker answered an error reply (it is still serving)."""


def _close_pipes(proc: subprocess.Popen) -> None:
    for pipe in (proc.stdin, proc.stdout):
        if pipe is not None:
            try:
                pipe.close()
            except OSError:
                pass


def _kill(proc: subprocess.Popen, parent: int) -> None:
    """Kill and reap ``proc`` when this process started it; in a forked child only close the pipes."""
    if os.getpid() == parent:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    _close_pipes(proc)


def check_backend_worker() -> None:
    """Start one backend worker and stop it.

    Raises:
        EnvSetupError: the worker does not start (the message names its command and the cause).
    """
    from trace_envs.errors import EnvSetupError

    try:
        worker = _Worker()
    except (BackendFailure, OSError) as exc:
        raise EnvSetupError(f"BFCL-v0's backend worker ({WORKER_COMMAND}) does not start: {exc}. Check that "
                            f"this Python imports bfcl_eval (pip install --no-deps bfcl-eval; pip install "
                            f"'trace-gym[bfcl]')") from None
    worker.kill()


class RemoteBackends:
    """The backends of one env's episode, in a worker process; the env's only view of them.

    :meth:`start` loads a task's scenario; :meth:`call_many` runs a step's calls; :meth:`state` /
    :meth:`restore` snapshot and restore; :meth:`compare` is the state check of a user turn. None of
    these raise for anything a model can do: a failed call is an error outcome, a state that cannot be
    frozen is snapshotted as its recipe, a failed state check is reported as None.
    """

    def __init__(self, *, timeout_s: float = CALL_TIMEOUT_S) -> None:
        self.timeout_s = timeout_s
        self._worker: _Worker | None = None
        self._lock = threading.RLock()
        self._spec: dict[str, Any] = {}
        self._classes: dict[str, type] = {}
        self._owner: dict[str, str] = {}
        self._base: bytes | None = None
        self._log: list[bytes] = []
        self._synced = False
        #: True after a step whose calls got no answer because no worker could be (re)started.
        self.unavailable = False

    # --------------------------------------------------------------- episode
    def start(self, involved_classes: Sequence[str], initial_config: Mapping[str, Any], *,
              long_context: bool) -> None:
        """Fresh instances of the classes loaded with their scenario, as BFCL's executor does.

        Raises:
            BackendFailure: the worker could not load the scenario (a caller's task, not the model's).
        """
        with self._lock:
            self._classes = {name: backend_class(name) for name in involved_classes}
            self._owner = method_owners(self._classes)
            self._spec = {"op": "load", "classes": list(involved_classes), "config": dict(initial_config),
                          "long_context": long_context}
            self._base, self._log, self._synced = None, [], False
            self._sync()

    def call_many(self, calls: Sequence[tuple[str, Sequence[Any], Mapping[str, Any]]], *,
                  allowed: Collection[str] | None = None) -> list[CallOutcome]:
        """Run the calls in order; each gets :attr:`timeout_s`. A call past it has no effect (the worker
        is rebuilt without it) and an error result; the calls after it still run."""
        with self._lock:
            outcomes: list[CallOutcome | None] = [None] * len(calls)
            blobs: dict[int, bytes] = {}
            for index, (name, args, kwargs) in enumerate(calls):
                try:
                    blobs[index] = pickle.dumps((name, tuple(args), dict(kwargs)), protocol=_PROTOCOL)
                except (RecursionError, MemoryError, TypeError, ValueError, pickle.PicklingError) as exc:
                    outcomes[index] = _outcome(calls[index], f"Error: {name}: the arguments cannot be copied "
                                                             f"({type(exc).__name__}).", True, None)
            pending = sorted(blobs)
            allowed_list = None if allowed is None else sorted(allowed)
            retry = True
            while pending:
                pending, retry = self._run_some(calls, blobs, pending, allowed_list, outcomes, retry)
            return [o for o in outcomes if o is not None]

    def _run_some(self, calls: Sequence[Any], blobs: Mapping[int, bytes], pending: list[int],
                  allowed: list[str] | None, outcomes: list[CallOutcome | None],
                  retry: bool) -> tuple[list[int], bool]:
        """Send the pending calls; fill their outcomes until one fails. Returns the calls still to run and
        whether a worker found dead before it answered anything may still be retried (once per step)."""
        idle = self._worker is not None and self._synced
        try:
            worker = self._sync()
            worker.send({"op": "calls", "calls": [blobs[i] for i in pending], "allowed": allowed})
        except BackendFailure:
            if idle and retry:
                self._drop()
                return pending, False
            self.unavailable = True
            for i in pending:
                outcomes[i] = _outcome(calls[i], "Error during execution: the backend could not be rebuilt "
                                                 "after an earlier failure", True, None)
            return [], False
        self.unavailable = False
        for position, index in enumerate(pending):
            try:
                reply = worker.reply(time.monotonic() + self.timeout_s)
            except (BackendFailure, _Refused) as exc:
                self._drop()
                timed_out = isinstance(exc, _TimedOut)
                if idle and retry and position == 0 and not timed_out and not isinstance(exc, _Refused):
                    return pending, False  # it died while idle (killed from outside): ask a fresh one
                why = (f"the call exceeded its {self.timeout_s:g} s limit" if timed_out
                       else "the call failed (its backend process died)")
                outcomes[index] = _outcome(calls[index], f"Error during execution: {why}", True, None)
                return pending[position + 1:], False
            outcomes[index] = _reply_outcome(calls[index], reply)
            if reply.get("class_name") is not None:
                self._log.append(blobs[index])
        return [], False

    # -------------------------------------------------------------- snapshots
    def freeze(self) -> bytes | None:
        """The full state (private attributes and RNGs included) as opaque bytes, or None when the worker
        cannot freeze it (too deep, too slow, or the worker cannot be rebuilt)."""
        with self._lock:
            try:
                worker = self._sync()
                worker.send({"op": "freeze"})
                deadline = time.monotonic() + STATE_FACTOR * self.timeout_s
                worker.reply(deadline)
                blob = worker.read(deadline, _MAX_STATE_BYTES)
            except _Refused:
                return None
            except BackendFailure:
                self._drop()
                return None
            self._base, self._log = blob, []
            return blob

    def state(self) -> BackendState:
        """The current state for a snapshot: frozen bytes, or else the recipe (last frozen state + calls since)."""
        with self._lock:
            blob = self.freeze()
            if blob is not None:
                return BackendState(blob)
            return BackendState(self._base, tuple(self._log))

    def restore(self, state: BackendState) -> None:
        """Make ``state`` current (the worker is brought to it on the next request); never raises."""
        with self._lock:
            if self._synced and not self._log and state.base is not None and state.base is self._base \
                    and not state.calls:
                return
            self._base, self._log, self._synced = state.base, list(state.calls), False

    # ------------------------------------------------------------- checking
    def compare(self, key: str, truth_states: bytes) -> dict[str, list[str]] | None:
        """{class: public attributes that differ from the pickled ground-truth states} ({} when equal), or
        None when the check could not be made in time. ``key`` names ``truth_states`` (a digest)."""
        with self._lock:
            try:
                worker = self._sync()
                worker.send({"op": "compare", "key": key, "states": None if key in worker.known else truth_states})
                worker.known.add(key)
                reply = worker.reply(time.monotonic() + STATE_FACTOR * self.timeout_s)
            except _Refused:
                return None
            except BackendFailure:
                self._drop()
                return None
            differences = reply.get("differences")
            if not isinstance(differences, dict):
                return None
            return {str(k): [str(a) for a in v] for k, v in differences.items() if isinstance(v, list)}

    def probe(self, calls: Sequence[tuple[str, Sequence[Any], Mapping[str, Any]]]) -> int | None:
        """The index of the first call that runs and changes the current state (tried on copies), or None."""
        with self._lock:
            blobs = [pickle.dumps((n, tuple(a), dict(k)), protocol=_PROTOCOL) for n, a, k in calls]
            try:
                worker = self._sync()
                worker.send({"op": "probe", "calls": blobs})
                index = worker.reply(time.monotonic() + STATE_FACTOR * self.timeout_s).get("index")
            except _Refused:
                return None
            except BackendFailure:
                self._drop()
                return None
            return index if isinstance(index, int) and 0 <= index < len(calls) else None

    # ------------------------------------------------------------- metadata
    def function_names(self) -> list[str]:
        """Every public method name of the involved classes."""
        return list(self._owner)

    def with_keywords(self, name: str, args: Sequence[Any], kwargs: Mapping[str, Any]) -> dict[str, Any]:
        """The call's arguments as keywords only (see :func:`~trace_envs.function_calling.backends.keyword_arguments`)."""
        return keyword_arguments(self._classes, self._owner, name, args, kwargs)

    # ----------------------------------------------------------- inspection
    @property
    def instances(self) -> dict[str, Any]:
        """A host-side copy of the live instances, for tests and benchmarks only: it unpickles the
        worker's frozen state in this process, which the env itself never does."""
        blob = self.freeze()
        if blob is None:
            raise BackendFailure("the backend state cannot be frozen")
        return Backends.thaw(blob).instances

    def public_states(self) -> dict[str, dict[str, Any]]:
        """{class name: public attributes} of a host-side copy (tests only, see :attr:`instances`)."""
        return Backends(self.instances).public_states()

    def close(self) -> None:
        """Kill the worker; a later request starts a new one."""
        with self._lock:
            self._drop()

    # -------------------------------------------------------------- workers
    def _drop(self) -> None:
        if self._worker is not None:
            self._worker.kill()
        self._worker, self._synced = None, False

    def _sync(self) -> _Worker:
        """A live worker holding the current state (rebuilt from the recipe when needed).

        Raises:
            BackendFailure: the worker could not be started or rebuilt (it has been dropped).
        """
        worker = self._worker
        if worker is not None and (worker.pid_of_parent != os.getpid() or worker.proc.poll() is not None):
            self._drop()
            worker = None
        if worker is not None and self._synced:
            return worker
        try:
            worker = worker or _Worker()
            self._worker = worker
            self._rebuild(worker)
        except (BackendFailure, _Refused, OSError) as exc:
            self._drop()
            raise BackendFailure(f"the backend state could not be rebuilt ({type(exc).__name__}: {exc})") from exc
        self._synced = True
        return worker

    def _rebuild(self, worker: _Worker) -> None:
        """Load the recipe into ``worker``: the base state (or the scenario), then the calls since."""
        deadline = time.monotonic() + STATE_FACTOR * self.timeout_s
        worker.send(self._spec if self._base is None else {"op": "thaw", "state": self._base})
        worker.reply(deadline)
        if self._log:
            worker.send({"op": "calls", "calls": self._log, "allowed": None})
            for _ in self._log:
                worker.reply(time.monotonic() + self.timeout_s)


def _outcome(call: tuple[str, Sequence[Any], Mapping[str, Any]], result: str, error: bool,
             class_name: str | None) -> CallOutcome:
    name, args, kwargs = call
    return CallOutcome(name=name, args=tuple(args), kwargs=dict(kwargs), result=result, error=error,
                       class_name=class_name)


def _reply_outcome(call: tuple[str, Sequence[Any], Mapping[str, Any]], reply: Mapping[str, Any]) -> CallOutcome:
    result, error, class_name = reply.get("result"), reply.get("error"), reply.get("class_name")
    if not isinstance(result, str) or not isinstance(error, bool) or not isinstance(class_name, (str, type(None))):
        return _outcome(call, "Error during execution: the call's reply was off the protocol", True, None)
    return _outcome(call, result, error, class_name)
