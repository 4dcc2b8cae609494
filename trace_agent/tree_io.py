"""Rollout trees on disk: JSONL (one tree per line) and Parquet (one row per node).

Snapshots are dropped in both; everything else round-trips exactly
(:meth:`RolloutTree.to_dict <trace_agent.tree.RolloutTree.to_dict>` /
:meth:`~trace_agent.tree.RolloutTree.from_dict` define the record; the loaders validate it).
JSON is written with ``allow_nan=False``; nothing is unpickled.

Reading is bounded (:class:`~trace_envs.limits.ReadLimits`): a file over ``tree_file_bytes``, a
JSONL line over ``tree_bytes`` (refused before it is parsed), a tree of more than ``tree_nodes``
nodes or nested deeper than ``nesting``, a line that is not a tree record, and a record whose
nodes do not each name an earlier node as parent (a cycle, a gap) are each one
:class:`~trace_agent.errors.TreeError` line naming the file and line. :func:`iter_jsonl` yields
the trees of a JSONL file one at a time: a reader holds one tree (at most ``tree_bytes`` of
JSON, 64 MiB by default) rather than the file.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from trace_agent.errors import TreeError
from trace_agent.tree import FORMAT_NAME, FORMAT_VERSION, RolloutTree
from trace_envs.limits import ReadLimits, data_problem, json_nesting, limit_hint, read_limits

__all__ = ["save_jsonl", "load_jsonl", "iter_jsonl", "tree_from_record", "save_parquet", "load_parquet"]


def save_jsonl(trees: Iterable[RolloutTree], path: str | Path) -> Path:
    """Write one JSON object per tree (snapshots dropped); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as fh:
        for tree in trees:
            fh.write(json.dumps(tree.to_dict(), ensure_ascii=False, allow_nan=False))
            fh.write("\n")
    return path


def load_jsonl(path: str | Path, *, limits: ReadLimits | None = None) -> list[RolloutTree]:
    """Read trees written by :func:`save_jsonl` (within ``limits``; see the module doc)."""
    return list(iter_jsonl(path, limits=limits))


def _check_size(path: Path, limits: ReadLimits) -> None:
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise TreeError(f"{path} cannot be read: {exc.strerror}") from None
    if size > limits.tree_file_bytes:
        raise TreeError(f"{path} is {size} bytes, more than the {limits.tree_file_bytes} a tree file may hold "
                        f"({limit_hint('tree_file_bytes')})")


def iter_jsonl(path: str | Path, *, limits: ReadLimits | None = None) -> Iterator[RolloutTree]:
    """The trees of a file written by :func:`save_jsonl`, one at a time, each checked before it is built.

    Raises :class:`TreeError` naming the file and line (see the module doc); ``FileNotFoundError`` when it is missing.
    """
    limits = limits or read_limits()
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no tree file at {path}")
    _check_size(path, limits)
    with path.open("rb") as fh:
        number = 0
        while True:
            line = fh.readline(limits.tree_bytes + 1)
            if not line:
                return
            number += 1
            if len(line) > limits.tree_bytes:
                raise TreeError(f"{path}:{number}: a tree of more than {limits.tree_bytes} bytes: refused before it "
                                f"is read ({limit_hint('tree_bytes')})")
            if line.strip():
                yield _tree_from_line(line, f"{path}:{number}", limits)


def _tree_from_line(line: bytes, where: str, limits: ReadLimits) -> RolloutTree:
    if json_nesting(line) > limits.nesting:
        raise TreeError(f"{where}: the tree record nests deeper than {limits.nesting} levels "
                        f"({limit_hint('nesting')})")
    try:
        data = json.loads(line.decode("utf-8"))
    except UnicodeDecodeError:
        raise TreeError(f"{where}: not UTF-8 text (is this a tree .jsonl file?)") from None
    except RecursionError:
        raise TreeError(f"{where}: nests deeper than JSON can be read ({limit_hint('nesting')})") from None
    except ValueError as exc:
        raise TreeError(f"{where}: not JSON ({exc})") from None
    return tree_from_record(data, where, limits=limits, nesting_checked=True)


def tree_from_record(data: Any, where: str, *, limits: ReadLimits | None = None,
                     nesting_checked: bool = False) -> RolloutTree:
    """:meth:`RolloutTree.from_dict` after the checks of the module doc; ``where`` names the source in errors.

    ``nesting_checked``: the caller measured the record's nesting on its JSON text already (cheaper).
    """
    limits = limits or read_limits()
    if not isinstance(data, dict):
        raise TreeError(f"{where}: a {type(data).__name__}, not a tree record (a JSON object with nodes)")
    nodes = data.get("nodes")
    if not isinstance(nodes, list) or not nodes:
        raise TreeError(f"{where}: not a tree record (no list of nodes)")
    if len(nodes) > limits.tree_nodes:
        raise TreeError(f"{where}: a tree of {len(nodes)} nodes, more than {limits.tree_nodes} "
                        f"({limit_hint('tree_nodes')})")
    problem = None if nesting_checked else data_problem(data, nesting=limits.nesting)
    if problem:
        raise TreeError(f"{where}: the tree record {problem}")
    for i, rec in enumerate(nodes):
        if not isinstance(rec, dict):
            raise TreeError(f"{where}: node {i} is a {type(rec).__name__}, not a node record")
        node_id, parent = rec.get("node_id"), rec.get("parent_id")
        if type(node_id) is not int or node_id != i:
            raise TreeError(f"{where}: node records out of order: expected id {i}, got {node_id!r}")
        if i == 0 and parent is not None:
            raise TreeError(f"{where}: the root (node 0) names a parent ({parent!r})")
        if i and (type(parent) is not int or not 0 <= parent < i):
            raise TreeError(f"{where}: node {i} names parent {parent!r}, which is not an earlier node (a parent "
                            f"cycle or a missing node)")
    try:
        return RolloutTree.from_dict(data)
    except TreeError as exc:
        raise TreeError(f"{where}: {exc}") from None
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
        raise TreeError(f"{where}: not a rollout-tree record ({type(exc).__name__}: {exc})") from None


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
    """Read trees written by :func:`save_parquet` (within the limits of the module doc)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    limits = read_limits()
    path = Path(path)
    _check_size(path, limits)
    try:
        meta_data = pq.read_metadata(path)
        if meta_data.num_rows > limits.tree_nodes * 16:
            raise TreeError(f"{path}: {meta_data.num_rows} node rows, more than {limits.tree_nodes * 16} "
                            f"({limit_hint('tree_nodes')})")
        unpacked = sum(meta_data.row_group(i).total_byte_size for i in range(meta_data.num_row_groups))
        if unpacked > limits.tree_file_bytes:
            raise TreeError(f"{path}: {unpacked} bytes once decompressed, more than {limits.tree_file_bytes} "
                            f"({limit_hint('tree_file_bytes')})")
        table = pq.read_table(path)
    except (pa.ArrowException, OSError) as exc:
        raise TreeError(f"{path} is not a readable Parquet file ({type(exc).__name__}: {exc})") from None
    meta = table.schema.metadata or {}
    if meta.get(b"format") != FORMAT_NAME.encode() or meta.get(b"version") != str(FORMAT_VERSION).encode():
        raise TreeError(f"{path} is not a {FORMAT_NAME} v{FORMAT_VERSION} Parquet file")
    try:
        return _parquet_trees(table.to_pylist(), path, limits)
    except TreeError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError, IndexError, RecursionError) as exc:
        raise TreeError(f"{path} is not a rollout-tree Parquet file ({type(exc).__name__}: {exc})") from None


def _parquet_trees(rows: list[dict[str, Any]], path: Path, limits: ReadLimits) -> list[RolloutTree]:
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
        trees.append(tree_from_record({
            "format": FORMAT_NAME, "version": FORMAT_VERSION, "prompt_id": first["prompt_id"],
            "task_id": first["task_id"], "metadata": json.loads(first["tree_metadata"]),
            "rollout_starts": first["rollout_starts"] or [], "nodes": nodes,
            "tools": json.loads(first["tools"]) if first.get("tools") else [],
            "ground_truth": json.loads(first["ground_truth"]) if first.get("ground_truth") else None,
        }, f"{path} (tree {t_index})", limits=limits))
    return trees
