"""A policy path that is not there fails fast, naming policy.path: no hub download retries for a typo'd
run directory, nor for a hub id on an offline machine."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from trace_agent.cli import build_parser, main


@pytest.mark.parametrize("path", ["myrun/policy", "runs/trace/checkpoints/step_3", "./myrun/policy", "nowhere/x/y"])
@pytest.mark.parametrize("command", ["train", "eval"])
def test_a_local_looking_path_that_does_not_exist_fails_in_under_a_second(
        command: str, path: str, tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    build_parser()  # the subcommand modules are imported once, as a process does before parsing
    args = [command, "--policy", "hf", "--policy-path", path] + (["--out", "run"] if command == "train" else [])
    start = time.perf_counter()
    assert main(args) == 1
    assert time.perf_counter() - start < 1.0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"policy.path {path}: no such directory" in err[0]


def test_an_owner_that_is_a_local_directory_is_a_local_path(tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "myruns").mkdir()
    assert main(["eval", "--policy", "hf", "--policy-path", "myruns/best"]) == 1
    assert "policy.path myruns/best: no such directory" in capsys.readouterr().err


def test_a_hub_id_on_an_offline_machine_fails_fast(tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    build_parser()
    start = time.perf_counter()
    assert main(["eval", "--policy", "hf", "--policy-path", "someone/some-model"]) == 1
    assert time.perf_counter() - start < 1.0
    err = capsys.readouterr().err
    assert "policy.path someone/some-model is a hub id, this machine is offline" in err


def test_a_hub_id_online_is_only_a_warning(tmp_path: Path, monkeypatch) -> None:
    from trace_agent.preflight import model_check

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    check = model_check("policy", "Qwen/Qwen3-8B", what="policy.path")
    assert check.ok and not check.fatal and "hub id" in check.message
