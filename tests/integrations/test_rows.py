"""Leaf rows of a tree and advantages recomputed from rows equal trace_agent.objectives on the tree itself."""

from __future__ import annotations

import math

import numpy as np
import pytest

from trace_agent.integrations.rows import (
    TreeRowError,
    leaf_rows,
    mask_runs,
    parse_tree_key,
    rows_advantages,
    token_advantages,
    tree_key,
)
from trace_agent.objectives import group_normalized, tree_segments
from trace_agent.options import OBJECTIVES
from trace_agent.rollout import node_context, path_token_ids
from trace_agent.tree import RolloutTree


def branching_tree(seed: int, *, prompt_id: str = "p", roots: int = 4, depth: int = 3, continuations: int = 5,
                   rate: float = 0.5) -> RolloutTree:
    """Random roots, then continuations from random inner nodes; every turn is followed by >= 1 appended id."""
    rng = np.random.default_rng(seed)
    tree = RolloutTree(prompt_id=prompt_id, prompt_ids=rng.integers(0, 500, 7).tolist())

    def run(start):
        rid = tree.start_rollout(start)
        node = start
        turns = int(rng.integers(1, depth + 1)) if start.is_root else max(1, depth - start.depth)
        for t in range(turns):
            n = int(rng.integers(1, 5))
            last = t == turns - 1
            node = tree.add_turn(node, rollout_id=rid, generated_ids=rng.integers(0, 500, n).tolist(),
                                 generated_logprobs=(-rng.random(n) * 2).tolist(),
                                 observation_ids=rng.integers(0, 500, int(rng.integers(0 if last else 1, 4))).tolist())
        tree.finish(node, float(rng.random() < rate))

    for _ in range(roots):
        run(tree.root)
    for _ in range(continuations):
        inner = [n for n in tree.nodes if not n.is_root and not n.is_leaf]
        run(inner[int(rng.integers(len(inner)))] if inner else tree.root)
    return tree


@pytest.mark.parametrize("seed", range(6))
def test_rows_are_the_exact_leaf_paths(seed):
    tree = branching_tree(seed)
    rows = leaf_rows(tree)
    assert [r.leaf_id for r in rows] == [leaf.node_id for leaf in tree.leaves()] and rows
    for row, leaf in zip(rows, tree.leaves()):
        ctx = node_context(tree, leaf)
        assert list(row.prompt_ids + row.response_ids) == path_token_ids(leaf) == list(ctx.token_ids)
        n = len(row.prompt_ids)
        assert row.response_mask == tuple(int(g) for g in ctx.generated[n:])
        expected = [0.0 if math.isnan(x) else x for x in ctx.logprobs[n:]]
        assert list(row.response_logprobs) == expected
        assert row.reward == leaf.reward and row.num_turns == leaf.depth and not row.truncated
        assert len(mask_runs(row.response_mask)) == row.num_turns


def test_truncated_rows_keep_mask_and_logprobs_aligned():
    tree = branching_tree(3, depth=4)
    full, cut = leaf_rows(tree), leaf_rows(tree, max_response_length=5)
    for a, b in zip(full, cut):
        assert b.response_ids == a.response_ids[:5] and b.response_mask == a.response_mask[:5]
        assert b.response_logprobs == a.response_logprobs[:5] and b.truncated == (len(a.response_ids) > 5)


@pytest.mark.parametrize("objective", OBJECTIVES)
@pytest.mark.parametrize("shared", ["repeat", "split"])
@pytest.mark.parametrize("normalize_std", [False, True])
def test_advantages_from_rows_equal_advantages_from_trees(objective, shared, normalize_std):
    trees = [branching_tree(s, prompt_id=f"p{s}", rate=0.3 + 0.1 * s) for s in range(5)]
    keys, rewards, masks, expected = [], [], [], []
    for i, tree in enumerate(trees):
        uid = f"uid-{i}"
        direct = token_advantages(tree, objective, shared=shared, normalize_std=normalize_std)
        for row, adv in zip(leaf_rows(tree), direct):
            keys.append(row.key(uid))
            rewards.append(row.reward)
            masks.append(list(row.response_mask) + [0] * 3)  # right padding, as in a batch
            expected.append(np.concatenate([adv, np.zeros(3)]))
    order = np.random.default_rng(0).permutation(len(keys))  # rows arrive in any order
    got = rows_advantages([keys[i] for i in order], [rewards[i] for i in order], [masks[i] for i in order],
                          objective, shared=shared, normalize_std=normalize_std)
    for j, i in enumerate(order):
        np.testing.assert_allclose(got[j], expected[i], rtol=0, atol=1e-12)
    assert any(np.abs(e).sum() > 0 for e in expected)  # the check is not vacuous


@pytest.mark.parametrize("objective", OBJECTIVES)
def test_token_advantages_follow_the_segments(objective):
    """repeat: each row carries its segments' advantages; split: the copies of a segment sum to one segment."""
    tree = branching_tree(11, continuations=8)
    rows = leaf_rows(tree)
    repeat = token_advantages(tree, objective, shared="repeat")
    split = token_advantages(tree, objective, shared="split")
    for seg in tree_segments(tree, objective):
        through = [(r, a, s) for r, a, s in zip(rows, repeat, split) if seg.node_id in r.path]
        assert len(through) == seg.leaves
        total = 0.0
        for row, a, s in through:
            start, stop = mask_runs(row.response_mask)[row.path.index(seg.node_id) - 1]
            assert row.response_ids[start:stop] == seg.generated_ids
            assert np.all(a[start:stop] == seg.advantage)
            total += s[start:stop].sum()
        assert total == pytest.approx(seg.advantage * seg.num_tokens, abs=1e-12)


def test_flat_group_gets_grpo_on_every_generated_token():
    tree = branching_tree(5, roots=6, continuations=0)
    rows = leaf_rows(tree)
    adv = token_advantages(tree, "grpo")
    z = group_normalized([r.reward for r in rows])
    for row, a, zi in zip(rows, adv, z):
        mask = np.asarray(row.response_mask, bool)
        assert np.all(a[mask] == zi) and np.all(a[~mask] == 0.0)


def test_tree_keys_round_trip_and_refuse_garbage():
    assert parse_tree_key(tree_key("a-b", (0, 3, 9))) == ("a-b", (0, 3, 9))
    for bad in ["", "uid", "uid/", "/0.1", "uid/0.x", "uid/1.2", "uid/0", "uid/0.3.3", "uid/0.5.2", "u/0.1e3",
                "uid/0.-1", "uid/0.\u00b2", "uid/0." + "9" * 40]:
        with pytest.raises(TreeRowError):
            parse_tree_key(bad)
    with pytest.raises(TreeRowError):
        tree_key("a/b", (0, 1))


def test_rows_that_do_not_form_a_tree_are_refused():
    mask = [1, 0, 1]
    with pytest.raises(TreeRowError, match="two parents"):
        rows_advantages(["u/0.1.3", "u/0.2.3"], [1.0, 0.0], [mask, mask], "treerpo")
    with pytest.raises(TreeRowError, match="has children"):
        rows_advantages(["u/0.1", "u/0.1.2"], [1.0, 0.0], [[1], mask], "treerpo")
    with pytest.raises(TreeRowError, match="same leaf"):
        rows_advantages(["u/0.1", "u/0.1"], [1.0, 0.0], [[1], [1]], "grpo")
    with pytest.raises(TreeRowError, match="generated runs"):
        rows_advantages(["u/0.1"], [1.0], [[1, 0, 1]], "grpo")
    with pytest.raises(TreeRowError, match="finite"):
        rows_advantages(["u/0.1"], [float("nan")], [[1]], "grpo")
    with pytest.raises(TreeRowError):
        rows_advantages(["u/0.1"], [1.0, 0.0], [[1]], "grpo")


def test_trees_that_cannot_be_rows_are_refused():
    tree = RolloutTree(prompt_id="p", prompt_ids=[1, 2])
    rid = tree.start_rollout()
    a = tree.add_turn(tree.root, rollout_id=rid, generated_ids=[3], generated_logprobs=[-0.1], observation_ids=[])
    b = tree.add_turn(a, rollout_id=rid, generated_ids=[4], generated_logprobs=[-0.2])
    tree.finish(b, 1.0)
    with pytest.raises(TreeRowError, match="merge"):
        leaf_rows(tree)
    tree2 = RolloutTree(prompt_id="q", prompt_ids=[1])
    rid = tree2.start_rollout()
    tree2.finish(tree2.add_turn(tree2.root, rollout_id=rid, generated_ids=[5]), 0.0)
    with pytest.raises(TreeRowError, match="log-probs"):
        leaf_rows(tree2)
    with pytest.raises(TreeRowError, match="prompt token ids"):
        leaf_rows(RolloutTree(prompt_id="r"))
