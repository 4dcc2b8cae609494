"""Branching through wrapper chains, and snapshot handles for vector envs.

:func:`snapshot` / :func:`restore` save and load a whole wrapper chain: the
returned :class:`~trace_envs.core.Snapshot` is the innermost env's own snapshot
with each wrapper's state in ``wrapper_states`` (innermost first, keyed by the
wrapper's class). They work on any chain whose innermost env is a
:class:`~trace_envs.core.BranchableEnv`, including wrappers a user adds after
``gym.make``. A wrapper's state is, in this order of precedence:

1. what its own ``snapshot_state()`` returns, loaded back by ``restore_state(state)``;
2. for a :class:`BranchableWrapper`, its ``wrapper_state()`` /
   ``load_wrapper_state(state)``;
3. for the stock Gymnasium wrappers listed in :data:`STOCK_WRAPPER_STATE` (exact
   class, not subclasses), the counters named there (``TimeLimit._elapsed_steps``,
   ``RecordEpisodeStatistics``' episode return, length, start time and queues, ...);
4. otherwise a deep copy of every instance attribute except ``env``, the spaces,
   metadata, spec and recorded constructor arguments; a restore sets these
   attributes back exactly (attributes added since are removed). References to
   objects of the chain itself (the env, other wrappers) are kept, not copied. A
   wrapper holding something that cannot be deep-copied (a lock, an open file, a
   process) is refused with :class:`~trace_envs.errors.SnapshotError` naming the
   attribute: give it hooks (1).

Wrappers that hold no branch state (``BranchingWrapper`` itself and
``PassiveEnvChecker``, by exact class) are left out of a snapshot, so the bare
env's snapshot restores through ``gym.make(id)`` and the other way round.
States are deep-copied when taken and again when loaded, so one snapshot can be
restored any number of times. A snapshot is refused with
:class:`~trace_envs.errors.ForeignSnapshotError` when its wrapper classes differ
from the chain's, and by the innermost env when it is of another env id,
configuration or task.

``gym.make`` of a suite id returns a :class:`BranchingWrapper` as the outermost
wrapper, so ``gym.make(id, max_episode_steps=n).snapshot()`` branches the
``TimeLimit`` below it too. Gymnasium's own way to reach a method through wrappers
added later, ``env.get_wrapper_attr("snapshot")()`` / ``("restore")(snap)`` (and the
handle methods, which ``VectorEnv.call`` reaches the same way), branches the whole
chain from the wrapper it was called on: :meth:`BranchingWrapper.get_wrapper_attr`
binds these methods to the outermost wrapper of the ``get_wrapper_attr`` calls that led to it.
So ``make_vec(id, n, wrappers=[...])`` handles carry the added wrappers' state too.
In an ``AsyncVectorEnv`` worker, ``call("snapshot")`` is refused (a Snapshot holds live
state and cannot cross the process boundary): the caller gets a
:class:`~trace_envs.errors.SnapshotError` naming ``snapshot_handle``, and the workers go on. Its ``snapshot_handle()`` / ``restore_handle()`` /
``release_handle()`` keep the snapshot inside the process that owns the env and
pass a small picklable :class:`SnapshotHandle` instead, for ``AsyncVectorEnv``
(see :mod:`trace_envs.vector`).
"""

from __future__ import annotations

import copy
import itertools
import os
import sys
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, ClassVar

import gymnasium as gym
from gymnasium.utils import RecordConstructorArgs

from trace_envs._async_refusal import in_async_worker, refused_snapshot
from trace_envs.core import BranchableEnv, Snapshot
from trace_envs.errors import ForeignSnapshotError, SnapshotError

__all__ = [
    "STOCK_WRAPPER_STATE",
    "HandleArg",
    "BranchingWrapper",
    "SnapshotHandle",
    "snapshot",
    "restore",
    "wrapper_chain",
    "chain_key",
    "BranchableWrapper",
    "find_branchable",
    "CHAIN_METHODS",
]

#: The methods :meth:`BranchingWrapper.get_wrapper_attr` binds to the whole chain it was reached through.
CHAIN_METHODS = frozenset({"snapshot", "restore", "snapshot_handle", "restore_handle", "release_handle"})

#: Stock Gymnasium wrappers (matched by exact class) and the attributes that make up their state.
STOCK_WRAPPER_STATE: dict[type[gym.Wrapper], tuple[str, ...]] = {
    gym.wrappers.TimeLimit: ("_elapsed_steps",),
    gym.wrappers.OrderEnforcing: ("_has_reset",),
    gym.wrappers.Autoreset: ("autoreset",),
    gym.wrappers.RecordEpisodeStatistics: (
        "episode_count", "episode_start_time", "episode_returns", "episode_lengths",
        "time_queue", "return_queue", "length_queue",
    ),
}

_STATELESS: tuple[type[gym.Wrapper], ...] = (gym.wrappers.PassiveEnvChecker,)

_NOT_STATE = frozenset({
    "env", "_action_space", "_observation_space", "_metadata", "_cached_spec", "_saved_kwargs", "_reward_range",
})


def wrapper_chain(env: gym.Env) -> tuple[list[gym.Wrapper], BranchableEnv]:
    """The wrappers of ``env`` from the outermost in, and the innermost env.

    Raises:
        TypeError: the innermost env is not a BranchableEnv.
    """
    wrappers: list[gym.Wrapper] = []
    current: Any = env
    while isinstance(current, gym.Wrapper):
        wrappers.append(current)
        current = current.env
    if not isinstance(current, BranchableEnv):
        raise TypeError(f"{type(env).__name__} does not wrap a BranchableEnv (innermost: {type(current).__name__})")
    return wrappers, current


def _stateful(wrappers: Sequence[gym.Wrapper]) -> list[gym.Wrapper]:
    """The wrappers that take part in a snapshot, innermost first."""
    return [w for w in reversed(wrappers) if type(w) not in _STATELESS and type(w) is not BranchingWrapper]


def _key(wrapper: gym.Wrapper) -> str:
    cls = type(wrapper)
    return f"{cls.__module__}:{cls.__qualname__}"


def chain_key(env: gym.Env) -> tuple[str, ...]:
    """The wrapper classes of ``env``'s chain a snapshot records, innermost first."""
    wrappers, _ = wrapper_chain(env)
    return tuple(_key(w) for w in _stateful(wrappers))


def _own_hooks(wrapper: gym.Wrapper) -> tuple[Any, Any] | None:
    cls = type(wrapper)
    if callable(getattr(cls, "snapshot_state", None)) and callable(getattr(cls, "restore_state", None)):
        return wrapper.snapshot_state, wrapper.restore_state  # type: ignore[attr-defined]
    if isinstance(wrapper, BranchableWrapper):
        return wrapper.wrapper_state, wrapper.load_wrapper_state
    return None


def _copy(value: Any, keep: Sequence[Any], what: str) -> Any:
    memo: dict[int, Any] = {id(obj): obj for obj in keep}
    try:
        return copy.deepcopy(value, memo)
    except Exception as exc:  # noqa: BLE001 - any failure to copy means the state cannot be branched
        raise SnapshotError(
            f"{what} cannot be copied into a snapshot ({type(exc).__name__}: {exc}); give the wrapper "
            f"snapshot_state()/restore_state() hooks"
        ) from exc


def _copy_fields(fields: Mapping[str, Any], keep: Sequence[Any], name: str) -> dict[str, Any]:
    """Deep-copy ``fields`` with one memo (shared references stay shared); name the culprit on failure."""
    try:
        return _copy(dict(fields), keep, name)
    except SnapshotError:
        for attr, value in fields.items():
            _copy(value, keep, f"{name}.{attr}")
        raise


def _take_state(wrapper: gym.Wrapper, keep: Sequence[Any]) -> Any:
    name = type(wrapper).__qualname__
    hooks = _own_hooks(wrapper)
    if hooks is not None:
        return _copy(hooks[0](), keep, f"the state {name}'s hook returned")
    attrs = STOCK_WRAPPER_STATE.get(type(wrapper))
    if attrs is not None:
        return _copy_fields({a: getattr(wrapper, a) for a in attrs}, keep, name)
    fields = getattr(wrapper, "__dict__", None)
    if fields is None:
        raise SnapshotError(f"{name} has no instance __dict__: give it snapshot_state()/restore_state() hooks")
    return _copy_fields({a: v for a, v in fields.items() if a not in _NOT_STATE}, keep, name)


def _loader(wrapper: gym.Wrapper, state: Any, keep: Sequence[Any]) -> Callable[[], None]:
    """Copy ``state`` for ``wrapper`` now; the returned call loads the copy (so a failed copy changes nothing)."""
    name = type(wrapper).__qualname__
    hooks = _own_hooks(wrapper)
    if hooks is not None:
        value = _copy(state, keep, f"the saved state of {name}")
        load = hooks[1]
        return lambda: load(value)
    if not isinstance(state, Mapping):
        raise SnapshotError(f"the saved state of {name} is a {type(state).__name__}, not its attributes")
    values = _copy_fields(state, keep, name)
    generic = type(wrapper) not in STOCK_WRAPPER_STATE

    def load() -> None:
        if generic:
            for stale in [a for a in vars(wrapper) if a not in _NOT_STATE and a not in values]:
                delattr(wrapper, stale)
        for attr, value in values.items():
            setattr(wrapper, attr, value)

    return load


def _keep(wrappers: Sequence[gym.Wrapper], base: BranchableEnv) -> list[Any]:
    return [*wrappers, base]


def snapshot(env: gym.Env) -> Snapshot:
    """Save ``env`` and every wrapper around it (see the module docstring for what a wrapper's state is).

    With no wrappers that hold state this is the innermost env's own ``snapshot()``.

    Raises:
        TypeError: the chain does not end in a BranchableEnv.
        SnapshotError: a wrapper's state cannot be copied.
        ResetNeededError: the env has not been reset.
    """
    wrappers, base = wrapper_chain(env)
    stateful = _stateful(wrappers)
    if not stateful:
        return base.snapshot()
    keep = _keep(wrappers, base)
    states = tuple((_key(w), _take_state(w, keep)) for w in stateful)
    inner = base.snapshot()
    return replace(inner, wrapper_states=states, snapshot_id=inner.snapshot_id)


def restore(env: gym.Env, snap: Snapshot) -> None:
    """Put ``env`` and every wrapper around it back where :func:`snapshot` took ``snap``.

    Raises:
        SnapshotError: ``snap`` is not a Snapshot, or was released.
        ForeignSnapshotError: ``snap`` was taken through other wrapper classes than this chain's,
            or is of another env id, configuration or task.
    """
    wrappers, base = wrapper_chain(env)
    if not isinstance(snap, Snapshot):
        raise SnapshotError(f"restore() takes a Snapshot, got {type(snap).__name__}")
    stateful = _stateful(wrappers)
    expected = tuple(_key(w) for w in stateful)
    got = tuple(key for key, _ in snap.wrapper_states)
    if got != expected:
        raise ForeignSnapshotError(
            f"{snap!r} was taken through the wrappers {list(got) or 'none'} (innermost first) but this "
            f"chain has {list(expected) or 'none'}: restore it into a chain of the same wrappers"
        )
    keep = _keep(wrappers, base)
    loaders = [_loader(w, state, keep) for w, (_, state) in zip(stateful, snap.wrapper_states)]
    base.restore(snap)
    for load in loaders:
        load()


def _chain_head(wrapper: gym.Wrapper, frame: Any) -> gym.Wrapper:
    """The outermost wrapper of the ``get_wrapper_attr`` calls on the stack that led down to ``wrapper``.

    Gymnasium's ``Wrapper.get_wrapper_attr(name)`` asks ``self.env.get_wrapper_attr(name)`` when it
    lacks ``name``; each such frame's ``self`` wraps the one below it.
    """
    head: gym.Wrapper = wrapper
    while frame is not None and frame.f_code.co_name == "get_wrapper_attr":
        outer = frame.f_locals.get("self")
        if outer is head:  # a subclass's override calling up to Wrapper.get_wrapper_attr: the same wrapper
            frame = frame.f_back
            continue
        if not isinstance(outer, gym.Wrapper) or outer.__dict__.get("env") is not head:
            break
        head = outer
        frame = frame.f_back
    return head


@dataclass(frozen=True)
class SnapshotHandle:
    """A picklable reference to a snapshot held by the :class:`BranchingWrapper` that took it.

    Plain data only (no sandbox, lock or payload), so it crosses process
    boundaries; only its owner (``owner`` is that wrapper's :attr:`BranchingWrapper.branch_owner`)
    can restore or release it.
    """

    owner: str
    number: int
    env_id: str
    config_key: str
    task_id: str
    turn: int
    done: bool

    def __repr__(self) -> str:
        return f"SnapshotHandle(#{self.number} of {self.owner} {self.env_id} task={self.task_id!r} turn={self.turn})"


#: What ``restore_handle`` / ``release_handle`` take: one handle, a sequence of them, or ``{branch_owner: handle}``.
HandleArg = SnapshotHandle | Sequence[SnapshotHandle | None] | Mapping[str, SnapshotHandle | None]


def find_branchable(env: gym.Env) -> BranchableEnv | BranchableWrapper:
    """The outermost object in a wrapper chain that has ``snapshot()``/``restore()``."""
    current: Any = env
    while True:
        if isinstance(current, (BranchableEnv, BranchableWrapper)):
            return current
        inner = getattr(current, "env", None)
        if inner is None:
            raise TypeError(f"{type(env).__name__} does not wrap a BranchableEnv")
        current = inner


class BranchableWrapper(gym.Wrapper[str, str, str, str]):
    """Base for user wrappers of a branchable env: forwards ``snapshot``/``restore``.

    Gymnasium 1.x wrappers do not forward attributes. Subclass this instead of
    ``gym.Wrapper``; a wrapper that keeps its own state overrides
    ``wrapper_state()`` / ``load_wrapper_state()`` and that state travels in the snapshot.
    ``snapshot()`` / ``restore()`` cover this wrapper and every wrapper below it
    (see :func:`snapshot`); reached with ``get_wrapper_attr`` through wrappers above it, they cover
    those too (:meth:`get_wrapper_attr`).
    """

    def wrapper_state(self) -> Any:
        return None

    def load_wrapper_state(self, state: Any) -> None:
        """Load a value made by ``wrapper_state`` (must not keep references into it)."""

    def snapshot(self) -> Snapshot:
        return snapshot(self)

    def restore(self, snapshot: Snapshot) -> None:
        restore(self, snapshot)

    def get_wrapper_attr(self, name: str) -> Any:
        """Gymnasium's ``get_wrapper_attr``, with the branching methods bound to the whole chain.

        Reached through outer wrappers (``RecordEpisodeStatistics(TimeLimit(gym.make(id), 3))
        .get_wrapper_attr("snapshot")``), ``snapshot`` / ``restore`` and (on a :class:`BranchingWrapper`)
        the handle methods (:data:`CHAIN_METHODS`) branch the chain from the outermost of those wrappers, so no
        wrapper's state is left behind. In an ``AsyncVectorEnv`` worker, ``snapshot`` returns a
        value whose arrival raises :class:`SnapshotError` in the caller (use ``snapshot_handle``).
        """
        if name not in CHAIN_METHODS or not hasattr(self, name):
            return super().get_wrapper_attr(name)
        caller = sys._getframe(1)
        if name == "snapshot" and in_async_worker(caller):
            return refused_snapshot
        head = _chain_head(self, caller)
        if head is self:
            return getattr(self, name)
        return getattr(_HeadBound(self, head), name)


class BranchingWrapper(BranchableWrapper, RecordConstructorArgs):
    """The outermost wrapper ``gym.make`` puts on the suite's envs: branching over the chain below it.

    ``snapshot()`` / ``restore()`` save and load the env and every wrapper
    between the env and this one (``TimeLimit`` from ``max_episode_steps``, ...) via
    :func:`snapshot` / :func:`restore`. Wrappers added on top of it later are not
    seen by these methods: call ``trace_envs.wrappers.snapshot(outer)`` /
    ``restore(outer, snap)`` on the outermost wrapper instead.

    Reads of public attributes it lacks fall through to the wrappers and env
    below (``gym.make(id).tools``, ``.messages``, ``.task``); assignments stay
    on this wrapper, as with any Gymnasium wrapper (``set_wrapper_attr`` sets
    the attribute where it is defined).

    For vector envs, ``snapshot_handle()`` keeps the snapshot here and returns a
    :class:`SnapshotHandle`; ``restore_handle()`` / ``release_handle()`` take it
    back. Handles survive resets; ``close()`` releases them all.
    """

    _handle_numbers: ClassVar[itertools.count[int]] = itertools.count(1)

    def __init__(self, env: gym.Env) -> None:
        RecordConstructorArgs.__init__(self)
        super().__init__(env)
        self._branch_owner = f"pid{os.getpid()}-{uuid.uuid4().hex[:12]}"
        self._held: dict[int, Snapshot] = {}

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        inner = self.__dict__.get("env")
        if inner is None:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        return inner.get_wrapper_attr(name)

    def set_wrapper_attr(self, name: str, value: Any, *, force: bool = True) -> bool:
        """Set ``name`` where it is defined in the chain (this wrapper, or below); else here if ``force``."""
        if name in self.__dict__ or hasattr(type(self), name):
            setattr(self, name, value)
            return True
        if self.env.set_wrapper_attr(name, value, force=False):
            return True
        if force:
            setattr(self, name, value)
            return True
        return False

    def wrapper_state(self) -> None:
        """This wrapper's branch state: none (held handles are not part of a branch)."""
        return None

    @property
    def branch_owner(self) -> str:
        """A token unique to this wrapper instance, recorded in the handles it hands out."""
        return self._branch_owner

    @property
    def held_handles(self) -> int:
        """How many snapshots this wrapper holds for handles not yet released."""
        return len(self._held)

    def snapshot_handle(self) -> SnapshotHandle:
        """Take ``snapshot()``, keep it here, and return a picklable handle to it."""
        return self._snapshot_handle(self)

    def _snapshot_handle(self, head: gym.Env) -> SnapshotHandle:
        snap = snapshot(head)
        number = next(self._handle_numbers)
        self._held[number] = snap
        return SnapshotHandle(owner=self._branch_owner, number=number, env_id=snap.env_id,
                              config_key=snap.config_key, task_id=snap.task_id, turn=snap.turn, done=snap.done)

    def _mine(self, handles: HandleArg, *, strict: bool) -> list[SnapshotHandle]:
        if isinstance(handles, SnapshotHandle):
            if handles.owner != self._branch_owner:
                raise ForeignSnapshotError(
                    f"{handles!r} was taken by another env ({handles.owner}); this env is {self._branch_owner}"
                )
            return [handles]
        if isinstance(handles, Mapping):
            entry = handles.get(self._branch_owner)
            return [] if entry is None else self._mine(entry, strict=True)
        if isinstance(handles, Sequence) and not isinstance(handles, (str, bytes)):
            for entry in handles:
                if entry is not None and not isinstance(entry, SnapshotHandle):
                    raise SnapshotError(f"expected SnapshotHandle entries, got {type(entry).__name__}")
            mine = [h for h in handles if h is not None and h.owner == self._branch_owner]
            if strict and not mine:
                raise ForeignSnapshotError(
                    f"none of {list(handles)!r} was taken by this env ({self._branch_owner})"
                )
            return mine
        raise SnapshotError(f"expected a SnapshotHandle, a sequence or a mapping of them, got {type(handles).__name__}")

    def restore_handle(self, handles: HandleArg) -> bool:
        """Restore the snapshot behind a handle this wrapper handed out.

        Args:
            handles: a :class:`SnapshotHandle`; or a sequence of them (``None`` entries allowed), such
                as ``vector_env.call("snapshot_handle")`` returns, of which this env restores the
                one it owns; or a mapping ``{branch_owner: handle or None}``, of which it restores
                its own entry, if any.

        Returns:
            True when a snapshot was restored, False when the mapping had no entry for this env.

        Raises:
            ForeignSnapshotError: the handle (or, in a sequence, every handle) belongs to another env.
            SnapshotError: the handle was released, or the sequence holds two of this env's handles.
        """
        return self._restore_handle(self, handles)

    def _restore_handle(self, head: gym.Env, handles: HandleArg) -> bool:
        mine = self._mine(handles, strict=True)
        if not mine:
            return False
        if len(mine) > 1:
            raise SnapshotError(f"{len(mine)} handles of this env given ({mine!r}): pass one")
        snap = self._held.get(mine[0].number)
        if snap is None:
            raise SnapshotError(f"{mine[0]!r} was released")
        restore(head, snap)
        return True

    def release_handle(self, handles: HandleArg) -> int:
        """Free the snapshots behind this env's handles among ``handles`` (forms as :meth:`restore_handle`).

        Releasing twice is a no-op; in a sequence or mapping, other envs' handles are ignored.

        Returns:
            The number of snapshots freed.

        Raises:
            ForeignSnapshotError: a single handle of another env.
        """
        freed = 0
        for handle in self._mine(handles, strict=False):
            snap = self._held.pop(handle.number, None)
            if snap is not None:
                snap.release()
                freed += 1
        return freed

    def close(self) -> None:
        """Release every held snapshot, then close the chain below."""
        held, self._held = list(self._held.values()), {}
        for snap in held:
            snap.release()
        super().close()


class _HeadBound:
    """A :class:`BranchableWrapper`'s branching methods over the chain from ``head`` (an outer wrapper) in.

    Handles are still held by (and owned by) the BranchingWrapper; their snapshots cover ``head``'s
    chain, so restoring one through a shorter chain is refused (:class:`ForeignSnapshotError`).
    """

    def __init__(self, wrapper: Any, head: gym.Wrapper) -> None:
        self._wrapper = wrapper
        self._head = head

    def snapshot(self) -> Snapshot:
        return snapshot(self._head)

    def restore(self, snap: Snapshot) -> None:
        restore(self._head, snap)

    def snapshot_handle(self) -> SnapshotHandle:
        return self._wrapper._snapshot_handle(self._head)

    def restore_handle(self, handles: HandleArg) -> bool:
        return self._wrapper._restore_handle(self._head, handles)

    def release_handle(self, handles: HandleArg) -> int:
        return self._wrapper.release_handle(handles)
