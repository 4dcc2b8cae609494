"""The retrieval server's batcher: one worker thread, batches bounded in queries and in cost, fair across clients.

:class:`MicroBatcher` merges requests into ``batch_search`` calls. Two limits
bound a batch: ``max_batch`` queries, and ``max_batch_cost`` units of estimated
work (:func:`query_cost`), so that a batch of maximum-size queries at the
largest ``topk`` takes about as long as a batch of ordinary ones rather than
fifteen times longer. Requests are queued per client and a batch is filled by
deficit round-robin (Shreedhar and Varghese, 1995) over the clients' queues,
counted in the same cost units: each client with queued work gets, in turn, a
quantum of 16 units (one maximum-size query at the default limits; more when a
single query costs more), spends it on its oldest request's queries (a large
request is split over turns and batches) and keeps what is left for its next
turn while it has work queued. The turn order carries over from one batch to
the next. A client alone on the server fills whole batches; with others
waiting, each batch holds a share of every waiting client's work, so a small
request waits for at most the batch under way and the one it joins, both
bounded in cost, whatever another client has queued.

Why hand-written: the scheduler sits between the HTTP layer and the backend's
``batch_search``; no web framework schedules work inside an endpoint (uvicorn
and starlette run each request on its own, in arrival order), and a generic
priority queue does not merge requests into one backend call.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from retrievers.base import Hit, Retriever

__all__ = ["MicroBatcher", "query_cost", "QUANTUM"]

QUANTUM = 16.0
"""Cost units a client may spend per turn (at least one query's cost whatever its size)."""


def query_cost(query: str, k: int) -> float:
    """The estimated work of searching ``query`` for ``k`` hits, in units of a short top-1 query.

    ``1 + k / 16 + len(query) / 512``: fitted to bm25s on the synthetic WikiQA
    index, where a 40-character query costs ~0.3 ms at ``k = 3``, ~1.7 ms at
    ``k = 100`` (building the hits), and a 3,900-character one ~1.2 ms and
    ~2.5 ms (scoring its terms), per query in a batch of 16 to 512. Dense
    backends scale alike (the encoder with the query's length, the hits with
    ``k``). A maximum-size query at the server's default limits (4,096
    characters, ``k = 100``) costs 15.25 units, an ordinary Search-R1 query
    (60 characters, ``k = 3``) about 1.3.
    """
    return 1.0 + k / 16 + len(query) / 512


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
    running: bool = False

    def cost(self, i: int) -> float:
        return query_cost(self.queries[i], self.k)

    def cost_left(self) -> float:
        return sum(self.cost(i) for i in range(self.taken, len(self.queries)))


@dataclass(eq=False)
class _Client:
    """One client's queue and its deficit (cost units it may still spend in its turn)."""

    jobs: deque[_Job] = field(default_factory=deque)
    deficit: float = 0.0
    in_turn: bool = False


_Piece = tuple[_Job, int, int]


class MicroBatcher:
    """One worker thread that merges requests into ``batch_search`` calls, fairly across clients.

    :meth:`submit` queues a request under its client (any hashable key; the server
    passes the peer IP address). A batch holds at most ``max_batch`` queries and at
    most ``max_batch_cost`` cost units (:func:`query_cost`, every query costed at the
    batch's largest ``k``, which is what the backend is asked for), and at least one
    query whatever it costs. It is filled by deficit round-robin across the clients
    (see the module docstring). The worker waits up to ``batch_window_ms`` for more
    work while less than one batch is queued. A request's future gets its results
    once all its queries are answered, or the exception of the first part that fails
    (its remaining parts are dropped); if a ``batch_search`` call raises, each
    request's part of the batch is searched on its own, so a query the backend cannot
    handle fails only the request that sent it. Cancelled requests are dropped
    before they are searched.

    ``batches``: ``batch_search`` calls made; ``isolated_failures``: requests failed
    by their own queries; ``submitted_queries``: queries ever submitted;
    :attr:`queued_queries`: queries waiting for a batch.
    """

    def __init__(self, retriever: Retriever, *, max_batch: int, batch_window_ms: float,
                 max_batch_cost: float) -> None:
        if max_batch < 1 or max_batch_cost <= 0 or batch_window_ms < 0:
            raise ValueError("need max_batch >= 1, max_batch_cost > 0 and batch_window_ms >= 0")
        self.retriever = retriever
        self.max_batch = max_batch
        self.max_batch_cost = max_batch_cost
        self.window_s = batch_window_ms / 1000
        self._cond = threading.Condition()
        self._clients: dict[Any, _Client] = {}
        self._order: deque[Any] = deque()
        self._queued = 0
        self._queued_cost = 0.0
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
        """Queue ``queries`` (top ``k`` each) under ``client``; the future gets one hit list per query."""
        future: Future[list[list[Hit]]] = Future()
        if not queries:
            future.set_result([])
            return future
        job = _Job(list(queries), k, future, results=[[] for _ in queries], left=len(queries))
        with self._cond:
            if self._stopping:
                raise RuntimeError("the retrieval worker is stopped")
            if client not in self._clients:
                self._clients[client] = _Client()
                self._order.append(client)
            self._clients[client].jobs.append(job)
            self._queued += len(queries)
            self._queued_cost += job.cost_left()
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
        try:
            while True:
                with self._cond:
                    while not self._queued and not self._stopping:
                        self._cond.wait()
                    if not self._queued:
                        return
                    deadline = time.monotonic() + self.window_s
                    while (self._queued < self.max_batch and self._queued_cost < self.max_batch_cost
                           and not self._stopping):
                        timeout = deadline - time.monotonic()
                        if timeout <= 0:
                            break
                        self._cond.wait(timeout)
                    pieces = self._take()
                if pieces:
                    self._answer(pieces)
        finally:
            import sys

            if "jnius" in sys.modules:  # a JVM-attached thread must detach before it ends
                sys.modules["jnius"].detach()

    def _take(self) -> list[_Piece]:
        """One batch, by deficit round-robin over the clients' queues (holding the lock)."""
        pieces: list[_Piece] = []
        n, chars, k_max = 0, 0, 0
        while self._order:
            key = self._order[0]
            client = self._clients[key]
            while client.jobs:
                job = client.jobs[0]
                if job.failed or (not job.running and not job.future.set_running_or_notify_cancel()):
                    client.jobs.popleft()
                    self._queued -= len(job.queries) - job.taken
                    self._queued_cost -= job.cost_left()
                    continue
                job.running = True
                query = job.queries[job.taken]
                own = job.cost(job.taken)
                if not client.in_turn:
                    client.deficit += max(QUANTUM, own)
                    client.in_turn = True
                if own > client.deficit:
                    break  # the turn is over
                k = max(k_max, job.k)
                if n and (n >= self.max_batch
                          or (n + 1) * (1 + k / 16) + (chars + len(query)) / 512 > self.max_batch_cost):
                    return pieces  # the batch is full; this client's turn goes on in the next one
                if pieces and pieces[-1][0] is job:
                    pieces[-1] = (job, pieces[-1][1], job.taken + 1)
                else:
                    pieces.append((job, job.taken, job.taken + 1))
                job.taken += 1
                n, chars, k_max = n + 1, chars + len(query), k
                client.deficit -= own
                self._queued -= 1
                self._queued_cost -= own
                if job.taken == len(job.queries):
                    client.jobs.popleft()
            client.in_turn = False
            if client.jobs:
                self._order.rotate(-1)
            else:
                self._order.popleft()
                del self._clients[key]
        if not self._queued:
            self._queued_cost = 0.0  # no float drift carried into the next burst
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
