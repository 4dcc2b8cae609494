"""Every env's default task set is its train split; a held-out task is served only when asked for.

Asked for means an env made with ``tasks="test"`` (or ``"all"``); ``reset(options={"task_id": ...})``
picks among the env's own tasks, and the id of a held-out task on a default env is refused with an
error naming the split that holds it. Also: stratified samples of a task set (the held-out evaluation's).
"""

from __future__ import annotations

import importlib.util
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

import trace_envs  # noqa: F401  (registers the suite)
from trace_envs.core import Task, TaskSet
from trace_envs.errors import InvalidTaskError, TaskNotFoundError
from trace_envs.tasks.splits import SplitTaskSet, stratified_ids, task_kind
from trace_envs.tasks.wiki import default_wiki_tasks, wiki_split

WIKI = "trace_envs/WikiQA-v0"
BFCL = "trace_envs/BFCL-v0"
MATH = "trace_envs/PythonMath-v0"
needs_bfcl = pytest.mark.skipif(importlib.util.find_spec("bfcl_eval") is None, reason="bfcl-eval not installed")


@pytest.fixture(scope="module", autouse=True)
def _cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    path = tmp_path_factory.mktemp("trace-gym-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRACE_GYM_CACHE", str(path))
        yield path


def _drawn(env, n: int = 60) -> set[str]:
    drawn = set()
    for seed in range(n):
        env.reset(seed=seed)
        drawn.add(env.task.task_id)
    return drawn


def test_wiki_default_is_the_train_split_and_refuses_a_held_out_id() -> None:
    env = gym.make(WIKI).unwrapped
    try:
        train, test = wiki_split("train"), wiki_split("test")
        assert env.tasks.ids() == train.ids() and len(env.tasks) == 315
        assert _drawn(env) <= set(train.ids())
        held = test.ids()[0]
        with pytest.raises(TaskNotFoundError, match=r"in the 'test' split.*tasks='test'"):
            env.reset(seed=0, options={"task_id": held})
        with pytest.raises(TaskNotFoundError, match="no task 'nope'"):
            env.reset(seed=0, options={"task_id": "nope"})
        env.reset(seed=0, options={"task_id": train.ids()[0]})  # the env is still usable
    finally:
        env.close()


def test_wiki_test_and_all_are_served_when_asked_for() -> None:
    test = wiki_split("test")
    env = gym.make(WIKI, tasks="test").unwrapped
    try:
        assert env.tasks.ids() == test.ids()
        env.reset(seed=0, options={"task_id": test.ids()[0]})
        assert env.task.task_id == test.ids()[0]
        with pytest.raises(TaskNotFoundError, match="in the 'train' split"):
            env.reset(seed=0, options={"task_id": wiki_split("train").ids()[0]})
    finally:
        env.close()
    every = gym.make(WIKI, tasks="all").unwrapped
    try:
        assert every.tasks.ids() == default_wiki_tasks().ids() and len(every.tasks) == 420
        every.reset(seed=0, options={"task_id": test.ids()[0]})
    finally:
        every.close()
    with pytest.raises(InvalidTaskError, match="ambiguous"):
        gym.make(WIKI, tasks="default")


@needs_bfcl
def test_bfcl_default_is_the_train_split_and_refuses_a_held_out_id() -> None:
    from trace_envs.tasks.bfcl import bfcl_split, load_bfcl_tasks

    env = gym.make(BFCL).unwrapped
    try:
        train, test = bfcl_split("multi_turn_base", "train"), bfcl_split("multi_turn_base", "test")
        assert env.tasks.ids() == train.ids() and len(env.tasks) == 150
        assert _drawn(env, 30) <= set(train.ids())
        with pytest.raises(TaskNotFoundError, match=r"in the 'test' split.*tasks='test'"):
            env.reset(seed=0, options={"task_id": test.ids()[0]})
        with pytest.raises(TaskNotFoundError, match="in the 'test' split"):
            gym.make(BFCL, task_ids=[test.ids()[0]])  # the task_ids filter picks from the train split too
    finally:
        env.close()
    for tasks, expected in ((None, train.ids()), ("test", test.ids()), ("all", load_bfcl_tasks("base").ids())):
        other = gym.make(BFCL, tasks=tasks).unwrapped
        try:
            assert other.tasks.ids() == expected
        finally:
            other.close()


def test_python_math_default_is_the_train_split() -> None:
    env = gym.make(MATH).unwrapped
    try:
        assert env.tasks.name == "math-default-train" and len(env.tasks) == 300
        assert all(t.startswith("math-train-") for t in env.tasks.ids())
        with pytest.raises(TaskNotFoundError):
            env.reset(seed=0, options={"task_id": "math-test-0003"})
    finally:
        env.close()


def test_split_task_set_is_a_task_set_of_its_split_only() -> None:
    train = wiki_split("train")
    assert isinstance(train, SplitTaskSet) and train.split == "train"
    held = wiki_split("test").ids()[0]
    assert held not in train and len(list(train)) == len(train) == 315
    assert train.sample(np.random.default_rng(0)).task_id in set(train.ids())


# ----------------------------------------------------------------------------------------- stratified samples
def test_stratified_sample_covers_every_kind_and_is_deterministic() -> None:
    test = wiki_split("test")
    ids = stratified_ids(test, 30)
    kinds = Counter(task_kind(test[t]) for t in ids)
    assert len(ids) == 30 and len(kinds) == 7 and max(kinds.values()) - min(kinds.values()) <= 1
    assert ids == stratified_ids(wiki_split("test"), 30)
    assert ids == [t for t in test.ids() if t in set(ids)]  # the split's order
    assert len({task_kind(test[t]) for t in stratified_ids(test, 7)}) == 7
    assert stratified_ids(test, None) == test.ids() == stratified_ids(test, 10_000)
    assert test.ids()[:30] != ids  # the first 30 are two kinds only


def test_stratified_sample_over_math_families_and_kindless_sets() -> None:
    from trace_envs.tasks.math_gen import default_math_tasks

    math_test = default_math_tasks("test")
    assert len({task_kind(math_test[t]) for t in stratified_ids(math_test, 18)}) == 18
    plain = TaskSet([Task(task_id=f"t{i}", prompt="p") for i in range(5)])
    assert task_kind(plain["t0"]) == "" and stratified_ids(plain, 3) == ["t0", "t1", "t2"]
    with pytest.raises(ValueError):
        stratified_ids(plain, 0)
