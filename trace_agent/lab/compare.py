"""Equal-budget training comparison on any env: strategies x seeds from one starting policy, held-out success.

::

    from trace_agent.lab.compare import compare_training
    result = compare_training(config, ["trace", "grpo", "treepo"], [0, 1, 2])
    result.write("runs/compare")        # compare.json + compare.md
    print(result.to_markdown())

Every (strategy, seed) run is ``config`` with ``rollout.strategy`` and ``seed`` replaced, trained
with :func:`~trace_agent.run.run_training` into ``<config.out_dir>/<strategy>_s<seed>``
(no evaluation before training and none in between: every run starts from the same policy,
which is evaluated once, on the generator the runs evaluate on, closed before the first
run builds its own). Equal budget is the config's (M, N) for all: a branching strategy
spends M roots and N continuations per root, a flat one (GRPO, PCL) the same paper units as
M + M*N/2 root rollouts (:class:`~trace_agent.strategies.Budget`). Held-out success is
:func:`~trace_agent.evaluation.evaluate_heldout` on the first ``eval.tasks`` tasks of the
held-out split, ``eval.samples`` episodes each, with the same episode seeds for every run.

The summary per strategy: held-out success after training (mean, sample std over seeds, min,
max, per seed), mean effective ratio over steps, train-rollout success, paper units, generated
tokens, predictor share of step time and wall time; and, against a reference strategy (the
second one named, e.g. GRPO), the per-seed paired difference (same seed, same start, same
held-out episodes): mean, std and wins.

``scripts/demo_train.py --compare`` (PythonMath-v0) and ``scripts/paper_claims.py train`` (any env)
both run through :func:`compare_training`.
"""

from __future__ import annotations

import json
import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from trace_agent.config import TrainConfig
from trace_agent.config_io import config_to_dict

__all__ = ["ComparisonResult", "compare_training"]

_ROW_MEANS = ("effective_ratio", "train_success", "paper_units", "generated_tokens", "predictor_share", "seconds")


def _finite_mean(values: Sequence[float]) -> float:
    vals = [float(x) for x in values if not math.isnan(float(x))]
    return statistics.fmean(vals) if vals else math.nan


def _stats(values: Sequence[float]) -> dict[str, float]:
    vals = [float(x) for x in values if not math.isnan(float(x))]
    if not vals:
        return {"mean": math.nan, "std": math.nan, "min": math.nan, "max": math.nan}
    return {"mean": statistics.fmean(vals), "std": statistics.stdev(vals) if len(vals) > 1 else 0.0,
            "min": min(vals), "max": max(vals)}


@dataclass(frozen=True, kw_only=True)
class ComparisonResult:
    """What :func:`compare_training` measured.

    Attributes:
        config: the base config as a dict (the per-run strategy and seed replace its own).
        strategies: in table order; the second (when there are two or more) is the reference.
        seeds: the training seeds.
        base: held-out result of the starting policy (``success``, ``success_se``, ``tasks``,
            ``samples``, ``episodes``).
        rows: one per (strategy, seed): ``after`` (held-out success), ``after_se``,
            ``effective_ratio`` (mean over steps), ``train_success``, ``paper_units``,
            ``generated_tokens``, ``predictor_share``, ``seconds``, ``out_dir``.
        command: the command line, recorded in the outputs.
    """

    config: dict[str, Any]
    strategies: tuple[str, ...]
    seeds: tuple[int, ...]
    base: dict[str, float]
    rows: tuple[dict[str, Any], ...]
    command: str = ""

    @property
    def reference(self) -> str | None:
        return self.strategies[1] if len(self.strategies) > 1 else None

    def summary(self) -> dict[str, dict[str, Any]]:
        """Per strategy: ``after`` stats, ``per_seed``, means of the other row keys, and ``vs_reference``."""
        out: dict[str, dict[str, Any]] = {}
        ref = self.reference
        ref_after = {r["seed"]: r["after"] for r in self.rows if r["strategy"] == ref}
        for name in self.strategies:
            mine = [r for r in self.rows if r["strategy"] == name]
            entry: dict[str, Any] = {"after": _stats([r["after"] for r in mine]),
                                     "per_seed": {str(r["seed"]): r["after"] for r in mine}}
            for key in _ROW_MEANS:
                entry[key] = _finite_mean([r[key] for r in mine])
            if ref is not None and name != ref:
                diffs = [r["after"] - ref_after[r["seed"]] for r in mine if r["seed"] in ref_after]
                entry["vs_reference"] = {**_stats(diffs), "wins": sum(d > 0 for d in diffs),
                                         "ties": sum(d == 0 for d in diffs), "seeds": len(diffs)}
            out[name] = entry
        return out

    def to_json(self) -> str:
        return json.dumps({"command": self.command, "config": self.config, "strategies": list(self.strategies),
                           "seeds": list(self.seeds), "base": self.base, "rows": list(self.rows),
                           "summary": self.summary()}, indent=1, default=str)

    def _base_text(self) -> str:
        se = float(self.base.get("success_se", math.nan))
        text = f"{self.base['success']:.3f}"
        return f"{text} ± {se:.3f} (s.e.)" if math.isfinite(se) else text

    def to_markdown(self) -> str:
        from trace_agent.config_io import resolve_aliases

        c = resolve_aliases(self.config)  # a config written with the flat keys reads as the nested one
        r, b, e = c["rollout"], c["rollout"]["budget"], c["eval"]
        units = b["roots"] * (1 + b["continuations_per_root"] * b["continuation_cost"])
        lines = [f"Command: `{self.command}`" if self.command else "", "",
                 f"`{c['env_id']}`: {len(self.seeds)} seeds ({', '.join(map(str, self.seeds))}) x {c['steps']} steps "
                 f"per run; budget per step {units:g} paper units (M = {b['roots']}, N = {b['continuations_per_root']}, "
                 f"group {b['group_size']}, {r['prompts_per_step']} candidate prompts); objective "
                 f"{c['objective']['name']}; held-out: {self.base['tasks']} `{e['split']}` tasks x {self.base['samples']} "
                 f"samples; starting policy {self._base_text()}.", "",
                 "| strategy | held-out success after (mean ± sd over seeds) [min, max] | per seed | vs "
                 f"{self.reference or '-'} (paired, mean ± sd; wins) | effective ratio | train rollout success "
                 "| paper units | generated tokens | predictor share | wall s/run |",
                 "|---|---|---|---|---:|---:|---:|---:|---:|---:|"]
        for name, s in self.summary().items():
            a = s["after"]
            vs = s.get("vs_reference")
            vs_text = (f"{vs['mean']:+.3f} ± {vs['std']:.3f}; {vs['wins']}/{vs['seeds']}" if vs and vs["seeds"]
                       else "-")
            lines.append(
                f"| {name} | {a['mean']:.3f} ± {a['std']:.3f} [{a['min']:.3f}, {a['max']:.3f}] "
                f"| {self._per_seed_text(s['per_seed'])} | {vs_text} "
                f"| {s['effective_ratio']:.2f} | {s['train_success']:.2f} | {s['paper_units']:.0f} "
                f"| {s['generated_tokens']:.0f} | {s['predictor_share']:.1%} | {s['seconds']:.0f} |")
        return "\n".join(lines).strip() + "\n"

    def _per_seed_text(self, per_seed: dict[str, float]) -> str:
        """Values in seed order; labelled with their seeds when a strategy ran on only some of the seeds."""
        if [int(k) for k in per_seed] == list(self.seeds):
            return " / ".join(f"{x:.3f}" for x in per_seed.values())
        return " / ".join(f"{k}: {x:.3f}" for k, x in per_seed.items())

    @classmethod
    def from_json(cls, text: str) -> ComparisonResult:
        """The result :meth:`to_json` wrote (extra keys, such as a claim file's ``claim`` and ``paper``, ignored).

        Raises ValueError when a key is missing or has the wrong type (the text is only ever parsed as JSON)."""
        data = json.loads(text)
        try:
            rows = tuple({**r, "strategy": str(r["strategy"]), "seed": int(r["seed"]), "after": float(r["after"])}
                         for r in data["rows"])
            return cls(config=dict(data["config"]), strategies=tuple(str(s) for s in data["strategies"]),
                       seeds=tuple(int(s) for s in data["seeds"]), base=dict(data["base"]), rows=rows,
                       command=str(data.get("command", "")))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ValueError(f"not a training comparison: {exc!r}") from None

    @classmethod
    def merge(cls, parts: Sequence[ComparisonResult]) -> ComparisonResult:
        """One comparison of runs measured in parts (seeds or strategies split over processes or machines).

        The parts must agree on the config (``out_dir`` aside) and on the starting policy's held-out result, so
        only runs of the same comparison are pooled; strategies keep their first-seen order (the first part's
        reference stays the reference), seeds are sorted, commands are kept in order. Raises ValueError when
        ``parts`` is empty, the parts disagree, or a (strategy, seed) run is in two parts.
        """
        if not parts:
            raise ValueError("merge needs at least one comparison")
        first = parts[0]
        config = {k: v for k, v in first.config.items() if k != "out_dir"}
        rows: dict[tuple[str, int], dict[str, Any]] = {}
        strategies: list[str] = []
        for k, part in enumerate(parts):
            other = {key: v for key, v in part.config.items() if key != "out_dir"}
            if other != config:
                keys = sorted(key for key in set(config) | set(other) if config.get(key) != other.get(key))
                raise ValueError(f"part {k} was trained with another config (differs in {', '.join(keys)})")
            if part.base != first.base:
                raise ValueError(f"part {k} starts from another held-out result ({part.base} vs {first.base})")
            for row in part.rows:
                key = (row["strategy"], row["seed"])
                if key in rows:
                    raise ValueError(f"{key[0]} seed {key[1]} is in two parts")
                rows[key] = row
            strategies += [name for name in part.strategies if name not in strategies]
        order = {name: i for i, name in enumerate(strategies)}
        return cls(config=dict(first.config), strategies=tuple(strategies),
                   seeds=tuple(sorted({seed for _, seed in rows})), base=dict(first.base),
                   rows=tuple(rows[k] for k in sorted(rows, key=lambda k: (order[k[0]], k[1]))),
                   command="; ".join(dict.fromkeys(p.command for p in parts if p.command)))

    def write(self, out_dir: str | Path) -> list[Path]:
        """``compare.json`` and ``compare.md`` under ``out_dir``; returns the paths."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        paths = [out / "compare.json", out / "compare.md"]
        paths[0].write_text(self.to_json())
        paths[1].write_text(self.to_markdown())
        return paths


def compare_training(config: TrainConfig, strategies: Sequence[str], seeds: Sequence[int], *,
                     log: Callable[[str], None] = print, command: str = "") -> ComparisonResult:
    """Train every (strategy, seed) from ``config``'s policy at its equal budget; evaluate all on the same episodes.

    Raises ValueError when no strategy or no seed is given, or a strategy is named twice.
    """
    from trace_agent.evaluation import evaluate_heldout
    from trace_agent.policy.base import close_generator
    from trace_agent.run import run_training
    from trace_agent.wiring import build_policies

    if not strategies or not seeds:
        raise ValueError("name at least one strategy and one seed")
    if len(set(strategies)) != len(strategies) or len(set(seeds)) != len(seeds):
        raise ValueError(f"strategies and seeds must be distinct, got {list(strategies)} and {list(seeds)}")
    out = Path(config.out_dir)
    learner, generator = build_policies(config.policy, seed=0, env_id=config.env_id)
    try:
        base_eval = evaluate_heldout(generator, config)
    finally:
        close_generator(generator, learner)
    del learner, generator
    base = {"success": base_eval.success, "success_se": base_eval.success_se, "tasks": base_eval.tasks,
            "samples": base_eval.samples, "episodes": base_eval.episodes}
    log(f"starting policy: held-out success {base_eval.success:.3f} ({base_eval.tasks} tasks x "
        f"{base_eval.samples} samples)")
    rows: list[dict[str, Any]] = []
    for seed in seeds:
        for strategy in strategies:
            run_dir = out / f"{strategy.replace(':', '_')}_s{seed}"
            cfg = replace(config, seed=seed, out_dir=str(run_dir), rollout=replace(config.rollout, strategy=strategy),
                          eval=replace(config.eval, every=0))
            t = time.perf_counter()
            rep = run_training(cfg, evaluate="after", log=lambda _m: None)
            if rep.after is None:  # run_training(evaluate="after") always evaluates; guard the contract
                raise RuntimeError(f"run {run_dir} returned no held-out evaluation")
            rows.append({"strategy": strategy, "seed": seed, "after": rep.after.success,
                         "after_se": rep.after.success_se, "effective_ratio": _finite_mean(rep.effective_ratio),
                         "train_success": _finite_mean(rep.train_success), "paper_units": rep.paper_units,
                         "generated_tokens": rep.generated_tokens, "predictor_share": rep.predictor_share,
                         "seconds": time.perf_counter() - t, "out_dir": str(run_dir)})
            log(json.dumps(rows[-1]))
    return ComparisonResult(config=config_to_dict(config), strategies=tuple(strategies), seeds=tuple(seeds),
                            base=base, rows=tuple(rows), command=command)
