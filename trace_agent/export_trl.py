"""TRL rows from rollout trees: the message lists behind ``trace-gym export``'s ``trl-*`` formats.

Row shapes follow TRL's dataset formats (huggingface.co/docs/trl/dataset_formats):

* conversational language modeling ``{"messages": [...]}``;
* conversational prompt-completion ``{"prompt": [...], "completion": [...]}``;
* conversational preference ``{"prompt", "chosen", "rejected"}``;
* prompt-only ``{"prompt": [...]}`` plus the columns a GRPO reward function reads.

Messages. A trajectory is the prompt (the root's messages), then each turn's messages: the
assistant's text, then what the env answered, a ``role: "tool"`` message for a tool's
output or an error note (``role: "user"`` where the env says so). It ends at the last
assistant message: the env's verdict after the final answer ("Correct.") would leak the
reward into training text.

Tool calls. Trees store each assistant turn as the text that was sampled, with its calls
inline (``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``), not parsed calls.
``tool_calls="structured"`` re-parses them with the envs' own parser
(:func:`trace_envs.actions.parse_action`) into TRL's form, ``{"role": "assistant",
"content": <the text around the calls>, "tool_calls": [{"type": "function", "function":
{"name", "arguments": {...}}}]}``; a turn that did not parse cleanly (an error, or a
``<tool_call>`` inside ``<think>``) stays inline, since it is what the model wrote. The
default is ``"inline"``, the sampled text itself: a chat template re-renders structured
calls in its own spacing and key order, so they are not the tokens the policy produced,
and Arrow (Parquet, ``datasets``) gives every ``arguments`` dict in a column the union
of all tools' argument names (``"query": null`` in a python call).

Tools. ``tools`` is the env's tool list as a JSON string (``"[]"`` when it has none), the
form of TRL's own tool-calling test data (TRL's SFTTrainer ``json.loads`` a string
``tools``): a list of dicts would be unified across envs by Arrow, turning one tool's
schema into another's with ``null`` fields.

What is trained. In prompt-completion rows the completion holds every turn: assistant
messages and the observations between them, as ``role: "tool"`` messages. Train with
``SFTConfig(assistant_only_loss=True)``: TRL then masks every non-assistant token of the
completion (it swaps in a training chat template with ``{% generation %}`` markers for the
templates it knows); without it, TRL's completion-only loss also trains the observations.

Which leaves. SFT rows keep the successful leaves by default
(:func:`trace_agent.success.is_success`, the project's one success definition);
``keep="all"`` keeps every leaf. Preference rows pair a success with a failure where the
tree branches. GRPO rows are one per distinct prompt, whatever the number of leaves or
trees it has.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any, Literal, get_args

from trace_agent.errors import ExportError
from trace_agent.success import is_success
from trace_agent.tree import Node, RolloutTree

__all__ = [
    "ToolCallStyle",
    "TOOL_CALL_STYLES",
    "SftKeep",
    "SFT_KEEP",
    "structured_message",
    "trajectory_messages",
    "conversational_rows",
    "prompt_completion_rows",
    "preference_rows",
    "grpo_rows",
]

#: How an assistant turn's tool calls appear: the sampled text, or TRL ``tool_calls`` messages.
ToolCallStyle = Literal["inline", "structured"]
TOOL_CALL_STYLES: tuple[str, ...] = get_args(ToolCallStyle)

#: Which leaves SFT rows keep: the successes, or every finished leaf.
SftKeep = Literal["success", "all"]
SFT_KEEP: tuple[str, ...] = get_args(SftKeep)

Message = dict[str, Any]
_OPEN, _CLOSE = "<tool_call>", "</tool_call>"


# --------------------------------------------------------------------------------------------------
# messages


def _without_calls(text: str) -> tuple[str, int]:
    """``text`` without its closed ``<tool_call>...</tool_call>`` spans, and how many there were."""
    kept: list[str] = []
    pos = count = 0
    while (start := text.find(_OPEN, pos)) >= 0:
        end = text.find(_CLOSE, start + len(_OPEN))
        if end < 0:
            break
        kept.append(text[pos:start])
        pos = end + len(_CLOSE)
        count += 1
    kept.append(text[pos:])
    return "".join(kept), count


def structured_message(message: Message) -> Message:
    """An assistant message with inline tool calls as TRL ``tool_calls``; any other message as it is.

    Only a turn that parses cleanly with :func:`trace_envs.actions.parse_action` (calls, no
    errors, no call hidden in ``<think>``) is converted; ``content`` becomes the text around the
    calls, stripped.
    """
    from trace_envs.actions import parse_action

    text = message.get("content")
    if message.get("role") != "assistant" or not isinstance(text, str) or _OPEN not in text:
        return dict(message)
    parsed = parse_action(text)
    rest, spans = _without_calls(text)
    if not parsed.ok or not parsed.tool_calls or spans != len(parsed.tool_calls):
        return dict(message)
    calls = [{"type": "function", "function": {"name": c.name, "arguments": dict(c.arguments)}}
             for c in parsed.tool_calls]
    return {**message, "content": rest.strip(), "tool_calls": calls}


def _styled(messages: Iterable[Message], tool_calls: ToolCallStyle) -> list[Message]:
    if tool_calls not in TOOL_CALL_STYLES:
        raise ExportError(f"tool_calls must be one of {TOOL_CALL_STYLES}, got {tool_calls!r}")
    return [structured_message(m) if tool_calls == "structured" else dict(m) for m in messages]


def _turn_messages(nodes: Sequence[Node]) -> list[Message]:
    return [dict(m) for n in nodes for m in n.messages]


def _until_last_assistant(messages: list[Message]) -> list[Message]:
    """Drop what follows the last assistant message (the env's verdict, a turn-limit note)."""
    last = max((i for i, m in enumerate(messages) if m.get("role") == "assistant"), default=-1)
    return messages[: last + 1]


def trajectory_messages(tree: RolloutTree, leaf: Node, *, tool_calls: ToolCallStyle = "inline") -> list[Message]:
    """The chat of one finished leaf: the prompt, then every turn, ending at the last assistant message."""
    if not leaf.is_leaf:
        raise ExportError(f"node {leaf.node_id} of tree {tree.prompt_id!r} is not a finished leaf")
    chat = [dict(m) for m in tree.root.messages] + _turn_messages(leaf.path()[1:])
    return _styled(_until_last_assistant(chat), tool_calls)


def _tools_json(tree: RolloutTree) -> str:
    return json.dumps([dict(t) for t in tree.tools], ensure_ascii=False)


def _common(tree: RolloutTree, leaf: Node) -> dict[str, Any]:
    return {"tools": _tools_json(tree), "reward": float(leaf.reward),  # type: ignore[arg-type]
            "prompt_id": tree.prompt_id, "task_id": tree.task_id}


def _kept_leaves(tree: RolloutTree, keep: SftKeep) -> list[Node]:
    if keep not in SFT_KEEP:
        raise ExportError(f"keep must be one of {SFT_KEEP}, got {keep!r}")
    return [leaf for leaf in tree.leaves() if keep == "all" or is_success(leaf.reward)]


# --------------------------------------------------------------------------------------------------
# rows


def conversational_rows(tree: RolloutTree, *, keep: SftKeep = "success",
                        tool_calls: ToolCallStyle = "inline") -> list[dict[str, Any]]:
    """``{"messages", "tools", "reward", "prompt_id", "task_id"}`` per kept leaf, in creation order."""
    return [{"messages": trajectory_messages(tree, leaf, tool_calls=tool_calls), **_common(tree, leaf)}
            for leaf in _kept_leaves(tree, keep)]


def prompt_completion_rows(tree: RolloutTree, *, keep: SftKeep = "success",
                           tool_calls: ToolCallStyle = "inline") -> list[dict[str, Any]]:
    """``{"prompt": the root's messages, "completion": every turn, ...}`` per kept leaf (see the module docstring)."""
    n_prompt = len(tree.root.messages)
    rows = []
    for leaf in _kept_leaves(tree, keep):
        messages = trajectory_messages(tree, leaf, tool_calls=tool_calls)
        rows.append({"prompt": messages[:n_prompt], "completion": messages[n_prompt:], **_common(tree, leaf)})
    return rows


def preference_rows(tree: RolloutTree, *, pairs_per_branch: int = 1,
                    tool_calls: ToolCallStyle = "inline") -> list[dict[str, Any]]:
    """Success/failure pairs where ``tree`` branches: for a node with a success below one child and a
    failure below another, ``{"prompt": prompt + history up to the node, "chosen", "rejected", ...}``
    (``pairs_per_branch`` per branch point, first in creation order)."""
    if pairs_per_branch < 1:
        raise ExportError(f"pairs_per_branch must be >= 1, got {pairs_per_branch}")
    rows = []
    for node in tree.nodes:
        if len(node.children) < 2:
            continue
        by_child = [(c, c.leaves()) for c in node.children]
        successes = [(c, leaf) for c, leaves in by_child for leaf in leaves if leaf.is_success]
        failures = [(c, leaf) for c, leaves in by_child for leaf in leaves if not leaf.is_success]
        shared = _styled([dict(m) for m in tree.root.messages] + _turn_messages(node.path()[1:]), tool_calls)
        made = 0
        used: set[int] = set()
        for child_s, s in successes:
            if made >= pairs_per_branch:
                break
            match = next(((c, f) for c, f in failures if c is not child_s and f.node_id not in used), None)
            if match is None:
                continue
            failure = match[1]
            used.add(failure.node_id)
            rows.append({
                "prompt": shared,
                "chosen": _styled(_until_last_assistant(_turn_messages(s.path()[node.depth + 1:])), tool_calls),
                "rejected": _styled(_until_last_assistant(_turn_messages(failure.path()[node.depth + 1:])),
                                    tool_calls),
                "tools": _tools_json(tree), "prompt_id": tree.prompt_id, "task_id": tree.task_id,
                "branch_node": node.node_id, "branch_depth": node.depth,
                "chosen_reward": float(s.reward), "rejected_reward": float(failure.reward),  # type: ignore[arg-type]
            })
            made += 1
    return rows


def grpo_rows(trees: Iterable[RolloutTree]) -> list[dict[str, Any]]:
    """TRL GRPOTrainer prompt-only rows, one per distinct prompt, in first-seen order.

    ``{"prompt": the root's messages, "ground_truth": the task's answer, "task_id", "data_source": the env id}``.
    GRPOTrainer hands every column but ``prompt`` to each reward function as a keyword argument,
    one value per completion: ``def reward(completions, ground_truth, **kwargs)``. A prompt is
    the same when its env id, task id and messages are; trees of several steps or files give
    one row. Raises :class:`ExportError` for a tree without ground truth (``--env`` fills older files).
    """
    rows: list[dict[str, Any]] = []
    seen: set[tuple[str, str, str]] = set()
    for tree in trees:
        data_source = str(tree.metadata.get("env_id", ""))
        key = (data_source, str(tree.task_id), json.dumps(tree.root.messages, sort_keys=True, ensure_ascii=False))
        if key in seen:
            continue
        seen.add(key)
        if tree.ground_truth is None:
            raise ExportError(f"tree {tree.prompt_id!r} (task {tree.task_id!r}) has no ground truth for a reward "
                              "function: pass --env ENV_ID to fill it from the env")
        rows.append({"prompt": [dict(m) for m in tree.root.messages], "ground_truth": tree.ground_truth,
                     "task_id": tree.task_id, "data_source": data_source})
    return rows
