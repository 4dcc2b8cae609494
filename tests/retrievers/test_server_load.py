"""Server hardening (issue 14, class 6): many clients, stalled clients, trickling clients, bad queries.

Every loop is bounded (a fixed number of clients, joins and socket reads with timeouts).
"""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

from retrievers.bm25 import BM25Retriever
from retrievers.server import RetrievalServer, ServerConfig

from .conftest import named_queries


def _retrieve(url: str, query: str, k: int = 2, timeout: float = 30) -> tuple[int, dict]:
    body = json.dumps({"queries": [query], "topk": k, "return_scores": True}).encode()
    request = urllib.request.Request(url + "/retrieve", data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _address(server: RetrievalServer) -> tuple[str, int]:
    host, port = server.url.removeprefix("http://").rsplit(":", 1)
    return host, int(port)


def test_200_concurrent_clients_none_reset(bm25_index, small_enc) -> None:
    queries = [q for q, _ in named_queries(small_enc)]
    expected = {q: [h.doc_id for h in hits] for q, hits in zip(queries, bm25_index.batch_search(queries, 2))}
    barrier = threading.Barrier(200, timeout=60)

    def client(i: int) -> tuple[str, int, list[str]]:
        query = queries[i % len(queries)]
        barrier.wait()  # every client connects at the same moment
        status, body = _retrieve(url, query)
        return query, status, [item["document"]["id"] for item in body["result"][0]]

    # 200 clients, all from 127.0.0.1: one address, so its own limit must allow them
    with RetrievalServer(bm25_index, ServerConfig(port=0, max_connections_per_client=256)) as server:
        url = server.url
        with ThreadPoolExecutor(max_workers=200) as pool:
            answers = list(pool.map(client, range(200), timeout=120))
        assert server.open_connections == 0 or server.open_connections <= 200
    assert len(answers) == 200
    assert all(status == 200 and ids == expected[q] for q, status, ids in answers)


def test_300_stalled_connections_do_not_block_innocent_requests(bm25_index, small_enc) -> None:
    queries = [q for q, _ in named_queries(small_enc)][:20]
    stalled: list[socket.socket] = []
    config = ServerConfig(port=0, read_timeout_s=60, idle_timeout_s=60, max_connections_per_client=400)
    with RetrievalServer(bm25_index, config) as server:
        try:
            for i in range(300):
                s = socket.create_connection(_address(server), timeout=10)
                if i % 3 == 1:
                    s.sendall(b"POST /retrieve HTTP/1.1\r\nHost: x\r\n")  # headers never finished
                elif i % 3 == 2:
                    s.sendall(b"POST /retrieve HTTP/1.1\r\nContent-Length: 1000\r\n\r\n{\"que")  # body never finished
                stalled.append(s)
            deadline = time.monotonic() + 10
            while server.open_connections < 300 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert server.open_connections >= 300, "the server holds every stalled connection open"
            start = time.monotonic()
            with ThreadPoolExecutor(max_workers=20) as pool:
                answers = list(pool.map(lambda q: _retrieve(server.url, q, timeout=20), queries, timeout=60))
            elapsed = time.monotonic() - start
            assert all(status == 200 and len(body["result"][0]) == 2 for status, body in answers)
            assert elapsed < 15, f"innocent requests took {elapsed:.1f} s next to 300 stalled connections"
        finally:
            for s in stalled:
                s.close()


def test_stalled_and_trickling_clients_are_cut_off_at_the_read_deadline(bm25_index) -> None:
    with RetrievalServer(bm25_index, ServerConfig(port=0, read_timeout_s=1.0, idle_timeout_s=1.0)) as server:
        silent = socket.create_connection(_address(server), timeout=10)
        trickler = socket.create_connection(_address(server), timeout=10)
        start = time.monotonic()
        request = b"POST /retrieve HTTP/1.1\r\nContent-Length: 30\r\n\r\n" + b'{"queries": ["a"]}'
        closed_at = None
        for byte in request:  # one byte every 0.2 s: each read is quick, the request as a whole is not
            try:
                trickler.sendall(bytes([byte]))
            except OSError:
                closed_at = time.monotonic() - start
                break
            time.sleep(0.2)
            trickler.settimeout(0.01)
            try:
                if trickler.recv(4096):
                    closed_at = time.monotonic() - start
                    break
            except (TimeoutError, BlockingIOError):
                pass
            except OSError:
                closed_at = time.monotonic() - start
                break
        assert closed_at is not None and closed_at < 4, f"trickling client still connected after {closed_at}"
        silent.settimeout(5)
        answer = silent.recv(4096)
        assert answer.startswith(b"HTTP/1.1 408"), answer[:60]
        silent.close()
        trickler.close()
        deadline = time.monotonic() + 5
        while server.open_connections and time.monotonic() < deadline:
            time.sleep(0.05)
        assert server.open_connections == 0


class _FailsOnBoom(BM25Retriever):
    """The real bm25s index, with a backend that cannot handle queries containing 'BOOM'."""

    def batch_search(self, queries, k=10):
        if any("BOOM" in q for q in queries):
            raise RuntimeError("the backend cannot parse this query")
        return super().batch_search(queries, k)


def test_a_bad_query_fails_only_its_own_request(bm25_index, small_enc) -> None:
    retriever = _FailsOnBoom.load(bm25_index.directory)
    queries = [q for q, _ in named_queries(small_enc)][:9] + ["BOOM (unbalanced"]
    expected = {q: [h.doc_id for h in hits] for q, hits in zip(queries[:9], bm25_index.batch_search(queries[:9], 2))}
    with RetrievalServer(retriever, ServerConfig(port=0, batch_window_ms=300)) as server:
        with ThreadPoolExecutor(max_workers=10) as pool:
            answers = dict(zip(queries, pool.map(lambda q: _retrieve(server.url, q), queries, timeout=60)))
        assert server.batcher.isolated_failures == 1
    status, body = answers.pop("BOOM (unbalanced")
    assert status == 500 and "cannot parse" in body["error"]
    assert all(status == 200 and [d["document"]["id"] for d in body["result"][0]] == expected[q]
               for q, (status, body) in answers.items())


@pytest.mark.parametrize("raw", [
    b"GARBAGE\r\n\r\n",
    b"POST /retrieve HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
    b"POST /retrieve HTTP/1.1\r\n\r\n",
    b"POST /retrieve HTTP/1.1\r\nX-Long: " + b"a" * 40_000 + b"\r\n\r\n",
])
def test_malformed_http_gets_an_error_and_the_server_lives_on(bm25_index, raw: bytes) -> None:
    with RetrievalServer(bm25_index, ServerConfig(port=0)) as server:
        with socket.create_connection(_address(server), timeout=10) as s:
            s.sendall(raw)
            answer = s.recv(4096)
        assert answer.split(b" ", 2)[1] in (b"400", b"411", b"431"), answer[:80]
        assert _retrieve(server.url, "city")[0] == 200


def test_a_body_larger_than_the_header_limit_is_read_whole(bm25_index, small_enc) -> None:
    queries = [q for q, _ in named_queries(small_enc)] * 25  # ~900 queries, ~50 KB of JSON
    body = json.dumps({"queries": queries, "topk": 1}).encode()
    assert len(body) > 40_000
    with RetrievalServer(bm25_index, ServerConfig(port=0)) as server:
        request = urllib.request.Request(server.url + "/retrieve", data=body)
        with urllib.request.urlopen(request, timeout=60) as response:
            result = json.loads(response.read())["result"]
    assert len(result) == len(queries) and all(len(r) == 1 for r in result)


def test_expect_100_continue_as_curl_sends_it(bm25_index) -> None:
    body = json.dumps({"query": "city river", "topk": 1}).encode()
    with RetrievalServer(bm25_index, ServerConfig(port=0)) as server:
        with socket.create_connection(_address(server), timeout=10) as s:
            s.sendall(b"POST /retrieve HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: "
                      + str(len(body)).encode() + b"\r\nConnection: close\r\n\r\n")
            assert s.recv(4096).startswith(b"HTTP/1.1 100 Continue")
            s.sendall(body)
            answer = b""
            for _ in range(100):  # bounded: until the server closes
                chunk = s.recv(65536)
                if not chunk:
                    break
                answer += chunk
    head, _, payload = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") and len(json.loads(payload)["result"][0]) == 1
