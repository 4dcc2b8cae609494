"""Parsing one turn of model text into tool calls or a final answer.

This is the only place where model output is interpreted. Model output is
untrusted: it is parsed (``json``, ``ast`` literals), never evaluated, and
every problem becomes a human-readable message that the env shows the model
as its observation instead of raising.

Formats:

* Qwen3 / Hermes tool calls, one JSON object per block::

      <tool_call>{"name": "python", "arguments": {"code": "print(1)"}}</tool_call>

* a final answer, optionally with ``\\boxed{...}`` inside::

      <answer>\\boxed{42}</answer>

Text inside ``<think>...</think>`` is ignored.

Bounds (model output is hostile): a turn longer than ``MAX_ACTION_CHARS`` is
refused before any scanning; tags are found with ``str.find`` in one left-to-right
pass (linear in the text, however many unclosed openers it holds — lazy regexes
are quadratic there); a JSON body nested deeper than ``MAX_NESTING`` is refused
by a linear pre-scan before ``json.loads`` sees it, and every error ``json`` can
raise (``ValueError`` for a 5,000-digit integer, ``RecursionError``) becomes an
error message. The same bounds hold for BFCL call lists.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "ToolCall",
    "ParsedAction",
    "parse_action",
    "extract_boxed",
    "strip_thinking",
    "format_tool_call",
    "MAX_ACTION_CHARS",
    "MAX_NESTING",
    "scrub_surrogates",
]

#: the longest turn parsed at all; a longer one is an error observation.
MAX_ACTION_CHARS = 100_000
#: the deepest ``[``/``{`` (JSON) or bracket (call list) nesting accepted.
MAX_NESTING = 64


def scrub_surrogates(text: str) -> str:
    """``text`` with every lone UTF-16 surrogate replaced by U+FFFD (a split pair is joined), so it encodes as UTF-8.

    Interpreter output and JSON escapes (``"\\ud800"``) can carry lone surrogates, which
    tokenizers, JSON writers and the JVM refuse. Valid text is returned unchanged (one encode check).
    """
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def _tag_spans(text: str, opener: str, closer: str, *, run_to_end: bool = False) -> tuple[list[str], str]:
    """Bodies of the non-overlapping ``opener ... closer`` spans, left to right, and the text without them.

    The same spans as the lazy regex ``opener(.*?)closer`` would find, in one linear pass: each
    ``find`` starts where the previous span ended, and the first opener without a closer ends the
    scan (every later opener lacks one too). ``run_to_end``: an unclosed span runs to the end of the
    text and is removed (as ``<think>`` spans are).
    """
    bodies: list[str] = []
    kept: list[str] = []
    pos = 0
    while True:
        start = text.find(opener, pos)
        if start < 0:
            break
        end = text.find(closer, start + len(opener))
        if end < 0:
            if run_to_end:
                bodies.append(text[start + len(opener):])
                kept.append(text[pos:start])
                pos = len(text)
            break
        bodies.append(text[start + len(opener):end])
        kept.append(text[pos:start])
        pos = end + len(closer)
    kept.append(text[pos:])
    return bodies, "".join(kept)


def _json_depth_exceeds(body: str, limit: int) -> bool:
    """Whether ``[``/``{`` nesting outside JSON strings goes deeper than ``limit`` (one linear pass)."""
    depth = 0
    in_string = escaped = False
    for ch in body:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            if depth > limit:
                return True
        elif ch in "]}":
            depth -= 1
    return False


def _loads(text: str) -> tuple[bool, Any]:
    """``json.loads`` that never raises: (True, value) or (False, a short reason)."""
    if _json_depth_exceeds(text, MAX_NESTING):
        return False, f"nested deeper than {MAX_NESTING} levels"
    try:
        return True, json.loads(text)
    except json.JSONDecodeError as exc:
        return False, f"{exc.msg} at position {exc.pos}"
    except (ValueError, RecursionError, MemoryError, TypeError) as exc:  # e.g. an integer of 5,000 digits
        return False, str(exc).split(":")[0][:120] or type(exc).__name__


@dataclass(frozen=True)
class ToolCall:
    """One requested tool invocation: a function name and its JSON arguments."""

    name: str
    arguments: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps({"name": self.name, "arguments": dict(self.arguments)}, ensure_ascii=False)


class _Problems:
    """``ok`` and the observation text of a parse result that carries ``errors``."""

    errors: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not self.errors

    def error_message(self) -> str:
        """All problems as one observation text for the model."""
        return "Error: " + " ".join(self.errors)


@dataclass(frozen=True)
class ParsedAction(_Problems):
    """What one turn of model text asks for.

    Exactly one of these holds: ``errors`` is non-empty (the turn was
    malformed), ``answer`` is not None (the episode should end), or
    ``tool_calls`` is non-empty. ``text`` is the raw turn.
    """

    text: str
    tool_calls: tuple[ToolCall, ...] = ()
    answer: str | None = None
    errors: tuple[str, ...] = ()


def strip_thinking(text: str) -> str:
    """Remove ``<think>...</think>`` spans (an unclosed one runs to the end); linear time."""
    return _tag_spans(text, "<think>", "</think>", run_to_end=True)[1]


def extract_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` in ``text`` (braces balanced), or None."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    i = start + len("\\boxed{")
    depth = 1
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i:j]
    return None


def _parse_call_body(body: str, index: int) -> ToolCall | str:
    """One ``<tool_call>`` body → ToolCall, or an error sentence."""
    where = f"tool call #{index}"
    ok, obj = _loads(body.strip())
    if not ok:
        return f"{where} is not valid JSON ({obj})."
    if not isinstance(obj, dict):
        return f"{where} must be a JSON object with 'name' and 'arguments'."
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return f"{where} has no 'name' string."
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):  # some models emit arguments as a JSON string
        ok, args = _loads(args) if args.strip() else (True, {})
        if not ok:
            return f"{where}: 'arguments' is a string that is not valid JSON."
    if not isinstance(args, dict):
        return f"{where}: 'arguments' must be a JSON object."
    return ToolCall(name=name, arguments=args)


def _too_long(text: str, max_chars: int) -> str | None:
    if len(text) > max_chars:
        return f"the turn is {len(text):,} characters long; at most {max_chars:,} are accepted."
    return None


def parse_action(text: str, *, max_tool_calls: int | None = None, allow_answer: bool = True,
                 max_chars: int = MAX_ACTION_CHARS) -> ParsedAction:
    """Parse one assistant turn in time linear in its length.

    Args:
        text: the raw model output for this turn.
        max_tool_calls: more calls than this in one turn is an error (None: no limit).
        allow_answer: whether ``<answer>`` is a valid way to end the turn.
        max_chars: a longer turn is refused unparsed.

    Returns:
        A ParsedAction; malformed text yields ``errors`` and never raises.
    """
    if not isinstance(text, str):
        return ParsedAction(text=repr(text)[:200], errors=(f"the action must be text, got {type(text).__name__}.",))
    too_long = _too_long(text, max_chars)
    if too_long:
        return ParsedAction(text=text, errors=(too_long,))
    visible = strip_thinking(text)
    errors: list[str] = []
    calls: list[ToolCall] = []
    bodies, remainder = _tag_spans(visible, "<tool_call>", "</tool_call>")
    limit = len(bodies) if max_tool_calls is None else max_tool_calls + 1
    for index, body in enumerate(bodies[:limit], start=1):  # calls past the limit are an error anyway
        parsed = _parse_call_body(body, index)
        if isinstance(parsed, str):
            errors.append(parsed)
        else:
            calls.append(parsed)
    if "<tool_call>" in remainder:
        errors.append("a <tool_call> tag is not closed with </tool_call>.")
    answers, rest = _tag_spans(remainder, "<answer>", "</answer>")
    if "<answer>" in rest:
        errors.append("an <answer> tag is not closed with </answer>.")
    answer: str | None = None
    if answers:
        if not allow_answer:
            errors.append("an <answer> is not accepted here.")
        else:
            raw = answers[-1]
            boxed = extract_boxed(raw)
            answer = (boxed if boxed is not None else raw).strip()
            if not answer:
                errors.append("the <answer> is empty.")
    if answer is not None and (calls or errors) and not errors:
        errors.append("give either tool calls or a final <answer> in one turn, not both.")
    if max_tool_calls is not None and len(bodies) > max_tool_calls:
        errors.append(f"at most {max_tool_calls} tool call(s) per turn, got {len(bodies)}.")
    if not errors and not calls and answer is None:
        errors.append(
            "no tool call or answer found. Call a tool with "
            '<tool_call>{"name": ..., "arguments": {...}}</tool_call> or finish with <answer>...</answer>.'
        )
    if errors:
        return ParsedAction(text=text, errors=tuple(errors))
    return ParsedAction(text=text, tool_calls=tuple(calls), answer=answer)


def format_tool_call(name: str, arguments: Mapping[str, Any]) -> str:
    """The canonical text of one tool call, as a policy should emit it."""
    return "<tool_call>" + ToolCall(name, dict(arguments)).to_json() + "</tool_call>"


# ---------------------------------------------------------------------------
# BFCL's Python-style call lists: ``[func(a=1), other("x", b=[1, 2])]``.
#
# The text is parsed with ``ast`` and every argument goes through
# ``ast.literal_eval`` on its own node, so only literals (str, bytes, numbers,
# bool, None, tuples, lists, dicts, sets) are accepted. Names, attributes,
# calls, subscripts, comprehensions, lambdas and ``*``/``**`` unpacking are
# refused, as are function names that are dotted or start with "_". Nothing is
# ever evaluated.

__all__ += ["PythonCall", "ParsedCallList", "parse_call_list", "looks_like_call_list"]

_FENCE_TAG = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_+-")
_CALL_START = re.compile(r"^(\[\s*[A-Za-z_][\w.]*\s*[(\[.]|[A-Za-z_][\w.]*[(\[])")


@dataclass(frozen=True)
class PythonCall:
    """One call of a Python-style call list: a plain function name, literal positional and keyword arguments."""

    name: str
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)

    def to_source(self) -> str:
        """The call as Python source, e.g. ``cd(folder='document')`` (literals rendered with ``repr``)."""
        parts = [repr(a) for a in self.args] + [f"{k}={v!r}" for k, v in self.kwargs.items()]
        return f"{self.name}({', '.join(parts)})"


@dataclass(frozen=True)
class ParsedCallList(_Problems):
    """The calls of a Python-style call list, or the reasons it was refused.

    ``errors`` non-empty means nothing of the text may be executed (a list is
    accepted or refused as a whole). An empty list ``[]`` parses to no calls and no errors.
    """

    text: str
    calls: tuple[PythonCall, ...] = ()
    errors: tuple[str, ...] = ()


def _unfence(text: str) -> str:
    """Thinking removed and one Markdown fence (```lang ... ```) around the whole text stripped; linear."""
    stripped = strip_thinking(text).strip()
    if len(stripped) < 6 or not (stripped.startswith("```") and stripped.endswith("```")):
        return stripped
    inner = stripped[3:-3]
    tag = 0
    while tag < len(inner) and inner[tag] in _FENCE_TAG:
        tag += 1
    return inner[tag:].strip()


def _bracket_depth_exceeds(body: str, limit: int) -> bool:
    """Whether bracket nesting goes deeper than ``limit`` (strings not excluded: a conservative bound)."""
    depth = 0
    for ch in body:
        if ch in "([{":
            depth += 1
            if depth > limit:
                return True
        elif ch in ")]}":
            depth -= 1
    return False


def looks_like_call_list(text: str) -> bool:
    """Whether ``text`` (thinking removed, an optional Markdown code fence stripped) is an attempt at a call list.

    True when it starts with ``[name(``, ``[name.`` or ``[name[``, or with ``name(`` / ``name[`` alone
    (no space before the parenthesis; dotted names included), or is exactly ``[]``.
    Plain prose does not match, so a reply without calls can be told apart from a malformed call list.
    """
    if not isinstance(text, str) or len(text) > MAX_ACTION_CHARS:
        return isinstance(text, str) and bool(_CALL_START.match(text[:1000].lstrip()))
    body = _unfence(text)
    return bool(_CALL_START.match(body)) or body.replace(" ", "") == "[]"


def _literal(node: ast.expr, where: str) -> tuple[bool, Any]:
    try:
        return True, ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError):
        return False, f"{where} is not a literal (only strings, numbers, booleans, None, lists, tuples, dicts and sets are accepted)."


def _call_from_node(node: ast.expr, index: int) -> PythonCall | str:
    where = f"call #{index}"
    if not isinstance(node, ast.Call):
        return f"{where} is not a function call."
    if not isinstance(node.func, ast.Name):
        return f"{where}: the function must be a plain name like func(...), not an expression."
    name = node.func.id
    if name.startswith("_"):
        return f"{where}: function names starting with '_' are not callable."
    args: list[Any] = []
    for i, arg in enumerate(node.args, start=1):
        if isinstance(arg, ast.Starred):
            return f"{where} ({name}): *-unpacking is not accepted."
        ok, value = _literal(arg, f"{where} ({name}): positional argument {i}")
        if not ok:
            return value
        args.append(value)
    kwargs: dict[str, Any] = {}
    for kw in node.keywords:
        if kw.arg is None:
            return f"{where} ({name}): **-unpacking is not accepted."
        if kw.arg in kwargs:
            return f"{where} ({name}): argument {kw.arg!r} is given twice."
        ok, value = _literal(kw.value, f"{where} ({name}): argument {kw.arg!r}")
        if not ok:
            return value
        kwargs[kw.arg] = value
    return PythonCall(name=name, args=tuple(args), kwargs=kwargs)


def parse_call_list(text: str, *, max_chars: int = MAX_ACTION_CHARS) -> ParsedCallList:
    """Parse BFCL's Python-style call list, e.g. ``[cd(folder='docs'), ls(a=True)]``.

    Thinking spans and a Markdown code fence around the list are removed;
    a single call without brackets is accepted, as BFCL's decoder does.
    Never raises and never evaluates: malformed or non-literal input yields ``errors``;
    text over ``max_chars`` or nested deeper than ``MAX_NESTING`` is refused before ``ast`` sees it.
    """
    if not isinstance(text, str):
        return ParsedCallList(text=repr(text)[:200], errors=(f"the action must be text, got {type(text).__name__}.",))
    too_long = _too_long(text, max_chars)
    if too_long:
        return ParsedCallList(text=text, errors=(too_long,))
    body = _unfence(text)
    if _bracket_depth_exceeds(body, MAX_NESTING):
        return ParsedCallList(text=text, errors=(f"the call list is nested deeper than {MAX_NESTING} levels.",))
    if not body.startswith("["):
        body = "[" + body
    if not body.endswith("]"):
        body = body + "]"
    try:
        tree = ast.parse(body, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        detail = exc.msg if isinstance(exc, SyntaxError) else type(exc).__name__
        return ParsedCallList(text=text, errors=(f"the call list is not valid Python syntax ({detail}).",))
    if not isinstance(tree.body, ast.List):
        return ParsedCallList(text=text, errors=("expected a list of calls like [func(a=1), other(b='x')].",))
    calls: list[PythonCall] = []
    errors: list[str] = []
    for index, node in enumerate(tree.body.elts, start=1):
        parsed = _call_from_node(node, index)
        if isinstance(parsed, str):
            errors.append(parsed)
        else:
            calls.append(parsed)
    if errors:
        return ParsedCallList(text=text, errors=tuple(errors))
    return ParsedCallList(text=text, calls=tuple(calls))
