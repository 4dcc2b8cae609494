"""A broken search backend is an error, never a quiet result: a dead port at gym.make, a retrieval
server killed mid-run (a real `python -m retrievers serve-retriever` process), the run-level counter."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import gymnasium as gym
import pytest

import trace_envs  # noqa: F401  (registers the suite)
from retrievers.http import HTTPRetriever
from trace_agent.backend_watch import BackendFailureError, watch_backend
from trace_envs.actions import format_tool_call
from trace_envs.errors import EnvSetupError

ROOT = Path(__file__).resolve().parents[2]
WIKI = "trace_envs/WikiQA-v0"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A real retrieval server process on a free port."""

    def __init__(self, index_dir: Path) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "retrievers", "serve-retriever", "--index", str(index_dir), "--port",
             str(self.port)], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        body = json.dumps({"queries": ["city"], "topk": 1}).encode()
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(urllib.request.Request(self.url + "/retrieve", data=body), timeout=5):
                    return
            except OSError:
                assert self.proc.poll() is None and time.monotonic() < deadline, "server did not come up"
                time.sleep(0.2)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)


@pytest.fixture()
def server(bm25_index) -> Iterator[Server]:
    srv = Server(bm25_index.directory)
    try:
        yield srv
    finally:
        srv.kill()


def _search(query: str = "city river") -> str:
    return format_tool_call("search", {"query": query})


def test_a_dead_port_fails_at_gym_make_naming_the_url(small_enc) -> None:
    url = f"http://127.0.0.1:{_free_port()}"
    t0 = time.monotonic()
    with pytest.raises(EnvSetupError, match=f"retrieval server {url}/retrieve"):
        gym.make(WIKI, retriever=url, tasks=small_enc.tasks)
    assert time.monotonic() - t0 < 5, "a refused connection is not retried at make"
    with pytest.raises(EnvSetupError, match="serve-retriever"):
        gym.make(WIKI, retriever=HTTPRetriever(url, retries=0), tasks=small_enc.tasks)


def test_a_server_killed_mid_run_flags_each_turn_and_reset_refuses(server: Server, small_enc) -> None:
    env = gym.make(WIKI, retriever=HTTPRetriever(server.url, retries=0, timeout=5), tasks=small_enc.tasks)
    env.reset(seed=0)
    obs, _, _, _, info = env.step(_search())
    assert not obs.startswith("Error") and info["backend_error"] is False
    assert info["backend"] == f"retrieval server {server.url}/retrieve"
    _, _, _, _, info = env.step("<answer>x</answer>")
    assert "backend_error" not in info, "a turn that asks no backend carries no flag"
    env.reset(seed=1)
    server.kill()
    obs, reward, terminated, truncated, info = env.step(_search())
    assert obs.startswith("Error: the search backend failed") and server.url in obs
    assert info["backend_error"] is True and server.url in info["backend"]
    assert reward == 0.0 and not terminated and not truncated, "the episode goes on with an error observation"
    with pytest.raises(EnvSetupError, match=f"{server.url}/retrieve"):
        env.reset(seed=2)
    env.close()


def test_consecutive_failures_end_the_run_naming_the_backend(server: Server, small_enc) -> None:
    def make():
        return gym.make(WIKI, retriever=HTTPRetriever(server.url, retries=0, timeout=5),
                        tasks=small_enc.tasks).unwrapped

    factory = watch_backend(make, limit=3)
    a, b = factory(), factory()
    a.reset(seed=0)
    b.reset(seed=0)
    a.step(_search())
    assert factory.counter.failures == 0
    server.kill()
    a.step(_search())
    b.step(_search())  # two failures in a row, across the factory's envs
    assert factory.counter.failures == 2
    a.step("<answer>x</answer>")  # no backend call: the count stands
    with pytest.raises(BackendFailureError, match=rf"retrieval server {server.url}/retrieve failed on 3 tool calls "
                                                  r"in a row \(max_backend_failures=3\)"):
        b.step(_search())
    assert factory.counter.total == 3


def test_an_answered_call_resets_the_count(server: Server, small_enc, bm25_index) -> None:
    factory = watch_backend(lambda: gym.make(WIKI, retriever=HTTPRetriever(server.url, retries=0, timeout=5),
                                             tasks=small_enc.tasks).unwrapped, limit=2)
    env = factory()
    env.reset(seed=0)
    server.kill()
    env.step(_search())
    assert factory.counter.failures == 1
    again = Server(bm25_index.directory)
    try:
        env.unwrapped.retriever = HTTPRetriever(again.url, retries=0, timeout=5)
        _, _, _, _, info = env.step(_search())
        assert info["backend_error"] is False and factory.counter.failures == 0
        again.kill()
        env.step(_search())
        assert factory.counter.failures == 1, "one failure after an answer is not the limit"
    finally:
        again.kill()


def test_eval_and_preflight_refuse_a_dead_server(tmp_path: Path, capsys) -> None:
    from trace_agent.cli import main

    url = f"http://127.0.0.1:{_free_port()}"
    common = ["--env", WIKI, "--policy", "tiny", "--set", f"env_kwargs={{retriever: {url}}}"]
    assert main(["eval", *common, "--tasks", "1", "--samples", "1"]) == 1
    err = capsys.readouterr().err
    assert f"retrieval server {url}/retrieve" in err and err.count("\n") == 1
    assert main(["train", *common, "--out", str(tmp_path / "run"), "--preflight"]) != 0
    out = capsys.readouterr()
    assert f"FAIL  WikiQA-v0's retrieval server {url}/retrieve does not work" in out.out + out.err


class SearchingPolicy:
    """A Policy whose every turn is one search; it kills the retrieval server at its second call (its
    first turn's searches were answered)."""

    stop_token_ids = (256,)

    def __init__(self, on_second_call) -> None:
        self.on_second_call = on_second_call
        self.calls = 0

    def render(self, messages, tools=None):
        from trace_agent.policy.base import TokenContext

        return TokenContext.from_prompt(list(b"prompt"))

    def decode(self, token_ids) -> str:
        return bytes(t for t in token_ids if t < 256).decode()

    def generate(self, contexts, sampling=None, *, seeds=None, sessions=None):
        from trace_agent.policy.base import Generation

        self.calls += 1
        if self.calls == 2:
            self.on_second_call()
        ids = (*_search().encode(), 256)
        return [Generation(token_ids=ids, logprobs=tuple(-0.5 for _ in ids), text=_search(), finish_reason="stop")
                for _ in contexts]

    def extend(self, context, generation, observation):
        return context.append(generation.token_ids, generated=True, logprobs=generation.logprobs) \
            .append([10], generated=False)

    def logprobs(self, contexts, targets, *, temperature=1.0):
        return [tuple(-0.5 for _ in t) for t in targets]


def test_the_collector_stops_a_run_whose_search_server_died(server: Server, small_enc) -> None:
    """Trees are never grown from error messages: the collection ends with an error naming the server
    (from the failure counter, the next reset's check or the check of an env the engine makes later)."""
    from trace_agent.predictor import EmbeddingPredictor, HashedNGramFeaturizer
    from trace_agent.rollout import PromptSpec, RolloutConfig, TreeCollector
    from trace_agent.strategies import GRPO, Budget

    def make():
        return gym.make(WIKI, retriever=HTTPRetriever(server.url, retries=0, timeout=5), tasks=small_enc.tasks,
                        max_turns=8).unwrapped

    prompts = [PromptSpec(task_id=list(small_enc.tasks.ids())[0])]
    with TreeCollector(make_env=watch_backend(make, limit=2), policy=SearchingPolicy(server.kill),
                       predictor=EmbeddingPredictor(HashedNGramFeaturizer(dim=16)),
                       config=RolloutConfig(workers=1, seed=0)) as collector:
        with pytest.raises((EnvSetupError, BackendFailureError, RuntimeError),
                           match=rf"retrieval server {server.url}/retrieve"):
            collector.collect(prompts, GRPO(), Budget(roots=4, continuations_per_root=0, group_size=4), seed=0)
