"""The retrieval server beside FastAPI + uvicorn (+ pydantic): the same scenarios against each, in one run.

Three servers answer ``POST /retrieve`` over one bm25s index of the project's
synthetic encyclopedia, each in its own subprocess (so that a lowered
``RLIMIT_NOFILE`` applies to that server alone):

* ``ours``: :class:`retrievers.server.RetrievalServer`;
* ``uvicorn``: a FastAPI app served by uvicorn, the idiomatic way (what Search-R1
  runs): a pydantic request model for Search-R1's ``{"queries": [...], "topk",
  "return_scores"}`` and SkyRL's ``{"query": ...}``, and a plain ``def`` endpoint
  that FastAPI runs in its thread pool (``run_in_threadpool``), one
  ``batch_search`` per request;
* ``uvicorn+batcher``: the same app, but the endpoint awaits our micro-batcher
  (round-robin across client addresses), so that only the HTTP layer differs
  from ``ours``.

uvicorn's knobs are set to the closest equivalents of our limits:
``limit_concurrency`` = our global connection cap, ``timeout_keep_alive`` = our
``idle_timeout_s``, ``backlog`` = our ``backlog``. uvicorn has no per-client
connection limit, no timeout for a request's headers/body once started (our
``read_timeout_s``), no idle timeout for a connection that never sends a request,
and no descriptor reserve for EMFILE.

Scenarios (clients speak from distinct loopback addresses, 127.0.0.2, .3, ...):
throughput and p50/p99 latency of concurrent well-behaved clients (a new
connection per request, as ``requests.post`` does); one client holding many idle
connections while another queries; the same under ``RLIMIT_NOFILE`` 256 in the
server's process; slow-loris clients trickling header bytes; a small query
behind another client's large batches (fairness); a schema error (the status and
error key each server answers). One table, servers side by side, ratios
against ``ours`` from the same run.

    taskset -c 0 .venv/bin/python scripts/bench/retrieval_server_peer.py
    .venv/bin/python scripts/bench/retrieval_server_peer.py --small     # seconds; the test's mode
"""

import argparse
import contextlib
import http.client
import json
import os
import resource
import select
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
HOSTILE, INNOCENT, OTHER = "127.0.0.2", "127.0.0.3", "127.0.0.4"
SERVERS = ("ours", "uvicorn", "uvicorn+batcher")

# The limits every server runs under (ours) and their uvicorn equivalents (--small: idle and read 1 s).
CAP = 256
IDLE_S = 3.0
READ_S = 2.0
BACKLOG = 4096


# ====================================================================== the servers (child processes)
def _fastapi_app(retriever: Any, batched: bool, default_topk: int = 3, max_topk: int = 100) -> Any:
    import asyncio

    from fastapi import FastAPI, Request
    from fastapi.concurrency import run_in_threadpool
    from pydantic import BaseModel, Field, model_validator

    from retrievers.protocol import format_results
    from retrievers.server import ServerConfig, batcher_for

    class RetrieveRequest(BaseModel):
        """Search-R1's request model (``queries``, ``topk``, ``return_scores``), plus SkyRL's ``query``."""

        queries: list[str] | None = Field(None, max_length=1024)
        query: str | None = None
        topk: int | None = Field(None, ge=0, le=max_topk)
        return_scores: bool = False

        @model_validator(mode="after")
        def _one_dialect(self) -> "RetrieveRequest":
            if (self.queries is None) == (self.query is None):
                raise ValueError("send either 'queries' (a list of strings) or 'query' (one string)")
            return self

    app = FastAPI()
    batcher = batcher_for(retriever, ServerConfig(port=0)) if batched else None
    state = {"requests": 0}

    @app.get("/health")
    def health() -> dict:
        return {"status": "ok", "requests": state["requests"]}

    @app.post("/retrieve")
    async def retrieve(body: RetrieveRequest, request: Request) -> dict:
        queries = body.queries if body.queries is not None else [body.query]
        k = body.topk or default_topk
        state["requests"] += 1
        if batcher is None:
            results = await run_in_threadpool(retriever.batch_search, queries, k)
        else:
            client = request.client.host if request.client else ""
            results = await asyncio.wrap_future(batcher.submit(list(queries), k, client))
        return format_results(results, return_scores=body.return_scores)

    return app


def _serve(spec: dict) -> None:
    """Child process: lower RLIMIT_NOFILE, start one server, print its URL, serve until stdin closes."""
    if spec.get("nofile"):
        resource.setrlimit(resource.RLIMIT_NOFILE, (spec["nofile"], spec["nofile"]))
    sys.path.insert(0, str(ROOT))
    from retrievers import load_retriever
    from retrievers.server import RetrievalServer, ServerConfig

    retriever = load_retriever(spec["index"])
    if spec["kind"] == "ours":
        config = ServerConfig(port=0, max_connections=CAP, idle_timeout_s=spec["idle_s"], read_timeout_s=spec["read_s"],
                              backlog=BACKLOG)
        server = RetrievalServer(retriever, config).start()
        print(json.dumps({"url": server.url, "max_connections": server.max_connections,
                          "max_connections_per_client": server.max_connections_per_client}), flush=True)
        sys.stdin.read()
        server.close()
        return
    import uvicorn

    app = _fastapi_app(retriever, batched=spec["kind"] == "uvicorn+batcher")
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(BACKLOG)
    config = uvicorn.Config(app, limit_concurrency=spec["limit_concurrency"], timeout_keep_alive=spec["idle_s"],
                            backlog=BACKLOG, log_level="critical", access_log=False, lifespan="off")
    server = uvicorn.Server(config)
    print(json.dumps({"url": f"http://127.0.0.1:{sock.getsockname()[1]}",
                      "max_connections": spec["limit_concurrency"], "max_connections_per_client": None}), flush=True)

    def stop() -> None:
        sys.stdin.read()
        server.should_exit = True

    threading.Thread(target=stop, daemon=True).start()
    server.run(sockets=[sock])


class _Server:
    """A server in a subprocess (see :func:`_serve`)."""

    def __init__(self, kind: str, index: Path, *, nofile: int | None = None, idle_s: float = IDLE_S,
                 read_s: float = READ_S, limit_concurrency: int = CAP) -> None:
        spec = {"kind": kind, "index": str(index), "nofile": nofile, "idle_s": idle_s, "read_s": read_s,
                "limit_concurrency": limit_concurrency}
        self.kind = kind
        self.log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen([sys.executable, __file__, "--serve", json.dumps(spec)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self.log, cwd=ROOT)
        ready, _, _ = select.select([self.proc.stdout], [], [], 120)
        line = self.proc.stdout.readline() if ready else b""
        if not line:
            self.log.seek(0)
            why = self.log.read()[-2000:].decode(errors="replace")
            self.close()
            raise RuntimeError(f"{kind} did not start: {why}")
        info = json.loads(line)
        self.url, self.max_connections = info["url"], info["max_connections"]
        self.per_client = info["max_connections_per_client"]

    def cpu_seconds(self) -> float:
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self.log.close()

    def __enter__(self) -> "_Server":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ====================================================================== clients
def _address(url: str) -> tuple[str, int]:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    return host, int(port)


def _post(url: str, body: Any, source: str, timeout: float) -> tuple[int, Any]:
    host, port = _address(url)
    conn = http.client.HTTPConnection(host, port, timeout=timeout, source_address=(source, 0))
    try:
        conn.request("POST", "/retrieve", json.dumps(body).encode(), {"Content-Type": "application/json"})
        response = conn.getresponse()
        data = response.read()
        try:
            return response.status, json.loads(data)
        except ValueError:  # uvicorn's 503 is plain text
            return response.status, data.decode(errors="replace")
    finally:
        conn.close()


def _attempt(url: str, body: Any, source: str, timeout: float) -> tuple[int | str, float]:
    """(status, or the name of what ended the request: 'timeout', 'ConnectionResetError', ...; seconds)."""
    start = time.monotonic()
    try:
        status: int | str = _post(url, body, source, timeout)[0]
    except TimeoutError:
        status = "timeout"
    except (OSError, http.client.HTTPException) as exc:
        status = type(exc).__name__
    return status, time.monotonic() - start


def _idle(url: str, source: str, n: int) -> list[socket.socket]:
    out = []
    for _ in range(n):
        s = socket.socket()
        s.bind((source, 0))
        s.settimeout(10)
        s.connect(_address(url))
        out.append(s)
    return out


def _sweep(socks: list[socket.socket], wait: float) -> tuple[int, int, int]:
    """Within ``wait`` s: how many of ``socks`` got a 503, were closed bare, stayed open."""
    got: dict[socket.socket, bytes | None] = {s: None for s in socks}
    deadline = time.monotonic() + wait
    pending = set(socks)
    while pending and (left := deadline - time.monotonic()) > 0:
        readable, _, _ = select.select(list(pending), [], [], left)
        for s in readable:
            try:
                s.setblocking(False)
                chunk = s.recv(4096)
            except BlockingIOError:
                continue
            except OSError:
                chunk = b""
            got[s] = (got[s] or b"") + chunk
            if not chunk:
                pending.discard(s)
    refused = sum(1 for s in socks if s not in pending and (got[s] or b"").startswith(b"HTTP/1.1 503"))
    closed = sum(1 for s in socks if s not in pending) - refused
    return refused, closed, len(pending)


def _close_all(socks: list[socket.socket]) -> None:
    for s in socks:
        s.close()


def _pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))] if values else float("nan")


def _statuses(answers: list[int | str]) -> str:
    counts: dict[str, int] = {}
    for a in answers:
        counts[str(a)] = counts.get(str(a), 0) + 1
    return " ".join(f"{k}x{v}" if v > 1 else k for k, v in sorted(counts.items()))


# ====================================================================== scenarios
class Bench:
    def __init__(self, index: Path, queries: list[str], small: bool) -> None:
        self.index, self.queries, self.small = index, queries, small
        self.idle_s, self.read_s = (1.0, 1.0) if small else (IDLE_S, READ_S)
        self.wait_s = 1.5 if small else 3.0  # how long a client waits for an answer in the hostile scenarios
        self.rows: list[tuple[str, str, str, dict[str, Any]]] = []  # (scenario, metric, better, {server: value})

    def record(self, scenario: str, metric: str, kind: str, value: Any, better: str = "") -> None:
        for row in self.rows:
            if row[0] == scenario and row[1] == metric:
                row[3][kind] = value
                return
        self.rows.append((scenario, metric, better, {kind: value}))

    def run(self) -> None:
        for scenario in (self.throughput, self.idle_hoarder, self.low_nofile, self.slow_loris, self.fairness,
                         self.schema_error):
            for kind in SERVERS:
                start = time.monotonic()
                scenario(kind)
                print(f"  {scenario.__name__} / {kind}: {time.monotonic() - start:.1f} s", file=sys.stderr, flush=True)

    # ------------------------------------------------------------------ 1
    def throughput(self, kind: str) -> None:
        clients, per_client = (4, 3) if self.small else (16, 20)
        body = {"queries": self.queries[:4], "topk": 3, "return_scores": True}
        name = f"{clients} clients x {per_client} requests"
        with _Server(kind, self.index) as server:
            _attempt(server.url, body, INNOCENT, 30)  # warm-up
            latencies: list[float] = []
            errors: list[int | str] = []
            barrier = threading.Barrier(clients)

            def client(i: int) -> None:
                source = f"127.0.1.{i + 1}"
                barrier.wait()
                for _ in range(per_client):
                    status, seconds = _attempt(server.url, body, source, 30)
                    latencies.append(seconds) if status == 200 else errors.append(status)

            threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
            start = time.monotonic()
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            wall = time.monotonic() - start
        self.record(name, "requests/s", kind, len(latencies) / wall, "higher")
        self.record(name, "p50 latency ms", kind, 1000 * _pct(latencies, 0.5), "lower")
        self.record(name, "p99 latency ms", kind, 1000 * _pct(latencies, 0.99), "lower")
        self.record(name, "failed requests", kind, len(errors))

    # ------------------------------------------------------------------ 2
    def idle_hoarder(self, kind: str) -> None:
        hoard = 60 if self.small else 300
        name = f"{hoard} idle conns from one client (cap {CAP}, idle {self.idle_s:g} s)"
        body = {"queries": self.queries[:1], "topk": 3}
        with _Server(kind, self.index, idle_s=self.idle_s, read_s=self.read_s) as server:
            opened = time.monotonic()
            held = _idle(server.url, HOSTILE, hoard)
            try:
                time.sleep(0.3)
                tries = [_attempt(server.url, body, INNOCENT, self.wait_s) for _ in range(2 if self.small else 5)]
                refused, closed, _ = _sweep(held, 0.3)
                time.sleep(max(0.0, opened + self.idle_s + 1.0 - time.monotonic()))
                _, closed_later, still_open = _sweep(held, 0.3)
            finally:
                _close_all(held)
        self.record(name, "innocent client's answers", kind, _statuses([s for s, _ in tries]))
        self.record(name, "innocent p50 ms", kind, 1000 * statistics.median(t for _, t in tries), "lower")
        self.record(name, "hoarder's extra conns: 503 at once", kind, refused)
        self.record(name, f"hoarder's conns open after {self.idle_s + 1:g} s", kind, still_open)

    # ------------------------------------------------------------------ 3
    def low_nofile(self, kind: str) -> None:
        hoard = 300 if self.small else 400
        name = f"RLIMIT_NOFILE 256 in the server, {hoard} idle conns from one client"
        body = {"queries": self.queries[:1], "topk": 3}
        # uvicorn gets the cap our server derives from the limit; a long idle timeout keeps the hoard open.
        cap = getattr(self, "_nofile_cap", 192)
        with _Server(kind, self.index, nofile=256, idle_s=60, limit_concurrency=cap) as server:
            if kind == "ours":
                self._nofile_cap = server.max_connections
            held = _idle(server.url, HOSTILE, hoard)
            try:
                time.sleep(0.5 if self.small else 1.0)
                window = 0.5 if self.small else 2.0
                cpu = server.cpu_seconds()
                time.sleep(window)
                cpu = (server.cpu_seconds() - cpu) / window
                tries = [_attempt(server.url, body, source, self.wait_s)
                         for source in (INNOCENT, OTHER)[:1 if self.small else 2]]
            finally:
                _close_all(held)
            start = time.monotonic()
            recovered = None
            while time.monotonic() - start < 15:
                if _attempt(server.url, body, INNOCENT, self.wait_s)[0] == 200:
                    recovered = time.monotonic() - start
                    break
            alive = server.proc.poll() is None
        self.record(name, "connection cap (limit_concurrency)", kind, server.max_connections)
        self.record(name, "new clients' answers", kind, _statuses([s for s, _ in tries]))
        self.record(name, "new clients' wait, max s", kind, max(t for _, t in tries), "lower")
        self.record(name, "server CPU while held, %", kind, 100 * cpu, "lower")
        self.record(name, "serving again after the hoard leaves, s", kind,
                    recovered if recovered is not None else "no (15 s)", "lower")
        self.record(name, "server alive", kind, "yes" if alive else "no")

    # ------------------------------------------------------------------ 4
    def slow_loris(self, kind: str) -> None:
        n, span = (5, 2.0) if self.small else (20, 6.0)
        name = f"{n} slow-loris conns (1 header byte / 0.25 s for {span:g} s; read timeout {self.read_s:g} s)"
        with _Server(kind, self.index, idle_s=self.idle_s, read_s=self.read_s) as server:
            socks = _idle(server.url, HOSTILE, n)
            for s in socks:
                s.sendall(b"POST /retrieve HTTP/1.1\r\nHost: x\r\nX-Pad: ")
                s.setblocking(False)
            cut: dict[socket.socket, tuple[float, bytes]] = {}
            start = time.monotonic()
            innocent: tuple[int | str, float] | None = None
            try:
                while time.monotonic() - start < span and len(cut) < n:
                    for s in socks:
                        if s in cut:
                            continue
                        try:
                            data = s.recv(4096)
                        except BlockingIOError:
                            data = None
                        except OSError:
                            data = b""
                        if data is not None:
                            cut[s] = (time.monotonic() - start, data)
                            continue
                        with contextlib.suppress(OSError):
                            s.send(b"a")
                    if innocent is None and time.monotonic() - start > 0.5:
                        innocent = _attempt(server.url, {"queries": self.queries[:1], "topk": 3}, INNOCENT,
                                            self.wait_s)
                    time.sleep(0.25)
            finally:
                _close_all(socks)
        times = [t for t, _ in cut.values()]
        self.record(name, "conns cut off by the server", kind, f"{len(cut)}/{n}")
        self.record(name, "median time to cut-off, s", kind, statistics.median(times) if times else f"> {span:g}",
                    "lower")
        self.record(name, "cut-offs answered 408", kind, sum(d.startswith(b"HTTP/1.1 408") for _, d in cut.values()))
        self.record(name, "innocent client meanwhile", kind,
                    f"{innocent[0]} in {1000 * innocent[1]:.0f} ms" if innocent else "-")

    # ------------------------------------------------------------------ 5
    def fairness(self, kind: str) -> None:
        size, n_large = (256, 3) if self.small else (1024, 4)
        name = f"1-query request behind {n_large} x {size}-query requests of another client"
        # Each large query joins 6 questions (~60 words), so that a large request costs ~0.1 s of BM25 alone.
        large = {"queries": [" ".join(self.queries[(i + j) % len(self.queries)] for j in range(6)) + f" big {i}"
                             for i in range(size)], "topk": 1}
        small = {"queries": self.queries[:1], "topk": 1}
        with _Server(kind, self.index) as server:
            _attempt(server.url, large, HOSTILE, 120)  # warm-up
            status, one_large = _attempt(server.url, large, HOSTILE, 120)
            done: dict[str, float] = {}

            def send(label: str, body: dict, source: str) -> None:
                if _attempt(server.url, body, source, 120)[0] == 200:
                    done[label] = time.monotonic()

            threads = [threading.Thread(target=send, args=(f"large{i}", large, HOSTILE)) for i in range(n_large)]
            for t in threads:
                t.start()
            time.sleep(0.05 if self.small else 0.1)  # the large requests are in, not yet answered
            start = time.monotonic()
            send("small", small, INNOCENT)
            for t in threads:
                t.join()
        small_s = done["small"] - start if "small" in done else float("nan")
        before = sum(done.get(f"large{i}", float("inf")) < done.get("small", float("inf")) for i in range(n_large))
        self.record(name, "one large request alone, ms", kind, 1000 * one_large, "lower")
        self.record(name, "the small request's latency, ms", kind, 1000 * small_s, "lower")
        self.record(name, "small latency / one large alone", kind, small_s / one_large, "lower")
        self.record(name, "large requests finished before it", kind, f"{before}/{n_large}")

    # ------------------------------------------------------------------ 6
    def schema_error(self, kind: str) -> None:
        name = 'schema error: {"queries": "a string"}'
        with _Server(kind, self.index) as server:
            status, body = _post(server.url, {"queries": "a string"}, INNOCENT, 10)
            skyrl = _post(server.url, {"query": self.queries[0], "topk": 2}, INNOCENT, 10)
        self.record(name, "status", kind, status)
        self.record(name, "error body key", kind, ",".join(body) if isinstance(body, dict) else str(body))
        self.record(name, 'SkyRL {"query": ...} answered', kind,
                    f"{skyrl[0]}, {len(skyrl[1]['result'][0])} hits" if skyrl[0] == 200 else skyrl[0])

    # ------------------------------------------------------------------ table
    def table(self) -> str:
        def show(v: Any) -> str:
            if isinstance(v, float):
                return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.2f}"
            return str(v)

        head = "| scenario | metric | " + " | ".join(SERVERS) + " | " + " | ".join(
            f"{k} / ours" for k in SERVERS[1:]) + " |"
        lines = [head, "|---|---|" + "---:|" * (2 * len(SERVERS) - 1)]
        last = None
        for scenario, metric, better, values in self.rows:
            ratios = []
            for k in SERVERS[1:]:
                a, b = values.get(k), values.get("ours")
                numeric = better and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in (a, b))
                ratios.append(f"{a / b:.2f}" if numeric and b else "")
            lines.append(f"| {scenario if scenario != last else ''} | {metric} | "
                         + " | ".join(show(values.get(k, "-")) for k in SERVERS) + " | " + " | ".join(ratios) + " |")
            last = scenario
        return "\n".join(lines)


def _index(tmp: Path) -> tuple[Path, list[str]]:
    """A bm25s index over the tests' small synthetic encyclopedia, and questions that name its entities."""
    sys.path.insert(0, str(ROOT))
    from retrievers.bm25 import BM25Retriever
    from retrievers.corpus import iter_corpus, write_corpus
    from trace_envs.tasks.wiki import SyntheticWikiConfig, generate_encyclopedia

    enc = generate_encyclopedia(SyntheticWikiConfig(seed=3, n_countries=8, n_cities=30, n_people=160, n_orgs=80,
                                                    n_books=60, n_questions=8))
    write_corpus(iter_corpus(enc.passages), tmp / "corpus.jsonl")
    BM25Retriever.build(tmp / "corpus.jsonl", tmp / "bm25")
    queries = [f"Where is the {p['title']} headquartered and who founded it?" for p in enc.passages
               if p["id"].endswith("-main")][:16]
    return tmp / "bm25", queries


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--small", action="store_true", help="tiny sizes (seconds; for the test)")
    parser.add_argument("--serve", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        _serve(json.loads(args.serve))
        return 0
    try:
        with socket.socket() as s:
            s.bind((HOSTILE, 0))
    except OSError:
        print("this host cannot bind 127.0.0.2 (the scenarios need distinct loopback addresses)", file=sys.stderr)
        return 2
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 2048:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(2048, hard), hard))
    import fastapi
    import pydantic
    import uvicorn

    with tempfile.TemporaryDirectory() as tmp:
        index, queries = _index(Path(tmp))
        bench = Bench(index, queries, args.small)
        start = time.monotonic()
        bench.run()
        took = time.monotonic() - start
    print(f"fastapi {fastapi.__version__}, uvicorn {uvicorn.__version__} "
          f"({'httptools' if _has('httptools') else 'h11'}, {'uvloop' if _has('uvloop') else 'asyncio'} loop), "
          f"pydantic {pydantic.__version__}; Python {sys.version.split()[0]}; "
          f"CPUs allowed: {len(os.sched_getaffinity(0))}; {took:.0f} s")
    print(bench.table())
    return 0


def _has(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


if __name__ == "__main__":
    sys.exit(main())
