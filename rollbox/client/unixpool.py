"""Keep-alive HTTP/1.1 connections to the local daemon's unix socket, O(1) per request.

Why not httpcore's AsyncConnectionPool (httpcore 1.0.9): on every request start and end it
walks its connections, and for each idle one it counts the idle ones again
(`_assign_requests_to_connections`), O(connections^2). With 256 requests in flight (an RL
reward server's small execs, gh-19) that walk took 85 % of the SDK event loop's time
(py-spy) and held the whole process to ~10 requests/s. Here an idle connection is taken
from, and given back to, the top of a stack; the connections themselves stay httpcore's
(`AsyncHTTPConnection`: HTTP/1.1 framing, keep-alive expiry, a peer's close seen on reuse).
"""

from __future__ import annotations

import asyncio
import collections
from typing import Any

import httpcore

# A connection that httpcore says cannot take a request (closed by the daemon between our
# look and the request) is replaced by a new one this many times before giving up.
_RETRIES = 3


class UnixPool:
    """At most `max_connections` connections to `uds`; requests beyond that wait in arrival
    order. At most `max_idle` idle ones are kept, each for up to `keepalive_expiry` seconds.

    Errors are httpcore's (ConnectError when the daemon does not accept, NetworkError or
    RemoteProtocolError when a connection breaks mid-request); the caller types them.
    """

    def __init__(self, uds: str, *, max_connections: int, max_idle: int, keepalive_expiry: float,
                 network_backend: httpcore.AsyncNetworkBackend) -> None:
        self.uds = uds
        self.max_connections = max_connections
        self.max_idle = max_idle
        self.keepalive_expiry = keepalive_expiry
        self._backend = network_backend
        self._origin = httpcore.Origin(b"http", b"rollbox", 80)
        self._idle: list[httpcore.AsyncHTTPConnection] = []
        self._open = 0  # connections made and not yet closed (idle or serving a request)
        self._waiters: collections.deque[asyncio.Future[httpcore.AsyncHTTPConnection | None]] = collections.deque()

    @property
    def connections(self) -> int:
        return self._open

    async def request(self, method: bytes, url: httpcore.URL, *, headers: list[tuple[bytes, bytes]],
                      content: bytes | None, extensions: dict[str, Any]) -> httpcore.Response:
        """Sends one request and reads its whole answer (the body is in `.content`)."""
        # What httpcore's own pool adds (its include_request_headers): HTTP/1.1 needs a Host,
        # and a body needs its length.
        headers = [(b"host", url.host), *headers]
        if content is not None:
            headers.append((b"content-length", str(len(content)).encode()))
        req = httpcore.Request(method, url, headers=headers, content=content, extensions=extensions)
        for attempt in range(_RETRIES + 1):
            conn = await self._acquire()
            try:
                resp = await conn.handle_async_request(req)
                try:
                    await resp.aread()
                finally:
                    await resp.aclose()
            except httpcore.ConnectionNotAvailable:
                await self._drop(conn)
                if attempt == _RETRIES:
                    raise
                continue
            except BaseException:
                await self._drop(conn)
                raise
            self._give_back(conn)
            return resp
        raise AssertionError("unreachable")

    async def aclose(self) -> None:
        idle, self._idle = self._idle, []
        for conn in idle:
            await self._drop(conn)

    # ---- slots ------------------------------------------------------------------------
    # A waiter is handed either a connection (one that just finished a request) or None: the
    # slot of a closed connection, for a new one.

    async def _acquire(self) -> httpcore.AsyncHTTPConnection:
        while self._idle:
            conn = self._idle.pop()  # the most recently used: warm, least likely expired
            if conn.is_available() and not conn.has_expired():
                return conn
            await self._drop(conn)
        if self._open < self.max_connections and not self._waiters:
            self._open += 1
            return self._new()
        fut: asyncio.Future[httpcore.AsyncHTTPConnection | None] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        try:
            handed = await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                if (handed_over := fut.result()) is not None:
                    self._give_back(handed_over)
                else:
                    self._pass_slot()
            raise
        return handed if handed is not None else self._new()

    def _new(self) -> httpcore.AsyncHTTPConnection:
        return httpcore.AsyncHTTPConnection(self._origin, uds=self.uds, keepalive_expiry=self.keepalive_expiry,
                                            network_backend=self._backend)

    def _give_back(self, conn: httpcore.AsyncHTTPConnection) -> None:
        if conn.is_idle():
            if self._hand(conn):
                return
            if len(self._idle) < self.max_idle:
                self._idle.append(conn)
                return
        asyncio.get_running_loop().create_task(self._drop(conn))

    async def _drop(self, conn: httpcore.AsyncHTTPConnection) -> None:
        try:
            await conn.aclose()
        finally:
            self._pass_slot()

    def _pass_slot(self) -> None:
        """A connection was closed: its slot goes to the first waiter, else is given up."""
        if not self._hand(None):
            self._open -= 1

    def _hand(self, conn: httpcore.AsyncHTTPConnection | None) -> bool:
        while self._waiters:
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_result(conn)
                return True
        return False
