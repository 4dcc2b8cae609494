"""PythonMath-v0's demonstrator: a one-line program per generated family, its plausible wrong method."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from trace_agent.demo.demonstrators.base import tool_call
from trace_agent.demo.profiles import PYTHON_MATH

if TYPE_CHECKING:
    from trace_envs.core import BranchableEnv, Task, TaskSet

__all__ = ["PythonMathDemonstrator", "short_program", "misconception_program"]


_INT = re.compile(r"(?<![\w.])(\d+)(?![\w.])")


#: family -> (a one-line program printing the answer, the same problem by a plausible wrong method),
#: each built from a generated task's ``params``.
_ONE_LINERS: dict[str, tuple[Callable[[Mapping[str, Any]], str], Callable[[Mapping[str, Any]], str]]] = {
    "divisor_count": (
        lambda p: f"print(sympy.divisor_count({p['n']}))",
        lambda p: f"print(len(sympy.divisors({p['n']})) - 1)",
    ),
    "divisor_sum": (
        lambda p: f"print(sympy.divisor_sigma({p['n']}))",
        lambda p: f"print(sympy.divisor_sigma({p['n']}) - {p['n']})",
    ),
    "totient": (
        lambda p: f"print(sympy.totient({p['n']}))",
        lambda p: f"print({p['n']} - 1)",
    ),
    "prime_count": (
        lambda p: f"print(sympy.primepi({p['b']}) - sympy.primepi({p['a'] - 1}))",
        lambda p: f"print(sympy.primepi({p['b']}))",
    ),
    "digit_sum_power": (
        lambda p: f"print(sum(map(int, str({p['a']}**{p['b']}))))",
        lambda p: f"print(sum(map(int, str({p['a']} * {p['b']}))))",
    ),
    "modpow": (
        lambda p: f"print(pow({p['a']}, {p['b']}, {p['m']}))",
        lambda p: f"print({p['a']} * {p['b']} % {p['m']})",
    ),
    "mod_inverse": (
        lambda p: f"print(pow({p['a']}, -1, {p['m']}))",
        lambda p: f"print(pow({p['a']}, {p['m']} - 1, {p['m']}))",
    ),
    "binomial": (
        lambda p: f"print(math.comb({p['n']}, {p['k']}))",
        lambda p: f"print(math.perm({p['n']}, {p['k']}))",
    ),
    "derangements": (
        lambda p: f"print(sympy.subfactorial({p['n']}))",
        lambda p: f"print(math.factorial({p['n']}) - 1)",
    ),
    "power_sum": (
        lambda p: f"print(sum(k**{p['p']} for k in range(1, {p['n']} + 1)))",
        lambda p: f"print(sum(k**{p['p']} for k in range(1, {p['n']})))",
    ),
    "fibonacci": (
        lambda p: f"print(sympy.fibonacci({p['n']}))",
        lambda p: f"print(sympy.fibonacci({p['n']} + 1))",
    ),
    "count_divisible": (
        lambda p: (f"print(sum(1 for k in range(1, {p['n']} + 1) "
                   f"if (k % {p['a']} == 0 or k % {p['b']} == 0) and k % {p['c']}))"),
        lambda p: f"print(sum(1 for k in range(1, {p['n']} + 1) if k % {p['a']} == 0 or k % {p['b']} == 0))",
    ),
    "digit_sum_count": (
        lambda p: f"print(sum(1 for k in range(1, {p['n']} + 1) if sum(map(int, str(k))) == {p['s']}))",
        lambda p: f"print(sum(1 for k in range(1, {p['n']} + 1) if sum(map(int, str(k))) <= {p['s']}))",
    ),
    "coprime_probability": (
        lambda p: f"print(sympy.Rational(sum(math.gcd(k, {p['m']}) == 1 for k in range(1, {p['n']} + 1)), {p['n']}))",
        lambda p: f"print(sympy.Rational(sum(math.gcd(k, {p['m']}) == 1 for k in range(1, {p['n']} + 1)), {p['m']}))",
    ),
}


def short_program(family: str, p: Mapping[str, Any]) -> str | None:
    """A one-line program (sympy / stdlib) that prints a generated task's answer, or None.

    Used for levels 1–2, where each is checked against the task's answer in the tests;
    a small model learns these far faster than the long reference ``solution_code``.
    """
    programs = _ONE_LINERS.get(family)
    return programs[0](p) if programs else None


def misconception_program(family: str, p: Mapping[str, Any]) -> str | None:
    """A one-line program for a generated task that applies a plausible *wrong method*, or None.

    The mistakes a careless solver makes: proper instead of all divisors, permutations instead of
    combinations, an off-by-one range or index, a dropped condition, the wrong denominator, a misremembered theorem
    (``pow(a, m - 1, m)`` for an inverse), a product for a power. Each is wrong on almost every
    level 1–2 task of its family (checked in the tests), so a policy that learned it sometimes
    has a family-level habit that reinforcement learning can unlearn, and the fix carries over to
    held-out problems of the same family.
    """
    programs = _ONE_LINERS.get(family)
    return programs[1](p) if programs else None


class PythonMathDemonstrator:
    """PythonMath-v0: run a program for the task, then box what it printed.

    The program is a one-liner (:func:`short_program`) for levels 1–2 and the task's reference
    ``solution_code`` for level 3, so level-3 problems stay hard for a small model.

    A flawed demonstration runs the family's plausible wrong method (:func:`misconception_program`)
    where the task has a one-line program, and otherwise changes one integer literal of the program
    by ±1 (or ±2); the answer then boxes the wrong output, as a careless solver would.
    """

    env_id = PYTHON_MATH

    def covers(self, task: Task) -> bool:
        """Only levels 1–2 of the families with a one-line program are demonstrated.

        The rest (level 3, and families such as lattice paths) the policy never sees solved,
        which keeps it imperfect in a useful way: some prompts always fail, some are mixed.
        """
        data = task.data
        return int(data.get("level", 3)) <= 2 and short_program(str(data.get("family")), data.get("params", {})) is not None

    def demonstration_tasks(self, batches: int = 10, seed: int = 7) -> TaskSet:
        """Generated math problems for demonstrations: several times the train split (so the model
        learns to copy numbers, not to recall problems), deduplicated, none equal to a test problem."""
        from trace_envs.core import TaskSet as _TaskSet
        from trace_envs.tasks.math_gen import DEFAULT_SPLIT_SIZES, default_math_tasks, generate_math_tasks

        seen = {task.prompt for task in default_math_tasks("test").values()}
        tasks = []
        for b in range(batches):
            for task in generate_math_tasks(DEFAULT_SPLIT_SIZES["train"], seed=seed + b, id_prefix=f"math-demo{b}"):
                if task.prompt not in seen:
                    seen.add(task.prompt)
                    tasks.append(task)
        return _TaskSet(tasks, name=f"math-demo-{batches}x-{seed}")

    def act(self, env: BranchableEnv, *, flawed: bool, rng: np.random.Generator) -> str:
        task = env.task
        tool_outputs = [m["content"] for m in env.messages if m.get("role") == "tool"]
        if not tool_outputs:
            short = wrong = None
            if int(task.data.get("level", 3)) <= 2 and "family" in task.data:
                family, params = str(task.data["family"]), task.data.get("params", {})
                short, wrong = short_program(family, params), misconception_program(family, params)
            if short is not None:  # a family with a one-liner also has its wrong method
                code = "import math, sympy\n" + (wrong if flawed else short)
            else:
                code = str(task.data.get("solution_code") or f"print({task.data['answer']!r})")
                if flawed:
                    code = _perturb_code(code, rng)
            return tool_call("python", {"code": code})
        result = tool_outputs[-1].strip().splitlines()
        answer = result[-1].strip() if result else ""
        return f"<answer>\\boxed{{{answer}}}</answer>"


def _perturb_code(code: str, rng: np.random.Generator) -> str:
    literals = [m for m in _INT.finditer(code) if int(m.group(1)) > 2]
    if not literals:
        return code
    m = literals[int(rng.integers(len(literals)))]
    delta = int(rng.choice([-2, -1, 1, 2]))
    return code[:m.start()] + str(int(m.group(1)) + delta) + code[m.end():]
