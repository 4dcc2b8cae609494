"""scripts/gpu_check.py (`make gpu-check`, :mod:`trace_agent.lab.gpu_check`) on a machine without CUDA: the table, the
exit code, and that the checks it would run with CUDA build every model from config and reach no network."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu_check.py"


@pytest.fixture(scope="module")
def gpu_check():
    from trace_agent.lab import gpu_check

    saved = dict(os.environ)
    try:
        yield gpu_check  # its main() sets the offline variables in os.environ
    finally:
        os.environ.clear()
        os.environ.update(saved)


def _rows(table: str) -> dict[str, list[str]]:
    rows = {}
    for line in table.strip().splitlines()[2:]:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        rows[cells[0]] = cells
    return rows


def test_without_cuda_every_row_is_skipped_and_the_exit_code_is_zero(gpu_check) -> None:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run([sys.executable, str(SCRIPT)], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = _rows(proc.stdout)
    assert list(rows) == list(gpu_check.CHECKS)
    assert all(cells[1] == "skipped: no CUDA device" for cells in rows.values()), proc.stdout
    assert proc.stdout.splitlines()[0].startswith("| check | status | seconds | throughput |")


@pytest.fixture
def no_network(monkeypatch):
    """Any TCP/UDP connection or hub download raises (local sockets, e.g. AF_UNIX pairs, still work)."""
    real_connect = socket.socket.connect

    def connect(self, address):
        if self.family in (socket.AF_INET, socket.AF_INET6):
            raise AssertionError(f"network access to {address}")
        return real_connect(self, address)

    def refuse(*args, **kwargs):
        raise AssertionError(f"hub download {args} {kwargs}")

    monkeypatch.setattr(socket.socket, "connect", connect)
    monkeypatch.setattr(socket, "create_connection", refuse)
    import huggingface_hub
    import huggingface_hub.file_download

    for module in (huggingface_hub, huggingface_hub.file_download):
        for name in ("hf_hub_download", "snapshot_download"):
            if hasattr(module, name):
                monkeypatch.setattr(module, name, refuse)


def test_the_transformers_checks_build_models_from_config_and_stay_offline(gpu_check, no_network, tmp_path) -> None:
    """What runs on CUDA, run on the CPU instead: every model is built here, nothing is fetched."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        rc = gpu_check.main(["--device", "cpu", "--quick", "--only", "hf-generate,trace-step,lm-critic",
                             "--json", str(tmp_path / "rows.json")])
    finally:
        torch.set_num_threads(threads)
    import json

    rows = {r["name"]: r for r in json.loads((tmp_path / "rows.json").read_text())}
    assert rc == 0, rows
    assert [rows[n]["status"] for n in ("hf-generate", "trace-step", "lm-critic")] == ["ok"] * 3, rows
    assert rows["hf-generate"]["figures"]["tokens_per_s"] > 0
    for key, value in gpu_check.OFFLINE_ENV.items():
        assert os.environ[key] == value


def test_with_cuda_present_every_child_runs_offline_and_the_budget_holds(gpu_check, monkeypatch) -> None:
    """With CUDA "present", the vLLM and verl children get the offline environment and the time that is left."""
    calls = []

    def run(cmd, **kwargs):
        calls.append((cmd, kwargs))
        if "-c" in cmd:  # the import probe
            return SimpleNamespace(returncode=0, stdout="", stderr="")
        if "--child" in cmd:
            out = Path(cmd[cmd.index("--child-out") + 1])
            names = cmd[cmd.index("--child") + 1].split(",")
            out.write_text(gpu_check.json.dumps([{"name": n, "status": "ok", "throughput": "1 tokens/s"}
                                                 for n in names]))
            return SimpleNamespace(returncode=0, stdout="", stderr="")
        return SimpleNamespace(returncode=0, stdout="", stderr="SKIPPED [1] test_verl_gpu_e2e.py:26: needs vllm\n"
                                                               "1 skipped in 1.0s")

    monkeypatch.setattr(gpu_check, "cuda_available", lambda: True)
    monkeypatch.setattr(gpu_check.subprocess, "run", run)
    rc = gpu_check.main(["--only", "vllm-engine,vllm-serve,verl-e2e", "--vllm-python", sys.executable,
                         "--verl-python", sys.executable, "--budget-s", "600"])
    assert rc == 0
    assert calls
    for cmd, kwargs in calls:
        env = kwargs["env"]
        assert all(env[k] == v for k, v in gpu_check.OFFLINE_ENV.items()), cmd
        assert str(ROOT) in env["PYTHONPATH"].split(os.pathsep)
        assert kwargs.get("timeout", 0) <= 600
    child = next(cmd for cmd, _ in calls if "--child" in cmd)
    assert child[child.index("--child") + 1] == "vllm-engine,vllm-serve"
    verl = next(cmd for cmd, _ in calls if "pytest" in cmd)
    assert verl[-2].endswith("test_verl_gpu_e2e.py")




def test_a_child_without_a_cuda_vllm_skips_with_the_reason(gpu_check, tmp_path) -> None:
    out = tmp_path / "rows.json"
    assert gpu_check.main(["--child", "vllm-engine,vllm-async", "--child-out", str(out)]) == 0
    rows = gpu_check.json.loads(out.read_text())
    assert [r["name"] for r in rows] == ["vllm-engine", "vllm-async"]
    assert all(r["status"].startswith("skipped: ") for r in rows)


def test_pytest_outcomes_are_read_from_the_summary(gpu_check) -> None:
    assert gpu_check._pytest_outcome("x\n1 passed in 300.0s\n", 0)[0] == "ok"
    status, _ = gpu_check._pytest_outcome("SKIPPED [1] t.py:26: needs a CUDA device\n1 skipped in 1s\n", 0)
    assert status == "skipped: needs a CUDA device"
    assert gpu_check._pytest_outcome("E assert 1 == 0\n1 failed in 9s\n", 1)[0] == "failed: pytest exited 1"


def test_unknown_checks_are_refused(gpu_check) -> None:
    with pytest.raises(SystemExit):
        gpu_check.main(["--only", "hf-generate,warp-drive"])
