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
import shlex
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from trace_envs.python_tool.sandbox import REQUIRED_LAYERS, Sandbox, SandboxConfig, SandboxCrashed

pytestmark = pytest.mark.hostile

ROOT = os.geteuid() == 0
PROJECT = Path(__file__).resolve().parents[2]
TEST_USER = "trace-gym-tester"

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


def _closed_dirs_on_the_way(path: str) -> list[str]:
    """``path`` and its ancestors that other users cannot traverse (/root holding ~/.pyenv, a checkout in a
    ``mktemp -d`` dir)."""
    parts, current, closed = Path(path).resolve().parts[1:], "/", []
    for part in parts:
        current = os.path.join(current, part)
        if not os.stat(current).st_mode & 0o001:
            closed.append(current)
    return closed


def _expose_commands(targets: list[str], stage_root: str) -> list[str]:
    """Shell commands (run as root in a private mount namespace) that let any user reach ``targets``.

    Each closed dir on the way is covered by a 0755 tmpfs into which the entries on the way are bind-mounted
    back from a staged view of it (every entry, where the closed dir is a target itself); what is not on the
    way stays out of sight, and what is exposed keeps its own modes.
    """
    resolved = [Path(t).resolve() for t in targets]
    commands: list[str] = []
    for number, top in enumerate(sorted({d for t in resolved for d in _closed_dirs_on_the_way(str(t))})):
        needed = set()
        for target in resolved:
            if target == Path(top):
                needed.update(os.listdir(top))
            elif target.is_relative_to(top):
                needed.add(target.relative_to(top).parts[0])
        stage, quoted = f"{stage_root}/.stage{number}", shlex.quote(top)
        commands.append(f"mkdir -p {shlex.quote(stage)} && mount --bind {quoted} {shlex.quote(stage)} && "
                        f"mount -t tmpfs -o mode=0755 tmpfs {quoted}")
        for name in sorted(needed):
            make = "mkdir -p" if os.path.isdir(os.path.join(top, name)) else "touch"
            commands.append(f"{make} {shlex.quote(f'{top}/{name}')} && "
                            f"mount --bind {shlex.quote(f'{stage}/{name}')} {shlex.quote(f'{top}/{name}')}")
    return commands


def _ensure_test_user() -> int:
    import pwd

    try:
        return pwd.getpwnam(TEST_USER).pw_uid
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", TEST_USER],
                       check=True, capture_output=True)
        return pwd.getpwnam(TEST_USER).pw_uid


@pytest.mark.skipif(not ROOT, reason="this run already is an ordinary user's")
@pytest.mark.skipif(shutil.which("setpriv") is None or shutil.which("unshare") is None,
                    reason="needs util-linux's setpriv and unshare")
def test_hostile_suite_holds_as_an_unprivileged_user():
    """The kernel-boundary, sandbox, snapshot, BFCL, run-dir, user-file and retrieval-server (fairness too) hostile
    suites pass for a user with no privileges at all.

    The interpreter's own files may sit under a dir other users cannot enter (/root/.pyenv), and so may the
    checkout (a clone in a ``mktemp -d`` dir): a private mount namespace shows only those files to the test
    user (as the sandbox's own ``expose_python`` does for its uid), nothing else of the host changes.
    """
    uid = _ensure_test_user()
    base = tempfile.mkdtemp(prefix="trace-gym-nonroot-")
    os.chown(base, uid, uid)
    exposes = _expose_commands([sys.base_prefix, sys.prefix, str(PROJECT)], base)
    suites = ["tests/envs/test_kernel_boundary.py", "tests/envs/test_python_sandbox.py", "tests/envs/test_hostile.py",
              "tests/envs/test_snapshot_hostile.py",
              "tests/envs/test_bfcl_hostile.py", "tests/agent/test_rundir_hostile.py",
              "tests/agent/test_user_files_hostile.py",
              "tests/retrievers/test_server_hostile.py", "tests/retrievers/test_server_fairness.py"]
    pytest_cmd = (f"cd {PROJECT} && setpriv --reuid={uid} --regid={uid} --clear-groups env HOME={base} "
                  f"TMPDIR={base} PYTHONDONTWRITEBYTECODE=1 {sys.executable} -m pytest -q -x -p no:cacheprovider "
                  f"--basetemp={base}/pytest {' '.join(suites)}")
    script = " && ".join([*exposes, pytest_cmd])
    try:
        proc = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
                              capture_output=True, text=True, timeout=900)
    finally:
        # the JVM of the Lucene tests keeps its perf data in /tmp/hsperfdata_<user> whatever TMPDIR says
        subprocess.run(["rm", "-rf", base, f"/tmp/hsperfdata_{TEST_USER}"], check=False)
    tail = (proc.stdout + proc.stderr)[-3000:]
    assert proc.returncode == 0, tail
    assert " passed" in tail and "failed" not in tail, tail


def test_time_budget_of_a_cell_survives_a_replaced_alarm(bypassed):
    """Model code replaced the cell's alarm handler (as the bypass does): the host still ends the cell."""
    start = time.monotonic()
    try:
        result = bypassed.run("signal.signal(signal.SIGALRM, signal.SIG_IGN)\nwhile True:\n    pass")
        assert not result.ok and "exceeded" in result.output  # the CPU limit ended it
    except SandboxCrashed:
        pass  # the host's wall-clock limit ended it
    assert time.monotonic() - start < bypassed.config.timeout_s + bypassed.config.kill_grace_s + 3
