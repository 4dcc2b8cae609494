"""Host side of the persistent, forkable Python sandbox.

A :class:`Sandbox` owns one process tree (see ``_server.py``): a keeper, a
pristine *base* interpreter, one *live* interpreter that runs cells, and any
number of *frozen* copies made by ``fork``. Copy-on-write ``fork`` makes a
snapshot cost the same whatever the history: :meth:`Sandbox.freeze` copies
the live interpreter into a :class:`FrozenInterpreter`; :meth:`Sandbox.thaw`
makes a new live interpreter from a frozen one (which stays reusable).

The work dir's files are copied beside each frozen copy by the *filer* (``_filer.py``): a process
of the sandbox's own uid, Landlock domain and seccomp filter that walks by directory descriptor,
never by path, while every thread and process of the live interpreter is stopped (``_procs.py``).
No process with more privilege than the sandbox resolves a name in a tree model code can change.
A snapshot's cost grows with the work dir's files (``snapshot_max_depth``/``_entries`` cap it, and
a cell that leaves the dir past a cap is told so: ``CellResult.tree_limit``); the store's quota is per
branch (each ``thaw`` starts one; ``snapshot_branch_mb``/``_entries``); held snapshots count against
``env_memory_mb`` (:meth:`Sandbox.memory_headroom`).

The host trusts nothing the sandbox sends (model code shares the interpreter's
process and can write to its socket): see ``_host.py`` for the checks (kernel-
verified pids, one deadline per reply, frame cap, schema, sequence numbers). A
reply that fails them gets the interpreter killed; the caller rebuilds it.

Isolation, strongest available first (``Sandbox.isolation`` lists what is active and
what is unavailable here):

* OS level, where the host runs as root on Linux (and as an ordinary user, inside a user namespace
  of the sandbox's own): pid and IPC namespaces; a network namespace with no
  interfaces; a mount namespace in which every mount is read-only and the work
  dirs live on a private tmpfs with a size quota (freed by the kernel with the
  namespace); a uid unique to the sandbox on this machine (claimed in the per-host
  state dir, so forked host workers never share one); ``no_new_privs``; cgroups
  for the whole env (memory, process count, CPU share) where the cgroup tree is writable;
* resource limits on every process: address space, CPU time per cell, between
  cells (background threads) and in total, file size, open files, process count;
* in-process: a per-cell wall-clock alarm, an output cap, and an always-armed audit
  hook that refuses writes outside the work directory (``open``/``os.open`` flags
  included), new processes, signals, sockets, ctypes and introspection. The hook
  is a guard, not a kernel boundary; without root it is the main line of defence.

The host enforces the wall-clock limit too: a cell that does not return within
``timeout_s + kill_grace_s`` has its process group killed. When the host dies
(even by SIGKILL) the keeper sees its socket close and kills the tree; anything
left (the keeper itself killed) is reaped by the next host through the state dir.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import secrets
import socket
import subprocess
import sys
import threading
import time
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trace_envs.errors import SandboxError, SnapshotError, SnapshotLimitError
from trace_envs.python_tool._config import REQUIRED_LAYERS, SandboxConfig
from trace_envs.python_tool._host import (
    ProtocolError,
    StateDir,
    adopt,
    kill_pid_checked,
    make_cgroups,
    proc_stat,
    recv_frame,
    remove_cgroups,
    send_frame,
)
from trace_envs.python_tool._interp import SandboxCrashed, SnapshotTreeError, _Proc
from trace_envs.python_tool._procs import (
    QuiesceError,
    ancestors,
    children,
    descendants,
    memory_in_use,
    pidfd_or_none,
    private_bytes,
    resume,
    stop_tree,
)

__all__ = ["REQUIRED_LAYERS", "SandboxConfig", "CellResult", "FrozenInterpreter", "Sandbox", "SandboxCrashed",
           "SnapshotTreeError"]

_SERVER = Path(__file__).with_name("_server.py")

_KEEPER_TIMEOUT_S = 60.0
_MEMORY_SLACK = 64 * 1024 * 1024  # the keeper, the filer and the kernel's own use
_ROOT_INODES = 3  # the work root's tmpfs holds its root, live/ and the store's mount point besides the live files


@dataclass(frozen=True)
class CellResult:
    """The outcome of one cell: its output (stdout, stderr and any traceback, in order)."""

    ok: bool
    output: str
    truncated_chars: int = 0
    crashed: bool = False
    #: the snapshot cap the work dir passed after this cell (``snapshot_max_depth``/``_entries``), or ""
    tree_limit: str = ""


class FrozenInterpreter:
    """A frozen copy of an interpreter: the payload of a PythonMath snapshot.

    It only ever forks; it never runs code. Its process is freed by
    ``release()``, when the object is garbage-collected, or when its sandbox closes.
    ``released`` says whether it was let go (then it can never be used again); a copy whose
    process died (killed by model code, or the sandbox restarted) is not released but
    ``usable`` is False, and the env rebuilds that state by replay.
    """

    def __init__(self, proc: _Proc, sandbox: Sandbox) -> None:
        self._proc = proc
        self._sandbox = weakref.ref(sandbox)
        self._finalizer = weakref.finalize(self, FrozenInterpreter._free, proc, sandbox._frozen)
        sandbox._frozen[id(proc)] = proc

    @staticmethod
    def _free(proc: _Proc, registry: dict[int, _Proc]) -> None:
        proc.kill()
        registry.pop(id(proc), None)

    @property
    def released(self) -> bool:
        return not self._finalizer.alive or self._proc.released

    @property
    def usable(self) -> bool:
        return not self.released and self._proc.alive

    def release(self) -> None:
        self._finalizer()

    def owner(self) -> Sandbox | None:
        return self._sandbox()


class Sandbox:
    """A persistent Python interpreter in its own process tree (see the module docstring).

    Not thread-safe across concurrent ``run`` calls; one env uses one sandbox. ``restart()``
    replaces the whole process tree (e.g. after the pristine interpreter died); frozen copies
    of the old tree stay unreleased but unusable.
    """

    _reaped = False
    _reap_lock = threading.Lock()
    _ids = itertools.count()

    def __init__(self, config: SandboxConfig | None = None) -> None:
        self.config = config or SandboxConfig()
        self._frozen: dict[int, _Proc] = {}
        self._closed = False
        self._live: _Proc | None = None
        self._started = False
        self.restarts = 0
        self.state = StateDir()
        with Sandbox._reap_lock:
            if not Sandbox._reaped:  # once per host process: what hosts SIGKILLed earlier left behind
                Sandbox._reaped = True
                self.state.reap()
        self._start()

    def _start(self) -> None:
        cfg_ = self.config
        self.sid = f"{os.getpid()}-{next(Sandbox._ids)}-{secrets.token_hex(3)}"
        self.uid: int | None = None
        if os.geteuid() == 0 and cfg_.drop_privileges:
            self.uid = self.state.claim_uid()
        self.root = str(self.state.path / self.sid)
        os.mkdir(self.root, 0o700)
        if self.uid is not None:
            os.chown(self.root, self.uid, self.uid)
        self._cgroups, procs = make_cgroups(f"trace-gym-{self.sid}", memory_mb=cfg_.env_memory_mb,
                                            max_processes=cfg_.max_processes + 16, cpus=cfg_.cpus)
        keeper_ours, keeper_theirs = socket.socketpair()
        base_ours, base_theirs = socket.socketpair()
        base_ours.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        filer_ours, filer_theirs = socket.socketpair()
        filer_ours.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        cfg = {
            "keeper_fd": keeper_theirs.fileno(), "base_fd": base_theirs.fileno(), "root": self.root,
            "filer_fd": filer_theirs.fileno(), "snapshot_max_depth": cfg_.snapshot_max_depth,
            "snapshot_max_entries": cfg_.snapshot_max_entries, "snapshot_inodes": cfg_.snapshot_inodes,
            "snapshot_branch_mb": cfg_.branch_share[0], "snapshot_branch_entries": cfg_.branch_share[1],
            "uid": self.uid, "network_namespace": cfg_.network_namespace,
            "memory_mb": cfg_.memory_mb, "file_mb": cfg_.file_mb, "disk_mb": cfg_.disk_mb,
            "snapshot_disk_mb": cfg_.snapshot_disk_mb,
            "cpu_s": cfg_.cpu_s, "cpu_total_s": cfg_.cpu_total_s, "max_open_files": cfg_.max_open_files,
            "timeout_s": cfg_.timeout_s, "output_chars": cfg_.output_chars,
            "max_processes": cfg_.max_processes, "preload": list(cfg_.preload), "cgroup_procs": procs,
        }
        self._pending_drops: list[int] = []
        #: the last snapshot's work dir: entries copied and unchanged files shared with an earlier one; and
        #: what its branch's held snapshots take of the store (``branch_bytes``, ``branch_entries``)
        self.last_save: dict[str, int] = {"entries": 0, "shared": 0}
        self._saved: set[int] = set()
        self._branch = 0  # the live interpreter's branch: each thaw starts one (the store's quota is per branch)
        self._keeper_lock = threading.Lock()
        live_dir = self.root + "/live"
        env = {"PATH": "/usr/bin:/bin", "HOME": live_dir, "TMPDIR": live_dir, "LANG": "C.UTF-8",
               "PYTHONHASHSEED": "0", "PYTHONDONTWRITEBYTECODE": "1", "OPENBLAS_NUM_THREADS": "1",
               "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        log_path = self.state.path / f"{self.sid}.log"
        self._log = open(log_path, "w+b")  # noqa: SIM115 - closed in close()
        os.chmod(log_path, 0o600)
        self._keeper = subprocess.Popen(
            [sys.executable, "-s", str(_SERVER), json.dumps(cfg)],
            pass_fds=(keeper_theirs.fileno(), base_theirs.fileno(), filer_theirs.fileno()), env=env, cwd="/",
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=self._log,
            start_new_session=True,
        )
        keeper_theirs.close()
        base_theirs.close()
        filer_theirs.close()
        self._keeper_sock = keeper_ours
        self._filer_sock = filer_ours
        self._filer: tuple[int, int | None] | None = None
        self._keeper_pidfd = pidfd_or_none(self._keeper.pid)
        self.state.write_record(self.sid, {
            "host_pid": os.getpid(), "host_start": proc_stat(os.getpid())[2] if proc_stat(os.getpid()) else None,
            "keeper_pid": self._keeper.pid, "keeper_start": (proc_stat(self._keeper.pid) or ("", 0, None))[2],
            "uid": self.uid, "cgroups": self._cgroups, "root": self.root,
        })
        self._started = True
        self._finalizer = weakref.finalize(self, Sandbox._shutdown, self._keeper, keeper_ours, self.state,
                                           self.sid, self.uid, tuple(self._cgroups), filer_ours)
        try:
            creds: list[int] = []
            hello = recv_frame(base_ours, time.monotonic() + 60.0, 65_536, creds=creds)
            layers = hello.get("isolation")
            if hello.get("ready") is not True or not isinstance(layers, list) or len(creds) != 3:
                raise ProtocolError("unexpected hello from the base interpreter")
            base_pidfd = adopt(creds[0], parent=self._keeper.pid, uid=self.uid)
            filer_creds: list[int] = []
            filer_hello = recv_frame(filer_ours, time.monotonic() + 60.0, 65_536, creds=filer_creds)
            if filer_hello.get("ready") is not True or len(filer_creds) != 3:
                raise ProtocolError("unexpected hello from the filer")
            self._filer = (filer_creds[0], adopt(filer_creds[0], parent=self._keeper.pid, uid=self.uid,
                                                 known={creds[0]}))
        except (OSError, EOFError, ProtocolError) as exc:
            self._log.seek(0)
            log = self._log.read()[-2000:].decode(errors="replace")
            base_ours.close()
            self.close()
            raise SandboxError(f"the sandbox interpreter did not start ({exc}); its log:\n{log}") from exc
        self._cgroup_ok = bool(self._cgroups)
        filer_layers = filer_hello.get("layers")
        self._filer_holds = filer_hello.get("landlock") is True and filer_hello.get("seccomp") is True
        self.isolation: tuple[str, ...] = (tuple(str(x) for x in layers) + self._host_layers()
                                           + (self._snapshot_layer(filer_layers, filer_hello.get("shares") is True),))
        self._base = FrozenInterpreter(_Proc(creds[0], base_pidfd, base_ours, self), self)
        achieved = hello.get("achieved")
        self.layers_held = frozenset(str(x) for x in achieved) if isinstance(achieved, list) else frozenset()
        missing = [name for name in cfg_.required_layers if name not in self.layers_held]
        if missing:
            self.close()
            raise SandboxError(
                f"the sandbox cannot hold on this machine without: {', '.join(missing)} (its isolation: "
                f"{'; '.join(x for x in self.isolation if x.startswith('unavailable'))}). To run with weaker "
                f"isolation anyway, name what to do without: SandboxConfig(allow_weaker={tuple(missing)!r}) "
                f"or TRACE_GYM_ALLOW_WEAKER={','.join(missing)}")

    def _snapshot_layer(self, filer_layers: Any, shares: bool) -> str:
        held = ", ".join(str(x).split("(")[0] for x in filer_layers) if isinstance(filer_layers, list) else ""
        shared = ("files unchanged since a held snapshot hard-linked to its copy" if shares else
                  "every file copied (no fresh change time after every write here)")
        return ("snapshot-files(copied by the filer, a process of the sandbox's own uid, Landlock domain "
                f"and seccomp filter [{held or 'none held'}], walking by directory descriptor with "
                "O_NOFOLLOW at every level, iteratively, with depth and entry caps, while every thread "
                f"and process of the live interpreter is stopped; {shared}; not an overlay mount: see "
                "docs/guides/security.md)")

    def _host_layers(self) -> tuple[str, ...]:
        layers = ["kernel-verified pids (SCM_CREDENTIALS, pidfd, parentage, uid)",
                  "control-frame checks (one deadline per reply, size cap, schema, sequence numbers)",
                  f"private dirs under {self.state.path} (mode 0700), reaped after a killed host"]
        if self._cgroups:
            layers.append("per-env cgroups(" + ",".join(d.split("/")[4]
                                                        for d in self._cgroups) + ")")
        else:
            layers.append("unavailable: per-env cgroups (needs root and a writable cgroup tree); "
                          "memory is limited per process only")
        if self.uid is None:
            layers.append("no per-env uid (not root): envs share the host uid; Landlock, the mount namespace "
                          "and seccomp keep each env to its own files and processes")
        return tuple(layers)

    # ------------------------------------------------------------------ life
    @property
    def base(self) -> FrozenInterpreter:
        """The pristine interpreter (nothing executed): ``thaw(base)`` starts a fresh episode."""
        return self._base

    @property
    def live_pid(self) -> int | None:
        return self._live.pid if self._live is not None else None

    def _known_pids(self) -> set[int]:
        known = {p.pid for p in self._frozen.values() if p.alive}
        if self._live is not None:
            known.add(self._live.pid)
        return known

    def thaw(self, frozen: FrozenInterpreter) -> None:
        """Replace the live interpreter with a fresh copy of ``frozen`` (which stays reusable).

        The old live interpreter and every process it left are killed first, then the filer puts
        ``frozen``'s files into the live dir (an empty dir for the pristine one), then ``frozen`` forks.
        When this raises, there is no live interpreter.

        Raises:
            SnapshotError: ``frozen`` was released or belongs to another sandbox.
            SandboxCrashed: its process is gone (or broke the protocol while forking).
            SandboxError: it refused to fork, or its files could not be restored.
        """
        self._check_open()
        if frozen.released:
            raise SnapshotError("the frozen interpreter was released")
        if frozen.owner() is not self:
            raise SnapshotError("the frozen interpreter belongs to another sandbox")
        if not frozen.usable:
            raise SandboxCrashed("the frozen interpreter's process is gone")
        old, self._live = self._live, None
        if old is not None:
            old.kill()
        self.kill_strays()
        source = frozen._proc.pid if frozen is not self._base else None
        if source is not None and source not in self._saved:
            raise SandboxError("the frozen interpreter's files were not saved")
        self._branch += 1
        self._file_request({"op": "load", "id": source})
        try:
            new = frozen._proc.fork(self.config.timeout_s, "live")
        except SandboxCrashed:
            frozen._proc.kill(released=False)
            raise
        self._live = new

    def freeze(self) -> FrozenInterpreter:
        """A frozen copy of the live interpreter, its work dir's files saved beside it by the filer.

        The copy is forked first; then every thread and process of the live interpreter is stopped
        (and what it started killed) while the filer copies the work dir, so no name changes under
        the walk; then it runs on.

        Raises:
            SnapshotLimitError: ``max_frozen`` copies are held, or the env's memory budget would not
                hold another (see :meth:`memory_headroom`).
            SandboxError: the interpreter refused or failed to fork, could not be stopped, or the
                files did not fit a quota or a cap (it keeps serving; the message says which);
                SandboxCrashed: it died or broke the protocol (it was killed).
        """
        self._check_open()
        if self._live is None:
            raise SandboxError("no live interpreter: call thaw() first")
        if len(self._frozen) - 1 >= self.config.max_frozen:
            raise SnapshotLimitError(
                f"{self.config.max_frozen} snapshots hold interpreter processes; release some "
                "(snapshot.release() or drop them) or raise SandboxConfig.max_frozen"
            )
        self._check_memory()
        live = self._live
        try:
            proc = live.fork(self.config.timeout_s, "frozen")
        except SandboxCrashed:
            self._live = None
            live.kill()
            raise
        try:
            if live.pidfd is None:
                raise SandboxError("no pidfd for the live interpreter: it cannot be stopped for the copy")
            stop_tree(live.pid, live.pidfd, known=frozenset(self._known_pids() | {proc.pid}))
            try:
                self.kill_strays(also_known=(proc.pid,))  # what was orphaned earlier (keeper, filer)
                reply = self._file_request({"op": "save", "id": proc.pid, "branch": self._branch})
                entries, shared = reply.get("entries"), reply.get("shared")
                if type(entries) is int and type(shared) is int:
                    self.last_save = {"entries": entries, "shared": shared}
                    for key in ("branch_bytes", "branch_entries"):
                        if type(reply.get(key)) is int:
                            self.last_save[key] = reply[key]
            finally:
                resume(live.pidfd)
        except QuiesceError as exc:
            proc.kill()
            raise SandboxError(f"the snapshot's files were not copied: {exc}") from exc
        except SandboxError:
            proc.kill()
            raise
        self._saved.add(proc.pid)
        return FrozenInterpreter(proc, self)

    def memory_headroom(self) -> int:
        """Bytes of ``env_memory_mb`` left once another snapshot is held: the budget less the env's
        use now (every process and its tmpfs files) and what the new frozen copy costs once the live
        interpreter rewrites all of its memory, and a slack for the keeper, the filer and the kernel.
        Negative: :meth:`freeze` refuses, so that rewriting its data never takes the live
        interpreter over the budget because of a snapshot."""
        live = private_bytes(self._live.pid) if self._live is not None else 0
        memory_cgroups = [d for d in self._cgroups if "/memory" in d or Path(d, "memory.current").exists()]
        filer = [self._filer[0]] if self._filer is not None else []
        pids = [] if memory_cgroups else [self._keeper.pid, *filer, *self._known_pids()]
        room = self.config.env_memory_mb * 1024 * 1024 - live - _MEMORY_SLACK
        return room - memory_in_use(memory_cgroups, pids, enough=room)

    def _check_memory(self) -> None:
        headroom = self.memory_headroom()
        if headroom < 0:
            budget = self.config.env_memory_mb
            raise SnapshotLimitError(
                f"another snapshot would not fit the env's memory budget ({budget} MB, "
                f"{(budget * 1024 * 1024 - headroom) / 2**20:.0f} MB needed with it): every snapshot "
                "keeps the interpreter's memory as it was. Release snapshots (snapshot.release() or drop "
                "them), or raise SandboxConfig.env_memory_mb")

    def _file_request(self, msg: dict[str, Any]) -> dict[str, Any]:
        """One file operation by the filer (see ``_filer.py``), with the pending drops; its reply is
        checked like an interpreter's (deadline, frame cap, sequence number)."""
        with self._keeper_lock:
            drops, self._pending_drops = self._pending_drops, []
            seq = random.getrandbits(62) + 1
            try:
                send_frame(self._filer_sock, {**msg, "drop": drops, "seq": seq},
                           time.monotonic() + _KEEPER_TIMEOUT_S)
                reply = recv_frame(self._filer_sock, time.monotonic() + _KEEPER_TIMEOUT_S, 65_536)
                if reply.get("seq") != seq:
                    raise ProtocolError("a reply to another request")
            except (OSError, EOFError, TimeoutError, ProtocolError) as exc:
                raise SandboxCrashed(f"the sandbox's filer did not answer ({type(exc).__name__}: {exc})") from exc
        if reply.get("ok") is not True:
            error = str(reply.get("error"))[:400]
            if reply.get("limit") is True and msg.get("op") == "check":
                raise SnapshotTreeError(f"this cell left a work dir that snapshots do not copy: "
                                        f"{error.removeprefix('check: ')}; snapshots of this state hold the replay "
                                        "log only, and restoring one re-runs every cell of the episode")
            if reply.get("limit") is True:
                raise SnapshotTreeError(f"the work dir was not saved: {error}")
            raise SandboxError(f"the work dir could not be copied: {error}")
        return reply

    def kill_strays(self, also_known: tuple[int, ...] = ()) -> int:
        """SIGKILL every process in the tree that is not one of the sandbox's interpreters (with all
        below it): what a cell started, whatever it did since (setsid, double fork). Returns how many
        were found. Cheap when there are none: it reads the children lists of the keeper and the live
        interpreter only."""
        if not self._started or self._keeper.poll() is not None:
            return 0
        keeper, found = self._keeper.pid, 0
        filer = [self._filer[0]] if self._filer is not None else []
        for _ in range(50):  # a stray may fork while it is being killed: its orphans reach the filer (the
            known = self._known_pids() | {keeper, *filer, *also_known}  # pid namespace's init) or the keeper
            roots = [keeper, *filer] + ([self._live.pid] if self._live is not None else [])
            strays = [pid for root in roots for pid in children(root)
                      if pid not in known and (proc_stat(pid) or ("Z",))[0] not in ("Z", "X")]
            if not strays:
                break
            found += len(strays)
            for stray in strays:
                for pid in [stray, *descendants(stray)]:
                    if pid not in known:
                        kill_pid_checked(pid, lambda p: keeper in ancestors(p))
            time.sleep(0.001)
        return found

    def seed(self, seed: int) -> None:
        """Seed ``random`` (and numpy's legacy global RNG) in the live interpreter."""
        self._request({"op": "seed", "seed": int(seed)}, self.config.timeout_s)

    def run(self, code: str) -> CellResult:
        """Run one cell in the live interpreter.

        Errors in the code come back as ``ok=False`` with the traceback. If the
        interpreter dies, ignores its time limit or breaks the protocol, it is killed and
        :class:`SandboxCrashed` is raised; the caller restores a frozen copy.
        """
        try:
            reply = self._request({"op": "exec", "code": code}, self.config.timeout_s + self.config.kill_grace_s)
        finally:
            self.kill_strays()  # a cell's processes end with the cell
        return CellResult(ok=reply["ok"], output=reply["output"], truncated_chars=reply["truncated"],
                          tree_limit=self._tree_limit(reply.get("inodes")))

    def _tree_limit(self, inodes: object) -> str:
        """Whether the work dir passed a snapshot cap, asked of the filer only when the live tmpfs's
        inode count (sent by the interpreter: a hint only, model code may change it) could allow it:
        a work dir of fewer entries than either cap is neither too deep nor too large."""
        cap = min(self.config.snapshot_max_depth, self.config.snapshot_max_entries)
        if type(inodes) is int and 0 <= inodes - _ROOT_INODES <= cap:
            return ""
        try:
            self._file_request({"op": "check"})
        except SnapshotTreeError as exc:
            return str(exc)
        except SandboxError:
            pass  # the tree changed under the walk, or the filer is gone: the next snapshot says so
        return ""

    def _request(self, msg: dict[str, Any], timeout: float) -> dict[str, Any]:
        self._check_open()
        if self._live is None:
            raise SandboxError("no live interpreter: call thaw() first")
        live = self._live
        try:
            reply = live.request(msg, timeout)
        except SandboxCrashed:
            self._live = None
            live.kill()
            raise
        if "error" in reply:
            raise SandboxError(f"the interpreter refused {msg.get('op')!r}: {reply['error']}")
        return reply

    def process_count(self) -> int:
        """Processes alive in this sandbox's tree, keeper and filer excluded (user-spawned ones included)."""
        filer = self._filer[0] if self._filer is not None else None
        return len([pid for pid in descendants(self._keeper.pid) if pid != filer])

    def _forget(self, pid: int) -> None:
        """A copy's process is gone: its saved files are dropped with the next keeper request."""
        if pid in self._saved:
            self._saved.discard(pid)
            self._pending_drops.append(pid)

    def _check_open(self) -> None:
        if self._closed:
            raise SandboxError("the sandbox is closed")

    def restart(self) -> None:
        """A new process tree (keeper, base); the old one is killed, its frozen copies become unusable."""
        self._check_open()
        self._stop(released=False)
        self.restarts += 1
        self._start()

    def _stop(self, *, released: bool) -> None:
        if self._live is not None:
            self._live.kill()
            self._live = None
        for proc in list(self._frozen.values()):
            proc.kill(released=released)
        self._frozen.clear()
        if self._started:
            self._started = False
            self._finalizer()
            self._log.close()
            if self._keeper_pidfd is not None:
                os.close(self._keeper_pidfd)
                self._keeper_pidfd = None
            if self._filer is not None and self._filer[1] is not None:
                os.close(self._filer[1])
            self._filer = None

    def close(self) -> None:
        """Kill every process of the sandbox and remove its files and cgroups (idempotent)."""
        if self._closed:
            return
        self._stop(released=True)
        self._closed = True

    @staticmethod
    def _shutdown(keeper: subprocess.Popen, keeper_sock: socket.socket, state: StateDir, sid: str,
                  uid: int | None, cgroups: tuple[str, ...], filer_sock: socket.socket) -> None:
        for _ in range(20):  # kill the whole tree; orphans are re-parented to the keeper meanwhile
            pids = descendants(keeper.pid)
            if not pids:
                break
            for pid in pids:
                kill_pid_checked(pid, lambda p: keeper.pid in ancestors(p))
        filer_sock.close()
        keeper_sock.close()  # the keeper kills whatever is left below it and exits
        try:
            keeper.wait(timeout=2)
        except subprocess.TimeoutExpired:
            keeper.kill()
            keeper.wait()
        remove_cgroups(cgroups)
        state.remove(sid, uid)

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
