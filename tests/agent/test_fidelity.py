"""Issue 13 edge cases: NaN predictions, degenerate values, root-as-prefix on mixed trees, the Oracle's stage 2,
predictor batches with the paper's prefix share."""

from __future__ import annotations

import math

import numpy as np
import pytest

from trace_agent.allocation import allocate_flip_once, allocate_prefixes, repeat_probability
from trace_agent.predictor import (
    PAPER_PREFIX_SHARE,
    EmbeddingPredictor,
    HashedNGramFeaturizer,
    PredictionError,
    checked_predictions,
    refresh_predictor,
    score_nodes,
    tree_examples,
)
from trace_agent.strategies import (
    TRACE,
    Budget,
    ExpansionRequest,
    Oracle,
    RootRequest,
    root_repeat_probability,
)
from trace_agent.tree import RolloutTree

from .conftest import build_tree


def _roots(values, budget: Budget) -> RootRequest:  # type: ignore[no-untyped-def]
    return RootRequest(prompt_ids=tuple(f"p{i}" for i in range(len(values))), budget=budget,
                       root_budget=budget.roots, rng=np.random.default_rng(0),
                       values={"predicted": np.asarray(values), "oracle": np.asarray(values)})


def _expansion(tree: RolloutTree, budget: int, values: np.ndarray) -> ExpansionRequest:
    cands = tuple(n for n in tree.nodes if not n.is_root and not n.is_leaf)
    table = {n.node_id: float(v) for n, v in zip(cands, values, strict=False)}
    table.setdefault(0, float(values[0]))  # the root's own value, when a strategy reads it
    return ExpansionRequest(tree=tree, budget=budget, candidates=cands, root_exchange=2, prefix_cap=None,
                            rng=np.random.default_rng(0), values={"predicted": table, "oracle": table})


def test_nan_predictions_are_refused_with_a_clear_error() -> None:
    budget = Budget(roots=8, continuations_per_root=1, group_size=2)
    with pytest.raises(PredictionError, match="non-finite"):
        TRACE().allocate_roots(_roots([0.5, math.nan, 0.3, 0.2], budget))
    tree = build_tree(roots=2, depth=2, continuations=0, seed=0)
    with pytest.raises(PredictionError, match="non-finite"):
        TRACE().allocate_continuations(_expansion(tree, 2, np.array([math.nan, 0.5])))
    with pytest.raises(PredictionError, match="3 values for 2"):
        checked_predictions([0.1, 0.2, 0.3], 2)
    assert checked_predictions([-0.5, 1.5], 2).tolist() == [0.0, 1.0]  # finite values are clipped

    class Broken:
        def predict(self, contexts):  # type: ignore[no-untyped-def]
            return np.full(len(contexts), np.nan)

    with pytest.raises(PredictionError):
        score_nodes(Broken(), tree)  # type: ignore[arg-type]
    with pytest.raises(PredictionError):
        refresh_predictor(Broken(), [tree])  # type: ignore[arg-type]


def test_saturated_predictions_spread_the_root_budget() -> None:
    budget = Budget(roots=16, continuations_per_root=1, group_size=4)  # at most 4 active prompts
    got = TRACE().allocate_roots(_roots([1.0, 0.0, 1.0, 1.0, 0.0, 1.0], budget))
    assert sorted(got) == [0, 0, 4, 4, 4, 4]  # was [16, 0, 0, 0, 0, 0]: the whole budget on one prompt


def test_rootprefix_buys_no_root_for_a_mixed_tree() -> None:
    tree = build_tree(roots=4, depth=2, continuations=0, rate=0.5, seed=3)
    assert tree.is_mixed()
    assert root_repeat_probability(tree, 0.5) == 1.0
    cands = [n for n in tree.nodes if not n.is_root and not n.is_leaf]
    got = TRACE(root_prefix=True).allocate_continuations(_expansion(tree, 4, np.full(len(cands), 0.5)))
    assert got.get(0, 0) == 0 and sum(got.values()) == 4
    # an all-fail tree still may: q = 1 - v for the root
    fail = build_tree(roots=3, depth=2, continuations=0, rate=0.0, seed=0)
    assert root_repeat_probability(fail, 0.3) == pytest.approx(0.7)


def test_oracle_stage_two_maximises_the_chance_a_tree_becomes_mixed() -> None:
    fail = build_tree(roots=3, depth=2, continuations=0, rate=0.0, seed=0)  # every root rollout failed
    cands = [n for n in fail.nodes if not n.is_root and not n.is_leaf]
    values = np.linspace(0.2, 0.6, len(cands))
    request = _expansion(fail, 4, values)
    q = repeat_probability(values, request.endings())
    got = Oracle().allocate_continuations(request)
    want = allocate_flip_once(q, 4)
    assert got == {n.node_id: k for n, k in zip(cands, want) if k}
    assert got == {cands[-1].node_id: 4}  # all on the likeliest flip (v = 0.6 after a failure: q = 0.4)
    # a mixed tree keeps TRACE's expected-flips allocation
    mixed = build_tree(roots=4, depth=2, continuations=0, rate=0.5, seed=3)
    cands = [n for n in mixed.nodes if not n.is_root and not n.is_leaf]
    values = np.linspace(0.2, 0.6, len(cands))
    req = _expansion(mixed, 4, values)
    expected = allocate_prefixes(repeat_probability(values, req.endings()), 4)
    assert Oracle().allocate_continuations(req) == {n.node_id: k for n, k in zip(cands, expected) if k}


def test_predictor_batches_keep_the_paper_prefix_share() -> None:
    trees = [build_tree(prompt_id=f"p{i}", roots=4, depth=3, continuations=3, seed=i) for i in range(40)]
    full = tree_examples(trees)
    assert float(np.mean(~full.is_root)) > 0.7  # every inner node: prefixes dominate
    sub = tree_examples(trees, prefix_share=PAPER_PREFIX_SHARE, seed=1)
    assert int(sub.is_root.sum()) == 40  # every prompt is kept
    assert int((~sub.is_root).sum()) == round(0.06 / 0.94 * 40) == 3
    again = tree_examples(trees, prefix_share=PAPER_PREFIX_SHARE, seed=1)
    assert again.node_ids.tolist() == sub.node_ids.tolist() and again.prompt_ids == sub.prompt_ids
    assert len(tree_examples(trees, prefix_share=0.0)) == 40
    assert len(tree_examples(trees, prefix_share=1.0)) == len(full)
    one = tree_examples(trees[:2], prefix_share=0.06)
    assert int((~one.is_root).sum()) == 1  # a positive share keeps at least one prefix
    with pytest.raises(ValueError, match="prefix_share"):
        tree_examples(trees, prefix_share=1.5)


def test_refresh_reports_root_accuracy_on_every_example_and_trains_on_the_share() -> None:
    trees = [build_tree(prompt_id=f"p{i}", prompt=f"task {i % 3}", roots=4, depth=3, continuations=3,
                        rate=(i % 3) / 2, seed=i) for i in range(30)]
    pred = EmbeddingPredictor(HashedNGramFeaturizer(dim=64))
    out = refresh_predictor(pred, trees, seed=0)
    full = tree_examples(trees)
    assert out["examples"] == len(full) and out["pre_examples"] == len(full)
    assert out["train_examples"] == 30 + round(0.06 / 0.94 * 30)
    assert out["train_prefix_share"] == pytest.approx(2 / 32)
    for key in ("pre_spearman_root", "pre_mse_root", "pre_mse_prefix", "pre_mse_depth_0", "pre_mse_depth_1"):
        assert key in out
    after = refresh_predictor(pred, trees, seed=1)
    assert after["pre_spearman_root"] > 0.5  # prompt text determines the rate here: ranks are learnt
    everything = refresh_predictor(EmbeddingPredictor(HashedNGramFeaturizer(dim=64)), trees, prefix_share=None)
    assert everything["train_examples"] == len(full)
