"""Policy objectives on rollout trees: GRPO, TreeRPO and Tree-GRPO advantages; the clipped loss.

Everything here is a pure function. The advantage functions read finished
:class:`~trace_agent.tree.RolloutTree` s and return *training segments*; the loss
functions work on tensors (torch is imported inside them, so importing this
module stays cheap). Defaults follow the reference implementations; every deviation is a
named option.

References
    verl ``verl/trainer/ppo/core_algos.py``: ``compute_grpo_outcome_advantage`` (group mean,
    *unbiased* std ``torch.std``, eps 1e-6; a group of one gets mean 0 and std 1, so A = R),
    ``agg_loss`` (the four loss aggregation modes, ``token-mean`` the default) and
    ``compute_policy_loss_vanilla`` (log-ratio clamped to +-20 before ``exp``; dual clip
    ``clip_ratio_c`` on negative advantages). The official Tree-GRPO code (AMAP-ML/Tree-GRPO,
    ``ray_trainer_ts.py``, estimator ``tree``): the sum of two such GRPO advantages, one
    grouped by prompt, one by tree, every leaf a full trajectory in the batch. TreeRPO
    (Yang et al. 2025, arXiv 2506.05183): step-level groups of siblings, a node's value the
    mean reward of the leaves below it.

Segments
    A segment is one turn: the tokens the policy generated on the edge from a node ``p`` to
    its child ``c`` (``c.generated_ids`` with their behaviour log-probs
    ``c.generated_logprobs``), the token context it was sampled from, and the *samples* it
    belongs to. A turn shared by several leaves (a prefix that was continued from) is **one**
    segment, scored once; turns with no finished leaf below are dropped.

    Samples. For ``grpo`` and ``tree-grpo`` with ``shared_turns="per-leaf"`` (the default, as
    the official Tree-GRPO code, where every leaf is a full trajectory of the batch) a turn
    shared by L leaves belongs to L samples, one per leaf, each with that leaf's advantage:
    the loss counts its tokens L times, each copy with its own advantage (computed once, see
    :func:`pack_segments`). ``shared_turns="once"`` (a deviation) trains it once with the mean
    leaf advantage. For ``treerpo`` each turn is its own sample with its node's advantage (the
    definition: an advantage per step, not per leaf).

    Context ids of the segment into ``c``: the concatenation, along the path root .. p, of
    each node's ``generated_ids + observation_ids``. The root has no generated ids; its
    ``observation_ids`` hold the rendered prompt (the rollout collector's convention). A
    collector that keeps the prompt elsewhere passes ``prompt_ids`` to :func:`tree_segments`.

Advantages (R in {0, 1} the leaf reward, eps = 1e-6)
    :func:`group_normalized`: (R - mean) / (std + eps), std with ``ddof`` (1: unbiased, verl
    and Tree-GRPO; 0: population, a deviation); a group of one gets A = R / (1 + eps)
    (``singleton="reference"``, verl) or 0 (``singleton="zero"``, a deviation).

    ``grpo``       A_i = group_normalized over all leaves G of the prompt's tree.
    ``treerpo``    r(n) = mean leaf reward below n. The segment p -> c gets
                   A = r(c) - mean_{c' in children(p)} r(c'), divided by
                   (std_{c'} r(c') + eps) when ``normalize_std``. A node whose parent has a
                   single child (a *lone child*, which TreeRPO's fixed-branching trees never
                   have): ``lone_child="inherit"`` (the default) gives it the advantage of the
                   segment into its parent. A chain of lone children is one edge of TreeRPO's
                   tree (the tree's nodes are the branch points, its edges the spans between
                   them) and has the same leaves, hence the same value, as the edge above it,
                   so every generated turn is trained. ``lone_child="zero"`` (a deviation) gives
                   it A = 0, the sibling group of one taken literally (on demo trees that leaves
                   about a quarter of the generated tokens without gradient).
    ``tree-grpo``  A_i = group_normalized over the prompt + group_normalized over the tree.
                   Tree-GRPO samples several trees per prompt: the *prompt* (inter-tree) group
                   is every leaf of every tree of the prompt, the *tree* (intra-tree) group the
                   leaves of one tree. Here a prompt has one RolloutTree whose root rollouts
                   each seed a subtree of continuations, so **tree = the leaves below one
                   child of the root** and **prompt = all leaves**. With the reference
                   singleton rule, a root rollout that was never continued is a tree of one
                   leaf whose intra-tree term is R.

Loss (:func:`policy_loss`)
    Per generated token t and sample i with advantage A_i: ratio_t = exp(clamp(logp_t -
    logp_behaviour_t, -c_log, c_log)) and l_ti = -min(ratio_t A_i, clip(ratio_t, 1 - eps_low,
    1 + eps_high) A_i); with dual clip (``clip_ratio_c`` = c > 1) l_ti = min(l_ti, -c A_i) for
    A_i < 0 (verl). Plus ``kl_coef`` * k3_t with k3_t = exp(ref_t - logp_t) - (ref_t - logp_t)
    - 1 when reference log-probs are given. l_ti is linear in A_i for a fixed sign, so the
    samples sharing a token are summed exactly from two numbers per token: the weighted sums
    of their positive and of their negative advantages.

Loss aggregation (``loss_agg_mode``, verl's ``agg_loss``; T_i the generated tokens of sample i)
    ``token-mean``              sum_{t,i} l_ti / #(t, i)   over ALL trainable tokens of the
                                mini-batch (zero-advantage ones included: more mixed groups,
                                more gradient). The default.
    ``seq-mean-token-sum``      sum_{t,i} l_ti / #samples
    ``seq-mean-token-mean``     sum_{t,i} (l_ti / T_i) / #samples
    ``seq-mean-token-sum-norm`` sum_{t,i} l_ti / loss_scale_factor (Dr. GRPO; verl divides by
                                the padded response length; here a constant you set, or the
                                longest sample of the step).
    :func:`pack_segments` puts each token's sample weight (1, or 1/T_i for
    ``seq-mean-token-mean``) into ``weights`` and its share of samples (sum_i 1/T_i) into
    ``sample_shares``; :func:`loss_normalizer` turns a mini-batch of packed sequences into the
    denominator. When a sample's tokens are split over mini-batches, #samples counts the
    fractions present (exactly the number of samples for a whole-step mini-batch).

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

from trace_agent.tree import Node, RolloutTree, path_token_ids

if TYPE_CHECKING:  # pragma: no cover
    import torch

__all__ = [
    "EPS",
    "LOG_RATIO_CLAMP",
    "ObjectiveName",
    "OBJECTIVES",
    "LossAggMode",
    "LOSS_AGG_MODES",
    "SharedTurns",
    "Singleton",
    "Segment",
    "PackedSequence",
    "LossStats",
    "group_normalized",
    "grpo_leaf_advantages",
    "tree_grpo_leaf_advantages",
    "treerpo_node_advantages",
    "node_advantages",
    "node_samples",
    "node_context_ids",
    "tree_segments",
    "batch_segments",
    "pack_segments",
    "loss_normalizer",
    "k3_kl",
    "policy_loss",
]

#: The epsilon of every normalisation (DESIGN.md, "Objectives"; verl's default).
EPS = 1e-6
#: verl's clamp of the log importance ratio before ``exp`` (``compute_policy_loss_vanilla``).
LOG_RATIO_CLAMP = 20.0
ObjectiveName = Literal["grpo", "treerpo", "tree-grpo"]
OBJECTIVES: tuple[str, ...] = ("grpo", "treerpo", "tree-grpo")
LossAggMode = Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
LOSS_AGG_MODES: tuple[str, ...] = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean",
                                   "seq-mean-token-sum-norm")
SharedTurns = Literal["per-leaf", "once"]
Singleton = Literal["reference", "zero"]


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
        advantage: the turn's advantage: the mean over its samples (what a turn trained once
            carries; for one sample, that sample's advantage).
        leaves: finished leaves below the node.
        sample_advantages: the advantage of each sample (full-path sample) the turn belongs
            to; empty means one sample with ``advantage``.
        sample_tokens: the generated tokens of each of those samples (for
            ``seq-mean-token-mean``); empty means this turn's own tokens.
    """

    prompt_id: str
    node_id: int
    depth: int
    context_ids: tuple[int, ...]
    generated_ids: tuple[int, ...]
    behaviour_logprobs: tuple[float, ...] | None
    advantage: float
    leaves: int
    sample_advantages: tuple[float, ...] = ()
    sample_tokens: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.behaviour_logprobs is not None and len(self.behaviour_logprobs) != len(self.generated_ids):
            raise ValueError(f"segment {self.prompt_id}/{self.node_id}: {len(self.behaviour_logprobs)} log-probs "
                             f"for {len(self.generated_ids)} generated ids")
        if not math.isfinite(self.advantage) or not all(math.isfinite(a) for a in self.sample_advantages):
            raise ValueError(f"segment {self.prompt_id}/{self.node_id}: an advantage is not finite")
        if self.sample_tokens and len(self.sample_tokens) != len(self.sample_advantages):
            raise ValueError(f"segment {self.prompt_id}/{self.node_id}: {len(self.sample_tokens)} sample lengths "
                             f"for {len(self.sample_advantages)} samples")
        if any(t < 1 for t in self.sample_tokens):
            raise ValueError(f"segment {self.prompt_id}/{self.node_id}: a sample has no generated tokens")

    @property
    def num_tokens(self) -> int:
        return len(self.generated_ids)

    @property
    def samples(self) -> tuple[tuple[float, int], ...]:
        """(advantage, generated tokens) of every sample this turn belongs to."""
        if not self.sample_advantages:
            return ((self.advantage, max(self.num_tokens, 1)),)
        tokens = self.sample_tokens or (max(self.num_tokens, 1),) * len(self.sample_advantages)
        return tuple(zip(self.sample_advantages, tokens))


# --------------------------------------------------------------------------------------------------
# advantages


def group_normalized(rewards: Sequence[float], *, eps: float = EPS, ddof: int = 1,
                     singleton: Singleton = "reference") -> np.ndarray:
    """(R - mean) / (std + eps) over the group, as verl's ``compute_grpo_outcome_advantage``.

    ``ddof=1`` is the unbiased std (``torch.std``, verl and Tree-GRPO); ``ddof=0`` the
    population std. A group of one gets mean 0 and std 1, i.e. R / (1 + eps)
    (``singleton="reference"``), or 0 (``singleton="zero"``). An empty group gives an empty array.
    """
    if ddof not in (0, 1):
        raise ValueError(f"ddof must be 0 or 1, got {ddof}")
    if singleton not in ("reference", "zero"):
        raise ValueError(f"singleton must be 'reference' or 'zero', got {singleton!r}")
    r = np.asarray(rewards, dtype=np.float64).reshape(-1)
    if r.size == 0:
        return r
    if r.size == 1:
        return r / (1.0 + eps) if singleton == "reference" else np.zeros(1)
    return (r - r.mean()) / (r.std(ddof=ddof) + eps)


def _finished_leaves(tree: RolloutTree) -> list[Node]:
    return tree.leaves()


def grpo_leaf_advantages(tree: RolloutTree, *, eps: float = EPS, ddof: int = 1,
                         singleton: Singleton = "reference") -> dict[int, float]:
    """GRPO: leaf node id -> :func:`group_normalized` reward over all the tree's leaves."""
    leaves = _finished_leaves(tree)
    adv = group_normalized([leaf.reward for leaf in leaves], eps=eps, ddof=ddof,  # type: ignore[misc]
                           singleton=singleton)
    return {leaf.node_id: float(a) for leaf, a in zip(leaves, adv)}


def _root_child(node: Node) -> Node:
    while node.parent is not None and node.parent.parent is not None:
        node = node.parent
    return node


def tree_grpo_leaf_advantages(tree: RolloutTree, *, eps: float = EPS, ddof: int = 1,
                              singleton: Singleton = "reference") -> dict[int, float]:
    """Tree-GRPO: leaf id -> prompt-group term + tree-group term (tree = leaves below one root child).

    Both terms are :func:`group_normalized` of the raw rewards (the official code's default
    estimator ``tree`` sums two GRPO advantages, grouped by prompt uid and by tree uid).
    """
    leaves = _finished_leaves(tree)
    prompt_term = group_normalized([leaf.reward for leaf in leaves], eps=eps, ddof=ddof,  # type: ignore[misc]
                                   singleton=singleton)
    out = {leaf.node_id: float(a) for leaf, a in zip(leaves, prompt_term)}
    groups: dict[int, list[Node]] = {}
    for leaf in leaves:
        groups.setdefault(_root_child(leaf).node_id, []).append(leaf)
    for members in groups.values():
        term = group_normalized([leaf.reward for leaf in members], eps=eps, ddof=ddof,  # type: ignore[misc]
                                singleton=singleton)
        for leaf, a in zip(members, term):
            out[leaf.node_id] += float(a)
    return out


def _path_tokens(node: Node) -> int:
    return sum(len(n.generated_ids) for n in node.path())


def _leaf_samples(tree: RolloutTree, leaf_adv: Mapping[int, float]) -> dict[int, list[tuple[float, int]]]:
    """Non-root node id -> [(advantage, path tokens) of every leaf below it], leaves in node order."""
    out: dict[int, list[tuple[float, int]]] = {}
    for leaf_id in sorted(leaf_adv):
        leaf = tree.nodes[leaf_id]
        sample = (float(leaf_adv[leaf_id]), max(_path_tokens(leaf), 1))
        for n in leaf.path()[1:]:
            out.setdefault(n.node_id, []).append(sample)
    return out


def treerpo_node_advantages(
    tree: RolloutTree,
    *,
    normalize_std: bool = False,
    lone_child: Literal["zero", "inherit"] = "inherit",
    eps: float = EPS,
    ddof: int = 1,
) -> dict[int, float]:
    """TreeRPO: non-root node id -> r(c) - mean of r over its sibling group (optionally / (std + eps)).

    Siblings without a finished leaf below are not part of the group and get no advantage.
    ``ddof`` is the std's (``normalize_std`` only). See the module docstring for ``lone_child``.
    """
    if lone_child not in ("zero", "inherit"):
        raise ValueError(f"lone_child must be 'zero' or 'inherit', got {lone_child!r}")
    values, counts = tree.targets()
    out: dict[int, float] = {}
    for node in tree.nodes:  # parents before children: "inherit" reads the parent's advantage
        kids = [c for c in node.children if counts[c.node_id] > 0]
        if not kids:
            continue
        if len(kids) == 1:
            only = kids[0].node_id
            out[only] = out.get(node.node_id, 0.0) if lone_child == "inherit" and not node.is_root else 0.0
            continue
        r = np.array([values[c.node_id] for c in kids], dtype=np.float64)
        adv = r - r.mean()
        if normalize_std:
            adv = adv / (r.std(ddof=ddof) + eps)
        for c, a in zip(kids, adv):
            out[c.node_id] = float(a)
    return out


def node_samples(
    tree: RolloutTree,
    objective: ObjectiveName,
    *,
    normalize_std: bool = False,
    lone_child: Literal["zero", "inherit"] = "inherit",
    shared_turns: SharedTurns = "per-leaf",
    eps: float = EPS,
    ddof: int = 1,
    singleton: Singleton = "reference",
) -> dict[int, list[tuple[float, int]]]:
    """Non-root node id -> [(advantage, generated tokens)] of the samples the turn into it belongs to.

    ``grpo`` / ``tree-grpo`` with ``shared_turns="per-leaf"``: one sample per leaf below (its
    advantage, its path's generated tokens); with ``"once"``: one sample with the mean leaf
    advantage. ``treerpo``: one sample per turn (its advantage, the turn's tokens). Only
    nodes with a finished leaf below appear.
    """
    if shared_turns not in ("per-leaf", "once"):
        raise ValueError(f"shared_turns must be 'per-leaf' or 'once', got {shared_turns!r}")
    if objective in ("grpo", "tree-grpo"):
        fn = grpo_leaf_advantages if objective == "grpo" else tree_grpo_leaf_advantages
        per_leaf = _leaf_samples(tree, fn(tree, eps=eps, ddof=ddof, singleton=singleton))
        if shared_turns == "per-leaf":
            return per_leaf
        return {i: [(float(np.mean([a for a, _ in s])), max(len(tree.nodes[i].generated_ids), 1))]
                for i, s in per_leaf.items()}
    if objective == "treerpo":
        adv = treerpo_node_advantages(tree, normalize_std=normalize_std, lone_child=lone_child, eps=eps, ddof=ddof)
        return {i: [(a, max(len(tree.nodes[i].generated_ids), 1))] for i, a in adv.items()}
    raise ValueError(f"unknown objective {objective!r}; choose one of {OBJECTIVES}")


def node_advantages(
    tree: RolloutTree,
    objective: ObjectiveName,
    *,
    normalize_std: bool = False,
    lone_child: Literal["zero", "inherit"] = "inherit",
    eps: float = EPS,
    ddof: int = 1,
    singleton: Singleton = "reference",
) -> dict[int, float]:
    """Non-root node id -> the (mean over its samples) advantage of the turn leading to it.

    Only nodes with a finished leaf below appear. ``normalize_std`` and ``lone_child``
    apply to TreeRPO only; ``singleton`` to GRPO and Tree-GRPO.
    """
    samples = node_samples(tree, objective, normalize_std=normalize_std, lone_child=lone_child,
                           shared_turns="once", eps=eps, ddof=ddof, singleton=singleton)
    return {i: s[0][0] for i, s in sorted(samples.items())}


def node_context_ids(node: Node, *, prompt_ids: Sequence[int] | None = None) -> tuple[int, ...]:
    """Token ids before ``node``'s generated ids: the path's generated + observation ids up to its parent.

    The root contributes ``prompt_ids`` when given, else its ``observation_ids``
    (:func:`~trace_agent.tree.path_token_ids` of the parent).
    """
    return tuple(path_token_ids(node.parent, prompt_ids=prompt_ids))


def tree_segments(
    tree: RolloutTree,
    objective: ObjectiveName,
    *,
    prompt_ids: Sequence[int] | None = None,
    normalize_std: bool = False,
    lone_child: Literal["zero", "inherit"] = "inherit",
    shared_turns: SharedTurns = "per-leaf",
    skip_zero: bool = False,
    eps: float = EPS,
    ddof: int = 1,
    singleton: Singleton = "reference",
) -> list[Segment]:
    """The tree's training segments (one per turn with a finished leaf below), in node-id order.

    ``skip_zero`` (a deviation, off by default) drops segments whose samples all have
    advantage exactly 0: they add no policy gradient, but with ``token-mean`` they count in
    the denominator, which is how more mixed groups give more gradient (verl keeps them).
    Turns with no generated tokens are dropped.
    """
    samples = node_samples(tree, objective, normalize_std=normalize_std, lone_child=lone_child,
                           shared_turns=shared_turns, eps=eps, ddof=ddof, singleton=singleton)
    _, counts = tree.targets()
    if not tree.root.observation_ids and prompt_ids is None and samples:
        raise ValueError(f"tree {tree.prompt_id!r}: the root holds no prompt token ids (root.observation_ids); "
                         "pass prompt_ids=")
    out = []
    for node_id, s in sorted(samples.items()):
        node = tree.nodes[node_id]
        if not node.generated_ids or (skip_zero and all(a == 0.0 for a, _ in s)):
            continue
        out.append(Segment(
            prompt_id=tree.prompt_id, node_id=node_id, depth=node.depth,
            context_ids=node_context_ids(node, prompt_ids=prompt_ids),
            generated_ids=tuple(node.generated_ids),
            behaviour_logprobs=None if node.generated_logprobs is None else tuple(node.generated_logprobs),
            advantage=float(np.mean([a for a, _ in s])), leaves=int(counts[node_id]),
            sample_advantages=tuple(a for a, _ in s), sample_tokens=tuple(t for _, t in s),
        ))
    return out


def batch_segments(
    trees: Iterable[RolloutTree],
    objective: ObjectiveName,
    *,
    prompt_ids: Mapping[str, Sequence[int]] | None = None,
    normalize_std: bool = False,
    lone_child: Literal["zero", "inherit"] = "inherit",
    shared_turns: SharedTurns = "per-leaf",
    skip_zero: bool = False,
    eps: float = EPS,
    ddof: int = 1,
    singleton: Singleton = "reference",
) -> list[Segment]:
    """:func:`tree_segments` over several trees (each tree is its own group), concatenated in order."""
    out: list[Segment] = []
    for tree in trees:
        out += tree_segments(tree, objective, prompt_ids=None if prompt_ids is None else prompt_ids[tree.prompt_id],
                             normalize_std=normalize_std, lone_child=lone_child, shared_turns=shared_turns,
                             skip_zero=skip_zero, eps=eps, ddof=ddof, singleton=singleton)
    return out


# --------------------------------------------------------------------------------------------------
# packing


@dataclass(frozen=True, kw_only=True)
class PackedSequence:
    """One sequence to score, carrying the tokens of one or more segments.

    ``token_ids`` is a full context; ``first_target`` the first position scored;
    per scored position (``len(token_ids) - first_target`` of them): ``mask`` (True on
    segment tokens, False on observation / template tokens in between),
    ``advantages`` (the segment's mean advantage), ``behaviour_logprobs`` (NaN where
    masked or not recorded), and the loss weights of :func:`pack_segments`: ``weights``
    (sum of the samples' weights), ``gains`` / ``penalties`` (weighted sums of the samples'
    positive / negative advantages) and ``sample_shares`` (sum_i 1 / T_i). Masked positions
    hold 0 in the four weight fields. Empty weight fields mean one sample of weight 1 with
    ``advantages`` (a sequence built by hand).
    """

    token_ids: tuple[int, ...]
    first_target: int
    mask: tuple[bool, ...]
    advantages: tuple[float, ...]
    behaviour_logprobs: tuple[float, ...]
    weights: tuple[float, ...] = ()
    gains: tuple[float, ...] = ()
    penalties: tuple[float, ...] = ()
    sample_shares: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if not self.weights:
            w = tuple(1.0 if m else 0.0 for m in self.mask)
            object.__setattr__(self, "weights", w)
            object.__setattr__(self, "gains", tuple(max(a, 0.0) if m else 0.0
                                                    for a, m in zip(self.advantages, self.mask)))
            object.__setattr__(self, "penalties", tuple(min(a, 0.0) if m else 0.0
                                                        for a, m in zip(self.advantages, self.mask)))
        if not self.sample_shares:
            n = max(sum(self.mask), 1)
            object.__setattr__(self, "sample_shares", tuple(1.0 / n if m else 0.0 for m in self.mask))
        n = len(self.mask)
        if not (len(self.advantages) == len(self.behaviour_logprobs) == len(self.weights) == len(self.gains)
                == len(self.penalties) == len(self.sample_shares) == n == self.num_targets):
            raise ValueError("a packed sequence's per-target fields must all have num_targets entries")

    @property
    def num_targets(self) -> int:
        return len(self.token_ids) - self.first_target

    @property
    def num_tokens(self) -> int:
        """Trainable tokens in this sequence."""
        return sum(self.mask)

    @property
    def weight(self) -> float:
        """Sum of the token weights (the ``token-mean`` denominator's share of this sequence)."""
        return float(sum(self.weights))

    @property
    def samples(self) -> float:
        """Samples this sequence carries (fractions of samples whose tokens lie elsewhere)."""
        return float(sum(self.sample_shares))


def _token_weights(seg: Segment, mode: LossAggMode) -> tuple[float, float, float, float]:
    """(weight, gain, penalty, sample share) of one token of ``seg`` under ``mode``."""
    w = g = p = share = 0.0
    for a, t in seg.samples:
        wi = 1.0 / t if mode == "seq-mean-token-mean" else 1.0
        w += wi
        g += wi * max(a, 0.0)
        p += wi * min(a, 0.0)
        share += 1.0 / t
    return w, g, p, share


def pack_segments(segments: Sequence[Segment], *, loss_agg_mode: LossAggMode = "token-mean") -> list[PackedSequence]:
    """Pack segments into as few sequences as prefix sharing allows (deterministic, order-preserving).

    Segments are placed longest first; a segment joins the first sequence whose ids
    start with its ``context + generated`` ids and whose positions there are still free (two
    sibling turns that sampled the very same ids are distinct segments), else it opens a new
    sequence. The result lists sequences in the order their longest segment appears in
    ``segments``. Each token's weights follow ``loss_agg_mode`` (module docstring).
    """
    if loss_agg_mode not in LOSS_AGG_MODES:
        raise ValueError(f"loss_agg_mode must be one of {LOSS_AGG_MODES}, got {loss_agg_mode!r}")
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
        fields = [[0.0] * n for _ in range(4)]
        for seg in s["segs"]:
            off = len(seg.context_ids) - start
            tw = _token_weights(seg, loss_agg_mode)
            for j in range(seg.num_tokens):
                if mask[off + j]:
                    raise ValueError(f"segments {seg.prompt_id}/{seg.node_id} overlap another segment")
                mask[off + j] = True
                adv[off + j] = seg.advantage
                lps[off + j] = math.nan if seg.behaviour_logprobs is None else seg.behaviour_logprobs[j]
                for f, v in zip(fields, tw):
                    f[off + j] = v
        out.append(PackedSequence(token_ids=ids, first_target=start, mask=tuple(mask), advantages=tuple(adv),
                                  behaviour_logprobs=tuple(lps), weights=tuple(fields[0]), gains=tuple(fields[1]),
                                  penalties=tuple(fields[2]), sample_shares=tuple(fields[3])))
    return out


def loss_normalizer(seqs: Sequence[PackedSequence], loss_agg_mode: LossAggMode = "token-mean", *,
                    loss_scale_factor: float | None = None) -> float:
    """The denominator of a mini-batch's loss under ``loss_agg_mode`` (module docstring).

    ``token-mean``: the sum of token weights (tokens x samples); ``seq-mean-*``: the samples
    present; ``seq-mean-token-sum-norm``: ``loss_scale_factor`` (required for that mode).
    """
    if loss_agg_mode == "token-mean":
        return sum(s.weight for s in seqs)
    if loss_agg_mode in ("seq-mean-token-sum", "seq-mean-token-mean"):
        return sum(s.samples for s in seqs)
    if loss_agg_mode == "seq-mean-token-sum-norm":
        if loss_scale_factor is None or not loss_scale_factor > 0:
            raise ValueError("seq-mean-token-sum-norm needs a loss_scale_factor > 0")
        return float(loss_scale_factor)
    raise ValueError(f"loss_agg_mode must be one of {LOSS_AGG_MODES}, got {loss_agg_mode!r}")


# --------------------------------------------------------------------------------------------------
# loss


@dataclass(frozen=True, kw_only=True)
class LossStats:
    """Diagnostics of one :func:`policy_loss` call (floats, detached; fractions per masked token)."""

    loss: float
    policy_loss: float
    kl: float
    clip_fraction: float
    ratio_mean: float
    approx_kl_behaviour: float
    tokens: int
    dual_clip_fraction: float = 0.0


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
    weights: torch.Tensor | None = None,
    negative_advantages: torch.Tensor | None = None,
    clip_ratio_c: float | None = None,
    log_ratio_clamp: float | None = LOG_RATIO_CLAMP,
) -> tuple[torch.Tensor, LossStats]:
    """The clipped importance-ratio surrogate, summed over tokens and divided by ``num_tokens``.

    All tensors share one shape (e.g. (batch, tokens)); ``mask`` is bool, True on the tokens
    to train. NaN behaviour log-probs (not recorded) are replaced by the detached current
    log-probs (ratio 1). Masked positions may hold anything (NaN included).

    One sample per token (``negative_advantages`` None): ``advantages`` is its A. Several
    samples per token (:func:`pack_segments`): ``advantages`` holds the weighted sum of their
    positive advantages and ``negative_advantages`` that of their negative ones (<= 0).
    ``weights`` (default 1) weigh the KL term per token and give the default denominator
    (their sum over the mask: ``token-mean``); pass ``num_tokens`` for a mini-batch's
    denominator when accumulating over micro-batches (:func:`loss_normalizer`).
    ``clip_ratio_c`` (> 1; None: off) is verl's dual clip on negative advantages;
    ``log_ratio_clamp`` (None: off) bounds the log-ratio before ``exp`` (verl: 20).
    """
    import torch

    shapes = [logprobs.shape, behaviour_logprobs.shape, advantages.shape, mask.shape]
    shapes += [t.shape for t in (weights, negative_advantages) if t is not None]
    if any(s != shapes[0] for s in shapes):
        raise ValueError(f"shapes differ: {[tuple(s) for s in shapes]}")
    if clip_low < 0 or clip_high < 0 or clip_low >= 1:
        raise ValueError(f"need 0 <= clip_low < 1 and clip_high >= 0, got {clip_low}, {clip_high}")
    if clip_ratio_c is not None and not clip_ratio_c > 1.0:
        raise ValueError(f"clip_ratio_c must be > 1 (dual clip) or None, got {clip_ratio_c}")
    if log_ratio_clamp is not None and not log_ratio_clamp > 0:
        raise ValueError(f"log_ratio_clamp must be > 0 or None, got {log_ratio_clamp}")
    m = mask.bool()
    zero = torch.zeros((), dtype=logprobs.dtype, device=logprobs.device)
    w = torch.where(m, torch.ones_like(logprobs) if weights is None else weights.to(logprobs.dtype), zero)
    if negative_advantages is None:
        a = torch.where(m, advantages.to(logprobs.dtype), zero)
        gain, penalty = a.clamp(min=0.0), a.clamp(max=0.0)
    else:
        gain = torch.where(m, advantages.to(logprobs.dtype), zero)
        penalty = torch.where(m, negative_advantages.to(logprobs.dtype), zero)
    denom = float(w.sum().item()) if num_tokens is None else float(num_tokens)
    denom = denom if denom > 0 else 1.0
    lp = torch.where(m, logprobs, zero)
    old = torch.where(m & ~torch.isnan(behaviour_logprobs), behaviour_logprobs, lp.detach())
    log_ratio = lp - old
    if log_ratio_clamp is not None:
        log_ratio = log_ratio.clamp(-log_ratio_clamp, log_ratio_clamp)
    ratio = log_ratio.exp()
    clipped = ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    up = torch.minimum(ratio, clipped)  # the A > 0 branch: -A min(r, clip r)
    down = torch.maximum(ratio, clipped)  # the A < 0 branch: -A max(r, clip r) = |A| max(r, clip r)
    if clip_ratio_c is not None:
        down_dual = torch.clamp(down, max=clip_ratio_c)
    else:
        down_dual = down
    per_token = -gain * up - penalty * down_dual
    pg = torch.where(m, per_token, zero).sum() / denom
    loss = pg
    kl_value = 0.0
    if ref_logprobs is not None:
        ref = torch.where(m, ref_logprobs, lp.detach())
        kl = torch.where(m, w * k3_kl(lp, ref), zero).sum() / denom
        kl_value = float(kl.detach())
        if kl_coef:
            loss = loss + kl_coef * kl
    with torch.no_grad():
        n = max(int(m.sum().item()), 1)
        was_clipped = (((gain > 0) & (ratio > clipped)) | ((penalty < 0) & (ratio < clipped))) & m
        dual = ((penalty < 0) & (down > down_dual)) & m
        stats = LossStats(
            loss=float(loss.detach()), policy_loss=float(pg.detach()), kl=kl_value,
            clip_fraction=float(was_clipped.sum().item()) / n,
            ratio_mean=float(torch.where(m, ratio, zero).sum().item()) / n,
            approx_kl_behaviour=float(torch.where(m, -log_ratio, zero).sum().item()) / n,
            tokens=int(m.sum().item()),
            dual_clip_fraction=float(dual.sum().item()) / n,
        )
    return loss, stats
