"""The filer: the one process that copies a sandbox's work-dir files (sandbox side; stdlib only).

The keeper forks it before anything else, in the sandbox's mount, pid and IPC namespaces; it then
gives up everything a branch's files do not need, so that it can reach nothing model code cannot:

* the sandbox's own uid (as root), or no capability at all (in the user namespace, as an ordinary
  user); ``no_new_privs``; not dumpable (its /proc files are root's: model code cannot read its
  memory or descriptors);
* a Landlock domain: read and write beneath the sandbox's work root (the live dir and the
  snapshot store) only, read of the same system and python dirs as the sandbox, nothing else;
* the sandbox's seccomp filter.

A save hard-links the files unchanged since an earlier held snapshot to that copy (:class:`Shares`).
Every walk goes by directory descriptor, one name at a time (``O_NOFOLLOW`` at every level, the
opened inode checked against the one listed), iteratively (no recursion), with a depth and an entry
cap; the host stops every process of the live interpreter before a ``save``, so nothing renames
under a walk. A symlink is copied as a link and never followed.

**The store's quota is per branch.** A branch is one live interpreter's life, from the restore
that started it to the next (the host numbers them and names the branch in every ``save``). The
snapshots a branch holds may together add at most ``branch_mb`` bytes and ``branch_inodes`` inode
slots to the store (files copied count their pages; every name made counts a slot, a hard link to
an unchanged file too, as tmpfs counts them): past that, the save stops with a ``limit`` error and
*that* snapshot holds its replay log only, while the rest of the store stays free for the branch's
siblings. The charge is the store's measured growth (``statvfs`` of the store's own tmpfs), and a
drop gives back what it measurably freed; a branch holding no snapshot any more owes nothing. With
the default share (half the store), no one branch can fill the store; several heavy branches
together still can, and then a save fails on the store's own quota as before (``error``, replay-only).

Requests come from the host over a socket of its own (4-byte big-endian length + JSON, ``seq``
echoed): ``save`` (live dir -> snapshot ``id`` of ``branch``), ``load`` (snapshot ``id``, or nothing
when ``id`` is None, -> live dir), ``check`` (walk the live dir against the depth and entry caps
without copying: the host asks after a cell that may have passed them), ``drop`` (snapshots listed
in ``drop``; every op drops those first).
Every failure is an ``error`` reply (``limit`` true when a cap was hit); the loop never exits on
one. When the host's socket closes, the filer exits (and, as the pid namespace's first process,
the kernel ends every process in it).

The walks themselves are in ``_tree.py``. This file is imported by ``_server.py`` from its own
directory; it must not import trace_envs.
"""

from __future__ import annotations

import json
import os
import struct
from typing import NamedTuple

from _tree import O_DIR, Quota, TreeLimit, check_tree, clear_tree, copy_tree, too_many
from _tree import open_dir as _open_dir


# ------------------------------------------------------------------ unchanged files shared between snapshots
def _key(info: os.stat_result) -> tuple[int, ...]:
    return (info.st_ctime_ns, info.st_mtime_ns, info.st_atime_ns, info.st_size, info.st_mode)


class Share(NamedTuple):
    """One walk's use of :class:`Shares`: the snapshot it saves to or loads from."""

    shares: Shares
    ident: int
    saving: bool


class Shares:
    """Which live files are unchanged since the last save or load, and where their copy lies.

    A save hard-links such a file to the earlier snapshot's copy instead of copying it: snapshots
    are never written, so sharing an inode between two of them changes nothing a branch sees, and
    the store holds each unchanged file once. "Unchanged" is the live file's inode with the same
    change time, modification and access times, size and mode as when its copy was made; it is
    only trusted where the kernel gives every change after a query a fresh change time
    (multigrain timestamps: Linux >= 6.13, checked by :func:`fine_change_times` at start), and a
    snapshot's copy only while that snapshot is held (a per-save epoch, as pids are reused).
    """

    def __init__(self, snaps: int) -> None:
        self.snaps = snaps
        self.known: dict[int, tuple] = {}
        self.pending: dict[int, tuple] = {}
        self.epochs: dict[int, int] = {}
        self.counter = 0
        self.reused = 0
        self._parent: tuple[tuple, int] | None = None

    def start(self, ident: int, *, saving: bool) -> Share:
        if saving:
            self.counter += 1
            self.epochs[ident] = self.counter
        self.pending = {}
        self.reused = 0
        return Share(self, ident, saving)

    def finish(self, ok: bool) -> None:
        """Keep what the walk noted (ok) or nothing (a failed walk: the live dir's state is unknown)."""
        self.known, self.pending = (self.pending if ok else {}), {}
        if self._parent is not None:
            os.close(self._parent[1])
            self._parent = None

    def forget(self, ident: int) -> None:
        self.epochs.pop(ident, None)

    def note(self, share: Share, ino: int, path: tuple[str, ...], name: str, info: os.stat_result,
             earlier: tuple = ()) -> None:
        """Record that the live file ``ino`` equals the copy at ``path``/``name`` of ``share``'s
        snapshot (and at the ``earlier`` places, still held, it was linked from: up to 4 in all, so
        releasing one snapshot leaves the others to share with)."""
        epoch = self.epochs.get(share.ident)
        if epoch is not None:
            self.pending[ino] = (_key(info), (*earlier, (share.ident, epoch, path, name))[-4:])

    def reuse(self, share: Share, info: os.stat_result, name: str, d_fd: int) -> tuple | None:
        """Link ``name`` in ``d_fd`` to a held copy of the unchanged live file ``info``; the places of
        its held copies when linked, else None."""
        entry = self.known.get(info.st_ino) if share.saving else None
        if entry is None or entry[0] != _key(info):
            return None
        held = tuple(loc for loc in entry[1] if self.epochs.get(loc[0]) == loc[1] and loc[0] != share.ident)
        for ident, _, path, first in reversed(held):
            try:
                os.link(first, name, src_dir_fd=self._open_parent(ident, path), dst_dir_fd=d_fd,
                        follow_symlinks=False)
            except OSError:
                continue
            self.reused += 1
            return held
        return None

    def _open_parent(self, ident: int, path: tuple[str, ...]) -> int:
        where = (ident, path)
        if self._parent is not None and self._parent[0] == where:
            return self._parent[1]
        if self._parent is not None:
            os.close(self._parent[1])
            self._parent = None
        fd = _open_dir(str(ident), self.snaps)
        try:
            for part in path:
                below = _open_dir(part, fd)
                os.close(fd)
                fd = below
        except BaseException:
            os.close(fd)
            raise
        self._parent = (where, fd)
        return fd


def fine_change_times(snaps: int) -> bool:
    """Whether every write after a ``stat`` gives the file a new change time here (multigrain
    timestamps on the store's tmpfs): the kernel's release and a probe of 64 writes."""
    try:
        major, minor = (int(x) for x in os.uname().release.split(".")[:2])
    except ValueError:
        return False
    if (major, minor) < (6, 13):
        return False
    name = ".ctime-probe"
    fd = os.open(name, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600, dir_fd=snaps)
    try:
        for _ in range(64):
            before = os.fstat(fd).st_ctime_ns
            os.write(fd, b"x")
            if os.fstat(fd).st_ctime_ns == before:
                return False
        return True
    finally:
        os.close(fd)
        os.unlink(name, dir_fd=snaps)


# ------------------------------------------------------------------ the request loop
def _recv(sock) -> dict | None:
    head = b""
    while len(head) < 4:
        chunk = sock.recv(4 - len(head))
        if not chunk:
            return None
        head += chunk
    (size,) = struct.unpack(">I", head)
    if size > 1 << 20:
        return None
    body = bytearray()
    while len(body) < size:
        chunk = sock.recv(size - len(body))
        if not chunk:
            return None
        body += chunk
    msg = json.loads(body)
    return msg if isinstance(msg, dict) else None


def _send(sock, obj: dict) -> None:
    data = json.dumps(obj).encode()
    sock.sendall(struct.pack(">I", len(data)) + data)


class Filer:
    """The file operations of one sandbox, on descriptors of its live dir and snapshot store."""

    def __init__(self, root: str, *, max_depth: int, max_entries: int, branch_mb: int = 1 << 20,
                 branch_inodes: int = 1 << 40, measured: bool = False) -> None:
        self.live = os.open(root + "/live", O_DIR)
        self.snaps = os.open(root + "/snaps", O_DIR)
        self.max_depth, self.max_entries = max_depth, max_entries
        self.branch_mb, self.branch_inodes = branch_mb, branch_inodes
        self.measured = measured  # the store is a file system of its own: statvfs counts only snapshots
        self.charges: dict[int, tuple[int, int, int]] = {}  # snapshot -> (branch, bytes, inodes)
        self.usage: dict[int, list[int]] = {}  # branch -> [bytes, inodes] its held snapshots hold
        self.shares = Shares(self.snaps) if fine_change_times(self.snaps) else None

    def _store_use(self) -> tuple[int, int]:
        """(bytes, inodes) in use on the store, or zeros when it shares a file system with others."""
        if not self.measured:
            return 0, 0
        st = os.statvfs(self.snaps)
        return (st.f_blocks - st.f_bfree) * st.f_frsize, st.f_files - st.f_ffree

    def _uncharge(self, ident: int, freed: tuple[int, int] | None) -> None:
        """Take a dropped snapshot off its branch: what its drop freed (measured), else its own charge.
        A branch holding no snapshot any more owes nothing (what others still link is theirs)."""
        branch, size, inodes = self.charges.pop(ident, (None, 0, 0))
        if branch is None or branch not in self.usage:
            return
        used = self.usage[branch]
        size, inodes = freed if freed is not None else (size, inodes)
        used[0], used[1] = max(0, used[0] - size), max(0, used[1] - inodes)
        if not any(b == branch for b, _, _ in self.charges.values()):
            del self.usage[branch]

    def _share(self, ident: int, *, saving: bool) -> Share | None:
        return self.shares.start(ident, saving=saving) if self.shares is not None else None

    def _finish(self, ok: bool) -> None:
        if self.shares is not None:
            self.shares.finish(ok)

    def _drop(self, ident: int) -> None:
        name = str(int(ident))
        if self.shares is not None:
            self.shares.forget(int(ident))
        try:
            fd = _open_dir(name, self.snaps)
        except FileNotFoundError:
            self._uncharge(int(ident), None)
            return
        before = self._store_use()
        try:
            clear_tree(fd)
        finally:
            os.close(fd)
        os.rmdir(name, dir_fd=self.snaps)
        after = self._store_use()
        self._uncharge(int(ident), (before[0] - after[0], before[1] - after[1]) if self.measured else None)

    def handle(self, msg: dict) -> dict:
        """One request; every failure is an error reply."""
        errors = []
        for old in msg.get("drop", []):
            try:
                self._drop(int(old))
            except (OSError, ValueError, TypeError) as exc:
                errors.append(f"drop {old!r}: {exc}")
        op, ident = msg.get("op"), msg.get("id")
        try:
            if op == "save":
                return self._save(int(ident), int(msg.get("branch", 0)))
            if op == "check":
                return self._check()
            if op == "load":
                self._finish(False)
                clear_tree(self.live)
                if ident is not None:
                    fd = _open_dir(str(int(ident)), self.snaps)
                    try:
                        count = copy_tree(fd, self.live, max_depth=self.max_depth + 1, max_entries=1 << 30,
                                          share=self._share(int(ident), saving=False))
                    except BaseException:
                        self._finish(False)
                        raise
                    finally:
                        os.close(fd)
                    self._finish(True)
                    return {"ok": True, "entries": count}
                os.chmod(self.live, 0o700)
                return {"ok": True, "entries": 0}
            if op == "drop":
                return {"ok": True} if not errors else {"error": "; ".join(errors)[:900]}
            return {"error": f"unknown op {op!r}"}
        except TreeLimit as exc:
            return {"error": f"{op}: {exc}", "limit": True}
        except (OSError, ValueError, TypeError, RecursionError, MemoryError) as exc:
            text = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            return {"error": f"{op}: {type(exc).__name__}: {text}"[:900]}

    def _check(self) -> dict:
        """The live dir against the caps, without copying. On the work root's own tmpfs its inode count
        gives the entries (less the root, live/ and the store's mount point) and only the depth is walked."""
        if not self.measured:
            return {"ok": True, "entries": check_tree(self.live, max_depth=self.max_depth,
                                                      max_entries=self.max_entries)}
        st = os.statvfs(self.live)
        entries = st.f_files - st.f_ffree - 3
        if entries > self.max_entries:
            raise too_many(self.max_entries)
        check_tree(self.live, max_depth=self.max_depth, max_entries=None)
        return {"ok": True, "entries": entries}

    def _save(self, ident: int, branch: int) -> dict:
        """Copy the live dir into snapshot ``ident`` of ``branch``, within that branch's share of the
        store (``branch_mb``, ``branch_inodes`` over its held snapshots); the store's measured growth
        (else the copy's own count) is charged to the branch."""
        name = str(ident)
        used = self.usage.get(branch, [0, 0])
        quota = Quota(self.branch_mb * 1024 * 1024 - used[0], self.branch_inodes - used[1],
                      branch_mb=self.branch_mb, branch_inodes=self.branch_inodes)
        before = self._store_use()
        os.mkdir(name, 0o700, dir_fd=self.snaps)
        target = _open_dir(name, self.snaps)
        try:
            count = copy_tree(self.live, target, max_depth=self.max_depth, max_entries=self.max_entries,
                              share=self._share(ident, saving=True), quota=quota)
            shared = self.shares.reused if self.shares is not None else 0
            self._finish(True)
            after = self._store_use()
            size, inodes = ((after[0] - before[0], after[1] - before[1]) if self.measured
                            else (quota.bytes, quota.inodes + 1))
            self.charges[ident] = (branch, max(0, size), max(0, inodes))
            total = self.usage.setdefault(branch, [0, 0])
            total[0], total[1] = total[0] + max(0, size), total[1] + max(0, inodes)
            return {"ok": True, "entries": count, "shared": shared, "branch_bytes": total[0],
                    "branch_entries": total[1]}
        except BaseException:
            self._finish(False)
            if self.shares is not None:
                self.shares.forget(ident)
            try:
                clear_tree(target)
                os.rmdir(name, dir_fd=self.snaps)
            except OSError:
                pass
            raise
        finally:
            os.close(target)

    def serve(self, sock) -> None:
        """Answer requests until the host's socket closes (or sends a frame that is not a request)."""
        while True:
            try:
                msg = _recv(sock)
            except (OSError, ValueError):
                return
            if msg is None:
                return
            try:
                reply = self.handle(msg)
            except Exception as exc:  # noqa: BLE001 - the filer answers every request, whatever happened
                reply = {"error": f"internal: {type(exc).__name__}: {exc}"[:900]}
            reply["seq"] = msg.get("seq") if type(msg.get("seq")) is int else 0
            try:
                _send(sock, reply)
            except OSError:
                return
