"""`trace-gym bench`: equal budgets across strategies, outputs on disk, a user strategy by module path, the CLI."""

from __future__ import annotations

import argparse
import json

import pytest

from trace_agent.bench import (
    BenchConfig,
    add_bench_parser,
    bench_config_from_args,
    resolve_strategy,
    run_bench,
    summarize,
)
from trace_agent.policy.base import SamplingConfig
from trace_agent.predictor import EmbeddingPredictor, HashedNGramFeaturizer
from trace_agent.rollout import RolloutConfig
from trace_agent.strategies import Budget, Strategy

from .test_rollout import make_math_env, scripted_setup


@pytest.mark.slow
def test_bench_runs_every_strategy_at_equal_budget_and_writes_its_outputs(tmp_path) -> None:
    policy, _ = scripted_setup(300)  # flaw rates spread over the whole default task set
    budget = Budget(roots=8, continuations_per_root=2, group_size=4)
    config = BenchConfig(
        strategies=("grpo", "pcl", "treepo", "trace", "trace-root", "trace-prefix", "oracle",
                    "tests.agent.test_strategies:EntropyBranching"),
        seeds=2, prompts=4, budget=budget, warmup_prompts=4, max_turns=3,
        rollout=RolloutConfig(workers=2, oracle_samples=2), command="trace-gym bench (test)",
    )
    result = run_bench(config, policy=policy, predictor=EmbeddingPredictor(HashedNGramFeaturizer(dim=64)),
                       make_env=make_math_env, log=lambda _m: None)
    assert len(result.rows) == 2 * 8
    names = list(result.summary)
    assert names == ["grpo", "pcl", "treepo", "trace", "trace-root", "trace-prefix", "oracle", "entropy"]
    for row in result.rows:
        assert row["paper_units"] == pytest.approx(budget.paper_units)
        assert row["active_prompts"] <= budget.max_active
        assert 0.0 <= row["effective_ratio"] <= 1.0
    assert result.rows[6]["oracle_generated_tokens"] > 0
    for row in result.rows:  # each candidate prompt: the roots it got, the value behind them, its leaves
        prompts = row["prompts"]
        assert len(prompts) == 4 and sum(p["roots"] for p in prompts) == row["root_rollouts"]
        assert sum(p["roots"] == 0 for p in prompts) == row["skipped"]
        assert all((p["leaf_success"] is None) == (p["roots"] == 0) for p in prompts)
        wanted = {"grpo": False, "trace": True, "oracle": True}.get(row["strategy"])
        if wanted is not None:  # GRPO asks for no value; TRACE predicted, Oracle Monte-Carlo values
            assert all((p["value"] is not None) == wanted for p in prompts), row["strategy"]
            assert all(0.0 <= p["value"] <= 1.0 for p in prompts if p["value"] is not None)
    assert "warmup_refresh" in result.predictor
    measured = result.predictor["measured"]  # Oracle ran, so the Monte-Carlo ceiling of the root ranking is there
    assert measured["mc_roots"] > 0 and -1.0 <= measured["mc_spearman_root"] <= 1.0
    paths = result.write(tmp_path)
    assert {p.name for p in paths} == {"bench.json", "bench.md", "trees.jsonl", "bench.png", "effective_ratio.png",
                                       "branch_depths.png"}
    for p in paths:
        if p.suffix == ".png":
            assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 5000, p
    from trace_agent.plotting import show_trees
    from trace_agent.tree_io import load_jsonl

    trees = load_jsonl(tmp_path / "trees.jsonl")
    assert {(t.metadata["strategy"], t.metadata["seed"]) for t in trees} == {(r["strategy"], r["seed"])
                                                                             for r in result.rows}
    drawn = show_trees(tmp_path, tmp_path / "pics", strategy="trace", seed=1, limit=2)
    assert len(drawn) >= 1 and all(p.read_bytes()[:4] == b"\x89PNG" for p in drawn)
    data = json.loads((tmp_path / "bench.json").read_text())
    assert data["config"]["budget"]["roots"] == 8 and len(data["rows"]) == 16
    md = (tmp_path / "bench.md").read_text()
    assert "| trace |" in md and "trace-gym bench (test)" in md and "trace_over_grpo" in md
    assert "inf" not in md.replace("info", "")


def test_comparisons_never_divide_by_zero() -> None:
    from trace_agent.bench import BenchResult

    zero = {"effective_ratio": {"mean": 0.0, "std": 0.0, "min": 0.0, "max": 0.0}}
    result = BenchResult(config=BenchConfig(strategies=("grpo", "trace")), rows=(),
                         summary={"grpo": zero, "trace": zero}, predictor={})
    import math

    assert math.isnan(result.comparisons()["trace_over_grpo"])


def test_summary_is_mean_std_min_max_over_seeds() -> None:
    base = {k: 0 for k in ("success_rate", "mixed_trees", "active_prompts", "contrast_pairs", "skipped", "root_rollouts",
                           "continuations", "paper_units", "generated_tokens", "env_steps", "wall_seconds",
                           "oracle_generated_tokens")}
    rows = [dict(base, strategy="a", effective_ratio=r, branch_depths={"1": 2}, continuation_depths={})
            for r in (0.25, 0.75)]
    s = summarize(rows)["a"]
    assert s["effective_ratio"] == {"mean": 0.5, "std": pytest.approx(0.353553, rel=1e-5), "min": 0.25, "max": 0.75}
    assert s["branch_depths"] == {"1": 2.0}


def test_strategies_resolve_by_name_or_module_path() -> None:
    assert resolve_strategy("trace").name == "trace"
    user = resolve_strategy("tests.agent.test_strategies:EntropyBranching")
    assert isinstance(user, Strategy) and user.name == "entropy"
    with pytest.raises(ValueError, match="cannot load"):
        resolve_strategy("tests.agent.nowhere:Nothing")


def test_bench_parser_options() -> None:
    parser = argparse.ArgumentParser()
    add_bench_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["bench", "--env", "trace_envs/WikiQA-v0", "--budget", "16,6", "--strategies",
                              "grpo,trace", "--seeds", "3", "--prompts", "8", "--out", "x"])
    assert args.budget == "16,6" and args.seeds == 3 and args.func is not None
    assert bench_config_from_args(args).budget.paper_units == 16 * 4


def test_the_root_rank_ceiling_scores_monte_carlo_rates_and_the_predictor_on_the_same_roots() -> None:
    import numpy as np

    from trace_agent.bench.run import _root_rank_ceiling
    from trace_agent.predictor.examples import TreeExamples

    targets = np.array([0.0, 0.25, 0.5, 1.0, 0.5, 0.75])
    depths = np.array([0, 0, 0, 0, 1, 0])  # the fifth is a prefix, the sixth a prompt Oracle never estimated
    examples = TreeExamples(contexts=("c",) * 6, targets=targets, weights=np.full(6, 4.0),
                            second_moments=targets, depths=depths, prompt_ids=("a", "b", "c", "d", "d", "e"),
                            node_ids=np.arange(6))
    oracle = {"a": 0.1, "b": 0.2, "c": 0.6, "d": 0.9}
    predictions = np.array([0.9, 0.6, 0.2, 0.1, 0.0, 0.0])
    out = _root_rank_ceiling(predictions, examples, oracle)
    assert out == {"mc_spearman_root": pytest.approx(1.0), "pre_spearman_root_mc_prompts": pytest.approx(-1.0),
                   "mc_roots": 4.0}


def test_bench_builds_the_policy_states_predictor_from_the_benched_policy(tmp_path) -> None:
    """--predictor policy-states: the bench copies the policy it benches; a policy without weights is refused."""
    from trace_agent.demo.model import tiny_policy

    budget = Budget(roots=4, continuations_per_root=1, group_size=2)
    config = BenchConfig(strategies=("trace",), seeds=1, prompts=2, budget=budget, warmup_prompts=2, max_turns=2,
                         rollout=RolloutConfig(workers=1, sampling=SamplingConfig(max_new_tokens=8)),
                         predictor="policy-states")
    result = run_bench(config, policy=tiny_policy(seed=1), make_env=make_math_env, log=lambda _m: None)
    assert result.predictor["warmup_refresh"]["update_buffer"] > 0  # the head learned from the warm-up trees
    values = [p["value"] for p in result.rows[0]["prompts"]]
    assert all(v is not None and 0.0 <= v <= 1.0 for v in values)
    result.write(tmp_path)
    assert json.loads((tmp_path / "bench.json").read_text())["config"]["predictor"] == "policy-states"
    scripted, _ = scripted_setup(4)
    with pytest.raises(ValueError, match="policy-states needs a transformers policy"):
        run_bench(config, policy=scripted, make_env=make_math_env, log=lambda _m: None)
    with pytest.raises(ValueError, match="predictor must be one of"):
        BenchConfig(predictor="lm-critic")


def test_the_warm_up_refreshes_the_predictor_with_the_configured_prefix_share() -> None:
    """``BenchConfig.prefix_share`` (``--prefix-share``) reaches every warm-up refresh: 0 trains on prompts only,
    None (``all``) on every example; the trainer's check refuses a share outside [0, 1]."""
    from trace_agent.bench import prefix_share_arg
    from trace_agent.errors import ConfigError

    policy, _ = scripted_setup(300)
    budget = Budget(roots=8, continuations_per_root=2, group_size=4)
    refresh = {}
    for share in (0.0, None):
        config = BenchConfig(strategies=("grpo",), seeds=1, prompts=2, budget=budget, warmup_prompts=4, max_turns=3,
                             prefix_share=share, rollout=RolloutConfig(workers=1))
        result = run_bench(config, policy=policy, predictor=EmbeddingPredictor(HashedNGramFeaturizer(dim=64)),
                           make_env=make_math_env, log=lambda _m: None)
        refresh[share] = result.predictor["warmup_refresh"]
    assert refresh[None]["train_examples"] == refresh[None]["examples"] > refresh[0.0]["train_examples"] > 0
    assert refresh[None]["train_prefix_share"] > 0.0 == refresh[0.0]["train_prefix_share"]
    assert BenchConfig().prefix_share == 0.06
    with pytest.raises(ConfigError, match="prefix_share"):
        BenchConfig(prefix_share=1.5)
    assert prefix_share_arg("all") is None and prefix_share_arg("0.25") == 0.25
    for bad in ("-0.1", "nan", "x"):
        with pytest.raises(argparse.ArgumentTypeError):
            prefix_share_arg(bad)
