"""HTTPRetriever: the Retriever protocol over a Search-R1-style ``POST /retrieve`` endpoint.

Works against ``trace-gym serve-retriever``, Search-R1's own
``retrieval_server.py`` (dense or BM25) and servers that take one query per
request. The wire format is :mod:`retrievers.protocol`. Requests, by
``request_format``:

* ``"queries"`` (default, Search-R1): ``{"queries": ["q1", ...], "topk": 3, "return_scores": true}``,
  batches split into ``max_queries`` per request;
* ``"query"`` (SkyRL's single-query dialect): ``{"query": "q1", "topk": 3, "return_scores": true}``,
  one request per query.

Response: ``{"result": [[item, ...] per query]}``; an item is ``{"document": doc,
"score": s}`` or the bare document. Documents are read in every shape in use:
wiki-18 corpus rows ``{"id", "contents"}`` (``contents`` = ``'"Title"\\ntext'``),
Search-R1's BM25 shape ``{"title", "text", "contents"}`` (no id: the id is
``""``), and ``{"id"|"docid"|"doc_id", "title", "text"}``. Stdlib only (urllib).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from retrievers.base import Hit, RetrieverError, read_manifest, split_contents, write_manifest

__all__ = ["HTTPConfig", "HTTPRetriever", "hit_from_document", "REQUEST_FORMATS"]

#: ``request_format`` values: Search-R1's ``queries`` list, or SkyRL's single ``query``.
REQUEST_FORMATS = ("queries", "query")


@dataclass(frozen=True, kw_only=True)
class HTTPConfig:
    """Where and how to reach a retrieval server.

    Attributes:
        url: the server's base URL (``http://127.0.0.1:8000``) or its full ``/retrieve`` URL.
        timeout: seconds per request.
        max_queries: queries per request; longer batches are split.
        request_format: "queries" (Search-R1's list) or "query" (one query per request).
    """

    url: str
    timeout: float = 30.0
    max_queries: int = 256
    request_format: str = "queries"

    def __post_init__(self) -> None:
        if not self.url.startswith(("http://", "https://")):
            raise ValueError(f"url must start with http:// or https://, got {self.url!r}")
        if self.timeout <= 0 or self.max_queries < 1:
            raise ValueError("timeout must be > 0 and max_queries >= 1")
        if self.request_format not in REQUEST_FORMATS:
            raise ValueError(f"request_format must be one of {REQUEST_FORMATS}, got {self.request_format!r}")

    @property
    def endpoint(self) -> str:
        url = self.url.rstrip("/")
        return url if url.endswith("/retrieve") else url + "/retrieve"


def hit_from_document(item: Mapping[str, Any] | Any, score: float | None = None) -> Hit:
    """One Search-R1 result item (``{"document", "score"}`` or a bare document) -> Hit."""
    if not isinstance(item, Mapping):
        raise RetrieverError(f"retrieval server returned a non-object result item: {str(item)[:100]}")
    if "document" in item and isinstance(item["document"], Mapping):
        doc, score = item["document"], item.get("score", score)
    else:
        doc = item
    if "text" in doc:
        title, text = str(doc.get("title") or ""), str(doc["text"])
    else:
        title, text = split_contents(str(doc.get("contents", "")))
    doc_id = next((doc[key] for key in ("id", "docid", "doc_id") if doc.get(key) is not None), "")
    try:
        value = float(score or 0.0)
    except (TypeError, ValueError):
        raise RetrieverError(f"retrieval server returned a non-numeric score {str(score)[:40]!r}") from None
    return Hit(doc_id=str(doc_id), score=value, title=title, text=text)


class HTTPRetriever:
    """A client of a retrieval server; satisfies :class:`retrievers.Retriever`.

    Raises :class:`RetrieverError` when the server cannot be reached or answers
    with an error (the message includes the server's own).
    """

    kind = "http"

    def __init__(self, url: str, *, timeout: float = 30.0, max_queries: int = 256,
                 request_format: str = "queries") -> None:
        self.config = HTTPConfig(url=url, timeout=timeout, max_queries=max_queries, request_format=request_format)

    @property
    def url(self) -> str:
        return self.config.endpoint

    @property
    def fingerprint(self) -> str:
        return f"http:{self.config.endpoint}"

    def __repr__(self) -> str:
        return f"HTTPRetriever({self.config.endpoint!r})"

    def _post(self, payload: Mapping[str, Any]) -> Any:
        data = json.dumps(payload).encode("utf-8")
        request = urllib.request.Request(
            self.config.endpoint, data=data, headers={"Content-Type": "application/json"}, method="POST"
        )
        try:
            with urllib.request.urlopen(request, timeout=self.config.timeout) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as exc:
            body = exc.read().decode("utf-8", "replace")[:500]
            raise RetrieverError(f"retrieval server {self.config.endpoint} answered {exc.code}: {body}") from None
        except (urllib.error.URLError, TimeoutError, ConnectionError) as exc:
            raise RetrieverError(f"cannot reach retrieval server {self.config.endpoint}: {exc}") from None
        except json.JSONDecodeError as exc:
            raise RetrieverError(f"retrieval server {self.config.endpoint} sent invalid JSON: {exc}") from None

    def search(self, query: str, k: int = 10) -> list[Hit]:
        return self.batch_search([query], k)[0]

    def batch_search(self, queries: Sequence[str], k: int = 10) -> list[list[Hit]]:
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        out: list[list[Hit]] = []
        single = self.config.request_format == "query"
        step = 1 if single else self.config.max_queries
        for start in range(0, len(queries), step):
            chunk = list(queries[start:start + step])
            payload: dict[str, Any] = {"query": chunk[0]} if single else {"queries": chunk}
            body = self._post({**payload, "topk": k, "return_scores": True})
            result = body.get("result") if isinstance(body, Mapping) else None
            if not isinstance(result, list) or len(result) != len(chunk):
                raise RetrieverError(
                    f"retrieval server {self.config.endpoint} returned {str(body)[:200]}; expected "
                    f'{{"result": [...]}} with one list per query ({len(chunk)})'
                )
            if not all(isinstance(items, list) for items in result):
                raise RetrieverError(f"retrieval server {self.config.endpoint} returned a result that is not "
                                     f"one list of documents per query: {str(result)[:200]}")
            out.extend([hit_from_document(item) for item in items] for items in result)
        return out

    def save(self, directory: str | Path) -> Path:
        """Write a manifest that reopens this client (no index data)."""
        write_manifest(directory, self.kind, asdict(self.config))
        return Path(directory)

    @classmethod
    def load(cls, directory: str | Path) -> HTTPRetriever:
        manifest = read_manifest(directory)
        if manifest["kind"] != cls.kind:
            raise RetrieverError(f"{directory} holds a {manifest['kind']!r} index, not an HTTP client manifest")
        return cls(**manifest["config"])
