"""Rollout trees on disk: JSONL (one tree per line) and Parquet (one row per node).

Snapshots are dropped in both; everything else round-trips exactly
(:meth:`RolloutTree.to_dict <trace_agent.tree.RolloutTree.to_dict>` /
:meth:`~trace_agent.tree.RolloutTree.from_dict` define the record; the loaders validate it).
JSON is written with ``allow_nan=False``; nothing is unpickled.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from trace_agent.errors import TreeError
from trace_agent.tree import FORMAT_NAME, FORMAT_VERSION, RolloutTree

__all__ = ["save_jsonl", "load_jsonl", "save_parquet", "load_parquet"]


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
        record = tree.to_dict()
        for n, rec in zip(tree.nodes, record["nodes"], strict=True):
            cols["tree_index"].append(t_index)
            cols["prompt_id"].append(tree.prompt_id)
            cols["task_id"].append(tree.task_id)
            cols["tree_metadata"].append(meta)
            cols["rollout_starts"].append(record["rollout_starts"] if n.is_root else None)
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
        {"format": FORMAT_NAME, "version": str(FORMAT_VERSION)}
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
    if meta.get(b"format") != FORMAT_NAME.encode() or meta.get(b"version") != str(FORMAT_VERSION).encode():
        raise TreeError(f"{path} is not a {FORMAT_NAME} v{FORMAT_VERSION} Parquet file")
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
            "format": FORMAT_NAME, "version": FORMAT_VERSION, "prompt_id": first["prompt_id"],
            "task_id": first["task_id"], "metadata": json.loads(first["tree_metadata"]),
            "rollout_starts": first["rollout_starts"] or [], "nodes": nodes,
            "tools": json.loads(first["tools"]) if first.get("tools") else [],
            "ground_truth": json.loads(first["ground_truth"]) if first.get("ground_truth") else None,
        }))
    return trees
