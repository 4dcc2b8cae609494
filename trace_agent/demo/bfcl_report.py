"""Measurements of BFCL-v0's demo policy (docs/paper/bfcl/): context lengths, success spread, probes, mixed prefixes.

Each function returns one report as a JSON-ready dict (``scripts/bfcl_demo_report.py`` writes them):

* :func:`context_lengths`: root-context tokens of the 50 test entries with full / compact / names tool
  schemas, under PythonMath's shipped tokenizer and BFCL's.
* :func:`success_spread`: per-entry success rates of a policy on the demonstrated train entries, on
  undemonstrated train entries and on held-out test entries (:func:`~trace_agent.evaluation.evaluate`).
* :func:`turn_checks`: per user-turn index, the share of episodes whose turn passes BFCL's turn check
  (state and results), and of episodes still valid through that turn, on demonstrated train entries
  (``split="test"``: on held-out test entries); episodes played by :func:`~trace_agent.evaluation.evaluate`.
* :func:`first_steps`: greedy, the policy's first step on the first ``tasks`` entries of a split
  (``train``: the demonstrated ones): how many are exactly the ground truth's first call list
  (positional arguments read as keywords), how many parse, and how many of the string arguments the
  policy wrote appear in the first user turn (copied from the user) against the ground truth's.
* :func:`copying`: teacher-forced on the ground truth's first call list of each entry of a split, for
  every string argument the user writes in the first question, whether the policy's most likely next
  token is right at the name's *first* token (choosing which name to copy) and at its *later* tokens
  (continuing a copy), against the other tokens of the call (the syntax and function names). More
  :data:`COPY_CASES`: the same with the user's names made up (``made_up``: no model can have memorised
  them), that without the system prompt and tools (``bare``), and the build's list drills (``list``,
  ``any_order``; :meth:`~trace_agent.demo.demonstrators.bfcl.BFCLDemonstrator.copy_drills`).
* :func:`spelling`: of the ground truth's first-turn string arguments that the user writes in the first
  question (the names a policy must copy), on every entry of a split, how many the tokenizer spells with
  the same tokens in the question and in the call, under each pre-tokenizer split of the demo tokenizer
  (:data:`~trace_agent.demo.model.SPLIT_PATTERNS`). Measured on pre-token boundaries: when the name
  starts and ends on one in both texts, BPE gives it the same tokens in both.
* :func:`prefixes`: from a ``trace-gym bench`` run's trees, per strategy, the branch points at depth >= 1
  and the share whose continuations are mixed (a success and a failure below them), by depth.

``policy_path`` is a built policy directory (None: the shipped BFCL-v0 policy); ``checkpoint`` (the
probes) a demo-build stage's checkpoint (``DIR/.build*``, :mod:`trace_agent.checkpoint`) loaded on that
policy's tokenizer and shape. Importing this module imports neither torch nor transformers.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from trace_agent.demo.profiles import BFCL, PYTHON_MATH

ENV_ID = BFCL

#: :func:`copying`'s cases: the ground truth's first call on each entry as is, with the user's names made up (in
#: the question and the call), the same without system prompt and tools, and the build's list drills
COPY_CASES = ("real", "made_up", "bare", "list", "any_order")

__all__ = ["ENV_ID", "COPY_CASES", "demonstrated_ids", "load_probed_policy", "context_lengths", "success_spread",
           "turn_checks", "first_steps", "check_cases", "copying", "spelling", "prefixes"]


def _stats(values: list[int]) -> dict[str, float]:
    import numpy as np

    a = np.asarray(values, dtype=float)
    return {"min": float(a.min()), "mean": round(float(a.mean()), 1), "p90": float(np.percentile(a, 90)),
            "max": float(a.max())}


def demonstrated_ids(policy_dir: Path) -> list[str]:
    """The train entries a built BFCL policy was warm-started on: its ``build_report.json`` names the
    demonstrator's options (``num_tasks``; a report without them is a 40-entry build)."""
    import json

    from trace_agent.demo.demonstrators.bfcl import BFCLDemonstrator

    config = json.loads((Path(policy_dir) / "build_report.json").read_text())["config"]
    options = dict((config.get("demonstrator_options") or {}).get(ENV_ID, {}))
    return BFCLDemonstrator(**options).demonstration_tasks().ids()


def load_probed_policy(policy_path: str | Path | None = None, checkpoint: str | Path | None = None) -> tuple[Path, Any]:
    """The measured policy's directory and the policy (``policy_path``, None: the shipped one); with
    ``checkpoint``, a demo-build stage's weights on that policy's tokenizer and shape."""
    from trace_agent.demo.shipped import load_demo_policy, shipped_demo_policy

    policy_dir = Path(policy_path) if policy_path else shipped_demo_policy(ENV_ID)
    policy = load_demo_policy(policy_dir)
    if checkpoint:
        from trace_agent.checkpoint import read_checkpoint

        policy.model.load_state_dict(read_checkpoint(checkpoint)["model"])
        policy.model.eval()
    return policy_dir, policy


def _make(split: str, max_turns: int) -> Any:
    """A factory of BFCL-v0 envs on ``split`` with tools rendered by name (what the demo policy reads)."""
    from trace_agent.env_factory import make_env_factory

    return make_env_factory(ENV_ID, None, max_turns=max_turns, env_kwargs={"tasks": split, "tool_detail": "names"})


def _env(split: str) -> Any:
    """A BFCL-v0 env on ``split`` with tools rendered by name and the env's default turn limit."""
    import gymnasium as gym

    import trace_envs  # noqa: F401

    return gym.make(ENV_ID, tasks=split, tool_detail="names").unwrapped


def _entry_ids(env: Any, policy_dir: Path, split: str, tasks: int) -> list[str]:
    """The first ``tasks`` entries measured on ``split``: the policy's demonstrated ones on train, else ``env``'s."""
    return (demonstrated_ids(policy_dir) if split == "train" else env.tasks.ids())[:tasks]


def context_lengths() -> dict[str, Any]:
    """Root-context tokens of the test entries per tokenizer and tool detail (see the module docstring)."""
    import gymnasium as gym
    from transformers import AutoTokenizer

    import trace_envs  # noqa: F401
    from trace_agent.demo.shipped import SHIPPED_DEMO_POLICIES
    from trace_agent.policy.chat import ChatRenderer

    out: dict[str, Any] = {}
    for label, env_id in (("pythonmath_tokenizer", PYTHON_MATH), ("bfcl_tokenizer", ENV_ID)):
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


def success_spread(policy_path: str | Path | None = None, *, tasks: int = 20, other_tasks: int = 10,
                   samples: int = 4, max_new_tokens: int = 128, max_turns: int = 20, seed: int = 0,
                   temperature: float = 1.0, log: Any = print) -> dict[str, Any]:
    """Per-entry success rates on ``tasks`` demonstrated train entries and ``other_tasks`` undemonstrated
    train and held-out test entries, ``samples`` episodes each (:func:`~trace_agent.evaluation.evaluate`,
    seeded with ``seed``); ``log`` gets one line per group."""
    import json

    from trace_agent.env_factory import task_ids
    from trace_agent.evaluation import evaluate, success_histogram
    from trace_agent.policy.base import SamplingConfig

    policy_dir, policy = load_probed_policy(policy_path)
    demo_ids = demonstrated_ids(policy_dir)
    train = task_ids(ENV_ID, None, env_kwargs={"tasks": "train"})
    test = task_ids(ENV_ID, None, env_kwargs={"tasks": "test"})
    groups = {
        "demonstrated_train": ("train", demo_ids[:tasks]),
        "undemonstrated_train": ("train", [t for t in train if t not in set(demo_ids)][:other_tasks]),
        "heldout_test": ("test", test[:other_tasks]),
    }
    sampling = SamplingConfig(max_new_tokens=max_new_tokens, temperature=temperature)
    out: dict[str, Any] = {"samples": samples, "temperature": temperature, "max_new_tokens": max_new_tokens,
                           "max_turns": max_turns, "seed": seed}
    for name, (split, ids) in groups.items():
        t0 = time.perf_counter()
        results = evaluate(policy, _make(split, max_turns), ids, samples=samples, sampling=sampling, seed=seed)
        summary = success_histogram(results)
        summary["rates"] = dict(zip(ids, summary["rates"]))
        summary["seconds"] = round(time.perf_counter() - t0, 1)
        out[name] = summary
        log(f"{name} {json.dumps({k: v for k, v in summary.items() if k != 'rates'})}")
    out["context_cuts"] = policy.context_cuts
    return out


def turn_checks(policy_path: str | Path | None = None, *, split: str = "train", tasks: int = 10, samples: int = 2,
                max_new_tokens: int = 96, max_turns: int = 16, seed: int = 0,
                temperature: float = 1.0) -> dict[str, Any]:
    """Per user turn, the share of episodes passing BFCL's turn check, on ``tasks`` entries of ``split``
    (``train``: the demonstrated ones) x ``samples`` episodes (:func:`~trace_agent.evaluation.evaluate`,
    seeded with ``seed``); also steps and the steps that did not parse."""
    from trace_agent.evaluation import evaluate
    from trace_agent.policy.base import SamplingConfig

    policy_dir, policy = load_probed_policy(policy_path)
    make = _make(split, max_turns)
    env = make()
    try:
        ids = _entry_ids(env, policy_dir, split, tasks)
    finally:
        env.close()
    checks: dict[tuple[str, int], list[bool]] = {(t, k): [] for t in ids for k in range(samples)}
    counts = {"steps": 0, "parse_errors": 0}

    def stepped(task_id: str, sample: int, info: Any) -> None:
        counts["steps"] += 1
        counts["parse_errors"] += "parse_error" in info
        if "turn_checks" in info:
            checks[task_id, sample] = [bool(c["valid"]) for c in info["turn_checks"]]

    evaluate(policy, make, ids, samples=samples, sampling=SamplingConfig(max_new_tokens=max_new_tokens,
                                                                         temperature=temperature),
             seed=seed, on_step=stepped)
    episodes = list(checks.values())
    by_turn = {}
    for t in range(max(len(c) for c in episodes)):
        have = [c for c in episodes if len(c) > t]
        by_turn[str(t)] = {"episodes": len(have), "turn_passes": round(sum(c[t] for c in have) / len(have), 3),
                           "valid_through_turn": round(sum(all(c[:t + 1]) for c in have) / len(have), 3)}
    return {"split": split, "tasks": ids, "samples": samples, "temperature": temperature, "seed": seed,
            "steps": counts["steps"], "steps_with_parse_errors": counts["parse_errors"],
            "episodes_valid": sum(all(c) and bool(c) for c in episodes), "episodes": len(episodes),
            "by_user_turn": by_turn}


def _first_turn(env: Any, task_id: str) -> tuple[str, list[Any]]:
    """``env`` reset to ``task_id``: its first user question and the ground truth's first-turn calls."""
    env.reset(options={"task_id": task_id})
    question = next(m["content"] for m in env.messages if m.get("role") == "user")
    return question, list(env.ground_truth().turns[0].calls)


def _keyword_sources(env: Any, calls: Any) -> list[str] | None:
    try:
        return [c.to_source() for c in env.keyword_calls(calls)]
    except ValueError:  # a function or arguments the entry's backends do not have: not the ground truth
        return None


def first_steps(policy_path: str | Path | None = None, *, checkpoint: str | Path | None = None, split: str = "test",
                tasks: int = 50, max_new_tokens: int = 96) -> dict[str, Any]:
    """The policy's greedy first steps on the first ``tasks`` entries of ``split``, graded (see the module docstring)."""
    from trace_agent.demo.demonstrators.bfcl import call_string_arguments
    from trace_agent.policy.base import SamplingConfig
    from trace_envs.actions import parse_call_list
    from trace_envs.function_calling.env import render_calls

    policy_dir, policy = load_probed_policy(policy_path, checkpoint)
    env = _env(split)
    ids = _entry_ids(env, policy_dir, split, tasks)
    rows, contexts, truths = [], [], []
    for task_id in ids:
        question, calls = _first_turn(env, task_id)
        contexts.append(policy.render(env.messages, env.tools))
        truths.append((question, _keyword_sources(env, calls), call_string_arguments(render_calls(calls))))
    gens = policy.generate(contexts, SamplingConfig(max_new_tokens=max_new_tokens, temperature=0.0))
    for task_id, g, (question, truth, truth_args) in zip(ids, gens, truths):
        env.reset(options={"task_id": task_id})  # its backends read the generated calls' arguments
        parsed = parse_call_list(g.text)
        wrote = call_string_arguments(g.text)
        rows.append({"task_id": task_id, "text": g.text, "parses": not parsed.errors,
                     "exact": not parsed.errors and _keyword_sources(env, parsed.calls) == truth,
                     "args": len(wrote), "args_in_question": sum(a in question for a in wrote),
                     "truth_args": len(truth_args), "truth_args_in_question": sum(a in question for a in truth_args),
                     "truth_args_in_question_written": sum(a in question and a in wrote for a in truth_args)})
    env.close()
    total = {k: sum(int(r[k]) for r in rows) for k in ("exact", "parses", "args", "args_in_question", "truth_args",
                                                       "truth_args_in_question", "truth_args_in_question_written")}
    return {"policy": str(policy_dir), "split": split, "entries": len(rows), "greedy": True,
            "max_new_tokens": max_new_tokens, **total, "rows": rows}


def _copy_cases(env: Any, ids: list[str], kinds: Sequence[str], seed: int) -> dict[str, list[tuple[list, list, str]]]:
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


def check_cases(cases: Sequence[str]) -> list[str]:
    """``cases`` as a list (blank names dropped); ValueError unless it is a non-empty subset of :data:`COPY_CASES`."""
    kinds = [k.strip() for k in cases if k.strip()]
    unknown = sorted(set(kinds) - set(COPY_CASES))
    if unknown or not kinds:
        raise ValueError(f"cases must be a non-empty subset of {', '.join(COPY_CASES)}, got {list(cases)}")
    return kinds


def copying(policy_path: str | Path | None = None, *, checkpoint: str | Path | None = None, split: str = "test",
            tasks: int = 50, cases: Sequence[str] = ("real",), seed: int = 0) -> dict[str, Any]:
    """Teacher-forced next-token accuracy on the first calls of ``tasks`` entries of ``split``, per kind of call
    token, for each of ``cases`` (a non-empty subset of :data:`COPY_CASES`; ``seed`` seeds the made-up names
    and the drills). Raises ValueError for an unknown case."""
    import torch

    from trace_agent.demo.demonstrators.bfcl import call_string_arguments

    kinds = check_cases(cases)
    policy_dir, policy = load_probed_policy(policy_path, checkpoint)
    env = _env(split)
    ids = _entry_ids(env, policy_dir, split, tasks)
    out: dict[str, Any] = {"policy": str(policy_dir), "checkpoint": str(checkpoint) if checkpoint else None,
                           "split": split, "entries": len(ids), "teacher_forced": True}
    for kind, triples in _copy_cases(env, ids, kinds, seed).items():
        right = {"first": [0, 0], "later": [0, 0], "other": [0, 0]}  # [right, total] per kind of call token
        for messages, tools, text in triples:
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
            out[kind] = {"calls": len(triples), **summary}
    env.close()
    return out


def spelling(split: str = "test") -> dict[str, Any]:
    """Names spelled alike in the first question and the first call, per tokenizer split (see the module docstring)."""
    from tokenizers import Regex, pre_tokenizers

    from trace_agent.demo.demonstrators.bfcl import call_string_arguments
    from trace_agent.demo.model import SPLIT_PATTERNS
    from trace_envs.function_calling.env import render_calls

    env = _env(split)
    cases = []  # (question, call text, name, where in the question, where in the call)
    for task_id in env.tasks.ids():
        question, calls = _first_turn(env, task_id)
        text = render_calls(env.keyword_calls(calls))
        for name in call_string_arguments(text):
            at, quoted = question.find(name), text.find(repr(name))
            if at >= 0 and quoted >= 0:
                cases.append((question, text, name, at, quoted + 1))
    entries = len(env.tasks.ids())
    env.close()

    def on_boundaries(splitter: Any, text: str, start: int, end: int) -> bool:
        cuts = {edge for _, span in splitter.pre_tokenize_str(text) for edge in span}
        return start in cuts and end in cuts

    out: dict[str, Any] = {"split": split, "entries": entries, "names_in_question": len(cases)}
    for name_of_split, pattern in SPLIT_PATTERNS.items():
        splitter = pre_tokenizers.Split(Regex(pattern), behavior="isolated")
        alike = [on_boundaries(splitter, q, a, a + len(n)) and on_boundaries(splitter, t, c, c + len(n))
                 for q, t, n, a, c in cases]
        out[name_of_split] = {"spelled_alike": sum(alike),
                              "examples_not_alike": [q[max(0, a - 8):a + len(n) + 4] for (q, _, n, a, _), ok
                                                     in zip(cases, alike) if not ok][:5]}
    return out


def prefixes(trees: str | Path) -> dict[str, Any]:
    """Per strategy of a bench run's trees (a JSONL file), the mixed branch points at depth >= 1, by depth."""
    from trace_agent.tree_io import load_jsonl
    from trace_agent.tree_stats import prefix_mixing

    result = {}
    for name, r in sorted(prefix_mixing(load_jsonl(trees)).items()):
        total = r["depth>=1"]
        result[name] = {"branch_points_depth_ge_1": total["branch_points"], "mixed": total["mixed"],
                        "mixed_share": round(total["share_mixed"], 3) if total["branch_points"] else None,
                        "by_depth": r["by_depth"]}
    return result
