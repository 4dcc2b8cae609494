"""The retrieval server under hostile load: connection hoarding, descriptor exhaustion, one client's huge batches.

A client is a peer IP address; the tests speak from distinct loopback addresses
(127.0.0.2, 127.0.0.3, ...), which Linux routes to a server on 127.0.0.1. Every
wait is bounded; bounds on speed are relative to a time measured in the same
test, or loose enough (2 s for an answer that takes milliseconds) not to flake on
a loaded 2-core machine.
"""

from __future__ import annotations

import http.client
import itertools
import json
import os
import resource
import select
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from retrievers.bm25 import BM25Retriever
from retrievers.server import RetrievalServer, ServerConfig

from .conftest import named_queries

pytestmark = pytest.mark.hostile

HOSTILE, INNOCENT, OTHER = "127.0.0.2", "127.0.0.3", "127.0.0.4"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module", autouse=True)
def _loopback_aliases() -> None:
    try:
        with socket.socket() as s:
            s.bind((HOSTILE, 0))
    except OSError:
        pytest.skip("this host cannot bind 127.0.0.2 (Linux routes all of 127/8 to loopback)")


def _address(url: str) -> tuple[str, int]:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    return host, int(port)


def _post(url: str, body: dict, source: str, timeout: float = 30) -> tuple[int, dict]:
    """One request on a new connection from ``source``; (status, JSON body)."""
    host, port = _address(url)
    conn = http.client.HTTPConnection(host, port, timeout=timeout, source_address=(source, 0))
    try:
        conn.request("POST", "/retrieve", json.dumps(body).encode(), {"Content-Type": "application/json"})
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()


def _answer_or_refusal(url: str, source: str, query: str = "city", timeout: float = 2) -> int | str:
    """The status of one request from ``source``, or the name of the error that ended it at once."""
    try:
        return _post(url, {"queries": [query], "topk": 1}, source, timeout=timeout)[0]
    except (ConnectionError, http.client.HTTPException) as exc:
        return type(exc).__name__


def _idle_connections(url: str, source: str, n: int) -> list[socket.socket]:
    return [socket.create_connection(_address(url), timeout=10, source_address=(source, 0)) for _ in range(n)]


def _closed_or_refused(s: socket.socket, timeout: float) -> bytes | None:
    """What the server sent before closing ``s`` within ``timeout`` (b"" for a bare close, None if still open)."""
    s.settimeout(timeout)
    data = b""
    try:
        while chunk := s.recv(4096):
            data += chunk
    except TimeoutError:
        return None
    except ConnectionError:
        pass
    return data


def _wait(predicate, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


# ------------------------------------------------------------------ per-client connection limits
def test_a_client_over_its_connection_limit_is_refused_at_once_and_others_are_served(bm25_index) -> None:
    config = ServerConfig(port=0, max_connections_per_client=16, idle_timeout_s=60)
    with RetrievalServer(bm25_index, config) as server:
        assert server.max_connections_per_client == 16
        held = _idle_connections(server.url, HOSTILE, 16)
        extra: list[socket.socket] = []
        try:
            assert _wait(lambda: server.open_connections == 16, 10)
            extra = _idle_connections(server.url, HOSTILE, 24)
            start = time.monotonic()
            answers = [_closed_or_refused(s, 2) for s in extra]
            assert all(a is not None and (a == b"" or a.startswith(b"HTTP/1.1 503")) for a in answers), answers
            assert sum(a.startswith(b"HTTP/1.1 503") for a in answers) >= 20, "a refusal is a 503, not a reset"
            assert time.monotonic() - start < 5
            assert _answer_or_refusal(server.url, HOSTILE) == 503
            for source in (INNOCENT, OTHER):
                assert _answer_or_refusal(server.url, source) == 200
            assert _wait(lambda: server.open_connections == 16, 5), "the innocent clients' connections close"
            assert server.refused_connections >= 25
            assert all(_closed_or_refused(s, 0.01) is None for s in held), "the first 16 are still served"
        finally:
            for s in held + extra:
                s.close()


def test_the_default_per_client_limit_is_well_below_the_global_cap(bm25_index) -> None:
    with RetrievalServer(bm25_index, ServerConfig(port=0, max_connections=800)) as server:
        assert server.max_connections == 800 and server.max_connections_per_client == 100
    with RetrievalServer(bm25_index, ServerConfig(port=0, max_connections=100,
                                                  max_connections_per_client=10_000)) as server:
        assert server.max_connections_per_client == 100, "never above the global cap"


def test_idle_connections_are_closed_after_the_idle_timeout(bm25_index) -> None:
    config = ServerConfig(port=0, idle_timeout_s=0.5, read_timeout_s=30, max_connections_per_client=64)
    with RetrievalServer(bm25_index, config) as server:
        silent = _idle_connections(server.url, HOSTILE, 30)
        kept = socket.create_connection(_address(server.url), timeout=10, source_address=(INNOCENT, 0))
        try:
            body = json.dumps({"query": "city", "topk": 1}).encode()
            kept.sendall(b"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
            kept.settimeout(10)
            first = kept.recv(65536)
            assert first.startswith(b"HTTP/1.1 200") and b"Connection: close" not in first
            answers = [_closed_or_refused(s, 5) for s in silent]
            assert all(a is not None and a.startswith(b"HTTP/1.1 408") for a in answers)
            assert _closed_or_refused(kept, 5) == b"", "a keep-alive connection is closed quietly when idle"
            assert _wait(lambda: server.open_connections == 0, 5)
        finally:
            for s in silent + [kept]:
                s.close()


# ------------------------------------------------------------------ descriptor exhaustion (a subprocess)
class _Launched:
    def __init__(self, index: Path, nofile: int, config: dict, leave_free: int | None = None) -> None:
        spec = json.dumps({"index": str(index), "nofile": nofile, "config": config, "leave_free": leave_free})
        env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
        self.proc = subprocess.Popen([sys.executable, str(Path(__file__).with_name("_rlimit_launcher.py")), spec],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, cwd=ROOT)
        ready, _, _ = select.select([self.proc.stdout], [], [], 120)
        line = self.proc.stdout.readline() if ready else b""
        if not line:
            self.close()
            raise AssertionError(f"the server did not start (exit status {self.proc.poll()})")
        info = json.loads(line)
        self.url, self.max_connections = info["url"], info["max_connections"]
        self.max_connections_per_client = info["max_connections_per_client"]

    def cpu_seconds(self) -> float:
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def health(self) -> dict:
        host, port = _address(self.url)
        conn = http.client.HTTPConnection(host, port, timeout=10)
        try:
            conn.request("GET", "/health")
            return json.loads(conn.getresponse().read())
        finally:
            conn.close()

    def close(self) -> None:
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)


@pytest.fixture
def launch(bm25_index):
    if resource.getrlimit(resource.RLIMIT_NOFILE)[0] < 1024:
        pytest.skip("the test process needs ~600 descriptors for its idle connections")
    launched: list[_Launched] = []

    def start(**kwargs) -> _Launched:
        launched.append(_Launched(bm25_index.directory, 256, **kwargs))
        return launched[-1]

    yield start
    for server in launched:
        server.close()


def _timed(url: str, source: str) -> tuple[int | str, float]:
    start = time.monotonic()
    answer = _answer_or_refusal(url, source, timeout=2)
    return answer, time.monotonic() - start


@pytest.mark.parametrize("per_client", [None, 10_000], ids=["default-per-client-limit", "no-per-client-limit"])
def test_under_ulimit_256_idle_connections_never_stall_a_new_client(launch, per_client) -> None:
    server = launch(config={"max_connections_per_client": per_client, "idle_timeout_s": 60})
    assert 0 < server.max_connections <= 256 - 64, "the global cap leaves descriptors free"
    idle = _idle_connections(server.url, HOSTILE, 400)
    try:
        time.sleep(0.5)
        answer, elapsed = _timed(server.url, INNOCENT)
        assert elapsed < 2, f"a new client waited {elapsed:.1f} s"
        if per_client is None:
            assert answer == 200, "the hoarder is held to its own limit; everyone else is served"
        else:
            assert answer in (200, 503, "ConnectionResetError", "RemoteDisconnected", "BrokenPipeError")
        assert server.proc.poll() is None
    finally:
        for s in idle:
            s.close()
    assert _wait(lambda: _answer_or_refusal(server.url, INNOCENT, timeout=5) == 200, 10)
    health = server.health()
    assert health["refused_connections"] >= 400 - server.max_connections and health["accept_errors"] == 0


def test_emfile_in_accept_answers_new_clients_at_once_and_serving_resumes(launch) -> None:
    server = launch(config={"idle_timeout_s": 60}, leave_free=4)
    idle = _idle_connections(server.url, HOSTILE, 200)
    try:
        time.sleep(0.5)
        cpu_before = server.cpu_seconds()
        time.sleep(1.0)
        assert server.cpu_seconds() - cpu_before < 0.3, "the accept loop spins on EMFILE"
        for source in (INNOCENT, OTHER, INNOCENT):
            answer, elapsed = _timed(server.url, source)
            assert elapsed < 2, f"a new client waited {elapsed:.1f} s"
            closed = ("ConnectionResetError", "RemoteDisconnected", "BrokenPipeError")  # closed at once
            assert answer == 503 or answer in closed, answer
    finally:
        for s in idle:
            s.close()
    assert _wait(lambda: _answer_or_refusal(server.url, INNOCENT, timeout=5) == 200, 10), "serving resumes"
    health = server.health()
    assert health["accept_errors"] > 0 and health["refused_connections"] > 0 and server.proc.poll() is None


# ------------------------------------------------------------------ fair scheduling across clients
class _CostPerQuery(BM25Retriever):
    """The real index, with a backend whose batch_search costs 0.5 ms a query (it sleeps; CPU load does not skew it)."""

    calls: list[list[str]]

    def batch_search(self, queries, k=10):
        self.calls.append(list(queries))
        time.sleep(0.0005 * len(queries))
        return super().batch_search(queries, k)


def test_a_small_query_is_not_starved_by_another_clients_maximum_size_batches(bm25_index, small_enc) -> None:
    retriever = _CostPerQuery.load(bm25_index.directory)
    retriever.calls = []
    config = ServerConfig(port=0)
    large = {"queries": [f"big {i} city river" for i in range(config.max_queries)], "topk": 1}
    small = {"queries": [named_queries(small_enc)[0][0]], "topk": 1}
    with RetrievalServer(retriever, config) as server:
        start = time.monotonic()
        status, body = _post(server.url, large, HOSTILE)
        one_large = time.monotonic() - start
        assert status == 200 and len(body["result"]) == config.max_queries
        done: dict[str, float] = {}

        def send(name: str, body: dict, source: str) -> None:
            assert _post(server.url, body, source, timeout=120)[0] == 200
            done[name] = time.monotonic()

        before = server.batcher.submitted_queries
        threads = [threading.Thread(target=send, args=(f"large{i}", large, HOSTILE)) for i in range(3)]
        for t in threads:
            t.start()
        assert _wait(lambda: server.batcher.submitted_queries - before == 3 * config.max_queries, 30)
        start = time.monotonic()
        send("small", small, INNOCENT)
        small_latency = done["small"] - start
        for t in threads:
            t.join(timeout=120)
    assert len(done) == 4
    larges = sorted(done[f"large{i}"] for i in range(3))
    waited = (f"the small query took {small_latency:.2f} s behind 3 large requests; one large alone takes "
              f"{one_large:.2f} s")
    assert done["small"] < larges[1], f"the small query finished after two of the large ones ({waited})"
    # Counted in work, not seconds (a loaded machine stretches both): the queries searched before the small one's
    # batch are at most the batches already formed when it came, far fewer than the three large requests (FIFO).
    calls = retriever.calls[2:]
    assert max(len(c) for c in calls) <= config.max_batch and any(small["queries"][0] in c for c in calls[:3])
    ahead = sum(len(c) for c in itertools.takewhile(lambda c: small["queries"][0] not in c, calls))
    assert ahead < 2 * config.max_queries, f"{ahead} queries were searched before the small one ({waited})"


def test_the_batcher_interleaves_clients_and_keeps_one_clients_batches_whole(bm25_index, small_enc) -> None:
    words = [p["title"] for p in small_enc.passages[:50]]
    retriever = _CostPerQuery.load(bm25_index.directory)
    retriever.calls = []
    with RetrievalServer(retriever, ServerConfig(port=0, max_batch=64, batch_window_ms=50)) as server:
        batcher = server.batcher
        jobs = [[f"{words[(i + j) % len(words)]} {i} {j}" for i in range(200)] for j in range(3)]
        jobs += [["b city"], [f"c {words[i % len(words)]} {i}" for i in range(40)]]
        futures = [batcher.submit(q, 2, client="a") for q in jobs[:3]]
        futures += [batcher.submit(jobs[3], 2, client="b"), batcher.submit(jobs[4], 2, client="c")]
        results = [f.result(timeout=60) for f in futures]
    assert results == [bm25_index.batch_search(q, 2) for q in jobs], "each request's pieces come back in order"
    assert all(len(c) <= 64 for c in retriever.calls)
    where = {q: n for n, c in enumerate(retriever.calls) for q in c}
    assert where["b city"] <= 1 and max(where[q] for q in jobs[4]) <= 2
    assert sum(len(c) for c in retriever.calls) == 641 and len(retriever.calls) == 11, "full batches"


def test_a_large_response_is_encoded_off_the_loop_and_arrives_whole(bm25_index, small_enc) -> None:
    queries = [q for q, _ in named_queries(small_enc)] * 4
    with RetrievalServer(bm25_index, ServerConfig(port=0)) as server:
        status, body = _post(server.url, {"queries": queries, "topk": 50, "return_scores": True}, INNOCENT)
    assert status == 200 and sum(map(len, body["result"])) > 4096
    assert [[item["document"]["id"] for item in r] for r in body["result"]] == [
        [h.doc_id for h in hits] for hits in bm25_index.batch_search(queries, 50)]
