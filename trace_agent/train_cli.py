"""``trace-gym train`` and ``trace-gym eval``; :func:`run_training` and
:func:`~trace_agent.evaluation.evaluate_heldout` behind them.

::

    trace-gym train --env trace_envs/PythonMath-v0 --policy demo --strategy trace --objective treerpo \\
        --steps 10 --out runs/trace
    trace-gym train --config docs/configs/demo.yaml --set optim.lr=1e-4 --set rollout.strategy=grpo
    trace-gym train --config docs/configs/wiki.yaml --strategy mypkg.branching:EntropyBranching --out runs/wiki
    trace-gym train --resume runs/trace            # continue a stopped run with its own config.yaml
    trace-gym train --resume runs/trace --steps 20 # ... and train it longer
    trace-gym train --config docs/configs/qwen3_gpu.yaml --preflight   # check prerequisites, then exit
    trace-gym eval --policy hf --policy-path runs/trace/policy --tasks 50 --samples 4
    trace-gym eval --policy hf --policy-path runs/trace/policy --transcripts runs/trace/eval.jsonl

A run directory holds ``config.yaml``, ``metrics.jsonl`` (one line per step, step 0 =
before training), TensorBoard events (``tb/``: scalars, tree pictures, transcripts),
``checkpoints/step_<k>/`` (safetensors + JSON + a sha256 manifest), ``trees/``, the final
policy (``policy/``, loadable with ``HFPolicy.from_pretrained``), ``learning_curves.png``,
``summary.json`` and ``run_report.json`` (:mod:`trace_agent.run_report`: the report ``trace-gym train``
ends with). ``--resume DIR`` refuses a conflicting config and names the
differences; a fresh run refuses a directory that holds a run (``--overwrite`` replaces it).
Splits: every env's ``train`` split trains and its ``test`` split is held out
(:func:`trace_agent.env_factory.split_kwargs`).

Demo settings: without ``--config`` (and without ``--resume``), a run of the demo policy
(``policy.kind: demo``, the default) on an env with a shipped demo config starts from that config
(:data:`DEMO_CONFIGS`: ``docs/configs/demo.yaml``, ``wiki_demo.yaml``, ``bfcl_demo.yaml``: learning
rate, rollout shape, turn and token limits, held-out sample), and the flags and ``--set`` overrides
apply on top; one line on stderr names the config applied. ``--config`` replaces it.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Literal

from trace_agent.config import TrainConfig
from trace_agent.config_io import config_to_dict, load_config
from trace_agent.evaluation import EvalResult, evaluate_heldout
from trace_agent.options import BATCHING, ENV_BACKENDS, OBJECTIVES, POLICY_KINDS
from trace_agent.strategies import STRATEGY_NAMES

__all__ = [
    "CONFIG_DIR",
    "DEMO_CONFIGS",
    "TrainReport",
    "run_training",
    "config_from_args",
    "add_train_parser",
    "add_eval_parser",
    "demo_config_path",
]


#: The demo policy's settings per env: file names under ``docs/configs/`` (see the module docstring).
DEMO_CONFIGS: dict[str, str] = {
    "trace_envs/PythonMath-v0": "demo.yaml",
    "trace_envs/WikiQA-v0": "wiki_demo.yaml",
    "trace_envs/BFCL-v0": "bfcl_demo.yaml",
}

#: Where :data:`DEMO_CONFIGS` are read from (the source tree's ``docs/configs``).
CONFIG_DIR = Path(__file__).resolve().parents[1] / "docs" / "configs"


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
    Ctrl-C raises :class:`~trace_agent.rundir.TrainingStopped`, which names the last completed
    step, the last checkpoint and the command that resumes.
    """
    from tqdm import tqdm

    from trace_agent.config_io import save_config
    from trace_agent.env_factory import check_env_id
    from trace_agent.metrics import MetricsLogger, plot_learning_curves, read_metrics
    from trace_agent.preflight import policy_dir, policy_env_ids, write_policy_meta
    from trace_agent.rundir import TrainingStopped, config_differences
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
            bar = tqdm(range(start, config.steps), initial=start, total=config.steps, desc="train", unit="step",
                       disable=not progress, dynamic_ncols=True)
            for _ in bar:
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
                    trainer.save_checkpoint()
                    trainer.prune_checkpoints()
                    last_checkpoint = k
            bar.close()
            if trainer.step_count and last_checkpoint != trainer.step_count:
                trainer.save_checkpoint()
                trainer.prune_checkpoints()
                last_checkpoint = trainer.step_count
            done = any(r.get("step") == trainer.step_count and "eval/success" in r for r in earlier)
            if evaluate and not done:
                after = evaluate_heldout(trainer.generator, config, progress=progress)
                logger.log(trainer.step_count, _eval_metrics(after))
                log(f"held-out success after: {after.success:.3f} ± {after.success_se:.3f} ({after.tasks} tasks x "
                    f"{after.samples} samples, {after.seconds:.0f}s)")
        except KeyboardInterrupt:
            raise TrainingStopped(out_dir=out, step=trainer.step_count, checkpoint_step=last_checkpoint) from None
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


# --------------------------------------------------------------------------------------------------
# command line


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="YAML config (see docs/configs/); flags and --set override it")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.FIELD=VALUE",
                        help="override any config field, e.g. --set optim.lr=1e-4 (repeatable; values are YAML)")
    parser.add_argument("--env", help="env id (config: env_id)")
    parser.add_argument("--policy", choices=POLICY_KINDS,
                        help="policy kind (config: policy.kind); demo (the default) starts from the env's demo "
                             "config when no --config is given")
    parser.add_argument("--policy-path", help="checkpoint directory or hub name (config: policy.path)")
    parser.add_argument("--device", help="torch device of the policy (config: policy.device)")
    parser.add_argument("--seed", type=int, help="run seed (config: seed)")
    parser.add_argument("--tasks", type=int, help="held-out tasks to evaluate (config: eval.tasks)")
    parser.add_argument("--samples", type=int, help="episodes per held-out task (config: eval.samples)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    parser.add_argument("--preflight", action="store_true",
                        help="check the prerequisites (env, splits, model paths offline, CUDA, vLLM) and exit")


def _flags(args: argparse.Namespace) -> list[str]:
    flags: list[str] = []

    def put(key: str, value: Any) -> None:
        if value is not None:
            flags.append(f"{key}={json.dumps(value) if isinstance(value, str) else value}")

    put("env_id", args.env)
    put("policy.kind", args.policy)
    put("policy.path", args.policy_path)
    put("policy.device", args.device)
    put("seed", args.seed)
    put("eval.tasks", args.tasks)
    put("eval.samples", args.samples)
    for name, key in (("strategy", "rollout.strategy"), ("objective", "objective.name"), ("steps", "steps"),
                      ("out", "out_dir"), ("lr", "optim.lr"), ("split", "eval.split")):
        put(key, getattr(args, name, None))
    for name, key in (("backend", "rollout.backend"), ("ray_workers", "rollout.ray.workers"),
                      ("ray_address", "rollout.ray.address"), ("batching", "rollout.batching")):
        put(key, getattr(args, name, None))
    if getattr(args, "no_progress", False):
        flags.append("log.progress=false")
    return flags


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    """The run's config: ``--config`` YAML, then the named flags, then ``--set`` overrides.

    With ``--resume DIR`` the base is ``DIR/config.yaml`` (see :func:`trace_agent.rundir.resume_config`):
    flags and overrides given beside it must agree with it (``--steps`` may grow).
    """
    from trace_agent.rundir import RunDirError, resume_config

    flags = [*_flags(args), *args.overrides]
    resume = getattr(args, "resume", None)
    if resume is None:
        config = load_config(args.config, flags)
        demo = demo_config_path(config) if args.config is None else None
        if demo is None:
            return config
        import sys

        if not demo.is_file():
            print(f"trace-gym: the demo policy's settings for {config.env_id} are in docs/configs/{demo.name}, "
                  f"not found here: pass --config with a copy of it", file=sys.stderr, flush=True)
            return config
        print(f"trace-gym: using the demo policy's settings for {config.env_id}: {_shown_path(demo)} "
              f"(flags and --set apply on top; --config replaces it)", file=sys.stderr, flush=True)
        return load_config(demo, flags)
    run_dir = resume or args.out
    if not run_dir:
        raise RunDirError("--resume needs the run directory: trace-gym train --resume runs/NAME")
    if args.out and resume and Path(args.out).resolve() != Path(resume).resolve():
        raise RunDirError(f"--out {args.out} and --resume {resume} name different runs: give only --resume {resume}")
    # a module:attr strategy the command line itself names may be imported; one only the run dir names may not
    named = tuple(f.split("=", 1)[1] for f in flags if f.startswith("rollout.strategy="))
    saved = resume_config(run_dir, allow_code=named)
    extra = [f for f in flags if not f.startswith("out_dir=") and f != "log.progress=false"]
    if args.config is None and not extra:
        return TrainConfig(**{**saved.__dict__, "log": replace(saved.log, progress=saved.log.progress
                                                                and not args.no_progress)})
    given = load_config(args.config, flags, base=None if args.config else saved)
    return resume_config(run_dir, given)


def demo_config_path(config: TrainConfig) -> Path | None:
    """The demo config (:data:`DEMO_CONFIGS`) a run of ``config`` starts from, or None.

    Only a run of the demo policy (``policy.kind == "demo"``) on an env that has one gets one; the
    path may not exist outside a source checkout.
    """
    if config.policy.kind != "demo" or config.env_id not in DEMO_CONFIGS:
        return None
    return CONFIG_DIR / DEMO_CONFIGS[config.env_id]


def _shown_path(path: Path) -> str:
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def _preflight(args: argparse.Namespace, config: TrainConfig, *, train: bool) -> int | None:
    """Run the checks; ``--preflight`` prints them all and returns the exit code, else raise on the first failure."""
    import sys

    from trace_agent.preflight import format_checks, preflight, require

    checks = preflight(config, train=train)
    if args.preflight:
        print(format_checks(checks))
        return 0 if all(c.ok or not c.fatal for c in checks) else 1
    require(checks, warn=lambda message: print(message, file=sys.stderr, flush=True))
    return None


def _train_main(args: argparse.Namespace) -> int:
    from trace_agent.rundir import check_fresh, clear_run

    config = config_from_args(args)
    code = _preflight(args, config, train=True)
    if code is not None:
        return code
    resume = args.resume is not None
    if not resume:
        if args.overwrite:
            clear_run(config.out_dir)
        check_fresh(config.out_dir)
    report = run_training(config, resume=resume, evaluate=not args.no_eval, log=lambda m: print(m, flush=True))
    from trace_agent.run_report import print_run_report

    print_run_report(report.out_dir)
    print(f"metrics: {Path(report.out_dir) / 'metrics.jsonl'}\npolicy: {report.policy_dir}\n"
          f"trees: trace-gym show-tree {report.out_dir} --out {Path(report.out_dir) / 'tree_pictures'}")
    return 0


def _eval_main(args: argparse.Namespace) -> int:
    from trace_agent.policy.base import close_generator
    from trace_agent.wiring import build_policies

    config = config_from_args(args)
    code = _preflight(args, config, train=False)
    if code is not None:
        return code
    learner, generator = build_policies(config.policy, seed=config.seed, env_id=config.env_id)
    progress = not args.no_progress
    try:
        if args.transcripts:
            path = Path(args.transcripts)
            path.parent.mkdir(parents=True, exist_ok=True)
            with path.open("w") as f:
                def write(task_id: str, sample: int, reward: float, messages: list[dict[str, Any]]) -> None:
                    f.write(json.dumps({"task_id": task_id, "sample": sample, "reward": reward,
                                        "messages": messages}, ensure_ascii=False, default=str) + "\n")

                result = evaluate_heldout(generator, config, seed=args.eval_seed, on_episode=write,
                                          progress=progress)
        else:
            result = evaluate_heldout(generator, config, seed=args.eval_seed, progress=progress)
    finally:
        close_generator(generator, learner)  # a vLLM engine gives its memory back when the evaluation ends
    print(json.dumps({k: v for k, v in asdict(result).items() if k != "per_task"} if not args.per_task
                     else asdict(result), indent=1))
    return 0


def add_train_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``train`` to a ``trace-gym`` subparsers object."""
    p = subparsers.add_parser("train", help="train a policy with TRACE / GRPO / PCL / TreePO rollouts",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    _common(p)
    p.add_argument("--strategy", help=f"rollout strategy: {', '.join(STRATEGY_NAMES)} or module:attribute "
                                      f"(config: rollout.strategy)")
    p.add_argument("--objective", choices=OBJECTIVES, help="policy objective (config: objective.name)")
    p.add_argument("--steps", type=int, help="training steps (config: steps)")
    p.add_argument("--lr", type=float, help="learning rate (config: optim.lr)")
    p.add_argument("--out", help="run directory (config: out_dir)")
    p.add_argument("--resume", nargs="?", const="", default=None, metavar="DIR",
                   help="continue the run in DIR (default: --out) from its newest valid checkpoint, with its "
                        "config.yaml")
    p.add_argument("--overwrite", action="store_true", help="replace the run already in --out")
    p.add_argument("--backend", choices=ENV_BACKENDS, help="where envs run (config: rollout.backend)")
    p.add_argument("--ray-workers", type=int, help="Ray env actors (config: rollout.ray.workers)")
    p.add_argument("--ray-address", help="existing Ray cluster; default: a local one (config: rollout.ray.address)")
    p.add_argument("--batching", choices=BATCHING, help="engine batching (config: rollout.batching)")
    p.add_argument("--no-eval", action="store_true", help="skip held-out evaluation before and after")
    p.set_defaults(func=_train_main)
    return p


def add_eval_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``eval`` to a ``trace-gym`` subparsers object."""
    p = subparsers.add_parser("eval", help="held-out success of a policy on an env's test split")
    _common(p)
    p.add_argument("--split", help="task split to evaluate (config: eval.split)")
    p.add_argument("--eval-seed", type=int, default=12345, help="seed of the evaluation episodes")
    p.add_argument("--per-task", action="store_true", help="print every task's success rate")
    p.add_argument("--transcripts", metavar="FILE.jsonl",
                   help="write every episode (task id, sample, reward, chat messages) to this JSONL file")
    p.set_defaults(func=_eval_main)
    return p


def main(argv: Sequence[str] | None = None) -> int:  # pragma: no cover - `trace-gym` is the entry point
    from trace_agent.cli import main as cli_main

    return cli_main(argv)
