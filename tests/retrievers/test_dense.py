"""Dense backend: faiss flat / HNSW / IVF over the bundled all-MiniLM-L6-v2 (offline)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from retrievers import load_retriever
from retrievers.dense import DenseConfig, DenseRetriever, Encoder

from .conftest import named_queries

os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytestmark = pytest.mark.slow  # encoding with all-MiniLM-L6-v2 on CPU takes ~30 s in all


@pytest.fixture(scope="module")
def subset(small_enc) -> list[dict]:
    """The gold passages of the named questions plus ~150 distractors (encoding is slow on CPU)."""
    gold = {g for _, g in named_queries(small_enc)}
    picked = [p for p in small_enc.passages if p["id"] in gold]
    return picked + [p for p in small_enc.passages if p["id"] not in gold][::4]


@pytest.fixture(scope="module")
def encoder() -> Encoder:
    return Encoder(DenseConfig())


@pytest.fixture(scope="module")
def flat(subset, encoder, tmp_path_factory) -> DenseRetriever:
    return DenseRetriever.build(subset, tmp_path_factory.mktemp("dense") / "flat", encoder=encoder)


def test_dense_returns_the_gold_passage(flat: DenseRetriever, small_enc) -> None:
    pairs = named_queries(small_enc)
    found = [gold in [h.doc_id for h in hits] for (_, gold), hits in
             zip(pairs, flat.batch_search([q for q, _ in pairs], 3))]
    assert sum(found) >= len(pairs) - 2, [q for (q, _), ok in zip(pairs, found) if not ok]
    hits = flat.search(pairs[0][0], 4)
    assert len(hits) == 4 and [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
    assert flat.search("   ", 3) == []


def test_prefixes_and_config() -> None:
    assert DenseConfig(model="intfloat/e5-base-v2").prefixes == ("query: ", "passage: ")
    assert DenseConfig().prefixes == ("", "")
    assert DenseConfig(query_prefix="q: ", passage_prefix="p: ").prefixes == ("q: ", "p: ")
    with pytest.raises(ValueError):
        DenseConfig(index="lsh")


@pytest.mark.parametrize("kind", ["hnsw", "ivf"])
def test_approximate_indexes_agree_with_flat(kind: str, flat: DenseRetriever, subset, encoder, small_enc,
                                             tmp_path: Path) -> None:
    approx = DenseRetriever.build(subset, tmp_path / kind, encoder=encoder, index=kind, train_size=len(subset),
                                  nprobe=64)
    queries = [q for q, _ in named_queries(small_enc)]
    top_flat = [h[0].doc_id for h in flat.batch_search(queries, 1)]
    top_approx = [h[0].doc_id for h in approx.batch_search(queries, 1)]
    assert sum(a == b for a, b in zip(top_flat, top_approx)) >= len(queries) - 1


def test_save_load_round_trip(flat: DenseRetriever, small_enc, tmp_path: Path) -> None:
    queries = [q for q, _ in named_queries(small_enc)][:5]
    again = load_retriever(flat.save(tmp_path / "copy"))
    assert isinstance(again, DenseRetriever) and again.config == flat.config
    for a, b in zip(again.batch_search(queries, 3), flat.batch_search(queries, 3)):
        assert [h.doc_id for h in a] == [h.doc_id for h in b]
        assert [h.score for h in a] == pytest.approx([h.score for h in b], abs=1e-5)
