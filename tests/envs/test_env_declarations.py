"""Envs describe their own splits; the trainer's env factory reads the declaration, never an env id.

Every registered env's class (its spec's entry point) declares ``splits`` and resolves a split name with
the ``split_kwargs`` classmethod of :class:`~trace_envs.BranchableEnv`. An env registered here, which the
trainer has never heard of, gets its splits honoured and its errors reported the same way.
"""

from __future__ import annotations

import importlib.util

import gymnasium as gym
import pytest

import trace_envs
from tests.envs.counter_env import CounterEnv
from trace_agent.env_factory import env_class, make_env_factory, split_kwargs, task_ids
from trace_agent.errors import EnvSetupError
from trace_envs import BranchableEnv, Task, TaskSet
from trace_envs.errors import InvalidTaskError

HAS_BFCL = importlib.util.find_spec("bfcl_eval") is not None
FOURTH = "tests/Splits-v0"


class SplitCounterEnv(CounterEnv):
    """A counter env with its own split names: "easy" (targets 3, 4), "hard" (target 30), "all"."""

    env_id = FOURTH
    splits = ("easy", "hard")
    _TASKS = {"easy": [("e0", 3), ("e1", 4)], "hard": [("h0", 30)]}

    def __init__(self, *, tasks: str = "easy", **kwargs):
        super().__init__(**kwargs)
        chosen = [t for name in (self._TASKS if tasks == "all" else [tasks]) for t in self._TASKS[name]]
        self.tasks = TaskSet([Task(i, f"reach {n}", {"target": n}) for i, n in chosen], name=f"split-{tasks}")

    @classmethod
    def split_kwargs(cls, split, kwargs):
        if split not in (*cls.splits, "all"):
            raise InvalidTaskError(f"{cls.env_id} has no split {split!r}: use easy, hard or all")
        return {**kwargs, "tasks": split}


@pytest.fixture(scope="module", autouse=True)
def _fourth_env():
    gym.register(id=FOURTH, entry_point=SplitCounterEnv, order_enforce=False, disable_env_checker=True)
    yield
    gym.registry.pop(FOURTH, None)


def test_every_registered_env_declares_disjoint_splits() -> None:
    for env_id in trace_envs.registered_ids():
        cls = env_class(env_id)
        assert issubclass(cls, BranchableEnv) and cls.env_id == env_id
        assert cls.splits[0] == "train" and len(set(cls.splits)) == len(cls.splits) >= 2
        if "BFCL" in env_id and not HAS_BFCL:
            continue
        ids = [set(task_ids(env_id, split)) for split in cls.splits]
        assert all(ids), env_id
        assert sum(len(s) for s in ids) == len(set().union(*ids)), f"{env_id}: its splits overlap"
        with pytest.raises((EnvSetupError, ValueError, OSError)):  # refused by the declaration or the constructor
            task_ids(env_id, "no/such/split.jsonl")


def test_an_env_the_trainer_never_heard_of_gets_its_splits() -> None:
    assert split_kwargs(FOURTH, "hard", {"leak_state": False}) == {"leak_state": False, "tasks": "hard"}
    assert split_kwargs(FOURTH, None) == {} and split_kwargs(FOURTH, "hard", {"tasks": "all"}) == {"tasks": "all"}
    assert task_ids(FOURTH, "hard") == ["h0"] and task_ids(FOURTH, "all") == ["e0", "e1", "h0"]
    env = make_env_factory(FOURTH, "easy", max_turns=2)()
    try:
        _, info = env.reset(seed=0)
        assert env.task.task_id in {"e0", "e1"} and env.max_turns == 2
    finally:
        env.close()
    with pytest.raises(EnvSetupError, match="has no split 'medium': use easy, hard or all"):
        make_env_factory(FOURTH, "medium", max_turns=1)


def test_the_default_declaration_passes_the_split_to_the_constructor() -> None:
    assert BranchableEnv.split_kwargs("test", {"x": 1}) == {"x": 1, "tasks": "test"}
    assert CounterEnv.splits == ("train", "test")


def test_trl_refuses_what_an_env_declares_it_cannot_serve() -> None:
    """TRL's adapter reads the declarations (same_tools, multi_user_turn), not a table of env ids."""
    from trace_agent.integrations.trl_env import UNSUPPORTED, unsupported_reason

    class Chat(SplitCounterEnv):
        multi_user_turn = True

    gym.register(id="tests/Chat-v0", entry_point=Chat, order_enforce=False, disable_env_checker=True)
    try:
        assert unsupported_reason(FOURTH) is None
        reason = unsupported_reason("tests/Chat-v0")
        assert reason is not None and reason.startswith("Chat-v0 cannot be exposed")
        assert "several user turns" in reason and "differ per task" not in reason
    finally:
        gym.registry.pop("tests/Chat-v0", None)
    declared = {i for i in trace_envs.registered_ids()
                if not env_class(i).same_tools or env_class(i).multi_user_turn}
    assert set(UNSUPPORTED) == declared and declared  # the suite has one such env (BFCL-v0)
