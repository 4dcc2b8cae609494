"""WikiQA-v0 and BFCL-v0 train and evaluate with the default splits (the old failures: a split sent to the hub,
`'str' object has no attribute 'ids'`), each for one step with the tiny policy."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from trace_agent.cli import main
from trace_agent.env_factory import task_ids
from trace_agent.tree_io import load_jsonl

_SMALL = ["--policy", "tiny", "--steps", "1", "--tasks", "1", "--samples", "1", "--no-progress",
          "--set", "rollout.prompts_per_step=2", "--set", "rollout.roots=4", "--set", "rollout.group_size=2",
          "--set", "sampling.max_new_tokens=6", "--set", "sampling.max_turns=2", "--set", "predictor.kind=hashed",
          "--set", "log.tensorboard=false", "--set", "log.wandb=false"]


def _train_then_eval(env_id: str, tmp_path: Path, capsys) -> None:
    run = tmp_path / "run"
    assert main(["train", "--env", env_id, "--out", str(run), *_SMALL]) == 0
    train_ids, test_ids = set(task_ids(env_id, "train")), set(task_ids(env_id, "test"))
    assert train_ids and test_ids and train_ids.isdisjoint(test_ids)
    trees = load_jsonl(run / "trees" / "step_000001.jsonl")
    assert trees and {t.task_id for t in trees} <= train_ids  # prompts come from the train split
    capsys.readouterr()
    assert main(["eval", "--env", env_id, "--policy", "hf", "--policy-path", str(run / "policy"), "--tasks", "1",
                 "--samples", "1", "--per-task", "--no-progress", "--set", "sampling.max_new_tokens=6",
                 "--set", "sampling.max_turns=2"]) == 0
    captured = capsys.readouterr()
    result = json.loads(captured.out)
    assert result["episodes"] == 1 and set(result["per_task"]) <= test_ids  # held out: the test split
    assert "warning" not in captured.err  # the policy was trained on this env


def test_wikiqa_trains_and_evaluates_with_default_splits(tmp_path: Path, capsys) -> None:
    _train_then_eval("trace_envs/WikiQA-v0", tmp_path, capsys)


@pytest.mark.skipif(importlib.util.find_spec("bfcl_eval") is None, reason="bfcl-eval not installed")
def test_bfcl_trains_and_evaluates_with_default_splits(tmp_path: Path, capsys) -> None:
    _train_then_eval("trace_envs/BFCL-v0", tmp_path, capsys)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["wiki", "bfcl"])
def test_shipped_env_configs_train_a_step(name: str, tmp_path: Path) -> None:
    """docs/configs/{wiki,bfcl}.yaml train a step (offline: the tiny policy instead of the Qwen3 checkpoint)."""
    if name == "bfcl" and importlib.util.find_spec("bfcl_eval") is None:
        pytest.skip("bfcl-eval not installed")
    config = Path(__file__).resolve().parents[2] / "docs" / "configs" / f"{name}.yaml"
    run = tmp_path / name
    assert main(["train", "--config", str(config), "--out", str(run), "--no-eval", *_SMALL]) == 0
    assert (run / "checkpoints" / "step_000001" / "manifest.json").is_file()
    assert (run / "config.yaml").read_text().count("train_split: train") == 1
