"""The hostile suites rerun as a user with no privileges at all (used by
``test_kernel_boundary.test_hostile_suite_holds_as_an_unprivileged_user``).

The rerun is one pytest process under a user made for the test (:data:`TEST_USER`), started by
``tests/envs/conftest.py`` as soon as collection shows the test is selected, so that it runs on the second
core beside the rest of the suite (one pytest process keeps about 0.8 of a core busy: ``/usr/bin/time make
test`` reports 81% CPU on the 2-core machine); the test waits for it and checks its outcome. It runs at
``nice 10`` so that the timing-bound tests of the in-process suite keep their priority. Both runs start
sandboxes at once, as two hosts on one machine do: each host user keeps its own state directory and uid
claims (``trace_envs.python_tool._host``).

The interpreter's own files may sit under a dir other users cannot enter (/root/.pyenv), and so may the
checkout (a clone in a ``mktemp -d`` dir): a private mount namespace shows only those files to the test user
(as the sandbox's own ``expose_python`` does for its uid); nothing else of the host changes.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[2]
TEST_USER = "trace-gym-tester"
TEST_NAME = "test_hostile_suite_holds_as_an_unprivileged_user"
SUITES = ("tests/envs/test_kernel_boundary.py", "tests/envs/test_python_sandbox.py", "tests/envs/test_hostile.py",
          "tests/envs/test_snapshot_hostile.py", "tests/envs/test_bfcl_hostile.py",
          "tests/agent/test_rundir_hostile.py", "tests/agent/test_user_files_hostile.py",
          "tests/retrievers/test_server_hostile.py", "tests/retrievers/test_server_fairness.py")
TIMEOUT_S = 900


def skip_reason() -> str | None:
    """Why the rerun cannot happen here, or None."""
    if os.geteuid() != 0:
        return "this run already is an ordinary user's"
    if shutil.which("setpriv") is None or shutil.which("unshare") is None:
        return "needs util-linux's setpriv and unshare"
    return None


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


@dataclass
class Outcome:
    """How the rerun ended: pytest's exit code (None: stopped at :data:`TIMEOUT_S`) and its output's tail."""

    returncode: int | None
    tail: str


class Rerun:
    """The rerun, running in the background from its construction until :meth:`wait` or :meth:`stop`."""

    def __init__(self) -> None:
        uid = _ensure_test_user()
        self.base = tempfile.mkdtemp(prefix="trace-gym-nonroot-")
        os.chown(self.base, uid, uid)
        exposes = _expose_commands([sys.base_prefix, sys.prefix, str(PROJECT)], self.base)
        pytest_cmd = (f"cd {shlex.quote(str(PROJECT))} && setpriv --reuid={uid} --regid={uid} --clear-groups "
                      f"env HOME={self.base} TMPDIR={self.base} PYTHONDONTWRITEBYTECODE=1 {sys.executable} -m pytest "
                      f"-q -x -p no:cacheprovider --basetemp={self.base}/pytest {' '.join(SUITES)}")
        self._log = tempfile.TemporaryFile(mode="w+")
        self._proc = subprocess.Popen(
            ["nice", "-n", "10", "unshare", "--mount", "--propagation", "private", "sh", "-c",
             " && ".join([*exposes, pytest_cmd])],
            stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True)
        self._deadline = time.monotonic() + TIMEOUT_S
        self._outcome: Outcome | None = None

    def wait(self) -> Outcome:
        """Waits for the rerun (at most until :data:`TIMEOUT_S` after its start) and cleans up after it."""
        if self._outcome is None:
            try:
                code: int | None = self._proc.wait(timeout=max(0.0, self._deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                code = None
            self._finish(code)
        assert self._outcome is not None
        return self._outcome

    def stop(self) -> None:
        """Ends the rerun if it still runs (the session ended without waiting for it) and cleans up."""
        if self._outcome is None:
            self._finish(None)

    def _finish(self, code: int | None) -> None:
        if self._proc.poll() is None:  # SIGINT first: pytest's KeyboardInterrupt closes the sandboxes its tests hold
            for signum, grace in ((signal.SIGINT, 30.0), (signal.SIGKILL, None)):
                try:
                    os.killpg(self._proc.pid, signum)
                except ProcessLookupError:
                    break
                try:
                    self._proc.wait(timeout=grace)
                    break
                except subprocess.TimeoutExpired:
                    continue
        self._log.seek(0)
        tail = self._log.read()[-3000:]
        self._log.close()
        # the JVM of the Lucene tests keeps its perf data in /tmp/hsperfdata_<user> whatever TMPDIR says
        subprocess.run(["rm", "-rf", self.base, f"/tmp/hsperfdata_{TEST_USER}"], check=False)
        self._outcome = Outcome(code, tail)
