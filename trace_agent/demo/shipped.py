"""The demo policies the project ships, one per env, and loading them.

:data:`SHIPPED_DEMO_POLICIES` names each env's directory under ``trace_agent/demo/assets/`` (the profiles'
``policy_dir``, :mod:`trace_agent.demo.profiles`);
:func:`load_demo_policy` loads one as an :class:`~trace_agent.policy.hf.HFPolicy`;
:func:`ensure_demo_policy` returns the shipped directory or builds a policy where the caller asks.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from trace_agent.demo.build import DEFAULT_ENV_IDS, build_demo_policy, demo_train_config
from trace_agent.demo.profiles import DEFAULT_ENV_ID, PROFILES
from trace_agent.policy.base import PolicyError

if TYPE_CHECKING:
    from trace_agent.policy.hf import HFPolicy

__all__ = [
    "SHIPPED_DEMO_POLICY",
    "SHIPPED_DEMO_POLICIES",
    "shipped_demo_policy",
    "missing_shipped_policy",
    "ensure_demo_policy",
    "load_demo_policy",
]


#: The demo policy the project ships (built by ``scripts/build_demo_policy.py --steps 400 --seed 0``;
#: its ``build_report.json`` holds the losses and timings).
_ASSETS = Path(__file__).resolve().parent / "assets"
#: env id -> the directory its shipped demo policy lives in (it may not be built yet for every env).
SHIPPED_DEMO_POLICIES: dict[str, Path] = {env_id: _ASSETS / p.policy_dir for env_id, p in PROFILES.items()}
#: The shipped demo policy of the default env, PythonMath-v0 (the default of every ``path``-less call).
SHIPPED_DEMO_POLICY = SHIPPED_DEMO_POLICIES[DEFAULT_ENV_ID]


def shipped_demo_policy(env_id: str = DEFAULT_ENV_IDS[0]) -> Path:
    """Where ``env_id``'s shipped demo policy lives (PythonMath-v0's for an env without one)."""
    return SHIPPED_DEMO_POLICIES.get(env_id, SHIPPED_DEMO_POLICY)


def missing_shipped_policy(env_id: str) -> str | None:
    """Why ``--policy demo`` without a path cannot run on ``env_id`` (its shipped slot is empty), or None."""
    if (shipped_demo_policy(env_id) / "config.json").exists():
        return None
    return (f"no demo policy is shipped for {env_id} yet; build one with `python scripts/build_demo_policy.py "
            f"--env {env_id} --out DIR` (tens of minutes on a CPU) and pass its directory as the policy path")



def ensure_demo_policy(path: str | Path | None = None, *, env_id: str = DEFAULT_ENV_IDS[0], seed: int = 0,
                       steps: int | None = None, log: Callable[[str], None] | None = None) -> Path:
    """The directory of ``env_id``'s demo policy: the shipped one (:func:`shipped_demo_policy`) when
    ``path`` is None or empty, else ``path``, built there first (:func:`build_demo_policy` with
    :func:`demo_train_config`) when it holds no model.

    An env whose shipped slot is empty is a :class:`PolicyError` naming the build command: building
    one silently into the package would take tens of minutes on a CPU.
    """
    if not path:
        missing = missing_shipped_policy(env_id)
        if missing is not None:
            raise PolicyError(missing)
        return shipped_demo_policy(env_id)
    target = Path(path)
    if not (target / "config.json").exists():
        if log is not None:
            log(f"building the {env_id} demo policy in {target} (minutes, once)")
        config = demo_train_config(env_id, seed=seed)
        build_demo_policy(target, seed=seed, steps=steps, config=config, log=log, progress=True)
    return target


def load_demo_policy(path: str | Path = SHIPPED_DEMO_POLICY, *, device: str = "cpu",
                     max_batch_size: int = 32) -> HFPolicy:
    """The demo policy saved by :func:`build_demo_policy`, loaded with ``HFPolicy.from_pretrained``."""
    from trace_agent.policy.hf import HFPolicy

    if not (Path(path) / "config.json").exists():
        raise PolicyError(f"no demo policy at {path}: build it with scripts/build_demo_policy.py")
    return HFPolicy.from_pretrained(path, device=device, max_batch_size=max_batch_size)
