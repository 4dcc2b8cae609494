"""The run directory's rules: resume exactly as configured, never overwrite a run by accident.

* ``trace-gym train --resume DIR`` continues with ``DIR/config.yaml`` (:func:`resume_config`). A
  config or overrides given beside it must agree with the saved one except in
  :data:`RESUMABLE_CHANGES` (``steps``, to train longer; ``log.progress``); otherwise the
  resume is refused with every differing field named.
* ``trace-gym train --out DIR`` refuses a directory that already holds a run
  (:func:`check_fresh`) unless ``--overwrite`` clears its artefacts (:func:`clear_run`).
* A stopped run says how to continue (:class:`TrainingStopped`).
* A run directory never names code to import: a saved config whose ``rollout.strategy`` is a
  ``module:attribute`` spec is resumed only when the caller gives the same spec itself (in
  ``given``), allows it (``resume_config(..., allow_code=("mypkg.strats:Mine",))``) or lists it
  in the :data:`ALLOW_CODE_ENV` environment variable (comma-separated); otherwise
  :func:`resume_config` raises :class:`~trace_agent.errors.ConfigError` saying how to allow it.
"""

from __future__ import annotations

import os
import shlex
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from trace_agent.config import TrainConfig
from trace_agent.config_io import config_to_dict, load_config
from trace_agent.errors import ConfigError, RunDirError

__all__ = [
    "ALLOW_CODE_ENV",
    "RESUMABLE_CHANGES",
    "RUN_ARTIFACTS",
    "RunDirError",
    "TrainingStopped",
    "config_differences",
    "named_code",
    "allowed_code",
    "resume_config",
    "is_run",
    "check_fresh",
    "clear_run",
]

#: Fields a resumed run may change (dotted paths).
RESUMABLE_CHANGES: tuple[str, ...] = ("steps", "log.progress")

#: Environment variable listing the ``module:attribute`` specs a resumed run's saved config may name.
ALLOW_CODE_ENV = "TRACE_GYM_ALLOW_CODE"

#: What ``trace-gym train`` writes into a run directory (what ``--overwrite`` removes).
RUN_ARTIFACTS: tuple[str, ...] = ("config.yaml", "metrics.jsonl", "tb", "checkpoints", "trees", "policy",
                                  "learning_curves.png", "summary.json", "wandb", "wandb_id.txt")


class TrainingStopped(KeyboardInterrupt):
    """Ctrl-C (or SIGINT) stopped a run; ``message`` says where it stopped and how to resume."""

    def __init__(self, *, out_dir: str | Path, step: int, checkpoint_step: int | None) -> None:
        self.out_dir = str(out_dir)
        self.step = step
        self.checkpoint_step = checkpoint_step
        super().__init__(self.message)

    @property
    def message(self) -> str:
        resume = f"trace-gym train --resume {shlex.quote(self.out_dir)}"
        if self.checkpoint_step is None:
            return f"stopped after step {self.step}, before the first checkpoint: start it again (with --overwrite)"
        saved = "" if self.checkpoint_step == self.step else f" (last checkpoint: step {self.checkpoint_step})"
        return f"stopped after step {self.step}{saved}; resume with: {resume}"

    def __str__(self) -> str:
        return self.message


def _flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(data, dict) and data:
        out: dict[str, Any] = {}
        for k, v in data.items():
            out.update(_flatten(v, f"{prefix}{k}."))
        return out
    return {prefix.rstrip("."): data}


def config_differences(saved: TrainConfig, given: TrainConfig, *, ignore: tuple[str, ...] = ()) -> list[str]:
    """``field: saved -> given`` for every dotted field that differs (except those in ``ignore``)."""
    a, b = _flatten(config_to_dict(saved)), _flatten(config_to_dict(given))
    out = []
    for key in sorted(set(a) | set(b)):
        if key in ignore or any(key.startswith(i + ".") for i in ignore):
            continue
        if a.get(key) != b.get(key):
            out.append(f"{key}: {a.get(key)!r} (saved) -> {b.get(key)!r} (given)")
    return out


def is_run(path: str | Path) -> bool:
    """True when ``path`` holds a run's config or checkpoints."""
    p = Path(path)
    return (p / "config.yaml").is_file() or (p / "checkpoints").is_dir()


def named_code(config: TrainConfig) -> dict[str, str]:
    """``{dotted field: "module:attribute"}`` for every field of ``config`` that names code to import."""
    spec = config.rollout.strategy
    return {"rollout.strategy": spec} if isinstance(spec, str) and ":" in spec else {}


def allowed_code(allow_code: Iterable[str] = ()) -> frozenset[str]:
    """``allow_code`` plus the comma-separated specs in the :data:`ALLOW_CODE_ENV` environment variable."""
    listed = os.environ.get(ALLOW_CODE_ENV, "").split(",")
    return frozenset(str(s).strip() for s in (*allow_code, *listed) if str(s).strip())


def _refuse_named_code(run: Path, saved: TrainConfig, allowed: frozenset[str]) -> None:
    """Raise :class:`ConfigError` when ``saved`` (read from ``run``) names a ``module:attribute`` not in ``allowed``."""
    named = {field: spec for field, spec in named_code(saved).items() if spec not in allowed}
    if not named:
        return
    specs = ",".join(sorted(set(named.values())))
    fields = "; ".join(f"{f}: {v}" for f, v in sorted(named.items()))
    raise ConfigError(f"refusing to resume {run}: its config.yaml names code to import ({fields}) and a run "
                      f"directory never chooses code; if you trust it, allow it with {ALLOW_CODE_ENV}={specs} "
                      f"(or give the same spec in your own config, or resume_config(..., allow_code=...))")


def resume_config(run_dir: str | Path, given: TrainConfig | None = None, *,
                  allow_code: Iterable[str] = ()) -> TrainConfig:
    """The config a resumed run continues with: ``run_dir/config.yaml``, or ``given`` when it agrees.

    ``given`` (built from a ``--config`` file and/or flags and ``--set`` overrides) may differ
    from the saved config only in :data:`RESUMABLE_CHANGES`; ``out_dir`` is always ``run_dir``.
    Raises :class:`RunDirError` naming every other difference, and
    :class:`~trace_agent.errors.ConfigError` when the saved config names a ``module:attribute``
    that neither ``given`` nor :func:`allowed_code` (``allow_code`` and :data:`ALLOW_CODE_ENV`) names.
    """
    run = Path(run_dir)
    path = run / "config.yaml"
    if not path.is_file():
        hint = " (it has checkpoints but no config.yaml)" if (run / "checkpoints").is_dir() else ""
        raise RunDirError(f"{run} is not a run directory{hint}: start a run there with trace-gym train --out {run}")
    saved = load_config(path)
    saved = TrainConfig(**{**saved.__dict__, "out_dir": str(run)})
    if given is None:
        _refuse_named_code(run, saved, allowed_code(allow_code))
        return saved
    given = TrainConfig(**{**given.__dict__, "out_dir": str(run)})
    diffs = config_differences(saved, given, ignore=RESUMABLE_CHANGES)
    if diffs:
        raise RunDirError(f"refusing to resume {run} with another config ({'; '.join(diffs)}): "
                          f"resume with --resume {run} alone (it uses the run's config.yaml; --steps may grow), "
                          f"or start a new run with another --out")
    _refuse_named_code(run, saved, allowed_code((*allow_code, *named_code(given).values())))
    return given


def check_fresh(path: str | Path) -> None:
    """Raise :class:`RunDirError` when ``path`` already holds a run (a fresh run would overwrite it)."""
    if is_run(path):
        raise RunDirError(f"{path} already holds a run: continue it with trace-gym train --resume {path}, "
                          f"choose another --out, or pass --overwrite to replace it")


def clear_run(path: str | Path) -> list[Path]:
    """Remove the run artefacts (:data:`RUN_ARTIFACTS`) under ``path``; other files stay. Returns what went."""
    gone = []
    for name in RUN_ARTIFACTS:
        p = Path(path) / name
        if p.is_dir():
            shutil.rmtree(p)
            gone.append(p)
        elif p.exists():
            p.unlink()
            gone.append(p)
    return gone
