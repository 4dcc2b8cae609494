"""What a checkpoint holds beside the weights: every RNG's state and the predictor's learned state."""

from __future__ import annotations

import random
from typing import Any

import numpy as np

__all__ = ["capture_rng_state", "restore_rng_state", "predictor_state", "load_predictor_state"]


def capture_rng_state(generator: np.random.Generator | None = None) -> dict[str, Any]:
    """python ``random``, numpy's global RNG, torch's CPU (and CUDA) RNG, and ``generator``'s state."""
    import torch

    state: dict[str, Any] = {"python": random.getstate(), "numpy": np.random.get_state(),
                             "torch": torch.get_rng_state()}
    if torch.cuda.is_available():  # pragma: no cover - GPU machines
        state["cuda"] = torch.cuda.get_rng_state_all()
    if generator is not None:
        state["generator"] = generator.bit_generator.state
    return state


def restore_rng_state(state: dict[str, Any], generator: np.random.Generator | None = None) -> None:
    """Inverse of :func:`capture_rng_state`."""
    import torch

    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():  # pragma: no cover
        torch.cuda.set_rng_state_all(state["cuda"])
    if generator is not None and "generator" in state:
        generator.bit_generator.state = state["generator"]


def predictor_state(predictor: Any) -> dict[str, Any]:
    """A picklable snapshot of a predictor's learned state.

    :class:`~trace_agent.predictor.EmbeddingPredictor`: its replay buffer, head and
    standardisation (and the featurizer's embedding cache, so resumed scores are bit-equal).
    :class:`~trace_agent.predictor.LMCritic`: backbone and head weights, optimiser, RNG.
    Anything else must offer ``state_dict()``.
    """
    from trace_agent.predictor import EmbeddingPredictor, LMCritic

    if isinstance(predictor, EmbeddingPredictor):
        state = {k: v for k, v in predictor.__dict__.items() if k not in ("featurizer", "config")}
        cache = getattr(predictor.featurizer, "cache", None)
        return {"kind": "embedding", "state": state,
                "cache": None if cache is None else list(cache._data.items())}
    if isinstance(predictor, LMCritic):
        opt = predictor._optimizer
        return {"kind": "lm-critic", "model": predictor.model.state_dict(), "head": predictor.head.state_dict(),
                "optimizer": None if opt is None else opt.state_dict(), "rng": predictor._rng.bit_generator.state}
    state_dict = getattr(predictor, "state_dict", None)
    if callable(state_dict):
        return {"kind": "custom", "state": state_dict()}
    raise TypeError(f"cannot checkpoint a {type(predictor).__name__}: give it state_dict()/load_state_dict()")


def load_predictor_state(predictor: Any, state: dict[str, Any]) -> None:
    """Inverse of :func:`predictor_state` (into a predictor built the same way)."""
    from collections import OrderedDict

    kind = state["kind"]
    if kind == "embedding":
        predictor.__dict__.update(state["state"])
        cache = getattr(predictor.featurizer, "cache", None)
        if cache is not None and state["cache"] is not None:
            cache._data = OrderedDict(state["cache"])
    elif kind == "lm-critic":
        predictor.model.load_state_dict(state["model"])
        predictor.head.load_state_dict(state["head"])
        if state["optimizer"] is not None:
            predictor._get_optimizer().load_state_dict(state["optimizer"])
        predictor._rng.bit_generator.state = state["rng"]
    else:
        predictor.load_state_dict(state["state"])
