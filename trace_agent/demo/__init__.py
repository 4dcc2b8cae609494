"""The offline demo policies: tiny Qwen3-architecture LMs warm-started on scripted demonstrations.

* :mod:`trace_agent.demo.model`: the tokenizer and the model (:class:`DemoModelConfig`,
  :func:`tiny_policy` for tests);
* :mod:`trace_agent.demo.demonstrators`: scripted demonstrations through the real envs, one
  :class:`Demonstrator` registered per env id (:func:`register_demonstrator` adds one);
* :mod:`trace_agent.demo.build`: :func:`build_demo_policy` and its settings (:class:`DemoTrainConfig`);
* :mod:`trace_agent.demo.shipped`: the policies shipped in ``trace_agent/demo/assets/`` and
  :func:`load_demo_policy`;
* :mod:`trace_agent.demo.bfcl_report`: measurements of the BFCL-v0 policy (``scripts/bfcl_demo_report.py``).

Importing this package imports neither torch nor transformers.
"""

from __future__ import annotations

from trace_agent.demo.build import (
    DemoBuildReport,
    DemoTrainConfig,
    build_demo_policy,
    demo_train_config,
    with_settings,
)
from trace_agent.demo.demonstrators import (
    Demonstration,
    Demonstrator,
    collect_demonstrations,
    demonstrator_for,
    register_demonstrator,
)
from trace_agent.demo.model import DemoModelConfig, tiny_policy
from trace_agent.demo.shipped import (
    SHIPPED_DEMO_POLICIES,
    SHIPPED_DEMO_POLICY,
    ensure_demo_policy,
    load_demo_policy,
    shipped_demo_policy,
)

__all__ = [
    "DemoModelConfig",
    "DemoTrainConfig",
    "DemoBuildReport",
    "Demonstration",
    "Demonstrator",
    "register_demonstrator",
    "demonstrator_for",
    "collect_demonstrations",
    "build_demo_policy",
    "demo_train_config",
    "with_settings",
    "tiny_policy",
    "SHIPPED_DEMO_POLICY",
    "SHIPPED_DEMO_POLICIES",
    "shipped_demo_policy",
    "ensure_demo_policy",
    "load_demo_policy",
]
