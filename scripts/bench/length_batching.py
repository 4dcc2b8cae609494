"""Benchmark: length-grouped vs unsorted generation batches of the transformers backend on BFCL-v0 contexts.

Run: .venv/bin/python scripts/bench/length_batching.py [--contexts 32] [--rows 32,8] [--repeats 3]
                                                          [--max-new-tokens 128] [--tool-detail compact]
                                                          [--threads 1] [--json out.json]

The setting is docs/configs/bfcl_demo.yaml's: the shipped BFCL demo policy (tool_detail "names", from its
trace_policy.json; ``--tool-detail compact`` renders longer schemas), multi_turn_base train entries, temperature 1, 128 new tokens per turn, one seed per
request (what the rollout engine passes). The contexts are one generate call's worth of live episodes
at different depths, as an evaluation wave or an engine round holds them: entry i is played ``i % 4``
ground-truth steps (its transcript rendered with the chat template), so short first turns and long
later turns share the call.

For each ``--rows`` (the policy's ``max_batch_size``; ``max_batch_tokens`` stays at its default) the same
call runs with ``length_grouping=False`` (contexts cut into batches in input order: the baseline) and
``True`` (sorted by length, then cut), alternating A B A B in one process. It prints generated tokens/s
(median over repeats, wall clock of the whole call), the padded share of the prefill (pad tokens /
rows x width summed over batches), the number of forward-pass batches, the ratio grouped / unsorted
(with the ratio of each A B pair), generated tokens per CPU-second of this process (less sensitive to
other jobs on the machine than the wall clock) and whether every request's token ids were the same in
both modes.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from trace_agent.policy.base import SamplingConfig  # noqa: E402
from trace_agent.policy.hf import prefill_padding  # noqa: E402


def bfcl_contexts(policy: Any, n: int, *, category: str = "multi_turn_base") -> list[Any]:
    """``n`` contexts of BFCL-v0 train entries, entry i after ``i % 4`` ground-truth steps."""
    from trace_envs.function_calling import BFCLEnv

    env = BFCLEnv(category=category, tasks="train", tool_detail=policy.tool_detail,
                  max_turns=10**6, max_steps_per_turn=10**6)
    ids = list(env.tasks.ids())
    contexts = []
    try:
        for i in range(n):
            env.reset(options={"task_id": ids[i % len(ids)]})
            for action in env.ground_truth_actions()[: i % 4]:
                _, _, terminated, truncated, _ = env.step(action)
                if terminated or truncated:
                    break
            contexts.append(policy.render(env.messages, env.tools))
    finally:
        env.close()
    return contexts


def measure(policy: Any, contexts: list[Any], *, rows: int, repeats: int, max_new_tokens: int) -> dict[str, Any]:
    seeds = [1000 + i for i in range(len(contexts))]
    policy.max_batch_size = rows
    runs: dict[str, list[float]] = {"unsorted": [], "grouped": []}
    cpu: dict[str, list[float]] = {"unsorted": [], "grouped": []}
    ids: dict[str, list[tuple[int, ...]]] = {}
    for _ in range(repeats):
        for mode in ("unsorted", "grouped"):
            policy.length_grouping = mode == "grouped"
            t, c = time.perf_counter(), time.process_time()
            gens = policy.generate(contexts, SamplingConfig(max_new_tokens=max_new_tokens, temperature=1.0),
                                   seeds=seeds)
            seconds, cpu_seconds = time.perf_counter() - t, time.process_time() - c
            runs[mode].append(sum(g.num_tokens for g in gens) / seconds)
            cpu[mode].append(sum(g.num_tokens for g in gens) / cpu_seconds)
            ids[mode] = [g.token_ids for g in gens]
    lengths = [len(c) for c in contexts]
    row: dict[str, Any] = {"rows": rows, "max_batch_tokens": policy.max_batch_tokens}
    for mode in ("unsorted", "grouped"):
        pad, batches = prefill_padding(lengths, max_rows=rows, max_tokens=policy.max_batch_tokens,
                                       sort=mode == "grouped")
        row[mode] = {"tokens_per_s": statistics.median(runs[mode]), "all": runs[mode], "pad_share": pad,
                     "batches": batches, "tokens_per_cpu_s": statistics.median(cpu[mode]), "all_cpu": cpu[mode]}
    row["ratio"] = row["grouped"]["tokens_per_s"] / row["unsorted"]["tokens_per_s"]
    row["cpu_ratio"] = row["grouped"]["tokens_per_cpu_s"] / row["unsorted"]["tokens_per_cpu_s"]
    row["paired_ratios"] = [g / u for u, g in zip(runs["unsorted"], runs["grouped"])]
    row["same_ids"] = ids["unsorted"] == ids["grouped"]
    return row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--contexts", type=int, default=32, help="contexts in the call (default: bfcl_demo's batch, 32)")
    p.add_argument("--rows", default="32,8", help="policy max_batch_size values, comma-separated")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads (default 1: on a shared machine more threads spin and swing the "
                        "timings; 0: torch's default)")
    p.add_argument("--tool-detail", choices=("full", "compact", "names"), default=None,
                   help="render the tool schemas so (default: the policy's own, names)")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)

    import torch

    from trace_agent.demo.shipped import SHIPPED_DEMO_POLICIES, load_demo_policy

    if args.threads:
        torch.set_num_threads(args.threads)
    policy = load_demo_policy(SHIPPED_DEMO_POLICIES["trace_envs/BFCL-v0"])
    if args.tool_detail is not None:
        policy.tool_detail = args.tool_detail
    contexts = bfcl_contexts(policy, args.contexts)
    lengths = sorted(len(c) for c in contexts)
    print(f"BFCL-v0 multi_turn_base train, {len(contexts)} contexts, tool_detail {policy.tool_detail}: "
          f"{lengths[0]}..{lengths[-1]} tokens (median {statistics.median(lengths):.0f}); "
          f"{args.max_new_tokens} new tokens, temperature 1, per-request seeds; torch threads "
          f"{torch.get_num_threads()}; load average (1 min) {os.getloadavg()[0]:.1f}")
    print("| max_batch_size | batches unsorted / grouped | pad share of prefill unsorted / grouped "
          "| tokens/s unsorted | tokens/s grouped | ratio (paired repeats) | tokens/CPU-s unsorted / grouped "
          "| CPU ratio | same ids |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    rows = []
    for r in (int(x) for x in args.rows.split(",")):
        row = measure(policy, contexts, rows=r, repeats=args.repeats, max_new_tokens=args.max_new_tokens)
        rows.append(row)
        u, g = row["unsorted"], row["grouped"]
        paired = ", ".join(f"{x:.2f}" for x in row["paired_ratios"])
        print(f"| {r} | {u['batches']} / {g['batches']} | {u['pad_share']:.0%} / {g['pad_share']:.0%} "
              f"| {u['tokens_per_s']:.0f} | {g['tokens_per_s']:.0f} | {row['ratio']:.2f} ({paired}) "
              f"| {u['tokens_per_cpu_s']:.0f} / {g['tokens_per_cpu_s']:.0f} | {row['cpu_ratio']:.2f} "
              f"| {row['same_ids']} |")
    print(f"load average (1 min) at the end: {os.getloadavg()[0]:.1f}")
    if args.json is not None:
        args.json.write_text(json.dumps({"lengths": lengths, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
