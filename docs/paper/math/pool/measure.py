"""The PythonMath-v0 training pool of docs/paper/math/plan.md: measured from the starting policy on train tasks only.

    PYTHONPATH=. .venv/bin/python docs/paper/math/pool/measure.py measure   # per_task.json (p-hat of every train task)
    PYTHONPATH=. .venv/bin/python docs/paper/math/pool/measure.py pool      # pool.jsonl + pool.json from per_task.json
    PYTHONPATH=. .venv/bin/python docs/paper/math/pool/measure.py noise     # noise.json: held-out noise, two eval seeds

``measure``: the shipped demo policy (docs/configs/demo.yaml's sampling: temperature 1, 160 new tokens, 3 turns)
plays K = 8 episodes of each of the 300 train tasks (episode seeds from SEED, not the held-out evaluation's);
p-hat = successes / K per task.

``pool`` (the rule, docs/paper/math/plan.md): three classes by p-hat -- high (7 or 8 of 8), never (0 of 8) and
middle (1..6 of 8). The pool holds SHARES of each: 20% high, 55% never, 25% middle, of at most POOL_SIZE = 120 tasks;
the pool shrinks so that the shares hold where a class has fewer tasks than its share (high: 23 tasks, so 115 =
23 / 63 / 29). Within a class, tasks are drawn uniformly without replacement by ``numpy.random.default_rng(0)`` from
the class's ids in sorted order. (Written first with high = 8 of 8 only and shares 40 / 35 / 25: the measurement
found 4 such tasks, a pool of 10; the plan records this.) The pool is written as a PythonMath-v0 task file
(``problem`` = the task's prompt without the answer instruction, which the loader appends again, so prompts are
byte-identical; ``answer``; ``task_id`` = the train id; ``class``; ``successes``)
for ``train_split=docs/paper/math/pool/pool.jsonl``.

``noise``: the starting policy on the held-out set of the plan (all 100 test tasks x NOISE_SAMPLES episodes) under
two evaluation seeds; the sampling noise of one evaluation with the task set fixed, measured (half the squared
difference of the two) and from the per-task rates (sum of p(1-p)/(K-1) over tasks, / tasks^2).
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
K = 8
SEED = 777_000
SHARES = {"high": 0.20, "never": 0.55, "middle": 0.25}
POOL_SIZE = 120
NOISE_SAMPLES = 16
NOISE_SEEDS = (12345, 54321)


def _config(split: str, tasks: int | None, samples: int):
    from trace_agent.config import load_config

    root = HERE.parents[3]
    return load_config(root / "docs" / "configs" / "demo.yaml",
                       [f"eval.split={split}", f"eval.tasks={'null' if tasks is None else tasks}",
                        f"eval.samples={samples}", "out_dir=/tmp/trace_pool_measure"])


def _policy(config):
    from trace_agent.wiring import build_policies

    policy, _ = build_policies(config.policy, seed=0, env_id=config.env_id)
    return policy


def measure() -> None:
    from trace_agent.evaluation import evaluate_heldout

    config = _config("train", None, K)
    t = time.perf_counter()
    result = evaluate_heldout(_policy(config), config, seed=SEED)
    per_task = {tid: round(rate * K) for tid, rate in result.per_task.items()}
    (HERE / "per_task.json").write_text(json.dumps({
        "what": "successes of the shipped demo policy in K episodes of each PythonMath-v0 train task",
        "policy": "shipped demo policy (docs/configs/demo.yaml)", "split": "train", "samples": K,
        "episode_seeds": f"{SEED} + 1000 * task_index + sample (trace_agent.evaluation.evaluate_heldout)",
        "success": result.success, "seconds": time.perf_counter() - t, "successes": per_task}, indent=1))
    print(f"train success {result.success:.3f} over {result.episodes} episodes, {time.perf_counter() - t:.0f}s")


def pool() -> None:
    import numpy as np

    from trace_envs.tasks.math_gen import ANSWER_INSTRUCTION, default_math_tasks

    data = json.loads((HERE / "per_task.json").read_text())
    k = int(data["samples"])
    classes: dict[str, list[str]] = {"high": [], "never": [], "middle": []}
    for tid, s in sorted(data["successes"].items()):
        classes["high" if s >= k - 1 else "never" if s == 0 else "middle"].append(tid)
    size = min([POOL_SIZE, *(math.floor(len(classes[c]) / SHARES[c]) for c in SHARES)])
    counts = {c: round(size * SHARES[c]) for c in SHARES}
    rng = np.random.default_rng(0)
    chosen = {c: sorted(rng.choice(classes[c], size=counts[c], replace=False).tolist()) for c in SHARES}
    tasks = default_math_tasks("train")
    suffix = "\n\n" + ANSWER_INSTRUCTION
    rows = []
    for c in SHARES:
        for tid in chosen[c]:
            task = tasks.get(tid)
            assert task.prompt.endswith(suffix), tid
            rows.append({"problem": task.prompt[:-len(suffix)], "answer": str(task.data["answer"]), "task_id": tid,
                         "class": c, "successes": data["successes"][tid]})
    with (HERE / "pool.jsonl").open("w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    (HERE / "pool.json").write_text(json.dumps({
        "rule": f"shares {SHARES} of {POOL_SIZE} (shrunk to keep the shares), numpy default_rng(0) per class",
        "available": {c: len(v) for c, v in classes.items()}, "size": len(rows), "counts": counts,
        "mean_phat": sum(r["successes"] for r in rows) / (k * len(rows)), "chosen": chosen}, indent=1))
    print({c: len(v) for c, v in classes.items()}, "->", counts)


def noise() -> None:
    from trace_agent.evaluation import evaluate_heldout

    config = _config("test", 100, NOISE_SAMPLES)
    policy = _policy(config)
    evals = []
    for seed in NOISE_SEEDS:
        t = time.perf_counter()
        r = evaluate_heldout(policy, config, seed=seed)
        evals.append({"seed": seed, "success": r.success, "success_se_clustered": r.success_se,
                      "seconds": time.perf_counter() - t, "per_task": r.per_task})
    n, k = 100, NOISE_SAMPLES
    within = [sum(p * (1 - p) * k / (k - 1) for p in e["per_task"].values()) / (k * n * n) for e in evals]
    diff = evals[0]["success"] - evals[1]["success"]
    (HERE / "noise.json").write_text(json.dumps({
        "what": "the starting policy on the plan's held-out set under two evaluation seeds", "tasks": n,
        "samples": k, "difference": diff, "noise_sd_from_difference": abs(diff) / math.sqrt(2),
        "noise_sd_from_per_task_rates": [math.sqrt(v) for v in within], "evals": evals}, indent=1))
    print(f"diff {diff:+.4f}; sd from per-task rates {[round(math.sqrt(v), 4) for v in within]}")


if __name__ == "__main__":
    {"measure": measure, "pool": pool, "noise": noise}[sys.argv[1]]()
