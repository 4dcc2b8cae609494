"""BFCL-v0's reward agrees with bfcl-eval's own multi-turn checker.

bfcl-eval's ``multi_turn_checker`` imports without heavy dependencies, so the
same call sequences are scored by both: the ground truth and three
perturbations per entry (the last call of the last checked turn dropped, an
argument of the first call changed, an extra state-changing call). BFCL's
checker ``eval``s call strings and keeps instances in module globals, so it
runs in a subprocess (its backends' mutable defaults would otherwise be shared
with this process); only call strings made here from parsed literals reach it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

pytest.importorskip("bfcl_eval", reason="needs bfcl-eval (pip install --no-deps bfcl-eval mpmath)")
pytest.importorskip("mpmath")

from trace_envs.actions import PythonCall  # noqa: E402
from trace_envs.function_calling import BFCLEnv, render_calls  # noqa: E402
from trace_envs.tasks.bfcl import BFCL_CATEGORIES, load_bfcl_entries  # noqa: E402

_BFCL_RUNNER = r"""
import json, sys
from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import multi_turn_checker
cases = json.load(sys.stdin)
verdicts = []
for i, case in enumerate(cases):
    entry = case["entry"]
    result = multi_turn_checker(case["decoded"], entry["ground_truth"], entry, entry["id"].rsplit("_", 1)[0],
                                f"tracegym_agreement_{i}")
    verdicts.append([bool(result["valid"]), result.get("error_type")])
json.dump(verdicts, sys.stdout)
"""


def _perturb_value(value: Any) -> Any:
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return value + 1
    if isinstance(value, str):
        return value + "_x"
    if isinstance(value, list):
        return [*value, "x"] if all(isinstance(v, str) for v in value) else [*value, 1]
    return value


def _misargued(call: PythonCall) -> PythonCall:
    if call.kwargs:
        key = next(iter(call.kwargs))
        return PythonCall(call.name, call.args, {**call.kwargs, key: _perturb_value(call.kwargs[key])})
    if call.args:
        return PythonCall(call.name, (_perturb_value(call.args[0]), *call.args[1:]), {})
    return call


_EXTRA = {  # a state-changing call for the first involved class that has one
    "GorillaFileSystem": PythonCall("mkdir", (), {"dir_name": "extra_dir"}),
    "VehicleControlAPI": PythonCall("adjustClimateControl", (), {"temperature": 30.5, "fanSpeed": 3}),
    "TradingBot": PythonCall("add_to_watchlist", (), {"stock": "SYNX"}),
    "TwitterAPI": PythonCall("post_tweet", (), {"content": "extra", "tags": ["#x"], "mentions": []}),
    "TravelAPI": PythonCall("authenticate_travel", (), {"client_id": "x", "client_secret": "y", "refresh_token": "z",
                                                        "grant_type": "read_write", "user_first_name": "A",
                                                        "user_last_name": "B"}),
}


def _variants(truth: list[list[PythonCall]], involved: list[str]) -> dict[str, list[list[PythonCall]]]:
    checked = [i for i, calls in enumerate(truth) if calls]
    last, first = checked[-1], checked[0]
    dropped = [list(c) for c in truth]
    dropped[last] = dropped[last][:-1]
    misargued = [list(c) for c in truth]
    misargued[first][0] = _misargued(misargued[first][0])
    extra = [list(c) for c in truth]
    extra_call = next((_EXTRA[c] for c in involved if c in _EXTRA), None)
    variants = {"truth": truth, "dropped": dropped, "misargued": misargued}
    if extra_call is not None:
        extra[first].append(extra_call)
        variants["extra"] = extra
    return variants


def _env_reward(env: BFCLEnv, task_id: str, turns: list[list[PythonCall]]) -> float:
    env.reset(options={"task_id": task_id})
    reward = 0.0
    for calls in turns:
        for action in ([render_calls(calls)] if calls else []) + ["Nothing more to call."]:
            _, reward, terminated, truncated, _ = env.step(action)
            if terminated or truncated:
                return reward
    return reward


def _bfcl_verdicts(cases: list[dict[str, Any]]) -> list[list[Any]]:
    done = subprocess.run([sys.executable, "-c", _BFCL_RUNNER], input=json.dumps(cases), capture_output=True,
                          text=True, check=True)
    return json.loads(done.stdout)


@pytest.mark.parametrize("category", BFCL_CATEGORIES)
def test_reward_agrees_with_bfcl_multi_turn_checker(category: str) -> None:
    env = BFCLEnv(category=category, tasks="all")
    entries = {e["id"]: e for e in load_bfcl_entries(category)}
    cases: list[dict[str, Any]] = []
    ours: list[tuple[str, str, float]] = []
    for task_id in env.tasks.ids():
        env.reset(options={"task_id": task_id})
        truth = [list(t.calls) for t in env.ground_truth().turns]
        for name, turns in _variants(truth, env.task.data["involved_classes"]).items():
            ours.append((task_id, name, _env_reward(env, task_id, turns)))
            decoded = [[[c.to_source() for c in calls]] if calls else [] for calls in turns]
            cases.append({"entry": entries[task_id], "decoded": decoded})
    theirs = _bfcl_verdicts(cases)
    disagreements = [(tid, name, reward, verdict) for (tid, name, reward), verdict in zip(ours, theirs)
                     if (reward == 1.0) != verdict[0]]
    assert not disagreements, disagreements[:5]
    by_variant: dict[str, list[float]] = {}
    for _, name, reward in ours:
        by_variant.setdefault(name, []).append(reward)
    assert all(r == 1.0 for r in by_variant["truth"])
    # perturbations mostly fail; some are harmless under BFCL's rules too (e.g. ls(a=False) instead of
    # ls(a=True) when there is nothing hidden, or dropping a read whose result already appeared)
    for name in ("dropped", "misargued", "extra"):
        assert sum(by_variant[name]) < 0.35 * len(by_variant[name]), name
