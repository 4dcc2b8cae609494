"""bm25s backend, the document store, manifests and load_retriever."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

import retrievers
from retrievers import Hit, IndexNotFoundError, Retriever, RetrieverError, load_retriever
from retrievers.bm25 import BM25Retriever
from retrievers.corpus import DocStore, iter_corpus, parse_record

from .conftest import named_queries


def test_bm25_returns_the_gold_passage_for_named_questions(bm25_index: BM25Retriever, small_enc) -> None:
    assert isinstance(bm25_index, Retriever)
    pairs = named_queries(small_enc)
    found = [gold in [h.doc_id for h in bm25_index.search(q, 3)] for q, gold in pairs]
    assert sum(found) == len(pairs), [q for (q, _), ok in zip(pairs, found) if not ok]
    top = bm25_index.search(pairs[0][0], 5)
    assert len(top) == 5 and all(isinstance(h, Hit) for h in top)
    assert [h.score for h in top] == sorted((h.score for h in top), reverse=True)
    assert top[0].title and top[0].text and top[0].contents == f'"{top[0].title}"\n{top[0].text}'


def test_batch_matches_single_and_edge_queries(bm25_index: BM25Retriever, small_enc) -> None:
    queries = [q for q, _ in named_queries(small_enc)][:8] + ["", "the of and", "zzzunknownzzz"]
    batch = bm25_index.batch_search(queries, 4)
    assert batch == [bm25_index.search(q, 4) for q in queries]
    assert batch[-3:] == [[], [], []], "empty, all-stopword and unknown queries match nothing"
    assert bm25_index.batch_search([], 3) == []
    assert len(bm25_index.search("city", 10_000)) <= len(bm25_index)
    with pytest.raises(ValueError):
        bm25_index.search("city", 0)


def test_save_load_round_trip(bm25_index: BM25Retriever, small_enc, tmp_path: Path) -> None:
    queries = [q for q, _ in named_queries(small_enc)]
    saved = bm25_index.save(tmp_path / "copy")
    again = load_retriever(saved)
    assert isinstance(again, BM25Retriever) and again.fingerprint == bm25_index.fingerprint
    assert again.batch_search(queries, 3) == bm25_index.batch_search(queries, 3)
    mm = BM25Retriever.build(bm25_index.docs.iter_passages(), tmp_path / "mm", mmap=True)
    assert mm.batch_search(queries, 3) == bm25_index.batch_search(queries, 3)
    assert mm.fingerprint != bm25_index.fingerprint, "configuration is part of the fingerprint"


def test_corpus_formats_and_docstore(tmp_path: Path) -> None:
    lines = [
        {"id": "1", "title": "Alpha", "text": "first passage about alpha"},
        {"id": "w2", "contents": '"Beta (band)"\nsecond passage\nwith two lines'},
        {"_id": "b3", "title": "Gamma", "text": "third"},
        {"contents": "no title here"},
    ]
    path = tmp_path / "c.jsonl.gz"
    with gzip.open(path, "wt") as fh:
        fh.write("\n".join(json.dumps(x) for x in lines) + "\n\n")
    passages = list(iter_corpus(path))
    assert [p.doc_id for p in passages] == ["1", "w2", "b3", "3"]
    assert passages[1].title == "Beta (band)" and passages[1].text == "second passage\nwith two lines"
    assert passages[3].title == "" and passages[3].text == "no title here"
    store = DocStore.build(passages, tmp_path / "store")
    assert len(store) == 4 and store.get(1) == passages[1]
    assert store.row_of("b3") == 2 and store.row_of("nope") is None
    assert list(store.iter_passages()) == passages
    with pytest.raises(IndexError):
        store.get(4)
    with pytest.raises(ValueError):
        parse_record({"id": "x"})
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": 1, "text": "ok"}\n{not json\n')
    with pytest.raises(ValueError, match="bad.jsonl:2"):
        list(iter_corpus(bad))


def test_build_index_dispatch_and_errors(tmp_path: Path) -> None:
    docs = [{"id": str(i), "title": f"T{i}", "text": f"word{i} shared"} for i in range(20)]
    r = retrievers.build_index(docs, tmp_path / "i", kind="bm25")
    assert r.search("word7", 1)[0].doc_id == "7"
    with pytest.raises(RetrieverError, match="already holds an index"):
        retrievers.build_index(docs, tmp_path / "i", kind="bm25")
    retrievers.build_index(docs[:5], tmp_path / "i", kind="bm25", overwrite=True)
    assert len(load_retriever(tmp_path / "i")) == 5
    with pytest.raises(IndexNotFoundError, match="trace-gym index build"):
        load_retriever(tmp_path)
    with pytest.raises(ValueError):
        retrievers.build_index(docs, tmp_path / "j", kind="nope")
    with pytest.raises(ValueError, match="empty"):
        retrievers.build_index([], tmp_path / "k", kind="bm25")
    temp = BM25Retriever.build(docs)
    assert temp.directory.exists() and temp.search("word3", 1)[0].doc_id == "3"
