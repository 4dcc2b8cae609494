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

Requests come from the host over a socket of its own (4-byte big-endian length + JSON, ``seq``
echoed): ``save`` (live dir -> snapshot ``id``), ``load`` (snapshot ``id``, or nothing when ``id``
is None, -> live dir), ``drop`` (snapshots listed in ``drop``; every op drops those first).
Every failure is an ``error`` reply (``limit`` true when a cap was hit); the loop never exits on
one. When the host's socket closes, the filer exits (and, as the pid namespace's first process,
the kernel ends every process in it).

This file is imported by ``_server.py`` from its own directory; it must not import trace_envs.
"""

from __future__ import annotations

import json
import os
import stat
import struct
from typing import NamedTuple

O_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
O_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
O_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
O_NOATIME = getattr(os, "O_NOATIME", 0)
_CLEAR_DEPTH = 64  # deeper dirs are moved up to the top while a tree is removed (bounded descriptors)


class TreeLimit(Exception):
    """The tree is deeper or larger than the caps allow."""


def _open_dir(name: str, parent: int, want: os.stat_result | None = None) -> int:
    """``name`` in ``parent`` as a directory descriptor, never through a symlink; when ``want`` is
    given, the opened inode must be the one that was listed (else OSError)."""
    fd = os.open(name, O_DIR, dir_fd=parent)
    if want is not None:
        got = os.fstat(fd)
        if (got.st_dev, got.st_ino) != (want.st_dev, want.st_ino):
            os.close(fd)
            raise OSError(f"{name!r} changed while it was copied")
    return fd


def _chmod(name: str, mode: int, parent: int) -> None:
    os.chmod(name, mode, dir_fd=parent, follow_symlinks=False)


def _entries(fd: int) -> list[tuple[str, bool]]:
    """The names in the directory ``fd``, last first, each with whether the kernel's listing (d_type)
    calls it a regular file: those are opened straight away (``O_NOFOLLOW``, then checked by fstat)."""
    with os.scandir(fd) as it:
        found = [(entry.name, entry.is_file(follow_symlinks=False)) for entry in it]
    found.sort(reverse=True)
    return found


def _copy_data(fin: int, fout: int, size: int) -> None:
    done = 0
    while done < size:
        sent = os.sendfile(fout, fin, done, size - done)
        if sent == 0:
            break
        done += sent


def copy_tree(src: int, dst: int, *, max_depth: int, max_entries: int, share: Share | None = None) -> int:
    """Copy the contents of directory ``src`` into the empty directory ``dst`` (both descriptors).

    Regular files get their own inodes, names sharing an inode in ``src`` share one in ``dst``
    (where the first copy's dir can still be opened), symlinks are copied as links, FIFOs re-made,
    other special files skipped; modes and times are kept. An entry the owner cannot read (mode
    0) is opened up for the copy and its mode put back. Returns the number of entries.

    ``share``: the :class:`Shares` record to consult and fill (see there); None copies every file.

    Raises:
        TreeLimit: more than ``max_entries`` entries, or dirs deeper than ``max_depth``.
        OSError: a file could not be copied (e.g. the store's quota).
    """
    links: dict[tuple[int, int], tuple[tuple[str, ...], str]] = {}
    count = 0
    top = os.fstat(src)
    # a frame: source fd, target fd, names left, path of names from the top, the dir's own stat, mode to put back
    stack = [[os.dup(src), os.dup(dst), _entries(src), (), top, None]]
    try:
        while stack:
            frame = stack[-1]
            s_fd, d_fd, names, path = frame[0], frame[1], frame[2], frame[3]
            if not names:
                stack.pop()
                info, restore = frame[4], frame[5]
                try:
                    os.chmod(d_fd, stat.S_IMODE(info.st_mode))
                    os.utime(d_fd, ns=(info.st_atime_ns, info.st_mtime_ns))
                    if restore is not None and stack:
                        _chmod(path[-1], restore, stack[-1][0])
                finally:
                    os.close(s_fd)
                    os.close(d_fd)
                continue
            name, regular = names.pop()
            count += 1
            if count > max_entries:
                raise TreeLimit(f"the work dir holds more than {max_entries:,} entries (SandboxConfig."
                                "snapshot_max_entries)")
            if regular and _copy_regular(name, s_fd, d_fd, path, links, dst, share):
                continue
            info = os.stat(name, dir_fd=s_fd, follow_symlinks=False)
            kind, mode = stat.S_IFMT(info.st_mode), stat.S_IMODE(info.st_mode)
            if kind == stat.S_IFDIR:
                if len(stack) >= max_depth:
                    raise TreeLimit(f"the work dir is more than {max_depth} directories deep (SandboxConfig."
                                    "snapshot_max_depth)")
                restore = None
                if mode & 0o500 != 0o500:
                    _chmod(name, mode | 0o700, s_fd)
                    restore = mode
                os.mkdir(name, 0o700, dir_fd=d_fd)
                child = _open_dir(name, s_fd, info)
                try:
                    target = _open_dir(name, d_fd)
                except BaseException:
                    os.close(child)
                    raise
                stack.append([child, target, _entries(child), (*path, name), info, restore])
            elif kind == stat.S_IFREG:
                _copy_file(name, s_fd, d_fd, info, path, links, dst)
            elif kind == stat.S_IFLNK:
                os.symlink(os.readlink(name, dir_fd=s_fd), name, dir_fd=d_fd)
                os.utime(name, ns=(info.st_atime_ns, info.st_mtime_ns), dir_fd=d_fd, follow_symlinks=False)
            elif kind == stat.S_IFIFO:
                os.mkfifo(name, 0o600, dir_fd=d_fd)
                _chmod(name, mode, d_fd)
                os.utime(name, ns=(info.st_atime_ns, info.st_mtime_ns), dir_fd=d_fd, follow_symlinks=False)
    finally:  # on an error: the source's opened-up modes are put back, every descriptor closed
        for depth in range(len(stack) - 1, -1, -1):
            frame = stack[depth]
            try:
                if frame[5] is not None and depth > 0:
                    _chmod(frame[3][-1], frame[5], stack[depth - 1][0])
            except OSError:
                pass
            os.close(frame[0])
            os.close(frame[1])
    return count


def _copy_regular(name: str, s_fd: int, d_fd: int, path: tuple[str, ...],
                  links: dict[tuple[int, int], tuple[tuple[str, ...], str]], dst_top: int,
                  share: Share | None) -> bool:
    """Copy the regular file ``name`` opened directly (not touching its access time); False when it
    cannot be read as it is (its mode): then the caller takes the slow route, which opens it up first."""
    try:
        fin = os.open(name, O_FILE | O_NOATIME, dir_fd=s_fd)
    except PermissionError:
        try:
            fin = os.open(name, O_FILE, dir_fd=s_fd)
        except PermissionError:
            return False
    try:
        info = os.fstat(fin)
        if not stat.S_ISREG(info.st_mode):
            raise OSError(f"{name!r} changed while it was copied")
        if info.st_nlink > 1:
            key = (info.st_dev, info.st_ino)
            if key in links and _link(links[key], dst_top, name, d_fd):
                return True
            links[key] = (path, name)
        elif share is not None and (held := share.shares.reuse(share, info, name, d_fd)) is not None:
            share.shares.note(share, info.st_ino, path, name, info, held)
            return True
        fout = os.open(name, O_NEW, stat.S_IMODE(info.st_mode) | 0o200, dir_fd=d_fd)
        try:
            if info.st_size:
                _copy_data(fin, fout, info.st_size)
            if not info.st_mode & 0o200:
                os.chmod(fout, stat.S_IMODE(info.st_mode))
            os.utime(fout, ns=(info.st_atime_ns, info.st_mtime_ns))
            if share is not None and (info.st_nlink == 1 or not share.saving):  # a stored copy may be shared
                made = info if share.saving else os.fstat(fout)
                share.shares.note(share, made.st_ino, path, name, made)
        finally:
            os.close(fout)
    finally:
        os.close(fin)
    return True


def _copy_file(name: str, s_fd: int, d_fd: int, info: os.stat_result, path: tuple[str, ...],
               links: dict[tuple[int, int], tuple[tuple[str, ...], str]], dst_top: int) -> None:
    key = (info.st_dev, info.st_ino)
    if info.st_nlink > 1 and key in links and _link(links[key], dst_top, name, d_fd):
        return
    mode = stat.S_IMODE(info.st_mode)
    opened_up = not mode & 0o400
    if opened_up:
        _chmod(name, mode | 0o400, s_fd)
    try:
        fin = os.open(name, O_FILE, dir_fd=s_fd)
    finally:
        if opened_up:
            _chmod(name, mode, s_fd)
    try:
        got = os.fstat(fin)
        if (got.st_dev, got.st_ino) != key or not stat.S_ISREG(got.st_mode):
            raise OSError(f"{name!r} changed while it was copied")
        fout = os.open(name, O_NEW, 0o600, dir_fd=d_fd)
        try:
            _copy_data(fin, fout, got.st_size)
            os.chmod(fout, mode)
            os.utime(fout, ns=(info.st_atime_ns, info.st_mtime_ns))
        finally:
            os.close(fout)
    finally:
        os.close(fin)
    if info.st_nlink > 1:
        links[key] = (path, name)


def _link(first: tuple[tuple[str, ...], str], dst_top: int, name: str, d_fd: int) -> bool:
    """Hard-link ``name`` in ``d_fd`` to the copy made first; False when its dir cannot be opened."""
    dirs, first_name = first
    fds: list[int] = []
    try:
        parent = dst_top
        for part in dirs:
            parent = _open_dir(part, parent)
            fds.append(parent)
        os.link(first_name, name, src_dir_fd=parent, dst_dir_fd=d_fd, follow_symlinks=False)
        return True
    except OSError:
        return False
    finally:
        for fd in fds:
            os.close(fd)


def _kinds(fd: int) -> list[tuple[str, bool]]:
    """The names in the directory ``fd``, each with whether it is a dir (d_type; a symlink is not)."""
    with os.scandir(fd) as it:
        return [(entry.name, entry.is_dir(follow_symlinks=False)) for entry in it]


def clear_tree(top: int) -> None:
    """Remove everything inside the directory ``top`` (a descriptor), whatever the depth or modes;
    ``top`` itself stays. Dirs deeper than a fixed bound are first moved up to ``top`` under a
    fresh name, so the descriptors held stay bounded however deep the tree is."""
    os.chmod(top, 0o700)
    pending = list(os.listdir(top))
    moved = 0
    while pending:
        name = pending.pop()
        info = os.stat(name, dir_fd=top, follow_symlinks=False)
        if not stat.S_ISDIR(info.st_mode):
            os.unlink(name, dir_fd=top)
            continue
        _chmod(name, 0o700, top)
        first = _open_dir(name, top)
        stack = [(first, iter(_kinds(first)), name)]
        try:
            while stack:
                fd, entries, own = stack[-1]
                entry, is_dir = next(entries, (None, False))
                if entry is None:
                    stack.pop()
                    os.close(fd)
                    os.rmdir(own, dir_fd=stack[-1][0] if stack else top)
                    continue
                if not is_dir:
                    os.unlink(entry, dir_fd=fd)
                    continue
                _chmod(entry, 0o700, fd)
                if len(stack) >= _CLEAR_DEPTH:
                    while True:  # a name not taken (model code may have made any name)
                        moved += 1
                        flat = f".trace-gym-clear-{moved}"
                        try:
                            os.stat(flat, dir_fd=top, follow_symlinks=False)
                        except FileNotFoundError:
                            break
                    os.rename(entry, flat, src_dir_fd=fd, dst_dir_fd=top)
                    pending.append(flat)
                    continue
                child = _open_dir(entry, fd)
                stack.append((child, iter(_kinds(child)), entry))
        finally:
            for fd, _, _ in stack:
                os.close(fd)


def tree_usage(top: int) -> tuple[int, int]:
    """(bytes, inodes) of the tree below the descriptor ``top``, counted by ``st_blocks``."""
    used, inodes, seen = 0, 0, set()
    stack = [os.dup(top)]
    try:
        while stack:
            fd = stack.pop()
            try:
                for name in os.listdir(fd):
                    info = os.stat(name, dir_fd=fd, follow_symlinks=False)
                    if (info.st_dev, info.st_ino) in seen:
                        continue
                    seen.add((info.st_dev, info.st_ino))
                    used += info.st_blocks * 512
                    inodes += 1
                    if stat.S_ISDIR(info.st_mode):
                        stack.append(_open_dir(name, fd))
            finally:
                os.close(fd)
    finally:
        for fd in stack:
            os.close(fd)
    return used, inodes


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

    def __init__(self, root: str, *, max_depth: int, max_entries: int) -> None:
        self.live = os.open(root + "/live", O_DIR)
        self.snaps = os.open(root + "/snaps", O_DIR)
        self.max_depth, self.max_entries = max_depth, max_entries
        self.shares = Shares(self.snaps) if fine_change_times(self.snaps) else None

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
            return
        try:
            clear_tree(fd)
        finally:
            os.close(fd)
        os.rmdir(name, dir_fd=self.snaps)

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
                return self._save(int(ident))
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

    def _save(self, ident: int) -> dict:
        name = str(ident)
        os.mkdir(name, 0o700, dir_fd=self.snaps)
        target = _open_dir(name, self.snaps)
        try:
            count = copy_tree(self.live, target, max_depth=self.max_depth, max_entries=self.max_entries,
                              share=self._share(ident, saving=True))
            shared = self.shares.reused if self.shares is not None else 0
            self._finish(True)
            return {"ok": True, "entries": count, "shared": shared}
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
