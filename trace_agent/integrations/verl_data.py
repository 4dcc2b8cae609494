"""verl dataset files for trace-gym envs: one parquet row per task, read by verl's ``RLHFDataset``.

Each row holds what verl's dataset and trainer read (``prompt``: the env's opening chat
messages, ``data_source``, ``reward_model``, ``agent_name``) and what
:class:`~trace_agent.integrations.verl.TraceTreeWorker` needs to rebuild the episode
(``extra_info``: ``env_id``, ``task_id``, ``reset_seed``, ``index``; verl copies
``extra_info.index`` into the row's ``index``). The worker never trusts ``prompt``: it resets
its own env to ``task_id`` and renders the env's messages itself, so the prompt column is
for verl's length filter and logs only. Rewards come from the env (``reward_model.style``
is ``"env"``).

    python -m trace_agent.integrations.verl_data --env trace_envs/PythonMath-v0 --split train \\
        --out data/math_train.parquet

Imports neither verl nor torch; writing parquet needs pyarrow.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["AGENT_NAME", "dataset_rows", "write_parquet", "main"]

#: ``agent_name`` of every row (informational: the trace-gym worker runs every row itself).
AGENT_NAME = "trace_tree"


def dataset_rows(
    env_id: str,
    *,
    split: str = "train",
    task_ids: Sequence[str] | None = None,
    env_kwargs: Mapping[str, Any] | None = None,
    reset_seed: int = 0,
    limit: int | None = None,
) -> list[dict[str, Any]]:
    """One verl row per task of ``env_id``'s ``split`` (or per id in ``task_ids``), in task order."""
    from trace_agent.env_factory import make_env_factory

    if limit is not None and limit < 1:
        raise ValueError(f"limit must be >= 1, got {limit}")
    env = make_env_factory(env_id, split, max_turns=1, env_kwargs=dict(env_kwargs or {}))()
    try:
        ids = list(task_ids) if task_ids is not None else list(env.tasks.ids())
        rows = []
        for index, task_id in enumerate(ids[:limit]):
            env.reset(seed=reset_seed, options={"task_id": task_id})
            messages = [{"role": str(m["role"]), "content": str(m.get("content") or "")} for m in env.messages]
            rows.append({
                "data_source": env_id, "agent_name": AGENT_NAME, "ability": "agent", "prompt": messages,
                "reward_model": {"style": "env", "ground_truth": ""},
                "extra_info": {"env_id": env_id, "task_id": str(task_id), "reset_seed": int(reset_seed),
                               "index": index, "split": split},
            })
        return rows
    finally:
        env.close()


def write_parquet(rows: Sequence[Mapping[str, Any]], path: str | Path) -> Path:
    """Write ``rows`` to ``path`` (parents created)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist([dict(r) for r in rows]), out)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    import trace_envs

    parser.add_argument("--env", required=True, help=f"trace-gym env id ({', '.join(trace_envs.registered_ids())})")
    parser.add_argument("--split", default="train", help="the env's tasks argument (train, test, a file path)")
    parser.add_argument("--env-kwargs", default="{}", help="JSON object of extra env arguments")
    parser.add_argument("--limit", type=int, default=None, help="at most this many tasks")
    parser.add_argument("--reset-seed", type=int, default=0)
    parser.add_argument("--out", required=True, help="parquet file to write")
    args = parser.parse_args(argv)
    kwargs = json.loads(args.env_kwargs)
    if not isinstance(kwargs, dict):
        parser.error("--env-kwargs must be a JSON object")
    rows = dataset_rows(args.env, split=args.split, env_kwargs=kwargs, reset_seed=args.reset_seed, limit=args.limit)
    print(f"wrote {len(rows)} rows to {write_parquet(rows, args.out)}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
