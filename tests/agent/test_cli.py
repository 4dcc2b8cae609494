"""`trace-gym train | eval | show-tree` as a user runs them: resume, refusals, Ctrl-C, one-line errors, pictures."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.agent.test_trainer import ROOT, state_equal, tiny_config
from trace_agent.cli import main
from trace_agent.config import EvalConfig, LogConfig, RolloutSettings, TrainConfig
from trace_agent.config_io import load_config, save_config
from trace_agent.metrics import read_metrics

#: The tiny Parity run (tests/agent/test_trainer.py) as a YAML config, 2 steps, small held-out eval.
_CHECKPOINTS = LogConfig(tensorboard=True, wandb=False, progress=False, keep_checkpoints=2)


def _config_file(tmp_path: Path, **changes) -> Path:
    cfg = tiny_config(tmp_path / "unused", **{"steps": 2, "eval": EvalConfig(tasks=2, samples=2), "log": _CHECKPOINTS,
                                              **changes})
    return save_config(cfg, tmp_path / "parity.yaml")


def _steps(run: Path) -> list[int]:
    return [r["step"] for r in read_metrics(run / "metrics.jsonl")]


def _comparable(run: Path) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith("time/") and k != "eval/seconds"}
            for r in read_metrics(run / "metrics.jsonl")]


def _weights(run: Path) -> dict[str, torch.Tensor]:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(run / "policy").state_dict()


@pytest.fixture(scope="module")
def straight_run(tmp_path_factory) -> tuple[Path, Path]:
    """An uninterrupted 2-step Parity run through the CLI (and its config file)."""
    tmp = tmp_path_factory.mktemp("cli")
    cfg = _config_file(tmp)
    assert main(["train", "--config", str(cfg), "--out", str(tmp / "a")]) == 0
    return tmp / "a", cfg


@pytest.mark.slow
def test_resume_dir_alone_equals_an_uninterrupted_run(straight_run, tmp_path: Path) -> None:
    """Kill after step 1's checkpoint (step 2's checkpoint gone), then `--resume DIR` alone: same run."""
    a, cfg = straight_run
    b = tmp_path / "b"
    assert main(["train", "--config", str(cfg), "--out", str(b)]) == 0
    import shutil

    shutil.rmtree(b / "checkpoints" / "step_000002")
    config_bytes = (b / "config.yaml").read_bytes()
    assert main(["train", "--resume", str(b)]) == 0
    assert (b / "config.yaml").read_bytes() == config_bytes  # the saved config, neither defaults nor rewritten
    assert _steps(b) == [0, 1, 2, 2]  # eval before, 2 steps, eval after: nothing logged twice
    assert _comparable(b) == _comparable(a)
    assert state_equal(_weights(a), _weights(b))
    # resuming a finished run re-logs nothing
    assert main(["train", "--resume", str(b)]) == 0
    assert _steps(b) == [0, 1, 2, 2]


def test_tensorboard_holds_scalars_transcripts_and_tree_images(straight_run) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    a, _ = straight_run
    acc = EventAccumulator(str(a / "tb"), size_guidance={"images": 0, "tensors": 0})
    acc.Reload()
    tags = acc.Tags()
    assert "rollout/effective_ratio" in tags["scalars"] and "eval/success_se" in tags["scalars"]
    assert "samples/tree" in tags["images"] and len(acc.Images("samples/tree")) == 2
    assert any(t.startswith("samples/transcript") for t in tags["tensors"])
    text = acc.Tensors(next(t for t in tags["tensors"] if t.startswith("samples/transcript")))[0]
    assert "best leaf" in text.tensor_proto.string_val[0].decode()


def test_learning_curves_carry_error_bars_on_held_out_points(straight_run) -> None:
    a, _ = straight_run
    evals = [r for r in read_metrics(a / "metrics.jsonl") if "eval/success" in r]
    assert len(evals) == 2 and all(r["eval/success_se"] >= 0 for r in evals)
    assert (a / "learning_curves.png").read_bytes()[:4] == b"\x89PNG"


def test_policy_records_its_env(straight_run) -> None:
    from trace_agent.preflight import policy_env_ids

    a, _ = straight_run
    assert policy_env_ids(a / "policy") == ("tests/Parity-v0",)


def test_conflicting_resume_and_fresh_run_over_a_run_are_refused(straight_run, capsys) -> None:
    a, cfg = straight_run
    before = (a / "metrics.jsonl").read_bytes()
    assert main(["train", "--resume", str(a), "--set", "optim.lr=0.5", "--seed", "9"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "refusing to resume" in err
    assert "optim.lr: 0.003 (saved) -> 0.5 (given)" in err and "seed: 3 (saved) -> 9 (given)" in err
    assert main(["train", "--config", str(cfg), "--out", str(a)]) == 1
    assert "already holds a run" in capsys.readouterr().err
    assert (a / "metrics.jsonl").read_bytes() == before  # nothing touched


def test_resume_may_extend_steps(straight_run, tmp_path: Path) -> None:
    from trace_agent.rundir import RunDirError, resume_config

    a, _ = straight_run
    longer = TrainConfig(**{**load_config(a / "config.yaml").__dict__, "steps": 10})
    assert resume_config(a, longer).steps == 10
    with pytest.raises(RunDirError, match="not a run directory"):
        resume_config(tmp_path / "nothing")


def test_custom_strategy_trains_one_step(tmp_path: Path) -> None:
    cfg = _config_file(tmp_path)
    out = tmp_path / "custom"
    assert main(["train", "--config", str(cfg), "--out", str(out), "--strategy",
                 "tests.agent.test_strategies:EntropyBranching", "--steps", "1", "--no-eval"]) == 0
    assert _steps(out) == [1]
    assert load_config(out / "config.yaml").rollout.strategy == "tests.agent.test_strategies:EntropyBranching"
    rec = read_metrics(out / "metrics.jsonl")[0]
    assert rec["rollout/continuations"] > 0  # it branched, as EntropyBranching does
    with pytest.raises(Exception, match="module:attribute"):
        RolloutSettings(strategy="no-such-strategy")


def test_show_tree_draws_pngs_from_a_run(straight_run, tmp_path: Path, capsys) -> None:
    a, _ = straight_run
    assert main(["show-tree", str(a), "--out", str(tmp_path / "pics"), "--max", "2"]) == 0
    printed = capsys.readouterr().out.split()
    assert len(printed) == 2
    for p in map(Path, printed):
        assert p.parent == tmp_path / "pics" and p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main(["show-tree", str(a), "--step", "99"]) == 1
    assert "saved steps: 1, 2" in capsys.readouterr().err


def test_errors_are_one_line_and_come_before_the_policy_loads(tmp_path: Path, capsys, monkeypatch) -> None:
    import trace_agent.wiring as wiring

    def no_policy(*_a, **_k):
        raise AssertionError("the policy was loaded before the error")

    monkeypatch.setattr(wiring, "build_policies", no_policy)
    t0 = time.perf_counter()
    assert main(["eval", "--env", "trace_envs/WikiQa-v0"]) == 1
    assert main(["eval", "--env", "trace_envs/WikiQA-v0", "--policy", "hf", "--policy-path",
                 str(tmp_path / "runs" / "x" / "policy")]) == 1
    assert main(["eval", "--env", "trace_envs/WikiQA-v0", "--split", "validation", "--policy", "tiny"]) == 1
    assert time.perf_counter() - t0 < 30
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 3 and all(line.startswith("trace-gym: error: ") for line in lines)
    assert "did you mean trace_envs/WikiQA-v0" in lines[0]
    assert "no such directory" in lines[1] and "repo" not in lines[1].lower()
    assert "no split 'validation'" in lines[2]
    from trace_agent.preflight import PreflightError

    with pytest.raises(PreflightError, match="unknown env id"):  # --debug: the exception itself
        main(["--debug", "eval", "--env", "trace_envs/Nope-v0"])


def test_preflight_warns_about_a_policy_trained_on_another_env(tmp_path: Path, capsys, monkeypatch) -> None:
    from trace_agent.demo.shipped import SHIPPED_DEMO_POLICY

    assert main(["train", "--env", "trace_envs/WikiQA-v0", "--policy", "demo", "--policy-path", str(SHIPPED_DEMO_POLICY),
                 "--out", str(tmp_path / "r"), "--preflight"]) == 0
    out = capsys.readouterr().out
    assert "warn" in out and "trained on trace_envs/PythonMath-v0, not trace_envs/WikiQA-v0" in out
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert main(["train", "--policy", "hf", "--policy-path", "no-such-org/no-such-model-xyz", "--preflight",
                 "--out", str(tmp_path / "r")]) == 1
    assert "offline" in capsys.readouterr().out
    assert main(["train", "--policy", "vllm", "--policy-path", str(tmp_path), "--preflight",
                 "--out", str(tmp_path / "r")]) == 1
    out = capsys.readouterr().out
    assert "config.json" in out and ("vLLM" in out or "CUDA" in out)


@pytest.mark.slow
def test_ctrl_c_leaves_a_resumable_run_and_prints_the_hint(tmp_path: Path) -> None:
    cfg = _config_file(tmp_path, steps=40)
    run = tmp_path / "killed"
    # A terminal's Ctrl-C: Python's own SIGINT handler, even when this suite runs as a background job (which
    # inherits SIGINT ignored and would pass that on to the child).
    script = ("import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
              "import tests.agent.test_trainer; from trace_agent.cli import main; "
              f"sys.exit(main(['train', '--config', {str(cfg)!r}, '--out', {str(run)!r}, '--no-eval']))")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 240
    while not (run / "checkpoints" / "step_000001" / "manifest.json").exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "no checkpoint within 240 s"
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    last = err.strip().splitlines()[-1]
    assert last.startswith("trace-gym: stopped after step ") and f"resume with: trace-gym train --resume {run}" in last
    done = int(last.split("stopped after step ")[1].split()[0].rstrip(";"))
    from trace_agent.trainer import Trainer

    ckpt = Trainer.latest_checkpoint(run)
    assert ckpt is not None and int(ckpt.name.split("_")[1]) in (done, done - 1)
    target = int(ckpt.name.split("_")[1]) + 1
    assert main(["train", "--resume", str(run), "--steps", str(target), "--no-eval"]) == 0
    assert _steps(run) == list(range(1, target + 1))


def test_wandb_offline_beside_tensorboard(tmp_path: Path, monkeypatch) -> None:
    pytest.importorskip("wandb")
    from trace_agent.metrics import MetricsLogger

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    logger = MetricsLogger(tmp_path, tensorboard=True, wandb="auto", config={"steps": 1})
    logger.log(1, {"x": 0.5, "bad": math.nan})
    logger.log_text("samples/transcript", "hello <b>", 1)
    logger.close()
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and any(runs[0].glob("*.wandb"))
    run_id = (tmp_path / "wandb_id.txt").read_text()
    assert run_id in runs[0].name
    assert json.loads((tmp_path / "metrics.jsonl").read_text())["bad"] is None
