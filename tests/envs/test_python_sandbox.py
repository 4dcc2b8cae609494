"""The sandbox on its own: persistence, fork-copies, limits and hostile code."""

from __future__ import annotations

import os
import time

import pytest

from trace_envs.errors import SnapshotError, SnapshotLimitError
from trace_envs.python_tool.sandbox import Sandbox, SandboxConfig, SandboxCrashed


@pytest.fixture(scope="module")
def sandbox():
    box = Sandbox(SandboxConfig(timeout_s=2.0, kill_grace_s=1.0, cpu_s=3, memory_mb=1024, output_chars=1000))
    yield box
    box.close()


@pytest.fixture
def fresh(sandbox):
    sandbox.thaw(sandbox.base)
    sandbox.seed(0)
    return sandbox


def test_reports_isolation_layers(sandbox):
    assert any("rlimits" in layer for layer in sandbox.isolation)
    assert any("audit-hook" in layer for layer in sandbox.isolation)
    if os.geteuid() == 0:  # the OS-level layers are expected where the host is root on Linux
        assert "network-namespace" in sandbox.isolation
        assert any(layer.startswith("uid-drop") for layer in sandbox.isolation)


def test_state_persists_across_cells(fresh):
    assert fresh.run("x = 20").ok
    assert fresh.run("def f(y):\n    return x + y").ok
    assert fresh.run("f(22)").output.strip() == "42"


def test_errors_keep_the_interpreter(fresh):
    result = fresh.run("x = 1\n1 / 0")
    assert not result.ok and "ZeroDivisionError" in result.output and "_server.py" not in result.output
    assert fresh.run("x").output.strip() == "1"
    assert "SyntaxError" in fresh.run("def (").output
    assert "SystemExit" in fresh.run("raise SystemExit(3)").output
    assert fresh.run("x").ok


def test_frozen_copy_is_exact_and_reusable(fresh):
    fresh.run("import random\nvalues = [1]\nopen('f.txt', 'w').write('a')")
    frozen = fresh.freeze()
    runs = []
    for tag in ("b", "c"):
        fresh.thaw(frozen)
        runs.append(fresh.run(f"values.append(2)\nopen('f.txt', 'a').write('{tag}')\n"
                              "(values, random.random(), open('f.txt').read())").output)
    assert runs[0].split("'")[0] == runs[1].split("'")[0]  # same list and same random draw
    assert "'ab'" in runs[0] and "'ac'" in runs[1]  # each branch has its own files
    fresh.thaw(frozen)
    assert fresh.run("values, open('f.txt').read()").output.strip() == "([1], 'a')"
    frozen.release()
    with pytest.raises(SnapshotError):
        fresh.thaw(frozen)


def test_infinite_loop_times_out(fresh):
    start = time.monotonic()
    result = fresh.run("while True:\n    pass")
    assert not result.ok and "limit" in result.output
    assert time.monotonic() - start < 5
    assert fresh.run("1 + 1").output.strip() == "2"


def test_loop_that_swallows_the_alarm_is_killed(fresh):
    with pytest.raises(SandboxCrashed):
        fresh.run("import signal\nfor s in (signal.SIGALRM, signal.SIGXCPU):\n"
                  "    signal.signal(s, signal.SIG_IGN)\nwhile True:\n    pass")
    fresh.thaw(fresh.base)  # the host survives and a new interpreter works
    assert fresh.run("2 + 2").output.strip() == "4"


def test_memory_bomb(fresh):
    result = fresh.run("blob = bytearray(8 * 1024**3)")
    assert not result.ok and "MemoryError" in result.output
    assert fresh.run("'alive'").ok


def test_fork_bomb_and_subprocesses_are_refused(fresh):
    result = fresh.run("import os\nwhile True:\n    os.fork()")
    assert not result.ok and "not allowed" in result.output
    assert not fresh.run("import subprocess; subprocess.run(['true'])").ok
    assert fresh.process_count() <= 3 + len(fresh._frozen)


def test_writing_outside_the_work_dir(fresh):
    for target in ("/tmp/trace_gym_escape.txt", "/etc/trace_gym_escape", "../escape.txt"):
        result = fresh.run(f"open({target!r}, 'w').write('x')")
        assert not result.ok and ("not allowed" in result.output or "Error" in result.output), result.output
    assert not os.path.exists("/tmp/trace_gym_escape.txt")
    assert fresh.run("open('inside.txt', 'w').write('ok')").ok


def test_network_is_refused(fresh):
    result = fresh.run("import socket\ns = socket.create_connection(('127.0.0.1', 22), timeout=1)")
    assert not result.ok


def test_killing_the_parent_leaves_host_intact(fresh):
    result = fresh.run("import os, signal\nos.kill(os.getppid(), signal.SIGKILL)")
    assert not result.ok
    assert fresh.run("'still here'").ok


def test_huge_output_is_capped(fresh):
    result = fresh.run("print('y' * 100_000_000)")
    assert result.ok and len(result.output) == 1000 and result.truncated_chars > 99_000_000


def test_dead_interpreter_raises_crash_not_host_exit(fresh):
    with pytest.raises(SandboxCrashed):
        fresh.run("import os\nos._exit(1)")
    fresh.thaw(fresh.base)
    assert fresh.run("3").output.strip() == "3"


def test_snapshot_cap():
    with Sandbox(SandboxConfig(max_frozen=2, max_processes=16)) as box:
        box.thaw(box.base)
        held = [box.freeze(), box.freeze()]
        with pytest.raises(SnapshotLimitError):
            box.freeze()
        held.pop().release()
        assert box.freeze() is not None


def test_close_frees_every_process():
    box = Sandbox()
    box.thaw(box.base)
    frozen = [box.freeze() for _ in range(3)]
    keeper = box._keeper.pid
    assert box.process_count() == 5
    box.close()
    assert not os.path.exists(f"/proc/{keeper}")
    assert all(f.released for f in frozen)


WRITE_ROUTES = [
    "open('t.txt', 'a').write('+a')",
    "os.truncate('big.bin', 10)",
    "os.chmod('t.txt', 0o600)",
    "held.write('y'); held.flush()",
    "fd = os.open('t.txt', os.O_RDWR); os.write(fd, b'ZZ'); os.close(fd)",
    # the routes that once reached a sibling's snapshot through a hard-linked inode
    "os.symlink(os.path.abspath('t.txt'), 'link'); open('link', 'w').write('via link')",
    "os.symlink('big.bin', 'blink'); os.truncate('blink', 3)",
    "ro = open('t.txt'); open(f'/proc/self/fd/{ro.fileno()}', 'w').write('via proc fd')",
    "d = os.open('sub', os.O_RDONLY); f = os.open('s.txt', os.O_WRONLY | os.O_TRUNC, dir_fd=d); os.write(f, b'dirfd')",
    "os.symlink('t.txt', 'clink'); os.chmod('clink', 0o600)",
    "os.rename('t.txt', 'moved.txt'); open('moved.txt', 'w').write('renamed')",
    "os.link('t.txt', 'hard'); open('hard', 'w').write('via hard link')",
    "import mmap; m = mmap.mmap(os.open('big.bin', os.O_RDWR), 10, flags=mmap.MAP_PRIVATE); m[:1] = b'Z'",
    "held_sub.seek(0); held_sub.write('moved the shared offset'); held_sub.flush()",
]


@pytest.mark.parametrize("change", WRITE_ROUTES)
def test_every_write_route_stays_in_its_branch(fresh, change):
    """A frozen copy's files are its own (the keeper copies them): no write route of one branch, through
    a name, a link, a descriptor, a dir fd or a map, reaches the snapshot or a sibling branch."""
    fresh.run("import os\nopen('big.bin', 'wb').write(b'a' * 1_000_000)\nopen('t.txt', 'w').write('orig')\n"
              "held = open('held.txt', 'a')\nheld.write('x'); held.flush()\nos.mkdir('sub')\n"
              "open('sub/s.txt', 'w').write('s')\nheld_sub = open('sub/s.txt', 'r+')")
    frozen = fresh.freeze()
    probe = ("(os.path.getsize('big.bin'), open('t.txt').read(), oct(os.stat('t.txt').st_mode & 0o777),"
             " open('held.txt').read(), open('sub/s.txt').read(), held_sub.tell(), sorted(os.listdir('.')))")
    expected = fresh.run(probe).output.strip()
    for _ in range(2):  # the branch, then a sibling from the same snapshot
        fresh.thaw(frozen)
        result = fresh.run(change)
        assert result.ok, (change, result.output)
        fresh.thaw(frozen)
        assert fresh.run(probe).output.strip() == expected, change
    frozen.release()


def test_files_keep_their_absolute_paths_and_links_across_branches(fresh):
    """Every live interpreter sees its files at one path, so absolute paths and symlinks taken before
    a snapshot mean the branch's own files after it; hard links inside the work dir stay links."""
    fresh.run("import os\npath = os.path.abspath('a.txt'); open(path, 'w').write('a')\n"
              "os.symlink(path, 'abs_link'); os.link('a.txt', 'twin')")
    frozen = fresh.freeze()
    fresh.thaw(frozen)
    out = fresh.run("open(path, 'a').write('+'); (open('abs_link').read(), open('twin').read(), "
                    "os.stat('twin').st_nlink, os.getcwd() == os.path.dirname(path))").output.strip()
    assert out == "('a+', 'a+', 2, True)"
    fresh.thaw(frozen)
    assert fresh.run("open(path).read()").output.strip() == "'a'"
    frozen.release()


def test_a_branchs_share_of_the_snapshot_store_defaults_to_half_and_never_exceeds_it():
    assert SandboxConfig().branch_share == (512, 524_288)
    assert SandboxConfig(snapshot_disk_mb=64, snapshot_inodes=8192).branch_share == (32, 4096)
    assert SandboxConfig(snapshot_branch_mb=100, snapshot_branch_entries=7).branch_share == (100, 7)
    for bad in ({"snapshot_branch_mb": 2048}, {"snapshot_branch_mb": 0}, {"snapshot_branch_entries": 2_000_000}):
        with pytest.raises(ValueError, match="snapshot_branch"):
            SandboxConfig(**bad)
