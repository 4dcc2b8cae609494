"""End to end on a GPU: two real ``verl.trainer.main_ppo`` steps (v1 trainer, vLLM servers, FSDP actor) of the
shipped demo policy with TRACE trees on PythonMath-v0 and the recipe config. Skips without verl, vLLM or a GPU.

What it shows that the CPU tests cannot: the worker inside verl's real rollout stack (vLLM async servers
behind verl's load balancer), the actor update on ``trace_treerpo`` advantages, weight sync, and the
predictor checkpoint written by verl's checkpoint hook.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.verl, pytest.mark.slow]
pytest.importorskip("verl")
pytest.importorskip("vllm")
torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_two_trace_steps_with_verl_main_ppo(tmp_path):
    from trace_agent.demo.shipped import SHIPPED_DEMO_POLICY
    from trace_agent.integrations.verl_data import dataset_rows, write_parquet

    env = "trace_envs/PythonMath-v0"
    train = write_parquet(dataset_rows(env, split="train", limit=64), tmp_path / "train.parquet")
    val = write_parquet(dataset_rows(env, split="test", limit=16), tmp_path / "val.parquet")
    ckpt = tmp_path / "ckpt"
    cmd = [
        sys.executable, "-m", "verl.trainer.main_ppo", "--config-path", str(ROOT / "docs" / "configs"),
        "--config-name", "verl_qwen3_trace",
        f"data.train_files={train}", f"data.val_files={val}", "data.train_batch_size=8",
        "data.max_prompt_length=1024", "data.max_response_length=1024",
        f"actor_rollout_ref.model.path={SHIPPED_DEMO_POLICY}", "actor_rollout_ref.actor.strategy=fsdp",
        "actor_rollout_ref.rollout.n=4", "actor_rollout_ref.rollout.agent.num_workers=2",
        "actor_rollout_ref.rollout.gpu_memory_utilization=0.3", "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "actor_rollout_ref.actor.ppo_mini_batch_size=8", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8",
        "trace.sampling.max_turns=3", "trace.sampling.max_new_tokens=128", "trace.env_threads=4",
        "trace.predictor.kind=hashed",
        "trainer.nnodes=1", "trainer.n_gpus_per_node=1", "trainer.total_training_steps=2", "trainer.save_freq=2",
        "trainer.val_before_train=false", "trainer.test_freq=-1", "trainer.logger=[console]",
        f"trainer.default_local_dir={ckpt}",
    ]
    env_vars = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
                "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(cmd, cwd=tmp_path, env=env_vars, capture_output=True, text=True, timeout=3600)
    log = proc.stdout + proc.stderr
    (tmp_path / "main_ppo.log").write_text(log)
    assert proc.returncode == 0, log[-6000:]
    meta = ckpt / "global_step_2" / "trace_predictor" / "meta.json"
    assert meta.exists(), log[-3000:]
    assert json.loads(meta.read_text())["refreshes"] >= 1  # step 2's roots were scored after step 1's refresh
    assert "actor/pg_loss" in log and "critic/score/mean" in log
