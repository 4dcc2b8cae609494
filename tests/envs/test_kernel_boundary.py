"""The kernel, not the audit hook, holds the sandbox: every case runs with the guard already bypassed.

Each test first takes the route around the audit hook that model code has (a signal handler's
frame argument leads to the server's own frames and so to the object that holds the guard's
permits), then does what the guard would have refused. What must stop it is a kernel layer:
seccomp (exec, signals, sockets, pipes, shared writable maps), Landlock (files outside the live
work dir, the snapshot store), the mount namespace (read-only mounts, a private tmpfs with a
quota) and the host killing every process a cell started.

The same file runs as root (the in-process run) and as an ordinary user
(:func:`test_hostile_suite_holds_as_an_unprivileged_user` reruns it, with the other sandbox
suites, as a user made for the test).
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.envs import unprivileged
from trace_envs.python_tool.sandbox import REQUIRED_LAYERS, Sandbox, SandboxConfig, SandboxCrashed

pytestmark = pytest.mark.hostile

ROOT = os.geteuid() == 0

# Reaches the server's Runtime through a signal handler's frame (no audit event on f_back/f_locals).
BYPASS = textwrap.dedent("""
    import signal, time
    _box = {}
    def _grab(signum, frame):
        f = frame
        while f is not None:
            loc = f.f_locals
            if 'self' in loc and hasattr(loc['self'], 'permit'):
                _box['rt'] = loc['self']
                break
            f = f.f_back
    signal.signal(signal.SIGALRM, _grab)
    signal.setitimer(signal.ITIMER_REAL, 0.02)
    _t = time.time()
    while 'rt' not in _box and time.time() - _t < 3:
        pass
    rt = _box['rt']
    type(rt).__name__
""")


@pytest.fixture(scope="module")
def box():
    sandbox = Sandbox(SandboxConfig(timeout_s=4.0, kill_grace_s=1.0, cpu_s=3, disk_mb=64, output_chars=4000,
                                    preload=()))
    yield sandbox
    sandbox.close()


@pytest.fixture
def bypassed(box):
    """A fresh live interpreter in which model code holds the guard's permits."""
    box.thaw(box.base)
    result = box.run(BYPASS)
    assert result.ok and result.output.strip() == "'Runtime'", result.output
    return box


def errno_of(box: Sandbox, code: str) -> int | None:
    """Run ``code`` (which sets ``err``) and return the errno it recorded, None when nothing failed."""
    out = box.run("err = None\ntry:\n" + textwrap.indent(code, "    ") + "\nexcept OSError as exc:\n"
                  "    err = exc.errno\nerr").output.strip()
    return None if out in ("", "None") else int(out)


def test_every_required_layer_holds_here(box):
    assert set(box.layers_held) == set(REQUIRED_LAYERS), box.isolation
    assert any(layer.startswith("landlock") for layer in box.isolation)
    assert any(layer.startswith("seccomp") for layer in box.isolation)
    assert not ROOT or any(layer.startswith("uid-drop") for layer in box.isolation)
    assert ROOT or any(layer.startswith("user-namespace") for layer in box.isolation)


def test_allow_weaker_names_only_real_layers():
    with pytest.raises(ValueError, match="unknown layer"):
        SandboxConfig(allow_weaker=("landlok",))
    assert "landlock" not in SandboxConfig(allow_weaker=("landlock",)).required_layers
    assert "network" not in SandboxConfig(network_namespace=False).required_layers


def test_no_program_can_be_executed(bypassed):
    assert errno_of(bypassed, "rt.permit('os.exec')\nos_ = __import__('os')\n"
                              "os_.execv('/bin/sh', ['sh', '-c', 'true'])") == errno.EPERM
    # a forked child, with no guard at all on its path, cannot start a shell either
    out = bypassed.run("import os\nrt.permit('os.fork')\npid = os.fork()\nif pid == 0:\n"
                       "    try:\n        rt.permit('os.exec')\n        os.execv('/bin/sh', ['sh', '-c', 'true'])\n"
                       "    except OSError as exc:\n        open('exec.txt', 'w').write(str(exc.errno))\n"
                       "    os._exit(0)\nimport time\nfor _ in range(200):\n"
                       "    if os.path.exists('exec.txt') and open('exec.txt').read():\n        break\n"
                       "    time.sleep(0.01)\nopen('exec.txt').read()").output.strip()
    assert out == f"'{errno.EPERM}'"


def test_no_write_outside_the_live_work_dir(bypassed, tmp_path):
    target = tmp_path / "outside.txt"
    os.chmod(tmp_path, 0o777)
    for path in (str(target), "/tmp/trace-gym-escape", f"{bypassed.root}/snaps/x", f"{bypassed.root}/x"):
        err = errno_of(bypassed, f"rt.permit('open')\nopen({path!r}, 'w').write('x')")
        assert err in (errno.EACCES, errno.EROFS, errno.EPERM, errno.ENOENT), (path, err)
    assert not target.exists() and not os.path.exists("/tmp/trace-gym-escape")


def test_snapshot_store_and_host_files_are_unreadable(bypassed, tmp_path):
    frozen = bypassed.freeze()
    secret = tmp_path / "secret.txt"
    secret.write_text("host secret")
    os.chmod(tmp_path, 0o755)
    os.chmod(secret, 0o644)
    assert errno_of(bypassed, f"open({str(secret)!r}).read()") in (errno.EACCES, errno.ENOENT)
    assert errno_of(bypassed, f"__import__('os').listdir({bypassed.root + '/snaps'!r})") in (
        errno.EACCES, errno.ENOENT)
    frozen.release()


def test_other_envs_work_dirs_are_out_of_reach(bypassed):
    other = Sandbox(SandboxConfig(timeout_s=4.0, preload=()))
    try:
        other.thaw(other.base)
        other.run("open('mine.txt', 'w').write('env B')")
        theirs = other.root + "/live/mine.txt"
        assert errno_of(bypassed, f"open({theirs!r}).read()") in (errno.EACCES, errno.ENOENT)
        assert errno_of(bypassed, f"rt.permit('open')\nopen({theirs!r}, 'w')") in (
            errno.EACCES, errno.ENOENT, errno.EROFS)
        assert other.run("open('mine.txt').read()").output.strip() == "'env B'"
    finally:
        other.close()


def test_the_host_and_its_processes_cannot_be_signalled(bypassed):
    victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        for pid in (os.getpid(), victim.pid, bypassed._keeper.pid):
            assert errno_of(bypassed, f"rt.permit('os.kill')\n__import__('os').kill({pid}, 9)") == errno.EPERM
            assert errno_of(bypassed, f"rt.permit('os.pidfd_open')\n__import__('os').pidfd_open({pid})") == errno.EPERM
        assert victim.poll() is None and bypassed._keeper.poll() is None
    finally:
        victim.kill()
        victim.wait()


def test_no_sockets_pipes_or_shared_writable_memory(bypassed):
    assert errno_of(bypassed, "import _socket\nrt.permit('socket.__new__')\n_socket.socket()") == errno.EPERM
    assert errno_of(bypassed, "__import__('os').pipe()") == errno.EPERM
    assert errno_of(bypassed, "import mmap\nmmap.mmap(-1, 4096)") == errno.EPERM  # MAP_SHARED by default
    assert errno_of(bypassed, "import mmap\nmmap.mmap(-1, 4096, flags=mmap.MAP_PRIVATE)") is None


def test_disk_quota_holds(bypassed):
    out = bypassed.run("written = 0\ntry:\n    with open('fill.bin', 'wb') as fh:\n"
                       "        for _ in range(100):\n            fh.write(b'0' * (4 << 20)); written += 4\n"
                       "except OSError as exc:\n    err = exc.errno\nerr, written").output.strip()
    err, written = out.strip("()").split(", ")
    assert int(err) in (errno.ENOSPC, errno.EFBIG) and int(written) <= 64
    assert os.listdir(bypassed.root) == []  # the host's view of the mount point holds nothing


def test_a_cells_processes_end_with_the_cell(bypassed):
    """setsid'd, double-forked CPU burners: gone when the cell returns, and none counts against a sibling."""
    frozen = bypassed.freeze()
    interpreters = bypassed.process_count()
    spawn = ("import os\nfor _ in range(20):\n    rt.permit('os.fork')\n    if os.fork() == 0:\n"
             "        os.setsid()\n        rt.permit('os.fork')\n        if os.fork() == 0:\n"
             "            while True:\n                pass\n        os._exit(0)\nlen(os.listdir('/proc'))")
    assert bypassed.run(spawn).ok
    deadline = time.monotonic() + 5  # SIGKILLed processes may take a moment to exit
    while bypassed.process_count() > interpreters and time.monotonic() < deadline:
        time.sleep(0.02)
    assert bypassed.process_count() == interpreters
    bypassed.thaw(frozen)  # a sibling branch starts without a restart
    assert bypassed.restarts == 0 and bypassed.run("rt is not None").output.strip() == "True"
    frozen.release()


def test_process_cap_holds_for_every_user(bypassed):
    limits = Path(f"/proc/{bypassed.live_pid}/limits").read_text()
    line = next(x for x in limits.splitlines() if x.startswith("Max processes"))
    assert line.split()[2] == str(bypassed.config.max_processes)


@pytest.mark.skipif(unprivileged.skip_reason() is not None, reason=str(unprivileged.skip_reason()))
def test_hostile_suite_holds_as_an_unprivileged_user(unprivileged_rerun):
    """The kernel-boundary, sandbox, snapshot, BFCL, run-dir, user-file and retrieval-server (fairness too) hostile
    suites pass for a user with no privileges at all (``tests/envs/unprivileged.py``: how, and why it runs beside
    the rest of the suite)."""
    outcome = unprivileged_rerun.wait()
    assert outcome.returncode == 0, outcome.tail or f"stopped after {unprivileged.TIMEOUT_S} s"
    assert " passed" in outcome.tail and "failed" not in outcome.tail, outcome.tail


def test_time_budget_of_a_cell_survives_a_replaced_alarm(bypassed):
    """Model code replaced the cell's alarm handler (as the bypass does): the host still ends the cell."""
    start = time.monotonic()
    try:
        result = bypassed.run("signal.signal(signal.SIGALRM, signal.SIG_IGN)\nwhile True:\n    pass")
        assert not result.ok and "exceeded" in result.output  # the CPU limit ended it
    except SandboxCrashed:
        pass  # the host's wall-clock limit ended it
    assert time.monotonic() - start < bypassed.config.timeout_s + bypassed.config.kill_grace_s + 3
