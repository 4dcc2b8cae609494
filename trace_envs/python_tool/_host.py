"""Host-side mechanics of the sandbox that trust nothing the sandbox says.

* **Framing** (:func:`send_frame`, :func:`recv_frame`): 4-byte big-endian length + JSON, with a
  *total* deadline per frame (not per ``recv``), a frame-size cap checked before a byte of the body
  is read, and JSON errors of every kind turned into :class:`ProtocolError`. Optionally the
  sender's credentials as the kernel reports them (``SCM_CREDENTIALS``).
* **Pids** (:func:`adopt`): a pid is signalled only through a pidfd opened on a process the kernel
  says sent the frame, whose parent is the process that was asked to fork, whose uid is the
  sandbox's, and that is neither pid 1, the host, nor in the host's process group.
* **Per-host state** (:class:`StateDir`): one directory per host user (root: ``/run/trace-gym``)
  holding each sandbox's record, log and work-dir mount point, and the uid claims that keep two
  host processes (forked workers included) from ever sharing a sandbox uid; records whose host
  died are reaped, processes, cgroups and files, by the next host that starts a sandbox.
* **cgroups** (:func:`make_cgroups`): memory, process and CPU limits for the whole env (every
  process of one sandbox together), under the host's own cgroup, where the host may create them.

Why the process facts (:func:`proc_stat`, :func:`proc_cpu_seconds`, :func:`proc_uid`) are read from
/proc here rather than through psutil: what decides a pid's trust is the pidfd, the sender's
kernel credentials and the parent check, none of which psutil offers, so psutil could replace only
these three readers; measured with ``python scripts/bench/proc_facts.py`` (psutil 7.2.2), psutil
takes 2.1x as long for one pid's facts (82 vs 40 us) and 18 ms to import: a compiled dependency
that would make the host's hottest check slower. (The sandbox's own side, ``_server.py`` and
``_isolation.py``, imports the standard library alone, psutil or not.)
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import random
import shutil
import signal
import socket
import struct
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["ProtocolError", "send_frame", "recv_frame", "adopt", "proc_uid", "proc_stat", "proc_cpu_seconds", "StateDir",
           "make_cgroups", "remove_cgroups", "cgroup_pids", "kill_verified"]

_CRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


class ProtocolError(Exception):
    """The sandbox sent something that is not a valid reply (oversized, malformed, off-schema, out of order)."""


# ------------------------------------------------------------------ framing
def send_frame(sock: socket.socket, obj: Any, deadline: float, fds: tuple[int, ...] = ()) -> None:
    data = json.dumps(obj).encode()
    frame = struct.pack(">I", len(data)) + data
    sock.settimeout(max(0.001, deadline - time.monotonic()))
    if fds:
        socket.send_fds(sock, [frame], list(fds))
    else:
        sock.sendall(frame)  # the timeout bounds the whole sendall (Python >= 3.5)


def _recv_exact(sock: socket.socket, size: int, deadline: float, creds: list[int] | None) -> bytes:
    buf = bytearray()
    while len(buf) < size:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("the sandbox did not send a whole frame in time")
        sock.settimeout(remaining)
        if creds is not None and not creds:
            chunk, ancillary, _, _ = sock.recvmsg(size - len(buf), socket.CMSG_SPACE(_CRED.size))
            for level, kind, data in ancillary:
                if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS and len(data) >= _CRED.size:
                    creds.extend(_CRED.unpack(data[:_CRED.size]))
        else:
            chunk = sock.recv(min(1 << 20, size - len(buf)))
        if not chunk:
            raise EOFError("the sandbox closed its socket")
        buf += chunk
    return bytes(buf)


def recv_frame(sock: socket.socket, deadline: float, max_bytes: int, *,
               creds: list[int] | None = None) -> dict[str, Any]:
    """One frame as a dict, read before ``deadline`` (``time.monotonic()``); never more than ``max_bytes``.

    ``creds``: an empty list to fill with the kernel's (pid, uid, gid) of the sender (needs
    ``SO_PASSCRED`` on ``sock``). Raises TimeoutError, EOFError, OSError or ProtocolError.
    """
    head = _recv_exact(sock, 4, deadline, creds)
    (size,) = struct.unpack(">I", head)
    if size > max_bytes:
        raise ProtocolError(f"a frame of {size:,} bytes (the cap is {max_bytes:,})")
    body = _recv_exact(sock, size, deadline, None)
    try:
        obj = json.loads(body)
    except (ValueError, RecursionError, MemoryError) as exc:
        raise ProtocolError(f"a frame that is not JSON ({type(exc).__name__})") from None
    if not isinstance(obj, dict):
        raise ProtocolError("a frame that is not a JSON object")
    return obj


def nothing_pending(sock: socket.socket) -> bool:
    """Whether no byte waits on ``sock`` beyond the reply just read (extra bytes = a forged stream)."""
    sock.settimeout(0.0)
    try:
        return not sock.recv(1, socket.MSG_PEEK)
    except (BlockingIOError, InterruptedError):
        return True
    except OSError:
        return True  # a broken socket shows at the next request


# ------------------------------------------------------------------ pids
def _stat_fields(pid: int) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command name (the state first), or None when it is gone."""
    try:
        with open(f"/proc/{int(pid)}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError, ValueError):
        return None


def proc_stat(pid: int) -> tuple[str, int, int] | None:
    """(state, parent pid, start time) of ``pid`` from /proc, or None when it is gone."""
    fields = _stat_fields(pid)
    try:
        return None if fields is None else (fields[0], int(fields[1]), int(fields[19]))
    except (IndexError, ValueError):
        return None


def proc_cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds ``pid`` has used, from /proc, or None when it is gone."""
    fields = _stat_fields(pid)
    try:
        return None if fields is None else (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (IndexError, ValueError):
        return None


def proc_uid(pid: int) -> int | None:
    """The real uid of ``pid`` from /proc, or None."""
    try:
        with open(f"/proc/{int(pid)}/status") as fh:
            for line in fh:
                if line.startswith("Uid:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def _alive(pidfd: int) -> bool:
    try:
        signal.pidfd_send_signal(pidfd, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def adopt(pid: Any, *, parent: int, uid: int | None, known: Iterable[int] = ()) -> int:
    """A pidfd for ``pid`` once the kernel confirms it is a fresh child of ``parent`` running as ``uid``.

    ``pid`` must come from the kernel (SCM_CREDENTIALS), never from a message. The pidfd is opened
    first and checked alive after the /proc checks, so the checks are about the process it names.

    Raises:
        ProtocolError: anything does not hold; nothing is opened then.
    """
    if type(pid) is not int or pid <= 1 or pid == os.getpid() or pid == os.getpgrp() or pid in set(known):
        raise ProtocolError(f"refused pid {pid!r}")
    try:
        pidfd = os.pidfd_open(pid)
    except OSError as exc:
        raise ProtocolError(f"pid {pid} cannot be opened: {exc}") from None
    try:
        stat = proc_stat(pid)
        if stat is None or stat[0] == "Z" or stat[1] != parent:
            raise ProtocolError(f"pid {pid} is not a child of {parent}")
        if uid is not None and proc_uid(pid) != uid:
            raise ProtocolError(f"pid {pid} does not run as the sandbox's uid {uid}")
        if not _alive(pidfd):
            raise ProtocolError(f"pid {pid} exited while being checked")
    except BaseException:
        os.close(pidfd)
        raise
    return pidfd


def kill_verified(pid: int, pidfd: int | None, *, group: bool = True) -> None:
    """SIGKILL the process a pidfd names (and its process group if it leads one); never by bare pid."""
    if pidfd is None:
        return  # no pidfd (old kernel): the process ends when its socket closes
    try:
        if group and _alive(pidfd) and pid > 1 and pid != os.getpgrp() and os.getpgid(pid) == pid:
            os.killpg(pid, signal.SIGKILL)  # the group it leads: what user code spawned goes too
    except (ProcessLookupError, PermissionError):
        pass
    with contextlib.suppress(ProcessLookupError, PermissionError, OSError):
        signal.pidfd_send_signal(pidfd, signal.SIGKILL)


def kill_pid_checked(pid: int, check) -> None:
    """SIGKILL ``pid`` through a pidfd if ``check(pid)`` still holds once the pidfd is open."""
    try:
        pidfd = os.pidfd_open(pid)
    except OSError:
        return
    try:
        if pid > 1 and pid != os.getpid() and check(pid):
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
    except OSError:
        pass
    finally:
        os.close(pidfd)


# ------------------------------------------------------------------ cgroups
@dataclass(frozen=True)
class _Controller:
    name: str
    path: Path


def _own_cgroups() -> list[_Controller]:
    """Writable cgroup directories of this process per controller (v1), or the v2 one."""
    found: list[_Controller] = []
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return found
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        controllers, rel = parts[1], parts[2].lstrip("/")
        if controllers == "":  # v2
            base = Path("/sys/fs/cgroup")
            if (base / "cgroup.controllers").exists():
                found.append(_Controller("v2", base / rel))
            continue
        for name in ("memory", "pids", "cpu"):
            if name in controllers.split(","):
                mount = Path("/sys/fs/cgroup") / controllers
                if not mount.exists():
                    mount = Path("/sys/fs/cgroup") / name
                if (mount / rel).is_dir():
                    found.append(_Controller(name, mount / rel))
    return found


def _write(path: Path, value: str) -> bool:
    try:
        path.write_text(value)
        return True
    except OSError:
        return False


def make_cgroups(name: str, *, memory_mb: int, max_processes: int,
                 cpus: float | None) -> tuple[list[str], list[str]]:
    """Create the env's cgroups; returns (their directories, the ``cgroup.procs`` files to join).

    Only as root; a controller that cannot be created or limited is left out (the caller reports
    it); no CPU cgroup when ``cpus`` is None.
    """
    if os.geteuid() != 0:
        return [], []
    dirs: list[str] = []
    limited: list[str] = []
    for ctl in _own_cgroups():
        if ctl.name == "cpu" and cpus is None:
            continue
        target = ctl.path / name
        try:
            target.mkdir()
        except OSError:
            continue
        if ctl.name == "memory":
            ok = _write(target / "memory.limit_in_bytes", str(memory_mb * 1024 * 1024))
        elif ctl.name == "pids":
            ok = _write(target / "pids.max", str(max_processes))
        elif ctl.name == "cpu":
            ok = _write(target / "cpu.cfs_period_us", "100000") and _write(
                target / "cpu.cfs_quota_us", str(max(1000, int((cpus or 1.0) * 100000))))
        else:  # v2: whatever the parent delegates
            ok = any([_write(target / "memory.max", str(memory_mb * 1024 * 1024)),
                      _write(target / "pids.max", str(max_processes))]
                     + ([_write(target / "cpu.max", f"{max(1000, int(cpus * 100000))} 100000")] if cpus else []))
        if ok:
            dirs.append(str(target))
            limited.append(ctl.name)
        else:
            with contextlib.suppress(OSError):
                target.rmdir()
    return dirs, [str(Path(d) / "cgroup.procs") for d in dirs]


def cgroup_pids(dirs: Iterable[str]) -> set[int]:
    """Pids the kernel lists in the given cgroups."""
    pids: set[int] = set()
    for d in dirs:
        try:
            pids.update(int(x) for x in Path(d, "cgroup.procs").read_text().split())
        except (OSError, ValueError):
            pass
    return pids


def _in_cgroup(pid: int, dirs: Iterable[str]) -> bool:
    try:
        text = Path(f"/proc/{pid}/cgroup").read_text()
    except OSError:
        return False
    rels = {line.split(":", 2)[2] for line in text.splitlines() if line.count(":") >= 2}
    return any(any(d.endswith(rel) and rel not in ("", "/") for rel in rels) for d in dirs)


def remove_cgroups(dirs: Iterable[str], timeout: float = 2.0) -> bool:
    """Kill what is left in the cgroups (kernel-listed members only) and remove them; True when all are gone."""
    dirs = list(dirs)
    deadline = time.monotonic() + timeout
    while dirs:
        for pid in cgroup_pids(dirs):
            kill_pid_checked(pid, lambda p: _in_cgroup(p, dirs))
        for d in list(dirs):
            try:
                os.rmdir(d)
                dirs.remove(d)
            except FileNotFoundError:
                dirs.remove(d)
            except OSError:
                pass
        if not dirs or time.monotonic() > deadline:
            break
        time.sleep(0.01)
    return not dirs


# ------------------------------------------------------------------ per-host state
def _start_time(pid: int) -> int | None:
    stat = proc_stat(pid)
    return None if stat is None else stat[2]


class StateDir:
    """The one directory per host user under which every sandbox of this machine keeps its files.

    Layout: ``<sid>.json`` (the record: host pid and start time, keeper pid, uid, cgroups),
    ``<sid>.log`` (the keeper's stderr), ``<sid>/`` (the work-dir mount point, owned by the
    sandbox uid, mode 0700) and ``uids/<uid>`` (claims). The directory itself is 0711 (root) or
    0700, so a sandbox can reach its own work dir but list nothing.
    """

    def __init__(self, path: str | None = None) -> None:
        self.path = Path(path or os.environ.get("TRACE_GYM_STATE_DIR") or self._default())
        self.path.mkdir(mode=0o711 if os.geteuid() == 0 else 0o700, parents=True, exist_ok=True)
        st = self.path.stat()
        if st.st_uid != os.geteuid() or st.st_mode & 0o022:
            self.path = Path(tempfile.mkdtemp(prefix="trace-gym-state-"))  # someone else's dir: not ours to use
        os.chmod(self.path, 0o711 if os.geteuid() == 0 else 0o700)
        (self.path / "uids").mkdir(mode=0o700, exist_ok=True)

    @staticmethod
    def _default() -> str:
        if os.geteuid() == 0 and os.path.isdir("/run") and os.access("/run", os.W_OK):
            return "/run/trace-gym"
        return os.path.join(tempfile.gettempdir(), f"trace-gym-{os.geteuid()}")

    @contextlib.contextmanager
    def locked(self):
        with open(self.path / ".lock", "a+") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    # ------------------------------------------------------------ uids
    def claim_uid(self) -> int:
        """A uid no other sandbox on this machine holds and no process runs as (claimed by an O_EXCL file)."""
        rng = random.SystemRandom()
        in_use = {proc_uid(int(p)) for p in os.listdir("/proc") if p.isdigit()}
        for _ in range(1000):
            uid = rng.randrange(200_000, 2_000_000_000)
            if uid in in_use:
                continue
            try:
                fd = os.open(self.path / "uids" / str(uid), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            except FileExistsError:
                continue
            os.write(fd, f"{os.getpid()} {_start_time(os.getpid())}".encode())
            os.close(fd)
            return uid
        raise OSError("no free sandbox uid")

    def release_uid(self, uid: int | None) -> None:
        if uid is not None:
            with contextlib.suppress(OSError):
                os.unlink(self.path / "uids" / str(uid))

    # ------------------------------------------------------------ records
    def write_record(self, sid: str, record: dict[str, Any]) -> None:
        tmp = self.path / f".{sid}.json.tmp"
        tmp.write_text(json.dumps(record))
        os.chmod(tmp, 0o600)
        os.replace(tmp, self.path / f"{sid}.json")

    def remove(self, sid: str, uid: int | None) -> None:
        shutil.rmtree(self.path / sid, ignore_errors=True)
        for suffix in (".json", ".log"):
            with contextlib.suppress(OSError):
                os.unlink(self.path / f"{sid}{suffix}")
        self.release_uid(uid)

    def reap(self) -> int:
        """Clean up after hosts that died without closing their sandboxes; returns how many were reaped."""
        reaped = 0
        with self.locked():
            for entry in list(self.path.glob("*.json")):
                sid = entry.stem
                try:
                    record = json.loads(entry.read_text())
                    host, start = int(record["host_pid"]), record.get("host_start")
                except (OSError, ValueError, KeyError, TypeError):
                    continue
                if _start_time(host) is not None and _start_time(host) == start:
                    continue  # its host still runs
                self._reap_one(record)
                self.remove(sid, record.get("uid"))
                reaped += 1
            for claim in list((self.path / "uids").iterdir()):
                try:
                    host, start = claim.read_text().split()
                    if _start_time(int(host)) is None or str(_start_time(int(host))) != start:
                        claim.unlink()
                except (OSError, ValueError):
                    pass
        return reaped

    @staticmethod
    def _reap_one(record: dict[str, Any]) -> None:
        keeper, keeper_start = record.get("keeper_pid"), record.get("keeper_start")
        if isinstance(keeper, int) and keeper > 1 and _start_time(keeper) == keeper_start:
            kill_pid_checked(keeper, lambda p: _start_time(p) == keeper_start)
        uid = record.get("uid")
        if isinstance(uid, int) and uid >= 200_000 and os.geteuid() == 0:  # a sandbox-only uid: all its processes
            for _ in range(20):
                pids = [int(p) for p in os.listdir("/proc") if p.isdigit() and proc_uid(int(p)) == uid]
                if not pids:
                    break
                for pid in pids:
                    kill_pid_checked(pid, lambda p: proc_uid(p) == uid)
                time.sleep(0.01)
        remove_cgroups([d for d in record.get("cgroups", []) if isinstance(d, str) and "/trace-gym-" in d])
