"""RolloutTree: invariants, bottom-up targets, statistics, contexts, storage round-trips, pictures."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from tests.agent.conftest import TreeFactory
from trace_agent.contexts import CONTEXT_SEPARATOR, make_context, split_context
from trace_agent.errors import TreeError
from trace_agent.tree import RolloutTree, bottom_up_targets
from trace_agent.tree_io import load_jsonl, load_parquet, save_jsonl, save_parquet
from trace_agent.tree_stats import batch_stats


class Handle:
    """A stand-in for an env snapshot: counts releases."""

    def __init__(self) -> None:
        self.released = 0

    def release(self) -> None:
        self.released += 1


def _hand_tree() -> RolloutTree:
    """root -> a -> (leaf 1.0), a -> b -> (leaf 0.0); plus a second root rollout c -> leaf 0.0."""
    t = RolloutTree(prompt_id="hand", messages=[{"role": "user", "content": "Q?"}], prompt_ids=[11, 12, 13],
                    value=0.4)
    r0 = t.start_rollout()
    a = t.add_turn(t.root, rollout_id=r0, generated_ids=[1, 2], generated_logprobs=[-0.1, -0.2],
                   observation_ids=[9], messages=[{"role": "assistant", "content": "A"}])
    a1 = t.add_turn(a, rollout_id=r0, generated_ids=[3], generated_logprobs=[-0.3])
    t.finish(a1, 1.0)
    r1 = t.start_rollout(a)
    b = t.add_turn(a, rollout_id=r1, generated_ids=[4], generated_logprobs=[-0.4],
                   messages=[{"role": "assistant", "content": "B"}])
    b1 = t.add_turn(b, rollout_id=r1, generated_ids=[5, 6, 7], generated_logprobs=None)
    t.finish(b1, 0.0)
    r2 = t.start_rollout()
    c = t.add_turn(t.root, rollout_id=r2, generated_ids=[8], generated_logprobs=[-0.5])
    t.finish(c, 0.0)
    return t


def test_hand_tree_targets_counts_and_helpers() -> None:
    t = _hand_tree()
    targets, counts = t.targets()
    # ids: 0 root, 1 a, 2 a1(1.0), 3 b, 4 b1(0.0), 5 c(0.0)
    np.testing.assert_allclose(targets, [1 / 3, 0.5, 1.0, 0.0, 0.0, 0.0])
    np.testing.assert_array_equal(counts, [3, 2, 1, 1, 1, 1])
    a = t.nodes[1]
    assert [n.node_id for n in t.nodes[4].path()] == [0, 1, 3, 4]
    assert [n.node_id for n in a.leaves()] == [2, 4]
    assert t.is_mixed() and t.is_mixed(a) and not t.is_mixed(t.nodes[3])
    assert t.contrast_pairs() == 2 and t.contrast_pairs(a) == 1
    assert t.target(a) == 0.5
    lonely = RolloutTree(prompt_id="x")
    assert math.isnan(lonely.target(lonely.root))
    rollouts = t.rollouts()
    assert [(r.start_depth, r.turns, r.end_depth, r.leaf) for r in rollouts] == [(0, 2, 2, 2), (1, 2, 3, 4), (0, 1, 1, 5)]
    assert rollouts[1].generated_tokens == 4
    s = t.stats()
    assert (s.root_rollouts, s.continuations, s.leaves, s.successes) == (2, 1, 3, 1)
    assert s.branch_depths == {0: 1, 1: 1} and s.continuation_depths == {1: 1}
    assert s.paper_units == 2.5 and s.env_steps == 5 and s.generated_tokens == 8 and s.observation_tokens == 1


def test_bottom_up_targets_pure_function() -> None:
    targets, counts = bottom_up_targets([-1, 0, 0, 1, 1], [None, None, 1.0, 0.0, None])
    np.testing.assert_allclose(targets[:4], [0.5, 0.0, 1.0, 0.0])
    assert math.isnan(targets[4]) and counts.tolist() == [2, 1, 1, 1, 0]
    with pytest.raises(TreeError):
        bottom_up_targets([-1, 2, 0], [None, 1.0, 0.0])


def test_targets_match_leaf_enumeration_on_random_trees(make_tree: TreeFactory) -> None:
    for seed in range(20):
        t = make_tree(seed=seed, roots=int(2 + seed % 4), depth=int(2 + seed % 3), continuations=seed % 5,
                      rate=0.3 + 0.04 * seed)
        targets, counts = t.targets()
        for node in t.nodes:
            leaves = node.leaves()
            assert counts[node.node_id] == len(leaves)
            assert targets[node.node_id] == pytest.approx(np.mean([x.reward for x in leaves]))
            assert t.is_mixed(node) == (len({x.reward for x in leaves}) == 2)


def test_invariants_are_enforced() -> None:
    t = _hand_tree()
    leaf = t.nodes[2]
    with pytest.raises(TreeError, match="ends an episode"):
        t.start_rollout(leaf)
    with pytest.raises(TreeError, match="already holds"):
        t.finish(leaf, 1.0)
    with pytest.raises(TreeError, match="the root"):
        t.finish(t.root, 1.0)
    rid = t.start_rollout()
    with pytest.raises(TreeError, match="cannot hang"):
        t.add_turn(t.nodes[1], rollout_id=rid, generated_ids=[1])
    with pytest.raises(TreeError, match="log-probs"):
        t.add_turn(t.root, rollout_id=rid, generated_ids=[1, 2], generated_logprobs=[-1.0])
    with pytest.raises(TreeError, match="unknown rollout"):
        t.add_turn(t.root, rollout_id=99, generated_ids=[1])
    other = _hand_tree()
    with pytest.raises(TreeError, match="does not belong"):
        t.start_rollout(other.nodes[3])
    with pytest.raises(TreeError, match="has children"):
        t.finish(t.nodes[1], 0.0)
    with pytest.raises(TreeError, match=r"\[0, 1\]"):
        RolloutTree(prompt_id="x", value=1.5)


def test_batch_stats_effective_ratio(make_tree: TreeFactory) -> None:
    mixed = _hand_tree()
    all_fail = make_tree(prompt_id="f", rate=0.0, roots=3, continuations=1)
    empty = RolloutTree(prompt_id="skipped")  # a candidate with no rollouts is not active
    b = batch_stats([mixed, all_fail, empty])
    assert (b.trees, b.active_prompts, b.mixed_trees) == (3, 2, 1)
    assert b.effective_ratio == 0.5
    assert b.contrast_pairs == 2
    assert b.root_rollouts == 5 and b.continuations == 2
    d = b.as_dict()
    assert d["effective_ratio"] == 0.5 and d["branch_depth_0"] >= 2
    assert math.isnan(batch_stats([empty]).effective_ratio)


def test_budget_spent_by_a_tree() -> None:
    stats = _hand_tree().stats()
    assert stats.paper_units == 2.5 and stats.root_rollouts == 2 and stats.continuations == 1
    assert stats.generated_tokens == 8 and stats.env_steps == 5


def test_context_keeps_prompt_and_history_apart() -> None:
    t = _hand_tree()
    root_ctx = t.context()
    prompt, history = split_context(root_ctx)
    assert "Q?" in prompt and history == ""
    prompt_b, history_b = split_context(t.context(t.nodes[3]))
    assert prompt_b == prompt and "A" in history_b and history_b.index("A") < history_b.index("B")
    assert split_context("no separator") == ("no separator", "")
    assert make_context("p", "h") == f"p{CONTEXT_SEPARATOR}h"
    with pytest.raises(ValueError):
        make_context(f"bad{CONTEXT_SEPARATOR}", "")


def test_release_snapshots(make_tree: TreeFactory) -> None:
    handles: list[Handle] = []

    def factory() -> Handle:
        handles.append(Handle())
        return handles[-1]

    t = make_tree(snapshot_factory=factory)
    assert t.release_snapshots() == len(handles) > 0
    assert all(h.released == 1 for h in handles)
    assert all(n.snapshot is None for n in t.nodes)
    assert t.release_snapshots() == 0


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_storage_round_trip(make_tree: TreeFactory, tmp_path: Path, fmt: str) -> None:
    trees = [make_tree(prompt_id=f"p{i}", seed=i, snapshot_factory=Handle) for i in range(4)]
    trees.append(_hand_tree())  # prompt ids, None log-probs, predicted values
    trees[0].nodes[1].info["unicode"] = "éß∑ — ✓"
    trees[0].nodes[1].value = 0.123456789012345
    path = tmp_path / f"trees.{fmt}"
    (save_jsonl if fmt == "jsonl" else save_parquet)(trees, path)
    loaded = (load_jsonl if fmt == "jsonl" else load_parquet)(path)
    assert [t.to_dict() for t in loaded] == [t.to_dict() for t in trees]
    assert loaded[-1].root.observation_ids == [11, 12, 13]  # the prompt's token ids survive
    assert all(n.snapshot is None for t in loaded for n in t.nodes)
    # loaded trees keep working: targets, stats, new rollouts
    np.testing.assert_allclose(loaded[1].targets()[0], trees[1].targets()[0])
    rid = loaded[1].start_rollout(loaded[1].nodes[1])
    loaded[1].add_turn(loaded[1].nodes[1], rollout_id=rid, generated_ids=[1])


def test_jsonl_is_plain_json_and_rejects_other_records(tmp_path: Path) -> None:
    path = save_jsonl([_hand_tree()], tmp_path / "t.jsonl")
    rec = json.loads(path.read_text().splitlines()[0])
    assert rec["format"] == "trace-gym/rollout-tree" and len(rec["nodes"]) == 6
    rec["version"] = 99
    with pytest.raises(TreeError, match="not a"):
        RolloutTree.from_dict(rec)


def test_render_text() -> None:
    text = _hand_tree().render(show_text=10)
    lines = text.splitlines()
    assert len(lines) == 1 + 6
    assert "mixed" in lines[0] and "v^=0.40" in lines[1]
    assert sum("OK reward=1" in x for x in lines) == 1 and sum("FAIL reward=0" in x for x in lines) == 2


def test_tree_png(make_tree: TreeFactory, tmp_path: Path) -> None:
    from trace_agent.plotting import plot_tree

    t = make_tree(roots=4, depth=3, continuations=4, seed=3)
    for n in t.nodes:
        if not n.is_leaf:
            n.value = 0.5
    out = plot_tree(t, tmp_path / "tree.png")
    data = out.read_bytes()
    assert len(data) > 1000 and data[:8] == b"\x89PNG\r\n\x1a\n"
    import matplotlib.image as mpimg

    img = mpimg.imread(out)
    assert img.ndim == 3 and img.shape[0] > 50 and img.shape[1] > 50


def test_allocation_png(tmp_path: Path) -> None:
    from trace_agent.allocation import allocate_roots
    from trace_agent.plotting import plot_allocation

    six = [0.99, 0.90, 0.50, 0.50, 0.15, 0.02]
    budgets = list(range(2, 13))
    out = plot_allocation(budgets, [allocate_roots(six, b) for b in budgets], [str(v) for v in six],
                          tmp_path / "sub" / "alloc.png")
    assert out.stat().st_size > 1000 and out.read_bytes()[:4] == b"\x89PNG"
    with pytest.raises(ValueError, match="shape"):
        plot_allocation([2, 3], [[2, 0]], ["a", "b"], tmp_path / "bad.png")
