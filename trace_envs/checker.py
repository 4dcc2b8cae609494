"""check_branchable_env: Gymnasium's ``check_env`` plus the snapshot laws.

Each law is a small ``check_*`` function that raises ``AssertionError`` with a
message naming the law and the first difference. The test suite runs
:func:`check_branchable_env` over every registered id, so a new env gets the
laws for free. The actions used come from ``env.conformance_actions()``.

A wrapped env is checked through its whole chain: steps and resets go through
the outermost wrapper and save points are taken with
:func:`trace_envs.wrappers.snapshot` / :func:`~trace_envs.wrappers.restore`, so
the wrappers' own state (``TimeLimit``'s step count, ...) is under the laws too.

The wrapper laws (8-10) hold Gymnasium's own idioms to the same standard: a method reached
with ``get_wrapper_attr`` through wrappers added after ``gym.make`` branches the whole chain
(:func:`check_wrapper_attr_branching`); vector-env snapshot handles carry the state of the
wrappers given to ``make_vec`` (:func:`check_vector_handles`); ``call("snapshot")`` on an
``AsyncVectorEnv`` is refused in the caller and the workers keep working
(:func:`check_async_snapshot_refused`). The vector laws take an env id and start sub-envs, so
:func:`check_branchable_env` runs them only when given ``vector=True``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import gymnasium as gym
from gymnasium.utils.env_checker import check_env

from trace_envs import wrappers as _wrappers
from trace_envs.core import Snapshot, Task
from trace_envs.errors import ForeignSnapshotError, SnapshotError

__all__ = [
    "check_branchable_env",
    "check_gymnasium_api",
    "check_replay",
    "check_reuse",
    "check_isolation",
    "check_longevity",
    "check_foreign_snapshot_refused",
    "check_foreign_chain_refused",
    "check_opening_messages",
    "check_wrapper_attr_branching",
    "check_vector_handles",
    "check_async_snapshot_refused",
    "ChainView",
]

Transition = tuple[str, float, bool, bool]


def _play(env: Any, actions: Sequence[str]) -> list[Transition]:
    """Step until the actions run out or the episode ends; return (obs, reward, terminated, truncated)."""
    out: list[Transition] = []
    for action in actions:
        obs, reward, terminated, truncated, _ = env.step(action)
        out.append((obs, float(reward), bool(terminated), bool(truncated)))
        if terminated or truncated:
            break
    return out


def _diff(law: str, expected: list[Transition], got: list[Transition]) -> str:
    for i, (a, b) in enumerate(zip(expected, got)):
        if a != b:
            return f"{law}: turn {i + 1} differs:\n  expected {a!r:.300}\n  got      {b!r:.300}"
    return f"{law}: {len(expected)} transitions expected, got {len(got)}"


def _reset_to(env: Any, seed: int, task_id: str) -> None:
    env.reset(seed=seed, options={"task_id": task_id})


def _split(actions: Sequence[str]) -> tuple[list[str], list[str], list[str]]:
    """Prefix to play before the snapshot, branch A and a different branch B."""
    cut = max(1, len(actions) // 2)
    prefix, branch_a = list(actions[:cut]), list(actions[cut:]) or list(actions[:1])
    branch_b = list(reversed(actions))
    return prefix, branch_a, branch_b


def check_replay(env: Any, actions: Sequence[str], seed: int, task_id: str) -> None:
    """Law 1: restore, then the same actions give the same observations, rewards and flags."""
    prefix, branch, _ = _split(actions)
    _reset_to(env, seed, task_id)
    _play(env, prefix)
    snap = env.snapshot()
    first = _play(env, branch)
    env.restore(snap)
    again = _play(env, branch)
    assert first == again, _diff("replay", first, again)


def check_reuse(env: Any, actions: Sequence[str], seed: int, task_id: str, times: int = 3) -> None:
    """Law 2: one snapshot restored many times gives identical branches, and its digest never changes."""
    prefix, branch, _ = _split(actions)
    _reset_to(env, seed, task_id)
    _play(env, prefix)
    snap = env.snapshot()
    digest = snap.digest()
    runs = []
    for _ in range(times):
        env.restore(snap)
        runs.append(_play(env, branch))
    for run in runs[1:]:
        assert run == runs[0], _diff("reuse", runs[0], run)
    assert snap.digest() == digest, "reuse: restoring and stepping changed the snapshot"


def check_isolation(env: Any, actions: Sequence[str], seed: int, task_id: str) -> None:
    """Law 3: stepping a branch never changes a snapshot or another branch."""
    prefix, branch_a, branch_b = _split(actions)
    _reset_to(env, seed, task_id)
    _play(env, prefix)
    snap = env.snapshot()
    digest = snap.digest()
    reference = _play(env, branch_a)
    env.restore(snap)
    _play(env, branch_b)  # a different branch, which may change tool state
    mid = env.snapshot()
    env.restore(snap)
    after_b = _play(env, branch_a)
    assert after_b == reference, _diff("isolation (branch B leaked into branch A)", reference, after_b)
    assert snap.digest() == digest, "isolation: stepping a branch changed the snapshot"
    env.restore(mid)  # the other branch's snapshot is still intact after A ran again
    mid.release()


def check_longevity(env: Any, actions: Sequence[str], seed: int, task_id: str, other_seed: int) -> None:
    """Law 4: a snapshot stays valid across later steps, restores and resets of its env."""
    prefix, branch, _ = _split(actions)
    _reset_to(env, seed, task_id)
    _play(env, prefix)
    snap = env.snapshot()
    reference = _play(env, branch)
    env.restore(snap)
    _play(env, branch[:1])
    env.reset(seed=other_seed)  # possibly another task
    _play(env, actions[:1])
    _reset_to(env, seed + 1, task_id)
    env.restore(snap)
    later = _play(env, branch)
    assert later == reference, _diff("longevity", reference, later)


def check_foreign_snapshot_refused(env: Any, seed: int, task_id: str, other_task_id: str | None) -> None:
    """Law 5: snapshots of another env id, configuration or task are refused with a clear error."""
    _reset_to(env, seed, task_id)
    snap = env.snapshot()
    foreign = [
        replace(snap, env_id="trace_envs/SomeOtherEnv-v0"),
        replace(snap, config_key=snap.config_key + "|other"),
        replace(snap, task=Task(task_id=snap.task_id, prompt=snap.task.prompt + " (edited)", data=snap.task.data)),
    ]
    if other_task_id is not None:
        _reset_to(env, seed, other_task_id)
        foreign.append(snap)  # a snapshot of task_id while the env holds other_task_id
    for bad in foreign:
        try:
            env.restore(bad)
        except ForeignSnapshotError as exc:
            assert str(exc), "foreign snapshot: the error has no message"
        else:
            raise AssertionError(f"foreign snapshot accepted: {bad!r}")
    try:
        env.restore("not a snapshot")
    except Exception as exc:  # noqa: BLE001 - any clear error is fine, but it must be an error
        assert str(exc), "restore(non-snapshot): the error has no message"
    else:
        raise AssertionError("restore() accepted a non-Snapshot")


def check_foreign_chain_refused(env: gym.Env, seed: int, task_id: str) -> None:
    """Law 5b: a snapshot taken through other wrappers (or none) is refused by a wrapped env."""
    _, base = _wrappers.wrapper_chain(env)
    if not _wrappers.chain_key(env):
        return
    env.reset(seed=seed, options={"task_id": task_id})
    snap = _wrappers.snapshot(env)
    foreign = [base.snapshot(), replace(snap, wrapper_states=snap.wrapper_states[:-1]),
               replace(snap, wrapper_states=(("some.module:OtherWrapper", None), *snap.wrapper_states[1:]))]
    for bad in foreign:
        try:
            _wrappers.restore(env, bad)
        except ForeignSnapshotError as exc:
            assert str(exc), "foreign chain: the error has no message"
        else:
            raise AssertionError(f"a snapshot taken through other wrappers was accepted: {bad.wrapper_states!r}")
    _wrappers.restore(env, snap)


class ChainView:
    """``env`` (possibly wrapped) seen by the laws: its own ``reset``/``step``, and
    :func:`trace_envs.wrappers.snapshot` / :func:`~trace_envs.wrappers.restore` over its whole chain."""

    def __init__(self, env: gym.Env) -> None:
        self.env = env

    def reset(self, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        return self.env.reset(**kwargs)

    def step(self, action: str) -> tuple[Any, Any, bool, bool, dict[str, Any]]:
        return self.env.step(action)

    def snapshot(self) -> Snapshot:
        return _wrappers.snapshot(self.env)

    def restore(self, snapshot: Snapshot) -> None:
        _wrappers.restore(self.env, snapshot)


def check_opening_messages(env: Any, seed: int, task_id: str) -> None:
    """Law 7: an env that tells its opening messages without a reset tells the ones a reset gives, mid-episode too."""
    base = env.unwrapped
    told = base.opening_messages(task_id, seed=seed)
    if told is None:
        return
    _reset_to(env, seed, task_id)
    assert told == base.messages, f"opening_messages({task_id!r}) differs from the messages reset gives"
    env.step(base.conformance_actions()[0])
    during = list(base.messages)
    assert base.opening_messages(task_id, seed=seed) == told and base.messages == during, \
        "opening_messages must not touch the running episode"


def _counters(outer: gym.Wrapper) -> tuple[Any, ...]:
    limit = outer.env
    return (limit._elapsed_steps, outer.episode_lengths, float(outer.episode_returns))


def check_wrapper_attr_branching(env: gym.Env, actions: Sequence[str], seed: int, task_id: str) -> None:
    """Law 8: ``get_wrapper_attr("snapshot"/"restore")`` through wrappers added later branches the whole chain.

    ``env`` is wrapped in ``RecordEpisodeStatistics(TimeLimit(env, n))``; after a branch, the restore
    reached through ``get_wrapper_attr`` must put back the env, ``TimeLimit``'s step count and the
    episode statistics (never a half restore), and replaying gives the same transitions.
    An env with no :class:`~trace_envs.wrappers.BranchableWrapper` (a bare env, not made by ``gym.make``)
    must refuse instead, with an error naming ``trace_envs.wrappers.snapshot``.
    """
    wrappers, _ = _wrappers.wrapper_chain(env)
    if not any(isinstance(w, _wrappers.BranchableWrapper) for w in wrappers):
        limited = gym.wrappers.TimeLimit(env, max_episode_steps=len(actions) + 8)
        _reset_to(limited, seed, task_id)
        try:
            limited.get_wrapper_attr("snapshot")()
        except SnapshotError as exc:
            assert "trace_envs.wrappers.snapshot" in str(exc), f"get_wrapper_attr refusal: {exc}"
            return
        raise AssertionError("get_wrapper_attr('snapshot') through TimeLimit on a bare env neither branched the "
                             "whole chain nor refused: a half snapshot")
    prefix, branch, _ = _split(actions)
    outer = gym.wrappers.RecordEpisodeStatistics(gym.wrappers.TimeLimit(env, max_episode_steps=len(actions) + 8),
                                                 stats_key="check_wrapper_attr_episode")  # env may record its own
    _reset_to(outer, seed, task_id)
    _play(outer, prefix)
    snap = outer.get_wrapper_attr("snapshot")()
    saved = _counters(outer)
    first = _play(outer, branch)
    outer.get_wrapper_attr("restore")(snap)
    assert _counters(outer) == saved, (f"get_wrapper_attr restore: the outer wrappers' state is {_counters(outer)}, "
                                       f"expected {saved} (TimeLimit steps, episode length, return): a half restore")
    again = _play(outer, branch)
    assert first == again, _diff("get_wrapper_attr replay", first, again)


def _vector_counters(venv: Any) -> tuple[Any, ...]:
    return tuple(tuple(x) for x in (venv.call("turn"), venv.get_attr("episode_lengths"), venv.get_attr("_elapsed_steps")))


#: A turn every env answers with an error observation (it neither ends the episode nor needs a task).
_IDLE = "still thinking"


def check_vector_handles(env_id: str, *, mode: str = "sync", seed: int = 0, **kwargs: Any) -> None:
    """Law 9: ``make_vec(env_id, 2, wrappers=[...])`` snapshot handles carry the added wrappers' state."""
    from trace_envs.vector import restore_handles, snapshot_handles

    venv = gym.make_vec(env_id, num_envs=2, vectorization_mode=mode,
                        wrappers=[lambda e: gym.wrappers.TimeLimit(e, max_episode_steps=50),
                                  gym.wrappers.RecordEpisodeStatistics],
                        vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.DISABLED}, **kwargs)
    try:
        venv.reset(seed=seed)
        venv.step((_IDLE, _IDLE))
        handles = snapshot_handles(venv)
        saved = _vector_counters(venv)
        venv.step((_IDLE, _IDLE))
        restore_handles(venv, handles)
        assert _vector_counters(venv) == saved, (f"vector handles: after restore (turn, episode length, TimeLimit "
                                                 f"steps) are {_vector_counters(venv)}, expected {saved}")
    finally:
        venv.close()


def check_async_snapshot_refused(env_id: str, *, seed: int = 0, **kwargs: Any) -> None:
    """Law 10: ``call("snapshot")`` on an ``AsyncVectorEnv`` raises in the caller naming ``snapshot_handle``;
    the workers survive (the next calls work)."""
    venv = gym.make_vec(env_id, num_envs=2, vectorization_mode="async", **kwargs)
    try:
        venv.reset(seed=seed)
        try:
            venv.call("snapshot")
        except SnapshotError as exc:
            assert "snapshot_handle" in str(exc), f"async snapshot: the error does not name snapshot_handle: {exc}"
        else:
            raise AssertionError("venv.call('snapshot') on an AsyncVectorEnv returned instead of raising")
        assert tuple(venv.call("turn")) == (0, 0), "async snapshot: the workers did not survive the refusal"
        handles = venv.call("snapshot_handle")
        assert tuple(venv.call("restore_handle", handles)) == (True, True), "async snapshot: handles broke after it"
    finally:
        venv.close()


def check_gymnasium_api(env: gym.Env) -> None:
    """Law 6: Gymnasium's own ``check_env`` passes."""
    check_env(env.unwrapped, skip_render_check=False)


def check_branchable_env(
    env: gym.Env,
    *,
    seed: int = 0,
    task_id: str | None = None,
    actions: Sequence[str] | None = None,
    vector: bool = False,
) -> None:
    """Run every law on ``env`` (a BranchableEnv, possibly wrapped); raise AssertionError on the first failure.

    A wrapped env is stepped through its outermost wrapper and branched over its whole chain
    (see :class:`ChainView`); its wrappers' classes must match for a snapshot to be restored.

    Args:
        seed: the reset seed used for every episode.
        task_id: the task to test on (default: the first of the env's task set).
        actions: turns that change the env's state (default: ``env.conformance_actions()``
            after resetting to the task).
        vector: also run the vector laws (9, 10) on ``env.spec.id`` with its ``spec.kwargs``
            (starts sync and async sub-envs of it).
    """
    branchable = ChainView(env)
    _, base = _wrappers.wrapper_chain(env)
    ids = base.tasks.ids()
    task_id = task_id if task_id is not None else ids[0]
    other_task_id = next((t for t in ids if t != task_id), None)
    if actions is None:
        _reset_to(branchable, seed, task_id)
        actions = base.conformance_actions()
    assert len(actions) >= 2, "check_branchable_env needs at least two actions"
    check_replay(branchable, actions, seed, task_id)
    check_reuse(branchable, actions, seed, task_id)
    check_isolation(branchable, actions, seed, task_id)
    check_longevity(branchable, actions, seed, task_id, other_seed=seed + 17)
    check_foreign_snapshot_refused(branchable, seed, task_id, other_task_id)
    check_foreign_chain_refused(env, seed, task_id)
    check_opening_messages(env, seed, task_id)
    check_wrapper_attr_branching(env, actions, seed, task_id)
    if vector:
        if env.spec is None:
            raise ValueError("vector=True needs an env made by gym.make (its spec names the id to vectorise)")
        kwargs = dict(env.spec.kwargs)
        check_vector_handles(env.spec.id, seed=seed, **kwargs)
        check_async_snapshot_refused(env.spec.id, seed=seed, **kwargs)
    check_gymnasium_api(env)
    assert isinstance(base.snapshot(), Snapshot)
