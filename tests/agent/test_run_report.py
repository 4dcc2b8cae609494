"""The run report: held-out statistics against hand-computed and brute-force references, phases, and the real output.

The statistics run on synthetic evaluation results (:meth:`EvalResult.of` over made-up rewards); the
output runs on a tiny real training run (the Parity env and tiny policy of ``test_trainer``) through
``run_training`` and through ``trace-gym train``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from trace_agent.evaluation import EvalResult
from trace_agent.run_report import (
    NOISE_SES,
    HeldoutChange,
    RunReport,
    format_run_report,
    heldout_change,
    load_run_report,
    run_phases,
)


def _result(rewards: dict[str, list[float]]) -> EvalResult:
    samples = len(next(iter(rewards.values())))
    return EvalResult.of(rewards, samples=samples, seconds=1.0)


def test_hand_computed_three_tasks() -> None:
    """Rates 0, .5, 1 -> .5, .5, 1: d = (.5, 0, 0), gain 1/6, sd sqrt(1/12), s.e. 1/6: one s.e., not beyond noise."""
    before = _result({"a": [0, 0], "b": [1, 0], "c": [1, 1]})
    after = _result({"a": [1, 0], "b": [0, 1], "c": [1, 1]})
    c = heldout_change(before, after)
    assert c.paired and c.tasks == 3
    assert c.before == pytest.approx(0.5) and c.after == pytest.approx(2 / 3)
    assert c.gain == pytest.approx(1 / 6) and c.gain_se == pytest.approx(1 / 6)
    assert c.z == pytest.approx(1.0) and not c.beyond_noise
    assert c.newly_solved == ("a",) and c.newly_lost == ()
    assert (c.solved_before, c.solved_after) == (2, 3)
    lo, hi = c.interval
    assert lo == pytest.approx(1 / 6 - 1.959964 / 6) and hi == pytest.approx(1 / 6 + 1.959964 / 6)
    assert "NOT beyond" in c.verdict()


def test_brute_force_against_episodes() -> None:
    """Random evaluations: gain = difference of episode means; s.e. = numpy's sd(ddof=1) of per-task differences / sqrt(T);
    newly solved / lost = per-task set differences, computed from the raw rewards."""
    rng = np.random.default_rng(0)
    for trial in range(20):
        tasks, samples = int(rng.integers(2, 30)), int(rng.integers(1, 6))
        ids = [f"t{i:02d}" for i in range(tasks)]
        p = rng.random(tasks)
        rb = {t: [float(rng.random() < p[i]) for _ in range(samples)] for i, t in enumerate(ids)}
        ra = {t: [float(rng.random() < min(1.0, p[i] + 0.2)) for _ in range(samples)] for i, t in enumerate(ids)}
        c = heldout_change(_result(rb), _result(ra))
        eb = np.array([rb[t] for t in ids])
        ea = np.array([ra[t] for t in ids])
        assert c.gain == pytest.approx(ea.mean() - eb.mean(), abs=1e-12), trial
        d = ea.mean(axis=1) - eb.mean(axis=1)
        assert c.gain_se == pytest.approx(d.std(ddof=1) / math.sqrt(tasks), abs=1e-12), trial
        assert c.before_se == pytest.approx(eb.mean(axis=1).std(ddof=1) / math.sqrt(tasks), abs=1e-12)
        assert set(c.newly_solved) == {t for t in ids if max(rb[t]) == 0 and max(ra[t]) > 0}
        assert set(c.newly_lost) == {t for t in ids if max(rb[t]) > 0 and max(ra[t]) == 0}
        assert c.beyond_noise == (c.gain >= NOISE_SES * c.gain_se > 0)


def test_standard_error_matches_the_spread_of_repeated_evaluations() -> None:
    """Monte Carlo: draw tasks from a population (difficulty ~ Beta) and 4 episodes a task, before and after, many
    times; the mean paired s.e. is the gain's real spread over draws (within 10%). An episode-level binomial s.e.
    of the difference (ignoring that the episodes of a task and the two evaluations are tied) is not."""
    rng = np.random.default_rng(1)
    tasks, samples, reps = 60, 4, 1500
    gains, ses, naive = [], [], []
    for _ in range(reps):
        p = rng.beta(0.4, 0.6, tasks)
        q = np.clip(p + 0.1 * (p > 0.2), 0, 1)
        b = rng.random((tasks, samples)) < p[:, None]
        a = rng.random((tasks, samples)) < q[:, None]
        ids = [str(i) for i in range(tasks)]
        c = heldout_change(_result({t: b[i].astype(float).tolist() for i, t in enumerate(ids)}),
                           _result({t: a[i].astype(float).tolist() for i, t in enumerate(ids)}))
        gains.append(c.gain)
        ses.append(c.gain_se)
        n = tasks * samples
        naive.append(math.sqrt(b.mean() * (1 - b.mean()) / n + a.mean() * (1 - a.mean()) / n))
    spread = float(np.std(gains, ddof=1))
    assert float(np.mean(ses)) == pytest.approx(spread, rel=0.10)
    assert abs(float(np.mean(naive)) / spread - 1) > 0.25  # the naive one is far off: the test can tell them apart


def test_unpaired_when_per_task_rates_are_missing() -> None:
    before = EvalResult(success=0.3, success_se=0.03, tasks=100, samples=4, episodes=400, solved_tasks=40,
                        seconds=1.0, per_task={})
    after = _result({f"t{i}": [1.0, 0.0] for i in range(4)})
    c = heldout_change(before, after)
    assert not c.paired and c.newly_solved == () and c.newly_lost == ()
    assert c.gain == pytest.approx(0.2) and c.gain_se == pytest.approx(math.hypot(0.03, after.success_se))
    assert "unpaired" in c.verdict()


def test_different_tasks_are_refused() -> None:
    with pytest.raises(ValueError, match="different tasks"):
        heldout_change(_result({"a": [1.0], "b": [0.0]}), _result({"a": [1.0], "c": [0.0]}))


@pytest.mark.parametrize(("gain", "se", "beyond"), [(0.06, 0.03, True), (0.0599, 0.03, False), (-0.2, 0.01, False),
                                                     (0.1, 0.0, False)])
def test_noise_threshold(gain: float, se: float, beyond: bool) -> None:
    c = HeldoutChange(tasks=10, before=0.3, after=0.3 + gain, before_se=0.03, after_se=0.03, gain=gain, gain_se=se,
                      paired=True, solved_before=1, solved_after=1)
    assert c.beyond_noise is beyond
    assert ("is beyond" in c.verdict()) is beyond


def test_phases_from_records() -> None:
    records = [{"step": 0, "eval/success": 0.2, "eval/seconds": 10.0},
               {"step": 1, "time/step_s": 5.0, "time/generation_s": 3.0, "time/env_s": 1.0, "time/predictor_s": 0.5,
                "time/update_s": 0.5},
               {"step": 2, "time/step_s": 3.0, "time/generation_s": 2.0, "time/env_s": 0.5, "time/predictor_s": None,
                "time/update_s": 0.5, "eval/success": 0.3, "eval/seconds": 8.0},
               {"step": 2, "eval/success": 0.4, "eval/seconds": 7.0}]
    p = run_phases(records, total_s=40.0, setup_s=4.0)
    assert p.evaluations == ((0, 10.0), (2, 8.0), (2, 7.0)) and p.evaluations_s == 25.0
    assert p.steps_s == 8.0 and p.first_step_s == 5.0
    assert p.step_parts == {"generation": 5.0, "env": 1.5, "predictor": 0.5, "update": 1.0}
    assert p.predictor_share == pytest.approx(0.5 / 8.0)
    assert math.isnan(p.predictor_busy_share)  # records without the busy time: unknown, not zero
    busy = [{**r, "time/predictor_scoring_busy_s": 0.9, "time/predictor_refresh_s": 0.1} if "time/step_s" in r else r
            for r in records]
    assert run_phases(busy, total_s=40.0, setup_s=4.0).predictor_busy_share == pytest.approx(2.0 / 8.0)
    assert p.other_s == pytest.approx(40.0 - 4.0 - 8.0 - 25.0)
    assert run_phases(records, total_s=1.0, setup_s=4.0).other_s == 0.0  # never negative


# ------------------------------------------------------------------ a tiny real run


@pytest.mark.slow
def test_report_of_a_real_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``trace-gym train`` on the tiny Parity run writes run_report.json and prints the report from it."""
    from tests.agent.test_cli import _config_file
    from trace_agent.cli import main
    from trace_agent.config import EvalConfig
    from trace_agent.metrics import read_metrics

    cfg = _config_file(tmp_path, eval=EvalConfig(tasks=4, samples=2, every=1))
    run = tmp_path / "run"
    assert main(["train", "--config", str(cfg), "--out", str(run)]) == 0
    out = capsys.readouterr().out
    report = load_run_report(run)
    summary = json.loads((run / "summary.json").read_text())
    c = report.change
    assert c is not None and c.paired and c.tasks == 4
    assert c.before == pytest.approx(summary["before"]["success"]) and c.after == pytest.approx(summary["after"]["success"])
    assert report.steps == 2 and [s for s, _, _ in report.curve] == [0, 1, 2]  # before, every step, after (2 is final)
    records = read_metrics(run / "metrics.jsonl")
    assert report.phases.steps_s == pytest.approx(sum(r["time/step_s"] for r in records if "time/step_s" in r))
    assert len(report.phases.evaluations) == 3 and report.phases.setup_s > 0
    p = report.phases
    assert p.setup_s + p.evaluations_s + p.steps_s + p.other_s == pytest.approx(p.total_s, rel=1e-6)
    assert Path(report.plot).stat().st_size > 1000
    assert RunReport.from_dict(json.loads(report.to_json())) == report
    lines = format_run_report(report)
    for line in lines:
        assert line in out
    assert sum("the evaluation's noise" in line for line in lines) == 1
    assert any(line.startswith("time: ") and "set-up" in line for line in lines)


def test_missing_report_says_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="--resume"):
        load_run_report(tmp_path)
