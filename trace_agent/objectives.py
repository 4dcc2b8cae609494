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

Loss, loss aggregation and packing
    :mod:`trace_agent.loss` (which imports this module, never the reverse): :func:`pack_segments`,
    :func:`loss_normalizer`, :func:`policy_loss`, with the formulas in its docstring.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from trace_agent.options import (
    LONE_CHILD,
    OBJECTIVES,
    SHARED_TURNS,
    SINGLETONS,
    LoneChild,
    ObjectiveName,
    SharedTurns,
    Singleton,
    either,
)
from trace_agent.tree import Node, RolloutTree, path_token_ids

__all__ = [
    "EPS",
    "Segment",
    "group_normalized",
    "grpo_leaf_advantages",
    "tree_grpo_leaf_advantages",
    "treerpo_node_advantages",
    "node_advantages",
    "node_samples",
    "node_context_ids",
    "tree_segments",
    "batch_segments",
]

#: The epsilon of every normalisation (docs/design.md, "Objectives"; verl's default).
EPS = 1e-6


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
    if singleton not in SINGLETONS:
        raise ValueError(f"singleton must be {either(SINGLETONS)}, got {singleton!r}")
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
    lone_child: LoneChild = "inherit",
    eps: float = EPS,
    ddof: int = 1,
) -> dict[int, float]:
    """TreeRPO: non-root node id -> r(c) - mean of r over its sibling group (optionally / (std + eps)).

    Siblings without a finished leaf below are not part of the group and get no advantage.
    ``ddof`` is the std's (``normalize_std`` only). See the module docstring for ``lone_child``.
    """
    if lone_child not in LONE_CHILD:
        raise ValueError(f"lone_child must be {either(LONE_CHILD)}, got {lone_child!r}")
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
    lone_child: LoneChild = "inherit",
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
    if shared_turns not in SHARED_TURNS:
        raise ValueError(f"shared_turns must be {either(SHARED_TURNS)}, got {shared_turns!r}")
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
    lone_child: LoneChild = "inherit",
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
    lone_child: LoneChild = "inherit",
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
    lone_child: LoneChild = "inherit",
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
