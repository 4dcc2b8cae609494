"""verl rows from rollout trees: ``trace-gym export --format verl``, one row per finished leaf.

A row is verl's agent-loop output as it is: ``AgentLoopOutput(**row)`` builds it (verl 0.9.1,
``verl.experimental.agent_loop.agent_loop``), and what verl's fields have no place for
travels in its ``extra_fields``, which verl's post-processing turns into ``non_tensor_batch``
columns of the batch (one per key).

``prompt_ids``
    the rendered prompt, the root's ids.
``response_ids``
    every turn's generated ids, then the observation ids appended after it, exactly as
    sampled and fed; the leaf's own appended ids (end-of-turn glue after the final
    generation) are not part of a response.
``response_mask``
    1 on generated tokens, 0 on observation tokens.
``response_logprobs``
    behaviour log-probs, 0 on observation tokens; None when a turn did not record them.
``reward_score``, ``num_turns``
    the leaf's reward; user, assistant and tool messages of the chat.
``metrics``
    verl's ``AgentLoopMetrics`` (a required field): trees record no timings, so its
    defaults, written out (0 seconds, ``num_preempted = -1``: not available).
``extra_fields``
    ``uid`` (the prompt id: verl's group key), ``data_source`` (the env id),
    ``reward_model = {"style": "rule", "ground_truth": ...}``, ``extra_info`` (task id,
    leaf node id, objective, assistant turns) and ``advantages``: per response token, 0
    where the mask is 0. Under ``grpo``/``tree-grpo`` the trajectory's own leaf advantage
    (:func:`trace_agent.objectives.grpo_leaf_advantages` /
    :func:`~trace_agent.objectives.tree_grpo_leaf_advantages`); under ``treerpo`` each turn's
    node advantage (:func:`~trace_agent.objectives.node_advantages`).

Shared turns. A turn shared by several leaves (a prefix that was continued from) follows
the objective's rule by default: under ``treerpo`` it is trained once (its own sample, in
the first trajectory through it; later ones carry it with mask 0 and advantage 0); under
``grpo``/``tree-grpo`` every trajectory is a full-path sample with its leaf's advantage
(``"per-leaf"``, as verl and the official Tree-GRPO code train it). ``shared="once"`` or
``"per-leaf"`` forces either (``once`` under GRPO uses the mean leaf advantage of the turn).
"""

from __future__ import annotations

from typing import Any

from trace_agent.errors import ExportError
from trace_agent.export_trl import trajectory_messages
from trace_agent.options import SHARED_TURNS, LoneChild, ObjectiveName, SharedTurns, either
from trace_agent.tree import RolloutTree

__all__ = ["NO_METRICS", "verl_rows"]

#: verl's ``AgentLoopMetrics`` defaults: what a row says when no timing was recorded.
NO_METRICS: dict[str, float | int] = {"generate_sequences": 0.0, "tool_calls": 0.0, "compute_score": 0.0,
                                      "num_preempted": -1}


def _advantages(tree: RolloutTree, objective: ObjectiveName, shared: SharedTurns, normalize_std: bool,
                lone_child: LoneChild | None) -> tuple[dict[int, float] | None, dict[int, float]]:
    """(leaf id -> advantage for per-leaf GRPO samples, else None; node id -> advantage)."""
    from trace_agent import objectives

    if objective != "treerpo" and shared == "per-leaf":
        leaf_fn = objectives.grpo_leaf_advantages if objective == "grpo" else objectives.tree_grpo_leaf_advantages
        return leaf_fn(tree), {}
    options: dict[str, Any] = {}
    if objective == "treerpo":
        options["normalize_std"] = normalize_std
        if lone_child is not None:
            options["lone_child"] = lone_child
    return None, objectives.node_advantages(tree, objective, **options)


def verl_rows(tree: RolloutTree, *, objective: ObjectiveName = "treerpo", shared: SharedTurns | None = None,
              normalize_std: bool = False, lone_child: LoneChild | None = None) -> list[dict[str, Any]]:
    """One ``AgentLoopOutput``-shaped row per finished leaf of ``tree`` (see the module docstring).

    ``shared`` None: the objective's rule (``once`` under treerpo, ``per-leaf`` otherwise).
    Raises :class:`ExportError` when the tree holds no prompt token ids.
    """
    rule: SharedTurns = shared or ("once" if objective == "treerpo" else "per-leaf")
    if rule not in SHARED_TURNS:
        raise ExportError(f"shared_turns must be {either(SHARED_TURNS)}, got {rule!r}")
    leaves = tree.leaves()
    if leaves and not tree.root.observation_ids:
        raise ExportError(f"tree {tree.prompt_id!r} holds no prompt token ids (root observation_ids): verl rows "
                          "need the trees the collector records (trace-gym train / bench)")
    per_leaf, advantages = _advantages(tree, objective, rule, normalize_std, lone_child)
    emitted: set[int] = set()
    rows = []
    for leaf in leaves:
        ids: list[int] = []
        mask: list[int] = []
        logprobs: list[float] | None = []
        adv: list[float] = []
        path = leaf.path()[1:]
        for node in path:
            train = rule == "per-leaf" or node.node_id not in emitted
            emitted.add(node.node_id)
            own = per_leaf[leaf.node_id] if per_leaf is not None else advantages.get(node.node_id, 0.0)
            a = own if train else 0.0
            ids += node.generated_ids
            mask += [1 if train else 0] * len(node.generated_ids)
            adv += [a] * len(node.generated_ids)
            if logprobs is not None:
                logprobs = None if node.generated_logprobs is None else logprobs + list(node.generated_logprobs)
            if node is not leaf:  # the leaf's appended ids are end-of-turn glue, not part of the response
                ids += node.observation_ids
                mask += [0] * len(node.observation_ids)
                adv += [0.0] * len(node.observation_ids)
                if logprobs is not None:
                    logprobs += [0.0] * len(node.observation_ids)
        messages = trajectory_messages(tree, leaf)
        rows.append({
            "prompt_ids": list(tree.root.observation_ids), "response_ids": ids, "response_mask": mask,
            "response_logprobs": logprobs, "reward_score": float(leaf.reward),  # type: ignore[arg-type]
            "num_turns": sum(1 for m in messages if m.get("role") != "system"),
            "metrics": dict(NO_METRICS),
            "extra_fields": {
                "uid": tree.prompt_id, "data_source": str(tree.metadata.get("env_id", "")),
                "reward_model": {"style": "rule", "ground_truth": tree.ground_truth},
                "extra_info": {"task_id": tree.task_id, "leaf_node_id": leaf.node_id, "objective": objective,
                               "num_assistant_turns": len(path)},
                "advantages": adv,
            },
        })
    return rows
