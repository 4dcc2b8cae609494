"""Rollout trees: save points, exact token ids per turn, snapshots, rewards, bottom-up targets.

A :class:`Node` is a save point: the prompt (the root) or the state after a
finished turn. It holds the exact token ids of the turn that led to it
(generated ids, with their behaviour log-probs, kept apart from the appended
observation ids; never decode -> re-encode), the chat messages that turn added,
an optional env snapshot handle (any object, e.g. a ``trace_envs`` Snapshot),
the predicted value and its children. A *leaf* is a finished episode and holds
its reward. Every non-root node belongs to exactly one rollout: a rollout
starts at some node (the root for a fresh rollout, a visited prefix for a
continuation) and adds one node per turn until its leaf.

Node ids are assigned in creation order, so a parent's id is always smaller
than its children's: the id order is a topological order, which the one bottom-up
walk (:func:`bottom_up_targets`: leaf means and counts; also the predictor's second
moments) relies on. :func:`path_token_ids` is the one reconstruction of a token path
from the recorded ids (the collector's contexts, the objectives' segment contexts).

Around the tree, one module each, imported from where they live: contexts for the predictor
(:mod:`trace_agent.contexts`: :data:`CONTEXT_SEPARATOR`, :func:`make_context`,
:func:`split_context`), statistics (:mod:`trace_agent.tree_stats`: :class:`TreeStats`,
:class:`BatchStats`, :func:`batch_stats`) and files (:mod:`trace_agent.tree_io`:
:func:`save_jsonl` writes one JSON object per tree, :func:`save_parquet` one row per
node; snapshots are dropped, everything else round-trips exactly). A tree also carries
what a re-render or an export needs: the env's ``tools`` (the JSON schemas the prompt
was rendered with) and the task's ``ground_truth`` (files written before these fields
existed load with ``()`` and None).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from trace_agent.budget import PAPER_CONTINUATION_COST
from trace_agent.contexts import format_messages, make_context
from trace_agent.errors import TreeError
from trace_agent.success import is_success
from trace_agent.tree_stats import TreeStats, tree_stats

__all__ = [
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "Node",
    "Rollout",
    "RolloutTree",
    "bottom_up_targets",
    "path_token_ids",
    "ground_truth_of",
]

#: Name and version of the JSONL / Parquet layout (a :meth:`RolloutTree.to_dict` record; files in
#: :mod:`trace_agent.tree_io`).
FORMAT_NAME = "trace-gym/rollout-tree"
FORMAT_VERSION = 1


Message = dict[str, Any]


#: Task data keys that hold a task's reference answer, in the order they are looked up.
_GROUND_TRUTH_KEYS = ("answer", "answers", "ground_truth", "target")


def ground_truth_of(task_data: Any) -> Any:
    """A task's reference answer from its ``data``: the first of ``answer`` (PythonMath), ``answers``
    (WikiQA), ``ground_truth`` (BFCL) or ``target`` that is present; None when there is none."""
    if not hasattr(task_data, "get"):
        return None
    for key in _GROUND_TRUTH_KEYS:
        value = task_data.get(key)
        if value is not None:
            return value
    return None


# --------------------------------------------------------------------------------------------------
# nodes and trees


@dataclass(eq=False)
class Node:
    """A save point. Build nodes through :class:`RolloutTree`, not directly.

    Attributes:
        node_id: index in ``tree.nodes`` (creation order; parents before children).
        depth: turns from the prompt (root 0).
        parent: the parent node (None for the root).
        children: child nodes in creation order.
        rollout_id: the rollout that generated this turn (-1 for the root).
        generated_ids: token ids the policy generated in this turn, exactly as sampled.
        generated_logprobs: behaviour log-probs of ``generated_ids`` (None: not recorded).
        observation_ids: token ids appended after the generation (tool result, chat
            template glue), exactly as fed to the policy.
        messages: chat messages this node added (root: the prompt messages).
        snapshot: env state handle after this turn (optional, never serialised).
        value: the predicted success probability used for allocation (None: not scored).
        reward: the episode's reward if this node ends it (a leaf), else None.
        info: JSON-serialisable extras (env info, timing, ...).
    """

    node_id: int
    depth: int
    parent: Node | None = field(default=None, repr=False)
    children: list[Node] = field(default_factory=list, repr=False)
    rollout_id: int = -1
    generated_ids: list[int] = field(default_factory=list, repr=False)
    generated_logprobs: list[float] | None = field(default=None, repr=False)
    observation_ids: list[int] = field(default_factory=list, repr=False)
    messages: list[Message] = field(default_factory=list, repr=False)
    snapshot: Any = field(default=None, repr=False)
    value: float | None = None
    reward: float | None = None
    info: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def is_root(self) -> bool:
        return self.parent is None

    @property
    def is_leaf(self) -> bool:
        """True when this node ends an episode (it holds a reward)."""
        return self.reward is not None

    @property
    def is_success(self) -> bool:
        """True for a leaf whose reward is a success (:func:`trace_agent.success.is_success`)."""
        return is_success(self.reward)

    def path(self) -> list[Node]:
        """The nodes from the root down to this node, both included."""
        out: list[Node] = []
        node: Node | None = self
        while node is not None:
            out.append(node)
            node = node.parent
        return out[::-1]

    def subtree(self) -> Iterator[Node]:
        """This node and everything below it, depth first in creation order."""
        stack = [self]
        while stack:
            node = stack.pop()
            yield node
            stack.extend(reversed(node.children))

    def leaves(self) -> list[Node]:
        """The leaves at or below this node."""
        return [n for n in self.subtree() if n.is_leaf]

    def history(self) -> list[Message]:
        """The messages added after the prompt, from the root's first child down to this node."""
        return [m for n in self.path()[1:] for m in n.messages]


@dataclass(frozen=True, kw_only=True)
class Rollout:
    """One rollout of a tree: where it started and what it cost.

    ``start_depth == 0`` is a fresh rollout from the prompt; otherwise a continuation.
    ``turns`` is the number of nodes (= env steps) it generated and ``end_depth`` its leaf's
    depth (or its deepest node while unfinished).
    """

    rollout_id: int
    start_node: int
    start_depth: int
    turns: int
    end_depth: int
    leaf: int | None
    generated_tokens: int
    observation_tokens: int


def bottom_up_targets(
    parent_ids: Sequence[int], rewards: Sequence[float | None]
) -> tuple[NDArray[np.float64], NDArray[np.int64]]:
    """Mean leaf reward below each node and the number of leaves below it.

    ``parent_ids[i]`` is node i's parent (-1 for the root) and must be < i; ``rewards[i]``
    is the reward of a leaf, None for other nodes. Nodes with no finished leaf below get
    target NaN and count 0. A pure function of its inputs, O(#nodes).
    """
    n = len(parent_ids)
    sums = np.zeros(n)
    counts = np.zeros(n, dtype=np.int64)
    for i, r in enumerate(rewards):
        if r is not None:
            sums[i] = float(r)
            counts[i] = 1
    for i in range(n - 1, 0, -1):
        p = parent_ids[i]
        if not 0 <= p < i:
            raise TreeError(f"node {i} has parent {p}; parents must come before their children")
        sums[p] += sums[i]
        counts[p] += counts[i]
    with np.errstate(invalid="ignore", divide="ignore"):
        targets = np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)
    return targets, counts


def path_token_ids(node: Node | None, *, prompt_ids: Sequence[int] | None = None) -> list[int]:
    """Every token id from the prompt through the end of ``node``'s turn (generated + appended ids).

    The root contributes its ``observation_ids`` (the rendered prompt), or ``prompt_ids``
    when given; every later node its generated ids, then its observation ids. ``None``
    (the parent of the root) gives ``[]``. This is exactly the context the policy
    continued from after ``node`` (the ids are recorded, never re-encoded).
    """
    ids: list[int] = []
    for n in node.path() if node is not None else ():
        if n.is_root and prompt_ids is not None:
            ids.extend(int(t) for t in prompt_ids)
        else:
            ids.extend(n.generated_ids)
            ids.extend(n.observation_ids)
    return ids


class RolloutTree:
    """The tree of rollouts for one prompt.

    Build it with :meth:`start_rollout` (returns a rollout id, from the root or from a
    visited prefix), :meth:`add_turn` (one node per finished turn) and :meth:`finish`
    (sets the leaf reward). Read it with :meth:`targets`, :meth:`stats`, :meth:`rollouts`,
    :meth:`context`, :meth:`render`.

    Args:
        prompt_id: id of the candidate prompt (unique within a batch).
        task_id: the env task id (defaults to ``prompt_id``).
        messages: the prompt's chat messages (system + user ...), stored on the root.
        prompt_ids: the rendered prompt's token ids, stored as the root's ``observation_ids``
            (so concatenating ``generated_ids + observation_ids`` along a path gives the exact
            token context of its last node).
        snapshot: env state after ``reset`` (optional).
        value: predicted success rate of the prompt (optional).
        metadata: JSON-serialisable tree-level extras (env id, step, ...).
        tools: the env's tool schemas the prompt was rendered with (``env.tools``).
        ground_truth: the task's reference answer (JSON-serialisable; see :func:`ground_truth_of`).
    """

    def __init__(
        self,
        *,
        prompt_id: str,
        task_id: str | None = None,
        messages: Sequence[Message] = (),
        prompt_ids: Sequence[int] = (),
        snapshot: Any = None,
        value: float | None = None,
        metadata: dict[str, Any] | None = None,
        tools: Sequence[dict[str, Any]] = (),
        ground_truth: Any = None,
    ) -> None:
        self.prompt_id = str(prompt_id)
        self.tools: list[dict[str, Any]] = [dict(t) for t in tools]
        self.ground_truth = ground_truth
        self.task_id = self.prompt_id if task_id is None else str(task_id)
        self.metadata: dict[str, Any] = dict(metadata or {})
        self.root = Node(node_id=0, depth=0, messages=[dict(m) for m in messages], snapshot=snapshot,
                         observation_ids=[int(t) for t in prompt_ids], value=_check_value(value))
        self.nodes: list[Node] = [self.root]
        self._rollout_starts: list[int] = []
        self._rollout_tips: list[int] = []

    # ---------------------------------------------------------------- building

    def start_rollout(self, start: Node | None = None) -> int:
        """Open a rollout from ``start`` (default: the root); returns its id for :meth:`add_turn`."""
        node = self.root if start is None else self._own(start)
        if node.is_leaf:
            raise TreeError(f"node {node.node_id} ends an episode; a rollout cannot continue from it")
        self._rollout_starts.append(node.node_id)
        self._rollout_tips.append(node.node_id)
        return len(self._rollout_starts) - 1

    def add_turn(
        self,
        parent: Node,
        *,
        rollout_id: int,
        generated_ids: Sequence[int],
        generated_logprobs: Sequence[float] | None = None,
        observation_ids: Sequence[int] = (),
        messages: Sequence[Message] = (),
        snapshot: Any = None,
        value: float | None = None,
        info: dict[str, Any] | None = None,
    ) -> Node:
        """Add the save point after one finished turn of rollout ``rollout_id`` below ``parent``.

        ``parent`` must be the rollout's start node (first turn) or its latest node.
        ``generated_logprobs``, when given, must have one entry per generated id.
        """
        parent = self._own(parent)
        if not 0 <= rollout_id < len(self._rollout_starts):
            raise TreeError(f"unknown rollout id {rollout_id}; open one with start_rollout()")
        if parent.is_leaf:
            raise TreeError(f"node {parent.node_id} ends an episode; it cannot get children")
        expected = self._rollout_tips[rollout_id]
        if parent.node_id != expected:
            raise TreeError(
                f"rollout {rollout_id} is at node {expected}; its next turn cannot hang below node {parent.node_id}"
            )
        gen = [int(t) for t in generated_ids]
        logp = None if generated_logprobs is None else [float(x) for x in generated_logprobs]
        if logp is not None and len(logp) != len(gen):
            raise TreeError(f"{len(logp)} log-probs for {len(gen)} generated tokens")
        node = Node(
            node_id=len(self.nodes), depth=parent.depth + 1, parent=parent, rollout_id=rollout_id,
            generated_ids=gen, generated_logprobs=logp, observation_ids=[int(t) for t in observation_ids],
            messages=[dict(m) for m in messages], snapshot=snapshot, value=_check_value(value),
            info=dict(info or {}),
        )
        parent.children.append(node)
        self.nodes.append(node)
        self._rollout_tips[rollout_id] = node.node_id
        return node

    def set_value(self, node: Node, value: float | None) -> None:
        """Record ``node``'s predicted success probability (in [0, 1], or None), the one way a value is written.

        The constructor and :meth:`add_turn` store theirs through the same check; scoring
        (:func:`trace_agent.predictor.score_nodes`) calls this. Raises :class:`TreeError` for a
        value outside [0, 1] (NaN included) or a node of another tree.
        """
        self._own(node).value = _check_value(value)

    def finish(self, node: Node, reward: float) -> None:
        """Mark ``node`` as the end of its episode with ``reward`` (it becomes a leaf)."""
        node = self._own(node)
        if node.is_root:
            raise TreeError("the root is the prompt; an episode ends after at least one turn")
        if node.children:
            raise TreeError(f"node {node.node_id} has children; only a childless node can end an episode")
        if node.reward is not None:
            raise TreeError(f"node {node.node_id} already holds reward {node.reward}")
        r = float(reward)
        if not math.isfinite(r):
            raise TreeError(f"reward must be finite, got {reward}")
        node.reward = r

    def release_snapshots(self) -> int:
        """Release (``snapshot.release()`` when it exists) and drop every snapshot; returns how many."""
        n = 0
        for node in self.nodes:
            if node.snapshot is not None:
                release = getattr(node.snapshot, "release", None)
                if callable(release):
                    release()
                node.snapshot = None
                n += 1
        return n

    def _own(self, node: Node) -> Node:
        if not (0 <= node.node_id < len(self.nodes) and self.nodes[node.node_id] is node):
            raise TreeError(f"node {node.node_id} does not belong to tree {self.prompt_id!r}")
        return node

    # ---------------------------------------------------------------- reading

    @property
    def rollout_count(self) -> int:
        return len(self._rollout_starts)

    def leaves(self) -> list[Node]:
        """All finished leaves, in creation order."""
        return [n for n in self.nodes if n.is_leaf]

    def parent_ids(self) -> list[int]:
        """Each node's parent id (-1 for the root), indexed by node id (parents come first)."""
        return [-1 if n.parent is None else n.parent.node_id for n in self.nodes]

    def targets(self) -> tuple[NDArray[np.float64], NDArray[np.int64]]:
        """(mean leaf reward below each node, leaf count below each node), indexed by node id."""
        return bottom_up_targets(self.parent_ids(), [n.reward for n in self.nodes])

    def target(self, node: Node) -> float:
        """Mean reward of the leaves below ``node`` (NaN if none)."""
        leaves = self._own(node).leaves()
        return float(np.mean([leaf.reward for leaf in leaves])) if leaves else math.nan

    def outcome_counts(self, node: Node | None = None) -> tuple[int, int]:
        """(successes, failures) among the leaves at or below ``node`` (default: the root)."""
        leaves = (self.root if node is None else self._own(node)).leaves()
        s = sum(1 for leaf in leaves if leaf.is_success)
        return s, len(leaves) - s

    def is_mixed(self, node: Node | None = None) -> bool:
        """True when the leaves below ``node`` (default: the root) hold a success and a failure."""
        s, f = self.outcome_counts(node)
        return s > 0 and f > 0

    def contrast_pairs(self, node: Node | None = None) -> int:
        """Number of (success, failure) leaf pairs below ``node`` (default: the root)."""
        s, f = self.outcome_counts(node)
        return s * f

    def rollouts(self) -> list[Rollout]:
        """Every rollout with its start, length, leaf and token counts."""
        per: dict[int, list[Node]] = {i: [] for i in range(len(self._rollout_starts))}
        for node in self.nodes[1:]:
            per[node.rollout_id].append(node)
        out = []
        for rid, start in enumerate(self._rollout_starts):
            own = per[rid]
            leaf = next((n.node_id for n in own if n.is_leaf), None)
            out.append(Rollout(
                rollout_id=rid, start_node=start, start_depth=self.nodes[start].depth, turns=len(own),
                end_depth=max((n.depth for n in own), default=self.nodes[start].depth), leaf=leaf,
                generated_tokens=sum(len(n.generated_ids) for n in own),
                observation_tokens=sum(len(n.observation_ids) for n in own),
            ))
        return out

    def branch_points(self) -> list[Node]:
        """Nodes with two or more children."""
        return [n for n in self.nodes if len(n.children) >= 2]

    def context(self, node: Node | None = None) -> str:
        """The predictor's context for ``node`` (default: the root): prompt + separator + history."""
        node = self.root if node is None else self._own(node)
        return make_context(format_messages(self.root.messages), format_messages(node.history()))

    def stats(self, *, continuation_cost: float = PAPER_CONTINUATION_COST) -> TreeStats:
        """Counts, outcome mix, contrast pairs, branch-point depth histogram and costs of this tree.

        ``paper_units`` charges 1 per rollout from the root and ``continuation_cost`` per
        continuation (:func:`~trace_agent.budget.spent_units`).
        """
        return tree_stats(self, continuation_cost=continuation_cost)

    def render(self, *, show_text: int = 0) -> str:
        """A text drawing of the tree: one line per node with tokens, v-hat, target and outcome.

        ``show_text`` > 0 appends the first that many characters of each node's last message.
        """
        targets, counts = self.targets()
        s, f = self.outcome_counts()
        lines = [f"RolloutTree {self.prompt_id!r} (task {self.task_id!r}): {len(self.nodes)} nodes, "
                 f"{s + f} leaves ({s} ok / {f} fail){' mixed' if s and f else ''}"]

        def label(n: Node) -> str:
            head = "prompt" if n.is_root else f"t{n.depth} r{n.rollout_id} gen={len(n.generated_ids)} obs={len(n.observation_ids)}"
            parts = [f"[{n.node_id}] {head}"]
            if n.value is not None:
                parts.append(f"v^={n.value:.2f}")
            if n.is_leaf:
                parts.append(("OK " if n.is_success else "FAIL ") + f"reward={n.reward:g}")
            elif counts[n.node_id]:
                parts.append(f"target={targets[n.node_id]:.2f}/{counts[n.node_id]}")
            if show_text and n.messages:
                text = str(n.messages[-1].get("content", "")).replace("\n", " ")
                parts.append(repr(text[:show_text]))
            return "  ".join(parts)

        def walk(n: Node, prefix: str, last: bool) -> None:
            for i, child in enumerate(n.children):
                is_last = i == len(n.children) - 1
                lines.append(prefix + ("└─ " if is_last else "├─ ") + label(child))
                walk(child, prefix + ("   " if is_last else "│  "), is_last)

        lines.append(label(self.root))
        walk(self.root, "", True)
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"RolloutTree(prompt_id={self.prompt_id!r}, nodes={len(self.nodes)}, leaves={len(self.leaves())})"

    # ---------------------------------------------------------------- (de)serialisation

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dict of the tree (snapshots dropped)."""
        return {
            "format": FORMAT_NAME,
            "version": FORMAT_VERSION,
            "prompt_id": self.prompt_id,
            "task_id": self.task_id,
            "metadata": self.metadata,
            "tools": self.tools,
            "ground_truth": self.ground_truth,
            "rollout_starts": list(self._rollout_starts),
            "nodes": [_node_dict(n) for n in self.nodes],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RolloutTree:
        """Rebuild a tree written by :meth:`to_dict` (validates the format and the structure)."""
        if data.get("format") != FORMAT_NAME or data.get("version") != FORMAT_VERSION:
            raise TreeError(f"not a {FORMAT_NAME} v{FORMAT_VERSION} record: {data.get('format')!r} "
                            f"v{data.get('version')!r}")
        nodes = data["nodes"]
        if not nodes or nodes[0]["parent_id"] is not None:
            raise TreeError("a tree record needs its root first")
        tree = cls(prompt_id=data["prompt_id"], task_id=data["task_id"], messages=nodes[0]["messages"],
                   prompt_ids=nodes[0].get("observation_ids") or (), value=nodes[0]["value"],
                   metadata=data.get("metadata") or {}, tools=data.get("tools") or (),
                   ground_truth=data.get("ground_truth"))
        tree.root.info = dict(nodes[0].get("info") or {})
        tree._rollout_starts = [int(x) for x in data["rollout_starts"]]
        tree._rollout_tips = list(tree._rollout_starts)
        if any(not 0 <= s < len(nodes) for s in tree._rollout_starts):
            raise TreeError("a rollout starts at a node the record does not hold")
        for i, rec in enumerate(nodes[1:], start=1):
            if rec["node_id"] != i:
                raise TreeError(f"node records out of order: expected id {i}, got {rec['node_id']}")
            parent = tree.nodes[int(rec["parent_id"])]
            node = tree.add_turn(
                parent, rollout_id=int(rec["rollout_id"]), generated_ids=rec["generated_ids"],
                generated_logprobs=rec["generated_logprobs"], observation_ids=rec["observation_ids"],
                messages=rec["messages"], value=rec["value"], info=rec.get("info") or {},
            )
            if rec.get("depth", node.depth) != node.depth:
                raise TreeError(f"node {i} records depth {rec['depth']} but sits at depth {node.depth}")
            if rec["reward"] is not None:
                tree.finish(node, rec["reward"])
        return tree


def _check_value(value: float | None) -> float | None:
    if value is None:
        return None
    v = float(value)
    if not 0.0 <= v <= 1.0:
        raise TreeError(f"a predicted value must be in [0, 1], got {value}")
    return v


def _node_dict(n: Node) -> dict[str, Any]:
    return {
        "node_id": n.node_id,
        "parent_id": None if n.parent is None else n.parent.node_id,
        "depth": n.depth,
        "rollout_id": n.rollout_id,
        "generated_ids": n.generated_ids,
        "generated_logprobs": n.generated_logprobs,
        "observation_ids": n.observation_ids,
        "messages": n.messages,
        "value": n.value,
        "reward": n.reward,
        "info": n.info,
    }
