"""Wrong constructor arguments and wrong-split task ids end in one line that names them."""

from __future__ import annotations

import importlib.util

import gymnasium as gym
import numpy as np
import pytest

import trace_envs  # noqa: F401  (registers the suite)
from trace_envs.errors import EnvArgumentError, TaskNotFoundError

MATH, WIKI, BFCL = "trace_envs/PythonMath-v0", "trace_envs/WikiQA-v0", "trace_envs/BFCL-v0"


@pytest.mark.parametrize(("env_id", "kwargs", "named"), [
    (MATH, {"max_turns": "three"}, "max_turns must be int, got 'three' (str)"),
    (MATH, {"max_turns": True}, "max_turns must be int, got True (bool)"),
    (WIKI, {"max_turns": 2.5}, "max_turns must be int, got 2.5 (float)"),
    (WIKI, {"top_k": "3"}, "top_k must be int, got '3' (str)"),
    (WIKI, {"task_prompt": "yes"}, "task_prompt must be bool, got 'yes' (str)"),
    (BFCL, {"backend_timeout_s": "2"}, "backend_timeout_s must be float, got '2' (str)"),
    (BFCL, {"refuse_held_back": 1}, "refuse_held_back must be bool, got 1 (int)"),
])
def test_a_wrongly_typed_kwarg_is_named_in_one_line(env_id: str, kwargs: dict, named: str, tmp_path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    if env_id == BFCL:
        pytest.importorskip("bfcl_eval")
    monkeypatch.setenv("TRACE_GYM_CACHE", str(tmp_path))
    with pytest.raises(EnvArgumentError, match="^" + env_id + ": " + named.replace("(", r"\(").replace(")", r"\)")) \
            as caught:
        gym.make(env_id, **kwargs)
    assert "\n" not in str(caught.value) and isinstance(caught.value, TypeError)


def test_numbers_of_any_kind_pass(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRACE_GYM_CACHE", str(tmp_path))
    env = gym.make(WIKI, max_turns=np.int64(3), top_k=np.int32(2))
    assert env.unwrapped.max_turns == 3 and env.unwrapped.top_k == 2
    env.close()
    if importlib.util.find_spec("bfcl_eval") is not None:
        env = gym.make(BFCL, backend_timeout_s=1)  # an int where a float is wanted
        assert env.unwrapped._backends.timeout_s == 1  # noqa: SLF001
        env.close()


@pytest.mark.parametrize(("env_id", "other", "hint"), [
    (MATH, "math-test-0003", "make the env with tasks='test' to play it"),
    (WIKI, None, "make the env with tasks='test' (or 'all') to play it"),
])
def test_a_held_out_id_names_its_split(env_id: str, other: str | None, hint: str, tmp_path,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRACE_GYM_CACHE", str(tmp_path))
    held_out = other or gym.make(env_id, tasks="test").unwrapped.tasks.ids()[0]
    env = gym.make(env_id)
    with pytest.raises(TaskNotFoundError, match=f"task '{held_out}' is in the 'test' split") as caught:
        env.reset(options={"task_id": held_out})
    assert hint in str(caught.value)
    with pytest.raises(TaskNotFoundError, match="no task 'nope'"):
        env.reset(options={"task_id": "nope"})
    env.close()


def test_the_math_test_split_names_the_train_split() -> None:
    env = gym.make(MATH, tasks="test")
    with pytest.raises(TaskNotFoundError, match="'math-train-0000' is in the 'train' split"):
        env.reset(options={"task_id": "math-train-0000"})
    assert len(env.unwrapped.tasks) == 100 and "math-train-0000" not in list(env.unwrapped.tasks)
    env.close()
