"""The demo profile table is the one place the project keys what it ships by env id; the rest are views of it."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import trace_envs
from trace_agent.config import TrainConfig
from trace_agent.config_io import CONFIG_DIR, load_config
from trace_agent.demo import profiles
from trace_agent.demo.profiles import DEFAULT_ENV_ID, PROFILES, DemoProfile, demo_profile


@pytest.mark.parametrize("env_id", sorted(PROFILES))
def test_each_profile_names_a_registered_env_and_things_that_exist(env_id: str) -> None:
    from trace_agent.demo import demonstrators
    from trace_agent.demo.demonstrators.base import demonstrator_for
    from trace_agent.demo.shipped import SHIPPED_DEMO_POLICIES

    p = PROFILES[env_id]
    assert p.env_id == env_id and env_id in trace_envs.registered_ids()
    assert p.config is not None and load_config(CONFIG_DIR / p.config).env_id == env_id, \
        "a demo config trains the env whose profile names it"
    assert SHIPPED_DEMO_POLICIES[env_id].parent.name == "assets" and SHIPPED_DEMO_POLICIES[env_id].name == p.policy_dir
    if p.demonstrator is not None:
        cls = getattr(demonstrators, p.demonstrator)
        assert cls.env_id == env_id and type(demonstrator_for(env_id)) is cls


def test_the_other_tables_are_views_of_the_profiles() -> None:
    from trace_agent.demo.build import DEFAULT_ENV_IDS
    from trace_agent.demo.shipped import SHIPPED_DEMO_POLICIES, SHIPPED_DEMO_POLICY
    from trace_agent.integrations.trl_env import SUPPORTED
    from trace_agent.train_cli import DEMO_CONFIGS

    assert DEMO_CONFIGS == {e: p.config for e, p in PROFILES.items() if p.config}
    assert set(SHIPPED_DEMO_POLICIES) == set(PROFILES) and SHIPPED_DEMO_POLICY == SHIPPED_DEMO_POLICIES[DEFAULT_ENV_ID]
    assert {e: c.__name__ for e, c in SUPPORTED.items()} == \
        {e: p.trl_environment for e, p in PROFILES.items() if p.trl_environment}
    assert all(cls.env_id == e for e, cls in SUPPORTED.items())
    assert DEFAULT_ENV_IDS == (DEFAULT_ENV_ID,) == (TrainConfig().env_id,)


def test_an_env_without_a_profile_has_none() -> None:
    assert demo_profile("trace_envs/Counter-v0") is None
    assert demo_profile(DEFAULT_ENV_ID) is PROFILES[DEFAULT_ENV_ID]
    with pytest.raises(TypeError):
        DemoProfile("trace_envs/X-v0", policy_dir="x")  # type: ignore[misc]  # keyword-only


def test_reading_the_table_loads_nothing_else() -> None:
    """``trace_agent.config`` reads its default env here: the table imports only the standard library, and the
    demo package loads a submodule only when one of its names is used."""
    imports = [node for node in ast.walk(ast.parse(Path(profiles.__file__).read_text())) if isinstance(node, ast.ImportFrom)]
    assert {node.module for node in imports} <= {"__future__", "dataclasses"}
    code = ("import sys, trace_agent.config; print(sorted(m for m in sys.modules if m.startswith('trace_agent.demo'))); "
            "from trace_agent.demo import DemoTrainConfig; print('trace_agent.demo.build' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.splitlines()
    assert out == [str(["trace_agent.demo", "trace_agent.demo.profiles"]), "True"]
    assert profiles.__all__ and all(hasattr(profiles, name) for name in profiles.__all__)
