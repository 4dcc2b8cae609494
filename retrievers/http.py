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
``""``), and ``{"id"|"docid"|"doc_id", "title", "text"}``.

Transport: one ``httpx.Client`` per retriever (keep-alive connections, safe to share across threads).
Retries: a connection that cannot be made is retried by httpx's own transport (``retries`` times,
with its exponential backoff); a 502/503/504 answer (``trace-gym serve-retriever`` sheds load with
503 + ``Retry-After``) is retried up to ``retries`` times after ``Retry-After`` seconds (capped at
:data:`MAX_RETRY_AFTER_S`) or ``backoff_s * 2**attempt``. httpx retries connect failures only, so the
status retry is the few lines of :meth:`HTTPRetriever._post`. Any other error status, a timeout or
invalid JSON is a :class:`RetrieverError` at once.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from retrievers.base import Hit, RetrieverError, read_manifest, split_contents, write_manifest

__all__ = ["HTTPConfig", "HTTPRetriever", "hit_from_document", "REQUEST_FORMATS", "RETRY_STATUSES"]

#: ``request_format`` values: Search-R1's ``queries`` list, or SkyRL's single ``query``.
REQUEST_FORMATS = ("queries", "query")
#: Answers retried after a pause: the server is overloaded or a proxy in front of it is.
RETRY_STATUSES = frozenset({502, 503, 504})
#: The longest pause a server's ``Retry-After`` may ask for.
MAX_RETRY_AFTER_S = 5.0


@dataclass(frozen=True, kw_only=True)
class HTTPConfig:
    """Where and how to reach a retrieval server.

    Attributes:
        url: the server's base URL (``http://127.0.0.1:8000``) or its full ``/retrieve`` URL.
        timeout: seconds per request.
        max_queries: queries per request; longer batches are split.
        request_format: "queries" (Search-R1's list) or "query" (one query per request).
        retries: retries of a connection that fails and of a 502/503/504 answer (0: none).
        backoff_s: first pause before a status retry without ``Retry-After`` (doubled each time).
    """

    url: str
    timeout: float = 30.0
    max_queries: int = 256
    request_format: str = "queries"
    retries: int = 3
    backoff_s: float = 0.25

    def __post_init__(self) -> None:
        if not self.url.startswith(("http://", "https://")):
            raise ValueError(f"url must start with http:// or https://, got {self.url!r}")
        if self.timeout <= 0 or self.max_queries < 1:
            raise ValueError("timeout must be > 0 and max_queries >= 1")
        if self.retries < 0 or not 0 <= self.backoff_s <= MAX_RETRY_AFTER_S:
            raise ValueError(f"retries must be >= 0 and backoff_s in [0, {MAX_RETRY_AFTER_S}]")
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
                 request_format: str = "queries", retries: int = 3, backoff_s: float = 0.25) -> None:
        self.config = HTTPConfig(url=url, timeout=timeout, max_queries=max_queries, request_format=request_format,
                                 retries=retries, backoff_s=backoff_s)
        self._http: Any = None
        self._lock = threading.Lock()

    @property
    def url(self) -> str:
        return self.config.endpoint

    @property
    def fingerprint(self) -> str:
        return f"http:{self.config.endpoint}"

    def __repr__(self) -> str:
        return f"HTTPRetriever({self.config.endpoint!r})"

    def _client(self) -> Any:
        """The shared ``httpx.Client``, made on first use (RetrieverError when httpx is missing)."""
        with self._lock:
            if self._http is None:
                try:
                    import httpx
                except ImportError as exc:
                    raise RetrieverError(f"HTTPRetriever needs httpx: pip install httpx ({exc})") from None
                self._http = httpx.Client(transport=httpx.HTTPTransport(retries=self.config.retries),
                                          timeout=self.config.timeout)
            return self._http

    def close(self) -> None:
        """Close the client's connections (idempotent; a later search opens new ones)."""
        with self._lock:
            http, self._http = self._http, None
        if http is not None:
            http.close()

    def _pause(self, response: Any, attempt: int) -> float:
        """Seconds to wait before retrying ``response``: its ``Retry-After`` (capped), else the backoff."""
        try:
            after = float(response.headers.get("retry-after", ""))
        except ValueError:
            after = self.config.backoff_s * 2**attempt
        if math.isnan(after):
            after = MAX_RETRY_AFTER_S
        return min(max(after, 0.0), MAX_RETRY_AFTER_S)

    def _post(self, payload: Mapping[str, Any]) -> Any:
        import httpx

        endpoint = self.config.endpoint
        client = self._client()
        for attempt in range(self.config.retries + 1):
            try:
                response = client.post(endpoint, json=payload)
            except httpx.TimeoutException as exc:
                raise RetrieverError(f"retrieval server {endpoint} timed out after {self.config.timeout}s: "
                                     f"{type(exc).__name__}") from None
            except httpx.TransportError as exc:
                raise RetrieverError(f"cannot reach retrieval server {endpoint}: {exc}") from None
            if response.status_code in RETRY_STATUSES and attempt < self.config.retries:
                time.sleep(self._pause(response, attempt))
                continue
            if response.status_code >= 400:
                body = response.text[:500]
                raise RetrieverError(f"retrieval server {endpoint} answered {response.status_code}: {body}")
            try:
                return response.json()
            except ValueError as exc:
                raise RetrieverError(f"retrieval server {endpoint} sent invalid JSON: {exc}") from None
        raise AssertionError("unreachable: the last attempt returns or raises")

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
