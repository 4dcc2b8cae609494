"""``trace-gym index synthetic``: build (or find) WikiQA's default synthetic corpus and bm25s index.

``retrievers`` knows nothing of ``trace_envs``; this module adds the
WikiQA-specific ``index`` subcommand to the generic ones of
:mod:`retrievers.cli` (``trace-gym`` uses :func:`add_index_parser`)::

    trace-gym index synthetic --out idx/synthetic    # corpus.jsonl, tasks and bm25/ copied to idx/synthetic
"""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["add_index_parser", "add_synthetic_command"]


def _cmd_synthetic(args: argparse.Namespace) -> int:
    import shutil

    from trace_envs.tasks.wiki import SyntheticWikiConfig, default_wiki_index

    index = default_wiki_index(SyntheticWikiConfig(seed=args.seed), cache_dir=args.cache_dir)
    if args.out:
        shutil.copytree(index.parent, args.out, dirs_exist_ok=True)
        print(f"synthetic corpus, tasks and bm25s index -> {args.out}")
    else:
        print(index.parent)
    return 0


def add_synthetic_command(index_subparsers: Any) -> argparse.ArgumentParser:
    """Add ``synthetic`` to the subparsers object of an ``index`` command."""
    syn = index_subparsers.add_parser("synthetic", help="build (or find) the default synthetic WikiQA corpus and index")
    syn.add_argument("--seed", type=int, default=0)
    syn.add_argument("--cache-dir", default=None, help="default: $TRACE_GYM_CACHE or ~/.cache/trace-gym")
    syn.add_argument("--out", default=None, help="also copy corpus, tasks and index here")
    syn.set_defaults(func=_cmd_synthetic)
    return syn


def add_index_parser(subparsers: Any) -> argparse.ArgumentParser:
    """``index {build,wrap-lucene,info}`` from :mod:`retrievers.cli` plus ``index synthetic``."""
    from retrievers.cli import add_index_parser as add_generic

    return add_generic(subparsers, extra_commands=(add_synthetic_command,))
