"""``trace-gym export --format verl`` rows build verl's own ``AgentLoopOutput`` as they are (run in .venv-verl).

verl 0.9.1's ``AgentLoopOutput`` is a pydantic model whose ``metrics`` is required and which
silently ignores unknown keys, so a row's extra columns must travel in ``extra_fields`` (verl's
post-processing makes each of its keys a ``non_tensor_batch`` column). Skipped where verl is not
installed (``make test-verl`` runs it).
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.verl
pytest.importorskip("verl")

from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics, AgentLoopOutput  # noqa: E402

from trace_agent.export import ExportConfig, export_rows, read_rows, write_rows  # noqa: E402
from trace_agent.tree import RolloutTree  # noqa: E402

EXTRA = {"uid", "data_source", "reward_model", "extra_info", "advantages"}


def _tree(prompt_id: str, env_id: str, ground_truth: object, *, logprobs: bool = True) -> RolloutTree:
    """Two rollouts from the root (a success, a failure) and a continuation from the first turn."""
    tree = RolloutTree(prompt_id=prompt_id, task_id=f"{prompt_id}-task", prompt_ids=[1, 2, 3],
                       ground_truth=ground_truth, messages=[{"role": "user", "content": "q"}],
                       metadata={"env_id": env_id})
    lp = (lambda n: [-0.5] * n) if logprobs else (lambda n: None)
    a, b = tree.start_rollout(), tree.start_rollout()
    a1 = tree.add_turn(tree.root, rollout_id=a, generated_ids=[10, 11], generated_logprobs=lp(2), observation_ids=[20],
                       messages=[{"role": "assistant", "content": "call"}, {"role": "tool", "content": "obs"}])
    b1 = tree.add_turn(tree.root, rollout_id=b, generated_ids=[30], generated_logprobs=lp(1), observation_ids=[40],
                       messages=[{"role": "assistant", "content": "call"}, {"role": "tool", "content": "obs"}])
    for parent, rollout, reward in [(a1, a, 1.0), (b1, b, 0.0), (a1, tree.start_rollout(a1), 0.0)]:
        leaf = tree.add_turn(parent, rollout_id=rollout, generated_ids=[12], generated_logprobs=lp(1),
                             observation_ids=[99], messages=[{"role": "assistant", "content": "<answer>x</answer>"},
                                                             {"role": "user", "content": "verdict"}])
        tree.finish(leaf, reward)
    return tree


@pytest.mark.parametrize("objective", ["treerpo", "grpo", "tree-grpo"])
def test_rows_build_agent_loop_output_and_keep_every_column(objective: str, tmp_path) -> None:
    trees = [_tree("m", "trace_envs/PythonMath-v0", "42"),
             _tree("w", "trace_envs/WikiQA-v0", ["Paris", "City of Paris"], logprobs=False)]
    rows = export_rows(trees, ExportConfig(format="verl", objective=objective))
    write_rows(rows, tmp_path / "verl.jsonl")
    with pytest.warns(UserWarning, match="extra_fields"):  # one env's string answer, another's list
        write_rows(rows, tmp_path / "verl.parquet")
    for source in (rows, read_rows(tmp_path / "verl.jsonl"), read_rows(tmp_path / "verl.parquet")):
        assert source == rows
        for row in source:
            out = AgentLoopOutput(**row)
            assert isinstance(out.metrics, AgentLoopMetrics) and out.metrics.num_preempted == -1
            assert (out.prompt_ids, out.response_ids, out.response_mask) == (
                row["prompt_ids"], row["response_ids"], row["response_mask"])
            assert out.response_logprobs == row["response_logprobs"] and out.reward_score == row["reward_score"]
            assert set(out.extra_fields) == EXTRA and out.extra_fields == row["extra_fields"], "nothing dropped"
            assert len(out.extra_fields["advantages"]) == len(out.response_ids)
            # what verl's post-processing reads off the model: its tensors and the extra fields
            as_dict = out.as_dict()
            assert as_dict["responses"].tolist() == row["response_ids"]
            assert as_dict["response_mask"].tolist() == row["response_mask"]
            assert float(as_dict["rm_scores"][-1]) == row["reward_score"]
            assert ("rollout_log_probs" in as_dict) == (row["response_logprobs"] is not None)
            assert as_dict["extra_fields"]["uid"] == row["extra_fields"]["uid"]
    math_row, wiki_row = rows[0], rows[-1]
    assert math_row["extra_fields"]["reward_model"] == {"style": "rule", "ground_truth": "42"}
    assert wiki_row["extra_fields"]["reward_model"]["ground_truth"] == ["Paris", "City of Paris"]
    assert wiki_row["extra_fields"]["data_source"] == "trace_envs/WikiQA-v0" and wiki_row["response_logprobs"] is None
    assert any(a != 0 for r in rows for a in r["extra_fields"]["advantages"])


def test_verl_would_have_dropped_the_extra_columns_at_the_top_level() -> None:
    """Why they live in extra_fields: pydantic ignores unknown keys, and metrics is required."""
    row = export_rows([_tree("m", "trace_envs/PythonMath-v0", "42")], ExportConfig(format="verl"))[0]
    flat = {**{k: v for k, v in row.items() if k not in ("extra_fields", "metrics")}, **row["extra_fields"]}
    with pytest.raises(Exception, match="metrics"):
        AgentLoopOutput(**flat)
    out = AgentLoopOutput(**flat, metrics=row["metrics"])
    assert "advantages" not in out.model_dump() and out.extra_fields == {}


def test_verl_batch_is_laid_out_as_verls_agent_loop_and_verls_own_grpo_agrees(tmp_path) -> None:
    """``verl_batch``: the exported rows as verl's ``DataProto`` (left-padded prompts, right-padded responses,
    masks, positions, rm_scores at the last response token); verl's own GRPO advantage on its ``rm_scores`` equals
    the exported GRPO advantages, and verl's policy loss trains on the batch as it is."""
    import numpy as np
    import torch
    from verl import DataProto
    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage, compute_policy_loss_vanilla
    from verl.workers.config import ActorConfig

    from trace_agent.errors import ExportError
    from trace_agent.export_verl import verl_batch

    trees = [_tree("m", "trace_envs/PythonMath-v0", "42"), _tree("n", "trace_envs/PythonMath-v0", "7")]
    rows = export_rows(trees, ExportConfig(format="verl", objective="grpo"))
    write_rows(rows, tmp_path / "verl.jsonl")
    batch = verl_batch(read_rows(tmp_path / "verl.jsonl"), prompt_length=5, response_length=8, pad_token_id=0)
    assert isinstance(batch, DataProto) and len(batch) == len(rows) == 6
    b = batch.batch
    first = rows[0]  # prompt [1, 2, 3]; response: generated 10 11, observation 20, generated 12
    assert first["response_ids"] == [10, 11, 20, 12] and first["response_mask"] == [1, 1, 0, 1]
    assert b["prompts"][0].tolist() == [0, 0, 1, 2, 3]
    assert b["responses"][0].tolist() == [10, 11, 20, 12, 0, 0, 0, 0]
    assert b["input_ids"][0].tolist() == [0, 0, 1, 2, 3, 10, 11, 20, 12, 0, 0, 0, 0]
    assert b["attention_mask"][0].tolist() == [0, 0, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0]
    assert b["position_ids"][0].tolist() == [0, 0, 0, 1, 2, 3, 4, 5, 6, 6, 6, 6, 6]
    assert b["response_mask"][0].tolist() == [1, 1, 0, 1, 0, 0, 0, 0]
    assert b["rm_scores"][0].tolist() == [0, 0, 0, float(first["reward_score"]), 0, 0, 0, 0]
    assert b["rollout_log_probs"][0].tolist() == [-0.5, -0.5, 0.0, -0.5, 0, 0, 0, 0]
    assert list(batch.non_tensor_batch["uid"]) == [r["extra_fields"]["uid"] for r in rows]
    assert batch.non_tensor_batch["reward_model"][0] == {"style": "rule", "ground_truth": "42"}
    assert "advantages" not in batch.non_tensor_batch and batch.non_tensor_batch["__num_turns__"].dtype == np.int32

    verl_adv, _ = compute_grpo_outcome_advantage(token_level_rewards=b["rm_scores"], response_mask=b["response_mask"],
                                                 index=batch.non_tensor_batch["uid"])
    assert torch.allclose(verl_adv, b["advantages"], atol=1e-5)
    assert b["advantages"].abs().sum() > 0

    # verl's clipped PPO loss on the batch as it is: at the behaviour log-probs the ratio is 1, so the loss is
    # -mean(A) over the trained tokens; a policy that raised every trained token's log-prob by 0.1 lowers it
    config = ActorConfig(strategy="fsdp", ppo_micro_batch_size_per_gpu=1, rollout_n=1)
    mask = b["response_mask"].float()
    old = b["rollout_log_probs"]
    at_behaviour, _ = compute_policy_loss_vanilla(old, old, b["advantages"], b["response_mask"], "token-mean", config)
    assert float(at_behaviour) == pytest.approx(float(-(b["advantages"] * mask).sum() / mask.sum()), abs=1e-6)
    raised = old + 0.1 * torch.sign(b["advantages"])
    moved, _ = compute_policy_loss_vanilla(old, raised, b["advantages"], b["response_mask"], "token-mean", config)
    assert float(moved) < float(at_behaviour)

    with pytest.raises(ExportError, match="do not fit"):
        verl_batch(rows, prompt_length=2, response_length=8)
    with pytest.raises(ExportError, match="at least one row"):
        verl_batch([], prompt_length=5, response_length=8)
    no_lp = verl_batch(export_rows([_tree("w", "trace_envs/WikiQA-v0", "x", logprobs=False)],
                                   ExportConfig(format="verl", objective="grpo")), prompt_length=5, response_length=8)
    assert "rollout_log_probs" not in no_lp.batch.keys()
