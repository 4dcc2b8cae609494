"""A hostile run directory is refused, never obeyed: forged checkpoints, symbolic links, code named in config.yaml.

Each case writes a real checkpoint with :func:`~trace_agent.checkpoint.write_checkpoint` (or a
real run's files), makes it hostile the way an attacker with write access to the run directory
would, and drives the real resume / prune / config paths.
"""

from __future__ import annotations

import hashlib
import json
import math
import sys
from pathlib import Path

import pytest

from tests.agent.test_checkpoint import _copy_run, two_checkpoints  # noqa: F401  (a fixture)
from tests.agent.test_trainer import tiny_config
from trace_agent.budget import Budget
from trace_agent.checkpoint import CheckpointError, read_checkpoint, write_checkpoint
from trace_agent.config import EvalConfig, LogConfig, RolloutSettings
from trace_agent.config_io import save_config
from trace_agent.errors import ConfigError
from trace_agent.trainer import Trainer

pytestmark = pytest.mark.hostile

FORGED = "step_000009"


def _reseal(ckpt: Path) -> None:
    """Recompute the manifest's sizes and hashes, as a forger who edits a checkpoint would."""
    manifest = json.loads((ckpt / "manifest.json").read_text())
    for name in manifest["files"]:
        blob = (ckpt / name).read_bytes()
        manifest["files"][name] = {"bytes": len(blob), "sha256": hashlib.sha256(blob).hexdigest()}
    (ckpt / "manifest.json").write_text(json.dumps(manifest))


def _edit_state(ckpt: Path, old: str, new: str) -> None:
    text = (ckpt / "state.json").read_text()
    assert old in text
    (ckpt / "state.json").write_text(text.replace(old, new, 1))
    _reseal(ckpt)


def _resume(run: Path) -> tuple[int, list[str]]:
    """Resume ``run`` through :func:`run_training` (no further steps); its final step and its log lines."""
    from trace_agent.run import run_training

    logs: list[str] = []
    cfg = tiny_config(run, steps=2, eval=EvalConfig(tasks=1, samples=1),
                      log=LogConfig(tensorboard=False, wandb=False, progress=False, samples_every=0))
    report = run_training(cfg, resume=True, evaluate=False, log=logs.append)
    return report.steps, logs


def _assert_fell_back(logs: list[str], reason: str) -> None:
    refused = [m for m in logs if "refused checkpoint" in m]
    assert len(refused) == 1 and FORGED in refused[0] and reason in refused[0], logs
    assert all("\n" not in m for m in refused)
    assert any("resumed from" in m and "step_000002" in m for m in logs), logs


@pytest.fixture
def run(two_checkpoints, tmp_path: Path) -> Path:  # noqa: F811
    """A copy of the 2-step run (checkpoints after steps 1 and 2) with its config.yaml."""
    out, _, _ = two_checkpoints
    run = _copy_run(out, tmp_path / "run")
    save_config(tiny_config(run), run / "config.yaml")
    return run


@pytest.fixture
def state(run: Path) -> dict:
    """The decoded state of the run's step-2 checkpoint (to forge newer ones from)."""
    return read_checkpoint(run / "checkpoints" / "step_000002")


# ------------------------------------------------------------------ 1. forged newer checkpoints


def _forge_deep(run: Path, state: dict) -> str:
    ckpt = write_checkpoint(run / "checkpoints" / FORGED, {**state, "step": 9})
    _edit_state(ckpt, '"step": 9', '"step": 9, "junk": ' + "[" * 200_000 + "]" * 200_000)
    return "nests deeper"


def _forge_bare_constant(name: str):
    def forge(run: Path, state: dict) -> str:
        ckpt = write_checkpoint(run / "checkpoints" / FORGED, {**state, "step": 9})
        _edit_state(ckpt, '"step": 9', f'"step": {name}')
        return name
    return forge


def _forge_huge_float(run: Path, state: dict) -> str:
    ckpt = write_checkpoint(run / "checkpoints" / FORGED, {**state, "step": 9})
    _edit_state(ckpt, '"step": 9', '"step": 1e400')
    return "does not fit a float"


def _forge_written(reason: str, **changes):
    def forge(run: Path, state: dict) -> str:
        write_checkpoint(run / "checkpoints" / FORGED, {**state, "step": 9, **changes})
        return reason
    return forge


def _forge_pool(run: Path, state: dict) -> str:
    write_checkpoint(run / "checkpoints" / FORGED, {**state, "step": 9, "pool": {**state["pool"], "cursor": 10**6}})
    return "prompt pool cursor"


def _forge_misnamed(run: Path, state: dict) -> str:
    write_checkpoint(run / "checkpoints" / FORGED, state)
    return "directory name says 9"


FORGERIES = {
    "deeply-nested-json": _forge_deep,
    "bare-infinity-step": _forge_bare_constant("Infinity"),
    "bare-nan-step": _forge_bare_constant("NaN"),
    "overflowing-step": _forge_huge_float,
    "infinite-step": _forge_written("not an integer", step=math.inf),
    "nan-step": _forge_written("not an integer", step=math.nan),
    "negative-step": _forge_written("not an integer", step=-1),
    "float-step": _forge_written("not an integer", step=9.0),
    "huge-step": _forge_written("not an integer", step=10**30),
    "infinite-totals": _forge_written("budget total", totals={"paper_units": math.inf}),
    "negative-totals": _forge_written("budget total", totals={"paper_units": -1.0}),
    "pool-cursor-past-the-pool": _forge_pool,
    "step-unlike-its-name": _forge_misnamed,
}


@pytest.mark.parametrize("forgery", sorted(FORGERIES))
def test_forged_newer_checkpoint_is_refused_and_resume_falls_back(run: Path, state: dict, forgery: str) -> None:
    reason = FORGERIES[forgery](run, state)
    step, logs = _resume(run)
    assert step == 2
    _assert_fell_back(logs, reason)


def test_non_finite_values_still_round_trip_as_tags(tmp_path: Path) -> None:
    back = read_checkpoint(write_checkpoint(tmp_path / "c", {"x": [math.inf, -math.inf, math.nan, 1.5]}))
    assert back["x"][:2] == [math.inf, -math.inf] and math.isnan(back["x"][2]) and back["x"][3] == 1.5
    assert "Infinity" not in (tmp_path / "c" / "state.json").read_text()


def test_no_checkpoint_passing_is_a_clear_error(run: Path, state: dict) -> None:
    for ckpt in (run / "checkpoints").iterdir():
        _edit_state(ckpt, '"step": ', '"step": NaN, "was": ')
    with pytest.raises(CheckpointError, match="no usable checkpoint") as info:
        _resume(run)
    assert "step_000001" in str(info.value) and "step_000002" in str(info.value) and "NaN" in str(info.value)


# ------------------------------------------------------------------ 2. symbolic links


@pytest.fixture
def elsewhere(tmp_path: Path, state: dict) -> Path:
    """A valid step-9 checkpoint outside the run directory."""
    return write_checkpoint(tmp_path / "elsewhere" / FORGED, {**state, "step": 9})


def test_symlinked_step_dir_is_refused_on_resume(run: Path, elsewhere: Path) -> None:
    (run / "checkpoints" / FORGED).symlink_to(elsewhere, target_is_directory=True)
    step, logs = _resume(run)
    assert step == 2
    _assert_fell_back(logs, "symbolic link")
    assert Trainer.latest_checkpoint(run).name == "step_000002"


def test_symlinked_file_in_a_step_dir_is_refused_on_resume(run: Path, elsewhere: Path) -> None:
    forged = write_checkpoint(run / "checkpoints" / FORGED, read_checkpoint(elsewhere))
    (forged / "tensors.safetensors").unlink()
    (forged / "tensors.safetensors").symlink_to(elsewhere / "tensors.safetensors")
    _reseal(forged)
    step, logs = _resume(run)
    assert step == 2
    _assert_fell_back(logs, "symbolic link")


def test_symlinked_checkpoints_dir_resolves_outside_the_run_and_is_refused(run: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    (run / "checkpoints").rename(outside)
    (run / "checkpoints").symlink_to(outside, target_is_directory=True)
    with pytest.raises(CheckpointError, match="no usable checkpoint") as info:
        _resume(run)
    assert "outside the run directory" in str(info.value)
    assert Trainer.latest_checkpoint(run) is None


def test_pruner_never_follows_links_nor_raises_on_odd_entries(run: Path, elsewhere: Path, tmp_path: Path) -> None:
    ckpts = run / "checkpoints"
    secret = tmp_path / "secret.txt"
    secret.write_text("keep me")
    (ckpts / FORGED).symlink_to(elsewhere, target_is_directory=True)
    (ckpts / "step_000008").symlink_to(secret)
    (ckpts / "step_000007").symlink_to(tmp_path / "nowhere")
    (ckpts / "step_000006").write_text("not a checkpoint")
    (ckpts / "step_000000").mkdir()
    (ckpts / "step_000000" / "link").symlink_to(secret)
    trainer = Trainer(tiny_config(run, log=LogConfig(tensorboard=False, wandb=False, keep_checkpoints=1)))
    try:
        assert trainer.load_checkpoint(ckpts / "step_000002") == 2
        trainer.prune_checkpoints()
    finally:
        trainer.collector.close()
    assert sorted(p.name for p in ckpts.iterdir()) == ["step_000002", "step_000006"]
    assert secret.read_text() == "keep me"
    assert sorted(p.name for p in elsewhere.iterdir()) == ["manifest.json", "state.json", "tensors.safetensors"]


def test_pruner_leaves_a_symlinked_checkpoints_dir_alone(run: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    (run / "checkpoints").rename(outside)
    (run / "checkpoints").symlink_to(outside, target_is_directory=True)
    trainer = Trainer(tiny_config(run, log=LogConfig(tensorboard=False, wandb=False, keep_checkpoints=1)))
    try:
        warnings = trainer.prune_checkpoints()
    finally:
        trainer.collector.close()
    assert warnings and "symbolic link" in warnings[0]
    assert sorted(p.name for p in outside.iterdir()) == ["step_000001", "step_000002"]


# ------------------------------------------------------------------ 3. code named in config.yaml


@pytest.fixture
def payload(tmp_path: Path, monkeypatch):
    """An importable module whose import leaves a marker file (a strategy spec naming it, the marker)."""
    marker = tmp_path / "imported"
    pkg = tmp_path / "payload_pkg"
    pkg.mkdir()
    (pkg / "hostile_strategy_payload.py").write_text(
        f"from pathlib import Path\nPath({str(marker)!r}).write_text('ran')\n"
        "from trace_agent.strategies import TRACE as Payload\n")
    monkeypatch.syspath_prepend(str(pkg))
    monkeypatch.delenv("TRACE_GYM_ALLOW_CODE", raising=False)
    yield "hostile_strategy_payload:Payload", marker
    sys.modules.pop("hostile_strategy_payload", None)


def _code_run(tmp_path: Path, spec: str) -> Path:
    run = tmp_path / "coderun"
    run.mkdir()
    save_config(tiny_config(run, rollout=RolloutSettings(strategy=spec, prompts_per_step=4,
                                                         budget=Budget(roots=4, group_size=2))),
                run / "config.yaml")
    return run


def test_resume_refuses_code_named_by_the_run_dir(tmp_path: Path, payload, capsys) -> None:
    from trace_agent.cli import main
    from trace_agent.rundir import resume_config

    spec, marker = payload
    run = _code_run(tmp_path, spec)
    with pytest.raises(ConfigError, match="TRACE_GYM_ALLOW_CODE=hostile_strategy_payload:Payload"):
        resume_config(run)
    assert main(["train", "--resume", str(run), "--no-eval"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "names code to import" in err and spec in err
    assert not marker.exists() and "hostile_strategy_payload" not in sys.modules


def test_code_the_caller_allows_or_gives_is_resumed(tmp_path: Path, payload, monkeypatch) -> None:
    from trace_agent.config_io import load_config
    from trace_agent.rundir import resume_config
    from trace_agent.wiring import resolve_strategy

    spec, marker = payload
    run = _code_run(tmp_path, spec)
    assert resume_config(run, allow_code=(spec,)).rollout.strategy == spec
    assert resume_config(run, load_config(run / "config.yaml")).rollout.strategy == spec
    monkeypatch.setenv("TRACE_GYM_ALLOW_CODE", f"other.mod:Thing, {spec}")
    assert resume_config(run).rollout.strategy == spec
    assert not marker.exists()
    assert resolve_strategy(spec).name == "trace" and marker.exists()  # the caller's own spec still loads
