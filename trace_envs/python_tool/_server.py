"""The sandbox side of PythonMath's interpreter (runs in its own process; stdlib only).

Process tree, all started by the host through one ``Popen``::

    keeper  (stays root where the host is root; sets up namespaces, mounts, cgroups and
      |      rlimits, preloads modules, is the child-subreaper that reaps every orphan, and
      |      kills the whole tree when the host's end of its socket closes, e.g. host SIGKILLed;
      |      it never touches a file of the work dir)
      +-- filer     (the pid namespace's first process; the sandbox's uid, Landlock and seccomp;
      |              copies work dirs by directory descriptor for the host: ``_filer.py``)
      +-- base      (privileges dropped; a pristine interpreter, never runs user code)
            +-- live / frozen copies, each made by ``fork`` of another one

The filer and every interpreter live in the sandbox's own pid and IPC namespaces (the keeper
stays outside, so the host's parentage checks see the keeper as every interpreter's root).

Every interpreter runs the same loop on its own Unix socket: ``exec``
runs a cell, ``fork`` makes a copy-on-write copy of the whole interpreter that
serves on a socket the host passes along (SCM_RIGHTS). Which copy is "live"
and which is "frozen" is the host's business. Messages are 4-byte big-endian
length + JSON; every request carries a ``seq`` that its reply echoes.

Nothing this process sends is trusted by the host (model code shares the
process and can write to the socket): the host learns a copy's pid from the
kernel (SCM_CREDENTIALS), checks its parentage and uid, and enforces a frame
cap, a schema and a deadline per reply.

The in-process guard (an audit hook, made by ``_guard.py``) is always armed, in every thread, the
server's own code included; the server's few privileged calls (fork, adopting
a socket, setting rlimits) are let through by one-shot permits for the main
thread, consumed by the audit event of that very C call. The hook, its state
and the permits live in a closure that no module, frame or object reachable
from model code refers to: ``__main__`` is replaced, the output writer and
signal handlers are defined in a namespace of their own, and the introspection
routes to the rest (``gc``, ``ctypes``, frames of tracebacks/generators/
coroutines, ``sys._getframe``, tracing, other threads' frames, new audit hooks,
``__code__`` replacement) are refused. It is a guard, not a kernel boundary:
under root the kernel enforces the same write rules (read-only mounts, a private
tmpfs, a dropped uid).

This file is executed as a script by path; it must not import trace_envs.
"""

from __future__ import annotations

import _imp
import _json
import _signal
import _socket
import builtins
import json
import os
import resource
import signal
import socket
import stat
import struct
import sys
import time
import types

import _filer  # the sibling files (this script's directory is sys.path[0])
import _isolation
from _guard import make_guard, sealed_objects
from _isolation import (
    PR_SET_CHILD_SUBREAPER,
    PR_SET_DUMPABLE,
    _libc,
    drop_privileges,
    isolate_os,
    join_cgroups,
    restrict_files,
    restrict_syscalls,
    set_limits,
)


# ------------------------------------------------------------------ framing (keeper and start-up only)
def send(sock: socket.socket, obj: object) -> None:
    data = json.dumps(obj).encode()
    sock.sendall(struct.pack(">I", len(data)) + data)


def recv(sock: socket.socket) -> dict:
    head = b""
    while len(head) < 4:
        chunk = sock.recv(4 - len(head))
        if not chunk:
            raise EOFError
        head += chunk
    (size,) = struct.unpack(">I", head)
    body = bytearray()
    while len(body) < size:
        chunk = sock.recv(min(1 << 20, size - len(body)))
        if not chunk:
            raise EOFError
        body += chunk
    return json.loads(body)


class Runtime:
    """What the interpreter loop needs, captured before model code runs (see the module docstring)."""

    def __init__(self, cfg: dict, workdir: str) -> None:
        self.cfg = cfg
        self.hook, self.permit = make_guard(workdir)
        self.io = sealed_objects()
        self.workdir = workdir
        self.root = cfg["root"]
        self.cell = 0
        self.ns = {"__name__": "__sandbox__", "__builtins__": builtins}
        # C-level callables, captured: model code may rebind os.fork or json.dumps, never these objects
        self.fork, self.setsid, self.chdir, self.getpid = os.fork, os.setsid, os.chdir, os.getpid
        self.close_fd, self.open, self.read = os.close, os.open, os.read
        self.write, self.readlink, self.exit = os.write, os.readlink, os._exit
        self.setrlimit, self.getrusage, self.setitimer = resource.setrlimit, resource.getrusage, signal.setitimer
        # the C functions (no enum wrapping: 20 us for all signals instead of 1 ms per cell)
        self.signal, self.getsignal = _signal.signal, _signal.getsignal
        self.catchable = tuple(int(s) for s in signal.valid_signals() if s not in (signal.SIGKILL, signal.SIGSTOP))
        self.ours = (self.io["on_alarm"], self.io["on_xcpu"], signal.default_int_handler)
        self.compile, self.exec, self.eval, self.repr = builtins.compile, builtins.exec, builtins.eval, builtins.repr
        self.excepthook = sys.__excepthook__
        self.enc = _json.encode_basestring_ascii
        self.scan = _json.make_scanner(json.JSONDecoder())
        self.pack, self.unpack = struct.pack, struct.unpack
        self.lock_held, self.sleep, self.monotonic = _imp.lock_held, time.sleep, time.monotonic
        self.socket_type = _socket.socket
        self.only_ast, self.expr_type, self.expression_type = 0x400, __import__("_ast").Expr, __import__("_ast").Expression
        self.sys = sys
        self.rlimit_cpu, self.itimer_real, self.rusage_self = resource.RLIMIT_CPU, signal.ITIMER_REAL, resource.RUSAGE_SELF
        self.listdir, self.fstat, self.getcwd, self.pread = os.listdir, os.fstat, os.getcwd, os.pread
        self.dup2, self.lseek, self.statvfs = os.dup2, os.lseek, os.statvfs
        self.is_reg, self.is_dir, self.int = stat.S_ISREG, stat.S_ISDIR, int
        self.O = {name: getattr(os, name) for name in ("O_RDONLY", "O_RDWR", "O_CREAT", "O_EXCL", "O_TRUNC",
                                                       "O_TMPFILE", "O_CLOEXEC", "SEEK_SET")}
        self.fd_table: list = []
        self.cwd = ""
        self.traceback_type, self.own_file = types.TracebackType, __file__
        self.modern_traceback = sys.version_info >= (3, 12)  # there the printer is Python code reading frames

    # ------------------------------------------------------------ framing
    def recv(self, sock) -> tuple[dict, list[int]]:
        head, fds = b"", []
        while len(head) < 4:
            chunk, ancillary, _, _ = sock.recvmsg(4 - len(head), 64)
            if not chunk:
                raise EOFError
            head += chunk
            for level, kind, data in ancillary:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    fds += list(self.unpack(f"{len(data) // 4}i", data[: len(data) - len(data) % 4]))
        (size,) = self.unpack(">I", head)
        body = bytearray()
        while len(body) < size:
            chunk = sock.recv(min(1 << 20, size - len(body)))
            if not chunk:
                raise EOFError
            body += chunk
        msg, _ = self.scan(body.decode(), 0)
        return msg, fds

    def reply(self, sock, seq: int, **fields: object) -> None:
        parts = [f'"seq": {int(seq)}']
        for key, value in fields.items():
            if value is True or value is False:
                parts.append(f'"{key}": {"true" if value else "false"}')
            elif type(value) is int:
                parts.append(f'"{key}": {value}')
            else:
                parts.append(f'"{key}": {self.enc(value if type(value) is str else self.repr(value))}')
        data = ("{" + ", ".join(parts) + "}").encode()
        sock.sendall(self.pack(">I", len(data)) + data)

    # ------------------------------------------------------------ cells
    def run_cell(self, code: str) -> dict:
        cfg, io = self.cfg, self.io
        self.cell += 1
        name = f"<cell {self.cell}>"
        out = io["CappedWriter"](cfg["output_chars"])
        ok = True
        used = self.getrusage(self.rusage_self)
        cpu_now = int(used.ru_utime + used.ru_stime)
        sys_ = self.sys
        old = sys_.stdout, sys_.stderr
        sys_.stdout = sys_.stderr = out
        try:
            self.signal(signal.SIGXCPU, self.io["on_xcpu"])
            self.set_cpu_limit(cpu_now + cfg["cpu_s"])
            self.setitimer(self.itimer_real, cfg["timeout_s"])
            tree = self.compile(code, name, "exec", self.only_ast)
            last = tree.body.pop() if tree.body and type(tree.body[-1]) is self.expr_type else None
            self.exec(self.compile(tree, name, "exec"), self.ns)
            if last is not None:
                value = self.eval(self.compile(self.expression_type(last.value), name, "eval"), self.ns)
                if value is not None:
                    out.write(self.repr(value) + "\n")
        except BaseException as exc:  # noqa: BLE001 - user code may raise anything, SystemExit included
            self.setitimer(self.itimer_real, 0)
            ok = False
            sys_.stderr = out
            try:
                self.print_exception(exc, out)
            except BaseException:  # noqa: BLE001 - a hostile __str__, or the alarm while printing
                out.write(f"{type(exc).__name__}: <the exception could not be printed>\n")
        finally:
            self.setitimer(self.itimer_real, 0)
            self.restore_signals()
            sys_.stdout, sys_.stderr = old
            used = self.getrusage(self.rusage_self)
            # between cells, background threads get one cell's CPU budget; past it the process ends
            self.set_cpu_limit(int(used.ru_utime + used.ru_stime) + cfg["cpu_s"])
        return {"ok": ok, "output": out.getvalue(), "truncated": out.truncated}

    def set_cpu_limit(self, soft: int) -> None:
        hard = self.cfg["cpu_total_s"]
        limits = (soft if soft < hard else hard, hard)  # computed before the permit: nothing patchable after it
        self.permit("resource.setrlimit")
        try:
            self.setrlimit(self.rlimit_cpu, limits)
        except (ValueError, OSError):
            self.permit(None)

    def print_exception(self, exc: BaseException, out) -> None:
        """The traceback of a failed cell, without this module's frame."""
        tb = self.user_frames(exc.__traceback__)
        if not self.modern_traceback:
            exc.__traceback__ = tb
            self.excepthook(type(exc), exc, tb)  # C code (3.10/3.11): nothing model code could patch
            return
        # 3.12+ prints with the traceback module, which reads frames (refused): line numbers only
        lines = []
        while tb is not None:
            lines.append(str(tb.tb_lineno))
            tb = tb.tb_next
        if lines:
            out.write("Traceback (most recent call last): line " + ", line ".join(lines) + "\n")
        import traceback

        out.write("".join(traceback.format_exception_only(type(exc), exc)))

    def user_frames(self, tb):
        """The traceback without this file's frames (the server's and the guard's)."""
        kept = []
        while tb is not None:
            self.permit("object.__getattr__")  # consumed by the tb_frame read right below (C attribute)
            frame = tb.tb_frame
            if frame.f_code.co_filename != self.own_file:
                kept.append((frame, tb.tb_lasti, tb.tb_lineno))
            tb = tb.tb_next
        self.permit(None)
        out = None
        for frame, lasti, lineno in reversed(kept):
            out = self.traceback_type(out, frame, lasti, lineno)
        return out

    def restore_signals(self) -> None:
        """Our handlers back, and no handler model code installed (it would see the server's frames)."""
        for sig in self.catchable:
            try:
                current = self.getsignal(sig)
            except (ValueError, OSError):
                continue
            if current is not None and type(current) is not int and current not in self.ours:
                self.signal(sig, _signal.SIG_DFL)
        self.signal(signal.SIGALRM, self.io["on_alarm"])
        # between cells the kernel's default action ends the process: whichever thread gets the signal
        # (a burning background thread, while the main thread waits in recvmsg), it cannot be deferred
        self.signal(signal.SIGXCPU, _signal.SIG_DFL)

    def work_inodes(self) -> int:
        """Inodes in use on the work root's own tmpfs (-1 when it has none): the host asks the filer
        whether the work dir passed a snapshot cap only when this count allows it."""
        if not self.cfg.get("tmpfs"):
            return -1
        try:
            st = self.statvfs(self.workdir)
        except OSError:
            return -1
        return self.int(st.f_files - st.f_ffree)

    # ------------------------------------------------------------ serving
    def serve(self, sock) -> None:
        while True:
            try:
                msg, fds = self.recv(sock)
            except self.io["CellTimeout"]:  # background threads used up the CPU between cells
                self.exit(3)
            except (EOFError, OSError, ValueError, StopIteration):
                self.exit(0)
            op, seq = msg.get("op"), msg.get("seq", 0)
            if op == "exec":
                result = self.run_cell(str(msg.get("code", "")))
                self.reply(sock, seq, ok=result["ok"], output=result["output"], truncated=result["truncated"],
                           inodes=self.work_inodes())
            elif op == "fork":
                if not fds:
                    self.reply(sock, seq, error="fork failed: no socket arrived (file descriptors exhausted?)")
                    continue
                for extra in fds[1:]:
                    self.close_fd(extra)
                copy = self.fork_copy(sock, fds[0], "frozen" if msg.get("role") == "frozen" else "live")
                if isinstance(copy, str):
                    self.reply(sock, seq, error=copy)
                elif copy is None:
                    self.reply(sock, seq, forked=True)
                else:  # this process is the new copy: from now on it serves its own channel
                    sock = copy
            elif op == "seed":
                random = self.sys.modules.get("random")
                if random is not None:
                    random.seed(msg.get("seed", 0))
                if "numpy" in self.sys.modules:
                    self.sys.modules["numpy"].random.seed(int(msg.get("seed", 0)) % 2**32)
                self.reply(sock, seq, ok=True)
            else:
                self.reply(sock, seq, error=f"unknown op {op!r}")

    def fork_copy(self, sock, fd: int, role: str):
        """Copy this whole interpreter by ``fork``; the copy serves on ``fd``.

        The work dir's files are the filer's job (``_filer.py``): a frozen copy's files are saved
        beside the live dir, and put back into the one live dir before a live copy starts, so every
        live interpreter sees its files at the same absolute path. What a fork would otherwise share
        between branches is handled here: a ``frozen`` copy records every open file and directory
        descriptor (path, flags, offset; a deleted file's bytes) and the working directory, and
        replaces those descriptors with placeholders; a ``live`` copy reopens each recorded
        descriptor at its number on the filer's fresh copy of the files. No open file description
        (so no file offset) is ever shared between two branches.

        Returns None in the parent (or an error sentence), and the copy's own channel in the copy.
        """
        deadline = self.monotonic() + 2.0
        while self.lock_held():  # os.fork waits for the import lock: a thread stuck in an import would hang it
            if self.monotonic() > deadline:
                self.close_fd(fd)
                return "fork refused: a thread holds the import lock"
            self.sleep(0.005)
        rng = self.sys.modules.get("random")
        rng_state = rng.getstate() if rng is not None else None
        try:
            self.permit("os.fork")
            pid = self.fork()
        except OSError as exc:  # e.g. the process cap, while killed copies are still exiting
            self.close_fd(fd)
            return f"fork failed: {exc}"
        if pid:
            self.close_fd(fd)
            return None
        try:
            if rng is not None:  # random re-seeds itself in a forked child; a copy must keep the parent's state
                rng.setstate(rng_state)
            sock.close()
            self.setsid()
            if role == "frozen":
                self.record_descriptors(fd)
            else:
                self.reopen_descriptors()
            self.permit("socket.__new__")
            channel = self.socket_type(fileno=fd)
            self.reply(channel, 0, ready=True)  # the host reads this copy's pid from the kernel, not from here
            return channel
        except BaseException:  # noqa: BLE001 - a copy that cannot start must never serve its parent's socket
            self.exit(1)

    def record_descriptors(self, keep: int) -> None:
        """Note every regular-file and directory descriptor above 2 (but ``keep``) and park it on /dev/null."""
        table, top = [], self.workdir
        try:
            here = self.getcwd()
        except OSError:
            here = top
        self.cwd = here[len(top) + 1:] if here.startswith(top + "/") else ""
        null = self.open("/dev/null", self.O["O_RDONLY"])
        try:
            for name in self.listdir("/proc/self/fd"):
                number = self.int(name)
                if number <= 2 or number in (keep, null):
                    continue
                try:
                    info = self.fstat(number)
                    if not (self.is_reg(info.st_mode) or self.is_dir(info.st_mode)):
                        continue
                    target = self.readlink("/proc/self/fd/" + name)
                    flags, pos = self.fd_flags(name)
                except (OSError, ValueError, IndexError):
                    continue
                data = None
                if target.endswith(" (deleted)"):  # unlinked while open: only its bytes can be copied
                    if not self.is_reg(info.st_mode) or info.st_size > self.cfg["file_mb"] * 1024 * 1024:
                        continue
                    data = self.pread(number, info.st_size, 0)
                table.append((number, target, flags, pos, data))
                self.dup2(null, number)
        finally:
            self.close_fd(null)
        self.fd_table = table

    def fd_flags(self, name: str) -> tuple[int, int]:
        fd = self.open("/proc/self/fdinfo/" + name, self.O["O_RDONLY"])
        try:
            text = self.read(fd, 4096).decode()
        finally:
            self.close_fd(fd)
        return (self.int(text.split("flags:", 1)[1].split()[0], 8), self.int(text.split("pos:", 1)[1].split()[0]))

    def reopen_descriptors(self) -> None:
        """Reopen the recorded descriptors (and directory) on this copy's files; clear the record."""
        o = self.O
        for number, target, flags, pos, data in self.fd_table:
            flags &= ~(o["O_CREAT"] | o["O_EXCL"] | o["O_TRUNC"])
            try:
                if data is not None:
                    new = self.open(self.workdir, o["O_TMPFILE"] | o["O_RDWR"], 0o600)
                    view = memoryview(data)
                    while view:
                        view = view[self.write(new, view):]
                else:
                    new = self.open(target, flags)
                self.lseek(new, pos, o["SEEK_SET"])
            except OSError:
                continue  # the path is gone from the copy: the placeholder stays
            self.dup2(new, number, inheritable=not flags & o["O_CLOEXEC"])
            self.close_fd(new)
        self.fd_table = []
        try:
            self.chdir(self.workdir + ("/" + self.cwd if self.cwd else ""))
        except OSError:
            self.chdir(self.workdir)


def readable_paths() -> list[str]:
    """What model code may read (and nothing else, under Landlock): the interpreter's own files
    (prefixes and their site-packages), this script's dir, and the system dirs a process needs."""
    prefixes = {sys.base_prefix, sys.prefix, sys.exec_prefix}
    found = set(prefixes) | {os.path.dirname(os.path.abspath(__file__))}
    found |= {p for p in sys.path if p and (p.endswith(("site-packages", "dist-packages"))
                                          or any(p.startswith(x + "/") for x in prefixes))}
    found |= {os.path.dirname(os.path.realpath(sys.executable))}
    found |= {"/usr", "/lib", "/lib64", "/lib32", "/bin", "/etc", "/dev", "/proc", "/sys/devices/system/cpu"}
    return sorted(p for p in found if os.path.exists(p))


def interpreter_main(cfg: dict, base_fd: int, layers: list[str]) -> None:
    """The base interpreter: limits, dropped privileges, Landlock, seccomp, sealed guard, then serve
    forever (never returns). Its hello names the layers and which required ones hold (``achieved``)."""
    os.setsid()
    layers += set_limits(cfg)
    workdir = cfg["root"] + "/live"
    layers += drop_privileges(cfg)
    os.chdir(workdir)
    base = socket.socket(fileno=base_fd)
    runtime = Runtime(cfg, os.path.realpath(workdir))
    runtime.restore_signals()
    sys.modules["__main__"] = types.ModuleType("__main__")  # this module is out of model code's reach
    for name in ("_isolation", "_guard"):
        sys.modules.pop(name, None)
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):  # stdio was the host's log file: model code must not write to the host's disk
        os.dup2(null, fd)
    os.close(null)
    achieved = cfg.get("achieved", [])
    found, holds = restrict_files(os.path.realpath(workdir), readable_paths())
    layers += found
    achieved += ["landlock"] if holds else []
    found, holds = restrict_syscalls()
    layers += found
    achieved += ["seccomp"] if holds else []
    sys.addaudithook(runtime.hook)
    layers.append("audit-hook guard(writes outside work dir, processes, signals, sockets, introspection; "
                  "always armed, no switch; a second line behind the kernel's)")
    send(base, {"ready": True, "isolation": layers, "achieved": achieved})
    runtime.serve(base)
    os._exit(0)


# ------------------------------------------------------------------ the filer
def filer_main(cfg: dict, fd: int) -> None:
    """The filer (see ``_filer.py``): the pid namespace's first process, so it reaps what is orphaned
    in it; the sandbox's uid, no capabilities, not dumpable, Landlock to the work root, seccomp.
    Its hello names what holds; it serves the host until the host's socket closes (never returns)."""
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # orphans of the namespace are re-parented here
    os.setsid()
    os.umask(0)  # copies are made with their source's mode
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_FSIZE, (cfg["file_mb"] * 1024 * 1024,) * 2)
    held = drop_privileges(cfg)
    _libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    sock = socket.socket(fileno=fd)
    null = os.open(os.devnull, os.O_RDWR)
    for std in (0, 1):
        os.dup2(null, std)
    os.close(null)
    filer = _filer.Filer(cfg["root"], max_depth=cfg["snapshot_max_depth"], max_entries=cfg["snapshot_max_entries"],
                         branch_mb=cfg["snapshot_branch_mb"], branch_inodes=cfg["snapshot_branch_entries"],
                         measured=bool(cfg.get("tmpfs")))
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 2 * cfg["snapshot_max_depth"] + 64
    if hard != resource.RLIM_INFINITY and hard < want:
        filer.max_depth = max(1, (hard - 64) // 2)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(want, hard) if hard != resource.RLIM_INFINITY else want, hard))
    found, landlock = restrict_files(os.path.realpath(cfg["root"]), readable_paths())
    found2, seccomp = restrict_syscalls()
    layers = held + found + found2
    send(sock, {"ready": True, "landlock": landlock, "seccomp": seccomp, "layers": layers,
                "shares": filer.shares is not None})
    filer.serve(sock)
    os._exit(0)


def keeper_main() -> None:
    """Namespaces, mounts and cgroups; then the filer (the pid namespace's first process) and the base
    interpreter; then wait for the host's socket to close, and kill the whole tree. Whatever fails
    here, the tree is killed before the keeper exits."""
    cfg = json.loads(sys.argv[1])
    keeper = socket.socket(fileno=cfg["keeper_fd"])
    try:
        _keeper_setup(cfg, keeper)
        while keeper.recv(65_536):  # the host sends nothing; its end closing (even SIGKILLed) ends this
            pass
    except BaseException:  # noqa: BLE001 - the keeper never leaves interpreters behind
        import traceback

        traceback.print_exc()
        sys.stderr.flush()
    finally:
        _isolation.kill_descendants()
        os._exit(0)


def _keeper_setup(cfg: dict, keeper: socket.socket) -> None:
    layers = join_cgroups(cfg)
    layers += isolate_os(cfg)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # with the subreaper flag: every orphan is reaped here
    _libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    owner = cfg["uid"] if cfg["uid"] is not None else os.getuid()
    group = cfg["uid"] if cfg["uid"] is not None else os.getgid()
    for name in ("live", "snaps"):
        os.makedirs(cfg["root"] + "/" + name, mode=0o700, exist_ok=True)
    if cfg.get("tmpfs"):  # snapshots have a quota of their own: a branch's ENOSPC never depends on them
        _isolation._mount("tmpfs", cfg["root"] + "/snaps", 2 | 4 | 8, "tmpfs",
                          f"size={cfg['snapshot_disk_mb']}m,nr_inodes={cfg['snapshot_inodes']},mode=0700,"
                          f"uid={owner},gid={group}")
    for name in ("live", "snaps"):
        os.chown(cfg["root"] + "/" + name, owner, group)
    for module in cfg["preload"]:
        try:
            __import__(module)
        except Exception:  # noqa: BLE001 - a missing optional module just is not preloaded
            pass
    for role, fd in (("filer", cfg["filer_fd"]), ("base", cfg["base_fd"])):
        pid = os.fork()
        if pid == 0:
            keeper.close()
            if role == "filer":
                os.close(cfg["base_fd"])
            try:
                if role == "filer":
                    filer_main(cfg, fd)
                else:
                    interpreter_main(cfg, fd, layers)
            except BaseException:  # noqa: BLE001 - the host shows this log when the sandbox does not start
                import traceback

                traceback.print_exc()
                sys.stderr.flush()
            finally:
                os._exit(1)
        os.close(fd)


if __name__ == "__main__":
    keeper_main()
