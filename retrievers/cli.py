"""Command line: ``trace-gym index ...`` and ``trace-gym serve-retriever`` (also ``python -m retrievers``).

``add_index_parser(subparsers)`` and ``add_serve_parser(subparsers)`` add the
subcommands to any argparse parser; each sets ``func`` (``args -> exit code``).
This package knows nothing of its clients: a client adds its own ``index``
subcommands through ``add_index_parser(..., extra_commands=...)`` (``trace-gym``
adds ``index synthetic``, the WikiQA corpus, from :mod:`trace_envs.wiki_search.cli`)::

    trace-gym index build --corpus wiki.jsonl --kind bm25 --out idx/bm25
    trace-gym index build --corpus wiki.jsonl --kind dense --model intfloat/e5-base-v2 --index-type ivf --out idx/e5
    trace-gym index wrap-lucene --lucene-index wiki-18-bm25/ --corpus wiki-18.jsonl --out idx/wiki18
    trace-gym index synthetic --out idx/synthetic           # trace-gym only: the WikiQA corpus + bm25s index
    trace-gym index info idx/bm25
    trace-gym serve-retriever --index idx/bm25 --port 8000
    trace-gym serve-retriever --index idx/bm25 --document-format search-r1-bm25
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["add_index_parser", "add_serve_parser", "build_parser", "main"]


def _cmd_build(args: argparse.Namespace) -> int:
    from retrievers.base import build_index

    config: dict[str, Any] = {}
    if args.kind == "bm25":
        config.update(k1=args.k1, b=args.b, mmap=args.mmap)
    elif args.kind == "lucene":
        config.update(k1=args.k1, b=args.b, index_threads=args.threads, threads=max(1, args.threads))
    else:
        config.update(model=args.model, index=args.index_type, batch_size=args.batch_size)
        if args.query_prefix is not None:
            config["query_prefix"] = args.query_prefix
        if args.passage_prefix is not None:
            config["passage_prefix"] = args.passage_prefix
        if args.device:
            config["device"] = args.device
    start = time.perf_counter()
    retriever = build_index(args.corpus, args.out, kind=args.kind, progress=True, overwrite=args.overwrite, **config)
    print(f"built {retriever!r} in {time.perf_counter() - start:.1f}s -> {args.out}")
    return 0


def _cmd_wrap(args: argparse.Namespace) -> int:
    from retrievers.lucene import LuceneRetriever

    retriever = LuceneRetriever.wrap(args.lucene_index, args.out, corpus=args.corpus, progress=True,
                                     overwrite=args.overwrite, threads=args.threads)
    print(f"wrapped {retriever.index_path} ({len(retriever)} docs) -> {args.out}")
    return 0


def _cmd_info(args: argparse.Namespace) -> int:
    from retrievers.base import read_manifest

    print(json.dumps(read_manifest(args.index), indent=2, sort_keys=True))
    return 0


def _cmd_serve(args: argparse.Namespace) -> int:
    from retrievers.base import load_retriever
    from retrievers.server import RetrievalServer, ServerConfig

    retriever = load_retriever(args.index)
    config = ServerConfig(host=args.host, port=args.port, default_topk=args.topk, max_batch=args.max_batch,
                          batch_window_ms=args.batch_window_ms, document_format=args.document_format,
                          read_timeout_s=args.read_timeout, verbose=args.verbose,
                          max_batch_cost=args.max_batch_cost, max_connections=args.max_connections,
                          max_connections_per_client=args.max_connections_per_client,
                          idle_timeout_s=args.idle_timeout)
    server = RetrievalServer(retriever, config)
    print(f"serving {retriever!r} at {server.url}/retrieve (Search-R1 and SkyRL request formats); Ctrl-C to stop",
          flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


def add_index_parser(subparsers: Any, *, extra_commands: Sequence[Callable[[Any], Any]] = ()) -> argparse.ArgumentParser:
    """Add ``index {build,wrap-lucene,info}`` to an argparse subparsers object.

    Each of ``extra_commands`` is called with the ``index`` subparsers object and
    adds one more ``index`` subcommand (setting ``func`` on it).
    """
    index = subparsers.add_parser("index", help="build and inspect retriever indexes")
    sub = index.add_subparsers(dest="index_command", required=True)

    build = sub.add_parser("build", help="index a JSONL corpus ({id,title,text} or wiki-18 {id,contents})")
    build.add_argument("--corpus", required=True, help="JSONL corpus (optionally .gz)")
    build.add_argument("--kind", choices=["bm25", "lucene", "dense"], default="bm25")
    build.add_argument("--out", required=True, help="index directory (created)")
    build.add_argument("--overwrite", action="store_true", help="replace an existing index in --out")
    build.add_argument("--k1", type=float, default=0.9, help="BM25 k1 (bm25, lucene)")
    build.add_argument("--b", type=float, default=0.4, help="BM25 b (bm25, lucene)")
    build.add_argument("--mmap", action="store_true", help="bm25: memory-map the index when loading")
    build.add_argument("--threads", type=int, default=0, help="lucene: indexing threads (0: all cores)")
    build.add_argument("--model", default="default", help="dense: sentence-transformers name or path")
    build.add_argument("--index-type", choices=["flat", "hnsw", "ivf"], default="flat", help="dense: faiss index")
    build.add_argument("--query-prefix", default=None, help='dense: e.g. "query: " (default: e5 prefixes for e5)')
    build.add_argument("--passage-prefix", default=None, help='dense: e.g. "passage: "')
    build.add_argument("--batch-size", type=int, default=64, help="dense: encoder batch size")
    build.add_argument("--device", default=None, help="dense: torch device (default: cuda if available)")
    build.set_defaults(func=_cmd_build)

    wrap = sub.add_parser("wrap-lucene", help="use an existing Lucene index (e.g. Search-R1 wiki-18 BM25) as is")
    wrap.add_argument("--lucene-index", required=True)
    wrap.add_argument("--out", required=True)
    wrap.add_argument("--corpus", default=None, help="the JSONL the index was built from (for titles/texts)")
    wrap.add_argument("--threads", type=int, default=1, help="search threads for batches")
    wrap.add_argument("--overwrite", action="store_true")
    wrap.set_defaults(func=_cmd_wrap)

    info = sub.add_parser("info", help="print an index's manifest")
    info.add_argument("index")
    info.set_defaults(func=_cmd_info)
    for add in extra_commands:
        add(sub)
    return index


def add_serve_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``serve-retriever`` to an argparse subparsers object."""
    from retrievers.server import ServerConfig

    default = ServerConfig()
    serve = subparsers.add_parser("serve-retriever", help="serve an index over HTTP (Search-R1's POST /retrieve)")
    serve.add_argument("--index", required=True, help="index directory (any kind)")
    serve.add_argument("--host", default=default.host, help="0.0.0.0 to listen on every interface (default: %(default)s)")
    serve.add_argument("--port", type=int, default=default.port)
    serve.add_argument("--topk", type=int, default=default.default_topk, help="topk when a request omits it")
    serve.add_argument("--max-batch", type=int, default=default.max_batch,
                       help="queries per batched search (default: %(default)s)")
    serve.add_argument("--batch-window-ms", type=float, default=default.batch_window_ms,
                       help="wait for more requests to batch")
    serve.add_argument("--document-format", choices=["corpus", "search-r1-bm25"], default="corpus",
                       help='documents as {"id","contents"} (corpus rows) or {"title","text","contents"} '
                            "(Search-R1's BM25 server)")
    serve.add_argument("--read-timeout", type=float, default=default.read_timeout_s,
                       help="seconds a request may take to arrive (stalled clients are cut off)")
    serve.add_argument("--max-batch-cost", type=float, default=default.max_batch_cost,
                       help="estimated work per batched search (a query costs 1 + topk/16 + chars/512), so that "
                            "large queries make smaller batches (default: %(default)s)")
    serve.add_argument("--max-connections", type=int, default=default.max_connections,
                       help="open connections in all, lowered to what the fd limit allows; at the cap a client "
                            "holding fewer than the largest holder takes that holder's longest-idle connection "
                            "(default: %(default)s)")
    serve.add_argument("--max-connections-per-client", type=int, default=default.max_connections_per_client,
                       help="open connections from one peer IP address; more get a 503 while other addresses are "
                            "served (default: an eighth of --max-connections). Behind a reverse proxy every "
                            "client is the proxy's address")
    serve.add_argument("--idle-timeout", type=float, default=default.idle_timeout_s,
                       help="seconds a connection may stay open without a request (default: %(default)s)")
    serve.add_argument("--verbose", action="store_true", help="log every request")
    serve.set_defaults(func=_cmd_serve)
    return serve


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m retrievers", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    add_index_parser(sub)
    add_serve_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m retrievers``; returns the exit code (errors print one line, code 2)."""
    from retrievers.base import RetrieverError

    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except (RetrieverError, FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
