"""The one definition of success: an episode succeeded when its reward is at least :data:`SUCCESS_THRESHOLD`.

Everything that splits outcomes in two uses this module: a tree's mixed / contrast counts
(:attr:`~trace_agent.tree.Node.is_success`), the allocators' repeat probability
(:func:`~trace_agent.allocation.repeat_probability`), the Oracle's Monte-Carlo rates, and the
evaluation of a policy (:func:`~trace_agent.evaluation.evaluate`, :func:`~trace_agent.evaluation.success_histogram`,
:func:`~trace_agent.evaluation.evaluate_heldout`).

Why 0.5 and not ``reward > 0``: the suite's graders give 0 or 1
(PythonMath-v0 ``float(correct)``, WikiQA-v0 exact match, BFCL-v0 ``float(valid)``), so the
two agree on every reward the shipped envs produce; they differ only for a reward in
(0, 0.5), which only a shaped reward (e.g. a partial F1) can give. There the threshold is
right: the paper's mixed group is "a success and a failure" of a binary verifier, a
half-wrong answer is not a success, and evaluation should count what training contrasts.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
from numpy.typing import ArrayLike, NDArray

__all__ = ["SUCCESS_THRESHOLD", "is_success", "success_mask", "success_rate"]

#: A leaf with reward >= this is a success, below it a failure.
SUCCESS_THRESHOLD = 0.5


def is_success(reward: float | None) -> bool:
    """True for a reward >= :data:`SUCCESS_THRESHOLD`; False for a lower reward, NaN or None (no outcome)."""
    return reward is not None and bool(reward >= SUCCESS_THRESHOLD)


def success_mask(rewards: ArrayLike) -> NDArray[np.bool_]:
    """Elementwise :func:`is_success` of an array of rewards (NaN is a failure)."""
    return np.asarray(rewards, dtype=np.float64) >= SUCCESS_THRESHOLD


def success_rate(rewards: Iterable[float]) -> float:
    """Share of ``rewards`` that are successes; NaN for no rewards."""
    values = list(rewards)
    return float(np.mean(success_mask(values))) if values else float("nan")
