"""Integrations with other trainers.

- :mod:`trace_agent.integrations.rows` - a rollout tree as flat leaf rows (prompt / response ids,
  response mask, behaviour log-probs) and tree advantages recomputed from rows; no torch, no verl.
- :mod:`trace_agent.integrations.verl` - TRACE tree rollouts inside verl's v1 agent loop (the
  ``verl`` extra: ``pip install trace-gym[verl]``; verl is imported only by that module).

Importing this package imports neither.
"""

from __future__ import annotations

__all__: list[str] = []
