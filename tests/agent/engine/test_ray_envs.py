"""The Ray backend on a real local cluster: env actors own their envs; same trees as the local backend.

Real parts only: ``ray.init(num_cpus=2)`` (token authentication on, a per-process token, nothing
under ~/.ray), 2 env actors, real PythonMath-v0 sandboxes and WikiQA-v0's real BM25 retriever.
A killed actor mid-collection is replaced and its prompts regrown: same trees, no hang.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

ray = pytest.importorskip("ray")

import trace_envs  # noqa: E402, F401
from trace_agent.engine.base import EnvWorkerError  # noqa: E402
from trace_agent.engine.ray_envs import RayConfig, RayEnvHost, ensure_ray, shutdown_ray  # noqa: E402
from trace_agent.env_factory import make_env_factory  # noqa: E402
from trace_agent.rollout import PromptSpec, RolloutConfig, TreeCollector  # noqa: E402
from trace_agent.strategies import GRPO, TRACE, Budget, TreePO  # noqa: E402

from ..test_rollout import ScriptedPolicy, _check_budget  # noqa: E402
from .test_engine import _dump, _HoldingAsync, _predictor, _slow_scripted  # noqa: E402

MATH_ENV = make_env_factory("trace_envs/PythonMath-v0", "train", max_turns=3)
WIKI_ENV = make_env_factory("trace_envs/WikiQA-v0", "default", max_turns=3)


@pytest.fixture(scope="module")
def cluster():
    """One local cluster for the module (2 CPUs, a small object store); shut down afterwards.

    Started with a SIGTERM handler of the test's own installed (as a training run's stop handler
    is): ``ray.init`` replaces it by one that calls ``sys.exit``, :func:`ensure_ray` must put it back.
    """
    had = ray.is_initialized()
    sigterm = signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, _own_sigterm)
    try:
        started = ensure_ray(RayConfig(cluster_cpus=2, object_store_mb=128))
        after_init = signal.getsignal(signal.SIGTERM)
    finally:
        signal.signal(signal.SIGTERM, sigterm)
    yield {"started": started, "home_token": os.path.expanduser("~/.ray/auth_token"), "sigterm_after_init": after_init}
    if started and not had:
        shutdown_ray()
        signal.signal(signal.SIGTERM, sigterm)


def _own_sigterm(signum: int, frame: Any) -> None:  # pragma: no cover - never delivered
    raise AssertionError("the test's own SIGTERM handler was called")


def test_ray_init_keeps_the_process_sigterm_handler(cluster) -> None:
    """A run's stop handler survives ``ray.init``: a SIGTERM stops training at a step boundary, not by sys.exit."""
    if not cluster["started"]:
        pytest.skip("Ray was already initialised in this process by another test module")
    assert cluster["sigterm_after_init"] is _own_sigterm


@pytest.mark.slow
def test_shutdown_ray_puts_back_the_default_sigterm_action() -> None:
    """Where SIGTERM had its default action, Ray's handler is kept while its cluster is up and removed after
    (a process of its own: its own cluster, started and shut down)."""
    import subprocess
    import sys

    code = (
        "import signal\n"
        "from trace_agent.engine.ray_envs import RayConfig, ensure_ray, shutdown_ray\n"
        "assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL\n"
        "assert ensure_ray(RayConfig(cluster_cpus=1, object_store_mb=80))\n"
        "up = signal.getsignal(signal.SIGTERM)\n"
        "shutdown_ray()\n"
        "print(up is not signal.SIG_DFL and callable(up), signal.getsignal(signal.SIGTERM) is signal.SIG_DFL)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         cwd=str(Path(__file__).resolve().parents[3]))
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "True True"


def _config(backend: str, **kw: Any) -> RolloutConfig:
    return RolloutConfig(seed=1, workers=2, concurrent_prompts=4, max_batch_size=8, backend=backend,
                         ray=RayConfig(workers=2, num_cpus_per_worker=0.5, call_timeout_s=120), **kw)


def _collect(make_env, policy, prompts, strategy, budget, backend, *, seed=3, **kw):
    with TreeCollector(make_env=make_env, policy=policy, predictor=_predictor(),
                       config=_config(backend, **kw)) as collector:
        batch = collector.collect(prompts, strategy, budget, seed=seed)
        stats = collector.env_host().worker_stats() if backend == "ray" else []
    return batch, stats


def test_ray_cluster_keeps_token_auth_without_writing_home(cluster) -> None:
    if not cluster["started"]:
        pytest.skip("Ray was initialised before this module")
    token = os.environ.get("RAY_AUTH_TOKEN", "")
    assert os.environ.get("RAY_AUTH_MODE") == "token" and len(token) >= 32  # Ray's default (auth on) is kept
    # the cluster's token lives in this process's environment only (other users of Ray on this machine may
    # have their own ~/.ray/auth_token; ours is never written there)
    if os.path.exists(cluster["home_token"]):
        with open(cluster["home_token"]) as fh:
            assert fh.read().strip() != token

    @ray.remote(num_cpus=0)
    def mode() -> str:
        return os.environ.get("RAY_AUTH_MODE", "")

    assert ray.get(mode.remote(), timeout=60) == "token"  # the cluster's processes run with auth on


@pytest.mark.parametrize("strategy", [GRPO(), TRACE()], ids=lambda s: s.name)
def test_ray_and_local_backends_give_identical_trees_on_python_math(cluster, strategy) -> None:
    policy, prompts = _slow_scripted(6)
    budget = Budget(roots=8, continuations_per_root=2, group_size=2)
    local, _ = _collect(MATH_ENV, policy, prompts, strategy, budget, "local")
    remote, stats = _collect(MATH_ENV, policy, prompts, strategy, budget, "ray")
    assert _dump(remote.trees) == _dump(local.trees)
    assert remote.engine.batch_sizes == local.engine.batch_sizes
    _check_budget(remote, budget, strategy.branching)
    assert len(stats) == 2 and len({s["pid"] for s in stats}) == 2 and os.getpid() not in {s["pid"] for s in stats}
    assert all(s["snapshots"] == 0 for s in stats)  # every snapshot released inside its actor
    assert all(0 < s["rss_mb"] < 2048 for s in stats)


def test_on_an_async_policy_ray_actors_stream_rollouts_to_the_same_trees(cluster) -> None:
    """Each rollout runs its turns on its own (several steps of one tree queue on its actor's env)."""
    policy, prompts = _slow_scripted(6)
    budget = Budget(roots=16, continuations_per_root=1, group_size=4)
    local, _ = _collect(MATH_ENV, policy, prompts, TreePO(), budget, "local")
    holding = _HoldingAsync(policy)
    remote, stats = _collect(MATH_ENV, holding, prompts, TreePO(), budget, "ray")
    assert _dump(remote.trees) == _dump(local.trees)
    assert any(holding.released.values()), "while one root's first turn was held, a sibling's next turn came in"
    assert all(s["snapshots"] == 0 for s in stats)  # every snapshot released inside its actor


class WikiScripted(ScriptedPolicy):
    """Scripted WikiQA-v0 episodes: one real search per hop, then the gold answer (flawed: the bridge entity)."""

    def __init__(self, tasks: Sequence[Any], flaw: Mapping[str, float]) -> None:
        super().__init__({}, flaw)
        env = gym.make("trace_envs/WikiQA-v0").unwrapped
        try:
            for t in tasks:
                env.reset(seed=0, options={"task_id": t.task_id})
                self.by_prompt[next(m["content"] for m in env.messages if m["role"] == "user")] = t
        finally:
            env.close()

    @staticmethod
    def _act(task, messages, flawed, *, slow=False) -> str:
        data = task.data
        queries = list(data.get("queries") or [data["question"]])
        done = sum(1 for m in messages if m["role"] == "assistant")
        if flawed and done >= 1:
            return f"<answer>{(data.get('supporting_titles') or queries)[0]}</answer>"
        if done < len(queries):
            return "<tool_call>" + json.dumps({"name": "search", "arguments": {"query": queries[done]}}) + "</tool_call>"
        return f"<answer>{data['answers'][0]}</answer>"


def test_ray_and_local_backends_give_identical_trees_on_wikiqa_with_the_real_retriever(cluster) -> None:
    env = gym.make("trace_envs/WikiQA-v0").unwrapped
    try:
        tasks = [env.tasks[t] for t in env.tasks.ids()[:6]]
    finally:
        env.close()
    policy = WikiScripted(tasks, {t.task_id: float(r) for t, r in zip(tasks, np.linspace(0.1, 0.9, 6))})
    prompts = [PromptSpec(task_id=t.task_id) for t in tasks]
    budget = Budget(roots=8, continuations_per_root=2, group_size=2)
    local, _ = _collect(WIKI_ENV, policy, prompts, TreePO(), budget, "local")
    remote, _ = _collect(WIKI_ENV, policy, prompts, TreePO(), budget, "ray")
    assert _dump(remote.trees) == _dump(local.trees)
    searched = [m for t in remote.trees for n in t.nodes for m in n.messages if m.get("role") == "tool"]
    assert searched and all("error" not in m["content"].lower()[:40] for m in searched)  # real retrieval results
    rewards = {leaf.reward for t in remote.trees for leaf in t.leaves()}
    assert rewards == {0.0, 1.0}


class _KillingPolicy:
    """Delegates to a policy; at engine call ``at`` it kills env actor 0 (a worker dying mid-collection)."""

    def __init__(self, inner: Any, at: int) -> None:
        self.inner = inner
        self.at = at
        self.calls = 0
        self.host: RayEnvHost | None = None
        self.killed_pid: float | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def generate(self, contexts, *args, **kw):
        self.calls += 1
        if self.calls == self.at and self.host is not None:
            self.killed_pid = ray.get(self.host.actors[0].stats.remote())["pid"]
            ray.kill(self.host.actors[0], no_restart=True)
        return self.inner.generate(contexts, *args, **kw)


@pytest.mark.parametrize("retries", [1, 0])
def test_a_killed_env_actor_is_replaced_and_its_prompts_regrown_or_fail_clearly(cluster, retries) -> None:
    policy, prompts = _slow_scripted(6)
    budget = Budget(roots=8, continuations_per_root=2, group_size=2)
    want, _ = _collect(MATH_ENV, policy, prompts, TRACE(), budget, "local")
    killer = _KillingPolicy(policy, at=3)
    with TreeCollector(make_env=MATH_ENV, policy=killer, predictor=_predictor(),
                       config=_config("ray", env_retries=retries)) as collector:
        killer.host = collector.env_host()
        t = time.perf_counter()
        if retries == 0:
            with pytest.raises(EnvWorkerError, match="died"):
                collector.collect(prompts, TRACE(), budget, seed=3)
            assert time.perf_counter() - t < 120
            return
        got = collector.collect(prompts, TRACE(), budget, seed=3)
        host = collector.env_host()
        assert host.replaced >= 1 and killer.killed_pid is not None
        assert killer.killed_pid not in {s["pid"] for s in host.worker_stats()}
    assert _dump(got.trees) == _dump(want.trees)  # regrown from scratch with the same request seeds
    _check_budget(got, budget, True)
