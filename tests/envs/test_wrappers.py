"""Branching through wrapper chains: gym.make's BranchingWrapper, stock and user wrappers, snapshot handles."""

from __future__ import annotations

import pickle
import threading
import warnings
from typing import Any

import gymnasium as gym
import pytest
from gymnasium.wrappers import OrderEnforcing, RecordEpisodeStatistics, TimeLimit

import trace_envs
from trace_envs import (
    BranchableWrapper,
    BranchingWrapper,
    ForeignSnapshotError,
    SnapshotError,
    SnapshotHandle,
    check_branchable_env,
)
from trace_envs.wrappers import chain_key, restore, snapshot

from .counter_env import CounterEnv

MATH = "trace_envs/PythonMath-v0"
ADD = '<tool_call>{{"name": "add", "arguments": {{"n": {}}}}}</tool_call>'
SIX_BY_SEVEN = {"task": {"prompt": "What is 6*7?", "answer": "42", "task_id": "six-seven"}}


def _offline(env_id: str, tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRACE_GYM_CACHE", str(tmp_path))
    if env_id.endswith("BFCL-v0"):
        pytest.importorskip("bfcl_eval")


class Recorder(gym.Wrapper):
    """A plain wrapper with state, covered by the generic rule."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self.seen: list[str] = []
        self.base = env.unwrapped

    def step(self, action: Any) -> Any:
        self.seen.append(action)
        return super().step(action)


class Locked(Recorder):
    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self.lock = threading.Lock()


class Hooked(Locked):
    def snapshot_state(self) -> list[str]:
        return self.seen

    def restore_state(self, state: list[str]) -> None:
        self.seen = state


class CountingTimeLimit(TimeLimit):
    """A subclass of a stock wrapper: not in the stock table, so the generic rule applies."""

    def __init__(self, env: gym.Env, max_episode_steps: int) -> None:
        super().__init__(env, max_episode_steps)
        self.calls = 0

    def step(self, action: Any) -> Any:
        self.calls += 1
        return super().step(action)


def test_gym_make_puts_a_branching_wrapper_outermost() -> None:
    env = gym.make(MATH, max_episode_steps=3)
    try:
        assert isinstance(env, BranchingWrapper) and isinstance(env.env, TimeLimit)
        env.reset(seed=0)
        snap = env.snapshot()
        assert [key for key, _ in snap.wrapper_states] == list(chain_key(env))
        assert env.tools[0]["function"]["name"] == "python" and env.turn == 0  # reads fall through
        again = gym.make(env.spec)
        assert type(again) is BranchingWrapper and isinstance(again.env, TimeLimit)
        again.close()
    finally:
        env.close()


def test_gym_make_without_stateful_wrappers_takes_bare_snapshots() -> None:
    env = gym.make(MATH)
    timed = gym.make(MATH, max_episode_steps=3)
    try:
        for e in (env, timed):
            e.reset(seed=0, options=SIX_BY_SEVEN)
        bare = env.unwrapped.snapshot()
        assert env.snapshot().wrapper_states == () and chain_key(env) == ()
        env.step("thinking")
        env.restore(bare)
        assert env.turn == 0
        with pytest.raises(ForeignSnapshotError, match="TimeLimit"):
            timed.restore(timed.unwrapped.snapshot())
    finally:
        env.close()
        timed.close()


def test_a_branch_under_max_episode_steps_is_truncated_at_its_own_step() -> None:
    env = gym.make(MATH, max_episode_steps=3)
    try:
        env.reset(seed=0, options=SIX_BY_SEVEN)
        env.step("thinking")
        snap = env.snapshot()
        env.step("thinking")
        assert env.step("thinking")[3]  # the trunk hits the limit at step 3
        env.restore(snap)
        assert not env.step("thinking")[3]  # step 2 of the branch
        assert env.step("thinking")[3]
    finally:
        env.close()


def test_record_episode_statistics_reports_the_branch_own_episode() -> None:
    env = RecordEpisodeStatistics(gym.make(MATH, max_episode_steps=3))
    try:
        env.reset(seed=0, options=SIX_BY_SEVEN)
        env.step("thinking")
        snap = snapshot(env)
        *_, terminated, _, info = env.step("<answer>42</answer>")
        assert terminated and info["episode"]["r"] == 1.0 and info["episode"]["l"] == 2
        restore(env, snap)
        _, _, _, truncated, info = env.step("thinking")
        assert not truncated and "episode" not in info
        _, reward, terminated, truncated, info = env.step("thinking")
        assert truncated and not terminated and reward == 0.0
        assert info["episode"]["r"] == 0.0 and info["episode"]["l"] == 3
        assert list(env.length_queue) == [3] and list(env.return_queue) == [0.0] and env.episode_count == 1
    finally:
        env.close()


@pytest.mark.parametrize("env_id", trace_envs.registered_ids())
def test_the_laws_hold_through_wrappers(env_id: str, tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    _offline(env_id, tmp_path, monkeypatch)
    env = RecordEpisodeStatistics(gym.make(env_id, max_episode_steps=4))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            check_branchable_env(env)
    finally:
        env.close()


def test_the_checker_catches_a_wrapper_that_is_not_restored() -> None:
    class Forgetful(BranchableWrapper):
        """Counts steps into the observation but declares no state."""

        def __init__(self, env: gym.Env) -> None:
            super().__init__(env)
            self.n = 0

        def step(self, action: Any) -> Any:
            self.n += 1
            obs, *rest = super().step(action)
            return (f"{obs} #{self.n}", *rest)

    with pytest.raises(AssertionError, match="replay|reuse|isolation|longevity"):
        check_branchable_env(Forgetful(CounterEnv()))


def test_the_generic_rule_copies_and_restores_instance_attributes() -> None:
    env = Recorder(OrderEnforcing(CounterEnv()))
    env.reset(seed=0, options={"task_id": "t0"})
    env.step(ADD.format(1))
    snap = snapshot(env)
    env.step(ADD.format(2))
    env.later = "added after the snapshot"
    for _ in range(2):
        restore(env, snap)
        assert env.seen == [ADD.format(1)] and not hasattr(env, "later")
        assert env.base is env.unwrapped  # a reference into the chain is kept, not copied
        assert env.step(ADD.format(5))[0].startswith("total=6")
    assert dict(snap.wrapper_states)["tests.envs.test_wrappers:Recorder"]["seen"] == [ADD.format(1)]


def test_a_subclass_of_a_stock_wrapper_is_restored_whole() -> None:
    env = CountingTimeLimit(CounterEnv(), max_episode_steps=3)
    env.reset(seed=0, options={"task_id": "t0"})
    env.step(ADD.format(1))
    snap = snapshot(env)
    env.step(ADD.format(1))
    restore(env, snap)
    assert env.calls == 1 and env._elapsed_steps == 1
    assert not env.step(ADD.format(1))[3] and env.step(ADD.format(1))[3]


def test_an_uncopyable_wrapper_is_refused_unless_it_has_hooks() -> None:
    locked = Locked(CounterEnv())
    locked.reset(seed=0)
    with pytest.raises(SnapshotError, match=r"Locked\.lock .*snapshot_state"):
        snapshot(locked)
    hooked = Hooked(CounterEnv())
    hooked.reset(seed=0, options={"task_id": "t0"})
    hooked.step(ADD.format(1))
    snap = snapshot(hooked)
    hooked.step(ADD.format(2))
    restore(hooked, snap)
    assert hooked.seen == [ADD.format(1)] and isinstance(hooked.lock, type(threading.Lock()))


def test_branchable_wrappers_now_branch_the_stock_wrappers_below_them() -> None:
    class Counting(BranchableWrapper):
        def __init__(self, env: gym.Env) -> None:
            super().__init__(env)
            self.steps = 0

        def step(self, action: Any) -> Any:
            self.steps += 1
            return super().step(action)

        def wrapper_state(self) -> int:
            return self.steps

        def load_wrapper_state(self, state: int) -> None:
            self.steps = state

    env = Counting(TimeLimit(CounterEnv(), max_episode_steps=3))
    env.reset(seed=0, options={"task_id": "t0"})
    env.step(ADD.format(1))
    snap = env.snapshot()
    env.step(ADD.format(1))
    env.step(ADD.format(1))
    env.restore(snap)
    assert env.steps == 1 and env.env._elapsed_steps == 1
    assert snapshot(env).wrapper_states == snap.wrapper_states


def test_snapshots_of_other_chains_are_refused() -> None:
    timed = TimeLimit(CounterEnv(), max_episode_steps=5)
    stats = RecordEpisodeStatistics(CounterEnv())
    for env in (timed, stats):
        env.reset(seed=0, options={"task_id": "t0"})
    snap = snapshot(timed)
    with pytest.raises(ForeignSnapshotError, match="TimeLimit.*RecordEpisodeStatistics"):
        restore(stats, snap)
    with pytest.raises(ForeignSnapshotError, match="none"):
        restore(timed, timed.unwrapped.snapshot())
    with pytest.raises(ForeignSnapshotError, match="configuration"):
        restore(timed, _other_config_snapshot())
    with pytest.raises(SnapshotError, match="takes a Snapshot"):
        restore(timed, "not a snapshot")  # type: ignore[arg-type]
    twin = TimeLimit(CounterEnv(), max_episode_steps=5)
    twin.reset(seed=0, options={"task_id": "t0"})
    restore(twin, snap)  # same wrappers, same configuration: accepted
    with pytest.raises(TypeError, match="does not wrap a BranchableEnv"):
        snapshot(TimeLimit(gym.make("CartPole-v1").unwrapped, max_episode_steps=5))


def _other_config_snapshot() -> Any:
    env = TimeLimit(CounterEnv(max_turns=3), max_episode_steps=5)
    env.reset(seed=0, options={"task_id": "t0"})
    return snapshot(env)


def test_an_unwrapped_env_snapshot_is_its_own() -> None:
    env = CounterEnv()
    env.reset(seed=0)
    snap = snapshot(env)
    assert snap.wrapper_states == () and chain_key(env) == ()
    restore(env, snap)
    env.restore(snap)


def test_snapshot_handles_in_process() -> None:
    env = BranchingWrapper(TimeLimit(CounterEnv(), max_episode_steps=9))
    other = BranchingWrapper(TimeLimit(CounterEnv(), max_episode_steps=9))
    for e in (env, other):
        e.reset(seed=0, options={"task_id": "t0"})
    env.step(ADD.format(1))
    handle = env.snapshot_handle()
    foreign = other.snapshot_handle()
    blob = pickle.dumps(handle)
    assert isinstance(pickle.loads(blob), SnapshotHandle) and pickle.loads(blob) == handle and len(blob) < 600
    assert handle.owner == env.branch_owner != other.branch_owner and handle.turn == 1
    expected = env.step(ADD.format(2))[0]
    assert env.restore_handle(handle) is True and env.step(ADD.format(2))[0] == expected
    assert env.restore_handle([foreign, None, handle]) is True
    assert env.restore_handle({other.branch_owner: foreign}) is False
    assert env.restore_handle({env.branch_owner: handle}) is True and env.turn == 1
    with pytest.raises(ForeignSnapshotError, match="another env"):
        env.restore_handle(foreign)
    with pytest.raises(ForeignSnapshotError, match="none of"):
        env.restore_handle([foreign, None])
    with pytest.raises(SnapshotError, match="expected a SnapshotHandle"):
        env.restore_handle("h")  # type: ignore[arg-type]
    assert env.held_handles == 1 and env.release_handle([handle, foreign]) == 1 and env.release_handle(handle) == 0
    with pytest.raises(SnapshotError, match="released"):
        env.restore_handle(handle)
    other.close()
    assert other.held_handles == 0
    env.close()


def test_set_wrapper_attr_reaches_the_env() -> None:
    env = BranchingWrapper(CounterEnv())
    env.set_wrapper_attr("leak_state", True)
    assert env.unwrapped.leak_state is True and "leak_state" not in vars(env)
    env.set_wrapper_attr("fresh", 1)
    assert vars(env)["fresh"] == 1
