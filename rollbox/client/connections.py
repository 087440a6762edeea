"""Connections to the daemon, each owned by one request at a time (an httpx transport).

Why not httpcore's `ConnectionPool`: any thread that enters it may close an idle connection of
the pool that looks expired, and it decides so without that connection's lock. A connection
that another thread had just taken for its request was then closed under it: `[Errno 9] Bad
file descriptor` (2 in 30,000 requests at 128 threads against a local uvicorn; once in 2,000
execs at 64 in rollbox). Here a request takes a connection off a stack, sends, reads the whole
response and puts the connection back: no other thread ever sees a connection in use, so
nothing is closed under anyone. Only the taker checks whether an idle connection has expired.
"""

from __future__ import annotations

import threading

import httpcore
import httpx

# Concurrent requests beyond this wait for a connection; idle connections kept for reuse.
MAX_CONNECTIONS = 1024
MAX_IDLE = 256
# Seconds an idle connection is reused; the daemon closes idle ones after 300 s (uvicorn's
# timeout_keep_alive), so the client never sends on a connection the daemon is dropping.
KEEPALIVE_EXPIRY_S = 60.0

# httpcore's errors as httpx's (the same names), most specific first.
_ERRORS: list[tuple[type[Exception], type[httpx.TransportError]]] = [
    (httpcore.ConnectTimeout, httpx.ConnectTimeout), (httpcore.ReadTimeout, httpx.ReadTimeout),
    (httpcore.WriteTimeout, httpx.WriteTimeout), (httpcore.PoolTimeout, httpx.PoolTimeout),
    (httpcore.TimeoutException, httpx.TimeoutException), (httpcore.ConnectError, httpx.ConnectError),
    (httpcore.ReadError, httpx.ReadError), (httpcore.WriteError, httpx.WriteError),
    (httpcore.NetworkError, httpx.NetworkError), (httpcore.UnsupportedProtocol, httpx.UnsupportedProtocol),
    (httpcore.LocalProtocolError, httpx.LocalProtocolError),
    (httpcore.RemoteProtocolError, httpx.RemoteProtocolError), (httpcore.ProtocolError, httpx.ProtocolError),
]


def _mapped(exc: Exception, request: httpx.Request) -> httpx.TransportError | None:
    for core, ours in _ERRORS:
        if isinstance(exc, core):
            return ours(str(exc), request=request)
    return None


class ExclusiveConnections(httpx.BaseTransport):
    """HTTP/1.1 to one daemon (unix socket `uds`, or TCP from the URL). Thread-safe."""

    def __init__(self, uds: str | None = None, *, max_connections: int = MAX_CONNECTIONS,
                 max_idle: int = MAX_IDLE, keepalive_expiry: float = KEEPALIVE_EXPIRY_S) -> None:
        self._uds = uds
        self._max_idle = max_idle
        self._keepalive_expiry = keepalive_expiry
        self._idle: list[httpcore.HTTPConnection] = []
        self._lock = threading.Lock()
        self._max_connections = max_connections
        self._slots = threading.BoundedSemaphore(max_connections)
        self._closed = False

    def _take(self, origin: httpcore.Origin) -> httpcore.HTTPConnection:
        while True:
            with self._lock:
                conn = self._idle.pop() if self._idle else None
            if conn is None:
                return httpcore.HTTPConnection(origin, uds=self._uds, keepalive_expiry=self._keepalive_expiry)
            if conn.can_handle_request(origin) and conn.is_idle() and not conn.has_expired():
                return conn
            conn.close()  # the daemon closed it (restart) or it sat idle too long

    def _give(self, conn: httpcore.HTTPConnection) -> None:
        with self._lock:
            if conn.is_idle() and not self._closed and len(self._idle) < self._max_idle:
                self._idle.append(conn)
                return
        conn.close()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        req = httpcore.Request(method=request.method,
                               url=httpcore.URL(scheme=url.raw_scheme, host=url.raw_host, port=url.port,
                                                target=url.raw_path),
                               headers=request.headers.raw, content=request.stream,
                               extensions=request.extensions)
        timeout = (request.extensions.get("timeout") or {}).get("pool")
        if not self._slots.acquire(timeout=timeout):
            raise httpx.PoolTimeout(f"all {self._max_connections} connections to the daemon are busy", request=request)
        try:
            conn = self._take(req.url.origin)
            try:
                resp = conn.handle_request(req)
                body = resp.read()
                resp.close()
            except Exception as e:
                conn.close()
                mapped = _mapped(e, request)
                if mapped is None:
                    raise
                raise mapped from e
            self._give(conn)
        finally:
            self._slots.release()
        return httpx.Response(status_code=resp.status, headers=resp.headers, content=body,
                              extensions=resp.extensions)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()
