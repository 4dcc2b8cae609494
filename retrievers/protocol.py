"""The ``POST /retrieve`` wire format: request dialects in, Search-R1 documents out.

One format, several dialects, all answered by :mod:`retrievers.server` and
spoken by :class:`retrievers.http.HTTPRetriever`:

* **Search-R1** (``search_r1/search/retrieval_server.py``; verl's search tool and
  Search-R1's ``batch_search`` send it)::

      {"queries": ["q1", "q2"], "topk": 3, "return_scores": true}

* **SkyRL** (``skyrl_gym/tools/search.py`` since mid-2025: one query per request)::

      {"query": "q1", "topk": 3, "return_scores": true}

Both get the same response shape, one list per query (a single ``query`` gets a
list holding one list)::

    {"result": [[{"document": {...}, "score": 12.3}, ...], ...]}

and, with ``"return_scores": false`` (the default), the bare documents.

Validation follows Search-R1's server, a FastAPI app whose request model is
``queries: List[str]``, ``topk: Optional[int] = None``, ``return_scores: bool =
False`` (pydantic's lax mode):

* ``queries`` must be a list of strings: a bare string is refused, as pydantic
  refuses it (send ``{"query": "..."}`` for one query);
* a missing, ``null`` or ``0`` ``topk`` falls back to the server's default
  (Search-R1's ``if not request.topk``); integral floats (``3.0``), numeric
  strings (``"3"``) and booleans are read as pydantic reads them; a fractional or
  negative ``topk``, or one over ``max_topk``, is refused;
* ``return_scores`` takes what pydantic's ``bool`` takes: ``true``/``false``,
  ``0``/``1`` and the strings ``"yes"``/``"no"``, ``"on"``/``"off"``, ``"t"``/``"f"`` ...;
* unknown fields are ignored.

A request that breaks these rules is answered 422, as Search-R1's FastAPI server
answers a schema violation; the body is always ``{"error": "<what is wrong and what to send>"}``.

Documents. ``document_format="corpus"`` (the default) returns wiki-18 corpus
rows, ``{"id", "contents"}`` with ``contents = '"Title"\\ntext'``, as Search-R1's
dense server returns them. ``"search-r1-bm25"`` returns the shape of Search-R1's
BM25 server on an index that stores its documents: ``{"title", "text",
"contents"}`` (no id; the title without its quotes). Every client in use reads
``document["contents"]``, which both carry.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from retrievers.base import Hit

__all__ = [
    "DOCUMENT_FORMATS",
    "RequestError",
    "RetrieveRequest",
    "parse_request",
    "format_document",
    "format_results",
]

#: ``document_format`` values: corpus rows (``id``, ``contents``) or Search-R1's BM25 shape.
DOCUMENT_FORMATS = ("corpus", "search-r1-bm25")

_TRUE = frozenset({"1", "on", "t", "true", "y", "yes"})
_FALSE = frozenset({"0", "off", "f", "false", "n", "no"})
_MAX_NUMERIC_CHARS = 32


class RequestError(ValueError):
    """A client error: the message is sent back with a 400."""


@dataclass(frozen=True, kw_only=True)
class RetrieveRequest:
    """A validated ``/retrieve`` request.

    Attributes:
        queries: the query strings, in order.
        topk: passages per query (the default already applied).
        return_scores: wrap each document as ``{"document", "score"}``.
        dialect: "queries" (Search-R1's list) or "query" (SkyRL's single string).
    """

    queries: tuple[str, ...]
    topk: int
    return_scores: bool
    dialect: str


def _lax_int(value: Any) -> int | None:
    """An integer as pydantic's lax ``int`` reads it (bool, integral float, numeric string), else None."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return int(value) if math.isfinite(value) and value.is_integer() else None
    if isinstance(value, str) and len(value) <= _MAX_NUMERIC_CHARS:
        text = value.strip()
        try:
            return int(text)
        except ValueError:
            pass
        try:
            number = float(text)
        except ValueError:
            return None
        return int(number) if math.isfinite(number) and number.is_integer() else None
    return None


def _lax_bool(value: Any) -> bool | None:
    """A boolean as pydantic's lax ``bool`` reads it, else None."""
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)) and value in (0, 1):
        return bool(value)
    if isinstance(value, str):
        text = value.strip().lower()
        if text in _TRUE:
            return True
        if text in _FALSE:
            return False
    return None


def _queries(payload: Mapping[str, Any]) -> tuple[list[str], str]:
    has_list, has_single = "queries" in payload, "query" in payload
    if has_list and has_single:
        raise RequestError("send either 'queries' (a list of strings) or 'query' (one string), not both")
    if has_single:
        query = payload["query"]
        if not isinstance(query, str):
            raise RequestError(f"'query' must be a string, got {type(query).__name__}; "
                               'for several queries send {"queries": ["...", ...]}')
        return [query], "query"
    if not has_list:
        raise RequestError('the body needs \'queries\' (a list of strings) or \'query\' (a string): '
                           '{"queries": ["..."], "topk": 3, "return_scores": true}')
    queries = payload["queries"]
    if isinstance(queries, str):
        raise RequestError("'queries' must be a list of strings, got a string; "
                           'send {"queries": ["..."]} or {"query": "..."}')
    if not isinstance(queries, list):
        raise RequestError(f"'queries' must be a list of strings, got {type(queries).__name__}")
    bad = next((i for i, q in enumerate(queries) if not isinstance(q, str)), None)
    if bad is not None:
        raise RequestError(f"'queries' must be a list of strings; item #{bad} is a {type(queries[bad]).__name__}")
    return queries, "queries"


def parse_request(body: bytes, *, default_topk: int, max_topk: int, max_queries: int,
                  max_query_chars: int) -> RetrieveRequest:
    """Validate a ``/retrieve`` body in any dialect (see the module docstring).

    Raises:
        RequestError: with a message saying what is wrong and what to send. Never
            raises anything else, whatever the bytes (invalid UTF-8, deep nesting,
            5000-digit numbers).
    """
    try:
        payload = json.loads(body)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, UnicodeDecodeError, int digit limits
        raise RequestError(f"the body is not valid JSON: {str(exc)[:200]}") from None
    if not isinstance(payload, dict):
        raise RequestError('the body must be a JSON object: {"queries": ["..."], "topk": 3, "return_scores": true}')
    queries, dialect = _queries(payload)
    if len(queries) > max_queries:
        raise RequestError(f"{len(queries)} queries in one request; the limit is {max_queries}")
    long = next((i for i, q in enumerate(queries) if len(q) > max_query_chars), None)
    if long is not None:
        raise RequestError(f"query #{long} has {len(queries[long])} characters; the limit is {max_query_chars}")
    raw_topk = payload.get("topk")
    topk = 0 if raw_topk is None else _lax_int(raw_topk)
    if topk is None or topk < 0 or topk > max_topk:
        raise RequestError(f"'topk' must be an integer in 0..{max_topk} (0 or null: the default {default_topk}), "
                           f"got {str(raw_topk)[:40]!r}")
    raw_scores = payload.get("return_scores", False)
    return_scores = _lax_bool(raw_scores)
    if return_scores is None:
        raise RequestError(f"'return_scores' must be true or false, got {str(raw_scores)[:40]!r}")
    return RetrieveRequest(queries=tuple(queries), topk=topk or default_topk, return_scores=return_scores,
                           dialect=dialect)


def format_document(hit: Hit, document_format: str = "corpus") -> dict[str, Any]:
    """One hit as a Search-R1 document (see the module docstring for the two formats)."""
    if document_format == "corpus":
        return {"id": hit.doc_id, "contents": hit.contents}
    if document_format == "search-r1-bm25":
        return {"title": hit.title, "text": hit.text, "contents": hit.contents}
    raise ValueError(f"document_format must be one of {DOCUMENT_FORMATS}, got {document_format!r}")


def format_results(results: Sequence[Sequence[Hit]], *, return_scores: bool,
                   document_format: str = "corpus") -> dict[str, Any]:
    """The response body: ``{"result": [[item, ...] per query]}``."""
    out = []
    for hits in results:
        if return_scores:
            out.append([{"document": format_document(h, document_format), "score": h.score} for h in hits])
        else:
            out.append([format_document(h, document_format) for h in hits])
    return {"result": out}
