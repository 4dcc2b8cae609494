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

# The package, by job: config (BenchConfig: a config tree plus its bench section, BENCH_OVERRIDES, load_bench_config),
# run (run_bench, load_policy), result (BenchResult: rows, summary, JSON, Markdown), plots (its figures),
# cli (`trace-gym bench`, `python -m trace_agent.bench`). This docstring is the command's --help text.

from __future__ import annotations

from trace_agent.bench.cli import add_bench_parser, bench_config_from_args, main, prefix_share_arg
from trace_agent.bench.config import BENCH_OVERRIDES, BenchConfig, BenchSettings, load_bench_config
from trace_agent.bench.result import BenchResult, summarize
from trace_agent.bench.run import load_policy, run_bench
from trace_agent.wiring import resolve_strategy

__all__ = [
    "BENCH_OVERRIDES",
    "BenchConfig",
    "BenchResult",
    "BenchSettings",
    "add_bench_parser",
    "bench_config_from_args",
    "load_bench_config",
    "load_policy",
    "prefix_share_arg",
    "resolve_strategy",
    "run_bench",
    "summarize",
    "main",
]
