"""Bounds on reading user files: configs, ``--set`` values, task files, tree files, exported rows.

A user file is read only within these limits, checked before the expensive work (a size before
the file is read, a line's length before it is parsed, nesting before a recursive parser sees
it, YAML aliases while the document is composed, before anything is built from it). A file
beyond one is refused with one line that names the file (and row or key), the limit and the
environment variable that raises it. Defaults:

==========================  ============  ===============================================================
setting                     default       what it bounds
==========================  ============  ===============================================================
``config_bytes``            1 MiB         a YAML config file, and each ``--set`` value
``yaml_aliases``            100           alias references (``*name``) in one YAML document
``yaml_nodes``              100,000       nodes of one YAML document with every alias expanded
``nesting``                 100           nesting of lists / mappings in a YAML or JSON document or row
``task_file_bytes``         1 GiB         a task file (.json, .jsonl, .parquet)
``json_document_bytes``     256 MiB       a ``.json`` task file, parsed whole (JSONL and Parquet stream)
``row_bytes``               16 MiB        one line of a JSONL task or row file; one Parquet row group
                                          (uncompressed) is held to 16 x this
``field_chars``             1,000,000     one text field of a task row
``tree_file_bytes``         4 GiB         a tree file or an exported row file
``tree_bytes``              64 MiB        one tree (a line of a tree JSONL file)
``tree_nodes``              250,000       nodes of one tree
``draw_nodes``              5,000         nodes of a tree ``show-tree`` draws (a bigger picture is unreadable)
==========================  ============  ===============================================================

Each can be changed per process with ``TRACE_GYM_LIMIT_<SETTING>`` (upper case), e.g.
``TRACE_GYM_LIMIT_ROW_BYTES=67108864``; :func:`read_limits` reads them. This module imports
nothing heavy.
"""

from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass

__all__ = ["ReadLimits", "read_limits", "limit_hint", "data_problem", "json_nesting", "ENV_PREFIX"]

#: Prefix of the environment variables that override a limit (``TRACE_GYM_LIMIT_ROW_BYTES``).
ENV_PREFIX = "TRACE_GYM_LIMIT_"


@dataclass(frozen=True, kw_only=True)
class ReadLimits:
    """The limits of the module doc (every field a positive integer)."""

    config_bytes: int = 1 << 20
    yaml_aliases: int = 100
    yaml_nodes: int = 100_000
    nesting: int = 100
    task_file_bytes: int = 1 << 30
    json_document_bytes: int = 256 << 20
    row_bytes: int = 16 << 20
    field_chars: int = 1_000_000
    tree_file_bytes: int = 4 << 30
    tree_bytes: int = 64 << 20
    tree_nodes: int = 250_000
    draw_nodes: int = 5_000

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"read limit {f.name} must be a positive integer, got {value!r}")


def read_limits() -> ReadLimits:
    """:class:`ReadLimits` with every ``TRACE_GYM_LIMIT_<SETTING>`` environment variable applied.

    Raises ``ValueError`` naming the variable when one is not a positive integer.
    """
    changes: dict[str, int] = {}
    for f in dataclasses.fields(ReadLimits):
        name = ENV_PREFIX + f.name.upper()
        raw = os.environ.get(name)
        if raw is None or not raw.strip():
            continue
        try:
            changes[f.name] = int(raw.strip())
        except ValueError:
            raise ValueError(f"{name}={raw!r}: expected a positive integer") from None
        if changes[f.name] < 1:
            raise ValueError(f"{name}={raw!r}: expected a positive integer")
    return ReadLimits(**changes)


def limit_hint(setting: str) -> str:
    """``"(limit ..., TRACE_GYM_LIMIT_X raises it)"`` text for an error message about ``setting``."""
    return f"{ENV_PREFIX}{setting.upper()} raises it"


def data_problem(value: object, *, nesting: int, field_chars: int | None = None) -> str | None:
    """What in ``value`` (parsed JSON-like data) breaks a limit, or None: nesting deeper than ``nesting``,
    or (with ``field_chars``) a string longer than that. Walks iteratively: no recursion, whatever the depth."""
    def wanted(v: object) -> bool:
        return isinstance(v, dict | list | tuple) or (field_chars is not None and isinstance(v, str)
                                                      and len(v) > field_chars)

    stack: list[tuple[object, int, str]] = [(value, 1, "")]
    while stack:
        item, depth, key = stack.pop()
        if isinstance(item, dict | list | tuple):
            if depth > nesting:
                return f"nests deeper than {nesting} levels (at {key or 'the top'}; {limit_hint('nesting')})"
            pairs = item.items() if isinstance(item, dict) else enumerate(item)
            # only containers and overlong strings are pushed: a list of a million ids costs one pass
            stack.extend((v, depth + 1, (f"{key}.{k}" if key else str(k)) if isinstance(item, dict) else f"{key}[{k}]")
                         for k, v in pairs if wanted(v))
        elif isinstance(item, str) and field_chars is not None and len(item) > field_chars:
            return (f"field {key or 'value'} holds {len(item)} characters, more than {field_chars} "
                    f"({limit_hint('field_chars')})")
    return None


_JSON_TOKENS = re.compile(rb'"(?:[^"\\]|\\.)*"|[\[\]{}]')


def json_nesting(text: bytes) -> int:
    """The deepest nesting of ``[`` / ``{`` in JSON ``text`` (brackets inside strings do not count), without
    parsing it: only strings and brackets are visited (by the regex engine), so numbers cost nothing."""
    depth = deepest = 0
    for match in _JSON_TOKENS.finditer(text):
        token = match.group()
        if token in (b"[", b"{"):
            depth += 1
            deepest = max(deepest, depth)
        elif token in (b"]", b"}"):
            depth -= 1
    return deepest
