"""verl dataset rows for trace-gym envs: one row per task, the worker's task reference in extra_info."""

from __future__ import annotations

import pytest

from trace_agent.integrations.verl_data import AGENT_NAME, dataset_rows, main, write_parquet

ENV = "trace_envs/PythonMath-v0"


def test_rows_name_the_task_and_round_trip_through_parquet(tmp_path):
    pq = pytest.importorskip("pyarrow.parquet")
    rows = dataset_rows(ENV, split="train", limit=3, reset_seed=5)
    assert [r["extra_info"]["index"] for r in rows] == [0, 1, 2]
    assert len({r["extra_info"]["task_id"] for r in rows}) == 3
    for r in rows:
        assert r["data_source"] == ENV and r["agent_name"] == AGENT_NAME and r["extra_info"]["reset_seed"] == 5
        assert r["prompt"][-1]["role"] == "user" and r["prompt"][-1]["content"]
    back = pq.read_table(write_parquet(rows, tmp_path / "d" / "train.parquet")).to_pylist()
    assert back == rows
    assert main(["--env", ENV, "--limit", "2", "--out", str(tmp_path / "m.parquet")]) == 0
    assert len(pq.read_table(tmp_path / "m.parquet")) == 2


def test_explicit_task_ids_and_bad_arguments():
    rows = dataset_rows(ENV, task_ids=["math-train-0007"])
    assert [r["extra_info"]["task_id"] for r in rows] == ["math-train-0007"]
    with pytest.raises(ValueError):
        dataset_rows(ENV, limit=0)
    with pytest.raises(SystemExit):
        main(["--env", ENV, "--env-kwargs", "[1]", "--out", "x.parquet"])
