"""A batched retrieval server for ``POST /retrieve`` (Search-R1's protocol, SkyRL's dialect too).

The wire format, its dialects and its validation are in :mod:`retrievers.protocol`::

    {"queries": ["q1", "q2"], "topk": 3, "return_scores": true}     # Search-R1, verl
    {"query": "q1", "topk": 3, "return_scores": true}               # SkyRL
    -> {"result": [[{"document": {"id": "...", "contents": "\\"Title\\"\\ntext"}, "score": 12.3}, ...], ...]}

``GET /health`` answers ``{"status": "ok", ...}``. A body that is not a valid
request gets a 422 ``{"error": "..."}`` (the status Search-R1's FastAPI server
gives a schema error), a malformed HTTP request a 400, bodies over
``max_body_bytes`` a 413, a backend failure a 500 naming the exception.

Serving model (stdlib only). One asyncio event loop owns every connection, so a
stalled or slow client costs a coroutine, not a thread: 300 stalled
connections do not delay anyone else. The listen backlog is ``backlog`` (the
kernel caps it at ``net.core.somaxconn``), so a burst of concurrent connects is
queued, not reset. A connection that sends no request (a new one, or a
keep-alive one between requests) is closed after ``idle_timeout_s`` (a new one
with a 408); a request must arrive whole within ``read_timeout_s`` once its
first byte has (headers and body together: a client trickling one byte at a
time is cut off at the deadline, not per read); a response must be taken within
``write_timeout_s``.

Admission. A client is a peer IP address. The server holds at most
``RetrievalServer.max_connections`` connections (``max_connections``, lowered
to what ``RLIMIT_NOFILE`` leaves once the descriptors open at start and
``reserved_fds`` are set aside) and at most
``RetrievalServer.max_connections_per_client`` from one client. A connection
beyond either limit is answered 503 (``Retry-After: 1``) and half-closed as it
is accepted, without a coroutine (the socket is kept up to 1 s, or until the
client closes it, so that a request still arriving does not turn the 503 into a
reset), so a client holding its whole quota of idle connections costs other
clients nothing. When ``accept`` fails with
EMFILE/ENFILE (descriptors taken elsewhere in the process or the system), the
server frees a descriptor it keeps in reserve, accepts the waiting connection,
answers it 503 and closes it; when even that fails it stops accepting for
0.1 s. A new client therefore gets a 503 or a closed connection at once, and
the event loop neither spins on a listening socket that stays readable nor
leaves clients waiting in the backlog.

Retrieval runs on one worker thread that merges requests into ``batch_search``
calls of up to ``max_batch`` queries, waiting ``batch_window_ms`` for more when
fewer are queued. Requests are queued per client and a batch is filled round-robin
across clients (see :class:`_MicroBatcher`), so a client's large requests hold up
another client's small one by about one batch, not by everything they queued.
If a ``batch_search`` call raises, each request's part of the batch is searched
on its own, so a query the backend cannot handle fails only the request that
sent it. A response of more than 4096 hits is formatted and encoded on a helper
thread, so that it does not hold up the event loop.

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
import errno
import json
import os
import socket
import threading
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field
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
_ACCEPTS_PER_WAKEUP = 64
_ACCEPT_BACKOFF_S = 0.1
_OUT_OF_DESCRIPTORS = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)
_QUANTUM = 32
_LINGER_S = 1.0
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
        document_format: "corpus" (``{"id", "contents"}``) or "search-r1-bm25"
            (``{"title", "text", "contents"}``), see :mod:`retrievers.protocol`.
        backlog: the listen backlog (pending connections the kernel queues).
        max_connections: open connections served at once; more get a 503. The server
            uses at most what ``RLIMIT_NOFILE`` allows (see ``reserved_fds``).
        max_connections_per_client: open connections one peer IP address may hold; more
            get a 503. ``None``: an eighth of the server's global cap (1024 of 8192).
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


@dataclass(eq=False)
class _Job:
    """One request's queries; answered piece by piece, delivered whole."""

    queries: list[str]
    k: int
    future: Future[list[list[Hit]]]
    results: list[list[Hit]] = field(default_factory=list)
    taken: int = 0
    left: int = 0
    failed: bool = False


_Piece = tuple[_Job, int, int]


class _MicroBatcher:
    """One worker thread that merges requests into ``batch_search`` calls, fairly across clients.

    :meth:`submit` queues a request under its client (any hashable key; the server
    passes the peer IP address). Each client has its own FIFO. A batch of up to
    ``max_batch`` queries is filled round-robin: each client with queued work in
    turn contributes up to 32 queries (its oldest request first; a large request
    is split over turns and batches), and the turn order carries over from one
    batch to the next. A client alone on the server fills whole batches; with
    others waiting, its share of each batch is theirs too, so a small request waits
    about one batch whatever another client has queued. A request's future gets
    its results once all its queries are answered, or the exception of the first
    part that fails (its remaining parts are dropped). Cancelled requests are
    dropped before they are searched.

    ``batches``: ``batch_search`` calls made; ``isolated_failures``: requests failed
    by their own queries; ``submitted_queries``: queries ever submitted;
    :attr:`queued_queries`: queries waiting for a batch.
    """

    def __init__(self, retriever: Retriever, config: ServerConfig) -> None:
        self.retriever = retriever
        self.config = config
        self._cond = threading.Condition()
        self._queues: dict[Any, deque[_Job]] = {}
        self._order: deque[Any] = deque()
        self._queued = 0
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="retrieval-batcher", daemon=True)
        self.batches = 0
        self.isolated_failures = 0
        self.submitted_queries = 0
        self._thread.start()

    @property
    def queued_queries(self) -> int:
        with self._cond:
            return self._queued

    def submit(self, queries: list[str], k: int, client: Any = "") -> Future[list[list[Hit]]]:
        future: Future[list[list[Hit]]] = Future()
        if not queries:
            future.set_result([])
            return future
        job = _Job(list(queries), k, future, results=[[] for _ in queries], left=len(queries))
        with self._cond:
            if self._stopping:
                raise RuntimeError("the retrieval worker is stopped")
            if client not in self._queues:
                self._queues[client] = deque()
                self._order.append(client)
            self._queues[client].append(job)
            self._queued += len(queries)
            self.submitted_queries += len(queries)
            self._cond.notify()
        return future

    def close(self) -> None:
        """Answer what is queued, then stop the worker (waits up to 10 s)."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        window = self.config.batch_window_ms / 1000
        try:
            while True:
                with self._cond:
                    while not self._queued and not self._stopping:
                        self._cond.wait()
                    if not self._queued:
                        return
                    deadline = time.monotonic() + window
                    while self._queued < self.config.max_batch and not self._stopping:
                        timeout = deadline - time.monotonic()
                        if timeout <= 0:
                            break
                        self._cond.wait(timeout)
                    pieces = self._take(self.config.max_batch)
                if pieces:
                    self._answer(pieces)
        finally:
            import sys

            if "jnius" in sys.modules:  # a JVM-attached thread must detach before it ends
                sys.modules["jnius"].detach()

    def _take(self, limit: int) -> list[_Piece]:
        """Up to ``limit`` queries, round-robin over the clients' queues (holding the lock)."""
        pieces: list[_Piece] = []
        n = 0
        while n < limit and self._order:
            client = self._order[0]
            jobs = self._queues[client]
            share = min(_QUANTUM, limit - n)
            while share > 0 and jobs:
                job = jobs[0]
                if job.failed or (job.taken == 0 and not job.future.set_running_or_notify_cancel()):
                    jobs.popleft()
                    self._queued -= len(job.queries) - job.taken
                    continue
                take = min(share, len(job.queries) - job.taken)
                pieces.append((job, job.taken, job.taken + take))
                job.taken += take
                share -= take
                n += take
                self._queued -= take
                if job.taken == len(job.queries):
                    jobs.popleft()
            self._order.rotate(-1)
            if not jobs:
                self._order.pop()
                del self._queues[client]
        return pieces

    def _answer(self, pieces: list[_Piece]) -> None:
        queries = [q for job, start, end in pieces for q in job.queries[start:end]]
        k = max(job.k for job, _, _ in pieces)
        try:
            results = self.retriever.batch_search(queries, k)
            self.batches += 1
            if len(results) != len(queries):
                raise RuntimeError(f"the retriever returned {len(results)} result lists for {len(queries)} queries")
        except Exception as exc:  # noqa: BLE001 - retried piece by piece: a bad query fails only its own request
            if len(pieces) == 1:
                self._fail(pieces[0][0], exc)
            else:
                for piece in pieces:
                    self._answer_alone(piece)
            return
        offset = 0
        for job, start, end in pieces:
            self._deliver(job, start, results[offset:offset + end - start])
            offset += end - start

    def _answer_alone(self, piece: _Piece) -> None:
        job, start, end = piece
        if job.failed:
            return
        try:
            results = self.retriever.batch_search(job.queries[start:end], job.k)
            self.batches += 1
            if len(results) != end - start:
                raise RuntimeError(f"the retriever returned {len(results)} result lists for {end - start} queries")
        except Exception as exc:  # noqa: BLE001 - the error goes back to this request only
            self._fail(job, exc)
            return
        self._deliver(job, start, results)

    def _deliver(self, job: _Job, start: int, results: list[list[Hit]]) -> None:
        if job.failed:
            return
        job.results[start:start + len(results)] = [list(hits[:job.k]) for hits in results]
        job.left -= len(results)
        if job.left == 0:
            job.future.set_result(job.results)

    def _fail(self, job: _Job, exc: BaseException) -> None:
        if not job.failed:
            job.failed = True
            self.isolated_failures += 1
            job.future.set_exception(exc)


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


def _open_descriptors() -> int:
    """File descriptors this process has open now (0 where that cannot be read)."""
    for directory in ("/proc/self/fd", "/dev/fd"):
        try:
            return len(os.listdir(directory))
        except OSError:
            continue
    return 0


def _descriptor_budget(reserved: int) -> int | None:
    """Descriptors left for connections under the soft RLIMIT_NOFILE; None where it is unlimited or unknown."""
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (ImportError, OSError, ValueError):
        return None
    if soft == resource.RLIM_INFINITY:
        return None
    return max(1, soft - _open_descriptors() - reserved)


def _listen(host: str, port: int, backlog: int) -> list[socket.socket]:
    """Bound, listening, non-blocking sockets for every address ``host`` resolves to."""
    infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    sockets: list[socket.socket] = []
    seen: set[Any] = set()
    try:
        for family, kind, proto, _, address in infos:
            if address in seen:
                continue
            seen.add(address)
            sock = socket.socket(family, kind, proto)
            sockets.append(sock)
            if os.name == "posix":
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6 and hasattr(socket, "IPV6_V6ONLY"):
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(address)
            sock.listen(backlog)
            sock.setblocking(False)
    except BaseException:
        for sock in sockets:
            sock.close()
        raise
    return sockets


def _reserve_descriptor() -> int | None:
    try:
        return os.open(os.devnull, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None


def _refusal(message: str) -> bytes:
    data = _encode({"error": message})
    return (f"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nContent-Length: {len(data)}\r\n"
            f"Retry-After: 1\r\nConnection: close\r\n\r\n").encode("latin-1") + data


def _refuse(conn: socket.socket, response: bytes) -> bool:
    """Send ``response`` on a just-accepted connection and half-close it; False if the connection is gone.

    Never waits: ``response`` fits a socket buffer, and what the client has sent so far is read and dropped.
    """
    try:
        conn.setblocking(False)
        conn.send(response)
        conn.shutdown(socket.SHUT_WR)
        while conn.recv(1 << 16):
            pass
        return False
    except BlockingIOError:
        return True
    except OSError:
        return False


class _Lingering:
    """A refused connection kept until the client closes it (or ``_LINGER_S``), so its request does not reset it.

    Closing a socket with unread input sends a reset, which can destroy the 503 before the client reads it;
    reading what it sends until it closes lets the 503 arrive.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, conn: socket.socket, done: set[_Lingering]) -> None:
        self.loop, self.conn, self.done = loop, conn, done
        self.fd = conn.fileno()
        done.add(self)
        loop.add_reader(self.fd, self._drain)
        self.timer = loop.call_later(_LINGER_S, self.close)

    def _drain(self) -> None:
        try:
            while self.conn.recv(1 << 16):
                pass
        except BlockingIOError:
            return
        except OSError:
            pass
        self.close()

    def close(self) -> None:
        if self in self.done:
            self.done.discard(self)
            self.timer.cancel()
            if not self.loop.is_closed():
                self.loop.remove_reader(self.fd)
            self.conn.close()


class RetrievalServer:
    """Serve a Retriever over HTTP (see the module docstring).

    Use as a context manager or call :meth:`start` / :meth:`close`;
    :meth:`serve_forever` blocks (the CLI). ``url`` is ``http://host:port``.
    ``max_connections`` and ``max_connections_per_client`` are the limits in force
    (the config's, after ``RLIMIT_NOFILE``). ``open_connections`` is the number of
    connections being served now, ``refused_connections`` the number answered 503
    at accept (over a limit, or out of descriptors), ``accept_errors`` the number
    of ``accept`` calls that failed (for want of descriptors, mostly).
    """

    def __init__(self, retriever: Retriever, config: ServerConfig | None = None) -> None:
        self.retriever = retriever
        self.config = config or ServerConfig()
        self.open_connections = 0
        self.refused_connections = 0
        self.accept_errors = 0
        self._per_client: dict[str, int] = {}
        self._lingering: set[_Lingering] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._accepting = False
        self._reserve: int | None = None
        self._sockets: list[socket.socket] = []
        self.batcher = _MicroBatcher(retriever, self.config)
        self._loop = asyncio.new_event_loop()
        try:
            self._sockets = _listen(self.config.host, self.config.port, self.config.backlog)
            self._reserve = _reserve_descriptor()
            budget = _descriptor_budget(self.config.reserved_fds)
            self.max_connections = self.config.max_connections if budget is None else min(
                self.config.max_connections, budget)
            per_client = self.config.max_connections_per_client
            self.max_connections_per_client = min(
                self.max_connections, max(1, self.max_connections // 8) if per_client is None else per_client)
            self._full = _refusal(f"more than {self.max_connections} open connections; retry")
            self._client_full = _refusal(
                f"more than {self.max_connections_per_client} open connections from your address; retry")
            self._no_descriptors = _refusal("the server is out of file descriptors; retry")
            self._resume_accepting()
        except BaseException:
            self._release()
            self.batcher.close()
            raise

    @property
    def url(self) -> str:
        host, port = self._sockets[0].getsockname()[:2]
        return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"

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
            self._pause_accepting()
            for lingering in list(self._lingering):
                lingering.close()
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
            self._pause_accepting()
            self._loop.close()
        for sock in self._sockets:
            sock.close()
        if self._reserve is not None:
            os.close(self._reserve)
            self._reserve = None

    def __enter__(self) -> RetrievalServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---------------------------------------------------------------- accept
    def _resume_accepting(self) -> None:
        if self._closed or self._accepting:
            return
        for sock in self._sockets:
            self._loop.add_reader(sock.fileno(), self._accept, sock)
        self._accepting = True

    def _pause_accepting(self) -> None:
        if self._accepting and not self._loop.is_closed():
            for sock in self._sockets:
                self._loop.remove_reader(sock.fileno())
        self._accepting = False

    def _accept(self, sock: socket.socket) -> None:
        """Accept what is waiting, at most 64 per wakeup so that the loop stays responsive.

        An ``accept`` that fails for want of descriptors sheds the waiting connection
        (:meth:`_shed`); any other failure, or a failed shed, stops accepting for 0.1 s.
        """
        for _ in range(_ACCEPTS_PER_WAKEUP):
            try:
                conn, address = sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except ConnectionAbortedError:
                continue
            except OSError as exc:
                self.accept_errors += 1
                if self.config.verbose:
                    import sys

                    print(f"accept: {exc}", file=sys.stderr)
                if exc.errno not in _OUT_OF_DESCRIPTORS or not self._shed(sock):
                    self._pause_accepting()
                    self._loop.call_later(_ACCEPT_BACKOFF_S, self._resume_accepting)
                    return
                continue
            self._admit(conn, address)

    def _shed(self, sock: socket.socket) -> bool:
        """Out of descriptors: accept one waiting connection on the reserve descriptor and refuse it."""
        if self._reserve is None:
            self._reserve = _reserve_descriptor()
            return False
        os.close(self._reserve)
        self._reserve = None
        try:
            conn, _ = sock.accept()
        except (BlockingIOError, InterruptedError, ConnectionAbortedError):
            return True
        except OSError:
            return False
        else:
            self.refused_connections += 1
            _refuse(conn, self._no_descriptors)
            conn.close()
            return True
        finally:
            self._reserve = _reserve_descriptor()

    def _admit(self, conn: socket.socket, address: Any) -> None:
        client = str(address[0]) if isinstance(address, tuple) else str(address)
        if self.open_connections >= self.max_connections:
            self._refuse(conn, self._full)
            return
        if self._per_client.get(client, 0) >= self.max_connections_per_client:
            self._refuse(conn, self._client_full)
            return
        self.open_connections += 1
        self._per_client[client] = self._per_client.get(client, 0) + 1
        task = self._loop.create_task(self._handle(conn, client))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _refuse(self, conn: socket.socket, response: bytes) -> None:
        """503 and close; the connection lingers (at most ``reserved_fds // 2`` at once) if the client is still sending."""
        self.refused_connections += 1
        if _refuse(conn, response) and len(self._lingering) < self.config.reserved_fds // 2:
            _Lingering(self._loop, conn, self._lingering)
        else:
            conn.close()

    async def _handle(self, conn: socket.socket, client: str) -> None:
        writer: asyncio.StreamWriter | None = None
        try:
            conn.setblocking(False)
            reader = asyncio.StreamReader(limit=_MAX_HEADER_BYTES, loop=self._loop)
            protocol = asyncio.StreamReaderProtocol(reader, loop=self._loop)
            transport, _ = await self._loop.connect_accepted_socket(lambda: protocol, sock=conn)
            writer = asyncio.StreamWriter(transport, protocol, reader, self._loop)
            await self._serve_connection(reader, writer, client)
        except OSError:
            pass
        finally:
            self.open_connections -= 1
            left = self._per_client[client] - 1
            if left:
                self._per_client[client] = left
            else:
                del self._per_client[client]
            if writer is None:
                conn.close()

    # ------------------------------------------------------------ connections
    async def _serve_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                                client: str) -> None:
        try:
            first = True
            while True:
                try:
                    head = await asyncio.wait_for(reader.read(1), self.config.idle_timeout_s)
                except (TimeoutError, asyncio.TimeoutError):
                    if first:
                        await self._respond(writer, HTTPStatus.REQUEST_TIMEOUT,
                                            {"error": f"no request within {self.config.idle_timeout_s} s"},
                                            close=True)
                    return
                if not head:
                    return
                try:
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
                status, payload = await self._route(method, path, body, client)
                if not await self._respond(writer, status, payload, close=not keep_alive):
                    return
                if not keep_alive:
                    return
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, OSError):
            return
        finally:
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

    async def _route(self, method: str, path: str, body: bytes, client: str = "") -> tuple[int, Any]:
        route = path.split("?", 1)[0].rstrip("/")
        if self.config.verbose:
            import sys

            print(f"{method} {path} ({len(body)} bytes)", file=sys.stderr)
        if method == "GET" and route == "/health":
            return HTTPStatus.OK, {"status": "ok", "retriever": repr(self.retriever), "batches": self.batcher.batches,
                                   "open_connections": self.open_connections,
                                   "refused_connections": self.refused_connections,
                                   "accept_errors": self.accept_errors}
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
                return _encode(format_results(results, return_scores=request.return_scores,
                                              document_format=self.config.document_format))

            if sum(map(len, results)) <= _INLINE_HITS:
                return HTTPStatus.OK, encoded()
            return HTTPStatus.OK, await asyncio.to_thread(encoded)  # a large response does not hold up the loop
        return HTTPStatus.NOT_FOUND, {"error": f"no route {method} {path[:100]}; use POST /retrieve or GET /health"}

    async def _respond(self, writer: asyncio.StreamWriter, status: int, payload: Any, *, close: bool) -> bool:
        """Write one JSON response (``payload``, or its encoding as bytes); False when the client did not take it in time."""
        data = payload if isinstance(payload, bytes) else _encode(payload)
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
