"""`rollbox serve`: one daemon per state directory, serving the API on a unix socket.

Start-up: take the state directory's lock (a second daemon exits at once), become the
sandboxes' subreaper, reconcile what a previous daemon left (re-attach or clean up), then
serve. The watchdog enforces keep_warm_seconds and reaps orphans while it runs.
Sandboxes outlive the daemon: stopping it stops nothing inside them.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import socket
from collections.abc import AsyncIterator
from types import FrameType
from typing import IO, Callable

import uvicorn

from ..config import Paths
from ..errors import InvalidArgument, RollboxError
from ..runtime import cgroups
from ..runtime.reaper import become_subreaper
from ..runtime.runsc import Runsc, platform_from_env
from .app import create_app
from .auth import BearerAuth, load_or_create_token, secure_socket
from . import watchdog
from .service import SandboxService
from .store import Store

log = logging.getLogger("rollbox.daemon")


def _lock(paths: Paths) -> IO[str]:
    f = open(paths.daemon_lock, "a+")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.close()
        raise RollboxError(f"another rollbox daemon already serves {paths.home} (lock {paths.daemon_lock})") from None
    f.seek(0)
    f.truncate()
    f.write(str(os.getpid()))
    f.flush()
    return f


def parse_listen(listen: str) -> tuple[str, int]:
    """'HOST:PORT' (IPv4 or a name; '[v6]:PORT' for IPv6) -> (host, port). Raises ValueError."""
    host, sep, port = listen.rpartition(":")
    if not sep or not host or not port.isdigit() or not (0 <= int(port) <= 65535):
        raise ValueError(f"--listen {listen!r} must be HOST:PORT, e.g. 0.0.0.0:7420")
    return host.strip("[]"), int(port)


def _unix_socket(paths: Paths) -> socket.socket:
    if paths.socket.exists():
        paths.socket.unlink()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)  # never world-writable, not even between bind and chmod
    try:
        sock.bind(str(paths.socket))
    finally:
        os.umask(old)
    secure_socket(paths.socket, paths.home)
    return sock


def _tcp_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    return sock


class _Server(uvicorn.Server):
    """uvicorn's server, telling the app when a signal starts its shutdown: what runs then is
    answered `daemon_unavailable` (retryable), never an untyped 500 (answers.TypedServerErrors)."""

    def __init__(self, config: uvicorn.Config, on_exit: Callable[[], None]) -> None:
        super().__init__(config)
        self._on_exit = on_exit

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self._on_exit()
        super().handle_exit(sig, frame)


async def serve_async(paths: Paths, listen: str | None = None) -> None:
    """Serves the API on the unix socket, and with `listen` ('HOST:PORT') also on TCP,
    where every request needs the bearer token (rollbox.server.auth)."""
    tcp_addr = parse_listen(listen) if listen else None
    paths.ensure()
    lock = _lock(paths)
    become_subreaper()
    runsc = Runsc(paths.runsc_root, binary=os.environ.get("ROLLBOX_RUNSC") or None, platform=platform_from_env())
    runsc.check()
    log.info("gVisor platform: %s (%s)", runsc.platform, runsc.binary)
    store = Store(paths.db)
    service = SandboxService(paths, runsc, store)
    summary = await watchdog.recover(service)
    log.info("recovered state: %s", summary)
    app = create_app(service)

    @contextlib.asynccontextmanager
    async def lifespan(_app: object) -> AsyncIterator[None]:
        yield
        # Here, not after serve(): uvicorn re-raises SIGTERM once it has shut down, which
        # would end the process before a `finally` runs.
        await service.net.close()
        # Its own cgroup parents go with it, unless sandboxes it leaves running still use them.
        cgroups.remove_parent(paths.cgroup_parent)

    app.router.lifespan_context = lifespan
    sockets = [_unix_socket(paths)]
    asgi: object = app
    if tcp_addr is not None:
        sockets.append(_tcp_socket(*tcp_addr))
        asgi = BearerAuth(app, load_or_create_token(paths))
        log.info("listening on tcp %s:%d (bearer token required)", *sockets[-1].getsockname()[:2])
    config = uvicorn.Config(asgi, log_level="warning", access_log=False,  # type: ignore[arg-type]
                            timeout_keep_alive=300, timeout_graceful_shutdown=2)
    server = _Server(config, on_exit=lambda: setattr(app.state, "stopping", True))
    watcher = asyncio.create_task(watchdog.run(service))
    try:
        await server.serve(sockets=sockets)
    finally:
        watcher.cancel()
        store.close()
        lock.close()


LOG_LEVELS = ("debug", "info", "warning", "error")


def log_level() -> int:
    """The daemon's log level from ROLLBOX_LOG_LEVEL (debug, info (default), warning, error).
    `debug` adds one line per request (method, path, status, time) and per exec (program name
    and counts); request bodies, exec arguments and environments are never logged.

    Raises:
        InvalidArgument: another value.
    """
    name = os.environ.get("ROLLBOX_LOG_LEVEL", "info").strip().lower() or "info"
    if name not in LOG_LEVELS:
        raise InvalidArgument(f"ROLLBOX_LOG_LEVEL={name!r} must be one of {', '.join(LOG_LEVELS)}")
    return int(getattr(logging, name.upper()))


def serve(paths: Paths | None = None, listen: str | None = None) -> None:
    logging.basicConfig(level=log_level(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    asyncio.run(serve_async(paths or Paths.from_env(), listen or os.environ.get("ROLLBOX_LISTEN") or None))
