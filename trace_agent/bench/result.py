"""A bench run's results: :class:`BenchResult` (rows, per-strategy summary, predictor metrics; JSON, Markdown,
plots) and the per-(strategy, seed) row a collection becomes."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from trace_agent.bench.config import BenchConfig
from trace_agent.bench.plots import plot_result
from trace_agent.rollout import Collection

__all__ = ["BenchResult", "bench_row", "summarize"]

_SUMMARY_KEYS = ("effective_ratio", "success_rate", "mixed_trees", "active_prompts", "contrast_pairs", "skipped", "root_rollouts",
                 "continuations", "paper_units", "generated_tokens", "env_steps", "wall_seconds",
                 "oracle_generated_tokens")


@dataclass(frozen=True, kw_only=True)
class BenchResult:
    """Rows (one per strategy and seed), the per-strategy summary and the predictor's warm-up metrics."""

    config: BenchConfig
    rows: tuple[dict[str, Any], ...]
    summary: dict[str, dict[str, dict[str, float]]]
    predictor: dict[str, Any]
    trees: tuple[Any, ...] = ()

    def to_json(self) -> str:
        cfg = asdict(self.config)
        return json.dumps({"config": cfg, "rows": list(self.rows), "summary": self.summary,
                           "predictor": self.predictor}, indent=2, default=_json_default, allow_nan=True)

    def comparisons(self) -> dict[str, float]:
        """TRACE vs GRPO (ratio), vs TreePO (points) and vs Oracle (share), on mean effective ratios."""
        mean = {name: s["effective_ratio"]["mean"] for name, s in self.summary.items()}
        out: dict[str, float] = {}
        if "trace" in mean:
            t = mean["trace"]
            if "grpo" in mean:
                out["trace_over_grpo"] = t / mean["grpo"] if mean["grpo"] else math.nan  # x/0: undefined
            if "treepo" in mean:
                out["trace_minus_treepo_points"] = 100.0 * (t - mean["treepo"])
            if "oracle" in mean:
                out["trace_share_of_oracle"] = t / mean["oracle"] if mean["oracle"] else math.nan
        return out

    def to_markdown(self) -> str:
        b = self.config.budget
        lines = [
            f"Command: `{self.config.command}`" if self.config.command else "",
            "",
            f"Env `{self.config.env_id}`, budget (M, N) = ({b.roots}, {b.continuations_per_root}), group size "
            f"{b.group_size} (at most {b.max_active} active prompts of a pool of {self.config.prompts}), "
            f"{b.paper_units:g} paper units per batch; {self.config.seeds} seeds; mean ± std over seeds "
            f"[min, max].",
            "",
            "| strategy | effective ratio | mixed groups | contrast pairs | skipped | leaf success | roots + conts "
            "| paper units | gen. tokens | env steps | wall s | branch depths | continuation depths |",
            "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|",
        ]
        for name, s in self.summary.items():
            er = s["effective_ratio"]
            hist, cont = (" ".join(f"{d}:{c:.3g}" for d, c in sorted(s.get(h, {}).items(), key=lambda kv: int(kv[0])))
                          or "-" for h in ("branch_depths", "continuation_depths"))
            lines.append(
                f"| {name} | {er['mean']:.3f} ± {er['std']:.3f} [{er['min']:.2f}, {er['max']:.2f}] "
                f"| {s['mixed_trees']['mean']:.1f} / {s['active_prompts']['mean']:.1f} "
                f"| {s['contrast_pairs']['mean']:.1f} | {s['skipped']['mean']:.1f} | {s['success_rate']['mean']:.2f} "
                f"| {s['root_rollouts']['mean']:.1f} + {s['continuations']['mean']:.1f} "
                f"| {s['paper_units']['mean']:.1f} | {s['generated_tokens']['mean']:.0f} "
                f"| {s['env_steps']['mean']:.0f} | {s['wall_seconds']['mean']:.1f} | {hist} | {cont} |"
            )
        comp = self.comparisons()
        if comp:
            lines += ["", "Comparisons on mean effective ratio: " + ", ".join(
                f"{k} = {v:.2f}" if math.isfinite(v) else f"{k} = n/a (zero denominator)" for k, v in comp.items())]
        if self.predictor:
            keys = ("pre_spearman_root", "pre_spearman_prefix", "pre_mse", "examples", "mc_spearman_root",
                    "pre_spearman_root_mc_prompts")
            shown = {k: self.predictor.get("measured", {}).get(k) for k in keys}
            lines += ["", "Predictor on the measured trees (after warm-up, before any update): " + ", ".join(
                f"{k.removeprefix('pre_')} = {v:.3f}" for k, v in shown.items() if isinstance(v, float))]
        rates = self.predictor.get("oracle_prompt_rates")
        if rates:
            lines += ["", f"Monte-Carlo success rates of the {rates['prompts']} measured prompts (Oracle's "
                      f"{self.config.rollout.oracle_samples} samples each): {rates['all_fail']} never solved, "
                      f"{rates['all_success']} always solved, {rates['mixed']} in between (mean {rates['mean']:.2f})."]
        return "\n".join(lines).strip() + "\n"

    def write(self, out_dir: str | Path) -> list[Path]:
        """``bench.json``, ``bench.md`` and the plots under ``out_dir``; returns the paths."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        paths = [out / "bench.json", out / "bench.md"]
        paths[0].write_text(self.to_json())
        paths[1].write_text(self.to_markdown())
        if self.trees:
            from trace_agent.tree_io import save_jsonl

            paths.append(save_jsonl(self.trees, out / "trees.jsonl"))
        paths += plot_result(self, out)
        return paths


def _json_default(obj: Any) -> Any:
    if isinstance(obj, (np.integer, np.floating)):
        return obj.item()
    if isinstance(obj, Path):
        return str(obj)
    return str(obj)


def bench_row(collection: Collection, seed: int) -> dict[str, Any]:
    """One row of ``bench.json``: a strategy's batch on one seed (effective ratio, success, budget spent, skips)."""
    s = collection.stats()
    return {
        "strategy": collection.strategy, "seed": seed, "effective_ratio": s.effective_ratio,
        "success_rate": s.successes / s.leaves if s.leaves else math.nan,
        "mixed_trees": s.mixed_trees, "active_prompts": s.active_prompts, "contrast_pairs": s.contrast_pairs,
        "skipped": len(collection.skipped), "root_rollouts": s.root_rollouts, "continuations": s.continuations,
        "paper_units": s.paper_units, "generated_tokens": s.generated_tokens, "env_steps": s.env_steps,
        "wall_seconds": collection.wall_seconds, "oracle_generated_tokens": collection.oracle_generated_tokens,
        "oracle_env_steps": collection.oracle_env_steps, "leaves": s.leaves, "successes": s.successes,
        "branch_depths": {str(k): v for k, v in s.branch_depths.items()},
        "continuation_depths": {str(k): v for k, v in s.continuation_depths.items()},
        "prompts": _prompt_rows(collection),
    }


def _prompt_rows(collection: Collection) -> list[dict[str, Any]]:
    """Per candidate prompt, in pool order: its id, the roots it got, the value the strategy allocated
    with (None where it asked for none) and its tree's leaf success rate (None when skipped) — what a
    reader needs to see *why* a strategy skipped or favoured a prompt (ties, degenerate predictions)."""
    leaf_success: dict[str, float | None] = {}
    for tree in collection.trees:
        successes, failures = tree.outcome_counts()
        leaf_success[tree.prompt_id] = successes / (successes + failures) if successes + failures else None
    values = collection.root_values or tuple(math.nan for _ in collection.prompt_ids)
    return [{"id": pid, "roots": int(m), "value": float(v) if math.isfinite(v) else None,
             "leaf_success": leaf_success.get(pid)}
            for pid, m, v in zip(collection.prompt_ids, collection.roots, values, strict=True)]


def summarize(rows: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per strategy (in first-seen order): mean / std / min / max over seeds, mean depth histograms."""
    out: dict[str, dict[str, Any]] = {}
    for name in dict.fromkeys(r["strategy"] for r in rows):
        mine = [r for r in rows if r["strategy"] == name]
        entry: dict[str, Any] = {}
        for key in _SUMMARY_KEYS:
            vals = np.asarray([float(r[key]) for r in mine])
            vals = vals[np.isfinite(vals)]
            entry[key] = {"mean": float(vals.mean()) if vals.size else math.nan,
                          "std": float(vals.std(ddof=1)) if vals.size > 1 else 0.0,
                          "min": float(vals.min()) if vals.size else math.nan,
                          "max": float(vals.max()) if vals.size else math.nan}
        for hist in ("branch_depths", "continuation_depths"):
            total: dict[str, float] = {}
            for r in mine:
                for d, c in r[hist].items():
                    total[d] = total.get(d, 0.0) + c / len(mine)
            entry[hist] = total
        out[name] = entry
    return out
