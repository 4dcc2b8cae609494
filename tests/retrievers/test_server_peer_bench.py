"""scripts/bench/retrieval_server_peer.py in its --small mode: every scenario runs and the table has every server."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

ROOT = Path(__file__).resolve().parents[2]
SERVERS = ("ours", "uvicorn", "uvicorn+batcher")


@pytest.mark.slow  # 40 s: three servers' scenarios; the servers' own behaviour is tested in test_server_*.py
def test_the_peer_bench_prints_every_scenario_for_every_server() -> None:
    try:
        with socket.socket() as s:
            s.bind(("127.0.0.2", 0))
    except OSError:
        pytest.skip("this host cannot bind 127.0.0.2 (Linux routes all of 127/8 to loopback)")
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench" / "retrieval_server_peer.py"), "--small"],
                          capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [line for line in done.stdout.splitlines() if line.startswith("|")]
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    assert header[2:5] == list(SERVERS) and header[5:] == ["uvicorn / ours", "uvicorn+batcher / ours"]
    rows = {}
    scenario = ""
    for line in lines[2:]:
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        scenario = cells[0] or scenario
        rows[(scenario.split(" (")[0], cells[1])] = dict(zip(SERVERS, cells[2:5]))
    metrics = {metric for _, metric in rows}
    for metric in ("requests/s", "p50 latency ms", "p99 latency ms", "innocent client's answers",
                   "new clients' answers", "conns cut off by the server", "the small request's latency, ms",
                   "status"):
        assert metric in metrics, (metric, sorted(metrics))
    for values in rows.values():
        assert all(values[k] not in ("", "-") for k in SERVERS), values
    assert float(rows[("4 clients x 3 requests", "requests/s")]["ours"].replace(",", "")) > 0
    schema = next(v for (s, m), v in rows.items() if s.startswith("schema error") and m == "status")
    assert schema == {"ours": "422", "uvicorn": "422", "uvicorn+batcher": "422"}
    ours_answers = next(v["ours"] for (s, m), v in rows.items() if m == "new clients' answers")
    assert ours_answers.startswith("200"), "our server answers a new client under RLIMIT_NOFILE 256"
