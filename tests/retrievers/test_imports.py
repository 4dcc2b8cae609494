"""``import trace_envs`` / ``import retrievers`` stay cheap: no torch, faiss, Java or bm25s."""

from __future__ import annotations

import subprocess
import sys


def test_imports_are_cheap() -> None:
    code = (
        "import sys, trace_envs, retrievers, trace_envs.wiki_search, trace_envs.tasks.wiki, retrievers.cli\n"
        "heavy = [m for m in ('torch', 'faiss', 'jnius', 'bm25s', 'sentence_transformers') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_retrievers_know_nothing_of_trace_envs() -> None:
    """Dependencies point one way: every retrievers module imports without trace_envs or trace_agent."""
    code = (
        "import sys, pkgutil, importlib, retrievers\n"
        "for m in pkgutil.iter_modules(retrievers.__path__):\n"
        "    if m.name not in ('__main__', 'dense', 'lucene', 'bm25'):\n"
        "        importlib.import_module('retrievers.' + m.name)\n"
        "import retrievers.cli as cli, argparse\n"
        "cli.build_parser().parse_args(['serve-retriever', '--index', 'x'])\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('trace_envs', 'trace_agent')]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
