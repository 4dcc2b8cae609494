"""OS-level isolation of a sandbox, set up by its keeper (root where the host is root); stdlib only.

Imported by ``_server.py`` from its own directory (a script: it must not import trace_envs) and
dropped from ``sys.modules`` before model code runs. Layers: a network namespace; a mount namespace
in which every mount is read-only and the work dirs live on a private tmpfs with a size quota;
the env's cgroups (made by the host) joined before anything forks; rlimits; a dropped uid with
``no_new_privs``; and, when the host goes away, SIGKILL for the whole tree.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import resource
import signal
import sys
import time

CLONE_NEWNS = 0x00020000
CLONE_NEWNET = 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 1, 2, 4, 32, 4096, 16384, 1 << 18
PR_SET_CHILD_SUBREAPER, PR_SET_NO_NEW_PRIVS = 36, 38

_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)


def _mount(src: str | None, dst: str, flags: int, fstype: str | None = None, data: str | None = None) -> bool:
    return _libc.mount(src.encode() if src else None, dst.encode(), fstype.encode() if fstype else None, flags,
                       data.encode() if data else None) == 0


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
    needed = [sys.base_prefix, sys.prefix, os.path.dirname(os.path.abspath(sys.argv[0]))]
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
        if not _mount("tmpfs", top, 0, "tmpfs", "mode=0755,size=1m"):
            return False
        for child in children:
            target = os.path.join(top, child)
            os.mkdir(target) if os.path.isdir(os.path.join(stage, child)) else open(target, "w").close()
            if not _mount(os.path.join(stage, child), target, MS_BIND):
                return False
        _libc.umount2(stage.encode(), 2)  # MNT_DETACH
        os.rmdir(stage)
        _mount(None, top, MS_REMOUNT | MS_BIND | MS_RDONLY)
    return all(_closed_ancestor(p) is None for p in needed)


def _mount_points() -> list[str]:
    """Mount points of this mount namespace, from /proc/self/mountinfo (octal escapes decoded)."""
    points = []
    with open("/proc/self/mountinfo") as fh:
        for line in fh:
            fields = line.split()
            if len(fields) > 4:
                points.append(fields[4].encode().decode("unicode_escape"))
    return points


def _read_only(point: str) -> bool:
    """Remount ``point`` read-only in this mount namespace (bind it onto itself first if needed)."""
    if _mount(None, point, MS_REMOUNT | MS_BIND | MS_RDONLY):
        return True
    return _mount(point, point, MS_BIND) and _mount(None, point, MS_REMOUNT | MS_BIND | MS_RDONLY)


def isolate_os(cfg: dict) -> list[str]:
    """Namespaces, a read-only file system and a private tmpfs work dir (keeper, as root). Returns the layers."""
    layers: list[str] = []
    if os.geteuid() != 0:
        return layers
    if cfg["network_namespace"] and _libc.unshare(CLONE_NEWNET) == 0:
        layers.append("network-namespace")
    if _libc.unshare(CLONE_NEWNS) == 0 and _mount(None, "/", MS_REC | MS_PRIVATE):
        # every mount read-only (a per-mount flag: the host's view is untouched): the kernel, not the
        # audit hook, keeps model code from writing anywhere but its work dir
        failed = [p for p in _mount_points() if not _read_only(p)]
        if not [p for p in failed if p in ("/", "/tmp", "/var/tmp", "/dev/shm")]:
            layers.append("read-only-filesystem(mount namespace)")
        size = f"size={cfg['disk_mb']}m,nr_inodes=65536,mode=0700,uid={cfg['uid'] or 0},gid={cfg['uid'] or 0}"
        if _mount("tmpfs", cfg["root"], MS_NOSUID | MS_NODEV, "tmpfs", size):
            layers.append(f"private-tmpfs-workdir({cfg['disk_mb']} MB quota, freed with the sandbox)")
            cfg["tmpfs"] = True
        if cfg["uid"] is not None and not expose_python(cfg):
            cfg["uid"] = None  # the interpreter could not import its own stdlib under another uid
    elif cfg["uid"] is not None and not all(
        _closed_ancestor(p) is None for p in (sys.base_prefix, sys.prefix, os.path.abspath(sys.argv[0]))
    ):
        cfg["uid"] = None
    return layers


def join_cgroups(cfg: dict) -> list[str]:
    """Move the keeper (and so every later process) into the env's cgroups made by the host."""
    joined = []
    for path in cfg.get("cgroup_procs", []):
        try:
            with open(path, "w") as fh:
                fh.write(str(os.getpid()))
            joined.append(path)
        except OSError:
            pass
    try:  # the keeper holds the tree together: the OOM killer takes an interpreter instead
        with open("/proc/self/oom_score_adj", "w") as fh:
            fh.write("-1000")
    except OSError:
        pass
    return [f"cgroups-joined({len(joined)})"] if joined else []


def drop_privileges(cfg: dict) -> list[str]:
    layers = []
    if os.geteuid() == 0 and cfg["uid"] is not None:
        os.setgroups([])
        os.setgid(cfg["uid"])
        os.setuid(cfg["uid"])
        layers.append(f"uid-drop({cfg['uid']}, unique to this sandbox)")
    _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    return layers


def set_limits(cfg: dict) -> list[str]:
    mem = cfg["memory_mb"] * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
    resource.setrlimit(resource.RLIMIT_FSIZE, (cfg["file_mb"] * 1024 * 1024,) * 2)
    resource.setrlimit(resource.RLIMIT_CPU, (cfg["cpu_total_s"], cfg["cpu_total_s"]))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_NOFILE, (cfg["max_open_files"],) * 2)
    if os.geteuid() == 0 and cfg["uid"] is not None:
        resource.setrlimit(resource.RLIMIT_NPROC, (cfg["max_processes"],) * 2)
    return ["rlimits(as,cpu,fsize,nofile,nproc)"]


def kill_descendants() -> None:
    """SIGKILL every process below this one (the keeper's tree), until none is left."""
    me = os.getpid()
    for _ in range(50):
        children: dict[int, list[int]] = {}
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    with open(f"/proc/{entry}/stat") as fh:
                        fields = fh.read().rsplit(")", 1)[1].split()
                except (OSError, IndexError):
                    continue
                if fields[0] != "Z":
                    children.setdefault(int(fields[1]), []).append(int(entry))
        found, stack = [], [me]
        while stack:
            for child in children.get(stack.pop(), []):
                found.append(child)
                stack.append(child)
        if not found:
            return
        for pid in found:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.01)
