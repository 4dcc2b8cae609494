"""A rollout tree as flat leaf rows, and tree advantages recomputed from those rows.

Trainers built on flat sequences (verl, TRL) see one row per trajectory:
``prompt_ids`` and ``response_ids`` with a ``response_mask`` (1 on tokens the policy
generated, 0 on template and observation tokens) and the behaviour log-probs. A
rollout tree gives one such row per finished **leaf**: its prompt is the root's
rendered prompt, its response the exact ids along its path (each turn's generated
ids, then the ids appended after them), so shared prefixes repeat in every leaf
below them. Nothing is re-encoded: ``prompt_ids + response_ids`` is
:func:`~trace_agent.rollout.path_token_ids` of the leaf.

Tree keys. A row also carries its place in the tree, ``"<uid>/<n0>.<n1>...<leaf>"``
(:func:`tree_key`): the prompt's uid and the node ids from the root to the leaf.
From the keys, rewards and response masks of a batch alone,
:func:`rows_advantages` rebuilds each prompt's tree (the nodes that have a finished
leaf below, with their leaf rewards) and computes the advantages of
:mod:`trace_agent.objectives` on it, so a trainer that only hands an estimator
``(rewards, response_mask, index)`` (verl's advantage-estimator registry) still
trains exactly trace-gym's objective. Turn ``k`` of a leaf is the ``k``-th run of
ones in its response mask, which :func:`leaf_rows` guarantees (every turn
generated at least one token, and every turn but the last is followed by at least
one appended token).

Shared segments. A turn shared by ``c`` leaves appears in ``c`` rows.
``shared="repeat"`` (default) gives every copy the turn's advantage: each leaf is a
full-path sample, the convention of the official Tree-GRPO code
(github.com/AMAP-ML/Tree-GRPO). ``shared="split"`` gives each copy ``A / c``, so
the copies' summed policy-gradient numerator equals that of trace-gym's own
trainer, which trains a shared segment once (:func:`trace_agent.objectives.tree_segments`);
the token-mean denominator still counts every copy.

This module imports neither torch nor verl.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
from numpy.typing import NDArray

from trace_agent.errors import TreeRowError
from trace_agent.objectives import EPS, node_advantages
from trace_agent.options import LoneChild, ObjectiveName
from trace_agent.tree import Node, RolloutTree

__all__ = [
    "SharedSegments",
    "LeafRow",
    "TreeRowError",
    "leaf_rows",
    "tree_key",
    "parse_tree_key",
    "mask_runs",
    "token_advantages",
    "rows_advantages",
]

SharedSegments = Literal["repeat", "split"]
_KEY_SEPARATOR = "/"


@dataclass(frozen=True, kw_only=True)
class LeafRow:
    """One finished leaf of a tree as a flat trajectory.

    Attributes:
        prompt_id: the tree's prompt id.
        path: node ids from the root (0) down to the leaf.
        prompt_ids: the rendered prompt (the root's ``observation_ids``).
        response_ids: every id after the prompt along the path (generated + appended).
        response_mask: 1 per generated id, 0 per appended id.
        response_logprobs: the behaviour log-prob of each generated id, 0.0 elsewhere.
        reward: the leaf's reward.
        num_turns: assistant turns on the path (``len(path) - 1``).
        truncated: the response was cut to ``max_response_length``.
    """

    prompt_id: str
    path: tuple[int, ...]
    prompt_ids: tuple[int, ...]
    response_ids: tuple[int, ...]
    response_mask: tuple[int, ...]
    response_logprobs: tuple[float, ...]
    reward: float
    num_turns: int
    truncated: bool = False

    def __post_init__(self) -> None:
        n = len(self.response_ids)
        if len(self.response_mask) != n or len(self.response_logprobs) != n:
            raise TreeRowError(f"row {self.prompt_id}/{self.leaf_id}: {n} response ids, {len(self.response_mask)} "
                               f"mask entries, {len(self.response_logprobs)} log-probs")

    @property
    def leaf_id(self) -> int:
        return self.path[-1]

    def key(self, uid: str) -> str:
        """This row's :func:`tree_key` under the prompt uid ``uid``."""
        return tree_key(uid, self.path)


def tree_key(uid: str, path: Sequence[int]) -> str:
    """``"<uid>/<n0>.<n1>...<leaf>"``: a row's prompt uid and its node path (see the module docstring)."""
    if _KEY_SEPARATOR in uid:
        raise TreeRowError(f"a prompt uid must not contain {_KEY_SEPARATOR!r}, got {uid!r}")
    if len(path) < 2 or path[0] != 0 or any(int(a) >= int(b) for a, b in zip(path, path[1:])):
        raise TreeRowError(f"a leaf path starts at the root (0) and its node ids increase, got {list(path)}")
    return f"{uid}{_KEY_SEPARATOR}{'.'.join(str(int(n)) for n in path)}"


def parse_tree_key(key: str) -> tuple[str, tuple[int, ...]]:
    """Inverse of :func:`tree_key`; raises :class:`TreeRowError` on anything else (keys may be user data)."""
    uid, sep, tail = str(key).rpartition(_KEY_SEPARATOR)
    if not sep or not uid or not tail or len(tail) > 100_000:
        raise TreeRowError(f"not a tree key (\"<uid>/<node ids>\"): {str(key)[:200]!r}")
    parts = tail.split(".")
    if not all(p.isascii() and p.isdigit() and len(p) <= 12 for p in parts):
        raise TreeRowError(f"tree key {str(key)[:200]!r}: node ids must be decimal integers")
    path = tuple(int(p) for p in parts)
    tree_key(uid, path)  # validates the path
    return uid, path


def leaf_rows(tree: RolloutTree, *, max_response_length: int | None = None) -> list[LeafRow]:
    """One :class:`LeafRow` per finished leaf of ``tree``, in node-id order.

    ``max_response_length`` cuts longer responses (mask and log-probs with them) and
    marks the row ``truncated``. Raises :class:`TreeRowError` when the root holds no
    prompt ids, a turn has no generated ids or no behaviour log-probs, or a turn
    other than a leaf's last is followed by no appended ids (turns would merge in
    the response mask).
    """
    if max_response_length is not None and max_response_length < 1:
        raise TreeRowError(f"max_response_length must be >= 1, got {max_response_length}")
    if not tree.root.observation_ids:
        raise TreeRowError(f"tree {tree.prompt_id!r}: the root holds no prompt token ids")
    rows = []
    for leaf in tree.leaves():
        ids: list[int] = []
        mask: list[int] = []
        logps: list[float] = []
        path = leaf.path()
        for node in path[1:]:
            _check_turn(tree, node, last=node is leaf)
            ids += node.generated_ids
            mask += [1] * len(node.generated_ids)
            logps += [float(x) for x in node.generated_logprobs]  # type: ignore[union-attr]
            ids += node.observation_ids
            mask += [0] * len(node.observation_ids)
            logps += [0.0] * len(node.observation_ids)
        cut = max_response_length is not None and len(ids) > max_response_length
        if cut:
            ids, mask, logps = ids[:max_response_length], mask[:max_response_length], logps[:max_response_length]
        rows.append(LeafRow(
            prompt_id=tree.prompt_id, path=tuple(n.node_id for n in path), prompt_ids=tuple(tree.root.observation_ids),
            response_ids=tuple(ids), response_mask=tuple(mask), response_logprobs=tuple(logps),
            reward=float(leaf.reward), num_turns=len(path) - 1, truncated=cut,  # type: ignore[arg-type]
        ))
    return rows


def _check_turn(tree: RolloutTree, node: Node, *, last: bool) -> None:
    where = f"tree {tree.prompt_id!r}, node {node.node_id}"
    if not node.generated_ids:
        raise TreeRowError(f"{where}: a turn without generated ids cannot be a row segment")
    if node.generated_logprobs is None:
        raise TreeRowError(f"{where}: no behaviour log-probs recorded (the generation backend must return them)")
    if not last and not node.observation_ids:
        raise TreeRowError(f"{where}: no ids appended after a non-final turn, so it would merge with the next "
                           "turn in the response mask")


def mask_runs(mask: Sequence[int] | NDArray[np.integer]) -> list[tuple[int, int]]:
    """Half-open ``(start, stop)`` ranges of the runs of nonzero entries of ``mask``, in order."""
    m = np.asarray(mask).reshape(-1) != 0
    if m.size == 0:
        return []
    edges = np.flatnonzero(np.diff(np.concatenate([[False], m, [False]]).astype(np.int8)))
    return [(int(a), int(b)) for a, b in zip(edges[0::2], edges[1::2])]


def _fill(mask: Sequence[int] | NDArray[np.integer], path: Sequence[int], node_adv: Mapping[int, float],
          scale: Mapping[int, float]) -> NDArray[np.float64]:
    """Per-token advantages of one row: run k gets the advantage of ``path[k + 1]`` (0 where it has none)."""
    out = np.zeros(len(mask), dtype=np.float64)
    runs = mask_runs(mask)
    if len(runs) > len(path) - 1:
        raise TreeRowError(f"a response mask with {len(runs)} generated runs for a path of {len(path) - 1} turns")
    for (a, b), node_id in zip(runs, path[1:]):
        out[a:b] = node_adv.get(node_id, 0.0) * scale.get(node_id, 1.0)
    return out


def _scales(tree: RolloutTree, shared: SharedSegments) -> dict[int, float]:
    if shared not in ("repeat", "split"):
        raise TreeRowError(f"shared must be 'repeat' or 'split', got {shared!r}")
    if shared == "repeat":
        return {}
    _, counts = tree.targets()
    return {i: 1.0 / float(c) for i, c in enumerate(counts) if c > 0}


def token_advantages(
    tree: RolloutTree,
    objective: ObjectiveName,
    *,
    shared: SharedSegments = "repeat",
    normalize_std: bool = False,
    lone_child: LoneChild = "inherit",
    max_response_length: int | None = None,
    eps: float = EPS,
) -> list[NDArray[np.float64]]:
    """Per-response-token advantages of each of :func:`leaf_rows` ``(tree)``, straight from the tree."""
    adv = node_advantages(tree, objective, normalize_std=normalize_std, lone_child=lone_child, eps=eps)
    scale = _scales(tree, shared)
    return [_fill(row.response_mask, row.path, adv, scale)
            for row in leaf_rows(tree, max_response_length=max_response_length)]


def _rebuild(prompt_uid: str, members: Sequence[tuple[tuple[int, ...], float]]) -> tuple[RolloutTree, dict[int, int]]:
    """A tree with the nodes on ``members``' paths and their leaf rewards; returns it and original id -> new id."""
    parent_of: dict[int, int] = {}
    for path, _ in members:
        for parent, child in zip(path, path[1:]):
            if parent_of.setdefault(child, parent) != parent:
                raise TreeRowError(f"prompt {prompt_uid!r}: node {child} has two parents in the batch's tree keys")
    leaves = {path[-1]: reward for path, reward in members}
    if len(leaves) != len(members):
        raise TreeRowError(f"prompt {prompt_uid!r}: two rows end at the same leaf")
    tree = RolloutTree(prompt_id=prompt_uid)
    new: dict[int, Node] = {0: tree.root}
    for node_id in sorted(parent_of):
        parent = new[parent_of[node_id]]
        new[node_id] = tree.add_turn(parent, rollout_id=tree.start_rollout(parent), generated_ids=())
    for node_id, reward in leaves.items():
        if new[node_id].children:
            raise TreeRowError(f"prompt {prompt_uid!r}: leaf {node_id} has children")
        tree.finish(new[node_id], reward)
    return tree, {orig: node.node_id for orig, node in new.items()}


def rows_advantages(
    keys: Sequence[str],
    rewards: Sequence[float] | NDArray[np.floating],
    response_masks: Sequence[Sequence[int]] | NDArray[np.integer],
    objective: ObjectiveName,
    *,
    shared: SharedSegments = "repeat",
    normalize_std: bool = False,
    lone_child: LoneChild = "inherit",
    eps: float = EPS,
) -> list[NDArray[np.float64]]:
    """Per-token advantages of a batch of rows from their tree keys, rewards and masks alone.

    Rows are grouped by the uid of their :func:`tree_key`; each group's tree is rebuilt
    from its paths (see the module docstring) and scored with
    :func:`~trace_agent.objectives.node_advantages`. ``response_masks[i]`` may be
    right-padded with zeros. Returns one float array per row, the shape of its mask.
    Raises :class:`TreeRowError` on malformed keys or paths that do not form a tree.
    """
    if not (len(keys) == len(rewards) == len(response_masks)):
        raise TreeRowError(f"{len(keys)} keys, {len(rewards)} rewards, {len(response_masks)} masks")
    parsed = [parse_tree_key(k) for k in keys]
    groups: dict[str, list[int]] = {}
    for i, (uid, _) in enumerate(parsed):
        groups.setdefault(uid, []).append(i)
    out: list[NDArray[np.float64]] = [np.zeros(0)] * len(keys)
    for uid, rows in groups.items():
        reward_values = [float(rewards[i]) for i in rows]
        if not all(np.isfinite(reward_values)):
            raise TreeRowError(f"prompt {uid!r}: rewards must be finite")
        tree, new_id = _rebuild(uid, [(parsed[i][1], r) for i, r in zip(rows, reward_values)])
        adv = node_advantages(tree, objective, normalize_std=normalize_std, lone_child=lone_child, eps=eps)
        scale = _scales(tree, shared)
        by_orig = {orig: adv[n] for orig, n in new_id.items() if n in adv}
        scale_orig = {orig: scale[n] for orig, n in new_id.items() if n in scale}
        for i in rows:
            out[i] = _fill(response_masks[i], parsed[i][1], by_orig, scale_orig)
    return out
