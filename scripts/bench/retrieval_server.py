"""Retrieval-server benchmark: the asyncio server against a thread-per-connection baseline, same run.

The baseline is the design the server had before (stdlib ``ThreadingHTTPServer``,
one thread per connection, the stdlib's listen backlog of 5), speaking the same
protocol through the same micro-batcher, so only the serving model differs.
For each server and each concurrency level, ``--clients`` threads start at once
(a barrier) and each sends ``--requests`` Search-R1 requests, a new connection
per request as Search-R1's ``requests.post`` does. Reported: answered
requests/s (median, min and max over ``--repeats`` runs), failed requests
(connection resets, timeouts, non-200 answers) and the ratio asyncio / baseline.

    .venv/bin/python scripts/bench/retrieval_server.py
    .venv/bin/python scripts/bench/retrieval_server.py --clients 1 16 200 --requests 10 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from retrievers.protocol import RequestError, format_results  # noqa: E402
from retrievers.server import RetrievalServer, ServerConfig, batcher_for, parse_request  # noqa: E402


class _BaselineHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        pass

    def do_POST(self) -> None:  # noqa: N802 - stdlib name
        app = self.server.app  # type: ignore[attr-defined]
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        try:
            request = parse_request(body, app.config)
            results = app.batcher.submit(list(request.queries), request.topk).result()
            status, payload = 200, format_results(results, return_scores=request.return_scores)
        except RequestError as exc:
            status, payload = 400, {"error": str(exc)}
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class _BaselineServer:
    """Thread per connection, listen backlog 5 (the stdlib default): the previous serving model."""

    def __init__(self, retriever: Any, config: ServerConfig) -> None:
        self.config = config
        self.batcher = batcher_for(retriever, config)
        self.httpd = ThreadingHTTPServer((config.host, 0), _BaselineHandler)
        self.httpd.daemon_threads = True
        self.httpd.app = self  # type: ignore[attr-defined]
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.batcher.close()


def _load(url: str, queries: list[str], clients: int, requests: int) -> tuple[float, int]:
    """(answered requests/s, failed requests) for ``clients`` threads of ``requests`` requests each."""
    barrier = threading.Barrier(clients + 1)
    failures = [0] * clients

    def client(i: int) -> None:
        barrier.wait()
        for j in range(requests):
            body = json.dumps({"queries": [queries[(i * requests + j) % len(queries)]], "topk": 3,
                               "return_scores": True}).encode()
            try:
                req = urllib.request.Request(url + "/retrieve", data=body, headers={"Content-Type": "application/json"})
                with urllib.request.urlopen(req, timeout=30) as response:
                    ok = response.status == 200 and len(json.loads(response.read())["result"]) == 1
            except (OSError, urllib.error.URLError, ValueError):
                ok = False
            failures[i] += 0 if ok else 1

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    barrier.wait()
    start = time.perf_counter()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    return (clients * requests - sum(failures)) / elapsed, sum(failures)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 16, 200])
    parser.add_argument("--requests", type=int, default=10, help="requests per client")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", default=None, help="also write the figures here")
    args = parser.parse_args(argv)

    from retrievers.bm25 import BM25Retriever
    from retrievers.corpus import iter_corpus, write_corpus
    from trace_envs.tasks.wiki import generate_encyclopedia

    enc = generate_encyclopedia()
    workdir = Path(tempfile.mkdtemp())
    write_corpus(iter_corpus(enc.passages), workdir / "corpus.jsonl")
    retriever = BM25Retriever.build(workdir / "corpus.jsonl", workdir / "bm25")
    queries = [t.prompt for t in enc.tasks.values()]
    config = ServerConfig(port=0)
    results: list[dict[str, Any]] = []
    for clients in args.clients:
        row: dict[str, Any] = {"clients": clients}
        for name in ("baseline", "asyncio"):
            rates, failed = [], 0
            for _ in range(args.repeats):
                server: Any = _BaselineServer(retriever, config) if name == "baseline" else \
                    RetrievalServer(retriever, config).start()
                try:
                    rate, bad = _load(server.url, queries, clients, args.requests)
                finally:
                    server.close()
                rates.append(rate)
                failed += bad
            row[name] = {"median": statistics.median(rates), "min": min(rates), "max": max(rates), "failed": failed,
                         "requests": clients * args.requests * args.repeats}
        row["ratio"] = row["asyncio"]["median"] / row["baseline"]["median"]
        results.append(row)
    print("| clients | baseline req/s (min-max) | baseline failed | asyncio req/s (min-max) | asyncio failed "
          "| asyncio / baseline |")
    print("|---|---|---|---|---|---|")
    for row in results:
        b, a = row["baseline"], row["asyncio"]
        print(f"| {row['clients']} | {b['median']:.0f} ({b['min']:.0f}-{b['max']:.0f}) | {b['failed']}/{b['requests']} "
              f"| {a['median']:.0f} ({a['min']:.0f}-{a['max']:.0f}) | {a['failed']}/{a['requests']} "
              f"| {row['ratio']:.2f}x |")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
