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
