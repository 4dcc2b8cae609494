"""The in-process guard of a sandbox interpreter: the audit hook and the sealed I/O objects
(sandbox side; stdlib only).

:func:`make_guard` returns the audit hook and its one handle (a one-shot permit), sharing a closure
that no module, frame or object reachable from model code refers to; :func:`sealed_objects` makes
the objects model code does reach (the output writer, the alarm handlers) in a namespace of their
own. Both are called once, before model code runs; the interpreter drops this module from
``sys.modules`` afterwards. It is a guard, not a kernel boundary (see ``_server.py``).

Split from ``_server.py``, which imports it from its own directory; it must not import trace_envs.
"""

from __future__ import annotations

import _thread
import builtins
import os
import stat

__all__ = ["WRITE_EVENTS", "BLOCKED_EVENTS", "FRAME_ATTRS", "make_guard", "sealed_objects"]

WRITE_EVENTS = ("os.remove", "os.rename", "os.mkdir", "os.rmdir", "os.chmod", "os.chown", "os.link",
                "os.symlink", "os.truncate", "os.utime", "os.chflags", "os.setxattr", "os.removexattr",
                "shutil.rmtree", "shutil.move", "shutil.copyfile", "shutil.copytree", "shutil.chown",
                "shutil.copymode", "shutil.copystat", "shutil.make_archive", "shutil.unpack_archive")
BLOCKED_EVENTS = ("os.fork", "os.forkpty", "os.system", "os.exec", "os.posix_spawn", "os.spawn",
                  "subprocess.Popen", "os.kill", "os.killpg", "signal.pthread_kill", "socket.",
                  "ctypes.", "os.setuid", "os.setgid", "os.setreuid", "os.setregid", "os.setresuid",
                  "os.setresgid", "os.setgroups", "resource.setrlimit", "resource.prlimit", "gc.get_",
                  "sys._current_frames", "sys.settrace", "sys.setprofile", "sys.addaudithook",
                  "sys._current_exceptions", "cpython.PyInterpreterState_")
FRAME_ATTRS = ("tb_frame", "gi_frame", "cr_frame", "ag_frame", "f_back", "f_globals", "f_locals")


# ------------------------------------------------------------- the sealed part
# Defined in a namespace of their own: model code reaches these objects (sys.stdout, signal handlers),
# and through a function's __globals__ it would reach its module; this module must stay out of reach.
_SEALED_SRC = '''
class CellTimeout(Exception):
    pass


class CappedWriter:
    def __init__(self, limit):
        self.parts = []
        self.size = 0
        self.limit = limit
        self.truncated = 0

    def write(self, text):
        text = str(text)
        room = self.limit - self.size
        if room > 0:
            self.parts.append(text[:room])
            self.size += min(room, len(text))
        self.truncated += max(0, len(text) - max(room, 0))
        return len(text)

    def flush(self):
        pass

    def isatty(self):
        return False

    def getvalue(self):
        return "".join(self.parts)


def on_alarm(signum, frame):
    raise CellTimeout("the cell exceeded its wall-clock limit")


def on_xcpu(signum, frame):
    raise CellTimeout("the cell exceeded its CPU-time limit")
'''


def sealed_objects() -> dict:
    allowed = ("str", "len", "min", "max", "Exception", "__build_class__")
    ns: dict = {"__name__": "sandbox_io", "__builtins__": {k: getattr(builtins, k) for k in allowed}}
    exec(compile(_SEALED_SRC, "<sandbox io>", "exec"), ns)
    return ns


def make_guard(workdir: str):
    """The audit hook and its one handle (a one-shot permit), sharing a closure; the work dir is fixed.

    Everything the hook calls is captured here as a C-level object: rebinding ``os.path.realpath``,
    ``builtins.isinstance`` or any module attribute from model code changes nothing in it.
    """
    get_ident, main = _thread.get_ident, _thread.get_ident()
    getcwd, lstat, readlink, is_link = os.getcwd, os.lstat, os.readlink, stat.S_ISLNK
    is_instance, str_, bytes_, int_, denied, shallow = isinstance, str, bytes, int, PermissionError, ValueError
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
    write_events, blocked, frame_attrs = frozenset(WRITE_EVENTS), BLOCKED_EVENTS, frozenset(FRAME_ATTRS)
    stat_, is_directory = os.stat, stat.S_ISDIR
    state = {"workdir": workdir, "permit": None}

    def resolve(path):
        """``path`` absolute with every symlink resolved (non-strict, like ``os.path.realpath``)."""
        if is_instance(path, bytes_):
            path = path.decode("utf-8", "surrogateescape")
        if not path.startswith("/"):
            path = getcwd() + "/" + path
        pending = path.split("/")[::-1]
        out: list = []
        hops = 0
        while pending:
            part = pending.pop()
            if part in ("", "."):
                continue
            if part == "..":
                if out:
                    out.pop()
                continue
            candidate = "/" + "/".join(out) + ("/" if out else "") + part
            try:
                mode = lstat(candidate).st_mode
            except OSError:
                out.append(part)
                continue
            if is_link(mode):
                hops += 1
                if hops > 40:
                    raise denied("sandbox: too many symbolic links")
                target = readlink(candidate)
                if target.startswith("/"):
                    out = []
                pending.extend(target.split("/")[::-1])
            else:
                out.append(part)
        return "/" + "/".join(out)

    def inside(path) -> bool:
        real, top = resolve(path), state["workdir"]
        return real == top or real.startswith(top + "/")

    def hook(event, args):
        if event == state["permit"] and get_ident() == main:
            state["permit"] = None  # the server's own call, consumed by its audit event
        elif event == "open":
            path, mode, flags = args
            writing = (is_instance(mode, str_) and ("w" in mode or "a" in mode or "x" in mode or "+" in mode)) or (
                is_instance(flags, int_) and flags & write_flags)
            if writing and is_instance(path, (str_, bytes_)):
                if not inside(path):
                    raise denied(f"sandbox: writing outside the work directory is not allowed: {path!r}")
            elif mode is None and is_instance(path, (str_, bytes_)) and not inside(path):
                # os.open of a directory elsewhere would give a dir_fd, and writes relative to it carry
                # no path this hook could check
                try:
                    is_dir = is_directory(stat_(path).st_mode)
                except OSError:
                    is_dir = False
                if is_dir:
                    raise denied("sandbox: opening directories outside the work directory is not allowed")
        elif event in write_events:
            for arg in args:
                if is_instance(arg, (str_, bytes_)) and not inside(arg):
                    raise denied(f"sandbox: {event} outside the work directory is not allowed")
        elif event.startswith(blocked):
            raise denied(f"sandbox: {event} is not allowed")
        elif event == "sys._getframe":
            raise shallow("call stack is not deep enough")  # what callers such as namedtuple expect
        elif event == "object.__getattr__" and args[1] in frame_attrs:
            raise denied(f"sandbox: reading .{args[1]} is not allowed")
        elif event == "object.__setattr__" and args[1] in ("__code__", "__globals__"):
            raise denied(f"sandbox: replacing .{args[1]} is not allowed")

    def permit(event):
        state["permit"] = event

    return hook, permit
