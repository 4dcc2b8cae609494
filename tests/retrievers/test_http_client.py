"""HTTPRetriever's transport: retries of a shedding server (503 + Retry-After), of 502/504, and of refused
connections; errors that are not retried; the client shared across threads; close and reopen.

The servers here are scripted ``http.server`` handlers on loopback that answer each request from a list,
so the retry policy is observed from the server's side (how many requests arrived, and when).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from retrievers.base import RetrieverError
from retrievers.http import MAX_RETRY_AFTER_S, HTTPRetriever

pytest.importorskip("httpx")

OK = (200, {}, json.dumps({"result": [[{"document": {"id": "d1", "contents": '"T"\ntext'}, "score": 1.5}]]}))


class Scripted:
    """A loopback server answering the n-th request with ``answers[n]`` (the last one repeats)."""

    def __init__(self, answers: list[tuple[int, dict[str, str], str]]) -> None:
        self.answers = answers
        self.arrivals: list[float] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                outer.arrivals.append(time.monotonic())
                status, headers, body = outer.answers[min(len(outer.arrivals), len(outer.answers)) - 1]
                data = body.encode()
                self.send_response(status)
                for key, value in {"Content-Type": "application/json", **headers}.items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def __enter__(self) -> Scripted:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def scripted() -> Iterator[type[Scripted]]:
    yield Scripted


def test_a_shedding_server_is_retried_after_its_retry_after(scripted) -> None:
    shed = (503, {"Retry-After": "0.2"}, '{"error": "busy"}')
    with scripted([shed, shed, OK]) as srv:
        hits = HTTPRetriever(srv.url, retries=3).search("q", 1)
    assert [h.doc_id for h in hits] == ["d1"] and len(srv.arrivals) == 3
    gaps = [b - a for a, b in zip(srv.arrivals, srv.arrivals[1:])]
    assert all(g >= 0.18 for g in gaps), gaps


@pytest.mark.parametrize("status", [502, 504])
def test_gateway_errors_are_retried_with_backoff(scripted, status: int) -> None:
    with scripted([(status, {}, "gateway"), OK]) as srv:
        hits = HTTPRetriever(srv.url, retries=1, backoff_s=0.05).search("q", 1)
    assert hits[0].title == "T" and len(srv.arrivals) == 2


def test_retries_run_out_with_the_servers_own_message(scripted) -> None:
    with scripted([(503, {"Retry-After": "0"}, '{"error": "still busy"}')]) as srv:
        with pytest.raises(RetrieverError, match="answered 503: .*still busy"):
            HTTPRetriever(srv.url, retries=2).search("q", 1)
    assert len(srv.arrivals) == 3


def test_retries_zero_fails_at_once(scripted) -> None:
    with scripted([(503, {"Retry-After": "3"}, "busy"), OK]) as srv:
        t = time.monotonic()
        with pytest.raises(RetrieverError, match="503"):
            HTTPRetriever(srv.url, retries=0).search("q", 1)
    assert len(srv.arrivals) == 1 and time.monotonic() - t < 2.0


@pytest.mark.parametrize("answer", [(400, {}, '{"error": "bad topk"}'), (422, {}, "{}"), (500, {}, "boom")])
def test_client_and_server_errors_are_not_retried(scripted, answer) -> None:
    with scripted([answer, OK]) as srv:
        with pytest.raises(RetrieverError, match=f"answered {answer[0]}"):
            HTTPRetriever(srv.url, retries=3).search("q", 1)
    assert len(srv.arrivals) == 1


@pytest.mark.parametrize("retry_after", ["3600", "-5", "soon", "1e999", "nan", "-inf"])
def test_hostile_retry_after_is_bounded(scripted, retry_after: str) -> None:
    client = HTTPRetriever("http://127.0.0.1:9", retries=1, backoff_s=0.01)

    class Answer:
        headers = {"retry-after": retry_after}

    assert 0.0 <= client._pause(Answer(), 0) <= MAX_RETRY_AFTER_S


def test_invalid_json_and_a_wrong_shape_are_clear_errors(scripted) -> None:
    with scripted([(200, {}, "<html>not json")]) as srv:
        with pytest.raises(RetrieverError, match="invalid JSON"):
            HTTPRetriever(srv.url).search("q", 1)
    with scripted([(200, {}, '{"result": "nope"}')]) as srv:
        with pytest.raises(RetrieverError, match="expected"):
            HTTPRetriever(srv.url).search("q", 1)


def test_refused_connections_are_retried_then_a_clear_error() -> None:
    t = time.monotonic()
    with pytest.raises(RetrieverError, match="cannot reach"):
        HTTPRetriever("http://127.0.0.1:9", retries=2, timeout=2).search("q", 1)
    assert time.monotonic() - t < 10.0


def test_one_client_serves_threads_and_reopens_after_close(scripted) -> None:
    with scripted([OK]) as srv:
        client = HTTPRetriever(srv.url)
        results: list[int] = []
        threads = [threading.Thread(target=lambda: results.append(len(client.search("q", 1)))) for _ in range(8)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        assert results == [1] * 8
        client.close()
        client.close()
        assert client.search("q", 1)[0].score == 1.5
        client.close()
    assert len(srv.arrivals) == 9


def test_manifest_round_trip_keeps_the_retry_policy(tmp_path) -> None:
    client = HTTPRetriever("http://127.0.0.1:8000", retries=5, backoff_s=0.5)
    again = HTTPRetriever.load(client.save(tmp_path / "c"))
    assert again.config == client.config
    with pytest.raises(ValueError, match="retries"):
        HTTPRetriever("http://127.0.0.1:8000", retries=-1)
