"""The offline demo policies: tiny Qwen3-architecture LMs warm-started on scripted demonstrations.

* :mod:`trace_agent.demo.model`: the tokenizer and the model (:class:`DemoModelConfig`,
  :func:`tiny_policy` for tests);
* :mod:`trace_agent.demo.demonstrators`: scripted demonstrations through the real envs, one
  :class:`Demonstrator` registered per env id (:func:`register_demonstrator` adds one);
* :mod:`trace_agent.demo.build`: :func:`build_demo_policy` and its settings (:class:`DemoTrainConfig`);
* :mod:`trace_agent.demo.shipped`: the policies shipped in ``trace_agent/demo/assets/`` and
  :func:`load_demo_policy`;
* :mod:`trace_agent.demo.profiles`: the demo profile table, what the project ships per env id;
* :mod:`trace_agent.demo.bfcl_report`: measurements of the BFCL-v0 policy (``scripts/bfcl_demo_report.py``).

Importing this package imports nothing but the standard library: each name loads its submodule on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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

#: public name -> the submodule that defines it: imported on first use (:func:`__getattr__`), so that
#: importing :mod:`trace_agent.demo.profiles` (the config's default env) loads nothing else.
_LAZY: dict[str, str] = {
    "DemoBuildReport": "trace_agent.demo.build",
    "DemoTrainConfig": "trace_agent.demo.build",
    "build_demo_policy": "trace_agent.demo.build",
    "demo_train_config": "trace_agent.demo.build",
    "with_settings": "trace_agent.demo.build",
    "Demonstration": "trace_agent.demo.demonstrators",
    "Demonstrator": "trace_agent.demo.demonstrators",
    "collect_demonstrations": "trace_agent.demo.demonstrators",
    "demonstrator_for": "trace_agent.demo.demonstrators",
    "register_demonstrator": "trace_agent.demo.demonstrators",
    "DemoModelConfig": "trace_agent.demo.model",
    "tiny_policy": "trace_agent.demo.model",
    "SHIPPED_DEMO_POLICIES": "trace_agent.demo.shipped",
    "SHIPPED_DEMO_POLICY": "trace_agent.demo.shipped",
    "ensure_demo_policy": "trace_agent.demo.shipped",
    "load_demo_policy": "trace_agent.demo.shipped",
    "shipped_demo_policy": "trace_agent.demo.shipped",
}


#: the submodules, loaded on first attribute access too (``trace_agent.demo.shipped`` after ``import trace_agent.demo``).
_SUBMODULES = ("bfcl_report", "build", "demonstrators", "model", "profiles", "shipped")


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        if name in _SUBMODULES:
            return importlib.import_module(f"{__name__}.{name}")
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


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
