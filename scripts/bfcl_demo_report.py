"""Measurements of BFCL-v0's demo policy for docs/paper/bfcl/: context lengths, success spread, mixed prefixes.

    .venv/bin/python scripts/bfcl_demo_report.py contexts --out docs/paper/bfcl/context_lengths.json
    .venv/bin/python scripts/bfcl_demo_report.py eval --out docs/paper/bfcl/eval.json [--tasks 20 --samples 4]
    .venv/bin/python scripts/bfcl_demo_report.py turns --out docs/paper/bfcl/turns.json [--tasks 10 --samples 2]
    .venv/bin/python scripts/bfcl_demo_report.py first-steps --split test --tasks 50 --out FILE [--policy-path DIR] \\
        [--checkpoint DIR/.build-first-turns]
    .venv/bin/python scripts/bfcl_demo_report.py copying --split test --out FILE [--policy-path DIR] \\
        [--cases real,made_up,bare,list,any_order] [--checkpoint DIR/.build-first-turns]
    .venv/bin/python scripts/bfcl_demo_report.py spelling --out docs/paper/bfcl/spelling.json
    .venv/bin/python scripts/bfcl_demo_report.py prefixes --trees artifacts/bench-bfcl/trees.jsonl \\
        --out docs/paper/bfcl/prefixes.json

* ``contexts``: root-context tokens of the 50 test entries with full / compact / names tool schemas, under
  PythonMath's shipped tokenizer (what ``--policy demo`` loaded on BFCL before it had its own) and BFCL's.
* ``eval``: per-entry success rates of the shipped policy or ``--policy-path DIR`` (``evaluate_policy``, temperature 1 or ``--temperature``) on the
  demonstrated train entries, on undemonstrated train entries and on held-out test entries.
* ``turns``: per user-turn index, the share of episodes whose turn passes BFCL's turn check (state and
  results), and of episodes still valid through that turn, on demonstrated train entries (``--split test``:
  on held-out test entries).
* ``first-steps``: greedy, the policy's first step on the first ``--tasks`` entries of a split (``train``: the
  demonstrated ones): how many are exactly the ground truth's first call list (positional arguments read as
  keywords), how many parse, and how many of the string arguments the policy wrote appear in the first user
  turn (copied from the user) against the ground truth's.
* ``copying``: teacher-forced on the ground truth's first call list of each entry of a split, for every string
  argument the user writes in the first question, whether the policy's most likely next token is right at the
  name's *first* token (choosing which name to copy) and at its *later* tokens (continuing a copy), against
  the other tokens of the call (the syntax and function names). ``--cases`` adds the same with the user's names
  made up (``made_up``: no model can have memorised them), that without the system prompt and tools (``bare``),
  and the build's list drills (``list``, ``any_order``; :meth:`BFCLDemonstrator.copy_drills`); ``--checkpoint``
  (``first-steps`` too) measures a build stage's checkpoint on a built policy's tokenizer and shape.
* ``spelling``: of the ground truth's first-turn string arguments that the user writes in the first question (the
  names a policy must copy), on every entry of a split, how many the tokenizer spells with the same tokens in the
  question and in the call, under each pre-tokenizer split of the demo tokenizer (``SPLIT_PATTERNS``). Measured on
  pre-token boundaries: when the name starts and ends on one in both texts, BPE gives it the same tokens in both.
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
    from trace_agent.demo.demonstrators.bfcl import BFCLDemonstrator

    config = json.loads((policy_dir / "build_report.json").read_text())["config"]
    options = dict((config.get("demonstrator_options") or {}).get(ENV_ID, {}))
    return BFCLDemonstrator(**options).demonstration_tasks().ids()


def _policy_dir(args: argparse.Namespace) -> Path:
    from trace_agent.demo.shipped import shipped_demo_policy

    return Path(args.policy_path) if args.policy_path else shipped_demo_policy(ENV_ID)


def contexts(args: argparse.Namespace) -> dict:
    import gymnasium as gym
    from transformers import AutoTokenizer

    import trace_envs  # noqa: F401
    from trace_agent.demo.shipped import SHIPPED_DEMO_POLICIES
    from trace_agent.policy.chat import ChatRenderer

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
    from trace_agent.demo.shipped import load_demo_policy
    from trace_agent.policy.episodes import evaluate_policy, success_histogram

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
    out: dict = {"samples": args.samples, "temperature": args.temperature, "max_new_tokens": args.max_new_tokens,
                 "max_turns": args.max_turns, "seed": args.seed}
    for name, (split, ids) in groups.items():
        t0 = time.perf_counter()
        results = evaluate_policy(policy, ENV_ID, ids, samples=args.samples, temperature=args.temperature,
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
    from trace_agent.demo.shipped import load_demo_policy
    from trace_agent.policy.episodes import observation_messages

    policy_dir = _policy_dir(args)
    policy = load_demo_policy(policy_dir)
    ids = _entry_ids(gym.make(ENV_ID, tasks=args.split).unwrapped, policy_dir, args.split, args.tasks)
    envs = [gym.make(ENV_ID, tasks=args.split, tool_detail="names", max_turns=args.max_turns).unwrapped
            for _ in range(len(ids) * args.samples)]
    contexts, checks, parse_errors, steps = [], [], 0, 0
    for k, env in enumerate(envs):
        env.reset(seed=args.seed + k, options={"task_id": ids[k // args.samples]})
        contexts.append(policy.render(env.messages, env.tools))
        checks.append([])
    alive, turn = list(range(len(envs))), 0
    while alive:
        gens = policy.generate([contexts[k] for k in alive], max_new_tokens=args.max_new_tokens, temperature=args.temperature,
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
    return {"split": args.split, "tasks": ids, "samples": args.samples, "temperature": args.temperature, "seed": args.seed, "steps": steps,
            "steps_with_parse_errors": parse_errors, "episodes_valid": sum(all(c) and bool(c) for c in checks),
            "episodes": len(checks), "by_user_turn": by_turn}


def _load_policy(args: argparse.Namespace):
    """The measured policy's directory and the policy; with ``--checkpoint``, a demo-build stage's weights
    (:mod:`trace_agent.checkpoint`, ``DIR/.build*``) on that policy's tokenizer and shape."""
    from trace_agent.demo.shipped import load_demo_policy

    policy_dir = _policy_dir(args)
    policy = load_demo_policy(policy_dir)
    if getattr(args, "checkpoint", ""):
        from trace_agent.checkpoint import read_checkpoint

        policy.model.load_state_dict(read_checkpoint(args.checkpoint)["model"])
        policy.model.eval()
    return policy_dir, policy


def _entry_ids(env, policy_dir: Path, split: str, tasks: int) -> list[str]:
    """The first ``tasks`` entries measured on ``split``: the policy's demonstrated ones on train, else ``env``'s."""
    return (demonstrated_ids(policy_dir) if split == "train" else env.tasks.ids())[:tasks]


def _first_turn(env, task_id: str) -> tuple[str, list]:
    """``env`` reset to ``task_id``: its first user question and the ground truth's first-turn calls."""
    env.reset(options={"task_id": task_id})
    question = next(m["content"] for m in env.messages if m.get("role") == "user")
    return question, list(env.ground_truth().turns[0].calls)


def _keyword_sources(env, calls) -> list[str] | None:
    try:
        return [c.to_source() for c in env.keyword_calls(calls)]
    except ValueError:  # a function or arguments the entry's backends do not have: not the ground truth
        return None


def first_steps(args: argparse.Namespace) -> dict:
    import gymnasium as gym

    import trace_envs  # noqa: F401
    from trace_agent.demo.demonstrators.bfcl import call_string_arguments
    from trace_envs.actions import parse_call_list
    from trace_envs.function_calling.env import render_calls

    policy_dir, policy = _load_policy(args)
    env = gym.make(ENV_ID, tasks=args.split, tool_detail="names").unwrapped
    ids = _entry_ids(env, policy_dir, args.split, args.tasks)
    rows, contexts, truths = [], [], []
    for task_id in ids:
        question, calls = _first_turn(env, task_id)
        contexts.append(policy.render(env.messages, env.tools))
        truths.append((question, _keyword_sources(env, calls), call_string_arguments(render_calls(calls))))
    gens = policy.generate(contexts, max_new_tokens=args.max_new_tokens, temperature=0.0)
    for task_id, g, (question, truth, truth_args) in zip(ids, gens, truths):
        env.reset(options={"task_id": task_id})  # its backends read the generated calls' arguments
        parsed = parse_call_list(g.text)
        wrote = call_string_arguments(g.text)
        rows.append({"task_id": task_id, "text": g.text, "parses": not parsed.errors,
                     "exact": not parsed.errors and _keyword_sources(env, parsed.calls) == truth,
                     "args": len(wrote), "args_in_question": sum(a in question for a in wrote),
                     "truth_args": len(truth_args), "truth_args_in_question": sum(a in question for a in truth_args),
                     "truth_args_in_question_written": sum(a in question and a in wrote for a in truth_args)})
    total = {k: sum(int(r[k]) for r in rows) for k in ("exact", "parses", "args", "args_in_question", "truth_args",
                                                       "truth_args_in_question", "truth_args_in_question_written")}
    return {"policy": str(policy_dir), "split": args.split, "entries": len(rows), "greedy": True,
            "max_new_tokens": args.max_new_tokens, **total, "rows": rows}


#: ``copying --cases``: the ground truth's first call on each entry as is, with the user's names made up (in the
#: question and the call), the same without system prompt and tools, and the build's list drills
COPY_CASES = ("real", "made_up", "bare", "list", "any_order")


def _copy_cases(env, ids: list[str], kinds: list[str], seed: int) -> dict[str, list[tuple[list, list, str]]]:
    """Per case kind, (context messages, tools, call text) triples; the call is what is teacher-forced."""
    import numpy as np

    from trace_agent.demo.demonstrators import collect_demonstrations
    from trace_agent.demo.demonstrators.bfcl import (
        BFCLDemonstrator,
        made_up_words,
        rename_names,
        spelled_names,
    )
    from trace_envs.function_calling.env import render_calls

    rng = np.random.default_rng(seed)
    cases: dict[str, list[tuple[list, list, str]]] = {k: [] for k in kinds}
    for task_id in ids:
        _, calls = _first_turn(env, task_id)
        text = render_calls(env.keyword_calls(calls))
        messages = [dict(m) for m in env.messages]
        if "real" in cases:
            cases["real"].append((messages, list(env.tools), text))
        if "made_up" in cases or "bare" in cases:
            pair = [messages[-1], {"role": "assistant", "content": text}]
            (user, call), _ = rename_names(pair, spelled_names(pair), made_up_words(rng), rng)
            if "made_up" in cases:
                cases["made_up"].append(([*messages[:-1], user], list(env.tools), call["content"]))
            if "bare" in cases:
                cases["bare"].append(([user], [], call["content"]))
    if "list" in cases or "any_order" in cases:
        demos = collect_demonstrations(ENV_ID, limit=10, demos_per_task=1, flawed_fraction=0.0, seed=seed,
                                       max_turns=20)
        for drill in BFCLDemonstrator().copy_drills(demos, 2 * len(ids), rng, list_share=1.0):
            user, call = drill.messages
            kind = "any_order" if "any order" in user["content"] else "list"
            if kind in cases:
                cases[kind].append(([dict(user)], [], call["content"]))
    return cases


def copying(args: argparse.Namespace) -> dict:
    import gymnasium as gym
    import torch

    import trace_envs  # noqa: F401
    from trace_agent.demo.demonstrators.bfcl import call_string_arguments

    policy_dir, policy = _load_policy(args)
    env = gym.make(ENV_ID, tasks=args.split, tool_detail="names").unwrapped
    ids = _entry_ids(env, policy_dir, args.split, args.tasks)
    kinds = [k.strip() for k in args.cases.split(",") if k.strip()]
    unknown = sorted(set(kinds) - set(COPY_CASES))
    if unknown or not kinds:
        raise SystemExit(f"--cases takes a comma-separated subset of {', '.join(COPY_CASES)}, got {args.cases!r}")
    out: dict = {"policy": str(policy_dir), "checkpoint": args.checkpoint or None, "split": args.split,
                 "entries": len(ids), "teacher_forced": True}
    for kind, cases in _copy_cases(env, ids, kinds, args.seed).items():
        right = {"first": [0, 0], "later": [0, 0], "other": [0, 0]}  # [right, total] per kind of call token
        for messages, tools, text in cases:
            question = next(m["content"] for m in reversed(messages) if m.get("role") == "user")
            enc = policy.tokenizer(text, return_offsets_mapping=True, add_special_tokens=False)
            token_kind = ["other"] * len(enc["input_ids"])
            for name in {n for n in call_string_arguments(text) if n in question}:
                at = 0
                while (at := text.find(repr(name), at)) >= 0:
                    start, end = at + 1, at + 1 + len(name)
                    inside = [i for i, (a, b) in enumerate(enc["offset_mapping"]) if start <= a and b <= end and b > a]
                    for j, i in enumerate(inside):
                        token_kind[i] = "first" if j == 0 else "later"
                    at = end
            context = list(policy.render(messages, tools).token_ids)
            full = torch.tensor([context + list(enc["input_ids"])])
            with torch.no_grad():
                guess = policy.model(input_ids=full).logits[0, len(context) - 1:-1].argmax(-1).tolist()
            for k, g, t in zip(token_kind, guess, enc["input_ids"]):
                right[k][0] += int(g == t)
                right[k][1] += 1
        summary = {k: {"right": r, "tokens": n, "share": round(r / n, 3) if n else None} for k, (r, n) in right.items()}
        if kind == "real":
            out.update(summary)
        else:
            out[kind] = {"calls": len(cases), **summary}
    return out


def spelling(args: argparse.Namespace) -> dict:
    import gymnasium as gym
    from tokenizers import Regex, pre_tokenizers

    import trace_envs  # noqa: F401
    from trace_agent.demo.demonstrators.bfcl import call_string_arguments
    from trace_agent.demo.model import SPLIT_PATTERNS
    from trace_envs.function_calling.env import render_calls

    env = gym.make(ENV_ID, tasks=args.split, tool_detail="names").unwrapped
    cases = []  # (question, call text, name, where in the question, where in the call)
    for task_id in env.tasks.ids():
        question, calls = _first_turn(env, task_id)
        text = render_calls(env.keyword_calls(calls))
        for name in call_string_arguments(text):
            at, quoted = question.find(name), text.find(repr(name))
            if at >= 0 and quoted >= 0:
                cases.append((question, text, name, at, quoted + 1))

    def on_boundaries(splitter, text: str, start: int, end: int) -> bool:
        cuts = {edge for _, span in splitter.pre_tokenize_str(text) for edge in span}
        return start in cuts and end in cuts

    out: dict = {"split": args.split, "entries": len(env.tasks.ids()), "names_in_question": len(cases)}
    for split, pattern in SPLIT_PATTERNS.items():
        splitter = pre_tokenizers.Split(Regex(pattern), behavior="isolated")
        alike = [on_boundaries(splitter, q, a, a + len(n)) and on_boundaries(splitter, t, c, c + len(n))
                 for q, t, n, a, c in cases]
        out[split] = {"spelled_alike": sum(alike),
                      "examples_not_alike": [q[max(0, a - 8):a + len(n) + 4] for (q, _, n, a, _), ok
                                             in zip(cases, alike) if not ok][:5]}
    return out


def prefixes(args: argparse.Namespace) -> dict:
    from trace_agent.analysis import prefix_mixing
    from trace_agent.tree_io import load_jsonl

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
    e.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (> 0)")
    t = sub.add_parser("turns")
    t.add_argument("--out", required=True)
    t.add_argument("--tasks", type=int, default=10)
    t.add_argument("--split", choices=("train", "test"), default="train",
                   help="train: the demonstrated entries; test: the held-out entries")
    t.add_argument("--samples", type=int, default=2)
    t.add_argument("--max-new-tokens", type=int, default=96)
    t.add_argument("--max-turns", type=int, default=16)
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (> 0)")
    f = sub.add_parser("first-steps")
    f.add_argument("--max-new-tokens", type=int, default=96)
    c = sub.add_parser("copying")
    c.add_argument("--cases", default="real", help=f"comma-separated, of: {', '.join(COPY_CASES)}")
    c.add_argument("--seed", type=int, default=0, help="seeds the made-up names and the drills")
    for command in (f, c):
        command.add_argument("--checkpoint", default="", help="a demo-build stage checkpoint (DIR/.build*) to load "
                             "instead of the policy's weights; same tokenizer and shape as --policy-path")
        command.add_argument("--out", required=True)
        command.add_argument("--tasks", type=int, default=50)
        command.add_argument("--split", choices=("train", "test"), default="test",
                             help="train: the demonstrated entries; test: the held-out entries")
    for command in (e, t, f, c):
        command.add_argument("--policy-path", default="", help="a built policy directory (default: the shipped one)")
    w = sub.add_parser("spelling")
    w.add_argument("--out", required=True)
    w.add_argument("--split", choices=("train", "test"), default="test")
    p = sub.add_parser("prefixes")
    p.add_argument("--trees", required=True)
    p.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    result = {"contexts": contexts, "eval": evaluate, "turns": turns, "first-steps": first_steps,
              "copying": copying, "spelling": spelling, "prefixes": prefixes}[args.what](args)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1)[:3000])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
