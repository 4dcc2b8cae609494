"""BFCL-v0 on hostile actions: the stateful backends run in a worker, bounded in time and memory.

Two attacks on bfcl-eval's GorillaFileSystem: ``cp`` copies a directory's entries without copying
them, so a short action builds a DAG on which ``du()``/``find()`` take 2**levels steps; and a chain
of ``mkdir``/``cd`` builds a state thousands of levels deep (too deep for a default stack to pickle
or compare). Each is followed by the same checks: bounded time, an error observation, an env that
still steps, snapshots and restores, and a host process whose state is untouched.
"""

from __future__ import annotations

import os
import signal
import sys
import time

import pytest

pytest.importorskip("bfcl_eval", reason="BFCL-v0 needs bfcl-eval (pip install --no-deps bfcl-eval mpmath)")
pytest.importorskip("mpmath")

from tests.envs.signals import stop  # noqa: E402
from trace_envs.function_calling import BFCLEnv, remote  # noqa: E402

pytestmark = pytest.mark.hostile

TIMEOUT_S = 1.0
#: a deadline-missing call costs its deadline plus a worker restart and replay (about a second here)
BOUND_S = TIMEOUT_S + 8.0


def dag_action(levels: int) -> str:
    """``a`` holding ``a``/``b`` that share their entries, ``levels`` deep: 2**levels paths, 5 calls a level."""
    calls = ["mkdir(dir_name='a')"]
    for _ in range(levels):
        calls += ["cp(source='a', destination='b')", "mkdir(dir_name='c')", "mv(source='a', destination='c')",
                  "mv(source='b', destination='c')", "mv(source='c', destination='a')"]
    return "[" + ", ".join(calls) + "]"


def deep_action(levels: int) -> str:
    return "[" + ", ".join(["mkdir(dir_name='d'), cd(folder='d')"] * levels) + "]"


@pytest.fixture()
def env():
    e = BFCLEnv(category="multi_turn_base", backend_timeout_s=TIMEOUT_S)
    e.reset(options={"task_id": "multi_turn_base_0"})
    yield e
    e.close()


def timed_step(env: BFCLEnv, action: str) -> tuple[str, float, dict]:
    start = time.monotonic()
    obs, _, _, _, info = env.step(action)
    return obs, time.monotonic() - start, info


def host_fingerprint() -> tuple:
    """What a backend call run in this process could change: recursion limit, numeric contexts, modules."""
    import decimal

    import mpmath

    return (sys.getrecursionlimit(), mpmath.mp.prec, decimal.getcontext().prec,
            "bfcl_eval.eval_checker.multi_turn_eval.func_source_code.gorilla_file_system" in sys.modules
            and id(sys.modules["bfcl_eval.eval_checker.multi_turn_eval.func_source_code.gorilla_file_system"]))


def test_the_dag_action_is_small() -> None:
    assert len(dag_action(30)) < 5000


@pytest.mark.parametrize("query", ["[du(human_readable=True)]", "[find(path='.', name='nothing')]"])
def test_du_or_find_on_a_dag_is_a_bounded_error_and_the_env_stays_usable(env: BFCLEnv, query: str) -> None:
    before = host_fingerprint()
    obs, seconds, _ = timed_step(env, dag_action(40))
    assert seconds < BOUND_S and "Error" not in obs
    obs, seconds, info = timed_step(env, query)
    assert seconds < BOUND_S, seconds
    assert obs == f"Error during execution: the call exceeded its {TIMEOUT_S:g} s limit"
    assert info["calls"][0]["error"]
    # rebuilt without the call that ran over: the DAG is still there, and the env steps on
    obs, seconds, _ = timed_step(env, "[ls(), cd(folder='a'), ls()]")
    assert seconds < BOUND_S
    assert '"a"' in obs.splitlines()[0] and obs.splitlines()[2] == '[3] ls: {"current_directory_content": ["a", "b"]}'
    snap = env.snapshot()
    obs, _, _ = timed_step(env, "[cd(folder='b')]")
    env.restore(snap)
    assert timed_step(env, "[pwd()]")[0] == '{"current_working_directory": "/workspace/a"}'
    assert host_fingerprint() == before


def test_a_timed_out_call_has_no_effect_and_the_calls_after_it_run(env: BFCLEnv) -> None:
    env.step(dag_action(40))
    obs, seconds, info = timed_step(env, "[touch(file_name='x.txt'), du(), touch(file_name='y.txt'), ls()]")
    assert seconds < BOUND_S
    lines = obs.splitlines()
    assert lines[1].startswith("[2] du: Error during execution: the call exceeded")
    assert '"x.txt"' in lines[3] and '"y.txt"' in lines[3]
    assert [c["error"] for c in info["calls"]] == [False, True, False, False]


def test_a_deep_action_snapshots_restores_and_checks_without_raising(env: BFCLEnv) -> None:
    action = deep_action(2200)
    assert len(action) > 76_000
    before = host_fingerprint()
    obs, seconds, _ = timed_step(env, action)
    assert seconds < BOUND_S and obs.endswith('cd: {"current_working_directory": "d"}')
    snap = env.snapshot()
    env.step("[cd(folder='..')]")
    env.restore(snap)
    obs = env.step("[pwd()]")[0]
    assert obs.endswith("/d" * 20 + '"}') and obs.count("/d") == 2200
    env.restore(snap)
    again = env.snapshot()
    assert again.digest() == snap.digest() and again.payload.digest() == snap.payload.digest()
    obs, _, info = timed_step(env, "Done with that.")  # the turn's state check: a verdict, not an exception
    assert info["turn_check"]["valid"] is False
    assert host_fingerprint() == before


def test_a_state_too_deep_to_freeze_is_snapshotted_as_its_recipe(env: BFCLEnv, monkeypatch) -> None:
    """Freezing fails (forced here: the worker's pickling refused): the snapshot replays the calls instead."""
    env.step("[mkdir(dir_name='kept'), cd(folder='kept')]")
    monkeypatch.setattr(env._backends, "freeze", lambda: None)  # noqa: SLF001
    snap = env.snapshot()
    assert snap.payload.backends.calls, "a recipe, not frozen bytes"
    monkeypatch.undo()
    env.step("[cd(folder='..'), rmdir(dir_name='kept')]")
    env.restore(snap)
    assert env.step("[pwd()]")[0] == '{"current_working_directory": "/workspace/kept"}'
    fresh = BFCLEnv(category="multi_turn_base", backend_timeout_s=TIMEOUT_S)
    fresh.reset(options={"task_id": "multi_turn_base_0"})
    fresh.restore(snap)
    assert fresh.step("[pwd()]")[0] == '{"current_working_directory": "/workspace/kept"}'
    fresh.close()


def test_a_killed_or_stopped_worker_is_replaced_and_the_state_rebuilt(env: BFCLEnv) -> None:
    env.step("[mkdir(dir_name='kept')]")
    worker = env._backends._worker  # noqa: SLF001
    os.kill(worker.proc.pid, signal.SIGKILL)
    obs, seconds, _ = timed_step(env, "[ls()]")
    assert '"kept"' in obs and seconds < BOUND_S
    worker = env._backends._worker  # noqa: SLF001
    stop(worker.proc.pid)
    obs, seconds, _ = timed_step(env, "[ls()]")
    assert seconds < BOUND_S and "exceeded" in obs
    assert worker.proc.poll() is not None  # killed and reaped
    assert '"kept"' in env.step("[ls()]")[0]
    snap = env.snapshot()
    os.kill(env._backends._worker.proc.pid, signal.SIGKILL)  # noqa: SLF001
    env.restore(snap)
    assert '"kept"' in env.step("[ls()]")[0]


def test_the_worker_has_a_memory_cap_and_the_host_never_runs_a_backend(env: BFCLEnv) -> None:
    pid = env._backends._worker.proc.pid  # noqa: SLF001
    limits = open(f"/proc/{pid}/limits").read()
    line = next(row for row in limits.splitlines() if row.startswith("Max address space"))
    assert line.split()[3] == str(remote.MEMORY_LIMIT_BYTES)
    env.step("[echo(content='" + "x" * 1000 + "', file_name='big.txt')]")
    obs, seconds, _ = timed_step(env, "[" + ", ".join(["cat(file_name='big.txt')"] * 50) + "]")
    assert seconds < BOUND_S and obs.count("[") >= 50


def test_a_forked_child_leaves_its_parents_worker_alone(env: BFCLEnv) -> None:
    env.step("[mkdir(dir_name='kept')]")
    parent_worker = env._backends._worker.proc.pid  # noqa: SLF001
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - runs in the child
        ok = False
        try:
            obs = env.step("[ls()]")[0]
            ok = '"kept"' in obs and env._backends._worker.proc.pid != parent_worker  # noqa: SLF001
            env.close()
        finally:
            os.write(write, b"1" if ok else b"0")
            os._exit(0)
    os.close(write)
    assert os.read(read, 1) == b"1"
    os.waitpid(child, 0)
    os.close(read)
    assert env._backends._worker.proc.pid == parent_worker and env._backends._worker.proc.poll() is None  # noqa: SLF001
    assert '"kept"' in env.step("[ls()]")[0]
