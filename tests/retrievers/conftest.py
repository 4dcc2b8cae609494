"""Shared corpora and indexes for the retriever tests (built once per session, in tmp dirs)."""

from __future__ import annotations

from pathlib import Path

import pytest

from retrievers.corpus import iter_corpus, write_corpus
from trace_envs.tasks.wiki import Encyclopedia, SyntheticWikiConfig, generate_encyclopedia

SMALL = SyntheticWikiConfig(seed=3, n_countries=8, n_cities=30, n_people=160, n_orgs=80, n_books=60, n_questions=8)


@pytest.fixture(scope="session")
def small_enc() -> Encyclopedia:
    """A ~600-passage synthetic encyclopedia (fast to index with every backend)."""
    return generate_encyclopedia(SMALL)


@pytest.fixture(scope="session")
def small_corpus(small_enc: Encyclopedia, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("corpus") / "corpus.jsonl"
    write_corpus(iter_corpus(small_enc.passages), path)
    return path


@pytest.fixture(scope="session")
def bm25_index(small_corpus: Path, tmp_path_factory: pytest.TempPathFactory):
    from retrievers.bm25 import BM25Retriever

    return BM25Retriever.build(small_corpus, tmp_path_factory.mktemp("idx") / "bm25")


def named_queries(enc: Encyclopedia) -> list[tuple[str, str]]:
    """(question that names an entity, gold passage id) pairs: organisations, books, cities."""
    out = []
    for p in enc.passages:
        if p["id"].endswith("-main") and len(out) < 15:
            out.append((f"Where is the {p['title']} headquartered and who founded it?", p["id"]))
    books = [p for p in enc.passages if p["id"].startswith("book-")][:10]
    out += [(f"Who wrote {p['title']}?", p["id"]) for p in books]
    cities = [p for p in enc.passages if p["id"].startswith("city-")][:10]
    out += [(f"In which country is the city of {p['title']}?", p["id"]) for p in cities]
    return out
