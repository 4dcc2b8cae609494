"""The table of WikiQA-v0's tuning search (docs/paper/wiki/tuning_plan.md), rebuilt from its run files alone.

Run files: ``tuning/runs/<cell>/grpo_s<seed>.json[.gz]`` (``<cell>`` as :func:`cell_name` names it), written by ``scripts/paper_claims.py train --runs``
(``scripts/wiki_tuning.py runs``). A cell is a learning rate and a pool (:data:`CELLS`, named by :func:`cell_name`);
each file's own config must be its folder's cell (``optim.lr``, ``train_split``), GRPO, :data:`STEPS` steps, the
plan's validation evaluation, and evaluated at :data:`EVAL_STEPS`. A file that is not so is refused
(:class:`TuningRunError`, naming the file and what is wrong), never read past a size bound or evaluated.

The criterion ("rises beyond noise"), per cell and step count: the mean over its seeds of (validation success at
that step - at step 0) is at least :data:`RISE` and every seed is above the start. Stage 2's pick: among the
(cell, step count) pairs that meet it in stage 1 (seeds :data:`STAGE1_SEEDS`), the largest mean rise; ties: fewer
steps, then the smaller learning rate; a tie those do not break is reported as unresolved (no pick). The pick is
**found** when its cell's stage-2 seeds (:data:`STAGE2_SEEDS`) meet the criterion at its step count.
Core-hours: the runs' own ``seconds`` plus stage 0's.
"""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path
from typing import Any

__all__ = ["TUNING", "LRS", "POOLS", "CELLS", "STEPS", "EVAL_EVERY", "EVAL_STEPS", "EVAL_SAMPLES", "VALID_SIZE",
           "STAGE1_SEEDS", "STAGE2_SEEDS", "RISE", "CAP_CORE_HOURS", "MAX_RUN_FILE_BYTES", "TuningRunError",
           "cell_name", "read_run_file", "check_run", "load_tuning_runs", "criterion", "build_table",
           "table_markdown"]

TUNING = "docs/paper/wiki/tuning"
LRS = ("3e-4", "1e-3", "3e-3")
POOLS = {"all": f"{TUNING}/tune.jsonl", "learnable": f"{TUNING}/learnable.jsonl"}
CELLS = tuple((lr, pool) for lr in LRS for pool in POOLS)
STEPS = 96
EVAL_EVERY = 24
EVAL_STEPS = (0, 24, 48, 72, 96)
EVAL_SAMPLES = 8
VALID_SIZE = 63
STAGE1_SEEDS = (200, 201)
STAGE2_SEEDS = (202, 203, 204)
RISE = 0.04
CAP_CORE_HOURS = 6.0
#: A run file larger than this (stored, or decompressed) is refused: the plan's files are ~100 kB.
MAX_RUN_FILE_BYTES = 8 << 20
_TOL = 1e-9  # success values are k/504: a mean rise is never within this of 0.04 unless it is exactly that


class TuningRunError(ValueError):
    """A run file the tuning table cannot be built from (malformed, another setting, a duplicate)."""


def cell_name(lr: str, pool: str) -> str:
    """``("1e-3", "learnable")`` -> ``"lr1e-3_learnable_runs"``: the cell's runs folder (under ``tuning/runs/``; a
    per-run file's folder is named ``*runs*``, which the repository's checks of committed run data rely on)."""
    return f"lr{lr}_{pool}_runs"


def read_run_file(path: Path) -> dict[str, Any]:
    """The JSON object of a run file (plain or ``.gz``), read within :data:`MAX_RUN_FILE_BYTES`; never evaluated."""
    if path.stat().st_size > MAX_RUN_FILE_BYTES:
        raise TuningRunError(f"{path}: {path.stat().st_size} bytes, more than a run file holds")
    try:
        if path.name.endswith(".gz"):
            with gzip.open(path, "rb") as f:
                raw = f.read(MAX_RUN_FILE_BYTES + 1)
        else:
            raw = path.read_bytes()
        if len(raw) > MAX_RUN_FILE_BYTES:
            raise TuningRunError(f"{path}: decompresses to more than {MAX_RUN_FILE_BYTES} bytes")
        data = json.loads(raw.decode("utf-8"))
    except (OSError, EOFError, UnicodeDecodeError, ValueError, RecursionError) as exc:
        if isinstance(exc, TuningRunError):
            raise
        raise TuningRunError(f"{path}: not a readable JSON run file ({type(exc).__name__}: {str(exc)[:120]})") from None
    if not isinstance(data, dict):
        raise TuningRunError(f"{path}: a run file is a JSON object, this is a {type(data).__name__}")
    return data


def _number(value: Any, what: str, path: Path, low: float = -math.inf, high: float = math.inf) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) \
            or not low <= value <= high:
        raise TuningRunError(f"{path}: {what} is {str(value)[:40]!r}, expected a finite number in [{low}, {high}]")
    return float(value)


def check_run(data: dict[str, Any], path: Path, lr: str, pool: str) -> dict[str, Any]:
    """The figures of one run file of cell (``lr``, ``pool``): seed, success by step, seconds, commit, dirty."""
    config = data.get("config")
    if data.get("arm") != "grpo" or data.get("strategy") != "grpo" or not isinstance(config, dict):
        raise TuningRunError(f"{path}: not a GRPO run file of `paper_claims.py train --runs` (arm {data.get('arm')!r})")
    seed = data.get("seed")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TuningRunError(f"{path}: seed {str(seed)[:40]!r} is not an integer")
    if not path.name.removesuffix(".gz") == f"grpo_s{seed}.json":
        raise TuningRunError(f"{path}: the file's name does not match its seed {seed}")
    optim, ev = config.get("optim"), config.get("eval")
    if not isinstance(optim, dict) or not isinstance(ev, dict):
        raise TuningRunError(f"{path}: its config has no optim / eval section")
    expected = {"optim.lr": float(lr), "train_split": POOLS[pool], "steps": STEPS, "eval.split": f"{TUNING}/valid.jsonl",
                "eval.samples": EVAL_SAMPLES, "eval.every": EVAL_EVERY}
    found = {"optim.lr": optim.get("lr"), "train_split": config.get("train_split"), "steps": config.get("steps"),
             "eval.split": ev.get("split"), "eval.samples": ev.get("samples"), "eval.every": ev.get("every")}
    wrong = [f"{k}={repr(found[k])[:60]} (the cell's: {v!r})" for k, v in expected.items() if found[k] != v]
    if wrong:
        raise TuningRunError(f"{path}: not a run of cell {cell_name(lr, pool)}: " + ", ".join(wrong))
    evals = data.get("evals")
    if not isinstance(evals, list) or not all(isinstance(e, dict) for e in evals):
        raise TuningRunError(f"{path}: evals is not a list of evaluations")
    success: dict[int, float] = {}
    for e in evals:
        step = e.get("step")
        if isinstance(step, bool) or not isinstance(step, int) or step in success:
            raise TuningRunError(f"{path}: an evaluation's step {str(step)[:40]!r} is not an integer or repeats")
        success[step] = _number(e.get("success"), f"the success at step {step}", path, 0.0, 1.0)
    if tuple(sorted(success)) != EVAL_STEPS:
        raise TuningRunError(f"{path}: evaluated at steps {sorted(success)}, the plan's are {list(EVAL_STEPS)}")
    dirty = data.get("code_dirty")
    commit = data.get("commit")
    if not isinstance(dirty, bool) or not isinstance(commit, str):
        raise TuningRunError(f"{path}: commit / code_dirty missing")
    return {"seed": seed, "success": success, "seconds": _number(data.get("seconds"), "seconds", path, 0.0),
            "commit": commit[:40], "code_dirty": dirty}


def load_tuning_runs(runs: str | Path) -> dict[tuple[str, str], dict[int, dict[str, Any]]]:
    """Every cell's runs under ``runs`` (``<cell>/grpo_s<seed>.json[.gz]``): cell -> seed -> :func:`check_run`.
    A folder that names no cell, or a seed stored twice, is refused."""
    root = Path(runs)
    known = {cell_name(lr, pool): (lr, pool) for lr, pool in CELLS}
    out: dict[tuple[str, str], dict[int, dict[str, Any]]] = {}
    if not root.is_dir():
        raise TuningRunError(f"{root}: no runs folder")
    for folder in sorted(p for p in root.iterdir() if p.is_dir()):
        if folder.name not in known:
            raise TuningRunError(f"{folder}: not a cell's folder (cells: {', '.join(known)})")
        lr, pool = known[folder.name]
        by_seed: dict[int, dict[str, Any]] = {}
        for path in sorted(folder.glob("grpo_s*.json*")):
            if not path.name.endswith((".json", ".json.gz")) or path.is_symlink() or not path.is_file():
                continue
            run = check_run(read_run_file(path), path, lr, pool)
            if run["seed"] in by_seed:
                raise TuningRunError(f"{path}: seed {run['seed']} of {folder.name} is stored twice")
            by_seed[run["seed"]] = run
        if by_seed:
            out[(lr, pool)] = by_seed
    return out


def _rises(runs: dict[int, dict[str, Any]], seeds: tuple[int, ...], step: int) -> dict[str, float]:
    """Validation success at ``step`` minus at step 0, per seed of ``seeds`` that has a run."""
    return {str(s): runs[s]["success"][step] - runs[s]["success"][0] for s in seeds if s in runs}


def criterion(runs: dict[int, dict[str, Any]], seeds: tuple[int, ...], step: int) -> dict[str, Any] | None:
    """The rise of ``seeds``' runs at ``step`` over step 0: per seed, mean, met; None when a seed has no run."""
    if not seeds or any(s not in runs for s in seeds):
        return None
    rises = _rises(runs, seeds, step)
    mean = sum(rises.values()) / len(rises)
    return {"rises": rises, "mean_rise": mean, "met": mean >= RISE - _TOL and all(r > 0 for r in rises.values())}


def build_table(cells: dict[tuple[str, str], dict[int, dict[str, Any]]], *, stage0_seconds: float = 0.0) -> dict[str, Any]:
    """The plan's cells x step counts table, stage 2's pick and verdict, the commits and the core-hours."""
    rows = []
    for lr, pool in CELLS:
        runs = cells.get((lr, pool), {})
        for step in EVAL_STEPS[1:]:
            c = criterion(runs, STAGE1_SEEDS, step)
            if c is None:  # a seed without its run: a seed in at or below the start already rules the row out
                rises = _rises(runs, STAGE1_SEEDS, step)
                c = {"rises": rises, "mean_rise": None, "met": False if any(r <= 0 for r in rises.values()) else None}
            rows.append({"lr": lr, "pool": pool, "steps": step, "seeds": [s for s in STAGE1_SEEDS if s in runs], **c})
    met = [r for r in rows if r["met"]]
    key = lambda r: (-round(r["mean_rise"], 9), r["steps"], float(r["lr"]))  # noqa: E731
    met.sort(key=key)
    best, tie = (met[0] if met else None), []
    if len(met) > 1 and key(met[0]) == key(met[1]):
        tie, best = [r for r in met if key(r) == key(met[0])], None
    stage2 = None
    if best is not None:
        c = criterion(cells.get((best["lr"], best["pool"]), {}), STAGE2_SEEDS, best["steps"])
        stage2 = {"cell": cell_name(best["lr"], best["pool"]), "steps": best["steps"], **(c or {"met": None})}
    every = [r for runs in cells.values() for r in runs.values()]
    run_seconds = sum(r["seconds"] for r in every)
    complete = all(s in cells.get(c, {}) for c in CELLS for s in STAGE1_SEEDS)
    verdict = _verdict(stage2, best, tie, complete=complete, decided=all(r["met"] is False for r in rows),
                       cap_reached=(run_seconds + stage0_seconds) / 3600 >= CAP_CORE_HOURS)
    return {"criterion": f"mean rise over seeds >= {RISE} and every seed above the start", "rows": rows,
            "stage1_complete": complete, "best": best, "unresolved_tie": tie, "stage2": stage2, "verdict": verdict,
            "runs": len(every), "commits": sorted({r["commit"] for r in every}),
            "code_dirty_runs": sum(r["code_dirty"] for r in every),
            "core_hours": {"runs": run_seconds / 3600, "stage0": stage0_seconds / 3600,
                           "total": (run_seconds + stage0_seconds) / 3600, "cap": CAP_CORE_HOURS}}


def _verdict(stage2: dict[str, Any] | None, best: dict[str, Any] | None, tie: list[dict[str, Any]], *,
             complete: bool, decided: bool, cap_reached: bool) -> str:
    """The plan's verdict. Stage 1 complete with no cell meeting the criterion is the null; the cap reached first
    stops the search (the plan: what ran is reported); before either, a table whose every row already has a seed
    at or below the start says so (no run still to come can meet the criterion)."""
    if stage2 and stage2["met"] is not None:
        return "found" if stage2["met"] else "not confirmed"
    if complete and not best and not tie:
        return "no cell meets the criterion"
    if cap_reached:
        return f"not found within the {CAP_CORE_HOURS:.0f}-hour cap"
    if best:
        return "stage 2 to run"
    if tie:
        return "unresolved tie"
    return "no cell can meet the criterion (stage 1 incomplete)" if decided else "stage 1 incomplete"


def _f(x: float | None) -> str:
    return "—" if x is None else f"{x:+.3f}"


def table_markdown(t: dict[str, Any]) -> str:
    """The table as Markdown: one line per (cell, step count)."""
    lines = [f"Criterion: {t['criterion']}. Verdict: **{t['verdict']}**.", "",
             "| lr | pool | steps | rise, seed " + ", ".join(map(str, STAGE1_SEEDS)) + " | mean rise | met |",
             "|---|---|---:|---|---:|---|"]
    for r in t["rows"]:
        per = ", ".join(_f(r["rises"].get(str(s))) if str(s) in r["rises"] else "—" for s in STAGE1_SEEDS)
        met = "—" if r["met"] is None else "**yes**" if r["met"] else "no"
        lines.append(f"| {r['lr']} | {r['pool']} | {r['steps']} | {per} | {_f(r['mean_rise'])} | {met} |")
    h = t["core_hours"]
    if not t["stage1_complete"]:
        lines += ["", "A row reads no before its seeds are all in when a seed in is at or below the start: the "
                  "criterion wants every seed above it."]
    lines += ["", f"Runs: {t['runs']}; commits: {', '.join(c[:10] for c in t['commits']) or '—'}; runs with changed "
              f"code: {t['code_dirty_runs']}. Core-hours: {h['runs']:.2f} (runs) + {h['stage0']:.2f} (stage 0) = "
              f"{h['total']:.2f} of the {h['cap']:.0f}-hour cap."]
    if t["best"]:
        b = t["best"]
        lines.append(f"Stage 2 pick: lr {b['lr']}, pool {b['pool']}, {b['steps']} steps (mean rise {_f(b['mean_rise'])}).")
    if t["unresolved_tie"]:
        lines.append("Tie the plan's rules do not break: " + "; ".join(
            f"lr {r['lr']} {r['pool']} {r['steps']} steps" for r in t["unresolved_tie"]) + ".")
    if t["stage2"] and t["stage2"].get("met") is not None:
        s = t["stage2"]
        lines.append(f"Stage 2 ({', '.join(map(str, STAGE2_SEEDS))}): mean rise {_f(s['mean_rise'])}, per seed "
                     + ", ".join(_f(v) for v in s["rises"].values()) + f": {'met' if s['met'] else 'not met'}.")
    return "\n".join(lines) + "\n"
