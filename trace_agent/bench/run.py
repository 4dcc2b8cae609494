"""Running the bench: :func:`run_bench` (the predictor's warm-up, then every strategy for every seed on common
random numbers) and :func:`load_policy` (the policy it benches, loaded as a training run loads it)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from trace_agent.bench.config import BenchConfig
from trace_agent.bench.result import BenchResult, bench_row, summarize
from trace_agent.config import TrainConfig
from trace_agent.env_factory import make_env_factory, task_ids
from trace_agent.rollout import PromptSpec, TreeCollector
from trace_agent.strategies import Strategy, TreePO
from trace_agent.wiring import resolve_strategy

__all__ = ["load_policy", "run_bench"]


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
                row = bench_row(batch, seed)
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
