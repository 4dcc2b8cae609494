"""The configuration of a PythonMath sandbox (split from ``sandbox.py``, which re-exports it)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

__all__ = ["REQUIRED_LAYERS", "SandboxConfig"]

#: The kernel layers a sandbox needs, by name: ``filesystem`` (a mount namespace with every mount
#: read-only and a private tmpfs work root with a quota), ``network`` (a network namespace with no
#: interfaces), ``landlock`` (file access: writes only in the live work dir; reads only of system and
#: python dirs), ``seccomp`` (no exec, ptrace, signals, namespaces, mounts, sockets, pipes or shared
#: memory). As an ordinary user the first two come from a user namespace of the sandbox's own.
REQUIRED_LAYERS = ("filesystem", "network", "landlock", "seccomp")


@dataclass(frozen=True, kw_only=True)
class SandboxConfig:
    """Limits and isolation of one sandbox.

    Attributes:
        timeout_s: wall-clock limit of one cell (the alarm inside; the host kills after ``kill_grace_s`` more).
        kill_grace_s: extra time the host waits before killing a cell that ignores the alarm.
        cpu_s: CPU-time limit of one cell.
        cpu_total_s: CPU-time limit of one interpreter over its whole life.
        memory_mb: address-space limit of each sandbox process.
        env_memory_mb: memory of the whole env (all its processes and its tmpfs files; a cgroup, where available).
        cpus: CPU cap of the whole env in cores (a cgroup quota, where available); None: no CPU cgroup.
            Off by default: under contention the env then competes as one task, which doubled
            restore latency on a loaded 2-core machine; rlimits bound CPU per cell and between cells anyway.
        disk_mb: size of the live work dir's private tmpfs (what model code can write).
        snapshot_disk_mb: size of the private tmpfs holding every snapshot's copy of the work dir; a
            snapshot whose files do not fit holds its replay log only (``info`` says so).
        snapshot_inodes: inode slots of that tmpfs (every file, dir and hard link of every snapshot;
            a slot that holds a link costs about 0.2 KB of kernel memory, within ``env_memory_mb``).
        snapshot_branch_mb: most bytes of the store one branch's held snapshots may add (a branch is
            one live interpreter, from the restore or reset that started it to the next): past it,
            that branch's snapshot holds its replay log only (``info`` says why) and the rest of the
            store stays free for its siblings. At most ``snapshot_disk_mb``; None: half of it.
        snapshot_branch_entries: most inode slots of the store one branch's held snapshots may take
            (likewise; at most ``snapshot_inodes``; None: half of it).
        snapshot_max_depth: deepest directory nesting a snapshot copies; a deeper work dir makes the
            snapshot hold its replay log only (``info`` says why).
        snapshot_max_entries: most files and dirs a snapshot copies (likewise).
        max_open_files: open files per process.
        file_mb: largest file a cell may write.
        output_chars: output kept per cell; the rest is counted and dropped.
        max_processes: process cap of the sandbox's uid (frozen copies count).
        max_frozen: live frozen copies allowed at once (snapshots beyond it raise SnapshotLimitError).
        network_namespace: isolate the network (a namespace with no interfaces; required unless False).
        drop_privileges: run user code under a fresh uid when the host is root.
        allow_weaker: kernel layers the sandbox may start without, by name (see :data:`REQUIRED_LAYERS`):
            by default it refuses to start when one is missing on this machine. Defaults to the
            comma-separated names in ``TRACE_GYM_ALLOW_WEAKER``.
        preload: modules imported once in the keeper so that every interpreter starts warm.
    """

    timeout_s: float = 10.0
    kill_grace_s: float = 2.0
    cpu_s: int = 10
    cpu_total_s: int = 3600
    memory_mb: int = 1024
    env_memory_mb: int = 4096
    cpus: float | None = None
    disk_mb: int = 256
    snapshot_disk_mb: int = 1024
    snapshot_inodes: int = 1_048_576
    snapshot_branch_mb: int | None = None
    snapshot_branch_entries: int | None = None
    snapshot_max_depth: int = 256
    snapshot_max_entries: int = 65_536
    max_open_files: int = 256
    file_mb: int = 16
    output_chars: int = 8192
    max_processes: int = 512
    max_frozen: int = 256
    network_namespace: bool = True
    drop_privileges: bool = True
    allow_weaker: tuple[str, ...] = field(default_factory=lambda: tuple(
        name.strip() for name in os.environ.get("TRACE_GYM_ALLOW_WEAKER", "").split(",") if name.strip()))
    preload: tuple[str, ...] = ("math", "fractions", "itertools", "functools", "collections", "random",
                                "numpy", "numpy.random", "sympy")

    def __post_init__(self) -> None:
        if self.timeout_s <= 0 or self.cpu_s <= 0 or self.memory_mb < 64 or self.output_chars < 1:
            raise ValueError("SandboxConfig limits must be positive (memory_mb >= 64)")
        if self.max_frozen < 1 or self.max_processes <= self.max_frozen:
            raise ValueError("need max_frozen >= 1 and max_processes > max_frozen")
        if (self.env_memory_mb < self.memory_mb // 4 or (self.cpus is not None and self.cpus <= 0)
                or self.disk_mb < 1 or self.snapshot_disk_mb < 1 or self.max_open_files < 16
                or self.snapshot_max_depth < 1 or self.snapshot_max_entries < 1):
            raise ValueError("SandboxConfig: env_memory_mb >= memory_mb / 4, cpus > 0 or None, disk_mb and snapshot_disk_mb >= 1, "
                             "max_open_files >= 16, snapshot_max_depth and snapshot_max_entries >= 1")
        branch_mb, branch_entries = self.branch_share
        if not (1 <= branch_mb <= self.snapshot_disk_mb and 1 <= branch_entries <= self.snapshot_inodes):
            raise ValueError("SandboxConfig: need 1 <= snapshot_branch_mb <= snapshot_disk_mb and "
                             "1 <= snapshot_branch_entries <= snapshot_inodes")
        unknown = set(self.allow_weaker) - set(REQUIRED_LAYERS)
        if unknown:
            raise ValueError(f"SandboxConfig.allow_weaker: unknown layer(s) {sorted(unknown)}; "
                             f"the layers are {list(REQUIRED_LAYERS)}")

    @property
    def branch_share(self) -> tuple[int, int]:
        """(MB, inode slots) of the snapshot store one branch's held snapshots may take."""
        return (self.snapshot_branch_mb if self.snapshot_branch_mb is not None else max(1, self.snapshot_disk_mb // 2),
                self.snapshot_branch_entries if self.snapshot_branch_entries is not None
                else max(1, self.snapshot_inodes // 2))

    @property
    def required_layers(self) -> tuple[str, ...]:
        """The kernel layers this sandbox refuses to start without."""
        wanted = [name for name in REQUIRED_LAYERS if name != "network" or self.network_namespace]
        return tuple(name for name in wanted if name not in self.allow_weaker)
