"""OS-level isolation of a sandbox, set up by its keeper; stdlib only; the same layers as root and not.

Imported by ``_server.py`` from its own directory (a script: it must not import trace_envs) and
dropped from ``sys.modules`` before model code runs. Layers, all from the kernel:

* namespaces: as root, the keeper unshares them directly; as an ordinary user it first enters a
  user namespace of its own (the host uid mapped to itself, as ``unshare -U`` and bubblewrap do),
  which gives it the capabilities to make the rest: a network namespace with no interfaces and a
  mount namespace in which every mount is read-only and the work dirs live on a private tmpfs
  with a size quota;
* the env's cgroups (made by the host, where the cgroup tree is writable) joined before anything forks;
* rlimits (address space, CPU, file size, open files, processes);
* privileges: as root a uid unique to the sandbox; otherwise every capability dropped; ``no_new_privs``;
* Landlock (:func:`restrict_files`): writes only beneath the live work dir, reads only of the
  interpreter's own files and a few system dirs, no TCP, and (ABI >= 6) no signals to processes
  outside the sandbox;
* seccomp (:func:`restrict_syscalls`): no exec, ptrace, signals, namespaces, mounts, sockets,
  pipes, shared memory or shared writable maps;
* when the host goes away, SIGKILL for the whole tree.

The Landlock and seccomp structures are written here with ``ctypes`` rather than taken from a
library: ``python-landlock``/``pyseccomp`` need libseccomp or a compiled extension that a
sandbox host may lack, and the whole of both is two fixed programs (a ruleset and a deny list).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import resource
import signal
import sys
import time

CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWNET = 0x00020000, 0x10000000, 0x40000000
CLONE_NEWIPC, CLONE_NEWPID = 0x08000000, 0x20000000
CLONE_NAMESPACES = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000 | 0x00000080
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 1, 2, 4, 32, 4096, 16384, 1 << 18
MS_NOEXEC, MS_NOATIME, MS_NODIRATIME, MS_RELATIME = 8, 1024, 2048, 1 << 21
PR_SET_CHILD_SUBREAPER, PR_SET_NO_NEW_PRIVS, PR_CAPBSET_DROP, PR_CAP_AMBIENT = 36, 38, 24, 47
PR_SET_DUMPABLE = 4

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
    """Remount ``point`` read-only in this mount namespace (bind it onto itself first if needed).

    The mount's own nosuid/nodev/noexec/atime flags are kept: inside a user namespace they are
    locked, and a remount that dropped one would be refused.
    """
    try:
        have = os.statvfs(point).f_flag
    except OSError:
        return False
    keep = ((MS_NOSUID if have & os.ST_NOSUID else 0) | (MS_NODEV if have & os.ST_NODEV else 0)
            | (MS_NOEXEC if have & os.ST_NOEXEC else 0) | (MS_NOATIME if have & os.ST_NOATIME else 0)
            | (MS_NODIRATIME if have & os.ST_NODIRATIME else 0) | (MS_RELATIME if have & os.ST_RELATIME else 0))
    flags = MS_REMOUNT | MS_BIND | MS_RDONLY | keep
    if _mount(None, point, flags):
        return True
    return _mount(point, point, MS_BIND) and _mount(None, point, flags)


def _write_file(path: str, text: str) -> bool:
    try:
        with open(path, "w") as fh:
            fh.write(text)
        return True
    except OSError:
        return False


def enter_user_namespace() -> bool:
    """As an ordinary user: a user namespace of our own, the host uid and gid mapped to themselves.

    The keeper then holds every capability over the namespaces it makes next (mount, network) and
    none over anything else on the machine; files keep the host uid. Returns whether it worked
    (kernels can disable unprivileged user namespaces).
    """
    uid, gid = os.getuid(), os.getgid()
    if _libc.unshare(CLONE_NEWUSER) != 0:
        return False
    return (_write_file("/proc/self/setgroups", "deny") and _write_file("/proc/self/uid_map", f"{uid} {uid} 1")
            and _write_file("/proc/self/gid_map", f"{gid} {gid} 1"))


def isolate_os(cfg: dict) -> list[str]:
    """Namespaces, a read-only file system and a private tmpfs work root. Returns the layers.

    Sets ``cfg["achieved"]`` (a list) to the named layers that hold: ``network``, ``filesystem``.
    """
    layers: list[str] = []
    achieved: list[str] = cfg.setdefault("achieved", [])
    if os.geteuid() != 0:
        if not enter_user_namespace():
            layers.append("unavailable: user namespace (unprivileged user namespaces are disabled here)")
            return layers
        cfg["userns"] = True
        layers.append(f"user-namespace(host uid {os.getuid()} mapped to itself)")
    if cfg["network_namespace"] and _libc.unshare(CLONE_NEWNET) == 0:
        layers.append("network-namespace")
        achieved.append("network")
    if _libc.unshare(CLONE_NEWIPC) == 0:
        layers.append("ipc-namespace(System V queues, semaphores and shared memory end with the sandbox)")
    else:
        layers.append(f"unavailable: ipc namespace ({os.strerror(ctypes.get_errno())})")
    # the keeper's next children (the filer first: the namespace's init) are in a pid namespace of
    # their own: no pid a sandbox process can name reaches the host or any other env
    if _libc.unshare(CLONE_NEWPID) == 0:
        layers.append("pid-namespace(no pid outside the sandbox can be named; the filer is its init)")
    else:
        layers.append(f"unavailable: pid namespace ({os.strerror(ctypes.get_errno())})")
    if _libc.unshare(CLONE_NEWNS) == 0 and _mount(None, "/", MS_REC | MS_PRIVATE):
        # every mount read-only (a per-mount flag: the host's view is untouched): the kernel, not the
        # audit hook, keeps model code from writing anywhere but its work dir
        failed = [p for p in _mount_points() if not _read_only(p)]
        read_only = not [p for p in failed if p in ("/", "/tmp", "/var/tmp", "/dev/shm")]
        if read_only:
            layers.append("read-only-filesystem(mount namespace)")
        owner = cfg["uid"] if cfg["uid"] is not None else os.getuid()
        group = cfg["uid"] if cfg["uid"] is not None else os.getgid()
        size = f"size={cfg['disk_mb']}m,nr_inodes=65536,mode=0700,uid={owner},gid={group}"
        if _mount("tmpfs", cfg["root"], MS_NOSUID | MS_NODEV, "tmpfs", size):
            layers.append(f"private-tmpfs-workdir({cfg['disk_mb']} MB quota, freed with the sandbox)")
            cfg["tmpfs"] = True
            if read_only:
                achieved.append("filesystem")
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


def _drop_capabilities() -> bool:
    """Every capability gone (bounding, ambient, effective, permitted, inheritable); whether it worked."""
    for cap in range(64):
        _libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)
    _libc.prctl(PR_CAP_AMBIENT, 4, 0, 0, 0)  # PR_CAP_AMBIENT_CLEAR_ALL
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this thread
    data = (ctypes.c_uint32 * 6)()
    return _libc.syscall(126 if _X86_64 else 91, header, data) == 0  # capset


def drop_privileges(cfg: dict) -> list[str]:
    """As root: the sandbox's own uid. In a user namespace: no capabilities. Both: ``no_new_privs``."""
    layers = []
    if os.geteuid() == 0 and cfg["uid"] is not None and not cfg.get("userns"):
        os.setgroups([])
        os.setgid(cfg["uid"])
        os.setuid(cfg["uid"])
        layers.append(f"uid-drop({cfg['uid']}, unique to this sandbox)")
    elif cfg.get("userns") and _drop_capabilities():
        layers.append("capabilities-dropped(user namespace)")
    _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    return layers


def set_limits(cfg: dict) -> list[str]:
    """rlimits of every sandbox process. RLIMIT_NPROC only where it counts this sandbox alone: a
    uid of its own (root) or a user namespace of its own (the kernel counts per namespace)."""
    mem = cfg["memory_mb"] * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
    resource.setrlimit(resource.RLIMIT_FSIZE, (cfg["file_mb"] * 1024 * 1024,) * 2)
    resource.setrlimit(resource.RLIMIT_CPU, (cfg["cpu_total_s"], cfg["cpu_total_s"]))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_NOFILE, (cfg["max_open_files"],) * 2)
    if (os.geteuid() == 0 and cfg["uid"] is not None) or cfg.get("userns"):
        resource.setrlimit(resource.RLIMIT_NPROC, (cfg["max_processes"],) * 2)
        return ["rlimits(as,cpu,fsize,nofile,nproc)"]
    return ["rlimits(as,cpu,fsize,nofile)"]


# ------------------------------------------------------------------ Landlock
_X86_64 = os.uname().machine == "x86_64"
_SYS_LANDLOCK_CREATE_RULESET, _SYS_LANDLOCK_ADD_RULE, _SYS_LANDLOCK_RESTRICT_SELF = 444, 445, 446
_FS_EXECUTE, _FS_WRITE_FILE, _FS_READ_FILE, _FS_READ_DIR = 1, 2, 4, 8
_FS_ALL_V1 = (1 << 13) - 1  # execute ... make_sym
_FS_REFER, _FS_TRUNCATE = 1 << 13, 1 << 14
_NET_BIND_TCP, _NET_CONNECT_TCP = 1, 2
_SCOPE_ABSTRACT_UNIX_SOCKET, _SCOPE_SIGNAL = 1, 2
O_PATH = 0o10000000


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def landlock_abi() -> int:
    """The kernel's Landlock ABI version (0: none or disabled)."""
    if not _X86_64 and os.uname().machine != "aarch64":
        return 0  # the syscall numbers below are the generic ones; other arches are not checked
    abi = _libc.syscall(_SYS_LANDLOCK_CREATE_RULESET, None, 0, 1)  # LANDLOCK_CREATE_RULESET_VERSION
    return max(0, abi)


def restrict_files(writable: str, readable: list[str]) -> tuple[list[str], bool]:
    """Landlock for this process and all it starts: full access beneath ``writable``, read and execute
    beneath each of ``readable``, nothing elsewhere; no TCP (ABI >= 4); no signals to, and no
    abstract sockets of, processes outside the sandbox (ABI >= 6). Needs ``no_new_privs`` first.

    Returns (layers, whether it holds).
    """
    abi = landlock_abi()
    if abi < 1:
        return ["unavailable: Landlock (needs Linux >= 5.13 with landlock in the active LSMs)"], False
    fs = _FS_ALL_V1 | (_FS_REFER if abi >= 2 else 0) | (_FS_TRUNCATE if abi >= 3 else 0)
    net = _NET_BIND_TCP | _NET_CONNECT_TCP if abi >= 4 else 0
    scoped = _SCOPE_ABSTRACT_UNIX_SOCKET | _SCOPE_SIGNAL if abi >= 6 else 0
    attr = _RulesetAttr(fs, net, scoped)
    size = 24 if abi >= 6 else 16 if abi >= 4 else 8
    ruleset = _libc.syscall(_SYS_LANDLOCK_CREATE_RULESET, ctypes.byref(attr), size, 0)
    if ruleset < 0:
        return [f"unavailable: Landlock (create_ruleset: {os.strerror(ctypes.get_errno())})"], False
    try:
        rules = [(writable, fs)] + [(p, _FS_EXECUTE | _FS_READ_FILE | _FS_READ_DIR) for p in readable]
        for path, access in rules:
            try:
                fd = os.open(path, O_PATH | os.O_CLOEXEC)
            except OSError:
                continue
            try:
                if not os.path.isdir(path):
                    access &= _FS_EXECUTE | _FS_READ_FILE | _FS_WRITE_FILE | (_FS_TRUNCATE if abi >= 3 else 0)
                rule = _PathBeneathAttr(access, fd)
                if _libc.syscall(_SYS_LANDLOCK_ADD_RULE, ruleset, 1, ctypes.byref(rule), 0) != 0:
                    return [f"unavailable: Landlock (add_rule {path}: {os.strerror(ctypes.get_errno())})"], False
            finally:
                os.close(fd)
        if _libc.syscall(_SYS_LANDLOCK_RESTRICT_SELF, ruleset, 0) != 0:
            return [f"unavailable: Landlock (restrict_self: {os.strerror(ctypes.get_errno())})"], False
    finally:
        os.close(ruleset)
    extra = (",no-tcp" if net else "") + (",signals-scoped" if scoped else "")
    return [f"landlock(abi {abi}: writes only in the work dir, reads only of system and python dirs{extra})"], True


# ------------------------------------------------------------------ seccomp
# x86_64 syscall numbers refused with EPERM for every sandbox process once the interpreter is set up.
_DENIED_X86_64 = {
    "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311, "kill": 62, "tkill": 200,
    "tgkill": 234, "rt_sigqueueinfo": 129, "rt_tgsigqueueinfo": 297, "pidfd_send_signal": 424,
    "pidfd_open": 434, "pidfd_getfd": 438, "execve": 59, "execveat": 322, "mount": 165, "umount2": 166,
    "pivot_root": 155, "chroot": 161, "unshare": 272, "setns": 308, "open_tree": 428, "move_mount": 429,
    "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433, "mount_setattr": 442, "bpf": 321,
    "perf_event_open": 298, "userfaultfd": 323, "keyctl": 250, "add_key": 248, "request_key": 249,
    "kexec_load": 246, "kexec_file_load": 320, "init_module": 175, "finit_module": 313,
    "delete_module": 176, "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
    "personality": 135, "socket": 41, "socketpair": 53, "pipe": 22, "pipe2": 293, "memfd_create": 319,
    "shmget": 29, "shmat": 30, "acct": 163, "swapon": 167, "reboot": 169, "setdomainname": 171,
    "sethostname": 170, "name_to_handle_at": 303, "open_by_handle_at": 304, "landlock_create_ruleset": 444,
    # other processes' priority, I/O class, memory placement and kernel objects
    "setpriority": 141, "ioprio_set": 251, "migrate_pages": 256, "move_pages": 279, "kcmp": 312,
    # System V and POSIX IPC (the IPC namespace already ends them with the sandbox)
    "shmctl": 31, "shmdt": 67, "semget": 64, "semop": 65, "semctl": 66, "semtimedop": 220, "msgget": 68,
    "msgsnd": 69, "msgrcv": 70, "msgctl": 71, "mq_open": 240, "mq_unlink": 241, "mq_timedsend": 242,
    "mq_timedreceive": 243, "mq_notify": 244, "mq_getsetattr": 245,
}
# x86_64 syscalls whose first argument is a pid: allowed for pid 0 (the caller itself) only. A
# filter cannot compare with the caller's pid, so naming oneself by number is refused too.
_SELF_ONLY_X86_64 = {"prlimit64": 302, "sched_setparam": 142, "sched_setscheduler": 144,
                     "sched_setaffinity": 203, "sched_setattr": 314}
_NR_CLONE, _NR_CLONE3, _NR_MMAP = 56, 435, 9
_AUDIT_ARCH_X86_64 = 0xC000003E
_BPF_LD_W_ABS, _BPF_JEQ_K, _BPF_JSET_K, _BPF_JGE_K, _BPF_RET_K = 0x20, 0x15, 0x45, 0x35, 0x06
_RET_ALLOW, _RET_ERRNO, _RET_KILL = 0x7FFF0000, 0x00050000, 0x80000000
_MAP_SHARED, _PROT_WRITE = 0x01, 0x2


class _SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_uint16), ("filter", ctypes.POINTER(_SockFilter))]


def seccomp_program() -> list[tuple[int, int, int, int]]:
    """The filter as (code, jt, jf, k) instructions over ``struct seccomp_data`` (x86_64).

    Another arch (or the x32 ABI) is killed; each denied syscall returns EPERM; ``prlimit64`` and
    the ``sched_set*`` calls return EPERM unless their pid is 0 (the caller); ``clone`` with a
    namespace flag returns EPERM; ``clone3`` returns ENOSYS (its flags sit behind a pointer, and
    the C library falls back to ``clone``); ``mmap`` of a shared writable map returns EPERM.
    """
    eperm, enosys = _RET_ERRNO | 1, _RET_ERRNO | 38
    prog = [(_BPF_LD_W_ABS, 0, 0, 4), (_BPF_JEQ_K, 1, 0, _AUDIT_ARCH_X86_64), (_BPF_RET_K, 0, 0, _RET_KILL),
            (_BPF_LD_W_ABS, 0, 0, 0), (_BPF_JGE_K, 0, 1, 0x40000000), (_BPF_RET_K, 0, 0, _RET_KILL)]
    for nr in sorted(set(_DENIED_X86_64.values())):
        prog += [(_BPF_JEQ_K, 0, 1, nr), (_BPF_RET_K, 0, 0, eperm)]
    for nr in sorted(_SELF_ONLY_X86_64.values()):  # args[0] (a pid_t: its low word, offset 16) must be 0
        prog += [(_BPF_JEQ_K, 0, 4, nr), (_BPF_LD_W_ABS, 0, 0, 16), (_BPF_JEQ_K, 0, 1, 0),
                 (_BPF_RET_K, 0, 0, _RET_ALLOW), (_BPF_RET_K, 0, 0, eperm)]
    prog += [(_BPF_JEQ_K, 0, 1, _NR_CLONE3), (_BPF_RET_K, 0, 0, enosys)]
    # clone: refuse namespace flags (args[0], low word at offset 16); the accumulator is reloaded after
    prog += [(_BPF_JEQ_K, 0, 4, _NR_CLONE), (_BPF_LD_W_ABS, 0, 0, 16), (_BPF_JSET_K, 0, 1, CLONE_NAMESPACES),
             (_BPF_RET_K, 0, 0, eperm), (_BPF_RET_K, 0, 0, _RET_ALLOW)]
    # mmap: refuse MAP_SHARED (args[3], offset 40) with PROT_WRITE (args[2], offset 32)
    prog += [(_BPF_JEQ_K, 0, 5, _NR_MMAP), (_BPF_LD_W_ABS, 0, 0, 40), (_BPF_JSET_K, 0, 3, _MAP_SHARED),
             (_BPF_LD_W_ABS, 0, 0, 32), (_BPF_JSET_K, 0, 1, _PROT_WRITE), (_BPF_RET_K, 0, 0, eperm)]
    prog += [(_BPF_RET_K, 0, 0, _RET_ALLOW)]
    return prog


def restrict_syscalls() -> tuple[list[str], bool]:
    """Install :func:`seccomp_program` for this process and all it starts. Returns (layers, holds)."""
    if not _X86_64:
        return [f"unavailable: seccomp filter (no syscall table for {os.uname().machine})"], False
    prog = seccomp_program()
    filters = (_SockFilter * len(prog))(*[_SockFilter(*ins) for ins in prog])
    fprog = _SockFprog(len(prog), filters)
    if _libc.prctl(22, 2, ctypes.byref(fprog), 0, 0) != 0:  # PR_SET_SECCOMP, SECCOMP_MODE_FILTER
        return [f"unavailable: seccomp filter ({os.strerror(ctypes.get_errno())})"], False
    return ["seccomp(no exec, ptrace, signals, namespaces, mounts, sockets, pipes, shared memory, "
            "shared writable maps, System V/POSIX IPC, priority/scheduling/rlimits of any process but "
            "the caller (pid 0 only), ioprio, page migration, kcmp)"], True


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
