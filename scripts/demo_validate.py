"""Choose the demo's settings on a validation slice of the train split, never on the held-out test tasks.

    python scripts/demo_validate.py --seed 100 --every 4 --out runs/demo-validate/base
    python scripts/demo_validate.py --seed 100 --every 4 --set optim.lr=1e-4 --out runs/demo-validate/lr1e-4

The train split (300 PythonMath-v0 tasks) is cut in two: a validation slice of ``--val-tasks`` tasks
spread over the task families (:func:`trace_envs.tasks.splits.stratified_ids`) and the rest, the
only prompts trained on. The demo config (``docs/configs/demo.yaml``, with ``--set`` overrides) is
trained for its steps with no test-split evaluation; every ``--every`` steps (and at the end) the
policy plays ``eval.samples`` episodes of each validation task with the evaluator's seeding, and
the change from step 0 is reported as :mod:`trace_agent.run_report` reports a run (paired
standard error over tasks, tasks solved at least once, newly solved / lost). The step-0
evaluation of the shipped policy is the same for every candidate and seed: it is computed once
and kept in ``<out>/../step0_<val-tasks>x<samples>.json``. Writes ``<out>/validation.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--seed", type=int, default=100)
    parser.add_argument("--every", type=int, default=4, help="validate every N steps (and at the end)")
    parser.add_argument("--val-tasks", type=int, default=100)
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.FIELD=VALUE")
    args = parser.parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

    from trace_agent.config_io import load_config
    from trace_agent.env_factory import make_env_factory
    from trace_agent.evaluation import EvalResult, evaluate
    from trace_agent.pool import PromptPool
    from trace_agent.run_report import heldout_change
    from trace_agent.trainer import Trainer
    from trace_envs.tasks.splits import stratified_ids

    config = load_config(ROOT / "docs" / "configs" / "demo.yaml",
                         [*args.overrides, f"seed={args.seed}", f"out_dir={json.dumps(str(args.out))}",
                          "log.progress=false", "log.tensorboard=false"])
    make = make_env_factory(config.env_id, config.train_split, max_turns=config.sampling.max_turns,
                            env_kwargs=config.env_kwargs)
    env = make()
    try:
        every_id = list(env.tasks.ids())
        val_ids = stratified_ids(env.tasks, args.val_tasks)
    finally:
        env.close()
    train_ids = [t for t in every_id if t not in set(val_ids)]
    sampling = replace(config.sampling.params, temperature=config.eval.temperature)

    def validate(policy) -> EvalResult:
        t0 = time.perf_counter()
        rewards = evaluate(policy, make, val_ids, samples=config.eval.samples, sampling=sampling, seed=12345)
        return EvalResult.of(rewards, samples=config.eval.samples, seconds=time.perf_counter() - t0)

    args.out.mkdir(parents=True, exist_ok=True)
    trainer = Trainer(config)
    trainer.pool = PromptPool(train_ids, seed=config.seed)
    cache = args.out.parent / f"step0_{args.val_tasks}x{config.eval.samples}.json"
    try:
        if cache.is_file():
            start = EvalResult(**json.loads(cache.read_text()))
        else:
            start = validate(trainer.generator)
            cache.write_text(json.dumps(start.__dict__))
        rows = []
        t_run = time.perf_counter()
        for k in range(1, config.steps + 1):
            metrics = trainer.step().metrics
            line = {"step": k, "train_success": metrics["rollout/success_rate"],
                    "effective_ratio": metrics["rollout/effective_ratio"], "step_s": metrics["time/step_s"],
                    "predictor_share": metrics["time/predictor_s"] / metrics["time/step_s"]}
            if k % args.every == 0 or k == config.steps:
                res = validate(trainer.generator)
                c = heldout_change(start, res)
                line.update(val=res.success, gain=c.gain, gain_se=c.gain_se, solved=res.solved_tasks,
                            solved0=start.solved_tasks, newly_solved=len(c.newly_solved), newly_lost=len(c.newly_lost),
                            eval_s=res.seconds)
                print(f"step {k}: validation {start.success:.3f} -> {res.success:.3f} ({c.gain:+.3f} ± {c.gain_se:.3f}, "
                      f"z {c.z:.1f}); solved {start.solved_tasks} -> {res.solved_tasks} (+{len(c.newly_solved)} "
                      f"-{len(c.newly_lost)}); {res.seconds:.0f}s", flush=True)
            rows.append(line)
        out = {"seed": args.seed, "overrides": args.overrides, "val_tasks": len(val_ids), "train_tasks": len(train_ids),
               "samples": config.eval.samples, "start": {"success": start.success, "solved": start.solved_tasks},
               "steps": rows, "train_seconds": time.perf_counter() - t_run}
        (args.out / "validation.json").write_text(json.dumps(out, indent=1))
    finally:
        trainer.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
