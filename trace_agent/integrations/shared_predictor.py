"""The success predictor shared by every rollout worker (TRACE steps 1 and 4), and its checkpoint as data.

:class:`PredictorService` holds one :class:`~trace_agent.predictor.EmbeddingPredictor`; workers score
prompts and prefixes through it and hand it their finished trees. It runs as one named Ray actor per
cluster (:meth:`PredictorService.actor`) or in-process; :class:`PredictorProxy` gives either the
``predict`` face the rollout collector expects. :func:`save_predictor` / :func:`load_predictor` write
and read its learned state as ``arrays.npz`` + ``meta.json`` (``np.load(allow_pickle=False)``: a
checkpoint is data, never unpickled).

Imports neither verl nor torch (the actor process stays small); Ray only when used as an actor.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from trace_agent.policy.base import PolicyError
from trace_agent.predictor.base import PAPER_PREFIX_SHARE
from trace_agent.tree import RolloutTree

__all__ = ["PREDICTOR_ACTOR", "PREDICTOR_NAMESPACE", "PredictorService", "PredictorProxy", "save_predictor",
           "load_predictor"]

#: Name and namespace of the shared predictor actor.
PREDICTOR_ACTOR = "trace_predictor"
PREDICTOR_NAMESPACE = "trace_gym"


class PredictorService:
    """The success predictor shared by all workers: scores contexts, refreshes on finished trees.

    Trees handed in with :meth:`add_trees` (as ``RolloutTree.to_dict()`` data) wait until
    :meth:`refresh` trains on all of them at once (:func:`~trace_agent.predictor.refresh_predictor`).
    Each worker calls :meth:`refresh` when a training chunk arrives, before scoring it, so with
    verl's synchronous trainer step k+1's roots are scored after one refresh on all of step k's
    trees, and no tree of a step sees another tree of the same step, as in trace-gym's loop
    (an asynchronous trainer refreshes on whatever finished before the chunk arrived). Run it
    as one Ray actor (:meth:`actor`) or in-process.
    """

    def __init__(self, *, kind: str = "embedding", prefixes: str = "all", prefix_share: float | None = PAPER_PREFIX_SHARE,
                 checkpoint: str | None = None) -> None:
        from trace_agent.predictor import EmbeddingPredictor, HashedNGramFeaturizer

        self.predictor = EmbeddingPredictor() if kind == "embedding" else EmbeddingPredictor(HashedNGramFeaturizer())
        self.prefixes = prefixes
        self.prefix_share = prefix_share
        self._pending: list[RolloutTree] = []
        self.refreshes = 0
        self.last_metrics: dict[str, float] = {}
        if checkpoint is not None and (Path(checkpoint) / "meta.json").exists():
            load_predictor(self.predictor, checkpoint)

    @classmethod
    def actor(cls, *, kind: str = "embedding", prefixes: str = "all", prefix_share: float | None = PAPER_PREFIX_SHARE,
              checkpoint: str | None = None) -> Any:
        """The cluster's one predictor actor (created by the first caller, found by the others)."""
        import ray

        remote = ray.remote(num_cpus=0)(cls)
        return remote.options(name=PREDICTOR_ACTOR, namespace=PREDICTOR_NAMESPACE, get_if_exists=True).remote(
            kind=kind, prefixes=prefixes, prefix_share=prefix_share, checkpoint=checkpoint)

    def add_trees(self, trees: Sequence[Mapping[str, Any]]) -> int:
        self._pending += [RolloutTree.from_dict(dict(t)) for t in trees]
        return len(self._pending)

    def refresh(self) -> dict[str, float]:
        from trace_agent.predictor import refresh_predictor

        if not self._pending:
            return {}
        # workers finish in any order; training in prompt-id order makes a refresh reproducible
        trees, self._pending = sorted(self._pending, key=lambda t: t.prompt_id), []
        self.last_metrics = refresh_predictor(self.predictor, trees, prefixes=self.prefixes,  # type: ignore[arg-type]
                                              prefix_share=self.prefix_share)
        self.refreshes += 1
        return self.last_metrics

    def predict(self, contexts: Sequence[str]) -> list[float]:
        return [float(v) for v in self.predictor.predict(list(contexts))]

    def state_dict(self) -> dict[str, Any]:
        """The shared predictor's ``state_dict`` (trees still pending are trained on first)."""
        self.refresh()
        return self.predictor.state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.predictor.load_state_dict(state)

    def save(self, directory: str) -> str:
        self.refresh()
        return str(save_predictor(self.predictor, directory, extra={"refreshes": self.refreshes}))


class PredictorProxy:
    """The SuccessPredictor face of a :class:`PredictorService` (local object or Ray actor) for the collector."""

    def __init__(self, service: Any) -> None:
        self.service = service

    def _call(self, name: str, *args: Any) -> Any:
        method = getattr(self.service, name)
        if hasattr(method, "remote"):
            import ray

            return ray.get(method.remote(*args))
        return method(*args)

    def predict(self, contexts: Sequence[str]) -> np.ndarray:
        return np.asarray(self._call("predict", list(contexts)), dtype=np.float64)

    def update(self, contexts: Sequence[str], targets: Any, weights: Any = None) -> dict[str, float]:
        raise PolicyError("the shared predictor learns from finished trees (add_trees), not from update()")

    def add_trees(self, trees: Sequence[RolloutTree]) -> None:
        self._call("add_trees", [t.to_dict() for t in trees])

    def refresh(self) -> dict[str, float]:
        return dict(self._call("refresh"))

    def state_dict(self) -> dict[str, Any]:
        """The service's predictor state (as data: it travels from the actor like the trees do)."""
        return dict(self._call("state_dict"))

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self._call("load_state_dict", dict(state))


def save_predictor(predictor: Any, directory: str | Path, *, extra: Mapping[str, Any] | None = None) -> Path:
    """Write an ``EmbeddingPredictor``'s learned arrays (its ``state_dict()["state"]``) as ``arrays.npz`` + ``meta.json``.

    No pickle; the embedding cache is not written (it is rebuilt on demand).
    """
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    arrays = {k: v for k, v in predictor.state_dict()["state"].items() if v is not None}
    np.savez(out / "arrays.npz", **{k: np.asarray(v, dtype=np.float64) for k, v in arrays.items()})
    meta = {"kind": "embedding", "featurizer": predictor.featurizer_name, "arrays": sorted(arrays),
            **dict(extra or {})}
    (out / "meta.json").write_text(json.dumps(meta, indent=1))
    return out


def load_predictor(predictor: Any, directory: str | Path) -> None:
    """Inverse of :func:`save_predictor` into a predictor built the same way (refuses another featurizer)."""
    src = Path(directory)
    meta = json.loads((src / "meta.json").read_text())
    if meta.get("featurizer") != predictor.featurizer_name:
        raise ValueError(f"predictor checkpoint in {src} used featurizer {meta.get('featurizer')!r}, "
                         f"this predictor uses {predictor.featurizer_name!r}")
    with np.load(src / "arrays.npz", allow_pickle=False) as data:
        arrays = {k: np.array(data[k]) for k in meta["arrays"]}
    predictor.load_state_dict({"state": arrays, "cache": None})
