"""Train / held-out splits of WikiQA-v0 and BFCL-v0, and their resolution by the trainer's wiring."""

from __future__ import annotations

import importlib.util
from collections import Counter

import pytest

from trace_agent.env_factory import make_env_factory, split_kwargs, task_ids
from trace_agent.errors import EnvSetupError
from trace_envs.tasks.wiki import HELDOUT_FRACTION, default_wiki_tasks, wiki_split

needs_bfcl = pytest.mark.skipif(importlib.util.find_spec("bfcl_eval") is None, reason="bfcl-eval not installed")


def test_wiki_splits_are_disjoint_cover_everything_and_hold_every_kind() -> None:
    train, test = wiki_split("train"), wiki_split("test")
    everything = default_wiki_tasks()
    assert set(train.ids()).isdisjoint(test.ids())
    assert sorted([*train.ids(), *test.ids()]) == sorted(everything.ids())
    kinds_all = Counter(t.data["kind"] for t in everything.values())
    kinds_test = Counter(t.data["kind"] for t in test.values())
    assert set(kinds_test) == set(kinds_all)
    for kind, n in kinds_all.items():  # the held-out share is per kind, not by luck
        assert kinds_test[kind] == -(-n * HELDOUT_FRACTION // 1)
    assert train.name != test.name  # snapshots never move between splits
    assert wiki_split("test").ids() == test.ids()  # fixed, not re-drawn


def test_wiki_split_names_never_reach_the_hub() -> None:
    """'train'/'test' are the synthetic splits; another string must be an existing file, else a clear error."""
    assert split_kwargs("trace_envs/WikiQA-v0", "test")["tasks"].ids() == wiki_split("test").ids()
    assert split_kwargs("trace_envs/WikiQA-v0", "all") == {"tasks": "all"}
    assert split_kwargs("trace_envs/WikiQA-v0", None) == {}  # the env's own default: its train split
    with pytest.raises(EnvSetupError, match="no split 'validation'"):
        split_kwargs("trace_envs/WikiQA-v0", "validation")
    assert split_kwargs("trace_envs/WikiQA-v0", "test", {"tasks": "all"}) == {"tasks": "all"}


def test_wiki_env_from_the_factory_serves_only_its_split() -> None:
    env = make_env_factory("trace_envs/WikiQA-v0", "test", max_turns=2)()
    try:
        held = set(wiki_split("test").ids())
        assert set(env.tasks.ids()) == held
        _, info = env.reset(seed=0)
        assert env.task.task_id in held
    finally:
        env.close()


@needs_bfcl
def test_bfcl_splits_per_category() -> None:
    from trace_envs.tasks.bfcl import BFCL_CATEGORIES, bfcl_split, load_bfcl_tasks

    for category in BFCL_CATEGORIES:
        train, test = bfcl_split(category, "train"), bfcl_split(category, "test")
        assert set(train.ids()).isdisjoint(test.ids())
        assert sorted([*train.ids(), *test.ids()]) == sorted(load_bfcl_tasks(category).ids())
        assert len(test) == 50 and len(train) == 150
    assert task_ids("trace_envs/BFCL-v0", "test", env_kwargs={"category": "miss_func"}) == \
        bfcl_split("miss_func", "test").ids()
    with pytest.raises(EnvSetupError, match="no split"):
        split_kwargs("trace_envs/BFCL-v0", "dev")
    assert split_kwargs("trace_envs/BFCL-v0", "all") == {"tasks": "all"}
    assert split_kwargs("trace_envs/BFCL-v0", None) == {}


@needs_bfcl
def test_bfcl_env_from_the_factory_steps_on_a_held_out_entry() -> None:
    """The old failure: the split string reached BFCL-v0's `tasks` ('str' object has no attribute 'ids')."""
    env = make_env_factory("trace_envs/BFCL-v0", "test", max_turns=2)()
    try:
        obs, _ = env.reset(seed=0)
        assert env.task.task_id in set(task_ids("trace_envs/BFCL-v0", "test"))
        obs, reward, terminated, truncated, _ = env.step("no call, just text")
        assert isinstance(obs, str)
    finally:
        env.close()


def test_unknown_env_id_is_a_clear_error() -> None:
    with pytest.raises(EnvSetupError, match="did you mean trace_envs/WikiQA-v0"):
        make_env_factory("trace_envs/WikiQa-v0", "train", max_turns=1)
