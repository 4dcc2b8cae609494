"""The training claims: ``train`` (held-out success after training at equal budget) and the pre-registered
comparison (``train --runs DIR``: one compact file per (arm, seed) run, arms named as
:func:`~trace_agent.lab.preregistered.parse_arm` reads them; ``table``: the table rebuilt from those files).

``train`` is :func:`trace_agent.lab.compare.compare_training` on a training config (``--config``, default
docs/configs/demo.yaml; ``--set`` overrides); the table's arithmetic is :mod:`trace_agent.lab.preregistered`'s.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from trace_agent.lab.claims.report import bar_plot, write_claim
from trace_agent.lab.claims.settings import PAPER, train_config
from trace_agent.lab.preregistered import (
    arm_file_stem,
    build_table,
    kept_step_metric,
    load_runs,
    parse_arm,
    table_markdown,
)
from trace_agent.lab.run_data import REPO_ROOT, portable, stored_path

#: The checkout whose commit every run file records (its paths are written relative to it).
ROOT = REPO_ROOT


def run_train(args: argparse.Namespace, policy: Any = None) -> dict[str, Any]:
    """``train``: held-out success after training each strategy from one start at equal budget
    (:func:`~trace_agent.lab.compare.compare_training`); ``--merge`` pools earlier parts, ``--runs`` is :func:`run_arms`."""
    from trace_agent.lab.compare import ComparisonResult, compare_training

    if args.runs and not args.merge:
        return run_arms(args)
    if args.merge:
        result = ComparisonResult.merge([ComparisonResult.from_json(Path(f).read_text())
                                         for f in args.merge.split(",") if f.strip()])
        result = replace(result, command=f"{result.command}; pooled by {args.command_line}")
    else:
        strategies = [s.strip() for s in args.strategies.split(",") if s.strip()]
        seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
        result = compare_training(train_config(args), strategies, seeds,
                                  log=lambda m: print(m, file=sys.stderr, flush=True), command=args.command_line)
    result = replace(result, config=portable(result.config, ROOT))
    result.write(args.out)
    md = "\n".join(["### train", "", f"Paper: {PAPER['train']}.", "", result.to_markdown()])
    data = json.loads(result.to_json())
    env = str(result.config["env_id"]).split("/")[-1]
    write_claim(args.out, "train", data, md, [lambda out: bar_plot(
        out / "train.png", {n: [r["after"] for r in result.rows if r["strategy"] == n] for n in result.strategies},
        "held-out success after training", f"{env}: equal budget (dots = seeds)")])
    return data


def _code_commit() -> dict[str, Any]:
    """The checkout's commit and whether its code differs from it (recorded in every run file), and its ``root``:
    ``.``, the repository every path in the file is relative to (no machine path is recorded)."""

    def git(*a: str) -> str:
        try:
            return subprocess.run(["git", "-C", str(ROOT), *a], capture_output=True, text=True, timeout=30).stdout.strip()
        except OSError:
            return ""

    dirty = git("status", "--porcelain", "--", "trace_agent", "trace_envs", "scripts", "docs/configs",
                "docs/paper/math/pool")
    return {"commit": git("rev-parse", "HEAD"), "code_dirty": bool(dirty), "root": "."}


def _eval_data(result: Any, step: int) -> dict[str, Any]:
    """A held-out evaluation at ``step`` as a run file records it."""
    return {"step": step, "success": result.success, "success_se": result.success_se, "tasks": result.tasks,
            "samples": result.samples, "episodes": result.episodes, "solved_tasks": result.solved_tasks,
            "seconds": result.seconds}


def _base_key(config: Any) -> dict[str, Any]:
    """The config sections the starting policy's evaluation depends on (``base.json`` is reused when they match)."""
    from trace_agent.config_io import config_to_dict

    c = config_to_dict(config)
    return {k: c[k] for k in ("env_id", "env_kwargs", "policy", "sampling", "eval")}


def run_arms(args: argparse.Namespace) -> dict[str, Any]:
    """``train --runs DIR``: every (arm, seed), seed-major, from one start; one compact JSON per finished run."""
    from trace_agent.config_io import config_to_dict
    from trace_agent.evaluation import evaluate_heldout
    from trace_agent.metrics import read_metrics
    from trace_agent.run import run_training
    from trace_agent.wiring import build_policies

    config = train_config(args)
    runs = Path(args.runs)
    runs.mkdir(parents=True, exist_ok=True)
    arms = [a.strip() for a in args.strategies.split(",") if a.strip()]
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    for arm in arms:
        parse_arm(arm)
    log = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    code = _code_commit()
    base_path = runs / "base.json"
    key = portable(_base_key(config), ROOT)  # as base.json records it
    if base_path.is_file() and json.loads(base_path.read_text()).get("key") == key:
        base = json.loads(base_path.read_text())["eval"]
    else:
        policy, _ = build_policies(config.policy, seed=0, env_id=config.env_id)
        base = _eval_data(evaluate_heldout(policy, config), 0)
        del policy
        base_path.write_text(json.dumps(portable({
            "what": "held-out evaluation of the starting policy (step 0 of every run)",
            **code, "command": args.command_line, "key": key, "eval": base}, ROOT), indent=1))
    log(f"starting policy: held-out {base['success']:.3f} ({base['tasks']} tasks x {base['samples']} samples)")
    done = []
    for seed in seeds:
        for arm in arms:
            path = runs / f"{arm_file_stem(arm)}_s{seed}.json"
            if _stored(path):
                log(f"{path.name}: already there, skipped")
                continue
            strategy, mult, shape, warm = parse_arm(arm)
            roots, continuations = shape or (config.rollout.budget.roots, config.rollout.budget.continuations_per_root)
            tasks, group = warm or (config.predictor.warm_start_tasks, config.predictor.warm_start_roots)
            run_dir = Path(config.out_dir) / path.stem
            cfg = replace(config, seed=seed, out_dir=str(run_dir),
                          rollout=replace(config.rollout, strategy=strategy,
                                          budget=replace(config.rollout.budget, roots=roots * mult,
                                                         continuations_per_root=continuations)),
                          predictor=replace(config.predictor, warm_start_tasks=tasks, warm_start_roots=group))
            t = time.perf_counter()
            rep = run_training(cfg, evaluate="after", log=lambda _m: None)
            seconds = time.perf_counter() - t
            records = read_metrics(run_dir / "metrics.jsonl")
            evals = [base] + [{"step": int(r["step"]), "success": r["eval/success"], "success_se": r["eval/success_se"],
                               "episodes": int(r["eval/episodes"]), "seconds": r["eval/seconds"]}
                              for r in records if "eval/success" in r and int(r["step"]) > 0]
            steps = [{"step": int(r["step"]), **{k: v for k, v in r.items() if kept_step_metric(k, v)}}
                     for r in records if "rollout/effective_ratio" in r]
            warm_record = next((r for r in records if "warm_start/tasks" in r), None)
            data = {"arm": arm, "strategy": strategy, "budget_multiple": mult,
                    "shape": [cfg.rollout.budget.roots, cfg.rollout.budget.continuations_per_root], "seed": seed, **code,
                    "command": args.command_line, "config": config_to_dict(cfg), "seconds": seconds,
                    "paper_units": rep.paper_units, "generated_tokens": rep.generated_tokens, "evals": evals,
                    "steps": steps, "warm_start": _warm_start_data(warm_record)}
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(portable(json.loads(json.dumps(data, default=float)), ROOT),
                                      separators=(",", ":")))
            tmp.replace(path)
            done.append(path.name)
            log(f"{path.name}: {seconds:.0f}s, held-out " + " ".join(f"{e['step']}:{e['success']:.3f}" for e in evals))
    return {"runs": done, "base": base}


def _stored(path: Path) -> bool:
    """Whether the run file ``path`` is there, plain or compressed (``scripts/strip_run_paths.py``)."""
    try:
        return stored_path(path).is_file()
    except FileNotFoundError:
        return False


def _warm_start_data(record: dict[str, Any] | None) -> dict[str, Any] | None:
    """A run's predictor warm-up as its run file records it: the ``warm_start/*`` figures (paper units, generated
    tokens, env steps, seconds ...) and the refresh's ``predictor/*`` at step 0; None for a run without one.
    The run's ``paper_units`` and ``generated_tokens`` include the warm-up's."""
    if record is None:
        return None
    return {k.split("/", 1)[1] if k.startswith("warm_start/") else k: v for k, v in record.items()
            if k.startswith(("warm_start/", "predictor/")) and isinstance(v, int | float)}


def run_table(args: argparse.Namespace, policy: Any = None) -> dict[str, Any]:
    """``table``: the pre-registered comparison's table from its per-run files alone; printed, and written under
    ``--out`` if given."""
    pairs = [tuple(p.split(":", 1)) for p in args.pairs.split(",") if p.strip()]
    if any(len(p) != 2 or not all(p) for p in pairs):
        raise SystemExit(f"paper_claims table: --pairs wants A:B[,C:D...], got {args.pairs!r}")
    table = build_table(load_runs(args.runs), reference=args.reference, pairs=pairs)  # type: ignore[arg-type]
    md = table_markdown(table)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "table.json").write_text(json.dumps(table, indent=1, allow_nan=True))
        (out / "table.md").write_text(md)
    print(md)
    return table
