"""The host's handle on one sandbox interpreter process: a pidfd the kernel vouched for, a socket,
and checked requests (one deadline per reply, a frame cap, the op's schema, sequence numbers).

Split from ``sandbox.py``; :class:`SandboxCrashed` and :class:`SnapshotTreeError` are re-exported there.
"""

from __future__ import annotations

import os
import random
import socket
import threading
import time
from typing import TYPE_CHECKING, Any

from trace_envs.errors import SandboxError
from trace_envs.python_tool._host import (
    ProtocolError,
    adopt,
    kill_verified,
    nothing_pending,
    recv_frame,
    send_frame,
)

if TYPE_CHECKING:
    from trace_envs.python_tool.sandbox import Sandbox

__all__ = ["SandboxCrashed", "SnapshotTreeError"]


class SandboxCrashed(SandboxError):
    """The live interpreter died or was killed (the host process is unaffected)."""


class SnapshotTreeError(SandboxError):
    """The work dir is deeper or larger than a snapshot copies (``snapshot_max_depth``/``_entries``)."""


def _check_reply(op: str, reply: dict[str, Any], output_chars: int) -> None:
    """The schema of each op's reply; anything else is a forged or corrupt frame."""
    if "error" in reply:
        if not isinstance(reply["error"], str) or len(reply["error"]) > 1000:
            raise ProtocolError("an error reply without a short error text")
        return
    if op == "exec":
        ok, output, truncated = reply.get("ok"), reply.get("output"), reply.get("truncated")
        if (type(ok) is not bool or not isinstance(output, str) or len(output) > output_chars
                or type(truncated) is not int or truncated < 0 or type(reply.get("inodes", 0)) is not int):
            raise ProtocolError("an exec reply off its schema")
    elif op == "fork":
        if reply.get("forked") is not True:
            raise ProtocolError("a fork reply off its schema")
    elif reply.get("ok") is not True:
        raise ProtocolError(f"a {op} reply off its schema")


class _Proc:
    """One sandbox interpreter process, known by a pidfd the kernel vouched for, and the host's socket to it."""

    def __init__(self, pid: int, pidfd: int | None, sock: socket.socket, box: Sandbox) -> None:
        self.pid = pid
        self.pidfd = pidfd
        self.sock = sock
        self.box = box
        self.alive = True
        self.released = False
        self.lock = threading.Lock()

    def kill(self, *, released: bool = True) -> None:
        if not self.alive:
            return
        self.alive = False
        self.released = released
        try:
            kill_verified(self.pid, self.pidfd)
        finally:
            if self.pidfd is not None:
                os.close(self.pidfd)
                self.pidfd = None
            self.sock.close()
        self.box._forget(self.pid)

    def fork(self, timeout: float, role: str, retries: int = 20) -> _Proc:
        """Ask this interpreter for a copy of itself; return the copy, verified through the kernel.

        The copy's pid is what SCM_CREDENTIALS says sent its first frame, and it must be a child of
        this process running as the sandbox uid (:func:`adopt`); nothing the interpreter writes names it.
        ``role`` is ``"frozen"`` (a save point: it records its open descriptors) or ``"live"`` (it
        reopens them on the files the keeper has just put in the live dir). A refused fork (the
        process cap, while killed copies are still exiting) is retried with a short
        back-off before it becomes an error. A fork the interpreter refuses raises SandboxError and
        leaves it serving; a broken channel raises SandboxCrashed.
        """
        reply: dict[str, Any] = {}
        for attempt in range(retries + 1):
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
            ours.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
            try:
                reply = self.request({"op": "fork", "role": role}, timeout, fds=(theirs.fileno(),))
            except BaseException:
                ours.close()
                raise
            finally:
                theirs.close()
            if "error" not in reply:
                creds: list[int] = []
                try:  # the copy reports once it has its own session and work dir
                    ready = recv_frame(ours, time.monotonic() + timeout, 4096, creds=creds)
                    if ready != {"seq": 0, "ready": True} or len(creds) != 3:
                        raise ProtocolError(f"unexpected start message from a copy: {str(ready)[:200]!r}")
                    pidfd = adopt(creds[0], parent=self.pid, uid=self.box.uid, known=self.box._known_pids())
                except (OSError, EOFError, ProtocolError) as exc:
                    ours.close()
                    raise SandboxError(f"the copy of interpreter {self.pid} failed to start: {exc}") from exc
                return _Proc(creds[0], pidfd, ours, self.box)
            ours.close()
            if "import lock" in reply["error"]:
                break
            if attempt < retries:
                time.sleep(0.01 * (attempt + 1))
        raise SandboxError(f"interpreter {self.pid} cannot fork: {reply.get('error')}")

    def request(self, msg: dict[str, Any], timeout: float | None, fds: tuple[int, ...] = ()) -> dict[str, Any]:
        """Send ``msg`` and return its reply, checked: the echoed sequence number, the op's schema, a
        frame cap, one deadline for the whole reply, and no stray bytes behind it.

        Raises:
            SandboxCrashed: the interpreter broke the protocol, died or missed the deadline (the
                caller must kill it: its stream can no longer be trusted).
        """
        seq = random.getrandbits(62) + 1
        deadline = time.monotonic() + (timeout if timeout is not None else 3600.0)
        cfg = self.box.config
        with self.lock:
            try:
                send_frame(self.sock, {**msg, "seq": seq}, deadline, fds)
                reply = recv_frame(self.sock, deadline, 12 * cfg.output_chars + 65_536)
                if reply.get("seq") != seq:
                    raise ProtocolError("a reply to another request (a forged or stale frame)")
                _check_reply(str(msg.get("op")), reply, cfg.output_chars)
                if not nothing_pending(self.sock):
                    raise ProtocolError("bytes after the reply (a forged frame)")
            except TimeoutError as exc:
                raise SandboxCrashed(f"the interpreter ignored its time limit (no answer within {timeout:g} s) and was killed") from exc
            except ProtocolError as exc:
                raise SandboxCrashed(f"the interpreter broke the control protocol: {exc}") from exc
            except (OSError, EOFError) as exc:
                raise SandboxCrashed(f"the interpreter process died ({type(exc).__name__})") from exc
        return reply
