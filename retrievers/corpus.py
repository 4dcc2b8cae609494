"""Streaming corpus reading and the on-disk document store shared by all backends.

Corpus format: JSONL, one passage per line, either ``{"id", "title", "text"}``
or wiki-18's ``{"id", "contents"}`` where ``contents`` is ``'"Title"\\ntext'``
(``.jsonl.gz`` is read too). A corpus is streamed once; nothing holds all
passages in memory.

The :class:`DocStore` keeps the passages of an index on disk: a JSONL copy
in wiki-18 form (``corpus/docs.jsonl``, which is also a valid Anserini
JsonCollection) plus ``docstore/offsets.npy`` (byte offset of each row) and
a sorted 64-bit hash of every id (``docstore/idhash.npy`` / ``idrow.npy``)
for id -> row lookups. The arrays are memory-mapped, so a 21M-passage store
costs ~0.5 GB of page cache, not 21M Python strings.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
from array import array
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np

from retrievers.base import RetrieverError, format_contents, split_contents

__all__ = [
    "Passage",
    "parse_record",
    "iter_corpus",
    "write_corpus",
    "DocStore",
    "DocStoreWriter",
    "CorpusFormatError",
]


class CorpusFormatError(RetrieverError, ValueError):
    """A corpus line is not a JSON object with an id and a text."""


@dataclass(frozen=True)
class Passage:
    """One corpus passage."""

    doc_id: str
    title: str
    text: str

    @property
    def contents(self) -> str:
        return format_contents(self.title, self.text)


def parse_record(record: Mapping[str, Any], *, fallback_id: str | None = None) -> Passage:
    """A corpus record -> Passage.

    Accepts ``{"id","title","text"}``, ``{"id","contents"}`` (wiki-18) and
    BEIR's ``{"_id","title","text"}``. Newlines in titles become spaces.

    Raises:
        CorpusFormatError: no id (and no ``fallback_id``) or no text.
    """
    if not isinstance(record, Mapping):
        raise CorpusFormatError(f"a corpus record must be a JSON object, got {type(record).__name__}")
    raw_id = record.get("id", record.get("_id", record.get("docid", fallback_id)))
    if raw_id is None:
        raise CorpusFormatError(f"corpus record has no 'id': {str(record)[:120]}")
    if "text" in record:
        title, text = str(record.get("title") or ""), str(record["text"])
    elif "contents" in record:
        title, text = split_contents(str(record["contents"]))
        if record.get("title"):
            title = str(record["title"])
    else:
        raise CorpusFormatError(f"corpus record {raw_id!r} has neither 'text' nor 'contents'")
    return Passage(doc_id=str(raw_id), title=" ".join(title.split("\n")), text=text)


def _open_text(path: Path) -> IO[bytes]:
    if path.suffix == ".gz":
        return gzip.open(path, "rb")
    return open(path, "rb")


def iter_corpus(
    corpus: str | Path | Iterable[Mapping[str, Any] | Passage],
    *,
    progress: bool = False,
    desc: str = "corpus",
) -> Iterator[Passage]:
    """Stream the passages of a JSONL file (or of an iterable of records).

    With ``progress``, a tqdm bar shows bytes read (for files) or passages.
    Blank lines are skipped; a line without an id gets its line number.
    """
    if isinstance(corpus, (str, Path)):
        path = Path(corpus)
        if not path.is_file():
            raise FileNotFoundError(f"corpus file {path} does not exist")
        bar = None
        if progress:
            from tqdm import tqdm

            total = path.stat().st_size if path.suffix != ".gz" else None
            bar = tqdm(total=total, unit="B", unit_scale=True, desc=desc)
        try:
            with _open_text(path) as fh:
                for lineno, line in enumerate(fh):
                    if bar is not None:
                        bar.update(len(line))
                    if not line.strip():
                        continue
                    try:
                        record = json.loads(line)
                    except json.JSONDecodeError as exc:
                        raise CorpusFormatError(f"{path}:{lineno + 1}: invalid JSON ({exc.msg})") from None
                    yield parse_record(record, fallback_id=str(lineno))
        finally:
            if bar is not None:
                bar.close()
        return
    iterable: Iterable[Any] = corpus
    if progress:
        from tqdm import tqdm

        iterable = tqdm(corpus, unit="doc", desc=desc)
    for i, record in enumerate(iterable):
        yield record if isinstance(record, Passage) else parse_record(record, fallback_id=str(i))


def write_corpus(passages: Iterable[Passage], path: str | Path) -> int:
    """Write passages as ``{"id","title","text"}`` JSONL; return how many."""
    n = 0
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as fh:
        for p in passages:
            fh.write(json.dumps({"id": p.doc_id, "title": p.title, "text": p.text}, ensure_ascii=False) + "\n")
            n += 1
    return n


def _id_hash(doc_id: str) -> int:
    return int.from_bytes(hashlib.blake2b(doc_id.encode("utf-8"), digest_size=8).digest(), "little")


CORPUS_FILE = Path("corpus") / "docs.jsonl"
_STORE_DIR = Path("docstore")


class DocStoreWriter:
    """Appends passages to a new store in ``directory``; call :meth:`close` to finish it."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        (self.directory / CORPUS_FILE).parent.mkdir(parents=True, exist_ok=True)
        (self.directory / _STORE_DIR).mkdir(parents=True, exist_ok=True)
        self._fh = open(self.directory / CORPUS_FILE, "wb")
        self._offsets = array("q", [0])
        self._hashes = array("Q")
        self._pos = 0

    def add(self, passage: Passage) -> int:
        """Store one passage; return its row number."""
        line = json.dumps({"id": passage.doc_id, "contents": passage.contents}, ensure_ascii=False) + "\n"
        data = line.encode("utf-8")
        self._fh.write(data)
        self._pos += len(data)
        self._offsets.append(self._pos)
        self._hashes.append(_id_hash(passage.doc_id))
        return len(self._offsets) - 2

    def __len__(self) -> int:
        return len(self._offsets) - 1

    def close(self) -> DocStore:
        """Flush everything to disk and return the opened store."""
        self._fh.close()
        hashes = np.frombuffer(self._hashes, dtype=np.uint64) if len(self._hashes) else np.zeros(0, np.uint64)
        order = np.argsort(hashes, kind="stable")
        store = self.directory / _STORE_DIR
        np.save(store / "offsets.npy", np.frombuffer(self._offsets, dtype=np.int64))
        np.save(store / "idhash.npy", hashes[order])
        np.save(store / "idrow.npy", order.astype(np.int64))
        return DocStore(self.directory)


class DocStore:
    """Read-only, thread-safe random access to an index's passages by row or id."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        store = self.directory / _STORE_DIR
        corpus = self.directory / CORPUS_FILE
        if not corpus.is_file() or not (store / "offsets.npy").is_file():
            raise RetrieverError(f"{self.directory} has no document store ({CORPUS_FILE} and {_STORE_DIR}/)")
        self._offsets = np.load(store / "offsets.npy", mmap_mode="r")
        self._hashes = np.load(store / "idhash.npy", mmap_mode="r")
        self._rows = np.load(store / "idrow.npy", mmap_mode="r")
        self._fd = os.open(corpus, os.O_RDONLY)

    @staticmethod
    def exists(directory: str | Path) -> bool:
        return (Path(directory) / _STORE_DIR / "offsets.npy").is_file()

    @classmethod
    def build(cls, passages: Iterable[Passage], directory: str | Path) -> DocStore:
        writer = DocStoreWriter(directory)
        for p in passages:
            writer.add(p)
        return writer.close()

    def __len__(self) -> int:
        return int(self._offsets.shape[0]) - 1

    def __del__(self) -> None:
        fd = getattr(self, "_fd", None)
        if fd is not None:
            try:
                os.close(fd)
            except OSError:
                pass

    def get(self, row: int) -> Passage:
        """The passage at ``row`` (0-based, in corpus order)."""
        if not 0 <= row < len(self):
            raise IndexError(f"row {row} out of range for a store of {len(self)} passages")
        start, end = int(self._offsets[row]), int(self._offsets[row + 1])
        line = os.pread(self._fd, end - start, start)
        record = json.loads(line)
        title, text = split_contents(record["contents"])
        return Passage(doc_id=str(record["id"]), title=title, text=text)

    def get_many(self, rows: Sequence[int]) -> list[Passage]:
        return [self.get(int(r)) for r in rows]

    def row_of(self, doc_id: str) -> int | None:
        """The row of ``doc_id``, or None when the store does not hold it."""
        h = np.uint64(_id_hash(doc_id))
        lo = int(np.searchsorted(self._hashes, h, side="left"))
        hi = int(np.searchsorted(self._hashes, h, side="right"))
        for i in range(lo, hi):
            row = int(self._rows[i])
            if self.get(row).doc_id == doc_id:
                return row
        return None

    def iter_passages(self) -> Iterator[Passage]:
        """Every passage in row order (streamed)."""
        with open(self.directory / CORPUS_FILE, "rb") as fh:
            for line in fh:
                record = json.loads(line)
                title, text = split_contents(record["contents"])
                yield Passage(doc_id=str(record["id"]), title=title, text=text)

    def copy_to(self, directory: str | Path) -> DocStore:
        """Copy the store's files into another index directory and open the copy."""
        import shutil

        directory = Path(directory)
        (directory / CORPUS_FILE).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(self.directory / CORPUS_FILE, directory / CORPUS_FILE)
        shutil.copytree(self.directory / _STORE_DIR, directory / _STORE_DIR, dirs_exist_ok=True)
        return DocStore(directory)
