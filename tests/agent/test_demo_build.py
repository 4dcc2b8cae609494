"""The demo-policy build loop checkpoints and resumes: stopped mid-way and restarted, it ends with the same weights;
every shipped demo policy was built with its env's preset."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest
import torch

from trace_agent.policy import demo
from trace_agent.policy.demo import (
    SHIPPED_DEMO_POLICIES,
    DemoModelConfig,
    DemoTrainConfig,
    demo_train_config,
    make_demo_model,
    tiny_policy,
)

_MODEL = DemoModelConfig(vocab_size=400, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, head_dim=16,
                         intermediate_size=64)


def _data(tokenizer) -> list[tuple[list[int], list[bool]]]:
    rng = np.random.default_rng(0)
    prefix = rng.integers(5, 300, 12).tolist()
    out = []
    for _ in range(6):
        n = int(rng.integers(6, 14))
        out.append((prefix + rng.integers(5, 300, n).tolist(), [False] * len(prefix) + [True] * n))
    return out


class _Stop(Exception):
    pass


def _train(tmp: Path | None, steps: int, monkeypatch=None, stop_after: int | None = None):
    tokenizer = tiny_policy().tokenizer
    model = make_demo_model(tokenizer, _MODEL, seed=0)
    cfg = DemoTrainConfig(steps=steps, batch_size=3, warmup_steps=2, model=_MODEL)
    if stop_after is not None:
        calls = {"n": 0}
        real = torch.nn.utils.clip_grad_norm_

        def clip(*a, **k):
            calls["n"] += 1
            if calls["n"] > stop_after:
                raise _Stop
            return real(*a, **k)

        monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", clip)
    logs: list[str] = []
    losses = demo._train(model, _data(tokenizer), cfg, pad_id=0, log=logs.append, checkpoint_dir=tmp,
                         checkpoint_every=2)
    return model, losses, logs


def test_a_stopped_build_resumes_to_the_same_weights(tmp_path: Path, monkeypatch) -> None:
    straight, losses, _ = _train(None, 7)
    with pytest.raises(_Stop):
        _train(tmp_path / "ckpt", 7, monkeypatch, stop_after=5)  # checkpoints after steps 2 and 4
    monkeypatch.undo()
    assert (tmp_path / "ckpt" / "manifest.json").exists()
    resumed, resumed_losses, logs = _train(tmp_path / "ckpt", 7)
    assert any("resuming the demo-policy build at step 4/7" in m for m in logs)
    assert resumed_losses == losses
    assert all(torch.equal(a, b) for a, b in zip(straight.state_dict().values(), resumed.state_dict().values()))


def test_a_checkpoint_of_other_settings_is_not_resumed(tmp_path: Path, monkeypatch) -> None:
    with pytest.raises(_Stop):
        _train(tmp_path / "ckpt", 7, monkeypatch, stop_after=3)
    monkeypatch.undo()
    _, losses, logs = _train(tmp_path / "ckpt", 5)  # other settings: starts over
    assert any("starting over" in m for m in logs) and len(losses) == 5


def test_first_turn_cuts_after_the_first_assistant_turn() -> None:
    ids = list(range(12))
    mask = [False] * 3 + [True] * 3 + [False] * 2 + [True] * 4  # prompt, turn 1, observation, turn 2
    assert demo.first_turn(ids, mask) == (ids[:6], mask[:6])
    assert demo.first_turn(ids[:6], mask[:6]) == (ids[:6], mask[:6])  # a one-turn episode is its first turn
    for seq, m in _data(tiny_policy().tokenizer):
        cut, cut_mask = demo.first_turn(seq, m)
        assert cut == seq[:len(cut)] and cut_mask[-1] and sum(cut_mask) == len(cut_mask) - cut_mask.index(True)


def _json(value):
    return json.loads(json.dumps(value))


@pytest.mark.parametrize("env_id", sorted(SHIPPED_DEMO_POLICIES))
def test_every_shipped_policy_was_built_with_its_env_preset(env_id: str) -> None:
    """``scripts/build_demo_policy.py --env ENV`` rebuilds what is shipped: the settings a shipped build recorded in
    its ``build_report.json`` are the env's preset (``demo_train_config``), field for field. A field the report
    lacks was added to ``DemoTrainConfig`` after that build, and the preset must hold its default there (the
    behaviour the build had)."""
    report = SHIPPED_DEMO_POLICIES[env_id] / "build_report.json"
    if not report.is_file():
        pytest.skip(f"{env_id}: no shipped demo policy")
    recorded = json.loads(report.read_text())["config"]
    preset = _json(asdict(demo_train_config(env_id, seed=recorded["seed"])))
    defaults = _json(asdict(DemoTrainConfig()))
    assert {k: preset.get(k) for k in recorded} == recorded
    assert {k: preset[k] for k in preset.keys() - recorded.keys()} == \
        {k: defaults[k] for k in preset.keys() - recorded.keys()}
