"""The run directory's rules: resume exactly as configured, never overwrite a run by accident.

* ``trace-gym train --resume DIR`` continues with ``DIR/config.yaml`` (:func:`resume_config`). A
  config or overrides given beside it must agree with the saved one except in
  :data:`RESUMABLE_CHANGES` (``steps``, to train longer; ``log.progress``); otherwise the
  resume is refused with every differing field named.
* ``trace-gym train --out DIR`` refuses a directory that already holds a run
  (:func:`check_fresh`) unless ``--overwrite`` clears its artefacts (:func:`clear_run`).
* One writer per run directory (:func:`lock_run_dir`): ``trace-gym train`` and ``--resume`` take an
  exclusive ``fcntl.flock`` on ``DIR/run.lock`` before writing anything and hold it for the run's
  life; a second run or resume of a locked directory is refused with :class:`RunDirError` naming
  the holder's pid and host. The kernel drops the lock when its holder exits, however it exits
  (SIGKILL and power loss included), so a dead run's lock is taken over by the next run. A lock
  file on a network file system is only as exclusive as that file system's ``flock``.
* A stopped run says how to continue (:class:`TrainingStopped`): Ctrl-C (SIGINT), SIGTERM and
  SIGHUP stop it alike (:func:`stop_signals`); the exit status is ``128 + signal number``.
* A run directory never names code to import: a saved config whose ``rollout.strategy`` is a
  ``module:attribute`` spec, or whose ``env_id`` is a ``module.path:EnvName-v0`` id (whose module
  :mod:`trace_agent.env_factory` would import), is resumed only when the caller gives the same spec
  itself (in ``given``, e.g. ``--env mypkg.envs:Guess-v0`` beside ``--resume``), allows it
  (``resume_config(..., allow_code=("mypkg.strats:Mine",))``) or lists it in the :data:`ALLOW_CODE_ENV`
  environment variable (comma-separated); otherwise :func:`resume_config` raises
  :class:`~trace_agent.errors.ConfigError` saying how to allow it, before anything is imported.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import socket
import sys
import threading
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from trace_agent.config import TrainConfig
from trace_agent.config_io import config_to_dict, load_config
from trace_agent.errors import ConfigError, RunDirError

__all__ = [
    "ALLOW_CODE_ENV",
    "RESUMABLE_CHANGES",
    "RUN_ARTIFACTS",
    "RunDirError",
    "LOCK_FILE",
    "STOP_SIGNALS",
    "TrainingStopped",
    "lock_run_dir",
    "stop_signals",
    "raise_if_stopped",
    "raises_keyboard_interrupt",
    "deferred_stops",
    "config_differences",
    "named_code",
    "allowed_code",
    "resume_config",
    "is_run",
    "check_fresh",
    "clear_run",
]

#: Fields a resumed run may change (dotted paths).
RESUMABLE_CHANGES: tuple[str, ...] = ("steps", "log.progress")

#: Environment variable listing the ``module:attribute`` specs a resumed run's saved config may name.
ALLOW_CODE_ENV = "TRACE_GYM_ALLOW_CODE"

#: What ``trace-gym train`` writes into a run directory (what ``--overwrite`` removes).
RUN_ARTIFACTS: tuple[str, ...] = ("config.yaml", "metrics.jsonl", "tb", "checkpoints", "trees", "policy",
                                  "learning_curves.png", "summary.json", "wandb", "wandb_id.txt")


#: The lock file every writer of a run directory holds (:func:`lock_run_dir`); not a run artefact.
LOCK_FILE = "run.lock"

#: Signals that stop a run as Ctrl-C does (:func:`stop_signals`).
STOP_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class TrainingStopped(KeyboardInterrupt):
    """A stop signal (Ctrl-C / SIGINT, SIGTERM, SIGHUP) ended a run; ``message`` says where and how to resume.

    ``exit_status`` is ``128 + signum`` (130 for SIGINT, 143 for SIGTERM, 129 for SIGHUP), what a
    shell reports for a process the signal ended, so schedulers read the stop as the signal's.
    """

    def __init__(self, *, out_dir: str | Path, step: int, checkpoint_step: int | None,
                 signum: int = signal.SIGINT) -> None:
        self.out_dir = str(out_dir)
        self.step = step
        self.checkpoint_step = checkpoint_step
        self.signum = int(signum)
        super().__init__(self.message)

    @property
    def exit_status(self) -> int:
        return 128 + self.signum

    @property
    def message(self) -> str:
        resume = f"trace-gym train --resume {shlex.quote(self.out_dir)}"
        by = "" if self.signum == signal.SIGINT else f" by {signal.Signals(self.signum).name}"
        if self.checkpoint_step is None:
            return (f"stopped after step {self.step}{by}, before the first checkpoint: start it again "
                    f"(with --overwrite)")
        saved = "" if self.checkpoint_step == self.step else f" (last checkpoint: step {self.checkpoint_step})"
        return f"stopped after step {self.step}{by}{saved}; resume with: {resume}"

    def __str__(self) -> str:
        return self.message


class _Held:
    """A lock this process holds on one run directory (re-entered by nested :func:`lock_run_dir` calls)."""

    def __init__(self, fd: int) -> None:
        self.fd, self.depth = fd, 0


_HELD: dict[str, _Held] = {}
_HELD_LOCK = threading.Lock()


def _holder(path: Path) -> str:
    try:
        with path.open("rb") as fh:
            text = fh.read(256).decode("utf-8", "replace").split()
    except OSError:
        text = []
    fields = dict(item.split("=", 1) for item in text if "=" in item)
    pid, host = fields.get("pid", "?"), fields.get("host", "?")
    return f"pid {pid} on host {host}"


@contextlib.contextmanager
def lock_run_dir(path: str | Path) -> Iterator[Path]:
    """Hold the exclusive lock of run directory ``path`` (created if missing) for the ``with`` block.

    The lock is an ``fcntl.flock`` on ``path/run.lock`` (:data:`LOCK_FILE`), whose text names the
    holder (``pid=... host=...``). Taken without waiting: a directory another process holds raises
    :class:`RunDirError` naming that process's pid and host. Re-entrant within one process (a
    ``trace-gym train`` takes it before clearing or checking the directory, and
    :func:`~trace_agent.run.run_training` inside it again). A lock whose holder died is free:
    the kernel releases ``flock`` locks with the last descriptor of their file.
    """
    import fcntl

    run = Path(path)
    run.mkdir(parents=True, exist_ok=True)
    key = str(run.resolve())
    with _HELD_LOCK:
        held = _HELD.get(key)
        if held is None:
            lock_path = run / LOCK_FILE
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | os.O_CLOEXEC, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise RunDirError(f"{run} is in use by another trace-gym run ({_holder(lock_path)}): wait for it "
                                  f"to end or stop it (Ctrl-C / SIGTERM), or choose another --out") from None
            except BaseException:
                os.close(fd)
                raise
            os.ftruncate(fd, 0)
            os.write(fd, f"pid={os.getpid()} host={socket.gethostname()}\n".encode())
            held = _HELD[key] = _Held(fd)
        held.depth += 1
    try:
        yield run
    finally:
        with _HELD_LOCK:
            held.depth -= 1
            if held.depth == 0:
                del _HELD[key]
                os.close(held.fd)  # closing the last descriptor releases the flock


def raises_keyboard_interrupt(handler: Any) -> bool:
    """Whether a SIGINT handler raises ``KeyboardInterrupt``: Python's default one, or the one :func:`stop_signals` installs."""
    return handler is signal.default_int_handler or bool(getattr(handler, "raises_keyboard_interrupt", False))


@contextlib.contextmanager
def stop_signals() -> Iterator[list[int]]:
    """Within the block, SIGINT, SIGTERM and SIGHUP stop the run alike; yields the list each stop is appended to.

    Every stop is recorded, then goes to the SIGINT handler in force when it arrives (ours raises
    ``KeyboardInterrupt`` at once; :func:`~trace_agent.rollout.run_interruptibly`'s cancels the
    collection and raises when its loop is done), so a step is finished or abandoned the same way
    whichever signal came. The record is what makes a stop certain: a ``KeyboardInterrupt`` raised
    while the main thread runs a finalizer (``__del__``, a weakref callback: Python prints
    "Exception ignored" and goes on) is lost, and the training loop checks the list at every step
    boundary (:func:`raise_if_stopped`). A signal this process inherited as ignored (``nohup``
    ignores SIGHUP, a background job SIGINT) stays ignored; a handler a library installed (Ray's
    ``ray.init`` sets one that exits at once) is replaced for the block; outside the main thread
    nothing is installed. The previous handlers come back when the block ends.

    A stop lost that way is not reported as an error either: while Python's own ``sys.unraisablehook``
    is in force, the block's hook drops a ``KeyboardInterrupt`` of a recorded stop (the user sees where
    the run stopped, not a finalizer's traceback) and hands every other unraisable exception on.
    """
    caught: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield caught
        return

    def stop(signum: int, frame: Any) -> None:
        caught.append(signum)
        handler = signal.getsignal(signal.SIGINT)
        if callable(handler) and handler is not stop:
            handler(signal.SIGINT, frame)
        else:
            signal.default_int_handler(signal.SIGINT, frame)

    def quiet(unraisable: Any) -> None:
        if caught and isinstance(unraisable.exc_value, KeyboardInterrupt):
            return  # on record: the loop stops at the next step boundary and says so
        sys.__unraisablehook__(unraisable)

    stop.raises_keyboard_interrupt = True  # type: ignore[attr-defined]
    previous: dict[int, Any] = {}
    for sig in STOP_SIGNALS:
        handler = signal.getsignal(sig)
        if handler is not signal.SIG_IGN and handler is not None:
            previous[sig] = signal.signal(sig, stop)
    hooked = sys.unraisablehook is sys.__unraisablehook__  # a hook someone else set is theirs to keep
    if hooked:
        sys.unraisablehook = quiet
    try:
        yield caught
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if hooked and sys.unraisablehook is quiet:
            sys.unraisablehook = sys.__unraisablehook__


def raise_if_stopped(caught: Sequence[int]) -> None:
    """Raise ``KeyboardInterrupt`` if :func:`stop_signals` recorded a stop (one whose own exception was lost)."""
    if caught:
        raise KeyboardInterrupt


@contextlib.contextmanager
def deferred_stops() -> Iterator[None]:
    """Hold SIGINT, SIGTERM and SIGHUP back for the block (a checkpoint being written); they act when it ends.

    Within the block their handlers only record them; when it ends the handlers in force before come
    back and the first signal that came is handed to its own (a default action is taken by sending
    the signal again). A stop therefore never leaves the checkpoint it interrupted half-written or its
    step unrecorded. (Blocking with ``pthread_sigmask`` would not do: another thread of the process
    takes the signal and Python runs the handler in the main thread all the same.) An ignored signal
    stays ignored; outside the main thread nothing changes.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[int] = []

    def hold(signum: int, frame: Any) -> None:
        held.append(signum)

    previous: dict[int, Any] = {}
    for sig in STOP_SIGNALS:
        handler = signal.getsignal(sig)
        if handler is not signal.SIG_IGN and handler is not None:
            previous[sig] = signal.signal(sig, hold)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if held:
            handler = previous[held[0]]
            if callable(handler):
                handler(held[0], None)
            else:  # SIG_DFL: the signal's own action, now that the block is over
                os.kill(os.getpid(), held[0])


def _flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(data, dict) and data:
        out: dict[str, Any] = {}
        for k, v in data.items():
            out.update(_flatten(v, f"{prefix}{k}."))
        return out
    return {prefix.rstrip("."): data}


def config_differences(saved: TrainConfig, given: TrainConfig, *, ignore: tuple[str, ...] = ()) -> list[str]:
    """``field: saved -> given`` for every dotted field that differs (except those in ``ignore``)."""
    a, b = _flatten(config_to_dict(saved)), _flatten(config_to_dict(given))
    out = []
    for key in sorted(set(a) | set(b)):
        if key in ignore or any(key.startswith(i + ".") for i in ignore):
            continue
        if a.get(key) != b.get(key):
            out.append(f"{key}: {a.get(key)!r} (saved) -> {b.get(key)!r} (given)")
    return out


def is_run(path: str | Path) -> bool:
    """True when ``path`` holds a run's config or checkpoints."""
    p = Path(path)
    return (p / "config.yaml").is_file() or (p / "checkpoints").is_dir()


def named_code(config: TrainConfig) -> dict[str, str]:
    """``{dotted field: "module:attribute"}`` for every field of ``config`` that names code to import:
    a ``module:attribute`` ``rollout.strategy`` and a ``module.path:EnvName-v0`` ``env_id``."""
    fields = (("env_id", config.env_id), ("rollout.strategy", config.rollout.strategy))
    return {field: spec for field, spec in fields if isinstance(spec, str) and ":" in spec}


def allowed_code(allow_code: Iterable[str] = ()) -> frozenset[str]:
    """``allow_code`` plus the comma-separated specs in the :data:`ALLOW_CODE_ENV` environment variable."""
    listed = os.environ.get(ALLOW_CODE_ENV, "").split(",")
    return frozenset(str(s).strip() for s in (*allow_code, *listed) if str(s).strip())


def _refuse_named_code(run: Path, saved: TrainConfig, allowed: frozenset[str]) -> None:
    """Raise :class:`ConfigError` when ``saved`` (read from ``run``) names a ``module:attribute`` not in ``allowed``."""
    named = {field: spec for field, spec in named_code(saved).items() if spec not in allowed}
    if not named:
        return
    specs = ",".join(sorted(set(named.values())))
    fields = "; ".join(f"{f}: {v}" for f, v in sorted(named.items()))
    raise ConfigError(f"refusing to resume {run}: its config.yaml names code to import ({fields}) and a run "
                      f"directory never chooses code; if you trust it, allow it with {ALLOW_CODE_ENV}={specs} "
                      f"(or give the same spec yourself: --env or --strategy beside --resume, your own --config, or "
                      f"resume_config(..., allow_code=...))")


def resume_config(run_dir: str | Path, given: TrainConfig | None = None, *,
                  allow_code: Iterable[str] = ()) -> TrainConfig:
    """The config a resumed run continues with: ``run_dir/config.yaml``, or ``given`` when it agrees.

    ``given`` (built from a ``--config`` file and/or flags and ``--set`` overrides) may differ
    from the saved config only in :data:`RESUMABLE_CHANGES`; ``out_dir`` is always ``run_dir``.
    Raises :class:`RunDirError` naming every other difference, and
    :class:`~trace_agent.errors.ConfigError` when the saved config names a ``module:attribute``
    that neither ``given`` nor :func:`allowed_code` (``allow_code`` and :data:`ALLOW_CODE_ENV`) names.
    """
    run = Path(run_dir)
    path = run / "config.yaml"
    if not path.is_file():
        hint = " (it has checkpoints but no config.yaml)" if (run / "checkpoints").is_dir() else ""
        raise RunDirError(f"{run} is not a run directory{hint}: start a run there with trace-gym train --out {run}")
    saved = load_config(path)
    saved = TrainConfig(**{**saved.__dict__, "out_dir": str(run)})
    if given is None:
        _refuse_named_code(run, saved, allowed_code(allow_code))
        return saved
    given = TrainConfig(**{**given.__dict__, "out_dir": str(run)})
    diffs = config_differences(saved, given, ignore=RESUMABLE_CHANGES)
    if diffs:
        raise RunDirError(f"refusing to resume {run} with another config ({'; '.join(diffs)}): "
                          f"resume with --resume {run} alone (it uses the run's config.yaml; --steps may grow), "
                          f"or start a new run with another --out")
    _refuse_named_code(run, saved, allowed_code((*allow_code, *named_code(given).values())))
    return given


def check_fresh(path: str | Path) -> None:
    """Raise :class:`RunDirError` when ``path`` already holds a run (a fresh run would overwrite it)."""
    if is_run(path):
        raise RunDirError(f"{path} already holds a run: continue it with trace-gym train --resume {path}, "
                          f"choose another --out, or pass --overwrite to replace it")


def clear_run(path: str | Path) -> list[Path]:
    """Remove the run artefacts (:data:`RUN_ARTIFACTS`) under ``path``; other files stay. Returns what went."""
    gone = []
    for name in RUN_ARTIFACTS:
        p = Path(path) / name
        if p.is_dir():
            shutil.rmtree(p)
            gone.append(p)
        elif p.exists():
            p.unlink()
            gone.append(p)
    return gone
