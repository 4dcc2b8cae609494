"""A batched retrieval server for ``POST /retrieve`` (Search-R1's protocol, SkyRL's dialect too).

The wire format, its dialects and its validation are in :mod:`retrievers.protocol`::

    {"queries": ["q1", "q2"], "topk": 3, "return_scores": true}     # Search-R1, verl
    {"query": "q1", "topk": 3, "return_scores": true}               # SkyRL
    -> {"result": [[{"document": {"id": "...", "contents": "\\"Title\\"\\ntext"}, "score": 12.3}, ...], ...]}

``GET /health`` answers ``{"status": "ok", ...}``. Bad requests get a 400
``{"error": "..."}``, bodies over ``max_body_bytes`` a 413, a backend failure a
500 naming the exception.

Serving model (stdlib only). One asyncio event loop owns every connection, so a
stalled or slow client costs a coroutine, not a thread: 300 stalled
connections do not delay anyone else. The listen backlog is ``backlog`` (the
kernel caps it at ``net.core.somaxconn``), so a burst of concurrent connects is
queued, not reset. Each request must arrive whole within ``read_timeout_s``
(headers and body together: a client trickling one byte at a time is cut off
at the deadline, not per read), an idle keep-alive connection is closed after
``idle_timeout_s``, and a response must be taken within ``write_timeout_s``.
Beyond ``max_connections`` open connections a new one is answered 503 and closed.

Retrieval runs on one worker thread that merges every request arriving within
``batch_window_ms`` (up to ``max_batch`` queries) into one ``batch_search``
call. If that call raises, each request of the batch is searched on its own, so
a query the backend cannot handle fails only the request that sent it.
"""

from __future__ import annotations

import asyncio
import json
import queue
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

from retrievers.base import Hit, Retriever
from retrievers.protocol import (
    DOCUMENT_FORMATS,
    RequestError,
    RetrieveRequest,
    format_results,
)
from retrievers.protocol import parse_request as _parse

__all__ = ["ServerConfig", "RetrievalServer", "RequestError", "parse_request"]

_MAX_HEADER_BYTES = 32 * 1024
_MAX_HEADERS = 100


@dataclass(frozen=True, kw_only=True)
class ServerConfig:
    """How the server listens and what it accepts.

    Attributes:
        host / port: where to listen (port 0: an ephemeral port, see ``RetrievalServer.url``).
        default_topk: ``topk`` when a request omits it, or sends ``null`` or ``0``.
        max_topk: the largest ``topk`` accepted.
        max_queries: queries per request.
        max_query_chars: characters per query.
        max_body_bytes: request body size limit (413 beyond it).
        batch_window_ms: how long the worker waits for more requests to batch (0: no waiting).
        max_batch: queries per ``batch_search`` call.
        document_format: "corpus" (``{"id", "contents"}``) or "search-r1-bm25"
            (``{"title", "text", "contents"}``), see :mod:`retrievers.protocol`.
        backlog: the listen backlog (pending connections the kernel queues).
        max_connections: open connections served at once; more get a 503.
        read_timeout_s: a request's headers and body must arrive within this.
        idle_timeout_s: a keep-alive connection with no new request is closed after this.
        write_timeout_s: a client must take its response within this.
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
    document_format: str = "corpus"
    backlog: int = 4096
    max_connections: int = 8192
    read_timeout_s: float = 30.0
    idle_timeout_s: float = 60.0
    write_timeout_s: float = 30.0
    verbose: bool = False

    def __post_init__(self) -> None:
        if not 0 <= self.port < 65536:
            raise ValueError(f"port must be in 0..65535, got {self.port}")
        if not 1 <= self.default_topk <= self.max_topk:
            raise ValueError("need 1 <= default_topk <= max_topk")
        if min(self.max_queries, self.max_query_chars, self.max_body_bytes, self.max_batch, self.backlog,
               self.max_connections) < 1:
            raise ValueError("max_queries, max_query_chars, max_body_bytes, max_batch, backlog and "
                             "max_connections must be >= 1")
        if self.batch_window_ms < 0:
            raise ValueError("batch_window_ms must be >= 0")
        if min(self.read_timeout_s, self.idle_timeout_s, self.write_timeout_s) <= 0:
            raise ValueError("read_timeout_s, idle_timeout_s and write_timeout_s must be > 0")
        if self.document_format not in DOCUMENT_FORMATS:
            raise ValueError(f"document_format must be one of {DOCUMENT_FORMATS}, got {self.document_format!r}")


def parse_request(body: bytes, config: ServerConfig) -> RetrieveRequest:
    """Validate a ``/retrieve`` body against ``config``'s limits; raise RequestError on a bad one."""
    return _parse(body, default_topk=config.default_topk, max_topk=config.max_topk,
                  max_queries=config.max_queries, max_query_chars=config.max_query_chars)


_Job = tuple[list[str], int, "Future[list[list[Hit]]]"]


class _MicroBatcher:
    """One worker thread that merges concurrent requests into ``batch_search`` calls."""

    def __init__(self, retriever: Retriever, config: ServerConfig) -> None:
        self.retriever = retriever
        self.config = config
        self._jobs: queue.Queue[_Job | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="retrieval-batcher", daemon=True)
        self.batches = 0
        self.isolated_failures = 0
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
            if len(results) != len(queries):
                raise RuntimeError(f"the retriever returned {len(results)} result lists for {len(queries)} queries")
        except Exception as exc:  # noqa: BLE001 - retried request by request: a bad query fails only its own request
            if len(jobs) == 1:
                self.isolated_failures += 1
                jobs[0][2].set_exception(exc)
            else:
                for job in jobs:
                    self._answer_alone(job)
            return
        start = 0
        for job_queries, job_k, future in jobs:
            future.set_result([list(hits[:job_k]) for hits in results[start:start + len(job_queries)]])
            start += len(job_queries)

    def _answer_alone(self, job: _Job) -> None:
        job_queries, job_k, future = job
        try:
            results = self.retriever.batch_search(job_queries, job_k)
            self.batches += 1
        except Exception as exc:  # noqa: BLE001 - the error goes back to this request only
            self.isolated_failures += 1
            future.set_exception(exc)
            return
        future.set_result([list(hits[:job_k]) for hits in results])


def _encode(body: Any) -> bytes:
    text = json.dumps(body, ensure_ascii=False)
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate in a passage: \\u escapes keep the JSON valid
        return json.dumps(body, ensure_ascii=True).encode("ascii")


_MAX_DISCARD_BYTES = 64 * 1024 * 1024


async def _discard(reader: asyncio.StreamReader, length: int) -> None:
    """Read and drop up to ``length`` bytes (at most 64 MiB; the caller's deadline bounds the time)."""
    left = min(length, _MAX_DISCARD_BYTES)
    while left > 0:
        chunk = await reader.read(min(left, 1 << 16))
        if not chunk:
            return
        left -= len(chunk)


class _BadHTTP(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class RetrievalServer:
    """Serve a Retriever over HTTP (see the module docstring).

    Use as a context manager or call :meth:`start` / :meth:`close`;
    :meth:`serve_forever` blocks (the CLI). ``url`` is ``http://host:port``.
    ``open_connections`` is the number of connections being served now.
    """

    def __init__(self, retriever: Retriever, config: ServerConfig | None = None) -> None:
        self.retriever = retriever
        self.config = config or ServerConfig()
        self.batcher = _MicroBatcher(retriever, self.config)
        self.open_connections = 0
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.base_events.Server | None = None
        self._thread: threading.Thread | None = None
        self._closed = False
        try:
            self._server = self._loop.run_until_complete(asyncio.start_server(
                self._serve_connection, self.config.host, self.config.port, backlog=self.config.backlog,
                limit=_MAX_HEADER_BYTES,
            ))
        except BaseException:
            self.batcher.close()
            self._loop.close()
            raise

    @property
    def url(self) -> str:
        assert self._server is not None
        host, port = self._server.sockets[0].getsockname()[:2]
        return f"http://{host}:{port}"

    # ------------------------------------------------------------- lifecycle
    def start(self) -> RetrievalServer:
        """Serve in a background thread; returns self."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop.run_forever, name="retrieval-server", daemon=True)
            self._thread.start()
        return self

    def serve_forever(self) -> None:
        """Serve on this thread until interrupted (KeyboardInterrupt propagates after cleanup)."""
        try:
            self._loop.run_forever()
        finally:
            self.close()

    def close(self) -> None:
        """Stop listening, drop open connections, stop the batch worker (idempotent)."""
        if self._closed:
            return
        self._closed = True

        async def shutdown() -> None:
            if self._server is not None:
                self._server.close()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        if self._thread is not None and self._thread.is_alive():
            asyncio.run_coroutine_threadsafe(shutdown(), self._loop).result(timeout=10)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
        elif not self._loop.is_running():
            self._loop.run_until_complete(shutdown())
        self._thread = None
        if not self._loop.is_running():
            self._loop.close()
        self.batcher.close()

    def __enter__(self) -> RetrievalServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------ connections
    async def _serve_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.open_connections += 1
        try:
            if self.open_connections > self.config.max_connections:
                await self._respond(writer, HTTPStatus.SERVICE_UNAVAILABLE,
                                    {"error": f"more than {self.config.max_connections} open connections; retry"},
                                    close=True)
                return
            first = True
            while True:
                try:
                    # the first byte of a new request: the idle timeout; the rest: the read deadline
                    head = await asyncio.wait_for(reader.read(1), self.config.read_timeout_s if first
                                                  else self.config.idle_timeout_s)
                    if not head:
                        return
                    request = await asyncio.wait_for(self._read_request(head, reader, writer),
                                                     self.config.read_timeout_s)
                except (TimeoutError, asyncio.TimeoutError):
                    await self._respond(writer, HTTPStatus.REQUEST_TIMEOUT,
                                        {"error": f"the request did not arrive within {self.config.read_timeout_s} s"},
                                        close=True)
                    return
                except _BadHTTP as exc:
                    await self._respond(writer, exc.status, {"error": str(exc)}, close=True)
                    return
                first = False
                method, path, keep_alive, body = request
                status, payload = await self._route(method, path, body)
                if not await self._respond(writer, status, payload, close=not keep_alive):
                    return
                if not keep_alive:
                    return
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, OSError):
            return
        finally:
            self.open_connections -= 1
            writer.close()

    async def _read_request(self, head: bytes, reader: asyncio.StreamReader,
                            writer: asyncio.StreamWriter) -> tuple[str, str, bool, bytes]:
        try:
            raw = head + await reader.readuntil(b"\r\n\r\n")
        except asyncio.LimitOverrunError:
            raise _BadHTTP(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE,
                           f"request headers over {_MAX_HEADER_BYTES} bytes") from None
        except asyncio.IncompleteReadError:
            raise ConnectionResetError("the client closed the connection mid-request") from None
        lines = raw.decode("latin-1").split("\r\n")
        parts = lines[0].split()
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            raise _BadHTTP(HTTPStatus.BAD_REQUEST, f"not an HTTP/1.x request line: {lines[0][:80]!r}")
        method, path, version = parts
        headers: dict[str, str] = {}
        for line in lines[1:_MAX_HEADERS + 1]:
            if line:
                name, sep, value = line.partition(":")
                if not sep:
                    raise _BadHTTP(HTTPStatus.BAD_REQUEST, f"malformed header line {line[:80]!r}")
                headers[name.strip().lower()] = value.strip()
        connection = headers.get("connection", "").lower()
        keep_alive = "close" not in connection if version == "HTTP/1.1" else "keep-alive" in connection
        if "chunked" in headers.get("transfer-encoding", "").lower():
            raise _BadHTTP(HTTPStatus.LENGTH_REQUIRED, "chunked bodies are not accepted; send a Content-Length")
        body = b""
        if method == "POST":
            try:
                length = int(headers["content-length"])
            except (KeyError, ValueError):
                raise _BadHTTP(HTTPStatus.LENGTH_REQUIRED, "a Content-Length header is required") from None
            if length < 0:
                raise _BadHTTP(HTTPStatus.BAD_REQUEST, "a negative Content-Length")
            if length > self.config.max_body_bytes:
                await _discard(reader, length)  # read it, so that closing does not reset the client's socket
                raise _BadHTTP(HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                               f"body of {length} bytes; the limit is {self.config.max_body_bytes}")
            if headers.get("expect", "").lower() == "100-continue":
                writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            try:
                body = await reader.readexactly(length)
            except asyncio.IncompleteReadError:
                raise ConnectionResetError("the client closed the connection mid-body") from None
        return method, path, keep_alive, body

    async def _route(self, method: str, path: str, body: bytes) -> tuple[int, Any]:
        route = path.split("?", 1)[0].rstrip("/")
        if self.config.verbose:
            import sys

            print(f"{method} {path} ({len(body)} bytes)", file=sys.stderr)
        if method == "GET" and route == "/health":
            return HTTPStatus.OK, {"status": "ok", "retriever": repr(self.retriever), "batches": self.batcher.batches,
                                   "open_connections": self.open_connections}
        if method == "POST" and route == "/retrieve":
            try:
                request = parse_request(body, self.config)
            except RequestError as exc:
                return HTTPStatus.BAD_REQUEST, {"error": str(exc)}
            try:
                results = await asyncio.wrap_future(self.batcher.submit(list(request.queries), request.topk))
            except Exception as exc:  # noqa: BLE001 - report backend failures as 500s
                return HTTPStatus.INTERNAL_SERVER_ERROR, {"error": f"retrieval failed: {type(exc).__name__}: {exc}"}
            return HTTPStatus.OK, format_results(results, return_scores=request.return_scores,
                                                 document_format=self.config.document_format)
        return HTTPStatus.NOT_FOUND, {"error": f"no route {method} {path[:100]}; use POST /retrieve or GET /health"}

    async def _respond(self, writer: asyncio.StreamWriter, status: int, payload: Any, *, close: bool) -> bool:
        """Write one JSON response; False when the client did not take it in time."""
        data = _encode(payload)
        phrase = HTTPStatus(status).phrase
        connection = "Connection: close\r\n" if close else ""
        head = (f"HTTP/1.1 {int(status)} {phrase}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(data)}\r\n{connection}\r\n")
        try:
            writer.write(head.encode("latin-1") + data)
            await asyncio.wait_for(writer.drain(), self.config.write_timeout_s)
        except (TimeoutError, asyncio.TimeoutError, ConnectionError, OSError):
            return False
        return True
