"""Checkpoints are durable: files and directories are fsynced before the rename makes them final, and after."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from trace_agent.checkpoint import read_checkpoint, write_checkpoint


def test_files_and_directories_are_fsynced_around_the_rename(tmp_path: Path, monkeypatch) -> None:
    events: list[tuple[str, str]] = []
    real_fsync, real_rename = os.fsync, Path.rename

    def fsync(fd: int) -> None:  # the real call, recorded by the path the descriptor names
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def rename(self: Path, target: Path) -> Path:
        events.append(("rename", str(self)))
        return real_rename(self, target)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(Path, "rename", rename)
    final = write_checkpoint(tmp_path / "ckpts" / "step_000001", {"step": 1, "w": torch.ones(3)})
    monkeypatch.undo()
    at = events.index(("rename", str(final) + ".tmp"))
    before = {p for kind, p in events[:at] if kind == "fsync"}
    tmp = str(final) + ".tmp"
    assert {f"{tmp}/tensors.safetensors", f"{tmp}/state.json", f"{tmp}/manifest.json", tmp,
            str(final.parent)} <= before, events
    assert ("fsync", str(final.parent)) in events[at + 1:], events
    assert read_checkpoint(final)["step"] == 1
