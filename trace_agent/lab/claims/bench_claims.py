"""The claims over the strategies bench: ``ratio``, ``ablation``, ``shape`` and ``budget``.

Each is a layer over :func:`trace_agent.bench.run_bench` (strategies at equal budget, common random
numbers per seed, the predictor warmed up on TreePO-style trees of other tasks), or over the rows of a
saved ``bench.json`` (``--bench-json``: ``ratio``, ``ablation``, ``budget``). Each runner takes the
parsed options and the policy, writes its outputs under ``--out`` and returns the claim's data.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from trace_agent.bench import BenchConfig, BenchResult, run_bench, summarize
from trace_agent.config_io import override
from trace_agent.lab.analysis import budget_profile, shape_costs
from trace_agent.lab.claims.report import (
    bar_plot,
    claim_header,
    fmt_spread,
    new_figure,
    per_seed_values,
    ratio_table,
    rows_data,
    write_claim,
)
from trace_agent.lab.claims.settings import STAGES, bench_config, claim_config, parse_budget, strategy_names
from trace_agent.lab.preregistered import fmt
from trace_agent.policy.base import SamplingConfig
from trace_agent.rollout import RolloutConfig
from trace_agent.strategies import Budget


def load_bench(path: str | Path, strategies: Sequence[str]) -> BenchResult:
    """The rows of a saved ``bench.json`` for ``strategies`` (those it holds, in the order asked), re-summarised."""
    data = json.loads(Path(path).read_text())
    cfg = dict(data["config"])
    rollout = {k: v for k, v in cfg.pop("rollout").items() if k != "ray"}
    # the sampling settings: one "sampling" object, or (files that hold them as flat rollout fields) flat fields
    flat = {k: rollout.pop(k) for k in ("max_new_tokens", "temperature", "top_p") if k in rollout}
    sampling = rollout.pop("sampling", None) or flat
    chosen = [s for s in strategies if s in cfg["strategies"]]
    if not chosen:
        raise SystemExit(f"paper_claims: {path} holds none of {', '.join(strategies)} (it has "
                         f"{', '.join(cfg['strategies'])})")
    config = BenchConfig(**{**cfg, "strategies": tuple(chosen), "budget": Budget(**cfg["budget"]),
                            "rollout": RolloutConfig(**rollout, sampling=SamplingConfig(**sampling))})
    rows = tuple(r for name in chosen for r in data["rows"] if r["strategy"] == name)
    rows = tuple(sorted(rows, key=lambda r: (r["seed"], chosen.index(r["strategy"]))))
    return BenchResult(config=config, rows=rows, summary=summarize(rows), predictor=data.get("predictor", {}))


def _bench(args: argparse.Namespace, policy: Any, config: BenchConfig, **kwargs: Any) -> BenchResult:
    """The rows of ``--bench-json`` if given, else ``config`` run on ``policy`` (kept under ``--raw`` if given)."""
    if getattr(args, "bench_json", None):
        return load_bench(args.bench_json, config.strategies)
    result = run_bench(config, policy=policy, log=lambda m: print(m, file=sys.stderr, flush=True), **kwargs)
    if args.raw:
        result.write(args.raw)
    return result


def run_ratio(args: argparse.Namespace, policy: Any) -> dict[str, Any]:
    """``ratio``: the effective ratio per strategy at equal budget; ``ratio.json``, ``.md`` and ``.png``."""
    result = _bench(args, policy, bench_config(args, strategies=strategy_names(args)))
    config = result.config
    md = "\n".join([*claim_header("ratio", args, config), *ratio_table(result)]) + "\n"
    write_claim(args.out, "ratio", rows_data(result), md, [lambda out: bar_plot(
        out / "ratio.png", per_seed_values(result), "effective ratio (mixed / active)",
        f"{config.env_id.split('/')[-1]}: effective ratio at equal budget (dots = seeds)")])
    return rows_data(result)


def run_ablation(args: argparse.Namespace, policy: Any) -> dict[str, Any]:
    """``ablation``: the effective ratio with neither, either or both allocation stages (:data:`STAGES`)."""
    result = _bench(args, policy, bench_config(args, strategies=strategy_names(args)))
    config = result.config
    md = "\n".join([*claim_header("ablation", args, config), *ratio_table(result, lambda n: STAGES.get(n, n))]) + "\n"
    data = rows_data(result)
    write_claim(args.out, "ablation", data, md, [lambda out: bar_plot(
        out / "ablation.png", per_seed_values(result), "effective ratio (mixed / active)",
        f"{config.env_id.split('/')[-1]}: stage ablation (dots = seeds)")])
    return data


def _shapes(args: argparse.Namespace, config: BenchConfig) -> tuple[Budget, Budget]:
    """The wide and the deep budget of ``shape`` (around ``config``'s); they must cost the same paper units."""
    group = config.budget.group_size
    m = config.budget.roots
    wide = parse_budget(args.wide or f"{m},2", group)
    deep = parse_budget(args.deep or f"{m // 2},6", group)
    if not math.isclose(wide.paper_units, deep.paper_units):
        raise SystemExit(f"paper_claims shape: the shapes cost {wide.paper_units:g} and {deep.paper_units:g} paper "
                         "units; choose M,N pairs with equal M(1 + N/2)")
    return wide, deep


def run_shape(args: argparse.Namespace, policy: Any) -> dict[str, Any]:
    """``shape``: the strategies on a wide (M, 2) and a deep (M/2, 6) budget of equal paper units."""
    base = claim_config(args)
    wide, deep = _shapes(args, base)
    results: dict[str, tuple[Budget, BenchResult]] = {}
    raw = args.raw
    for label, budget in (("wide", wide), ("deep", deep)):
        config = bench_config(args, strategies=strategy_names(args), budget=budget, base=base)
        args.raw = None if raw is None else str(Path(raw) / label)
        results[label] = (budget, _bench(args, policy, config))
    args.raw = raw
    costs = shape_costs({k: (b, r.rows) for k, (b, r) in results.items()})
    lines = claim_header("shape", args, bench_config(args, strategies=strategy_names(args), budget=wide, base=base))
    lines += [f"Shapes: wide (M, N) = ({wide.roots}, {wide.continuations_per_root}) on at most {wide.max_active} prompts, "
              f"deep ({deep.roots}, {deep.continuations_per_root}) on at most {deep.max_active}; planned paper units "
              f"{wide.paper_units:g} and {deep.paper_units:g}, measured per batch "
              + ", ".join(f"{k} {v['measured_min']:g}-{v['measured_max']:g}" for k, v in costs["shapes"].items())
              + f": **{'equal' if costs['equal'] else 'NOT equal'}**. Each shape's predictor is warmed up on the same "
              "tasks, collected TreePO-style in that shape; pools and seeds are the same.", "",
              "| shape | strategy | effective ratio | per seed | mixed / active | contrast pairs | paper units "
              "| gen. tokens |", "|---|---|---|---|---:|---:|---:|---:|"]
    for label, (budget, result) in results.items():
        seeds = per_seed_values(result)
        for name, s in result.summary.items():
            lines.append(f"| {label} ({budget.roots}, {budget.continuations_per_root}) | {name} "
                         f"| {fmt_spread(s['effective_ratio'])} | {' / '.join(fmt(x, 2) for x in seeds[name])} "
                         f"| {s['mixed_trees']['mean']:.1f} / {s['active_prompts']['mean']:.1f} "
                         f"| {s['contrast_pairs']['mean']:.1f} | {s['paper_units']['mean']:.1f} "
                         f"| {s['generated_tokens']['mean']:.0f} |")
    data = {"costs": costs, "shapes": {k: rows_data(r) for k, (_, r) in results.items()}}
    groups = {f"{k} {n}": v for k, (_, r) in results.items() for n, v in per_seed_values(r).items()}
    write_claim(args.out, "shape", data, "\n".join(lines) + "\n", [lambda out: bar_plot(
        out / "shape.png", groups, "effective ratio (mixed / active)",
        f"wide ({wide.roots},{wide.continuations_per_root}) vs deep ({deep.roots},{deep.continuations_per_root}) at "
        f"{wide.paper_units:g} paper units (dots = seeds)")])
    return data


def _budget_claim_config(args: argparse.Namespace) -> BenchConfig:
    """``budget``'s config: its candidate pool is ``--pool-factor`` times the budget's most active prompts, unless
    ``--prompts`` (or ``--set rollout.prompts_per_step``) names it."""
    if args.prompts is not None:
        return claim_config(args)
    unbounded = claim_config(args, after_flags=[override("rollout.prompts_per_step", 1 << 30)])  # the budget alone
    return claim_config(args, after_flags=[override("rollout.prompts_per_step",
                                                    args.pool_factor * unbounded.budget.max_active)])


def run_budget(args: argparse.Namespace, policy: Any) -> dict[str, Any]:
    """``budget``: where each strategy's budget goes (prompts skipped, rollouts per active prompt, depths)."""
    result = _bench(args, policy, bench_config(args, strategies=strategy_names(args), base=_budget_claim_config(args)))
    config = result.config
    budget, prompts = config.budget, config.prompts
    profile = budget_profile(result.rows, prompts=prompts, budget=budget)
    lines = claim_header("budget", args, config)
    lines += [f"Every strategy may activate at most {budget.max_active} of the {prompts} candidates, so at least "
              f"{next(iter(profile.values()))['skip_floor']:.0%} are skipped by the budget rules alone.", "",
              "| strategy | skipped share of candidates | roots per active prompt | rollouts (roots + continuations) "
              "per active prompt | paper units per active prompt | continuation start depth: share | deepest |",
              "|---|---|---|---|---|---|---:|"]
    for name, p in profile.items():
        depths = " ".join(f"{d}:{c:.0%}" for d, c in p["continuation_depths"].items()) or "-"
        lines.append(f"| {name} | {fmt_spread(p['skipped_share'], 2)} | {fmt_spread(p['roots_per_active'], 1)} "
                     f"| {fmt_spread(p['rollouts_per_active'], 1)} | {fmt_spread(p['units_per_active'], 1)} | {depths} "
                     f"| {p['deepest_continuation']} |")
    data = {**rows_data(result), "profile": profile, "prompts": prompts}

    def plot(out: Path) -> Path:
        fig = new_figure()
        ax = fig.add_subplot(1, 1, 1)
        names = [n for n, p in profile.items() if p["continuation_depths"]]
        depths = sorted({int(d) for n in names for d in profile[n]["continuation_depths"]})
        w = 0.8 / max(1, len(names))
        for j, n in enumerate(names):
            ax.bar([d - 0.4 + (j + 0.5) * w for d in depths],
                   [profile[n]["continuation_depths"].get(str(d), 0.0) for d in depths], width=w, label=n)
        ax.set_xticks(depths)
        ax.set_xlabel("turn a continuation starts after (depth)", fontsize=9)
        ax.set_ylabel("share of continuations", fontsize=9)
        ax.set_title(f"{config.env_id.split('/')[-1]}: where continuations start", fontsize=9)
        if names:
            ax.legend(fontsize=8)
        fig.savefig(out / "budget.png", dpi=110)
        return out / "budget.png"

    write_claim(args.out, "budget", data, "\n".join(lines) + "\n", [plot])
    return data
