"""Re-grade an eval's episodes under both grading modes: how often do "math-verify" and "strict" disagree?

Reads the transcripts ``trace-gym eval --transcripts FILE.jsonl`` writes (PythonMath-v0 on its
generated splits), takes each episode's final ``<answer>``, grades it against the task's answer with
``grade_answer(mode="math-verify")`` (the default) and ``mode="strict"``, and prints the success rate
under each, the number of identical verdicts, and whether the default re-grade matches the reward the
env recorded (a check that the transcripts were graded with the default mode).

    trace-gym eval --config docs/configs/demo.yaml --policy demo --transcripts /tmp/eval.jsonl
    .venv/bin/python scripts/bench/grading_modes.py /tmp/eval.jsonl --split test
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def main(argv: list[str] | None = None) -> int:
    from trace_envs.actions import parse_action
    from trace_envs.python_tool.grading import grade_answer
    from trace_envs.tasks.math_gen import default_math_tasks

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("transcripts")
    parser.add_argument("--split", default="test", help="the generated split the eval ran on")
    args = parser.parse_args(argv)
    tasks = default_math_tasks(args.split)
    n = same = matches = 0
    success = {"math-verify": 0.0, "strict": 0.0}
    differ = []
    for line in Path(args.transcripts).read_text().splitlines():
        try:
            episode = json.loads(line)
        except json.JSONDecodeError:  # a run cut off mid-line
            continue
        gold = str(tasks[episode["task_id"]].data["answer"])
        answers = [parse_action(m["content"]).answer for m in episode["messages"] if m["role"] == "assistant"]
        answer = next((a for a in reversed(answers) if a is not None), None)
        verdict = {mode: float(answer is not None and grade_answer(answer, gold, mode=mode)) for mode in success}
        n += 1
        for mode, v in verdict.items():
            success[mode] += v
        same += verdict["math-verify"] == verdict["strict"]
        matches += verdict["math-verify"] == episode["reward"]
        if verdict["math-verify"] != verdict["strict"]:
            differ.append((episode["task_id"], answer, gold))
    if not n:
        print("no episodes in", args.transcripts)
        return 1
    print(f"episodes: {n}; success math-verify {success['math-verify'] / n:.4f}, strict {success['strict'] / n:.4f}; "
          f"identical verdicts {same}/{n}; default re-grade equals the recorded reward {matches}/{n}")
    for task_id, answer, gold in differ[:20]:
        print(f"  {task_id}: answer {answer!r} gold {gold!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
