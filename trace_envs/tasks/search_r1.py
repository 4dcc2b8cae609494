"""Search-R1's QA data (and verl's preprocessed copy of it) as WikiQA tasks.

Search-R1's training file (``nq_hotpotqa_train``, written by its
``scripts/data_process/qa_search_train_merge.py``) holds one row per question:
the source columns ``id``, ``question``, ``golden_answers`` (a list of strings),
plus ``data_source`` ("nq", "hotpotqa", ...), ``prompt`` (the chat messages the
policy was trained on: one user message holding Search-R1's instruction and
the question), ``ability``, ``reward_model`` = ``{"style": "rule",
"ground_truth": {"target": [answers]}}`` and ``extra_info`` = ``{"split",
"index"}``. verl's ``examples/data_preprocess/preprocess_search_r1_dataset.py``
rewrites it to ``data_source`` ("searchR1_nq"), ``prompt`` (a system and a user
message), ``ability``, ``reward_model`` (unchanged), ``extra_info`` (``index``,
``question``, ``split``, ``tools_kwargs``) and ``metadata``: no top-level
``question`` or ``golden_answers``.

:func:`search_r1_record_to_task` reads either: the question from ``question``,
else ``extra_info.question``; the answers from ``reward_model.ground_truth.target``,
else ``golden_answers`` (a bare string is one answer); the chat prompt is kept as
``data["prompt_messages"]`` so ``WikiQA-v0(task_prompt=True)`` can open the
episode with exactly what the policy was trained on. Rows without a question or
an answer are skipped with a count (:class:`SkippedRowsWarning`), or refused
with ``strict=True``.

:func:`load_qa_file` is what ``WikiQA-v0(tasks=<path>)`` uses: a ``.parquet``,
``.json`` or ``.jsonl`` file (read by extension) in Search-R1's layout (it has
``golden_answers`` or ``reward_model``) or in HotpotQA's.
"""

from __future__ import annotations

import hashlib
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from trace_envs.core import Task, TaskSet
from trace_envs.errors import InvalidTaskError
from trace_envs.tasks.files import read_rows

__all__ = ["load_search_r1", "load_qa_file", "search_r1_record_to_task", "is_search_r1_record", "SkippedRowsWarning"]


class SkippedRowsWarning(UserWarning):
    """Rows of a task file were skipped (no question or no answer); the message counts them."""


def is_search_r1_record(record: Mapping[str, Any]) -> bool:
    """Whether a row is in Search-R1's (or verl's preprocessed Search-R1) layout rather than HotpotQA's."""
    return "golden_answers" in record or isinstance(record.get("reward_model"), Mapping)


def _strings(value: Any) -> list[str] | None:
    """A string or a sequence of strings (parquet lists arrive as lists or numpy arrays) -> list, else None."""
    if isinstance(value, str):
        return [value] if value.strip() else []
    if value is None or isinstance(value, (bytes, Mapping)):
        return None
    try:
        items = list(value)
    except TypeError:
        return None
    if not all(isinstance(a, str) for a in items):
        return None
    return [a for a in items if a.strip()]


def _messages(value: Any) -> list[dict[str, str]]:
    if value is None or isinstance(value, (str, bytes, Mapping)):
        return []
    try:
        items = list(value)
    except TypeError:
        return []
    out = []
    for m in items:
        if isinstance(m, Mapping) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str):
            out.append({"role": m["role"], "content": m["content"]})
    return out


def _typed(record: Mapping[str, Any], index: int, **fields: Any) -> None:
    """Refuse (``InvalidTaskError``) a field that is neither text nor an integer: nothing is ``str()``-ed but those."""
    for name, value in fields.items():
        if not isinstance(value, str) and (not isinstance(value, int) or isinstance(value, bool)):
            raise InvalidTaskError(f"row {index}: field {name!r} is a {type(value).__name__}, expected text or an "
                                   f"integer")


def search_r1_record_to_task(record: Mapping[str, Any], index: int = 0) -> Task:
    """One Search-R1 / verl-preprocessed row -> a WikiQA Task.

    ``data``: ``question``, ``answers``, ``data_source``, ``prompt_messages`` and
    ``index``. Task ids: ``search-r1-<data_source>-<id>`` (the row's ``id``, else
    ``extra_info.index``, else the row's position; text or an integer, written as text).

    Raises:
        InvalidTaskError: the row has no question or no answer string, or a ``data_source`` / ``id``
            that is neither text nor an integer.
    """
    extra = record.get("extra_info") if isinstance(record.get("extra_info"), Mapping) else {}
    question = record.get("question") if isinstance(record.get("question"), str) else extra.get("question")
    reward = record.get("reward_model") if isinstance(record.get("reward_model"), Mapping) else {}
    truth = reward.get("ground_truth")
    answers = _strings(truth.get("target")) if isinstance(truth, Mapping) else _strings(truth)
    if not answers:
        answers = _strings(record.get("golden_answers"))
    if not isinstance(question, str) or not question.strip():
        raise InvalidTaskError(f"row {index} has no 'question' (nor extra_info.question): {str(record)[:160]}")
    if not answers:
        raise InvalidTaskError(f"row {index} has no answer in reward_model.ground_truth.target or golden_answers")
    source = record.get("data_source") or "search-r1"
    rid = record.get("id")
    if rid is None:
        rid = extra.get("index", index)
    _typed(record, index, data_source=source, id=rid)
    rid = str(rid) if str(rid) else hashlib.sha256(question.encode()).hexdigest()[:12]
    return Task(
        task_id=f"search-r1-{source}-{rid}",
        prompt=question.strip(),
        data={"question": question.strip(), "answers": answers, "data_source": source,
              "prompt_messages": _messages(record.get("prompt")), "index": index},
    )


def load_search_r1(path: str | Path, *, limit: int | None = None, strict: bool = False,
                   cache_dir: str | None = None) -> TaskSet:
    """A Search-R1 or verl-preprocessed Search-R1 file (.parquet/.json/.jsonl) as a TaskSet.

    Raises:
        TaskNotFoundError / InvalidTaskError: see :func:`trace_envs.tasks.files.read_rows`; also
            (``strict``) a row without a question or an answer, or no usable row at all.

    Warns:
        SkippedRowsWarning: rows without a question or an answer were skipped (not in strict mode).
    """
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be None or >= 0, got {limit}")
    rows = read_rows(path, cache_dir=cache_dir)
    return _to_taskset(rows, path, limit=limit, strict=strict, convert=search_r1_record_to_task,
                       name=f"search-r1:{Path(path).name}")


def _to_taskset(rows: Any, path: str | Path, *, limit: int | None, strict: bool, convert: Any, name: str) -> TaskSet:
    tasks: list[Task] = []
    skipped: list[int] = []
    seen: set[str] = set()
    for index, row in enumerate(rows):
        if limit is not None and len(tasks) >= limit:
            break
        try:
            task = convert(row, index)
        except InvalidTaskError as exc:
            if strict or "expected text" in str(exc):  # a field of the wrong type is never skipped quietly
                raise InvalidTaskError(f"{path}: {exc} (strict=False skips such rows with a warning)") from None
            skipped.append(index)
            continue
        if task.task_id in seen:  # ids repeat across merged sources: keep them unique by position
            task = Task(task_id=f"{task.task_id}-row{index}", prompt=task.prompt, data=task.data)
        seen.add(task.task_id)
        tasks.append(task)
    if skipped:
        shown = ", ".join(map(str, skipped[:10])) + (" ..." if len(skipped) > 10 else "")
        warnings.warn(f"{path}: skipped {len(skipped)} rows without a question or an answer (rows {shown}); "
                      "strict=True refuses them", SkippedRowsWarning, stacklevel=3)
    if not tasks:
        raise InvalidTaskError(f"{path}: no row has both a question and an answer")
    return TaskSet(tasks, name=name)


def load_qa_file(path: str | Path, *, limit: int | None = None, strict: bool = False) -> TaskSet:
    """A local QA file in Search-R1's layout or HotpotQA's, told apart by the first row's columns."""
    from trace_envs.tasks.hotpotqa import record_to_task

    rows = read_rows(path)
    if len(rows) and is_search_r1_record(rows[0]):
        return _to_taskset(rows, path, limit=limit, strict=strict, convert=search_r1_record_to_task,
                           name=f"search-r1:{Path(path).name}")
    return _to_taskset(rows, path, limit=limit, strict=strict, convert=lambda row, _i: record_to_task(row),
                       name=f"hotpotqa:{Path(path).name}:validation")
