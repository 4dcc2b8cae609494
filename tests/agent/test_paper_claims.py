"""The paper's claims in miniature: the analyses against hand-computed and brute-force cases, the equal-budget
comparison's summary, and every ``scripts/paper_claims.py`` subcommand (:mod:`trace_agent.lab.claims.cli`) in its
``--small`` mode on PythonMath-v0."""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from trace_agent.lab.analysis import (
    Anchor,
    MonteCarloProbe,
    anchors_from_trees,
    budget_profile,
    capture_at,
    capture_curve,
    contrast_summary,
    curve_auc,
    error_by_depth,
    fraction_for_share,
    rank_correlations,
    shape_costs,
    split_contrast_summary,
    spread,
)
from trace_agent.lab.compare import ComparisonResult
from trace_agent.strategies import Budget

from .conftest import build_tree


def _anchor(depth: int, predicted: float, truth: float, *, samples: int = 4, seed: int = 0, prompt_truth: float = 0.5,
            pid: str = "p") -> Anchor:
    return Anchor(prompt_id=pid, seed=seed, node_id=depth, depth=depth, predicted=predicted, truth=truth,
                  samples=samples, prompt_truth=prompt_truth)


# --------------------------------------------------------------------------------------------------
# contrast capture


def test_capture_curve_matches_a_hand_computed_case_with_ties() -> None:
    # order by score: 0.9 (6), then a tie 0.5/0.5 (2, 0 -> 1 each), 0.2 (4), 0.1 (0); total 12
    curve = capture_curve([6, 0, 2, 0, 4], [0.9, 0.1, 0.5, 0.5, 0.2])
    assert curve.tolist() == pytest.approx([0.0, 6 / 12, 7 / 12, 8 / 12, 1.0, 1.0])
    assert capture_at(curve, 0.2) == pytest.approx(0.5)
    assert capture_at(curve, 0.3) == pytest.approx((6 / 12 + 7 / 12) / 2)  # halfway between k = 1 and k = 2
    assert fraction_for_share(curve, 0.5) == pytest.approx(0.2)
    assert fraction_for_share(curve, 0.9) == pytest.approx(0.8)
    assert fraction_for_share(curve, 0.0) == 0.0


def test_tied_positions_are_the_exact_expectation_over_tie_orders() -> None:
    rng = np.random.default_rng(3)
    for _ in range(20):
        c = rng.integers(0, 5, 6).astype(float)
        c[0] += 1.0  # some contrast
        s = rng.integers(0, 3, 6).astype(float)  # many ties
        curve = capture_curve(c, s)
        # brute force: every ordering consistent with the scores (ties in every order), averaged
        curves = []
        for perm in itertools.permutations(range(6)):
            if all(s[perm[i]] >= s[perm[i + 1]] for i in range(5)):
                curves.append(np.concatenate([[0.0], np.cumsum(c[list(perm)])]) / c.sum())
        assert curve == pytest.approx(np.mean(curves, axis=0))


def test_random_ranking_is_the_diagonal_and_the_oracle_bounds_every_ranking() -> None:
    rng = np.random.default_rng(0)
    for _ in range(30):
        n = int(rng.integers(2, 7))
        c = rng.integers(0, 10, n).astype(float)
        if c.sum() == 0:
            continue
        diag = capture_curve(c, np.zeros(n))
        assert diag == pytest.approx(np.arange(n + 1) / n)
        assert curve_auc(diag) == pytest.approx(0.5)
        oracle = capture_curve(c, c)
        for perm in itertools.permutations(range(n)):
            other = capture_curve(c, -np.asarray(perm, dtype=float))  # a strict ranking: perm order
            assert np.all(oracle >= other - 1e-12)
            assert np.all(np.diff(other) >= 0) and other[0] == 0.0 and other[-1] == 1.0
        assert np.all(oracle >= diag - 1e-12)


def test_capture_curve_refuses_bad_inputs() -> None:
    with pytest.raises(ValueError, match="no available contrast"):
        capture_curve([0, 0], [0.1, 0.2])
    with pytest.raises(ValueError, match="no available contrast"):
        capture_curve([], [])
    with pytest.raises(ValueError, match=">= 0"):
        capture_curve([1, -1], [0.1, 0.2])
    with pytest.raises(ValueError, match="finite"):
        capture_curve([1, 2], [0.1, math.nan])
    with pytest.raises(ValueError, match="contrasts for"):
        capture_curve([1, 2, 3], [0.1, 0.2])
    with pytest.raises(ValueError):
        capture_at([0.0, 1.0], 1.5)


def test_anchor_contrast_is_an_unbiased_estimate_of_k_k1_v_1v() -> None:
    from math import comb

    for k in (2, 4, 8):
        for v in (0.0, 0.1, 0.5, 0.8):
            expected = sum(comb(k, s) * v**s * (1 - v) ** (k - s) * _anchor(0, 0.5, s / k, samples=k).contrast
                           for s in range(k + 1))
            assert expected == pytest.approx(k * (k - 1) * v * (1 - v))
    assert _anchor(0, 0.5, 0.375, samples=8).contrast == 3 * 5


def test_contrast_summary_ranks_by_predicted_uncertainty() -> None:
    # the predictor puts its 0.5 on the anchor with the most contrast: its curve equals the oracle's
    anchors = [_anchor(0, 0.5, 0.5), _anchor(1, 0.9, 0.25), _anchor(1, 0.99, 1.0), _anchor(2, 0.05, 0.0)]
    summ = contrast_summary(anchors)
    assert summ["total_contrast"] == 4 + 3
    assert summ["degenerate_share"] == 0.5
    assert summ["predicted"]["curve"] == pytest.approx(summ["oracle"]["curve"])
    assert summ["oracle"]["at"]["0.5"] == pytest.approx(1.0)
    assert summ["random"]["auc"] == pytest.approx(0.5)
    assert summ["oracle"]["fraction_for"]["0.5"] == pytest.approx(0.25)


def _split_reference(anchors: list[Anchor]) -> dict[str, list[float]]:
    """Brute force: every arrangement of each anchor's successes among its K samples (half A = the first K // 2),
    equally likely given s; curves averaged over the arrangements whose half B holds contrast."""
    from math import comb

    k = anchors[0].samples
    k_a = k // 2
    per_anchor = []
    for a in anchors:
        arrangements = [set(c) for c in itertools.combinations(range(k), a.successes)]
        per_anchor.append([(sum(i < k_a for i in c), sum(i >= k_a for i in c)) for c in arrangements])
    assert all(len(x) == comb(k, a.successes) for x, a in zip(per_anchor, anchors))
    p = np.asarray([a.predicted for a in anchors])
    sums = {"oracle": np.zeros(len(anchors) + 1), "predicted": np.zeros(len(anchors) + 1)}
    weight = 0
    for combo in itertools.product(*per_anchor):
        s_a = np.asarray([x[0] for x in combo])
        s_b = np.asarray([x[1] for x in combo])
        c_b = s_b * (k - k_a - s_b)
        if c_b.sum() == 0:
            continue
        weight += 1
        sums["oracle"] += capture_curve(c_b, s_a * (k_a - s_a))
        sums["predicted"] += capture_curve(c_b, p * (1 - p))
    return {name: (v / weight).tolist() for name, v in sums.items()}


def test_split_contrast_matches_the_brute_force_average_over_sample_arrangements() -> None:
    anchors = [_anchor(0, 0.5, 0.5), _anchor(1, 0.9, 0.75), _anchor(1, 0.2, 0.25), _anchor(2, 0.05, 0.0),
               _anchor(2, 0.6, 0.5)]
    ref = _split_reference(anchors)
    summ = split_contrast_summary(anchors, splits=20000, seed=1)
    assert summ["half_samples"] == [2, 2] and summ["anchors"] == 5
    assert summ["splits"] + summ["skipped_splits"] == 20000 and summ["skipped_splits"] > 0
    for name in ("oracle", "predicted"):
        assert summ[name]["curve"] == pytest.approx(ref[name], abs=0.01)
    assert summ["random"]["curve"] == pytest.approx(np.linspace(0, 1, 6).tolist())
    assert summ["random"]["auc_over_splits"]["std"] == pytest.approx(0.0)


def test_out_of_sample_a_predictor_that_knows_the_mixed_anchors_beats_half_a_samples() -> None:
    # two mixed anchors (2 and 6 successes of 8) among all-alike ones; the predictor knows which are mixed. Half A's
    # 4 samples misjudge them: with s = 2, s_A = 2 leaves half B all-alike and s_A = 0 hides the pairs half B holds
    anchors = [_anchor(0, 0.3, 0.25, samples=8), _anchor(1, 0.7, 0.75, samples=8)] + [
        _anchor(1, v, t, samples=8) for v, t in ((0.99, 1.0), (0.01, 0.0), (0.98, 1.0), (0.02, 0.0))]
    split = split_contrast_summary(anchors, splits=4000, seed=0)
    assert split["half_samples"] == [4, 4]
    assert split["predicted"]["at"]["0.5"] == pytest.approx(1.0)  # half B's pairs sit only on the two mixed anchors
    assert split["predicted"]["auc"] > split["oracle"]["auc"] + 0.02
    assert split["oracle"]["auc"] > split["random"]["auc"]  # the all-alike anchors are never ranked above them
    assert split_contrast_summary(anchors, splits=50, seed=3) == split_contrast_summary(anchors, splits=50, seed=3)


def test_split_contrast_refuses_what_it_cannot_split() -> None:
    with pytest.raises(ValueError, match="K >= 4"):
        split_contrast_summary([_anchor(0, 0.5, 0.5, samples=2)])
    with pytest.raises(ValueError, match="one K"):
        split_contrast_summary([_anchor(0, 0.5, 0.5, samples=4), _anchor(0, 0.5, 0.5, samples=8)])
    with pytest.raises(ValueError, match="splits"):
        split_contrast_summary([_anchor(0, 0.5, 0.5)], splits=0)
    with pytest.raises(ValueError, match="no available contrast"):
        split_contrast_summary([_anchor(0, 0.5, 1.0), _anchor(1, 0.5, 0.0)], splits=10)


# --------------------------------------------------------------------------------------------------
# predictor error and rank correlation


def test_error_by_depth_is_hand_computed_with_the_monte_carlo_noise_removed() -> None:
    anchors = [_anchor(0, 0.5, 0.25, prompt_truth=0.25), _anchor(0, 0.5, 0.75, prompt_truth=0.75),
               _anchor(1, 0.5, 0.5, prompt_truth=0.25), _anchor(1, 1.0, 1.0, prompt_truth=0.75)]
    rows = error_by_depth(anchors)
    assert [r["depth"] for r in rows] == [0.0, 1.0]
    d0, d1 = rows
    assert d0["mse"] == pytest.approx(0.0625) and d0["mae"] == pytest.approx(0.25)
    assert d0["noise"] == pytest.approx(0.1875 / 3)  # t(1 - t)/(K - 1), K = 4
    assert d0["mse_vs_true"] == pytest.approx(0.0625 - 0.0625)
    assert math.isnan(d0["ratio_to_prompt"])  # depth 0 error vs true V is 0: no ratio
    assert d1["mse"] == 0.0 and d1["noise"] == pytest.approx((0.25 / 3 + 0.0) / 2)
    assert d1["prompt_rate_mse"] == pytest.approx((0.25**2 + 0.25**2) / 2)
    assert d0["prompt_rate_mse"] == 0.0
    assert d0["raw_ratio_to_prompt"] == 1.0 and d1["raw_ratio_to_prompt"] == 0.0


def test_error_ratio_to_prompts_and_the_noise_estimate_is_unbiased() -> None:
    # E[t(1-t)] / (K-1) = V(1-V)/K = Var(t) for t = s/K, s ~ Binomial(K, V)
    from math import comb

    k, v = 6, 0.3
    e = sum(comb(k, s) * v**s * (1 - v) ** (k - s) * (s / k) * (1 - s / k) for s in range(k + 1)) / (k - 1)
    assert e == pytest.approx(v * (1 - v) / k)
    anchors = [_anchor(0, 0.9, 0.0, samples=2), _anchor(1, 0.3, 0.0, samples=2)]
    rows = error_by_depth(anchors)
    assert rows[1]["ratio_to_prompt"] == pytest.approx(0.09 / 0.81)


def test_rank_correlations_split_prompts_from_prefixes_and_seeds() -> None:
    anchors = []
    for seed in (0, 1):
        for i in range(4):
            anchors.append(_anchor(0, i / 4, i / 4, seed=seed, pid=f"r{i}"))  # perfect at prompts
            anchors.append(_anchor(1, i / 4, 1 - i / 4, seed=seed, pid=f"r{i}"))  # reversed at prefixes
    out = rank_correlations(anchors)
    assert out["pooled"]["root"] == pytest.approx(1.0) and out["pooled"]["prefix"] == pytest.approx(-1.0)
    assert set(out["per_seed"]) == {"0", "1"}
    assert out["over_seeds"]["root"]["mean"] == pytest.approx(1.0) and out["over_seeds"]["root"]["std"] == 0.0


def test_anchors_come_from_nodes_with_a_prediction_and_a_monte_carlo_rate() -> None:
    tree = build_tree(roots=2, depth=3, continuations=0, seed=1)
    tree.metadata["seed"] = 7
    assert anchors_from_trees([tree], samples=4) == []  # no Monte-Carlo rate at the root: skipped
    inner = [n for n in tree.nodes if not n.is_leaf]
    for i, n in enumerate(inner):
        n.value = 0.1 * i
        n.info["oracle_value"] = 0.25 * (i % 5)
    leaf = tree.leaves()[0]
    leaf.value, leaf.info["oracle_value"] = 0.5, 0.5  # leaves are never anchors
    got = anchors_from_trees([tree], samples=4)
    assert [a.node_id for a in got] == [n.node_id for n in inner]
    assert all(a.seed == 7 and a.prompt_truth == 0.0 and a.samples == 4 for a in got)
    with pytest.raises(ValueError):
        anchors_from_trees([tree], samples=0)


# --------------------------------------------------------------------------------------------------
# budget profile, shapes, spread


def _row(strategy: str, seed: int, **kw: object) -> dict:
    base = {"strategy": strategy, "seed": seed, "skipped": 6, "active_prompts": 3, "root_rollouts": 12,
            "continuations": 24, "paper_units": 24.0, "continuation_depths": {"1": 20, "2": 4}}
    return base | kw


def test_budget_profile_is_hand_computed() -> None:
    budget = Budget(roots=12, continuations_per_root=2, group_size=4)
    rows = [_row("trace", 0), _row("trace", 1, skipped=7, active_prompts=2, continuation_depths={"1": 12, "3": 12}),
            _row("grpo", 0, continuations=0, continuation_depths={})]
    prof = budget_profile(rows, prompts=9, budget=budget)
    t = prof["trace"]
    assert t["skipped_share"]["mean"] == pytest.approx((6 / 9 + 7 / 9) / 2)
    assert t["roots_per_active"]["mean"] == pytest.approx((4 + 6) / 2)
    assert t["rollouts_per_active"]["mean"] == pytest.approx((12 + 18) / 2)
    assert t["units_per_active"]["mean"] == pytest.approx((8 + 12) / 2)
    assert t["continuation_depths"] == pytest.approx({"1": 32 / 48, "2": 4 / 48, "3": 12 / 48})
    assert t["deepest_continuation"] == 3 and t["skip_floor"] == pytest.approx(1 - 3 / 9)
    assert prof["grpo"]["continuation_depths"] == {} and prof["grpo"]["deepest_continuation"] == 0


def test_shape_costs_compares_planned_and_measured_units() -> None:
    wide, deep = Budget(roots=24, continuations_per_root=2, group_size=4), Budget(roots=12, continuations_per_root=6,
                                                                                   group_size=4)
    assert wide.paper_units == deep.paper_units == 48
    ok = shape_costs({"wide": (wide, [{"paper_units": 48.0}]), "deep": (deep, [{"paper_units": 48.0}])})
    assert ok["equal"] and ok["shapes"]["deep"]["max_active"] == 3
    short = shape_costs({"wide": (wide, [{"paper_units": 48.0}]), "deep": (deep, [{"paper_units": 47.5}])})
    assert not short["equal"]
    other = Budget(roots=12, continuations_per_root=2, group_size=4)
    assert not shape_costs({"a": (wide, []), "b": (other, [])})["equal"]


def test_spread_is_mean_sample_sd_min_max() -> None:
    s = spread([1.0, 3.0, math.nan])
    assert s == {"mean": 2.0, "std": pytest.approx(math.sqrt(2)), "min": 1.0, "max": 3.0, "n": 2}
    assert spread([5.0])["std"] == 0.0 and math.isnan(spread([])["mean"])


# --------------------------------------------------------------------------------------------------
# the training comparison's summary


def test_comparison_summary_pairs_each_seed_with_the_reference() -> None:
    from trace_agent.config import TrainConfig
    from trace_agent.config_io import config_to_dict

    rows = []
    for seed, (t, g) in enumerate([(0.5, 0.4), (0.3, 0.35), (0.6, 0.5)]):
        for name, after in (("trace", t), ("grpo", g)):
            rows.append({"strategy": name, "seed": seed, "after": after, "after_se": 0.01, "effective_ratio": 0.5,
                         "train_success": 0.4, "paper_units": 100.0, "generated_tokens": 10.0,
                         "predictor_share": 0.1, "seconds": 3.0, "out_dir": "x"})
    result = ComparisonResult(config=config_to_dict(TrainConfig()), strategies=("trace", "grpo"), seeds=(0, 1, 2),
                              base={"success": 0.2, "success_se": 0.02, "tasks": 10, "samples": 2, "episodes": 20},
                              rows=tuple(rows), command="test")
    s = result.summary()
    assert s["trace"]["after"]["mean"] == pytest.approx(1.4 / 3)
    vs = s["trace"]["vs_reference"]
    assert vs["mean"] == pytest.approx((0.1 - 0.05 + 0.1) / 3) and vs["wins"] == 2 and vs["seeds"] == 3
    assert "vs_reference" not in s["grpo"]
    md = result.to_markdown()
    assert "| trace |" in md and "2/3" in md and "0.500 / 0.300 / 0.600" in md
    data = json.loads(result.to_json())
    assert data["summary"]["grpo"]["after"]["max"] == 0.5 and len(data["rows"]) == 6


def _comparison(strategies: tuple[str, ...], seeds: tuple[int, ...], *, steps: int = 4,
                out_dir: str = "a") -> ComparisonResult:
    from trace_agent.config import TrainConfig
    from trace_agent.config_io import config_to_dict

    rows = tuple({"strategy": name, "seed": seed, "after": 0.1 * seed + 0.01 * len(name), "after_se": 0.01,
                  "effective_ratio": 0.5, "train_success": 0.4, "paper_units": 100.0, "generated_tokens": 10.0,
                  "predictor_share": 0.1, "seconds": 3.0, "out_dir": f"{out_dir}/{name}_s{seed}"}
                 for name in strategies for seed in seeds)
    config = {**config_to_dict(TrainConfig()), "steps": steps, "out_dir": out_dir}
    return ComparisonResult(config=config, strategies=strategies, seeds=seeds, rows=rows, command=f"run {out_dir}",
                            base={"success": 0.2, "success_se": 0.02, "tasks": 10, "samples": 2, "episodes": 20})


def test_comparisons_run_in_parts_merge_into_the_whole(claims, tmp_path) -> None:
    """Seeds (and a strategy) run in three parts pool into the comparison run at once: the same summary, the
    reference kept, seeds sorted; a round trip through the JSON changes nothing; parts of another config, another
    start or a run measured twice are refused; ``paper_claims.py train --merge`` writes the pooled table."""
    whole = _comparison(("trace", "grpo"), (0, 1, 2, 3))
    parts = [_comparison(("trace", "grpo"), (2, 3), out_dir="b"), _comparison(("trace", "grpo"), (0, 1)),
             _comparison(("treepo",), (0, 1), out_dir="c")]
    merged = ComparisonResult.merge(parts)
    assert merged.strategies == ("trace", "grpo", "treepo") and merged.seeds == (0, 1, 2, 3)
    summary = merged.summary()
    assert {k: summary[k] for k in ("trace", "grpo")} == whole.summary()
    assert summary["treepo"]["vs_reference"]["seeds"] == 2
    assert "0: 0.060 / 1: 0.160" in merged.to_markdown()  # a strategy on only some seeds: labelled
    assert merged.command == "run b; run a; run c"
    assert ComparisonResult.from_json(merged.to_json()) == merged
    with pytest.raises(ValueError, match="steps"):
        ComparisonResult.merge([whole, _comparison(("pcl",), (0,), steps=8)])
    with pytest.raises(ValueError, match="another held-out result"):
        ComparisonResult.merge([whole, replace(_comparison(("pcl",), (0,)), base={"success": 0.3})])
    with pytest.raises(ValueError, match="two parts"):
        ComparisonResult.merge([whole, _comparison(("trace",), (3,), out_dir="d")])
    with pytest.raises(ValueError):
        ComparisonResult.merge([])
    with pytest.raises(ValueError, match="not a training comparison"):
        ComparisonResult.from_json(json.dumps({"rows": "__import__('os')"}))
    files = []
    for k, part in enumerate(parts):
        files.append(tmp_path / f"part{k}.json")
        files[-1].write_text(part.to_json())
    data = claims.main(["train", "--merge", ",".join(map(str, files)), "--out", str(tmp_path / "pooled")])
    assert data["summary"] == json.loads(merged.to_json())["summary"] and data["command"].startswith(merged.command)
    assert "pooled by python scripts/paper_claims.py train --merge" in data["command"]
    assert (tmp_path / "pooled" / "train.png").is_file() and (tmp_path / "pooled" / "compare.md").is_file()


# --------------------------------------------------------------------------------------------------
# the probe through the real collector (scripted policy: fast)


@pytest.mark.slow
def test_monte_carlo_probe_scores_and_estimates_every_anchor_without_adding_continuations() -> None:
    from trace_agent.bench import BenchConfig, run_bench
    from trace_agent.predictor import EmbeddingPredictor, HashedNGramFeaturizer
    from trace_agent.rollout import RolloutConfig

    from .test_rollout import make_math_env, scripted_setup

    policy, _ = scripted_setup(300)  # covers the whole default task set
    budget = Budget(roots=8, continuations_per_root=1, group_size=2)
    config = BenchConfig(strategies=("probe",), seeds=1, prompts=4, budget=budget, warmup_prompts=4, max_turns=3,
                         rollout=RolloutConfig(workers=2, oracle_samples=3))
    result = run_bench(config, policy=policy, strategies=[MonteCarloProbe()],
                       predictor=EmbeddingPredictor(HashedNGramFeaturizer(dim=32)), make_env=make_math_env,
                       log=lambda _m: None)
    assert len(result.trees) == 4
    for tree in result.trees:
        assert len(tree.leaves()) == 2  # its two roots; the probe adds no continuation
        inner = [n for n in tree.nodes if not n.is_leaf]
        assert all(n.value is not None and n.info["oracle_value"] in (0.0, 1 / 3, 2 / 3, 1.0) for n in inner)
    anchors = anchors_from_trees(result.trees, samples=3)
    assert sum(a.depth == 0 for a in anchors) == 4
    assert result.rows[0]["oracle_generated_tokens"] > 0


# --------------------------------------------------------------------------------------------------
# the command, --small, on PythonMath-v0 with the shipped demo policy


def test_every_subcommand_has_help(capsys) -> None:
    from trace_agent.lab.claims import cli

    for argv in (["--help"], *([c, "--help"] for c in cli.RUNNERS)):
        with pytest.raises(SystemExit) as exit_:
            cli.main(argv)
        assert exit_.value.code == 0
    assert "contrast" in capsys.readouterr().out


def test_the_script_is_the_command_line() -> None:
    import subprocess
    import sys

    script = Path(__file__).resolve().parents[2] / "scripts" / "paper_claims.py"
    proc = subprocess.run([sys.executable, str(script), "table", "--help"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "--reference" in proc.stdout, proc.stderr[-2000:]


@pytest.fixture(scope="module")
def claims():
    from trace_agent.lab.claims import cli

    return cli


@pytest.fixture(scope="module")
def demo_policy():
    from trace_agent.bench import load_policy

    return load_policy("demo", log=lambda _m: None)


def _outputs(out: Path, claim: str) -> dict:
    assert (out / f"{claim}.md").read_text().startswith(f"### {claim}")
    png = out / f"{claim}.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    return json.loads((out / f"{claim}.json").read_text())


@pytest.mark.slow
def test_ratio_small_and_ablation_from_its_bench_json(claims, demo_policy, tmp_path) -> None:
    raw = tmp_path / "raw"
    data = claims.main(["ratio", "--small", "--strategies", "grpo,trace-root,trace", "--raw", str(raw),
                        "--out", str(tmp_path / "r")], policy=demo_policy)
    on_disk = _outputs(tmp_path / "r", "ratio")
    assert on_disk["rows"] == json.loads(json.dumps(data["rows"]))  # JSON round trip
    assert [r["strategy"] for r in on_disk["rows"]] == ["grpo", "trace-root", "trace"] * 2
    assert all(r["paper_units"] == 16.0 for r in on_disk["rows"])
    assert all(0.0 <= r["effective_ratio"] <= 1.0 for r in on_disk["rows"])
    assert (raw / "bench.json").is_file() and (raw / "trees.jsonl").is_file()
    # the ablation reads the same rows back (no policy needed): the stages it names that the bench ran
    again = claims.main(["ablation", "--bench-json", str(raw / "bench.json"), "--out", str(tmp_path / "a")])
    assert list(again["summary"]) == ["trace-root", "trace"]
    assert again["rows"] == [r for r in on_disk["rows"] if r["strategy"] != "grpo"]
    assert again["summary"]["trace"]["effective_ratio"] == on_disk["summary"]["trace"]["effective_ratio"]
    md = (tmp_path / "a" / "ablation.md").read_text()
    assert "root allocation only" in md and "measured by: `python scripts/paper_claims.py ratio --small" in md
    with pytest.raises(SystemExit, match="holds none of"):
        claims.main(["ablation", "--bench-json", str(raw / "bench.json"), "--strategies", "pcl",
                     "--out", str(tmp_path / "x")])


@pytest.mark.slow
def test_shape_small_spends_equal_paper_units(claims, demo_policy, tmp_path) -> None:
    data = claims.main(["shape", "--small", "--seeds", "1", "--strategies", "trace", "--out", str(tmp_path)],
                       policy=demo_policy)
    costs = _outputs(tmp_path, "shape")["costs"]
    assert costs["equal"] is True and data["costs"]["equal"]
    wide, deep = costs["shapes"]["wide"], costs["shapes"]["deep"]
    assert (wide["roots"], wide["continuations_per_root"], deep["roots"], deep["continuations_per_root"]) == (8, 2, 4, 6)
    assert wide["planned_units"] == deep["planned_units"] == wide["measured_min"] == deep["measured_max"] == 16.0
    assert "**equal**" in (tmp_path / "shape.md").read_text()
    with pytest.raises(SystemExit, match="equal"):
        claims.main(["shape", "--small", "--deep", "4,4", "--out", str(tmp_path)], policy=demo_policy)


@pytest.mark.slow
def test_budget_small_profiles_where_the_budget_went(claims, demo_policy, tmp_path) -> None:
    data = claims.main(["budget", "--small", "--seeds", "1", "--strategies", "grpo,trace", "--out", str(tmp_path)],
                       policy=demo_policy)
    prof = _outputs(tmp_path, "budget")["profile"]
    assert data["prompts"] == 12  # 3 x the 4 prompts any strategy may activate
    assert prof["grpo"]["skipped_share"]["mean"] == pytest.approx(8 / 12)
    assert prof["trace"]["skipped_share"]["mean"] >= prof["trace"]["skip_floor"] - 1e-9
    assert prof["grpo"]["continuation_depths"] == {}
    shares = prof["trace"]["continuation_depths"]
    assert shares and sum(shares.values()) == pytest.approx(1.0) and min(int(d) for d in shares) >= 1


@pytest.mark.slow
def test_predictor_and_contrast_small_on_the_same_probe_trees(claims, demo_policy, tmp_path) -> None:
    raw = tmp_path / "raw"
    data = claims.main(["predictor", "--small", "--seeds", "1", "--out", str(tmp_path / "p"), "--raw", str(raw)],
                       policy=demo_policy)
    on_disk = _outputs(tmp_path / "p", "predictor")
    assert on_disk["error_by_depth"] == json.loads(json.dumps(data["error_by_depth"], allow_nan=True))
    from trace_agent.tree_io import load_jsonl

    trees = load_jsonl(raw / "trees.jsonl")
    depths = {n.depth for t in trees for n in t.nodes if not n.is_leaf and "oracle_value" in n.info}
    assert {int(r["depth"]) for r in on_disk["error_by_depth"]} == depths and 0 in depths
    assert sum(r["anchors"] for r in on_disk["error_by_depth"]) == on_disk["anchors"]
    assert int(on_disk["error_by_depth"][0]["anchors"]) == 4  # every candidate prompt is an anchor
    data = claims.main(["contrast", "--small", "--trees", str(raw / "trees.jsonl"), "--out", str(tmp_path / "c")])
    levels = _outputs(tmp_path / "c", "contrast")["levels"]
    split = _outputs(tmp_path / "c", "contrast")["out_of_sample"]
    assert set(split) == set(levels)
    for part in split.values():  # scored on half B: a random ranking is the diagonal; or said why not
        assert ("error" in part and ("K >= 4" in part["error"] or "no available contrast" in part["error"])) or \
            part["random"]["auc"] == pytest.approx(0.5)
    summ = levels["all anchors"]
    if "error" in summ:  # every anchor's continuations ended alike: said so, no curve
        assert "no available contrast" in summ["error"]
        return
    for name in ("oracle", "predicted", "random"):
        y = np.asarray(summ[name]["curve"])
        assert y[0] == 0.0 and y[-1] == 1.0 and np.all(np.diff(y) >= 0)
        assert np.all(np.asarray(summ["oracle"]["curve"]) >= y - 1e-12)
    assert summ["random"]["curve"] == pytest.approx(np.linspace(0, 1, len(summ["random"]["curve"])))


@pytest.mark.slow
def test_train_small_compares_strategies_from_one_start(claims, tmp_path) -> None:
    data = claims.main(["train", "--small", "--seeds", "0", "--strategies", "trace,grpo", "--out", str(tmp_path)])
    on_disk = _outputs(tmp_path, "train")
    assert [r["strategy"] for r in on_disk["rows"]] == ["trace", "grpo"]
    assert on_disk["rows"][0]["paper_units"] == on_disk["rows"][1]["paper_units"] == pytest.approx(12.0)
    assert 0.0 <= data["base"]["success"] <= 1.0 and data["base"]["episodes"] == 2
    assert (tmp_path / "compare.json").is_file() and (tmp_path / "trace_s0" / "summary.json").is_file()


@pytest.mark.slow
def test_train_runs_writes_one_file_per_arm_and_seed_with_its_shape(claims, tmp_path) -> None:
    runs = tmp_path / "runs"
    argv = ["train", "--small", "--seeds", "0", "--strategies", "trace/8x2,trace/4x6", "--runs", str(runs),
            "--out", str(tmp_path / "out")]
    data = claims.main(argv)
    assert data["runs"] == ["trace_8x2_s0.json", "trace_4x6_s0.json"]
    wide, deep = (json.loads((runs / name).read_text()) for name in data["runs"])
    assert wide["shape"] == [8, 2] and deep["shape"] == [4, 6]
    assert wide["config"]["rollout"]["budget"]["continuations_per_root"] == 2 and deep["config"]["rollout"]["budget"]["roots"] == 4
    assert wide["paper_units"] == pytest.approx(16.0) and deep["paper_units"] <= 16.0 + 1e-9
    assert [e["step"] for e in wide["evals"]] == [0, 1] and json.loads((runs / "base.json").read_text())["eval"]
    # no machine path recorded, though --runs and --out are absolute paths outside the repository
    from trace_agent.lab.run_data import machine_paths

    base = json.loads((runs / "base.json").read_text())
    assert wide["root"] == base["root"] == "." and list(machine_paths(wide)) == list(machine_paths(base)) == []
    assert "--runs $OUTSIDE/runs" in wide["command"] and wide["command"].startswith("python scripts/paper_claims.py")
    assert claims.main(argv)["runs"] == []  # finished runs are skipped on a rerun
    from trace_agent.lab.run_data import compress_file

    compress_file(runs / data["runs"][0])
    assert claims.main(argv)["runs"] == []  # a compressed run file counts as finished too


@pytest.mark.slow
def test_train_runs_with_a_warm_arm_record_the_warm_up_in_budget(claims, tmp_path) -> None:
    """``trace+warm3x2``: 3 train tasks x 2 roots warm the predictor; the run file counts and records them."""
    runs = tmp_path / "runs"
    data = claims.main(["train", "--small", "--seeds", "0", "--strategies", "trace+warm3x2,grpo", "--runs", str(runs),
                        "--out", str(tmp_path / "out")])
    assert data["runs"] == ["trace_warm3x2_s0.json", "grpo_s0.json"]
    warm, grpo = (json.loads((runs / name).read_text()) for name in data["runs"])
    assert warm["config"]["predictor"]["warm_start_tasks"] == 3 and grpo["config"]["predictor"]["warm_start_tasks"] == 0
    w = warm["warm_start"]
    assert (w["tasks"], w["roots"], w["paper_units"]) == (3, 2, 6) and "predictor/pre_mse_root" in w
    assert warm["paper_units"] == pytest.approx(6 + 12) and grpo["paper_units"] == pytest.approx(12)
    assert warm["generated_tokens"] > w["generated_tokens"] > 0 and grpo["warm_start"] is None
    assert warm["steps"][0]["budget/total_paper_units"] == pytest.approx(18)
    from trace_agent.lab.preregistered import build_table, load_runs

    table = build_table(load_runs(runs))
    assert table["arms"]["trace+warm3x2"]["warm_start_generated_tokens"] == w["generated_tokens"]
    assert table["arms"]["grpo"]["warm_start_generated_tokens"] == 0


# --------------------------------------------------------------------------------------------------
# the pre-registered comparison's table, rebuilt from per-run files


def _run_file(arm: str, seed: int, curve: tuple[float, float, float], ratios: tuple[float, float],
              tokens: float) -> dict:
    strategy, _, mult = arm.partition("@")
    return {"arm": arm, "strategy": strategy, "budget_multiple": int(mult[:-1]) if mult else 1, "seed": seed,
            "commit": "c0ffee" * 6 + "abcd", "code_dirty": False, "config": {}, "seconds": 10.0,
            "paper_units": 1152.0 * (2 if mult else 1), "generated_tokens": tokens,
            "evals": [{"step": s, "success": v} for s, v in zip((0, 8, 16), curve)],
            "steps": [{"step": 1, "rollout/effective_ratio": ratios[0]}, {"step": 2, "rollout/effective_ratio": ratios[1]}]}


def test_table_from_run_files_matches_hand_computed_numbers(claims, tmp_path) -> None:
    curves = {  # (arm, seed) -> held-out success at steps 0, 8, 16
        ("grpo", 0): (0.30, 0.34, 0.38), ("grpo", 1): (0.30, 0.30, 0.34), ("grpo", 2): (0.30, 0.36, 0.32),
        ("trace", 0): (0.30, 0.38, 0.40), ("trace", 1): (0.30, 0.34, 0.34), ("trace", 2): (0.30, 0.36, 0.40),
        ("grpo@2x", 0): (0.30, 0.40, 0.42),
    }
    for (arm, seed), curve in curves.items():
        data = _run_file(arm, seed, curve, (0.25, 0.5) if arm == "grpo" else (0.5, 0.75), 100.0 + seed)
        (tmp_path / f"{arm.replace('@', '_')}_s{seed}.json").write_text(json.dumps(data))
    (tmp_path / "base.json").write_text(json.dumps({"eval": {"step": 0, "success": 0.3}}))  # not a run
    table = claims.main(["table", "--runs", str(tmp_path), "--out", str(tmp_path / "out")])
    # AUC over steps 0, 8, 16 = (s0 + 2 s8 + s16) / 4
    auc = {k: (c[0] + 2 * c[1] + c[2]) / 4 for k, c in curves.items()}
    assert auc[("trace", 0)] == pytest.approx(0.365)
    t = table["arms"]["trace"]
    assert t["seeds"] == [0, 1, 2]
    assert t["auc"] == pytest.approx((0.365 + 0.33 + 0.355) / 3)
    assert t["final"] == pytest.approx((0.40 + 0.34 + 0.40) / 3)
    assert t["effective_ratio_step1"] == pytest.approx(0.5) and t["effective_ratio"] == pytest.approx(0.625)
    assert table["arms"]["grpo"]["effective_ratio"] == pytest.approx(0.375)
    assert t["effective_ratio_sd"] == pytest.approx(0.0) and t["effective_ratio_step1_sd"] == pytest.approx(0.0)
    assert t["generated_tokens"] == pytest.approx(101.0)
    diffs = [auc[("trace", s)] - auc[("grpo", s)] for s in range(3)]  # 0.025, 0.02, 0.02
    mean = sum(diffs) / 3
    se = math.sqrt(sum((d - mean) ** 2 for d in diffs) / 2 / 3)
    vs = t["vs_reference"]["auc"]
    assert vs["n"] == 3 and vs["mean"] == pytest.approx(0.065 / 3) and vs["se"] == pytest.approx(se)
    assert vs["low"] == pytest.approx(mean - 4.302652729911275 * se)  # t(0.975, df = 2)
    assert vs["high"] == pytest.approx(mean + 4.302652729911275 * se)
    assert t["vs_reference"]["final"]["mean"] == pytest.approx((0.02 + 0.0 + 0.08) / 3)
    two_b = table["arms"]["grpo@2x"]  # one paired seed: a mean, no interval
    assert two_b["vs_reference"]["auc"]["n"] == 1 and math.isnan(two_b["vs_reference"]["auc"]["low"])
    assert two_b["vs_reference"]["seeds"] == [0] and two_b["paper_units"] == 2304
    assert "vs_reference" not in table["arms"]["grpo"]
    # the plan's other comparisons: grpo@2x - trace on the one seed both ran; trace - treepo left out (no treepo run)
    assert list(table["pairs"]) == ["grpo@2x − trace"]
    pair = table["pairs"]["grpo@2x − trace"]
    assert pair["seeds"] == [0] and pair["auc"]["mean"] == pytest.approx(auc[("grpo@2x", 0)] - auc[("trace", 0)])
    assert pair["final"]["mean"] == pytest.approx(0.02)
    custom = claims.main(["table", "--runs", str(tmp_path), "--pairs", "trace:grpo"])["pairs"]["trace − grpo"]
    assert custom["auc"] == t["vs_reference"]["auc"]
    with pytest.raises(SystemExit, match="--pairs"):
        claims.main(["table", "--runs", str(tmp_path), "--pairs", "trace"])
    md = (tmp_path / "out" / "table.md").read_text()
    assert "| grpo@2x − trace | 1 | " in md
    assert f"| trace | 3 | {(0.365 + 0.33 + 0.355) / 3:.3f} | 0.380 | +0.022 [" in md
    assert "(n = 3)" in md and "1 seed: no interval" in md and "c0ffeec0ff" in md
    # runs evaluated at other steps are not pooled
    (tmp_path / "odd_s9.json").write_text(json.dumps({**_run_file("odd", 9, (0.3, 0.3, 0.3), (0.5, 0.5), 1.0),
                                                      "evals": [{"step": 0, "success": 0.3}, {"step": 4, "success": 0.3}]}))
    with pytest.raises(SystemExit, match="different steps"):
        claims.main(["table", "--runs", str(tmp_path)])


def test_arm_names_carry_a_budget_multiple_and_shape(claims, tmp_path) -> None:
    from trace_agent.lab.preregistered import RunTableError, arm_file_stem, parse_arm

    assert parse_arm("grpo@2x") == ("grpo", 2, None, None) and parse_arm("trace") == ("trace", 1, None, None)
    assert parse_arm("trace/24x6") == ("trace", 1, (24, 6), None)
    assert parse_arm("grpo@2x/48x0") == ("grpo", 2, (48, 0), None)
    assert parse_arm("trace+warm45x4") == ("trace", 1, None, (45, 4)) and parse_arm("trace+warm45x4").warm == (45, 4)
    assert parse_arm("trace@2x/48x1+warm3x2") == ("trace", 2, (48, 1), (3, 2))
    assert arm_file_stem("grpo@2x") == "grpo_2x" and arm_file_stem("trace/24x6") == "trace_24x6"
    assert arm_file_stem("trace+warm45x4") == "trace_warm45x4"
    for bad in ("grpo@two", "trace/24", "trace/x6", "trace/0x6", "trace/24x-1", "trace+warm45", "trace+warm0x4",
                "trace+warm45x1", "trace+cold45x4", "trace+warm45x4+warm1x2", "trace+warm45x4/48x1"):
        with pytest.raises(RunTableError):
            parse_arm(bad)
    with pytest.raises(SystemExit, match="paper_claims train: arm 'trace/24'"):  # the command says it in one line
        claims.main(["train", "--small", "--strategies", "trace/24", "--runs", str(tmp_path)])
