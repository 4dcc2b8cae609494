"""BFCL function docs → JSON schemas in OpenAI function format.

BFCL writes parameter types in its own vocabulary (``dict``, ``float``,
``tuple``, ``any`` ...). Chat templates expect JSON Schema, so types are mapped
as bfcl-eval's ``GORILLA_TO_OPENAPI`` table does (``dict`` → ``object``,
``float`` → ``number``, ``tuple`` → ``array``, unknown → ``string``), at every
depth (``properties``, ``items``). ``description``, ``enum``, ``default`` and
``required`` are kept; BFCL's ``response`` block is dropped (it is not part of
the OpenAI format) and the class name bookkeeping key is removed.

The levels of detail a schema is shown at (``BFCLEnv(tool_detail=...)``, a policy's ``tool_detail``)
are env-agnostic: :func:`compact_tool`, :func:`names_tool`, :func:`tool_schema` and :data:`TOOL_DETAILS`
live in :mod:`trace_envs.tool_schemas` and are re-exported here.
"""


from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from trace_envs.tool_schemas import TOOL_DETAILS, compact_tool, names_tool, tool_schema

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
