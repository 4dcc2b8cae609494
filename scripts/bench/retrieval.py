"""Retrieval benchmark: bm25s vs Lucene vs faiss on the synthetic corpora.

For each corpus (the default synthetic encyclopedia, ~5.5k passages, and a
generated ~100k-passage one) and each backend, in a fresh subprocess (so
memory figures are per backend): build time, index size on disk, peak RSS,
queries/s single (``search`` in a loop) and batched (``batch_search``), and
recall of the gold supporting passages for the corpus's questions (question
text as the query, recall@5 and @20; per-hop entity queries, recall@3).
Ratios are printed against baselines measured in the same run: batched vs
single for each backend, and each backend vs bm25s.

    .venv/bin/python scripts/bench/retrieval.py                      # everything
    .venv/bin/python scripts/bench/retrieval.py --corpora default --backends bm25 lucene
    .venv/bin/python scripts/bench/retrieval.py --dense-max-docs 0   # dense on every corpus size

Dense encoding on a CPU is slow (tens of passages/s for all-MiniLM-L6-v2 on
2 cores), so by default dense runs only on corpora of at most
``--dense-max-docs`` passages.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

CORPORA = {
    "default": {},
    "100k": {"n_cities": 2000, "n_people": 28000, "n_orgs": 14000, "n_books": 16000},
}


def _dir_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _measure(corpus_name: str, backend: str, workdir: str, n_queries: int, queue: Any) -> None:
    """Runs in a fresh process: build, reload, query, recall. Puts a dict on ``queue``."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from retrievers.base import build_index, load_retriever
    from trace_envs.tasks.wiki import SyntheticWikiConfig, generate_encyclopedia

    enc = generate_encyclopedia(SyntheticWikiConfig(**CORPORA[corpus_name]))
    corpus = Path(workdir) / f"{corpus_name}.jsonl"
    out = Path(workdir) / f"{corpus_name}-{backend}"
    config: dict[str, Any] = {"lucene": {"threads": 2, "index_threads": 2}}.get(backend, {})
    start = time.perf_counter()
    build_index(corpus, out, kind=backend, **config)
    build_s = time.perf_counter() - start
    rss_build = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    start = time.perf_counter()
    r = load_retriever(out)
    load_s = time.perf_counter() - start
    tasks = list(enc.tasks.values())
    questions = [t.prompt for t in tasks]
    queries = (questions * (n_queries // len(questions) + 1))[:n_queries]
    r.batch_search(queries[:8], 10)  # warm-up
    n_single = min(len(queries), 200 if backend == "dense" else len(queries))
    start = time.perf_counter()
    for q in queries[:n_single]:
        r.search(q, 10)
    single_qps = n_single / (time.perf_counter() - start)
    start = time.perf_counter()
    for i in range(0, len(queries), 256):
        r.batch_search(queries[i:i + 256], 10)
    batch_qps = len(queries) / (time.perf_counter() - start)
    hits20 = r.batch_search(questions, 20)
    rec5 = rec20 = 0.0
    for t, hits in zip(tasks, hits20):
        gold = set(t.data["supporting_ids"])
        ids = [h.doc_id for h in hits]
        rec5 += len(gold & set(ids[:5])) / len(gold)
        rec20 += len(gold & set(ids)) / len(gold)
    hop_pairs = [(q, g) for t in tasks for q, g in zip(t.data["queries"], t.data["supporting_ids"])]
    hop_hits = r.batch_search([q for q, _ in hop_pairs], 3)
    hop3 = sum(g in [h.doc_id for h in hits] for (_, g), hits in zip(hop_pairs, hop_hits)) / len(hop_pairs)
    queue.put({
        "corpus": corpus_name, "backend": backend, "n_docs": len(r), "build_s": build_s, "load_s": load_s,
        "disk_mb": _dir_size(out) / 1e6, "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "build_rss_mb": rss_build, "single_qps": single_qps, "batch_qps": batch_qps,
        "recall5": rec5 / len(tasks), "recall20": rec20 / len(tasks), "hop_recall3": hop3,
    })


def _write_corpus(name: str, workdir: Path) -> int:
    from retrievers.corpus import iter_corpus, write_corpus
    from trace_envs.tasks.wiki import SyntheticWikiConfig, generate_encyclopedia

    enc = generate_encyclopedia(SyntheticWikiConfig(**CORPORA[name]))
    return write_corpus(iter_corpus(enc.passages), workdir / f"{name}.jsonl")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpora", nargs="+", choices=list(CORPORA), default=list(CORPORA))
    parser.add_argument("--backends", nargs="+", choices=["bm25", "lucene", "dense"], default=["bm25", "lucene", "dense"])
    parser.add_argument("--queries", type=int, default=1000, help="queries for the throughput runs")
    parser.add_argument("--dense-max-docs", type=int, default=10_000, help="skip dense above this size (0: never)")
    parser.add_argument("--json", default=None, help="also write the rows as JSON here")
    args = parser.parse_args(argv)

    workdir = Path(tempfile.mkdtemp(prefix="trace-gym-bench-"))
    ctx = mp.get_context("spawn")
    rows: list[dict[str, Any]] = []
    try:
        for name in args.corpora:
            n = _write_corpus(name, workdir)
            for backend in args.backends:
                if backend == "dense" and args.dense_max_docs and n > args.dense_max_docs:
                    print(f"[skip] dense on {name} ({n} passages > --dense-max-docs {args.dense_max_docs})", flush=True)
                    continue
                queue = ctx.Queue()
                proc = ctx.Process(target=_measure, args=(name, backend, str(workdir), args.queries, queue))
                proc.start()
                row = queue.get()
                proc.join()
                rows.append(row)
                print(f"[done] {name} {backend}: {json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()})}", flush=True)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    print()
    print(f"Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}")
    print()
    print("| corpus | backend | passages | build s | load s | disk MB | peak RSS MB | single q/s | batched q/s "
          "| batched/single | build vs bm25s | batched q/s vs bm25s | recall@5 | recall@20 | hop recall@3 |")
    print("|" + "---|" * 15)
    base = {r["corpus"]: r for r in rows if r["backend"] == "bm25"}
    for r in rows:
        b = base.get(r["corpus"])
        vs_build = f"{r['build_s'] / b['build_s']:.2f}x" if b else "-"
        vs_qps = f"{r['batch_qps'] / b['batch_qps']:.2f}x" if b else "-"
        print(f"| {r['corpus']} | {r['backend']} | {r['n_docs']:,} | {r['build_s']:.2f} | {r['load_s']:.2f} "
              f"| {r['disk_mb']:.1f} | {r['peak_rss_mb']:.0f} | {r['single_qps']:.0f} | {r['batch_qps']:.0f} "
              f"| {r['batch_qps'] / r['single_qps']:.2f}x | {vs_build} | {vs_qps} | {r['recall5']:.3f} "
              f"| {r['recall20']:.3f} | {r['hop_recall3']:.3f} |")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
