"""Synthetic rollout trees for the agent tests (no env, no model)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from trace_agent.tree import Node, RolloutTree

TreeFactory = Callable[..., RolloutTree]


def _turn(tree: RolloutTree, parent: Node, rid: int, rng: np.random.Generator, text: str) -> Node:
    n_gen = int(rng.integers(1, 6))
    return tree.add_turn(
        parent,
        rollout_id=rid,
        generated_ids=rng.integers(0, 1000, n_gen).tolist(),
        generated_logprobs=(-rng.random(n_gen) * 3).tolist(),
        observation_ids=rng.integers(0, 1000, int(rng.integers(0, 4))).tolist(),
        messages=[{"role": "assistant", "content": f"step {parent.depth + 1}: {text}"},
                  {"role": "tool", "content": f"observation {parent.depth + 1}"}],
        info={"turn": parent.depth + 1},
    )


def build_tree(
    *,
    prompt_id: str = "p0",
    prompt: str = "Solve the task.",
    rate: float = 0.5,
    roots: int = 4,
    depth: int = 3,
    continuations: int = 3,
    seed: int = 0,
    snapshot_factory: Callable[[], object] | None = None,
) -> RolloutTree:
    """``roots`` fresh rollouts of ``depth`` turns, then ``continuations`` replays from random prefixes.

    Each leaf succeeds with probability ``rate``.
    """
    rng = np.random.default_rng(seed)
    snap = snapshot_factory or (lambda: None)
    tree = RolloutTree(prompt_id=prompt_id, task_id=f"task-{prompt_id}",
                       messages=[{"role": "system", "content": "You are an agent."},
                                 {"role": "user", "content": prompt}],
                       snapshot=snap(), metadata={"env_id": "synthetic-v0"})

    def run(start: Node) -> None:
        rid = tree.start_rollout(start)
        node = start
        for _ in range(depth - start.depth):
            node = _turn(tree, node, rid, rng, f"r{rid}")
            node.snapshot = snap()
        tree.finish(node, float(rng.random() < rate))

    for _ in range(roots):
        run(tree.root)
    for _ in range(continuations):
        inner = [n for n in tree.nodes if not n.is_root and not n.is_leaf]
        if inner:
            run(inner[int(rng.integers(len(inner)))])
    return tree


@pytest.fixture
def make_tree() -> TreeFactory:
    return build_tree
