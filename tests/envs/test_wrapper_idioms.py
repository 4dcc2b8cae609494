"""Gymnasium's own idioms branch the whole wrapper chain or refuse: get_wrapper_attr through wrappers
added after gym.make, make_vec(wrappers=...) snapshot handles, call("snapshot") on an AsyncVectorEnv."""

from __future__ import annotations

import gymnasium as gym
import pytest
from gymnasium.wrappers import RecordEpisodeStatistics, TimeLimit

import trace_envs  # noqa: F401  (registers the suite)
from trace_envs import SnapshotError, SnapshotHandle
from trace_envs.checker import (
    check_async_snapshot_refused,
    check_branchable_env,
    check_vector_handles,
    check_wrapper_attr_branching,
)
from trace_envs.errors import ForeignSnapshotError
from trace_envs.vector import restore_handles, snapshot_handles

MATH = "trace_envs/PythonMath-v0"
IDLE = "still thinking"


def test_get_wrapper_attr_restores_time_limit_and_episode_statistics() -> None:
    env = RecordEpisodeStatistics(TimeLimit(gym.make(MATH), 3))
    try:
        env.reset(seed=0)
        env.step(IDLE)
        snap = env.get_wrapper_attr("snapshot")()
        env.step(IDLE)
        *_, truncated, _ = env.step(IDLE)
        assert truncated and env.env._elapsed_steps == 3 and env.episode_lengths == 3
        env.get_wrapper_attr("restore")(snap)
        assert env.env._elapsed_steps == 1 and env.episode_lengths == 1 and env.unwrapped.turn == 1
        *_, truncated, _ = env.step(IDLE)
        assert not truncated, "TimeLimit counts the branch's own steps"
        *_, truncated, info = env.step(IDLE)
        assert truncated and info["episode"]["l"] == 3, "the episode statistics are the branch's own"
    finally:
        env.close()


def test_a_whole_chain_snapshot_is_refused_by_a_shorter_chain() -> None:
    """No half restore either way: the inner BranchingWrapper refuses a snapshot of the whole chain."""
    env = RecordEpisodeStatistics(TimeLimit(gym.make(MATH), 3))
    try:
        env.reset(seed=0)
        snap = env.get_wrapper_attr("snapshot")()
        with pytest.raises(ForeignSnapshotError, match="wrappers"):
            env.env.env.restore(snap)
    finally:
        env.close()


def test_handles_reached_through_outer_wrappers_carry_their_state() -> None:
    env = RecordEpisodeStatistics(gym.make(MATH))
    try:
        env.reset(seed=0)
        env.step(IDLE)
        handle = env.get_wrapper_attr("snapshot_handle")()
        assert isinstance(handle, SnapshotHandle)
        env.step(IDLE)
        assert env.get_wrapper_attr("restore_handle")(handle) and env.episode_lengths == 1
        assert env.get_wrapper_attr("release_handle")(handle) == 1
    finally:
        env.close()


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_make_vec_wrappers_state_travels_in_handles(mode: str) -> None:
    venv = gym.make_vec(MATH, num_envs=2, vectorization_mode=mode, wrappers=[RecordEpisodeStatistics],
                        vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.DISABLED})
    try:
        venv.reset(seed=0)
        venv.step((IDLE, IDLE))
        handles = snapshot_handles(venv)
        venv.step((IDLE, IDLE))
        assert venv.get_attr("episode_lengths") == (2, 2)
        assert restore_handles(venv, handles) == (True, True)
        assert venv.get_attr("episode_lengths") == (1, 1) and venv.call("turn") == (1, 1)
    finally:
        venv.close()


def test_async_call_snapshot_raises_in_the_caller_and_the_workers_survive() -> None:
    venv = gym.make_vec(MATH, num_envs=3, vectorization_mode="async")
    try:
        venv.reset(seed=0)
        for _ in range(2):  # twice: the first refusal left the vector env ready for the next call
            with pytest.raises(SnapshotError, match="snapshot_handle"):
                venv.call("snapshot")
            assert venv.call("turn") == (0, 0, 0)
        venv.step((IDLE, IDLE, IDLE))
        handles = venv.call("snapshot_handle")
        venv.step((IDLE, IDLE, IDLE))
        assert venv.call("restore_handle", handles) == (True, True, True) and venv.call("turn") == (1, 1, 1)
    finally:
        venv.close()


def test_the_checker_runs_the_wrapper_laws() -> None:
    env = gym.make(MATH)
    try:
        check_branchable_env(env, vector=True)
    finally:
        env.close()


def test_the_wrapper_attr_law_catches_a_half_restore(monkeypatch: pytest.MonkeyPatch) -> None:
    """Negative control: with the chain binding turned off, law 8 fails on a half restore."""
    from trace_envs.wrappers import BranchingWrapper

    monkeypatch.setattr(BranchingWrapper, "get_wrapper_attr", gym.Wrapper.get_wrapper_attr)
    env = gym.make(MATH)
    try:
        env.reset(seed=0)
        actions = env.unwrapped.conformance_actions()
        with pytest.raises(AssertionError, match="half restore"):
            check_wrapper_attr_branching(env, actions, 0, env.unwrapped.task.task_id)
    finally:
        env.close()


def test_the_vector_laws_stand_alone() -> None:
    check_vector_handles(MATH)
    check_async_snapshot_refused(MATH)


def test_a_bare_env_refuses_a_snapshot_reached_through_a_wrapper() -> None:
    from trace_envs.python_tool.env import PythonMathEnv

    env = TimeLimit(PythonMathEnv(), 3)
    try:
        env.reset(seed=0)
        with pytest.raises(SnapshotError, match=r"trace_envs\.wrappers\.snapshot\(env\)"):
            env.get_wrapper_attr("snapshot")
        with pytest.raises(SnapshotError, match="half restore"):
            env.get_wrapper_attr("restore")
        assert env.unwrapped.get_wrapper_attr("snapshot")  # asked directly, the env's own method
        check_wrapper_attr_branching(env, env.unwrapped.conformance_actions(), 0, env.unwrapped.task.task_id)
    finally:
        env.close()


def test_a_user_branchable_wrapper_binds_the_chain_above_it_too() -> None:
    from trace_envs import BranchableWrapper
    from trace_envs.python_tool.env import PythonMathEnv

    env = RecordEpisodeStatistics(TimeLimit(BranchableWrapper(PythonMathEnv()), 3))
    try:
        env.reset(seed=0)
        env.step(IDLE)
        snap = env.get_wrapper_attr("snapshot")()
        env.step(IDLE)
        env.get_wrapper_attr("restore")(snap)
        assert env.env._elapsed_steps == 1 and env.episode_lengths == 1
        check_branchable_env(env)
    finally:
        env.close()
