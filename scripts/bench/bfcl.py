"""Benchmark: BFCL-v0 step latency and snapshot/restore cost on the largest-state entries.

Run: .venv/bin/python scripts/bench/bfcl.py [--repeats 200] [--entries 5] [--json out.json]

* step latency (median) of a one-call step in both formats, of a three-call
  step, and of a turn-ending step (which runs BFCL's state/response check),
  against bfcl-eval's own executor (``execute_multi_turn_func_call``: regex
  rewrite + ``eval`` on instances cached in its module globals) running the
  same call in the same process;
* for the ``multi_turn_long_context`` entries with the largest backend state
  (pickled size after half the ground truth has run): ``snapshot()`` and
  ``restore()`` against two baselines measured in the same run: a
  ``copy.deepcopy`` of the backend instances (the naive copy), and replaying
  the episode from ``reset()`` to the same point (what branching by re-feeding
  a prefix costs when tools keep state).
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from typing import Any

from _timing import median_ms

from trace_envs.function_calling import BFCLEnv


def _step_latency(repeats: int) -> list[dict[str, Any]]:
    from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_utils import execute_multi_turn_func_call

    env = BFCLEnv(category="multi_turn_base", max_turns=10**9, max_steps_per_turn=10**9)
    task_id = "multi_turn_base_0"
    env.reset(options={"task_id": task_id})
    entry = env.task.data
    rows = []
    one_py = "[ls(a=True)]"
    one_json = '<tool_call>{"name": "ls", "arguments": {"a": true}}</tool_call>'
    three = "[pwd(), ls(a=True), du(human_readable=True)]"
    rows.append({"what": "step, 1 call, [f(a=1)] format", "ms": median_ms(lambda: env.step(one_py), repeats)})
    rows.append({"what": "step, 1 call, <tool_call> format", "ms": median_ms(lambda: env.step(one_json), repeats)})
    rows.append({"what": "step, 3 calls", "ms": median_ms(lambda: env.step(three), repeats)})

    def bfcl_one() -> None:
        execute_multi_turn_func_call(["ls(a=True)"], entry["initial_config"], entry["involved_classes"],
                                     "tracegym_bench", task_id)

    bfcl_one()  # create its cached instances first, as its harness does
    rows.append({"what": "baseline: bfcl-eval executor, 1 call (eval, cached globals)",
                 "ms": median_ms(bfcl_one, repeats)})

    # a turn-ending step: restore to a point inside turn 0 with the ground truth run, then end the turn
    env.reset(options={"task_id": task_id})
    env.step(env.ground_truth_actions()[0])
    inside = env.snapshot()

    def end_turn() -> None:
        env.step("Done.")

    times = []
    for _ in range(repeats):
        env.restore(inside)
        start = time.perf_counter()
        end_turn()
        times.append(time.perf_counter() - start)
    rows.append({"what": "turn-ending step (state + response check)", "ms": statistics.median(times) * 1000})
    return rows


def _largest_entries(env: BFCLEnv, count: int) -> list[tuple[int, str, list[str], int]]:
    sized = []
    for task_id in env.tasks.ids():
        env.reset(options={"task_id": task_id})
        actions = env.ground_truth_actions()
        prefix = actions[: max(1, len(actions) // 2)]
        for action in prefix:
            env.step(action)
        sized.append((len(env._backends.freeze()), task_id, prefix, len(prefix)))  # noqa: SLF001
    sized.sort(reverse=True)
    return sized[:count]


def _snapshot_rows(repeats: int, count: int) -> list[dict[str, Any]]:
    env = BFCLEnv(category="multi_turn_long_context", tasks="all")  # the largest states of the whole category
    rows = []
    for size, task_id, prefix, steps in _largest_entries(env, count):
        env.reset(options={"task_id": task_id})
        for action in prefix:
            env.step(action)
        snap = env.snapshot()
        instances = env._backends.instances  # noqa: SLF001

        def replay(task_id: str = task_id, prefix: list[str] = prefix) -> None:
            env.reset(options={"task_id": task_id})
            for action in prefix:
                env.step(action)

        snapshot_ms = median_ms(env.snapshot, repeats)
        deepcopy_ms = median_ms(lambda instances=instances: copy.deepcopy(instances), repeats)
        restore_ms = median_ms(lambda snap=snap: env.restore(snap), repeats)
        replay_ms = median_ms(replay, max(5, repeats // 4))
        rows.append({
            "task_id": task_id, "state_bytes": size, "prefix_steps": steps,
            "snapshot_ms": snapshot_ms, "deepcopy_ms": deepcopy_ms, "restore_ms": restore_ms, "replay_ms": replay_ms,
            "replay_over_restore": replay_ms / restore_ms, "deepcopy_over_snapshot": deepcopy_ms / snapshot_ms,
        })
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--entries", type=int, default=5, help="how many largest-state long_context entries")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()

    steps = _step_latency(args.repeats)
    baseline = next(r["ms"] for r in steps if r["what"].startswith("baseline"))
    print(f"Python {sys.version.split()[0]}; medians of {args.repeats} runs\n")
    print("| step | median ms | vs bfcl-eval executor |")
    print("|---|---:|---:|")
    for row in steps:
        print(f"| {row['what']} | {row['ms']:.3f} | {row['ms'] / baseline:.2f}x |")

    snaps = _snapshot_rows(args.repeats, args.entries)
    print("\n| long_context entry (largest state) | state (pickled) | prefix steps | snapshot ms | deepcopy ms "
          "| restore ms | replay from reset ms | replay / restore |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in snaps:
        print(f"| {r['task_id']} | {r['state_bytes'] / 1024:.1f} KiB | {r['prefix_steps']} | {r['snapshot_ms']:.3f} "
              f"| {r['deepcopy_ms']:.3f} | {r['restore_ms']:.3f} | {r['replay_ms']:.3f} "
              f"| {r['replay_over_restore']:.1f}x |")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump({"steps": steps, "snapshots": snaps, "repeats": args.repeats}, handle, indent=2)


if __name__ == "__main__":
    main()
