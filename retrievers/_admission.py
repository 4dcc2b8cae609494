"""Admission for the retrieval server: who gets a connection, per client and in all, and what happens past a limit.

A client is a peer IPv4 address or IPv6 /64 (:func:`client_key`). Behind a
reverse proxy every client is the proxy: give the proxy its own limits, or run
the server where clients reach it directly. :class:`Admission` accepts
connections on the event loop and holds at most ``max_connections`` connections
in all and ``max_connections_per_client`` from one client. At the global cap a
client holding fewer connections than the largest holder takes that holder's
longest-idle connection (see :class:`Admission`). A connection refused is answered 503
(``Retry-After: 1``) and half-closed as it is accepted, without a coroutine (the
socket is kept up to 1 s, or until the client closes it, so that a request
still arriving does not turn the 503 into a reset), so a client holding its
whole quota of idle connections costs other clients nothing. When ``accept``
fails with EMFILE/ENFILE (descriptors taken elsewhere in the process or the
system), the server frees a descriptor it keeps in reserve, accepts the waiting
connection, answers it 503 and closes it; when even that fails it stops
accepting for 0.1 s. A new client therefore gets a 503 or a closed connection at
once, and the event loop neither spins on a listening socket that stays readable
nor leaves clients waiting in the backlog.

Why hand-written: uvicorn's ``limit_concurrency`` is one global count (one
client's idle connections make it answer everyone else 503), it has no
per-client limit and no descriptor reserve, and asyncio's own accept loop retries
a failing ``accept`` up to ``backlog`` times per wakeup (measured in
``scripts/bench/retrieval_server_peer.py``, docs/benchmarks.md).
"""

from __future__ import annotations

import asyncio
import errno
import ipaddress
import itertools
import os
import socket
import sys
from collections.abc import Awaitable, Callable
from typing import Any

from retrievers._wire import refusal, refuse

__all__ = ["Admission", "Ticket", "client_key", "connection_limits", "listen"]

_ACCEPTS_PER_WAKEUP = 64
_ACCEPT_BACKOFF_S = 0.1
_OUT_OF_DESCRIPTORS = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)
_LINGER_S = 1.0


def _open_descriptors() -> int:
    """File descriptors this process has open now (0 where that cannot be read)."""
    for directory in ("/proc/self/fd", "/dev/fd"):
        try:
            return len(os.listdir(directory))
        except OSError:
            continue
    return 0


def _descriptor_budget(reserved: int) -> int | None:
    """Descriptors left for connections under the soft RLIMIT_NOFILE; None where it is unlimited or unknown."""
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (ImportError, OSError, ValueError):
        return None
    if soft == resource.RLIM_INFINITY:
        return None
    return max(1, soft - _open_descriptors() - reserved)


def connection_limits(max_connections: int, per_client: int | None, reserved_fds: int) -> tuple[int, int]:
    """The limits in force: ``(global cap, per-client cap)``.

    The global cap is ``max_connections`` lowered to what the soft RLIMIT_NOFILE
    leaves once the descriptors open now and ``reserved_fds`` are set aside; the
    per-client cap is ``per_client`` (``None``: an eighth of the global cap), never
    above the global cap.
    """
    budget = _descriptor_budget(reserved_fds)
    total = max_connections if budget is None else min(max_connections, budget)
    return total, min(total, max(1, total // 8) if per_client is None else per_client)


def client_key(address: Any) -> str:
    """Who a peer is: its IPv4 address, or the /64 network of an IPv6 address.

    One IPv6 host holds a whole /64 (SLAAC, privacy addresses), so keying IPv6 by
    address would let one host count as millions of clients; an IPv4-mapped IPv6
    address is its IPv4 address. Anything else (a Unix socket's path) is itself.
    """
    host = str(address[0]) if isinstance(address, tuple) else str(address)
    try:
        ip = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return host
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return host


def listen(host: str, port: int, backlog: int) -> list[socket.socket]:
    """Bound, listening, non-blocking sockets for every address ``host`` resolves to."""
    infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    sockets: list[socket.socket] = []
    seen: set[Any] = set()
    try:
        for family, kind, proto, _, address in infos:
            if address in seen:
                continue
            seen.add(address)
            sock = socket.socket(family, kind, proto)
            sockets.append(sock)
            if os.name == "posix":
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6 and hasattr(socket, "IPV6_V6ONLY"):
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(address)
            sock.listen(backlog)
            sock.setblocking(False)
    except BaseException:
        for sock in sockets:
            sock.close()
        raise
    return sockets


def _reserve_descriptor() -> int | None:
    try:
        return os.open(os.devnull, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None


class _Lingering:
    """A refused connection kept until the client closes it (or ``_LINGER_S``), so its request does not reset it.

    Closing a socket with unread input sends a reset, which can destroy the 503 before the client reads it;
    reading what it sends until it closes lets the 503 arrive.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, conn: socket.socket, done: set[_Lingering]) -> None:
        self.loop, self.conn, self.done = loop, conn, done
        self.fd = conn.fileno()
        done.add(self)
        loop.add_reader(self.fd, self._drain)
        self.timer = loop.call_later(_LINGER_S, self.close)

    def _drain(self) -> None:
        try:
            while self.conn.recv(1 << 16):
                pass
        except BlockingIOError:
            return
        except OSError:
            pass
        self.close()

    def close(self) -> None:
        if self in self.done:
            self.done.discard(self)
            self.timer.cancel()
            if not self.loop.is_closed():
                self.loop.remove_reader(self.fd)
            self.conn.close()


class Ticket:
    """One admitted connection: its client, and whether it is idle (waiting for a request) now.

    The connection's handler calls :meth:`idle` with a function that closes the
    connection before it waits for a request, and :meth:`busy` once a request
    begins; an idle connection may be closed to admit another client (see
    :class:`Admission`).
    """

    __slots__ = ("client", "released", "_admission")

    def __init__(self, admission: Admission, client: str) -> None:
        self.client = client
        self.released = False
        self._admission = admission

    def idle(self, close: Callable[[], None]) -> None:
        if not self.released:
            self._admission._idle.setdefault(self.client, {})[self] = close

    def busy(self) -> None:
        idle = self._admission._idle.get(self.client)
        if idle is not None and idle.pop(self, None) is not None and not idle:
            del self._admission._idle[self.client]


class Admission:
    """Accepts connections on ``loop`` from ``sockets`` within the limits, and runs ``serve(conn, ticket)`` for each.

    ``max_connections`` / ``max_connections_per_client``: the limits in force (see
    :func:`connection_limits`). At the global cap a new client is not simply refused:
    if another client holds more connections than the newcomer would (its count + 1)
    and one of them is idle, that client's longest-idle connection is closed and the
    newcomer admitted, so that several clients hoarding idle connections, each within
    its own limit, cannot shut out a client holding few. (An idle connection is one
    waiting for a request, new or kept alive; its client sees it closed, as after the
    idle timeout.) The largest holder is found in O(1) (clients are bucketed by count).
    ``open_connections``: connections being served; ``refused_connections``:
    connections answered 503 at accept (over a limit, or out of descriptors);
    ``evicted_connections``: idle connections closed to admit another client;
    ``accept_errors``: ``accept`` calls that failed (for want of descriptors, mostly).
    Everything runs on the loop's thread.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, sockets: list[socket.socket], *,
                 max_connections: int, max_connections_per_client: int | None, reserved_fds: int,
                 serve: Callable[[socket.socket, Ticket], Awaitable[None]], verbose: bool = False) -> None:
        self._loop = loop
        self._sockets = sockets
        self._serve = serve
        self._verbose = verbose
        self._max_lingering = reserved_fds // 2
        self._reserve = _reserve_descriptor()
        self.max_connections, self.max_connections_per_client = connection_limits(
            max_connections, max_connections_per_client, reserved_fds)
        self.open_connections = 0
        self.refused_connections = 0
        self.accept_errors = 0
        self.evicted_connections = 0
        self._per_client: dict[str, int] = {}
        self._by_count: dict[int, dict[str, None]] = {}  # count -> clients holding that many (insertion-ordered)
        self._top = 0  # the largest count any client holds
        self._idle: dict[str, dict[Ticket, Callable[[], None]]] = {}  # client -> its idle connections, oldest first
        self._lingering: set[_Lingering] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._accepting = False
        self._closed = False
        self._full = refusal(f"more than {self.max_connections} open connections; retry")
        self._client_full = refusal(
            f"more than {self.max_connections_per_client} open connections from your address; retry")
        self._no_descriptors = refusal("the server is out of file descriptors; retry")

    def connections_of(self, client: str) -> int:
        """Connections ``client`` holds now."""
        return self._per_client.get(client, 0)

    def resume(self) -> None:
        """Accept again (after a pause, or at start)."""
        if self._closed or self._accepting:
            return
        for sock in self._sockets:
            self._loop.add_reader(sock.fileno(), self._accept, sock)
        self._accepting = True

    def pause(self) -> None:
        if self._accepting and not self._loop.is_closed():
            for sock in self._sockets:
                self._loop.remove_reader(sock.fileno())
        self._accepting = False

    def stop(self) -> None:
        """Stop accepting and drop the lingering refusals (on the loop's thread, or once it has stopped)."""
        self.pause()
        self._closed = True
        for lingering in list(self._lingering):
            lingering.close()

    def release(self) -> None:
        """Give back the reserve descriptor (after :meth:`stop`)."""
        if self._reserve is not None:
            os.close(self._reserve)
            self._reserve = None

    def _accept(self, sock: socket.socket) -> None:
        """Accept what is waiting, at most 64 per wakeup so that the loop stays responsive.

        An ``accept`` that fails for want of descriptors sheds the waiting connection
        (:meth:`_shed`); any other failure, or a failed shed, stops accepting for 0.1 s.
        """
        for _ in range(_ACCEPTS_PER_WAKEUP):
            try:
                conn, address = sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except ConnectionAbortedError:
                continue
            except OSError as exc:
                self.accept_errors += 1
                if self._verbose:
                    print(f"accept: {exc}", file=sys.stderr)
                if exc.errno not in _OUT_OF_DESCRIPTORS or not self._shed(sock):
                    self.pause()
                    self._loop.call_later(_ACCEPT_BACKOFF_S, self.resume)
                    return
                continue
            self._admit(conn, address)

    def _shed(self, sock: socket.socket) -> bool:
        """Out of descriptors: accept one waiting connection on the reserve descriptor and refuse it."""
        if self._reserve is None:
            self._reserve = _reserve_descriptor()
            return False
        os.close(self._reserve)
        self._reserve = None
        try:
            conn, _ = sock.accept()
        except (BlockingIOError, InterruptedError, ConnectionAbortedError):
            return True
        except OSError:
            return False
        else:
            self.refused_connections += 1
            refuse(conn, self._no_descriptors)
            conn.close()
            return True
        finally:
            self._reserve = _reserve_descriptor()

    def _admit(self, conn: socket.socket, address: Any) -> None:
        client = client_key(address)
        held = self._per_client.get(client, 0)
        if held >= self.max_connections_per_client:
            self._refuse(conn, self._client_full)
            return
        if self.open_connections >= self.max_connections and not self._evict_for(held):
            self._refuse(conn, self._full)
            return
        self._count(client, +1)
        ticket = Ticket(self, client)
        task = self._loop.create_task(self._run(conn, ticket))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _evict_for(self, held: int) -> bool:
        """At the global cap: close the longest-idle connection of a client holding more than ``held + 1``."""
        if self._top <= held + 1:
            return False
        for victim in itertools.islice(self._by_count.get(self._top, ()), 8):
            idle = self._idle.get(victim)
            if idle:
                ticket, close = next(iter(idle.items()))
                ticket.busy()
                self._release(ticket)
                self.evicted_connections += 1
                close()
                return True
        return False

    def _count(self, client: str, step: int) -> None:
        held = self._per_client.get(client, 0)
        if held:
            bucket = self._by_count[held]
            del bucket[client]
            if not bucket:
                del self._by_count[held]
        held += step
        self.open_connections += step
        if held:
            self._per_client[client] = held
            self._by_count.setdefault(held, {})[client] = None
        else:
            del self._per_client[client]
        if held > self._top:
            self._top = held
        elif self._top not in self._by_count:
            self._top = max(0, self._top - 1)

    def _release(self, ticket: Ticket) -> None:
        if not ticket.released:
            ticket.released = True
            self._count(ticket.client, -1)

    async def _run(self, conn: socket.socket, ticket: Ticket) -> None:
        try:
            await self._serve(conn, ticket)
        finally:
            ticket.busy()
            self._release(ticket)

    def _refuse(self, conn: socket.socket, response: bytes) -> None:
        """503 and close; the connection lingers (at most ``reserved_fds // 2`` at once) if the client is still sending."""
        self.refused_connections += 1
        if refuse(conn, response) and len(self._lingering) < self._max_lingering:
            _Lingering(self._loop, conn, self._lingering)
        else:
            conn.close()
