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
from collections.abc import AsyncIterator
from typing import IO

import uvicorn

from ..config import Paths
from ..errors import RollboxError
from ..runtime.reaper import become_subreaper
from ..runtime.runsc import Runsc
from .app import create_app
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


async def serve_async(paths: Paths) -> None:
    paths.ensure()
    lock = _lock(paths)
    become_subreaper()
    runsc = Runsc(paths.runsc_root)
    runsc.check()
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

    app.router.lifespan_context = lifespan
    if paths.socket.exists():
        paths.socket.unlink()
    config = uvicorn.Config(app, uds=str(paths.socket), log_level="warning", access_log=False,
                            timeout_keep_alive=300, timeout_graceful_shutdown=2)
    server = uvicorn.Server(config)
    watcher = asyncio.create_task(watchdog.run(service))
    try:
        await server.serve()
    finally:
        watcher.cancel()
        store.close()
        lock.close()


def serve(paths: Paths | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    asyncio.run(serve_async(paths or Paths.from_env()))
