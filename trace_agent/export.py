"""``trace-gym export``: finished rollout trees as TRL and verl training rows.

Input: the trees ``trace-gym train`` saves (``<run>/trees/step_*.jsonl``) or any
file written by :func:`trace_agent.tree.save_jsonl` / :func:`~trace_agent.tree.save_parquet`
(a directory is read whole, files in name order). Output: ``.jsonl`` or
``.parquet`` rows (Parquet via pyarrow: messages become lists of
``{role, content}`` structs), one of four formats:

``trl-conversational``
    TRL's conversational language-modeling rows, one per finished leaf:
    ``{"messages": [system, user, assistant, tool, ..., assistant], "tools": [...],
    "reward", "prompt_id", "task_id"}`` (``tools`` only when the env has tools).
``trl-prompt-completion``
    TRL's conversational prompt-completion rows, one per finished leaf:
    ``{"prompt": [the prompt's messages], "completion": [assistant, tool, ..., assistant], ...}``.
``trl-preference``
    TRL's conversational preference rows, built where trees branch: for a node
    with a success below one child and a failure below another,
    ``{"prompt": [prompt + history up to the node], "chosen": [the success's turns from there],
    "rejected": [the failure's], ...}`` (``pairs_per_branch`` pairs per branch point,
    first in creation order). A flat group branches at the root, so GRPO trees give
    prompt-level pairs and TRACE trees also give mid-trajectory ones.
``verl``
    verl's per-trajectory rows, shaped like its agent loop's output
    (``AgentLoopOutput``): ``prompt_ids`` (the rendered prompt, the root's ids),
    ``response_ids`` (every turn's generated ids, then the observation ids appended
    after it, exactly as sampled and fed), ``response_mask`` (1 on generated
    tokens, 0 on observation tokens), ``response_logprobs`` (behaviour log-probs; 0
    on observation tokens; None when a turn did not record them), ``advantages``
    (per response token, 0 where the mask is 0: under ``grpo``/``tree-grpo`` the
    trajectory's own leaf advantage, :func:`trace_agent.objectives.grpo_leaf_advantages` /
    :func:`~trace_agent.objectives.tree_grpo_leaf_advantages`; under ``treerpo`` each
    turn's node advantage, :func:`~trace_agent.objectives.node_advantages`; the
    objectives module's own defaults apply unless an option is given),
    ``reward_score``, ``num_turns`` (user, assistant and tool messages), ``uid``
    (the prompt id: verl's group key), ``data_source`` (the env id),
    ``reward_model = {"style": "rule", "ground_truth": ...}`` and ``extra_info``.
    A turn shared by several leaves (a prefix that was continued from) follows the
    objective's rule by default: under ``treerpo`` it is trained once (its own
    sample, in the first trajectory through it; later ones carry it with mask 0
    and advantage 0); under ``grpo``/``tree-grpo`` every trajectory is a full-path
    sample with its leaf's advantage (``"per-leaf"``, as verl and the official
    Tree-GRPO code train it). ``shared_turns="once"`` or ``"per-leaf"`` forces
    either (``once`` under GRPO uses the mean leaf advantage of the turn).

The env's verdict. A leaf's last message is the env's reaction to the final
answer ("Correct.", "Answer received: ..."); it would leak the reward into
training text, so every trajectory ends at its last assistant message (TRL
formats), and the leaf's appended ids (end-of-turn glue after the final
generation) are not part of a verl response.

Tools and ground truth come from the tree (recorded by the collector since
these fields exist); for older files, ``--env ID`` rebuilds them from the env
(``reset(options={"task_id": ...})``: its ``tools`` and the task's answer).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trace_agent.errors import ExportError, TreeError
from trace_agent.options import LONE_CHILD, OBJECTIVES, SHARED_TURNS, either
from trace_agent.tree import Node, RolloutTree, ground_truth_of
from trace_agent.tree_io import load_jsonl, load_parquet

__all__ = [
    "EXPORT_FORMATS",
    "ExportConfig",
    "ExportError",
    "trajectory_messages",
    "export_rows",
    "read_trees",
    "write_rows",
    "fill_from_env",
    "add_export_parser",
]

#: ``--format`` values.
EXPORT_FORMATS = ("trl-conversational", "trl-prompt-completion", "trl-preference", "verl")

Message = dict[str, Any]


@dataclass(frozen=True, kw_only=True)
class ExportConfig:
    """What to export.

    Attributes:
        format: one of :data:`EXPORT_FORMATS`.
        objective: verl advantages: "treerpo", "grpo" or "tree-grpo" (see :mod:`trace_agent.objectives`).
        normalize_std: TreeRPO only: divide by the sibling std.
        lone_child: TreeRPO only: "zero" or "inherit" (None: the objectives module's default).
        shared_turns: verl only: "once", "per-leaf", or None (the objective's rule; see the module docstring).
        min_reward: TRL conversational / prompt-completion: keep leaves with reward >= this (None: all).
        pairs_per_branch: TRL preference: pairs per branch point (>= 1).
    """

    format: str
    objective: str = "treerpo"
    normalize_std: bool = False
    lone_child: str | None = None
    shared_turns: str | None = None
    min_reward: float | None = None
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
        if self.pairs_per_branch < 1:
            raise ExportError(f"pairs_per_branch must be >= 1, got {self.pairs_per_branch}")

    @property
    def shared_rule(self) -> str:
        """The rule for turns shared by several leaves: the option, else the objective's own."""
        return self.shared_turns or ("once" if self.objective == "treerpo" else "per-leaf")


# --------------------------------------------------------------------------------------------------
# messages


def _turn_messages(nodes: Sequence[Node]) -> list[Message]:
    return [dict(m) for n in nodes for m in n.messages]


def _until_last_assistant(messages: list[Message]) -> list[Message]:
    """Drop what follows the last assistant message (the env's verdict, a turn-limit note)."""
    last = max((i for i, m in enumerate(messages) if m.get("role") == "assistant"), default=-1)
    return messages[: last + 1]


def trajectory_messages(tree: RolloutTree, leaf: Node) -> list[Message]:
    """The chat of one finished leaf: the prompt, then every turn, ending at the last assistant message."""
    if not leaf.is_leaf:
        raise ExportError(f"node {leaf.node_id} of tree {tree.prompt_id!r} is not a finished leaf")
    return _until_last_assistant([dict(m) for m in tree.root.messages] + _turn_messages(leaf.path()[1:]))


def _common(tree: RolloutTree, leaf: Node) -> dict[str, Any]:
    return {"reward": float(leaf.reward), "prompt_id": tree.prompt_id, "task_id": tree.task_id}  # type: ignore[arg-type]


def _with_tools(row: dict[str, Any], tree: RolloutTree) -> dict[str, Any]:
    if tree.tools:
        row["tools"] = [dict(t) for t in tree.tools]
    return row


def _kept(leaf: Node, config: ExportConfig) -> bool:
    return config.min_reward is None or float(leaf.reward) >= config.min_reward  # type: ignore[arg-type]


def _conversational(tree: RolloutTree, config: ExportConfig) -> list[dict[str, Any]]:
    return [_with_tools({"messages": trajectory_messages(tree, leaf), **_common(tree, leaf)}, tree)
            for leaf in tree.leaves() if _kept(leaf, config)]


def _prompt_completion(tree: RolloutTree, config: ExportConfig) -> list[dict[str, Any]]:
    rows = []
    n_prompt = len(tree.root.messages)
    for leaf in tree.leaves():
        if _kept(leaf, config):
            messages = trajectory_messages(tree, leaf)
            rows.append(_with_tools({"prompt": messages[:n_prompt], "completion": messages[n_prompt:],
                                     **_common(tree, leaf)}, tree))
    return rows


def _preference(tree: RolloutTree, config: ExportConfig) -> list[dict[str, Any]]:
    rows = []
    for node in tree.nodes:
        if len(node.children) < 2:
            continue
        by_child = [(c, c.leaves()) for c in node.children]
        successes = [(c, leaf) for c, leaves in by_child for leaf in leaves if leaf.is_success]
        failures = [(c, leaf) for c, leaves in by_child for leaf in leaves if not leaf.is_success]
        shared = [dict(m) for m in tree.root.messages] + _turn_messages(node.path()[1:])
        made = 0
        used: set[int] = set()
        for child_s, s in successes:
            if made >= config.pairs_per_branch:
                break
            match = next(((c, f) for c, f in failures if c is not child_s and f.node_id not in used), None)
            if match is None:
                continue
            used.add(match[1].node_id)
            path_s = s.path()[node.depth + 1:]
            path_f = match[1].path()[node.depth + 1:]
            rows.append(_with_tools({
                "prompt": shared,
                "chosen": _until_last_assistant(_turn_messages(path_s)),
                "rejected": _until_last_assistant(_turn_messages(path_f)),
                "prompt_id": tree.prompt_id, "task_id": tree.task_id, "branch_node": node.node_id,
                "branch_depth": node.depth, "chosen_reward": float(s.reward),  # type: ignore[arg-type]
                "rejected_reward": float(match[1].reward),  # type: ignore[arg-type]
            }, tree))
            made += 1
    return rows


def _advantages(tree: RolloutTree, config: ExportConfig) -> tuple[dict[int, float] | None, dict[int, float]]:
    """(leaf id -> advantage for per-leaf GRPO samples, else None; node id -> advantage)."""
    from trace_agent import objectives

    if config.objective != "treerpo" and config.shared_rule == "per-leaf":
        leaf_fn = objectives.grpo_leaf_advantages if config.objective == "grpo" else objectives.tree_grpo_leaf_advantages
        return leaf_fn(tree), {}
    options: dict[str, Any] = {}
    if config.objective == "treerpo":
        options["normalize_std"] = config.normalize_std
        if config.lone_child is not None:
            options["lone_child"] = config.lone_child
    return None, objectives.node_advantages(tree, config.objective, **options)  # type: ignore[arg-type]


def _verl(tree: RolloutTree, config: ExportConfig) -> list[dict[str, Any]]:
    leaves = tree.leaves()
    if leaves and not tree.root.observation_ids:
        raise ExportError(f"tree {tree.prompt_id!r} holds no prompt token ids (root observation_ids): verl rows "
                          "need the trees the collector records (trace-gym train / bench)")
    per_leaf, advantages = _advantages(tree, config)
    emitted: set[int] = set()
    rows = []
    for leaf in leaves:
        ids: list[int] = []
        mask: list[int] = []
        logprobs: list[float] | None = []
        adv: list[float] = []
        path = leaf.path()[1:]
        for node in path:
            train = config.shared_rule == "per-leaf" or node.node_id not in emitted
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
            "response_logprobs": logprobs, "advantages": adv, "reward_score": float(leaf.reward),  # type: ignore[arg-type]
            "num_turns": sum(1 for m in messages if m.get("role") != "system"), "uid": tree.prompt_id,
            "data_source": str(tree.metadata.get("env_id", "")),
            "reward_model": {"style": "rule", "ground_truth": tree.ground_truth},
            "extra_info": {"task_id": tree.task_id, "leaf_node_id": leaf.node_id, "objective": config.objective,
                           "num_assistant_turns": len(path)},
        })
    return rows


_BUILDERS = {"trl-conversational": _conversational, "trl-prompt-completion": _prompt_completion,
             "trl-preference": _preference, "verl": _verl}


def export_rows(trees: Iterable[RolloutTree], config: ExportConfig) -> list[dict[str, Any]]:
    """The rows of ``config.format`` for ``trees``, tree by tree, leaves in creation order."""
    build = _BUILDERS[config.format]
    return [row for tree in trees for row in build(tree, config)]


# --------------------------------------------------------------------------------------------------
# files


def read_trees(paths: Sequence[str | Path]) -> list[RolloutTree]:
    """Trees from ``.jsonl`` / ``.parquet`` files or directories of them (in name order).

    Raises:
        ExportError: a missing path, another file type, or a file that is not a tree file.
    """
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
    trees: list[RolloutTree] = []
    for path in files:
        if path.suffix not in (".jsonl", ".parquet"):
            raise ExportError(f"{path}: tree files are .jsonl or .parquet (written by trace-gym train / bench)")
        try:
            trees += load_jsonl(path) if path.suffix == ".jsonl" else load_parquet(path)
        except (TreeError, ValueError, KeyError, TypeError, OSError) as exc:
            raise ExportError(f"{path} is not a rollout-tree file: {type(exc).__name__}: {exc}") from None
    return trees


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


def write_rows(rows: Sequence[dict[str, Any]], out: str | Path) -> Path:
    """Write rows as JSONL (``.jsonl``) or Parquet (``.parquet``, schema inferred by pyarrow)."""
    out = Path(out)
    if out.suffix not in (".jsonl", ".parquet"):
        raise ExportError(f"--out must end in .jsonl or .parquet, got {out.name!r}")
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.suffix == ".jsonl":
        with out.open("w", encoding="utf-8") as fh:
            for row in rows:
                fh.write(json.dumps(row, ensure_ascii=False, allow_nan=False) + "\n")
        return out
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pa.Table.from_pylist(list(rows))
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        raise ExportError(f"these rows do not fit one Parquet schema ({exc}); write .jsonl instead") from None
    pq.write_table(table, out)
    return out


# --------------------------------------------------------------------------------------------------
# command line


def _main(args: argparse.Namespace) -> int:
    import sys

    try:
        config = ExportConfig(format=args.format, objective=args.objective, normalize_std=args.normalize_std,
                              lone_child=args.lone_child, shared_turns=args.shared_turns, min_reward=args.min_reward,
                              pairs_per_branch=args.pairs_per_branch)
        trees = read_trees(args.trees)
        if args.env:
            fill_from_env(trees, args.env)
        rows = export_rows(trees, config)
        out = write_rows(rows, args.out)
    except ExportError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {len(rows)} {config.format} rows from {len(trees)} trees -> {out}")
    return 0


def add_export_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``export`` to a ``trace-gym`` subparsers object."""
    p = subparsers.add_parser("export", help="finished trees as TRL or verl training rows",
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
    p.add_argument("--min-reward", type=float, default=None,
                   help="trl-conversational / trl-prompt-completion: keep leaves with at least this reward")
    p.add_argument("--pairs-per-branch", type=int, default=1, help="trl-preference: pairs per branch point")
    p.add_argument("--env", default=None, help="fill tools / ground truth of older tree files from this env id")
    p.set_defaults(func=_main)
    return p
