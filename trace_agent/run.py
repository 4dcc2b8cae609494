"""A training run end to end: :func:`run_training`, the loop over :meth:`~trace_agent.trainer.Trainer.step`.

``run_training(config)`` evaluates the starting policy on the env's held-out split, warms the predictor up
(``predictor.warm_start_tasks``), takes ``config.steps`` steps (held-out evaluation every ``eval.every``
steps, trees, TensorBoard samples and checkpoints at their cadences), evaluates again, saves the final
policy and its learning curves, and returns a :class:`TrainReport` (also written to ``summary.json``).
``trace-gym train`` (:mod:`trace_agent.train_cli`) parses its arguments into a config and calls it;
:func:`~trace_agent.lab.compare.compare_training` and the paper's training claims call it once per run.

The run directory (``config.out_dir``) holds ``config.yaml``, ``metrics.jsonl`` (one line per step,
step 0 = before training), TensorBoard events (``tb/``), ``checkpoints/step_<k>/`` (safetensors + JSON +
a sha256 manifest, :mod:`trace_agent.checkpoint`), ``trees/``, the final policy (``policy/``, loadable
with ``HFPolicy.from_pretrained``), ``learning_curves.png``, ``summary.json`` and ``run_report.json`` (:mod:`trace_agent.run_report`). One process writes a
run directory at a time (``run.lock``, :func:`~trace_agent.rundir.lock_run_dir`); Ctrl-C, SIGTERM and
SIGHUP stop a run with :class:`~trace_agent.rundir.TrainingStopped`, which names the step to resume from.
"""

from __future__ import annotations

import json
import math
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from trace_agent.config import TrainConfig
from trace_agent.config_io import config_to_dict, load_config
from trace_agent.evaluation import EvalResult, evaluate_heldout

__all__ = ["TrainReport", "run_training"]


@dataclass(frozen=True, kw_only=True)
class TrainReport:
    """What :func:`run_training` did (also written to ``<out>/summary.json``)."""

    out_dir: str
    steps: int
    before: EvalResult | None
    after: EvalResult | None
    effective_ratio: tuple[float, ...]
    train_success: tuple[float, ...]
    paper_units: float
    generated_tokens: float
    predictor_share: float
    wall_seconds: float
    plot: str
    policy_dir: str
    setup_seconds: float = 0.0

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1, default=float)


def _eval_metrics(result: EvalResult) -> dict[str, float]:
    return {"eval/success": result.success, "eval/success_se": result.success_se, "eval/solved_tasks": float(result.solved_tasks),
            "eval/tasks": float(result.tasks), "eval/episodes": float(result.episodes), "eval/seconds": result.seconds}


def _resume(trainer: Any, out: Path, log: Callable[[str], None]) -> tuple[int, Path | None]:
    """Load the newest checkpoint that verifies and fits; damaged ones are reported and skipped."""
    from trace_agent.checkpoint import CheckpointError
    from trace_agent.trainer import Trainer

    found = Trainer.checkpoints(out)
    refused = []
    for ckpt in found:
        try:
            start = trainer.load_checkpoint(ckpt)
        except CheckpointError as exc:
            refused.append(str(exc))
            log(f"refused checkpoint {exc}; trying an older one")
            continue
        log(f"resumed from {ckpt} (step {start})")
        return start, ckpt
    if refused:
        raise CheckpointError(f"no usable checkpoint in {out / 'checkpoints'} ({'; '.join(refused)})")
    log(f"no checkpoint in {out} yet: starting at step 0 with its config")
    return 0, None


def _logged_eval(records: Sequence[dict[str, Any]], step: int, config: TrainConfig) -> EvalResult | None:
    """The held-out result logged at ``step`` of a resumed run (per-task rates are not kept in the metrics)."""
    r = next((r for r in records if r.get("step") == step and r.get("eval/success") is not None), None)
    if r is None:
        return None
    return EvalResult(success=float(r["eval/success"]), success_se=float(r.get("eval/success_se") or 0.0),
                      tasks=int(r.get("eval/tasks") or 0), samples=config.eval.samples,
                      episodes=int(r.get("eval/episodes") or 0), solved_tasks=int(r.get("eval/solved_tasks") or 0),
                      seconds=float(r.get("eval/seconds") or 0.0), per_task={})


def _log_samples(logger: Any, trees: Sequence[Any], step: int) -> None:
    """A transcript (best and worst leaf) and a picture of one tree of the step, to TensorBoard / W&B."""
    if not trees:
        return
    import tempfile

    from trace_agent.plotting import plot_tree, tree_transcript

    tree = next((t for t in trees if t.is_mixed()), trees[0])
    logger.log_text("samples/transcript", tree_transcript(tree), step)
    with tempfile.TemporaryDirectory() as tmp:
        logger.log_image("samples/tree", plot_tree(tree, Path(tmp) / "tree.png", dpi=70), step)


def run_training(config: TrainConfig, *, resume: bool = False, evaluate: bool | Literal["after"] = True,
                 log: Callable[[str], None] = print) -> TrainReport:
    """Train ``config`` end to end: held-out eval, ``steps`` steps (checkpointed), eval, final policy, plots.

    With ``resume`` the newest checkpoint under ``config.out_dir`` that verifies is loaded
    (damaged ones are reported and skipped: the run falls back to the one before) and the run
    continues from its step; metrics lines after that step are dropped and rewritten, and an
    evaluation already logged for the final step is not repeated. ``evaluate="after"`` skips the
    evaluation before training (e.g. when comparing runs that start from the same policy).
    Ctrl-C (SIGINT), SIGTERM and SIGHUP raise :class:`~trace_agent.rundir.TrainingStopped`, which
    names the last completed step, the last checkpoint and the command that resumes.

    The run directory is locked for the whole call (:func:`~trace_agent.rundir.lock_run_dir`):
    another process training or resuming there raises :class:`~trace_agent.errors.RunDirError`
    before anything is written.
    """
    from trace_agent.rundir import lock_run_dir, stop_signals

    with lock_run_dir(config.out_dir), stop_signals() as stops:
        return _train(config, resume=resume, evaluate=evaluate, log=log, stops=stops)


def _train(config: TrainConfig, *, resume: bool, evaluate: bool | Literal["after"], log: Callable[[str], None],
           stops: Sequence[int]) -> TrainReport:
    """:func:`run_training` under its lock; ``stops`` collects the stop signals (SIGINT, SIGTERM, SIGHUP) that arrived."""
    from tqdm import tqdm

    from trace_agent.config_io import save_config
    from trace_agent.env_factory import check_env_id
    from trace_agent.metrics import MetricsLogger, plot_learning_curves, read_metrics
    from trace_agent.preflight import policy_dir, policy_env_ids, write_policy_meta
    from trace_agent.rundir import TrainingStopped, config_differences, deferred_stops, raise_if_stopped
    from trace_agent.trainer import Trainer

    check_env_id(config.env_id)
    t_start = time.perf_counter()
    out = Path(config.out_dir)
    trainer = Trainer(config)
    start, ckpt = _resume(trainer, out, log) if resume else (0, None)
    setup_seconds = time.perf_counter() - t_start
    saved_path = out / "config.yaml"
    if ckpt is None or not saved_path.is_file():
        trainer.save_config()
    else:
        diffs = config_differences(load_config(saved_path), config, ignore=("out_dir",))
        if diffs:
            save_config(config, saved_path)
            log(f"config.yaml updated: {'; '.join(diffs)}")
    logger = MetricsLogger(out, tensorboard=config.log.tensorboard, wandb=config.log.wandb,
                           config=config_to_dict(config), resume_step=start if ckpt is not None else None)
    earlier = read_metrics(logger.path)
    before: EvalResult | None = _logged_eval(earlier, 0, config) if start else None
    after: EvalResult | None = None
    progress = config.log.progress
    last_checkpoint = start if ckpt is not None else None
    try:
        try:
            if evaluate is True and start == 0:
                before = evaluate_heldout(trainer.generator, config, progress=progress)
                logger.log(0, _eval_metrics(before))
                log(f"held-out success before: {before.success:.3f} ± {before.success_se:.3f} ({before.tasks} tasks x "
                    f"{before.samples} samples, {before.seconds:.0f}s)")
            if warm := trainer.warm_start():  # predictor.warm_start_tasks: once, before step 1 (not on resume)
                logger.log(0, warm.metrics)
            bar = tqdm(range(start, config.steps), initial=start, total=config.steps, desc="train", unit="step",
                       disable=not progress, dynamic_ncols=True)
            for _ in bar:
                raise_if_stopped(stops)  # a stop whose KeyboardInterrupt a finalizer swallowed ends the run here
                result = trainer.step()
                metrics = dict(result.metrics)
                k = result.step
                if evaluate and config.eval.every and k % config.eval.every == 0 and k < config.steps:
                    metrics.update(_eval_metrics(evaluate_heldout(trainer.generator, config, progress=progress)))
                if config.log.save_trees:
                    from trace_agent.tree_io import save_jsonl

                    save_jsonl(result.trees, out / "trees" / f"step_{k:06d}.jsonl")
                logger.log(k, metrics)
                if config.log.samples_every and k % config.log.samples_every == 0:
                    _log_samples(logger, result.trees, k)
                bar.set_postfix(success=f"{metrics['rollout/success_rate']:.2f}",
                                eff=f"{metrics['rollout/effective_ratio']:.2f}", loss=f"{metrics['update/loss']:.3f}")
                if config.log.checkpoint_every and k % config.log.checkpoint_every == 0:
                    with deferred_stops():  # a stop waits for the checkpoint it would cut in half
                        trainer.save_checkpoint()
                        trainer.prune_checkpoints()
                        last_checkpoint = k
            bar.close()
            if trainer.step_count and last_checkpoint != trainer.step_count:
                with deferred_stops():
                    trainer.save_checkpoint()
                    trainer.prune_checkpoints()
                    last_checkpoint = trainer.step_count
            done = any(r.get("step") == trainer.step_count and "eval/success" in r for r in earlier)
            if evaluate and not done:
                raise_if_stopped(stops)
                after = evaluate_heldout(trainer.generator, config, progress=progress)
                logger.log(trainer.step_count, _eval_metrics(after))
                log(f"held-out success after: {after.success:.3f} ± {after.success_se:.3f} ({after.tasks} tasks x "
                    f"{after.samples} samples, {after.seconds:.0f}s)")
        except KeyboardInterrupt:
            raise TrainingStopped(out_dir=out, step=trainer.step_count, checkpoint_step=last_checkpoint,
                                  signum=stops[-1] if stops else signal.SIGINT) from None
    finally:
        logger.close()
        trainer.close()  # the collector and the generator it built (vLLM: its memory comes back now)
    policy_out = out / "policy"
    trainer.learner.save_pretrained(policy_out)  # model, tokenizer and trace_policy.json (e.g. BFCL's tool_detail)
    write_policy_meta(policy_out, env_ids=[*(policy_env_ids(policy_dir(config)) or ()), config.env_id],
                      trained_by="trace-gym train", run=str(out), steps=trainer.step_count)
    records = read_metrics(logger.path)
    plot = plot_learning_curves(records, out / "learning_curves.png",
                                title=f"{config.rollout.strategy} / {config.objective.name} on {config.env_id}")
    steps = [r for r in records if "rollout/effective_ratio" in r]

    def series(key: str) -> tuple[float, ...]:
        return tuple(math.nan if r.get(key) is None else float(r[key]) for r in steps)

    shares = [r["time/predictor_s"] for r in steps if r.get("time/predictor_s") is not None]
    walls = [r["time/step_s"] for r in steps if r.get("time/step_s") is not None]
    report = TrainReport(
        out_dir=str(out), steps=trainer.step_count, before=before, after=after,
        effective_ratio=series("rollout/effective_ratio"), train_success=series("rollout/success_rate"),
        paper_units=trainer.totals.get("paper_units", 0.0), generated_tokens=trainer.totals.get("generated_tokens", 0.0),
        predictor_share=sum(shares) / sum(walls) if walls and sum(walls) > 0 else math.nan,
        wall_seconds=time.perf_counter() - t_start, plot=str(plot), policy_dir=str(policy_out),
        setup_seconds=setup_seconds,
    )
    (out / "summary.json").write_text(report.to_json())
    from trace_agent.run_report import build_run_report

    (out / "run_report.json").write_text(build_run_report(
        report, records, title=f"{config.rollout.strategy} / {config.objective.name} on {config.env_id}",
        setup_s=setup_seconds, samples=config.eval.samples).to_json())
    return report
