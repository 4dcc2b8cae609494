"""WikiQA-v0's bounded search for a setting where GRPO learns (docs/paper/wiki/tuning_plan.md): data, runs, table.

    python scripts/wiki_tuning.py split      # tuning/valid.jsonl, tune.jsonl, split.json (63 / 252 train questions)
    python scripts/wiki_tuning.py pool       # stage 0: tuning/per_task.json, learnable.jsonl (8 episodes a question)
    python scripts/wiki_tuning.py noise      # stage 0: tuning/noise.json (the validation evaluation, two seeds)
    python scripts/wiki_tuning.py commands   # stage 1: one `paper_claims.py train --runs` command per (cell, seed)
    python scripts/wiki_tuning.py runs       # stage 1: those commands in order; finished runs are skipped
    python scripts/wiki_tuning.py table      # the cells x step counts table from the run files alone

Every path is relative to the repository root (run from there); ``tuning/`` is ``docs/paper/wiki/tuning/``.

``split``: the train split's 315 question ids in sorted order; ``numpy.random.default_rng(0).choice(315, 63,
replace=False)`` picks the validation slice, the other 252 are the tuning pool. Both are written as HotpotQA-format
JSONL (``_id`` = the synthetic question id, ``question``, ``answer``), rows in sorted-id order; WikiQA-v0 takes such a file as its split
(``train_split=`` / ``eval.split=``), its questions prompted and graded as the synthetic split's.

``pool``: the starting policy (``docs/configs/wiki_demo.yaml``: WikiQA-v0's shipped demo policy, temperature 1,
64 new tokens, 5 turns) plays K = 8 episodes of each tuning question (:func:`trace_agent.evaluation.evaluate_heldout`
on ``tune.jsonl``, episode seeds from POOL_SEED, not the validation evaluation's); the "learnable" pool is the
questions with 1..7 successes, written as rows of ``tune.jsonl`` to ``learnable.jsonl`` (``learnable`` rewrites
that file alone from ``per_task.json``).

``noise``: the validation evaluation of the plan (all 63 questions x 8 episodes, the config's sampling) of the
starting policy under NOISE_SEEDS (12345 is the seed every training run's evaluation uses); the sampling sd of
one evaluation measured from the difference and from the per-question rates, as docs/paper/math/pool/noise.json.

Stage 1 (``commands`` / ``runs``): GRPO at ``optim.lr`` in LRS x ``train_split`` in POOLS, seeds 200 and 201,
96 steps, the validation evaluation at steps 0, 24, 48, 72, 96; each (cell, seed) is one
``scripts/paper_claims.py train --runs tuning/runs/<cell>`` command, which writes ``grpo_s<seed>.json`` when the
run ends and skips a run whose file is there. A cell's ``base.json`` (the starting policy's validation evaluation,
step 0 of every run) is copied from another cell's when it has none: its key (env, policy, sampling, eval) is the
same in every cell, and the runner evaluates again if it is not. ``table`` reads :mod:`wiki_tuning_table`.
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from wiki_tuning_table import (  # noqa: E402
    CELLS,
    EVAL_EVERY,
    EVAL_SAMPLES,
    POOLS,
    STAGE1_SEEDS,
    STEPS,
    TUNING,
    VALID_SIZE,
    build_table,
    cell_name,
    load_tuning_runs,
    table_markdown,
)

__all__ = ["CONFIG", "K", "POOL_SEED", "NOISE_SEEDS", "split_ids", "hotpotqa_row", "learnable_ids",
           "stage0_seconds", "stage1_commands", "main"]

CONFIG = "docs/configs/wiki_demo.yaml"
K = 8
POOL_SEED = 777_000
NOISE_SEEDS = (12345, 54321)
TRAIN_SIZE = 315


def split_ids(train_ids: list[str]) -> tuple[list[str], list[str]]:
    """(validation ids, tuning ids), each sorted: the plan's ``default_rng(0).choice(315, 63)`` over the sorted ids."""
    import numpy as np

    ids = sorted(train_ids)
    if len(ids) != TRAIN_SIZE or len(set(ids)) != TRAIN_SIZE:
        raise SystemExit(f"wiki_tuning split: the train split has {len(set(ids))} distinct ids, the plan's {TRAIN_SIZE}")
    picked = set(np.random.default_rng(0).choice(TRAIN_SIZE, VALID_SIZE, replace=False).tolist())
    return [ids[i] for i in sorted(picked)], [ids[i] for i in range(TRAIN_SIZE) if i not in picked]


def hotpotqa_row(task) -> dict:
    """A synthetic WikiQA question as a HotpotQA-format record: ``_id`` (its id, whose prefix is its kind),
    ``question``, ``answer``; nothing else (the env reads no other field of a synthetic question)."""
    answers = task.data["answers"]
    if len(answers) != 1:
        raise SystemExit(f"wiki_tuning split: {task.task_id} has {len(answers)} answers; HotpotQA rows hold one")
    return {"_id": task.task_id, "question": task.data["question"], "answer": answers[0]}


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(r, separators=(",", ":")) + "\n" for r in rows))


def _read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def split() -> None:
    from trace_envs.tasks.wiki import wiki_split

    tasks = wiki_split("train")
    valid, tune = split_ids(list(tasks))
    out = ROOT / TUNING
    out.mkdir(parents=True, exist_ok=True)
    _write_jsonl(out / "valid.jsonl", [hotpotqa_row(tasks[i]) for i in valid])
    _write_jsonl(out / "tune.jsonl", [hotpotqa_row(tasks[i]) for i in tune])
    (out / "split.json").write_text(json.dumps({
        "what": "the plan's validation slice and tuning pool of WikiQA-v0's train split (synthetic question ids)",
        "rule": "numpy.random.default_rng(0).choice(315, 63, replace=False) over the train ids in sorted order",
        "command": "python scripts/wiki_tuning.py split", "tune": "the other 252 train ids, in tune.jsonl",
        "valid": valid}, separators=(",", ":")))
    print(f"valid {len(valid)}, tune {len(tune)}")


def _config(split_file: str, samples: int):
    from trace_agent.config_io import load_config

    return load_config(ROOT / CONFIG, [f"eval.split={split_file}", "eval.tasks=null", f"eval.samples={samples}",
                                       "out_dir=runs/wiki_tuning/stage0", "log.progress=false"])


def _policy(config):
    from trace_agent.wiring import build_policies

    policy, _ = build_policies(config.policy, seed=0, env_id=config.env_id)
    return policy


def _synthetic_id(task_id: str) -> str:
    """The synthetic id of a HotpotQA-file task (``hotpotqa-<_id>``)."""
    return task_id.removeprefix("hotpotqa-")


def learnable_ids(successes: dict[str, int], k: int = K) -> list[str]:
    """The questions solved in 1..k-1 of k episodes, sorted."""
    return sorted(q for q, s in successes.items() if 0 < s < k)


def pool() -> None:
    from trace_agent.evaluation import evaluate_heldout

    config = _config(f"{TUNING}/tune.jsonl", K)
    t = time.perf_counter()
    result = evaluate_heldout(_policy(config), config, seed=POOL_SEED)
    seconds = time.perf_counter() - t
    successes = {_synthetic_id(q): round(rate * K) for q, rate in sorted(result.per_task.items())}
    learnable = learnable_ids(successes)
    classes = {"never": sum(s == 0 for s in successes.values()), "learnable": len(learnable),
               "always": sum(s == K for s in successes.values())}
    # GRPO's unbiased per-question chance that a group of 4 is mixed: 1 - C(s,4)/C(8,4) - C(8-s,4)/C(8,4)
    mixed = {q: 1 - (math.comb(s, 4) + math.comb(K - s, 4)) / math.comb(K, 4) for q, s in successes.items()}
    out = ROOT / TUNING
    (out / "per_task.json").write_text(json.dumps({
        "what": "successes of WikiQA-v0's shipped demo policy in K episodes of each tuning question",
        "policy": f"shipped demo policy ({CONFIG}: temperature 1, 64 new tokens, 5 turns)",
        "split": f"{TUNING}/tune.jsonl", "samples": K,
        "episode_seeds": f"{POOL_SEED} + 1000 * question_index + sample (trace_agent.evaluation.evaluate)",
        "command": "python scripts/wiki_tuning.py pool", "success": result.success, "episodes": result.episodes,
        "seconds": seconds, "classes": classes,
        "predicted_mixed_share_group4": {"all": sum(mixed.values()) / len(mixed),
                                         "learnable": sum(mixed[q] for q in learnable) / max(1, len(learnable))},
        "successes": successes}, separators=(",", ":")))
    write_learnable()
    print(f"tuning success {result.success:.3f} over {result.episodes} episodes, {seconds:.0f}s; {classes}")


def write_learnable() -> None:
    """``learnable.jsonl``: the rows of ``tune.jsonl`` whose question ``per_task.json`` counts 1..K-1 successes."""
    out = ROOT / TUNING
    successes = json.loads((out / "per_task.json").read_text())["successes"]
    rows = {r["_id"]: r for r in _read_jsonl(out / "tune.jsonl")}
    if sorted(rows) != sorted(successes):
        raise SystemExit("wiki_tuning learnable: per_task.json does not measure tune.jsonl's questions; run pool")
    _write_jsonl(out / "learnable.jsonl", [rows[q] for q in learnable_ids(successes)])


def noise() -> None:
    from trace_agent.evaluation import evaluate_heldout

    config = _config(f"{TUNING}/valid.jsonl", EVAL_SAMPLES)
    policy = _policy(config)
    evals = []
    for seed in NOISE_SEEDS:
        t = time.perf_counter()
        r = evaluate_heldout(policy, config, seed=seed)
        evals.append({"seed": seed, "success": r.success, "success_se_clustered": r.success_se,
                      "episodes": r.episodes, "seconds": time.perf_counter() - t,
                      "per_task": {_synthetic_id(q): v for q, v in r.per_task.items()}})
    n, k = VALID_SIZE, EVAL_SAMPLES
    within = [sum(p * (1 - p) * k / (k - 1) for p in e["per_task"].values()) / (k * n * n) for e in evals]
    diff = evals[0]["success"] - evals[1]["success"]
    (ROOT / TUNING / "noise.json").write_text(json.dumps({
        "what": "the starting policy's validation evaluation (tuning/valid.jsonl) under two evaluation seeds",
        "command": "python scripts/wiki_tuning.py noise", "tasks": n, "samples": k, "difference": diff,
        "noise_sd_from_difference": abs(diff) / math.sqrt(2),
        "noise_sd_from_per_task_rates": [math.sqrt(v) for v in within], "evals": evals}, separators=(",", ":")))
    print(f"diff {diff:+.4f}; sd from per-task rates {[round(math.sqrt(v), 4) for v in within]}")


def stage1_commands(python: str = "python", runs: str = f"{TUNING}/runs", out: str = "runs/wiki_tuning",
                    seeds: tuple[int, ...] = STAGE1_SEEDS) -> list[tuple[str, int, list[str]]]:
    """(cell, seed, argv) of every stage-1 run, seed-major (every cell of seed 200 first)."""
    cmds = []
    for seed in seeds:
        for lr, pool_name in CELLS:
            cell = cell_name(lr, pool_name)
            argv = [python, "scripts/paper_claims.py", "train", "--config", CONFIG, "--strategies", "grpo",
                    "--seeds", str(seed), "--steps", str(STEPS), "--set", f"optim.lr={lr}",
                    "--set", f"train_split={POOLS[pool_name]}", "--set", f"eval.split={TUNING}/valid.jsonl",
                    "--set", f"eval.tasks={VALID_SIZE}", "--set", f"eval.samples={EVAL_SAMPLES}",
                    "--set", f"eval.every={EVAL_EVERY}", "--set", "log.tensorboard=false", "--set", "log.wandb=false",
                    "--set", "log.samples_every=0", "--set", "log.save_trees=false",
                    "--set", "log.checkpoint_every=0", "--runs", f"{runs}/{cell}", "--out", f"{out}/{cell}"]
            cmds.append((cell, seed, argv))
    return cmds


def _share_base(runs: Path, cell: str) -> None:
    """Copy another cell's base.json into ``cell``'s runs folder when it has none (same key in every cell)."""
    target = runs / cell / "base.json"
    if target.is_file():
        return
    for other in sorted(runs.glob("*/base.json")):
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(other, target)
        return


def run_stage1(args: argparse.Namespace) -> int:
    from trace_agent.lab.run_data import stored_path

    runs = ROOT / args.runs  # the commands run in ROOT: a relative --runs is relative to it
    cmds = stage1_commands(sys.executable, args.runs, args.out, tuple(int(s) for s in args.seeds.split(",")))
    for cell, seed, argv in cmds:
        if args.cells and cell not in args.cells.split(","):
            continue
        try:
            stored_path(runs / cell / f"grpo_s{seed}.json")
            print(f"{cell} seed {seed}: done, skipped", flush=True)
            continue
        except FileNotFoundError:
            pass
        _share_base(runs, cell)
        print(f"{cell} seed {seed}: {shlex.join(argv)}", flush=True)
        rc = subprocess.run(argv, cwd=ROOT).returncode
        if rc:
            print(f"{cell} seed {seed}: exit {rc}; stopped (rerun the same command to resume)", file=sys.stderr)
            return rc
    return 0


#: Stage 0's first pass (pool 178.05 s, noise 34.57 + 35.13 s): its files were written again by the second pass, on
#: the committed files, with identical figures (tuning/README.md); both passes count against the cap.
STAGE0_FIRST_PASS_SECONDS = 178.05 + 34.57 + 35.13


def stage0_seconds() -> float:
    """Stage 0's run time: the seconds ``per_task.json`` and ``noise.json`` record, and the first pass's."""
    seconds0 = STAGE0_FIRST_PASS_SECONDS
    for p in (ROOT / TUNING / "per_task.json", ROOT / TUNING / "noise.json"):
        if p.is_file():
            data = json.loads(p.read_text())
            seconds0 += float(data.get("seconds", 0.0)) + sum(float(e["seconds"]) for e in data.get("evals", []))
    return seconds0


def table(args: argparse.Namespace) -> None:
    result = build_table(load_tuning_runs(args.runs), stage0_seconds=stage0_seconds())
    md = table_markdown(result)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "table.json").write_text(json.dumps(result, separators=(",", ":")))
    (out / "table.md").write_text(md)
    print(md)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    for name in ("split", "pool", "learnable", "noise"):
        sub.add_parser(name)
    for name in ("commands", "runs"):
        p = sub.add_parser(name)
        p.add_argument("--runs", default=f"{TUNING}/runs", help="run files, one folder per cell")
        p.add_argument("--out", default="runs/wiki_tuning", help="the runs' own folders (metrics, checkpoints)")
        p.add_argument("--seeds", default=",".join(map(str, STAGE1_SEEDS)))
        p.add_argument("--cells", default="", help="only these cells (comma-separated names); default all")
    t = sub.add_parser("table")
    t.add_argument("--runs", default=f"{TUNING}/runs")
    t.add_argument("--out", default=f"{TUNING}/runs")
    args = parser.parse_args(argv)
    if args.what == "commands":
        for _, _, cmd in stage1_commands("python", args.runs, args.out, tuple(int(s) for s in args.seeds.split(","))):
            print(shlex.join(cmd))
        return 0
    if args.what == "runs":
        return run_stage1(args)
    if args.what == "table":
        table(args)
        return 0
    {"split": split, "pool": pool, "learnable": write_learnable, "noise": noise}[args.what]()
    return 0


if __name__ == "__main__":
    sys.exit(main())
