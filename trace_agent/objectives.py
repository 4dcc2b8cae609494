"""Policy objectives on rollout trees: GRPO, TreeRPO and Tree-GRPO advantages; the clipped loss.

Everything here is a pure function. The advantage functions read finished
:class:`~trace_agent.tree.RolloutTree` s and return *training segments*; the loss
functions work on tensors (torch is imported inside them, so importing this
module stays cheap).

Segments
    A segment is one turn: the tokens the policy generated on the edge from a
    node ``p`` to its child ``c`` (``c.generated_ids`` with their behaviour
    log-probs ``c.generated_logprobs``), the token context it was sampled from
    and one advantage. A turn shared by several leaves (a prefix that was
    continued from) is **one** segment, trained once. Turns with no finished
    leaf below are dropped.

    Context ids of the segment into ``c``: the concatenation, along the path
    root .. p, of each node's ``generated_ids + observation_ids``. The root has no
    generated ids; its ``observation_ids`` hold the rendered prompt (the rollout
    collector's convention). A collector that keeps the prompt elsewhere passes
    ``prompt_ids`` (prompt id -> ids) to :func:`tree_segments`.

Advantages (R in {0, 1} the leaf reward, eps = 1e-6, std = population std)
    ``grpo``       A_i = (R_i - mean_G) / (std_G + eps) over all leaves G of the prompt's
                   tree; a segment gets the **mean** of A_i over the leaves below it (for a
                   flat group, exactly its leaf's A_i on every token of the path).
    ``treerpo``    r(n) = mean leaf reward below n. The segment p -> c gets
                   A = r(c) - mean_{c' in children(p)} r(c'), divided by
                   (std_{c'} r(c') + eps) when ``normalize_std``. A node whose parent has a
                   single child gets A = 0 (``lone_child="zero"``, the definition) or the
                   advantage of the segment into its parent (``lone_child="inherit"``: a
                   lone child has the same leaves, hence the same value, as its parent).
    ``tree-grpo``  A_i = (R_i - mu_prompt)/(sigma_prompt + eps) + (R_i - mu_tree)/(sigma_tree + eps).
                   Tree-GRPO (Ji et al.) samples several trees per prompt: the *prompt*
                   (inter-tree) group is every leaf of every tree of the prompt, the *tree*
                   (intra-tree) group the leaves of one tree. Here a prompt has one
                   RolloutTree whose root rollouts each seed a subtree of continuations,
                   so **tree = the leaves below one child of the root** (one root rollout
                   and everything branched from it) and **prompt = all leaves**. A segment
                   gets the mean of A_i over the leaves below it.

Loss (:func:`policy_loss`)
    Per generated token t of a segment with advantage A:
    ratio_t = exp(logp_t - logp_behaviour_t) and
    l_t = -min(ratio_t A, clip(ratio_t, 1 - eps_low, 1 + eps_high) A), plus
    ``kl_coef`` * k3_t with k3_t = exp(ref_t - logp_t) - (ref_t - logp_t) - 1 when
    reference log-probs are given. Token-mean aggregation: sum of l_t over the mask
    (generated tokens only; prompt, observation and padding tokens are masked out)
    divided by ``num_tokens`` (default: the mask's sum; pass the mini-batch's token
    count when accumulating gradients over micro-batches).

Packing (:func:`pack_segments`)
    Segments of one path are scored in one forward pass: a segment whose
    ``context + generated`` ids are a prefix of another's context rides along in
    that longer sequence. Each token still belongs to exactly one segment.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import numpy as np

from trace_agent.tree import Node, RolloutTree

if TYPE_CHECKING:  # pragma: no cover
    import torch

__all__ = [
    "EPS",
    "ObjectiveName",
    "OBJECTIVES",
    "Segment",
    "PackedSequence",
    "LossStats",
    "group_normalized",
    "grpo_leaf_advantages",
    "tree_grpo_leaf_advantages",
    "treerpo_node_advantages",
    "node_advantages",
    "node_context_ids",
    "tree_segments",
    "batch_segments",
    "pack_segments",
    "k3_kl",
    "policy_loss",
]

#: The epsilon of every normalisation (DESIGN.md, "Objectives").
EPS = 1e-6
ObjectiveName = Literal["grpo", "treerpo", "tree-grpo"]
OBJECTIVES: tuple[str, ...] = ("grpo", "treerpo", "tree-grpo")


@dataclass(frozen=True, kw_only=True)
class Segment:
    """One turn to train on.

    Attributes:
        prompt_id: the tree's prompt id.
        node_id: the node this turn leads to (its tree's id).
        depth: that node's depth (1 = the first turn).
        context_ids: every token id before the turn, exactly as the policy saw them.
        generated_ids: the ids the policy sampled in this turn.
        behaviour_logprobs: their log-probs at sampling time (None: not recorded; the
            loss then uses the current policy's, detached, i.e. ratio 1).
        advantage: the turn's advantage (the same for each of its tokens).
        leaves: finished leaves below the node.
    """

    prompt_id: str
    node_id: int
    depth: int
    context_ids: tuple[int, ...]
    generated_ids: tuple[int, ...]
    behaviour_logprobs: tuple[float, ...] | None
    advantage: float
    leaves: int

    def __post_init__(self) -> None:
        if self.behaviour_logprobs is not None and len(self.behaviour_logprobs) != len(self.generated_ids):
            raise ValueError(f"segment {self.prompt_id}/{self.node_id}: {len(self.behaviour_logprobs)} log-probs "
                             f"for {len(self.generated_ids)} generated ids")
        if not math.isfinite(self.advantage):
            raise ValueError(f"segment {self.prompt_id}/{self.node_id}: advantage {self.advantage} is not finite")

    @property
    def num_tokens(self) -> int:
        return len(self.generated_ids)


# --------------------------------------------------------------------------------------------------
# advantages


def group_normalized(rewards: Sequence[float], *, eps: float = EPS) -> np.ndarray:
    """(R - mean) / (std + eps) over the group (population std); an empty group gives an empty array."""
    r = np.asarray(rewards, dtype=np.float64).reshape(-1)
    if r.size == 0:
        return r
    return (r - r.mean()) / (r.std() + eps)


def _finished_leaves(tree: RolloutTree) -> list[Node]:
    return tree.leaves()


def grpo_leaf_advantages(tree: RolloutTree, *, eps: float = EPS) -> dict[int, float]:
    """GRPO: leaf node id -> (R - mean_G) / (std_G + eps) over all the tree's leaves."""
    leaves = _finished_leaves(tree)
    adv = group_normalized([leaf.reward for leaf in leaves], eps=eps)  # type: ignore[misc]
    return {leaf.node_id: float(a) for leaf, a in zip(leaves, adv)}


def _root_child(node: Node) -> Node:
    while node.parent is not None and node.parent.parent is not None:
        node = node.parent
    return node


def tree_grpo_leaf_advantages(tree: RolloutTree, *, eps: float = EPS) -> dict[int, float]:
    """Tree-GRPO: leaf id -> prompt-group term + tree-group term (tree = leaves below one root child)."""
    leaves = _finished_leaves(tree)
    prompt_term = group_normalized([leaf.reward for leaf in leaves], eps=eps)  # type: ignore[misc]
    out = {leaf.node_id: float(a) for leaf, a in zip(leaves, prompt_term)}
    groups: dict[int, list[Node]] = {}
    for leaf in leaves:
        groups.setdefault(_root_child(leaf).node_id, []).append(leaf)
    for members in groups.values():
        term = group_normalized([leaf.reward for leaf in members], eps=eps)  # type: ignore[misc]
        for leaf, a in zip(members, term):
            out[leaf.node_id] += float(a)
    return out


def _mean_over_leaves(tree: RolloutTree, leaf_adv: Mapping[int, float]) -> dict[int, float]:
    """Non-root node id -> mean of ``leaf_adv`` over its leaves (nodes without a finished leaf omitted)."""
    n = len(tree.nodes)
    sums = np.zeros(n)
    counts = np.zeros(n, dtype=np.int64)
    for leaf_id, a in leaf_adv.items():
        sums[leaf_id] = a
        counts[leaf_id] = 1
    for node in reversed(tree.nodes[1:]):  # ids are a topological order
        p = node.parent.node_id  # type: ignore[union-attr]
        sums[p] += sums[node.node_id]
        counts[p] += counts[node.node_id]
    return {i: float(sums[i] / counts[i]) for i in range(1, n) if counts[i] > 0}


def treerpo_node_advantages(
    tree: RolloutTree,
    *,
    normalize_std: bool = False,
    lone_child: Literal["zero", "inherit"] = "zero",
    eps: float = EPS,
) -> dict[int, float]:
    """TreeRPO: non-root node id -> r(c) - mean of r over its sibling group (optionally / (std + eps)).

    Siblings without a finished leaf below are not part of the group and get no advantage.
    """
    if lone_child not in ("zero", "inherit"):
        raise ValueError(f"lone_child must be 'zero' or 'inherit', got {lone_child!r}")
    values, counts = tree.targets()
    out: dict[int, float] = {}
    for node in tree.nodes:  # parents before children: "inherit" reads the parent's advantage
        kids = [c for c in node.children if counts[c.node_id] > 0]
        if not kids:
            continue
        r = np.array([values[c.node_id] for c in kids], dtype=np.float64)
        adv = r - r.mean()
        if normalize_std:
            adv = adv / (r.std() + eps)
        for c, a in zip(kids, adv):
            if len(kids) == 1 and lone_child == "inherit" and not node.is_root:
                out[c.node_id] = out.get(node.node_id, 0.0)
            else:
                out[c.node_id] = float(a)
    return out


def node_advantages(
    tree: RolloutTree,
    objective: ObjectiveName,
    *,
    normalize_std: bool = False,
    lone_child: Literal["zero", "inherit"] = "zero",
    eps: float = EPS,
) -> dict[int, float]:
    """Non-root node id -> the advantage of the turn leading to it, for ``objective``.

    Only nodes with a finished leaf below appear. ``normalize_std`` and ``lone_child``
    apply to TreeRPO only.
    """
    if objective == "grpo":
        return _mean_over_leaves(tree, grpo_leaf_advantages(tree, eps=eps))
    if objective == "tree-grpo":
        return _mean_over_leaves(tree, tree_grpo_leaf_advantages(tree, eps=eps))
    if objective == "treerpo":
        return treerpo_node_advantages(tree, normalize_std=normalize_std, lone_child=lone_child, eps=eps)
    raise ValueError(f"unknown objective {objective!r}; choose one of {OBJECTIVES}")


def node_context_ids(node: Node, *, prompt_ids: Sequence[int] | None = None) -> tuple[int, ...]:
    """Token ids before ``node``'s generated ids: the path's generated + observation ids up to its parent.

    The root contributes ``prompt_ids`` when given, else its ``observation_ids``.
    """
    ids: list[int] = []
    for n in node.path()[:-1]:
        if n.is_root and prompt_ids is not None:
            ids.extend(int(t) for t in prompt_ids)
        else:
            ids.extend(n.generated_ids)
            ids.extend(n.observation_ids)
    return tuple(ids)


def tree_segments(
    tree: RolloutTree,
    objective: ObjectiveName,
    *,
    prompt_ids: Sequence[int] | None = None,
    normalize_std: bool = False,
    lone_child: Literal["zero", "inherit"] = "zero",
    skip_zero: bool = False,
    eps: float = EPS,
) -> list[Segment]:
    """The tree's training segments (one per turn with a finished leaf below), in node-id order.

    ``skip_zero`` drops segments whose advantage is exactly 0 (they add no policy gradient;
    without a KL term they only change the token-mean denominator). Turns with no
    generated tokens are dropped.
    """
    adv = node_advantages(tree, objective, normalize_std=normalize_std, lone_child=lone_child, eps=eps)
    _, counts = tree.targets()
    if not tree.root.observation_ids and prompt_ids is None and adv:
        raise ValueError(f"tree {tree.prompt_id!r}: the root holds no prompt token ids (root.observation_ids); "
                         "pass prompt_ids=")
    out = []
    for node_id, a in sorted(adv.items()):
        node = tree.nodes[node_id]
        if not node.generated_ids or (skip_zero and a == 0.0):
            continue
        out.append(Segment(
            prompt_id=tree.prompt_id, node_id=node_id, depth=node.depth,
            context_ids=node_context_ids(node, prompt_ids=prompt_ids),
            generated_ids=tuple(node.generated_ids),
            behaviour_logprobs=None if node.generated_logprobs is None else tuple(node.generated_logprobs),
            advantage=a, leaves=int(counts[node_id]),
        ))
    return out


def batch_segments(
    trees: Iterable[RolloutTree],
    objective: ObjectiveName,
    *,
    prompt_ids: Mapping[str, Sequence[int]] | None = None,
    normalize_std: bool = False,
    lone_child: Literal["zero", "inherit"] = "zero",
    skip_zero: bool = False,
    eps: float = EPS,
) -> list[Segment]:
    """:func:`tree_segments` over several trees (each tree is its own group), concatenated in order."""
    out: list[Segment] = []
    for tree in trees:
        out += tree_segments(tree, objective, prompt_ids=None if prompt_ids is None else prompt_ids[tree.prompt_id],
                             normalize_std=normalize_std, lone_child=lone_child, skip_zero=skip_zero, eps=eps)
    return out


# --------------------------------------------------------------------------------------------------
# packing


@dataclass(frozen=True, kw_only=True)
class PackedSequence:
    """One sequence to score, carrying the tokens of one or more segments.

    ``token_ids`` is a full context; ``first_target`` the first position scored;
    per scored position (``len(token_ids) - first_target`` of them): ``mask`` (True on
    segment tokens, False on observation / template tokens in between),
    ``advantages`` and ``behaviour_logprobs`` (NaN where masked or not recorded).
    """

    token_ids: tuple[int, ...]
    first_target: int
    mask: tuple[bool, ...]
    advantages: tuple[float, ...]
    behaviour_logprobs: tuple[float, ...]

    @property
    def num_targets(self) -> int:
        return len(self.token_ids) - self.first_target

    @property
    def num_tokens(self) -> int:
        """Trainable tokens in this sequence."""
        return sum(self.mask)


def pack_segments(segments: Sequence[Segment]) -> list[PackedSequence]:
    """Pack segments into as few sequences as prefix sharing allows (deterministic, order-preserving).

    Segments are placed longest first; a segment joins the first sequence whose ids
    start with its ``context + generated`` ids and whose positions there are still free (two
    sibling turns that sampled the very same ids are distinct segments), else it opens a new
    sequence. The result
    lists sequences in the order their longest segment appears in ``segments``.
    """
    order = sorted(range(len(segments)),
                   key=lambda i: (-(len(segments[i].context_ids) + segments[i].num_tokens), i))
    seqs: list[dict] = []
    for i in order:
        seg = segments[i]
        full = seg.context_ids + seg.generated_ids
        span = range(len(seg.context_ids), len(full))
        host = next((s for s in seqs if s["prompt_id"] == seg.prompt_id and len(s["ids"]) >= len(full)
                     and s["ids"][:len(full)] == full and not any(j in s["taken"] for j in span)), None)
        if host is None:  # identical sibling turns (same ids, same context) each get their own sequence
            host = {"prompt_id": seg.prompt_id, "ids": full, "segs": [], "first": i, "taken": set()}
            seqs.append(host)
        host["segs"].append(seg)
        host["taken"].update(span)
    seqs.sort(key=lambda s: s["first"])
    out = []
    for s in seqs:
        ids: tuple[int, ...] = s["ids"]
        start = min(len(seg.context_ids) for seg in s["segs"])
        n = len(ids) - start
        mask = [False] * n
        adv = [0.0] * n
        lps = [math.nan] * n
        for seg in s["segs"]:
            off = len(seg.context_ids) - start
            for j in range(seg.num_tokens):
                if mask[off + j]:
                    raise ValueError(f"segments {seg.prompt_id}/{seg.node_id} overlap another segment")
                mask[off + j] = True
                adv[off + j] = seg.advantage
                lps[off + j] = math.nan if seg.behaviour_logprobs is None else seg.behaviour_logprobs[j]
        out.append(PackedSequence(token_ids=ids, first_target=start, mask=tuple(mask), advantages=tuple(adv),
                                  behaviour_logprobs=tuple(lps)))
    return out


# --------------------------------------------------------------------------------------------------
# loss


@dataclass(frozen=True, kw_only=True)
class LossStats:
    """Diagnostics of one :func:`policy_loss` call (floats, detached)."""

    loss: float
    policy_loss: float
    kl: float
    clip_fraction: float
    ratio_mean: float
    approx_kl_behaviour: float
    tokens: int


def k3_kl(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimator of KL(pi || pi_ref): exp(ref - logp) - (ref - logp) - 1 (>= 0)."""
    d = ref_logprobs - logprobs
    return d.exp() - d - 1.0


def policy_loss(
    logprobs: torch.Tensor,
    behaviour_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    ref_logprobs: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    num_tokens: float | None = None,
) -> tuple[torch.Tensor, LossStats]:
    """The clipped importance-ratio surrogate with token-mean aggregation (see the module docstring).

    All tensors share one shape (e.g. (batch, tokens)); ``mask`` is bool, True on the tokens
    to train. NaN behaviour log-probs (not recorded) are replaced by the detached current
    log-probs (ratio 1). Masked positions may hold anything (NaN included).
    """
    import torch

    if not (logprobs.shape == behaviour_logprobs.shape == advantages.shape == mask.shape):
        raise ValueError(f"shapes differ: {tuple(logprobs.shape)}, {tuple(behaviour_logprobs.shape)}, "
                         f"{tuple(advantages.shape)}, {tuple(mask.shape)}")
    if clip_low < 0 or clip_high < 0 or clip_low >= 1:
        raise ValueError(f"need 0 <= clip_low < 1 and clip_high >= 0, got {clip_low}, {clip_high}")
    m = mask.bool()
    denom = float(m.sum().item()) if num_tokens is None else float(num_tokens)
    denom = max(denom, 1.0)
    zero = torch.zeros((), dtype=logprobs.dtype, device=logprobs.device)
    lp = torch.where(m, logprobs, zero)
    old = torch.where(m & ~torch.isnan(behaviour_logprobs), behaviour_logprobs, lp.detach())
    adv = torch.where(m, advantages, zero)
    log_ratio = lp - old
    ratio = log_ratio.exp()
    clipped = ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    per_token = -torch.minimum(ratio * adv, clipped * adv)
    pg = torch.where(m, per_token, zero).sum() / denom
    loss = pg
    kl_value = 0.0
    if ref_logprobs is not None:
        ref = torch.where(m, ref_logprobs, lp.detach())
        kl = torch.where(m, k3_kl(lp, ref), zero).sum() / denom
        kl_value = float(kl.detach())
        if kl_coef:
            loss = loss + kl_coef * kl
    with torch.no_grad():
        n = max(int(m.sum().item()), 1)
        was_clipped = (ratio * adv != clipped * adv) & m
        stats = LossStats(
            loss=float(loss.detach()), policy_loss=float(pg.detach()), kl=kl_value,
            clip_fraction=float(was_clipped.sum().item()) / n,
            ratio_mean=float(torch.where(m, ratio, zero).sum().item()) / n,
            approx_kl_behaviour=float(torch.where(m, -log_ratio, zero).sum().item()) / n,
            tokens=int(m.sum().item()),
        )
    return loss, stats
