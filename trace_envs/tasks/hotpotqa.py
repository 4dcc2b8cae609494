"""HotpotQA as WikiQA tasks, read from local files (bounded) or with ``datasets`` from the hub.

On a machine with the hub: ``load_hotpotqa("hotpot_qa", config="distractor",
split="validation")``. Offline, from a local file in HotpotQA's format (the
official JSON list, JSONL, or Parquet, read by extension):
``load_hotpotqa("path/to/hotpot_dev.json")``.

Record fields used: ``_id``/``id``, ``question``, ``answer``, ``type``
("bridge"/"comparison"), ``level``, ``supporting_facts`` and ``context``.
Both the official list form (``[[title, sent_id], ...]``, ``[[title,
[sentences]], ...]``) and the hub's columnar form (``{"title": [...],
"sent_id": [...]}``, ``{"title": [...], "sentences": [[...]]}``) are read.

:func:`hotpotqa_corpus` turns the records' context paragraphs into corpus
passages (one per title, de-duplicated), so the distractor setting can be
searched with any retriever backend.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from trace_envs.core import Task, TaskSet
from trace_envs.errors import InvalidTaskError
from trace_envs.tasks.files import BUILDERS, read_rows

__all__ = ["load_hotpotqa", "hotpotqa_records", "record_to_task", "hotpotqa_corpus"]


def _pairs(field: Any, second: str) -> list[tuple[str, Any]]:
    """Normalise supporting_facts / context to [(title, x), ...] from either layout."""
    if isinstance(field, Mapping):
        return list(zip(field.get("title", []), field.get(second, [])))
    return [(str(item[0]), item[1]) for item in field or []]


def hotpotqa_records(
    source: str | Path,
    *,
    split: str = "validation",
    config: str = "distractor",
    limit: int | None = None,
) -> Iterator[dict[str, Any]]:
    """Records from a local JSON/JSONL/Parquet file (:func:`~trace_envs.tasks.files.read_rows`, bounded) or a hub
    data set name (through ``datasets``)."""
    path = Path(source)
    if path.suffix.lower() in BUILDERS or path.exists():
        if not path.is_file():
            raise FileNotFoundError(f"HotpotQA file {path} does not exist")
        dataset: Any = read_rows(path)  # parquet, json or jsonl, by extension
    else:
        try:
            import datasets
        except ImportError as exc:  # pragma: no cover - depends on the [data] extra
            raise ImportError("reading HotpotQA from the hub needs `datasets` (pip install 'trace-gym[data]')") from exc
        dataset = datasets.load_dataset(str(source), config, split=split)
    for i, record in enumerate(dataset):
        if limit is not None and i >= limit:
            break
        yield dict(record)


def record_to_task(record: Mapping[str, Any]) -> Task:
    """One HotpotQA record -> a WikiQA Task (``data``: question, answers, type, level, supporting titles).

    ``_id``/``id``, ``type`` and ``level`` are text or integers (written as text); another type, or
    malformed ``supporting_facts``, raises :class:`InvalidTaskError`.
    """
    question, answer = record.get("question"), record.get("answer")
    if not isinstance(question, str) or not isinstance(answer, str):
        raise InvalidTaskError(f"HotpotQA record needs 'question' and 'answer' strings: {str(record)[:160]}")
    rid = record.get("_id") or record.get("id") or hashlib.sha256(question.encode()).hexdigest()[:12]
    for name, value in (("_id", rid), ("type", record.get("type", "")), ("level", record.get("level", ""))):
        if not isinstance(value, str) and (not isinstance(value, int) or isinstance(value, bool)):
            raise InvalidTaskError(f"HotpotQA record field {name!r} is a {type(value).__name__}, expected text "
                                   f"or an integer: {str(record)[:160]}")
    try:
        facts = _pairs(record.get("supporting_facts"), "sent_id")
        fact_list = [[t, int(s)] for t, s in facts]
    except (TypeError, ValueError, IndexError, KeyError):
        raise InvalidTaskError(f"HotpotQA record has malformed supporting_facts (expected [[title, sentence "
                               f"index], ...]): {str(record)[:160]}") from None
    titles = list(dict.fromkeys(t for t, _ in facts))
    return Task(
        task_id=f"hotpotqa-{rid}",
        prompt=question,
        data={
            "question": question,
            "answers": [answer],
            "type": str(record.get("type", "")),
            "level": str(record.get("level", "")),
            "supporting_titles": titles,
            "supporting_facts": fact_list,
            "queries": titles,
        },
    )


def load_hotpotqa(
    source: str | Path,
    *,
    split: str = "validation",
    config: str = "distractor",
    limit: int | None = None,
) -> TaskSet:
    """HotpotQA questions as a TaskSet named ``hotpotqa:<file or name>``."""
    tasks = [record_to_task(r) for r in hotpotqa_records(source, split=split, config=config, limit=limit)]
    return TaskSet(tasks, name=f"hotpotqa:{Path(str(source)).name}:{split}")


def hotpotqa_corpus(records: Iterable[Mapping[str, Any]]) -> Iterator[dict[str, str]]:
    """Context paragraphs as ``{"id","title","text"}`` passages, one per distinct title."""
    seen: set[str] = set()
    for record in records:
        for title, sentences in _pairs(record.get("context"), "sentences"):
            if title in seen:
                continue
            seen.add(title)
            text = "".join(sentences) if isinstance(sentences, list) else str(sentences)
            yield {"id": title, "title": title, "text": text.strip()}
