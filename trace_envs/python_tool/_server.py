"""The sandbox side of PythonMath's interpreter (runs in its own process; stdlib only).

Process tree, all started by the host through one ``Popen``::

    keeper  (stays root where the host is root; sets up namespaces and rlimits,
      |      preloads modules, is the child-subreaper that reaps every orphan)
      +-- base      (privileges dropped; a pristine interpreter, never runs user code)
            +-- live / frozen copies, each made by ``fork`` of another one

Every non-keeper process runs the same loop on its own Unix socket: ``exec``
runs a cell, ``fork`` makes a copy-on-write copy of the whole interpreter that
serves on a socket the host passes along (SCM_RIGHTS). Which copy is "live"
and which is "frozen" is the host's business. Messages are 4-byte big-endian
length + JSON.

This file is executed as a script by path; it must not import trace_envs.
"""

from __future__ import annotations

import ast
import builtins
import ctypes
import ctypes.util
import json
import os
import resource
import shutil
import signal
import socket
import struct
import sys
import traceback

CLONE_NEWNS = 0x00020000
CLONE_NEWNET = 0x40000000
MS_RDONLY, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 1, 32, 4096, 16384, 1 << 18
PR_SET_CHILD_SUBREAPER, PR_SET_NO_NEW_PRIVS = 36, 38
WORLD_WRITABLE = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock", "/dev/mqueue")
WRITE_EVENTS = ("os.remove", "os.rename", "os.mkdir", "os.rmdir", "os.chmod", "os.chown", "os.link",
                "os.symlink", "os.truncate", "os.utime", "shutil.rmtree", "shutil.move", "shutil.copyfile")
BLOCKED_EVENTS = ("os.fork", "os.forkpty", "os.system", "os.exec", "os.posix_spawn", "os.spawn",
                  "subprocess.Popen", "os.kill", "os.killpg", "signal.pthread_kill", "socket.connect",
                  "socket.bind", "socket.sendto", "socket.getaddrinfo", "ctypes.dlopen", "os.setuid")

_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
_state = {"armed": False, "workdir": "/", "root": "/", "ns": None, "cell": 0}


# ------------------------------------------------------------------ framing
def send(sock: socket.socket, obj: object) -> None:
    data = json.dumps(obj).encode()
    sock.sendall(struct.pack(">I", len(data)) + data)


def recv(sock: socket.socket) -> tuple[dict, list[int]]:
    head, fds = b"", []
    while len(head) < 4:
        chunk, got, _, _ = socket.recv_fds(sock, 4 - len(head), 4)
        if not chunk:
            raise EOFError
        head += chunk
        fds += got
    (size,) = struct.unpack(">I", head)
    body = bytearray()
    while len(body) < size:
        chunk = sock.recv(min(1 << 20, size - len(body)))
        if not chunk:
            raise EOFError
        body += chunk
    return json.loads(body), fds


# ------------------------------------------------------------- isolation
def _mount(src: str | None, dst: str, flags: int) -> bool:
    ok = _libc.mount(src.encode() if src else None, dst.encode(), None, flags, None) == 0
    return ok


def _closed_ancestor(path: str) -> tuple[str, str] | None:
    """The outermost ancestor of ``path`` that other users cannot traverse, and its child on the way."""
    parts = os.path.realpath(path).split(os.sep)[1:]
    current = "/"
    for i, part in enumerate(parts[:-1]):
        current = os.path.join(current, part)
        if not os.stat(current).st_mode & 0o001:
            return current, parts[i + 1]
    return None


def expose_python(cfg: dict) -> bool:
    """Make the interpreter's own files reachable for a dropped uid, hiding the rest of closed dirs.

    A closed directory on the way (e.g. /root, mode 0700, holding ~/.pyenv)
    gets an empty tmpfs on top inside this mount namespace, and only the
    needed entries are bind-mounted back. Returns whether everything is reachable.
    """
    needed = [sys.base_prefix, sys.prefix, os.path.dirname(os.path.abspath(__file__))]
    needed += [p for p in sys.path if p and os.path.isdir(p)]
    closed: dict[str, set[str]] = {}
    for path in needed:
        hit = _closed_ancestor(path)
        if hit:
            closed.setdefault(hit[0], set()).add(hit[1])
    for top, children in closed.items():
        stage = os.path.join(cfg["root"], ".stage")
        os.makedirs(stage, exist_ok=True)
        if not _mount(top, stage, MS_BIND):
            return False
        if _libc.mount(b"tmpfs", top.encode(), b"tmpfs", 0, b"mode=0755,size=1m") != 0:
            return False
        for child in children:
            target = os.path.join(top, child)
            os.mkdir(target) if os.path.isdir(os.path.join(stage, child)) else open(target, "w").close()
            if not _mount(os.path.join(stage, child), target, MS_BIND):
                return False
        _libc.umount2(stage.encode(), 2)  # MNT_DETACH
        os.rmdir(stage)
    return all(_closed_ancestor(p) is None for p in needed)


def isolate_os(cfg: dict) -> list[str]:
    """Namespaces and read-only world-writable dirs (keeper, as root). Returns the active layers."""
    layers: list[str] = []
    if os.geteuid() != 0:
        return layers
    if cfg["network_namespace"] and _libc.unshare(CLONE_NEWNET) == 0:
        layers.append("network-namespace")
    if _libc.unshare(CLONE_NEWNS) == 0 and _mount(None, "/", MS_REC | MS_PRIVATE):
        done = True
        for path in WORLD_WRITABLE:
            if os.path.isdir(path) and not os.path.islink(path):
                done &= _mount(path, path, MS_BIND) and _mount(None, path, MS_REMOUNT | MS_BIND | MS_RDONLY)
        # the sandbox's own dir stays writable: a bind mount of it, remounted read-write
        done &= _mount(cfg["root"], cfg["root"], MS_BIND) and _mount(None, cfg["root"], MS_REMOUNT | MS_BIND)
        if done:
            layers.append("mount-namespace(read-only /tmp,/var/tmp,/dev/shm)")
        if cfg["uid"] is not None and not expose_python(cfg):
            cfg["uid"] = None  # the interpreter could not import its own stdlib under another uid
    elif cfg["uid"] is not None and not all(
        _closed_ancestor(p) is None for p in (sys.base_prefix, sys.prefix, os.path.abspath(__file__))
    ):
        cfg["uid"] = None
    return layers


def drop_privileges(cfg: dict) -> list[str]:
    layers = []
    if os.geteuid() == 0 and cfg["uid"] is not None:
        os.setgroups([])
        os.setgid(cfg["uid"])
        os.setuid(cfg["uid"])
        layers.append(f"uid-drop({cfg['uid']})")
    _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    return layers


def set_limits(cfg: dict) -> list[str]:
    mem = cfg["memory_mb"] * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
    resource.setrlimit(resource.RLIMIT_FSIZE, (cfg["file_mb"] * 1024 * 1024,) * 2)
    resource.setrlimit(resource.RLIMIT_CPU, (cfg["cpu_total_s"], cfg["cpu_total_s"]))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if os.geteuid() == 0 and cfg["uid"] is not None:
        resource.setrlimit(resource.RLIMIT_NPROC, (cfg["max_processes"],) * 2)
    return ["rlimits(as,cpu,fsize,nproc)"]


def _inside(path: str) -> bool:
    real = os.path.realpath(path)
    return real == _state["workdir"] or real.startswith(_state["workdir"] + os.sep)


def _guard(event: str, args: tuple) -> None:
    if not _state["armed"]:
        return
    if event == "open":
        path, mode = args[0], args[1]
        writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
            isinstance(mode, int) and mode & (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND))
        if writing and isinstance(path, (str, bytes)) and not _inside(os.fsdecode(path)):
            raise PermissionError(f"sandbox: writing outside the work directory is not allowed: {path!r}")
    elif event in WRITE_EVENTS:
        for arg in args:
            if isinstance(arg, (str, bytes)) and not _inside(os.fsdecode(arg)):
                raise PermissionError(f"sandbox: {event} outside the work directory is not allowed")
    elif event.startswith(BLOCKED_EVENTS) or event == "socket.__new__":
        raise PermissionError(f"sandbox: {event} is not allowed")


# ------------------------------------------------------------- cell runner
class CappedWriter:
    def __init__(self, limit: int) -> None:
        self.parts: list[str] = []
        self.size = 0
        self.limit = limit
        self.truncated = 0

    def write(self, text: str) -> int:
        text = str(text)
        room = self.limit - self.size
        if room > 0:
            self.parts.append(text[:room])
            self.size += min(room, len(text))
        self.truncated += max(0, len(text) - max(room, 0))
        return len(text)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False

    def getvalue(self) -> str:
        return "".join(self.parts)


class CellTimeout(Exception):
    pass


def _on_alarm(signum, frame):
    raise CellTimeout("the cell exceeded its wall-clock limit")


def _on_xcpu(signum, frame):
    raise CellTimeout("the cell exceeded its CPU-time limit")


def run_cell(code: str, cfg: dict) -> dict:
    _state["cell"] += 1
    name = f"<cell {_state['cell']}>"
    out = CappedWriter(cfg["output_chars"])
    ok = True
    used = resource.getrusage(resource.RUSAGE_SELF)
    cpu_now = int(used.ru_utime + used.ru_stime)
    old = sys.stdout, sys.stderr
    sys.stdout = sys.stderr = out
    try:
        resource.setrlimit(resource.RLIMIT_CPU, (min(cpu_now + cfg["cpu_s"], cfg["cpu_total_s"]), cfg["cpu_total_s"]))
        signal.setitimer(signal.ITIMER_REAL, cfg["timeout_s"])
        tree = ast.parse(code, filename=name)
        last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
        _state["armed"] = True
        exec(compile(tree, name, "exec"), _state["ns"])
        if last is not None:
            value = eval(compile(ast.Expression(last.value), name, "eval"), _state["ns"])
            if value is not None:
                print(repr(value))
    except BaseException as exc:  # noqa: BLE001 - user code may raise anything, SystemExit included
        _state["armed"] = False
        ok = False
        frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename != __file__]
        text = "".join(traceback.format_list(frames)) if frames else ""
        text = ("Traceback (most recent call last):\n" + text) if text else ""
        out.write(text + "".join(traceback.format_exception_only(type(exc), exc)))
    finally:
        _state["armed"] = False
        signal.setitimer(signal.ITIMER_REAL, 0)
        sys.stdout, sys.stderr = old
    return {"ok": ok, "output": out.getvalue(), "truncated": out.truncated}


# ----------------------------------------------------------------- serving
def serve(sock: socket.socket, cfg: dict) -> None:
    while True:
        try:
            msg, fds = recv(sock)
        except (EOFError, OSError):
            os._exit(0)
        op = msg.get("op")
        if op == "exec":
            send(sock, run_cell(msg["code"], cfg))
        elif op == "fork":
            try:
                copy = fork_copy(sock, fds[0])
            except OSError as exc:  # e.g. the process cap, while killed copies are still exiting
                os.close(fds[0])
                send(sock, {"error": f"fork failed: {exc}"})
                continue
            if isinstance(copy, int):
                send(sock, {"pid": copy})
            else:  # this process is the new copy: from now on it serves its own channel
                sock = copy
        elif op == "seed":
            import random

            random.seed(msg["seed"])
            if "numpy" in sys.modules:
                sys.modules["numpy"].random.seed(msg["seed"] % 2**32)
            send(sock, {"ok": True})
        elif op == "ping":
            send(sock, {"pid": os.getpid(), "cell": _state["cell"]})
        else:
            send(sock, {"error": f"unknown op {op!r}"})


def fork_copy(sock: socket.socket, fd: int) -> socket.socket | int:
    """Copy this whole interpreter (memory by fork, files by copying the work dir).

    Returns the copy's pid in the parent, and the copy's own channel in the copy.
    """
    rng = sys.modules.get("random")
    rng_state = rng.getstate() if rng is not None else None
    pid = os.fork()
    if pid:
        os.close(fd)
        return pid
    try:
        if rng is not None:  # random re-seeds itself in a forked child; a copy must keep the parent's state
            rng.setstate(rng_state)
        sock.close()
        os.setsid()
        src = _state["workdir"]
        dst = os.path.join(_state["root"], str(os.getpid()))
        shutil.copytree(src, dst, symlinks=True)
        os.chdir(dst)
        _state["workdir"] = dst
        channel = socket.socket(fileno=fd)
        send(channel, {"ready": os.getpid()})  # only now may the host treat the copy as independent
        return channel
    except BaseException:  # noqa: BLE001 - a copy that cannot start must never serve its parent's socket
        traceback.print_exc()
        os._exit(1)


def keeper_main() -> None:
    cfg = json.loads(sys.argv[1])
    keeper = socket.socket(fileno=cfg["keeper_fd"])
    layers = isolate_os(cfg)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # with the subreaper flag: every orphan is reaped here
    _libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    for module in cfg["preload"]:
        try:
            __import__(module)
        except Exception:  # noqa: BLE001 - a missing optional module just is not preloaded
            pass
    base_pid = os.fork()
    if base_pid == 0:
        keeper.close()
        os.setsid()
        layers += set_limits(cfg)
        os.makedirs(os.path.join(cfg["root"], "base"), exist_ok=True)
        os.chown(os.path.join(cfg["root"], "base"), cfg["uid"] or os.getuid(), cfg["uid"] or os.getgid())
        layers += drop_privileges(cfg)
        os.chdir(os.path.join(cfg["root"], "base"))
        _state.update(workdir=os.path.realpath("."), root=cfg["root"])
        _state["ns"] = {"__name__": "__sandbox__", "__builtins__": builtins}
        sys.addaudithook(_guard)
        layers.append("audit-hook guard(writes outside work dir, processes, signals, sockets)")
        signal.signal(signal.SIGALRM, _on_alarm)
        signal.signal(signal.SIGXCPU, _on_xcpu)
        base = socket.socket(fileno=cfg["base_fd"])
        send(base, {"ready": True, "pid": os.getpid(), "isolation": layers})
        serve(base, cfg)
        os._exit(0)
    os.close(cfg["base_fd"])
    try:
        recv(keeper)  # blocks until the host says stop or goes away
    except (EOFError, OSError):
        pass
    os._exit(0)


if __name__ == "__main__":
    keeper_main()
