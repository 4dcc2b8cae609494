"""Integrations with other trainers.

- :mod:`trace_agent.integrations.rows` - a rollout tree as flat leaf rows (prompt / response ids,
  response mask, behaviour log-probs) and tree advantages recomputed from rows; no torch, no verl.
- :mod:`trace_agent.integrations.verl` - TRACE tree rollouts inside verl's v1 agent loop (the
  ``verl`` extra: ``pip install trace-gym[verl]``; verl is imported only by that module).
- :mod:`trace_agent.integrations.trl_env` - an env behind TRL's ``GRPOTrainer(environment_factory=...)``
  (TRL itself is never imported).
- :mod:`trace_agent.integrations.skyrl` - every env of the suite as a SkyRL-gym ``BaseTextEnv``,
  registered in ``skyrl_gym``'s registry when imported (needs ``skyrl-gym``).

Importing this package imports none of them.
"""

from __future__ import annotations

__all__: list[str] = []
