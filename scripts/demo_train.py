"""`make demo`: a real TRACE training run of the offline demo policy on PythonMath-v0, on a CPU, in minutes.

    .venv/bin/python scripts/demo_train.py                    # build the demo policy if needed, train, report
    .venv/bin/python scripts/demo_train.py --steps 4 --eval-tasks 20 --out runs/demo-short
    .venv/bin/python scripts/demo_train.py --compare trace,grpo --seeds 0,1,2 --out runs/compare   # equal budget

Steps: (1) load the shipped demo policy (``trace_agent/demo/assets/demo_policy``; or
``--policy-dir DIR``, built there first when missing); (2) measure its held-out success on the
test split; (3) train it with TRACE (predictor-driven root and prefix allocation) and
the TreeRPO objective on the train split; (4) measure held-out success again; (5) print
a short report: success before/after with the number of held-out tasks and episodes,
the effective ratio of every step, the predictor's share of wall-clock, where the
plots and metrics are.

``--compare A,B --seeds 0,1,2`` trains the same demo policy with each strategy and seed at
equal budget (the config's (M, N); a flat strategy such as GRPO spends the same paper
units as M + M*N/2 root rollouts), evaluates the shared starting policy once and every
trained policy on the same held-out episodes, and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trace_agent.budget import Budget
from trace_agent.config import (
    EvalConfig,
    LogConfig,
    ObjectiveConfig,
    OptimConfig,
    PolicyConfig,
    PredictorSettings,
    RolloutSettings,
    SamplingSettings,
    TrainConfig,
)
from trace_agent.config_io import apply_overrides, config_from_dict, config_to_dict


def demo_config(args: argparse.Namespace) -> TrainConfig:
    """The demo's settings (every one overridable with --set)."""
    config = TrainConfig(
        env_id="trace_envs/PythonMath-v0",
        steps=args.steps,
        seed=args.seed,
        out_dir=args.out,
        policy=PolicyConfig(kind="demo", path=args.policy_dir, demo_build_steps=args.build_steps, max_batch_size=48),
        sampling=SamplingSettings(max_new_tokens=160, temperature=1.0, max_turns=3),
        rollout=RolloutSettings(strategy=args.strategy, prompts_per_step=48,
                                budget=Budget(roots=48, continuations_per_root=1, group_size=4)),
        objective=ObjectiveConfig(name=args.objective, lone_child="inherit", clip_low=0.2, clip_high=0.28),
        optim=OptimConfig(lr=args.lr, epochs=1, minibatches=2, micro_batch=8, max_grad_norm=1.0),
        predictor=PredictorSettings(kind="policy-states"),  # a frozen copy of the starting policy reads the contexts
        eval=EvalConfig(split="test", tasks=args.eval_tasks, samples=args.eval_samples, temperature=1.0,
                        every=args.eval_every),
        log=LogConfig(checkpoint_every=1, keep_checkpoints=1, progress=not args.no_progress),
    )
    if args.overrides:
        config = config_from_dict(TrainConfig, apply_overrides(config_to_dict(config), args.overrides))
    return config


def build_parser() -> argparse.ArgumentParser:
    """The demo's command line (its defaults are docs/configs/demo.yaml's settings)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="runs/demo", help="run directory")
    parser.add_argument("--policy-dir", default="",
                        help="demo policy dir (default: the shipped one; a missing dir is built first)")
    parser.add_argument("--build-steps", type=int, default=None, help="demo-policy warm-start steps if it is built")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--strategy", default="trace")
    parser.add_argument("--objective", default="treerpo")
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--eval-tasks", type=int, default=100, help="held-out tasks (the test split has 100)")
    parser.add_argument("--eval-samples", type=int, default=3)
    parser.add_argument("--eval-every", type=int, default=0, help="also evaluate every N steps (0: before/after only)")
    parser.add_argument("--resume", action="store_true", help="continue a killed run from its checkpoint")
    parser.add_argument("--no-progress", action="store_true")
    parser.add_argument("--compare", help="comma-separated strategies to compare at equal budget (e.g. trace,grpo)")
    parser.add_argument("--seeds", default="0,1,2", help="seeds of --compare")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.FIELD=VALUE")
    parser.add_argument("--before-from", metavar="RUN_DIR",
                        help="reuse the held-out evaluation before training of RUN_DIR, a finished demo run of the same "
                             "commit with the same starting policy, env, sampling and eval settings (checked): that "
                             "evaluation is deterministic there, so the other seeds of a seed table need not repeat it")
    return parser


def reused_before(run_dir: Path, config: TrainConfig):
    """The evaluation before training of the demo run in ``run_dir``, when it is the one ``config`` would make.

    Same env, sampling and eval sections, same policy settings and the same policy weights (sha256 of the
    policy directory's files); anything else exits with what differs.
    """
    import hashlib
    import json

    from trace_agent.config_io import load_config
    from trace_agent.evaluation import EvalResult

    other = load_config(run_dir / "config.yaml")
    differ = [name for name in ("env_id", "env_kwargs", "sampling", "eval")
              if getattr(other, name) != getattr(config, name)]
    if replace(other.policy, path="") != replace(config.policy, path=""):
        differ.append("policy")

    def digest(path: str) -> str:
        h = hashlib.sha256()
        for f in sorted(Path(path).glob("*")):
            if f.is_file():
                h.update(f.name.encode() + b"\0" + f.read_bytes())
        return h.hexdigest()

    if "policy" not in differ and digest(other.policy.path) != digest(config.policy.path):
        differ.append("policy weights")
    if differ:
        raise SystemExit(f"--before-from {run_dir}: its {', '.join(differ)} differ from this run's: evaluate before "
                         f"training (leave --before-from out)")
    before = json.loads((run_dir / "summary.json").read_text()).get("before")
    if not before or not before.get("per_task"):
        raise SystemExit(f"--before-from {run_dir}: it has no evaluation before training with per-task rates")
    return EvalResult(**before)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

    from trace_agent.run import run_training

    t0 = time.perf_counter()
    config = demo_config(args)
    from trace_agent.demo.shipped import ensure_demo_policy

    policy_dir = ensure_demo_policy(config.policy.path, env_id=config.env_id, seed=args.seed, steps=args.build_steps,
                                    log=lambda m: print(f"  {m}", flush=True))
    print(f"demo policy: {policy_dir}", flush=True)
    t_build = time.perf_counter() - t0
    config = replace(config, policy=replace(config.policy, path=str(policy_dir), demo_build_steps=None))
    if args.compare:
        return compare(config, [x.strip() for x in args.compare.split(",")],
                       [int(x) for x in args.seeds.split(",")])
    before = reused_before(Path(args.before_from), config) if args.before_from else None
    report = run_training(config, resume=args.resume, evaluate="after" if before else True,
                          log=lambda m: print(m, flush=True))
    total = time.perf_counter() - t0
    if before is not None:
        add_before(report, before, config)
        print(f"held-out success before: {before.success:.3f} ± {before.success_se:.3f} (reused from "
              f"{args.before_from})", flush=True)

    from trace_agent.run_report import print_run_report

    print_run_report(report.out_dir)
    print(f"time from start: {total:.0f}s ({t_build:.0f}s finding the demo policy, {report.wall_seconds:.0f}s the run "
          f"above)\nmetrics: {Path(report.out_dir) / 'metrics.jsonl'} (TensorBoard: {Path(report.out_dir) / 'tb'})\n"
          f"report: {Path(report.out_dir) / 'run_report.json'}\ntrained policy: {report.policy_dir}")
    return 0


def add_before(report, before, config: TrainConfig) -> None:
    """Rewrite the run's run_report.json with ``before`` (reused) as its evaluation before training."""
    from trace_agent.metrics import read_metrics
    from trace_agent.run_report import REPORT_FILE, build_run_report

    out = Path(report.out_dir)
    records = [{"step": 0, "eval/success": before.success, "eval/success_se": before.success_se},
               *read_metrics(out / "metrics.jsonl")]  # no eval/seconds: this run spent none on it
    (out / REPORT_FILE).write_text(build_run_report(
        replace(report, before=before), records, setup_s=report.setup_seconds, samples=config.eval.samples,
        title=f"{config.rollout.strategy} / {config.objective.name} on {config.env_id}").to_json())


def compare(config: TrainConfig, strategies: list[str], seeds: list[int]) -> int:
    """Train each (strategy, seed) from the same policy at equal budget; write compare.json/.md, print the table.

    The comparison itself is :func:`trace_agent.lab.compare.compare_training` (any env; also behind
    ``scripts/paper_claims.py train``).
    """
    import shlex

    from trace_agent.lab.compare import compare_training

    command = " ".join(["scripts/demo_train.py", *(shlex.quote(a) for a in sys.argv[1:])])
    result = compare_training(config, strategies, seeds, log=lambda m: print(m, flush=True), command=command)
    result.write(config.out_dir)
    print("\n" + result.to_markdown())
    return 0


if __name__ == "__main__":
    sys.exit(main())
