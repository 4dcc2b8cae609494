"""HTTP/1.1 on the wire for the retrieval server: reading one request, writing one JSON response, refusals.

Bounded everywhere: request headers at most 32 KiB and 100 lines, a body at most
the caller's ``max_body_bytes`` (a larger one is read and dropped, up to 64 MiB,
then answered 413), no chunked bodies (411), ``Expect: 100-continue`` honoured.
The callers put deadlines around these coroutines; nothing here waits without one.
"""

from __future__ import annotations

import asyncio
import json
import socket
from http import HTTPStatus
from typing import Any

__all__ = ["MAX_HEADER_BYTES", "BadHTTP", "encode", "read_request", "respond", "refusal", "refuse"]

MAX_HEADER_BYTES = 32 * 1024
_MAX_HEADERS = 100
_MAX_DISCARD_BYTES = 64 * 1024 * 1024


class BadHTTP(Exception):
    """A request that is not acceptable HTTP; ``status`` is the answer to give before closing."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def encode(body: Any) -> bytes:
    """``body`` as UTF-8 JSON (``\\u`` escapes where a passage holds a lone surrogate)."""
    text = json.dumps(body, ensure_ascii=False)
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate in a passage: \\u escapes keep the JSON valid
        return json.dumps(body, ensure_ascii=True).encode("ascii")


async def _discard(reader: asyncio.StreamReader, length: int) -> None:
    """Read and drop up to ``length`` bytes (at most 64 MiB; the caller's deadline bounds the time)."""
    left = min(length, _MAX_DISCARD_BYTES)
    while left > 0:
        chunk = await reader.read(min(left, 1 << 16))
        if not chunk:
            return
        left -= len(chunk)


async def read_request(head: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                       max_body_bytes: int) -> tuple[str, str, bool, bytes]:
    """The rest of a request whose first byte is ``head``: ``(method, path, keep_alive, body)``.

    Raises :class:`BadHTTP` for a request to refuse, ConnectionResetError when the
    client closes mid-request.
    """
    try:
        raw = head + await reader.readuntil(b"\r\n\r\n")
    except asyncio.LimitOverrunError:
        raise BadHTTP(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE,
                      f"request headers over {MAX_HEADER_BYTES} bytes") from None
    except asyncio.IncompleteReadError:
        raise ConnectionResetError("the client closed the connection mid-request") from None
    lines = raw.decode("latin-1").split("\r\n")
    parts = lines[0].split()
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise BadHTTP(HTTPStatus.BAD_REQUEST, f"not an HTTP/1.x request line: {lines[0][:80]!r}")
    method, path, version = parts
    headers: dict[str, str] = {}
    for line in lines[1:_MAX_HEADERS + 1]:
        if line:
            name, sep, value = line.partition(":")
            if not sep:
                raise BadHTTP(HTTPStatus.BAD_REQUEST, f"malformed header line {line[:80]!r}")
            headers[name.strip().lower()] = value.strip()
    connection = headers.get("connection", "").lower()
    keep_alive = "close" not in connection if version == "HTTP/1.1" else "keep-alive" in connection
    if "chunked" in headers.get("transfer-encoding", "").lower():
        raise BadHTTP(HTTPStatus.LENGTH_REQUIRED, "chunked bodies are not accepted; send a Content-Length")
    body = b""
    if method == "POST":
        try:
            length = int(headers["content-length"])
        except (KeyError, ValueError):
            raise BadHTTP(HTTPStatus.LENGTH_REQUIRED, "a Content-Length header is required") from None
        if length < 0:
            raise BadHTTP(HTTPStatus.BAD_REQUEST, "a negative Content-Length")
        if length > max_body_bytes:
            await _discard(reader, length)  # read it, so that closing does not reset the client's socket
            raise BadHTTP(HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                          f"body of {length} bytes; the limit is {max_body_bytes}")
        if headers.get("expect", "").lower() == "100-continue":
            writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        try:
            body = await reader.readexactly(length)
        except asyncio.IncompleteReadError:
            raise ConnectionResetError("the client closed the connection mid-body") from None
    return method, path, keep_alive, body


async def respond(writer: asyncio.StreamWriter, status: int, payload: Any, *, close: bool,
                  write_timeout_s: float) -> bool:
    """Write one JSON response (``payload``, or its encoding as bytes); False when the client did not take it in time."""
    data = payload if isinstance(payload, bytes) else encode(payload)
    phrase = HTTPStatus(status).phrase
    connection = "Connection: close\r\n" if close else ""
    head = (f"HTTP/1.1 {int(status)} {phrase}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\n{connection}\r\n")
    try:
        writer.write(head.encode("latin-1") + data)
        await asyncio.wait_for(writer.drain(), write_timeout_s)
    except (TimeoutError, asyncio.TimeoutError, ConnectionError, OSError):
        return False
    return True


def refusal(message: str) -> bytes:
    """A whole 503 response (``Retry-After: 1``, ``Connection: close``) carrying ``{"error": message}``."""
    data = encode({"error": message})
    return (f"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nContent-Length: {len(data)}\r\n"
            f"Retry-After: 1\r\nConnection: close\r\n\r\n").encode("latin-1") + data


def refuse(conn: socket.socket, response: bytes) -> bool:
    """Send ``response`` on a just-accepted connection and half-close it; False if the connection is gone.

    Never waits: ``response`` fits a socket buffer, and what the client has sent so far is read and dropped.
    True means the client has not closed yet (the caller keeps or closes the socket).
    """
    try:
        conn.setblocking(False)
        conn.send(response)
        conn.shutdown(socket.SHUT_WR)
        while conn.recv(1 << 16):
            pass
        return False
    except BlockingIOError:
        return True
    except OSError:
        return False
