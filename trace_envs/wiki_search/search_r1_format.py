"""Search-R1's action and observation format, for ``WikiQA-v0(action_format="search-r1")``.

Search-R1 (Jin et al., 2025; ``search_r1/llm_agent/generation.py``) trains a
policy that acts in plain tags, not tool calls:

* a search: ``<search> query </search>``; the result comes back as
  ``<information>Doc 1(Title: "T") text\\nDoc 2(...) ...</information>`` — each passage
  is the retriever's wiki-18 ``contents`` split at its first line break (the
  title keeps its double quotes, as Search-R1 shows it);
* the final answer: ``<answer> Beijing </answer>``;
* the first ``<search>``/``<answer>`` element of the turn is the action (later
  ones are ignored); text without either is an invalid action, answered with a
  reminder of the format, and the episode goes on.

Parsing is a single left-to-right scan with ``str.find`` (linear time whatever
the text), and ``<think>`` spans are dropped first, as in every WikiQA format.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from trace_envs.actions import strip_thinking

__all__ = [
    "SEARCH_R1_INSTRUCTION",
    "SearchR1Action",
    "parse_search_r1_action",
    "format_information",
    "INVALID_ACTION",
    "MAX_ACTION_CHARS",
]

#: Longer turns are refused with an error observation before any scanning.
MAX_ACTION_CHARS = 200_000

#: The opening instruction for tasks that do not bring their own prompt (ours, not Search-R1's wording).
SEARCH_R1_INSTRUCTION = (
    "Answer the question below. Think inside <think> and </think> whenever you get new information. "
    "If you need to know more, search with <search> your query </search>; the top passages come back "
    "between <information> and </information>. Search as often as you need. When you know the answer, "
    "give it inside <answer> and </answer>, as short as possible, for example <answer> Paris </answer>. "
    "Question: {question}\n"
)

#: The observation after a turn with neither a search nor an answer.
INVALID_ACTION = ("Invalid action: to search, write the query between <search> and </search>; to answer, "
                  "write the answer between <answer> and </answer>.")


@dataclass(frozen=True)
class SearchR1Action:
    """One parsed turn: ``kind`` is "search", "answer" or "invalid"; ``content`` the stripped element text."""

    kind: str
    content: str = ""


def _first_element(text: str) -> SearchR1Action:
    """The first complete ``<search>...</search>`` or ``<answer>...</answer>`` element.

    Linear time: an opener with no closer anywhere after it means no later opener
    of that tag can close either, so each tag is given up at most once.
    """
    last_closer = {tag: text.rfind(f"</{tag}>") for tag in ("search", "answer")}
    pos = 0
    while True:
        found = []
        for tag, closer_at in last_closer.items():
            if closer_at >= 0:
                i = text.find(f"<{tag}>", pos)
                if i >= 0:
                    found.append((i, tag))
        if not found:
            return SearchR1Action("invalid")
        start, tag = min(found)
        body_start = start + len(tag) + 2
        if last_closer[tag] >= body_start:
            end = text.find(f"</{tag}>", body_start)
            return SearchR1Action(tag, text[body_start:end].strip())
        last_closer[tag] = -1
        pos = start + 1


def parse_search_r1_action(text: Any) -> SearchR1Action:
    """Parse one turn in Search-R1's format; never raises (non-text and oversized turns are "invalid")."""
    if not isinstance(text, str) or len(text) > MAX_ACTION_CHARS:
        return SearchR1Action("invalid")
    return _first_element(strip_thinking(text))


def format_information(hits: Sequence[Any], *, max_passage_chars: int) -> str:
    """Passages as Search-R1 shows them: ``Doc i(Title: <first line>) <rest>`` lines, in ``<information>``."""
    lines = []
    for i, hit in enumerate(hits, start=1):
        contents = str(hit.contents)
        title, _, text = contents.partition("\n")
        if len(text) > max_passage_chars:
            text = text[:max_passage_chars].rstrip() + "..."
        lines.append(f"Doc {i}(Title: {title}) {text}")
    body = "\n".join(lines) if lines else "No passages found."
    return f"<information>{body}</information>"
