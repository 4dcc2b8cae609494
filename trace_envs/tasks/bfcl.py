"""BFCL multi-turn data, read from the installed ``bfcl-eval`` package.

Nothing of BFCL is copied into this repository: the entries
(``data/BFCL_v4_multi_turn_<category>.json``), their ground truth
(``data/possible_answer/``) and the function docs (``data/multi_turn_func_doc/``)
are located inside the installed package. Install it with::

    pip install --no-deps bfcl-eval mpmath

(``--no-deps``: its declared dependencies pin numpy 1.26 and much more; the
multi-turn backends and data need only ``mpmath``.)

Each entry becomes a :class:`~trace_envs.core.Task` whose ``task_id`` is the
BFCL id (``multi_turn_base_0``), whose ``prompt`` is the first user question and
whose ``data`` holds the fields listed in :func:`entry_to_task`.
"""

from __future__ import annotations

import functools
import importlib.util
import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from trace_envs.core import Task, TaskSet
from trace_envs.errors import InvalidTaskError, TraceEnvError
from trace_envs.tasks.splits import SplitTaskSet

__all__ = [
    "BFCL_CATEGORIES",
    "INSTALL_HINT",
    "BFCLUnavailableError",
    "normalize_category",
    "bfcl_data_dir",
    "load_bfcl_entries",
    "load_function_docs",
    "entry_to_task",
    "load_bfcl_tasks",
    "BFCL_SPLITS",
    "BFCL_HELDOUT_FRACTION",
    "bfcl_split",
]

#: The multi-turn categories BFCL-v0 serves (BFCL v4 file names).
BFCL_CATEGORIES: tuple[str, ...] = (
    "multi_turn_base",
    "multi_turn_long_context",
    "multi_turn_miss_func",
    "multi_turn_miss_param",
)

INSTALL_HINT = "install it with `pip install --no-deps bfcl-eval mpmath` (no-deps: its pins would downgrade numpy)"


class BFCLUnavailableError(TraceEnvError, ImportError):
    """``bfcl-eval`` (or its data) is not installed; the message says how to install it."""


def normalize_category(category: str) -> str:
    """``"base"`` or ``"multi_turn_base"`` → ``"multi_turn_base"``; raise ValueError for anything else."""
    name = category if category.startswith("multi_turn_") else f"multi_turn_{category}"
    if name not in BFCL_CATEGORIES:
        raise ValueError(f"unknown BFCL category {category!r}; choose one of {', '.join(BFCL_CATEGORIES)}")
    return name


@functools.lru_cache(maxsize=1)
def bfcl_data_dir() -> Path:
    """The ``data/`` directory of the installed bfcl-eval package (found without importing it)."""
    spec = importlib.util.find_spec("bfcl_eval")
    if spec is None or not spec.submodule_search_locations:
        raise BFCLUnavailableError(f"BFCL-v0 needs the bfcl-eval package, which is not installed: {INSTALL_HINT}")
    for location in spec.submodule_search_locations:
        data = Path(location) / "data"
        if (data / "possible_answer").is_dir() and (data / "multi_turn_func_doc").is_dir():
            return data
    raise BFCLUnavailableError(
        f"bfcl-eval is installed but its data directory (data/, possible_answer/, multi_turn_func_doc/) "
        f"is missing; reinstall it: {INSTALL_HINT}"
    )


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        raise BFCLUnavailableError(f"BFCL data file {path} is missing; reinstall bfcl-eval: {INSTALL_HINT}")
    with path.open(encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def load_bfcl_entries(category: str) -> list[dict[str, Any]]:
    """The raw entries of ``category``, each with its ``ground_truth`` (list of turns of call strings) merged in."""
    name = normalize_category(category)
    data = bfcl_data_dir()
    entries = _read_jsonl(data / f"BFCL_v4_{name}.json")
    answers = {a["id"]: a["ground_truth"] for a in _read_jsonl(data / "possible_answer" / f"BFCL_v4_{name}.json")}
    for entry in entries:
        if entry["id"] not in answers:
            raise BFCLUnavailableError(f"no ground truth for {entry['id']} in possible_answer/; reinstall bfcl-eval")
        entry["ground_truth"] = answers[entry["id"]]
    return entries


@functools.lru_cache(maxsize=32)
def _docs_of_class(class_name: str) -> tuple[str, ...]:
    # BFCL's class -> doc-file table lives in a constants module without dependencies.
    try:
        from bfcl_eval.constants.executable_backend_config import MULTI_TURN_FUNC_DOC_FILE_MAPPING
    except ImportError as exc:
        raise BFCLUnavailableError(f"cannot import bfcl_eval ({exc}); {INSTALL_HINT}") from exc

    if class_name not in MULTI_TURN_FUNC_DOC_FILE_MAPPING:
        raise InvalidTaskError(
            f"unknown BFCL backend class {class_name!r}; known: {', '.join(MULTI_TURN_FUNC_DOC_FILE_MAPPING)}"
        )
    path = bfcl_data_dir() / "multi_turn_func_doc" / MULTI_TURN_FUNC_DOC_FILE_MAPPING[class_name]
    return tuple(json.dumps(doc) for doc in _read_jsonl(path))


def load_function_docs(class_names: Iterable[str]) -> list[dict[str, Any]]:
    """BFCL's function docs (its own ``dict``/``float`` types) of the given classes, in order; fresh copies."""
    docs: list[dict[str, Any]] = []
    for class_name in class_names:
        for blob in _docs_of_class(class_name):
            doc = json.loads(blob)
            doc["class_name"] = class_name
            docs.append(doc)
    return docs


def _turn_text(turn: Sequence[Mapping[str, Any]]) -> str:
    return "\n\n".join(str(m.get("content", "")) for m in turn if m.get("role", "user") == "user")


def entry_to_task(entry: Mapping[str, Any], category: str | None = None) -> Task:
    """Convert one BFCL entry (with ``ground_truth``) into a Task.

    ``data`` fields: ``category``; ``questions`` (one list of user messages per
    user turn; an empty turn is where held-back functions are revealed);
    ``initial_config`` ({class: scenario}); ``involved_classes``;
    ``ground_truth`` (one list of call strings per user turn); ``missed_function``
    ({turn index as str: [function names]}); ``long_context`` (bool).
    """
    for key in ("id", "question", "initial_config", "involved_classes", "ground_truth"):
        if key not in entry:
            raise InvalidTaskError(f"a BFCL task needs {key!r}; got keys {sorted(entry)}")
    questions = entry["question"]
    truth = entry["ground_truth"]
    if not isinstance(questions, list) or not questions or not all(isinstance(t, list) for t in questions):
        raise InvalidTaskError("'question' must be a non-empty list of turns, each a list of {role, content} messages")
    if not isinstance(truth, list) or len(truth) != len(questions):
        raise InvalidTaskError(
            f"'ground_truth' must hold one list of call strings per user turn ({len(questions)} turns), got {truth!r:.200}"
        )
    if not all(isinstance(t, list) and all(isinstance(c, str) for c in t) for t in truth):
        raise InvalidTaskError("each 'ground_truth' turn must be a list of call strings like \"cd(folder='x')\"")
    involved = entry["involved_classes"]
    if not isinstance(involved, list) or not involved or not all(isinstance(c, str) for c in involved):
        raise InvalidTaskError("'involved_classes' must be a non-empty list of BFCL class names")
    if not isinstance(entry["initial_config"], Mapping):
        raise InvalidTaskError("'initial_config' must be a mapping {class name: scenario}")
    missed = entry.get("missed_function", {}) or {}
    if not isinstance(missed, Mapping) or not all(str(k).isdigit() and isinstance(v, list) for k, v in missed.items()):
        raise InvalidTaskError("'missed_function' must map turn indices to lists of function names")
    task_id = str(entry["id"])
    category = category or entry.get("category") or task_id.rsplit("_", 1)[0]
    data = {
        "category": category,
        "questions": questions,
        "initial_config": entry["initial_config"],
        "involved_classes": involved,
        "ground_truth": truth,
        "missed_function": {str(k): list(v) for k, v in missed.items()},
        "long_context": bool(entry.get("long_context", "long_context" in str(category))),
    }
    return Task(task_id=task_id, prompt=_turn_text(questions[0]), data=data)


def load_bfcl_tasks(category: str = "multi_turn_base") -> TaskSet:
    """The TaskSet of one BFCL multi-turn category (200 entries each), ordered as in the data file."""
    name = normalize_category(category)
    return TaskSet([entry_to_task(e, name) for e in load_bfcl_entries(name)], name=f"bfcl/{name}")


#: Split names of every BFCL category: a fixed partition of its entries.
BFCL_SPLITS: tuple[str, ...] = ("train", "test")

#: Share of each category's entries in the "test" split (50 of 200).
BFCL_HELDOUT_FRACTION = 0.25


def bfcl_split(category: str = "multi_turn_base", split: str = "train") -> TaskSet:
    """The ``"train"`` or ``"test"`` entries of one BFCL multi-turn category.

    The partition is fixed: the category's entry ids, sorted, are shuffled by a generator
    seeded with the category's name and the first ``ceil(BFCL_HELDOUT_FRACTION * n)`` are
    held out. Both splits keep the data file's order; together they are the whole category.
    The TaskSet's name is ``bfcl/<category>/<split>``. It is a
    :class:`~trace_envs.tasks.splits.SplitTaskSet`: looking up an entry of the other split raises
    ``TaskNotFoundError`` naming that split.
    """
    import math
    import random

    if split not in BFCL_SPLITS:
        raise ValueError(f"unknown BFCL split {split!r}; choose one of {', '.join(BFCL_SPLITS)} "
                         f"(or 'all' for the whole category)")
    name = normalize_category(category)
    tasks = load_bfcl_tasks(name)
    order = sorted(tasks.ids())
    random.Random(f"trace-gym-bfcl-split|{name}").shuffle(order)
    held = set(order[:math.ceil(BFCL_HELDOUT_FRACTION * len(order))])
    chosen = [t for t in tasks.values() if (t.task_id in held) == (split == "test")]
    other = "train" if split == "test" else "test"
    return SplitTaskSet(chosen, name=f"bfcl/{name}/{split}", split=split,
                        elsewhere=dict.fromkeys((t for t in tasks if (t in held) != (split == "test")), other))
