"""BM25 with bm25s: the embedded default backend (numpy/scipy only, no Java).

Index layout: ``retriever.json`` (kind "bm25"), ``bm25s/`` (bm25s's sparse
score matrix and vocabulary, memory-mapped on load when ``mmap`` is set) and
the shared document store (``corpus/``, ``docstore/``).

Building tokenizes the corpus in chunks while streaming it, but bm25s keeps
every passage's token ids in memory until the score matrix is built (about
1 GB per million passages): for wiki-18 scale use the Lucene backend.
Scores use Lucene's BM25 variant with Anserini's defaults (k1=0.9, b=0.4),
so rankings are close to Lucene's (bm25s does not stem unless asked).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from retrievers._index import IndexDirRetriever, check_k, prepare_out, write_store
from retrievers.base import BackendUnavailableError, Hit, write_manifest
from retrievers.corpus import Passage

__all__ = ["BM25Config", "BM25Retriever"]

_CHUNK = 20_000


@dataclass(frozen=True, kw_only=True)
class BM25Config:
    """How a bm25s index is built and queried.

    Attributes:
        k1: term-frequency saturation.
        b: length normalisation.
        method: bm25s scoring variant ("lucene", "robertson", "atire", "bm25l", "bm25+").
        stopwords: stopword list name for bm25s ("en") or "" for none.
        mmap: memory-map the score matrix on load (for indexes larger than RAM).
    """

    k1: float = 0.9
    b: float = 0.4
    method: str = "lucene"
    stopwords: str = "en"
    mmap: bool = False

    def __post_init__(self) -> None:
        if self.k1 <= 0 or not 0 <= self.b <= 1:
            raise ValueError(f"BM25 needs k1 > 0 and 0 <= b <= 1, got k1={self.k1}, b={self.b}")
        if self.method not in ("lucene", "robertson", "atire", "bm25l", "bm25+"):
            raise ValueError(f"unknown bm25s method {self.method!r}")


def _import_bm25s() -> Any:
    try:
        import bm25s
    except ImportError as exc:
        raise BackendUnavailableError(
            f"the BM25 retriever (WikiQA-v0's default) needs bm25s, which this Python lacks ({exc}): "
            f"pip install 'trace-gym[wiki]' (or pip install bm25s)"
        ) from None
    return bm25s


def _tokenizer(config: BM25Config) -> Any:
    bm25s = _import_bm25s()
    return bm25s.tokenization.Tokenizer(stopwords=config.stopwords or None)


class BM25Retriever(IndexDirRetriever):
    """BM25 over a bm25s index. Build with :meth:`build`, reopen with :meth:`load`."""

    kind = "bm25"

    def __init__(self, directory: str | Path, *, _tmp: Any = None) -> None:
        super().__init__(directory, _tmp=_tmp)
        self.config = BM25Config(**self.manifest["config"])
        bm25s = _import_bm25s()
        self._model = bm25s.BM25.load(str(self.directory / "bm25s"), mmap=self.config.mmap)
        self._tok = _tokenizer(self.config)
        self._tok.load_vocab(str(self.directory / "bm25s"))
        self._n = len(self)
        self._lock = threading.Lock()  # bm25s's tokenizer keeps per-call caches

    @classmethod
    def load(cls, directory: str | Path) -> BM25Retriever:
        """Open an index written by :meth:`build` or :meth:`save`."""
        return cls(directory)

    @classmethod
    def build(
        cls,
        corpus: str | Path | Iterable[Mapping[str, Any] | Passage],
        out: str | Path | None = None,
        *,
        progress: bool = False,
        overwrite: bool = False,
        **config: Any,
    ) -> BM25Retriever:
        """Index a corpus (path or iterable of records) into ``out`` (a temporary directory when None)."""
        cfg = BM25Config(**config)
        directory, tmp = prepare_out(out, overwrite=overwrite)
        bm25s = _import_bm25s()
        tok = _tokenizer(cfg)
        ids: list[list[int]] = []
        chunk: list[str] = []

        def flush() -> None:
            if chunk:
                ids.extend(tok.tokenize(chunk, update_vocab=True, return_as="ids", show_progress=False))
                chunk.clear()

        def each(passage: Passage) -> None:
            chunk.append(passage.title + "\n" + passage.text)
            if len(chunk) >= _CHUNK:
                flush()

        n_docs = write_store(directory, corpus, progress=progress, desc="bm25s: reading", each=each)
        flush()
        model = bm25s.BM25(k1=cfg.k1, b=cfg.b, method=cfg.method)
        model.index((ids, tok.get_vocab_dict()), show_progress=progress)
        ids.clear()
        model.save(str(directory / "bm25s"), show_progress=False)
        tok.save_vocab(str(directory / "bm25s"))
        write_manifest(directory, cls.kind, asdict(cfg), n_docs=n_docs)
        return cls(directory, _tmp=tmp)

    def batch_search(self, queries: Sequence[str], k: int = 10) -> list[list[Hit]]:
        """Top-``k`` hits per query (hits with score 0, i.e. no shared term, are dropped)."""
        k = min(check_k(k), self._n)
        if not queries:
            return []
        with self._lock:
            qids = self._tok.tokenize(list(queries), update_vocab=False, return_as="ids", show_progress=False)
            # unknown words map to id 0 (the empty token); a query of only those matches nothing
            nonempty = [i for i, q in enumerate(qids) if any(t != 0 for t in q)]
            results: list[list[Hit]] = [[] for _ in queries]
            if not nonempty:
                return results
            docs, scores = self._model.retrieve(
                [[t for t in qids[i] if t != 0] for i in nonempty], k=k, show_progress=False, n_threads=1
            )
        for slot, i in enumerate(nonempty):
            keep = [(int(d), float(s)) for d, s in zip(docs[slot], scores[slot]) if s > 0]
            results[i] = self._hits([d for d, _ in keep], [s for _, s in keep])
        return results
