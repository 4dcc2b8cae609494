"""Benchmark: PythonMath snapshot/restore latency (fork vs replay) and per-cell overhead.

Run: .venv/bin/python scripts/bench/snapshot.py [--repeats 50]
     .venv/bin/python scripts/bench/snapshot.py --files [--repeats 5]

* restore latency at 1, 10 and 100 executed cells, through ``env.restore`` (a
  fork of the frozen interpreter) and by replaying the cells into a pristine
  interpreter (what a serialised snapshot or a prefix re-feed costs);
* snapshot latency (``env.snapshot``: a fork of the live interpreter);
* one cell in the persistent sandbox vs a fresh ``python -c`` per call (the
  stateless pattern of SkyRL-gym and similar tool servers).
With ``--files``: snapshot and restore time against the work dir's file count (0, 1k, 10k and 50k
small files, 1,000 to a dir), as the ratio to the empty dir measured in the same run, how many
of the snapshots had to hold their replay log only (their files not copied), and how many files the
last snapshot shared with the held one instead of copying them (unchanged since it was taken), and
what a one-line cell costs beside that many files (past the smaller snapshot cap's count of inodes,
the filer walks the work dir after each cell to tell the cell when it passed a cap). Run it as root and as
an ordinary user (e.g. under ``setpriv --reuid``): the two differ in the filer's uid and the memory
accounting (a cgroup, or each process's Pss).
Ratios are against baselines measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import warnings

from _timing import median_ms

from trace_envs import Task, TaskSet
from trace_envs.python_tool.env import PythonMathEnv


def _cell(i: int) -> str:
    return f"v{i} = [k * k % 7 for k in range(5000)]\nacc = (globals().get('acc', 0) + sum(v{i})) % 1000003"


def _call(code: str) -> str:
    return "<tool_call>" + json.dumps({"name": "python", "arguments": {"code": code}}) + "</tool_call>"


def _files_cell(count: int) -> str:
    return (f"import os\nfor n in range({count}):\n    if n % 1000 == 0:\n        os.mkdir(f'd{{n // 1000}}')\n"
            "    open(f'd{n // 1000}/{n}', 'w').write(str(n))")


def files_table(repeats: int) -> list[dict]:
    """Snapshot and restore medians against the work dir's file count (see the module docstring)."""
    from trace_envs.python_tool.sandbox import SandboxConfig

    tasks = TaskSet([Task("bench", "benchmark task", {"answer": "0"})], name="bench")
    config = SandboxConfig(disk_mb=1024, snapshot_disk_mb=2048, env_memory_mb=8192, timeout_s=120, cpu_s=120)
    rows = []
    for count in (0, 1000, 10_000, 50_000):
        env = PythonMathEnv(tasks=tasks, max_turns=1000, sandbox=config)
        env.reset(seed=0, options={"task_id": "bench"})
        env.step(_call(_files_cell(count)))
        snap = env.snapshot()
        snapshot_ms = median_ms(lambda env=env: env.snapshot().release(), repeats)
        restore_ms = median_ms(lambda env=env, snap=snap: env.restore(snap), repeats)
        shared = getattr(env._sandbox, "last_save", {}).get("shared", 0)  # of the last timed snapshot
        cell_ms = median_ms(lambda env=env: env._sandbox.run("1"), repeats * 4)
        info = env.step(_call("len(os.listdir('.'))"))[4]
        rows.append({"files": count, "snapshot_ms": snapshot_ms, "restore_ms": restore_ms, "shared": shared,
                     "cell_ms": cell_ms,
                     "replay_only": info.get("replay_only_snapshots", 0),
                     "restored_by_replay": bool(info.get("restored_by_replay"))})
        env.close()
    for row in rows:
        row["snapshot_vs_empty"] = row["snapshot_ms"] / rows[0]["snapshot_ms"]
        row["restore_vs_empty"] = row["restore_ms"] / rows[0]["restore_ms"]
        row["cell_vs_empty"] = row["cell_ms"] / rows[0]["cell_ms"]
    print(f"{'files':>7} {'snapshot ms':>12} {'vs empty':>9} {'restore ms':>11} {'vs empty':>9} {'replay-only':>12} "
          f"{'shared':>7} {'cell ms':>8} {'vs empty':>9}")
    for r in rows:
        print(f"{r['files']:>7} {r['snapshot_ms']:>12.2f} {r['snapshot_vs_empty']:>8.1f}x {r['restore_ms']:>11.2f} "
              f"{r['restore_vs_empty']:>8.1f}x {r['replay_only']:>12} {r['shared']:>7} {r['cell_ms']:>8.2f} "
              f"{r['cell_vs_empty']:>8.1f}x")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--files", action="store_true", help="time against the work dir's file count instead")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    if args.files:
        rows = files_table(args.repeats)
        if args.json:
            with open(args.json, "w") as fh:
                json.dump({"files": rows}, fh, indent=2)
        return
    tasks = TaskSet([Task("bench", "benchmark task", {"answer": "0"})], name="bench")
    env = PythonMathEnv(tasks=tasks, max_turns=1000)
    rows = []
    for cells in (1, 10, 100):
        env.reset(seed=0, options={"task_id": "bench"})
        for i in range(cells):
            env.step(_call(_cell(i)))
        snap = env.snapshot()
        snapshot_ms = median_ms(lambda: env.snapshot().release(), args.repeats)
        restore_ms = median_ms(lambda snap=snap: env.restore(snap), args.repeats)
        sandbox = env._sandbox
        assert sandbox is not None

        def replay(n=cells, sandbox=sandbox) -> None:
            sandbox.thaw(sandbox.base)
            sandbox.seed(0)
            for i in range(n):
                sandbox.run(_cell(i))

        replay_ms = median_ms(replay, max(3, args.repeats // (5 if cells >= 100 else 1)))
        env.restore(snap)
        rows.append({"cells": cells, "snapshot_ms": snapshot_ms, "restore_fork_ms": restore_ms,
                     "restore_replay_ms": replay_ms, "replay_over_fork": replay_ms / restore_ms})
        snap.release()
    one_cell = rows[0]["restore_fork_ms"]
    for row in rows:
        row["restore_vs_1_cell"] = row["restore_fork_ms"] / one_cell

    env.reset(seed=0, options={"task_id": "bench"})
    sandbox = env._sandbox
    persistent_ms = median_ms(lambda: sandbox.run("x = sum(range(1000))\nprint(x)"), args.repeats)
    fresh_ms = median_ms(
        lambda: subprocess.run([sys.executable, "-c", "x = sum(range(1000))\nprint(x)"], check=True,
                               capture_output=True), max(5, args.repeats // 5))
    cell_ms = median_ms(lambda: sandbox.run(_cell(0)), args.repeats)
    env.close()

    print(f"{'cells':>6} {'snapshot ms':>12} {'restore (fork) ms':>18} {'restore (replay) ms':>20} "
          f"{'replay/fork':>12} {'restore vs 1 cell':>18}")
    for r in rows:
        print(f"{r['cells']:>6} {r['snapshot_ms']:>12.2f} {r['restore_fork_ms']:>18.2f} "
              f"{r['restore_replay_ms']:>20.2f} {r['replay_over_fork']:>11.1f}x {r['restore_vs_1_cell']:>17.2f}x")
    print(f"\na benchmark cell costs {cell_ms:.2f} ms to execute in the live interpreter")
    print(f"per cell: persistent sandbox {persistent_ms:.2f} ms, fresh `python -c` {fresh_ms:.2f} ms "
          f"-> {fresh_ms / persistent_ms:.1f}x faster persistent")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"restore": rows, "persistent_cell_ms": persistent_ms, "python_c_ms": fresh_ms,
                       "benchmark_cell_ms": cell_ms}, fh, indent=2)


if __name__ == "__main__":
    main()
