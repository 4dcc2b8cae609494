"""The objectives against the reference definitions: verl's GRPO advantage and loss aggregation, dual clip,
log-ratio clamp, Tree-GRPO's full-path samples (brute force over explicit per-leaf sequences)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from trace_agent.loss import LOSS_AGG_MODES, PackedSequence, loss_normalizer, pack_segments, policy_loss
from trace_agent.objectives import EPS, group_normalized, tree_segments
from trace_agent.tree import RolloutTree


def test_group_normalized_is_verls_grpo_advantage() -> None:
    # verl: mean, torch.std (unbiased), eps 1e-6; a group of one gets mean 0, std 1
    r = [1.0, 0.0, 0.0]
    sd = math.sqrt(((2 / 3) ** 2 + 2 * (1 / 3) ** 2) / 2)
    assert group_normalized(r).tolist() == pytest.approx([(1 - 1 / 3) / (sd + EPS), -(1 / 3) / (sd + EPS),
                                                          -(1 / 3) / (sd + EPS)])
    rt = torch.tensor(r, dtype=torch.float64)
    assert torch.allclose(torch.tensor(group_normalized(r)), (rt - rt.mean()) / (rt.std() + EPS))
    assert group_normalized([1.0]).tolist() == pytest.approx([1.0 / (1.0 + EPS)])
    assert group_normalized([0.0]).tolist() == [0.0]
    assert group_normalized([1.0], singleton="zero").tolist() == [0.0]
    assert group_normalized([1.0, 0.0], ddof=0).tolist() == pytest.approx([0.5 / (0.5 + EPS), -0.5 / (0.5 + EPS)])
    assert group_normalized([1.0, 1.0]).tolist() == [0.0, 0.0]
    assert group_normalized([]).size == 0
    with pytest.raises(ValueError, match="ddof"):
        group_normalized([1.0, 0.0], ddof=2)
    with pytest.raises(ValueError, match="singleton"):
        group_normalized([1.0], singleton="one")  # type: ignore[arg-type]


def _verl_token_loss(ratio: torch.Tensor, adv: torch.Tensor, lo: float, hi: float, c: float | None) -> torch.Tensor:
    """The vanilla PPO token loss written from verl's definition (independent of policy_loss's algebra)."""
    pg1 = -adv * ratio
    pg2 = -adv * ratio.clamp(1 - lo, 1 + hi)
    out = torch.maximum(pg1, pg2)
    if c is not None:
        out = torch.where(adv < 0, torch.minimum(-adv * c, out), out)
    return out


def test_dual_clip_hand_computed() -> None:
    # A < 0 with a ratio of e^2 ~ 7.39: standard clip gives |A| * 7.39, dual clip caps it at c |A| = 3
    logp = torch.tensor([0.0, 0.0, -3.0])
    old = torch.tensor([-2.0, -2.0, -1.0])
    adv = torch.tensor([-1.0, 1.0, -1.0])
    mask = torch.ones(3, dtype=torch.bool)
    plain, st0 = policy_loss(logp, old, adv, mask)
    assert plain.item() == pytest.approx((math.exp(2) - 1.2 + 0.8) / 3)
    dual, st = policy_loss(logp, old, adv, mask, clip_ratio_c=3.0)
    assert dual.item() == pytest.approx((3.0 - 1.2 + 0.8) / 3)
    assert st.dual_clip_fraction == pytest.approx(1 / 3) and st0.dual_clip_fraction == 0.0
    with pytest.raises(ValueError, match="clip_ratio_c"):
        policy_loss(logp, old, adv, mask, clip_ratio_c=1.0)


def test_log_ratio_clamp() -> None:
    logp = torch.tensor([0.0], requires_grad=True)
    old = torch.tensor([-100.0])  # log-ratio 100: exp overflows float32 without the clamp
    adv = torch.tensor([-1.0])
    mask = torch.ones(1, dtype=torch.bool)
    loss, st = policy_loss(logp, old, adv, mask)
    assert loss.item() == pytest.approx(math.exp(20.0), rel=1e-5) and math.isfinite(st.ratio_mean)
    unclamped, _ = policy_loss(logp.detach(), old, adv, mask, log_ratio_clamp=None)
    assert math.isinf(unclamped.item())
    loss.backward()  # a clamped token carries no gradient
    assert logp.grad is not None and logp.grad.item() == 0.0


def _tree(rewards_shape: str = "mixed") -> RolloutTree:
    """Root with 3 rollouts; rollout 0 is continued twice from its first turn; random-length turns."""
    rng = np.random.default_rng(3)
    t = RolloutTree(prompt_id="p")
    t.root.observation_ids = [1, 2]
    tok = iter(range(10, 10_000))

    def turn(parent, rid, obs=True):  # type: ignore[no-untyped-def]
        n = int(rng.integers(1, 4))
        ids = [next(tok) for _ in range(n)]
        lps = [float(-rng.uniform(0.1, 2.0)) for _ in range(n)]
        return t.add_turn(parent, rollout_id=rid, generated_ids=ids, generated_logprobs=lps,
                          observation_ids=[next(tok)] if obs else [])

    firsts = []
    for r in (1.0, 0.0, 1.0):
        rid = t.start_rollout()
        a = turn(t.root, rid)
        b = turn(a, rid, obs=False)
        t.finish(b, r)
        firsts.append(a)
    for r in (0.0, 0.0):
        rid = t.start_rollout(firsts[0])
        b = turn(firsts[0], rid)
        c = turn(b, rid, obs=False)
        t.finish(c, r)
    return t


def _current(old: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
    """The 'current policy' log-probs: a smooth function of the behaviour ones, moved by theta."""
    return old + theta * torch.sin(7.0 * old)


@pytest.mark.parametrize("objective", ["grpo", "tree-grpo"])
@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
@pytest.mark.parametrize("dual", [None, 3.0])
def test_per_leaf_packing_equals_explicit_full_path_samples(objective: str, mode: str, dual: float | None) -> None:
    """Brute force: every leaf as its own full-path sequence (the official Tree-GRPO batch), verl's agg_loss."""
    tree = _tree()
    segs = tree_segments(tree, objective)  # type: ignore[arg-type]
    leaf_adv = {s.node_id: s.advantage for s in segs if tree.nodes[s.node_id].is_leaf}
    theta = torch.tensor(0.9, requires_grad=True)
    # explicit samples: (leaves, max path tokens), verl's loss matrix and agg_loss
    rows = []
    for leaf in tree.leaves():
        lps = [lp for n in leaf.path()[1:] for lp in n.generated_logprobs]  # type: ignore[union-attr]
        rows.append((lps, leaf_adv[leaf.node_id]))
    width = max(len(r) for r, _ in rows)
    old = torch.zeros(len(rows), width)
    adv = torch.zeros(len(rows), width)
    mask = torch.zeros(len(rows), width)
    for i, (lps, a) in enumerate(rows):
        old[i, :len(lps)] = torch.tensor(lps)
        adv[i, :len(lps)] = a
        mask[i, :len(lps)] = 1.0
    mat = _verl_token_loss(torch.exp(_current(old, theta) - old), adv, 0.2, 0.28, dual) * mask
    scale = float(width)
    if mode == "token-mean":
        want = mat.sum() / mask.sum()
    elif mode == "seq-mean-token-sum":
        want = mat.sum(-1).mean()
    elif mode == "seq-mean-token-mean":
        want = (mat.sum(-1) / mask.sum(-1)).mean()
    else:
        want = mat.sum() / scale
    (g_want,) = torch.autograd.grad(want, theta)
    # packed: each shared token scored once, its samples through gains / penalties / weights
    packed = pack_segments(segs, loss_agg_mode=mode)  # type: ignore[arg-type]
    assert sum(p.num_tokens for p in packed) < int(mask.sum())  # the shared turn really is shared
    got = torch.zeros(())
    denom = loss_normalizer(packed, mode, loss_scale_factor=scale)  # type: ignore[arg-type]
    for p in packed:
        m = torch.tensor(p.mask)
        b = torch.tensor(p.behaviour_logprobs, dtype=torch.float32)
        cur = torch.where(m, _current(torch.nan_to_num(b), theta), torch.zeros(()))
        loss, _ = policy_loss(cur[None], b[None], torch.tensor(p.gains)[None], m[None],
                              negative_advantages=torch.tensor(p.penalties)[None],
                              weights=torch.tensor(p.weights)[None], clip_low=0.2, clip_high=0.28,
                              num_tokens=denom, clip_ratio_c=dual)
        got = got + loss
    (g_got,) = torch.autograd.grad(got, theta)
    assert got.item() == pytest.approx(want.item(), rel=1e-5, abs=1e-7)
    assert g_got.item() == pytest.approx(g_want.item(), rel=1e-5, abs=1e-7)


def test_token_mean_counts_zero_advantage_turns() -> None:
    """verl's token-mean divides by every response token: an all-success group dilutes the gradient."""
    mixed = PackedSequence(token_ids=(1, 2, 3), first_target=1, mask=(True, True), advantages=(1.0, 1.0),
                           behaviour_logprobs=(-1.0, -1.0))
    flat = PackedSequence(token_ids=(1, 4, 5), first_target=1, mask=(True, True), advantages=(0.0, 0.0),
                          behaviour_logprobs=(-1.0, -1.0))
    assert loss_normalizer([mixed, flat]) == 4.0 and loss_normalizer([mixed]) == 2.0
    assert loss_normalizer([mixed, flat], "seq-mean-token-sum") == pytest.approx(2.0)
    assert loss_normalizer([mixed], "seq-mean-token-sum-norm", loss_scale_factor=8) == 8.0
    with pytest.raises(ValueError, match="loss_scale_factor"):
        loss_normalizer([mixed], "seq-mean-token-sum-norm")
    with pytest.raises(ValueError, match="loss_agg_mode"):
        loss_normalizer([mixed], "sum")  # type: ignore[arg-type]


def test_skip_zero_is_off_by_default_and_keeps_denominator() -> None:
    t = _tree()
    for leaf in t.leaves():
        leaf.reward = 1.0  # an all-success prompt: every advantage 0 (grpo)
    segs = tree_segments(t, "grpo")
    assert segs and all(a == 0.0 for s in segs for a, _ in s.samples)
    assert tree_segments(t, "grpo", skip_zero=True) == []
