"""A batched retrieval server speaking Search-R1's ``POST /retrieve`` protocol.

Request (JSON)::

    {"queries": ["q1", "q2"], "topk": 3, "return_scores": true}

Response::

    {"result": [[{"document": {"id": "...", "contents": "\\"Title\\"\\ntext"}, "score": 12.3}, ...], ...]}

With ``"return_scores": false`` (Search-R1's default) each item is the
document itself. This is the format of Search-R1's ``retrieval_server.py``,
so verl's and SkyRL's search tools can point at this server unchanged.
``GET /health`` answers ``{"status": "ok", ...}``.

Concurrent requests are micro-batched: a single worker thread takes every
request that arrives within ``batch_window_ms`` (up to ``max_batch``
queries) and answers them with one ``batch_search`` call. Bad requests get a
400 with ``{"error": "..."}`` saying what is wrong; bodies over
``max_body_bytes`` get a 413. Stdlib only (``http.server``).
"""

from __future__ import annotations

import json
import queue
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from retrievers.base import Hit, Retriever

__all__ = ["ServerConfig", "RetrievalServer", "RequestError", "parse_request"]


@dataclass(frozen=True, kw_only=True)
class ServerConfig:
    """How the server listens and what it accepts.

    Attributes:
        host / port: where to listen (port 0: an ephemeral port, see ``RetrievalServer.url``).
        default_topk: ``topk`` when a request omits it.
        max_topk: the largest ``topk`` accepted.
        max_queries: queries per request.
        max_query_chars: characters per query.
        max_body_bytes: request body size limit (413 beyond it).
        batch_window_ms: how long the worker waits for more requests to batch (0: no waiting).
        max_batch: queries per ``batch_search`` call.
        verbose: log every request to stderr.
    """

    host: str = "127.0.0.1"
    port: int = 8000
    default_topk: int = 3
    max_topk: int = 100
    max_queries: int = 1024
    max_query_chars: int = 4096
    max_body_bytes: int = 4 * 1024 * 1024
    batch_window_ms: float = 2.0
    max_batch: int = 512
    verbose: bool = False

    def __post_init__(self) -> None:
        if not 0 <= self.port < 65536:
            raise ValueError(f"port must be in 0..65535, got {self.port}")
        if not 1 <= self.default_topk <= self.max_topk:
            raise ValueError("need 1 <= default_topk <= max_topk")
        if min(self.max_queries, self.max_query_chars, self.max_body_bytes, self.max_batch) < 1:
            raise ValueError("max_queries, max_query_chars, max_body_bytes and max_batch must be >= 1")
        if self.batch_window_ms < 0:
            raise ValueError("batch_window_ms must be >= 0")


class RequestError(ValueError):
    """A client error: the message is sent back with a 400."""


def parse_request(body: bytes, config: ServerConfig) -> tuple[list[str], int, bool]:
    """Validate a ``/retrieve`` body -> (queries, topk, return_scores); raise RequestError on a bad one."""
    try:
        payload = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise RequestError(f"the body is not valid JSON: {exc}") from None
    if not isinstance(payload, dict):
        raise RequestError('the body must be a JSON object: {"queries": [...], "topk": k, "return_scores": bool}')
    queries = payload.get("queries")
    if isinstance(queries, str):
        queries = [queries]
    if not isinstance(queries, list) or not all(isinstance(q, str) for q in queries):
        raise RequestError("'queries' must be a list of strings")
    if len(queries) > config.max_queries:
        raise RequestError(f"{len(queries)} queries in one request; the limit is {config.max_queries}")
    long = next((i for i, q in enumerate(queries) if len(q) > config.max_query_chars), None)
    if long is not None:
        raise RequestError(f"query #{long} has {len(queries[long])} characters; the limit is {config.max_query_chars}")
    topk = payload.get("topk")
    if topk is None:
        topk = config.default_topk
    if not isinstance(topk, int) or isinstance(topk, bool) or not 1 <= topk <= config.max_topk:
        raise RequestError(f"'topk' must be an integer in 1..{config.max_topk}, got {topk!r}")
    return_scores = payload.get("return_scores", False)
    if not isinstance(return_scores, bool):
        raise RequestError(f"'return_scores' must be true or false, got {return_scores!r}")
    return queries, topk, return_scores


def _format(hits: list[Hit], with_scores: bool) -> list[dict[str, Any]]:
    return [h.to_search_r1(with_score=with_scores) for h in hits]


_Job = tuple[list[str], int, "Future[list[list[Hit]]]"]


class _MicroBatcher:
    """One worker thread that merges concurrent requests into ``batch_search`` calls."""

    def __init__(self, retriever: Retriever, config: ServerConfig) -> None:
        self.retriever = retriever
        self.config = config
        self._jobs: queue.Queue[_Job | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="retrieval-batcher", daemon=True)
        self.batches = 0
        self._thread.start()

    def submit(self, queries: list[str], k: int) -> Future[list[list[Hit]]]:
        future: Future[list[list[Hit]]] = Future()
        if not queries:
            future.set_result([])
        else:
            self._jobs.put((queries, k, future))
        return future

    def close(self) -> None:
        self._jobs.put(None)
        self._thread.join(timeout=10)

    def _run(self) -> None:
        try:
            while True:
                first = self._jobs.get()
                if first is None:
                    return
                jobs = [first]
                n = len(first[0])
                deadline = time.monotonic() + self.config.batch_window_ms / 1000
                stop = False
                while n < self.config.max_batch:
                    timeout = deadline - time.monotonic()
                    try:
                        job = self._jobs.get(timeout=timeout) if timeout > 0 else self._jobs.get_nowait()
                    except queue.Empty:
                        break
                    if job is None:
                        stop = True
                        break
                    jobs.append(job)
                    n += len(job[0])
                self._answer(jobs)
                if stop:
                    return
        finally:
            import sys

            if "jnius" in sys.modules:  # a JVM-attached thread must detach before it ends
                sys.modules["jnius"].detach()

    def _answer(self, jobs: list[_Job]) -> None:
        queries = [q for job in jobs for q in job[0]]
        k = max(job[1] for job in jobs)
        try:
            results = self.retriever.batch_search(queries, k)
            self.batches += 1
        except Exception as exc:  # noqa: BLE001 - the error goes back to every waiting request
            for _, _, future in jobs:
                future.set_exception(exc)
            return
        start = 0
        for job_queries, job_k, future in jobs:
            future.set_result([hits[:job_k] for hits in results[start:start + len(job_queries)]])
            start += len(job_queries)


class _Handler(BaseHTTPRequestHandler):
    server: _HTTPServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        if self.server.app.config.verbose:
            super().log_message(format, *args)

    def _send(self, status: int, body: Any) -> None:
        data = json.dumps(body, ensure_ascii=False).encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # noqa: N802 - stdlib name
        if self.path.rstrip("/") == "/health":
            app = self.server.app
            self._send(HTTPStatus.OK, {"status": "ok", "retriever": repr(app.retriever), "batches": app.batcher.batches})
        else:
            self._send(HTTPStatus.NOT_FOUND, {"error": f"no route GET {self.path}; use POST /retrieve"})

    def do_POST(self) -> None:  # noqa: N802 - stdlib name
        app = self.server.app
        if self.path.rstrip("/") != "/retrieve":
            self._send(HTTPStatus.NOT_FOUND, {"error": f"no route POST {self.path}; use POST /retrieve"})
            return
        length_header = self.headers.get("Content-Length")
        try:
            length = int(length_header) if length_header is not None else -1
        except ValueError:
            length = -1
        if length < 0:
            self.close_connection = True
            self._send(HTTPStatus.LENGTH_REQUIRED, {"error": "a Content-Length header is required"})
            return
        if length > app.config.max_body_bytes:
            self.close_connection = True
            self._send(HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                       {"error": f"body of {length} bytes; the limit is {app.config.max_body_bytes}"})
            return
        body = self.rfile.read(length)
        try:
            queries, topk, return_scores = parse_request(body, app.config)
        except RequestError as exc:
            self._send(HTTPStatus.BAD_REQUEST, {"error": str(exc)})
            return
        try:
            results = app.batcher.submit(queries, topk).result()
        except Exception as exc:  # noqa: BLE001 - report backend failures as 500s
            self._send(HTTPStatus.INTERNAL_SERVER_ERROR, {"error": f"retrieval failed: {type(exc).__name__}: {exc}"})
            return
        self._send(HTTPStatus.OK, {"result": [_format(hits, return_scores) for hits in results]})


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    app: RetrievalServer


class RetrievalServer:
    """Serve a Retriever over HTTP (Search-R1's protocol, see the module docstring).

    Use as a context manager or call :meth:`start` / :meth:`close`;
    :meth:`serve_forever` blocks (the CLI). ``url`` is ``http://host:port``.
    """

    def __init__(self, retriever: Retriever, config: ServerConfig | None = None) -> None:
        self.retriever = retriever
        self.config = config or ServerConfig()
        self.batcher = _MicroBatcher(retriever, self.config)
        self._httpd = _HTTPServer((self.config.host, self.config.port), _Handler)
        self._httpd.app = self
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> RetrievalServer:
        """Serve in a background thread; returns self."""
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="retrieval-server", daemon=True)
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        try:
            self._httpd.serve_forever()
        finally:
            self.close()

    def close(self) -> None:
        if self._thread is not None:
            self._httpd.shutdown()
            self._thread.join(timeout=10)
            self._thread = None
        self._httpd.server_close()
        self.batcher.close()

    def __enter__(self) -> RetrievalServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
