"""Walking a work dir by directory descriptor, for the filer (sandbox side; stdlib only).

Every function takes directory descriptors, never paths: each name is opened relative to its
parent with ``O_NOFOLLOW`` (the opened inode checked against the one listed where it matters),
walks are iterative (no recursion) with a depth and an entry cap, and a symlink is copied as a link
and never followed. :func:`copy_tree` copies a tree (charging a :class:`Quota`, sharing unchanged
files through the filer's ``Shares``), :func:`clear_tree` empties one whatever its depth or modes,
:func:`check_tree` counts one against the caps without copying.

Split from ``_filer.py``, which imports it from its own directory; it must not import trace_envs.
"""

from __future__ import annotations

import os
import stat
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from _filer import Share

__all__ = ["O_DIR", "TreeLimit", "Quota", "copy_tree", "clear_tree", "check_tree", "open_dir", "too_many"]

O_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
O_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
O_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
O_NOATIME = getattr(os, "O_NOATIME", 0)
_CLEAR_DEPTH = 64  # deeper dirs are moved up to the top while a tree is removed (bounded descriptors)


class TreeLimit(Exception):
    """The tree is deeper or larger than the caps allow, or a branch's share of the store is used up."""


def _pages(size: int) -> int:
    """Bytes a file of ``size`` takes on the store's tmpfs (whole 4 KiB pages)."""
    return -(-size // 4096) * 4096


class Quota:
    """What one save may still add to the store: bytes of new copies and entries (every name made
    takes one of the store's inode slots, a hard link too). ``take`` raises :class:`TreeLimit` past it."""

    def __init__(self, bytes_left: int, inodes_left: int, *, branch_mb: int, branch_inodes: int) -> None:
        self.bytes_left, self.inodes_left = bytes_left, inodes_left
        self.branch_mb, self.branch_inodes = branch_mb, branch_inodes
        self.bytes, self.inodes = 0, 0

    def take(self, size: int, inodes: int = 0) -> None:
        self.bytes += size
        self.inodes += inodes
        if self.bytes > self.bytes_left:
            raise TreeLimit(f"this branch's snapshots would hold more than {self.branch_mb:,} MB of the snapshot "
                            "store (SandboxConfig.snapshot_branch_mb); its siblings keep their own share")
        if self.inodes > self.inodes_left:
            raise TreeLimit(f"this branch's snapshots would hold more than {self.branch_inodes:,} entries of the "
                            "snapshot store (SandboxConfig.snapshot_branch_entries); its siblings keep their own share")


def open_dir(name: str, parent: int, want: os.stat_result | None = None) -> int:
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


def copy_tree(src: int, dst: int, *, max_depth: int, max_entries: int, share: Share | None = None,
              quota: Quota | None = None) -> int:
    """Copy the contents of directory ``src`` into the empty directory ``dst`` (both descriptors).

    Regular files get their own inodes, names sharing an inode in ``src`` share one in ``dst``
    (where the first copy's dir can still be opened), symlinks are copied as links, FIFOs re-made,
    other special files skipped; modes and times are kept. An entry the owner cannot read (mode
    0) is opened up for the copy and its mode put back. Returns the number of entries.

    ``share``: the :class:`Shares` record to consult and fill (see there); None copies every file.
    ``quota``: charged one inode slot per entry made and the pages of every file copied (not linked).

    Raises:
        TreeLimit: more than ``max_entries`` entries, dirs deeper than ``max_depth``, or past ``quota``.
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
                raise too_many(max_entries)
            if quota is not None:
                quota.take(0, 1)
            if regular and _copy_regular(name, s_fd, d_fd, path, links, dst, share, quota):
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
                child = open_dir(name, s_fd, info)
                try:
                    target = open_dir(name, d_fd)
                except BaseException:
                    os.close(child)
                    raise
                stack.append([child, target, _entries(child), (*path, name), info, restore])
            elif kind == stat.S_IFREG:
                _copy_file(name, s_fd, d_fd, info, path, links, dst, quota)
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
                  share: Share | None, quota: Quota | None) -> bool:
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
        if quota is not None:
            quota.take(_pages(info.st_size))
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
               links: dict[tuple[int, int], tuple[tuple[str, ...], str]], dst_top: int,
               quota: Quota | None = None) -> None:
    key = (info.st_dev, info.st_ino)
    if info.st_nlink > 1 and key in links and _link(links[key], dst_top, name, d_fd):
        return
    if quota is not None:
        quota.take(_pages(info.st_size))
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
            parent = open_dir(part, parent)
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
        first = open_dir(name, top)
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
                child = open_dir(entry, fd)
                stack.append((child, iter(_kinds(child)), entry))
        finally:
            for fd, _, _ in stack:
                os.close(fd)


def too_many(max_entries: int) -> TreeLimit:
    """The entry cap's error (raised by the walks here and by the filer's inode count)."""
    return TreeLimit(f"the work dir holds more than {max_entries:,} entries (SandboxConfig.snapshot_max_entries)")


def check_tree(top: int, *, max_depth: int, max_entries: int | None) -> int:
    """Walk the tree below the directory descriptor ``top`` against the caps a save would hit (nothing
    opened but dirs, never through a symlink); returns the entries counted.

    ``max_entries`` None: the caller counted the entries itself (the live tmpfs's inode count), so
    only the depth is walked, and a dir whose link count says it has no subdir is not listed: the
    walk then costs about one ``fstat`` a dir, whatever the number of files.

    Raises:
        TreeLimit: the same caps, with the same messages, as :func:`copy_tree`.
    """
    count = 0
    stack = [(os.dup(top), iter(_kinds(top)))]
    try:
        while stack:
            fd, names = stack[-1]
            name, is_dir = next(names, (None, False))
            if name is None:
                os.close(stack.pop()[0])
                continue
            count += 1
            if max_entries is not None and count > max_entries:
                raise too_many(max_entries)
            if is_dir:
                if len(stack) >= max_depth:
                    raise TreeLimit(f"the work dir is more than {max_depth} directories deep (SandboxConfig."
                                    "snapshot_max_depth)")
                try:
                    child = open_dir(name, fd)
                except OSError:
                    continue  # gone, or not searchable: the save opens it up; this check is advice
                try:
                    leaf = max_entries is None and os.fstat(child).st_nlink == 2  # tmpfs: 2 + its subdirs
                    stack.append((child, iter(() if leaf else _kinds(child))))
                except BaseException:
                    os.close(child)
                    raise
    finally:
        for fd, _ in stack:
            os.close(fd)
    return count
