"""The retrieval server answers real HTTP clients in Search-R1's format; HTTPRetriever is its client."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from retrievers import Hit, RetrieverError, load_retriever
from retrievers.http import HTTPRetriever
from retrievers.server import RetrievalServer, ServerConfig

from .conftest import named_queries


@pytest.fixture(scope="module")
def server(bm25_index):
    with RetrievalServer(bm25_index, ServerConfig(port=0, max_queries=64, max_body_bytes=20_000)) as srv:
        yield srv


def post(url: str, body: bytes, timeout: float = 10) -> tuple[int, dict]:
    request = urllib.request.Request(url + "/retrieve", data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_search_r1_format(server: RetrievalServer, bm25_index, small_enc) -> None:
    (q1, gold1), (q2, _) = named_queries(small_enc)[:2]
    status, body = post(server.url, json.dumps({"queries": [q1, q2], "topk": 3, "return_scores": True}).encode())
    assert status == 200 and list(body) == ["result"] and len(body["result"]) == 2
    first = body["result"][0]
    assert len(first) == 3 and set(first[0]) == {"document", "score"}
    assert set(first[0]["document"]) == {"id", "contents"} and first[0]["document"]["id"] == gold1
    expected = bm25_index.search(q1, 3)
    assert [d["document"]["contents"] for d in first] == [h.contents for h in expected]
    assert [d["score"] for d in first] == pytest.approx([h.score for h in expected])
    status, body = post(server.url, json.dumps({"queries": [q1]}).encode())
    assert status == 200 and set(body["result"][0][0]) == {"id", "contents"}, "no scores: bare documents"
    assert len(body["result"][0]) == 3, "default topk"


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        (b"{not json", 422, "not valid JSON"),
        (b"[1, 2]", 422, "JSON object"),
        (json.dumps({"queries": [1]}).encode(), 422, "list of strings"),
        (json.dumps({"queries": "a string"}).encode(), 422, "list of strings, got a string"),
        (json.dumps({"query": ["a"]}).encode(), 422, "'query' must be a string"),
        (json.dumps({"query": "a", "queries": ["a"]}).encode(), 422, "not both"),
        (json.dumps({"topk": 3}).encode(), 422, "needs 'queries'"),
        (json.dumps({"queries": ["a"], "topk": -1}).encode(), 422, "'topk'"),
        (json.dumps({"queries": ["a"], "topk": 2.5}).encode(), 422, "'topk'"),
        (json.dumps({"queries": ["a"], "topk": "three"}).encode(), 422, "'topk'"),
        (json.dumps({"queries": ["a"], "topk": 101}).encode(), 422, "'topk'"),
        (json.dumps({"queries": ["a"], "return_scores": "maybe"}).encode(), 422, "return_scores"),
        (json.dumps({"queries": ["a"], "return_scores": None}).encode(), 422, "return_scores"),
        (b'{"queries": ["a"], "topk": ' + b"9" * 5000 + b"}", 422, "not valid JSON"),
        (b"[" * 9000 + b"]" * 9000, 422, "not valid JSON"),
        (b"[" * 100_000 + b"]" * 100_000, 413, "limit is 20000"),
        (b"\xff\xfe{}", 422, "not valid JSON"),
        (json.dumps({"queries": ["a"] * 65}).encode(), 422, "limit is 64"),
        (json.dumps({"queries": ["a" * 30_000]}).encode(), 413, "limit is 20000"),
    ],
)
def test_bad_requests(server: RetrievalServer, body: bytes, status: int, message: str) -> None:
    got, payload = post(server.url, body)
    assert got == status and message in payload["error"], payload


def test_routes_and_health(server: RetrievalServer) -> None:
    with urllib.request.urlopen(server.url + "/health", timeout=10) as response:
        assert json.loads(response.read())["status"] == "ok"
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(server.url + "/nope", timeout=10)
    assert info.value.code == 404


def test_http_retriever_round_trip_and_concurrency(server: RetrievalServer, bm25_index, small_enc, tmp_path: Path):
    client = HTTPRetriever(server.url, timeout=10)
    queries = [q for q, _ in named_queries(small_enc)]
    assert client.batch_search(queries, 3) == [
        [Hit(h.doc_id, pytest.approx(h.score), h.title, h.text) for h in hits] for hits in bm25_index.batch_search(queries, 3)
    ]
    client.save(tmp_path / "client")
    assert isinstance(load_retriever(tmp_path / "client"), HTTPRetriever)
    results: dict[int, list[Hit]] = {}
    before = server.batcher.batches

    def worker(i: int) -> None:
        results[i] = client.search(queries[i % len(queries)], 2)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(24)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert len(results) == 24
    assert all(results[i] == client.search(queries[i % len(queries)], 2) for i in range(24))
    assert server.batcher.batches > before


def test_micro_batching_merges_concurrent_requests(bm25_index, small_enc) -> None:
    queries = [q for q, _ in named_queries(small_enc)][:10]
    with RetrievalServer(bm25_index, ServerConfig(port=0, batch_window_ms=300)) as srv:
        futures = [srv.batcher.submit([q], k) for q, k in zip(queries, range(1, 11))]
        answers = [f.result(timeout=30) for f in futures]
        assert srv.batcher.batches == 1, "ten requests inside one window -> one batch_search call"
    assert answers == [[bm25_index.search(q, k)] for q, k in zip(queries, range(1, 11))]


def test_env_through_the_server(server: RetrievalServer, small_enc) -> None:
    from trace_envs import check_branchable_env
    from trace_envs.wiki_search import WikiQAEnv

    env = WikiQAEnv(retriever=server.url, tasks=small_enc.tasks)
    check_branchable_env(env)


def test_unreachable_server_is_a_clear_error() -> None:
    client = HTTPRetriever("http://127.0.0.1:9", timeout=2)
    with pytest.raises(RetrieverError, match="cannot reach"):
        client.search("x")
