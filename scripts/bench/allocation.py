"""Benchmark: exact allocation next to its baselines and next to predictor scoring.

    .venv/bin/python scripts/bench/allocation.py            # full run (about a minute on 2 cores)
    .venv/bin/python scripts/bench/allocation.py --quick    # fewer repeats, smaller scoring sets

Measures, in one run:
  1. allocate_roots, 4,096 candidates, budget 16,384, cap 32, max_active 1,024, against a
     naive heap greedy (a heuristic: top-c prompts at 2 rollouts, then one rollout at a time
     to the best increment) - time and objective;
  2. allocate_prefixes, 64 prefixes, budget 128, unit costs, against a pure-Python heap greedy;
  3. predictor scoring throughput: the CPU default (MiniLM embeddings + logistic head, cold
     and warm cache), the hashed-n-gram fallback, and a tiny Qwen3 LM critic;
and prints absolute medians plus ratios against the baselines measured here.
"""

from __future__ import annotations

import argparse
import heapq
import json
import os
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from trace_agent.allocation import allocate_prefixes, allocate_roots, prefix_objective, root_objective  # noqa: E402
from trace_agent.contexts import make_context  # noqa: E402


def median_time(fn: Callable[[], Any], repeats: int, warmup: int = 2) -> tuple[float, float]:
    """(median, 90th percentile) wall time of ``fn`` in seconds."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    times.sort()
    return statistics.median(times), times[min(len(times) - 1, int(0.9 * len(times)))]


def greedy_roots(values: np.ndarray, budget: int, cap: int, max_active: int) -> list[int]:
    """A naive heuristic: the max_active prompts with the largest v(1 - v) get 2, then a heap adds one at a time."""
    c = values * (1 - values)
    active = np.argsort(-c, kind="stable")[: min(max_active, budget // 2)]
    m = np.zeros(len(values), dtype=np.int64)
    m[active] = 2
    left = budget - 2 * len(active)

    def inc(v: float, k: int) -> float:
        return v**k * (1 - v) + (1 - v) ** k * v

    heap = [(-inc(float(values[i]), 2), int(i)) for i in active]
    heapq.heapify(heap)
    while left > 0 and heap:
        _, i = heapq.heappop(heap)
        m[i] += 1
        left -= 1
        if m[i] < cap:
            heapq.heappush(heap, (-inc(float(values[i]), int(m[i])), i))
    return [int(x) for x in m]


def greedy_prefixes(q: np.ndarray, budget: int) -> list[int]:
    """The textbook heap greedy for the unit-cost prefix problem (exact, pure Python)."""
    k = [0] * len(q)
    heap = [(-(1 - float(x)), j) for j, x in enumerate(q)]
    heapq.heapify(heap)
    for _ in range(budget):
        _, j = heapq.heappop(heap)
        k[j] += 1
        heapq.heappush(heap, (-(float(q[j]) ** k[j] * (1 - float(q[j]))), j))
    return k


def synthetic_contexts(n: int, seed: int) -> list[str]:
    """Contexts shaped like agent prefixes: a ~40-word prompt and a ~150-word history, all distinct."""
    rng = np.random.default_rng(seed)
    words = ("search find the capital of country river year born film director population compute sum "
             "integer prime python result observation answer question which who when where").split()
    out = []
    for i in range(n):
        prompt = f"<|user|>\nQuestion {i}: " + " ".join(rng.choice(words, 40))
        history = "\n".join(f"<|assistant|>\n{' '.join(rng.choice(words, 25))}\n<|tool|>\n{' '.join(rng.choice(words, 25))}"
                            for _ in range(3))
        out.append(make_context(prompt, history))
    return out


def throughput(predict: Callable[[list[str]], np.ndarray], contexts: list[str]) -> float:
    start = time.perf_counter()
    predict(contexts)
    return len(contexts) / (time.perf_counter() - start)


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer repeats and smaller scoring sets")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures to this JSON file")
    parser.add_argument("--skip-predictors", action="store_true", help="allocation only")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads for the predictors")
    args = parser.parse_args(argv)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"machine: {os.cpu_count()} cores, load average {load:.2f} at start; numpy {np.__version__}")
    reps_root = 7 if args.quick else 21
    reps_prefix = 100 if args.quick else 500
    n_score = 128 if args.quick else 512
    res: dict[str, float] = {}
    rng = np.random.default_rng(0)

    # ---------------------------------------------------------------- roots
    values = rng.beta(0.5, 0.5, 4096)
    kw = {"cap": 32, "max_active": 1024}
    exact = allocate_roots(values, 16384, **kw)
    naive = greedy_roots(values, 16384, 32, 1024)
    res["roots_exact_ms"], res["roots_exact_p90_ms"] = (1e3 * t for t in median_time(
        lambda: allocate_roots(values, 16384, **kw), reps_root))
    res["roots_greedy_ms"], _ = (1e3 * t for t in median_time(lambda: greedy_roots(values, 16384, 32, 1024), reps_root))
    res["roots_exact_objective"] = root_objective(values, exact)
    res["roots_greedy_objective"] = root_objective(values, naive)
    res["roots_active"] = float(sum(x > 0 for x in exact))
    print("allocate_roots  4096 candidates, budget 16384, cap 32, max_active 1024")
    print(f"  exact          median {res['roots_exact_ms']:8.2f} ms  (p90 {res['roots_exact_p90_ms']:.2f} ms)  "
          f"objective {res['roots_exact_objective']:.3f}, {int(res['roots_active'])} active")
    print(f"  naive greedy   median {res['roots_greedy_ms']:8.2f} ms  objective {res['roots_greedy_objective']:.3f}")
    print(f"  ratio exact / greedy time {res['roots_exact_ms'] / res['roots_greedy_ms']:.2f}x; "
          f"greedy leaves {res['roots_exact_objective'] - res['roots_greedy_objective']:.3f} expected mixed groups")
    # where the active limit does not bind, activating the top-v(1-v) prompts at 2 each is far from optimal
    for budget in (4096, 8192):
        e = allocate_roots(values, budget, cap=32)
        g = greedy_roots(values, budget, 32, 4096)
        t_e, _ = median_time(lambda b=budget: allocate_roots(values, b, cap=32), reps_root)
        res[f"roots_b{budget}_exact_ms"] = 1e3 * t_e
        res[f"roots_b{budget}_exact_objective"] = root_objective(values, e)
        res[f"roots_b{budget}_greedy_objective"] = root_objective(values, g)
        print(f"  budget {budget}, no active limit: exact {1e3 * t_e:.2f} ms, objective "
              f"{res[f'roots_b{budget}_exact_objective']:.1f} ({sum(x > 0 for x in e)} active) vs greedy "
              f"{res[f'roots_b{budget}_greedy_objective']:.1f} ({sum(x > 0 for x in g)} active)")

    # ---------------------------------------------------------------- prefixes
    q = rng.uniform(0.3, 1.0, 64)
    k_exact = allocate_prefixes(q, 128)
    k_heap = greedy_prefixes(q, 128)
    assert abs(prefix_objective(q, k_exact) - prefix_objective(q, k_heap)) < 1e-9
    res["prefix_exact_us"], res["prefix_exact_p90_us"] = (1e6 * t for t in median_time(
        lambda: allocate_prefixes(q, 128), reps_prefix))
    res["prefix_heap_us"], _ = (1e6 * t for t in median_time(lambda: greedy_prefixes(q, 128), reps_prefix))
    costs = [int(c) for c in rng.integers(1, 4, 64)]
    res["prefix_dp_costs_ms"], _ = (1e3 * t for t in median_time(
        lambda: allocate_prefixes(q, 128, costs=costs), max(5, reps_prefix // 50)))
    print("allocate_prefixes  64 prefixes, budget 128, unit costs")
    print(f"  exact (numpy)  median {res['prefix_exact_us']:8.1f} us  (p90 {res['prefix_exact_p90_us']:.1f} us)")
    print(f"  heap greedy    median {res['prefix_heap_us']:8.1f} us  (pure Python, same optimum)")
    print(f"  ratio numpy / heap {res['prefix_exact_us'] / res['prefix_heap_us']:.2f}x; "
          f"integer costs 1-3 (exact DP): {res['prefix_dp_costs_ms']:.2f} ms")

    if args.skip_predictors:
        _write(args.json, res)
        return res

    # ---------------------------------------------------------------- predictors
    warnings.simplefilter("ignore")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.threads is not None:
        import torch

        torch.set_num_threads(args.threads)
    from trace_agent.predictor import (
        EmbeddingPredictor,
        HashedNGramFeaturizer,
        LMCriticConfig,
        MiniLMFeaturizer,
        tiny_qwen3_critic,
    )

    contexts = synthetic_contexts(n_score, seed=1)
    fit_ctx = synthetic_contexts(64, seed=2)
    fit_y = rng.random(64)
    print(f"predictor scoring  {n_score} distinct contexts (~40-word prompt + ~150-word history), CPU")
    try:
        emb = EmbeddingPredictor(MiniLMFeaturizer())
        emb.update(fit_ctx, fit_y)
        res["minilm_cold_ctx_per_s"] = throughput(emb.predict, contexts)
        res["minilm_warm_ctx_per_s"] = throughput(emb.predict, contexts)
        prompts_only = [make_context(c.split("\n<|trace-history|>")[0] + " (root)") for c in contexts]
        res["minilm_prompt_ctx_per_s"] = throughput(emb.predict, prompts_only)
        print(f"  MiniLM + logistic head, cold cache  {res['minilm_cold_ctx_per_s']:9.1f} contexts/s")
        print(f"  MiniLM + logistic head, warm cache  {res['minilm_warm_ctx_per_s']:9.1f} contexts/s")
        print(f"  MiniLM, prompts only (root scoring) {res['minilm_prompt_ctx_per_s']:9.1f} contexts/s")
    except (ImportError, OSError) as exc:
        print(f"  MiniLM unavailable: {exc}")
    hashed = EmbeddingPredictor(HashedNGramFeaturizer())
    hashed.update(fit_ctx, fit_y)
    res["hashed_ctx_per_s"] = throughput(hashed.predict, contexts)
    print(f"  hashed n-grams + logistic head      {res['hashed_ctx_per_s']:9.1f} contexts/s")
    critic = tiny_qwen3_critic(contexts[:200], vocab_size=512, hidden_size=64, num_layers=2,
                               config=LMCriticConfig(max_length=512, batch_size=16, device="cpu"))
    critic.predict(contexts[:16])
    res["tiny_lm_ctx_per_s"] = throughput(critic.predict, contexts)
    print(f"  tiny Qwen3 critic (h=64, 2 layers)  {res['tiny_lm_ctx_per_s']:9.1f} contexts/s")
    score_4096_s = 4096 / res.get("minilm_prompt_ctx_per_s", res["hashed_ctx_per_s"])
    res["roots_over_scoring"] = res["roots_exact_ms"] / 1e3 / score_4096_s
    print(f"  exact root allocation = {100 * res['roots_over_scoring']:.2f}% of scoring the 4096 candidate "
          f"prompts with the CPU default ({score_4096_s:.1f} s, extrapolated from {n_score})")
    _write(args.json, res)
    return res


def _write(path: Path | None, res: dict[str, float]) -> None:
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(res, indent=2, sort_keys=True))


if __name__ == "__main__":
    main()
