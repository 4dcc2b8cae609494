"""Process-tree facts and actions of the host, by pid from /proc and by pidfd (see ``_host.py``).

:func:`stop_tree` quiesces a sandbox's live interpreter before its work dir is copied: SIGSTOP
through the interpreter's pidfd stops all of its threads together; the call returns once the kernel
shows every one of its tasks stopped, and every process below it killed and gone. The cgroup freezer
is not used: the env's one cgroup also holds the keeper and the filer, which must keep running.
"""

from __future__ import annotations

import os
import signal
import time

from trace_envs.python_tool._host import kill_pid_checked, proc_stat

__all__ = ["descendants", "children", "ancestors", "pidfd_or_none", "stop_tree", "resume", "QuiesceError"]


class QuiesceError(Exception):
    """The live interpreter could not be stopped in time (it was resumed)."""


def descendants(root_pid: int) -> list[int]:
    """Live (non-zombie) descendants of ``root_pid``, from /proc."""
    kids: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        stat = proc_stat(int(entry))
        if stat is not None and stat[0] != "Z":
            kids.setdefault(stat[1], []).append(int(entry))
    found, stack = [], [root_pid]
    while stack:
        for child in kids.get(stack.pop(), []):
            found.append(child)
            stack.append(child)
    return found


def children(pid: int) -> list[int]:
    """The direct children of ``pid`` (every thread's), from /proc/<pid>/task/*/children."""
    found: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as fh:
                found += [int(x) for x in fh.read().split()]
        except (OSError, ValueError):
            continue
    return found


def ancestors(pid: int) -> list[int]:
    found, current = [], pid
    for _ in range(64):
        stat = proc_stat(current)
        if stat is None or stat[1] <= 1:
            break
        found.append(stat[1])
        current = stat[1]
    return found


def pidfd_or_none(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)
    except (OSError, AttributeError):
        return None


def _all_stopped(pid: int) -> bool:
    """Whether every task (thread) of ``pid`` is stopped or dead, by the kernel's /proc state."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return True  # gone
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as fh:
                state = fh.read().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue  # the thread is gone
        if state not in ("T", "t", "Z", "X"):
            return False
    return True


def stop_tree(pid: int, pidfd: int, *, known: frozenset[int] = frozenset(), timeout: float = 5.0) -> None:
    """Stop the process ``pidfd`` names (every thread of it) and kill every process below it but
    the ``known`` ones (the sandbox's own interpreters, which run nothing, and what is below them).

    Returns once the kernel shows each task of ``pid`` stopped and no live descendant left, so no
    process of that tree runs another instruction until :func:`resume`.

    Raises:
        QuiesceError: not stopped within ``timeout`` (it is resumed before this raises).
    """
    deadline = time.monotonic() + timeout
    try:
        signal.pidfd_send_signal(pidfd, signal.SIGSTOP)
    except ProcessLookupError:
        return
    polls = 0
    while not _all_stopped(pid):
        if time.monotonic() > deadline:
            resume(pidfd)
            raise QuiesceError(f"the interpreter {pid} did not stop within {timeout:g} s")
        polls += 1  # a stop takes one scheduling of each thread: poll finely at first, then back off
        time.sleep(0 if polls < 50 else 0.00005 if polls < 200 else 0.002)
    while True:  # it cannot start another now: what it started before is killed and waited for
        below = _live_below(pid, known)
        if not below:
            return
        if time.monotonic() > deadline:
            resume(pidfd)
            raise QuiesceError(f"processes started by the interpreter {pid} did not end within {timeout:g} s")
        for child in below:
            kill_pid_checked(child, lambda p: pid in ancestors(p))
        time.sleep(0.001)


def _live_below(pid: int, known: frozenset[int]) -> list[int]:
    """Non-zombie processes below ``pid`` but not below or at a ``known`` one, by the children lists."""
    found, stack = [], [pid]
    while stack:
        for child in children(stack.pop()):
            if child in known:
                continue
            state = proc_stat(child)
            if state is not None and state[0] not in ("Z", "X"):
                found.append(child)
                stack.append(child)
    return found


def resume(pidfd: int) -> None:
    """SIGCONT the process ``pidfd`` names (nothing when it is gone)."""
    try:
        signal.pidfd_send_signal(pidfd, signal.SIGCONT)
    except OSError:
        pass


def _status_kb(pid: int, field: str) -> int:
    """A ``kB`` field of /proc/<pid>/status (0 when it or the process is gone)."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0


def private_bytes(pid: int) -> int:
    """Anonymous resident memory of ``pid``: what a frozen copy of it costs once every page is rewritten."""
    return _status_kb(pid, "RssAnon") * 1024


def _rss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm") as fh:
            return int(fh.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return 0


_PAGE = os.sysconf("SC_PAGE_SIZE")


def memory_in_use(cgroups: list[str], pids: list[int], enough: int | None = None) -> int:
    """Bytes the env uses: its memory cgroup's own count where it has one (files on its tmpfs
    included), else the sum of each process's proportional share (Pss, /proc/<pid>/smaps_rollup).

    Without a cgroup, when ``enough`` is given and even the sum of resident sizes (which counts
    shared pages once per process, so never less than the truth) stays below it, that cheaper sum
    is returned instead: the caller only needs to know the use is below ``enough``."""
    for d in cgroups:
        for name in ("memory.current", "memory.usage_in_bytes"):
            try:
                with open(os.path.join(d, name)) as fh:
                    return int(fh.read().split()[0])
            except (OSError, ValueError, IndexError):
                continue
    if enough is not None:
        bound = sum(_rss(pid) for pid in pids)
        if bound < enough:
            return bound
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/smaps_rollup") as fh:
                for line in fh:
                    if line.startswith("Pss:"):
                        total += int(line.split()[1]) * 1024
                        break
        except (OSError, ValueError, IndexError):
            continue
    return total
