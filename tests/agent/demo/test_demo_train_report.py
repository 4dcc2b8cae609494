"""scripts/demo_train.py on a tiny real run: the report it prints, and ``--before-from`` (checked reuse of a
deterministic evaluation before training)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "scripts"))

import demo_train  # noqa: E402

from trace_agent.run_report import load_run_report  # noqa: E402

TINY = ["--steps", "1", "--eval-tasks", "3", "--eval-samples", "1", "--no-progress",
        "--set", "rollout.prompts_per_step=4", "--set", "rollout.roots=4", "--set", "sampling.max_new_tokens=24",
        "--set", "log.tensorboard=false"]


@pytest.mark.slow
def test_demo_report_and_reused_before(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    assert demo_train.main([*TINY, "--out", str(a)]) == 0
    out = capsys.readouterr().out
    report = load_run_report(a)
    assert report.change is not None and report.change.paired and report.change.tasks == 3
    assert "held-out success (3 tasks x 1 samples)" in out and "the evaluation's noise" in out
    assert "time from start:" in out and "predictor share of step wall-clock" in out

    assert demo_train.main([*TINY, "--seed", "1", "--out", str(b), "--before-from", str(a)]) == 0
    assert "reused from" in capsys.readouterr().out
    rb = load_run_report(b)
    before_a = json.loads((a / "summary.json").read_text())["before"]
    assert rb.change is not None and rb.change.paired and rb.change.before == pytest.approx(before_a["success"])
    assert [s for s, _ in rb.phases.evaluations] == [1]  # b spent no time evaluating before training
    assert [s for s, _, _ in rb.curve] == [0, 1]

    with pytest.raises(SystemExit, match="eval differ"):
        demo_train.main([*TINY, "--eval-samples", "2", "--out", str(tmp_path / "c"), "--before-from", str(a)])
