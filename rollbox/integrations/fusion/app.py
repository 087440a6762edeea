"""The HTTP side of `rollbox serve-fusion`: SandboxFusion's API on FastAPI/uvicorn.

Routes: `POST /run_code`, `POST /run_jupyter`, `GET /v1/ping` ("pong") and `GET /` (what this
server runs). Every answer is SandboxFusion's shape, never an HTTP 500: a request the server
cannot run (an unknown or unavailable language, bad base64, a platform fault) is 200 with
`status: SandboxError` and a message, as SandboxFusion answers a runner failure; a body that
is not JSON or does not match the schema is 422 (as SandboxFusion's FastAPI answers it) with
`status: SandboxError`, a message naming the bad fields, and FastAPI's `detail`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import AsyncIterator, Awaitable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from rollbox.errors import InvalidArgument

from .backend import FusionBackend
from .models import RunCodeRequest, RunCodeResponse, RunJupyterRequest, RunJupyterResponse, RunStatus

log = logging.getLogger("rollbox.fusion")


def _invalid(exc: RequestValidationError, path: str) -> JSONResponse:
    errs = jsonable_encoder(exc.errors())
    where = "; ".join(f"{'.'.join(str(p) for p in e.get('loc', ()) if p != 'body') or 'body'}: {e.get('msg')}"
                      for e in errs)
    shape = RunJupyterResponse if path.rstrip("/").endswith("run_jupyter") else RunCodeResponse
    body: dict[str, Any] = shape(status=RunStatus.SandboxError, message=f"invalid request: {where}").model_dump(mode="json")
    body["detail"] = errs
    return JSONResponse(status_code=422, content=body)


async def _guarded(answer: Awaitable[Any], shape: type[RunCodeResponse] | type[RunJupyterResponse]) -> Any:
    """The backend's answer; a bug there is SandboxFusion's SandboxError, never a 500."""
    try:
        return await answer
    except Exception as e:  # noqa: BLE001
        log.exception("serving a request failed")
        return shape(status=RunStatus.SandboxError, message=f"internal error: {type(e).__name__}: {e}")


def create_app(backend: FusionBackend) -> FastAPI:
    """The ASGI app answering SandboxFusion's API from `backend` (already started); it closes
    the backend when the server shuts down (uvicorn re-raises SIGTERM/SIGINT after its
    shutdown, so cleanup after `run()` returns would never run)."""

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        yield
        await asyncio.to_thread(backend.close)

    app = FastAPI(title="rollbox serve-fusion", version="1", lifespan=lifespan,
                  description="SandboxFusion's code-execution API; every request runs in a fresh rollbox episode.")

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        return _invalid(exc, request.url.path)

    @app.post("/run_code", response_model=RunCodeResponse)
    async def run_code(request: RunCodeRequest) -> Any:
        return await _guarded(backend.run_code(request), RunCodeResponse)

    @app.post("/run_jupyter", response_model=RunJupyterResponse)
    async def run_jupyter(request: RunJupyterRequest) -> Any:
        return await _guarded(backend.run_jupyter(request), RunJupyterResponse)

    @app.get("/v1/ping")
    async def ping() -> str:
        return "pong"

    @app.get("/")
    async def about() -> dict[str, Any]:
        return {"service": "rollbox serve-fusion", "api": "SandboxFusion", "isolation": backend.isolation,
                "runtime": backend.runtime,
                "concurrency": backend.concurrency, "languages": backend.available,
                "not_offered": {k: v for k, v in backend.why_not.items() if v}}

    return app


def parse_listen(listen: str) -> tuple[str, int]:
    """"HOST:PORT" (or "[V6]:PORT", or ":PORT" for 127.0.0.1) -> (host, port)."""
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise InvalidArgument(f"--listen {listen!r}: give HOST:PORT, e.g. 127.0.0.1:8080")
    return host.strip("[]") or "127.0.0.1", int(port)


def _check_free(host: str, port: int) -> None:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            raise InvalidArgument(f"cannot listen on {host}:{port}: {e.strerror}; pick another --listen") from None


def serve(backend: FusionBackend, listen: str = "127.0.0.1:8080") -> None:
    """Starts `backend`, serves until SIGINT/SIGTERM, then closes it (pool and snapshot)."""
    # A failed start closes it here; a served one is closed by the app's shutdown.
    import uvicorn

    host, port = parse_listen(listen)
    _check_free(host, port)  # before minutes of image building
    try:
        backend.start()
        url = f"http://{'[' + host + ']' if ':' in host else host}:{port}"
        backend.log(f"rollbox serve-fusion: listening on {url} (POST /run_code, /run_jupyter); "
                    f"verl: sandbox_fusion_url={url}/run_code")
        uvicorn.Server(uvicorn.Config(create_app(backend), host=host, port=port, log_level="warning")).run()
    finally:
        backend.close()
