"""`trace-gym bench`: sampling strategies compared at equal budget on one env, policy and prompt pool.

For every seed, a candidate pool of ``prompts`` tasks is drawn (the same pool for every
strategy of that seed, and the same sampling seeds, so strategies see common random
numbers) and each strategy collects one batch with :class:`~trace_agent.rollout.TreeCollector`
under the same :class:`~trace_agent.strategies.Budget`. Before the measured batches the
success predictor (the CPU :class:`~trace_agent.predictor.EmbeddingPredictor`; ``--predictor``
picks its features, MiniLM by default or the policy's own hidden states) is warmed
up on TreePO-style trees of *other* tasks of the same split, as in training where it
learns from earlier batches; it is not updated during the measured batches, so every
strategy meets the same predictor.

Per (strategy, seed) the table holds: effective ratio (mixed trees / active prompts),
mixed groups, contrast pairs, prompts skipped, the depth histogram of branch points,
root rollouts and continuations, paper units, generated tokens, env steps, wall time and,
for Oracle, the Monte-Carlo cost outside the budget. The summary gives mean, standard
deviation, min and max over seeds. Outputs under ``--out``: ``bench.json`` (config, rows,
summary, predictor metrics), ``bench.md`` (Markdown tables + the command), ``trees.jsonl``
(every measured tree, its strategy and seed in ``metadata``; ``trace-gym show-tree`` draws them)
and PNG plots: ``bench.png`` (effective ratio, leaf success, contrast pairs and generated tokens
per strategy: mean ± std over seeds, each seed a dot), ``effective_ratio.png`` and
``branch_depths.png`` (branch points per batch by depth: the table's "branch depths" column).
Progress bars (with ETA) cover the predictor warm-up and the measured batches.

Strategies are named (:data:`~trace_agent.strategies.STRATEGY_NAMES`) or given as
``module:attribute`` (a Strategy class or factory called without arguments), so a user's
strategy runs in the bench without touching the library::

    trace-gym bench --policy demo --strategies grpo,trace,mypkg.branching:EntropyBranching
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from trace_agent.bench_plots import plot_result
from trace_agent.config import PredictorSettings, RolloutSettings, SamplingSettings, TrainConfig
from trace_agent.env_factory import make_env_factory, task_ids
from trace_agent.policy.base import SamplingConfig
from trace_agent.rollout import Collection, PromptSpec, RolloutConfig, TreeCollector
from trace_agent.strategies import STRATEGY_NAMES, Budget, Strategy, TreePO
from trace_agent.wiring import resolve_strategy

__all__ = [
    "BENCH_OVERRIDES",
    "BenchConfig",
    "BenchResult",
    "add_bench_parser",
    "load_policy",
    "prefix_share_arg",
    "resolve_strategy",
    "run_bench",
    "summarize",
    "main",
]

DEFAULT_STRATEGIES: tuple[str, ...] = ("grpo", "pcl", "treepo", "trace", "trace-root", "trace-prefix", "oracle")
_SUMMARY_KEYS = ("effective_ratio", "success_rate", "mixed_trees", "active_prompts", "contrast_pairs", "skipped", "root_rollouts",
                 "continuations", "paper_units", "generated_tokens", "env_steps", "wall_seconds",
                 "oracle_generated_tokens")


#: Where the bench departs from the training config's defaults (config key -> value), on purpose; every other
#: knob it shares with ``trace-gym train`` takes the config tree's default (:mod:`trace_agent.config`):
#:
#: - ``rollout.roots`` 32 and ``rollout.continuations_per_root`` 2: a bench batch of (M, N) = (32, 2), the
#:   paper's N at eight groups of four: the batch the README's and docs/guides/benchmark.md's commands measure.
#: - ``sampling.max_new_tokens`` 160: the turn length of the demo configs (``docs/configs/demo.yaml``) that
#:   trained the bench's default policy, the shipped demo one.
BENCH_OVERRIDES: dict[str, Any] = {"rollout.roots": 32, "rollout.continuations_per_root": 2,
                                   "sampling.max_new_tokens": 160}

#: Predictor kinds the bench builds itself (the LM critic needs a checkpoint: pass it as ``predictor``).
BENCH_PREDICTORS = ("embedding", "hashed", "policy-states")


@dataclass(frozen=True, kw_only=True)
class BenchConfig:
    """One benchmark run.

    Attributes:
        env_id: the registered env.
        env_kwargs: extra ``gym.make`` arguments (e.g. ``{"tasks": "test"}`` for PythonMath-v0).
        max_turns: the env's turn limit.
        strategies: strategy names or ``module:attribute`` specs, in table order.
        seeds: number of seeds (0 .. seeds-1): one candidate pool and one batch per strategy each.
        prompts: candidate pool size per batch (>= ``budget.max_active``).
        budget: the batch budget (same for every strategy).
        warmup_prompts: tasks the predictor is warmed up on (disjoint from the measured ones), in
            batches of ``budget.max_active`` prompts collected TreePO-style with ``budget``; the
            predictor is refreshed on each batch's trees as it returns (as in training).
        prefix_share: the most share of prefix examples in each warm-up refresh, as the trainer's
            ``predictor.prefix_share`` (default the same, the paper's 0.06); None: every prefix.
        rollout: the collector's settings (``sampling``, workers, oracle_samples...).
        predictor: the success predictor's kind when :func:`run_bench` builds it
            (:func:`~trace_agent.wiring.build_predictor`): ``embedding`` (MiniLM + logistic head),
            ``hashed`` or ``policy-states`` (the same head on a frozen copy of the benched policy's
            hidden states).
        command: the command line, recorded in the outputs.

    The knobs a training run shares take the config tree's defaults (``env_id``, ``max_turns``, the
    budget's group size and cost, the sampling and collector settings, ``predictor``), except the ones
    :data:`BENCH_OVERRIDES` names.
    """

    env_id: str = TrainConfig.env_id
    env_kwargs: Mapping[str, Any] = field(default_factory=dict)
    max_turns: int = SamplingSettings.max_turns
    strategies: tuple[str, ...] = DEFAULT_STRATEGIES
    seeds: int = 5
    prompts: int = 16
    budget: Budget = field(default_factory=lambda: Budget(
        roots=BENCH_OVERRIDES["rollout.roots"], continuations_per_root=BENCH_OVERRIDES["rollout.continuations_per_root"],
        group_size=RolloutSettings.group_size, continuation_cost=RolloutSettings.continuation_cost))
    warmup_prompts: int = 48
    prefix_share: float | None = PredictorSettings.prefix_share
    rollout: RolloutConfig = field(default_factory=lambda: RolloutConfig(
        sampling=SamplingConfig(max_new_tokens=BENCH_OVERRIDES["sampling.max_new_tokens"])))
    predictor: str = PredictorSettings.kind
    command: str = ""

    def __post_init__(self) -> None:
        if self.seeds < 1 or self.prompts < 1 or self.max_turns < 1 or self.warmup_prompts < 0:
            raise ValueError("seeds, prompts and max_turns must be >= 1, warmup_prompts >= 0")
        if self.prompts < self.budget.max_active:
            raise ValueError(f"the pool ({self.prompts}) must hold at least budget.max_active "
                             f"({self.budget.max_active}) prompts")
        if not self.strategies:
            raise ValueError("name at least one strategy")
        PredictorSettings(prefix_share=self.prefix_share)  # the trainer's one check of the share
        if self.predictor not in BENCH_PREDICTORS:
            raise ValueError(f"predictor must be one of {', '.join(BENCH_PREDICTORS)}, got {self.predictor!r}")


def load_policy(spec: str, *, cache_dir: str | Path | None = None, env_id: str = TrainConfig.env_id,
                log: Callable[[str], None] = print) -> Any:
    """``"demo"``: ``env_id``'s offline demo policy (the shipped one, or built in ``cache_dir`` if given and
    missing); else a transformers model dir. Loaded by :func:`~trace_agent.wiring.build_policies`, as a
    training run loads its policy."""
    from trace_agent.config import PolicyConfig
    from trace_agent.wiring import build_policies

    config = (PolicyConfig(kind="demo", path=str(cache_dir or "")) if spec == "demo"
              else PolicyConfig(kind="hf", path=spec))
    learner, _ = build_policies(config, env_id=env_id, log=log)
    return learner


# --------------------------------------------------------------------------------------------------
# results


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


def _row(collection: Collection, seed: int) -> dict[str, Any]:
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


# --------------------------------------------------------------------------------------------------
# running


def run_bench(
    config: BenchConfig,
    *,
    policy: Any,
    strategies: Sequence[Strategy] | None = None,
    predictor: Any = None,
    make_env: Callable[[], Any] | None = None,
    log: Callable[[str], None] = print,
    progress: bool = False,
) -> BenchResult:
    """Warm the predictor up, then run every strategy for every seed; returns the rows and the summary.

    ``strategies`` overrides ``config.strategies`` (objects instead of names); ``predictor``
    defaults to a fresh one of ``config.predictor``'s kind; ``make_env``
    defaults to :func:`~trace_agent.env_factory.make_env_factory` (the env's own tasks, ``env_kwargs``
    as given: ``gym.make(config.env_id, max_turns=..., **env_kwargs).unwrapped``). ``progress``
    shows bars (with ETA) over the warm-up batches and the measured batches; ``log`` lines are
    written above them.
    """
    from tqdm import tqdm

    from trace_agent.config import PredictorSettings
    from trace_agent.predictor import prediction_metrics, refresh_predictor, tree_examples
    from trace_agent.wiring import build_predictor

    chosen = [resolve_strategy(s) for s in (strategies if strategies is not None else config.strategies)]
    env_kwargs = dict(config.env_kwargs)
    factory = make_env or make_env_factory(config.env_id, None, max_turns=config.max_turns, env_kwargs=env_kwargs)
    if predictor is None:
        predictor = build_predictor(PredictorSettings(kind=config.predictor), policy=policy)  # type: ignore[arg-type]
    ids = task_ids(config.env_id, None, env_kwargs=env_kwargs)
    order = np.random.default_rng(12345).permutation(len(ids))
    n_warm = min(config.warmup_prompts, max(0, len(ids) - config.prompts))
    warm_ids = [ids[i] for i in order[:n_warm]]
    measured_ids = [ids[i] for i in order[n_warm:]]
    oracle_cache: dict[str, float] = {}
    info: dict[str, Any] = {"warmup_tasks": n_warm}
    rows: list[dict[str, Any]] = []
    with TreeCollector(make_env=factory, policy=policy, predictor=predictor, config=config.rollout,
                       root_oracle=oracle_cache) as collector:
        t0 = time.perf_counter()
        warm_trees = []
        chunk = config.budget.max_active
        starts = list(range(0, n_warm - chunk + 1, chunk))
        bar = tqdm(starts, desc="predictor warm-up", unit="batch", disable=not progress, dynamic_ncols=True)
        for start in bar:
            pool = [PromptSpec(task_id=t) for t in warm_ids[start:start + chunk]]
            batch = collector.collect(pool, _WarmUp(), config.budget, seed=10_000 + start)
            warm_trees.extend(batch.trees)
            # the predictor keeps a replay buffer
            info["warmup_refresh"] = refresh_predictor(predictor, batch.trees, prefix_share=config.prefix_share)
        bar.close()
        log(f"warm-up: {len(warm_trees)} trees on {n_warm} tasks in {time.perf_counter() - t0:.0f}s")
        measured_trees = []
        bar = tqdm(total=config.seeds * len(chosen), desc="bench", unit="batch", disable=not progress,
                   dynamic_ncols=True)
        for seed in range(config.seeds):
            rng = np.random.default_rng(seed)
            pool_ids = [measured_ids[i] for i in rng.choice(len(measured_ids), size=config.prompts, replace=False)]
            pool = [PromptSpec(task_id=t) for t in pool_ids]
            for strategy in chosen:
                bar.set_postfix(seed=seed, strategy=strategy.name)
                batch = collector.collect(pool, strategy, config.budget, seed=seed)
                row = _row(batch, seed)
                rows.append(row)
                for tree in batch.trees:
                    tree.metadata.update(strategy=strategy.name, seed=seed)
                measured_trees.extend(batch.trees)
                bar.update(1)
                log(f"seed {seed} {strategy.name:>12}: effective {row['effective_ratio']:.3f} "
                    f"({row['mixed_trees']}/{row['active_prompts']}), pairs {row['contrast_pairs']}, "
                    f"units {row['paper_units']:g}, tokens {row['generated_tokens']}, {row['wall_seconds']:.1f}s")
        bar.close()
        if oracle_cache:
            rates = np.asarray(list(oracle_cache.values()))
            info["oracle_prompt_rates"] = {"prompts": int(rates.size), "all_fail": int(np.sum(rates == 0.0)),
                                           "all_success": int(np.sum(rates == 1.0)),
                                           "mixed": int(np.sum((rates > 0) & (rates < 1))),
                                           "mean": float(rates.mean())}
        examples = tree_examples(measured_trees)
        if len(examples):
            pred = predictor.predict(examples.contexts)
            info["measured"] = {f"pre_{k}": v for k, v in prediction_metrics(pred, examples).items()}
            if oracle_cache:
                info["measured"] |= _root_rank_ceiling(pred, examples, oracle_cache)
    return BenchResult(config=config, rows=tuple(rows), summary=summarize(rows), predictor=info,
                       trees=tuple(measured_trees))


def _root_rank_ceiling(pred: NDArray[np.float64], examples: Any, oracle: Mapping[str, float]) -> dict[str, float]:
    """How well the prompts' Monte-Carlo success rates rank the measured trees' root targets.

    ``pre_spearman_root`` compares predictions with each tree's leaf success: a target of 4-12 leaves,
    noisy in itself, so even a predictor that knew every prompt's Monte-Carlo rate would not reach 1.
    ``mc_spearman_root`` is that predictor's score (Oracle's ``oracle_samples`` rollouts per prompt as
    the predictions) on the roots whose prompt Oracle estimated, and ``pre_spearman_root_mc_prompts``
    the real predictor's on the same roots: the gap between them is what the predictor leaves.
    """
    from trace_agent.predictor.examples import spearman

    known = examples.is_root & np.asarray([pid in oracle for pid in examples.prompt_ids], dtype=bool)
    mc = np.asarray([oracle.get(pid, math.nan) for pid in examples.prompt_ids], dtype=np.float64)
    t = examples.targets
    return {"mc_spearman_root": spearman(mc[known], t[known]),
            "pre_spearman_root_mc_prompts": spearman(pred[known], t[known]),
            "mc_roots": float(known.sum())}


@dataclass(frozen=True, kw_only=True)
class _WarmUp(TreePO):
    """Warm-up trees: uniform roots, random prefixes (root and prefix targets for the predictor)."""

    name: str = "warmup"


# --------------------------------------------------------------------------------------------------
# command line


def add_bench_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``bench`` to a ``trace-gym`` subparsers object."""
    p = subparsers.add_parser("bench", help="compare sampling strategies at equal budget",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    d = BenchConfig()  # every default below is the config's: one default per knob
    p.add_argument("--env", default=d.env_id, help="registered env id")
    p.add_argument("--env-kwargs", default="{}", help='extra gym.make arguments as JSON, e.g. \'{"tasks": "test"}\'')
    p.add_argument("--max-turns", type=int, default=d.max_turns)
    p.add_argument("--policy", default="demo", help='"demo" or a saved transformers policy directory')
    p.add_argument("--policy-cache", default=None,
                   help="with --policy demo: a dir to build/load a demo policy in (default: the shipped one)")
    p.add_argument("--strategies", default=",".join(DEFAULT_STRATEGIES),
                   help=f"comma-separated: {', '.join(STRATEGY_NAMES)} or module:attribute")
    p.add_argument("--seeds", type=int, default=d.seeds)
    p.add_argument("--prompts", type=int, default=d.prompts, help="candidate pool size per batch")
    p.add_argument("--budget", default=f"{d.budget.roots},{d.budget.continuations_per_root}",
                   help="M,N: root rollouts per batch, continuations per root")
    p.add_argument("--group-size", type=int, default=d.budget.group_size,
                   help="baseline rollouts per prompt (M / group = prompts)")
    p.add_argument("--warmup-prompts", type=int, default=d.warmup_prompts)
    p.add_argument("--prefix-share", type=prefix_share_arg, default=d.prefix_share,
                   help="most share of prefix examples in each warm-up refresh of the predictor; 'all': every prefix")
    p.add_argument("--max-new-tokens", type=int, default=d.rollout.sampling.max_new_tokens)
    p.add_argument("--temperature", type=float, default=d.rollout.sampling.temperature)
    p.add_argument("--oracle-samples", type=int, default=d.rollout.oracle_samples)
    p.add_argument("--workers", type=int, default=d.rollout.workers)
    p.add_argument("--predictor", default=d.predictor, choices=BENCH_PREDICTORS,
                   help="embedding: MiniLM + logistic head; policy-states: the same head on a frozen copy of the "
                        "policy's hidden states; hashed: hashed n-grams")
    p.add_argument("--out", default="artifacts/bench", help="output directory")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=_cli)
    return p


def prefix_share_arg(text: str) -> float | None:
    """``--prefix-share``: a number in [0, 1], or ``all`` (None: every prefix)."""
    if text.strip().lower() == "all":
        return None
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a number in [0, 1] or 'all', got {text!r}") from None
    if not (math.isfinite(value) and 0.0 <= value <= 1.0):
        raise argparse.ArgumentTypeError(f"a number in [0, 1] or 'all', got {text!r}")
    return value


def _check_policy(spec: str, cache_dir: str | None, env_id: str) -> None:
    """A missing policy directory is a clear error; a policy trained on other envs gets a warning."""
    from trace_agent.preflight import PreflightError, model_check, policy_env_ids

    if spec == "demo":
        from trace_agent.demo.shipped import shipped_demo_policy

        where = Path(cache_dir) if cache_dir else shipped_demo_policy(env_id)
    else:
        check = model_check("policy", spec, what="--policy")
        if not check.ok:
            raise PreflightError(check.message)
        where = Path(spec)
    envs = policy_env_ids(where)
    if envs and env_id not in envs:
        print(f"warning: the policy at {where} was trained on {', '.join(envs)}, not {env_id}: expect text written "
              f"for that env", file=sys.stderr, flush=True)


def _cli(args: argparse.Namespace) -> int:
    if not hasattr(args, "argv"):
        args.argv = sys.argv[sys.argv.index("bench") + 1:] if "bench" in sys.argv else []
    budget = Budget.parse(args.budget, group_size=args.group_size)
    config = BenchConfig(
        env_id=args.env, env_kwargs=json.loads(args.env_kwargs), max_turns=args.max_turns,
        strategies=tuple(s.strip() for s in args.strategies.split(",") if s.strip()), seeds=args.seeds,
        prompts=args.prompts, budget=budget, warmup_prompts=args.warmup_prompts, prefix_share=args.prefix_share,
        rollout=RolloutConfig(sampling=SamplingConfig(max_new_tokens=args.max_new_tokens, temperature=args.temperature),
                              workers=args.workers, oracle_samples=args.oracle_samples),
        predictor=args.predictor,
        command=" ".join(["trace-gym bench", *(shlex.quote(a) for a in args.argv)]),
    )
    from tqdm import tqdm

    from trace_agent.env_factory import check_env_id

    check_env_id(config.env_id)  # before the policy loads
    _check_policy(args.policy, args.policy_cache, config.env_id)
    policy = load_policy(args.policy, cache_dir=args.policy_cache, env_id=config.env_id)
    result = run_bench(config, policy=policy, progress=not args.no_progress, log=tqdm.write)
    paths = result.write(args.out)
    print(result.to_markdown())
    print("wrote " + ", ".join(str(p) for p in paths))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m trace_agent.bench ...`` (the same options as ``trace-gym bench``)."""
    parser = argparse.ArgumentParser(prog="trace-gym")
    add_bench_parser(parser.add_subparsers(dest="command", required=True))
    rest = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(["bench", *rest])
    args.argv = rest
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
