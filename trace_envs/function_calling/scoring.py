"""BFCL's multi-turn verdict, turn by turn, without ``eval`` or globals.

For every user turn whose ground truth is not empty (BFCL skips the turns
where the model is expected to fail: held-back functions, missing parameters),
in this order, as ``bfcl_eval/eval_checker/multi_turn_eval/multi_turn_checker.py`` does:

1. **empty turn**: the model made at least one call during the turn;
2. **state**: every public attribute (not starting with "_") of every involved
   backend equals the one after executing the ground truth of turns 0..t
   from the same initial configuration;
3. **response**: the ground-truth results of turn t are contained (as a
   multiset, order free) in the results of *all* the model's calls so far.

An entry is valid when every turn passes (BFCL stops at the first failure;
here every turn is reported, and the verdict is the same).
"""

from __future__ import annotations

import functools
import hashlib
import pickle
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from trace_envs.actions import PythonCall, parse_call_list
from trace_envs.core import Task
from trace_envs.errors import InvalidTaskError
from trace_envs.function_calling.backends import Backends
from trace_envs.function_calling.remote import RemoteBackends

__all__ = ["GroundTruthTurn", "GroundTruth", "TurnCheck", "check_turn", "missing_results", "parse_ground_truth_call"]


def parse_ground_truth_call(source: str) -> PythonCall:
    """One ground-truth call string such as ``"sort('final_report.pdf')"`` → PythonCall (literals only)."""
    parsed = parse_call_list(source)
    if not parsed.ok or len(parsed.calls) != 1:
        raise InvalidTaskError(f"ground-truth call {source!r} is not one literal call: {' '.join(parsed.errors)}")
    return parsed.calls[0]


@dataclass(frozen=True)
class GroundTruthTurn:
    """The ground truth of one user turn, executed from the initial state after the previous turns."""

    calls: tuple[PythonCall, ...]
    results: tuple[str, ...]
    #: {class name: public attributes} after this turn
    states: Mapping[str, Mapping[str, Any]]

    @functools.cached_property
    def states_blob(self) -> bytes:
        """:attr:`states` pickled, for the backend worker's state check (trusted ground-truth objects)."""
        return pickle.dumps(dict(self.states), protocol=pickle.HIGHEST_PROTOCOL)

    @functools.cached_property
    def states_key(self) -> str:
        """A digest naming :attr:`states_blob`."""
        return hashlib.sha256(self.states_blob).hexdigest()


@dataclass(frozen=True)
class GroundTruth:
    """A task's ground truth, executed once per task (pure function of the task)."""

    turns: tuple[GroundTruthTurn, ...]

    @classmethod
    def compute(cls, task: Task) -> GroundTruth:
        data = task.data
        backends = Backends.load(data["involved_classes"], data["initial_config"],
                                 long_context=bool(data.get("long_context", False)))
        turns: list[GroundTruthTurn] = []
        for sources in data["ground_truth"]:
            calls = tuple(parse_ground_truth_call(s) for s in sources)
            results = tuple(backends.call(c.name, c.args, c.kwargs).result for c in calls)
            turns.append(GroundTruthTurn(calls=calls, results=results, states=backends.public_states()))
        return cls(turns=tuple(turns))


@dataclass(frozen=True)
class TurnCheck:
    """BFCL's verdict on one user turn.

    ``checked`` is False for turns with an empty ground truth (not checked, valid).
    ``error_type`` uses BFCL's names: ``multi_turn:empty_turn_model_response``,
    ``multi_turn:instance_state_mismatch``, ``multi_turn:execution_response_mismatch``.
    """

    turn: int
    valid: bool
    checked: bool = True
    error_type: str | None = None
    message: str = ""
    #: {class name: names of the public attributes that differ}
    state_differences: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    missing_results: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return {
            "turn": self.turn, "valid": self.valid, "checked": self.checked, "error_type": self.error_type,
            "message": self.message,
            "state_differences": {k: list(v) for k, v in self.state_differences.items()},
            "missing_results": list(self.missing_results),
        }


def missing_results(truth: Sequence[str], model: Sequence[str]) -> list[str]:
    """Ground-truth results not found in the model's (each model result matches at most once)."""
    pool = list(model)
    missing: list[str] = []
    for item in truth:
        try:
            pool.remove(item)
        except ValueError:
            missing.append(item)
    return missing


def _differences(backends: Backends | RemoteBackends,
                      truth: GroundTruthTurn) -> Mapping[str, Sequence[str]] | None:
    """{class: public attributes that differ from the turn's ground truth}; None when a worker's backends
    could not be compared in time (too deep or too slow a state)."""
    if isinstance(backends, RemoteBackends):
        return backends.compare(truth.states_key, truth.states_blob)
    return {cls: list(diff) for cls, diff in backends.compare(truth.states).items()}


def check_turn(turn: int, truth: GroundTruthTurn, backends: Backends | RemoteBackends, *, calls_in_turn: int,
               all_results: Sequence[str]) -> TurnCheck:
    """Check the model's state after user turn ``turn`` (see the module docstring). A state that cannot be
    compared in time fails the state check."""
    if not truth.calls:
        return TurnCheck(turn=turn, valid=True, checked=False, message="no ground truth for this turn: not checked")
    if calls_in_turn == 0:
        return TurnCheck(turn=turn, valid=False, error_type="multi_turn:empty_turn_model_response",
                         message=f"no function call in turn {turn}, whose ground truth has {len(truth.calls)}")
    differences = _differences(backends, truth)
    if differences is None:
        return TurnCheck(turn=turn, valid=False, error_type="multi_turn:instance_state_mismatch",
                         message="the state could not be compared with the ground truth within its time and "
                                 "memory limits")
    if differences:
        return TurnCheck(
            turn=turn, valid=False, error_type="multi_turn:instance_state_mismatch",
            message="state differs from the ground truth in " + ", ".join(
                f"{cls}.{attr}" for cls, diff in differences.items() for attr in diff),
            state_differences={cls: tuple(diff) for cls, diff in differences.items()},
        )
    missing = missing_results(truth.results, all_results)
    if missing:
        return TurnCheck(
            turn=turn, valid=False, error_type="multi_turn:execution_response_mismatch",
            message=f"{len(missing)} ground-truth result(s) of turn {turn} not among the model's results",
            missing_results=tuple(missing),
        )
    return TurnCheck(turn=turn, valid=True)
