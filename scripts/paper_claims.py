"""The paper's claims in miniature: one subcommand per claim, each writing JSON + Markdown (+ PNG) and printing its table.

    python scripts/paper_claims.py ratio     --out docs/paper/math/ratio       # effective ratio per strategy
    python scripts/paper_claims.py ablation  --out docs/paper/math/ablation    # root-only / prefix-only / both
    python scripts/paper_claims.py shape     --out docs/paper/math/shape       # wide (M, 2) vs deep (M/2, 6)
    python scripts/paper_claims.py budget    --out docs/paper/math/budget      # where TRACE's budget goes
    python scripts/paper_claims.py predictor --out docs/paper/math/predictor   # error by depth, Spearman
    python scripts/paper_claims.py contrast  --out docs/paper/math/contrast    # contrast capture curves
    python scripts/paper_claims.py train     --out runs/claims/train           # held-out success after training

Every subcommand takes ``--small`` (the tests' mode: seconds to a minute) and the bench's options
(``--env``, ``--env-kwargs``, ``--policy``, ``--seeds``, ``--prompts``, ``--budget``, ``--group-size``,
``--warmup-prompts``, ``--max-turns``, ``--max-new-tokens``, ``--oracle-samples``, ``--workers``);
``--raw DIR`` also keeps the underlying bench outputs (bench.json, trees.jsonl, plots) there.

``ratio``, ``ablation``, ``shape`` and ``budget`` are layers over :func:`trace_agent.bench.run_bench`
(strategies at equal budget, common random numbers per seed, the predictor warmed up on TreePO-style
trees of other tasks). ``predictor`` and ``contrast`` run :class:`trace_agent.analysis.MonteCarloProbe`
through the same bench: every candidate prompt gets ``--group-size`` root rollouts and every anchor
(the prompt and each visited prefix) is scored by the warmed-up predictor and estimated by
``--oracle-samples`` fresh continuations from its snapshot (the Monte-Carlo truth; see
:mod:`trace_agent.analysis`). ``contrast --trees FILE`` reuses the probe trees a ``predictor --raw DIR``
run kept (``DIR/trees.jsonl``). ``train`` is :func:`trace_agent.compare.compare_training` on a
training config (``--config``, default docs/configs/demo.yaml; ``--set`` overrides).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import sys
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trace_agent.analysis import (  # noqa: E402
    FRACTIONS,
    SHARES,
    MonteCarloProbe,
    anchors_from_trees,
    budget_profile,
    contrast_summary,
    error_by_depth,
    rank_correlations,
    shape_costs,
    split_contrast_summary,
    spread,
)
from trace_agent.bench import BENCH_PREDICTORS, BenchConfig, BenchResult, prefix_share_arg, run_bench  # noqa: E402
from trace_agent.policy.base import SamplingConfig  # noqa: E402
from trace_agent.preregistered import (  # noqa: E402
    PLAN_PAIRS,
    RunTableError,
    arm_file_stem,
    build_table,
    fmt,
    kept_step_metric,
    load_runs,
    parse_arm,
    table_markdown,
)
from trace_agent.rollout import RolloutConfig  # noqa: E402
from trace_agent.strategies import Budget  # noqa: E402

#: The paper's figures, as its public summaries (blog post and abstract) state them.
PAPER: dict[str, str] = {
    "ratio": "effective sample ratio on DeepScaleR math, GRPO 26.8% -> TRACE 60.6% (Qwen3-8B), 34.7% -> 59.7% "
             "(Qwen3-14B); TRACE lifts the effective ratio ~10 points over random branching (TreePO) at every budget",
    "ablation": "Qwen3-8B multi-hop QA: effective ratio 42.8 with neither stage (uniform roots, random prefixes), "
                "49.1 root allocation only, 47.3 prefix allocation only, both highest",
    "shape": "at the same budget of 2048, (M, N) = (1024, 2) (wider root coverage) beats (512, 6) (deeper branching)",
    "budget": "BFCL: 65-71% of candidate prompts skipped, 5-7 rollouts per active prompt, replays spread along the "
              "trajectory (largest share at the earliest turns, meaningful budget up to turn 15)",
    "predictor": "Qwen3-8B HotpotQA: group-success error falls to about a third of its prompt-level value by turn 4; "
                 "rank correlation positive at prompts and at prefixes",
    "contrast": "many prompts and prefixes sit near 0% or 100%; ranking anchors by V(1-V) lets a small fraction of the "
                "budget capture most of the available pairwise contrast",
    "train": "equal budget: TRACE's average above GRPO, PCL and TreePO (Qwen3-14B: math 73.5 -> 74.9, multi-hop QA "
             "51.2 -> 54.0, function calling 46.1 -> 48.0)",
}

#: ``--small``: the tests' sizes (a minute or less with the demo policy on PythonMath-v0).
SMALL: dict[str, Any] = {"seeds": 2, "prompts": 4, "budget": "8,2", "group_size": 2, "warmup_prompts": 4,
                         "oracle_samples": 4, "max_new_tokens": 200}
#: Defaults otherwise (the sizes of docs/benchmarks.md's strategies bench).
FULL: dict[str, Any] = {"seeds": 5, "prompts": 12, "budget": "24,2", "group_size": 4, "warmup_prompts": 96,
                        "oracle_samples": 8, "max_new_tokens": 200}

DEFAULT_STRATEGIES: dict[str, str] = {"ratio": "grpo,pcl,treepo,trace,oracle", "ablation": "treepo,trace-root,trace-prefix,trace",
                                      "shape": "treepo,trace", "budget": "grpo,treepo,trace"}
STAGES = {"treepo": "neither (uniform roots, random prefixes)", "trace-root": "root allocation only",
          "trace-prefix": "prefix allocation only", "trace": "both"}


# --------------------------------------------------------------------------------------------------
# options


def _setting(args: argparse.Namespace, key: str) -> Any:
    value = getattr(args, key)
    if value is not None:
        return value
    return (SMALL if args.small else FULL)[key]


def _add_common(p: argparse.ArgumentParser, claim: str) -> None:
    p.add_argument("--small", action="store_true", help="the tests' sizes (seconds to a minute)")
    p.add_argument("--env", default="trace_envs/PythonMath-v0", help="registered env id")
    p.add_argument("--env-kwargs", default="{}", help="extra gym.make arguments as JSON")
    p.add_argument("--max-turns", type=int, default=4)
    p.add_argument("--policy", default="demo", help='"demo" (the env\'s shipped demo policy) or a policy directory')
    p.add_argument("--seeds", type=int, default=None, help=f"bench seeds (default {FULL['seeds']}, small {SMALL['seeds']})")
    p.add_argument("--prompts", type=int, default=None, help="candidate pool per batch")
    p.add_argument("--budget", default=None, help="M,N: root rollouts per batch, continuations per root")
    p.add_argument("--group-size", type=int, default=None, help="baseline rollouts per prompt")
    p.add_argument("--warmup-prompts", type=int, default=None, help="tasks the predictor is warmed up on")
    p.add_argument("--prefix-share", type=prefix_share_arg, default=BenchConfig.prefix_share,
                   help="most share of prefix examples in the predictor's warm-up refreshes ('all': every prefix)")
    p.add_argument("--max-new-tokens", type=int, default=None)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--oracle-samples", type=int, default=None, help="Monte-Carlo continuations per anchor")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--predictor", default="embedding", choices=BENCH_PREDICTORS,
                   help="the bench's predictor: embedding (MiniLM), policy-states (frozen policy copy) or hashed")
    p.add_argument("--out", default=f"artifacts/paper/{claim}", help="output directory")
    p.add_argument("--raw", default=None, help="also keep the bench's own outputs (bench.json, trees.jsonl...) here")
    if claim in DEFAULT_STRATEGIES:
        p.add_argument("--strategies", default=DEFAULT_STRATEGIES[claim], help="comma-separated strategy names")
    if claim in ("ratio", "ablation", "budget"):
        p.add_argument("--bench-json", default=None,
                       help="analyse the rows of an existing bench.json (trace-gym bench, or a --raw dir) instead of "
                            "running the bench; --strategies picks among its strategies")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="claim", required=True)
    for claim in ("ratio", "ablation", "shape", "budget", "predictor", "contrast"):
        p = sub.add_parser(claim, help=PAPER[claim][:70].replace("%", "%%"))
        _add_common(p, claim)
    shape = sub.choices["shape"]
    shape.add_argument("--wide", default=None, help="M,N of the wide shape (default: --budget's M with N = 2)")
    shape.add_argument("--deep", default=None, help="M,N of the deep shape (default: M/2 with N = 6)")
    sub.choices["budget"].add_argument("--pool-factor", type=int, default=3,
                                       help="candidate pool = this many times the most active prompts (unless --prompts)")
    sub.choices["contrast"].add_argument("--trees", default=None, help="probe trees.jsonl of a `predictor --raw` run")
    sub.choices["contrast"].add_argument("--splits", type=int, default=500,
                                         help="random half splits of each anchor's samples for the out-of-sample table")
    t = sub.add_parser("train", help=PAPER["train"][:70].replace("%", "%%"))
    t.add_argument("--small", action="store_true", help="one step, a handful of held-out episodes")
    t.add_argument("--config", default=None, help="training YAML (default docs/configs/demo.yaml)")
    t.add_argument("--env", default=None, help="env id (config: env_id)")
    t.add_argument("--strategies", default="trace,grpo,treepo", help="the second one is the paired reference")
    t.add_argument("--seeds", default="0,1,2")
    t.add_argument("--steps", type=int, default=None)
    t.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.FIELD=VALUE")
    t.add_argument("--out", default="artifacts/paper/train")
    t.add_argument("--merge", default=None, metavar="FILE[,FILE...]",
                   help="train nothing: pool the runs of earlier train.json / compare.json files of the same "
                        "comparison (seeds run in parts) into one table under --out")
    t.add_argument("--runs", default=None, metavar="DIR",
                   help="pre-registered mode: write one compact JSON per finished (arm, seed) run into DIR (runs "
                        "already there are skipped), held-out evaluations every eval.every steps; an arm is a "
                        "strategy, optionally with a budget multiple ('grpo@2x': rollout.roots times 2) and a budget shape "
                        "('trace/24x6': 24 roots, 6 continuations per root); seed-major")
    tab = sub.add_parser("table", help="rebuild the pre-registered comparison's table from its per-run files alone")
    tab.add_argument("--runs", required=True, metavar="DIR", help="the per-run JSON files of `train --runs`")
    tab.add_argument("--reference", default="grpo", help="the arm every other is paired against (same seed)")
    tab.add_argument("--pairs", default=",".join(f"{a}:{b}" for a, b in PLAN_PAIRS),
                     help="more paired differences, A:B for A - B (same seed), comma-separated; a pair whose arms "
                          "have no run is left out (default: the PythonMath plan's other comparisons)")
    tab.add_argument("--out", default=None, help="also write table.json and table.md here")
    return parser


def _budget(text: str, group: int) -> Budget:
    return Budget.parse(text, group_size=group)


def bench_config(args: argparse.Namespace, *, strategies: Sequence[str], budget: Budget | None = None,
                 prompts: int | None = None) -> BenchConfig:
    """The :class:`BenchConfig` of a claim's options (``--small`` presets fill what is not given)."""
    group = _setting(args, "group_size")
    return BenchConfig(
        env_id=args.env, env_kwargs=json.loads(args.env_kwargs), max_turns=args.max_turns,
        strategies=tuple(strategies), seeds=_setting(args, "seeds"),
        prompts=prompts if prompts is not None else _setting(args, "prompts"),
        budget=budget if budget is not None else _budget(_setting(args, "budget"), group),
        warmup_prompts=_setting(args, "warmup_prompts"), prefix_share=args.prefix_share,
        rollout=RolloutConfig(sampling=SamplingConfig(max_new_tokens=_setting(args, "max_new_tokens"),
                                                      temperature=args.temperature),
                              workers=args.workers, oracle_samples=_setting(args, "oracle_samples")),
        predictor=args.predictor,
        command=args.command_line,
    )


def _strategies(args: argparse.Namespace) -> list[str]:
    return [s.strip() for s in args.strategies.split(",") if s.strip()]


def load_bench(path: str | Path, strategies: Sequence[str]) -> BenchResult:
    """The rows of a saved ``bench.json`` for ``strategies`` (those it holds, in the order asked), re-summarised."""
    from trace_agent.bench import summarize

    data = json.loads(Path(path).read_text())
    cfg = dict(data["config"])
    rollout = {k: v for k, v in cfg.pop("rollout").items() if k != "ray"}
    # the sampling settings: one "sampling" object, or (a file written before RolloutConfig carried one) flat fields
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
    if getattr(args, "bench_json", None):
        return load_bench(args.bench_json, config.strategies)
    result = run_bench(config, policy=policy, log=lambda m: print(m, file=sys.stderr, flush=True), **kwargs)
    if args.raw:
        result.write(args.raw)
    return result


# --------------------------------------------------------------------------------------------------
# output


def _pm(s: dict[str, float], digits: int = 3) -> str:
    return f"{fmt(s['mean'], digits)} ± {fmt(s['std'], digits)} [{fmt(s['min'], 2)}, {fmt(s['max'], 2)}]"


def _header(claim: str, args: argparse.Namespace, config: BenchConfig | None) -> list[str]:
    lines = [f"### {claim}", "", f"Paper: {PAPER[claim]}.", "", f"Command: `{args.command_line}`", ""]
    if getattr(args, "bench_json", None) and config is not None:
        lines += [f"Rows from `{args.bench_json}`, measured by: `{config.command}`", ""]
    if config is not None:
        b = config.budget
        policy = "" if getattr(args, "bench_json", None) else f"policy `{args.policy}`, "
        lines += [f"Env `{config.env_id}`, {policy}{config.seeds} seeds (0..{config.seeds - 1}), pool of "
                  f"{config.prompts} candidate prompts, budget (M, N) = ({b.roots}, {b.continuations_per_root}), group "
                  f"{b.group_size} (at most {b.max_active} active prompts), {b.paper_units:g} paper units per batch; "
                  f"predictor warmed up on {config.warmup_prompts} other tasks; max {config.max_turns} turns, "
                  f"{config.rollout.sampling.max_new_tokens} new tokens, "
                  f"temperature {config.rollout.sampling.temperature:g}. "
                  "Mean ± sample sd over seeds [min, max].", ""]
    return lines


def write_claim(out: str | Path, claim: str, data: dict[str, Any], markdown: str,
                figures: Sequence[Callable[[Path], Path]] = ()) -> list[Path]:
    """``<claim>.json``, ``<claim>.md`` and each figure under ``out``; prints the Markdown; returns the paths."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"{claim}.json", out / f"{claim}.md"]
    paths[0].write_text(json.dumps({"claim": claim, "paper": PAPER[claim], **data}, indent=1, default=_jsonable,
                                   allow_nan=True))
    paths[1].write_text(markdown)
    paths += [make(out) for make in figures]
    print(markdown)
    print("wrote " + ", ".join(str(p) for p in paths))
    return paths


def _jsonable(obj: Any) -> Any:
    if hasattr(obj, "item"):
        return obj.item()
    return str(obj)


def _figure(width: float = 7.0, height: float = 4.0) -> Any:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _bars(path: Path, groups: dict[str, list[float]], ylabel: str, title: str) -> Path:
    """Bars at the mean of each group, an error bar of one sd, every value as a dot."""
    fig = _figure(max(6.0, 1.1 * len(groups) + 2.0))
    ax = fig.add_subplot(1, 1, 1)
    names = list(groups)
    for i, n in enumerate(names):
        s = spread(groups[n])
        ax.bar(i, 0.0 if math.isnan(s["mean"]) else s["mean"], yerr=0.0 if math.isnan(s["std"]) else s["std"],
               color="#5b8cc0", capsize=4, alpha=0.85)
        ax.scatter([i] * len(groups[n]), groups[n], color="black", s=10, zorder=3)
    ax.set_xticks(range(len(names)), names, rotation=20, ha="right", fontsize=8)
    ax.set_ylabel(ylabel, fontsize=9)
    ax.set_ylim(0, 1.05)
    ax.set_title(title, fontsize=9)
    ax.grid(axis="y", alpha=0.3)
    fig.savefig(path, dpi=110)
    return path


def _per_seed(result: BenchResult, key: str = "effective_ratio") -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for r in result.rows:
        out.setdefault(r["strategy"], []).append(float(r[key]))
    return out


def _ratio_table(result: BenchResult, label: Callable[[str], str] | None = None) -> list[str]:
    seeds = _per_seed(result)
    head = "| strategy |" + (" stage |" if label else "") + " effective ratio | per seed | mixed / active | skipped | " \
        "contrast pairs | paper units | gen. tokens |"
    lines = [head, "|---|" + ("---|" if label else "") + "---|---|---:|---:|---:|---:|---:|"]
    for name, s in result.summary.items():
        lines.append(f"| {name} |" + (f" {label(name)} |" if label else "")
                     + f" {_pm(s['effective_ratio'])} | {' / '.join(fmt(x, 2) for x in seeds[name])} "
                     f"| {s['mixed_trees']['mean']:.1f} / {s['active_prompts']['mean']:.1f} | {s['skipped']['mean']:.1f} "
                     f"| {s['contrast_pairs']['mean']:.1f} | {s['paper_units']['mean']:.1f} "
                     f"| {s['generated_tokens']['mean']:.0f} |")
    comp = result.comparisons()
    if comp:
        lines += ["", "On mean effective ratio: " + ", ".join(f"{k} = {fmt(v, 2)}" for k, v in comp.items())]
    return lines


def _rows_data(result: BenchResult) -> dict[str, Any]:
    return {"config": json.loads(result.to_json())["config"], "rows": list(result.rows), "summary": result.summary,
            "comparisons": result.comparisons(), "predictor": result.predictor.get("measured", {})}


# --------------------------------------------------------------------------------------------------
# claims over the bench


def run_ratio(args: argparse.Namespace, policy: Any) -> dict[str, Any]:
    result = _bench(args, policy, bench_config(args, strategies=_strategies(args)))
    config = result.config
    md = "\n".join([*_header("ratio", args, config), *_ratio_table(result)]) + "\n"
    write_claim(args.out, "ratio", _rows_data(result), md, [lambda out: _bars(
        out / "ratio.png", _per_seed(result), "effective ratio (mixed / active)",
        f"{config.env_id.split('/')[-1]}: effective ratio at equal budget (dots = seeds)")])
    return _rows_data(result)


def run_ablation(args: argparse.Namespace, policy: Any) -> dict[str, Any]:
    result = _bench(args, policy, bench_config(args, strategies=_strategies(args)))
    config = result.config
    md = "\n".join([*_header("ablation", args, config), *_ratio_table(result, lambda n: STAGES.get(n, n))]) + "\n"
    data = _rows_data(result)
    write_claim(args.out, "ablation", data, md, [lambda out: _bars(
        out / "ablation.png", _per_seed(result), "effective ratio (mixed / active)",
        f"{config.env_id.split('/')[-1]}: stage ablation (dots = seeds)")])
    return data


def _shapes(args: argparse.Namespace) -> tuple[Budget, Budget]:
    group = _setting(args, "group_size")
    m = _budget(_setting(args, "budget"), group).roots
    wide = _budget(args.wide or f"{m},2", group)
    deep = _budget(args.deep or f"{m // 2},6", group)
    if not math.isclose(wide.paper_units, deep.paper_units):
        raise SystemExit(f"paper_claims shape: the shapes cost {wide.paper_units:g} and {deep.paper_units:g} paper "
                         "units; choose M,N pairs with equal M(1 + N/2)")
    return wide, deep


def run_shape(args: argparse.Namespace, policy: Any) -> dict[str, Any]:
    wide, deep = _shapes(args)
    results: dict[str, tuple[Budget, BenchResult]] = {}
    raw = args.raw
    for label, budget in (("wide", wide), ("deep", deep)):
        config = bench_config(args, strategies=_strategies(args), budget=budget)
        args.raw = None if raw is None else str(Path(raw) / label)
        results[label] = (budget, _bench(args, policy, config))
    args.raw = raw
    costs = shape_costs({k: (b, r.rows) for k, (b, r) in results.items()})
    lines = _header("shape", args, bench_config(args, strategies=_strategies(args), budget=wide))
    lines += [f"Shapes: wide (M, N) = ({wide.roots}, {wide.continuations_per_root}) on at most {wide.max_active} prompts, "
              f"deep ({deep.roots}, {deep.continuations_per_root}) on at most {deep.max_active}; planned paper units "
              f"{wide.paper_units:g} and {deep.paper_units:g}, measured per batch "
              + ", ".join(f"{k} {v['measured_min']:g}-{v['measured_max']:g}" for k, v in costs["shapes"].items())
              + f": **{'equal' if costs['equal'] else 'NOT equal'}**. Each shape's predictor is warmed up on the same "
              "tasks, collected TreePO-style in that shape; pools and seeds are the same.", "",
              "| shape | strategy | effective ratio | per seed | mixed / active | contrast pairs | paper units "
              "| gen. tokens |", "|---|---|---|---|---:|---:|---:|---:|"]
    for label, (budget, result) in results.items():
        seeds = _per_seed(result)
        for name, s in result.summary.items():
            lines.append(f"| {label} ({budget.roots}, {budget.continuations_per_root}) | {name} "
                         f"| {_pm(s['effective_ratio'])} | {' / '.join(fmt(x, 2) for x in seeds[name])} "
                         f"| {s['mixed_trees']['mean']:.1f} / {s['active_prompts']['mean']:.1f} "
                         f"| {s['contrast_pairs']['mean']:.1f} | {s['paper_units']['mean']:.1f} "
                         f"| {s['generated_tokens']['mean']:.0f} |")
    data = {"costs": costs, "shapes": {k: _rows_data(r) for k, (_, r) in results.items()}}
    groups = {f"{k} {n}": v for k, (_, r) in results.items() for n, v in _per_seed(r).items()}
    write_claim(args.out, "shape", data, "\n".join(lines) + "\n", [lambda out: _bars(
        out / "shape.png", groups, "effective ratio (mixed / active)",
        f"wide ({wide.roots},{wide.continuations_per_root}) vs deep ({deep.roots},{deep.continuations_per_root}) at "
        f"{wide.paper_units:g} paper units (dots = seeds)")])
    return data


def run_budget(args: argparse.Namespace, policy: Any) -> dict[str, Any]:
    budget = _budget(_setting(args, "budget"), _setting(args, "group_size"))
    prompts = args.prompts if args.prompts is not None else args.pool_factor * budget.max_active
    result = _bench(args, policy, bench_config(args, strategies=_strategies(args), budget=budget, prompts=prompts))
    config = result.config
    budget, prompts = config.budget, config.prompts
    profile = budget_profile(result.rows, prompts=prompts, budget=budget)
    lines = _header("budget", args, config)
    lines += [f"Every strategy may activate at most {budget.max_active} of the {prompts} candidates, so at least "
              f"{next(iter(profile.values()))['skip_floor']:.0%} are skipped by the budget rules alone.", "",
              "| strategy | skipped share of candidates | roots per active prompt | rollouts (roots + continuations) "
              "per active prompt | paper units per active prompt | continuation start depth: share | deepest |",
              "|---|---|---|---|---|---|---:|"]
    for name, p in profile.items():
        depths = " ".join(f"{d}:{c:.0%}" for d, c in p["continuation_depths"].items()) or "-"
        lines.append(f"| {name} | {_pm(p['skipped_share'], 2)} | {_pm(p['roots_per_active'], 1)} "
                     f"| {_pm(p['rollouts_per_active'], 1)} | {_pm(p['units_per_active'], 1)} | {depths} "
                     f"| {p['deepest_continuation']} |")
    data = {**_rows_data(result), "profile": profile, "prompts": prompts}

    def plot(out: Path) -> Path:
        fig = _figure()
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


# --------------------------------------------------------------------------------------------------
# claims over the Monte-Carlo probe


def probe_trees(args: argparse.Namespace, policy: Any) -> tuple[list[Any], int, BenchConfig]:
    """Run :class:`MonteCarloProbe` through the bench: every candidate is an anchor, as is every visited prefix."""
    group = _setting(args, "group_size")
    prompts = _setting(args, "prompts")
    cont = _budget(_setting(args, "budget"), group).continuations_per_root
    budget = Budget(roots=group * prompts, continuations_per_root=max(1, cont), group_size=group)
    config = bench_config(args, strategies=("probe",), budget=budget, prompts=prompts)
    result = run_bench(config, policy=policy, strategies=[MonteCarloProbe()],
                       log=lambda m: print(m, file=sys.stderr, flush=True))
    k = config.rollout.oracle_samples
    for tree in result.trees:
        tree.metadata["oracle_samples"] = k
    if args.raw:
        result.write(args.raw)
    return list(result.trees), k, config


def _probe_note(config: BenchConfig, k: int, anchors: Sequence[Any]) -> list[str]:
    roots = sum(a.depth == 0 for a in anchors)
    return [f"Truth: each anchor's Monte-Carlo success rate from K = {k} fresh continuations from its snapshot "
            f"(binomial noise sd = sqrt(V(1-V)/{k}), up to {0.5 / math.sqrt(k):.2f}); anchors: {roots} prompts (every "
            f"candidate, {config.budget.group_size} root rollouts each) and {len(anchors) - roots} visited prefixes. "
            f"Predictor: the bench's ({config.predictor} features) after its TreePO-style warm-up (prefix share "
            f"{'every prefix' if config.prefix_share is None else f'{config.prefix_share:g}'}), not updated while "
            "measured.", ""]


def run_predictor(args: argparse.Namespace, policy: Any) -> dict[str, Any]:
    trees, k, config = probe_trees(args, policy)
    anchors = anchors_from_trees(trees, samples=k)
    depth_rows = error_by_depth(anchors)
    ranks = rank_correlations(anchors)
    lines = [*_header("predictor", args, config), *_probe_note(config, k, anchors),
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
              f"({int(pooled['roots'])} anchors; per seed {_pm(over['root'], 2)}), prefixes {fmt(pooled['prefix'], 2)} "
              f"({int(pooled['prefixes'])} anchors; per seed {_pm(over['prefix'], 2)})."]
    data = {"oracle_samples": k, "error_by_depth": depth_rows, "rank_correlations": ranks, "anchors": len(anchors),
            "config": json.loads(BenchResult(config=config, rows=(), summary={}, predictor={}).to_json())["config"]}

    def plot(out: Path) -> Path:
        fig = _figure()
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
                         + (f" {_pm(r['auc_over_splits'], 2)} |" if over_splits else ""))
    return lines


def run_contrast(args: argparse.Namespace, policy: Any) -> dict[str, Any]:
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
    lines = _header("contrast", args, config)
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
            f"{name} {_pm(spread(v[name] for v in per_seed.values()), 2)}" for name in ("oracle", "predicted", "random"))]
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
        fig = _figure(7.5, 4.2)
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


# --------------------------------------------------------------------------------------------------
# training


def train_config(args: argparse.Namespace) -> Any:
    """The comparison's TrainConfig: ``--config`` (default docs/configs/demo.yaml), ``--small`` sizes, flags, ``--set``."""
    from trace_agent.config_io import load_config

    path = args.config or str(Path(__file__).resolve().parents[1] / "docs" / "configs" / "demo.yaml")
    flags = [f"out_dir={json.dumps(args.out)}", "log.progress=false"]
    if args.small:
        flags += ["steps=1", "rollout.prompts_per_step=4", "rollout.roots=8", "rollout.continuations_per_root=1",
                  "rollout.group_size=4", "eval.tasks=2", "eval.samples=1", "eval.every=0", "optim.minibatches=1"]
    if args.env:
        flags.append(f"env_id={json.dumps(args.env)}")
    if args.steps is not None:
        flags.append(f"steps={args.steps}")
    return load_config(path, [*flags, *args.overrides])


def run_train(args: argparse.Namespace, policy: Any = None) -> dict[str, Any]:
    from trace_agent.compare import ComparisonResult, compare_training

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
    result.write(args.out)
    md = "\n".join(["### train", "", f"Paper: {PAPER['train']}.", "", result.to_markdown()])
    data = json.loads(result.to_json())
    env = str(result.config["env_id"]).split("/")[-1]
    write_claim(args.out, "train", data, md, [lambda out: _bars(
        out / "train.png", {n: [r["after"] for r in result.rows if r["strategy"] == n] for n in result.strategies},
        "held-out success after training", f"{env}: equal budget (dots = seeds)")])
    return data


# --------------------------------------------------------------------------------------------------
# the pre-registered comparison: one compact file per (arm, seed) run, and the table rebuilt from those files

def _code_commit() -> dict[str, Any]:
    import subprocess

    root = Path(__file__).resolve().parents[1]

    def git(*a: str) -> str:
        try:
            return subprocess.run(["git", "-C", str(root), *a], capture_output=True, text=True, timeout=30).stdout.strip()
        except OSError:
            return ""

    dirty = git("status", "--porcelain", "--", "trace_agent", "trace_envs", "scripts", "docs/configs",
                "docs/paper/math/pool")
    return {"commit": git("rev-parse", "HEAD"), "code_dirty": bool(dirty), "root": str(root)}


def _eval_data(result: Any, step: int) -> dict[str, Any]:
    return {"step": step, "success": result.success, "success_se": result.success_se, "tasks": result.tasks,
            "samples": result.samples, "episodes": result.episodes, "solved_tasks": result.solved_tasks,
            "seconds": result.seconds}


def _base_key(config: Any) -> dict[str, Any]:
    from trace_agent.config_io import config_to_dict

    c = config_to_dict(config)
    return {k: c[k] for k in ("env_id", "env_kwargs", "policy", "sampling", "eval")}


def run_arms(args: argparse.Namespace) -> dict[str, Any]:
    """``train --runs DIR``: every (arm, seed), seed-major, from one start; one compact JSON per finished run."""
    from trace_agent.config_io import config_to_dict
    from trace_agent.evaluation import evaluate_heldout
    from trace_agent.metrics import read_metrics
    from trace_agent.train_cli import run_training
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
    key = _base_key(config)
    if base_path.is_file() and json.loads(base_path.read_text()).get("key") == key:
        base = json.loads(base_path.read_text())["eval"]
    else:
        policy, _ = build_policies(config.policy, seed=0, env_id=config.env_id)
        base = _eval_data(evaluate_heldout(policy, config), 0)
        del policy
        base_path.write_text(json.dumps({"what": "held-out evaluation of the starting policy (step 0 of every run)",
                                         **code, "command": args.command_line, "key": key, "eval": base}, indent=1))
    log(f"starting policy: held-out {base['success']:.3f} ({base['tasks']} tasks x {base['samples']} samples)")
    done = []
    for seed in seeds:
        for arm in arms:
            path = runs / f"{arm_file_stem(arm)}_s{seed}.json"
            if path.is_file():
                log(f"{path.name}: already there, skipped")
                continue
            strategy, mult, shape = parse_arm(arm)
            roots, continuations = shape or (config.rollout.roots, config.rollout.continuations_per_root)
            run_dir = Path(config.out_dir) / path.stem
            cfg = replace(config, seed=seed, out_dir=str(run_dir),
                          rollout=replace(config.rollout, strategy=strategy, roots=roots * mult,
                                          continuations_per_root=continuations))
            import time

            t = time.perf_counter()
            rep = run_training(cfg, evaluate="after", log=lambda _m: None)
            seconds = time.perf_counter() - t
            records = read_metrics(run_dir / "metrics.jsonl")
            evals = [base] + [{"step": int(r["step"]), "success": r["eval/success"], "success_se": r["eval/success_se"],
                               "episodes": int(r["eval/episodes"]), "seconds": r["eval/seconds"]}
                              for r in records if "eval/success" in r and int(r["step"]) > 0]
            steps = [{"step": int(r["step"]), **{k: v for k, v in r.items() if kept_step_metric(k, v)}}
                     for r in records if "rollout/effective_ratio" in r]
            data = {"arm": arm, "strategy": strategy, "budget_multiple": mult,
                    "shape": [cfg.rollout.roots, cfg.rollout.continuations_per_root], "seed": seed, **code,
                    "command": args.command_line, "config": config_to_dict(cfg), "seconds": seconds,
                    "paper_units": rep.paper_units, "generated_tokens": rep.generated_tokens, "evals": evals,
                    "steps": steps}
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(data, separators=(",", ":"), default=float))
            tmp.replace(path)
            done.append(path.name)
            log(f"{path.name}: {seconds:.0f}s, held-out " + " ".join(f"{e['step']}:{e['success']:.3f}" for e in evals))
    return {"runs": done, "base": base}


def run_table(args: argparse.Namespace, policy: Any = None) -> dict[str, Any]:
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


RUNNERS: dict[str, Callable[[argparse.Namespace, Any], dict[str, Any]]] = {
    "ratio": run_ratio, "ablation": run_ablation, "shape": run_shape, "budget": run_budget,
    "predictor": run_predictor, "contrast": run_contrast, "train": run_train, "table": run_table,
}


def main(argv: Sequence[str] | None = None, *, policy: Any = None) -> dict[str, Any]:
    """Run one claim; ``policy`` (tests) replaces loading ``--policy``. Returns the claim's data."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    rest = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(rest)
    args.command_line = " ".join(["python scripts/paper_claims.py", *(shlex.quote(a) for a in rest)])
    offline = (args.claim == "contrast" and args.trees) or getattr(args, "bench_json", None)
    if args.claim not in ("train", "table") and policy is None and not offline:
        from trace_agent.bench import load_policy
        from trace_agent.env_factory import check_env_id

        check_env_id(args.env)
        policy = load_policy(args.policy, env_id=args.env, log=lambda m: print(m, file=sys.stderr))
    try:
        return RUNNERS[args.claim](args, policy)
    except RunTableError as exc:
        raise SystemExit(f"paper_claims {args.claim}: {exc}") from exc


if __name__ == "__main__":
    main()
    sys.exit(0)
