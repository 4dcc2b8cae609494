"""The CPU default predictor: frozen sentence embeddings + a logistic-regression head fitted by L-BFGS.

Frozen all-MiniLM-L6-v2 embeddings (:mod:`trace_agent.predictor.featurizers`) of the prompt
and of the history's tail, cached by text hash, and a logistic-regression head fitted by
L-BFGS on weighted cross-entropy with soft targets. Learns in seconds. Without the model
package it falls back to hashed word n-grams, with a warning and ``featurizer_name`` saying so.

The fit's matrix-vector products are small (the replay buffer's rows of the features): they run
on one BLAS thread (:func:`one_blas_thread`), which spares the thread hand-offs that dominate such
products on a loaded machine (a demo run's four first fits: 2.9-3.6 s with two OpenBLAS threads,
0.27-0.41 s with one, on 2 busy cores). Up to a few hundred thousand buffer entries (a demo run's
buffer has ~100 x 897) OpenBLAS splits a product's outputs among its threads, not its sums, so the
weights are the same bits as with many threads; on larger buffers it splits the sums, whose bits
then depend on the thread count, and the one-thread fit's do not (the same on any machine).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from trace_agent.predictor.base import check_training_data
from trace_agent.predictor.featurizers import Featurizer, default_featurizer

__all__ = ["EmbeddingPredictorConfig", "EmbeddingPredictor", "one_blas_thread"]

#: The learned arrays of an :class:`EmbeddingPredictor` (its ``state_dict()["state"]`` keys).
_STATE_FIELDS = ("_x", "_y", "_w", "_theta", "_mean", "_scale")


@dataclass(frozen=True, kw_only=True)
class EmbeddingPredictorConfig:
    """Head and replay settings of :class:`EmbeddingPredictor`.

    Attributes:
        l2: L2 penalty on the head's weights (on standardised features; bias unpenalised).
        max_iter: L-BFGS iterations per update.
        buffer_size: most recent examples the head is refitted on (targets drift with the policy).
        prior: prediction before the first update.
    """

    l2: float = 1e-2
    max_iter: int = 100
    buffer_size: int = 20_000
    prior: float = 0.5

    def __post_init__(self) -> None:
        if not (self.l2 >= 0 and math.isfinite(self.l2)):
            raise ValueError("l2 must be a finite number >= 0")
        if self.max_iter < 1 or self.buffer_size < 1:
            raise ValueError("max_iter and buffer_size must be >= 1")
        if not 0.0 < self.prior < 1.0:
            raise ValueError("prior must be in (0, 1)")


class EmbeddingPredictor:
    """The CPU default predictor: frozen embeddings + a logistic-regression head (see the module doc).

    Each :meth:`update` appends the examples to a replay buffer (the last
    ``buffer_size`` kept), standardises the features on the buffer and refits the head
    by L-BFGS, warm-started, minimising the weighted soft-target cross-entropy
    sum_i w_i [-y_i log p_i - (1 - y_i) log(1 - p_i)] / sum_i w_i + l2/2 ||theta||^2.

    Args:
        featurizer: any :class:`Featurizer` (default: :func:`default_featurizer`).
        config: head settings.
    """

    def __init__(self, featurizer: Featurizer | None = None, *,
                 config: EmbeddingPredictorConfig | None = None) -> None:
        self.featurizer: Featurizer = default_featurizer() if featurizer is None else featurizer
        self.config = config or EmbeddingPredictorConfig()
        self._x = np.zeros((0, 0))
        self._y = np.zeros(0)
        self._w = np.zeros(0)
        self._theta: NDArray[np.float64] | None = None
        self._mean: NDArray[np.float64] | None = None
        self._scale: NDArray[np.float64] | None = None

    @property
    def featurizer_name(self) -> str:
        """Which featurizer is in use (says "fallback" when MiniLM could not be loaded)."""
        return self.featurizer.name

    @property
    def fitted(self) -> bool:
        return self._theta is not None

    def predict(self, contexts: Sequence[str]) -> NDArray[np.float64]:
        if not contexts:
            return np.zeros(0)
        if self._theta is None:
            return np.full(len(contexts), self.config.prior)
        x = self._design(self.featurizer.encode(contexts))
        return _sigmoid(x @ self._theta)

    def update(self, contexts: Sequence[str], targets: ArrayLike, weights: ArrayLike | None = None) -> dict[str, float]:
        y, w = check_training_data(contexts, targets, weights)
        if not contexts:
            return {"loss": math.nan, "buffer": float(self._y.shape[0]), "iterations": 0.0}
        x = self.featurizer.encode(contexts)
        if self._x.shape[0] == 0:
            self._x = x
        else:
            self._x = np.vstack([self._x, x])
        self._y = np.concatenate([self._y, y])
        self._w = np.concatenate([self._w, w])
        keep = self.config.buffer_size
        self._x, self._y, self._w = self._x[-keep:], self._y[-keep:], self._w[-keep:]
        return self._fit()

    def end_step(self) -> None:
        """A step ended: the featurizer drops its per-step caches (``end_step``, when it has one)."""
        end_step = getattr(self.featurizer, "end_step", None)
        if callable(end_step):
            end_step()

    def state_dict(self) -> dict[str, Any]:
        """Replay buffer, head and standardisation as arrays, plus the featurizer's embedding cache.

        ``{"state": {"_x", "_y", "_w", "_theta", "_mean", "_scale"}, "cache": {"keys", "vectors"} | None}``
        (the cache is None for a featurizer without ``cache_state``).
        """
        cache_state = getattr(self.featurizer, "cache_state", None)
        return {"state": {name: getattr(self, name) for name in _STATE_FIELDS},
                "cache": cache_state() if callable(cache_state) else None}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Inverse of :meth:`state_dict`; all or nothing.

        Raises ``ValueError`` (and changes nothing) on an unknown field, a field that is not an
        array, or a cache whose keys and vectors do not pair up.
        """
        fields = dict(state["state"])
        unknown = set(fields) - set(_STATE_FIELDS)
        if unknown:
            raise ValueError(f"the predictor state has unknown fields {sorted(unknown)}")
        for name, value in fields.items():
            if value is not None and not isinstance(value, np.ndarray | int | float):
                raise ValueError(f"predictor field {name} is a {type(value).__name__}, expected an array")
        load_cache = getattr(self.featurizer, "load_cache_state", None)
        if callable(load_cache) and state.get("cache") is not None:
            load_cache(state["cache"])  # checked before it replaces the cache, and before any field is set
        for name, value in fields.items():
            setattr(self, name, value)

    def _design(self, x: NDArray[np.float64]) -> NDArray[np.float64]:
        assert self._mean is not None and self._scale is not None
        z = (x - self._mean) / self._scale
        return np.hstack([z, np.ones((z.shape[0], 1))])

    def _fit(self) -> dict[str, float]:
        from scipy.optimize import minimize  # before the limit, which finds the BLAS libraries loaded

        with one_blas_thread():
            return self._fit_head(minimize)

    def _fit_head(self, minimize: Any) -> dict[str, float]:
        self._mean = self._x.mean(axis=0)
        self._scale = np.maximum(self._x.std(axis=0), 1e-6)
        x = self._design(self._x)
        y = self._y
        w = self._w / max(float(self._w.sum()), 1e-12)
        l2 = self.config.l2
        reg = np.ones(x.shape[1])
        reg[-1] = 0.0

        def loss_grad(theta: NDArray[np.float64]) -> tuple[float, NDArray[np.float64]]:
            z = x @ theta
            # log(1 + e^z) - y z, stable
            loss = float(np.sum(w * (np.logaddexp(0.0, z) - y * z))) + 0.5 * l2 * float(np.sum(reg * theta**2))
            grad = x.T @ (w * (_sigmoid(z) - y)) + l2 * reg * theta
            return loss, grad

        theta0 = self._theta if self._theta is not None and self._theta.shape[0] == x.shape[1] else np.zeros(x.shape[1])
        if self._theta is None:
            ybar = float(np.clip(np.sum(w * y), 1e-3, 1 - 1e-3))
            theta0[-1] = math.log(ybar / (1 - ybar))
        res = minimize(loss_grad, theta0, jac=True, method="L-BFGS-B", options={"maxiter": self.config.max_iter})
        self._theta = np.asarray(res.x, dtype=np.float64)
        return {"loss": float(res.fun), "buffer": float(self._y.shape[0]), "iterations": float(res.nit)}


_BLAS_LOCK = threading.Lock()


@contextmanager
def one_blas_thread() -> Iterator[None]:
    """Run the block with the BLAS libraries loaded in this process (numpy's, scipy's) on one thread.

    For small products: the thread hand-offs of a multi-threaded BLAS call cost more than the
    arithmetic, most of all when other processes hold the cores. The limit is process-wide
    (``threadpoolctl``), so blocks are serialised and the previous limits come back on exit; torch's
    own thread pool is not touched. Libraries loaded inside the block are not limited: import
    what the block uses first. Without ``threadpoolctl`` (an ``agent`` dependency) the block runs
    as it is: the same results, with the BLAS libraries' own thread counts.
    """
    try:
        from threadpoolctl import ThreadpoolController
    except ImportError:
        yield
        return
    with _BLAS_LOCK, ThreadpoolController().limit(limits=1, user_api="blas"):
        yield


def _sigmoid(z: NDArray[np.float64]) -> NDArray[np.float64]:
    return np.exp(-np.logaddexp(0.0, -z))
