"""Advantages and the clipped loss against hand-computed values."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from trace_agent.loss import k3_kl, pack_segments, policy_loss
from trace_agent.objectives import (
    EPS,
    Segment,
    batch_segments,
    grpo_leaf_advantages,
    node_advantages,
    tree_grpo_leaf_advantages,
    tree_segments,
)
from trace_agent.tree import RolloutTree

PROMPT = [100, 101]


def hand_tree() -> RolloutTree:
    """0 root; 1 a; 2 a1 (R=1); 3 b (continuation from a); 4 b1 (R=0); 5 c (R=0); 6 d; 7 d1 (R=1)."""
    t = RolloutTree(prompt_id="p", messages=[{"role": "user", "content": "q"}])
    t.root.observation_ids = list(PROMPT)
    r0 = t.start_rollout()
    a = t.add_turn(t.root, rollout_id=r0, generated_ids=[1, 2], generated_logprobs=[-0.1, -0.2], observation_ids=[9])
    a1 = t.add_turn(a, rollout_id=r0, generated_ids=[3], generated_logprobs=[-0.3])
    t.finish(a1, 1.0)
    r1 = t.start_rollout(a)
    b = t.add_turn(a, rollout_id=r1, generated_ids=[4], generated_logprobs=[-0.4], observation_ids=[8])
    b1 = t.add_turn(b, rollout_id=r1, generated_ids=[5], generated_logprobs=[-0.5])
    t.finish(b1, 0.0)
    r2 = t.start_rollout()
    c = t.add_turn(t.root, rollout_id=r2, generated_ids=[6], generated_logprobs=[-0.6])
    t.finish(c, 0.0)
    r3 = t.start_rollout()
    d = t.add_turn(t.root, rollout_id=r3, generated_ids=[7], generated_logprobs=[-0.7], observation_ids=[10])
    d1 = t.add_turn(d, rollout_id=r3, generated_ids=[11], generated_logprobs=[-0.8])
    t.finish(d1, 1.0)
    return t


SD4 = math.sqrt(1 / 3)  # unbiased std of [1, 0, 0, 1] (verl's torch.std)
A = 0.5 / (SD4 + EPS)  # (1 - 0.5) / (std + eps)
B = 0.5 / (math.sqrt(0.5) + EPS)  # a group [1, 0]: unbiased std sqrt(1/2)
S1 = 1.0 / (1.0 + EPS)  # verl's singleton rule: mean 0, std 1, so A = R / (1 + eps)


def approx(d: dict[int, float]) -> dict[int, float]:
    return {k: pytest.approx(v, abs=1e-9) for k, v in d.items()}


def test_grpo_leaves_and_nodes() -> None:
    t = hand_tree()
    assert grpo_leaf_advantages(t) == approx({2: A, 4: -A, 5: -A, 7: A})
    # a shared turn gets the mean over its leaves; the others their leaf's value on every turn of the path
    assert node_advantages(t, "grpo") == approx({1: 0.0, 2: A, 3: -A, 4: -A, 5: -A, 6: A, 7: A})


def test_grpo_flat_group_matches_textbook() -> None:
    t = RolloutTree(prompt_id="flat")
    t.root.observation_ids = [1]
    rewards = [1.0, 0.0, 0.0, 0.0]
    for r in rewards:
        rid = t.start_rollout()
        n = t.add_turn(t.root, rollout_id=rid, generated_ids=[5], generated_logprobs=[-1.0])
        n = t.add_turn(n, rollout_id=rid, generated_ids=[6], generated_logprobs=[-1.0])
        t.finish(n, r)
    mu, sd = 0.25, math.sqrt(0.25 * 0.75 * 4 / 3)  # unbiased std
    want = [(r - mu) / (sd + EPS) for r in rewards]
    adv = node_advantages(t, "grpo")
    for i, w in enumerate(want):  # each rollout's two turns carry its leaf's advantage
        assert adv[1 + 2 * i] == pytest.approx(w) and adv[2 + 2 * i] == pytest.approx(w)


def test_treerpo_sibling_groups() -> None:
    t = hand_tree()
    # r: a .5, a1 1, b 0, b1 0, c 0, d 1, d1 1. Root group {a, c, d} mean .5; a's group {a1, b} mean .5.
    # lone children (4 below 3, 7 below 6) inherit the edge above them: every turn trains (the default)
    assert node_advantages(t, "treerpo") == approx({1: 0.0, 5: -0.5, 6: 0.5, 2: 0.5, 3: -0.5, 4: -0.5, 7: 0.5})
    zero = node_advantages(t, "treerpo", lone_child="zero")
    assert zero == approx({1: 0.0, 5: -0.5, 6: 0.5, 2: 0.5, 3: -0.5, 4: 0.0, 7: 0.0})
    sd_root = math.sqrt((0.0 + 0.25 + 0.25) / 2)  # unbiased std of r over {a, c, d} = {.5, 0, 1}
    normed = node_advantages(t, "treerpo", normalize_std=True)
    assert normed == approx({1: 0.0, 5: -0.5 / (sd_root + EPS), 6: 0.5 / (sd_root + EPS),
                             2: B, 3: -B, 4: -B, 7: 0.5 / (sd_root + EPS)})
    population = node_advantages(t, "treerpo", normalize_std=True, ddof=0)
    assert population[2] == pytest.approx(0.5 / (0.5 + EPS))


def test_tree_grpo_prompt_plus_tree_groups() -> None:
    t = hand_tree()
    # prompt group [1, 0, 0, 1]: +-A; tree groups: {a1, b1} below a ([1, 0]: +-B), {c} (R = 0) and
    # {d1} (R = 1) alone: verl's singleton rule gives R / (1 + eps)
    assert tree_grpo_leaf_advantages(t) == approx({2: A + B, 4: -A - B, 5: -A, 7: A + S1})
    assert tree_grpo_leaf_advantages(t, singleton="zero") == approx({2: A + B, 4: -A - B, 5: -A, 7: A})
    assert node_advantages(t, "tree-grpo") == approx({1: 0.0, 2: A + B, 3: -A - B, 4: -A - B, 5: -A,
                                                      6: A + S1, 7: A + S1})


def test_uniform_outcomes_give_zero_advantages() -> None:
    t = hand_tree()
    for leaf in t.leaves():
        leaf.reward = 1.0
    for objective in ("grpo", "treerpo", "tree-grpo"):
        adv = node_advantages(t, objective, singleton="zero")  # type: ignore[arg-type]
        assert all(v == 0.0 for v in adv.values())
    # with the reference singleton rule, the lone trees {c} and {d1} keep their intra-tree R
    ref = node_advantages(t, "tree-grpo")
    assert ref[5] == pytest.approx(S1) and ref[7] == pytest.approx(S1) and ref[1] == 0.0


def test_segments_contexts_and_sharing() -> None:
    t = hand_tree()
    segs = {s.node_id: s for s in tree_segments(t, "treerpo")}
    assert sorted(segs) == [1, 2, 3, 4, 5, 6, 7]  # every turn once, shared turn a (1) included once
    assert segs[1].context_ids == (100, 101) and segs[1].generated_ids == (1, 2)
    assert segs[1].behaviour_logprobs == (-0.1, -0.2) and segs[1].leaves == 2
    assert segs[2].context_ids == (100, 101, 1, 2, 9) and segs[3].context_ids == (100, 101, 1, 2, 9)
    assert segs[4].context_ids == (100, 101, 1, 2, 9, 4, 8)
    assert segs[7].context_ids == (100, 101, 7, 10)
    kept = tree_segments(t, "treerpo", skip_zero=True)
    assert [s.node_id for s in kept] == [2, 3, 4, 5, 6, 7]
    kept = tree_segments(t, "treerpo", skip_zero=True, lone_child="zero")
    assert [s.node_id for s in kept] == [2, 3, 5, 6]
    # a prompt kept outside the tree
    t.root.observation_ids = []
    with pytest.raises(ValueError, match="prompt_ids"):
        tree_segments(t, "grpo")
    other = batch_segments([t], "grpo", prompt_ids={"p": [7, 7, 7]})
    assert other[0].context_ids == (7, 7, 7)


def test_unfinished_branches_are_dropped() -> None:
    t = hand_tree()
    rid = t.start_rollout(t.nodes[6])
    t.add_turn(t.nodes[6], rollout_id=rid, generated_ids=[42], generated_logprobs=[-1.0])  # no leaf yet
    for objective in ("grpo", "treerpo", "tree-grpo"):
        assert 8 not in node_advantages(t, objective)  # type: ignore[arg-type]


def test_pack_segments_shares_paths_and_masks_observations() -> None:
    segs = tree_segments(hand_tree(), "tree-grpo")
    packed = pack_segments(segs)
    assert len(packed) == 4 and sum(p.num_tokens for p in packed) == sum(s.num_tokens for s in segs)
    a1, b1, c, d1 = packed
    assert a1.token_ids == (100, 101, 1, 2, 9, 3) and a1.first_target == 5 and a1.mask == (True,)
    assert b1.token_ids == (100, 101, 1, 2, 9, 4, 8, 5) and b1.first_target == 2
    # targets 1 2 | 9 (observation) | 4 | 8 (observation) | 5
    assert b1.mask == (True, True, False, True, False, True)
    assert b1.advantages == pytest.approx((0.0, 0.0, 0.0, -A - B, 0.0, -A - B))
    # the shared turn a (1 2) is two full-path samples: leaf a1 (A + B) and leaf b1 (-A - B)
    assert b1.weights == (2.0, 2.0, 0.0, 1.0, 0.0, 1.0)
    assert b1.gains == pytest.approx((A + B, A + B, 0.0, 0.0, 0.0, 0.0))
    assert b1.penalties == pytest.approx((-A - B, -A - B, 0.0, -A - B, 0.0, -A - B))
    assert b1.behaviour_logprobs[:2] == (-0.1, -0.2) and math.isnan(b1.behaviour_logprobs[2])
    assert c.token_ids == (100, 101, 6) and d1.token_ids == (100, 101, 7, 10, 11)
    assert d1.mask == (True, False, True) and d1.advantages == pytest.approx((A + S1, 0.0, A + S1))
    # four leaves: the packed sample shares add up to four samples; token weights to 3 + 4 + 1 + 2 tokens
    assert sum(p.samples for p in packed) == pytest.approx(4.0)
    assert sum(p.weight for p in packed) == pytest.approx(10.0)
    once = pack_segments(tree_segments(hand_tree(), "tree-grpo", shared_turns="once"))
    assert once[1].weights == (1.0, 1.0, 0.0, 1.0, 0.0, 1.0) and once[1].gains[:2] == (0.0, 0.0)


def test_segment_validates() -> None:
    with pytest.raises(ValueError, match="log-probs"):
        Segment(prompt_id="p", node_id=1, depth=1, context_ids=(1,), generated_ids=(2, 3), behaviour_logprobs=(-1.0,),
                advantage=1.0, leaves=1)


def test_policy_loss_hand_computed() -> None:
    logp = torch.tensor([[-1.0, -0.5, -2.0, 5.0]], requires_grad=True)
    old = torch.tensor([[-1.0, -1.0, -1.0, math.nan]])
    adv = torch.tensor([[1.0, 1.0, -1.0, 123.0]])
    mask = torch.tensor([[True, True, True, False]])  # the last position is an observation token
    loss, stats = policy_loss(logp, old, adv, mask, clip_low=0.2, clip_high=0.2)
    # ratios 1, e^.5 (clipped to 1.2, A>0), e^-1 (clipped to .8, A<0): (-1 - 1.2 + 0.8) / 3
    assert loss.item() == pytest.approx(-1.4 / 3)
    assert stats.tokens == 3 and stats.clip_fraction == pytest.approx(2 / 3)
    loss.backward()
    # only the unclipped token carries gradient: d/dlogp of -ratio*A/3 at ratio 1 is -1/3
    assert logp.grad is not None
    assert logp.grad.tolist()[0] == pytest.approx([-1 / 3, 0.0, 0.0, 0.0])
    # asymmetric clip (clip-higher): eps_high .7 leaves token 2 unclipped
    loss2, _ = policy_loss(logp.detach(), old, adv, mask, clip_low=0.2, clip_high=0.7)
    assert loss2.item() == pytest.approx((-1 - math.exp(0.5) + 0.8) / 3)
    # token-mean over a larger mini-batch when accumulating
    loss3, _ = policy_loss(logp.detach(), old, adv, mask, num_tokens=6)
    assert loss3.item() == pytest.approx(-1.4 / 6)


def test_policy_loss_kl_k3() -> None:
    logp = torch.tensor([-1.0, -0.5, -2.0])
    ref = torch.tensor([-1.0, -1.0, -1.0])
    want = [0.0, math.exp(-0.5) + 0.5 - 1, math.e - 2]
    assert k3_kl(logp, ref).tolist() == pytest.approx(want)
    zeros = torch.zeros(3)
    mask = torch.ones(3, dtype=torch.bool)
    loss, stats = policy_loss(logp, logp, zeros, mask, ref_logprobs=ref, kl_coef=0.1)
    assert stats.kl == pytest.approx(np.mean(want)) and loss.item() == pytest.approx(0.1 * np.mean(want))


def test_policy_loss_missing_behaviour_logprobs_means_ratio_one() -> None:
    logp = torch.tensor([-1.0, -2.0], requires_grad=True)
    loss, stats = policy_loss(logp, torch.full((2,), math.nan), torch.tensor([1.0, -1.0]),
                              torch.ones(2, dtype=torch.bool))
    assert loss.item() == pytest.approx(0.0) and stats.ratio_mean == pytest.approx(1.0)
    loss.backward()
    assert logp.grad is not None and logp.grad.tolist() == pytest.approx([-0.5, 0.5])


def test_identical_sibling_turns_are_packed_apart() -> None:
    """Two rollouts that sample the very same first turn are two segments; each is trained once."""
    t = RolloutTree(prompt_id="twins")
    t.root.observation_ids = [1]
    for r in (1.0, 0.0):
        rid = t.start_rollout()
        n = t.add_turn(t.root, rollout_id=rid, generated_ids=[5, 6], generated_logprobs=[-1.0, -1.0],
                       observation_ids=[7])
        n = t.add_turn(n, rollout_id=rid, generated_ids=[8], generated_logprobs=[-1.0])
        t.finish(n, r)
    segs = tree_segments(t, "grpo")
    packed = pack_segments(segs)
    assert len(packed) == 2 and sum(p.num_tokens for p in packed) == sum(s.num_tokens for s in segs) == 6
    assert sorted(p.advantages[0] for p in packed) == pytest.approx([-B, B])
