"""scripts/demo_habits.py: first-turn programs classified as right program / wrong method / other."""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "scripts"))

import demo_habits  # noqa: E402

from trace_agent.demo.demonstrators import misconception_program, short_program  # noqa: E402
from trace_envs.tasks.math_gen import default_math_tasks  # noqa: E402


def _call(code: str) -> str:
    return "<tool_call>" + json.dumps({"name": "python", "arguments": {"code": code}}) + "</tool_call>"


def test_classifies_first_python_call_and_counts_success(tmp_path: Path, capsys) -> None:
    tasks = default_math_tasks("test")
    covered = next(t for t in tasks.values() if t.data["level"] <= 2 and t.data["family"] == "binomial")
    uncovered = next(t for t in tasks.values() if t.data["level"] == 3)
    right = "import math, sympy\n" + short_program("binomial", covered.data["params"])
    wrong = "import math, sympy\n" + misconception_program("binomial", covered.data["params"])
    assert "math.perm" in wrong
    episodes = [
        (covered.task_id, _call(right), 1.0),
        (covered.task_id, _call(wrong), 0.0),
        (covered.task_id, _call(right.replace("math.comb", "math.combb")), 0.0),
        (covered.task_id, "no call at all", 0.0),
        (uncovered.task_id, _call(right), 1.0),  # not a covered task: ignored
    ]
    path = tmp_path / "eval.jsonl"
    with path.open("w") as f:
        for k, (task_id, turn, reward) in enumerate(episodes):
            messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": turn}]
            f.write(json.dumps({"task_id": task_id, "sample": k, "reward": reward, "messages": messages}) + "\n")
    counts = demo_habits.habits((json.loads(line) for line in path.read_text().splitlines()), tasks)
    assert dict(counts["all"]) == {"episodes": 4, "right_program": 1, "wrong_method": 1, "other": 2, "success": 1}
    assert counts["binomial"] == counts["all"]
    assert demo_habits.main([str(path)]) == 0
    assert f"| {path} | 4 | 1 | 1 | 2 | 1 |" in capsys.readouterr().out
