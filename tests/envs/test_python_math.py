"""PythonMath-v0 through the public API: persistence, branching, hostile code, bookkeeping."""

from __future__ import annotations

import json

import gymnasium as gym
import pytest

import trace_envs
from trace_envs import BranchableWrapper, ForeignSnapshotError, SnapshotError, Task, TaskSet, find_branchable
from trace_envs.python_tool.env import PythonMathEnv
from trace_envs.python_tool.sandbox import SandboxConfig

from .counter_env import CounterEnv

TASKS = TaskSet([Task("six-seven", "What is 6*7?", {"answer": "42"}),
                 Task("half", "What is 1/2?", {"answer": "1/2"})], name="unit")


def call(code: str) -> str:
    return "<tool_call>" + json.dumps({"name": "python", "arguments": {"code": code}}) + "</tool_call>"


@pytest.fixture(scope="module")
def env():
    e = PythonMathEnv(tasks=TASKS, max_turns=50, sandbox=SandboxConfig(timeout_s=2.0, kill_grace_s=1.0))
    yield e
    e.close()


def start(env, task_id="six-seven", seed=0):
    return env.reset(seed=seed, options={"task_id": task_id})


def test_gymnasium_make_returns_a_branchable_env():
    env = gym.make("trace_envs/PythonMath-v0")
    try:
        obs, info = env.reset(seed=3)
        assert isinstance(obs, str) and obs == env.unwrapped.task.prompt
        snap = env.snapshot()
        env.step(call("z = 1"))
        env.restore(snap)
        assert env.unwrapped.turn == 0
        assert env.tools[0]["function"]["name"] == "python"
    finally:
        env.close()


def test_wrappers_forward_snapshots(env):
    class CountingWrapper(BranchableWrapper):
        def __init__(self, inner):
            super().__init__(inner)
            self.steps = 0

        def step(self, action):
            self.steps += 1
            return super().step(action)

        def wrapper_state(self):
            return self.steps

        def load_wrapper_state(self, state):
            self.steps = state

    wrapped = CountingWrapper(gym.wrappers.TimeLimit(env, max_episode_steps=40))
    start(wrapped)
    wrapped.step(call("a = 5"))
    snap = wrapped.snapshot()
    wrapped.step(call("a = 6"))
    wrapped.restore(snap)
    assert wrapped.steps == 1
    assert wrapped.step(call("a"))[0].strip() == "5"
    assert find_branchable(gym.wrappers.TimeLimit(env, max_episode_steps=3)) is env


def test_variables_persist_across_turns(env):
    start(env)
    env.step(call("import math\nx = 6"))
    env.step(call("y = x * 7"))
    env.step("I am thinking")  # a malformed turn in between
    obs, reward, terminated, truncated, info = env.step(call("print(math.gcd(y, 14), y)"))
    assert obs.strip() == "14 42" and reward == 0 and not terminated and info["cells"] == 3


def test_answer_is_graded(env):
    start(env, "half")
    assert env.step("<answer>\\boxed{0.5}</answer>")[1:3] == (1.0, True)
    start(env, "half")
    obs, reward, terminated, _, info = env.step("<answer>\\boxed{\\frac{1}{3}}</answer>")
    assert (reward, terminated, info["correct"]) == (0.0, True, False)


def test_malformed_turns_are_observations(env):
    start(env)
    for bad in ["", "<tool_call>{not json</tool_call>", '<tool_call>{"name": "bash", "arguments": {}}</tool_call>',
                '<tool_call>{"name": "python", "arguments": {"code": ""}}</tool_call>', "<answer>5", 12345]:
        obs, reward, terminated, truncated, _ = env.step(bad)
        assert "Error" in obs and reward == 0 and not terminated
    assert env.turn == 6


def test_turn_limit_truncates():
    with PythonMathEnv(tasks=TASKS, max_turns=2) as e:
        e.reset(seed=0)
        assert e.step("hmm")[3] is False
        obs, _, terminated, truncated, _ = e.step("hmm")
        assert truncated and not terminated
        with pytest.raises(trace_envs.ResetNeededError):
            e.step("more")


def test_restore_replays_identically_including_random(env):
    start(env)
    env.step(call("import random\nrandom.seed(7)\nrandom.random()"))
    snap = env.snapshot()
    branch = [call("draws = [random.randint(0, 10**9) for _ in range(3)]\ndraws"), call("sum(draws)")]
    first = [env.step(a)[0] for a in branch]
    for _ in range(3):
        env.restore(snap)
        assert [env.step(a)[0] for a in branch] == first


def test_branches_never_see_each_others_variables_or_files(env):
    start(env)
    env.step(call("shared = 1\nopen('log.txt', 'w').write('root')"))
    snap = env.snapshot()
    env.step(call("only_a = True\nopen('log.txt', 'a').write('+a')\nopen('a.txt', 'w').write('a')"))
    env.restore(snap)
    obs = env.step(call("import os\n('only_a' in globals(), open('log.txt').read(), sorted(os.listdir('.')))"))[0]
    assert obs.strip() == "(False, 'root', ['log.txt'])"
    env.restore(snap)
    assert env.step(call("shared"))[0].strip() == "1"


def test_snapshot_survives_reset_and_other_tasks(env):
    start(env)
    env.step(call("kept = 'yes'"))
    snap = env.snapshot()
    start(env, "half", seed=5)
    env.step(call("kept = 'overwritten'"))
    start(env)  # back on the snapshot's task
    env.restore(snap)
    assert env.step(call("kept"))[0].strip() == "'yes'"


def test_foreign_snapshots_are_refused(env):
    other = CounterEnv()
    other.reset(seed=0)
    start(env)
    with pytest.raises(ForeignSnapshotError):
        env.restore(other.snapshot())
    snap = env.snapshot()
    start(env, "half")
    with pytest.raises(ForeignSnapshotError, match="reset"):
        env.restore(snap)
    with PythonMathEnv(tasks=TASKS, max_turns=3) as differently_configured:
        start(differently_configured)
        with pytest.raises(ForeignSnapshotError):
            differently_configured.restore(snap)


def test_released_snapshot_is_refused(env):
    start(env)
    snap = env.snapshot()
    snap.release()
    with pytest.raises(SnapshotError, match="released"):
        env.restore(snap)


def test_crash_restarts_from_last_save_point(env):
    start(env)
    env.step(call("a = 1"))
    save_point = env.snapshot()  # the restart starts here (while the snapshot is held)
    env.step(call("b = 2"))
    obs = env.step(call("import os\nos._exit(1)"))[0]
    assert "restarted" in obs and "1 earlier cell" in obs
    assert env.step(call("a + b"))[0].strip() == "3"
    del save_point  # without a held save point the restart replays from the episode start
    obs = env.step(call("import signal\nsignal.signal(signal.SIGALRM, signal.SIG_IGN)\n"
                        "signal.signal(signal.SIGXCPU, signal.SIG_IGN)\nwhile True: pass"))[0]
    assert "killed" in obs and "restarted" in obs
    assert env.step(call("a + b"))[0].strip() == "3"


def test_hostile_cells_end_in_error_observations(env):
    start(env)
    env.step(call("keep = 'me'"))
    hostile = {
        "infinite loop": "while True: pass",
        "memory bomb": "x = bytearray(16 * 1024**3)",
        "fork bomb": "import os\nwhile True: os.fork()",
        "write outside": "open('/etc/passwd_trace_gym', 'w').write('x')",
        "socket": "import socket\nsocket.socket().connect(('127.0.0.1', 80))",
        "kill parent": "import os\nos.kill(os.getppid(), 9)",
    }
    for name, code in hostile.items():
        obs = env.step(call(code))[0]
        assert "Error" in obs or "not allowed" in obs or "limit" in obs, (name, obs)
    obs = env.step(call("print('z' * 100_000_000)"))[0]
    assert "truncated" in obs and len(obs) < 20_000
    assert env.step(call("keep"))[0].strip() == "'me'"


@pytest.mark.slow
def test_thousand_snapshot_restore_cycles_leave_no_extra_processes(env):
    start(env)
    env.step(call("n = 0"))
    sandbox = env._sandbox
    before = sandbox.process_count()
    for _ in range(1000):
        snap = env.snapshot()
        env.step(call("n += 1"))
        env.restore(snap)
        del snap
    import gc
    import time

    gc.collect()
    time.sleep(0.2)
    assert sandbox.process_count() <= before
    assert env.step(call("n"))[0].strip() == "0"


def test_exported_snapshot_restores_in_a_fresh_env(env):
    start(env)
    env.step(call("import random\nrandom.seed(1)\nv = [random.random() for _ in range(3)]"))
    data = json.loads(json.dumps(env.export_snapshot(env.snapshot())))
    expected = env.step(call("v, random.random()"))[0]
    with PythonMathEnv(tasks=TASKS, max_turns=50, sandbox=SandboxConfig(timeout_s=2.0, kill_grace_s=1.0)) as fresh:
        start(fresh)
        fresh.restore(fresh.import_snapshot(data))
        assert fresh.turn == 1 and fresh.messages == env.messages[:-2]
        assert fresh.step(call("v, random.random()"))[0] == expected
    with pytest.raises(SnapshotError):
        env.import_snapshot({"cells": []})


def test_user_task(env):
    env.reset(options={"task": {"prompt": "What is 2**10?", "answer": 1024}})
    assert env.task.task_id.startswith("user-")
    assert env.step(call("2**10"))[0].strip() == "1024"
    assert env.step("<answer>1024</answer>")[1] == 1.0
    with pytest.raises(trace_envs.InvalidTaskError):
        env.reset(options={"task": {"prompt": "no answer"}})
    with pytest.raises(trace_envs.TaskNotFoundError):
        env.reset(options={"task_id": "nope"})
