"""Scripted demonstrators for the suite's envs (one module each) and the loop that plays them.

``build_demo_policy`` warm-starts the demo LM on what these play. Each env's demonstrator is the one its
profile names (:data:`trace_agent.demo.profiles.PROFILES`); a new env gets demonstrations by a profile row,
or by registering a :class:`Demonstrator` for its id (:func:`register_demonstrator`).
"""

from __future__ import annotations

from trace_agent.demo.demonstrators.base import (
    Demonstration,
    Demonstrator,
    collect_demonstrations,
    demonstrator_for,
    register_demonstrator,
    tool_call,
)
from trace_agent.demo.demonstrators.bfcl import BFCLDemonstrator
from trace_agent.demo.demonstrators.python_math import (
    PythonMathDemonstrator,
    misconception_program,
    short_program,
)
from trace_agent.demo.demonstrators.wiki import WikiQADemonstrator
from trace_agent.demo.profiles import PROFILES

__all__ = [
    "Demonstration",
    "Demonstrator",
    "register_demonstrator",
    "demonstrator_for",
    "tool_call",
    "collect_demonstrations",
    "PythonMathDemonstrator",
    "WikiQADemonstrator",
    "BFCLDemonstrator",
    "short_program",
    "misconception_program",
]

for _profile in PROFILES.values():
    if _profile.demonstrator is not None:
        register_demonstrator(_profile.env_id, globals()[_profile.demonstrator])
