"""WikiQA-v0's demonstrator."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from trace_agent.policy.demonstrators.base import tool_call

if TYPE_CHECKING:
    from trace_envs.core import BranchableEnv

__all__ = ["WikiQADemonstrator"]


class WikiQADemonstrator:
    """WikiQA-v0: one search per hop (the task's ``queries``), then the gold answer.

    A flawed demonstration stops after the first hop and answers with the bridge entity.
    """

    env_id = "trace_envs/WikiQA-v0"

    def act(self, env: BranchableEnv, *, flawed: bool, rng: np.random.Generator) -> str:
        data = env.task.data
        queries = list(data.get("queries") or [data.get("question", env.task.prompt)])
        done = sum(1 for m in env.messages if m.get("role") == "assistant")
        if flawed and done >= 1:
            titles = list(data.get("supporting_titles") or [])
            return f"<answer>{titles[0] if titles else queries[0]}</answer>"
        if done < len(queries):
            return tool_call("search", {"query": queries[done]})
        return f"<answer>{(data.get('answers') or [''])[0]}</answer>"
