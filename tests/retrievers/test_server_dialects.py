"""The request dialects in use, written from the public formats, against the real server.

* Search-R1 (``search_r1/search/retrieval_server.py``): a FastAPI app whose request model is
  ``queries: List[str]``, ``topk: Optional[int] = None``, ``return_scores: bool = False``;
  ``if not request.topk`` falls back to the default. Its client (``batch_search``) and verl's search
  tool post ``{"queries": [...], "topk": k, "return_scores": true}`` and read
  ``result[i][j]["document"]["contents"]``.
* SkyRL (``skyrl_gym/tools/search.py`` since mid-2025) posts one ``{"query": "<str>", "topk", "return_scores"}``
  with a ``requests.Session`` and reads ``result`` as a list of per-query lists the same way.
"""

from __future__ import annotations

import json

import pytest

from retrievers.http import HTTPRetriever, hit_from_document
from retrievers.protocol import RequestError, format_document, parse_request
from retrievers.server import RetrievalServer, ServerConfig

from .conftest import named_queries

requests = pytest.importorskip("requests")


@pytest.fixture(scope="module")
def server(bm25_index):
    with RetrievalServer(bm25_index, ServerConfig(port=0, default_topk=3)) as srv:
        yield srv


def _passages_as_clients_read_them(result: list) -> list[list[str]]:
    """What Search-R1, verl and SkyRL take from a response: ``doc_item["document"]["contents"]``."""
    return [[item["document"]["contents"] for item in retrieval] for retrieval in result]


def test_skyrl_single_query_with_a_requests_session(server: RetrievalServer, bm25_index, small_enc) -> None:
    (question, gold), *_ = named_queries(small_enc)
    session = requests.Session()
    response = session.post(server.url + "/retrieve", json={"query": question, "topk": 3, "return_scores": True},
                            headers={"Content-Type": "application/json", "Accept": "application/json"}, timeout=10)
    response.raise_for_status()
    result = response.json()["result"]
    assert len(result) == 1, "one query -> one list of documents"
    assert _passages_as_clients_read_them(result) == [[h.contents for h in bm25_index.search(question, 3)]]
    assert result[0][0]["document"]["id"] == gold
    again = session.post(server.url + "/retrieve", json={"query": question}, timeout=10)  # keep-alive reuse
    assert again.status_code == 200 and len(again.json()["result"][0]) == 3
    session.close()


def test_search_r1_and_verl_batch(server: RetrievalServer, bm25_index, small_enc) -> None:
    queries = [q for q, _ in named_queries(small_enc)[:5]]
    response = requests.post(server.url + "/retrieve", json={"queries": queries, "topk": 2, "return_scores": True},
                             timeout=10)
    assert response.status_code == 200
    assert _passages_as_clients_read_them(response.json()["result"]) == [
        [h.contents for h in hits] for hits in bm25_index.batch_search(queries, 2)]


@pytest.mark.parametrize("topk", [0, None])
def test_topk_zero_or_null_falls_back_to_the_default(server: RetrievalServer, small_enc, topk) -> None:
    question = named_queries(small_enc)[0][0]
    response = requests.post(server.url + "/retrieve", json={"queries": [question], "topk": topk}, timeout=10)
    assert response.status_code == 200 and len(response.json()["result"][0]) == 3


def test_a_string_queries_is_refused_as_search_r1_refuses_it(server: RetrievalServer) -> None:
    response = requests.post(server.url + "/retrieve", json={"queries": "a string"}, timeout=10)
    assert response.status_code == 422
    assert "list of strings" in response.json()["error"] and '{"query": "..."}' in response.json()["error"]


# Bodies and what a pydantic model of Search-R1's request schema makes of them (lax mode, as FastAPI runs it).
_BODIES = [
    {"queries": ["a", "b"]}, {"queries": ["a"], "topk": 5}, {"queries": ["a"], "topk": "5"},
    {"queries": ["a"], "topk": 5.0}, {"queries": ["a"], "topk": 5.5}, {"queries": ["a"], "topk": True},
    {"queries": ["a"], "return_scores": "yes"}, {"queries": ["a"], "return_scores": "off"},
    {"queries": ["a"], "return_scores": 1}, {"queries": ["a"], "return_scores": 2},
    {"queries": ["a"], "return_scores": None}, {"queries": "abc"}, {"queries": [1]}, {"queries": None},
    {"queries": ["a"], "extra": {"ignored": True}}, {"queries": []}, {"topk": 3},
]


@pytest.mark.parametrize("body", _BODIES, ids=[json.dumps(b) for b in _BODIES])
def test_validation_agrees_with_search_r1s_request_model(body) -> None:
    pydantic = pytest.importorskip("pydantic")

    class QueryRequest(pydantic.BaseModel):  # the three fields Search-R1's server declares
        queries: list[str]
        topk: int | None = None
        return_scores: bool = False

    try:
        reference = QueryRequest.model_validate(body)
    except pydantic.ValidationError:
        reference = None
    try:
        ours = parse_request(json.dumps(body).encode(), default_topk=3, max_topk=100, max_queries=64,
                             max_query_chars=100)
    except RequestError:
        ours = None
    assert (ours is None) == (reference is None), (body, ours, reference)
    if ours is not None:
        assert list(ours.queries) == reference.queries and ours.return_scores == reference.return_scores
        assert ours.topk == (reference.topk or 3)


def test_search_r1_bm25_document_shape_and_the_client_reads_every_shape(bm25_index, small_enc) -> None:
    question = named_queries(small_enc)[0][0]
    expected = bm25_index.search(question, 2)
    with RetrievalServer(bm25_index, ServerConfig(port=0, document_format="search-r1-bm25")) as srv:
        body = requests.post(srv.url + "/retrieve", json={"queries": [question], "topk": 2}, timeout=10).json()
        document = body["result"][0][0]
        assert set(document) == {"title", "text", "contents"}, "Search-R1's BM25 server shape: no id"
        assert document["title"] == expected[0].title and document["contents"] == expected[0].contents
        for request_format in ("queries", "query"):
            hits = HTTPRetriever(srv.url, request_format=request_format).batch_search([question, question], 2)
            assert [(h.title, h.text) for h in hits[0]] == [(h.title, h.text) for h in expected]
            assert len(hits) == 2 and all(h.doc_id == "" for h in hits[0])
    hit = expected[0]
    for document in (format_document(hit, "corpus"), format_document(hit, "search-r1-bm25"),
                     {"docid": hit.doc_id, "title": hit.title, "text": hit.text}):
        read = hit_from_document({"document": document, "score": hit.score})
        assert (read.title, read.text, read.score) == (hit.title, hit.text, pytest.approx(hit.score))


def test_http_retriever_single_query_dialect(server: RetrievalServer, bm25_index, small_enc) -> None:
    queries = [q for q, _ in named_queries(small_enc)[:4]]
    client = HTTPRetriever(server.url, request_format="query")
    assert [[h.doc_id for h in hits] for hits in client.batch_search(queries, 3)] == [
        [h.doc_id for h in hits] for hits in bm25_index.batch_search(queries, 3)]
    with pytest.raises(ValueError, match="request_format"):
        HTTPRetriever(server.url, request_format="graphql")
