"""BFCL function docs → JSON schemas in OpenAI function format.

BFCL writes parameter types in its own vocabulary (``dict``, ``float``,
``tuple``, ``any`` ...). Chat templates expect JSON Schema, so types are mapped
as bfcl-eval's ``GORILLA_TO_OPENAPI`` table does (``dict`` → ``object``,
``float`` → ``number``, ``tuple`` → ``array``, unknown → ``string``), at every
depth (``properties``, ``items``). ``description``, ``enum``, ``default`` and
``required`` are kept; BFCL's ``response`` block is dropped (it is not part of
the OpenAI format) and the class name bookkeeping key is removed.

:func:`compact_tool` is the short form a small model is shown (``BFCLEnv(tool_detail="compact")``,
``HFPolicy(tool_detail="compact")``): the same names, parameter names, types, ``enum`` and
``required``, without any ``description`` or ``default`` text, which is most of a BFCL doc's
length (multi_turn_base: 14.8k characters of schemas per entry on average in full, 5.4k compact).
:func:`names_tool` keeps only the function's name (0.7k characters per entry): a model that
learned the suite's functions from demonstrations only needs to know which are offered.
:func:`tool_schema` applies a level by name (:data:`TOOL_DETAILS`).
"""


from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

__all__ = ["TYPE_MAP", "TOOL_DETAILS", "to_json_schema", "function_doc_to_tool", "compact_tool", "names_tool",
           "tool_schema"]

#: BFCL type name → JSON Schema type (the multi-turn docs use dict, string, float, integer, array, boolean).
TYPE_MAP: Mapping[str, str] = {
    "integer": "integer",
    "int": "integer",
    "number": "number",
    "float": "number",
    "double": "number",
    "string": "string",
    "str": "string",
    "char": "string",
    "any": "string",
    "boolean": "boolean",
    "bool": "boolean",
    "array": "array",
    "list": "array",
    "tuple": "array",
    "dict": "object",
    "object": "object",
}

_KEPT = ("description", "enum", "default", "required")

#: How much of a schema is rendered: "full" (BFCL's docs), "compact" (:func:`compact_tool`) or
#: "names" (:func:`names_tool`).
TOOL_DETAILS: tuple[str, ...] = ("full", "compact", "names")

_DROPPED_COMPACT = frozenset({"description", "default"})


def to_json_schema(node: Mapping[str, Any]) -> dict[str, Any]:
    """One BFCL parameter node (any depth) → a JSON Schema node; the input is not modified."""
    out: dict[str, Any] = {"type": TYPE_MAP.get(str(node.get("type", "string")), "string")}
    for key in _KEPT:
        if key in node:
            out[key] = copy.deepcopy(node[key])
    if isinstance(node.get("properties"), Mapping):
        out["properties"] = {name: to_json_schema(child) for name, child in node["properties"].items()}
    if isinstance(node.get("items"), Mapping):
        out["items"] = to_json_schema(node["items"])
    if out["type"] == "object" and "properties" not in out:
        out["properties"] = {}
    return out


def function_doc_to_tool(doc: Mapping[str, Any]) -> dict[str, Any]:
    """A BFCL function doc → ``{"type": "function", "function": {name, description, parameters}}``."""
    parameters = to_json_schema(doc.get("parameters") or {"type": "dict", "properties": {}})
    parameters["type"] = "object"
    parameters.setdefault("required", [])
    return {
        "type": "function",
        "function": {
            "name": str(doc["name"]),
            "description": str(doc.get("description", "")),
            "parameters": parameters,
        },
    }


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
    compact_tool(t)``), so a policy that compacts what it is given renders an already compact
    env's tools unchanged; the input is not modified.
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
