"""The predictor plug point: the :class:`SuccessPredictor` protocol and the checks every caller shares.

A predictor maps *contexts* (a prompt plus the interaction history up to a node, joined by
:data:`~trace_agent.tree.CONTEXT_SEPARATOR`) to success probabilities, learns from soft
targets, and hands its learned state out as data (``state_dict``) and takes it back
(``load_state_dict``) so that :mod:`trace_agent.checkpoint` never reaches into its attributes.
A predictor may also have ``end_step()``, which :func:`~trace_agent.predictor.refresh_predictor`
calls once a step's refresh is done: it drops what only speeds up scoring and is not in
``state_dict`` (a cache whose hits change the floats), so that a run resumed from a checkpoint
starts its next step from the same state as the run that went on.

:func:`checked_predictions` is the one gate between a predictor and the allocators (a NaN
never reaches them); :func:`score_nodes` scores a tree's nodes through it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np
from numpy.typing import ArrayLike, NDArray

from trace_agent.errors import PredictionError
from trace_agent.tree import Node, RolloutTree

__all__ = [
    "DEFAULT_CRITIC",
    "PAPER_PREFIX_SHARE",
    "PredictionError",
    "SuccessPredictor",
    "check_training_data",
    "checked_predictions",
    "score_nodes",
]

#: The paper's critic checkpoint.
DEFAULT_CRITIC = "Qwen/Qwen3-0.6B"
#: Share of prefix (non-prompt) examples in the paper's predictor batches (docs/design.md, "Objectives").
PAPER_PREFIX_SHARE = 0.06


@runtime_checkable
class SuccessPredictor(Protocol):
    """Predicts the success probability of a prompt or a visited prefix from its context."""

    def predict(self, contexts: Sequence[str]) -> NDArray[np.float64]:
        """One probability in [0, 1] per context, as a float64 array."""
        ...

    def update(
        self, contexts: Sequence[str], targets: ArrayLike, weights: ArrayLike | None = None
    ) -> dict[str, float]:
        """Learn from soft targets in [0, 1] with non-negative weights (None: all 1); returns metrics."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """The learned state as data (numbers, text, lists, dicts, arrays, tensors); never code."""
        ...

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Inverse of :meth:`state_dict` into a predictor built the same way; ``ValueError`` on a mismatch."""
        ...


def check_training_data(
    contexts: Sequence[str], targets: ArrayLike, weights: ArrayLike | None
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """``targets`` and ``weights`` (None: all 1) as float64 arrays, checked against ``contexts``.

    Raises ``ValueError`` when the three lengths differ, a target is not finite or outside
    [0, 1], or a weight is not finite or negative.
    """
    y = np.asarray(targets, dtype=np.float64).reshape(-1)
    w = np.ones_like(y) if weights is None else np.asarray(weights, dtype=np.float64).reshape(-1)
    if not (len(contexts) == y.shape[0] == w.shape[0]):
        raise ValueError(f"{len(contexts)} contexts, {y.shape[0]} targets and {w.shape[0]} weights differ")
    if not np.all(np.isfinite(y)) or np.any(y < 0) or np.any(y > 1):
        raise ValueError("targets must be finite and in [0, 1]")
    if not np.all(np.isfinite(w)) or np.any(w < 0):
        raise ValueError("weights must be finite and >= 0")
    return y, w


def checked_predictions(values: ArrayLike, expected: int) -> NDArray[np.float64]:
    """``values`` as float64 probabilities, or :class:`PredictionError` (NaN/inf, wrong count).

    A predictor that returns NaN (a diverged head, a critic in fp16 overflow) must not reach
    the allocators silently; the message says which predictions and what to do. Finite values
    outside [0, 1] are clipped.
    """
    v = np.asarray(values, dtype=np.float64).reshape(-1)
    if v.shape[0] != expected:
        raise PredictionError(f"the predictor returned {v.shape[0]} values for {expected} contexts")
    bad = ~np.isfinite(v)
    if bad.any():
        raise PredictionError(f"the predictor returned {int(bad.sum())} non-finite value(s) of {expected} "
                              f"(first at index {int(np.flatnonzero(bad)[0])}); it has diverged or was fed "
                              "non-finite targets: reload its last checkpoint or lower its learning rate")
    return np.clip(v, 0.0, 1.0)


def score_nodes(predictor: SuccessPredictor, tree: RolloutTree, nodes: Sequence[Node] | None = None) -> NDArray[np.float64]:
    """Predict ``nodes`` (default: all inner nodes) of ``tree``, store each in ``node.value``, return them.

    Values are clipped to [0, 1]; a NaN or infinite prediction raises :class:`PredictionError`
    (:func:`checked_predictions`) instead of reaching the allocators.
    """
    chosen = [n for n in tree.nodes if not n.is_leaf] if nodes is None else list(nodes)
    if not chosen:
        return np.zeros(0)
    values = checked_predictions(predictor.predict([tree.context(n) for n in chosen]), len(chosen))
    for n, v in zip(chosen, values, strict=True):
        tree.set_value(n, float(v))
    return values

