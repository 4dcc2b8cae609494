"""verl's own loader reads the dataset files trace-gym writes: ``RLHFDataset`` over ``verl_data`` parquet.

What verl's trainer sees of a row is what ``RLHFDataset.__getitem__`` returns: the chat in ``raw_prompt``,
``data_source``, ``reward_model``, ``extra_info`` (which the trace-gym worker reads the task from) and
``index`` (copied from ``extra_info.index``). Its overlong-prompt filter renders every prompt with the
tokenizer's chat template, so the rows must survive that too.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.verl
pytest.importorskip("verl")

from omegaconf import OmegaConf  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402
from verl.utils.dataset.rl_dataset import RLHFDataset  # noqa: E402

from trace_agent.demo.shipped import SHIPPED_DEMO_POLICY  # noqa: E402
from trace_agent.integrations.verl_data import AGENT_NAME, dataset_rows, write_parquet  # noqa: E402

ENV = "trace_envs/PythonMath-v0"


def _dataset(path, tmp_path, **config):
    tokenizer = AutoTokenizer.from_pretrained(str(SHIPPED_DEMO_POLICY))
    cfg = OmegaConf.create({"cache_dir": str(tmp_path / "cache"), "max_prompt_length": 4096,
                            "filter_overlong_prompts": True, "filter_overlong_prompts_workers": 1, **config})
    return RLHFDataset(data_files=[str(path)], tokenizer=tokenizer, config=cfg)


def test_rlhf_dataset_reads_every_row_as_written(tmp_path):
    rows = dataset_rows(ENV, split="train", limit=4, reset_seed=3)
    ds = _dataset(write_parquet(rows, tmp_path / "train.parquet"), tmp_path)
    assert len(ds) == len(rows)
    for i, row in enumerate(rows):
        item = ds[i]
        assert item["raw_prompt"] == row["prompt"]
        assert item["data_source"] == ENV and item["agent_name"] == AGENT_NAME
        assert item["reward_model"] == row["reward_model"]
        assert dict(item["extra_info"]) == row["extra_info"] and item["index"] == i
        assert item["extra_info"]["task_id"] == row["extra_info"]["task_id"]


def test_the_overlong_filter_applies_to_trace_gym_prompts(tmp_path):
    rows = dataset_rows(ENV, split="train", limit=3)
    path = write_parquet(rows, tmp_path / "train.parquet")
    assert len(_dataset(path, tmp_path, max_prompt_length=4)) == 0  # every prompt is longer than 4 tokens
