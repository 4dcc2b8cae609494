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
than its children's: the id order is a topological order, which the bottom-up
computations rely on.

Contexts. The predictor reads a *context*: the serialised prompt plus the
interaction history up to a node, joined by :data:`CONTEXT_SEPARATOR` so a
reader can split them and truncate the history but never the prompt
(:func:`make_context` / :func:`split_context`).

Storage. :func:`save_jsonl` writes one JSON object per tree; :func:`save_parquet`
writes one row per node (tree-level fields repeated). Snapshots are dropped in
both; everything else round-trips exactly. A tree also carries what a re-render
or an export needs: the env's ``tools`` (the JSON schemas the prompt was rendered
with) and the task's ``ground_truth`` (files written before these fields existed
load with ``()`` and None).
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from trace_agent.errors import TreeError

__all__ = [
    "CONTEXT_SEPARATOR",
    "SUCCESS_THRESHOLD",
    "FORMAT_VERSION",
    "Node",
    "Rollout",
    "RolloutTree",
    "TreeStats",
    "BatchStats",
    "TreeError",
    "bottom_up_targets",
    "batch_stats",
    "format_messages",
    "make_context",
    "split_context",
    "ground_truth_of",
    "save_jsonl",
    "load_jsonl",
    "save_parquet",
    "load_parquet",
]

#: Joins the serialised prompt and the history in a context string.
CONTEXT_SEPARATOR = "\n<|trace-history|>\n"
#: A leaf with reward >= this is a success, below it a failure.
SUCCESS_THRESHOLD = 0.5
#: Version of the JSONL / Parquet layout.
FORMAT_VERSION = 1
_FORMAT_NAME = "trace-gym/rollout-tree"

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
# contexts


def format_messages(messages: Sequence[Message]) -> str:
    """Serialise chat messages as ``<|role|>\\ncontent`` blocks (non-text content as JSON).

    Extra keys (``tool_calls``, ``name``, ...) are appended as a JSON line so nothing a
    message carries is lost to the predictor.
    """
    parts = []
    for msg in messages:
        role = str(msg.get("role", "unknown"))
        content = msg.get("content", "")
        text = content if isinstance(content, str) else json.dumps(content, sort_keys=True, default=str)
        extra = {k: v for k, v in msg.items() if k not in ("role", "content")}
        if extra:
            text = f"{text}\n{json.dumps(extra, sort_keys=True, default=str)}"
        parts.append(f"<|{role}|>\n{text}")
    return "\n".join(parts)


def make_context(prompt: str, history: str = "") -> str:
    """The context string for a node: ``prompt + CONTEXT_SEPARATOR + history``.

    The prompt must not contain the separator (it would make the split ambiguous).
    """
    if CONTEXT_SEPARATOR in prompt:
        raise ValueError("the prompt text contains CONTEXT_SEPARATOR; it cannot be split back")
    return f"{prompt}{CONTEXT_SEPARATOR}{history}"


def split_context(context: str) -> tuple[str, str]:
    """(prompt, history) of a context; a string without the separator is all prompt."""
    prompt, sep, history = context.partition(CONTEXT_SEPARATOR)
    return (prompt, history) if sep else (context, "")


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
        """True for a leaf whose reward is >= SUCCESS_THRESHOLD."""
        return self.reward is not None and self.reward >= SUCCESS_THRESHOLD

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


@dataclass(frozen=True, kw_only=True)
class TreeStats:
    """Per-tree statistics (see :meth:`RolloutTree.stats`)."""

    prompt_id: str
    nodes: int
    leaves: int
    successes: int
    failures: int
    mixed: bool
    contrast_pairs: int
    root_rollouts: int
    continuations: int
    max_depth: int
    branch_depths: dict[int, int]
    continuation_depths: dict[int, int]
    generated_tokens: int
    observation_tokens: int
    env_steps: int
    paper_units: float


@dataclass(frozen=True, kw_only=True)
class BatchStats:
    """Per-batch statistics (see :func:`batch_stats`).

    ``effective_ratio`` = mixed trees / active prompts (trees with at least one leaf),
    NaN when no prompt is active.
    """

    trees: int
    active_prompts: int
    mixed_trees: int
    effective_ratio: float
    contrast_pairs: int
    leaves: int
    successes: int
    root_rollouts: int
    continuations: int
    branch_depths: dict[int, int]
    continuation_depths: dict[int, int]
    generated_tokens: int
    observation_tokens: int
    env_steps: int
    paper_units: float

    def as_dict(self) -> dict[str, float]:
        """Flat scalar metrics (histograms as ``branch_depth_<d>`` / ``continuation_depth_<d>``)."""
        out: dict[str, float] = {}
        for name in (
            "trees", "active_prompts", "mixed_trees", "effective_ratio", "contrast_pairs", "leaves",
            "successes", "root_rollouts", "continuations", "generated_tokens", "observation_tokens",
            "env_steps", "paper_units",
        ):
            out[name] = float(getattr(self, name))
        out.update({f"branch_depth_{d}": float(c) for d, c in sorted(self.branch_depths.items())})
        out.update({f"continuation_depth_{d}": float(c) for d, c in sorted(self.continuation_depths.items())})
        return out


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

    def targets(self) -> tuple[NDArray[np.float64], NDArray[np.int64]]:
        """(mean leaf reward below each node, leaf count below each node), indexed by node id."""
        parents = [-1 if n.parent is None else n.parent.node_id for n in self.nodes]
        return bottom_up_targets(parents, [n.reward for n in self.nodes])

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

    def stats(self, *, continuation_cost: float = 0.5) -> TreeStats:
        """Counts, outcome mix, contrast pairs, branch-point depth histogram and costs of this tree.

        ``paper_units`` charges 1 per rollout from the root and ``continuation_cost`` per
        continuation (use :class:`~trace_agent.allocation.BudgetAccount` for other rules).
        """
        s, f = self.outcome_counts()
        rollouts = self.rollouts()
        roots = sum(1 for r in rollouts if r.start_depth == 0)
        conts = len(rollouts) - roots
        return TreeStats(
            prompt_id=self.prompt_id, nodes=len(self.nodes), leaves=s + f, successes=s, failures=f,
            mixed=s > 0 and f > 0, contrast_pairs=s * f, root_rollouts=roots, continuations=conts,
            max_depth=max(n.depth for n in self.nodes),
            branch_depths=dict(sorted(Counter(n.depth for n in self.branch_points()).items())),
            continuation_depths=dict(sorted(Counter(r.start_depth for r in rollouts if r.start_depth > 0).items())),
            generated_tokens=sum(r.generated_tokens for r in rollouts),
            observation_tokens=sum(r.observation_tokens for r in rollouts),
            env_steps=len(self.nodes) - 1, paper_units=roots + continuation_cost * conts,
        )

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
            "format": _FORMAT_NAME,
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
        if data.get("format") != _FORMAT_NAME or data.get("version") != FORMAT_VERSION:
            raise TreeError(f"not a {_FORMAT_NAME} v{FORMAT_VERSION} record: {data.get('format')!r} "
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


def batch_stats(trees: Iterable[RolloutTree], *, continuation_cost: float = 0.5) -> BatchStats:
    """Batch statistics: effective ratio (mixed trees / active prompts), contrast pairs, depth histograms, costs."""
    per = [t.stats(continuation_cost=continuation_cost) for t in trees]
    active = sum(1 for s in per if s.leaves > 0)
    mixed = sum(1 for s in per if s.mixed)
    branch: Counter[int] = Counter()
    cont: Counter[int] = Counter()
    for s in per:
        branch.update(s.branch_depths)
        cont.update(s.continuation_depths)
    return BatchStats(
        trees=len(per), active_prompts=active, mixed_trees=mixed,
        effective_ratio=mixed / active if active else math.nan,
        contrast_pairs=sum(s.contrast_pairs for s in per), leaves=sum(s.leaves for s in per),
        successes=sum(s.successes for s in per), root_rollouts=sum(s.root_rollouts for s in per),
        continuations=sum(s.continuations for s in per), branch_depths=dict(sorted(branch.items())),
        continuation_depths=dict(sorted(cont.items())),
        generated_tokens=sum(s.generated_tokens for s in per),
        observation_tokens=sum(s.observation_tokens for s in per),
        env_steps=sum(s.env_steps for s in per), paper_units=sum(s.paper_units for s in per),
    )


# --------------------------------------------------------------------------------------------------
# files


def save_jsonl(trees: Iterable[RolloutTree], path: str | Path) -> Path:
    """Write one JSON object per tree (snapshots dropped); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as fh:
        for tree in trees:
            fh.write(json.dumps(tree.to_dict(), ensure_ascii=False, allow_nan=False))
            fh.write("\n")
    return path


def load_jsonl(path: str | Path) -> list[RolloutTree]:
    """Read trees written by :func:`save_jsonl`."""
    with Path(path).open(encoding="utf-8") as fh:
        return [RolloutTree.from_dict(json.loads(line)) for line in fh if line.strip()]


_PARQUET_COLUMNS = (
    "tree_index", "prompt_id", "task_id", "tree_metadata", "rollout_starts", "node_id", "parent_id", "depth",
    "rollout_id", "generated_ids", "generated_logprobs", "observation_ids", "messages", "value", "reward", "info",
    "tools", "ground_truth",
)


def save_parquet(trees: Iterable[RolloutTree], path: str | Path) -> Path:
    """Write one row per node (tree fields repeated; messages, info, metadata as JSON text).

    Columns: tree_index, prompt_id, task_id, tree_metadata, rollout_starts, node_id,
    parent_id, depth, rollout_id, generated_ids (list<int64>), generated_logprobs
    (list<float64>, null when not recorded), observation_ids, messages, value, reward, info,
    tools and ground_truth (JSON text, tree-level, repeated).
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    cols: dict[str, list[Any]] = {c: [] for c in _PARQUET_COLUMNS}
    for t_index, tree in enumerate(trees):
        meta = json.dumps(tree.metadata, sort_keys=True, allow_nan=False)
        tools = json.dumps(tree.tools, ensure_ascii=False, allow_nan=False)
        truth = json.dumps(tree.ground_truth, ensure_ascii=False, allow_nan=False)
        for n in tree.nodes:
            rec = _node_dict(n)
            cols["tree_index"].append(t_index)
            cols["prompt_id"].append(tree.prompt_id)
            cols["task_id"].append(tree.task_id)
            cols["tree_metadata"].append(meta)
            cols["rollout_starts"].append(tree._rollout_starts if n.is_root else None)
            for key in ("node_id", "parent_id", "depth", "rollout_id", "generated_ids", "generated_logprobs",
                        "observation_ids", "value", "reward"):
                cols[key].append(rec[key])
            cols["messages"].append(json.dumps(n.messages, ensure_ascii=False, allow_nan=False))
            cols["info"].append(json.dumps(n.info, ensure_ascii=False, allow_nan=False))
            cols["tools"].append(tools)
            cols["ground_truth"].append(truth)
    schema = pa.schema([
        ("tree_index", pa.int64()), ("prompt_id", pa.string()), ("task_id", pa.string()),
        ("tree_metadata", pa.string()), ("rollout_starts", pa.list_(pa.int64())), ("node_id", pa.int64()),
        ("parent_id", pa.int64()), ("depth", pa.int64()), ("rollout_id", pa.int64()),
        ("generated_ids", pa.list_(pa.int64())), ("generated_logprobs", pa.list_(pa.float64())),
        ("observation_ids", pa.list_(pa.int64())), ("messages", pa.string()), ("value", pa.float64()),
        ("reward", pa.float64()), ("info", pa.string()), ("tools", pa.string()), ("ground_truth", pa.string()),
    ])
    table = pa.table(cols, schema=schema).replace_schema_metadata(
        {"format": _FORMAT_NAME, "version": str(FORMAT_VERSION)}
    )
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path)
    return path


def load_parquet(path: str | Path) -> list[RolloutTree]:
    """Read trees written by :func:`save_parquet`."""
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    meta = table.schema.metadata or {}
    if meta.get(b"format") != _FORMAT_NAME.encode() or meta.get(b"version") != str(FORMAT_VERSION).encode():
        raise TreeError(f"{path} is not a {_FORMAT_NAME} v{FORMAT_VERSION} Parquet file")
    rows = table.to_pylist()
    grouped: dict[int, list[dict[str, Any]]] = {}
    for row in rows:
        grouped.setdefault(row["tree_index"], []).append(row)
    trees = []
    for t_index in sorted(grouped):
        recs = sorted(grouped[t_index], key=lambda r: r["node_id"])
        first = recs[0]
        nodes = []
        for r in recs:
            rec = {k: r[k] for k in ("node_id", "parent_id", "depth", "rollout_id", "generated_ids",
                                     "generated_logprobs", "observation_ids", "value", "reward")}
            rec["messages"] = json.loads(r["messages"])
            rec["info"] = json.loads(r["info"])
            nodes.append(rec)
        trees.append(RolloutTree.from_dict({
            "format": _FORMAT_NAME, "version": FORMAT_VERSION, "prompt_id": first["prompt_id"],
            "task_id": first["task_id"], "metadata": json.loads(first["tree_metadata"]),
            "rollout_starts": first["rollout_starts"] or [], "nodes": nodes,
            "tools": json.loads(first["tools"]) if first.get("tools") else [],
            "ground_truth": json.loads(first["ground_truth"]) if first.get("ground_truth") else None,
        }))
    return trees
