"""Build the offline demo policy: scripted demonstrations -> tokenizer -> tiny Qwen3 LM -> save_pretrained.

    .venv/bin/python scripts/build_demo_policy.py --out artifacts/demo_policy --seed 0
    .venv/bin/python scripts/build_demo_policy.py --out artifacts/demo_policy --eval-tasks 30 --eval-samples 8
    .venv/bin/python scripts/build_demo_policy.py --env trace_envs/BFCL-v0 --out DIR \
        --set augment_copies=2 --set model.split=copy --set 'demonstrator_options={"trace_envs/BFCL-v0": {"num_tasks": null}}'

``--set field=value`` changes one field of the preset (:func:`trace_agent.demo.build.with_settings`; the
same syntax as ``trace-gym train --set``: the value is YAML data, converted to the field's type);
``build_report.json`` records the settings the build ran with.

With ``--eval-tasks N`` it then plays ``--eval-samples`` episodes on each of the first N test tasks of
each env (at most 4 turns each; :func:`trace_agent.evaluation.evaluate`, its seeds from ``--seed``) and prints
the per-task success-rate histogram (the spread that makes groups mixed).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trace_agent.demo.build import (  # noqa: E402
    DEFAULT_ENV_IDS,
    DemoTrainConfig,
    build_demo_policy,
    demo_train_config,
    with_settings,
)
from trace_agent.demo.shipped import load_demo_policy  # noqa: E402
from trace_agent.env_factory import make_env_factory  # noqa: E402
from trace_agent.evaluation import evaluate, success_histogram  # noqa: E402
from trace_agent.policy.base import SamplingConfig  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="artifacts/demo_policy", help="output directory")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=None, help="optimiser steps (default: the env's preset)")
    parser.add_argument("--flawed-fraction", type=float, default=None, help="default: the env's preset")
    parser.add_argument("--env", action="append", dest="envs", help=f"env id (repeatable; default {DEFAULT_ENV_IDS})")
    parser.add_argument("--set", action="append", dest="settings", default=[], metavar="FIELD=VALUE",
                        help="change a field of the preset (repeatable; model.FIELD for the model's)")
    parser.add_argument("--skip-build", action="store_true", help="only evaluate an existing --out")
    parser.add_argument("--eval-tasks", type=int, default=0, help="test tasks to evaluate per env (0: none)")
    parser.add_argument("--eval-samples", type=int, default=8)
    parser.add_argument("--temperature", type=float, default=1.0)
    args = parser.parse_args(argv)

    envs = tuple(args.envs) if args.envs else DEFAULT_ENV_IDS
    if not args.skip_build:
        overrides = {k: v for k, v in (("steps", args.steps), ("flawed_fraction", args.flawed_fraction))
                     if v is not None}
        # One env: its preset (demo_train_config); several: the defaults on all of them.
        config = (demo_train_config(envs[0], seed=args.seed, **overrides) if len(envs) == 1
                  else DemoTrainConfig(seed=args.seed, env_ids=envs, **overrides))
        try:
            config = with_settings(config, args.settings)
        except ValueError as exc:
            parser.error(str(exc))
        report = build_demo_policy(args.out, seed=args.seed, steps=config.steps, config=config, log=lambda m: print(m, flush=True))
        print(f"built {args.out}: {report.num_parameters:,} parameters, {report.size_bytes / 1e6:.1f} MB, "
              f"{report.total_seconds:.0f}s (demonstrations {report.demonstration_seconds:.0f}s, "
              f"tokenizer {report.tokenizer_seconds:.0f}s, training {report.train_seconds:.0f}s)")
    if args.eval_tasks:
        policy = load_demo_policy(args.out)
        for env_id in envs:
            make = make_env_factory(env_id, None, max_turns=4, env_kwargs={"tasks": "test"})  # every env's held-out split
            env = make()
            task_ids = env.tasks.ids()[:args.eval_tasks]
            env.close()
            t0 = time.perf_counter()
            results = evaluate(policy, make, task_ids, samples=args.eval_samples,
                               sampling=SamplingConfig(temperature=args.temperature), seed=args.seed)
            summary = success_histogram(results)
            summary["seconds"] = round(time.perf_counter() - t0, 1)
            summary["rates"] = {t: r for t, r in zip(task_ids, summary["rates"])}
            print(env_id, json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
