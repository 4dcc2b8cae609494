"""Shared plumbing of the on-disk backends: output directories, save/copy, hit assembly."""

from __future__ import annotations

import functools
import hashlib
import shutil
import tempfile
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from retrievers.base import MANIFEST_NAME, Hit, RetrieverError, read_manifest
from retrievers.corpus import DocStore, DocStoreWriter, Passage, iter_corpus

__all__ = ["prepare_out", "write_store", "IndexDirRetriever", "MAX_K"]

#: the largest ``k`` any backend accepts (bounds memory per query).
MAX_K = 1000


def prepare_out(out: str | Path | None, *, overwrite: bool = False) -> tuple[Path, tempfile.TemporaryDirectory | None]:
    """The directory to build an index in; a temporary one (returned too, to keep alive) when ``out`` is None.

    Raises:
        RetrieverError: ``out`` already holds an index and ``overwrite`` is False, or is a non-empty
            directory that is not an index.
    """
    if out is None:
        tmp = tempfile.TemporaryDirectory(prefix="trace-gym-index-")
        return Path(tmp.name), tmp
    path = Path(out)
    if path.exists() and any(path.iterdir()):
        if not (path / MANIFEST_NAME).is_file():
            raise RetrieverError(f"{path} is a non-empty directory that is not an index; choose an empty --out")
        if not overwrite:
            raise RetrieverError(f"{path} already holds an index; pass overwrite=True (--overwrite) to replace it")
        shutil.rmtree(path)
    path.mkdir(parents=True, exist_ok=True)
    return path, None


def write_store(
    directory: Path,
    corpus: str | Path | Iterable[Mapping[str, Any] | Passage],
    *,
    progress: bool,
    desc: str,
    each: Callable[[Passage], None] | None = None,
) -> int:
    """Write ``corpus`` as ``directory``'s document store, calling ``each(passage)`` after storing each passage.

    The first half of every backend's ``build()``: returns the number of passages stored;
    raises ``ValueError`` when the corpus is empty (nothing to index).
    """
    writer = DocStoreWriter(directory)
    for passage in iter_corpus(corpus, progress=progress, desc=desc):
        writer.add(passage)
        if each is not None:
            each(passage)
    n_docs = len(writer)
    writer.close()
    if n_docs == 0:
        raise ValueError("the corpus is empty: nothing to index")
    return n_docs


def check_k(k: int) -> int:
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise ValueError(f"k must be a positive int, got {k!r}")
    return min(k, MAX_K)


class IndexDirRetriever:
    """Base of retrievers whose whole state lives in one index directory (manifest + files)."""

    kind: str = ""

    def __init__(self, directory: str | Path, *, _tmp: tempfile.TemporaryDirectory | None = None) -> None:
        self.directory = Path(directory)
        self._tmp = _tmp  # keeps a temporary build directory alive as long as the retriever
        if _tmp is not None:
            weakref.finalize(self, _tmp.cleanup)
        self.manifest = read_manifest(self.directory)
        if self.manifest["kind"] != self.kind:
            raise RetrieverError(f"{self.directory} holds a {self.manifest['kind']!r} index, not {self.kind!r}")
        self.docs = DocStore(self.directory) if DocStore.exists(self.directory) else None

    @functools.cached_property
    def fingerprint(self) -> str:
        """Identifies the index content and configuration (same files -> same fingerprint)."""
        blob = (self.directory / MANIFEST_NAME).read_bytes()
        return f"{self.kind}:{hashlib.sha256(blob).hexdigest()[:12]}"

    def __len__(self) -> int:
        return int(self.manifest.get("n_docs", 0))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self.directory)!r}, n_docs={len(self)})"

    def save(self, directory: str | Path) -> Path:
        """Copy the index (manifest, backend files, document store) into ``directory``."""
        target = Path(directory)
        if target.resolve() != self.directory.resolve():
            shutil.copytree(self.directory, target, dirs_exist_ok=True)
        return target

    def _hits(self, rows: Sequence[int], scores: Sequence[float]) -> list[Hit]:
        assert self.docs is not None
        out = []
        for row, score in zip(rows, scores):
            p = self.docs.get(int(row))
            out.append(Hit(doc_id=p.doc_id, score=float(score), title=p.title, text=p.text))
        return out

    def search(self, query: str, k: int = 10) -> list[Hit]:
        """The top-``k`` hits for one query (see :class:`retrievers.Retriever`)."""
        return self.batch_search([query], k)[0]

    def batch_search(self, queries: Sequence[str], k: int = 10) -> list[list[Hit]]:  # pragma: no cover
        raise NotImplementedError
