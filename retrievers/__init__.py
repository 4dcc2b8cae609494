"""retrievers: one Retriever protocol over BM25 (bm25s, Lucene), dense (faiss) and HTTP backends.

``import retrievers`` is cheap: the backends (bm25s, Java via pyjnius, faiss,
sentence-transformers) are imported only when one is used::

    import retrievers

    r = retrievers.build_index("corpus.jsonl", "idx/bm25", kind="bm25")
    r = retrievers.load_retriever("idx/bm25")        # dispatches on idx/bm25/retriever.json
    hits = r.search("founder of the Velmora Foundry", k=3)   # list[Hit]

The retrieval server (``trace-gym serve-retriever``) speaks Search-R1's
``POST /retrieve``; :class:`HTTPRetriever` is its client.
"""

from __future__ import annotations

import importlib
from typing import Any

from retrievers.base import (
    KINDS,
    MANIFEST_NAME,
    BackendUnavailableError,
    Hit,
    IndexNotFoundError,
    Retriever,
    RetrieverError,
    build_index,
    format_contents,
    load_retriever,
    read_manifest,
    split_contents,
    write_manifest,
)

__all__ = [
    "Hit",
    "Retriever",
    "RetrieverError",
    "IndexNotFoundError",
    "BackendUnavailableError",
    "KINDS",
    "MANIFEST_NAME",
    "build_index",
    "load_retriever",
    "read_manifest",
    "write_manifest",
    "format_contents",
    "split_contents",
    "Passage",
    "iter_corpus",
    "write_corpus",
    "DocStore",
    "BM25Retriever",
    "BM25Config",
    "LuceneRetriever",
    "LuceneConfig",
    "DenseRetriever",
    "DenseConfig",
    "HTTPRetriever",
    "RetrievalServer",
    "ServerConfig",
]

_LAZY = {
    "Passage": "retrievers.corpus",
    "iter_corpus": "retrievers.corpus",
    "write_corpus": "retrievers.corpus",
    "DocStore": "retrievers.corpus",
    "BM25Retriever": "retrievers.bm25",
    "BM25Config": "retrievers.bm25",
    "LuceneRetriever": "retrievers.lucene",
    "LuceneConfig": "retrievers.lucene",
    "DenseRetriever": "retrievers.dense",
    "DenseConfig": "retrievers.dense",
    "HTTPRetriever": "retrievers.http",
    "RetrievalServer": "retrievers.server",
    "ServerConfig": "retrievers.server",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'retrievers' has no attribute {name!r}")
