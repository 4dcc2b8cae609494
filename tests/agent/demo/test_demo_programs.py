"""The demo policy's one-line programs print each generated task's answer (run in the real sandbox)."""

from __future__ import annotations

from trace_agent.demo.demonstrators import misconception_program, short_program
from trace_envs.python_tool.grading import grade_answer
from trace_envs.python_tool.sandbox import Sandbox, SandboxConfig
from trace_envs.tasks.math_gen import default_math_tasks


def test_short_programs_answer_every_level_one_and_two_task():
    checked = 0
    with Sandbox(SandboxConfig(timeout_s=10)) as sandbox:
        sandbox.thaw(sandbox.base)
        assert sandbox.run("import math, sympy").ok
        for split in ("train", "test"):
            for task in default_math_tasks(split).values():
                code = short_program(task.data["family"], task.data["params"])
                if code is None or task.data["level"] > 2:
                    continue
                result = sandbox.run(code)
                printed = result.output.strip().splitlines()[-1] if result.output.strip() else ""
                assert result.ok and grade_answer(printed, task.data["answer"]), (task.task_id, code, result)
                checked += 1
    assert checked >= 200


def test_unknown_family_has_no_short_program():
    assert short_program("lattice_paths", {"width": 2, "height": 3, "blocked": []}) is None


def test_misconception_programs_run_and_are_wrong_on_almost_every_task():
    """Each family's plausible wrong method runs cleanly and boxes a wrong answer on >= 75% of its tasks."""
    per_family: dict[str, list[bool]] = {}
    with Sandbox(SandboxConfig(timeout_s=10)) as sandbox:
        sandbox.thaw(sandbox.base)
        assert sandbox.run("import math, sympy").ok
        for task in default_math_tasks("train").values():
            family, params = task.data["family"], task.data["params"]
            code = misconception_program(family, params)
            assert (code is None) == (short_program(family, params) is None), family
            if code is None or task.data["level"] > 2:
                continue
            result = sandbox.run(code)
            printed = result.output.strip().splitlines()[-1] if result.output.strip() else ""
            assert result.ok and printed, (task.task_id, code, result)
            per_family.setdefault(family, []).append(grade_answer(printed, task.data["answer"]))
    assert len(per_family) == 14
    for family, right in per_family.items():
        assert sum(right) <= 0.25 * len(right), (family, sum(right), len(right))
