"""Predictor context strings: a prompt and the history up to a node, serialised and joined by one separator.

The predictor reads a *context*: the serialised prompt plus the interaction history up to
a node, joined by :data:`CONTEXT_SEPARATOR` so a reader can split them and truncate the
history but never the prompt (:func:`make_context` / :func:`split_context`).
:func:`format_messages` serialises chat messages losslessly. A tree builds a node's context
with :meth:`~trace_agent.tree.RolloutTree.context`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["CONTEXT_SEPARATOR", "format_messages", "make_context", "split_context"]

#: Joins the serialised prompt and the history in a context string.
CONTEXT_SEPARATOR = "\n<|trace-history|>\n"


def format_messages(messages: Sequence[Mapping[str, Any]]) -> str:
    """Serialise chat messages as ``<|role|>\\ncontent`` blocks (non-text content as JSON).

    Extra keys (``tool_calls``, ``name``, ...) are appended as a JSON line so nothing a
    message carries is lost to the predictor.
    """
    parts = []
    for msg in messages:
        role = str(msg.get("role", "unknown"))
        content = msg.get("content", "")
        text = content if isinstance(content, str) else json.dumps(content, sort_keys=True, default=str)
        extra = {k: v for k, v in msg.items() if k not in ("role", "content")}
        if extra:
            text = f"{text}\n{json.dumps(extra, sort_keys=True, default=str)}"
        parts.append(f"<|{role}|>\n{text}")
    return "\n".join(parts)


def make_context(prompt: str, history: str = "") -> str:
    """The context string for a node: ``prompt + CONTEXT_SEPARATOR + history``.

    The prompt must not contain the separator (it would make the split ambiguous).
    """
    if CONTEXT_SEPARATOR in prompt:
        raise ValueError("the prompt text contains CONTEXT_SEPARATOR; it cannot be split back")
    return f"{prompt}{CONTEXT_SEPARATOR}{history}"


def split_context(context: str) -> tuple[str, str]:
    """(prompt, history) of a context; a string without the separator is all prompt."""
    prompt, sep, history = context.partition(CONTEXT_SEPARATOR)
    return (prompt, history) if sep else (context, "")
