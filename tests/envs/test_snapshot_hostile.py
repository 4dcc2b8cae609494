"""Attacks on the work-dir snapshot and on the processes around a sandbox, with the guard taken out.

Every test starts from model code that has defeated the audit hook completely (it rewrites the
hook's closure: no write, event or ctypes check is left), so what holds is the kernel and the host:
the filer (the sandbox's uid, Landlock and seccomp, walking by directory descriptor) copying a work
dir only while the live interpreter is stopped, the pid and IPC namespaces, the seccomp filter, the
snapshot caps and the env's memory budget.

Runs as root here and as an ordinary user in
``test_kernel_boundary.py::test_hostile_suite_holds_as_an_unprivileged_user``.
"""

from __future__ import annotations

import errno
import os
import resource
import secrets
import time

import pytest

from tests.envs.test_kernel_boundary import BYPASS
from trace_envs import Task, TaskSet
from trace_envs.errors import SnapshotLimitError
from trace_envs.python_tool.env import PythonMathEnv
from trace_envs.python_tool.sandbox import Sandbox, SandboxConfig, SandboxError, SnapshotTreeError

pytestmark = pytest.mark.hostile

# After BYPASS (``rt`` is the server's Runtime): the guard's closure is rewritten so that it refuses
# nothing, in every thread -- the strongest position model code could reach inside the interpreter.
UNHOOK = BYPASS + """
for _cell in rt.hook.__closure__:
    _v = _cell.cell_contents
    if type(_v) is dict and 'workdir' in _v:
        _v['workdir'] = ''
    elif type(_v) is tuple and 'os.fork' in _v:
        _cell.cell_contents = ('\\0',)
    elif type(_v) is frozenset:
        _cell.cell_contents = frozenset()
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
'unhooked'
"""
TASKS = TaskSet([Task(task_id="t", prompt="What is 1?", data={"answer": "1"})], name="t")


# A chain of ``depth`` dirs named d, built by descriptor (0.1 s for 1,000), a file 'leaf' at the bottom.
CHAIN = """
import os
fd = os.open('.', os.O_RDONLY)
for _ in range({depth}):
    os.mkdir('d', dir_fd=fd)
    below = os.open('d', os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
    os.close(fd)
    fd = below
leaf = os.open('leaf', os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=fd)
os.write(leaf, b'deep'); os.close(leaf); os.close(fd)
"""
DEPTH = "n = 0\nwhile os.path.isdir('d'):\n    os.chdir('d'); n += 1\nleaf = open('leaf').read()\nos.chdir(os.path.expanduser('~'))\n(n, leaf)"


def unhooked(box: Sandbox) -> Sandbox:
    box.thaw(box.base)
    result = box.run(UNHOOK)
    assert result.ok and "'unhooked'" in result.output, result.output
    return box


@pytest.fixture(scope="module")
def box():
    sandbox = Sandbox(SandboxConfig(timeout_s=20.0, kill_grace_s=2.0, cpu_s=15, disk_mb=512, snapshot_disk_mb=1024,
                                    preload=()))
    yield sandbox
    sandbox.close()


def call(code: str) -> str:
    import json

    return "<tool_call>" + json.dumps({"name": "python", "arguments": {"code": code}}) + "</tool_call>"


def _secret(tmp_path) -> tuple[str, bytes]:
    """A host dir the sandbox cannot read (0700, outside every Landlock rule) with a 0600 secret file."""
    token = secrets.token_hex(16).encode()
    host = tmp_path / "host-secret"
    host.mkdir(mode=0o700)
    for i in range(200):  # the same names as the branch's own files: a walk sent astray finds each one
        (host / f"x{i}").write_bytes(b"SECRET-" + token)
        os.chmod(host / f"x{i}", 0o600)
    return str(host), token


SCAN = """
found = []
for top, dirs, files in os.walk('.', followlinks=False):
    for name in files:
        path = os.path.join(top, name)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            continue
        try:
            found.append(os.read(fd, 1 << 16))
        finally:
            os.close(fd)
sum(b'SECRET-' in data for data in found)
"""


def test_a_rename_race_during_snapshots_never_brings_a_host_file_into_a_branch(box, tmp_path):
    """A thread swaps a dir and a symlink to a host dir (renameat2 RENAME_EXCHANGE) as fast as it can
    while snapshots are taken: no byte of the host's file ever lands in any branch."""
    host, _ = _secret(tmp_path)
    tries, leaked = 0, []
    for _ in range(4):
        unhooked(box)
        setup = f"""
os.makedirs('P/c', exist_ok=True)
for i in range(200):
    open(f'P/c/x{{i}}', 'w').write('mine')
os.makedirs('Q', exist_ok=True); os.symlink({host!r}, 'Q/c')
import threading
def swap():
    end = time.time() + 3
    while time.time() < end:
        libc.syscall(316, -100, b'P', -100, b'Q', 2)  # renameat2(AT_FDCWD, 'P', AT_FDCWD, 'Q', RENAME_EXCHANGE)
threading.Thread(target=swap, daemon=True).start()
'racing'
"""
        assert "'racing'" in box.run("import time\n" + setup).output
        frozen = []
        for _ in range(10):
            try:
                frozen.append(box.freeze())
            except SandboxError:
                pass  # a refused snapshot is fine; a leaking one is not
            tries += 1
        for copy in frozen:
            box.thaw(copy)
            seen = box.run(SCAN).output.strip()
            if seen != "0":
                leaked.append(seen)
            copy.release()
    assert tries >= 40
    assert not leaked, "a host file was copied into a branch"


def test_a_deep_directory_chain_is_refused_clearly_and_nothing_else_degrades(box):
    """1,000 nested dirs: the snapshot is refused with the cap in the message; the filer serves on,
    and a sibling snapshot still restores from its own copy."""
    box.thaw(box.base)
    box.run("open('keep.txt', 'w').write('sibling')")
    sibling = box.freeze()
    # and a dir under the name the filer first moves deep parts to when it clears the tree
    assert box.run(CHAIN.format(depth=1000) + "os.makedirs('.trace-gym-clear-1/x')").ok
    with pytest.raises(SnapshotTreeError, match="snapshot_max_depth"):
        box.freeze()
    start = time.monotonic()
    box.thaw(sibling)  # the deep live dir is cleared (deep parts moved up first), the sibling's files put back
    assert time.monotonic() - start < 10
    assert box.run("open('keep.txt').read()").output.strip() == "'sibling'"
    assert box.run("import os\nos.listdir('.')").output.strip() == "['keep.txt']"


def test_a_deep_chain_within_the_cap_is_copied_exactly():
    with Sandbox(SandboxConfig(snapshot_max_depth=1100, preload=())) as deep:
        deep.thaw(deep.base)
        assert deep.run(CHAIN.format(depth=1000)).ok
        frozen = deep.freeze()
        deep.run("os.rename('d', 'gone')")
        deep.thaw(frozen)
        out = deep.run(DEPTH).output
        assert out.strip() == "(1000, 'deep')", out


def test_a_replay_only_snapshot_says_so_and_restore_keeps_the_record():
    """The cell that builds a tree past a cap gets an error line in its own observation; the snapshot
    after it holds the replay log (``info`` says why) and a restore of it replays, keeping the record."""
    config = SandboxConfig(snapshot_max_depth=8, snapshot_max_entries=100, preload=())
    with PythonMathEnv(tasks=TASKS, sandbox=config, max_turns=10) as env:
        env.reset(seed=0, options={"task_id": "t"})
        obs = env.step(call("import os\nfor i in range(60): open(f'f{i}', 'w').write('x')\n'sixty'"))[0]
        assert obs.strip() == "'sixty'", obs  # within both caps: no line
        obs = env.step(call("for i in range(60, 150): open(f'f{i}', 'w').write('x')\n'more'"))[0]
        assert obs.startswith("'more'") and obs.rstrip().endswith("re-runs every cell of the episode."), obs
        assert "Error: this cell left a work dir" in obs and "snapshot_max_entries" in obs, obs
        obs = env.step(call("import shutil\nfor i in range(150): os.remove(f'f{i}')\n'gone'"))[0]
        assert obs.strip() == "'gone'", obs
        obs = env.step(call(CHAIN.format(depth=20) + "x = 7"))[0]
        assert "Error: this cell left a work dir" in obs and "snapshot_max_depth" in obs, obs
        snap = env.snapshot()
        assert snap.payload.frozen is None
        info = dict(snap.episode_info)
        assert info["replay_only_snapshots"] == 1 and "snapshot_max_depth" in info["replay_only_reason"]
        env.step(call("x = 8"))
        env.restore(snap)
        _, _, _, _, info = env.step(call("x"))
        assert info["restored_by_replay"] is True and info["replay_only_snapshots"] == 1
        assert "7" in env.messages[-1]["content"]


@pytest.mark.slow
def test_fifty_thousand_small_files_snapshot_and_restore_in_bounded_time(box):
    box.thaw(box.base)
    box.run("import os\nfor d in range(50):\n    os.mkdir(f'd{d}')\n    for i in range(1000):\n"
            "        open(f'd{d}/{i}', 'w').write(str(i))", )
    start = time.monotonic()
    frozen = box.freeze()
    saved = time.monotonic() - start
    box.run("import shutil\nfor d in range(50):\n    shutil.rmtree(f'd{d}')")
    start = time.monotonic()
    box.thaw(frozen)
    restored = time.monotonic() - start
    out = box.run("import os\nsum(len(os.listdir(f'd{d}')) for d in range(50)), open('d49/999').read()").output
    assert out.strip() == "(50000, '999')", out
    assert saved < 30 and restored < 30, (saved, restored)  # a loaded 2-core machine: ~1-3 s each
    frozen.release()


def test_scheduling_and_limits_of_other_processes_are_refused(box):
    """prlimit, setpriority and the sched_set* calls against the host and the sandbox's other
    processes: refused (EPERM; in the pid namespace the host has no pid at all). The caller itself
    (pid 0) keeps them."""
    host = os.getpid()
    before = (resource.getrlimit(resource.RLIMIT_NOFILE), os.getpriority(os.PRIO_PROCESS, host),
              os.sched_getscheduler(host))
    unhooked(box)
    for pid in [host, 1, 2, 3, 4, 5]:
        assert box.run(f"import resource\ntry:\n    resource.prlimit({pid}, resource.RLIMIT_NOFILE, (8, 8))\n"
                       f"    r = 'done'\nexcept OSError as e:\n    r = e.errno\nr").output.strip() in (
            str(errno.EPERM), str(errno.ESRCH))
        for code in (f"os.setpriority(os.PRIO_PROCESS, {pid}, 19)", f"os.sched_setscheduler({pid}, os.SCHED_IDLE, "
                     "os.sched_param(0))", f"os.sched_setaffinity({pid}, {{0}})",
                     f"libc.syscall(251, 1, {pid}, (3 << 13) | 7) and (_ for _ in ()).throw(OSError("
                     "ctypes.get_errno(), 'ioprio'))"):
            out = box.run(f"try:\n    {code}\n    r = 'done'\nexcept OSError as e:\n    r = e.errno\nr").output
            assert out.strip() in (str(errno.EPERM), str(errno.ESRCH)), (code, out)
    assert box.run("os.setpriority(os.PRIO_PROCESS, 0, 1) if False else 'ok'").ok
    assert box.run("import resource\nresource.prlimit(0, resource.RLIMIT_NOFILE)").ok  # its own: allowed
    assert box.run("os.sched_setaffinity(0, os.sched_getaffinity(0))").ok
    after = (resource.getrlimit(resource.RLIMIT_NOFILE), os.getpriority(os.PRIO_PROCESS, host),
             os.sched_getscheduler(host))
    assert after == before
    box.thaw(box.base)  # the sandbox's own processes still work
    assert box.run("1 + 1").output.strip() == "2"


SYSV = """
def sysv():
    out = {}
    for name, nr, args in (('msgget', 68, (0x7ace, 0o1666)), ('semget', 64, (0x7ace, 1, 0o1666)),
                           ('shmget', 29, (0x7ace, 4096, 0o1666)), ('mq_open', 240, (b'/tracegym', 0o102, 0o666, 0))):
        r = libc.syscall(nr, *args)
        out[name] = r if r >= 0 else -ctypes.get_errno()
    return out
sysv()
"""


def test_system_v_and_posix_ipc_are_refused_and_invisible_across_envs(box):
    unhooked(box)
    out = box.run(SYSV).output
    assert out.strip() == str({name: -errno.EPERM for name in ("msgget", "semget", "shmget", "mq_open")}), out
    with open("/proc/sysvipc/msg") as fh:  # nothing of a sandbox's reaches the host's IPC namespace
        assert "7ace" not in fh.read().lower()


def test_snapshots_of_a_memory_heavy_interpreter_stop_at_the_budget_and_the_live_cell_survives():
    """A cell rewrites 40 MB each turn and a snapshot follows each: once another one would not fit
    the env's budget, it is refused with a clear error; the live interpreter never dies."""
    config = SandboxConfig(env_memory_mb=400, memory_mb=1024, preload=())
    with PythonMathEnv(tasks=TASKS, sandbox=config, max_turns=100) as env:
        env.reset(seed=0, options={"task_id": "t"})
        pid, held, refused = env._sandbox.live_pid, [], None
        for turn in range(40):
            obs = env.step(call(f"a = bytearray([{turn % 250}]) * (40 * 2**20)\nlen(a) // 2**20"))[0]
            assert "40" in obs, obs
            try:
                held.append(env.snapshot())
            except SnapshotLimitError as exc:
                refused = str(exc)
                break
        assert refused is not None and "memory budget" in refused and "env_memory_mb" in refused
        assert env._sandbox.live_pid == pid  # never killed, never rebuilt
        assert 2 <= len(held) < 10
        obs = env.step(call("a = bytearray([7]) * (40 * 2**20)\na[-1]"))[0]
        assert obs.strip() == "7" and env._sandbox.live_pid == pid
        for snap in held:
            snap.release()
        deadline = time.monotonic() + 10  # the released copies' memory is freed as they exit
        while env._sandbox.memory_headroom() < 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        env.snapshot().release()  # room again once the held ones are gone


def test_unchanged_files_are_shared_between_snapshots_and_no_change_is_ever_missed(box):
    """A snapshot hard-links the files unchanged since the last one (the store holds them once); a
    write, chmod or utime right after a snapshot -- within the same clock tick -- is still seen."""
    box.thaw(box.base)
    box.run("import os\nfor i in range(300):\n    open(f'f{i}', 'w').write(str(i))")
    first, second = box.freeze(), box.freeze()  # held: a released snapshot's copy is not shared
    if box.last_save["shared"] == 0:
        pytest.skip("this kernel gives no fresh change time after every write (before Linux 6.13)")
    assert (box.last_save["entries"], box.last_save["shared"]) == (300, 300)
    second.release()  # the copies it shared are still held by the first: the next snapshot links to those
    third = box.freeze()
    assert (box.last_save["entries"], box.last_save["shared"]) == (300, 300)
    pairs = []
    changes = ["open('f1', 'a').write('+')", "os.chmod('f2', 0o604 if {n} % 2 else 0o640)",
               "os.utime('f3', ({n} + 1, {n} + 1))", "os.truncate('f4', {n} + 1)",
               "os.rename('f5', 'g5') if os.path.exists('f5') else os.rename('g5', 'f5')"]
    for n in range(30):
        change = changes[n % 5].format(n=n)
        before = box.freeze()
        assert box.run(change).ok  # at once: usually within the clock tick of the copy's timestamps
        after = box.freeze()
        assert box.last_save["shared"] == 299, (change, box.last_save)
        pairs.append((before, after, change, n))
    del first, third
    state = ("sorted((n, open(n).read(), oct(os.stat(n).st_mode & 0o777), os.stat(n).st_mtime_ns) "
             "for n in os.listdir('.') if n in ('f1', 'f2', 'f3', 'f4', 'g5', 'f5'))")
    seen = []
    for before, after, _, _ in pairs:
        box.thaw(before)
        one = box.run(state).output
        box.thaw(after)
        seen.append((one, box.run(state).output))
    for (one, two), (_, _, change, _) in zip(seen, pairs, strict=True):
        assert one != two, f"the change {change!r} right after a snapshot was lost"


@pytest.mark.slow
def test_many_snapshots_of_a_big_work_dir_never_fill_the_store(box):
    """50,000 files, 8 snapshots: copied once, then shared (a link costs no bytes, one of the 524,288
    inode slots of the branch's share), so the store does not fill and a later snapshot still copies."""
    box.thaw(box.base)
    box.run("import os\nfor d in range(50):\n    os.mkdir(f'd{d}')\n    for i in range(1000):\n"
            "        open(f'd{d}/{i}', 'w').write(str(i))")
    held = [box.freeze() for _ in range(8)]
    if box.last_save["shared"] == 0:
        pytest.skip("this kernel gives no fresh change time after every write (before Linux 6.13)")
    box.run("open('d0/0', 'w').write('sibling')")
    held.append(box.freeze())
    box.thaw(held[3])
    assert box.run("open('d0/0').read(), len(os.listdir('d49'))").output.strip() == "('0', 1000)"
    box.thaw(held[-1])
    assert box.run("open('d0/0').read()").output.strip() == "'sibling'"
    for frozen in held:
        frozen.release()


FILL = """
import os
os.makedirs('r{n}', exist_ok=True)
for j in range({big}):
    open(f'r{n}/big{{j}}', 'wb').write(os.urandom(10 << 20))
for j in range({small}):
    open(f'r{n}/s{{j}}', 'w').write('x')
'filled'
"""


def test_one_branch_filling_the_store_never_makes_a_siblings_snapshot_replay_only():
    """A branch writes 10 MB and 1,000 files a turn and snapshots each turn, past its share of a small
    store (64 MB, 8,192 inode slots: half each per branch): only its own snapshots are refused, naming
    the share; sibling branches (restored from its first snapshot, and from the start) still get real
    snapshots with their own files, and restore from them."""
    config = SandboxConfig(snapshot_disk_mb=64, snapshot_inodes=8192, timeout_s=30.0, cpu_s=25, preload=())
    with Sandbox(config) as box:
        unhooked(box)  # branch A
        held, refused = [], []
        for n in range(5):
            assert "'filled'" in box.run(FILL.format(n=n, big=1, small=1000)).output
            try:
                held.append(box.freeze())
            except SnapshotTreeError as exc:
                refused.append(str(exc))
        first = held[0]
        assert len(held) >= 1 and len(refused) >= 2, refused
        assert all("snapshot_branch_" in text for text in refused), refused
        for source in (first, box.base):  # siblings: from A's held snapshot, and a fresh branch
            box.thaw(source)
            assert "'filled'" in box.run(FILL.format(n="b", big=1, small=1500)).output
            sibling = box.freeze()  # a SnapshotTreeError or a full store here is the defect
            assert box.last_save["branch_bytes"] < 32 << 20 and box.last_save["branch_entries"] < 4096
            box.run("import shutil; shutil.rmtree('rb')")
            box.thaw(sibling)
            out = box.run("import os\nlen(os.listdir('rb')), os.path.getsize('rb/big0')").output
            assert out.strip() == f"(1501, {10 << 20})", out
            sibling.release()
