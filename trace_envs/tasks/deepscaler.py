"""DeepScaleR-Preview math problems as a TaskSet, from a local file (bounded) or through ``datasets``.

DeepScaleR-Preview-Dataset (agentica-org) rows have ``problem``, ``answer``
and ``solution``. :func:`load_deepscaler` reads

* a local ``.json`` (a list of objects), ``.jsonl`` or ``.parquet`` file with
  :func:`trace_envs.tasks.files.read_rows` (offline, within the read limits of that module);
* a local directory that ``datasets.load_dataset`` understands;
* a Hugging Face hub name (on machines with network access).

Rows without a problem or an answer (the public set is reported to hold a
few) are skipped with a :class:`SkippedRowsWarning` that counts them; with
``strict=True`` the first such row raises instead. Task ids keep the row's
index in the file, so skipping never renumbers the other tasks.

``datasets`` is imported only for a hub name or a dataset folder.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

from trace_envs.core import Task, TaskSet
from trace_envs.errors import InvalidTaskError, TaskNotFoundError
from trace_envs.tasks.math_gen import ANSWER_INSTRUCTION

__all__ = ["load_deepscaler", "DEEPSCALER_HUB_NAME", "REQUIRED_FIELDS", "SkippedRowsWarning"]

DEEPSCALER_HUB_NAME = "agentica-org/DeepScaleR-Preview-Dataset"
#: Fields every row must have; ``solution`` is optional (stored as "" when absent).
REQUIRED_FIELDS = ("problem", "answer")

_BUILDERS = {".json": "json", ".jsonl": "json", ".parquet": "parquet"}


class SkippedRowsWarning(UserWarning):
    """Rows of a task file were skipped (no problem or no answer); the message counts them."""


def _answer_text(value: Any) -> str | None:
    """An answer as text: a string as it is, an int or a float as its ``str()`` (the one conversion); else None."""
    if isinstance(value, str):
        return value
    if isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)
    return None


def _looks_like_path(text: str) -> bool:
    return text.startswith((".", "/", "~")) or Path(text).suffix.lower() in _BUILDERS or "\\" in text


def _load(path_or_name: str, split: str, cache_dir: str | None) -> Any:
    path = Path(path_or_name).expanduser()
    if path.is_file():
        from trace_envs.tasks.files import read_rows

        return read_rows(path)  # bounded, by extension (trace_envs.tasks.files)
    import datasets

    if path.is_dir():
        return datasets.load_dataset(str(path), split=split, cache_dir=cache_dir)
    if _looks_like_path(path_or_name):
        raise TaskNotFoundError(f"no DeepScaleR file at {path}: check the path (.json, .jsonl or .parquet)")
    try:
        return datasets.load_dataset(path_or_name, split=split, cache_dir=cache_dir)
    except (FileNotFoundError, ConnectionError) as exc:
        raise TaskNotFoundError(
            f"cannot load {path_or_name!r} (split {split!r}) from the hub: {exc}. "
            "Offline, download the data elsewhere and pass the local .json/.jsonl/.parquet path"
        ) from exc


def load_deepscaler(
    path_or_name: str = DEEPSCALER_HUB_NAME,
    *,
    split: str = "train",
    limit: int | None = None,
    cache_dir: str | None = None,
    strict: bool = False,
) -> TaskSet:
    """DeepScaleR problems as tasks for PythonMath-v0.

    Args:
        path_or_name: a local .json/.jsonl/.parquet file or dataset folder, or a hub name.
        split: the split to read (a local file is read as this split).
        limit: keep only the first ``limit`` rows (None: all).
        cache_dir: the ``datasets`` cache folder (None: its default).
        strict: raise on a row without a problem or an answer instead of skipping it.

    Returns:
        A TaskSet named ``"deepscaler-<split>"`` whose tasks have ids
        ``"deepscaler-<split>-00007"``, prompt = the problem plus the answer
        instruction, and data ``{"answer", "solution", "source": "deepscaler", "index"}``.
        ``answer`` is always a string: a number in the file becomes its ``str()`` (the one
        conversion); ``problem`` and ``solution`` must be text. A local file is read within the
        bounds of :mod:`trace_envs.tasks.files`.

    Raises:
        TaskNotFoundError: the file is missing, or the hub data set cannot be fetched.
        InvalidTaskError: an unsupported, unreadable, empty or oversized file, a missing
            ``problem``/``answer`` column, a field of another type (a problem that is a mapping, an
            answer that is a list), no usable row at all, or (``strict``) a row whose problem or
            answer is empty.

    Warns:
        SkippedRowsWarning: rows without a problem or an answer were skipped (not in strict mode).
        ValueError: ``limit`` is negative.
    """
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be None or >= 0, got {limit}")
    dataset = _load(str(path_or_name), split, cache_dir)
    missing = [f for f in REQUIRED_FIELDS if f not in dataset.column_names]
    if missing:
        raise InvalidTaskError(
            f"{path_or_name}: rows lack the field(s) {missing}; DeepScaleR rows need {list(REQUIRED_FIELDS)} "
            f"(and optionally 'solution'); found columns {dataset.column_names}"
        )
    if limit is not None:
        dataset = dataset.select(range(min(limit, len(dataset))))
    tasks = []
    skipped: list[int] = []
    for index, row in enumerate(dataset):
        problem, answer, solution = row["problem"], _answer_text(row["answer"]), row.get("solution")
        for name, value, ok in (("problem", problem, problem is None or isinstance(problem, str)),
                                ("answer", row["answer"], answer is not None or row["answer"] is None),
                                ("solution", solution, solution is None or isinstance(solution, str))):
            if not ok:
                raise InvalidTaskError(f"{path_or_name}: row {index}: field {name!r} is a {type(value).__name__}, "
                                       f"expected text{' or a number' if name == 'answer' else ''}")
        if problem is None or not str(problem).strip() or answer is None or not str(answer).strip():
            if strict:
                raise InvalidTaskError(f"{path_or_name}: row {index} has an empty problem or answer "
                                       "(strict=False skips such rows with a warning)")
            skipped.append(index)
            continue
        tasks.append(Task(
            task_id=f"deepscaler-{split}-{index:05d}",
            prompt=f"{str(problem).strip()}\n\n{ANSWER_INSTRUCTION}",
            data={"answer": answer.strip(), "solution": "" if solution is None else solution,
                  "source": "deepscaler", "index": index},
        ))
    if skipped:
        shown = ", ".join(map(str, skipped[:10])) + (" ..." if len(skipped) > 10 else "")
        warnings.warn(f"{path_or_name}: skipped {len(skipped)} of {len(skipped) + len(tasks)} rows without a "
                      f"problem or an answer (rows {shown}); strict=True refuses them", SkippedRowsWarning,
                      stacklevel=2)
    if not tasks and skipped:
        raise InvalidTaskError(f"{path_or_name}: none of its {len(skipped)} rows has both a problem and an answer")
    return TaskSet(tasks, name=f"deepscaler-{split}")
