"""The five-step training loop and checkpoints that resume bit for bit.

One :meth:`Trainer.step` (docs/design.md, "One training step"):

1. **score** the step's candidate prompts with the predictor,
2. **allocate roots** and
3. **expand per prompt** - both inside the rollout collector
   (:class:`~trace_agent.rollout.TreeCollector` driven by a
   :class:`~trace_agent.strategies.Strategy`),
4. **refresh the predictor** on the finished trees' bottom-up targets
   (:func:`~trace_agent.predictor.refresh_predictor`; with ``predictor.refresh: auto`` only
   when the strategy reads the predictor),
5. **update the policy** (:func:`~trace_agent.update.update_policy`: advantages from
   :mod:`trace_agent.objectives`, clipped surrogate, AdamW, gradient clipping), then
   sync the new weights to the generator (:func:`~trace_agent.update.sync_weights`).

Before step 1, :meth:`Trainer.warm_start` can fit the predictor on the starting policy's
rollouts of train tasks (``predictor.warm_start_tasks``; :mod:`trace_agent.warm_start`).

The parts live beside it: :mod:`trace_agent.update` (step 5), :mod:`trace_agent.collector`
(steps 1-3 as the trainer sees them), :mod:`trace_agent.checkpoint` (RNG and predictor
state), :mod:`trace_agent.pool` (the prompt pool), :mod:`trace_agent.wiring` (building a
run's parts from its config).

Learner and generator. The *learner* is an :class:`~trace_agent.policy.hf.HFPolicy`
whose model is trained; the *generator* is the policy the run samples with. With the transformers
backend they are the same object (nothing to sync); with vLLM the generator is a vLLM backend
(:class:`~trace_agent.policy.vllm_backend.VLLMPolicy`, ...) and gets the learner's weights after each
update.

Checkpoints (:meth:`Trainer.save_checkpoint` / :meth:`Trainer.load_checkpoint`) hold
everything the next step reads: model and optimiser state (and the KL reference),
the predictor's state, every RNG (python, numpy global, torch, the trainer's
own generator), the step, the prompt pool's position, the budget totals and the
predictor's warm-up figures (so a resumed run never repeats the warm-up). A run
killed after checkpoint k and resumed from it produces the same step k+1 batch and
the same weights as a run that never stopped (same machine, same thread count).
They are data, never code: safetensors for tensors, JSON for the rest, a sha256 manifest
verified on load (:mod:`trace_agent.checkpoint`); nothing is unpickled.
"""

from __future__ import annotations

import logging
import math
import os
import random
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from trace_agent.checkpoint import (
    CheckpointError,
    capture_rng_state,
    checkpoint_step,
    list_checkpoints,
    load_predictor_state,
    predictor_state,
    read_checkpoint,
    restore_rng_state,
    verify_checkpoint,
    write_checkpoint,
)
from trace_agent.collector import CollectorProtocol, default_collector
from trace_agent.config import TrainConfig
from trace_agent.config_io import config_to_dict, save_config
from trace_agent.env_factory import task_ids
from trace_agent.objectives import Segment, batch_segments
from trace_agent.pool import PromptPool
from trace_agent.strategies import reads_of
from trace_agent.update import sync_weights, update_policy
from trace_agent.warm_start import TOTALS, WarmStart, check_warm_start, warm_up_predictor
from trace_agent.wiring import build_policies, build_predictor

if TYPE_CHECKING:  # pragma: no cover
    from trace_agent.policy.hf import HFPolicy
    from trace_agent.tree import RolloutTree

__all__ = ["StepResult", "Trainer", "CollectorFactory"]

_log = logging.getLogger(__name__)

#: Largest step a checkpoint may give (far beyond any run; it keeps step arithmetic in int64).
MAX_STEP = 2**53


# --------------------------------------------------------------------------------------------------
# the trainer


@dataclass(frozen=True, kw_only=True)
class StepResult:
    """One finished step: its trees, its segments and the metrics logged for it."""

    step: int
    trees: tuple[RolloutTree, ...]
    segments: tuple[Segment, ...]
    metrics: dict[str, float]


#: Builds a run's collector: ``factory(config, generator=..., predictor=...) -> CollectorProtocol``.
CollectorFactory = Callable[..., CollectorProtocol]


class Trainer:
    """Runs :class:`~trace_agent.config.TrainConfig` (see the module docstring).

    Args:
        config: the run.
        learner: the trained policy (default: built from ``config.policy``).
        generator: the generation policy (default: the learner, or the vLLM backend of a ``vllm*`` policy
            kind). A generator built here is the trainer's: :meth:`close` closes it; one passed in stays open.
        predictor: the success predictor (default: built from ``config.predictor``).
        collector_factory: builds the rollout collector (default: :func:`default_collector`).
    """

    def __init__(self, config: TrainConfig, *, learner: HFPolicy | None = None, generator: Any = None,
                 predictor: Any = None, collector_factory: CollectorFactory | None = None) -> None:
        import torch

        self.config = config
        self.out_dir = Path(config.out_dir)
        random.seed(config.seed)
        np.random.seed(config.seed % 2**32)
        torch.manual_seed(config.seed)
        self._owns_generator = generator is None
        if learner is None:
            learner, built_generator = build_policies(config.policy, seed=config.seed, env_id=config.env_id)
            generator = generator if generator is not None else built_generator
        self.learner = learner
        self.generator = generator if generator is not None else learner
        if predictor is None:  # policy-states copies the learner now, before any update or resume
            predictor = build_predictor(config.predictor, seed=config.seed, policy=learner)
        self.predictor = predictor
        o = config.optim
        self.optimizer = torch.optim.AdamW([p for p in learner.model.parameters() if p.requires_grad], lr=o.lr,
                                           betas=o.betas, weight_decay=o.weight_decay)
        self.reference: HFPolicy | None = None
        if config.objective.kl_coef > 0:
            import copy

            from trace_agent.policy.hf import HFPolicy

            ref_model = copy.deepcopy(learner.model).eval().requires_grad_(False)
            self.reference = HFPolicy(ref_model, learner.tokenizer, max_batch_size=learner.max_batch_size)
        ids = task_ids(config.env_id, config.train_split, env_kwargs=config.env_kwargs)
        self.pool = PromptPool(ids[:config.train_tasks] if config.train_tasks else ids, seed=config.seed)
        check_warm_start(config.predictor.warm_start_tasks, len(self.pool.prompt_ids))
        #: The warm-up's figures once it ran (``warm_start/*``; kept in checkpoints), else None.
        self.warm_started: dict[str, float] | None = None
        self.rng = np.random.default_rng([config.seed, 7])
        self.step_count = 0
        self.totals: dict[str, float] = {}
        self.collector: CollectorProtocol = (collector_factory or default_collector)(
            config, generator=self.generator, predictor=self.predictor)
        self.refreshes_predictor = (config.predictor.refresh == "always"
                                    or reads_of(self.collector.strategy).predictor)

    def close(self) -> None:
        """Shut the collector down and close the generator this trainer built (a vLLM backend gives its memory
        back; a learner that generates for itself stays usable). Idempotent; ``with Trainer(...)`` calls it."""
        from trace_agent.policy.base import close_generator

        close = getattr(self.collector, "close", None)
        if callable(close):
            close()
        if self._owns_generator:
            close_generator(self.generator, self.learner)

    def __enter__(self) -> Trainer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---------------------------------------------------------------- the predictor's warm-up
    def warm_start(self) -> WarmStart | None:
        """Warm the predictor up before step 1 (:mod:`trace_agent.warm_start`); at most once per run.

        Runs when ``predictor.warm_start_tasks > 0``, the strategy reads the predictor, no step has run and
        no warm-up is recorded (a checkpoint carries the record: a resumed run does not repeat it). Its
        paper units, generated tokens and env steps start :attr:`totals`; its metrics (``warm_start/*``,
        the refresh's ``predictor/*``, ``budget/total_*``) are step 0's. Returns None when it does not run
        (a strategy that does not read the predictor gets a logged warning and no warm-up, at no cost).
        """
        cfg = self.config
        if not cfg.predictor.warm_start_tasks or self.step_count or self.warm_started is not None:
            return None
        if not reads_of(self.collector.strategy).predictor:
            _log.warning("predictor.warm_start_tasks=%d: no warm-up, the strategy %r does not read the predictor",
                         cfg.predictor.warm_start_tasks, getattr(self.collector.strategy, "name", "?"))
            return None
        warm = warm_up_predictor(cfg, collector=self.collector, predictor=self.predictor,
                                 pool_ids=self.pool.prompt_ids)
        for k in TOTALS:
            self.totals[k] = self.totals.get(k, 0.0) + warm.metrics[f"warm_start/{k}"]
        self.warm_started = {k: v for k, v in warm.metrics.items() if k.startswith("warm_start/")}
        return replace(warm, metrics={**warm.metrics, **{f"budget/total_{k}": self.totals[k] for k in TOTALS}})

    # ---------------------------------------------------------------- one step
    def step(self) -> StepResult:
        """Run one training step (see the module docstring); returns its trees, segments and metrics."""
        from trace_agent.predictor import refresh_predictor
        from trace_agent.tree_stats import batch_stats

        cfg = self.config
        step = self.step_count + 1
        t0 = time.perf_counter()
        prompts = self.pool.take(cfg.rollout.prompts_per_step)
        collected = self.collector.collect(prompts, step=step, seed=int(self.rng.integers(2**31)))
        trees = list(collected.trees)
        t_collect = time.perf_counter()
        pred = (refresh_predictor(self.predictor, trees, prefixes=cfg.predictor.prefixes,
                                  prefix_share=cfg.predictor.prefix_share, seed=step)
                if self.refreshes_predictor else {})
        t_pred = time.perf_counter()
        o = cfg.objective
        segments = batch_segments(trees, o.name, **o.segment_kwargs())
        upd = update_policy(self.learner, self.optimizer, segments, optim=cfg.optim, objective=o,
                            temperature=cfg.sampling.temperature, rng=self.rng, reference=self.reference)
        synced = sync_weights(self.generator, self.learner) if upd.optimizer_steps else False
        t_update = time.perf_counter()
        for tree in trees:
            tree.release_snapshots()

        stats = batch_stats(trees, continuation_cost=cfg.rollout.budget.continuation_cost)
        timings = dict(collected.timings)
        gen_s = float(timings.get("generation", t_collect - t0))
        env_s = float(timings.get("env", 0.0))
        scoring_s = float(timings.get("predictor", 0.0))
        scoring_busy_s = float(timings.get("predictor_busy", scoring_s))
        predictor_s = scoring_s + (t_pred - t_collect)
        update_s = t_update - t_pred
        wall = t_update - t0
        metrics: dict[str, float] = {
            "rollout/success_rate": stats.successes / stats.leaves if stats.leaves else math.nan,
            "rollout/effective_ratio": stats.effective_ratio,
            "rollout/prompts_candidates": float(len(prompts)),
            "rollout/prompts_active": float(stats.active_prompts),
            "rollout/prompts_skipped": float(len(collected.skipped)),
            **{f"rollout/{k}": v for k, v in collected.engine.items()},
            **{f"rollout/{k}": v for k, v in stats.as_dict().items()
               if k not in ("effective_ratio",)},
            "budget/paper_units": stats.paper_units,
            "budget/generated_tokens": float(stats.generated_tokens),
            "budget/env_steps": float(stats.env_steps),
            **{f"predictor/{k}": v for k, v in pred.items()},
            **{f"update/{k}": v for k, v in upd.as_dict().items()},
            "update/synced": float(synced),
            "time/step_s": wall, "time/generation_s": gen_s, "time/env_s": env_s,
            "time/predictor_s": predictor_s, "time/predictor_scoring_s": scoring_s,
            "time/predictor_scoring_busy_s": scoring_busy_s,
            "time/predictor_refresh_s": t_pred - t_collect, "time/update_s": update_s,
        }
        for k in ("generation", "env", "predictor", "update"):
            metrics[f"time/{k}_share"] = metrics[f"time/{k}_s"] / wall if wall > 0 else math.nan
        for k in ("paper_units", "generated_tokens", "env_steps"):
            self.totals[k] = self.totals.get(k, 0.0) + metrics[f"budget/{k}"]
            metrics[f"budget/total_{k}"] = self.totals[k]
        self.step_count = step
        return StepResult(step=step, trees=tuple(trees), segments=tuple(segments), metrics=metrics)

    # ---------------------------------------------------------------- checkpoints
    def checkpoint_state(self) -> dict[str, Any]:
        """Everything the next step reads, as data (tensors, arrays, JSON values; see :mod:`trace_agent.checkpoint`)."""
        return {"step": self.step_count, "config": config_to_dict(self.config),
                "model": self.learner.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                "reference": None if self.reference is None else self.reference.model.state_dict(),
                "pool": self.pool.state_dict(), "totals": dict(self.totals),
                "rng": capture_rng_state(self.rng), "predictor": predictor_state(self.predictor),
                "collector": getattr(self.collector, "state_dict", lambda: None)(),
                **({} if self.warm_started is None else {"warm_start": dict(self.warm_started)})}

    def save_checkpoint(self, path: str | Path | None = None) -> Path:
        """Write :meth:`checkpoint_state` to ``path`` (default ``<out>/checkpoints/step_<k>``), atomically.

        safetensors + JSON + a sha256 manifest (:func:`~trace_agent.checkpoint.write_checkpoint`); no pickle.
        """
        final = Path(path) if path is not None else self.out_dir / "checkpoints" / f"step_{self.step_count:06d}"
        return write_checkpoint(final, self.checkpoint_state())

    def load_checkpoint(self, path: str | Path) -> int:
        """Restore a checkpoint written by :meth:`save_checkpoint` into this trainer; returns its step.

        The files are verified against the manifest and decoded as data before anything in the
        trainer changes; a checkpoint that is damaged, out of range (a step that is not a
        non-negative int, or not the one its ``step_<k>`` name gives; non-finite totals; a pool
        position past its pool), a symbolic link (or, named inside this run's directory, resolves
        outside it) or does not fit this run (other model shapes, another prompt pool) raises
        :class:`~trace_agent.checkpoint.CheckpointError` with the reason, never another error.
        """
        path = Path(path)
        state = read_checkpoint(path, root=self.out_dir if _lexically_inside(path, self.out_dir) else None)
        try:
            step = _checked_step(state.get("step"), path)
            totals = _checked_totals(state.get("totals"))
            warm = _checked_warm_start(state.get("warm_start"))
            _check_pool(state.get("pool"), len(self.pool.prompt_ids))
            _check_fits(self.learner.model.state_dict(), state["model"], "model")
            if self.reference is not None and state.get("reference") is not None:
                _check_fits(self.reference.model.state_dict(), state["reference"], "reference")
            self.learner.model.load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])
            if self.reference is not None and state.get("reference") is not None:
                self.reference.model.load_state_dict(state["reference"])
            self.pool.load_state_dict(state["pool"])
            self.totals = totals
            self.warm_started = warm
            load_predictor_state(self.predictor, state["predictor"])
            if state.get("collector") is not None:
                self.collector.load_state_dict(state["collector"])
            restore_rng_state(state["rng"], self.rng)
        except CheckpointError as exc:
            raise CheckpointError(f"{path}: {exc}") from None
        except (KeyError, TypeError, ValueError, RuntimeError, AttributeError, OverflowError, IndexError,
                RecursionError) as exc:
            raise CheckpointError(f"{path} does not fit this run: {type(exc).__name__}: {exc}") from None
        self.step_count = step
        sync_weights(self.generator, self.learner)
        return self.step_count

    def prune_checkpoints(self) -> list[str]:
        """Keep the newest ``log.keep_checkpoints`` checkpoint directories (and this step's); remove the others.

        Never follows a symbolic link: a linked ``step_<k>`` entry is unlinked (its target stays)
        and a linked ``checkpoints`` directory is not pruned at all. Never raises: an entry that
        cannot be removed is left, with one logged warning each; returns those warnings.
        """
        root = self.out_dir / "checkpoints"
        if root.is_symlink():
            return _warn([f"not pruning {root}: it is a symbolic link"])
        entries = list_checkpoints(root)
        real = [p for p in entries if not p.is_symlink()]
        keep = {*real[:self.config.log.keep_checkpoints], root / f"step_{self.step_count:06d}"}
        return _warn([msg for p in entries if p not in keep and (msg := _remove_entry(p))])

    @staticmethod
    def latest_checkpoint(out_dir: str | Path) -> Path | None:
        """The newest checkpoint under ``<out_dir>/checkpoints`` that passes verification (None: none).

        Damaged ones (truncated, edited, no manifest) and links or paths that resolve outside
        ``out_dir`` are skipped; :meth:`checkpoints` lists them all.
        """
        for path in Trainer.checkpoints(out_dir):
            try:
                verify_checkpoint(path, root=out_dir)
            except CheckpointError:
                continue
            return path
        return None

    @staticmethod
    def checkpoints(out_dir: str | Path) -> list[Path]:
        """Every ``step_<k>`` entry under ``<out_dir>/checkpoints``, newest first (unverified, links included)."""
        return list_checkpoints(Path(out_dir) / "checkpoints")

    def save_config(self) -> Path:
        return save_config(self.config, self.out_dir / "config.yaml")


def _lexically_inside(path: Path, root: Path) -> bool:
    """True when ``path`` names a place under ``root`` (compared as absolute, normalised names; links not resolved)."""
    p, r = os.path.normpath(os.path.abspath(path)), os.path.normpath(os.path.abspath(root))
    return os.path.commonpath([p, r]) == r


def _checked_step(step: Any, path: Path) -> int:
    """``step`` when it is an int in ``[0, MAX_STEP]`` equal to the step of ``path``'s ``step_<k>`` name (if it has one)."""
    if type(step) is not int or not 0 <= step <= MAX_STEP:
        raise CheckpointError(f"its step {step!r} is not an integer between 0 and {MAX_STEP}")
    named = checkpoint_step(path)
    if named is not None and named != step:
        raise CheckpointError(f"it holds step {step}, its directory name says {named}")
    return step


def _checked_totals(totals: Any) -> dict[str, float]:
    """The budget totals as ``{name: float}``; every value finite and non-negative."""
    if not isinstance(totals, dict):
        raise CheckpointError("its budget totals are not a mapping")
    out = {}
    for key, value in totals.items():
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < math.inf:
            raise CheckpointError(f"its budget total {key!r} is {value!r}, not a finite non-negative number")
        out[str(key)] = float(value)
    return out


def _checked_warm_start(record: Any) -> dict[str, float] | None:
    """The warm-up record (None: none, as in a checkpoint written before warm-ups existed); finite numbers."""
    if record is None:
        return None
    if not isinstance(record, dict):
        raise CheckpointError("its warm-up record is not a mapping")
    out = {}
    for key, value in record.items():
        if isinstance(value, bool) or not isinstance(value, int | float) or math.isinf(value):
            raise CheckpointError(f"its warm-up figure {key!r} is {value!r}, not a number")
        out[str(key)] = float(value)
    return out


def _check_pool(pool: Any, size: int) -> None:
    """Refuse a prompt-pool state whose epoch or cursor is not an int in range (a cursor past the pool never advances)."""
    if not isinstance(pool, dict):
        raise CheckpointError("its prompt pool state is not a mapping")
    epoch, cursor = pool.get("epoch"), pool.get("cursor")
    if type(epoch) is not int or not 0 <= epoch <= MAX_STEP:
        raise CheckpointError(f"its prompt pool epoch {epoch!r} is not an integer between 0 and {MAX_STEP}")
    if type(cursor) is not int or not 0 <= cursor <= size:
        raise CheckpointError(f"its prompt pool cursor {cursor!r} is not an integer between 0 and {size}")


def _remove_entry(path: Path) -> str | None:
    """Remove one checkpoint entry without following links (a link is unlinked); the warning when it cannot be."""
    try:
        if path.is_symlink() or not path.is_dir():
            path.unlink()
        else:
            shutil.rmtree(path)
    except OSError as exc:
        return f"could not remove old checkpoint {path}: {exc}"
    return None


def _warn(messages: list[str]) -> list[str]:
    for message in messages:
        _log.warning(message)
    return messages


def _check_fits(current: dict[str, Any], saved: Any, what: str) -> None:
    """Refuse a saved state dict whose names or shapes differ from the live model's (before loading anything)."""
    if not isinstance(saved, dict):
        raise CheckpointError(f"the {what} weights are not a mapping")
    missing, extra = sorted(set(current) - set(saved)), sorted(set(saved) - set(current))
    if missing or extra:
        raise CheckpointError(f"the {what} weights do not match this run's model (missing {missing[:3]}, "
                              f"unexpected {extra[:3]})")
    for name, tensor in current.items():
        shape = tuple(getattr(saved[name], "shape", ()))
        if shape != tuple(tensor.shape):
            raise CheckpointError(f"the {what} weight {name} has shape {shape}, this run's model {tuple(tensor.shape)}")
