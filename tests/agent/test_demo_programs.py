"""The demo policy's one-line programs print each generated task's answer (run in the real sandbox)."""

from __future__ import annotations

from trace_agent.policy.demo import short_program
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
