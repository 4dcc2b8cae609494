"""BFCL-v0: multi-turn function calling on bfcl-eval's executable backends, with state and response checks.

Importing this package does not import bfcl_eval; the env does, on construction.
See :class:`~trace_envs.function_calling.env.BFCLEnv` for the spec.
"""

from __future__ import annotations

from trace_envs.function_calling.backends import Backends, CallOutcome, format_result
from trace_envs.function_calling.env import BFCLEnv, render_calls, render_outcomes
from trace_envs.function_calling.remote import RemoteBackends
from trace_envs.function_calling.schemas import function_doc_to_tool, to_json_schema
from trace_envs.function_calling.scoring import GroundTruth, GroundTruthTurn, TurnCheck, check_turn

__all__ = [
    "BFCLEnv",
    "Backends",
    "CallOutcome",
    "GroundTruth",
    "GroundTruthTurn",
    "RemoteBackends",
    "TurnCheck",
    "check_turn",
    "format_result",
    "function_doc_to_tool",
    "to_json_schema",
    "render_calls",
    "render_outcomes",
]
