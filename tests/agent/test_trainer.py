"""The policy update on a tiny model, the training step, and bit-exact resume after a kill."""

from __future__ import annotations

import copy
import json
import math
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

from trace_agent.budget import Budget
from trace_agent.config import (
    ObjectiveConfig,
    OptimConfig,
    PolicyConfig,
    PredictorSettings,
    RolloutSettings,
    SamplingSettings,
    TrainConfig,
)
from trace_agent.config_io import config_to_dict, load_config
from trace_agent.errors import ConfigError
from trace_agent.loss import loss_normalizer, pack_segments
from trace_agent.objectives import batch_segments
from trace_agent.pool import PromptPool
from trace_agent.trainer import Trainer
from trace_agent.update import batch_loss, segment_logprobs, update_policy
from trace_envs import BranchableEnv, Task, TaskSet, TurnResult

ROOT = Path(__file__).resolve().parents[2]
ENV_ID = "tests/Parity-v0"


class ParityEnv(BranchableEnv):
    """Two turns; the episode succeeds when the second turn's text has an even number of characters.

    A tiny untrained policy gets mixed outcomes on it, and the outcome depends on what it writes.
    """

    env_id = ENV_ID

    def __init__(self, *, tasks: str = "train", max_turns: int = 2, **kwargs):
        n = 12 if tasks == "train" else 4
        ts = TaskSet([Task(f"{tasks}{i}", f"Task {i}: write text of even length.", {}) for i in range(n)],
                     name=f"parity-{tasks}")
        super().__init__(tasks=ts, max_turns=max_turns, **kwargs)
        self.state = {"turns": 0}

    def _start_episode(self, task):
        self.state = {"turns": 0}
        return task.prompt

    def _run_turn(self, action):
        self.state["turns"] += 1
        if self.state["turns"] >= 2:
            ok = len(action) % 2 == 0
            return TurnResult("even" if ok else "odd", reward=float(ok), terminated=True, role="user")
        return TurnResult(f"noted {len(action)} chars", role="user")

    def _capture_state(self):
        return dict(self.state)

    def _restore_state(self, payload):
        self.state = dict(payload)


if ENV_ID not in gym.registry:
    gym.register(id=ENV_ID, entry_point=ParityEnv, order_enforce=False, disable_env_checker=True)


def tiny_config(out_dir: Path, **changes) -> TrainConfig:
    base = TrainConfig(
        env_id=ENV_ID, steps=4, seed=3, out_dir=str(out_dir),
        policy=PolicyConfig(kind="tiny"),
        sampling=SamplingSettings(max_new_tokens=6, temperature=1.0, max_turns=2),
        rollout=RolloutSettings(strategy="trace", prompts_per_step=4,
                                budget=Budget(roots=4, continuations_per_root=1, group_size=2)),
        objective=ObjectiveConfig(name="treerpo", kl_coef=0.05),
        optim=OptimConfig(lr=3e-3, minibatches=2, micro_batch=3),
        predictor=PredictorSettings(kind="hashed"),
    )
    return TrainConfig(**{**base.__dict__, **changes})


def state_equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def segment_key(segments) -> list[tuple]:
    return [(s.prompt_id, s.node_id, s.context_ids, s.generated_ids, s.behaviour_logprobs, s.advantage)
            for s in segments]


@pytest.fixture(scope="module")
def collected(tmp_path_factory):
    """One real collection with the tiny policy on ParityEnv (TRACE strategy, continuations)."""
    trainer = Trainer(tiny_config(tmp_path_factory.mktemp("collect")))
    batch = trainer.collector.collect(trainer.pool.take(4), step=1, seed=11)
    trainer.collector.close()
    return trainer, list(batch.trees)


def test_update_lowers_loss_and_raises_positive_segments(collected) -> None:
    trainer, trees = collected
    learner = trainer.learner
    segments = batch_segments(trees, "tree-grpo", skip_zero=True)
    assert any(s.advantage > 0 for s in segments) and any(s.advantage < 0 for s in segments)
    assert any(s.depth == 2 and s.leaves > 1 for s in segments) or True  # shapes vary with the draw
    objective = ObjectiveConfig(name="tree-grpo", clip_low=0.2, clip_high=0.2)
    packed = pack_segments(segments)
    before_state = copy.deepcopy(learner.model.state_dict())
    with torch.no_grad():
        loss_before = float(batch_loss(learner, packed, objective, temperature=1.0)[0])
    pos = [s for s in segments if s.advantage > 0]
    neg = [s for s in segments if s.advantage < 0]
    lp_pos, lp_neg = segment_logprobs(learner, pos), segment_logprobs(learner, neg)
    # behaviour log-probs are the model's own at sampling time: ratio 1 before the update
    assert np.allclose(lp_pos, [sum(s.behaviour_logprobs) for s in pos], atol=1e-3)
    opt = torch.optim.AdamW(learner.model.parameters(), lr=1e-3, weight_decay=0.0)
    stats = update_policy(learner, opt, segments, optim=OptimConfig(lr=1e-3, epochs=1, minibatches=1, micro_batch=4),
                          objective=objective, temperature=1.0, rng=np.random.default_rng(0))
    assert stats.optimizer_steps == 1 and stats.tokens == sum(s.num_tokens for s in segments)
    assert stats.ratio_mean == pytest.approx(1.0, abs=1e-3) and stats.loss == pytest.approx(loss_before, abs=1e-4)
    with torch.no_grad():
        loss_after = float(batch_loss(learner, packed, objective, temperature=1.0)[0])
    after_pos, after_neg = segment_logprobs(learner, pos), segment_logprobs(learner, neg)
    assert loss_after < loss_before
    assert np.mean(after_pos) > np.mean(lp_pos) and np.mean(after_neg) < np.mean(lp_neg)
    learner.model.load_state_dict(before_state)


def test_update_with_nothing_to_learn_is_a_no_op(collected) -> None:
    trainer, trees = collected
    state = copy.deepcopy(trainer.learner.model.state_dict())
    opt = torch.optim.AdamW(trainer.learner.model.parameters(), lr=1e-2)
    stats = update_policy(trainer.learner, opt, [], optim=OptimConfig(), objective=ObjectiveConfig(), temperature=1.0,
                          rng=np.random.default_rng(0))
    assert stats.optimizer_steps == 0 and math.isnan(stats.loss)
    assert state_equal(state, trainer.learner.model.state_dict())


def test_micro_batches_match_one_batch(collected) -> None:
    """Token-mean over the mini-batch: accumulating micro-batches gives the one-batch gradient."""
    trainer, trees = collected
    learner = trainer.learner
    packed = pack_segments(batch_segments(trees, "grpo", skip_zero=True))
    objective = ObjectiveConfig(name="grpo")
    total = sum(p.num_tokens for p in packed)
    learner.model.zero_grad()
    batch_loss(learner, packed, objective, temperature=1.0, num_tokens=total)[0].backward()
    whole = [p.grad.clone() for p in learner.model.parameters() if p.grad is not None]
    learner.model.zero_grad()
    for i in range(0, len(packed), 2):
        batch_loss(learner, packed[i:i + 2], objective, temperature=1.0, num_tokens=total)[0].backward()
    parts = [p.grad.clone() for p in learner.model.parameters() if p.grad is not None]
    learner.model.zero_grad()
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(whole, parts))


@pytest.mark.parametrize("mode", ["seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_micro_batches_match_one_batch_in_other_agg_modes(collected, mode: str) -> None:
    """Per-leaf samples (tree-grpo) and a non-token normalizer: micro-batches still give the one-batch gradient."""
    trainer, trees = collected
    learner = trainer.learner
    packed = pack_segments(batch_segments(trees, "tree-grpo"), loss_agg_mode=mode)  # type: ignore[arg-type]
    objective = ObjectiveConfig(name="tree-grpo", loss_agg_mode=mode, clip_ratio_c=3.0)  # type: ignore[arg-type]
    total = loss_normalizer(packed, mode, loss_scale_factor=64.0)  # type: ignore[arg-type]
    learner.model.zero_grad()
    batch_loss(learner, packed, objective, temperature=1.0, num_tokens=total)[0].backward()
    whole = [p.grad.clone() for p in learner.model.parameters() if p.grad is not None]
    learner.model.zero_grad()
    for i in range(0, len(packed), 3):
        batch_loss(learner, packed[i:i + 3], objective, temperature=1.0, num_tokens=total)[0].backward()
    parts = [p.grad.clone() for p in learner.model.parameters() if p.grad is not None]
    learner.model.zero_grad()
    assert whole and all(torch.allclose(a, b, atol=1e-5) for a, b in zip(whole, parts))
    opt = torch.optim.AdamW(learner.model.parameters(), lr=1e-4)
    state = copy.deepcopy(learner.model.state_dict())
    stats = update_policy(learner, opt, batch_segments(trees, "tree-grpo"), optim=OptimConfig(lr=1e-4, minibatches=2),
                          objective=objective, temperature=1.0, rng=np.random.default_rng(0))
    assert stats.optimizer_steps == 2 and math.isfinite(stats.loss) and 0.0 <= stats.zero_advantage_share <= 1.0
    assert stats.samples == pytest.approx(sum(len(t.leaves()) for t in trees))
    learner.model.load_state_dict(state)


def test_prompt_pool_epochs_and_state() -> None:
    pool = PromptPool([f"p{i}" for i in range(5)], seed=1)
    first = pool.take(3) + pool.take(2)
    assert sorted(first) == [f"p{i}" for i in range(5)]
    state = pool.state_dict()
    nxt = pool.take(4)
    other = PromptPool([f"p{i}" for i in range(5)], seed=1)
    other.load_state_dict(state)
    assert other.take(4) == nxt
    with pytest.raises(ValueError, match="prompt pool"):
        PromptPool(["x"], seed=1).load_state_dict(state)


def test_prompt_pool_batches_never_repeat_a_prompt_across_epoch_boundaries() -> None:
    ids = [f"p{i}" for i in range(7)]
    pool = PromptPool(ids, seed=3)
    served = []
    for _ in range(40):  # 3 does not divide 7: most epoch boundaries fall inside a batch
        batch = pool.take(3)
        assert len(set(batch)) == 3
        served += batch
    counts = [served.count(i) for i in ids]
    assert max(counts) - min(counts) <= 2  # skipping at a boundary keeps the pool nearly uniform
    assert sorted(PromptPool(ids, seed=3).take(7)) == ids
    with pytest.raises(ValueError, match="distinct prompts"):
        pool.take(8)
    with pytest.raises(ValueError, match="duplicate"):
        PromptPool(["a", "a"], seed=0)


def test_config_yaml_and_overrides(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("steps: 3\nrollout: {strategy: grpo, roots: 8, group_size: 4}\noptim: {betas: [0.8, 0.9]}\n")
    cfg = load_config(path, ["optim.lr=1e-4", "objective.name=tree-grpo", "rollout.prompts_per_step=5"])
    assert cfg.steps == 3 and cfg.rollout.strategy == "grpo" and cfg.rollout.budget.roots == 8
    assert cfg.optim.lr == 1e-4 and cfg.optim.betas == (0.8, 0.9) and cfg.objective.name == "tree-grpo"
    assert cfg.rollout.paper_budget == 8 * 1.5
    with pytest.raises(ConfigError, match="unknown"):
        load_config(None, ["optim.learning_rate=1"])
    with pytest.raises(ConfigError, match="strategy"):
        load_config(None, ["rollout.strategy=best"])


def _run_steps(trainer: Trainer, n: int) -> list[list[tuple]]:
    return [segment_key(trainer.step().segments) for _ in range(n)]


def test_step_metrics(tmp_path: Path) -> None:
    trainer = Trainer(tiny_config(tmp_path / "m", steps=1))
    try:
        result = trainer.step()
    finally:
        trainer.collector.close()
    m = result.metrics
    for key in ("rollout/success_rate", "rollout/effective_ratio", "rollout/prompts_skipped", "predictor/pre_mse",
                "budget/paper_units", "budget/generated_tokens", "time/generation_s", "time/predictor_share",
                "time/update_s", "update/loss"):
        assert key in m, key
    assert m["budget/paper_units"] == pytest.approx(4 * 1.5)
    assert 0 <= m["time/predictor_share"] <= 1
    # the step waited for at most the time inside the predictor's calls; the parts never exceed the step
    assert 0 <= m["time/predictor_scoring_s"] <= m["time/predictor_scoring_busy_s"] + 1e-9
    parts = m["time/generation_s"] + m["time/env_s"] + m["time/predictor_s"] + m["time/update_s"]
    assert parts <= m["time/step_s"] + 1e-6


@pytest.mark.parametrize("predictor", ["hashed", "policy-states"])
def test_resume_is_bit_exact(tmp_path: Path, predictor: str) -> None:
    """2 steps straight == 1 step + checkpoint + fresh objects + load + 1 step (batches and weights).

    With ``policy-states`` the resumed predictor must read the *starting* policy's copy, as the
    straight run's does, not the trained weights the checkpoint loads into the learner.
    (The slow test below runs 4 = 2 + 2 with the second half in a fresh process.)
    """
    settings = PredictorSettings(kind=predictor)
    straight = Trainer(tiny_config(tmp_path / "a", predictor=settings))
    try:
        batches_a = _run_steps(straight, 2)
    finally:
        straight.collector.close()
    assert all(batches_a), "a step without segments would prove nothing"

    first = Trainer(tiny_config(tmp_path / "b", predictor=settings))
    try:
        batches_b = _run_steps(first, 1)
        ckpt = first.save_checkpoint()
    finally:
        first.collector.close()
    del first
    torch.manual_seed(12345)  # disturb global RNGs: the checkpoint must restore them
    np.random.seed(999)
    resumed = Trainer(tiny_config(tmp_path / "b", predictor=settings))
    try:
        assert resumed.load_checkpoint(ckpt) == 1
        batches_b += _run_steps(resumed, 1)
    finally:
        resumed.collector.close()
    assert batches_b == batches_a
    assert state_equal(straight.learner.model.state_dict(), resumed.learner.model.state_dict())
    if predictor == "policy-states":  # the copy is the starting policy, which training has since moved from
        copy_state = resumed.predictor.featurizer.model.state_dict()
        assert state_equal(copy_state, straight.predictor.featurizer.model.state_dict())
        assert not state_equal(copy_state, resumed.learner.model.state_dict())
    assert state_equal(straight.optimizer.state_dict()["state"][0], resumed.optimizer.state_dict()["state"][0])


@pytest.mark.slow
def test_resume_in_a_fresh_process(tmp_path: Path) -> None:
    """The same, with the second half in a new Python process (nothing shared but the checkpoint)."""
    straight = Trainer(tiny_config(tmp_path / "a"))
    try:
        batches_a = _run_steps(straight, 4)
    finally:
        straight.collector.close()
    first = Trainer(tiny_config(tmp_path / "b"))
    try:
        _run_steps(first, 2)
        ckpt = first.save_checkpoint()
    finally:
        first.collector.close()
    script = f"""
import json, sys, torch
sys.path.insert(0, {str(ROOT)!r})
from tests.agent.test_trainer import Trainer, tiny_config, _run_steps
from pathlib import Path
t = Trainer(tiny_config(Path({str(tmp_path / 'b')!r})))
t.load_checkpoint({str(ckpt)!r})
batches = _run_steps(t, 2)
t.collector.close()
torch.save(t.learner.model.state_dict(), {str(tmp_path / 'w.pt')!r})
json.dump(batches, open({str(tmp_path / 'b.json')!r}, 'w'))
"""
    subprocess.run([sys.executable, "-c", script], check=True, cwd=ROOT, timeout=300)
    resumed_batches = json.loads((tmp_path / "b.json").read_text())
    assert resumed_batches == json.loads(json.dumps(batches_a[2:]))
    assert state_equal(straight.learner.model.state_dict(), torch.load(tmp_path / "w.pt"))


def test_run_training_end_to_end(tmp_path: Path) -> None:
    """run_training: eval before/after, metrics.jsonl, checkpoint, final policy, PNG curves, summary; then resume."""
    from trace_agent.config import EvalConfig, LogConfig
    from trace_agent.metrics import read_metrics
    from trace_agent.run import run_training

    cfg = tiny_config(tmp_path / "run", steps=1, eval=EvalConfig(tasks=2, samples=2),
                      log=LogConfig(tensorboard=True, wandb=False, progress=False))
    report = run_training(cfg, log=lambda _m: None)
    assert report.steps == 1 and report.before is not None and report.after is not None
    assert report.after.tasks == 2 and report.after.episodes == 4 and len(report.effective_ratio) == 1
    run = tmp_path / "run"
    for name in ("metrics.jsonl", "learning_curves.png", "summary.json", "config.yaml", "policy/config.json"):
        assert (run / name).exists(), name
    assert Trainer.latest_checkpoint(run) is not None and any((run / "tb").iterdir())
    assert [r["step"] for r in read_metrics(run / "metrics.jsonl")] == [0, 1, 1]
    more = TrainConfig(**{**cfg.__dict__, "steps": 2})
    report2 = run_training(more, resume=True, evaluate=False, log=lambda _m: None)
    assert report2.steps == 2
    assert [r["step"] for r in read_metrics(run / "metrics.jsonl")] == [0, 1, 1, 2]


def test_shipped_yaml_configs_load_and_demo_yaml_matches_make_demo() -> None:
    """docs/configs/*.yaml are valid, and demo.yaml is what `make demo` (scripts/demo_train.py) trains."""
    root = Path(__file__).resolve().parents[2]
    # verl_*.yaml are verl (Hydra) configs, checked against verl's own dataclasses in tests/integrations/
    for path in sorted(p for p in (root / "docs" / "configs").glob("*.yaml") if not p.name.startswith("verl_")):
        load_config(path)
    sys.path.insert(0, str(root / "scripts"))
    try:
        import demo_train
    finally:
        sys.path.remove(str(root / "scripts"))
    args = demo_train.build_parser().parse_args([])
    made = config_to_dict(demo_train.demo_config(args))
    yaml_config = config_to_dict(load_config(root / "docs" / "configs" / "demo.yaml"))
    for section in ("env_id", "steps", "seed", "sampling", "rollout", "objective", "optim", "predictor", "eval"):
        assert yaml_config[section] == made[section], section
    assert yaml_config["policy"]["max_batch_size"] == made["policy"]["max_batch_size"]


def test_eval_transcripts_hold_every_episode_with_its_reward(tmp_path: Path) -> None:
    """`trace-gym eval --transcripts`: one JSONL line per held-out episode, rewards agreeing with the result."""
    from trace_agent.config import EvalConfig
    from trace_agent.evaluation import evaluate_heldout
    from trace_agent.wiring import build_policies

    cfg = tiny_config(tmp_path / "run", eval=EvalConfig(tasks=3, samples=2))
    _, generator = build_policies(cfg.policy, seed=cfg.seed)
    seen: list[tuple] = []
    result = evaluate_heldout(generator, cfg, on_episode=lambda *episode: seen.append(episode))
    assert sorted((t, k) for t, k, _, _ in seen) == sorted((t, k) for t in result.per_task for k in range(2))
    assert sum(r > 0 for _, _, r, _ in seen) / len(seen) == result.success
    for _, _, _, messages in seen:
        assert messages[0]["role"] in ("system", "user") and any(m["role"] == "assistant" for m in messages)


@pytest.mark.parametrize(("strategy", "refresh", "refreshed"),
                         [("grpo", "auto", False), ("grpo", "always", True), ("trace", "auto", True)])
def test_predictor_is_refreshed_only_for_strategies_that_read_it(tmp_path: Path, strategy: str, refresh: str,
                                                                 refreshed: bool) -> None:
    cfg = tiny_config(tmp_path / "run", steps=1, rollout=RolloutSettings(strategy=strategy, prompts_per_step=4,
                                                                         budget=Budget(roots=4, group_size=2)),
                      predictor=PredictorSettings(kind="hashed", refresh=refresh))
    trainer = Trainer(cfg)
    probes = ["What is 2 + 2?", "Is 7 prime? Answer yes or no."]
    before = trainer.predictor.predict(probes)
    metrics = trainer.step().metrics
    trainer.collector.close()
    assert trainer.refreshes_predictor is refreshed
    assert any(k.startswith("predictor/") for k in metrics) is refreshed
    assert (not np.allclose(before, trainer.predictor.predict(probes))) is refreshed
    with pytest.raises(ConfigError, match="predictor.refresh"):
        PredictorSettings(refresh="sometimes")
