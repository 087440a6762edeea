"""The SDK's blocking client: a façade over `AsyncClient` (httpx's async client) run on the
SDK's event loop (`portal.py`), so the code that talks to the daemon is written once, async.

When no daemon answers on the local socket and `ROLLBOX_URL` is unset, the client starts one
(`python -m rollbox serve`, detached, logging to `ROLLBOX_HOME/daemon.log`) and waits for it:
the embedded default needs no service set up by hand. Sandboxes belong to the daemon, so they
outlive the client process.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx

from ..config import Paths
from .aclient import DAEMON_START_TIMEOUT_S, AsyncClient, daemon_running, validation_message
from .portal import PORTAL


def stop_daemon(paths: Paths, timeout_s: float = 10.0) -> bool:
    """Stops the daemon serving `paths.home`: SIGTERM, wait until it has released its lock
    (reaping it if this process started it), SIGKILL after `timeout_s` seconds. Its sandboxes
    keep running. Returns False when no daemon was running."""
    try:
        pid = int(paths.daemon_lock.read_text().strip())
    except (OSError, ValueError):
        return False
    if not daemon_running(paths):
        return False
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while daemon_running(paths) and time.monotonic() < deadline:
        time.sleep(0.05)
    if daemon_running(paths):
        os.kill(pid, signal.SIGKILL)
    for _ in range(100):  # the lock goes just before the process: reap our own child
        try:
            if os.waitpid(pid, os.WNOHANG)[0]:
                break
        except ChildProcessError:
            break
        time.sleep(0.02)
    return True


class Client:
    """A blocking client of one daemon, shared by every thread; `client.aio` is the
    `AsyncClient` doing the work on the SDK's event loop (one per process, made anew in a
    forked child).

    Args:
        url: `http://HOST:PORT` of a daemon's TCP listener (token: its bearer token, default
            ROLLBOX_TOKEN), `unix:///path`, or None: ROLLBOX_URL, else the local daemon's socket.
        paths: the state directory (default from ROLLBOX_HOME).
        autostart: start the local daemon when none answers (never for a `url`).
        transport: an httpx async transport to use instead (tests: `httpx.MockTransport`).
    """

    def __init__(self, url: str | None = None, *, paths: Paths | None = None, autostart: bool = True,
                 token: str | None = None, transport: httpx.AsyncBaseTransport | None = None) -> None:
        self._args: tuple[str | None, Paths | None, bool, str | None] = (url, paths, autostart, token)
        self._transport = transport
        self._lock = threading.Lock()
        probe = AsyncClient(url, paths=paths, autostart=autostart, token=token, transport=transport)
        self._aio: AsyncClient | None = probe
        self._generation = PORTAL.generation
        self.paths = probe.paths
        self.base_url = probe.base_url
        self.autostart = probe.autostart
        self.socket_path = probe.socket_path

    @property
    def aio(self) -> AsyncClient:
        """The async client behind this one (bound to the SDK's event loop)."""
        gen = PORTAL.generation
        if self._aio is None or self._generation != gen:
            with self._lock:
                if self._aio is None or self._generation != gen:
                    url, paths, autostart, token = self._args
                    self._aio = AsyncClient(url, paths=paths or self.paths, autostart=autostart, token=token,
                                            transport=self._transport)
                    self._generation = gen
        return self._aio

    def close(self) -> None:
        if self._aio is not None and self._generation == PORTAL.generation:
            PORTAL.run(self._aio.aclose())
        self._aio = None

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def ensure_daemon(self) -> None:
        """Connects, starting the local daemon if needed. Raises DaemonUnavailable."""
        PORTAL.run(self.aio.ensure_daemon())

    def request(self, method: str, path: str, json: Any = None, params: dict[str, Any] | None = None) -> Any:
        """Sends one request; returns the decoded JSON body or raises the daemon's typed error."""
        return PORTAL.run(self.aio.request(method, path, json=json, params=params))

    def get_text(self, path: str) -> str:
        """GET a plain-text resource (e.g. /metrics); raises the daemon's typed error."""
        return PORTAL.run(self.aio.get_text(path))

    def send_raw(self, method: str, path: str, content: bytes | Iterator[bytes],
                 params: dict[str, Any] | None = None) -> Any:
        """Sends `content` (bytes, or an iterator of chunks, streamed) as the raw request body;
        returns the decoded JSON answer (see `AsyncClient.send_raw`)."""
        return PORTAL.run(self.aio.send_raw(method, path, content, params=params))

    @contextlib.contextmanager
    def stream_raw(self, path: str, params: dict[str, Any] | None = None
                   ) -> Iterator[tuple[httpx.Response, Iterator[bytes]]]:
        """GET whose raw answer body is read in chunks: yields (response, chunks). Raises the
        daemon's typed error before any chunk, DaemonUnavailable if the answer is cut short."""
        cm = self.aio.stream_raw(path, params=params)
        resp, chunks = PORTAL.run(cm.__aenter__())
        try:
            yield resp, PORTAL.iterate(chunks)
        except BaseException as e:
            if not PORTAL.run(cm.__aexit__(type(e), e, e.__traceback__)):
                raise
        else:
            PORTAL.run(cm.__aexit__(None, None, None))

    def stream_lines(self, path: str, params: dict[str, Any] | None = None) -> Iterator[dict[str, Any]]:
        """GETs a chunked NDJSON resource and yields each line's object as it arrives (see
        `AsyncClient.stream_lines`)."""
        agen: AsyncIterator[dict[str, Any]] = self.aio.stream_lines(path, params=params)
        return PORTAL.iterate(agen)


__all__ = ["AsyncClient", "Client", "DAEMON_START_TIMEOUT_S", "daemon_running", "stop_daemon", "validation_message"]
