"""OpenAI-format tool schemas at a level of detail: the one trimming rule every renderer and env applies.

A tool schema here is ``{"type": "function", "function": {"name", "description", "parameters"}}``,
whatever env it comes from. :func:`tool_schema` gives it at a level of :data:`TOOL_DETAILS`:

* ``"full"``: unchanged (a copy);
* ``"compact"`` (:func:`compact_tool`): the same names, parameter names, types, ``enum``, ``items``,
  ``properties`` and ``required``, without any ``description`` or ``default`` text, which is most of a
  long schema's length (BFCL multi_turn_base: 14.8k characters of schemas per entry on average in
  full, 5.4k compact);
* ``"names"`` (:func:`names_tool`): only the function's name (0.7k characters per BFCL entry): a model
  that learned an env's functions from demonstrations only needs to know which are offered.

Every level is idempotent and coarser levels absorb finer ones (``names_tool(compact_tool(t)) ==
names_tool(t)``), so a renderer that trims what an already-trimmed env gives it renders it unchanged.
The chat renderer (``trace_agent.policy.chat.ChatRenderer(tool_detail=...)``) applies it to the tools of
every root context, for every backend alike; an env may trim its own schemas too (``BFCL-v0``'s
``tool_detail``). The input is never modified.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

__all__ = ["TOOL_DETAILS", "compact_tool", "names_tool", "tool_schema", "check_tool_detail"]

#: How much of a schema is rendered: "full", "compact" (:func:`compact_tool`) or "names" (:func:`names_tool`).
TOOL_DETAILS: tuple[str, ...] = ("full", "compact", "names")

_DROPPED_COMPACT = frozenset({"description", "default"})


def check_tool_detail(detail: str) -> str:
    """``detail`` when it is one of :data:`TOOL_DETAILS`, else ``ValueError`` naming the levels."""
    if detail not in TOOL_DETAILS:
        raise ValueError(f"tool_detail must be one of {', '.join(TOOL_DETAILS)}, got {detail!r}")
    return detail


def _compact_node(node: Any) -> Any:
    if isinstance(node, Mapping):
        out: dict[str, Any] = {}
        for key, value in node.items():
            if key in _DROPPED_COMPACT:
                continue
            # "properties" maps parameter names to schemas: the names are kept even if one is "description"
            out[key] = ({name: _compact_node(child) for name, child in value.items()}
                        if key == "properties" and isinstance(value, Mapping) else _compact_node(value))
        return out
    if isinstance(node, list):
        return [_compact_node(v) for v in node]
    return copy.deepcopy(node)


def compact_tool(tool: Mapping[str, Any]) -> dict[str, Any]:
    """An OpenAI-format tool schema without ``description`` / ``default`` text, at every depth.

    Names, parameter names, ``type``, ``enum``, ``items``, ``properties`` and ``required`` stay (a
    parameter *named* "description" stays too). Idempotent (``compact_tool(compact_tool(t)) ==
    compact_tool(t)``); the input is not modified.
    """
    if not isinstance(tool, Mapping):
        raise TypeError(f"a tool schema is a mapping, got {type(tool).__name__}")
    return _compact_node(tool)


def names_tool(tool: Mapping[str, Any]) -> dict[str, Any]:
    """``{"type": "function", "function": {"name": ...}}``: only the function's name (idempotent)."""
    if not isinstance(tool, Mapping) or not isinstance(tool.get("function"), Mapping):
        raise TypeError("a tool schema is a mapping with a 'function' mapping (OpenAI format)")
    return {"type": "function", "function": {"name": str(tool["function"].get("name", ""))}}


def tool_schema(tool: Mapping[str, Any], detail: str) -> dict[str, Any]:
    """``tool`` at the level ``detail`` ("full": a copy, "compact", "names"); ValueError for another level."""
    if detail == "full":
        return copy.deepcopy(dict(tool))
    if detail == "compact":
        return compact_tool(tool)
    if detail == "names":
        return names_tool(tool)
    raise ValueError(f"tool detail must be one of {', '.join(TOOL_DETAILS)}, got {detail!r}")
