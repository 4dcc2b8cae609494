"""``trace-gym export``: finished rollout trees as TRL and verl training rows.

Input: the trees ``trace-gym train`` saves (``<run>/trees/step_*.jsonl``) or any file written
by :func:`trace_agent.tree_io.save_jsonl` / :func:`~trace_agent.tree_io.save_parquet` (a
directory is read whole, files in name order), within the read limits of
:mod:`trace_agent.tree_io`. Memory: exporting to ``.jsonl`` (every format but ``trl-grpo``, and
without ``--env``) streams, one tree at a time, so it needs about what the largest tree needs
(a tree line is at most ``tree_bytes``, 64 MiB by default; a bigger one is refused before it is
read); a ``.parquet`` output, ``trl-grpo`` and ``--env`` hold every tree and row. Output: ``.jsonl`` or ``.parquet`` rows
(:func:`write_rows`; :func:`read_rows` reads either back to the same rows), one of five formats:

``trl-conversational``
    TRL conversational language-modeling rows, one per kept leaf: ``{"messages": [system,
    user, assistant, tool, ..., assistant], "tools": "<JSON>", "reward", "prompt_id", "task_id"}``.
``trl-prompt-completion``
    TRL conversational prompt-completion rows, one per kept leaf: ``{"prompt": [the prompt's
    messages], "completion": [assistant, tool, ..., assistant], ...}``; observations are
    ``role: "tool"`` messages, masked by TRL's ``assistant_only_loss=True``.
``trl-preference``
    TRL conversational preference rows where trees branch: ``{"prompt", "chosen",
    "rejected", ...}`` (``pairs_per_branch`` per branch point). A flat group branches at
    the root, so GRPO trees give prompt-level pairs and TRACE trees mid-trajectory ones.
``trl-grpo``
    TRL GRPOTrainer prompt-only rows, one per distinct prompt: ``{"prompt", "ground_truth",
    "task_id", "data_source"}``; GRPOTrainer passes the columns other than ``prompt`` to
    each reward function as keyword arguments.
``verl``
    verl agent-loop rows, one per leaf: ``AgentLoopOutput(**row)`` builds verl's class, with
    ``advantages``, ``uid``, ``data_source``, ``reward_model`` and ``extra_info`` in its
    ``extra_fields`` (:mod:`trace_agent.export_verl`).

The row builders and their rules (the env's verdict never reaches training text, tools as a
JSON string, tool calls inline or as TRL ``tool_calls``, which leaves SFT keeps) are
documented in :mod:`trace_agent.export_trl` and :mod:`trace_agent.export_verl`. SFT rows keep
the successful leaves by default and warn (:class:`ExportWarning`) with the count they drop.

Parquet. A column whose values Arrow cannot store as they are (dicts with different keys,
which Arrow unifies into one struct with ``null`` fields; values of different types, such as
one env's string answer and another's list of answers) is written as JSON text and named in
the file's metadata (``trace_gym.json_columns``); :func:`read_rows` decodes it, so a Parquet
file reads back equal to the JSONL of the same rows.

Tools and ground truth come from the tree (recorded by the collector since these fields
exist); for older files, ``--env ID`` rebuilds them from the env
(``reset(options={"task_id": ...})``: its ``tools`` and the task's answer).
"""

from __future__ import annotations

import argparse
import json
import warnings
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trace_agent.errors import ExportError, TreeError
from trace_agent.export_trl import (
    SFT_KEEP,
    TOOL_CALL_STYLES,
    conversational_rows,
    grpo_rows,
    preference_rows,
    prompt_completion_rows,
    trajectory_messages,
)
from trace_agent.export_verl import verl_rows
from trace_agent.options import LONE_CHILD, OBJECTIVES, SHARED_TURNS, either
from trace_agent.success import SUCCESS_THRESHOLD
from trace_agent.tree import RolloutTree, ground_truth_of
from trace_agent.tree_io import iter_jsonl, load_parquet
from trace_envs.limits import limit_hint, read_limits

__all__ = [
    "EXPORT_FORMATS",
    "ExportConfig",
    "ExportError",
    "ExportWarning",
    "trajectory_messages",
    "export_rows",
    "read_trees",
    "iter_trees",
    "stream_jsonl_rows",
    "write_rows",
    "read_rows",
    "fill_from_env",
    "add_export_parser",
]

#: ``--format`` values.
EXPORT_FORMATS = ("trl-conversational", "trl-prompt-completion", "trl-preference", "trl-grpo", "verl")
_SFT_FORMATS = ("trl-conversational", "trl-prompt-completion")
_JSON_COLUMNS_KEY = b"trace_gym.json_columns"


class ExportWarning(UserWarning):
    """Rows were left out (SFT's success filter) or stored another way (a Parquet column as JSON text)."""


@dataclass(frozen=True, kw_only=True)
class ExportConfig:
    """What to export.

    Attributes:
        format: one of :data:`EXPORT_FORMATS`.
        objective: verl advantages: "treerpo", "grpo" or "tree-grpo" (see :mod:`trace_agent.objectives`).
        normalize_std: TreeRPO only: divide by the sibling std.
        lone_child: TreeRPO only: "zero" or "inherit" (None: the objectives module's default).
        shared_turns: verl only: "once", "per-leaf", or None (the objective's rule; see :mod:`trace_agent.export_verl`).
        keep: TRL conversational / prompt-completion: "success" (leaves with
            :func:`~trace_agent.success.is_success` rewards) or "all".
        tool_calls: TRL formats: "inline" (the sampled text) or "structured" (TRL ``tool_calls`` messages).
        pairs_per_branch: TRL preference: pairs per branch point (>= 1).
    """

    format: str
    objective: str = "treerpo"
    normalize_std: bool = False
    lone_child: str | None = None
    shared_turns: str | None = None
    keep: str = "success"
    tool_calls: str = "inline"
    pairs_per_branch: int = 1

    def __post_init__(self) -> None:
        if self.format not in EXPORT_FORMATS:
            raise ExportError(f"format must be one of {EXPORT_FORMATS}, got {self.format!r}")
        if self.objective not in OBJECTIVES:
            raise ExportError(f"objective must be one of {OBJECTIVES}, got {self.objective!r}")
        if self.lone_child is not None and self.lone_child not in LONE_CHILD:
            raise ExportError(f"lone_child must be {either(LONE_CHILD)}, got {self.lone_child!r}")
        if self.shared_turns is not None and self.shared_turns not in SHARED_TURNS:
            raise ExportError(f"shared_turns must be {either(SHARED_TURNS)}, got {self.shared_turns!r}")
        if self.keep not in SFT_KEEP:
            raise ExportError(f"keep must be {either(SFT_KEEP)}, got {self.keep!r}")
        if self.tool_calls not in TOOL_CALL_STYLES:
            raise ExportError(f"tool_calls must be {either(TOOL_CALL_STYLES)}, got {self.tool_calls!r}")
        if self.pairs_per_branch < 1:
            raise ExportError(f"pairs_per_branch must be >= 1, got {self.pairs_per_branch}")

    @property
    def shared_rule(self) -> str:
        """The rule for turns shared by several leaves: the option, else the objective's own."""
        return self.shared_turns or ("once" if self.objective == "treerpo" else "per-leaf")


def _tree_rows(tree: RolloutTree, config: ExportConfig) -> list[dict[str, Any]]:
    if config.format == "trl-conversational":
        return conversational_rows(tree, keep=config.keep, tool_calls=config.tool_calls)  # type: ignore[arg-type]
    if config.format == "trl-prompt-completion":
        return prompt_completion_rows(tree, keep=config.keep, tool_calls=config.tool_calls)  # type: ignore[arg-type]
    if config.format == "trl-preference":
        return preference_rows(tree, pairs_per_branch=config.pairs_per_branch,
                               tool_calls=config.tool_calls)  # type: ignore[arg-type]
    return verl_rows(tree, objective=config.objective, shared=config.shared_rule,  # type: ignore[arg-type]
                     normalize_std=config.normalize_std, lone_child=config.lone_child)  # type: ignore[arg-type]


def export_rows(trees: Iterable[RolloutTree], config: ExportConfig) -> list[dict[str, Any]]:
    """The rows of ``config.format`` for ``trees``, tree by tree, leaves in creation order.

    SFT formats under ``keep="success"`` warn (:class:`ExportWarning`) when they leave leaves out.
    """
    trees = list(trees)
    if config.format == "trl-grpo":
        return grpo_rows(trees)
    rows = [row for tree in trees for row in _tree_rows(tree, config)]
    if config.format in _SFT_FORMATS and config.keep == "success":
        finished = sum(len(tree.leaves()) for tree in trees)
        if len(rows) < finished:
            warnings.warn(f"kept {len(rows)} of {finished} finished leaves: the successes (reward >= "
                          f"{SUCCESS_THRESHOLD}); keep='all' (--keep all) exports every leaf", ExportWarning,
                          stacklevel=2)
    return rows


# --------------------------------------------------------------------------------------------------
# files


def read_trees(paths: Sequence[str | Path]) -> list[RolloutTree]:
    """Trees from ``.jsonl`` / ``.parquet`` files or directories of them (in name order).

    Raises:
        ExportError: a missing path, another file type, or a file that is not a tree file (or breaks a
            read limit, :mod:`trace_agent.tree_io`), naming the file and line.
    """
    return list(iter_trees(paths))


def iter_trees(paths: Sequence[str | Path]) -> Iterator[RolloutTree]:
    """:func:`read_trees` one tree at a time: a ``.jsonl`` file is never held whole (a Parquet file is)."""
    for path in _tree_files(paths):
        try:
            yield from iter_jsonl(path) if path.suffix == ".jsonl" else load_parquet(path)
        except (TreeError, ValueError, KeyError, TypeError, OSError) as exc:
            raise ExportError(f"{path} is not a rollout-tree file: {exc}") from None


def _tree_files(paths: Sequence[str | Path]) -> list[Path]:
    files: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            found = sorted(p for p in path.iterdir() if p.suffix in (".jsonl", ".parquet"))
            if not found:
                raise ExportError(f"{path} holds no .jsonl or .parquet tree files")
            files += found
        elif path.is_file():
            files.append(path)
        else:
            raise ExportError(f"no tree file or directory at {path}")
    for path in files:
        if path.suffix not in (".jsonl", ".parquet"):
            raise ExportError(f"{path}: tree files are .jsonl or .parquet (written by trace-gym train / bench)")
    return files


def fill_from_env(trees: Sequence[RolloutTree], env_id: str, **env_kwargs: Any) -> int:
    """Give trees without tools or ground truth the env's (older files); returns how many were filled.

    The env comes from the one env factory (:func:`~trace_agent.env_factory.make_env_factory`) with
    its default task set, as ``gym.make(env_id)`` has it (``env_kwargs`` such as ``tasks=``
    choose another); one turn is enough, nothing is stepped.
    """
    from trace_agent.env_factory import make_env_factory

    missing = [t for t in trees if not t.tools or t.ground_truth is None]
    if not missing:
        return 0
    env = make_env_factory(env_id, None, max_turns=1, env_kwargs=env_kwargs)()
    try:
        for tree in missing:
            env.reset(options={"task_id": tree.task_id})
            if not tree.tools:
                tree.tools = [dict(t) for t in env.tools]
            if tree.ground_truth is None:
                tree.ground_truth = ground_truth_of(env.task.data)
    finally:
        env.close()
    return len(missing)


def _column(values: list[Any]) -> tuple[Any, bool]:
    """An Arrow array holding ``values`` exactly, and whether it had to be JSON text."""
    import pyarrow as pa

    try:
        array = pa.array(values)
        if array.to_pylist() == values:
            return array, False
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
        pass
    return pa.array([json.dumps(v, ensure_ascii=False, allow_nan=False) for v in values], pa.string()), True


def write_rows(rows: Sequence[dict[str, Any]], out: str | Path) -> Path:
    """Write rows as JSONL (``.jsonl``) or Parquet (``.parquet``; see the module docstring on JSON columns).

    Raises:
        ExportError: another suffix, rows with different columns (Parquet), or values JSON cannot hold.
    """
    out = Path(out)
    if out.suffix not in (".jsonl", ".parquet"):
        raise ExportError(f"--out must end in .jsonl or .parquet, got {out.name!r}")
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.suffix == ".jsonl":
        try:
            lines = [json.dumps(row, ensure_ascii=False, allow_nan=False) + "\n" for row in rows]
        except (TypeError, ValueError) as exc:
            raise ExportError(f"a row does not fit JSON ({exc})") from None
        out.write_text("".join(lines), encoding="utf-8")
        return out
    import pyarrow as pa
    import pyarrow.parquet as pq

    names = list(rows[0]) if rows else []
    for i, row in enumerate(rows):
        if list(row) != names:
            raise ExportError(f"row {i} has the columns {list(row)}, row 0 {names}: the rows of one Parquet file "
                              "share their columns (write .jsonl instead)")
    arrays, as_json = [], []
    for name in names:
        try:
            array, encoded = _column([row[name] for row in rows])
        except (TypeError, ValueError) as exc:
            raise ExportError(f"column {name!r} does not fit Parquet or JSON ({exc})") from None
        arrays.append(array)
        if encoded:
            as_json.append(name)
    if as_json:
        warnings.warn(f"Parquet column(s) {as_json} stored as JSON text: their values do not share one Arrow type "
                      "(dicts with different keys, or values of different types); read_rows decodes them",
                      ExportWarning, stacklevel=2)
    table = pa.Table.from_arrays(arrays, names=names).replace_schema_metadata(
        {_JSON_COLUMNS_KEY: json.dumps(as_json).encode()})
    try:
        pq.write_table(table, out)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise ExportError(f"these rows do not fit one Parquet schema ({exc}); write .jsonl instead") from None
    return out


def stream_jsonl_rows(trees: Iterable[RolloutTree], config: ExportConfig, out: str | Path) -> tuple[int, int]:
    """Write ``config.format``'s rows of ``trees`` to the ``.jsonl`` file ``out`` as each tree is read.

    Holds one tree and its rows at a time (every format but ``trl-grpo``, whose rows are one per
    distinct prompt: use :func:`export_rows`). Rows go to ``<out>.partial``, renamed to ``out`` when
    every tree is read: a refused tree file leaves no ``out``. Returns (rows written, trees read); the
    SFT success filter warns as :func:`export_rows` does.
    """
    if config.format == "trl-grpo":
        raise ExportError("trl-grpo rows are one per distinct prompt: export them with export_rows")
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(out.name + ".partial")
    written = trees_read = finished = 0
    try:
        with partial.open("w", encoding="utf-8") as fh:
            for tree in trees:
                trees_read += 1
                finished += len(tree.leaves())
                for row in _tree_rows(tree, config):
                    try:
                        fh.write(json.dumps(row, ensure_ascii=False, allow_nan=False) + "\n")
                    except (TypeError, ValueError) as exc:
                        raise ExportError(f"a row does not fit JSON ({exc})") from None
                    written += 1
        partial.replace(out)  # only a finished export has the name
    finally:
        partial.unlink(missing_ok=True)
    if config.format in _SFT_FORMATS and config.keep == "success" and written < finished:
        warnings.warn(f"kept {written} of {finished} finished leaves: the successes (reward >= "
                      f"{SUCCESS_THRESHOLD}); keep='all' (--keep all) exports every leaf", ExportWarning, stacklevel=2)
    return written, trees_read


def read_rows(path: str | Path) -> list[dict[str, Any]]:
    """Rows written by :func:`write_rows`, JSON-text Parquet columns decoded: equal to the rows written.

    Raises :class:`ExportError` naming the file (and line) for a file over ``tree_file_bytes``, a JSONL
    line over ``row_bytes`` (:class:`~trace_envs.limits.ReadLimits`) or one that is not a JSON object,
    and a Parquet file pyarrow cannot read (truncated, not Parquet).
    """
    path = Path(path)
    if path.suffix not in (".jsonl", ".parquet"):
        raise ExportError(f"row files are .jsonl or .parquet, got {path.name!r}")
    if not path.is_file():
        raise ExportError(f"no row file at {path}")
    limits = read_limits()
    size = path.stat().st_size
    if size > limits.tree_file_bytes:
        raise ExportError(f"{path} is {size} bytes, more than the {limits.tree_file_bytes} a row file may hold "
                          f"({limit_hint('tree_file_bytes')})")
    if path.suffix == ".jsonl":
        return _jsonl_rows(path, limits.row_bytes)
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
        as_json = json.loads((table.schema.metadata or {}).get(_JSON_COLUMNS_KEY, b"[]"))
        rows = table.to_pylist()
        for row in rows:
            for name in as_json:
                row[name] = json.loads(row[name])
    except (pa.ArrowException, OSError, ValueError, TypeError, KeyError, RecursionError) as exc:
        raise ExportError(f"{path} is not a row file write_rows wrote ({type(exc).__name__}: {exc})") from None
    return rows


def _jsonl_rows(path: Path, row_bytes: int) -> list[dict[str, Any]]:
    rows = []
    with path.open("rb") as fh:
        for number, line in enumerate(iter(lambda: fh.readline(row_bytes + 1), b""), start=1):
            if len(line) > row_bytes:
                raise ExportError(f"{path}:{number}: a row of more than {row_bytes} bytes ({limit_hint('row_bytes')})")
            if not line.strip():
                continue
            try:
                row = json.loads(line.decode("utf-8"))
            except (UnicodeDecodeError, ValueError, RecursionError) as exc:
                raise ExportError(f"{path}:{number}: not a JSON row ({type(exc).__name__}: {exc})") from None
            if not isinstance(row, dict):
                raise ExportError(f"{path}:{number}: a {type(row).__name__}, not a row (a JSON object)")
            rows.append(row)
    return rows


# --------------------------------------------------------------------------------------------------
# command line


def _main(args: argparse.Namespace) -> int:
    import sys

    try:
        config = ExportConfig(format=args.format, objective=args.objective, normalize_std=args.normalize_std,
                              lone_child=args.lone_child, shared_turns=args.shared_turns, keep=args.keep,
                              tool_calls=args.tool_calls, pairs_per_branch=args.pairs_per_branch)
        streaming = str(args.out).endswith(".jsonl") and config.format != "trl-grpo" and not args.env
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", ExportWarning)
            if streaming:  # one tree in memory at a time
                written, read = stream_jsonl_rows(iter_trees(args.trees), config, args.out)
                out = Path(args.out)
            else:
                trees = read_trees(args.trees)
                if args.env:
                    fill_from_env(trees, args.env)
                rows = export_rows(trees, config)
                out = write_rows(rows, args.out)
                written, read = len(rows), len(trees)
    except ExportError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for warning in caught:
        print(f"warning: {warning.message}", file=sys.stderr)
    print(f"wrote {written} {config.format} rows from {read} trees -> {out}")
    return 0


def add_export_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``export`` to a ``trace-gym`` subparsers object."""
    p = subparsers.add_parser("export", help="finished trees as TRL (SFT, DPO, GRPO) or verl training rows",
                              description=__doc__.splitlines()[0])
    p.add_argument("trees", nargs="+", help="tree files (.jsonl/.parquet) or directories, e.g. runs/x/trees")
    p.add_argument("--format", required=True, choices=EXPORT_FORMATS)
    p.add_argument("--out", required=True, help="output file, .jsonl or .parquet")
    p.add_argument("--objective", default="treerpo", choices=OBJECTIVES, help="verl: advantages of this objective")
    p.add_argument("--normalize-std", action="store_true", help="verl, treerpo: divide by the sibling std")
    p.add_argument("--lone-child", default=None, choices=LONE_CHILD,
                   help="verl, treerpo (default: the objectives module's)")
    p.add_argument("--shared-turns", default=None, choices=SHARED_TURNS,
                   help="verl: a turn shared by several leaves trained once or in every trajectory through it "
                        "(default: the objective's rule, treerpo once, grpo/tree-grpo per-leaf)")
    p.add_argument("--keep", default="success", choices=SFT_KEEP,
                   help="trl-conversational / trl-prompt-completion: the successful leaves (default) or all")
    p.add_argument("--tool-calls", default="inline", choices=TOOL_CALL_STYLES,
                   help="TRL formats: tool calls as the sampled text (default) or as TRL tool_calls messages")
    p.add_argument("--pairs-per-branch", type=int, default=1, help="trl-preference: pairs per branch point")
    p.add_argument("--env", default=None, help="fill tools / ground truth of older tree files from this env id")
    p.set_defaults(func=_main)
    return p
