"""A scripted look-ahead agent that shows branching at work on PythonMath-v0.

The agent is given several candidate programs per problem (the correct one
and mutated ones — a stand-in for a policy's samples). It runs a shared setup
cell, takes a snapshot, then tries every candidate in its own branch with
``restore()`` and keeps the one the verifier accepts. A greedy agent that
commits to its first sample is the baseline. Figures printed at the end.

Run: .venv/bin/python scripts/demo.py [--tasks 24 --k 3]   (`make demo` runs the training demo instead)
"""

from __future__ import annotations

import argparse
import ast
import json
import random
import time
import warnings

import gymnasium as gym

import trace_envs  # noqa: F401 - registers the envs


def tool_call(code: str) -> str:
    return "<tool_call>" + json.dumps({"name": "python", "arguments": {"code": code}}) + "</tool_call>"


class _BumpOneLiteral(ast.NodeTransformer):
    """Add ``delta`` to the ``index``-th integer literal of a program (our own code, not model output)."""

    def __init__(self, index: int, delta: int) -> None:
        self.index, self.delta, self.seen = index, delta, 0

    def visit_Constant(self, node: ast.Constant) -> ast.AST:
        if isinstance(node.value, int) and not isinstance(node.value, bool):
            self.seen += 1
            if self.seen - 1 == self.index:
                return ast.copy_location(ast.Constant(node.value + self.delta), node)
        return node


def candidates(solution: str, k: int, rng: random.Random) -> list[str]:
    """The correct program at a random position among k-1 mutants."""
    literals = sum(isinstance(n, ast.Constant) and type(n.value) is int for n in ast.walk(ast.parse(solution)))
    mutants = []
    for _ in range(k - 1):
        tree = _BumpOneLiteral(rng.randrange(max(literals, 1)), rng.choice([-1, 1, 2])).visit(ast.parse(solution))
        mutants.append(ast.unparse(tree))
    programs = mutants + [solution]
    rng.shuffle(programs)
    return programs


def last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tasks", type=int, default=24)
    parser.add_argument("--k", type=int, default=3, help="candidate programs per problem")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    rng = random.Random(args.seed)
    env = gym.make("trace_envs/PythonMath-v0", tasks="test")
    task_ids = env.unwrapped.tasks.ids()[: args.tasks]
    greedy = lookahead = branches = 0
    start = time.perf_counter()
    restore_s = 0.0
    print(f"PythonMath-v0, {len(task_ids)} held-out problems, {args.k} candidate programs each")
    print(f"sandbox isolation: {', '.join(env.unwrapped.isolation)}\n")
    for task_id in task_ids:
        env.reset(seed=args.seed, options={"task_id": task_id})
        task = env.unwrapped.task
        programs = candidates(task.data["solution_code"], args.k, rng)
        env.step(tool_call("import math\nimport itertools\nsetup_done = True"))
        save_point = env.snapshot()
        outcomes = []
        for program in programs:
            t0 = time.perf_counter()
            env.restore(save_point)
            restore_s += time.perf_counter() - t0
            obs = env.step(tool_call(program))[0]
            reward = env.step(f"<answer>\\boxed{{{last_line(obs)}}}</answer>")[1]
            outcomes.append(reward)
            branches += 1
        greedy += outcomes[0]
        lookahead += max(outcomes)
        marks = "".join("✓" if r else "✗" for r in outcomes)
        print(f"  {task_id:16s} {task.data['family']:20s} level {task.data['level']}  branches {marks}")
    env.close()
    n = len(task_ids)
    print(f"\ngreedy (first sample only): {greedy:.0f}/{n} = {greedy / n:.0%}")
    print(f"look-ahead over {args.k} branches from one snapshot: {lookahead:.0f}/{n} = {lookahead / n:.0%}")
    print(f"{branches} branches, mean restore {1000 * restore_s / branches:.2f} ms, "
          f"total {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
