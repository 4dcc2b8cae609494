"""A batched retrieval server for ``POST /retrieve`` (Search-R1's protocol, SkyRL's dialect too).

The wire format, its dialects and its validation are in :mod:`retrievers.protocol`::

    {"queries": ["q1", "q2"], "topk": 3, "return_scores": true}     # Search-R1, verl
    {"query": "q1", "topk": 3, "return_scores": true}               # SkyRL
    -> {"result": [[{"document": {"id": "...", "contents": "\\"Title\\"\\ntext"}, "score": 12.3}, ...], ...]}

``GET /health`` answers ``{"status": "ok", ...}``. A body that is not a valid
request gets a 422 ``{"error": "..."}`` (the status Search-R1's FastAPI server
gives a schema error), a malformed HTTP request a 400, bodies over
``max_body_bytes`` a 413, a backend failure a 500 naming the exception.

The server is three parts, each in its own module, assembled here:

* admission (``retrievers._admission``): a client is a peer IPv4 address or
  IPv6 /64 network (one host holds a whole /64); at most
  ``max_connections`` connections in all and ``max_connections_per_client`` from
  one client (503 at accept beyond either, without a coroutine; at the global cap
  a client holding few connections is admitted by closing the longest-idle
  connection of the client holding the most), the global cap
  lowered to what ``RLIMIT_NOFILE`` allows, a reserve descriptor to shed
  connections on EMFILE. Behind a reverse proxy the peer is the proxy: every
  client behind it shares the proxy's limit.
* HTTP on the wire (``retrievers._wire``): bounded header and body reads.
* batching (``retrievers._batching``): one worker thread merges requests into
  ``batch_search`` calls bounded in queries (``max_batch``) and in estimated
  cost (``max_batch_cost``), filled by deficit round-robin across clients, so a
  client's large requests hold up another client's small one by at most the
  batch under way and the one it joins, both bounded in cost.

Serving model (stdlib only). One asyncio event loop owns every connection, so a
stalled or slow client costs a coroutine, not a thread: 300 stalled
connections do not delay anyone else. The listen backlog is ``backlog`` (the
kernel caps it at ``net.core.somaxconn``), so a burst of concurrent connects is
queued, not reset. A connection that sends no request (a new one, or a
keep-alive one between requests) is closed after ``idle_timeout_s`` (a new one
with a 408); a request must arrive whole within ``read_timeout_s`` once its
first byte has (headers and body together: a client trickling one byte at a
time is cut off at the deadline, not per read); a response must be taken within
``write_timeout_s``. If a ``batch_search`` call raises, each request's part of
the batch is searched on its own, so a query the backend cannot handle fails
only the request that sent it. A response of more than 4096 hits is formatted
and encoded on a helper thread, so that it does not hold up the event loop.

Why this stays hand-written rather than FastAPI + uvicorn (measured):
``taskset -c 0 .venv/bin/python scripts/bench/retrieval_server_peer.py`` runs
the same scenarios against this server and a FastAPI app on uvicorn 0.55 (pydantic
request model, ``limit_concurrency`` = our cap, ``timeout_keep_alive`` = our idle
timeout, the same ``backlog``), in one run on one core (table in
docs/benchmarks.md). uvicorn served well-behaved clients comparably (0.56x this
server's requests/s with a thread-pool endpoint, 0.88x with our batcher behind it;
0.83x and 1.22x in a run on a loaded machine), but held none of the guarantees
above: one client's 300 idle connections made uvicorn answer another client 503
five times of five (here 200, 4.1 ms) and were still open 4 s later (here closed
after the 3 s idle timeout); under RLIMIT_NOFILE 256 with 400 idle connections a
new client waited out its 3 s timeout while uvicorn's process burned 92% of a core
(asyncio's accept loop retries EMFILE up to ``backlog`` times per wakeup; here
200 in 0.01 s at 0% CPU); 20 slow-loris connections were all still open after 6 s
(here cut at 2.0 s with a 408); and with the idiomatic thread-pool endpoint a
1-query request behind another client's four 1024-query requests took 365 ms, 3.2x
one large request, finishing after three of them (here 64 ms, 0.56x). uvicorn has no
per-client limit, no header/body read timeout, no idle timeout for a connection
that never sends a request and no descriptor reserve, so these are not settings
away. A schema error is a 422 here as there; the one difference a client could see
is its body's key (``error`` here, FastAPI's ``detail``), which neither Search-R1's
client nor verl's search tool reads.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

from retrievers._admission import Admission, Ticket, listen
from retrievers._batching import MicroBatcher
from retrievers._wire import MAX_HEADER_BYTES, BadHTTP, encode, read_request, respond
from retrievers.base import Retriever
from retrievers.protocol import (
    DOCUMENT_FORMATS,
    RequestError,
    RetrieveRequest,
    format_results,
)
from retrievers.protocol import parse_request as _parse

__all__ = ["ServerConfig", "RetrievalServer", "RequestError", "parse_request", "batcher_for"]

_INLINE_HITS = 4096


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
        max_batch_cost: estimated work per ``batch_search`` call, in the units of
            ``retrievers._batching.query_cost`` (``1 + topk / 16 + len(query) / 512``; an
            ordinary query costs ~1.3, a maximum-size one 15.25): 1024 keeps a batch of
            ordinary queries at ``max_batch`` and cuts one of maximum-size queries at 67, so
            that no batch, and so no other client's wait, grows with the size of the queries.
        document_format: "corpus" (``{"id", "contents"}``) or "search-r1-bm25"
            (``{"title", "text", "contents"}``), see :mod:`retrievers.protocol`.
        backlog: the listen backlog (pending connections the kernel queues).
        max_connections: open connections served at once. At this cap a new connection is
            admitted by closing the longest-idle connection of the client holding the most,
            when that client holds more than the newcomer would; otherwise it gets a 503. The
            server uses at most what ``RLIMIT_NOFILE`` allows (see ``reserved_fds``).
        max_connections_per_client: open connections one client (a peer IPv4 address or
            IPv6 /64) may hold; more get a 503 while other clients are served. ``None``: an eighth of the server's
            global cap (1024 of 8192). Behind a reverse proxy the peer is the proxy.
        reserved_fds: file descriptors kept free beyond the open connections (for the
            index, logs, the backend's own files); the global cap is at most the soft
            ``RLIMIT_NOFILE`` less the descriptors open at start less this.
        read_timeout_s: a request's headers and body must arrive within this of its first byte.
        idle_timeout_s: a connection with no request under way (new, or keep-alive between
            requests) is closed after this.
        write_timeout_s: a client must take its response within this.
        verbose: log every request, and every descriptor shortage in ``accept``, to stderr.
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
    max_batch_cost: float = 1024.0
    document_format: str = "corpus"
    backlog: int = 4096
    max_connections: int = 8192
    max_connections_per_client: int | None = None
    reserved_fds: int = 64
    read_timeout_s: float = 30.0
    idle_timeout_s: float = 10.0
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
        if self.max_connections_per_client is not None and self.max_connections_per_client < 1:
            raise ValueError("max_connections_per_client must be >= 1 (or None)")
        if self.reserved_fds < 0:
            raise ValueError("reserved_fds must be >= 0")
        if not self.max_batch_cost > 0:
            raise ValueError(f"max_batch_cost must be > 0, got {self.max_batch_cost}")
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



def batcher_for(retriever: Retriever, config: ServerConfig) -> MicroBatcher:
    """The batch worker the server runs for ``config`` (started; ``close()`` it when done)."""
    return MicroBatcher(retriever, max_batch=config.max_batch, batch_window_ms=config.batch_window_ms,
                        max_batch_cost=config.max_batch_cost)


class RetrievalServer:
    """Serve a Retriever over HTTP (see the module docstring).

    Use as a context manager or call :meth:`start` / :meth:`close`;
    :meth:`serve_forever` blocks (the CLI). ``url`` is ``http://host:port``.
    ``max_connections`` and ``max_connections_per_client`` are the limits in force
    (the config's, after ``RLIMIT_NOFILE``). ``open_connections`` is the number of
    connections being served now, ``refused_connections`` the number answered 503
    at accept (over a limit, or out of descriptors), ``evicted_connections`` the
    idle connections closed at the global cap to admit a client holding fewer,
    ``accept_errors`` the number of ``accept`` calls that failed (for want of
    descriptors, mostly).
    ``batcher`` is the batch worker (its counters: ``batches``,
    ``submitted_queries``, ``queued_queries``, ``isolated_failures``).
    """

    def __init__(self, retriever: Retriever, config: ServerConfig | None = None) -> None:
        self.retriever = retriever
        self.config = config or ServerConfig()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._sockets: list[socket.socket] = []
        self._admission: Admission | None = None
        self.batcher = batcher_for(retriever, self.config)
        self._loop = asyncio.new_event_loop()
        try:
            self._sockets = listen(self.config.host, self.config.port, self.config.backlog)
            self._admission = Admission(
                self._loop, self._sockets, max_connections=self.config.max_connections,
                max_connections_per_client=self.config.max_connections_per_client,
                reserved_fds=self.config.reserved_fds, serve=self._handle, verbose=self.config.verbose)
            self._admission.resume()
        except BaseException:
            self._release()
            self.batcher.close()
            raise

    @property
    def url(self) -> str:
        host, port = self._sockets[0].getsockname()[:2]
        return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"

    @property
    def max_connections(self) -> int:
        return self._admitted().max_connections

    @property
    def max_connections_per_client(self) -> int:
        return self._admitted().max_connections_per_client

    @property
    def open_connections(self) -> int:
        return self._admitted().open_connections

    @property
    def refused_connections(self) -> int:
        return self._admitted().refused_connections

    @property
    def evicted_connections(self) -> int:
        return self._admitted().evicted_connections

    @property
    def accept_errors(self) -> int:
        return self._admitted().accept_errors

    def _admitted(self) -> Admission:
        assert self._admission is not None, "set in __init__"
        return self._admission

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
            self._admitted().stop()
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
        self._release()
        self.batcher.close()

    def _release(self) -> None:
        if not self._loop.is_running():
            if self._admission is not None:
                self._admission.stop()
            self._loop.close()
        for sock in self._sockets:
            sock.close()
        if self._admission is not None:
            self._admission.release()

    def __enter__(self) -> RetrievalServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------ connections
    async def _handle(self, conn: socket.socket, ticket: Ticket) -> None:
        """Serve one admitted connection (its counts are the admission's)."""
        writer: asyncio.StreamWriter | None = None
        try:
            conn.setblocking(False)
            reader = asyncio.StreamReader(limit=MAX_HEADER_BYTES, loop=self._loop)
            protocol = asyncio.StreamReaderProtocol(reader, loop=self._loop)
            transport, _ = await self._loop.connect_accepted_socket(lambda: protocol, sock=conn)
            writer = asyncio.StreamWriter(transport, protocol, reader, self._loop)
            await self._serve_connection(reader, writer, ticket)
        except OSError:
            pass
        finally:
            if writer is None:
                conn.close()

    async def _serve_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                                ticket: Ticket) -> None:
        config = self.config
        try:
            first = True
            while True:
                ticket.idle(writer.close)  # may be closed to admit another client at the global cap
                try:
                    head = await asyncio.wait_for(reader.read(1), config.idle_timeout_s)
                except (TimeoutError, asyncio.TimeoutError):
                    if first:
                        await self._respond(writer, HTTPStatus.REQUEST_TIMEOUT,
                                            {"error": f"no request within {config.idle_timeout_s} s"}, close=True)
                    return
                finally:
                    ticket.busy()
                if not head:
                    return
                try:
                    request = await asyncio.wait_for(read_request(head, reader, writer, config.max_body_bytes),
                                                     config.read_timeout_s)
                except (TimeoutError, asyncio.TimeoutError):
                    await self._respond(writer, HTTPStatus.REQUEST_TIMEOUT,
                                        {"error": f"the request did not arrive within {config.read_timeout_s} s"},
                                        close=True)
                    return
                except BadHTTP as exc:
                    await self._respond(writer, exc.status, {"error": str(exc)}, close=True)
                    return
                first = False
                method, path, keep_alive, body = request
                status, payload = await self._route(method, path, body, ticket.client)
                if not await self._respond(writer, status, payload, close=not keep_alive):
                    return
                if not keep_alive:
                    return
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, OSError):
            return
        finally:
            writer.close()

    async def _respond(self, writer: asyncio.StreamWriter, status: int, payload: Any, *, close: bool) -> bool:
        return await respond(writer, status, payload, close=close, write_timeout_s=self.config.write_timeout_s)

    async def _route(self, method: str, path: str, body: bytes, client: str = "") -> tuple[int, Any]:
        route = path.split("?", 1)[0].rstrip("/")
        if self.config.verbose:
            import sys

            print(f"{method} {path} ({len(body)} bytes) from {client}", file=sys.stderr)
        if method == "GET" and route == "/health":
            return HTTPStatus.OK, {"status": "ok", "retriever": repr(self.retriever), "batches": self.batcher.batches,
                                   "open_connections": self.open_connections,
                                   "refused_connections": self.refused_connections,
                                   "evicted_connections": self.evicted_connections,
                                   "accept_errors": self.accept_errors,
                                   "submitted_queries": self.batcher.submitted_queries,
                                   "queued_queries": self.batcher.queued_queries}
        if method == "POST" and route == "/retrieve":
            try:
                request = parse_request(body, self.config)
            except RequestError as exc:
                return HTTPStatus.UNPROCESSABLE_ENTITY, {"error": str(exc)}
            try:
                results = await asyncio.wrap_future(self.batcher.submit(list(request.queries), request.topk, client))
            except Exception as exc:  # noqa: BLE001 - report backend failures as 500s
                return HTTPStatus.INTERNAL_SERVER_ERROR, {"error": f"retrieval failed: {type(exc).__name__}: {exc}"}

            def encoded() -> bytes:
                return encode(format_results(results, return_scores=request.return_scores,
                                             document_format=self.config.document_format))

            if sum(map(len, results)) <= _INLINE_HITS:
                return HTTPStatus.OK, encoded()
            return HTTPStatus.OK, await asyncio.to_thread(encoded)  # a large response does not hold up the loop
        return HTTPStatus.NOT_FOUND, {"error": f"no route {method} {path[:100]}; use POST /retrieve or GET /health"}
