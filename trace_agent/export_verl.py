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

A batch for verl's trainer. :func:`verl_batch` pads rows into verl's ``DataProto`` laid out as
verl's agent loop lays out its own (``AgentLoopWorker._postprocess``): ``prompts`` left-padded,
``responses`` right-padded, ``input_ids``/``attention_mask`` their concatenation,
``response_mask`` (generated tokens only), ``position_ids`` from the attention mask,
``rollout_log_probs`` when every row has them, ``rm_scores`` (the reward on the last response
token), plus ``advantages`` (the rows' per-token advantages, right-padded) so that verl's actor
update can train on them as they are; every ``extra_fields`` key but ``advantages`` becomes a
``non_tensor_batch`` column, with ``__num_turns__``.
"""

from __future__ import annotations

from typing import Any

from trace_agent.errors import ExportError
from trace_agent.export_trl import trajectory_messages
from trace_agent.options import SHARED_TURNS, LoneChild, ObjectiveName, SharedTurns, either
from trace_agent.tree import RolloutTree

__all__ = ["NO_METRICS", "verl_batch", "verl_rows"]

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


def verl_batch(rows: list[dict[str, Any]], *, prompt_length: int, response_length: int, pad_token_id: int = 0) -> Any:
    """verl's ``DataProto`` of ``rows`` (:func:`verl_rows` output, or the exported JSONL/Parquet read back).

    Laid out as the module docstring says; needs verl (and torch) installed. Raises
    :class:`ExportError` for no rows, or a row whose prompt or response is longer than
    ``prompt_length`` / ``response_length`` (nothing is cut silently: raise the lengths or
    export with ``max_response_length``).
    """
    import numpy as np
    import torch
    from tensordict import TensorDict
    from verl import DataProto

    if not rows:
        raise ExportError("verl_batch needs at least one row")
    n = len(rows)
    prompts = torch.full((n, prompt_length), pad_token_id, dtype=torch.long)
    responses = torch.full((n, response_length), pad_token_id, dtype=torch.long)
    prompt_mask = torch.zeros((n, prompt_length), dtype=torch.long)
    response_attention = torch.zeros((n, response_length), dtype=torch.long)
    response_mask = torch.zeros((n, response_length), dtype=torch.long)
    advantages = torch.zeros((n, response_length), dtype=torch.float32)
    rm_scores = torch.zeros((n, response_length), dtype=torch.float32)
    with_logprobs = all(row.get("response_logprobs") is not None for row in rows)
    logprobs = torch.zeros((n, response_length), dtype=torch.float32)
    for i, row in enumerate(rows):
        p, r = list(row["prompt_ids"]), list(row["response_ids"])
        uid = (row.get("extra_fields") or {}).get("uid", i)
        if len(p) > prompt_length or len(r) > response_length:
            raise ExportError(f"row {i} (uid {uid!r}): prompt {len(p)} / response {len(r)} tokens do not fit "
                              f"prompt_length={prompt_length} / response_length={response_length}")
        if p:
            prompts[i, prompt_length - len(p):] = torch.tensor(p)
            prompt_mask[i, prompt_length - len(p):] = 1
        if r:
            responses[i, :len(r)] = torch.tensor(r)
            response_attention[i, :len(r)] = 1
            response_mask[i, :len(r)] = torch.tensor(list(row["response_mask"]))
            advantages[i, :len(r)] = torch.tensor(list(row["extra_fields"]["advantages"]), dtype=torch.float32)
            rm_scores[i, len(r) - 1] = float(row["reward_score"])
            if with_logprobs:
                logprobs[i, :len(r)] = torch.tensor(list(row["response_logprobs"]), dtype=torch.float32)
    attention_mask = torch.cat([prompt_mask, response_attention], dim=1)
    tensors = {
        "prompts": prompts, "responses": responses, "response_mask": response_mask * response_attention,
        "input_ids": torch.cat([prompts, responses], dim=1), "attention_mask": attention_mask,
        "position_ids": torch.clip(torch.cumsum(attention_mask, dim=-1) - 1, min=0),
        "rm_scores": rm_scores, "advantages": advantages * response_mask,
    }
    if with_logprobs:
        tensors["rollout_log_probs"] = logprobs
    non_tensor: dict[str, Any] = {"__num_turns__": np.array([int(row["num_turns"]) for row in rows], dtype=np.int32)}
    keys = sorted({k for row in rows for k in (row.get("extra_fields") or {}) if k != "advantages"})
    for key in keys:
        column = np.empty(n, dtype=object)
        column[:] = [(row.get("extra_fields") or {}).get(key) for row in rows]
        non_tensor[key] = column
    return DataProto(batch=TensorDict(tensors, batch_size=n), non_tensor_batch=non_tensor,
                     meta_info={"metrics": [dict(row.get("metrics") or NO_METRICS) for row in rows]})
