"""Gymnasium vector envs on the suite: text spaces (FreeText) and branching sub-envs through snapshot handles."""

from __future__ import annotations

import copy
import pickle

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.spaces import flatten, flatten_space, unflatten
from gymnasium.vector.utils import create_shared_memory, read_from_shared_memory, write_to_shared_memory

import trace_envs  # noqa: F401
from trace_envs import ForeignSnapshotError, SnapshotHandle
from trace_envs.core import FreeText
from trace_envs.vector import release_handles, restore_handles, snapshot_handles

TEXTS = ["", "plain ascii", "héllo wörld ☃ 日本語 🙂", "a\x00b", "lone \ud800 surrogate", "x" * 64]


@pytest.mark.parametrize("text", TEXTS)
def test_flatten_round_trips_any_text(text: str) -> None:
    space = FreeText(64)
    flat = flatten(space, text)
    assert flat.dtype == np.int32 and flat.shape == (64,) and flatten_space(space).contains(flat)
    assert unflatten(space, flat) == text


def test_flatten_refuses_an_oversized_text() -> None:
    with pytest.raises(ValueError, match="does not fit"):
        flatten(FreeText(4), "12345")


def test_shared_memory_shows_later_writes() -> None:
    space = FreeText(32)
    buffer = create_shared_memory(space, n=3)
    view = read_from_shared_memory(space, buffer, n=3)  # Gymnasium reads once, at construction
    assert tuple(view) == ("", "", "")
    write_to_shared_memory(space, 1, "héllo ☃", buffer)
    write_to_shared_memory(space, 2, "\ud800", buffer)
    assert view[1] == "héllo ☃" and view[-1] == "\ud800" and len(view) == 3
    assert copy.deepcopy(view) == ("", "héllo ☃", "\ud800") and isinstance(copy.deepcopy(view), tuple)


def _question_task(question: str) -> dict:
    return {"question": question, "answer": "Ærø"}


@pytest.mark.parametrize("env_id", ["trace_envs/WikiQA-v0", "trace_envs/PythonMath-v0", "trace_envs/BFCL-v0"])
def test_make_vec_async_works_out_of_the_box(env_id: str, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TRACE_GYM_CACHE", str(tmp_path))
    if env_id.endswith("BFCL-v0"):
        pytest.importorskip("bfcl_eval")
    single = gym.make(env_id)
    expected, _ = single.reset(seed=3)
    single.close()
    venv = gym.make_vec(env_id, num_envs=2, vectorization_mode="async")
    try:
        obs, _ = venv.reset(seed=3)
        assert isinstance(obs, tuple) and obs[0] == expected and len(obs[1]) > 0
        obs, rewards, terminated, truncated, _ = venv.step(("<answer>0</answer>", "not a tool call ✓"))
        assert all(isinstance(o, str) and o and not o.startswith("0000") for o in obs)
        assert rewards.shape == (2,)
    finally:
        venv.close()


def test_non_ascii_observations_cross_the_process_boundary(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TRACE_GYM_CACHE", str(tmp_path))
    venv = gym.make_vec("trace_envs/WikiQA-v0", num_envs=2, vectorization_mode="async")
    try:
        obs, _ = venv.reset(seed=0, options={"task": _question_task("Wer gründete Ærø ☃?")})
        assert obs == ("Question: Wer gründete Ærø ☃?",) * 2
        obs, rewards, terminated, *_ = venv.step(("<answer>Ærø</answer>", "<answer>Aero</answer>"))
        assert obs[0] == "Answer received: Ærø" and list(rewards) == [1.0, 0.0] and all(terminated)
    finally:
        venv.close()


@pytest.mark.parametrize("env_id", ["trace_envs/PythonMath-v0", "trace_envs/WikiQA-v0", "trace_envs/BFCL-v0"])
def test_async_sub_envs_branch_through_snapshot_handles(env_id: str, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TRACE_GYM_CACHE", str(tmp_path))
    if env_id.endswith("BFCL-v0"):
        pytest.importorskip("bfcl_eval")
    venv = gym.make_vec(env_id, num_envs=2, vectorization_mode="async",
                        vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.DISABLED})
    try:
        venv.reset(seed=3)
        plans = venv.call("conformance_actions")
        venv.step(tuple(plan[0] for plan in plans))
        handles = venv.call("snapshot_handle")
        assert all(isinstance(h, SnapshotHandle) and h.turn == 1 for h in handles)
        assert handles[0].owner != handles[1].owner and len(pickle.dumps(handles)) < 2000
        second = tuple(plan[1] for plan in plans)
        expected = venv.step(second)[0]
        assert venv.call("restore_handle", handles) == (True, True)
        assert venv.step(second)[0] == expected
        with pytest.raises(ForeignSnapshotError, match="belongs to sub-env 1, not to sub-env 0"):
            restore_handles(venv, handles[::-1])
        assert restore_handles(venv, (None, handles[1])) == (False, True)
        assert venv.call("turn") == (2, 1)  # the workers survived the refusal
        assert release_handles(venv, handles) == 2 and venv.call("held_handles") == (0, 0)
    finally:
        venv.close()


def test_sync_sub_envs_take_the_same_handles() -> None:
    venv = gym.make_vec("trace_envs/PythonMath-v0", num_envs=2, vectorization_mode="sync")
    try:
        venv.reset(seed=0)
        handles = snapshot_handles(venv)
        venv.step(("still thinking", "still thinking"))
        assert restore_handles(venv, handles) == (True, True) and venv.call("turn") == (0, 0)
    finally:
        venv.close()
