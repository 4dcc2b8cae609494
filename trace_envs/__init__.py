"""trace_envs: branchable multi-turn agent environments.

``import trace_envs`` registers the suite with Gymnasium; it imports no torch,
faiss, Java or vLLM. Every env is an ordinary ``gymnasium.Env`` plus
``snapshot()`` / ``restore()``; ``gym.make`` returns it inside a thin
:class:`~trace_envs.wrappers.BranchingWrapper` that branches the whole wrapper
chain below it (``TimeLimit`` included)::

    import gymnasium as gym
    import trace_envs

    env = gym.make("trace_envs/PythonMath-v0")
    obs, info = env.reset(seed=0)
    snap = env.snapshot()
    ...
    env.restore(snap)
"""

from __future__ import annotations

from gymnasium.envs.registration import WrapperSpec, register, registry

from trace_envs.actions import ParsedAction, ToolCall, parse_action
from trace_envs.checker import check_branchable_env
from trace_envs.core import (
    BranchableEnv,
    Snapshot,
    Task,
    TaskSet,
    TurnResult,
)
from trace_envs.errors import (
    ForeignSnapshotError,
    InvalidTaskError,
    ResetNeededError,
    SandboxError,
    SnapshotError,
    SnapshotLimitError,
    TaskNotFoundError,
    TraceEnvError,
)
from trace_envs.wrappers import BranchableWrapper, BranchingWrapper, SnapshotHandle, find_branchable

__all__ = [
    "BranchableEnv",
    "BranchableWrapper",
    "Snapshot",
    "Task",
    "TaskSet",
    "TurnResult",
    "ToolCall",
    "ParsedAction",
    "parse_action",
    "find_branchable",
    "BranchingWrapper",
    "SnapshotHandle",
    "check_branchable_env",
    "registered_ids",
    "TraceEnvError",
    "TaskNotFoundError",
    "InvalidTaskError",
    "ResetNeededError",
    "SnapshotError",
    "ForeignSnapshotError",
    "SnapshotLimitError",
    "SandboxError",
]

__version__ = "0.1.0"

#: id -> entry point. Entry points are strings so that importing trace_envs stays cheap.
_ENVS = {
    "trace_envs/PythonMath-v0": "trace_envs.python_tool.env:PythonMathEnv",
    "trace_envs/WikiQA-v0": "trace_envs.wiki_search.env:WikiQAEnv",
    "trace_envs/BFCL-v0": "trace_envs.function_calling.env:BFCLEnv",
}


def registered_ids() -> list[str]:
    """The ids of every environment this package registers."""
    return list(_ENVS)


#: ``gym.make`` applies ``additional_wrappers`` after its own (``TimeLimit``, ...), so this one is outermost.
_BRANCHING = WrapperSpec(name="BranchingWrapper", entry_point="trace_envs.wrappers:BranchingWrapper", kwargs={})

for _env_id, _entry_point in _ENVS.items():
    if _env_id not in registry:
        register(id=_env_id, entry_point=_entry_point, order_enforce=False, disable_env_checker=True,
                 additional_wrappers=(_BRANCHING,))
