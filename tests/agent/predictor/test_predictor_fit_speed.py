"""The predictor's cheap refresh: the head's fit on one BLAS thread gives the same bits; Spearman without scipy.stats.

These speed-ups must not move any allocation decision: on buffers of a demo run's size, the same
weights bit for bit, hence the same predictions, node values and trees as fits with the BLAS
libraries' own thread counts (the trainer test at the end runs both ways); on larger buffers the
weights no longer depend on the machine's thread count.
"""

from __future__ import annotations

import contextlib
import math
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.agent.test_trainer import segment_key, tiny_config
from trace_agent.config import PredictorSettings
from trace_agent.predictor import EmbeddingPredictor, HashedNGramFeaturizer, spearman
from trace_agent.predictor import embedding as embedding_mod
from trace_agent.trainer import Trainer

threadpoolctl = pytest.importorskip("threadpoolctl")


def _blas_threads() -> list[int]:
    return [lib.num_threads for lib in threadpoolctl.ThreadpoolController().select(user_api="blas").lib_controllers]


def test_spearman_equals_scipy_with_ties_and_non_finite_pairs() -> None:
    from scipy.stats import spearmanr

    rng = np.random.default_rng(0)
    checked = 0
    for i in range(300):
        n = int(rng.integers(3, 60))
        a = rng.integers(0, 4, n).astype(float) if i % 2 else rng.normal(size=n)  # ties on odd draws
        b = rng.integers(0, 3, n) / 2.0 if i % 3 else rng.normal(size=n)
        if i % 5 == 0:
            a[0], b[-1] = math.nan, math.inf  # dropped pairwise, as the metrics need
        ok = np.isfinite(a) & np.isfinite(b)
        if ok.sum() < 3 or np.ptp(a[ok]) == 0 or np.ptp(b[ok]) == 0:
            continue
        assert spearman(a, b) == pytest.approx(spearmanr(a[ok], b[ok]).statistic, abs=1e-12)
        checked += 1
    assert checked > 200
    assert spearman([3, 1, 2, 2], [30, 10, 20, 20]) == 1.0 and spearman([1, 2, 3], [3, 2, 1]) == -1.0
    assert math.isnan(spearman([1, 2], [1, 2])) and math.isnan(spearman([2, 2, 2], [1, 2, 3]))


def test_one_blas_thread_limits_inside_and_restores_after() -> None:
    before = _blas_threads()
    assert before, "numpy's BLAS must be visible to threadpoolctl"
    with embedding_mod.one_blas_thread():
        assert _blas_threads() == [1] * len(before)
    assert _blas_threads() == before


def test_without_threadpoolctl_the_fit_runs_unlimited(monkeypatch: pytest.MonkeyPatch) -> None:
    before = _blas_threads()
    monkeypatch.setitem(sys.modules, "threadpoolctl", None)  # import fails as if not installed
    ran = []
    with embedding_mod.one_blas_thread():
        ran.append(True)
    p = _buffered(13, 897, seed=1)
    assert p._fit()["iterations"] >= 1 and ran == [True]
    monkeypatch.undo()
    assert _blas_threads() == before


def _buffered(n: int, dim: int, seed: int) -> EmbeddingPredictor:
    rng = np.random.default_rng(seed)
    p = EmbeddingPredictor(HashedNGramFeaturizer(dim=dim // 2))
    p._x = rng.normal(size=(n, dim)) + rng.normal(size=dim)
    p._y = rng.uniform(size=n)
    p._w = rng.integers(1, 6, size=n).astype(float)
    return p


@pytest.mark.parametrize(("n", "dim"), [(13, 897), (102, 897), (400, 897)])
def test_head_fit_on_one_blas_thread_is_bit_identical_to_two(n: int, dim: int) -> None:
    """Buffers of a demo run's size (up to 400 x 897; the demo's reaches 102 rows): a fit, warm-started
    twice as the trainer's steps do, on one BLAS thread == on two, bit for bit."""
    from scipy.optimize import minimize

    one, two = _buffered(n, dim, seed=n), _buffered(n, dim, seed=n)
    for _ in range(2):
        got = one._fit()
        with threadpoolctl.ThreadpoolController().limit(limits=2, user_api="blas"):
            want = two._fit_head(minimize)
        assert got == want
        assert one._theta.tobytes() == two._theta.tobytes()
        one._y, two._y = one._y[::-1].copy(), two._y[::-1].copy()  # new targets: the next fit starts warm


def test_head_fit_does_not_depend_on_the_process_blas_threads() -> None:
    """A large buffer, where a two-thread BLAS splits a product's sums (bits other than one thread's): the fit
    gives the same weights whatever thread count the process has set around it (fails without the limit)."""
    fits = []
    for threads in (1, 2):
        p = _buffered(800, 897, seed=5)
        with threadpoolctl.ThreadpoolController().limit(limits=threads, user_api="blas"):
            p._fit()
        fits.append(p._theta.tobytes())
    assert fits[0] == fits[1]


def _trees_key(trees) -> list:
    return [(t.prompt_id, t.parent_ids(),
             [(n.reward, n.value, t.context(n)) for n in t.nodes]) for t in trees]


@pytest.mark.slow
def test_training_trees_and_head_unchanged_by_the_one_thread_fit(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """3 steps of the tiny trainer with the policy-states predictor: the same trees (node values included),
    batches and head weights whether the fits run on one BLAS thread or with the libraries' own counts."""

    def run(name: str) -> tuple[list, list, bytes]:
        trainer = Trainer(tiny_config(tmp_path / name, predictor=PredictorSettings(kind="policy-states")))
        try:
            results = [trainer.step() for _ in range(3)]
        finally:
            trainer.collector.close()
        assert any(n.value is not None for r in results[1:] for t in r.trees for n in t.nodes), "nothing scored"
        return ([_trees_key(r.trees) for r in results], [segment_key(r.segments) for r in results],
                trainer.predictor._theta.tobytes())

    fast = run("one-thread")
    monkeypatch.setattr(embedding_mod, "one_blas_thread", contextlib.nullcontext)
    assert run("own-threads") == fast
