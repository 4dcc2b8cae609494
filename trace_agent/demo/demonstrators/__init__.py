"""Scripted demonstrators for the suite's envs (one module each) and the loop that plays them.

``build_demo_policy`` warm-starts the demo LM on what these play. A new env gets demonstrations by
registering a :class:`Demonstrator` for its id (:func:`register_demonstrator`).
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

register_demonstrator(PythonMathDemonstrator.env_id, PythonMathDemonstrator)
register_demonstrator(WikiQADemonstrator.env_id, WikiQADemonstrator)
register_demonstrator(BFCLDemonstrator.env_id, BFCLDemonstrator)
