"""Task splits: a split that knows its siblings (a lookup of another split's task says where it is),
and deterministic samples of a task set stratified over its tasks' kinds."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping

from trace_envs.core import Task, TaskSet
from trace_envs.errors import TaskNotFoundError

__all__ = ["SplitTaskSet", "KIND_FIELDS", "task_kind", "stratified_ids"]

#: The ``Task.data`` fields that name a task's kind, in the order they are looked for: WikiQA's
#: question kind (``founder-city`` ...), PythonMath's problem family (``divisor_count`` ...).
KIND_FIELDS: tuple[str, ...] = ("kind", "family")


class SplitTaskSet(TaskSet):
    """One split (``"train"``, ``"test"``) of a task collection; a :class:`TaskSet` in every other way.

    It serves only its own tasks: iteration, ``len``, ``ids()`` and ``sample`` cover them alone.
    Looking up the id of a task that another split of the same collection holds
    (``reset(options={"task_id": ...})``) raises :class:`~trace_envs.errors.TaskNotFoundError`
    naming that split and the ``tasks=`` value that serves it, instead of serving it: a held-out
    task is played only by an env made for its split.

    Args:
        tasks: the split's tasks.
        name: the TaskSet name (part of the env's ``config_key``).
        split: this split's name.
        elsewhere: task id -> name of the split that holds it, for the collection's other tasks.
        all_name: the ``tasks=`` value that serves every split (named in the error), or None if none does.
    """

    def __init__(self, tasks: Iterable[Task], *, name: str, split: str, elsewhere: Mapping[str, str],
                 all_name: str | None = "all") -> None:
        super().__init__(list(tasks), name=name)
        self.split = split
        self.all_name = all_name
        own = set(self.ids())
        self._elsewhere = {k: v for k, v in elsewhere.items() if k not in own}

    def __getitem__(self, task_id: str) -> Task:
        try:
            return super().__getitem__(task_id)
        except TaskNotFoundError:
            other = self._elsewhere.get(task_id)
            if other is None:
                raise
            sample = ", ".join(itertools.islice(iter(self), 3))
            raise TaskNotFoundError(
                f"task {task_id!r} is in the {other!r} split, not in {self.name} (the {self.split!r} split, "
                f"{len(self)} tasks, e.g. {sample}); make the env with tasks={other!r}"
                + (f" (or {self.all_name!r})" if self.all_name else "") + " to play it"
            ) from None


def task_kind(task: Task) -> str:
    """The task's kind: its first :data:`KIND_FIELDS` field present in ``task.data``, else ``""``."""
    for name in KIND_FIELDS:
        value = task.data.get(name)
        if value is not None:
            return str(value)
    return ""


def stratified_ids(tasks: Mapping[str, Task], n: int | None) -> list[str]:
    """``n`` task ids of ``tasks`` spread over the tasks' kinds (:func:`task_kind`); deterministic.

    Kinds are taken in order of first appearance and each kind's tasks in the set's order; the
    sample is built round robin (the first task of every kind, then the second of every kind, ...),
    so it holds ``n // k`` or ``n // k + 1`` tasks of each of ``k`` kinds (fewer of a kind that has
    fewer). The ids come back in the set's order. ``n`` None, or at least ``len(tasks)``: every id.
    A set whose tasks carry no kind gives its first ``n`` ids.
    """
    ids = list(tasks)
    if n is None or n >= len(ids):
        return ids
    if n < 1:
        raise ValueError(f"n must be >= 1 or None, got {n}")
    kinds: dict[str, list[str]] = {}
    for task_id in ids:
        kinds.setdefault(task_kind(tasks[task_id]), []).append(task_id)
    chosen: set[str] = set()
    rounds = itertools.zip_longest(*kinds.values())
    for row in rounds:
        for task_id in row:
            if task_id is not None and len(chosen) < n:
                chosen.add(task_id)
        if len(chosen) >= n:
            break
    return [t for t in ids if t in chosen]
