"""The predictor's warm-up before step 1 (``predictor.warm_start_tasks``) on the tiny policy and ParityEnv.

What it must do: draw its tasks by the rule, fit the predictor on root-only GRPO groups of them, leave the
policy, the pool and the run's generator alone, count its cost in the run's totals, run once (never again
on resume) and change nothing at all when it is off.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from tests.agent.test_trainer import state_equal, tiny_config
from trace_agent.budget import Budget
from trace_agent.config import LogConfig, PredictorSettings, RolloutSettings, TrainConfig
from trace_agent.config_io import config_to_dict, load_config
from trace_agent.errors import ConfigError
from trace_agent.predictor import tree_examples
from trace_agent.trainer import Trainer
from trace_agent.tree_io import save_jsonl
from trace_agent.tree_stats import tree_stats
from trace_agent.warm_start import warm_start_draw

QUIET = LogConfig(tensorboard=False, wandb=False, progress=False, samples_every=0, checkpoint_every=1)


def warm_config(out: Path, *, tasks: int = 6, roots: int = 2, **changes) -> TrainConfig:
    """TRACE choosing 2 of 8 candidates a step; the predictor warmed on ``tasks`` x ``roots`` (0: off)."""
    return tiny_config(out, **{"steps": 2, "log": QUIET, **changes},
                       rollout=RolloutSettings(strategy="trace", prompts_per_step=8,
                                               budget=Budget(roots=4, continuations_per_root=1, group_size=2)),
                       predictor=PredictorSettings(kind="hashed", warm_start_tasks=tasks, warm_start_roots=roots))


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_task_draw_is_the_plans_rule() -> None:
    ids = [f"train{i}" for i in range(300)]
    tasks, seed = warm_start_draw(ids, 45, 100)
    rng = np.random.default_rng(10_000 + 100)
    assert tasks == tuple(ids[int(i)] for i in rng.choice(300, 45, replace=False))
    assert seed == int(rng.integers(2**31))  # the collection seed comes after the draw, from the same generator
    assert len(set(tasks)) == 45 and warm_start_draw(ids, 45, 100) == (tasks, seed)
    assert warm_start_draw(ids, 45, 101)[0] != tasks
    with pytest.raises(ConfigError, match="train pool holds 300 tasks"):
        warm_start_draw(ids, 301, 100)


def test_config_keys_default_off_and_are_validated() -> None:
    assert (PredictorSettings().warm_start_tasks, PredictorSettings().warm_start_roots) == (0, 4)
    cfg = load_config(None, ["predictor.warm_start_tasks=45", "predictor.warm_start_roots=4"])
    assert config_to_dict(cfg)["predictor"]["warm_start_tasks"] == 45
    for bad in (["predictor.warm_start_tasks=-1"], ["predictor.warm_start_roots=1"], ["predictor.warm_start_tasks=1.5"],
                ["predictor.warm_start_tasks=many"]):
        with pytest.raises(ConfigError, match="predictor.warm_start"):
            load_config(None, bad)
    with pytest.raises(ConfigError, match="warm_start_tasks"):
        PredictorSettings(warm_start_tasks=True)  # type: ignore[arg-type]


def test_more_warm_up_tasks_than_the_pool_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="train pool holds 5 tasks"):
        Trainer(warm_config(tmp_path, tasks=6, train_tasks=5))


def test_warm_up_fits_the_predictor_on_root_groups_and_touches_nothing_else(tmp_path: Path) -> None:
    warm, cold = Trainer(warm_config(tmp_path / "w")), Trainer(warm_config(tmp_path / "c", tasks=0))
    try:
        weights = {k: v.clone() for k, v in warm.learner.model.state_dict().items()}
        done = warm.warm_start()
        assert done is not None and cold.warm_start() is None
        # the tasks: the plan's draw over the run's train pool (never a held-out id), 2 roots each, no continuations
        assert done.task_ids == warm_start_draw(warm.pool.prompt_ids, 6, warm.config.seed)[0]
        assert all(t.startswith("train") for t in done.task_ids)
        assert sorted(t.prompt_id for t in done.trees) == sorted(done.task_ids)
        assert all((s.root_rollouts, s.continuations) == (2, 0) for s in map(tree_stats, done.trees))
        m = done.metrics
        assert m["warm_start/tasks"] == 6 and m["warm_start/paper_units"] == 12 == m["budget/total_paper_units"]
        assert m["warm_start/generated_tokens"] == warm.totals["generated_tokens"] > 0
        assert "predictor/pre_mse_root" in m and m["warm_start/seconds"] >= m["warm_start/refresh_seconds"] >= 0
        # the predictor moved off the cold one on the warm-up tasks; the policy and the optimiser did not move
        contexts = tree_examples(done.trees).contexts
        assert not np.allclose(warm.predictor.predict(contexts), cold.predictor.predict(contexts))
        assert state_equal(weights, warm.learner.model.state_dict()) and not warm.optimizer.state_dict()["state"]
        # neither the pool nor the run's generator moved: step 1 gets a cold run's candidates and seeds
        assert warm.pool.state_dict() == cold.pool.state_dict()
        assert warm.rng.bit_generator.state == cold.rng.bit_generator.state
        assert warm.warm_start() is None  # once per run
        w1, c1 = warm.step(), cold.step()
        assert w1.metrics["budget/total_paper_units"] == 12 + w1.metrics["budget/paper_units"]
        assert c1.metrics["budget/total_paper_units"] == c1.metrics["budget/paper_units"]
        allocation = [[(t.prompt_id, tree_stats(t).root_rollouts) for t in r.trees] for r in (w1, c1)]
        assert allocation[0] != allocation[1]  # the warm predictor chose other prompts at step 1
    finally:
        warm.close()
        cold.close()


def test_a_strategy_that_does_not_read_the_predictor_gets_no_warm_up(tmp_path: Path, caplog) -> None:
    cfg = warm_config(tmp_path)
    trainer = Trainer(replace(cfg, rollout=replace(cfg.rollout, strategy="grpo")))
    try:
        with caplog.at_level(logging.WARNING, logger="trace_agent.trainer"):
            assert trainer.warm_start() is None
        assert "does not read the predictor" in caplog.text and trainer.totals == {}
    finally:
        trainer.close()


def test_off_by_default_run_training_is_the_cold_trainer(tmp_path: Path) -> None:
    """With warm_start_tasks = 0 the trees of ``run_training`` are byte for byte the bare trainer's steps."""
    from trace_agent.metrics import read_metrics
    from trace_agent.run import run_training

    cfg = warm_config(tmp_path / "run", tasks=0, roots=3)
    run_training(cfg, evaluate=False, log=lambda _m: None)
    bare = Trainer(warm_config(tmp_path / "bare", tasks=0, roots=3))
    try:
        for k in (1, 2):
            save_jsonl(bare.step().trees, tmp_path / f"bare_{k}.jsonl")
    finally:
        bare.close()
    for k in (1, 2):
        assert sha(tmp_path / "run" / "trees" / f"step_{k:06d}.jsonl") == sha(tmp_path / f"bare_{k}.jsonl")
    assert "warm_start" not in bare.checkpoint_state()  # a cold run's checkpoint is what it was
    records = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2] and not any(k.startswith("warm_start/") for r in records for k in r)


def test_resume_after_step_1_does_not_repeat_the_warm_up_and_is_bit_exact(tmp_path: Path) -> None:
    from trace_agent.metrics import read_metrics
    from trace_agent.run import run_training

    straight = run_training(warm_config(tmp_path / "a"), evaluate=False, log=lambda _m: None)
    first = warm_config(tmp_path / "b", steps=1)
    run_training(first, evaluate=False, log=lambda _m: None)
    resumed = run_training(replace(first, steps=2), resume=True, evaluate=False, log=lambda _m: None)
    a, b = tmp_path / "a", tmp_path / "b"
    for name in ("trees/step_000001.jsonl", "trees/step_000002.jsonl", "policy/model.safetensors"):
        assert sha(a / name) == sha(b / name), name
    for run in (a, b):  # one warm-up line, at step 0, in each
        assert [r["step"] for r in read_metrics(run / "metrics.jsonl") if "warm_start/tasks" in r] == [0]
    assert resumed.paper_units == straight.paper_units == 12 + 2 * 6
    assert resumed.generated_tokens == straight.generated_tokens
    # the checkpoint carries the warm-up: a trainer loaded from it does not warm up again
    trainer = Trainer(warm_config(b, steps=2))
    try:
        predictor_before = trainer.predictor.predict(["Task 1: write text of even length."])
        assert trainer.load_checkpoint(Trainer.latest_checkpoint(b)) == 2
        assert trainer.warm_started is not None and trainer.warm_started["warm_start/paper_units"] == 12
        assert trainer.warm_start() is None and trainer.totals["paper_units"] == 24
        assert not np.allclose(predictor_before, trainer.predictor.predict(["Task 1: write text of even length."]))
    finally:
        trainer.close()


@pytest.mark.hostile
@pytest.mark.parametrize("record", ["yes", ["warm_start/tasks", 6], {"warm_start/paper_units": True},
                                    {"warm_start/paper_units": "12"}, {"warm_start/paper_units": float("inf")}])
def test_a_forged_warm_up_record_in_a_checkpoint_is_refused(tmp_path: Path, record) -> None:
    from trace_agent.checkpoint import CheckpointError, write_checkpoint

    trainer = Trainer(warm_config(tmp_path / "run"))
    try:
        path = write_checkpoint(tmp_path / "run" / "checkpoints" / "step_000000",
                                {**trainer.checkpoint_state(), "warm_start": record})
        with pytest.raises(CheckpointError, match="warm-up"):
            trainer.load_checkpoint(path)
        assert trainer.warm_started is None and trainer.warm_start() is not None  # nothing was half-loaded
    finally:
        trainer.close()
