"""The CLI: index build / info / synthetic, and serve-retriever answering a real client."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from retrievers import load_retriever
from retrievers.cli import main

ROOT = Path(__file__).resolve().parents[2]


def test_index_build_info_and_errors(small_corpus: Path, tmp_path: Path, capsys) -> None:
    assert main(["index", "build", "--corpus", str(small_corpus), "--kind", "bm25", "--out", str(tmp_path / "i")]) == 0
    assert "built BM25Retriever" in capsys.readouterr().out
    assert load_retriever(tmp_path / "i").search("city", 1)
    assert main(["index", "info", str(tmp_path / "i")]) == 0
    assert json.loads(capsys.readouterr().out)["kind"] == "bm25"
    assert main(["index", "build", "--corpus", str(small_corpus), "--out", str(tmp_path / "i")]) == 2
    assert "already holds an index" in capsys.readouterr().err
    assert main(["index", "build", "--corpus", str(tmp_path / "missing.jsonl"), "--out", str(tmp_path / "j")]) == 2


def test_index_synthetic_is_a_trace_gym_command(tmp_path: Path, capsys) -> None:
    """``trace-gym index synthetic`` comes from trace_envs; ``retrievers`` alone does not know it."""
    from trace_agent.cli import main as trace_gym

    out = tmp_path / "syn"
    assert trace_gym(["index", "synthetic", "--cache-dir", str(tmp_path / "cache"), "--out", str(out)]) == 0
    assert (out / "corpus.jsonl").is_file() and (out / "bm25" / "retriever.json").is_file()
    with pytest.raises(SystemExit):
        main(["index", "synthetic"])
    assert "invalid choice" in capsys.readouterr().err


def test_serve_retriever_subprocess(bm25_index, tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "retrievers", "serve-retriever", "--index", str(bm25_index.directory),
         "--port", str(port)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        body = json.dumps({"queries": ["city river"], "topk": 2, "return_scores": True}).encode()
        deadline = time.monotonic() + 30
        while True:
            try:
                request = urllib.request.Request(f"http://127.0.0.1:{port}/retrieve", data=body)
                with urllib.request.urlopen(request, timeout=5) as response:
                    result = json.loads(response.read())["result"]
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, "server did not come up"
                time.sleep(0.2)
        assert len(result) == 1 and len(result[0]) == 2 and "contents" in result[0][0]["document"]
    finally:
        proc.terminate()
        proc.wait(timeout=10)
