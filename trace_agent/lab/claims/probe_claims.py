"""The claims over the Monte-Carlo probe: ``predictor`` and ``contrast``.

They run :class:`trace_agent.lab.analysis.MonteCarloProbe` through the bench: every candidate prompt gets
``--group-size`` root rollouts and every anchor (the prompt and each visited prefix) is scored by the
warmed-up predictor and estimated by ``--oracle-samples`` fresh continuations from its snapshot (the
Monte-Carlo truth; see :mod:`trace_agent.lab.analysis`). ``contrast --trees FILE`` reuses the probe trees a
``predictor --raw DIR`` run kept (``DIR/trees.jsonl``).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from trace_agent.bench import BenchConfig, BenchResult, run_bench
from trace_agent.lab.analysis import (
    FRACTIONS,
    SHARES,
    MonteCarloProbe,
    anchors_from_trees,
    contrast_summary,
    error_by_depth,
    rank_correlations,
    split_contrast_summary,
    spread,
)
from trace_agent.lab.claims.report import claim_header, fmt_spread, new_figure, write_claim
from trace_agent.lab.claims.settings import bench_config, claim_config
from trace_agent.lab.preregistered import fmt
from trace_agent.strategies import Budget


def probe_trees(args: argparse.Namespace, policy: Any) -> tuple[list[Any], int, BenchConfig]:
    """Run :class:`MonteCarloProbe` through the bench: every candidate is an anchor, as is every visited prefix."""
    base = claim_config(args)
    group, prompts, cont = base.budget.group_size, base.prompts, base.budget.continuations_per_root
    budget = Budget(roots=group * prompts, continuations_per_root=max(1, cont), group_size=group)
    config = bench_config(args, strategies=("probe",), budget=budget, base=base)
    result = run_bench(config, policy=policy, strategies=[MonteCarloProbe()],
                       log=lambda m: print(m, file=sys.stderr, flush=True))
    k = config.rollout.oracle_samples
    for tree in result.trees:
        tree.metadata["oracle_samples"] = k
    if args.raw:
        result.write(args.raw)
    return list(result.trees), k, config


def _probe_note(config: BenchConfig, k: int, anchors: Sequence[Any]) -> list[str]:
    """The Markdown note on what the probe measured: the Monte-Carlo truth, the anchors, the predictor."""
    roots = sum(a.depth == 0 for a in anchors)
    return [f"Truth: each anchor's Monte-Carlo success rate from K = {k} fresh continuations from its snapshot "
            f"(binomial noise sd = sqrt(V(1-V)/{k}), up to {0.5 / math.sqrt(k):.2f}); anchors: {roots} prompts (every "
            f"candidate, {config.budget.group_size} root rollouts each) and {len(anchors) - roots} visited prefixes. "
            f"Predictor: the bench's ({config.predictor} features) after its TreePO-style warm-up (prefix share "
            f"{'every prefix' if config.prefix_share is None else f'{config.prefix_share:g}'}), not updated while "
            "measured.", ""]


def run_predictor(args: argparse.Namespace, policy: Any) -> dict[str, Any]:
    """``predictor``: the predictor's error by anchor depth and its rank correlation at prompts and at prefixes."""
    trees, k, config = probe_trees(args, policy)
    anchors = anchors_from_trees(trees, samples=k)
    depth_rows = error_by_depth(anchors)
    ranks = rank_correlations(anchors)
    lines = [*claim_header("predictor", args, config), *_probe_note(config, k, anchors),
             "| depth | anchors | mean truth | MSE vs MC | ratio to prompts | MC noise | MSE vs true V (MSE - noise) "
             "| ratio to prompts | MAE | Spearman | prompt's MC rate as forecast: MSE |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in depth_rows:
        lines.append(f"| {int(r['depth'])} | {int(r['anchors'])} | {fmt(r['mean_truth'], 2)} | {fmt(r['mse'])} "
                     f"| {fmt(r['raw_ratio_to_prompt'], 2)} | {fmt(r['noise'])} | {fmt(r['mse_vs_true'])} "
                     f"| {fmt(r['ratio_to_prompt'], 2)} | {fmt(r['mae'])} "
                     f"| {fmt(r['spearman'], 2)} | {fmt(r['prompt_rate_mse'])} |")
    pooled, over = ranks["pooled"], ranks["over_seeds"]
    lines += ["", f"Spearman of v-hat vs Monte-Carlo truth: prompts {fmt(pooled['root'], 2)} "
              f"({int(pooled['roots'])} anchors; per seed {fmt_spread(over['root'], 2)}), prefixes {fmt(pooled['prefix'], 2)} "
              f"({int(pooled['prefixes'])} anchors; per seed {fmt_spread(over['prefix'], 2)})."]
    data = {"oracle_samples": k, "error_by_depth": depth_rows, "rank_correlations": ranks, "anchors": len(anchors),
            "config": json.loads(BenchResult(config=config, rows=(), summary={}, predictor={}).to_json())["config"]}

    def plot(out: Path) -> Path:
        fig = new_figure()
        ax = fig.add_subplot(1, 1, 1)
        d = [r["depth"] for r in depth_rows]
        ax.plot(d, [r["mse_vs_true"] for r in depth_rows], "o-", label="predictor: MSE vs true V (noise removed)")
        ax.plot(d, [r["mse"] for r in depth_rows], "s--", alpha=0.6, label="predictor: MSE vs MC rate")
        ax.plot(d, [r["prompt_rate_mse"] for r in depth_rows], "^:", label="prompt's MC rate as forecast")
        ax.set_xlabel("anchor depth (turns from the prompt)", fontsize=9)
        ax.set_ylabel("squared error", fontsize=9)
        ax.set_xticks(d)
        ax.legend(fontsize=8)
        ax.set_title(f"{config.env_id.split('/')[-1]}: predictor error by depth (K = {k})", fontsize=9)
        fig.savefig(out / "predictor.png", dpi=110)
        return out / "predictor.png"

    write_claim(args.out, "predictor", data, "\n".join(lines) + "\n", [plot])
    return data


def _capture_table(summaries: dict[str, Any], describe: Any, *, over_splits: bool = False) -> list[str]:
    """Markdown rows of capture summaries (one per level and ranking); ``describe(summary)`` labels a level."""
    lines = ["| anchors | ranking | " + " | ".join(f"top {f:.0%}" for f in FRACTIONS) + " | "
             + " | ".join(f"anchors for {s:.0%}" for s in SHARES) + " | AUC |" + (" AUC over splits |" if over_splits
                                                                                else ""),
             "|---|---|" + "---:|" * (len(FRACTIONS) + len(SHARES) + 1 + over_splits)]
    for level, summ in summaries.items():
        if "error" in summ:
            lines.append(f"| {level} ({summ['anchors']}) | - | {summ['error']} |")
            continue
        for name in ("oracle", "predicted", "random"):
            r = summ[name]
            lines.append(f"| {level} ({summ['anchors']}; {describe(summ)}) | {name} | "
                         + " | ".join(f"{r['at'][f'{f:g}']:.0%}" for f in FRACTIONS) + " | "
                         + " | ".join(f"{r['fraction_for'][f'{s:g}']:.0%}" for s in SHARES) + f" | {r['auc']:.2f} |"
                         + (f" {fmt_spread(r['auc_over_splits'], 2)} |" if over_splits else ""))
    return lines


def run_contrast(args: argparse.Namespace, policy: Any) -> dict[str, Any]:
    """``contrast``: the share of the available contrast each ranking of anchors captures, in and out of sample
    (on the probe trees of ``--trees`` if given, else on a new probe)."""
    if args.trees:
        from trace_agent.tree_io import load_jsonl

        trees = load_jsonl(args.trees)
        ks = {int(t.metadata.get("oracle_samples", 0)) for t in trees}
        if len(ks) != 1 or 0 in ks:
            raise SystemExit(f"paper_claims contrast: {args.trees} holds no probe trees (oracle_samples {sorted(ks)})")
        k, config = ks.pop(), None
    else:
        trees, k, config = probe_trees(args, policy)
    anchors = anchors_from_trees(trees, samples=k)
    levels = {"all anchors": anchors, "prompts": [a for a in anchors if a.depth == 0],
              "prefixes": [a for a in anchors if a.depth > 0]}
    summaries: dict[str, Any] = {}
    for level, sel in levels.items():
        try:
            summaries[level] = contrast_summary(sel)
        except ValueError as exc:
            summaries[level] = {"anchors": len(sel), "error": str(exc)}
    seeds = sorted({a.seed for a in anchors})
    per_seed: dict[str, dict[str, float]] = {}
    for s in seeds:
        try:
            summ = contrast_summary([a for a in anchors if a.seed == s])
        except ValueError:
            continue
        per_seed[str(s)] = {name: summ[name]["at"]["0.2"] for name in ("oracle", "predicted", "random")}
    lines = claim_header("contrast", args, config)
    if config is not None:
        lines += _probe_note(config, k, anchors)
    else:
        lines += [f"Trees: `{args.trees}` (K = {k}).", ""]
    lines += [f"Available contrast of an anchor: s(K - s) (success, failure) pairs among its K = {k} continuations "
              "(unbiased for K(K-1)V(1-V)). Rankings: oracle (by that contrast itself: the best any ranking can do), "
              "predicted (v-hat(1 - v-hat), TRACE's score), random (the exact expectation: the diagonal). Share of the "
              "total contrast captured by the top fraction of anchors:", "",
              *_capture_table(summaries, lambda summ: f"{summ['degenerate_share']:.0%} all-alike")]
    if per_seed:
        lines += ["", "Share captured by the top 20% of anchors, over seeds: " + ", ".join(
            f"{name} {fmt_spread(spread(v[name] for v in per_seed.values()), 2)}" for name in ("oracle", "predicted", "random"))]
    split: dict[str, Any] = {}
    for level, sel in levels.items():
        try:
            split[level] = split_contrast_summary(sel, splits=args.splits, seed=0)
        except ValueError as exc:
            split[level] = {"anchors": len(sel), "error": str(exc)}
    lines += ["", f"Out of sample: each anchor's K = {k} continuations split into halves A and B ({args.splits} random "
              "splits, averaged); every ranking is scored on half B's contrast, the oracle ranks by half A's "
              "(a Monte-Carlo estimate made beforehand), the predictor by v-hat(1 - v-hat):", "",
              *_capture_table(split, lambda summ: f"halves {summ['half_samples'][0]}/{summ['half_samples'][1]}, "
                                                  f"{summ['skipped_splits']} splits without contrast",
                              over_splits=True)]
    data = {"oracle_samples": k, "levels": summaries, "per_seed_top20": per_seed, "out_of_sample": split}

    def plot(out: Path) -> Path:
        fig = new_figure(7.5, 4.2)
        ax = fig.add_subplot(1, 1, 1)
        summ = summaries["all anchors"]
        if "error" not in summ:
            for name, style in (("oracle", "-"), ("predicted", "--"), ("random", ":")):
                y = summ[name]["curve"]
                ax.plot([i / (len(y) - 1) for i in range(len(y))], y, style, label=f"{name} (AUC {summ[name]['auc']:.2f})")
        ax.set_xlabel("top-ranked fraction of anchors", fontsize=9)
        ax.set_ylabel("share of available contrast captured", fontsize=9)
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        ax.set_title(f"contrast capture, {summ['anchors']} anchors (K = {k})", fontsize=9)
        fig.savefig(out / "contrast.png", dpi=110)
        return out / "contrast.png"

    write_claim(args.out, "contrast", data, "\n".join(lines) + "\n", [plot])
    return data
