"""Measurements of BFCL-v0's demo policy for docs/paper/bfcl/: context lengths, success spread, mixed prefixes.

    .venv/bin/python scripts/bfcl_demo_report.py contexts --out docs/paper/bfcl/context_lengths.json
    .venv/bin/python scripts/bfcl_demo_report.py eval --out docs/paper/bfcl/eval.json [--tasks 20 --samples 4]
    .venv/bin/python scripts/bfcl_demo_report.py turns --out docs/paper/bfcl/turns.json [--tasks 10 --samples 2]
    .venv/bin/python scripts/bfcl_demo_report.py prefixes --trees artifacts/bench-bfcl/trees.jsonl \\
        --out docs/paper/bfcl/prefixes.json

* ``contexts``: root-context tokens of the 50 test entries with full / compact / names tool schemas, under
  PythonMath's shipped tokenizer (what ``--policy demo`` loaded on BFCL before it had its own) and BFCL's.
* ``eval``: per-entry success rates of the shipped policy or ``--policy-path DIR`` (``evaluate_policy``, temperature 1) on the
  demonstrated train entries, on undemonstrated train entries and on held-out test entries.
* ``turns``: per user-turn index, the share of episodes whose turn passes BFCL's turn check (state and
  results), and of episodes still valid through that turn, on demonstrated train entries (``--split test``:
  on held-out test entries).
* ``prefixes``: from a ``trace-gym bench`` run's trees, per strategy, the branch points at depth >= 1 and the
  share whose continuations are mixed (a success and a failure below them), by depth.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

ENV_ID = "trace_envs/BFCL-v0"


def _stats(values: list[int]) -> dict[str, float]:
    import numpy as np

    a = np.asarray(values, dtype=float)
    return {"min": float(a.min()), "mean": round(float(a.mean()), 1), "p90": float(np.percentile(a, 90)),
            "max": float(a.max())}


def demonstrated_ids(policy_dir: Path) -> list[str]:
    """The train entries a built BFCL policy was warm-started on: its ``build_report.json`` names the
    demonstrator's options (``num_tasks``; a report without them is a 40-entry build)."""
    from trace_agent.policy.demonstrators.bfcl import BFCLDemonstrator

    config = json.loads((policy_dir / "build_report.json").read_text())["config"]
    options = dict((config.get("demonstrator_options") or {}).get(ENV_ID, {}))
    return BFCLDemonstrator(**options).demonstration_tasks().ids()


def _policy_dir(args: argparse.Namespace) -> Path:
    from trace_agent.policy.demo import shipped_demo_policy

    return Path(args.policy_path) if args.policy_path else shipped_demo_policy(ENV_ID)


def contexts(args: argparse.Namespace) -> dict:
    import gymnasium as gym
    from transformers import AutoTokenizer

    import trace_envs  # noqa: F401
    from trace_agent.policy.chat import ChatRenderer
    from trace_agent.policy.demo import SHIPPED_DEMO_POLICIES

    out: dict = {}
    for label, env_id in (("pythonmath_tokenizer", "trace_envs/PythonMath-v0"), ("bfcl_tokenizer", ENV_ID)):
        chat = ChatRenderer(AutoTokenizer.from_pretrained(str(SHIPPED_DEMO_POLICIES[env_id])))
        for detail in ("full", "compact", "names"):
            env = gym.make(ENV_ID, tasks="test", tool_detail=detail).unwrapped
            lengths = []
            for task_id in env.tasks.ids():
                env.reset(options={"task_id": task_id})
                lengths.append(len(chat.render(env.messages, env.tools)))
            env.close()
            out[f"{label}/{detail}"] = _stats(lengths)
    return out


def evaluate(args: argparse.Namespace) -> dict:
    import gymnasium as gym

    import trace_envs  # noqa: F401
    from trace_agent.policy.demo import evaluate_policy, load_demo_policy, success_histogram

    policy_dir = _policy_dir(args)
    policy = load_demo_policy(policy_dir)
    demo_ids = demonstrated_ids(policy_dir)
    train = gym.make(ENV_ID, tasks="train").unwrapped.tasks.ids()
    test = gym.make(ENV_ID, tasks="test").unwrapped.tasks.ids()
    groups = {
        "demonstrated_train": ("train", demo_ids[:args.tasks]),
        "undemonstrated_train": ("train", [t for t in train if t not in set(demo_ids)][:args.other_tasks]),
        "heldout_test": ("test", test[:args.other_tasks]),
    }
    out: dict = {"samples": args.samples, "temperature": 1.0, "max_new_tokens": args.max_new_tokens,
                 "max_turns": args.max_turns, "seed": args.seed}
    for name, (split, ids) in groups.items():
        t0 = time.perf_counter()
        results = evaluate_policy(policy, ENV_ID, ids, samples=args.samples, temperature=1.0,
                                  max_new_tokens=args.max_new_tokens, max_turns=args.max_turns, seed=args.seed,
                                  env_kwargs={"tasks": split, "tool_detail": "names"})
        summary = success_histogram(results)
        summary["rates"] = dict(zip(ids, summary["rates"]))
        summary["seconds"] = round(time.perf_counter() - t0, 1)
        out[name] = summary
        print(name, json.dumps({k: v for k, v in summary.items() if k != "rates"}), flush=True)
    out["context_cuts"] = policy.context_cuts
    return out


def turns(args: argparse.Namespace) -> dict:
    import gymnasium as gym

    import trace_envs  # noqa: F401
    from trace_agent.policy.demo import load_demo_policy, observation_messages

    policy_dir = _policy_dir(args)
    policy = load_demo_policy(policy_dir)
    if args.split == "train":
        ids = demonstrated_ids(policy_dir)[:args.tasks]
    else:
        ids = gym.make(ENV_ID, tasks="test").unwrapped.tasks.ids()[:args.tasks]
    envs = [gym.make(ENV_ID, tasks=args.split, tool_detail="names", max_turns=args.max_turns).unwrapped
            for _ in range(len(ids) * args.samples)]
    contexts, checks, parse_errors, steps = [], [], 0, 0
    for k, env in enumerate(envs):
        env.reset(seed=args.seed + k, options={"task_id": ids[k // args.samples]})
        contexts.append(policy.render(env.messages, env.tools))
        checks.append([])
    alive, turn = list(range(len(envs))), 0
    while alive:
        gens = policy.generate([contexts[k] for k in alive], max_new_tokens=args.max_new_tokens, temperature=1.0,
                               seeds=[args.seed * 7919 + 101 * k + turn for k in alive])
        still = []
        for k, g in zip(alive, gens):
            _, _, terminated, truncated, info = envs[k].step(g.text)
            steps += 1
            parse_errors += "parse_error" in info
            if "turn_checks" in info:
                checks[k] = [bool(c["valid"]) for c in info["turn_checks"]]
            if not (terminated or truncated):
                contexts[k] = policy.extend(contexts[k], g, observation_messages(envs[k].messages))
                still.append(k)
        alive, turn = still, turn + 1
    depth = max(len(c) for c in checks)
    by_turn = {}
    for t in range(depth):
        have = [c for c in checks if len(c) > t]
        by_turn[str(t)] = {"episodes": len(have), "turn_passes": round(sum(c[t] for c in have) / len(have), 3),
                           "valid_through_turn": round(sum(all(c[:t + 1]) for c in have) / len(have), 3)}
    return {"split": args.split, "tasks": ids, "samples": args.samples, "temperature": 1.0, "seed": args.seed, "steps": steps,
            "steps_with_parse_errors": parse_errors, "episodes_valid": sum(all(c) and bool(c) for c in checks),
            "episodes": len(checks), "by_user_turn": by_turn}


def prefixes(args: argparse.Namespace) -> dict:
    from trace_agent.analysis import prefix_mixing
    from trace_agent.tree import load_jsonl

    result = {}
    for name, r in sorted(prefix_mixing(load_jsonl(args.trees)).items()):
        total = r["depth>=1"]
        result[name] = {"branch_points_depth_ge_1": total["branch_points"], "mixed": total["mixed"],
                        "mixed_share": round(total["share_mixed"], 3) if total["branch_points"] else None,
                        "by_depth": r["by_depth"]}
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="what", required=True)
    sub.add_parser("contexts").add_argument("--out", required=True)
    e = sub.add_parser("eval")
    e.add_argument("--out", required=True)
    e.add_argument("--tasks", type=int, default=20, help="demonstrated train entries")
    e.add_argument("--other-tasks", type=int, default=10, help="undemonstrated train and held-out test entries")
    e.add_argument("--samples", type=int, default=4)
    e.add_argument("--max-new-tokens", type=int, default=128)
    e.add_argument("--max-turns", type=int, default=20)
    e.add_argument("--seed", type=int, default=0)
    t = sub.add_parser("turns")
    t.add_argument("--out", required=True)
    t.add_argument("--tasks", type=int, default=10)
    t.add_argument("--split", choices=("train", "test"), default="train",
                   help="train: the demonstrated entries; test: the held-out entries")
    t.add_argument("--samples", type=int, default=2)
    t.add_argument("--max-new-tokens", type=int, default=96)
    t.add_argument("--max-turns", type=int, default=16)
    t.add_argument("--seed", type=int, default=0)
    for command in (e, t):
        command.add_argument("--policy-path", default="", help="a built policy directory (default: the shipped one)")
    p = sub.add_parser("prefixes")
    p.add_argument("--trees", required=True)
    p.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    result = {"contexts": contexts, "eval": evaluate, "turns": turns, "prefixes": prefixes}[args.what](args)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1)[:3000])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
