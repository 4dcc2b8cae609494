"""Host side of the persistent, forkable Python sandbox.

A :class:`Sandbox` owns one process tree (see ``_server.py``): a keeper, a
pristine *base* interpreter, one *live* interpreter that runs cells, and any
number of *frozen* copies made by ``fork``. Copy-on-write ``fork`` makes a
snapshot cost the same whatever the history: :meth:`Sandbox.freeze` copies
the live interpreter into a :class:`FrozenInterpreter`; :meth:`Sandbox.thaw`
makes a new live interpreter from a frozen one (which stays reusable).

Isolation, strongest available first (``Sandbox.isolation`` lists what is active):

* OS level, where the host runs as root on Linux: a network namespace with no
  interfaces, a mount namespace in which /tmp, /var/tmp and /dev/shm are
  read-only, a dropped uid unique to the sandbox, ``no_new_privs``;
* resource limits on every process: address space, CPU time per cell and in
  total, file size, process count (the count only binds for a non-root uid);
* in-process: a per-cell wall-clock alarm, an output cap, and an audit hook
  that refuses writes outside the work directory, new processes, signals and
  sockets while user code runs. The audit hook is a guard, not a security
  boundary (ctypes can bypass it); without root it is the main line of defence.

The host enforces the wall-clock limit too: a cell that does not return within
``timeout_s + kill_grace_s`` has its process group killed.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trace_envs.errors import SandboxError, SnapshotError, SnapshotLimitError

__all__ = ["SandboxConfig", "CellResult", "FrozenInterpreter", "Sandbox", "SandboxCrashed"]

_SERVER = Path(__file__).with_name("_server.py")
_uid_counter = itertools.count()
_UID_BASE = 200_000 + random.SystemRandom().randrange(0, 800_000, 1000)


@dataclass(frozen=True, kw_only=True)
class SandboxConfig:
    """Limits and isolation of one sandbox.

    Attributes:
        timeout_s: wall-clock limit of one cell (the alarm inside; the host kills after ``kill_grace_s`` more).
        kill_grace_s: extra time the host waits before killing a cell that ignores the alarm.
        cpu_s: CPU-time limit of one cell.
        cpu_total_s: CPU-time limit of one interpreter over its whole life.
        memory_mb: address-space limit of each sandbox process.
        file_mb: largest file a cell may write.
        output_chars: output kept per cell; the rest is counted and dropped.
        max_processes: process cap of the sandbox's uid (frozen copies count).
        max_frozen: live frozen copies allowed at once (snapshots beyond it raise SnapshotLimitError).
        network_namespace: isolate the network where the platform allows.
        drop_privileges: run user code under a fresh uid when the host is root.
        preload: modules imported once in the keeper so that every interpreter starts warm.
    """

    timeout_s: float = 10.0
    kill_grace_s: float = 2.0
    cpu_s: int = 10
    cpu_total_s: int = 3600
    memory_mb: int = 1024
    file_mb: int = 16
    output_chars: int = 8192
    max_processes: int = 512
    max_frozen: int = 256
    network_namespace: bool = True
    drop_privileges: bool = True
    preload: tuple[str, ...] = ("math", "fractions", "itertools", "functools", "collections", "random",
                                "numpy", "numpy.random", "sympy")

    def __post_init__(self) -> None:
        if self.timeout_s <= 0 or self.cpu_s <= 0 or self.memory_mb < 64 or self.output_chars < 1:
            raise ValueError("SandboxConfig limits must be positive (memory_mb >= 64)")
        if self.max_frozen < 1 or self.max_processes <= self.max_frozen:
            raise ValueError("need max_frozen >= 1 and max_processes > max_frozen")


@dataclass(frozen=True)
class CellResult:
    """The outcome of one cell: its output (stdout, stderr and any traceback, in order)."""

    ok: bool
    output: str
    truncated_chars: int = 0
    crashed: bool = False


class SandboxCrashed(SandboxError):
    """The live interpreter died or was killed (the host process is unaffected)."""


def _send(sock: socket.socket, obj: Any, fds: tuple[int, ...] = ()) -> None:
    data = json.dumps(obj).encode()
    frame = struct.pack(">I", len(data)) + data
    if fds:
        socket.send_fds(sock, [frame], list(fds))
    else:
        sock.sendall(frame)


def _recv(sock: socket.socket, timeout: float | None) -> dict[str, Any]:
    sock.settimeout(timeout)
    head = b""
    while len(head) < 4:
        chunk = sock.recv(4 - len(head))
        if not chunk:
            raise EOFError("sandbox closed its socket")
        head += chunk
    (size,) = struct.unpack(">I", head)
    body = bytearray()
    while len(body) < size:
        chunk = sock.recv(min(1 << 20, size - len(body)))
        if not chunk:
            raise EOFError("sandbox closed its socket")
        body += chunk
    return json.loads(body)


def _descendants(root_pid: int) -> list[int]:
    """Live (non-zombie) descendants of ``root_pid``, from /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != "Z":
            children.setdefault(int(fields[1]), []).append(int(entry))
    found, stack = [], [root_pid]
    while stack:
        for child in children.get(stack.pop(), []):
            found.append(child)
            stack.append(child)
    return found


class _Proc:
    """One sandbox interpreter process and the host's end of its socket."""

    def __init__(self, pid: int, sock: socket.socket, root: str) -> None:
        self.pid = pid
        try:  # a pidfd names this process even after its pid is reused
            self.pidfd: int | None = os.pidfd_open(pid)
        except (OSError, AttributeError):
            self.pidfd = None
        self.sock = sock
        self.root = root
        self.alive = True
        self.lock = threading.Lock()

    def kill(self) -> None:
        if not self.alive:
            return
        self.alive = False
        try:
            if self.pidfd is not None:
                signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
            os.killpg(self.pid, signal.SIGKILL)  # its own group: what user code spawned goes too
        except (ProcessLookupError, PermissionError):
            pass  # already gone: its pid may belong to someone else by now, so nothing more is sent
        finally:
            if self.pidfd is not None:
                os.close(self.pidfd)
        self.sock.close()
        shutil.rmtree(os.path.join(self.root, str(self.pid)), ignore_errors=True)

    def fork(self, timeout: float, retries: int = 20) -> _Proc:
        """Ask this interpreter for a copy of itself; return the copy.

        A refused fork (the process cap, while killed copies are still exiting) is retried
        with a short back-off before it becomes an error.
        """
        for attempt in range(retries + 1):
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                with self.lock:
                    _send(self.sock, {"op": "fork"}, fds=(theirs.fileno(),))
                    reply = _recv(self.sock, timeout)
            except (OSError, EOFError) as exc:
                ours.close()
                raise SandboxCrashed(f"interpreter {self.pid} did not answer a fork request: {exc}") from exc
            finally:
                theirs.close()
            if "pid" in reply:
                try:  # the copy reports once it has its own session and work dir
                    ready = _recv(ours, timeout)
                except (OSError, EOFError) as exc:
                    ours.close()
                    raise SandboxCrashed(f"the copy of interpreter {self.pid} failed to start: {exc}") from exc
                if ready.get("ready") != int(reply["pid"]):
                    ours.close()
                    raise SandboxError(f"unexpected start message from a copy: {ready!r}")
                return _Proc(int(reply["pid"]), ours, self.root)
            ours.close()
            if attempt < retries:
                time.sleep(0.01 * (attempt + 1))
        raise SandboxError(f"interpreter {self.pid} cannot fork: {reply.get('error')}")

    def request(self, msg: dict[str, Any], timeout: float | None) -> dict[str, Any]:
        with self.lock:
            _send(self.sock, msg)
            return _recv(self.sock, timeout)


class FrozenInterpreter:
    """A frozen copy of an interpreter: the payload of a PythonMath snapshot.

    It only ever forks; it never runs code. Its process is freed by
    ``release()``, when the object is garbage-collected, or when its sandbox closes.
    """

    def __init__(self, proc: _Proc, sandbox: Sandbox) -> None:
        self._proc = proc
        self._sandbox = weakref.ref(sandbox)
        self._finalizer = weakref.finalize(self, FrozenInterpreter._free, proc, sandbox._frozen)
        sandbox._frozen[proc.pid] = proc

    @staticmethod
    def _free(proc: _Proc, registry: dict[int, _Proc]) -> None:
        proc.kill()
        registry.pop(proc.pid, None)

    @property
    def released(self) -> bool:
        return not self._finalizer.alive or not self._proc.alive

    def release(self) -> None:
        self._finalizer()

    def owner(self) -> Sandbox | None:
        return self._sandbox()


class Sandbox:
    """A persistent Python interpreter in its own process tree (see the module docstring).

    Not thread-safe across concurrent ``run`` calls; one env uses one sandbox.
    """

    def __init__(self, config: SandboxConfig | None = None) -> None:
        self.config = config or SandboxConfig()
        self.root = tempfile.mkdtemp(prefix="trace-gym-sandbox-")
        self._frozen: dict[int, _Proc] = {}
        self._closed = False
        self.uid: int | None = None
        if os.geteuid() == 0 and self.config.drop_privileges:
            self.uid = _UID_BASE + next(_uid_counter) % 1000
            os.chown(self.root, self.uid, self.uid)
        os.chmod(self.root, 0o711)
        keeper_ours, keeper_theirs = socket.socketpair()
        base_ours, base_theirs = socket.socketpair()
        cfg = {
            "keeper_fd": keeper_theirs.fileno(), "base_fd": base_theirs.fileno(), "root": self.root,
            "uid": self.uid, "network_namespace": self.config.network_namespace,
            "memory_mb": self.config.memory_mb, "file_mb": self.config.file_mb,
            "cpu_s": self.config.cpu_s, "cpu_total_s": self.config.cpu_total_s,
            "timeout_s": self.config.timeout_s, "output_chars": self.config.output_chars,
            "max_processes": self.config.max_processes, "preload": list(self.config.preload),
        }
        env = {"PATH": "/usr/bin:/bin", "HOME": self.root, "TMPDIR": self.root, "LANG": "C.UTF-8",
               "PYTHONHASHSEED": "0", "PYTHONDONTWRITEBYTECODE": "1", "OPENBLAS_NUM_THREADS": "1",
               "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        self._log = open(os.path.join(self.root, "keeper.log"), "w+b")  # noqa: SIM115 - closed in close()
        self._live: _Proc | None = None
        self._keeper = subprocess.Popen(
            [sys.executable, "-s", str(_SERVER), json.dumps(cfg)],
            pass_fds=(keeper_theirs.fileno(), base_theirs.fileno()), env=env, cwd=self.root,
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=self._log,
            start_new_session=True,
        )
        keeper_theirs.close()
        base_theirs.close()
        self._keeper_sock = keeper_ours
        try:
            hello = _recv(base_ours, 60.0)
        except (OSError, EOFError) as exc:
            self._log.seek(0)
            log = self._log.read()[-2000:].decode(errors="replace")
            self.close()
            raise SandboxError(f"the sandbox interpreter did not start ({exc}); its log:\n{log}") from exc
        self.isolation: tuple[str, ...] = tuple(hello["isolation"])
        self._base = FrozenInterpreter(_Proc(int(hello["pid"]), base_ours, self.root), self)
        self._finalizer = weakref.finalize(self, Sandbox._shutdown, self._keeper, keeper_ours, self.root)

    # ------------------------------------------------------------------ life
    @property
    def base(self) -> FrozenInterpreter:
        """The pristine interpreter (nothing executed): ``thaw(base)`` starts a fresh episode."""
        return self._base

    @property
    def live_pid(self) -> int | None:
        return self._live.pid if self._live is not None else None

    def thaw(self, frozen: FrozenInterpreter) -> None:
        """Replace the live interpreter with a fresh copy of ``frozen`` (which stays reusable)."""
        self._check_open()
        if frozen.released:
            raise SnapshotError("the frozen interpreter was released")
        if frozen.owner() is not self:
            raise SnapshotError("the frozen interpreter belongs to another sandbox")
        new = frozen._proc.fork(self.config.timeout_s)
        old, self._live = self._live, new
        if old is not None:
            old.kill()

    def freeze(self) -> FrozenInterpreter:
        """A frozen copy of the live interpreter."""
        self._check_open()
        if self._live is None:
            raise SandboxError("no live interpreter: call thaw() first")
        if len(self._frozen) - 1 >= self.config.max_frozen:
            raise SnapshotLimitError(
                f"{self.config.max_frozen} snapshots hold interpreter processes; release some "
                "(snapshot.release() or drop them) or raise SandboxConfig.max_frozen"
            )
        return FrozenInterpreter(self._live.fork(self.config.timeout_s), self)

    def seed(self, seed: int) -> None:
        """Seed ``random`` (and numpy's legacy global RNG) in the live interpreter."""
        self._request({"op": "seed", "seed": int(seed)}, self.config.timeout_s)

    def run(self, code: str) -> CellResult:
        """Run one cell in the live interpreter.

        Errors in the code come back as ``ok=False`` with the traceback. If the
        interpreter dies or ignores its time limit, it is killed and
        :class:`SandboxCrashed` is raised; the caller restores a frozen copy.
        """
        reply = self._request({"op": "exec", "code": code}, self.config.timeout_s + self.config.kill_grace_s)
        return CellResult(ok=bool(reply["ok"]), output=reply["output"], truncated_chars=int(reply["truncated"]))

    def _request(self, msg: dict[str, Any], timeout: float) -> dict[str, Any]:
        self._check_open()
        if self._live is None:
            raise SandboxError("no live interpreter: call thaw() first")
        live = self._live
        try:
            return live.request(msg, timeout)
        except TimeoutError as exc:
            self._live = None
            live.kill()
            raise SandboxCrashed(f"the interpreter ignored its {self.config.timeout_s:g} s limit and was killed") from exc
        except (OSError, EOFError, ValueError) as exc:
            self._live = None
            live.kill()
            raise SandboxCrashed(f"the interpreter process died ({type(exc).__name__})") from exc

    def process_count(self) -> int:
        """Processes alive in this sandbox's tree, keeper excluded (user-spawned ones included)."""
        return len(_descendants(self._keeper.pid))

    def _check_open(self) -> None:
        if self._closed:
            raise SandboxError("the sandbox is closed")

    def close(self) -> None:
        """Kill every process of the sandbox and remove its files (idempotent)."""
        if self._closed:
            return
        self._closed = True
        if self._live is not None:
            self._live.kill()
            self._live = None
        for proc in list(self._frozen.values()):
            proc.kill()
        self._frozen.clear()
        self._log.close()
        if hasattr(self, "_finalizer"):
            self._finalizer()
        else:
            Sandbox._shutdown(self._keeper, self._keeper_sock, self.root)

    @staticmethod
    def _shutdown(keeper: subprocess.Popen, keeper_sock: socket.socket, root: str) -> None:
        for _ in range(20):  # kill the whole tree; orphans are re-parented to the keeper meanwhile
            pids = _descendants(keeper.pid)
            if not pids:
                break
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
        keeper_sock.close()
        try:
            keeper.wait(timeout=2)
        except subprocess.TimeoutExpired:
            keeper.kill()
            keeper.wait()
        shutil.rmtree(root, ignore_errors=True)

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
