"""Every registered env obeys the snapshot laws and Gymnasium's API; the checker itself can fail."""

from __future__ import annotations

import subprocess
import sys
import warnings

import gymnasium as gym
import pytest

import trace_envs
from trace_envs import check_branchable_env

from .counter_env import CounterEnv


@pytest.mark.parametrize("env_id", trace_envs.registered_ids())
def test_registered_env_passes_the_laws(env_id):
    env = gym.make(env_id)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            check_branchable_env(env)
    finally:
        env.close()


def test_checker_passes_a_correct_env():
    check_branchable_env(CounterEnv())


def test_checker_catches_a_snapshot_that_shares_state():
    with pytest.raises(AssertionError, match="isolation|replay|reuse|longevity"):
        check_branchable_env(CounterEnv(leak_state=True))


def test_import_is_cheap():
    code = ("import sys, trace_envs, gymnasium as gym\n"
            "heavy = [m for m in ('torch', 'faiss', 'jnius', 'vllm', 'transformers', 'bfcl_eval', 'sympy')"
            " if m in sys.modules]\n"
            "assert not heavy, heavy\n"
            "assert 'trace_envs/PythonMath-v0' in gym.registry")
    subprocess.run([sys.executable, "-c", code], check=True)
