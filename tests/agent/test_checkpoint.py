"""Checkpoints are data: safetensors + JSON + a verified manifest; tampering, truncation, fallback; no pickle."""

from __future__ import annotations

import json
import pickle
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.agent.test_trainer import _run_steps, state_equal, tiny_config
from trace_agent.checkpoint import (
    CheckpointError,
    capture_rng_state,
    load_predictor_state,
    predictor_state,
    read_checkpoint,
    restore_rng_state,
    verify_checkpoint,
    write_checkpoint,
)
from trace_agent.trainer import Trainer


def test_round_trip_of_every_kind_of_value(tmp_path: Path) -> None:
    w = torch.randn(3, 4)
    state = {"step": 7, "f": 0.1 + 0.2, "inf": float("inf"), "none": None, "flag": True, "text": "ünï",
             "tuple": (1, (2.5, "x")), "int_keys": {0: {"step": torch.tensor(3.0)}, 1: "b"},
             "dollar": {"$tensor": "not a tag"}, "bytes": b"\x00\xff", "big": 2**100 + 1,
             "weights": {"w": w, "tied": w}, "array": np.arange(6, dtype=np.uint32).reshape(2, 3),
             "f64": np.array([np.pi, -0.0]), "empty": np.zeros((0, 5)), "np_scalar": np.float64(1.5)}
    back = read_checkpoint(write_checkpoint(tmp_path / "c", state))
    assert back["step"] == 7 and back["f"] == 0.1 + 0.2 and back["inf"] == float("inf") and back["none"] is None
    assert back["tuple"] == (1, (2.5, "x")) and back["int_keys"][1] == "b"
    assert torch.equal(back["int_keys"][0]["step"], torch.tensor(3.0))
    assert back["dollar"] == {"$tensor": "not a tag"} and back["bytes"] == b"\x00\xff" and back["big"] == 2**100 + 1
    assert torch.equal(back["weights"]["w"], w) and torch.equal(back["weights"]["tied"], w)
    assert back["array"].dtype == np.uint32 and back["array"].tolist() == [[0, 1, 2], [3, 4, 5]]
    assert back["f64"].tobytes() == np.array([np.pi, -0.0]).tobytes() and back["empty"].shape == (0, 5)
    assert back["np_scalar"] == 1.5
    with pytest.raises(CheckpointError, match="cannot store"):
        write_checkpoint(tmp_path / "d", {"fn": print})


def test_rng_states_round_trip_as_data(tmp_path: Path) -> None:
    gen = np.random.default_rng(5)
    random.seed(1), np.random.seed(2), torch.manual_seed(3)
    gen.random(3), np.random.normal(), random.gauss(0, 1)  # leave a cached gaussian behind
    state = read_checkpoint(write_checkpoint(tmp_path / "r", {"rng": capture_rng_state(gen)}))["rng"]
    expected = (random.random(), np.random.normal(), float(torch.rand(1)), gen.random())
    random.seed(9), np.random.seed(9), torch.manual_seed(9)
    other = np.random.default_rng(0)
    restore_rng_state(state, other)
    assert (random.random(), np.random.normal(), float(torch.rand(1)), other.random()) == expected
    with pytest.raises(CheckpointError, match="RNG"):
        restore_rng_state({"python": "garbage"})


def test_embedding_predictor_state_round_trips(tmp_path: Path) -> None:
    from trace_agent.predictor import EmbeddingPredictor, HashedNGramFeaturizer

    a = EmbeddingPredictor(HashedNGramFeaturizer())
    a.update(["one plus one", "two primes", "a long question"], [1.0, 0.0, 0.5])
    saved = read_checkpoint(write_checkpoint(tmp_path / "p", {"predictor": predictor_state(a)}))["predictor"]
    b = EmbeddingPredictor(HashedNGramFeaturizer())
    load_predictor_state(b, saved)
    probes = ["one plus two", "three primes"]
    assert a.predict(probes).tobytes() == b.predict(probes).tobytes()
    assert list(a.featurizer.cache._data) == list(b.featurizer.cache._data)


@pytest.fixture(scope="module")
def two_checkpoints(tmp_path_factory) -> tuple[Path, list, dict]:
    """A 2-step run with checkpoints after step 1 and 2, plus what step 2 did."""
    out = tmp_path_factory.mktemp("ckpt") / "run"
    trainer = Trainer(tiny_config(out))
    try:
        first = _run_steps(trainer, 1)
        trainer.save_checkpoint()
        second = _run_steps(trainer, 1)
        trainer.save_checkpoint()
    finally:
        trainer.collector.close()
    return out, first + second, {k: v.clone() for k, v in trainer.learner.model.state_dict().items()}


def _copy_run(src: Path, dst: Path) -> Path:
    import shutil

    shutil.copytree(src, dst)
    return dst


def test_checkpoint_files_are_data_only(two_checkpoints) -> None:
    out, _, _ = two_checkpoints
    ckpt = Trainer.latest_checkpoint(out)
    assert ckpt is not None and ckpt.name == "step_000002"
    assert sorted(p.name for p in ckpt.iterdir()) == ["manifest.json", "state.json", "tensors.safetensors"]
    manifest = verify_checkpoint(ckpt)
    assert manifest["step"] == 2 and set(manifest["files"]) == {"state.json", "tensors.safetensors"}
    json.loads((ckpt / "state.json").read_text())  # plain JSON


@pytest.mark.parametrize("damage", ["edit-json", "flip-tensor-byte", "truncate", "drop-manifest", "extra-tag"])
def test_damaged_checkpoint_is_refused_with_a_clear_error(two_checkpoints, tmp_path: Path, damage: str) -> None:
    out, _, _ = two_checkpoints
    ckpt = _copy_run(out, tmp_path / "run") / "checkpoints" / "step_000002"
    if damage == "edit-json":
        text = (ckpt / "state.json").read_text()
        (ckpt / "state.json").write_text(text.replace('"step": 2', '"step": 9', 1))
        match = "sha256"
    elif damage == "flip-tensor-byte":
        data = bytearray((ckpt / "tensors.safetensors").read_bytes())
        data[-5] ^= 0xFF
        (ckpt / "tensors.safetensors").write_bytes(bytes(data))
        match = "sha256"
    elif damage == "truncate":
        data = (ckpt / "tensors.safetensors").read_bytes()
        (ckpt / "tensors.safetensors").write_bytes(data[: len(data) // 2])
        match = "truncated"
    elif damage == "drop-manifest":
        (ckpt / "manifest.json").unlink()
        match = "no manifest.json"
    else:  # a consistent manifest over a state.json with a tag the decoder does not know
        state = json.loads((ckpt / "state.json").read_text())
        state["pool"] = {"$pickle": "gASVAAAAAAAAAACMCGJ1aWx0aW5zlIwEZXZhbJSTlC4="}
        (ckpt / "state.json").write_text(json.dumps(state))
        import hashlib

        manifest = json.loads((ckpt / "manifest.json").read_text())
        blob = (ckpt / "state.json").read_bytes()
        manifest["files"]["state.json"] = {"bytes": len(blob), "sha256": hashlib.sha256(blob).hexdigest()}
        (ckpt / "manifest.json").write_text(json.dumps(manifest))
        match = "unknown tag"
    trainer = Trainer(tiny_config(tmp_path / "run"))
    try:
        with pytest.raises(CheckpointError, match=match):
            trainer.load_checkpoint(ckpt)
        assert trainer.step_count == 0  # nothing was half-loaded into the step counter
        if damage != "extra-tag":  # the hashes catch damage; a well-hashed forgery fails only when decoded
            assert Trainer.latest_checkpoint(tmp_path / "run").name == "step_000001"
    finally:
        trainer.collector.close()


def test_resume_falls_back_to_the_newest_valid_checkpoint_and_stays_bit_exact(two_checkpoints, tmp_path: Path,
                                                                              monkeypatch) -> None:
    """step_2 truncated: resume loads step_1, re-runs step 2 and ends with the weights of the straight run.

    pickle.load and torch.load are booby-trapped: nothing on the load path may call them.
    """
    from trace_agent.config import EvalConfig, LogConfig
    from trace_agent.run import run_training

    out, _, weights = two_checkpoints
    run = _copy_run(out, tmp_path / "run")
    (run / "config.yaml").write_text("")  # not read: run_training gets its config
    bad = run / "checkpoints" / "step_000002" / "tensors.safetensors"
    bad.write_bytes(bad.read_bytes()[:100])

    def trap(*_a, **_k):
        raise AssertionError("a checkpoint was unpickled")

    monkeypatch.setattr(pickle, "load", trap)
    monkeypatch.setattr(pickle, "loads", trap)
    monkeypatch.setattr(torch, "load", trap)
    logs: list[str] = []
    cfg = tiny_config(run, steps=2, eval=EvalConfig(tasks=1, samples=1),
                      log=LogConfig(tensorboard=False, wandb=False, progress=False, samples_every=0))
    report = run_training(cfg, resume=True, evaluate=False, log=logs.append)
    assert report.steps == 2
    assert any("refused checkpoint" in m and "step_000002" in m for m in logs)
    assert any("resumed from" in m and "step_000001" in m for m in logs)
    from transformers import AutoModelForCausalLM

    monkeypatch.undo()
    resumed = AutoModelForCausalLM.from_pretrained(run / "policy").state_dict()
    assert state_equal({k: weights[k] for k in resumed}, resumed)


def test_no_valid_checkpoint_is_an_error_not_a_silent_restart(two_checkpoints, tmp_path: Path) -> None:
    from trace_agent.config import LogConfig
    from trace_agent.run import run_training

    out, _, _ = two_checkpoints
    run = _copy_run(out, tmp_path / "run")
    for ckpt in (run / "checkpoints").iterdir():
        (ckpt / "manifest.json").write_text("{not json")
    cfg = tiny_config(run, steps=2, log=LogConfig(tensorboard=False, wandb=False, progress=False))
    with pytest.raises(CheckpointError, match="no usable checkpoint"):
        run_training(cfg, resume=True, evaluate=False, log=lambda _m: None)


def test_checkpoint_of_another_model_shape_is_refused(two_checkpoints, tmp_path: Path) -> None:
    out, _, _ = two_checkpoints
    ckpt = Trainer.latest_checkpoint(out)
    state = read_checkpoint(ckpt)
    name = next(iter(state["model"]))
    state["model"][name] = torch.zeros(1)
    forged = write_checkpoint(tmp_path / "forged", state)
    trainer = Trainer(tiny_config(tmp_path / "other"))
    try:
        with pytest.raises(CheckpointError, match="shape"):
            trainer.load_checkpoint(forged)
    finally:
        trainer.collector.close()
