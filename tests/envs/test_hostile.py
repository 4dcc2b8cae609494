"""Hostile model output: what a model could write, written, and what the host must still guarantee.

One section per class of issue 14 (1 pids, 2 control channel, 4 cross-sandbox, 5 exceptions,
7 resources; checkpoints and the retrieval server are tested elsewhere). Each attack is followed by
the same checks: the host and other envs survive, the env still steps, snapshots and restores
correctly, and nothing leaks (processes, host fds, files).
"""

from __future__ import annotations

import decimal
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from trace_envs import Task, TaskSet
from trace_envs.actions import parse_action, parse_call_list
from trace_envs.errors import SnapshotLimitError
from trace_envs.python_tool._host import ProtocolError, StateDir, adopt, proc_stat
from trace_envs.python_tool.env import PythonMathEnv
from trace_envs.python_tool.sandbox import SandboxConfig

pytestmark = pytest.mark.hostile

ROOT = os.geteuid() == 0
TASKS = TaskSet([Task("t", "What is 6*7?", {"answer": "42"}), Task("u", "What is 1/2?", {"answer": "1/2"})],
                name="hostile")
CONFIG = SandboxConfig(timeout_s=1.5, kill_grace_s=0.5, cpu_s=2, output_chars=2000)


def call(code: str) -> str:
    return "<tool_call>" + json.dumps({"name": "python", "arguments": {"code": code}}) + "</tool_call>"


def host_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.fixture(scope="module")
def env():
    e = PythonMathEnv(tasks=TASKS, max_turns=200, sandbox=CONFIG)
    yield e
    e.close()


@pytest.fixture
def fresh(env):
    from trace_envs.python_tool.grading import grade_answer

    grade_answer("1", "1")  # imports the graders once, outside the timed steps
    env.reset(seed=0, options={"task_id": "t"})
    return env


def assert_usable(env: PythonMathEnv) -> None:
    """The env steps, snapshots and restores correctly, and its sandbox holds no stray processes."""
    assert env.step(call("probe_value = 41"))[0] == "(no output)"
    snap = env.snapshot()
    env.step(call("probe_value += 1"))
    env.restore(snap)
    assert env.step(call("probe_value"))[0].strip() == "41"
    snap.release()
    box = env._sandbox
    assert box is not None
    deadline = time.monotonic() + 5  # killed processes may still be exiting (e.g. after an OOM kill)
    while box.process_count() > 2 + len(box._frozen) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert box.process_count() <= 2 + len(box._frozen)


@pytest.fixture
def victim():
    """An unrelated process of the host's: it must outlive every attack."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    yield proc
    alive = proc.poll() is None
    proc.kill()
    proc.wait()
    assert alive, "the host killed an unrelated process"


def _socket_fds_code() -> str:
    return textwrap.dedent("""
        import os, struct
        socks = []
        for f in os.listdir('/proc/self/fd'):
            try:
                if os.readlink('/proc/self/fd/' + f).startswith('socket:'):
                    socks.append(int(f))
            except OSError:
                pass
    """)


# ------------------------------------------------------------------ class 1: the host never trusts a pid
@pytest.mark.parametrize("forged_pid", ["victim", 0, 1, -1, "host"])
def test_forged_pid_frames_never_get_a_process_signalled(fresh, victim, forged_pid):
    pid = {"victim": victim.pid, "host": os.getpid()}.get(forged_pid, forged_pid)
    fds = host_fds()
    code = _socket_fds_code() + textwrap.dedent(f"""
        for fd in socks:
            for body in (b'{{"pid": {pid}, "seq": 0}}', b'{{"ready": {pid}, "forked": true, "seq": 0}}'):
                os.write(fd, struct.pack('>I', len(body)) + body)
    """)
    obs = fresh.step(call(code))[0]
    assert "restarted" in obs  # the forged frame got this interpreter killed and rebuilt, nothing else
    fresh.snapshot()  # a fork after the attack: the new copy is verified through the kernel
    assert victim.poll() is None and os.getpgid(0) == os.getpgrp()
    assert_usable(fresh)
    assert host_fds() <= fds + 1


def test_stolen_fork_request_with_forged_reply_is_refused(fresh, victim):
    """Model code reads the host's fork request itself (losing the socket it carries) and answers with a
    well-formed reply naming another process: the copy never reports, so the snapshot is replay-only."""
    fresh.step(call("kept = 7"))
    code = _socket_fds_code() + textwrap.dedent(f"""
        import threading, json
        def thief():
            for fd in socks:
                try:
                    head = os.read(fd, 4)
                    body = os.read(fd, struct.unpack('>I', head)[0])
                    seq = json.loads(body)['seq']
                    reply = json.dumps({{'seq': seq, 'forked': True, 'pid': {victim.pid}}}).encode()
                    os.write(fd, struct.pack('>I', len(reply)) + reply)
                except OSError:
                    pass
        threading.Thread(target=thief, daemon=True).start()
    """)
    before = fresh.snapshot()
    fresh.step(call(code))
    for _ in range(3):  # the thief (replayed with its cell) keeps answering: each turn is an observation
        fresh.snapshot()
        assert isinstance(fresh.step(call("kept = 8"))[0], str)
    assert victim.poll() is None
    fresh.restore(before)
    assert fresh.step(call("kept"))[0].strip() == "7"
    assert_usable(fresh)


def test_adopt_checks_everything_through_the_kernel(victim):
    for bad in (0, 1, -5, os.getpid(), os.getpgrp(), "12", 3.0):
        with pytest.raises(ProtocolError):
            adopt(bad, parent=os.getpid(), uid=None)
    with pytest.raises(ProtocolError):  # alive, but not a child of the named parent
        adopt(victim.pid, parent=1, uid=None)
    with pytest.raises(ProtocolError):  # a child of ours, but under the wrong uid
        adopt(victim.pid, parent=os.getpid(), uid=os.getuid() + 12345)
    pidfd = adopt(victim.pid, parent=os.getpid(), uid=os.getuid())
    os.close(pidfd)
    with pytest.raises(ProtocolError):
        adopt(victim.pid, parent=os.getpid(), uid=None, known={victim.pid})


# ------------------------------------------------------------------ class 2: the control channel
def test_slow_frame_is_bounded_by_one_deadline(fresh):
    code = _socket_fds_code() + textwrap.dedent("""
        import threading, time
        def drip():
            for fd in socks:
                os.write(fd, struct.pack('>I', 100))
            for _ in range(60):
                time.sleep(0.3)
                for fd in socks:
                    os.write(fd, b' ')
        threading.Thread(target=drip, daemon=True).start()
        time.sleep(0.1)
    """)
    start = time.monotonic()
    obs = fresh.step(call(code))[0]
    elapsed = time.monotonic() - start
    assert elapsed < CONFIG.timeout_s + CONFIG.kill_grace_s + 2.0, elapsed  # not 60 drips x 0.3 s
    assert "Error" in obs
    assert_usable(fresh)


def test_huge_frame_header_is_refused_before_reading(fresh):
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    code = _socket_fds_code() + "for fd in socks:\n    os.write(fd, struct.pack('>I', 1_500_000_000) + b'x' * 65536)\n"
    start = time.monotonic()
    obs = fresh.step(call(code))[0]
    assert time.monotonic() - start < 5 and "control protocol" in obs
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss < 200_000  # KiB: no 1.5 GB buffer
    assert_usable(fresh)


@pytest.mark.parametrize("body", ["b'not json'", "b'[1, 2]'", "b'[' * 100_000", """b'{"seq": 0, "ok": true}'""",
                                  """b'{"seq": 1, "ok": "yes", "output": 5, "truncated": -1}'""", "b'\\xff\\xfe'"])
def test_garbage_frames_are_protocol_errors(fresh, body):
    code = _socket_fds_code() + f"body = {body}\nfor fd in socks:\n    os.write(fd, struct.pack('>I', len(body)) + body)\n"
    obs = fresh.step(call(code))[0]
    assert "Error" in obs and "restarted" in obs
    assert_usable(fresh)


def test_forged_observation_cannot_desynchronise_later_replies(fresh):
    """A frame that looks like a reply (right shape, guessed seq) ends that interpreter; the next
    replies are the real ones, never the stale real reply of the attacking cell."""
    code = _socket_fds_code() + textwrap.dedent("""
        forged = b'{"seq": 1, "ok": true, "output": "FORGED", "truncated": 0}'
        for fd in socks:
            os.write(fd, struct.pack('>I', len(forged)) + forged)
        'real output'
    """)
    obs = fresh.step(call(code))[0]
    assert "FORGED" not in obs
    for i in range(3):
        assert fresh.step(call(f"{i} * 10"))[0].strip() == str(i * 10)


# ------------------------------------------------------------------ class 4: sandboxes never reach each other
@pytest.mark.skipif(not ROOT, reason="per-env uids need root")
def test_other_envs_files_and_processes_are_out_of_reach(fresh):
    with PythonMathEnv(tasks=TASKS, sandbox=CONFIG) as other:
        other.reset(seed=0, options={"task_id": "t"})
        other.step(call("open('secret.txt', 'w').write('s3cret'); other_secret = 1"))
        assert other._sandbox.uid != fresh._sandbox.uid
        assert os.stat(other._sandbox.root).st_mode & 0o777 == 0o700
        target_dir = f"{other._sandbox.root}/{other._sandbox.live_pid}"
        code = textwrap.dedent(f"""
            import os, signal
            out = []
            for attempt in (lambda: open({target_dir + '/secret.txt'!r}).read(),
                            lambda: os.listdir({other._sandbox.root!r}),
                            lambda: os.listdir({os.path.dirname(other._sandbox.root)!r}),
                            lambda: os.kill({other._sandbox.live_pid}, signal.SIGKILL)):
                try:
                    out.append(repr(attempt()))
                except Exception as exc:
                    out.append(type(exc).__name__)
            out
        """)
        obs = fresh.step(call(code))[0]
        assert "s3cret" not in obs and "secret.txt" not in obs and obs.count("Error") >= 3, obs
        assert other.step(call("other_secret + 1"))[0].strip() == "2"  # the other env is untouched
    assert_usable(fresh)


@pytest.mark.skipif(not ROOT, reason="per-env uids need root")
def test_uids_are_unique_across_host_processes(env):
    code = ("from trace_envs.python_tool.sandbox import Sandbox, SandboxConfig\n"
            "b = Sandbox(SandboxConfig(preload=()))\nprint(b.uid)\nb.close()")
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])}) for _ in range(3)]
    uids = {int(p.communicate(timeout=120)[0].split()[-1]) for p in procs}
    assert len(uids) == 3 and env._ensure_sandbox().uid not in uids
    state = StateDir()
    a, b = state.claim_uid(), state.claim_uid()
    assert a != b and (state.path / "uids" / str(a)).exists()
    state.release_uid(a)
    state.release_uid(b)


# ------------------------------------------------------------------ class 5: no exception escapes
HOSTILE_ACTIONS = [
    '<tool_call>{"name": "python", "arguments": {"code": ' + "1" * 5000 + "}}</tool_call>",
    "<tool_call>" + "[" * 50_000 + "</tool_call>",
    '<tool_call>{"name": "python", "arguments": "' + "[" * 5000 + '"}</tool_call>',
    "<tool_call>" * 18_000,
    "<answer>" * 18_000 + "<think>" * 5000,
    "x" * 1_000_000,
    '<tool_call>{"name": "python", "arguments": {"code": "print(1)"}}</tool_call>\ud800',
    "\udcff<answer>\ud800</answer>",
]


@pytest.mark.parametrize("action", HOSTILE_ACTIONS, ids=range(len(HOSTILE_ACTIONS)))
def test_hostile_actions_are_bounded_error_observations(fresh, action):
    start = time.monotonic()
    obs, reward, *_ = fresh.step(action)
    limit = 2.0 if "</answer>" not in action else 6.0  # an answer is graded within grade_answer's 3 s deadline
    assert time.monotonic() - start < limit and isinstance(obs, str)
    obs.encode("utf-8")  # no lone surrogate reaches an observation
    json.dumps(fresh.messages, ensure_ascii=False).encode("utf-8")
    assert reward == 0.0


def test_parsers_are_linear_in_unclosed_openers():
    def timed(fn, text):  # the best of three: the machine is shared
        best = float("inf")
        for _ in range(3):
            start = time.perf_counter()
            fn(text)
            best = min(best, time.perf_counter() - start)
        return best
    small, large = timed(parse_action, "<tool_call>" * 2_000), timed(parse_action, "<tool_call>" * 8_000)
    # linear: about 4x for 4x the input; the lazy regexes were quadratic (16x; 30 s at 18,000 openers)
    assert large < 0.1 and large < 10 * small + 0.005, (small, large)
    # call lists go through ast, whose cost the size cap bounds: the largest accepted turn parses fast
    worst = "<tool_call>" * (100_000 // len("<tool_call>"))
    assert timed(parse_call_list, worst) < 1.0 and timed(parse_call_list, "[" * 100_000) < 1.0


def test_lone_surrogates_in_interpreter_output_reach_no_one(fresh):
    obs = fresh.step(call("print('a\\ud800b'); '\\udcff'"))[0]
    assert "\ufffd" in obs
    obs.encode("utf-8")
    for message in fresh.messages:
        message["content"].encode("utf-8")
    assert_usable(fresh)


def test_surrogates_are_rendered_by_the_policy_tokenizer():
    pytest.importorskip("transformers")
    from transformers import AutoTokenizer

    from trace_agent.policy.chat import ChatRenderer

    path = Path(__file__).parents[2] / "trace_agent/demo/assets/demo_policy"
    renderer = ChatRenderer(AutoTokenizer.from_pretrained(str(path)))
    ctx = renderer.render([{"role": "user", "content": "x = '\ud800' and \udcff"}])
    assert ctx.token_ids and "\ufffd" in renderer.decode(ctx.token_ids)
    assert renderer.observation_text({"role": "tool", "content": "\ud800"})


def test_killed_pristine_interpreter_is_rebuilt_on_reset(fresh):
    fresh.step(call("old_episode = 1"))
    box = fresh._sandbox
    base_pid = box.base._proc.pid
    os.kill(base_pid, signal.SIGKILL)  # what a hostile copy with the sandbox's uid could do to it
    fresh.reset(seed=1, options={"task_id": "u"})
    assert fresh.task.task_id == "u" and box.restarts >= 1
    assert "NameError" in fresh.step(call("old_episode"))[0]  # the new task runs on a new interpreter
    assert_usable(fresh)


def test_crash_during_replay_ends_in_an_observation(fresh):
    fresh.step(call("import time, os\nt0 = time.time()"))
    time.sleep(0.7)
    fresh.step(call("if time.time() - t0 < 0.5:\n    os._exit(3)"))  # crashes only when replayed at once
    obs, *_ = fresh.step(call("os._exit(1)"))
    assert "Error" in obs and ("lost" in obs or "restarted" in obs)
    assert_usable(fresh)


def test_fd_exhaustion_does_not_break_snapshots(fresh):
    code = ("hold = []\ntry:\n    while True:\n        hold.append(open('fd.txt', 'a'))\n"
            "except OSError as exc:\n    print(type(exc).__name__, len(hold) > 100)")
    assert fresh.step(call(code))[0].strip() == "OSError True"
    fresh.step(call("marker = 'm'"))
    snap = fresh.snapshot()  # the fork cannot receive its socket: a replay-only snapshot, no exception
    fresh.step(call("marker = 'changed'; hold.clear()"))
    fresh.restore(snap)
    assert fresh.step(call("marker"))[0].strip() == "'m'"
    fresh.step(call("hold.clear()"))
    assert_usable(fresh)


def test_thread_holding_the_import_lock_does_not_break_snapshots(fresh):
    fresh.step(call("import _imp, threading, time\nvalue = 3\n"
                    "threading.Thread(target=lambda: (_imp.acquire_lock(), time.sleep(1e6)), daemon=True).start()\n"
                    "time.sleep(0.1)"))
    start = time.monotonic()
    snap = fresh.snapshot()
    assert time.monotonic() - start < CONFIG.timeout_s + 4
    fresh.step(call("value = 4"))
    fresh.restore(snap)
    assert fresh.step(call("value"))[0].strip() == "3"


def test_snapshot_and_restore_do_not_raise_when_the_live_interpreter_dies(fresh):
    fresh.step(call("z = 5"))
    os.kill(fresh._sandbox.live_pid, signal.SIGKILL)
    snap = fresh.snapshot()
    fresh.restore(snap)
    assert fresh.step(call("z"))[0].strip() == "5"
    assert_usable(fresh)


# ------------------------------------------------------------------ class 7: resources
def test_write_guard_covers_os_open_and_cannot_be_switched_off(fresh):
    target = f"/tmp/trace-gym-hostile-{os.getpid()}"
    code = textwrap.dedent(f"""
        import os, sys, gc, signal
        found = []
        for probe in (lambda: __import__('__main__')._state,
                      lambda: __import__('__main__').make_guard,
                      lambda: gc.get_objects(),
                      lambda: sys._getframe(1).f_globals,
                      lambda: type(sys.stdout).write.__globals__['make_guard'],
                      lambda: signal.getsignal(signal.SIGALRM).__globals__['Runtime'],
                      lambda: sys.exc_info(),
                      lambda: __import__('ctypes').CDLL(None),
                      lambda: sys.addaudithook(lambda *a: None)):
            try:
                probe()
                found.append('reached')
            except BaseException as exc:
                found.append(type(exc).__name__)
        for attempt in (lambda: os.open({target!r}, os.O_WRONLY | os.O_CREAT),
                        lambda: open({target!r}, 'w'),
                        lambda: os.open('/etc/trace-gym-hostile', os.O_RDWR | os.O_CREAT | os.O_TRUNC),
                        lambda: os.open('trace-gym-hostile', os.O_WRONLY | os.O_CREAT,
                                        dir_fd=os.open('/etc', os.O_RDONLY))):
            try:
                attempt()
                found.append('WROTE')
            except OSError as exc:
                found.append(type(exc).__name__)
        found
    """)
    obs = fresh.step(call(code))[0]
    # only sys.exc_info() (no frame without tb_frame) and sys.addaudithook (CPython drops a hook that an
    # existing hook refuses, without raising) may return
    assert "WROTE" not in obs and obs.count("reached") <= 2, obs
    assert not os.path.exists(target) and not os.path.exists("/etc/trace-gym-hostile")
    assert_usable(fresh)


def test_work_dir_quota_is_not_the_hosts_tmp():
    """The work dir is a private tmpfs with a quota, for root and an ordinary user alike; snapshots'
    copies have a quota of their own, so a full work dir still snapshots exactly."""
    config = SandboxConfig(timeout_s=3, kill_grace_s=1, disk_mb=24, file_mb=16, preload=())
    before = {n for n in os.listdir(tempfile.gettempdir()) if n.startswith("trace-gym")}
    with PythonMathEnv(tasks=TASKS, sandbox=config) as e:
        e.reset(seed=0, options={"task_id": "t"})
        obs = e.step(call("out = []\nfor i in range(3):\n    try:\n"
                          "        open(f'big{i}', 'wb').write(b'0' * 10_000_000); out.append('ok')\n"
                          "    except OSError as exc:\n        out.append(exc.errno)\nout"))[0]
        assert obs.strip() == "['ok', 'ok', 28]"  # ENOSPC: the quota, not the host's disk
        assert os.listdir(e._sandbox.root) == []  # the host's view of the mount point: nothing reached it
        snap = e.snapshot()
        assert snap.payload.frozen is not None
        e.restore(snap)
        assert e.step(call("len(out)"))[0].strip() == "3"
        assert_usable(e)
    assert {n for n in os.listdir(tempfile.gettempdir()) if n.startswith("trace-gym")} - before == set()


@pytest.mark.skipif(not ROOT, reason="cgroups need root")
def test_memory_is_limited_per_env_not_per_process():
    config = SandboxConfig(timeout_s=5, kill_grace_s=1, memory_mb=1024, env_memory_mb=300, cpus=0.5, preload=())
    with PythonMathEnv(tasks=TASKS, sandbox=config) as e:
        e.reset(seed=0, options={"task_id": "t"})
        box = e._sandbox
        if not box._cgroups:
            pytest.skip("no writable cgroup tree here")
        memory = [d for d in box._cgroups if "/memory/" in d]
        assert memory and Path(memory[0], "memory.limit_in_bytes").read_text().strip() == str(300 * 2**20)
        for d in box._cgroups:
            if "/cpu/" in d or "/cpu," in d:
                assert Path(d, "cpu.cfs_quota_us").read_text().strip() == "50000"  # half a core, opt-in
        e.step(call("a = bytearray(150 * 2**20)\nfor i in range(0, len(a), 4096): a[i] = 1"))
        with pytest.raises(SnapshotLimitError, match="memory budget"):  # a frozen copy of 150 MB that the
            e.snapshot()  # live interpreter may rewrite would not fit beside it: refused, nothing killed
        assert "150" in e.step(call("len(a) // 2**20"))[0]
        obs = e.step(call("b = bytearray(200 * 2**20)\nfor i in range(0, len(b), 4096): b[i] = 1"))[0]
        assert "Error" in obs or "MemoryError" in obs  # 350 MB in one env: over its 300 MB
        e.step(call("a = b = None"))
        assert_usable(e)


def test_background_threads_are_bounded_between_cells():
    config = SandboxConfig(timeout_s=2, kill_grace_s=1, cpu_s=1, preload=())
    with PythonMathEnv(tasks=TASKS, sandbox=config) as e:
        e.reset(seed=0, options={"task_id": "t"})
        e.step(call("import threading\ndef burn():\n    while True:\n        pass\n"
                    "threading.Thread(target=burn, daemon=True).start()"))
        pid = e._sandbox.live_pid
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and (proc_stat(pid) or ("Z",))[0] != "Z":
            time.sleep(0.2)
        assert (proc_stat(pid) or ("Z",))[0] == "Z", "a background thread kept burning CPU between cells"
        obs = e.step(call("1 + 1"))[0]
        assert "restarted" in obs or obs.strip() == "2"


def test_leftovers_of_a_sigkilled_host_are_cleaned():
    code = textwrap.dedent("""
        import json, sys
        from trace_envs.python_tool.sandbox import Sandbox, SandboxConfig
        b = Sandbox(SandboxConfig(preload=()))
        b.thaw(b.base)
        b.freeze()
        print(json.dumps({"keeper": b._keeper.pid, "live": b.live_pid, "root": b.root, "sid": b.sid,
                          "state": str(b.state.path)}), flush=True)
        sys.stdin.read()
    """)
    host = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])})
    info = json.loads(host.stdout.readline())
    host.kill()
    host.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(
            (proc_stat(p) or ("Z",))[0] != "Z" for p in (info["keeper"], info["live"])):
        time.sleep(0.05)
    assert all((proc_stat(p) or ("Z",))[0] == "Z" for p in (info["keeper"], info["live"])), "processes left behind"
    state = StateDir(info["state"])
    assert (state.path / f"{info['sid']}.json").exists()
    assert state.reap() >= 1
    assert not os.path.exists(info["root"]) and not (state.path / f"{info['sid']}.json").exists()


# ------------------------------------------------------------------ BFCL: backends bounded and isolated
@pytest.fixture(scope="module")
def bfcl_env():
    pytest.importorskip("bfcl_eval")
    pytest.importorskip("mpmath")
    from trace_envs.function_calling import BFCLEnv

    e = BFCLEnv(category="multi_turn_base")
    yield e
    e.close()


def _math_entry(env):
    for task_id in env.tasks.ids():
        if "MathAPI" in env.tasks[task_id].data.get("involved_classes", []):
            return task_id
    pytest.skip("no MathAPI entry in this category")


@pytest.mark.parametrize("call_text", [
    "[power(base=10, exponent=5000)]",
    "[power(base=10, exponent=100000000)]",
    "[logarithm(value=10, base=2, precision=100000)]",
    "[square_root(number=2, precision=200000)]",
    "[mean(numbers=[" + ",".join(["1e308"] * 2000) + "])]",
])
def test_bfcl_backend_calls_are_bounded_and_leave_no_global_state(bfcl_env, call_text):
    import mpmath

    bfcl_env.reset(options={"task_id": _math_entry(bfcl_env)})
    prec, context = mpmath.mp.prec, decimal.getcontext().prec
    start = time.monotonic()
    obs, *_ = bfcl_env.step(call_text)
    assert time.monotonic() - start < 10 and isinstance(obs, str)
    assert mpmath.mp.prec == prec and decimal.getcontext().prec == context
    snap = bfcl_env.snapshot()
    bfcl_env.step("[add(a=1, b=2)]")
    bfcl_env.restore(snap)
    assert "3" in bfcl_env.step("[add(a=1, b=2)]")[0]


def test_bfcl_hostile_actions_are_observations(bfcl_env):
    bfcl_env.reset(options={"task_id": bfcl_env.tasks.ids()[0]})
    for action in HOSTILE_ACTIONS + ["[" * 10_000, "[f(" + "[" * 300 + ")]", "[ls(a=" + "9" * 5000 + ")]",
                                     "```" + " " * 90_000]:
        start = time.monotonic()
        obs, *_ = bfcl_env.step(action)
        assert time.monotonic() - start < 2.0
        obs.encode("utf-8")
        if bfcl_env.done:
            bfcl_env.reset(options={"task_id": bfcl_env.tasks.ids()[0]})


def test_lucene_search_survives_lone_surrogates(tmp_path):
    import importlib.util

    if importlib.util.find_spec("jnius") is None:  # not importorskip: importing jnius starts a bare JVM
        pytest.skip("pyjnius is not installed")
    from retrievers.lucene import LuceneRetriever

    try:
        retriever = LuceneRetriever.build([{"id": "d1", "title": "Paris", "text": "Paris is the capital of France."},
                                           {"id": "d2", "title": "Rome", "text": "Rome is in Italy."}],
                                          tmp_path / "idx")
    except Exception as exc:  # noqa: BLE001 - no JVM / Anserini jar on this machine
        pytest.skip(f"Lucene unavailable: {exc}")
    hits = retriever.batch_search(["capital \ud800 France", "\udcff"], k=1)
    assert hits[0] and hits[0][0].doc_id == "d1"
