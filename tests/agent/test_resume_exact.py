"""The project's resume recipe is bit-exact with every predictor the CPU runs: finish a run, drop its newest
checkpoints, ``--resume``; metrics (predictor/* included), trees and weights equal the finished run's."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.agent.test_cli import _config_file, _steps, _weights
from tests.agent.test_trainer import state_equal
from trace_agent.cli import main
from trace_agent.config import LogConfig, PredictorSettings
from trace_agent.metrics import read_metrics


def _metrics(run: Path) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in read_metrics(run / "metrics.jsonl")]


def _trees(run: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((run / "trees").iterdir())}


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["policy-states", "hashed", "embedding"])
def test_resume_after_losing_the_last_checkpoints_is_bit_exact(tmp_path: Path, kind: str) -> None:
    """3 steps; the step-2 and step-3 checkpoints go; ``--resume`` re-runs steps 2 and 3 from step 1's checkpoint.

    ``policy-states`` is the demo configs' predictor: its features pass through a prefix cache of hidden
    states that is not in the checkpoint, so it must start every step empty (float rounding depends on it).
    """
    log = LogConfig(tensorboard=False, wandb=False, progress=False, keep_checkpoints=3, samples_every=0)
    cfg = _config_file(tmp_path, steps=3, log=log, predictor=PredictorSettings(kind=kind))
    run = tmp_path / "run"
    assert main(["train", "--config", str(cfg), "--out", str(run), "--no-eval"]) == 0
    metrics, trees, weights = _metrics(run), _trees(run), _weights(run)
    assert any(k.startswith("predictor/pre_") for k in metrics[-1]), "the predictor must be refreshed and scored"
    assert len(trees) == 3
    for step in (3, 2):
        shutil.rmtree(run / "checkpoints" / f"step_{step:06d}")
    assert main(["train", "--resume", str(run), "--no-eval"]) == 0
    assert _steps(run) == [1, 2, 3]
    assert _metrics(run) == metrics  # floats compared exactly
    assert _trees(run) == trees
    assert state_equal(_weights(run), weights)
