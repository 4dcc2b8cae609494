"""The rollout engine at scale: engine occupancy of tree collection vs flat generation; Ray 1 vs 2 env workers.

    .venv/bin/python scripts/bench/engine.py throughput --repeats 2          # (a) on the shipped demo policy
    .venv/bin/python scripts/bench/engine.py ray --repeats 3                 # (b) env-bound work, 1 vs 2 actors
    .venv/bin/python scripts/bench/engine.py all --out artifacts/bench_engine.json

(a) ``throughput``: the demo setting (PythonMath-v0, 48 candidate prompts, 48 roots, N = 1, groups
of 4, 160 new tokens, 3 turns, temperature 1). For each strategy (TRACE, GRPO, TreePO) and
repeat, in one run and in turn:

* ``engine``: ``TreeCollector.collect`` on the shared engine (deterministic batching, every
  active prompt alive at once, ``max_batch_size`` = the policy's 48);
* ``per-prompt``: the same engine with ``concurrent_prompts=1``: one prompt's rollouts per call,
  the batching of the collector before the engine (the issue's "today");
* ``flat``: the very contexts the ``engine`` collection generated from, generated again as one
  flat batched call (chunks of 48, same seeds, same sampling): the yardstick.

It prints mean sequences per engine call, tokens/s (generated tokens / wall seconds of the
whole collection, env steps, predictor and bookkeeping included) and tokens per CPU-second of
this process (all its threads; sandboxes run in their own processes and are not counted), and
the ratios to ``flat``. On a machine shared with other jobs the wall ratios swing with the
load; the CPU ratios and the sequences per call much less.

Then, per strategy, where the ``engine`` collection's wall clock went (medians over repeats;
measured by the engine's phase timers, :mod:`trace_agent.engine.phases`): seconds by phase
with the generator idle (``exposed``: generation, env, predictor, allocation, bookkeeping,
idle; they sum to the wall clock) and seconds inside each phase (``busy``; overlapping).
``--no-per-prompt`` skips the per-prompt collection. Each repeat resets its prompts with a
new seed (as each training step does), so prompt contexts are not cached across repeats.
``--by-reset`` adds ``by-reset``: the ``engine`` collection again on envs that hide
``opening_messages``, so every candidate's context costs an env reset.

(b) ``ray``: env-bound work: a scripted policy that costs nothing to run, whose programs keep
the sandbox busy (``--busy-ms`` of arithmetic per step), on PythonMath-v0 through the Ray
backend with 1 and 2 env actors (and the local backend for reference), alternating A B A B.
It prints median wall seconds, the speed-up with its min/max over paired repeats, and each
actor's resident memory.

The machine is shared with other jobs: quote the medians with the spread and the load.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import numpy as np  # noqa: E402

from trace_agent.engine.phases import PHASES, PhaseTimer  # noqa: E402
from trace_agent.env_factory import make_env_factory, task_ids  # noqa: E402
from trace_agent.policy.base import Generation, SamplingConfig, TokenContext  # noqa: E402
from trace_agent.rollout import PromptSpec, RolloutConfig, TreeCollector  # noqa: E402
from trace_agent.strategies import Budget, make_strategy  # noqa: E402

MATH = "trace_envs/PythonMath-v0"


def _load() -> str:
    try:
        return " ".join(f"{x:.1f}" for x in os.getloadavg())
    except OSError:  # pragma: no cover
        return "?"


# --------------------------------------------------------------------------------------------------
# (a) throughput


class _Recording:
    """Delegates to a policy and records every context it was asked to continue, with its seed."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.requests: list[tuple[TokenContext, int]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def generate(self, contexts, sampling=None, *, seeds=None, **kw):
        self.requests.extend(zip(contexts, seeds or [0] * len(contexts)))
        return self.inner.generate(contexts, sampling, seeds=seeds, **kw)


def _collector(policy: Any, *, concurrent: int, max_new_tokens: int, max_turns: int, boot: Sequence[PromptSpec],
               by_reset: bool = False, batching: str = "deterministic"):
    """A collector on the demo setting with ``concurrent`` env slots, its sandboxes booted (outside any timing).

    ``by_reset``: its envs hide ``opening_messages`` (a prompt's context then costs a reset).
    """
    from trace_agent.predictor import EmbeddingPredictor

    factory = make_env_factory(MATH, "train", max_turns=max_turns)

    def make_env() -> Any:
        env = factory()
        if by_reset:
            env.unwrapped.opening_messages = lambda *a, **k: None
        return env

    config = RolloutConfig(sampling=SamplingConfig(max_new_tokens=max_new_tokens, temperature=1.0),
                           seed=0, workers=2, concurrent_prompts=concurrent, batching=batching)
    c = TreeCollector(make_env=make_env, policy=policy, predictor=EmbeddingPredictor(), config=config)
    host = c._local_host()
    envs = [host.lease() for _ in boot]
    for env, prompt in zip(envs, boot):
        env.reset(seed=0, options={"task_id": prompt.task_id})
    for env in envs:
        host.give_back(env)
    return c


def _collect_once(c: TreeCollector, strategy_name: str, *, prompts: list[PromptSpec], budget: Budget,
                  seed: int) -> dict[str, float]:
    t, cpu = time.perf_counter(), time.process_time()
    batch = c.collect(prompts, make_strategy(strategy_name), budget, seed=seed)
    wall, cpu = time.perf_counter() - t, time.process_time() - cpu
    e = batch.engine
    return {"wall_s": wall, "cpu_s": cpu, "calls": e.calls, "sequences": e.sequences, "mean_batch": e.mean_batch,
            "tokens": e.generated_tokens, "tokens_per_s": e.generated_tokens / wall,
            "tokens_per_cpu_s": e.generated_tokens / cpu, "generate_s": e.generate_seconds,
            "effective_ratio": batch.stats().effective_ratio,
            **({} if batch.phases is None else {"exposed": batch.phases.exposed, "busy": batch.phases.busy})}


def _flat(policy: Any, requests: Sequence[tuple[TokenContext, int]], *, max_new_tokens: int,
          batch: int) -> dict[str, float]:
    t, cpu = time.perf_counter(), time.process_time()
    tokens = 0
    for i in range(0, len(requests), batch):
        chunk = requests[i:i + batch]
        gens = policy.generate([c for c, _ in chunk],
                               SamplingConfig(max_new_tokens=max_new_tokens, temperature=1.0),
                               seeds=[s for _, s in chunk])
        tokens += sum(len(g.token_ids) for g in gens)
    wall, cpu = time.perf_counter() - t, time.process_time() - cpu
    calls = math.ceil(len(requests) / batch)
    return {"wall_s": wall, "cpu_s": cpu, "calls": calls, "sequences": len(requests),
            "mean_batch": len(requests) / calls, "tokens": tokens, "tokens_per_s": tokens / wall,
            "tokens_per_cpu_s": tokens / cpu}


def throughput(args: argparse.Namespace) -> dict[str, Any]:
    from trace_agent.demo.shipped import ensure_demo_policy, load_demo_policy

    policy = load_demo_policy(ensure_demo_policy(""), max_batch_size=48)
    ids = task_ids(MATH, "train")[:args.prompts]
    budget = Budget(roots=args.roots, continuations_per_root=1, group_size=4)
    rows: list[dict[str, Any]] = []
    warm = [policy.render([{"role": "user", "content": f"warm-up {k}"}]) for k in range(48)]
    policy.generate(warm, SamplingConfig(max_new_tokens=8), seeds=list(range(48)))  # first forward passes are slow
    rec = _Recording(policy)
    boot = [PromptSpec(task_id=t, reset_seed=0) for t in ids[:budget.max_active]]
    engine_c = _collector(rec, concurrent=64, max_new_tokens=args.max_new_tokens, max_turns=3, boot=boot,
                          batching=args.batching)
    engine_c.phase_timer = PhaseTimer()
    reset_c = None
    if args.by_reset:
        reset_c = _collector(policy, concurrent=64, max_new_tokens=args.max_new_tokens, max_turns=3, boot=boot,
                             by_reset=True)
        reset_c.phase_timer = PhaseTimer()
    per_c = _collector(policy, concurrent=1, max_new_tokens=args.max_new_tokens, max_turns=3, boot=boot[:1])
    warm_prompts = [PromptSpec(task_id=t, reset_seed=0) for t in ids]
    for c in (engine_c, reset_c):  # untimed: every env slot a collection uses is created (sandboxes booted)
        if c is not None:
            c.collect(warm_prompts, make_strategy(args.strategies.split(",")[0]), budget, seed=99)
    for rep in range(args.repeats):
        for name in args.strategies.split(","):
            prompts = [PromptSpec(task_id=t, reset_seed=1 + rep) for t in ids]
            kw = {"prompts": prompts, "budget": budget, "seed": 100 + rep}
            rec.requests = []
            eng = _collect_once(engine_c, name, **kw)
            flat = _flat(policy, rec.requests, max_new_tokens=args.max_new_tokens, batch=48)
            per = None if args.no_per_prompt else _collect_once(per_c, name, **kw)
            by_reset = None if reset_c is None else _collect_once(reset_c, name, **kw)
            row = {"strategy": name, "repeat": rep, "engine": eng, "per_prompt": per, "flat": flat,
                   "engine_vs_flat": eng["tokens_per_s"] / flat["tokens_per_s"],
                   "per_prompt_vs_flat": math.nan if per is None else per["tokens_per_s"] / flat["tokens_per_s"],
                   "engine_vs_flat_cpu": eng["tokens_per_cpu_s"] / flat["tokens_per_cpu_s"],
                   "per_prompt_vs_flat_cpu": (math.nan if per is None
                                              else per["tokens_per_cpu_s"] / flat["tokens_per_cpu_s"]),
                   "load": _load()}
            if by_reset is not None:
                row["by_reset"] = by_reset
                row["by_reset_vs_flat"] = by_reset["tokens_per_s"] / flat["tokens_per_s"]
            rows.append(row)
            print(f"[{name} r{rep}] engine {eng['mean_batch']:.1f} seq/call {eng['tokens_per_s']:.0f} tok/s "
                  f"{eng['tokens_per_cpu_s']:.0f} tok/cpu-s | {_per_prompt_line(per)} | flat "
                  f"{flat['mean_batch']:.1f} seq/call {flat['tokens_per_s']:.0f} tok/s {flat['tokens_per_cpu_s']:.0f} "
                  f"tok/cpu-s | engine/flat {row['engine_vs_flat']:.2f} (cpu {row['engine_vs_flat_cpu']:.2f}) "
                  f"per-prompt/flat {row['per_prompt_vs_flat']:.2f} (cpu {row['per_prompt_vs_flat_cpu']:.2f}) "
                  f"(load {row['load']})", flush=True)
            print(f"    phases: {_phase_line(eng)}", flush=True)
            if by_reset is not None:
                print(f"    by-reset: engine/flat {row['by_reset_vs_flat']:.2f}; phases: {_phase_line(by_reset)}",
                      flush=True)
    engine_c.close()
    if reset_c is not None:
        reset_c.close()
    per_c.close()
    print("\n| strategy | engine seq/call | per-prompt seq/call | flat seq/call | engine tok/s | flat tok/s | "
          "engine / flat, wall (median, min-max) | engine / flat, CPU | per-prompt / flat, wall | "
          "per-prompt / flat, CPU |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name in args.strategies.split(","):
        rs = [r for r in rows if r["strategy"] == name]

        def med(path: tuple[str, ...], rs=rs) -> float:
            vals = []
            for r in rs:
                v: Any = r
                for k in path:
                    v = math.nan if v is None else v[k]  # a skipped run (--no-per-prompt) has no figures
                vals.append(float(v))
            return statistics.median(vals)

        def spread(key: str, rs=rs) -> str:
            vals = [float(r[key]) for r in rs]
            if any(math.isnan(v) for v in vals):
                return "–"
            return f"{statistics.median(vals):.2f} ({min(vals):.2f}-{max(vals):.2f})"

        per_batch = med(("per_prompt", "mean_batch"))
        print(f"| {name} | {med(('engine', 'mean_batch')):.1f} | {'–' if math.isnan(per_batch) else f'{per_batch:.1f}'} | "
              f"{med(('flat', 'mean_batch')):.1f} | {med(('engine', 'tokens_per_s')):.0f} | "
              f"{med(('flat', 'tokens_per_s')):.0f} | {spread('engine_vs_flat')} | {spread('engine_vs_flat_cpu')} | "
              f"{spread('per_prompt_vs_flat')} | {spread('per_prompt_vs_flat_cpu')} |")
    _phase_table(rows, args.strategies.split(","))
    if args.by_reset:
        _phase_table(rows, args.strategies.split(","), key="by_reset")
        print("\n| strategy | engine / flat, wall (median, min-max) | by-reset / flat, wall | engine / by-reset, wall |")
        print("|---|---|---|---|")
        for name in args.strategies.split(","):
            rs = [r for r in rows if r["strategy"] == name]
            a, b = [r["engine_vs_flat"] for r in rs], [r["by_reset_vs_flat"] for r in rs]
            c = [x / y for x, y in zip(a, b)]
            print(f"| {name} | " + " | ".join(f"{statistics.median(v):.2f} ({min(v):.2f}-{max(v):.2f})"
                                             for v in (a, b, c)) + " |")
    return {"rows": rows}


def _per_prompt_line(per: dict[str, Any] | None) -> str:
    """The per-prompt collection's figures for the progress line ("skipped" under ``--no-per-prompt``)."""
    if per is None:
        return "per-prompt skipped"
    return (f"per-prompt {per['mean_batch']:.1f} seq/call {per['tokens_per_s']:.0f} tok/s "
            f"{per['tokens_per_cpu_s']:.0f} tok/cpu-s")


def _phase_line(eng: Mapping[str, Any]) -> str:
    ex, busy = eng["exposed"], eng["busy"]
    return ("exposed " + " ".join(f"{k} {ex[k]:.2f}s" for k in (*PHASES, "idle")) + f" (wall {eng['wall_s']:.2f}s)"
            + " | busy " + " ".join(f"{k} {busy[k]:.2f}s" for k in PHASES))


def _phase_table(rows: Sequence[Mapping[str, Any]], strategies: Sequence[str], *, key: str = "engine") -> None:
    """Medians over repeats of each phase's exposed seconds (and share of the wall), then busy seconds."""
    cols = (*PHASES, "idle")
    print(f"\nWhere one {key} collection's wall clock goes (exposed seconds, share of wall; medians over repeats)\n")
    print("| strategy | wall s | " + " | ".join(cols) + " | busy: " + " | ".join(PHASES) + " |")
    print("|---|---|" + "---|" * (len(cols) + len(PHASES)))
    for name in strategies:
        engs = [r[key] for r in rows if r["strategy"] == name]
        wall = statistics.median(e["wall_s"] for e in engs)
        ex = {k: statistics.median(e["exposed"][k] for e in engs) for k in cols}
        busy = {k: statistics.median(e["busy"][k] for e in engs) for k in PHASES}
        print(f"| {name} | {wall:.2f} | " + " | ".join(f"{ex[k]:.2f} ({ex[k] / wall:.0%})" for k in cols)
              + " | " + " | ".join(f"{busy[k]:.2f}" for k in PHASES) + " |")


# --------------------------------------------------------------------------------------------------
# (b) Ray 1 vs 2 workers on env-bound work


class BusyScripted:
    """A free policy whose PythonMath-v0 turns are CPU-heavy programs (env-bound work), then an answer.

    Byte-level tokens (+256: end of turn); the context is one JSON line per message. The first
    turn runs ``busy_ms`` worth of arithmetic and prints the task's answer (wrong for half of
    the seeds); the second boxes the printed line.
    """

    def __init__(self, tasks: Mapping[str, Any], *, busy_ms: float) -> None:
        self.by_prompt = {t.prompt: t for t in tasks.values()}
        self.loops = max(1, int(busy_ms * 20_000))  # ~20k simple iterations per ms in CPython

    @property
    def stop_token_ids(self) -> tuple[int, ...]:
        return (256,)

    @staticmethod
    def _line(message: Mapping[str, Any]) -> list[int]:
        return list((json.dumps(dict(message), sort_keys=True) + "\n").encode())

    def render(self, messages, tools=None) -> TokenContext:
        return TokenContext.from_prompt([t for m in messages for t in self._line(m)])

    def decode(self, token_ids: Sequence[int]) -> str:
        return bytes(t for t in token_ids if t < 256).decode()

    def generate(self, contexts, sampling=None, *, seeds=None, sessions=None) -> list[Generation]:
        out = []
        for ctx, s in zip(contexts, seeds or [0] * len(contexts)):
            messages = [json.loads(x) for x in self.decode(ctx.token_ids).splitlines() if x]
            task = self.by_prompt[next(m["content"] for m in messages if m["role"] == "user")]
            outputs = [m["content"] for m in messages if m["role"] == "tool"]
            if not outputs:
                answer = str(task.data["answer"]) + ("" if s % 2 else "7")
                code = f"x = 0\nfor i in range({self.loops}):\n    x += i % 7\nprint({answer!r})"
                text = "<tool_call>" + json.dumps({"name": "python", "arguments": {"code": code}}) + "</tool_call>"
            else:
                lines = outputs[-1].strip().splitlines()
                text = f"<answer>\\boxed{{{lines[-1].strip() if lines else ''}}}</answer>"
            ids = self._line({"role": "assistant", "content": text})[:-1] + [256]
            out.append(Generation(token_ids=tuple(ids), logprobs=tuple(-0.5 for _ in ids), text=text,
                                  finish_reason="stop"))
        return out

    def extend(self, context, generation, observation) -> TokenContext:
        obs = [observation] if isinstance(observation, Mapping) else list(observation)
        ctx = context.append(generation.token_ids, generated=True, logprobs=generation.logprobs)
        return ctx.append([10] + [t for m in obs for t in self._line(m)], generated=False)


def ray_scaling(args: argparse.Namespace) -> dict[str, Any]:
    import gymnasium as gym

    import trace_envs  # noqa: F401
    from trace_agent.engine.ray_envs import RayConfig, ensure_ray

    env = gym.make(MATH).unwrapped
    try:
        tasks = {t: env.tasks[t] for t in env.tasks.ids()[:args.ray_prompts]}
    finally:
        env.close()
    policy = BusyScripted(tasks, busy_ms=args.busy_ms)
    prompts = [PromptSpec(task_id=t) for t in tasks]
    budget = Budget(roots=4 * len(prompts), continuations_per_root=1, group_size=4)
    make_env = make_env_factory(MATH, "train", max_turns=3)
    ensure_ray(RayConfig(cluster_cpus=os.cpu_count() or 2, object_store_mb=128))
    collectors = {}
    for label, backend, workers in (("ray-1", "ray", 1), ("ray-2", "ray", 2), ("local", "local", 1)):
        config = RolloutConfig(seed=0, workers=2, concurrent_prompts=len(prompts), backend=backend,
                               ray=RayConfig(workers=workers, num_cpus_per_worker=1.0 / workers))
        collectors[label] = TreeCollector(make_env=make_env, policy=policy, config=config)
    times: dict[str, list[float]] = {k: [] for k in collectors}
    memory: dict[str, list[dict[str, float]]] = {}
    try:
        for c in collectors.values():  # warm-up: boot every env once (sandboxes, actors)
            c.collect(prompts, make_strategy("treepo"), budget, seed=0)
        for rep in range(args.repeats):
            for label, c in collectors.items():
                t = time.perf_counter()
                c.collect(prompts, make_strategy("treepo"), budget, seed=1 + rep)
                times[label].append(time.perf_counter() - t)
            print(f"[ray r{rep}] " + " ".join(f"{k} {v[-1]:.2f}s" for k, v in times.items()) + f" (load {_load()})",
                  flush=True)
        for label in ("ray-1", "ray-2"):
            memory[label] = collectors[label].env_host().worker_stats()
    finally:
        for c in collectors.values():
            c.close()
    speedups = [a / b for a, b in zip(times["ray-1"], times["ray-2"])]
    print("\n| backend | median wall s (min-max) | actor RSS MiB |")
    print("|---|---|---|")
    for label, ts in times.items():
        rss = ", ".join(f"{m['rss_mb']:.0f}" for m in memory.get(label, []))
        print(f"| {label} | {statistics.median(ts):.2f} ({min(ts):.2f}-{max(ts):.2f}) | {rss or '-'} |")
    print(f"\nray 2 workers vs 1: {statistics.median(speedups):.2f}x (paired min {min(speedups):.2f}, "
          f"max {max(speedups):.2f}); load {_load()}")
    return {"times": times, "speedups": speedups, "memory": memory}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", choices=("throughput", "ray", "all"))
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--strategies", default="trace,grpo,treepo")
    p.add_argument("--prompts", type=int, default=48)
    p.add_argument("--roots", type=int, default=48)
    p.add_argument("--max-new-tokens", type=int, default=160)
    p.add_argument("--no-per-prompt", action="store_true", help="skip the per-prompt (concurrent_prompts=1) runs")
    p.add_argument("--by-reset", action="store_true", help="also collect with contexts built by env resets")
    p.add_argument("--ray-prompts", type=int, default=16)
    p.add_argument("--busy-ms", type=float, default=40.0)
    p.add_argument("--batching", choices=("deterministic", "dynamic"), default="deterministic",
                   help="the engine collection's batching mode (docs/engine.md)")
    p.add_argument("--out", default="")
    args = p.parse_args(argv)
    print(f"command: {' '.join(sys.argv)}\nmachine: {os.cpu_count()} CPUs, load {_load()}", flush=True)
    result: dict[str, Any] = {"argv": sys.argv, "load_start": _load()}
    np.random.seed(0)
    if args.what in ("throughput", "all"):
        result["throughput"] = throughput(args)
    if args.what in ("ray", "all"):
        result["ray"] = ray_scaling(args)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
