"""Retrieval-server fairness: a small query beside another client's maximum-size requests, cost-bounded batches vs not.

Two servers over the same bm25s index (the default synthetic encyclopedia, 5,484
passages), measured in the same run: ``fair`` has the default ``max_batch_cost``
(batches bounded in estimated cost), ``baseline`` the same server with
``max_batch_cost`` unbounded (batches of up to ``max_batch`` queries whatever their
size; both fill batches by deficit round-robin across clients). Scenario, per
repeat: client 127.0.0.2 sends one maximum-size request alone (1,024 queries of
~3,900 characters of corpus words, ``topk`` 100: its time is ``one large``), then
three at once; once the server holds them, client 127.0.0.3 sends one ordinary
query (``topk`` 3) and its latency is ``small``. Also reported: the time one client
takes for 2,048 ordinary queries in 16 requests (the price of smaller batches, if any).

    .venv/bin/python scripts/bench/retrieval_fairness.py
    .venv/bin/python scripts/bench/retrieval_fairness.py --repeats 5
"""

from __future__ import annotations

import argparse
import http.client
import itertools
import json
import re
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1].parent
sys.path.insert(0, str(ROOT))

from retrievers.server import RetrievalServer, ServerConfig  # noqa: E402

HOSTILE, INNOCENT = "127.0.0.2", "127.0.0.3"


def _post(url: str, body: dict, source: str, timeout: float = 300) -> float:
    """Seconds one request from ``source`` takes to be answered (200 asserted)."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    start = time.perf_counter()
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout, source_address=(source, 0))
    try:
        conn.request("POST", "/retrieve", json.dumps(body).encode(), {"Content-Type": "application/json"})
        response = conn.getresponse()
        response.read()
        assert response.status == 200, response.status
    finally:
        conn.close()
    return time.perf_counter() - start


def _scenario(server: RetrievalServer, large: dict, small: dict, ordinary: list[str]) -> dict[str, float]:
    one_large = _post(server.url, large, HOSTILE)
    before = server.batcher.submitted_queries
    threads = [threading.Thread(target=_post, args=(server.url, large, HOSTILE)) for _ in range(3)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 60
    while server.batcher.submitted_queries - before < 3 * len(large["queries"]) and time.monotonic() < deadline:
        time.sleep(0.01)
    small_s = _post(server.url, small, INNOCENT)
    for t in threads:
        t.join()
    start = time.perf_counter()
    for chunk in range(0, len(ordinary), 128):
        _post(server.url, {"queries": ordinary[chunk:chunk + 128], "topk": 3}, INNOCENT)
    return {"one_large_s": one_large, "small_s": small_s, "ordinary_s": time.perf_counter() - start}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
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
    fair = ServerConfig(port=0)
    words = dict.fromkeys(w for p in enc.passages[:200] for w in re.findall(r"[a-z]{4,}", p["text"].lower()))
    text = " ".join(itertools.islice(itertools.cycle(words), 2000))
    large = {"queries": [f"{i} {text}"[:3900] for i in range(fair.max_queries)], "topk": fair.max_topk}
    prompts = [t.prompt for t in enc.tasks.values()]
    small = {"queries": [prompts[0]], "topk": 3}
    ordinary = list(itertools.islice(itertools.cycle(prompts), 2048))
    configs = {"baseline": ServerConfig(port=0, max_batch_cost=1e12), "fair": fair}
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in configs}
    for _ in range(args.repeats):
        for name, config in configs.items():  # interleaved, so that load drift hits both alike
            with RetrievalServer(retriever, config) as server:
                runs[name].append(_scenario(server, large, small, ordinary))
    med = {name: {key: statistics.median(r[key] for r in rows) for key in rows[0]} for name, rows in runs.items()}
    print(f"{args.repeats} repeats, medians; maximum-size request: {len(large['queries'])} queries x "
          f"{len(large['queries'][0])} chars, topk {large['topk']}")
    print("| | baseline (batches by count) | fair (batches by cost) | fair / baseline |")
    print("|---|---|---|---|")
    for key, label in (("one_large_s", "one maximum-size request alone, s"),
                       ("small_s", "small query beside 3 of them, s"),
                       ("ordinary_s", "2,048 ordinary queries, one client, s")):
        print(f"| {label} | {med['baseline'][key]:.3f} | {med['fair'][key]:.3f} | "
              f"{med['fair'][key] / med['baseline'][key]:.2f}x |")
    print(f"| small / one large | {med['baseline']['small_s'] / med['baseline']['one_large_s']:.2f} | "
          f"{med['fair']['small_s'] / med['fair']['one_large_s']:.2f} | |")
    if args.json:
        Path(args.json).write_text(json.dumps({"runs": runs, "medians": med}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
