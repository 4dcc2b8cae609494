"""Broken tool-backend workers are loud: BFCL-v0's backend worker that cannot start (a real worker
process under an address-space cap too small for Python) raises EnvSetupError at reset and flags
``info["backend_error"]`` mid-run; trace_envs.health checks each env's backend before a run."""

from __future__ import annotations

import os
import signal

import pytest

from trace_envs.errors import EnvSetupError
from trace_envs.health import check_backend

#: An address-space cap no Python interpreter starts under (the worker dies before it is ready).
TOO_SMALL = 8 << 20


def test_the_math_grading_worker_is_checked() -> None:
    assert "grading worker" in check_backend("trace_envs/PythonMath-v0")


def test_a_retrieval_server_on_a_dead_port_is_refused() -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(EnvSetupError, match=f"http://127.0.0.1:{port}/retrieve"):
        check_backend("trace_envs/WikiQA-v0", {"retriever": f"http://127.0.0.1:{port}"})


@pytest.fixture()
def bfcl(monkeypatch: pytest.MonkeyPatch):
    pytest.importorskip("bfcl_eval", reason="BFCL-v0 needs bfcl-eval (pip install --no-deps bfcl-eval mpmath)")
    from trace_envs.function_calling import BFCLEnv

    env = BFCLEnv(category="multi_turn_base")
    yield env
    env.close()


def test_a_bfcl_worker_that_cannot_start_fails_reset_and_preflight(bfcl, monkeypatch: pytest.MonkeyPatch) -> None:
    from trace_envs.function_calling import remote

    assert "BFCL backend worker starts" in check_backend("trace_envs/BFCL-v0")
    monkeypatch.setattr(remote, "MEMORY_LIMIT_BYTES", TOO_SMALL)
    with pytest.raises(EnvSetupError, match=r"BFCL-v0's backend worker \(python -I -m trace_envs"):
        bfcl.reset(options={"task_id": "multi_turn_base_0"})
    with pytest.raises(EnvSetupError, match="does not start"):
        check_backend("trace_envs/BFCL-v0")
    monkeypatch.undo()
    bfcl.reset(options={"task_id": "multi_turn_base_0"})  # the env is usable once the backend is


def test_a_bfcl_worker_that_dies_and_cannot_restart_flags_the_turn(bfcl, monkeypatch: pytest.MonkeyPatch) -> None:
    from trace_envs.function_calling import remote

    bfcl.reset(options={"task_id": "multi_turn_base_0"})
    _, _, _, _, info = bfcl.step("[mkdir(dir_name='kept')]")
    assert info["backend_error"] is False and "trace_envs.function_calling._backend_worker" in info["backend"]
    monkeypatch.setattr(remote, "MEMORY_LIMIT_BYTES", TOO_SMALL)
    os.kill(bfcl._backends._worker.proc.pid, signal.SIGKILL)  # noqa: SLF001
    obs, reward, terminated, _, info = bfcl.step("[ls()]")
    assert "could not be rebuilt" in obs and info["backend_error"] is True
    assert reward == 0.0 and not terminated, "an error observation; the episode goes on"
    with pytest.raises(EnvSetupError, match="cannot load task"):
        bfcl.reset(options={"task_id": "multi_turn_base_0"})
    monkeypatch.undo()
    bfcl.reset(options={"task_id": "multi_turn_base_0"})
    _, _, _, _, info = bfcl.step("[ls()]")
    assert info["backend_error"] is False
