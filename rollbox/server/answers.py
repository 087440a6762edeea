"""The daemon's answer shapes: JSON bodies (one rendering for FastAPI's routes and the exec
fast path), a RollboxError's typed body and status, FastAPI's 422 details, and a typed answer
for an unexpected exception (`TypedServerErrors`)."""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from typing import Any, Callable

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse as _StarletteJSON

from .. import errors

log = logging.getLogger("rollbox.api")


def render(content: Any) -> bytes:
    """`content` as compact JSON with non-ASCII escaped: file names from a sandbox may carry
    surrogate-escaped bytes (not valid UTF-8), which UTF-8 rendering would turn into a 500.
    NaN and infinities (JSON has neither: a 422 may echo one a request held) become null."""
    try:
        return json.dumps(content, ensure_ascii=True, allow_nan=False, separators=(",", ":")).encode()
    except ValueError:
        return json.dumps(finite(content), ensure_ascii=True, allow_nan=False, separators=(",", ":")).encode()


def finite(value: Any) -> Any:
    """`value` with every NaN and infinity replaced by None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


class JSONResponse(_StarletteJSON):
    """JSON with non-ASCII escaped: file names from a sandbox may carry surrogate-escaped bytes
    (not valid UTF-8), which Starlette's UTF-8 rendering would turn into a 500."""

    def render(self, content: Any) -> bytes:
        return render(content)


class TypedServerErrors:
    """ASGI middleware: an unexpected exception becomes a typed JSON answer on the same connection.

    Starlette's own 500 path re-raises and the server drops the connection, which the client
    would see as a lost daemon. A plain ASGI wrapper, not `@app.middleware("http")`: that
    BaseHTTPMiddleware runs every request through an extra task and memory streams.

    A request cut short by the daemon stopping (`rollbox daemon restart`/`stop`: uvicorn
    cancels what is still running after its grace period) would get uvicorn's plain-text
    "Internal Server Error"; it gets `daemon_unavailable` (503, retryable) instead, as does
    any failure while `stopping()` says the daemon is going down.
    """

    def __init__(self, app: Any, stopping: Callable[[], bool] = lambda: False) -> None:
        self.app = app
        self.stopping = stopping

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False
        status = 0
        t0 = time.monotonic()

        async def tracking_send(message: dict[str, Any]) -> None:
            nonlocal started, status
            if message["type"] == "http.response.start":
                started, status = True, int(message.get("status", 0))
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
            if log.isEnabledFor(logging.DEBUG):
                # Method, path and status only: bodies (exec argv and environments, file
                # contents, stdin) are never logged at any level.
                log.debug("%s %s -> %d in %.1f ms", scope.get("method"), scope.get("path"), status,
                          (time.monotonic() - t0) * 1000)
        except (Exception, asyncio.CancelledError) as exc:
            what = f"{scope.get('method')} {scope.get('path')}"
            if isinstance(exc, asyncio.CancelledError) or self.stopping():
                log.info("%s cut short: the daemon is stopping (%s)", what, type(exc).__name__)
                err: errors.RollboxError = errors.DaemonUnavailable(
                    f"the rollbox daemon stopped (restart, stop or shutdown) while {what} ran, so its outcome is "
                    "unknown; retry the call (the SDK starts or finds the next daemon)")
            else:
                log.exception("unhandled error in %s", what)
                err = errors.RollboxError(f"{type(exc).__name__}: {exc}")
            if started:
                raise
            body = json.dumps(err.to_wire(), ensure_ascii=True).encode()
            await send({"type": "http.response.start", "status": err.status,
                        "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
            await send({"type": "http.response.body", "body": body})


def add_error_handlers(app: FastAPI) -> None:
    """A RollboxError answers with its typed body and status; a body the route's model
    refuses with FastAPI's 422 details, rendered as JSON even when the request held a NaN."""

    @app.exception_handler(errors.RollboxError)
    async def _rollbox_error(_req: Request, exc: errors.RollboxError) -> JSONResponse:
        return JSONResponse(status_code=exc.status, content=exc.to_wire())

    @app.exception_handler(RequestValidationError)
    async def _invalid_body(_req: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse(status_code=422, content={"detail": jsonable_encoder(exc.errors())})
