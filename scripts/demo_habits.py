"""What the demo policy's first (code) turn does on PythonMath-v0, from `trace-gym eval --transcripts` files.

    trace-gym eval --config docs/configs/demo.yaml --transcripts runs/demo/eval_before.jsonl
    trace-gym eval --config docs/configs/demo.yaml --policy hf --policy-path runs/demo/policy \\
        --transcripts runs/demo/eval_after.jsonl
    .venv/bin/python scripts/demo_habits.py runs/demo/eval_before.jsonl runs/demo/eval_after.jsonl

For every episode on a task the demonstrations covered (levels 1–2 of the families with a
one-line program), the first python call is classified as the family's right program
(:func:`~trace_agent.demo.demonstrators.short_program`), its wrong method
(:func:`~trace_agent.demo.demonstrators.misconception_program`), or other (a mis-copied number, a
malformed call, no call). Prints a Markdown table per file: episodes, each class, success.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trace_agent.demo.demonstrators import misconception_program, short_program  # noqa: E402
from trace_agent.success import is_success  # noqa: E402
from trace_envs.actions import parse_action  # noqa: E402

CLASSES = ("right_program", "wrong_method", "other")


def first_code(messages: Iterable[Mapping[str, Any]]) -> str | None:
    """The ``code`` argument of the first assistant turn's python call, if it made one."""
    for message in messages:
        if message.get("role") == "assistant":
            action = parse_action(str(message.get("content", "")))
            calls = [c for c in action.tool_calls if c.name == "python"]
            return str(calls[0].arguments.get("code")) if calls else None
    return None


def classify(task_data: Mapping[str, Any], code: str | None) -> str | None:
    """``right_program`` / ``wrong_method`` / ``other``, or None for a task the demonstrations do not cover."""
    family, params = str(task_data.get("family")), task_data.get("params", {})
    right, wrong = short_program(family, params), misconception_program(family, params)
    if int(task_data.get("level", 3)) > 2 or right is None or wrong is None:
        return None
    code = (code or "").strip()
    if code == f"import math, sympy\n{right}":
        return "right_program"
    if code == f"import math, sympy\n{wrong}":
        return "wrong_method"
    return "other"


def habits(episodes: Iterable[Mapping[str, Any]], tasks: Mapping[str, Any]) -> dict[str, Counter]:
    """Per-class episode and success counts over the covered tasks, in total and per family."""
    out: dict[str, Counter] = {"all": Counter()}
    for episode in episodes:
        task = tasks[episode["task_id"]]
        kind = classify(task.data, first_code(episode["messages"]))
        if kind is None:
            continue
        for key in ("all", str(task.data["family"])):
            counts = out.setdefault(key, Counter())
            counts["episodes"] += 1
            counts[kind] += 1
            counts["success"] += is_success(float(episode["reward"]))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("transcripts", nargs="+", help="JSONL files written by `trace-gym eval --transcripts`")
    parser.add_argument("--split", default="test", help="the PythonMath-v0 split the transcripts were played on")
    args = parser.parse_args(argv)

    from trace_envs.tasks.math_gen import default_math_tasks

    tasks = default_math_tasks(args.split)
    print("| transcripts | covered episodes | right program | wrong method | other | success |")
    print("|---|---:|---:|---:|---:|---:|")
    per_family = {}
    for path in args.transcripts:
        with open(path) as f:
            counts = habits((json.loads(line) for line in f if line.strip()), tasks)
        per_family[path] = counts
        c = counts["all"]
        print(f"| {path} | {c['episodes']} | " + " | ".join(str(c[k]) for k in CLASSES) + f" | {c['success']} |")
    print("\nper family (right / wrong / other -> success), one column per file:\n")
    families = sorted({f for counts in per_family.values() for f in counts if f != "all"})
    print("| family | " + " | ".join(Path(p).name for p in args.transcripts) + " |")
    print("|---|" + "---|" * len(args.transcripts))
    for family in families:
        cells = []
        for path in args.transcripts:
            c = per_family[path].get(family, Counter())
            cells.append(f"{c['right_program']} / {c['wrong_method']} / {c['other']} -> {c['success']}")
        print(f"| {family} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
