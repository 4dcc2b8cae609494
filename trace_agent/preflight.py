"""Checks before a run starts: the env, its splits, the policy and predictor paths, CUDA, vLLM, the run directory.

``trace-gym train`` and ``eval`` call :func:`require` before anything slow (the checks include every
module the run imports, :func:`required_imports`, and the env's tool backend, :func:`backend_check`) (loading a policy,
building an index), so a wrong env id, a missing model directory on an offline machine, a CUDA
device on a machine without one or a vLLM backend in a Python without vLLM ends in one line
that says what to do, within a second or two. ``trace-gym train --preflight`` prints every
check and exits (0: all passed).

A policy trained by trace-gym records the envs it was trained on (``trace_gym.json`` in its
directory, written by :func:`write_policy_meta`; the demo policy's ``build_report.json`` names its
demonstration envs). :func:`policy_env_warning` compares them with the env a run uses: the shipped
PythonMath demo policy on WikiQA-v0 gets a warning, not silence.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trace_agent.config import TrainConfig
from trace_agent.errors import PreflightError

__all__ = [
    "Check",
    "PreflightError",
    "preflight",
    "backend_check",
    "import_checks",
    "required_imports",
    "require",
    "format_checks",
    "model_check",
    "policy_dir",
    "policy_env_ids",
    "policy_env_warning",
    "write_policy_meta",
]

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_META = "trace_gym.json"


@dataclass(frozen=True, kw_only=True)
class Check:
    """One prerequisite: its name, whether it holds, and a one-line message (what to do when it does not)."""

    name: str
    ok: bool
    message: str
    fatal: bool = True


def _offline() -> bool:
    return any(os.environ.get(k, "").strip().lower() in ("1", "true", "yes", "on")
               for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


#: Last path components of what trace-gym saves (``<run>/policy``, ``<run>/checkpoints/step_<k>``): never hub ids.
_SAVED_NAMES = re.compile(r"^(policy|predictor|critic|step_\d+|checkpoints?)$")


def _local_looking(p: Path) -> bool:
    """``owner/name`` that is a local path gone wrong: ``<run>/policy``, or an owner that is a local directory."""
    return bool(_SAVED_NAMES.match(p.name)) or p.parent.is_dir()


def model_check(name: str, path: str, *, what: str) -> Check:
    """A model reference: an existing directory, or a hub id (cached when this machine is offline)."""
    if not path:
        return Check(name=name, ok=False, message=f"{what} is empty: pass a model directory or a hub id")
    p = Path(path).expanduser()
    if p.is_dir():
        if not (p / "config.json").is_file():
            return Check(name=name, ok=False, message=f"{what} {path} has no config.json: pass the directory a "
                                                      f"model was saved to (a run saves <run>/policy)")
        return Check(name=name, ok=True, message=f"{what}: {p}")
    if not _HUB_ID.match(path) or path.startswith((".", "/", "~")) or p.exists() or _local_looking(p):
        return Check(name=name, ok=False, message=f"{what} {path}: no such directory (a run saves its policy in "
                                                  f"<run>/policy; a hub id looks like Qwen/Qwen3-8B)")
    if _offline():
        try:
            from huggingface_hub import try_to_load_from_cache

            cached = try_to_load_from_cache(path, "config.json")
        except Exception:  # noqa: BLE001 - any failure means "not usable offline"
            cached = None
        if not isinstance(cached, str):
            return Check(name=name, ok=False, message=f"{what} {path} is a hub id, this machine is offline "
                                                      f"(HF_HUB_OFFLINE) and it is not in the Hugging Face cache: "
                                                      f"download it where the hub is reachable and pass its directory")
        return Check(name=name, ok=True, message=f"{what}: {path} (Hugging Face cache)")
    return Check(name=name, ok=True, fatal=False,
                 message=f"{what}: {path} is a hub id; it will be downloaded unless cached (set HF_HUB_OFFLINE=1 "
                         f"on machines without network)")


def policy_dir(config: TrainConfig) -> Path | None:
    """The directory the run's policy loads from (None: built in memory, e.g. ``kind == "tiny"``)."""
    p = config.policy
    if p.kind == "tiny":
        return None
    if p.kind == "demo":
        from trace_agent.demo.shipped import shipped_demo_policy

        return Path(p.path) if p.path else shipped_demo_policy(config.env_id)
    return Path(p.path).expanduser() if p.path else None


def policy_env_ids(path: str | Path | None) -> tuple[str, ...] | None:
    """The env ids a saved policy was trained on (``trace_gym.json`` or a demo ``build_report.json``); None: unknown."""
    if path is None:
        return None
    path = Path(path)
    for name, keys in ((_META, ("env_ids",)), ("build_report.json", ("config", "env_ids"))):
        try:
            data: Any = json.loads((path / name).read_text(encoding="utf-8"))
            for k in keys:
                data = data[k]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if isinstance(data, list) and all(isinstance(e, str) for e in data):
            return tuple(data)
    return None


def policy_env_warning(config: TrainConfig) -> str | None:
    """A one-line warning when the run's policy was trained on other envs than ``config.env_id`` (else None)."""
    path = policy_dir(config)
    envs = policy_env_ids(path)
    if not envs or config.env_id in envs:
        return None
    return (f"warning: the policy at {path} was trained on {', '.join(envs)}, not {config.env_id}: expect text "
            f"written for that env (pass a policy trained for {config.env_id.split('/')[-1]} with --policy hf "
            f"--policy-path DIR)")


def write_policy_meta(directory: str | Path, *, env_ids: Sequence[str], **extra: Any) -> Path:
    """Record in ``<directory>/trace_gym.json`` which envs the saved policy was trained on."""
    path = Path(directory) / _META
    path.write_text(json.dumps({"env_ids": list(dict.fromkeys(env_ids)), **extra}, indent=1, default=str))
    return path


def preflight(config: TrainConfig, *, train: bool = True, stop_early: bool = False) -> list[Check]:
    """Every check for ``config`` (``train=False``: only what ``trace-gym eval`` needs).

    The config itself was read within bounds already (:mod:`trace_agent.safe_yaml`); a split that is
    a task file is read here, every row, within the read limits (:mod:`trace_envs.tasks.files`).
    The env's backend (:func:`backend_check`, which may start a worker process or ask a server) is
    checked last; with ``stop_early`` it is left out when a cheaper check already failed.
    """
    from trace_agent.env_factory import check_env_id, split_kwargs
    from trace_agent.errors import EnvSetupError

    checks: list[Check] = []
    try:
        check_env_id(config.env_id)
        checks.append(Check(name="env", ok=True, message=f"env: {config.env_id}"))
    except EnvSetupError as exc:
        return [Check(name="env", ok=False, message=str(exc))]
    checks.extend(import_checks(config, train=train))
    splits = [("eval split", config.eval.split)] + ([("train split", config.train_split)] if train else [])
    for name, split in splits:
        try:
            kwargs = split_kwargs(config.env_id, split, config.env_kwargs)
            checks.append(Check(name=name, ok=True, message=f"{name}: {split}"))
        except (EnvSetupError, ValueError, ImportError) as exc:
            checks.append(Check(name=name, ok=False, message=str(exc)))
            continue
        checks += _task_file_checks(name, kwargs.get("tasks"), config.env_id)
    p = config.policy
    if p.kind == "demo":
        path = policy_dir(config)
        assert path is not None
        from trace_agent.demo.shipped import missing_shipped_policy

        built = (path / "config.json").is_file()
        missing = None if p.path else missing_shipped_policy(config.env_id)
        if missing is not None:
            checks.append(Check(name="policy", ok=False, message=f"policy: {missing} (--policy-path)"))
        else:
            checks.append(Check(name="policy", ok=True, fatal=False,
                                message=f"policy: demo at {path}" + ("" if built else " (built there first: minutes)")))
    elif p.kind != "tiny":
        checks.append(model_check("policy", p.path, what="policy.path"))
    warning = policy_env_warning(config)
    if warning:
        checks.append(Check(name="policy env", ok=False, fatal=False, message=warning))
    if train and config.predictor.kind == "lm-critic":
        checks.append(model_check("predictor", config.predictor.path, what="predictor.path"))
    if p.device.startswith("cuda") or (p.kind.startswith("vllm") and p.kind != "vllm-server"):
        import torch

        ok = torch.cuda.is_available()
        checks.append(Check(name="cuda", ok=ok or not p.device.startswith("cuda"),
                            message=f"CUDA: {torch.cuda.device_count()} device(s)" if ok else
                            f"policy.device={p.device} but torch {torch.__version__} sees no CUDA device: run on a GPU "
                            f"machine with a CUDA build of torch, or use --device cpu"))
    if p.kind.startswith("vllm") and p.kind != "vllm-server":
        ok = importlib.util.find_spec("vllm") is not None
        checks.append(Check(name="vllm", ok=ok, message="vLLM: importable" if ok else
                            "policy.kind=vllm needs vLLM in this Python, which lacks it: run from the vLLM venv "
                            "(make setup-vllm builds .venv-vllm; on GPUs see docs/gpu.md)"))
    if train:
        out = Path(config.out_dir)
        parent = next((q for q in (out, *out.parents) if q.exists()), Path("."))
        ok = os.access(parent, os.W_OK)
        checks.append(Check(name="out_dir", ok=ok, message=f"run directory: {out}" if ok else
                            f"cannot write to {parent}: choose another --out"))
    if stop_early and any(not c.ok and c.fatal for c in checks):
        return checks  # the backend check may start a process: not worth it for a run that cannot start
    backend = backend_check(config)
    if backend is not None:
        checks.append(backend)
    return checks


def _task_file_checks(name: str, tasks: Any, env_id: str) -> list[Check]:
    """Read a split's task file (when it is one) as the run will: within the read limits, every row checked.

    :func:`trace_envs.tasks.files.read_rows` refuses an empty, truncated, oversized or wrongly nested
    file, a line or row group over its limit and an overlong field, in one line naming the file and row;
    the env's :meth:`~trace_envs.BranchableEnv.load_tasks` (the task set its ``tasks=`` argument names, no
    process started) then turns every row into a task as the env will, so a field of the wrong type
    or a missing one fails here too. Rows the env's loader skips (with a warning) are counted.
    """
    if not isinstance(tasks, str | Path):
        return []
    path = Path(tasks).expanduser()
    from trace_envs.tasks.files import BUILDERS

    if not path.is_file() and not any(s.lower() in BUILDERS for s in path.suffixes):
        return []  # a split name, not a file
    from trace_agent.env_factory import env_class
    from trace_envs.errors import TraceEnvError
    from trace_envs.tasks.files import read_rows

    load = getattr(env_class(env_id), "load_tasks", None)
    try:
        rows = read_rows(path)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            loaded = load(str(path)) if callable(load) else None
    except (TraceEnvError, ValueError, OSError) as exc:
        return [Check(name=f"{name} file", ok=False, message=f"{name}: {exc}")]
    what = f"{len(rows)} rows read and checked"
    if loaded is not None:
        what += f", {len(loaded)} tasks"
    skipped = "; ".join(str(w.message) for w in caught)
    return [Check(name=f"{name} file", ok=True, message=f"{name}: {path} ({what})" + (f"; {skipped}" if skipped else ""))]
def required_imports(config: TrainConfig, *, train: bool = True) -> dict[str, str]:
    """The modules a run of ``config`` imports (module -> what installs it), beyond trace-gym's base dependencies."""
    agent = "pip install 'trace-gym[agent]' (CPU machines: pip install torch==2.13.0 first)"
    needed: dict[str, str] = {}
    if config.policy.kind != "vllm-server" or train:
        needed.update({m: agent for m in ("torch", "transformers", "tokenizers", "safetensors")})
    if train:
        needed.update({m: agent for m in ("scipy", "matplotlib")})
    if config.policy.kind == "vllm-server":
        needed["httpx"] = "pip install 'trace-gym[vllm-client]'"
    if config.rollout.engine.backend == "ray" and train:
        needed["ray"] = "pip install 'trace-gym[ray]'"
    if train and config.predictor.kind == "lm-critic":
        needed.update({m: agent for m in ("torch", "transformers")})
    return needed


def import_checks(config: TrainConfig, *, train: bool = True) -> list[Check]:
    """One check per module of :func:`required_imports` that this Python cannot import (found without importing)."""
    missing = [(m, how) for m, how in required_imports(config, train=train).items()
               if importlib.util.find_spec(m) is None]
    if not missing:
        return [Check(name="imports", ok=True, message=f"imports: {', '.join(required_imports(config, train=train))}")]
    return [Check(name=f"import {m}", ok=False, message=f"this run imports {m}, which this Python lacks: {how}")
            for m, how in missing]


def backend_check(config: TrainConfig) -> Check | None:
    """The env's tool backend (:func:`trace_envs.health.check_backend`: a retrieval server, a worker process).

    None when the env has no backend check or its id is unknown (the env check reports that).
    """
    import trace_envs  # noqa: F401  (registers the suite)
    from trace_envs.errors import TraceEnvError
    from trace_envs.health import check_backend

    try:
        described = check_backend(config.env_id, config.env_kwargs)
    except (TraceEnvError, ImportError) as exc:
        return Check(name="backend", ok=False, message=str(exc))
    except Exception:  # noqa: BLE001 - an unknown env id: the env check says so
        return None
    return None if described is None else Check(name="backend", ok=True, message=f"backend: {described}")


def format_checks(checks: Sequence[Check]) -> str:
    """One line per check: ``ok``, ``warn`` or ``FAIL``, then its message."""
    return "\n".join(f"{'ok  ' if c.ok else ('FAIL' if c.fatal else 'warn')}  {c.message}" for c in checks)


def require(checks: Sequence[Check], *, warn: Any = None) -> None:
    """Raise :class:`PreflightError` with the first fatal failure's message; pass warnings to ``warn(message)``."""
    for c in checks:
        if not c.ok and c.fatal:
            raise PreflightError(c.message)
    if warn is not None:
        for c in checks:
            if not c.ok:
                warn(c.message)
