"""A minimal BranchableEnv used to test the core and the checker in isolation."""

from __future__ import annotations

import copy

from trace_envs import BranchableEnv, Task, TaskSet, TurnResult, parse_action


class CounterEnv(BranchableEnv):
    """Tool ``add(n)`` adds to a counter and draws a random number; ``<answer>`` is right when it equals the target."""

    env_id = "tests/Counter-v0"

    def __init__(self, *, leak_state: bool = False, **kwargs):
        tasks = TaskSet([Task(f"t{i}", f"reach {i + 3}", {"target": i + 3}) for i in range(3)], name="counter")
        super().__init__(tasks=tasks, **kwargs)
        self.leak_state = leak_state  # a deliberately broken snapshot, to prove the checker can fail
        self.state = {"total": 0, "log": []}

    def conformance_actions(self):
        call = '<tool_call>{{"name": "add", "arguments": {{"n": {}}}}}</tool_call>'
        return [call.format(1), call.format(2), "<answer>3</answer>", call.format(5)]

    def _start_episode(self, task):
        self.state = {"total": 0, "log": []}
        return task.prompt

    def _run_turn(self, action):
        parsed = parse_action(action)
        if not parsed.ok:
            return TurnResult(parsed.error_message())
        if parsed.answer is not None:
            ok = parsed.answer.strip() == str(self.state["total"]) == str(self.task.data["target"])
            return TurnResult("correct" if ok else "wrong", reward=float(ok), terminated=True, role="user")
        outs = []
        for call in parsed.tool_calls:
            n = call.arguments.get("n")
            if call.name != "add" or not isinstance(n, int):
                outs.append(f"Error: unknown call {call.name}")
                continue
            self.state["total"] += n
            self.state["log"].append(n)
            outs.append(f"total={self.state['total']} draw={int(self.np_random.integers(1000))}")
        return TurnResult("\n".join(outs))

    def _capture_state(self):
        return self.state if self.leak_state else copy.deepcopy(self.state)

    def _restore_state(self, payload):
        self.state = payload if self.leak_state else copy.deepcopy(payload)
