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
