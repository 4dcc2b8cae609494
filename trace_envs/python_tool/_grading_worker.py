"""Stage 3 of answer grading (math_verify / sympy) in killable child processes.

Why a process: sympy can run for seconds or minutes on text that passes the structural screen of
:mod:`trace_envs.python_tool.grading`, and a thread cannot be stopped reliably (an asynchronous
exception is only delivered between bytecodes, and a long C-level step holds the GIL, starving the
caller). A child process can be killed at its deadline, whatever it is doing, and its memory is
capped, so neither the grading caller nor the host is held up or shares the damage.

Host side: :func:`symbolic_verdict` checks a worker out of a per-process pool (spawning one when none
is idle), sends one request and waits for the answer. The budget is the worker's **CPU time**
(``timeout_s``, read from ``/proc/<pid>/stat``), so a verdict does not depend on how loaded the
machine is: a correct answer that needs one CPU second is accepted on an idle machine and on one with
load 20 alike. A wall-clock cap (:data:`WALL_FACTOR` × ``timeout_s``) still bounds the caller's wait,
a fresh worker's start included: a start that misses it goes on in the background (up to
:data:`STARTUP_TIMEOUT_S`) and the worker joins the pool once ready.
A worker that overruns either, dies or answers out of protocol is killed (SIGKILL) and reaped, and
the call's verdict is ``None`` ("not verified"). Healthy workers go back to the pool (at most
:data:`MAX_IDLE` kept), so math_verify is imported once per worker, not once per call. The pool is
thread-safe; after a ``fork`` the child starts its own pool and leaves its parent's workers alone.

Child side (``python -I _grading_worker.py``): imports math_verify, caps its address space
(:data:`MEMORY_LIMIT_BYTES`), writes a ready line, then answers one JSON line per request line. It
exits when its stdin closes or its parent is gone. The wire is JSON lines both ways (nothing is
unpickled), and the host reads at most :data:`_MAX_REPLY_BYTES` of a reply.

Request: ``{"predicted": str, "gold": str, "strict": bool}``; reply: ``{"verdict": bool}`` (False
for anything math_verify cannot parse or raises on).
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import select
import subprocess
import sys
import threading
import time
from typing import Any

#: Idle workers kept per host process (about 0.1 GB each); more are killed when returned. A host
#: grading from more threads at once than this pays a worker start (about 0.3 s) per extra call.
MAX_IDLE = max(8, os.cpu_count() or 8)
#: Address-space cap of a worker (math_verify and sympy need about 0.3 GB of it).
MEMORY_LIMIT_BYTES = 2 << 30
#: A worker that has not imported math_verify and said so by then is given up. The call that started it
#: waits at most until its own wall-clock cap; the start then goes on in the background, up to this.
STARTUP_TIMEOUT_S = 60.0
#: The caller waits at most this many times ``timeout_s`` of wall-clock time (the budget itself is CPU time).
WALL_FACTOR = 10.0
_POLL_S = 0.02
_MAX_REPLY_BYTES = 4096
_READY = b'{"ready": true}\n'


# ---------------------------------------------------------------------------------------- host side
class _WorkerDied(Exception):
    """The worker's pipe closed before it answered."""


class _StartTimedOut(Exception):
    """A fresh worker was not ready by the call's wall-clock deadline (it finishes starting in the background)."""


class _Worker:
    """One child process and its pipes; used by one caller at a time."""

    def __init__(self) -> None:
        """Spawn the child; it is not usable before :meth:`wait_ready` says so."""
        self.start_deadline = time.monotonic() + STARTUP_TIMEOUT_S
        self.proc = subprocess.Popen(
            [sys.executable, "-I", os.path.abspath(__file__), str(os.getpid())],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            close_fds=True, start_new_session=True,
        )

    def wait_ready(self, deadline: float) -> bool | None:
        """Wait for the ready line until ``deadline`` (and never past :data:`STARTUP_TIMEOUT_S` after the
        spawn): True once ready, None when the wait ran out with the child still starting, False when the
        child failed to start (it is killed)."""
        line = self._read_line(min(deadline, self.start_deadline))
        if line == _READY:
            return True
        if line is None and self.alive() and time.monotonic() < self.start_deadline:
            return None
        self.kill()
        return False

    def ask(self, request: dict[str, Any], cpu_s: float, wall_deadline: float) -> bool | None:
        """The worker's verdict, or None when it used more than ``cpu_s`` CPU seconds on it, passed
        ``wall_deadline`` (``time.monotonic()``) or broke the protocol; then it is killed.

        Raises:
            _WorkerDied: the worker was gone before it answered (its pipe closed).
        """
        cpu_start = self.cpu_seconds()
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write(json.dumps(request).encode() + b"\n")
            self.proc.stdin.flush()
        except OSError as err:
            raise _WorkerDied from err
        line = self._read_line(wall_deadline, cpu_start + cpu_s)
        if line == b"":
            raise _WorkerDied
        try:
            reply = json.loads(line) if line else None
        except ValueError:
            reply = None
        if not isinstance(reply, dict) or not isinstance(reply.get("verdict"), bool):
            self.kill()
            return None
        return reply["verdict"]

    def cpu_seconds(self) -> float:
        """User + system CPU time the worker has used so far (0 once it is gone). Imported here, not at the
        top: the child runs this file as a script, without the package."""
        from trace_envs.python_tool._host import proc_cpu_seconds

        return proc_cpu_seconds(self.proc.pid) or 0.0

    def _read_line(self, wall_deadline: float, cpu_deadline: float = float("inf")) -> bytes | None:
        """One reply line read before ``wall_deadline`` and before the worker's CPU time reaches
        ``cpu_deadline``; ``b""`` at end of file, None on timeout or over the size cap."""
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        data = b""
        while not data.endswith(b"\n"):
            remaining = wall_deadline - time.monotonic()
            if remaining <= 0 or len(data) > _MAX_REPLY_BYTES:
                return None
            ready, _, _ = select.select([fd], [], [], min(remaining, _POLL_S))
            if not ready:
                if self.cpu_seconds() > cpu_deadline:
                    return None
                continue
            chunk = os.read(fd, _MAX_REPLY_BYTES)
            if not chunk:
                return None if data else b""
            data += chunk
        return data

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.close_pipes()

    def close_pipes(self) -> None:
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                try:
                    pipe.close()
                except OSError:
                    pass


class _Pool:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._idle: list[_Worker] = []
        self._pid = os.getpid()

    def _forked(self) -> None:
        """In a forked child: forget (do not kill) the parent's workers; caller holds the lock."""
        if self._pid != os.getpid():
            for worker in self._idle:
                worker.close_pipes()
            self._idle, self._pid = [], os.getpid()

    def take(self, deadline: float) -> tuple[_Worker, bool]:
        """A worker, and whether it was reused from the pool (it may have died since). A fresh worker's
        start counts against ``deadline`` (``time.monotonic()``).

        Raises:
            OSError, RuntimeError: the worker could not be started.
            _StartTimedOut: it was still starting at ``deadline``; it is left to finish in the background
                (:meth:`_finish_start`), so a later call finds it in the pool.
        """
        with self._lock:
            self._forked()
            while self._idle:
                worker = self._idle.pop()
                if worker.alive():
                    return worker, True
                worker.kill()
        worker = _Worker()
        ready = worker.wait_ready(deadline)
        if ready:
            return worker, False
        if ready is None:
            threading.Thread(target=self._finish_start, args=(worker,), daemon=True).start()
            raise _StartTimedOut
        raise RuntimeError("grading worker did not start")

    def _finish_start(self, worker: _Worker) -> None:
        """Pool ``worker`` once it is ready; kill it when it is not ready within its start timeout."""
        if worker.wait_ready(worker.start_deadline):
            self.give_back(worker)

    def give_back(self, worker: _Worker) -> None:
        with self._lock:
            self._forked()
            if len(self._idle) < MAX_IDLE and worker.alive():
                self._idle.append(worker)
                return
        worker.kill()

    def shutdown(self) -> None:
        with self._lock:
            workers, self._idle = self._idle, []
            forked = self._pid != os.getpid()
        for worker in workers:
            if forked:
                worker.close_pipes()
            else:
                worker.kill()

    def idle_pids(self) -> list[int]:
        with self._lock:
            self._forked()
            return [worker.proc.pid for worker in self._idle]


_POOL = _Pool()
atexit.register(_POOL.shutdown)


def _start_error(err: BaseException) -> Exception:
    from trace_envs.errors import EnvSetupError

    return EnvSetupError(f"the grading worker ({sys.executable} -I {os.path.abspath(__file__)}) could not start: "
                         f"{type(err).__name__}: {err}. Symbolic answers cannot be graded; check that this Python "
                         f"runs and imports math_verify (pip install 'math-verify>=0.7')")


def check_grading_worker(timeout_s: float = STARTUP_TIMEOUT_S) -> None:
    """Start (or reuse) a grading worker and put it in the pool.

    Raises:
        EnvSetupError: no worker starts (the message names the command and the cause); a worker still
            starting after ``timeout_s`` is not an error (it joins the pool when ready).
    """
    try:
        worker, _ = _POOL.take(time.monotonic() + timeout_s)
    except _StartTimedOut:
        return
    except (OSError, RuntimeError) as err:
        raise _start_error(err) from None
    _POOL.give_back(worker)


def symbolic_verdict(predicted: str, gold: str, *, strict: bool, timeout_s: float) -> bool | None:
    """math_verify's verdict on ``predicted`` vs ``gold`` (stage 3 of grading), from a worker process.

    ``strict`` and the verdict are :func:`verify`'s. ``timeout_s`` is the worker's CPU time for this
    call; the wait is capped at ``WALL_FACTOR * timeout_s`` of wall-clock time, a fresh worker's start
    included. Returns None when the worker overran either (it is killed), died on this request, or was not
    started by the cap (it goes on starting in the background and joins the pool); a pooled worker found
    dead is replaced by a fresh one under the same wall-clock cap.

    Raises:
        EnvSetupError: no worker can be started (a broken install, not anything a model wrote): a verdict
            of "not equivalent" for every symbolic answer would be a quiet training signal.
    """
    wall_deadline = time.monotonic() + WALL_FACTOR * timeout_s
    request = {"predicted": predicted, "gold": gold, "strict": strict}
    while True:
        try:
            worker, reused = _POOL.take(wall_deadline)
        except _StartTimedOut:
            return None
        except (OSError, RuntimeError) as err:
            raise _start_error(err) from None
        try:
            verdict = worker.ask(request, timeout_s, wall_deadline)
        except _WorkerDied:
            worker.kill()
            if reused:
                continue  # it died while idle (killed from outside): ask a fresh one
            return None
        except Exception:  # noqa: BLE001 - a broken fd: this worker is done, the answer is "not verified"
            worker.kill()
            return None
        if verdict is not None:
            _POOL.give_back(worker)
        return verdict


# --------------------------------------------------------------------------------------- child side
def _as_latex(s: str) -> str:
    """Wrap bare text in ``$...$`` so math_verify's LaTeX extraction reads it whole."""
    if "\\boxed" in s or "$" in s or "\\(" in s or "\\[" in s:
        return s
    return f"${s}$"


def verify_like_verl(mv: Any, predicted: str, gold: str) -> bool:
    """verl's math-verify reward on ``\\boxed{predicted}``: LaTeX extraction on both sides, 6-decimal rounding."""
    latex_only = [mv.LatexExtractionConfig()]
    gold_parsed = mv.parse("\\boxed{" + gold + "}", latex_only, parsing_timeout=None)
    if not gold_parsed:
        return False
    pred_parsed = mv.parse("\\boxed{" + predicted + "}", latex_only, parsing_timeout=None)
    if not pred_parsed:
        return False
    return bool(mv.verify(gold_parsed, pred_parsed, float_rounding=6, timeout_seconds=None))


def verify_symbolic(mv: Any, predicted: str, gold: str) -> bool:
    """math_verify's default reading of both sides; prose falls back to plain-expression extraction."""
    gold_parsed = mv.parse(_as_latex(gold), parsing_timeout=None)
    if not gold_parsed:
        return False
    pred_parsed = mv.parse(_as_latex(predicted), parsing_timeout=None)
    if not pred_parsed:
        pred_parsed = mv.parse(predicted, parsing_timeout=None)  # plain-expression extraction from prose
    if not pred_parsed:
        return False
    return bool(mv.verify(gold_parsed, pred_parsed, timeout_seconds=None))


def verify(mv: Any, predicted: str, gold: str, *, strict: bool) -> bool:
    """Stage 3's verdict (what a worker answers): :func:`verify_symbolic` when ``strict``, else verl's
    reading (:func:`verify_like_verl`) first."""
    if strict:
        return verify_symbolic(mv, predicted, gold)
    return verify_like_verl(mv, predicted, gold) or verify_symbolic(mv, predicted, gold)


def _answer(mv: Any, line: bytes) -> bool:
    try:
        request = json.loads(line)
        predicted, gold, strict = request["predicted"], request["gold"], request["strict"]
        if not (isinstance(predicted, str) and isinstance(gold, str)):
            return False
        return verify(mv, predicted, gold, strict=bool(strict))
    except BaseException:  # noqa: BLE001 - MemoryError, RecursionError, anything sympy raises: "not equivalent"
        return False


def _watch_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(0.5)
    os._exit(0)


def _child_main(parent: int) -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT_BYTES, MEMORY_LIMIT_BYTES))
    logging.disable(logging.CRITICAL)  # math_verify warns that its own (signal) timeouts are off
    import math_verify

    threading.Thread(target=_watch_parent, args=(parent,), daemon=True).start()
    out = sys.stdout.buffer
    out.write(_READY)
    out.flush()
    for line in sys.stdin.buffer:
        out.write(json.dumps({"verdict": _answer(math_verify, line)}).encode() + b"\n")
        out.flush()


if __name__ == "__main__":
    _child_main(int(sys.argv[1]))
