"""The demo profile table: what the project ships for each env, keyed by env id, in one place.

The trainer's whole knowledge of an env is ``gymnasium.make(id, **kwargs)`` plus what the env declares about
itself (:class:`trace_envs.BranchableEnv`: ``splits``, ``split_kwargs``, ``same_tools``). What the *project*
ships beside an env -- the demo policy's training config, the shipped demo policy, the scripted demonstrator
that taught it, the TRL tool adapter -- is keyed by env id here and nowhere else in ``trace_agent``: the
train command's demo configs (:data:`trace_agent.train_cli.DEMO_CONFIGS`), the shipped policies
(:data:`trace_agent.demo.shipped.SHIPPED_DEMO_POLICIES`), the demonstrators' registry
(:mod:`trace_agent.demo.demonstrators`) and TRL's :data:`trace_agent.integrations.trl_env.SUPPORTED` are views
of :data:`PROFILES`.

An env without a row trains, evaluates and benches as any other (``trace-gym train --env ID --policy hf``);
it just has no demo config, shipped policy or demonstrator (``docs/guides/adding_an_env.md``).

Importing this module imports nothing beyond the standard library.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DemoProfile", "PROFILES", "DEFAULT_ENV_ID", "PYTHON_MATH", "WIKI_QA", "BFCL", "demo_profile"]

#: The suite's env ids, named once.
PYTHON_MATH = "trace_envs/PythonMath-v0"
WIKI_QA = "trace_envs/WikiQA-v0"
BFCL = "trace_envs/BFCL-v0"

#: The env every entry point defaults to (``TrainConfig.env_id``, and through it the bench, the claims, verl).
DEFAULT_ENV_ID = PYTHON_MATH


@dataclass(frozen=True, kw_only=True)
class DemoProfile:
    """What the project ships for one env.

    Attributes:
        env_id: the registered env id.
        config: the demo policy's training config: a file name under
            :data:`~trace_agent.config_io.CONFIG_DIR`, the base of ``trace-gym train --policy demo``
            without ``--config`` (None: none).
        policy_dir: the shipped demo policy's directory under ``trace_agent/demo/assets/`` (the slot may be
            empty in a checkout that has not built it).
        demonstrator: the scripted :class:`~trace_agent.demo.demonstrators.Demonstrator` that demonstrates
            the env, as the name of a class :mod:`trace_agent.demo.demonstrators` exports (None: none).
        trl_environment: the TRL tool adapter, as the name of a class
            :mod:`trace_agent.integrations.trl_env` defines (None: TRL's environment interface is not offered
            for it; :data:`trace_agent.integrations.trl_env.UNSUPPORTED` says why where it cannot be).
    """

    env_id: str
    config: str | None = None
    policy_dir: str
    demonstrator: str | None = None
    trl_environment: str | None = None


#: env id -> its profile.
PROFILES: dict[str, DemoProfile] = {p.env_id: p for p in (
    DemoProfile(env_id=PYTHON_MATH, config="demo.yaml", policy_dir="demo_policy",
                demonstrator="PythonMathDemonstrator", trl_environment="PythonMathEnvironment"),
    DemoProfile(env_id=WIKI_QA, config="wiki_demo.yaml", policy_dir="demo_policy_wiki",
                demonstrator="WikiQADemonstrator", trl_environment="WikiQAEnvironment"),
    DemoProfile(env_id=BFCL, config="bfcl_demo.yaml", policy_dir="demo_policy_bfcl",
                demonstrator="BFCLDemonstrator"),
)}


def demo_profile(env_id: str) -> DemoProfile | None:
    """``env_id``'s profile, or None for an env the project ships nothing for."""
    return PROFILES.get(env_id)
