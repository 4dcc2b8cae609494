"""BFCL-v0's demonstrator."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from trace_envs.core import BranchableEnv

__all__ = ["BFCLDemonstrator"]


class BFCLDemonstrator:
    """BFCL-v0: replay the task's ground truth (the env's ``ground_truth_actions``, JSON tool calls).

    A flawed demonstration skips one step's calls (says it is done without making them).
    """

    env_id = "trace_envs/BFCL-v0"

    def act(self, env: BranchableEnv, *, flawed: bool, rng: np.random.Generator) -> str:
        actions = env.ground_truth_actions(style="json")  # type: ignore[attr-defined]
        done = sum(1 for m in env.messages if m.get("role") == "assistant")
        if done >= len(actions):
            return "Done."
        if flawed and done == 0 and actions[0] != "Done.":
            return "Done."
        return actions[done]
